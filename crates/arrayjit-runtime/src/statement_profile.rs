//! Where a routine's time goes, statement by statement: a routine compiled with
//! `OptimizeSettings::profile_statements` (or at `ARRAYJIT_DEBUG=2` and above) times each of
//! its top-level statements as it runs; [`crate::Routine::statement_profile`] reads the sums
//! with each statement's work, so a reader sees which statements are slow and how far each
//! is from the machine's limits.
//!
//! Rules:
//! - Times are wall-clock nanoseconds of each statement's call in the kernel (its parallel
//!   parts included), summed over the runs since the profile was last read; reading resets
//!   them. Only the C backends time statements; elsewhere there is no profile.
//! - A statement's work is counted from its loops, not measured: `flops` is 2 per
//!   multiply-add of a blocked product (only the terms its guard keeps) and, for other
//!   statements, every assignment and arithmetic operation of every iteration; `bytes` is
//!   the size of every array the statement touches, each once (a lower bound of its memory
//!   traffic).

use std::fmt;

use arrayjit_ir::LowLevel;
use arrayjit_opt::Optimized;
use arrayjit_opt::schedule::ScheduleKind;
use arrayjit_opt::schedule::gpu::analysis::operations;
use arrayjit_opt::schedule::gpu::plan::touched_bytes;

/// One top-level statement's time and work.
#[derive(Clone, Debug, PartialEq)]
pub struct StatementTime {
    /// Its position among the routine's top-level statements.
    pub index: usize,
    /// How it runs: `product`, `loops`, `reduction`, `attention`, `fused ×N`, ... (with
    /// `parallel` where its outermost loop is split over the workers).
    pub kind: String,
    /// The arrays it writes.
    pub writes: String,
    /// Nanoseconds, summed over its calls.
    pub nanos: u64,
    /// Times it ran.
    pub calls: u64,
    /// Floating-point (and other arithmetic) operations per call, counted from its loops.
    pub flops: u64,
    /// Bytes of the arrays it touches per call, each once.
    pub bytes: u64,
}

impl StatementTime {
    /// Seconds per call (0 when it did not run).
    pub fn seconds_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.nanos as f64 * 1e-9 / self.calls as f64
        }
    }

    /// The fraction of the machine's limits it reached: the time the FMA rate
    /// (`flops_per_s`) or the memory bandwidth (`bytes_per_s`) alone would need, whichever is
    /// longer, over its time (0 when it did not run).
    pub fn fraction_of_limit(&self, flops_per_s: f64, bytes_per_s: f64) -> f64 {
        let t = self.seconds_per_call();
        if t <= 0.0 {
            return 0.0;
        }
        let bound = (self.flops as f64 / flops_per_s).max(self.bytes as f64 / bytes_per_s);
        bound / t
    }

    /// Whether the FMA rate bounds it more than the bandwidth does.
    pub fn compute_bound(&self, flops_per_s: f64, bytes_per_s: f64) -> bool {
        self.flops as f64 / flops_per_s >= self.bytes as f64 / bytes_per_s
    }
}

/// A routine's statements with their times, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct StatementProfile {
    /// The routine's name.
    pub routine: String,
    /// Its top-level statements (those that run nothing are left out).
    pub statements: Vec<StatementTime>,
}

impl StatementProfile {
    /// The profile of `optimized` from its kernel's counters (`(nanoseconds, calls)` per
    /// top-level statement, as `CompiledBatch::statement_times` reads them).
    pub fn of(optimized: &Optimized, counters: &[(u64, u64)]) -> StatementProfile {
        let stmts: Vec<&LowLevel> = match &optimized.code {
            LowLevel::Seq(items) => items.iter().collect(),
            s => vec![s],
        };
        let mut statements = Vec::new();
        for (index, stmt) in stmts.into_iter().enumerate() {
            let sched = optimized.schedules.get(index);
            let kind = match sched.map(|s| &s.kind) {
                Some(ScheduleKind::Absorbed) => continue,
                Some(ScheduleKind::Contraction(_)) => "product".to_string(),
                Some(ScheduleKind::Reduction(_)) => "reduction".to_string(),
                Some(ScheduleKind::Attention(_)) => "attention".to_string(),
                Some(ScheduleKind::Fused(parts)) => format!("fused ×{}", parts.len()),
                Some(ScheduleKind::Gpu(_)) => "gpu pass".to_string(),
                Some(ScheduleKind::Loops) | None => "loops".to_string(),
            };
            let kind = match sched.and_then(|s| s.parallel.as_ref()) {
                Some(_) => format!("{kind}, parallel"),
                None => kind,
            };
            let flops = match sched.map(|s| &s.kind) {
                Some(ScheduleKind::Contraction(g)) => g.flops(),
                _ => operations(stmt),
            };
            let bytes = touched_bytes(stmt);
            let writes: Vec<String> = stmt
                .written_nodes()
                .iter()
                .map(|t| t.debug_name())
                .collect();
            let (nanos, calls) = counters.get(index).copied().unwrap_or((0, 0));
            statements.push(StatementTime {
                index,
                kind,
                writes: writes.join(", "),
                nanos,
                calls,
                flops,
                bytes,
            });
        }
        StatementProfile {
            routine: optimized.name.clone(),
            statements,
        }
    }

    /// Nanoseconds of all statements.
    pub fn total_nanos(&self) -> u64 {
        self.statements.iter().map(|s| s.nanos).sum()
    }

    /// The statements, slowest first.
    pub fn slowest(&self) -> Vec<&StatementTime> {
        let mut v: Vec<&StatementTime> = self.statements.iter().collect();
        v.sort_by(|a, b| b.nanos.cmp(&a.nanos).then(a.index.cmp(&b.index)));
        v
    }

    /// A table of the `rows` slowest statements (all: `usize::MAX`) with their share of the
    /// routine's time and, given the machine's FMA rate and bandwidth, their rates and the
    /// fraction of the limit that bounds each.
    pub fn table(&self, rows: usize, limits: Option<(f64, f64)>) -> String {
        use std::fmt::Write as _;
        let total = self.total_nanos().max(1) as f64;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| # | statement | writes | ms per call | share | GFLOP/s | GB/s | of limit |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for st in self.slowest().into_iter().take(rows) {
            let t = st.seconds_per_call();
            let rate = |x: u64| {
                if t > 0.0 {
                    format!("{:.1}", x as f64 / t * 1e-9)
                } else {
                    "–".into()
                }
            };
            let limit = match limits {
                Some((flops, bytes)) if t > 0.0 => format!(
                    "{:.0}% of {}",
                    100.0 * st.fraction_of_limit(flops, bytes),
                    if st.compute_bound(flops, bytes) {
                        "FMA"
                    } else {
                        "bandwidth"
                    }
                ),
                _ => "–".into(),
            };
            // Long lists of written arrays (a fused attention's seven) cut to a readable cell.
            let writes = if st.writes.chars().count() > 60 {
                let cut: String = st.writes.chars().take(57).collect();
                format!("{cut}...")
            } else {
                st.writes.clone()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {writes} | {:.3} | {:.1}% | {} | {} | {limit} |",
                st.index,
                st.kind,
                t * 1e3,
                100.0 * st.nanos as f64 / total,
                rate(st.flops),
                rate(st.bytes),
            );
        }
        s
    }
}

impl fmt::Display for StatementProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let top: Vec<String> = self
            .slowest()
            .into_iter()
            .take(3)
            .filter(|s| s.nanos > 0)
            .map(|s| {
                format!(
                    "#{} {} ({}) {:.1}%",
                    s.index,
                    s.kind,
                    s.writes,
                    100.0 * s.nanos as f64 / self.total_nanos().max(1) as f64
                )
            })
            .collect();
        write!(
            f,
            "{}: {} statements, {:.3} ms; slowest {}",
            self.routine,
            self.statements.len(),
            self.total_nanos() as f64 * 1e-6,
            if top.is_empty() {
                "none ran".to_string()
            } else {
                top.join(", ")
            }
        )
    }
}

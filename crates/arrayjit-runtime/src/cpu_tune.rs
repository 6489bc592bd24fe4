//! Measures which cache shares blocked products should fill on this CPU
//! ([`CacheShares`]; `arrayjit tune`) and stores the fastest in the compile cache, where every
//! later backend on this machine finds it (see `arrayjit_backends::cpu::tuning`).
//!
//! Rules:
//! - The candidates are the shares of [`CacheShares::SLIVER_CHOICES`] ×
//!   [`CacheShares::BLOCK_CHOICES`]; those that render the same source as one already timed
//!   (a clamped block size) are not compiled again. The choice in use before (the stored one,
//!   the table's or the vendor's) is timed first.
//! - Each candidate compiles one routine of matrix products shaped as a transformer's
//!   (GPT-2 small's: the forward product, the input gradient's product by a transposed
//!   weight, the weight gradient's product of transposed activations) and a square one
//!   ([`TuneSettings::tokens`] on a side), and
//!   runs it on zero-filled buffers of the backend's device 0. The work does not depend on
//!   the values.
//! - A candidate replaces the best so far only when faster by at least
//!   [`TuneSettings::min_gain`], and still is when both are timed again, so noise does not
//!   move the choice away from the one in use.
//! - No candidate starts after [`TuneSettings::time_budget`]; the winner is stored (when the
//!   backend keeps a compile cache) and applied to this backend's settings at once.

use std::time::{Duration, Instant};

use arrayjit_backends::cpu::tuning::{CpuShares, SharesSource};
use arrayjit_ir::{AccumRhs, Assignments, BinOp, Error, Operand, Prec, Result, Tnode};
use arrayjit_opt::optimize;
use arrayjit_opt::schedule::CacheShares;

use crate::backend::Backend;
use crate::search::{Compared, SearchSettings, Timed, compare, evaluate};

/// How long and how carefully `tune` times candidates.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneSettings {
    /// No new candidate is started after the tuning has run this long.
    pub time_budget: Duration,
    /// A candidate replaces the best so far only if faster by at least this fraction.
    pub min_gain: f64,
    /// Rows of the products' activations (tokens; the widths are GPT-2 small's, 768 and
    /// 3072), and the side of the square product.
    pub tokens: usize,
}

impl Default for TuneSettings {
    fn default() -> Self {
        TuneSettings {
            time_budget: Duration::from_secs(45),
            min_gain: 0.03,
            tokens: 1024,
        }
    }
}

/// One candidate of a tuning.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneCandidate {
    /// The shares it tried.
    pub shares: CacheShares,
    /// Seconds per run of the products (`None`: not timed; see `note`).
    pub seconds: Option<f64>,
    /// What happened.
    pub note: String,
}

/// What `tune` measured and chose.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneReport {
    /// The CPU measured (`CpuInfo::identity`).
    pub cpu: String,
    /// The choice in use before, and where it came from.
    pub before: CpuShares,
    /// Every candidate, the one in use first.
    pub candidates: Vec<TuneCandidate>,
    /// The fastest (the one in use unless another beat it by the margin, confirmed).
    pub winner: CacheShares,
    /// Multiply-adds ×2 per run of the products, for rates.
    pub flops: f64,
    /// The winner was written to the compile cache.
    pub stored: bool,
}

impl TuneReport {
    /// The winner's time against the choice in use before (`> 1`: faster).
    pub fn speedup(&self) -> Option<f64> {
        let before = self.candidates.first()?.seconds?;
        let winner = self
            .candidates
            .iter()
            .filter(|c| c.shares == self.winner)
            .find_map(|c| c.seconds)?;
        Some(before / winner)
    }
}

impl std::fmt::Display for TuneReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "CPU: {}", self.cpu)?;
        writeln!(f, "in use before: {}", self.before)?;
        for c in &self.candidates {
            match c.seconds {
                Some(s) => writeln!(
                    f,
                    "  {}: {:.2} ms ({:.1} GFLOP/s), {}",
                    c.shares,
                    s * 1e3,
                    self.flops / s * 1e-9,
                    c.note
                )?,
                None => writeln!(f, "  {}: {}", c.shares, c.note)?,
            }
        }
        write!(f, "chosen: {}", self.winner)?;
        if let Some(x) = self.speedup() {
            write!(f, " ({x:.2}× the choice in use before)")?;
        }
        if self.before.source == SharesSource::Environment {
            write!(
                f,
                "; stored, but ARRAYJIT_CPU_SHARES is set and overrides it while it is"
            )
        } else if self.stored {
            write!(f, "; stored in the compile cache for later runs")
        } else {
            write!(
                f,
                "; not stored (the backend keeps no compile cache): applies to this process only"
            )
        }
    }
}

/// The products timed: `(spec, [rows, depth, columns])` as `C[rows, columns]`.
fn product_shapes(tokens: usize) -> [(&'static str, [usize; 3]); 4] {
    let (d, f) = (768, 3072);
    [
        // Forward: activations · weight.
        ("ik,kj->ij", [tokens, d, f]),
        // Input gradient: gradient · weightᵀ.
        ("ik,jk->ij", [tokens, f, d]),
        // Weight gradient: activationsᵀ · gradient.
        ("ki,kj->ij", [d, tokens, f]),
        // Square.
        ("ik,kj->ij", [tokens, tokens, tokens]),
    ]
}

/// One routine of the products of [`product_shapes`], and its floating-point operations.
fn products(tokens: usize) -> Result<(Assignments, f64)> {
    let mut program = Assignments::Noop;
    let mut flops = 0.0;
    for (n, (spec, [m, k, nn])) in product_shapes(tokens).into_iter().enumerate() {
        let (lhs, rhs) = spec
            .split_once("->")
            .and_then(|(l, _)| l.split_once(','))
            .ok_or_else(|| Error::invalid("a product spec without two factors"))?;
        let dims = |s: &str| -> Vec<usize> {
            s.chars()
                .map(|c| match c {
                    'i' => m,
                    'j' => nn,
                    _ => k,
                })
                .collect()
        };
        let a = Tnode::new(Prec::F32, &dims(lhs), &[&format!("tune_a{n}")])?;
        let b = Tnode::new(Prec::F32, &dims(rhs), &[&format!("tune_b{n}")])?;
        let c = Tnode::new(Prec::F32, &[m, nn], &[&format!("tune_c{n}")])?;
        program = program.then(Assignments::einsum(
            spec,
            BinOp::Add,
            &c,
            AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
            true,
        )?);
        flops += 2.0 * (m * k * nn) as f64;
    }
    Ok((program, flops))
}

impl Backend {
    /// Measures which cache shares the blocked products should fill on this CPU, stores the
    /// fastest in the compile cache and uses it from now on (see [`crate::cpu_tune`]). A
    /// backend whose devices are GPUs is [`Error::InvalidSetting`]: its products do not block
    /// for CPU caches.
    pub fn tune_cpu_products(&self, settings: &TuneSettings) -> Result<TuneReport> {
        self.check_available()?;
        let lowered = self.lowered();
        let base = self.compile_settings()?;
        if base.schedule.gpu.is_some() {
            return Err(Error::InvalidSetting {
                setting: "the backend to tune".into(),
                value: self.name().into(),
                expected: "a C backend (sync_cc, multicore_cc): CPU cache tuning does not apply \
                           to backends whose devices run GPU passes"
                    .into(),
            });
        }
        let started = Instant::now();
        let before = lowered.cpu_shares();
        let (program, flops) = products(settings.tokens.max(1))?;
        let timing = SearchSettings {
            batch_time: Duration::from_millis(1),
            batches: 2,
            ..SearchSettings::default()
        };
        let mut order = vec![before.shares];
        for sliver in CacheShares::SLIVER_CHOICES {
            for block in CacheShares::BLOCK_CHOICES {
                let s = CacheShares {
                    sliver_of_l1: sliver,
                    block_of_l2: block,
                };
                if !order.contains(&s) {
                    order.push(s);
                }
            }
        }
        let mut timed: Vec<Timed> = Vec::new();
        let mut candidates = Vec::new();
        let mut best: Option<(CacheShares, usize)> = None;
        for shares in order {
            if best.is_some() && started.elapsed() >= settings.time_budget {
                candidates.push(TuneCandidate {
                    shares,
                    seconds: None,
                    note: "not timed: the time budget was spent".into(),
                });
                continue;
            }
            let mut s = base.clone();
            s.schedule.cache_shares = shares;
            let optimized = optimize("cpu_tune_products", &[], &program, &s)?;
            let (at, new) = evaluate(lowered, &optimized, &mut timed, &timing)?;
            let note = match best {
                _ if !new => "the same blocking as an earlier candidate",
                None => {
                    best = Some((shares, at));
                    "timed; the choice in use"
                }
                Some((_, best_at)) => {
                    let compared = compare(
                        lowered,
                        &mut timed,
                        (at, best_at),
                        &timing,
                        settings.min_gain,
                    )?;
                    if compared == Compared::Faster {
                        best = Some((shares, at));
                    }
                    compared.note()
                }
            };
            candidates.push(TuneCandidate {
                shares,
                seconds: Some(timed[at].seconds),
                note: note.into(),
            });
        }
        let winner = best.map_or(before.shares, |(s, _)| s);
        let stored = lowered.store_cpu_shares(winner)?;
        let mut now = self.optimize_settings();
        now.schedule.cache_shares = winner;
        self.set_optimize_settings(now);
        Ok(TuneReport {
            cpu: arrayjit_backends::device_info::CpuInfo::host().identity(),
            before,
            candidates,
            winner,
            flops,
            stored,
        })
    }
}

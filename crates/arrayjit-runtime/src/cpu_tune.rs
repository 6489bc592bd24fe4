//! Measures which cache shares blocked products should fill on this CPU, and which cache
//! their fetches of streamed operands should fill ([`CacheShares`]; `arrayjit tune`), and
//! stores the fastest in the compile cache, where every later backend on this machine finds it
//! (see `arrayjit_backends::cpu::tuning`).
//!
//! Rules:
//! - First the blocks: the candidates are the shares of [`CacheShares::SLIVER_CHOICES`] ×
//!   [`CacheShares::BLOCK_CHOICES`] (with the fetch level in use); those that render the same
//!   source as one already timed (a clamped block size) are not compiled again. The choice in
//!   use before (the stored one, the table's or the vendor's) is timed first.
//! - Each candidate of the blocks compiles one routine of matrix products shaped as a
//!   transformer's (GPT-2 small's: the forward product, the input gradient's product by a
//!   transposed weight, the weight gradient's product of transposed activations) and a square
//!   one ([`TuneSettings::tokens`] on a side).
//! - Then the fetch level ([`StreamFetch::CHOICES`]) with the blocks chosen, the level in use
//!   first: each candidate compiles one routine of products of one row by matrices that
//!   together are [`TuneSettings::streamed_bytes`] (a decoding step's products, which read
//!   their weights from memory once), half with the matrix's rows contiguous and half with its
//!   columns contiguous (a tied output head).
//! - Every routine runs on zero-filled buffers of the backend's device 0: the work does not
//!   depend on the values.
//! - A candidate replaces the best so far only when faster by at least
//!   [`TuneSettings::min_gain`], and still is when both are timed again, so noise does not
//!   move the choice away from the one in use.
//! - No candidate of the blocks starts after three quarters of [`TuneSettings::time_budget`],
//!   none of the fetch levels after all of it (the first of each is always timed); the winner
//!   is stored (when the backend keeps a compile cache) and applied to this backend's settings
//!   at once.

use std::time::{Duration, Instant};

use arrayjit_backends::cpu::tuning::{CpuShares, SharesSource};
use arrayjit_ir::{AccumRhs, Assignments, BinOp, Error, Operand, Prec, Result, Tnode};
use arrayjit_opt::optimize;
use arrayjit_opt::schedule::{CacheShares, StreamFetch};

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
    /// Bytes of the matrices the streamed products read per run, when timing the fetch
    /// levels (`None`: twice the CPU's last cache, at least 64 MiB, at most 1 GiB).
    pub streamed_bytes: Option<usize>,
}

impl Default for TuneSettings {
    fn default() -> Self {
        TuneSettings {
            time_budget: Duration::from_secs(45),
            min_gain: 0.03,
            tokens: 1024,
            streamed_bytes: None,
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
    /// Every candidate of the blocks, the one in use first.
    pub candidates: Vec<TuneCandidate>,
    /// Every candidate of the fetch level (with the blocks chosen), the one in use first.
    pub fetch_candidates: Vec<TuneCandidate>,
    /// The fastest (the one in use unless another beat it by the margin, confirmed).
    pub winner: CacheShares,
    /// Multiply-adds ×2 per run of the products, for rates.
    pub flops: f64,
    /// Bytes of matrices per run of the streamed products, for rates.
    pub streamed_bytes: f64,
    /// The winner was written to the compile cache.
    pub stored: bool,
}

impl TuneReport {
    /// The winner's time against the choice in use before (`> 1`: faster), on the products
    /// of the blocks and on the streamed products.
    pub fn speedup(&self) -> Option<(f64, f64)> {
        let ratio = |candidates: &[TuneCandidate], same: &dyn Fn(&CacheShares) -> bool| {
            let before = candidates.first()?.seconds?;
            let winner = candidates
                .iter()
                .filter(|c| same(&c.shares))
                .find_map(|c| c.seconds)?;
            Some(before / winner)
        };
        let w = self.winner;
        Some((
            ratio(&self.candidates, &|s| {
                (s.sliver_of_l1, s.block_of_l2) == (w.sliver_of_l1, w.block_of_l2)
            })?,
            ratio(&self.fetch_candidates, &|s| *s == w)?,
        ))
    }
}

impl std::fmt::Display for TuneReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "CPU: {}", self.cpu)?;
        writeln!(f, "in use before: {}", self.before)?;
        writeln!(
            f,
            "blocks (products of GPT-2 small's shapes and a square one):"
        )?;
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
        writeln!(
            f,
            "fetch level (one row by {:.0} MiB of matrices):",
            self.streamed_bytes / f64::from(1 << 20)
        )?;
        for c in &self.fetch_candidates {
            match c.seconds {
                Some(s) => writeln!(
                    f,
                    "  stream_fetch={}: {:.2} ms ({:.1} GB/s), {}",
                    c.shares.stream_fetch.name(),
                    s * 1e3,
                    self.streamed_bytes / s * 1e-9,
                    c.note
                )?,
                None => writeln!(
                    f,
                    "  stream_fetch={}: {}",
                    c.shares.stream_fetch.name(),
                    c.note
                )?,
            }
        }
        write!(f, "chosen: {}", self.winner)?;
        if let Some((blocks, streamed)) = self.speedup() {
            write!(
                f,
                " ({blocks:.2}× the choice in use before on the blocked products, {streamed:.2}× on the streamed ones)"
            )?;
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

/// One routine of the products `shapes` (`(spec, [rows, depth, columns])` as in
/// [`product_shapes`]), its nodes named `{prefix}_a{n}`, …, and their floating-point operations.
fn routine_of_products(prefix: &str, shapes: &[(&str, [usize; 3])]) -> Result<(Assignments, f64)> {
    let mut program = Assignments::Noop;
    let mut flops = 0.0;
    for (n, &(spec, [m, k, nn])) in shapes.iter().enumerate() {
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
        let a = Tnode::new(Prec::F32, &dims(lhs), &[&format!("{prefix}_a{n}")])?;
        let b = Tnode::new(Prec::F32, &dims(rhs), &[&format!("{prefix}_b{n}")])?;
        let c = Tnode::new(Prec::F32, &[m, nn], &[&format!("{prefix}_c{n}")])?;
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

/// One routine of the products of [`product_shapes`], and its floating-point operations.
fn products(tokens: usize) -> Result<(Assignments, f64)> {
    routine_of_products("tune", &product_shapes(tokens))
}

/// The bytes of matrices the streamed products read when [`TuneSettings::streamed_bytes`] is
/// not given: twice the last cache (`last_cache`, 0 when unknown), at least 64 MiB and at most
/// 1 GiB (so the tuning's memory stays modest where the last cache is huge).
fn default_streamed_bytes(last_cache: usize) -> usize {
    (2 * last_cache).clamp(64 << 20, 1 << 30)
}

/// One routine of products of one row by matrices of GPT-2 small's widths (768 × 3072, f32),
/// at least `bytes` of them in all (at least two), alternately with the matrix's rows
/// contiguous (`x · W`) and its columns contiguous (`x · Eᵀ`), and the bytes of the matrices.
fn streamed_products(bytes: usize) -> Result<(Assignments, f64)> {
    let (d, f) = (768, 3072);
    let matrix = d * f * 4;
    let count = bytes.div_ceil(matrix).clamp(2, 256);
    let shapes: Vec<(&str, [usize; 3])> = (0..count)
        .map(|n| {
            if n % 2 == 0 {
                ("ik,kj->ij", [1, d, f])
            } else {
                ("ik,jk->ij", [1, d, f])
            }
        })
        .collect();
    let (program, _) = routine_of_products("tune_streamed", &shapes)?;
    Ok((program, (count * matrix) as f64))
}

/// How the candidates of one part of a tuning are timed.
struct Round<'a> {
    name: &'a str,
    program: &'a Assignments,
    base: &'a arrayjit_opt::OptimizeSettings,
    timing: &'a SearchSettings,
    min_gain: f64,
    /// No candidate after the first starts later than this.
    deadline: Instant,
}

impl Round<'_> {
    /// Times `order` (the choice in use first) and returns every candidate and the fastest.
    fn run(
        &self,
        lowered: &arrayjit_backends::LoweredBackend,
        order: Vec<CacheShares>,
    ) -> Result<(Vec<TuneCandidate>, Option<CacheShares>)> {
        let mut timed: Vec<Timed> = Vec::new();
        let mut candidates = Vec::new();
        let mut best: Option<(CacheShares, usize)> = None;
        for shares in order {
            if best.is_some() && Instant::now() >= self.deadline {
                candidates.push(TuneCandidate {
                    shares,
                    seconds: None,
                    note: "not timed: the time budget was spent".into(),
                });
                continue;
            }
            let mut s = self.base.clone();
            s.schedule.cache_shares = shares;
            let optimized = optimize(self.name, &[], self.program, &s)?;
            let (at, new) = evaluate(lowered, &optimized, &mut timed, self.timing)?;
            let note = match best {
                _ if !new => "the same code as an earlier candidate",
                None => {
                    best = Some((shares, at));
                    "timed; the choice in use"
                }
                Some((_, best_at)) => {
                    let compared = compare(
                        lowered,
                        &mut timed,
                        (at, best_at),
                        self.timing,
                        self.min_gain,
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
        Ok((candidates, best.map(|(s, _)| s)))
    }
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
                    stream_fetch: before.shares.stream_fetch,
                };
                if !order.contains(&s) {
                    order.push(s);
                }
            }
        }
        let blocks = Round {
            name: "cpu_tune_products",
            program: &program,
            base: &base,
            timing: &timing,
            min_gain: settings.min_gain,
            deadline: started + settings.time_budget * 3 / 4,
        };
        let (candidates, blocks_winner) = blocks.run(lowered, order)?;
        let blocks_winner = blocks_winner.unwrap_or(before.shares);

        let streamed_bytes = settings
            .streamed_bytes
            .unwrap_or_else(|| default_streamed_bytes(base.schedule.cache_bytes[2]));
        let (streamed, streamed_bytes) = streamed_products(streamed_bytes)?;
        let mut order = vec![blocks_winner];
        order.extend(StreamFetch::CHOICES.into_iter().filter_map(|level| {
            (level != blocks_winner.stream_fetch).then_some(CacheShares {
                stream_fetch: level,
                ..blocks_winner
            })
        }));
        let fetches = Round {
            name: "cpu_tune_streamed_products",
            program: &streamed,
            deadline: started + settings.time_budget,
            ..blocks
        };
        let (fetch_candidates, winner) = fetches.run(lowered, order)?;
        let winner = winner.unwrap_or(blocks_winner);
        let stored = lowered.store_cpu_shares(winner)?;
        let mut now = self.optimize_settings();
        now.schedule.cache_shares = winner;
        self.set_optimize_settings(now);
        Ok(TuneReport {
            cpu: arrayjit_backends::device_info::CpuInfo::host().identity(),
            before,
            candidates,
            fetch_candidates,
            winner,
            flops,
            streamed_bytes,
            stored,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_products_read_beyond_the_last_cache_within_bounds() {
        // Twice the last cache, at least 64 MiB, at most 1 GiB.
        assert_eq!(default_streamed_bytes(32 << 20), 64 << 20);
        assert_eq!(default_streamed_bytes(260 << 20), 520 << 20);
        assert_eq!(default_streamed_bytes(0), 64 << 20);
        assert_eq!(default_streamed_bytes(4 << 30), 1 << 30);
        // Whole matrices of 768 × 3072 f32 (9 MiB), at least two, alternating orders.
        let matrix = 768 * 3072 * 4;
        let (_, bytes) = streamed_products(64 << 20).unwrap();
        assert_eq!(bytes, (8 * matrix) as f64);
        let (program, bytes) = streamed_products(1).unwrap();
        assert_eq!(bytes, (2 * matrix) as f64);
        let text = format!("{program:?}");
        assert!(text.contains("tune_streamed_b0") && text.contains("tune_streamed_b1"));
    }
}

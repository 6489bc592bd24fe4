//! Cache and register blocking of blocked matrix products, and the tuning choices the schedule
//! search varies around the heuristics (plain data, so a winner can be stored and reused).

/// Cache and register blocking of a matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Rows of the register tile (micro-kernel).
    pub mr: usize,
    /// Columns of the register tile: a multiple of the vector width.
    pub nr: usize,
    /// Rows of a packed block of the left factor (kept in L3).
    pub mc: usize,
    /// Depth of a packed block (a sliver of `mr × kc` of the left factor stays in L1).
    pub kc: usize,
    /// Columns of a packed block of the right factor (kept in L2).
    pub nc: usize,
    /// Which cache the product's software fetches of operands it streams once (a one-row
    /// product's matrix, B read in place, rows packed across) fill.
    pub stream_fetch: StreamFetch,
}

/// Which cache a product's software fetches of the operands it streams once fill: part of a
/// CPU's measured product tuning ([`CacheShares::stream_fetch`]), because CPUs differ in how
/// many fetches each level keeps in flight.
///
/// Measured on a 2-core AMD EPYC (Zen 4, family 25 model 17): GPT-2 small decoded 43.5 tokens/s
/// in f32 and 81.7 with `bf16` weights with fetches into L2, against 31.2 and 46.1 into L1 (a
/// fetch into L1 holds one of L1's few miss buffers until its line arrives, so fewer lines are
/// in flight); a 300-token prefill in chunks of 64 took 690 ms against 760. Not measured on an
/// Intel CPU: `arrayjit tune` measures both on the CPU it runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StreamFetch {
    /// Into L1 and the levels below it (`prefetcht0`; locality 3).
    L1,
    /// Into L2 and L3, not L1 (`prefetcht1`; locality 2): the choice made before the level was
    /// tuned, and the default.
    #[default]
    L2,
}

impl StreamFetch {
    /// The levels a tuning search tries.
    pub const CHOICES: [StreamFetch; 2] = [StreamFetch::L2, StreamFetch::L1];

    /// The locality argument of GCC's `__builtin_prefetch` that fills this level.
    pub fn locality(self) -> u8 {
        match self {
            StreamFetch::L1 => 3,
            StreamFetch::L2 => 2,
        }
    }

    /// The level's name as `Display` and [`CacheShares::parse`] write it (`l1`, `l2`).
    pub fn name(self) -> &'static str {
        match self {
            StreamFetch::L1 => "l1",
            StreamFetch::L2 => "l2",
        }
    }
}

/// How much of each cache a blocked product's blocks may fill, in eighths, and which cache
/// fetches of streamed operands fill: the choices that differ between CPUs of the same vector
/// width and cache sizes (how fast their L2 and L3 feed one core, how many fetches each level
/// keeps in flight), so they are measured per CPU (`arrayjit tune`) or taken from a table of
/// CPUs measured so far, not derived from the sizes alone.
///
/// Measured with `scripts/gemm-blocking.sh` (f32, one core):
/// - 2-core AMD EPYC (Zen 4 and Zen 5; 32 or 48 KiB L1, 1 MiB L2): a sliver of three quarters
///   of L1 and a block of B of twice L2 ([`CacheShares::WIDE`]): kc 512 ran the GPT products
///   of width 384 6% faster than kc 256, and nc 1024 the width-768 products 1–7% and matmul
///   2048 5–7% faster than nc 512: Zen's L3 feeds a core about as fast as its L2.
/// - 2-core Intel Xeon (family 6 model 207; 48 KiB L1, 2 MiB L2): a sliver of a quarter of
///   L1 and a block of B of half of L2 ([`CacheShares::L2_RESIDENT`]): kc 256 / nc 1024 ran
///   matmul 1024 at 155 GFLOP/s against 136 for kc 512 / nc 2048, matmul 2048 at 152 against
///   115–129, and the GPT-2-small (width 768) products 14–16% faster. The micro-kernel alone
///   ran at 173 GFLOP/s with its panels in 1 MiB of L2 and at 142 with them in 8 MiB
///   (streamed from L3): Intel's mesh L3 does not keep up with two 512-bit FMA ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheShares {
    /// Eighths of L1 the `mr × kc` sliver of A may fill (sets `kc`).
    pub sliver_of_l1: u8,
    /// Eighths of L2 the `kc × nc` block of B may fill (sets `nc`); above 8 the block
    /// streams from L3.
    pub block_of_l2: u8,
    /// Which cache fetches of streamed operands fill ([`StreamFetch`]).
    pub stream_fetch: StreamFetch,
}

impl CacheShares {
    /// A sliver of three quarters of L1, a block of twice L2: for CPUs whose L3 feeds a core
    /// as fast as its L2 (AMD Zen).
    pub const WIDE: CacheShares = CacheShares {
        sliver_of_l1: 6,
        block_of_l2: 16,
        stream_fetch: StreamFetch::L2,
    };
    /// A sliver of a quarter of L1, a block of half of L2: for CPUs whose L3 is far slower
    /// than L2 per core (Intel Xeon's mesh).
    pub const L2_RESIDENT: CacheShares = CacheShares {
        sliver_of_l1: 2,
        block_of_l2: 4,
        stream_fetch: StreamFetch::L2,
    };
    /// The slivers a tuning search tries, in eighths of L1.
    pub const SLIVER_CHOICES: [u8; 3] = [2, 4, 6];
    /// The blocks a tuning search tries, in eighths of L2.
    pub const BLOCK_CHOICES: [u8; 4] = [2, 4, 8, 16];

    /// Parses what `Display` writes (`sliver_of_l1=2/8 block_of_l2=4/8 stream_fetch=l2`),
    /// checking ranges (1 to 8 eighths of L1, 1 to 32 of L2, `l1` or `l2`). `stream_fetch` may
    /// be left out (choices stored before it was tuned): [`StreamFetch::L2`].
    pub fn parse(text: &str) -> std::result::Result<CacheShares, String> {
        let mut shares = [None, None];
        let mut stream_fetch = None;
        for field in text.split_whitespace() {
            let (name, value) = field
                .split_once('=')
                .ok_or_else(|| format!("`{field}` is not name=value"))?;
            if name == "stream_fetch" {
                let level = StreamFetch::CHOICES
                    .into_iter()
                    .find(|l| l.name() == value)
                    .ok_or_else(|| format!("stream_fetch=`{value}` is neither l1 nor l2"))?;
                stream_fetch = Some(level);
                continue;
            }
            let eighths = value
                .strip_suffix("/8")
                .and_then(|v| v.parse::<u8>().ok())
                .ok_or_else(|| format!("`{value}` is not a number of eighths such as 4/8"))?;
            let (slot, range) = match name {
                "sliver_of_l1" => (0, 1..=8),
                "block_of_l2" => (1, 1..=32),
                _ => return Err(format!("unknown field `{name}`")),
            };
            if !range.contains(&eighths) {
                return Err(format!("{name}={eighths}/8 is outside {range:?} eighths"));
            }
            shares[slot] = Some(eighths);
        }
        match shares {
            [Some(sliver_of_l1), Some(block_of_l2)] => Ok(CacheShares {
                sliver_of_l1,
                block_of_l2,
                stream_fetch: stream_fetch.unwrap_or_default(),
            }),
            _ => Err(format!(
                "`{text}` does not give both sliver_of_l1 and block_of_l2"
            )),
        }
    }
}

impl Default for CacheShares {
    /// [`CacheShares::WIDE`]: the choice measured first (on AMD Zen) and kept for CPUs no
    /// measurement covers.
    fn default() -> Self {
        CacheShares::WIDE
    }
}

impl std::fmt::Display for CacheShares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sliver_of_l1={}/8 block_of_l2={}/8 stream_fetch={}",
            self.sliver_of_l1,
            self.block_of_l2,
            self.stream_fetch.name()
        )
    }
}

impl Blocking {
    /// Blocking for a CPU with `lanes` elements per vector of `elem_bytes`-byte values, the
    /// given vector registers, L1/L2/L3 data cache sizes (0 where unknown) and the shares of
    /// them the blocks may fill:
    ///
    /// - the register tile uses at most two thirds of the registers for accumulators;
    /// - `kc` makes the `mr × kc` sliver of the left factor, which the micro-kernel broadcasts
    ///   from and which stays in L1 while the panels of the right factor stream past it, the
    ///   share `sliver_of_l1` of L1 (between 64 and 512 deep); a deeper block halves the
    ///   passes that read and write `C`;
    /// - `nc` makes a `kc × nc` block of the right factor the share `block_of_l2` of L2: the
    ///   micro-kernel reads its panels from L2 (or L3, where the share is above a whole L2 and
    ///   the CPU's L3 keeps up), and a wider block packs a left factor that is not read in
    ///   place fewer times (see [`CacheShares`] for what was measured);
    /// - an `mc × kc` block of the left factor takes half of L3 (measured on the AVX-512
    ///   machine of `docs/benchmarks.md`: this order and sizing ran matmul 1024 and 2048 7%
    ///   faster than the right factor's panel in L1 and its block in L3).
    ///
    /// The product splits its depth into blocks of equal depth of at most `kc` (see
    /// `arrayjit_codegen::c::gemm`).
    pub fn for_cpu(
        lanes: usize,
        registers: usize,
        elem_bytes: usize,
        caches: [usize; 3],
        shares: CacheShares,
    ) -> Blocking {
        let lanes = lanes.max(1);
        let nr = 2 * lanes;
        // Accumulators: mr × 2 vectors, plus 2 for the right panel and 1 broadcast.
        let mr = (registers.saturating_sub(3) / 2).clamp(1, 12);
        let l1 = if caches[0] > 0 { caches[0] } else { 32 << 10 };
        let l2 = if caches[1] > 0 { caches[1] } else { 256 << 10 };
        let l3 = if caches[2] > 0 { caches[2] } else { 4 << 20 };
        let sliver = l1 * usize::from(shares.sliver_of_l1.clamp(1, 8)) / 8;
        let block = l2 * usize::from(shares.block_of_l2.clamp(1, 32)) / 8;
        let kc = (sliver / (mr * elem_bytes)).clamp(64, 512) / 8 * 8;
        let nc = ((block / (kc * elem_bytes)) / nr).clamp(1, 256) * nr;
        let mc = ((l3 / 2 / (kc * elem_bytes)) / mr).clamp(1, 64) * mr;
        Blocking {
            mr,
            nr,
            mc,
            kc,
            nc,
            stream_fetch: shares.stream_fetch,
        }
    }
}

impl Blocking {
    /// Whether the C product can be generated for this blocking: a register tile of 1 to 32
    /// rows and an even 2 to 256 columns, cache blocks that are whole tiles, a depth block of
    /// at least 1.
    pub fn is_usable(&self) -> bool {
        (1..=32).contains(&self.mr)
            && (2..=256).contains(&self.nr)
            && self.nr.is_multiple_of(2)
            && self.kc >= 1
            && self.mc >= self.mr
            && self.mc.is_multiple_of(self.mr)
            && self.nc >= self.nr
            && self.nc.is_multiple_of(self.nr)
    }
}

/// What the schedule search varies around the heuristics. The default is the heuristics
/// themselves; any value is valid (out-of-range numbers are clamped where they are used), so a
/// stored winner can never make a schedule illegal — only slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScheduleTuning {
    /// Rows of the register tile of blocked products (`None`: from the register count).
    pub register_rows: Option<usize>,
    /// Scale of the cache blocks `mc`, `kc`, `nc` of blocked products, as powers of two
    /// relative to the heuristic's (`[0, 0, 0]`: the heuristic's sizes).
    pub block_scale_log2: [i8; 3],
    /// Vector-wide accumulators of a vectorized reduction (the heuristic: 4).
    pub reduction_vectors: usize,
    /// Invocations per group of GPU passes (`None`: the largest power of two up to 256 the
    /// device allows); clamped to what the device allows.
    pub gpu_threads: Option<u32>,
    /// Tile side of the tiled products of GPU passes, one of [`ScheduleTuning::GPU_TILES`]
    /// (`None`: from the product's size and the device); used only where its staging fits the
    /// device's shared memory.
    pub gpu_tile: Option<usize>,
    /// The most buffers of matrix-unit products' staged tiles (`None`: as many as the shared
    /// memory holds, up to [`crate::schedule::gpu::matrix::MAX_MATRIX_STAGES`]); clamped to
    /// 2 and that.
    pub gpu_stages: Option<usize>,
    /// Fragment depths of `k` per staged buffer of matrix-unit products, one of
    /// [`ScheduleTuning::GPU_STAGE_FRAGMENTS`] (`None`: 2).
    pub gpu_stage_fragments: Option<usize>,
    /// Stage the factors of sm_90 warpgroup products with the tensor memory accelerator
    /// (TMA: one invocation issues each buffer's bulk tensor copies, an mbarrier says when
    /// they have landed) where their layout allows it
    /// ([`crate::schedule::gpu::tensor_map`]); off by default until timed on a GPU.
    pub gpu_tensor_copies: bool,
}

impl Default for ScheduleTuning {
    fn default() -> Self {
        ScheduleTuning {
            register_rows: None,
            block_scale_log2: [0; 3],
            reduction_vectors: 4,
            gpu_threads: None,
            gpu_tile: None,
            gpu_stages: None,
            gpu_stage_fragments: None,
            gpu_tensor_copies: false,
        }
    }
}

impl ScheduleTuning {
    /// The most rows a register tile may have (two vector accumulators each).
    pub const MAX_REGISTER_ROWS: usize = 16;
    /// The most accumulator vectors of a reduction.
    pub const MAX_REDUCTION_VECTORS: usize = 16;
    /// The largest scale of a cache block, either way (a factor of 2^3 = 8).
    pub const MAX_BLOCK_SCALE_LOG2: i8 = 3;
    /// The group sizes a GPU pass may be given.
    pub const GPU_THREADS: [u32; 3] = [64, 128, 256];
    /// The tile sides a tiled GPU product may have.
    pub const GPU_TILES: [usize; 4] = [16, 32, 64, 128];
    /// The buffer counts the schedule search tries for matrix-unit products.
    pub const GPU_STAGES: [usize; 4] = [2, 3, 4, 6];
    /// The fragment depths per buffer matrix-unit products may stage.
    pub const GPU_STAGE_FRAGMENTS: [usize; 2] = [2, 4];

    /// Accumulators of a reduction with `lanes` elements per vector.
    pub fn reduction_lanes(&self, lanes: usize) -> usize {
        self.reduction_vectors.clamp(1, Self::MAX_REDUCTION_VECTORS) * lanes.max(1)
    }
}

/// Scales `value` by `2^shift` (clamped to ±[`ScheduleTuning::MAX_BLOCK_SCALE_LOG2`]).
fn scale(value: usize, shift: i8) -> usize {
    let shift = shift.clamp(
        -ScheduleTuning::MAX_BLOCK_SCALE_LOG2,
        ScheduleTuning::MAX_BLOCK_SCALE_LOG2,
    );
    if shift >= 0 {
        value << shift
    } else {
        value >> -shift
    }
}

impl Blocking {
    /// This blocking with a tuning applied: another register-tile height, cache blocks scaled
    /// by powers of two. Block sizes stay multiples of the register tile (`mc` of `mr`, `nc`
    /// of `nr`) and `kc` a multiple of 8, each at least one tile.
    pub fn tuned(self, tuning: &ScheduleTuning) -> Blocking {
        let mr = tuning
            .register_rows
            .map_or(self.mr, |r| r.clamp(1, ScheduleTuning::MAX_REGISTER_ROWS));
        let [smc, skc, snc] = tuning.block_scale_log2;
        // mc counted in tiles of the heuristic's height, re-rounded to the new height.
        let mc = (scale(self.mc, smc) / mr).max(1) * mr;
        let kc = (scale(self.kc, skc) / 8).max(1) * 8;
        let nc = (scale(self.nc, snc) / self.nr).max(1) * self.nr;
        Blocking {
            mr,
            nr: self.nr,
            mc,
            kc,
            nc,
            stream_fetch: self.stream_fetch,
        }
    }
}

impl Blocking {
    /// The blocking contractions of `elem_bytes` elements get under `settings` (the CPU's
    /// vector width, registers, caches and the shares of them blocks fill, then the tuning).
    pub fn for_settings(settings: &super::ScheduleSettings, elem_bytes: usize) -> Blocking {
        let lanes = settings.f32_lanes * 4 / elem_bytes;
        Blocking::for_cpu(
            lanes,
            settings.vector_registers,
            elem_bytes,
            settings.cache_bytes,
            settings.cache_shares,
        )
        .tuned(&settings.tuning)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: CacheShares = CacheShares::WIDE;

    #[test]
    fn the_default_tuning_keeps_the_heuristic() {
        let b = Blocking::for_cpu(16, 32, 4, [48 << 10, 2 << 20, 32 << 20], W);
        assert_eq!(b.tuned(&ScheduleTuning::default()), b);
    }

    #[test]
    fn the_fetch_level_follows_the_shares_through_tuning() {
        let caches = [32 << 10, 1 << 20, 32 << 20];
        let l1 = CacheShares {
            stream_fetch: StreamFetch::L1,
            ..W
        };
        let b = Blocking::for_cpu(16, 32, 4, caches, l1);
        assert_eq!(b.stream_fetch, StreamFetch::L1);
        let tuned = b.tuned(&ScheduleTuning {
            block_scale_log2: [1, -1, 1],
            ..ScheduleTuning::default()
        });
        assert_eq!(tuned.stream_fetch, StreamFetch::L1);
        // Only the fetches differ: the blocks are the same.
        let w = Blocking::for_cpu(16, 32, 4, caches, W);
        assert_eq!(
            (w.stream_fetch, w.mr, w.nr, w.mc, w.kc, w.nc),
            (StreamFetch::L2, b.mr, b.nr, b.mc, b.kc, b.nc)
        );
        assert_eq!(
            (StreamFetch::L1.locality(), StreamFetch::L2.locality()),
            (3, 2)
        );
    }

    #[test]
    fn blocks_follow_the_caches() {
        // AVX-512, f32, a 32 KiB L1 and 1 MiB L2 (the 2-core EPYC of docs/benchmarks.md): a
        // 12 × 512 sliver of A is 24 KiB, three quarters of L1; a 512 × 1024 block of B is
        // twice L2.
        let epyc = Blocking::for_cpu(16, 32, 4, [32 << 10, 1 << 20, 32 << 20], W);
        assert_eq!(
            (epyc.mr, epyc.nr, epyc.kc, epyc.nc, epyc.mc),
            (12, 32, 512, 1024, 768)
        );
        // A 48 KiB L1 would allow a deeper sliver: kc stops at 512; nc grows with L2.
        let xeon = Blocking::for_cpu(16, 32, 4, [48 << 10, 2 << 20, 32 << 20], W);
        assert_eq!((xeon.kc, xeon.nc), (512, 2048));
        // f64: the same sliver bytes at half the depth.
        let f64_epyc = Blocking::for_cpu(8, 32, 8, [32 << 10, 1 << 20, 32 << 20], W);
        assert_eq!((f64_epyc.mr, f64_epyc.nr, f64_epyc.kc), (12, 16, 256));
        // AVX2's 16 registers: a 6-row tile; unknown caches take 32 KiB, 256 KiB and 4 MiB.
        let avx2 = Blocking::for_cpu(8, 16, 4, [0; 3], W);
        assert_eq!((avx2.mr, avx2.nr, avx2.kc, avx2.nc), (6, 16, 512, 256));
        // The Xeon (6/207) keeps its block of B in half of L2: a 12 × 256 sliver is a quarter
        // of its 48 KiB L1, a 256 × 1024 block 1 MiB.
        let l2 = Blocking::for_cpu(
            16,
            32,
            4,
            [48 << 10, 2 << 20, 260 << 20],
            CacheShares::L2_RESIDENT,
        );
        assert_eq!((l2.mr, l2.kc, l2.nc), (12, 256, 1024));
    }

    #[test]
    fn cache_shares_parse_what_they_print_and_refuse_the_rest() {
        let fetched_into_l1 = CacheShares {
            stream_fetch: StreamFetch::L1,
            ..CacheShares::WIDE
        };
        for shares in [CacheShares::WIDE, CacheShares::L2_RESIDENT, fetched_into_l1] {
            assert_eq!(CacheShares::parse(&shares.to_string()), Ok(shares));
        }
        assert_eq!(
            fetched_into_l1.to_string(),
            "sliver_of_l1=6/8 block_of_l2=16/8 stream_fetch=l1"
        );
        // A choice stored before the fetch level was tuned fetched into L2.
        assert_eq!(
            CacheShares::parse("sliver_of_l1=2/8 block_of_l2=4/8"),
            Ok(CacheShares::L2_RESIDENT)
        );
        for bad in [
            "",
            "sliver_of_l1=2/8",
            "sliver_of_l1=0/8 block_of_l2=4/8",
            "sliver_of_l1=9/8 block_of_l2=4/8",
            "sliver_of_l1=2/8 block_of_l2=33/8",
            "sliver_of_l1=2 block_of_l2=4/8",
            "sliver_of_l1=2/8 block_of_l3=4/8",
            "sliver_of_l1",
            "sliver_of_l1=2/8 block_of_l2=4/8 stream_fetch=l3",
            "sliver_of_l1=2/8 block_of_l2=4/8 stream_fetch=",
            "stream_fetch=l1",
        ] {
            assert!(CacheShares::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tuned_blocks_stay_multiples_of_the_tile() {
        let b = Blocking::for_cpu(8, 16, 4, [32 << 10, 512 << 10, 16 << 20], W);
        for rows in [None, Some(1), Some(4), Some(6), Some(99)] {
            for shift in [-9i8, -1, 0, 1, 9] {
                let t = ScheduleTuning {
                    register_rows: rows,
                    block_scale_log2: [shift, shift, shift],
                    reduction_vectors: 4,
                    ..ScheduleTuning::default()
                };
                let g = b.tuned(&t);
                assert!(
                    g.mr >= 1 && g.mr <= ScheduleTuning::MAX_REGISTER_ROWS,
                    "{g:?}"
                );
                assert_eq!(g.mc % g.mr, 0, "{g:?}");
                assert_eq!(g.nc % g.nr, 0, "{g:?}");
                assert_eq!(g.kc % 8, 0, "{g:?}");
                assert!(g.mc >= g.mr && g.nc >= g.nr && g.kc >= 8, "{g:?}");
            }
        }
        let halved = b.tuned(&ScheduleTuning {
            block_scale_log2: [0, -1, 1],
            ..ScheduleTuning::default()
        });
        assert_eq!(
            (halved.kc, halved.nc, halved.mc),
            (b.kc / 2, b.nc * 2, b.mc)
        );
    }
}

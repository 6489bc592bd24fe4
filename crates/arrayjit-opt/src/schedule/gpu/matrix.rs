//! Matrix products on a GPU's matrix units (NVIDIA tensor cores): which products run there, in
//! which fragment shape, and how a group's tile is laid out over its warps.
//!
//! **Precision rules.**
//! - Factors in `bf16` or `f16` multiply on the matrix units exactly (the product of two such
//!   values is exact in `f32`) and accumulate in `f32`; the result is rounded to its own
//!   precision once, when stored. The loop nest rounds a 16-bit result at every step, so a
//!   matrix-unit product is at least as accurate.
//! - `f32` factors run on the matrix units only as TF32 (inputs rounded to 10 mantissa bits,
//!   to nearest, ties away from zero; products and sums in `f32`), and only where the user
//!   allows it ([`super::super::ScheduleSettings::allow_tf32`], off by default, as PyTorch's
//!   `allow_tf32`): otherwise they keep the exact `f32` tiled product.
//! - Within one fragment product the hardware adds in an order of its own; the CUDA emulation
//!   adds in the order of `k`. Results therefore agree with the loop nest to `f32` rounding of
//!   the sums, not bit for bit, and never depend on timing.
//!
//! **Copies.** A factor whose staged rows are whole 16-byte runs of it — its contiguous axis
//! (stride 1) is the staged tile's, and that axis's extent, its other strides and its batch
//! strides are multiples of 16 bytes — is copied by asynchronous 16-byte copies (`cp.async`,
//! zero-filled past its end), which bypass registers and overlap the multiplication of the
//! other buffer; any other factor element by element. This relies on every array starting on
//! a 16-byte boundary, as the `cuda` backend's pools (256-byte aligned) ensure. On sm_90, where
//! the tuning asks, warpgroup products' 16-bit factors are staged by the tensor memory
//! accelerator instead ([`super::tensor_map`]).
//!
//! **Layout.** A group computes a `tile × tile` block of results (32, 64 or 128 a side) with
//! [`MatrixTile::warps`] warps of 32 lanes, each owning a `warp_rows × warp_cols` part of the
//! block as `16 × 8` fragments.
//!
//! **Pipeline.** The factors' tiles are staged `depth` deep in shared memory in
//! [`MatrixTile::stages`] buffers (up to [`MAX_MATRIX_STAGES`], as many as the shared memory
//! holds that lets two groups share a compute unit, at least 2; beyond the 48 KiB a CUDA kernel
//! may declare statically, in dynamic shared memory the kernel opts in to): the copies of the
//! next [`MatrixTile::lookahead`] depths are in flight while one multiplies (`stages - 1`, or
//! `stages - 2` where warpgroup products stay in flight for a step). Each step waits until
//! its depth's copies have landed (leaving the later ones in flight), passes one barrier,
//! issues the copies of the depth `lookahead` ahead into the buffer multiplied
//! `stages - lookahead` steps before, and multiplies.
//!
//! **Warpgroups** (sm_90). Where the device has them, 64- and 128-tiles are multiplied by
//! `wgmma.mma_async` (`m64nNk16` for 16-bit factors, `m64nNk8` for TF32; `N` the tile): each
//! warpgroup (4 warps)
//! computes 64 rows of the tile from the staged tiles in shared memory, addressed by matrix
//! descriptors, without loading fragments into registers. The staged tiles are then in the
//! instruction's canonical layouts: a factor whose contiguous axis is `k` as rows of 64 bytes
//! (`depth` = 32 elements) swizzled in 512-byte atoms (the 64-byte swizzle; 8-row groups 512
//! bytes apart); one whose contiguous axis is the result side as blocks of 64 elements, each
//! `depth` rows of 128 bytes swizzled in 1024-byte atoms (the 128-byte swizzle; 8-row groups
//! 1024 bytes apart, blocks `depth · 128` bytes apart), the descriptor's transpose bit set.
//! Each step fences the staged copies for the asynchronous proxy before its barrier, then
//! issues one `wgmma` per fragment depth and waits for the previous step's
//! ([`MatrixTile::products_in_flight`]; with only 2 buffers, for its own), so one step's
//! products run while the next step waits at its barrier and issues its copies.
//!
//! **TF32 on warpgroups.** `wgmma` reads TF32 factors from shared memory as they are, and
//! only `k`-major ([`MatrixTile::k_staged`]). So both factors are staged through registers
//! ([`MatrixTile::rounds_while_staging`]; 16 bytes a load where [`MatrixTile::runs_fit`],
//! else element by element): each element is rounded to TF32
//! (to nearest, ties away from zero, as on warps) on its way, and a factor whose contiguous
//! axis is the result side is transposed into `k`-major rows (read along its contiguous axis,
//! so the reads stay coalesced). The rows are those of a 16-bit factor of the same bytes
//! (`depth` TF32 elements: 64 or 128 bytes), swizzled the same way. A step issues its
//! products before its copies, so the copies' loads wait while the products run.
//!
//! **Swizzle.** Staged rows of 16-bit factors are not padded: each row's 16-byte chunks are
//! permuted by an XOR with the row's position among the rows that share a 128-byte line group
//! ([`MatrixTile::swizzle`]), so the 8 rows a fragment load (`ldmatrix`) reads at one chunk
//! fall in 8 different groups of banks, and every 16-byte copy still lands whole. TF32 rows
//! on warps are padded by 16 bytes instead (their fragments load word by word).

use std::fmt;

use super::{GpuLimits, TileOrder};
use crate::schedule::{Gemm, ScheduleTuning};
use arrayjit_ir::prec::Prec;

/// The element type a matrix-unit product multiplies in, and its fragment shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MatrixKind {
    /// `bf16` factors, `f32` accumulation: `m16n8k16` fragments.
    Bf16,
    /// `f16` factors, `f32` accumulation: `m16n8k16` fragments.
    F16,
    /// `f32` factors rounded to TF32, `f32` accumulation: `m16n8k8` fragments (opt-in).
    Tf32,
}

impl MatrixKind {
    /// The fragment's depth: `k` of one matrix-unit instruction (16, or 8 for TF32).
    pub fn fragment_depth(self) -> usize {
        match self {
            MatrixKind::Bf16 | MatrixKind::F16 => 16,
            MatrixKind::Tf32 => 8,
        }
    }

    /// Bytes of one staged factor element (2, or 4 for TF32).
    pub fn element_bytes(self) -> usize {
        match self {
            MatrixKind::Bf16 | MatrixKind::F16 => 2,
            MatrixKind::Tf32 => 4,
        }
    }

    /// The factors' precision.
    pub fn factor_prec(self) -> Prec {
        match self {
            MatrixKind::Bf16 => Prec::Bf16,
            MatrixKind::F16 => Prec::F16,
            MatrixKind::Tf32 => Prec::F32,
        }
    }

    /// The kind that multiplies factors of `prec`, where TF32 is allowed or not.
    pub fn for_factors(prec: Prec, allow_tf32: bool) -> Option<MatrixKind> {
        match prec {
            Prec::Bf16 => Some(MatrixKind::Bf16),
            Prec::F16 => Some(MatrixKind::F16),
            Prec::F32 if allow_tf32 => Some(MatrixKind::Tf32),
            _ => None,
        }
    }

    /// Its name in the PTX instruction (`bf16`, `f16`, `tf32`).
    pub fn name(self) -> &'static str {
        match self {
            MatrixKind::Bf16 => "bf16",
            MatrixKind::F16 => "f16",
            MatrixKind::Tf32 => "tf32",
        }
    }
}

impl fmt::Display for MatrixKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The tile sides a matrix-unit product may have.
pub const MATRIX_TILES: [usize; 3] = [32, 64, 128];

/// The most buffers of a matrix-unit product's staged tiles.
pub const MAX_MATRIX_STAGES: usize = 6;

/// Rows of one fragment (`m16`).
pub const FRAGMENT_ROWS: usize = 16;
/// Columns of one fragment (`n8`).
pub const FRAGMENT_COLS: usize = 8;
/// Lanes of a warp.
pub const WARP_LANES: usize = 32;
/// Rows of results of one warpgroup's fragment (`m64`), and the result-side elements of one
/// staged block of a factor whose contiguous axis is the result side (128 bytes).
pub const WARPGROUP_ROWS: usize = 64;
/// Lanes of a warpgroup (four warps).
pub const WARPGROUP_LANES: usize = 128;

/// How a group of a matrix-unit product is laid out: its tile over warps, and its staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixTile {
    /// Results per side of the group's tile.
    pub tile: usize,
    /// The fragment kind.
    pub kind: MatrixKind,
    /// Whether the left and the right factor's tiles are copied by asynchronous 16-byte
    /// copies ([`MatrixTile::async_copy_fits`]), else element by element.
    pub async_copy: [bool; 2],
    /// Buffers of the staged tiles (2 to [`MAX_MATRIX_STAGES`]).
    pub stages: usize,
    /// Warpgroups multiply (`wgmma.mma_async`, sm_90): each of `tile / 64` warpgroups of 128
    /// lanes computes 64 rows × `tile` columns straight from the staged tiles, which then
    /// follow the instruction's canonical layouts (see the module documentation); else warps
    /// multiply `m16n8` fragments (`mma.sync`).
    pub warpgroups: bool,
    /// The buffers take more shared memory than a group may declare statically
    /// ([`GpuLimits::max_shared_bytes`]): the kernel opts in to dynamic shared memory
    /// ([`GpuLimits::max_opt_in_shared_bytes`]) and is launched with
    /// [`MatrixTile::shared_bytes`] of it.
    pub dynamic_shared: bool,
    /// The order in which groups take their tiles.
    pub order: TileOrder,
    /// Fragment depths of `k` per staged buffer: [`MatrixTile::SHALLOW`] (2) or, on
    /// warpgroups only, [`MatrixTile::DEEP`] (4: half the barriers and waits per product, as
    /// many bytes in flight in half as many buffers; `k`-contiguous factors then take
    /// 128-byte rows and the 128-byte swizzle). Warps' `mma.sync` products stay shallow:
    /// four fragment depths per step need more registers than two groups per unit leave
    /// them (ptxas spills 68–124 bytes of the `bf16` 128-tiles on sm_80). Nor do TF32
    /// warpgroups, whose copies through registers then hold twice the elements (ptxas spills
    /// 80–216 bytes of the 128-tiles on sm_90a).
    pub fragments_deep: usize,
    /// Whether the left and the right factor's tiles are staged by the tensor memory
    /// accelerator ([`super::tensor_map`]: one invocation issues each buffer's bulk tensor
    /// copies, an `mbarrier` per buffer says when they have landed) instead of by every
    /// invocation's asynchronous copies: where the tuning asks for it and the factor's
    /// layout allows it ([`MatrixTile::tensor_map`]).
    pub tensor_copy: [bool; 2],
}

impl MatrixTile {
    /// Fragment depths per buffer by default.
    pub const SHALLOW: usize = 2;
    /// Fragment depths per buffer of deep stages.
    pub const DEEP: usize = 4;

    /// The layout of `tile`-tiles of `kind` for `gemm`, each factor copied asynchronously
    /// where it fits, with as many buffers as `max_shared_bytes` holds (up to
    /// [`MAX_MATRIX_STAGES`]), multiplied by warpgroups where the device has them
    /// (`warpgroup_mma`) and the tile is 64 or 128; `None` where not
    /// even two buffers fit.
    pub fn new(
        gemm: &Gemm,
        tile: usize,
        kind: MatrixKind,
        max_shared_bytes: usize,
        warpgroup_mma: bool,
    ) -> Option<MatrixTile> {
        MatrixTile::with_depth(
            gemm,
            tile,
            kind,
            max_shared_bytes,
            warpgroup_mma,
            MatrixTile::SHALLOW,
        )
    }

    /// [`MatrixTile::new`] with `fragments_deep` fragment depths per buffer
    /// ([`MatrixTile::SHALLOW`], or [`MatrixTile::DEEP`] where warpgroups multiply; other
    /// requests are taken as the nearer that applies).
    pub fn with_depth(
        gemm: &Gemm,
        tile: usize,
        kind: MatrixKind,
        max_shared_bytes: usize,
        warpgroup_mma: bool,
        fragments_deep: usize,
    ) -> Option<MatrixTile> {
        let warpgroups = warpgroup_mma && tile.is_multiple_of(WARPGROUP_ROWS);
        let mut t = MatrixTile {
            tile,
            kind,
            async_copy: [false; 2],
            stages: 2,
            warpgroups,
            dynamic_shared: false,
            order: TileOrder::for_tiles(gemm.m.extent.div_ceil(tile), gemm.n.extent.div_ceil(tile)),
            fragments_deep: if warpgroups
                && kind != MatrixKind::Tf32
                && fragments_deep >= MatrixTile::DEEP
            {
                MatrixTile::DEEP
            } else {
                MatrixTile::SHALLOW
            },
            tensor_copy: [false; 2],
        };
        t.stages = (2..=MAX_MATRIX_STAGES)
            .rev()
            .find(|&s| s * t.stage_bytes() <= max_shared_bytes)?;
        t.async_copy = [1, 2].map(|f| t.async_copy_fits(gemm, f));
        Some(t)
    }

    /// The layout of `tile`-tiles of `kind` for `gemm` on a device of `limits`: buffers in
    /// as much shared memory as lets two groups share a unit
    /// ([`GpuLimits::tile_shared_bytes`]), at most `tuning.gpu_stages` of them where the
    /// tuning says (at least 2), each `tuning.gpu_stage_fragments` fragment depths deep
    /// (default [`MatrixTile::SHALLOW`]), in dynamic shared memory where they exceed what a
    /// group may declare statically, factors staged by the tensor memory accelerator where
    /// `tuning.gpu_tensor_copies` asks and they allow it; `None` where not even two buffers
    /// fit.
    pub fn for_device(
        gemm: &Gemm,
        tile: usize,
        kind: MatrixKind,
        limits: &GpuLimits,
        tuning: &ScheduleTuning,
    ) -> Option<MatrixTile> {
        let mut t = MatrixTile::with_depth(
            gemm,
            tile,
            kind,
            limits.tile_shared_bytes(),
            limits.warpgroup_mma,
            tuning.gpu_stage_fragments.unwrap_or(MatrixTile::SHALLOW),
        )?;
        if let Some(most) = tuning.gpu_stages {
            t.stages = t.stages.min(most.clamp(2, MAX_MATRIX_STAGES));
        }
        if tuning.gpu_tensor_copies {
            t.tensor_copy = [1, 2].map(|f| t.tensor_map(gemm, f).is_some());
            // The buffers' mbarriers take a few bytes beside them: a buffer fewer where the
            // group's share would not hold them.
            while t.stages > 2 && t.group_shared_bytes() > limits.tile_shared_bytes() {
                t.stages -= 1;
            }
        }
        t.dynamic_shared = t.group_shared_bytes() > limits.max_shared_bytes;
        Some(t)
    }

    /// Steps of warpgroup products left running while the next step is issued: one where
    /// there are at least 3 buffers (the buffer each step refills is then the one multiplied
    /// two steps before, whose products every invocation has waited for before the step's
    /// barrier), else none (warps' `mma.sync` products finish as issued).
    pub fn products_in_flight(&self) -> usize {
        usize::from(self.warpgroups && self.stages >= 3)
    }

    /// Depths whose copies are in flight ahead of the one multiplied: `stages - 1`, less the
    /// steps of products in flight ([`MatrixTile::products_in_flight`]); at least 1.
    pub fn lookahead(&self) -> usize {
        (self.stages - 1 - self.products_in_flight()).max(1)
    }

    /// Whether factor `f` (1: left, 2: right, as in [`super::super::Dim::strides`]) has `k`
    /// as the contiguous axis of its staged tile: its `k` stride is the smaller one.
    pub fn k_contiguous(gemm: &Gemm, f: usize) -> bool {
        super::simt::k_contiguous(gemm, f)
    }

    /// Elements of one 16-byte copy.
    pub fn copy_elements(&self) -> usize {
        16 / self.kind.element_bytes()
    }

    /// Whether TF32 factors are staged rounded, element by element: on warpgroups, whose
    /// products read them from shared memory as they are (see the module doc).
    pub fn rounds_while_staging(&self) -> bool {
        self.warpgroups && self.kind == MatrixKind::Tf32
    }

    /// Whether factor `f` (1: left, 2: right) is staged with `k` as the contiguous axis of its
    /// tile in shared memory: where `k` is the factor's own contiguous axis, and always for
    /// TF32 on warpgroups (`wgmma` takes TF32 factors only `k`-major: a factor whose
    /// contiguous axis is the result side is transposed while it is staged).
    pub fn k_staged(&self, gemm: &Gemm, f: usize) -> bool {
        self.rounds_while_staging() || MatrixTile::k_contiguous(gemm, f)
    }

    /// Whether factor `f`'s staged rows are whole 16-byte runs of it, which it is then copied
    /// by (see the module doc); never where TF32 factors are rounded while staged.
    pub fn async_copy_fits(&self, gemm: &Gemm, f: usize) -> bool {
        !self.rounds_while_staging() && self.runs_fit(gemm, f)
    }

    /// Whether factor `f`'s rows along its contiguous axis, as a tile reads them, are whole
    /// 16-byte runs of it (16-byte aligned where every array starts on a 16-byte boundary):
    /// what asynchronous copies need, and what lets copies through registers read 16 bytes
    /// at a time.
    pub fn runs_fit(&self, gemm: &Gemm, f: usize) -> bool {
        let c = self.copy_elements();
        let side = if f == 1 { &gemm.m } else { &gemm.n };
        let (inner, outer) = if MatrixTile::k_contiguous(gemm, f) {
            (&gemm.k, side)
        } else {
            (side, &gemm.k)
        };
        inner.strides[f] == 1
            && inner.extent.is_multiple_of(c)
            && outer.strides[f].is_multiple_of(c)
            && gemm.batch.iter().all(|b| b.strides[f].is_multiple_of(c))
            && (self.tile * self.depth()).is_multiple_of(c * self.threads() as usize)
    }
    /// Warps along the rows and the columns of the tile: 2 × 4 for 128-tiles (8 warps), 2 × 2
    /// for 64- and 32-tiles (4 warps).
    pub fn warp_grid(&self) -> (usize, usize) {
        if self.tile >= 128 { (2, 4) } else { (2, 2) }
    }

    /// Warps of a group.
    pub fn warps(&self) -> usize {
        let (r, c) = self.warp_grid();
        r * c
    }

    /// Invocations of a group: its warps, or its `tile / 64` warpgroups.
    pub fn threads(&self) -> u32 {
        if self.warpgroups {
            (self.tile / WARPGROUP_ROWS * WARPGROUP_LANES) as u32
        } else {
            (self.warps() * WARP_LANES) as u32
        }
    }

    /// Elements of one staged row where the result side is the contiguous axis: the tile's
    /// side, or blocks of 64 (128 bytes) for warpgroups, the tile's blocks one after another.
    pub fn side_block(&self) -> usize {
        if self.warpgroups {
            WARPGROUP_ROWS
        } else {
            self.tile
        }
    }

    /// Rows of results of one warp.
    pub fn warp_rows(&self) -> usize {
        self.tile / self.warp_grid().0
    }

    /// Columns of results of one warp.
    pub fn warp_cols(&self) -> usize {
        self.tile / self.warp_grid().1
    }

    /// Fragments of one warp along the rows (`warp_rows / 16`) and the columns
    /// (`warp_cols / 8`).
    pub fn fragments(&self) -> (usize, usize) {
        (
            self.warp_rows() / FRAGMENT_ROWS,
            self.warp_cols() / FRAGMENT_COLS,
        )
    }

    /// The depth of the staged factor tiles: [`MatrixTile::fragments_deep`] fragments deep.
    pub fn depth(&self) -> usize {
        self.fragments_deep * self.kind.fragment_depth()
    }

    /// Elements of padding after each staged row: none where rows are swizzled (16-bit
    /// factors, and TF32 on warpgroups), 16 bytes for TF32 on warps (see
    /// [`MatrixTile::swizzle`]).
    pub fn padding(&self) -> usize {
        if self.padded() {
            16 / self.kind.element_bytes()
        } else {
            0
        }
    }

    /// TF32 rows on warps are padded instead of swizzled.
    fn padded(&self) -> bool {
        self.kind == MatrixKind::Tf32 && !self.warpgroups
    }

    /// Elements of one staged factor tile (`tile × depth`, rows padded), whichever of its two
    /// axes is contiguous.
    pub fn staged_elements(&self) -> usize {
        let (d, t, p) = (self.depth(), self.tile, self.padding());
        (t * (d + p)).max(d * (t + p))
    }

    /// Shared memory of one buffer of both factors' tiles.
    pub fn stage_bytes(&self) -> usize {
        2 * self.staged_elements() * self.kind.element_bytes()
    }

    /// Shared memory of the buffers of both factors' tiles.
    pub fn shared_bytes(&self) -> usize {
        self.stages * self.stage_bytes()
    }

    /// Shared memory of a group: its buffers, and where the tensor memory accelerator stages
    /// a factor, one 8-byte `mbarrier` per buffer.
    pub fn group_shared_bytes(&self) -> usize {
        let barriers = if self.tensor_copy.contains(&true) {
            8 * self.stages
        } else {
            0
        };
        self.shared_bytes() + barriers
    }

    /// The swizzle of staged rows of `inner` elements: chunk `c` (16 bytes) of row `r` is
    /// stored as chunk `c ^ ((r / rows) % chunks)`, given as (`rows`, `chunks`): `rows` rows
    /// share a 128-byte line group, whose `chunks` chunks are permuted. TF32 rows on warps
    /// are not swizzled (`(1, 1)`) but padded: their fragments load word by word, where
    /// swizzled addresses cost the 128-tile registers it does not have (ptxas spills them).
    /// On warpgroups they are swizzled as the 16-bit ones of the same bytes are (the
    /// canonical layouts are in bytes).
    pub fn swizzle(&self, inner: usize) -> (usize, usize) {
        if self.padded() {
            return (1, 1);
        }
        let chunks = (inner * self.kind.element_bytes() / 16).max(1);
        ((8 / chunks).max(1), chunks.min(8))
    }

    /// `f32` accumulators each invocation holds.
    pub fn accumulators(&self) -> usize {
        if self.warpgroups {
            // 64 × tile results over a warpgroup's 128 lanes.
            return self.tile / 2;
        }
        let (fm, fn_) = self.fragments();
        fm * fn_ * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `bf16` `[n, n] · [n, n]` product's `Gemm`.
    fn square_gemm(n: usize) -> Gemm {
        use arrayjit_ir::assignments::{AccumRhs, Assignments, Operand};
        use arrayjit_ir::ops::BinOp;
        use arrayjit_ir::tnode::Tnode;
        let t = |l: &str| Tnode::new(Prec::Bf16, &[n, n], &[l]).unwrap();
        let (a, b, c) = (t("a"), t("b"), t("c"));
        let program = Assignments::einsum(
            "mk,kn->mn",
            BinOp::Add,
            &c,
            AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
            true,
        )
        .unwrap();
        let lowered = program.lower(&[]).unwrap();
        let arrayjit_ir::low_level::LowLevel::Seq(items) = &lowered else {
            panic!("{lowered:?}")
        };
        items
            .iter()
            .find_map(crate::schedule::Contraction::detect_for_matrix_units)
            .and_then(|c| {
                c.gemm(crate::schedule::Blocking::for_cpu(
                    4,
                    16,
                    4,
                    [0; 3],
                    Default::default(),
                ))
            })
            .unwrap()
    }

    #[test]
    fn tiles_cover_their_warps_with_whole_fragments() {
        for kind in [MatrixKind::Bf16, MatrixKind::F16, MatrixKind::Tf32] {
            for tile in MATRIX_TILES {
                let t = MatrixTile::new(&square_gemm(tile), tile, kind, 48 << 10, false).unwrap();
                let (fm, fn_) = t.fragments();
                assert_eq!(fm * FRAGMENT_ROWS * t.warp_grid().0, tile);
                assert_eq!(fn_ * FRAGMENT_COLS * t.warp_grid().1, tile);
                // Fragment loads take the columns' fragments two at a time.
                assert_eq!(fn_ % 2, 0);
                assert!(t.shared_bytes() <= 48 << 10, "{t:?}");
                assert!(
                    t.stages >= if kind == MatrixKind::Tf32 { 2 } else { 3 },
                    "{t:?}"
                );
                // Whichever axis is contiguous, the 8 rows an `ldmatrix` reads at one chunk
                // fall in 8 different bank groups of 16 bytes, and rows are whole chunks.
                for inner in [t.depth(), tile] {
                    let bytes = (inner + t.padding()) * kind.element_bytes();
                    assert_eq!(bytes % 16, 0);
                    let (rows, chunks) = t.swizzle(inner);
                    if kind == MatrixKind::Tf32 {
                        // Padded rows: 8 rows at one chunk start 16 bytes apart, mod 128.
                        assert_eq!((bytes / 16) % 2, 1, "{t:?}");
                        continue;
                    }
                    for first in (0..tile.min(t.depth())).step_by(8) {
                        for c in 0..bytes / 16 {
                            let groups: std::collections::BTreeSet<usize> = (first..first + 8)
                                .map(|r| (r * bytes / 16 + (c ^ ((r / rows) % chunks))) % 8)
                                .collect();
                            assert_eq!(groups.len(), 8, "{t:?} inner {inner} chunk {c}");
                        }
                    }
                }
            }
        }
        let big =
            MatrixTile::new(&square_gemm(128), 128, MatrixKind::Bf16, 48 << 10, false).unwrap();
        assert_eq!((big.threads(), big.accumulators()), (256, 64));
        // Three buffers of 16 KiB fill 48 KiB; 64 KiB would take four; 24 KiB not two.
        assert_eq!((big.stages, big.shared_bytes()), (3, 3 * 2 * 128 * 32 * 2));
        let more =
            MatrixTile::new(&square_gemm(128), 128, MatrixKind::Bf16, 64 << 10, false).unwrap();
        assert_eq!(more.stages, 4);
        assert!(
            MatrixTile::new(&square_gemm(128), 128, MatrixKind::Bf16, 24 << 10, false).is_none()
        );
        // Warpgroups: two for a 128-tile (64 rows each), one for a 64-tile, none for 32-tiles;
        // each lane holds half a row of the tile.
        let wg =
            |tile, kind| MatrixTile::new(&square_gemm(tile), tile, kind, 48 << 10, true).unwrap();
        let w128 = wg(128, MatrixKind::Bf16);
        assert!(w128.warpgroups);
        assert_eq!(
            (w128.threads(), w128.accumulators(), w128.side_block()),
            (256, 64, 64)
        );
        assert_eq!(w128.stages, 3);
        let w64 = wg(64, MatrixKind::F16);
        assert_eq!((w64.threads(), w64.accumulators()), (128, 32));
        assert!(!wg(32, MatrixKind::Bf16).warpgroups);
        // TF32 on warpgroups: rounded while staged (no asynchronous copies), `k`-major
        // whichever axis of a factor is contiguous, rows swizzled (64 bytes) and not padded.
        let t128 = wg(128, MatrixKind::Tf32);
        assert!(t128.warpgroups && t128.rounds_while_staging());
        assert_eq!(t128.async_copy, [false; 2]);
        assert_eq!((t128.padding(), t128.depth()), (0, 16));
        assert_eq!(t128.swizzle(t128.depth()), (2, 4));
        // The right factor of `mk,kn` has its columns (the result side) contiguous.
        let g = square_gemm(128);
        assert!(!MatrixTile::k_contiguous(&g, 2));
        assert!(t128.k_staged(&g, 2));
        let on_warps = MatrixTile::new(&g, 128, MatrixKind::Tf32, 48 << 10, false);
        assert!(!on_warps.unwrap().k_staged(&g, 2));
    }

    #[test]
    fn tf32_only_where_allowed() {
        assert_eq!(MatrixKind::for_factors(Prec::F32, false), None);
        assert_eq!(
            MatrixKind::for_factors(Prec::F32, true),
            Some(MatrixKind::Tf32)
        );
        assert_eq!(
            MatrixKind::for_factors(Prec::Bf16, false),
            Some(MatrixKind::Bf16)
        );
        assert_eq!(MatrixKind::for_factors(Prec::F64, true), None);
    }

    #[test]
    fn only_warpgroups_stage_four_fragments_deep() {
        let g = square_gemm(128);
        for (warpgroups, kind, want) in [
            (true, MatrixKind::Bf16, 64),
            (false, MatrixKind::Bf16, 32),
            (false, MatrixKind::Tf32, 16),
            (true, MatrixKind::Tf32, 16),
        ] {
            let t = MatrixTile::with_depth(&g, 128, kind, 200 << 10, warpgroups, MatrixTile::DEEP)
                .unwrap();
            assert_eq!(t.depth(), want, "{kind} warpgroups {warpgroups}: {t:?}");
            // A deep buffer holds twice a shallow one's bytes.
            let shallow = MatrixTile::new(&g, 128, kind, 200 << 10, warpgroups).unwrap();
            assert_eq!(
                t.stage_bytes(),
                shallow.stage_bytes() * t.fragments_deep / MatrixTile::SHALLOW
            );
        }
    }
}

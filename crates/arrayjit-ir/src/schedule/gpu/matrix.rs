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
//! a 16-byte boundary, as the `cuda` backend's pools (256-byte aligned) ensure.
//!
//! **Layout.** A group computes a `tile × tile` block of results (32, 64 or 128 a side) with
//! [`MatrixTile::warps`] warps of 32 lanes, each owning a `warp_rows × warp_cols` part of the
//! block as `16 × 8` fragments. The factors' tiles are staged `depth` deep in shared memory
//! in two buffers (the next tile loads while the current one multiplies), each row padded by
//! 16 bytes so the eight rows a fragment load reads fall in different banks.

use std::fmt;

use crate::prec::Prec;
use crate::schedule::Gemm;

/// The element type a matrix-unit product multiplies in, and its fragment shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// Rows of one fragment (`m16`).
pub const FRAGMENT_ROWS: usize = 16;
/// Columns of one fragment (`n8`).
pub const FRAGMENT_COLS: usize = 8;
/// Lanes of a warp.
pub const WARP_LANES: usize = 32;

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
}

impl MatrixTile {
    /// The layout of `tile`-tiles of `kind` for `gemm`, each factor copied asynchronously
    /// where it fits.
    pub fn new(gemm: &Gemm, tile: usize, kind: MatrixKind) -> MatrixTile {
        let mut t = MatrixTile {
            tile,
            kind,
            async_copy: [false; 2],
        };
        t.async_copy = [1, 2].map(|f| t.async_copy_fits(gemm, f));
        t
    }

    /// Whether factor `f` (1: left, 2: right, as in [`super::super::Dim::strides`]) has `k`
    /// as the contiguous axis of its staged tile: its `k` stride is the smaller one.
    pub fn k_contiguous(gemm: &Gemm, f: usize) -> bool {
        let side = if f == 1 { &gemm.m } else { &gemm.n };
        gemm.k.strides[f] <= side.strides[f]
    }

    /// Elements of one 16-byte copy.
    pub fn copy_elements(&self) -> usize {
        16 / self.kind.element_bytes()
    }

    /// Whether factor `f`'s staged rows are whole 16-byte runs of it (see the module doc).
    pub fn async_copy_fits(&self, gemm: &Gemm, f: usize) -> bool {
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

    /// Invocations of a group.
    pub fn threads(&self) -> u32 {
        (self.warps() * WARP_LANES) as u32
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

    /// The depth of the staged factor tiles: two fragments deep.
    pub fn depth(&self) -> usize {
        2 * self.kind.fragment_depth()
    }

    /// Elements of padding at the end of each staged row: 16 bytes.
    pub fn padding(&self) -> usize {
        16 / self.kind.element_bytes()
    }

    /// Elements of one staged factor tile (`tile × depth`, rows padded), whichever of its
    /// two axes is contiguous.
    pub fn staged_elements(&self) -> usize {
        let (d, t, p) = (self.depth(), self.tile, self.padding());
        (t * (d + p)).max(d * (t + p))
    }

    /// Shared memory of a group: two buffers of both factors' tiles.
    pub fn shared_bytes(&self) -> usize {
        2 * 2 * self.staged_elements() * self.kind.element_bytes()
    }

    /// `f32` accumulators each invocation holds.
    pub fn accumulators(&self) -> usize {
        let (fm, fn_) = self.fragments();
        fm * fn_ * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_their_warps_with_whole_fragments() {
        for kind in [MatrixKind::Bf16, MatrixKind::F16, MatrixKind::Tf32] {
            for tile in MATRIX_TILES {
                let t = MatrixTile {
                    tile,
                    kind,
                    async_copy: [false; 2],
                };
                let (fm, fn_) = t.fragments();
                assert_eq!(fm * FRAGMENT_ROWS * t.warp_grid().0, tile);
                assert_eq!(fn_ * FRAGMENT_COLS * t.warp_grid().1, tile);
                // Fragment loads take the columns' fragments two at a time.
                assert_eq!(fn_ % 2, 0);
                assert!(t.shared_bytes() <= 48 << 10, "{t:?}");
                // Staged rows start on 16-byte boundaries.
                assert_eq!(((t.depth() + t.padding()) * kind.element_bytes()) % 16, 0);
            }
        }
        let big = MatrixTile {
            tile: 128,
            kind: MatrixKind::Bf16,
            async_copy: [true; 2],
        };
        assert_eq!((big.threads(), big.accumulators()), (256, 64));
        assert_eq!(big.shared_bytes(), 2 * 2 * 128 * 40 * 2);
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
}

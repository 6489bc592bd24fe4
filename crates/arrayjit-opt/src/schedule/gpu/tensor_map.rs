//! Factors of sm_90 warpgroup products staged by the tensor memory accelerator (TMA): which
//! factors may be, and how the accelerator sees them (a tensor map: the factor's axes, the box
//! each copy moves, the swizzle it lands with).
//!
//! **What changes.** Without it, every invocation of a group issues 16-byte asynchronous
//! copies (`cp.async`) of its share of each buffer, computing a swizzled address and bounds
//! tests for each. With it, one invocation issues each buffer's copies — one bulk tensor copy
//! per factor tile (`cp.async.bulk.tensor`), or one per 64-element block where the result side
//! is the factor's contiguous axis — the accelerator swizzles them as the warpgroup products'
//! canonical layouts ask (the same 64- and 128-byte swizzles, on the same address bits) and
//! fills elements past the factor's ends with zeros, and the group waits on one `mbarrier` per
//! buffer, armed with the bytes the buffer's copies bring, instead of `cp.async` groups. The
//! pipeline (buffers, lookahead, the barrier that frees a buffer for refilling) is unchanged.
//!
//! **Which factors.** 16-bit factors of warpgroup products (TF32 ones are rounded while staged,
//! which the accelerator cannot do) whose tiles are copied by 16-byte asynchronous copies
//! ([`MatrixTile::async_copy_fits`]), and whose axes — the reduction, the result side and
//! each batch axis the factor moves along — ordered by stride, start with the contiguous one,
//! do not overlap (each stride at least the previous axis's extent times its stride), are
//! 16-byte multiples, and number at most [`MAX_TENSOR_RANK`]. The tensor map then has these
//! axes in that order; a copy's box is the tile along the reduction and the result side
//! (64 elements of the result side where it is contiguous) and one element of each batch
//! axis, so the box lands as the staged tile's bytes.
//!
//! **Choice.** Off by default ([`crate::schedule::ScheduleTuning::gpu_tensor_copies`]) until
//! it is timed on a GPU; the schedule search tries it.

use super::matrix::{MatrixKind, MatrixTile, WARPGROUP_ROWS};
use crate::schedule::Gemm;

/// The most axes a tensor map describes.
pub const MAX_TENSOR_RANK: usize = 5;

/// Strides of a tensor map are below 2^40 bytes.
const MAX_STRIDE_BYTES: usize = 1 << 40;

/// Which of a product's loops an axis of a tensor-mapped factor follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorAxisRole {
    /// The reduction (`k`).
    Reduction,
    /// The factor's result side (rows of the left factor, columns of the right).
    Side,
    /// Batch loop `d` of [`Gemm::batch`].
    Batch(usize),
}

/// One axis of a tensor map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorAxis {
    /// The loop it follows.
    pub role: TensorAxisRole,
    /// Its extent.
    pub extent: usize,
    /// Its stride, in elements.
    pub stride: usize,
    /// Elements of one copy's box along it.
    pub boxed: usize,
}

/// How the tensor memory accelerator sees one factor of a warpgroup product: what a backend
/// encodes into a tensor map (`cuTensorMapEncodeTiled`) from the factor's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapShape {
    /// The factor: 1 left, 2 right.
    pub factor: usize,
    /// Bytes of one element.
    pub element_bytes: usize,
    /// Its axes, the contiguous one first, strides increasing.
    pub axes: Vec<TensorAxis>,
    /// The swizzle a copy lands with: 16-byte chunks permuted within runs of this many bytes
    /// (64 or 128), by address bits 7 and up.
    pub swizzle_bytes: usize,
}

impl TensorMapShape {
    /// Bytes one copy brings: its box's elements.
    pub fn box_bytes(&self) -> usize {
        self.axes.iter().map(|a| a.boxed).product::<usize>() * self.element_bytes
    }
}

impl MatrixTile {
    /// How the tensor memory accelerator would see factor `f` (1: left, 2: right) of `gemm`
    /// in these tiles, where it can (see the module documentation).
    pub fn tensor_map(&self, gemm: &Gemm, f: usize) -> Option<TensorMapShape> {
        if !self.warpgroups || self.kind == MatrixKind::Tf32 || !self.async_copy_fits(gemm, f) {
            return None;
        }
        let k_major = MatrixTile::k_contiguous(gemm, f);
        let side = if f == 1 { &gemm.m } else { &gemm.n };
        let mut axes = vec![
            TensorAxis {
                role: TensorAxisRole::Reduction,
                extent: gemm.k.extent,
                stride: gemm.k.strides[f],
                boxed: self.depth(),
            },
            TensorAxis {
                role: TensorAxisRole::Side,
                extent: side.extent,
                stride: side.strides[f],
                boxed: if k_major { self.tile } else { WARPGROUP_ROWS },
            },
        ];
        if !k_major {
            axes.swap(0, 1);
        }
        axes.extend(
            gemm.batch
                .iter()
                .enumerate()
                .filter(|(_, d)| d.strides[f] != 0 && d.extent > 1)
                .map(|(d, dim)| TensorAxis {
                    role: TensorAxisRole::Batch(d),
                    extent: dim.extent,
                    stride: dim.strides[f],
                    boxed: 1,
                }),
        );
        // The contiguous axis first, then by stride (a stable sort keeps it first).
        axes[1..].sort_by_key(|a| a.stride);
        let eb = self.kind.element_bytes();
        let fits = axes.len() <= MAX_TENSOR_RANK
            && axes[0].stride == 1
            && axes.iter().all(|a| {
                a.extent > 0
                    && i32::try_from(a.extent).is_ok()
                    && a.boxed <= 256
                    && (a.stride * eb) < MAX_STRIDE_BYTES
            })
            && axes.windows(2).all(|w| {
                (w[1].stride * eb).is_multiple_of(16) && w[1].stride >= w[0].stride * w[0].extent
            });
        let swizzle_bytes = axes[0].boxed * eb;
        (fits && matches!(swizzle_bytes, 64 | 128)).then_some(TensorMapShape {
            factor: f,
            element_bytes: eb,
            axes,
            swizzle_bytes,
        })
    }

    /// The tensor maps of the factors these tiles stage by the tensor memory accelerator
    /// ([`MatrixTile::tensor_copy`]), left first.
    pub fn tensor_maps(&self, gemm: &Gemm) -> Vec<TensorMapShape> {
        [1, 2]
            .into_iter()
            .filter(|&f| self.tensor_copy[f - 1])
            .filter_map(|f| self.tensor_map(gemm, f))
            .collect()
    }

    /// Bytes the tensor copies of one buffer bring, both factors' together (what its
    /// `mbarrier` is armed with).
    pub fn tensor_bytes_per_buffer(&self, gemm: &Gemm) -> usize {
        self.tensor_maps(gemm)
            .iter()
            .map(|m| m.box_bytes() * self.tensor_boxes(m))
            .sum()
    }

    /// Copies of factor `m`'s tile per buffer: one, or one per 64-element block where the
    /// result side is its contiguous axis.
    pub fn tensor_boxes(&self, m: &TensorMapShape) -> usize {
        if m.axes[0].role == TensorAxisRole::Side {
            self.tile / WARPGROUP_ROWS
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Blocking, Dim};

    fn gemm(batch: Vec<Dim>, m: Dim, n: Dim, k: Dim) -> Gemm {
        use arrayjit_ir::prec::Prec;
        use arrayjit_ir::tnode::Tnode;
        let t = || Tnode::new(Prec::Bf16, &[4], &["x"]).unwrap();
        Gemm {
            prec: Prec::Bf16,
            out: t(),
            lhs: t(),
            rhs: t(),
            batch,
            m,
            n,
            k,
            blocking: Blocking::for_cpu(4, 16, 4, [0; 3], Default::default()),
            guard: None,
            guard_statics: Vec::new(),
            overwrite: true,
            covers_out: true,
            batch_split: crate::schedule::BatchSplit::ByProduct,
        }
    }

    fn dim(extent: usize, strides: [usize; 3]) -> Dim {
        Dim { extent, strides }
    }

    fn tiles(g: &Gemm, tile: usize, deep: usize) -> MatrixTile {
        let mut t =
            MatrixTile::with_depth(g, tile, MatrixKind::Bf16, 200 << 10, true, deep).unwrap();
        t.tensor_copy = [true; 2];
        t
    }

    #[test]
    fn tensor_maps_follow_the_staged_layouts() {
        // `mk,kn`: the left factor k-major, the right one with its columns contiguous.
        let g = gemm(
            vec![],
            dim(256, [512, 384, 0]),
            dim(512, [1, 0, 1]),
            dim(384, [0, 1, 512]),
        );
        let t = tiles(&g, 128, MatrixTile::SHALLOW);
        let a = t.tensor_map(&g, 1).unwrap();
        assert_eq!(
            a.axes.iter().map(|x| (x.role, x.boxed)).collect::<Vec<_>>(),
            [(TensorAxisRole::Reduction, 32), (TensorAxisRole::Side, 128)]
        );
        assert_eq!((a.swizzle_bytes, a.box_bytes()), (64, 128 * 32 * 2));
        let b = t.tensor_map(&g, 2).unwrap();
        assert_eq!(
            b.axes.iter().map(|x| (x.role, x.boxed)).collect::<Vec<_>>(),
            [(TensorAxisRole::Side, 64), (TensorAxisRole::Reduction, 32)]
        );
        assert_eq!((b.swizzle_bytes, t.tensor_boxes(&b)), (128, 2));
        // Each buffer's copies bring both factors' whole tiles.
        assert_eq!(t.tensor_bytes_per_buffer(&g), t.stage_bytes());
        // Deep buffers: 128-byte rows of the k-major factor, with the 128-byte swizzle.
        let deep = tiles(&g, 64, MatrixTile::DEEP);
        assert_eq!(deep.tensor_map(&g, 1).unwrap().swizzle_bytes, 128);
        assert_eq!(deep.tensor_bytes_per_buffer(&g), deep.stage_bytes());
    }

    #[test]
    fn batch_axes_join_the_map_by_stride_and_broadcasts_stay_out() {
        // Attention-like: `[b, t, h, d]` queries times keys, batch (b, h); the right factor
        // shared by every `b` (stride 0).
        let (b, t, h, d) = (2, 128, 4, 64);
        let g = gemm(
            vec![dim(b, [h * t * t, t * h * d, 0]), dim(h, [t * t, d, t * d])],
            dim(t, [t, h * d, 0]),
            dim(t, [1, 0, d]),
            dim(d, [0, 1, 1]),
        );
        let tl = tiles(&g, 64, MatrixTile::SHALLOW);
        let a = tl.tensor_map(&g, 1).unwrap();
        assert_eq!(
            a.axes.iter().map(|x| x.role).collect::<Vec<_>>(),
            [
                TensorAxisRole::Reduction,
                TensorAxisRole::Batch(1),
                TensorAxisRole::Side,
                TensorAxisRole::Batch(0)
            ]
        );
        let bm = tl.tensor_map(&g, 2).unwrap();
        assert_eq!(bm.axes.len(), 3, "{bm:?}");
        // Overlapping axes (a stride smaller than the axis below spans) are not mapped.
        let overlapping = gemm(
            vec![dim(3, [0, 8, 0])],
            dim(64, [64, 64, 0]),
            dim(64, [1, 0, 1]),
            dim(64, [0, 1, 64]),
        );
        assert!(
            tiles(&overlapping, 64, 2)
                .tensor_map(&overlapping, 1)
                .is_none()
        );
        // Rows that are not 16-byte multiples are not mapped either.
        let ragged = gemm(
            vec![],
            dim(64, [64, 60, 0]),
            dim(64, [1, 0, 1]),
            dim(60, [0, 1, 64]),
        );
        assert!(tiles(&ragged, 64, 2).tensor_map(&ragged, 1).is_none());
    }

    #[test]
    fn only_16_bit_warpgroup_factors_are_mapped() {
        let g = gemm(
            vec![],
            dim(128, [128, 128, 0]),
            dim(128, [1, 0, 1]),
            dim(128, [0, 1, 128]),
        );
        let warps = MatrixTile::new(&g, 128, MatrixKind::Bf16, 200 << 10, false).unwrap();
        assert!(warps.tensor_map(&g, 1).is_none());
        let tf32 = MatrixTile::new(&g, 128, MatrixKind::Tf32, 200 << 10, true).unwrap();
        assert!(tf32.tensor_map(&g, 1).is_none());
    }
}

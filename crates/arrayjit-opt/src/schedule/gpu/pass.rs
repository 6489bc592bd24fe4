//! The GPU pass types a schedule records ([`GpuPass`], its grid loops, split depth and
//! epilogue): what a renderer prints, without the policy that chose them.

use super::*;
use crate::schedule::Gemm;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::tnode::Tnode;
use std::fmt;

/// One loop of a pass's grid: its iterator and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridLoop {
    /// The loop's iterator.
    pub iter: arrayjit_ir::indexing::Symbol,
    /// First iteration.
    pub from: i64,
    /// One past the last iteration.
    pub to: i64,
}

impl GridLoop {
    /// Its iterations (0 for an empty range).
    pub fn extent(&self) -> u64 {
        (self.to - self.from).max(0) as u64
    }
}

/// How one top-level statement runs on a GPU (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub enum GpuPass {
    /// Nothing to run (a comment, a no-op).
    Nothing,
    /// Zeroing a node of `elements` elements, one invocation each, in groups of `threads`.
    Zero {
        /// Elements of the node.
        elements: u64,
        /// Invocations per group.
        threads: u32,
    },
    /// A tiled `f32` matrix product: `tile × tile` results per group of [`TILE_THREADS`]
    /// (`tile / 16` × `tile / 16` per invocation), `groups` groups ([`simt`]).
    Tiles {
        /// The product.
        gemm: Gemm,
        /// It accumulates by fused multiply-add (else multiply, then add).
        fused: bool,
        /// The group's layout: its tile (16, 32, 64 or 128 a side), buffers and loads.
        layout: SimtTile,
        /// Groups of the launch: tiles times batch elements (of one slice, where the
        /// reduction is split: the first launch then has `groups` times the slices).
        groups: u64,
        /// The pointwise statement after it, run on each result as it is stored.
        epilogue: Option<Epilogue>,
        /// The reduction split into slices, each multiplied by groups of its own, where the
        /// tiles alone would leave the device idle (two launches then).
        split: Option<KSplit>,
    },
    /// A matrix product on the device's matrix units ([`matrix`]): `tile × tile` results per
    /// group of warps ([`MatrixTile`]), `groups` groups, accumulating in `f32` registers.
    MatrixTiles {
        /// The product.
        gemm: Gemm,
        /// The group's layout and the fragments' kind.
        layout: MatrixTile,
        /// Groups of the launch: tiles times batch elements (of one slice, where the
        /// reduction is split: the first launch then has `groups` times the slices).
        groups: u64,
        /// The pointwise statement after it, run on each result as it is stored.
        epilogue: Option<Epilogue>,
        /// The reduction split into slices, as for [`GpuPass::Tiles`].
        split: Option<KSplit>,
    },
    /// One invocation per iteration of the independent loops `grid` (`total` of them), in
    /// groups of `threads`, each running the rest of the nest ([`grid_loops`]).
    Grid {
        /// The grid's loops, outermost first.
        grid: Vec<GridLoop>,
        /// Iterations of the grid.
        total: u64,
        /// Invocations per group.
        threads: u32,
    },
    /// One group of `threads` per iteration of the independent loops `grid` (`total` of them),
    /// running the [`row_items`] of the rest of the nest together.
    Rows {
        /// The grid's loops, outermost first.
        grid: Vec<GridLoop>,
        /// Iterations of the grid (groups of the launch).
        total: u64,
        /// Invocations per group.
        threads: u32,
    },
    /// A nest accumulating into one element ([`Accumulation`]), reduced by one group.
    Reduction {
        /// Invocations of the group.
        threads: u32,
        /// The element's value before the steps, where the statement before sets it to this
        /// constant (and runs nothing: see [`gpu_schedules`]); else the element is read.
        start: Option<f64>,
    },
    /// A nest accumulating into one element ([`Accumulation`]) of `total` steps, in two
    /// launches: `groups` groups of `threads` each reduce `chunk` consecutive steps (the last
    /// group the rest) into their element of `partials`; then one group of `threads` combines
    /// the partials in order, and the element with the result.
    GridReduction {
        /// Steps of the accumulation.
        total: u64,
        /// Groups of the first phase (partial results).
        groups: u64,
        /// Steps per group.
        chunk: u64,
        /// Invocations per group, in both phases.
        threads: u32,
        /// The partial results: a local node of `groups` elements in the element's precision.
        partials: Tnode,
        /// As [`GpuPass::Reduction`]'s `start`.
        start: Option<f64>,
    },
    /// A whole pass of fused attention in FlashAttention-2's split ([`attention`]): one
    /// launch forward, two backward.
    Attention(GpuAttention),
    /// Anything else: one invocation.
    Single,
}

/// A tiled product's reduction split into slices of consecutive steps (split-K): the first
/// launch runs the product's tiles once per slice, each group multiplying its slice's steps
/// from zero into its block of `partials`; the second runs one invocation per result, which
/// adds the slices to the result's start (zero where the product overwrites it, else its
/// value) in slice order, stores it and runs the epilogue. The order is fixed: results do not
/// depend on timing, but differ in rounding from the unsplit loop's order.
#[derive(Clone, Debug, PartialEq)]
pub struct KSplit {
    /// Slices of the reduction.
    pub slices: u64,
    /// Depth steps (of the layout's depth) per slice; the last slice takes the rest.
    pub steps: u64,
    /// The partial results: a local `f32` node of `slices` blocks of batch × M × N elements
    /// (slice-major; in a block, batch element, row, column).
    pub partials: Tnode,
}

impl KSplit {
    /// Whether every slice takes at least one of a reduction's `total` depth steps (as every
    /// split the planner makes does): kernels may then run a slice's first step before
    /// testing for its end.
    pub fn no_slice_is_empty(&self, total: u64) -> bool {
        self.steps >= 1
            && self.slices >= 1
            && (self.slices - 1).saturating_mul(self.steps) < total
            && self.slices.saturating_mul(self.steps) >= total
    }
}

/// A tiled product whose tiles make fewer groups than keep the device busy splits its
/// reduction into slices of at least this many depth steps ...
pub const SPLIT_MIN_SLICE_STEPS: u64 = 16;
/// ... when its partial results take at most this many bytes.
pub const SPLIT_MAX_PARTIAL_BYTES: u64 = 64 << 20;
/// A reduction at least this many times as long as the longer side of a product's result (a
/// weight gradient's, summed over batch × context) lets the product take larger tiles, split
/// along it, where the tiles alone would be too few: more results per invocation, fewer loads
/// from shared memory per product.
pub const SPLIT_LONG_REDUCTION: usize = 4;

impl fmt::Display for GpuPass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuPass::Nothing => write!(f, "GPU pass: nothing"),
            GpuPass::Zero { elements, threads } => {
                write!(f, "GPU zeroing of {elements} elements, groups of {threads}")
            }
            GpuPass::Tiles {
                gemm,
                layout,
                groups,
                split,
                ..
            } => {
                write!(
                    f,
                    "GPU tiled product M {} N {} K {} ({} batch loop(s)): {t}×{t} results per \
                     group of {TILE_THREADS}, {groups} groups",
                    gemm.m.extent,
                    gemm.n.extent,
                    gemm.k.extent,
                    gemm.batch.len(),
                    t = layout.tile,
                )?;
                if let Some(text) = gemm.guard_text() {
                    write!(f, ", {text}")?;
                }
                match split {
                    Some(k) => write!(f, " per slice of the reduction, {} slices", k.slices),
                    None => Ok(()),
                }
            }
            GpuPass::MatrixTiles {
                gemm,
                layout,
                groups,
                ..
            } => write!(
                f,
                "GPU {} matrix-unit product M {} N {} K {} ({} batch loop(s)): {}×{} results per \
                 group of {}, {groups} groups",
                layout.kind,
                gemm.m.extent,
                gemm.n.extent,
                gemm.k.extent,
                gemm.batch.len(),
                layout.tile,
                layout.tile,
                layout.threads()
            ),
            GpuPass::Grid {
                grid,
                total,
                threads,
            } => write!(
                f,
                "GPU grid of {total} over {} loop(s), groups of {threads}",
                grid.len()
            ),
            GpuPass::Rows {
                grid,
                total,
                threads,
            } => write!(
                f,
                "GPU rows: {total} groups of {threads} over {} loop(s)",
                grid.len()
            ),
            GpuPass::Reduction { threads, .. } => {
                write!(f, "GPU reduction by one group of {threads}")
            }
            GpuPass::GridReduction {
                total,
                groups,
                chunk,
                threads,
                ..
            } => write!(
                f,
                "GPU grid reduction of {total} steps: {groups} groups of {threads} reduce {chunk} \
                 each, then one group combines the partials"
            ),
            GpuPass::Attention(a) => write!(f, "{a}"),
            GpuPass::Single => write!(f, "GPU pass on one invocation"),
        }
    }
}

/// A pointwise statement over a tiled product's result, run in the product's epilogue: for
/// each element the product stores, `stmt` (the statement's innermost assignment) with
/// `iters` — its loops' iterators, one per axis of the product's result, in axis order —
/// bound to the element's indices. Its statement then runs nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// The iterators of the statement's loops, one per axis of the result.
    pub iters: Vec<arrayjit_ir::indexing::Symbol>,
    /// The assignment run per element.
    pub stmt: LowLevel,
}

impl Epilogue {
    /// `next` as the epilogue of a product into `gemm.out`, where it can be: a perfect nest
    /// with one loop over each whole axis of the result, in axis order, around one assignment
    /// to a node of the result's shape at those iterators, that reads the result only at the
    /// same element, reads its own target only there, and neither writes nor reads the
    /// product's factors (so moving it into the product's groups changes nothing it reads).
    pub fn of(gemm: &Gemm, next: &LowLevel) -> Option<Epilogue> {
        use arrayjit_ir::indexing::AxisIndex;
        let (nest, inner) = next.perfect_nest();
        let LowLevel::Set { tn, idcs, value } = inner else {
            return None;
        };
        let dims = gemm.out.dims();
        let whole = nest.len() == dims.len()
            && nest
                .iter()
                .zip(dims)
                .all(|(&(_, from, to), &d)| from == 0 && to == d as i64);
        let iters: Vec<_> = nest.iter().map(|&(s, ..)| s).collect();
        let at_element: Vec<AxisIndex> = iters.iter().map(|&s| AxisIndex::Iterator(s)).collect();
        if !whole || tn.dims() != dims || *idcs != at_element {
            return None;
        }
        if *tn == gemm.lhs || *tn == gemm.rhs || value.reads(&gemm.lhs) || value.reads(&gemm.rhs) {
            return None;
        }
        let mut pointwise = true;
        value.visit_all(&mut |e| match e {
            ScalarExpr::Get(t, at) | ScalarExpr::GetMerge(t, at)
                if (*t == gemm.out || t == tn) && *at != at_element =>
            {
                pointwise = false
            }
            ScalarExpr::LocalScope { .. } | ScalarExpr::GetMerge(..) => pointwise = false,
            _ => {}
        });
        pointwise.then(|| Epilogue {
            iters,
            stmt: inner.clone(),
        })
    }
}

impl GpuPass {
    /// The product of a tiled pass (on the `f32` lanes or the matrix units).
    pub fn tiled_product(&self) -> Option<&Gemm> {
        match self {
            GpuPass::Tiles { gemm, .. } | GpuPass::MatrixTiles { gemm, .. } => Some(gemm),
            _ => None,
        }
    }

    /// The local node of the pass's partial results, if it has one: a grid reduction's, or a
    /// tiled product's split along its reduction. The optimizer makes it a node of the
    /// routine; the pass's first launch writes it and its second reads it.
    pub fn partials(&self) -> Option<&Tnode> {
        match self {
            GpuPass::GridReduction { partials, .. } => Some(partials),
            GpuPass::Tiles { split: Some(k), .. } | GpuPass::MatrixTiles { split: Some(k), .. } => {
                Some(&k.partials)
            }
            _ => None,
        }
    }

    /// Kernels the pass launches: none for a pass that does nothing, two for a grid reduction
    /// and a split product (their phases), else one.
    pub fn launches(&self) -> u32 {
        match self {
            GpuPass::Nothing => 0,
            GpuPass::GridReduction { .. }
            | GpuPass::Tiles { split: Some(_), .. }
            | GpuPass::MatrixTiles { split: Some(_), .. } => 2,
            GpuPass::Attention(a) => a.launches(),
            _ => 1,
        }
    }
}

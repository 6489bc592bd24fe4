//! GPU passes as schedules: how each top-level statement maps onto a grid of thread groups on a
//! device that runs groups of invocations (a GPU, or the CUDA emulation), chosen here from the
//! device's limits ([`GpuLimits`]) and recorded in the routine's schedules with why, so that
//! every GPU renderer (CUDA, WGSL) follows one decision instead of re-deriving it.
//!
//! Before passes are chosen, [`restructure`] re-plans the code the optimizer fused for a CPU:
//! reductions inlined into expressions become accumulations of their own ([`hoist`]), and a
//! nest whose shared outer loops give few grid points, around statements that hold more
//! independent work of their own, is split into one nest per statement
//! ([`distribute_loop`]).
//!
//! A statement becomes one pass:
//! - **zeroing**: one invocation per element;
//! - **tiled product**: an `f32` matrix product whose result sides both reach half a tile side,
//!   in tiles of `tile × tile` results per group of [`TILE_THREADS`] (16 × 16) invocations, the
//!   factors staged in shared memory 16 deep, double-buffered where that fits, and read by
//!   128-bit loads where their strides allow ([`simt`]); the largest tile (128, 64, 32) whose
//!   sides both fill one and that still gives enough groups to fill the device (two per
//!   compute unit), else 16, and only tiles whose staging fits its shared memory; registers
//!   are capped so that [`TILE_GROUPS_PER_UNIT`] groups share a unit. Where the tiles are too
//!   few to fill the device and the reduction is long (a weight gradient's, over batch ×
//!   context), the reduction splits into slices ([`KSplit`], split-K): the tiles run once
//!   per slice into partial results, then one invocation per result adds the slices in a
//!   fixed order; a reduction of at least [`SPLIT_LONG_REDUCTION`] times the longer side
//!   lets a larger tile fill the device this way;
//! - **matrix-unit product**: a product of 16-bit factors (or of `f32` ones as TF32, where
//!   allowed) on a device with matrix units, in 32-, 64- or 128-tiles of warps multiplying
//!   fragments ([`matrix`]);
//! - **rows**: the loops whose iterations are independent as a grid of groups, one per point,
//!   where the statements under them hold work for a group: a reduction of at least
//!   [`ROW_REDUCTION_MIN`] steps (at most [`ROW_REDUCTION_MAX_ROWS`] points), or, while the
//!   points alone cannot fill the device, loops of at least [`ROW_MIN_WIDTH`] iterations. A
//!   group's reductions combine strided shares in a fixed tree, its independent loops stride
//!   over the group, and its other statements run on its first invocation; the group is as
//!   wide as its widest statement needs (a power of two, at least [`MIN_GROUP_THREADS`]);
//! - **grid**: the loops whose iterations are independent, one invocation per iteration, the
//!   rest of the nest inside, in program order;
//! - **reduction**: a nest accumulating into one element, by one group (strided shares, then
//!   a fixed tree);
//! - **grid reduction**: such a nest of at least [`GRID_REDUCTION_MIN`] steps, in two phases:
//!   groups reduce consecutive chunks of the steps into partial results (a local node of the
//!   routine), then one group combines the partials in order into the element;
//! - **attention**: a whole pass of fused attention, in FlashAttention-2's split: a group per
//!   block of query rows (key rows for the key gradients), one invocation per row, the other
//!   side staged in shared memory a block at a time ([`attention`]);
//! - **single**: anything else, on one invocation.
//!
//! Passes that take about as long as their launch, whose statements touch nothing the others
//! write, run side by side as one launch where the device allows it ([`join`]; the passes first go in
//! the order of their dependence levels, so that independent ones are neighbours).
//!
//! A pass changes results only by the fixed regrouping of reductions (a tree in a fixed order),
//! never by timing. The analyses the renderers need to render a pass (the grid's inner
//! statement, the accumulation, the row items) are in [`analysis`]; [`plan`] lists a routine's
//! passes with their work and an estimate of their time on a device.

use std::fmt;

use super::{Blocking, Contraction, Gemm, Schedule, ScheduleKind, ScheduleTuning};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::memory::MemoryMode;
use crate::ops::TernOp;
use crate::prec::Prec;
use crate::tnode::Tnode;

pub mod analysis;
pub mod attention;
mod distribute;
pub mod hoist;
pub mod join;
pub mod matrix;
pub mod order;
pub mod plan;
pub mod simt;
pub mod tensor_map;

pub use analysis::{
    Accumulation, Rest, RowItem, RowRole, grid_loops, grid_total, independent_work,
    longest_reduction, row_items,
};
pub use attention::GpuAttention;
pub use attention::runs_as_attention;
pub use distribute::{distribute_loop, merged_pointwise, restructure};
pub use join::{JoinedLaunch, joined_launches};
pub use matrix::{MatrixKind, MatrixTile};
pub use order::TileOrder;
pub use plan::{DeviceModel, GpuPlan, PlannedPass};
pub use simt::SimtTile;

/// What GPU passes may assume of a device: read from its `DeviceInfo` by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    /// The most invocations in one group (workgroup, block).
    pub max_group_invocations: u32,
    /// Shared (workgroup) memory one group may use, in bytes, as statically declared arrays.
    pub max_shared_bytes: usize,
    /// Shared memory one group may use where its kernel opts in to more than
    /// `max_shared_bytes` (CUDA's dynamic shared memory: 163 KiB on sm_80, 99 KiB on sm_86
    /// and sm_89, 227 KiB on sm_90); `max_shared_bytes` where the device has no opt-in.
    pub max_opt_in_shared_bytes: usize,
    /// Shared memory of one compute unit, which the groups resident on it divide; 0 when
    /// unknown.
    pub shared_bytes_per_unit: usize,
    /// Invocations that run in lock step (warp, subgroup); 0 when unknown.
    pub subgroup_size: u32,
    /// Units that run groups in parallel (SMs, compute units); 0 when unknown.
    pub compute_units: usize,
    /// The device multiplies warp-level matrix fragments (`mma.sync` and `ldmatrix`: NVIDIA
    /// tensor cores of compute capability 8.0 or later, or the CUDA emulation), so products of
    /// 16-bit factors (and `f32` ones as TF32, where allowed) run on them ([`matrix`]).
    pub matrix_units: bool,
    /// The device also multiplies warpgroup-wide fragments straight from shared memory
    /// (`wgmma.mma_async`: NVIDIA sm_90, compiled as `sm_90a`; the CUDA emulation), so the
    /// larger matrix-unit tiles of 16-bit factors use them ([`matrix`]).
    pub warpgroup_mma: bool,
    /// The most parameters (buffers and static indices) one launch may take for passes run
    /// together ([`join`]); 0: every pass launches on its own.
    pub joined_launch_parameters: usize,
}

/// Parameters a joined CUDA launch may take: 2 KiB of pointers and indices, half of what a
/// kernel's parameters may hold.
pub const CUDA_JOINED_LAUNCH_PARAMETERS: usize = 256;

impl GpuLimits {
    /// The limits every WebGPU device guarantees (256 invocations per workgroup, 16 KiB of
    /// workgroup memory), for rendering without a device at hand.
    pub fn portable() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 256,
            max_shared_bytes: 16 << 10,
            max_opt_in_shared_bytes: 16 << 10,
            shared_bytes_per_unit: 0,
            subgroup_size: 0,
            compute_units: 0,
            matrix_units: false,
            warpgroup_mma: false,
            joined_launch_parameters: 0,
        }
    }

    /// The limits every CUDA device of compute capability 5.0 or later has (1024 threads per
    /// block, 48 KiB of static shared memory, warps of 32), for rendering CUDA without a
    /// device at hand.
    pub fn cuda_minimum() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 1024,
            max_shared_bytes: 48 << 10,
            max_opt_in_shared_bytes: 48 << 10,
            shared_bytes_per_unit: 0,
            subgroup_size: 32,
            compute_units: 0,
            matrix_units: false,
            warpgroup_mma: false,
            joined_launch_parameters: CUDA_JOINED_LAUNCH_PARAMETERS,
        }
    }

    /// The limits of CUDA devices of architecture `sm_XY` (compute capability X.Y, with or
    /// without the `a` of arch-specific features) beyond [`GpuLimits::cuda_minimum`]: matrix
    /// units from `sm_80`, warpgroup matrix operations on `sm_90` (whose kernels then compile
    /// as `sm_90a`), and the architecture's opt-in shared memory per block and per SM (the
    /// CUDA programming guide's table of compute capabilities). `None` for a name that is not
    /// `sm_` and a number.
    pub fn cuda_arch(arch: &str) -> Option<GpuLimits> {
        let cc: u32 = arch
            .strip_prefix("sm_")?
            .trim_end_matches('a')
            .parse()
            .ok()?;
        // (opt-in per block, per SM) in KiB; from sm_80 each block reserves 1 KiB of the SM's.
        let (opt_in, per_unit) = match cc {
            70 | 72 => (96, 96),
            75 => (64, 64),
            80 | 87 => (163, 164),
            86 | 89 => (99, 100),
            90 => (227, 228),
            _ => (48, 0),
        };
        Some(GpuLimits {
            matrix_units: cc >= 80,
            warpgroup_mma: cc == 90,
            max_opt_in_shared_bytes: opt_in << 10,
            shared_bytes_per_unit: per_unit << 10,
            ..GpuLimits::cuda_minimum()
        })
    }

    /// Shared memory a tiled product's group may stage its factors in: as much as lets
    /// [`TILE_GROUPS_PER_UNIT`] groups share a compute unit (each also reserving
    /// [`GROUP_RESERVED_SHARED_BYTES`] of it), within the opt-in limit; all of the opt-in
    /// limit where the unit's memory is unknown; never less than `max_shared_bytes`.
    pub fn tile_shared_bytes(&self) -> usize {
        let share = match self.shared_bytes_per_unit {
            0 => usize::MAX,
            per_unit => (per_unit / TILE_GROUPS_PER_UNIT as usize)
                .saturating_sub(GROUP_RESERVED_SHARED_BYTES),
        };
        self.max_opt_in_shared_bytes
            .min(share)
            .max(self.max_shared_bytes)
    }

    /// Invocations per group of grid, row and reduction passes: the largest power of two up
    /// to 256 that the device allows.
    pub fn group_threads(&self) -> u32 {
        let cap = self.max_group_invocations.clamp(1, MAX_GROUP_THREADS);
        1 << (31 - cap.leading_zeros())
    }

    /// [`GpuLimits::group_threads`], or the power of two at most `tuned` (at least 1) where a
    /// tuning asks for fewer.
    pub fn tuned_group_threads(&self, tuned: Option<u32>) -> u32 {
        let most = self.group_threads();
        match tuned {
            Some(t) if t >= 1 && t < most => 1 << (31 - t.leading_zeros()),
            _ => most,
        }
    }

    /// Groups that keep the device busy: two per compute unit, or 256 when the device does
    /// not say how many units it has.
    pub fn busy_groups(&self) -> u64 {
        if self.compute_units > 0 {
            2 * self.compute_units as u64
        } else {
            256
        }
    }

    /// Invocations that keep the device busy: [`GpuLimits::busy_groups`] groups of `threads`.
    pub fn busy_invocations(&self, threads: u32) -> u64 {
        self.busy_groups() * u64::from(threads.max(1))
    }
}

/// The most invocations per group of grid, row and reduction passes.
pub const MAX_GROUP_THREADS: u32 = 256;
/// The fewest invocations per group that group reductions and row passes run on (below,
/// such statements run as grid or single-invocation passes).
pub const MIN_GROUP_THREADS: u32 = 64;
/// Invocations of a tiled product's group: 16 × 16.
pub const TILE_THREADS: u32 = 256;
/// The depth of the factors' tiles staged in shared memory (8 for 128-tiles:
/// [`SimtTile::depth`]).
pub const TILE_DEPTH: usize = 16;
/// Groups of a tiled product (on the `f32` lanes or the matrix units) that share a compute
/// unit at least: renderers ask the compiler to keep each invocation's registers within a
/// share that allows it (CUDA's `__launch_bounds__` minimum blocks), so one group's barriers
/// and loads overlap another's arithmetic.
pub const TILE_GROUPS_PER_UNIT: u32 = 2;
/// Shared memory of a compute unit that each resident group reserves beyond its own (the
/// CUDA runtime's, from sm_80 on).
pub const GROUP_RESERVED_SHARED_BYTES: usize = 1 << 10;
/// A reduction inside a grid gets a group of its own when it is at least this long ...
pub const ROW_REDUCTION_MIN: u64 = 256;
/// ... and there are at most this many grid points (beyond, one invocation per point keeps
/// every lane busy already).
pub const ROW_REDUCTION_MAX_ROWS: u64 = 1 << 14;
/// Statements under a grid too small to fill the device run as a row pass when one of them
/// offers at least this many invocations' work (a warp's).
pub const ROW_MIN_WIDTH: u64 = 32;
/// A reduction into one element of at least this many steps runs over the whole grid in two
/// phases (one group would take it alone).
pub const GRID_REDUCTION_MIN: u64 = 1 << 15;
/// Steps each invocation of a grid reduction's first phase takes at least (fewer groups,
/// fewer partials to combine).
pub const GRID_REDUCTION_STEPS_PER_INVOCATION: u64 = 8;

/// One loop of a pass's grid: its iterator and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridLoop {
    /// The loop's iterator.
    pub iter: crate::indexing::Symbol,
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

/// The split of a tiled product's reduction into slices, and why, where its `groups` (tiles
/// times batch elements) are fewer than [`GpuLimits::busy_groups`] and its reduction has room
/// for at least two slices of [`SPLIT_MIN_SLICE_STEPS`] depth steps: as many slices as bring
/// the groups to twice the busy count (a group alone on its unit waits on its loads for most
/// of each depth step, and groups of 16-tiles are small: more of them per unit hide that), or
/// as the reduction has room for, the steps spread evenly.
fn k_split(gemm: &Gemm, depth: usize, groups: u64, limits: &GpuLimits) -> Option<(KSplit, String)> {
    let busy = limits.busy_groups();
    if groups == 0 || groups >= busy {
        return None;
    }
    let depth = depth as u64;
    let steps = (gemm.k.extent as u64).div_ceil(depth);
    let wanted = (2 * busy)
        .div_ceil(groups)
        .min(steps / SPLIT_MIN_SLICE_STEPS);
    if wanted < 2 {
        return None;
    }
    let per_slice = steps.div_ceil(wanted);
    let slices = steps.div_ceil(per_slice);
    let batch: u64 = gemm.batch.iter().map(|d| d.extent as u64).product();
    let elements = slices
        .checked_mul(batch)?
        .checked_mul(gemm.m.extent as u64)?
        .checked_mul(gemm.n.extent as u64)?;
    if elements.saturating_mul(4) > SPLIT_MAX_PARTIAL_BYTES
        || groups.saturating_mul(slices) > u64::from(u32::MAX)
        || slices < 2
    {
        return None;
    }
    let partials = partials_node(
        Prec::F32,
        elements,
        "gpu_split_partials",
        "the partial results of a tiled product split along its reduction, read by its second \
         launch",
    )?;
    let why = format!(
        "its {groups} group(s) of tiles are fewer than the {busy} that keep the device busy, so \
         the reduction of {} steps splits into {slices} slices of {} (split-K): {} groups each \
         multiply one slice into partial results, then one invocation per result adds the \
         slices in order",
        gemm.k.extent,
        per_slice * depth,
        groups * slices,
    );
    Some((
        KSplit {
            slices,
            steps: per_slice,
            partials,
        },
        why,
    ))
}

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
    pub iters: Vec<crate::indexing::Symbol>,
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
        use crate::indexing::AxisIndex;
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

/// A statement that is a matrix product the device's matrix units multiply ([`matrix`]): 16-bit
/// factors, or `f32` ones where TF32 is allowed; both result sides at least a fragment's (16),
/// the tile the largest of [`matrix::MATRIX_TILES`] whose sides both fill one and that still
/// gives two groups per compute unit (else 32), or the tuning's, where its staging fits.
fn matrix_product(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    allow_tf32: bool,
    may_split: bool,
) -> Option<(GpuPass, String)> {
    let c = Contraction::detect_for_matrix_units(stmt)?;
    let kind = MatrixKind::for_factors(c.lhs.node.prec(), allow_tf32)?;
    let gemm = c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3], Default::default()))?;
    let (m, n) = (gemm.m.extent, gemm.n.extent);
    if m < matrix::FRAGMENT_ROWS || n < matrix::FRAGMENT_ROWS {
        return None;
    }
    let batch: usize = gemm.batch.iter().map(|d| d.extent).product();
    let groups = |t: usize| (m.div_ceil(t) * n.div_ceil(t) * batch) as u64;
    let layout_of = |t: usize| MatrixTile::for_device(&gemm, t, kind, limits, tuning);
    let fits = |t: usize| {
        layout_of(t).is_some_and(|layout| layout.threads() <= limits.max_group_invocations)
    };
    let busy = limits.busy_groups();
    let tuned = tuning
        .gpu_tile
        .filter(|t| matrix::MATRIX_TILES.contains(t) && fits(*t));
    let larger = [128, 64]
        .into_iter()
        .find(|&t| fits(t) && m.min(n) >= t && groups(t) >= busy);
    let (tile, reason) = match (tuned, larger) {
        (Some(t), _) => (t, format!("{t}-tiles as the schedule's tuning asks")),
        (None, Some(t)) => (
            t,
            format!(
                "{t}-tiles as both sides fill one and they still make {} groups, at least \
                 {busy} to keep the device busy",
                groups(t)
            ),
        ),
        (None, None) if fits(32) => (
            32,
            if m.min(n) >= 64 {
                format!(
                    "32-tiles as larger ones would make fewer than {busy} groups (32-tiles: {})",
                    groups(32)
                )
            } else {
                "32-tiles as a side is shorter than 64".to_string()
            },
        ),
        (None, None) => return None,
    };
    let layout = layout_of(tile)?;
    let (fm, fn_) = layout.fragments();
    let (wr, wc) = layout.warp_grid();
    let precision = match kind {
        MatrixKind::Tf32 => "f32 factors rounded to TF32 (allowed by the settings)".to_string(),
        _ => format!("{kind} factors"),
    };
    let by = |f: usize| {
        if layout.tensor_copy[f] {
            "by the tensor memory accelerator"
        } else if layout.async_copy[f] {
            "by 16-byte asynchronous copies"
        } else {
            "element by element"
        }
    };
    let accelerated = format!(
        "the left factor copied {}, the right {} (the accelerator's bulk tensor copies issued \
         by one invocation per buffer, swizzled and zero-filled past the factors' ends; the \
         group waits on the buffer's mbarrier)",
        by(0),
        by(1)
    );
    let copies = match layout.async_copy {
        _ if layout.tensor_copy.contains(&true) => accelerated.as_str(),
        _ if layout.rounds_while_staging() => {
            "both factors staged through registers, rounded to TF32 and k-major on the way \
             (wgmma reads TF32 factors as they are, and only k-major)"
        }
        [true, true] => "both factors copied by 16-byte asynchronous copies",
        [true, false] => {
            "the left factor copied by 16-byte asynchronous copies, the right \
                          element by element"
        }
        [false, true] => {
            "the right factor copied by 16-byte asynchronous copies, the left \
                          element by element"
        }
        [false, false] => {
            "both factors copied element by element (their rows are not whole \
                           16-byte runs)"
        }
    };
    let units = if layout.warpgroups {
        format!(
            "m64n{tile}k{} warpgroup fragments (wgmma) read from shared memory, accumulating \
             in f32 registers, {tile} x {tile} results per group of {} warpgroups",
            kind.fragment_depth(),
            tile / matrix::WARPGROUP_ROWS
        )
    } else {
        format!(
            "m16n8k{} fragments accumulating in f32 registers, {tile} x {tile} results per \
             group of {wr} x {wc} warps ({fm} x {fn_} fragments each)",
            kind.fragment_depth()
        )
    };
    let groups = groups(tile);
    // Few tiles and a long reduction: split it (the partial results are a node the optimizer
    // makes, so only where it plans the pass).
    let split = if may_split {
        k_split(&gemm, layout.depth(), groups, limits)
    } else {
        None
    };
    let sliced = match &split {
        Some((_, why)) => format!("; {why}"),
        None => String::new(),
    };
    let memory = if layout.dynamic_shared {
        format!(
            "{} bytes of dynamic shared memory (beyond the {} a group declares statically; \
             {} leave room for {TILE_GROUPS_PER_UNIT} groups per unit)",
            layout.group_shared_bytes(),
            limits.max_shared_bytes,
            limits.tile_shared_bytes()
        )
    } else {
        format!(
            "{} of {} bytes of shared memory",
            layout.group_shared_bytes(),
            limits.tile_shared_bytes()
        )
    };
    let why = format!(
        "a matrix product of {precision} on the matrix units: {units}, factor tiles {} deep in \
         {} buffers ({memory}, rows {}), {copies}, {}{sliced}; {reason}",
        layout.depth(),
        layout.stages,
        if layout.padding() > 0 {
            "padded by 16 bytes"
        } else {
            "swizzled"
        },
        layout.order,
    );
    (groups <= u64::from(u32::MAX)).then_some((
        GpuPass::MatrixTiles {
            gemm,
            layout,
            groups,
            epilogue: None,
            split: split.map(|(k, _)| k),
        },
        why,
    ))
}

/// Why the statements under a grid of `total` points run as a row pass, if they should: a
/// reduction long enough to spread over a group (on a grid small enough to give each point a
/// group), or, on a grid too small to fill the device, statements wide enough for a group
/// none of which leaves the group waiting on one invocation's loops.
fn row_pass_reason(
    items: &[RowItem<'_>],
    total: u64,
    limits: &GpuLimits,
    threads: u32,
) -> Option<String> {
    let longest_reduction = items
        .iter()
        .filter_map(|i| match &i.role {
            RowRole::Reduce(r) => Some(r.len()),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if total <= ROW_REDUCTION_MAX_ROWS && longest_reduction >= ROW_REDUCTION_MIN {
        return Some(format!(
            "around reductions of up to {longest_reduction} steps (at least {ROW_REDUCTION_MIN})"
        ));
    }
    let widest = items.iter().map(RowItem::width).max().unwrap_or(0);
    let busy = limits.busy_invocations(threads);
    let serial_lead = items
        .iter()
        .any(|i| matches!(i.role, RowRole::Lead) && i.underused());
    (total < busy && widest >= ROW_MIN_WIDTH && !serial_lead).then(|| {
        format!(
            "{total} point(s), fewer than the {busy} invocations that fill the device, around \
             statements of up to {widest} independent steps"
        )
    })
}

/// Invocations of a row pass's groups: the smallest power of two that covers its widest
/// statement, at least [`MIN_GROUP_THREADS`] and at most `threads`.
fn row_threads(items: &[RowItem<'_>], threads: u32) -> u32 {
    let widest = items.iter().map(RowItem::width).max().unwrap_or(1);
    let want = widest.clamp(1, u64::from(threads)).next_power_of_two() as u32;
    want.clamp(MIN_GROUP_THREADS.min(threads), threads)
}

/// A statement that is an `f32` matrix product, with whether it accumulates through a fused
/// multiply-add.
fn f32_product(stmt: &LowLevel) -> Option<(Gemm, bool)> {
    let c = Contraction::detect_guarded(stmt)?;
    if c.out.node.prec() != Prec::F32 {
        return None;
    }
    // The blocking is the CPU's and is not used by a tiled pass; any valid one will do.
    let g = c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3], Default::default()))?;
    // The tiled kernels take a guard of constants only: one naming a static index stays loops.
    if !g.guard_statics.is_empty() {
        return None;
    }
    let (_, inner) = stmt.perfect_nest();
    let fused = matches!(
        inner,
        LowLevel::Set {
            value: ScalarExpr::Ternop(TernOp::Fma, ..),
            ..
        }
    );
    Some((g, fused))
}

/// The tile side of a product of `m × n` results per batch element on a device, and why: the
/// largest of 128, 64 and 32 whose sides both fill one and which still gives enough groups to
/// keep the device busy — by its tiles alone, or with a long reduction (`split_k`: its steps,
/// where it may be split) split into slices — else 16; only sides whose staging fits the
/// device's shared memory. `None` when not even the smallest fits (or a group of
/// [`TILE_THREADS`] is not allowed).
fn product_tile(
    m: usize,
    n: usize,
    batch: usize,
    split_k: Option<usize>,
    limits: &GpuLimits,
    tuned: Option<usize>,
) -> Option<(usize, String)> {
    if limits.max_group_invocations < TILE_THREADS {
        return None;
    }
    let fits = |t: usize| SimtTile::bytes(t, 1) <= limits.max_shared_bytes;
    if let Some(t) = tuned.filter(|t| ScheduleTuning::GPU_TILES.contains(t) && fits(*t)) {
        return Some((t, format!("{t}-tiles as the schedule's tuning asks")));
    }
    let groups = |t: usize| (m.div_ceil(t) * n.div_ceil(t) * batch) as u64;
    let busy = limits.busy_groups();
    // The groups a tile makes with its reduction split into as many slices as it has room
    // for ([`k_split`]), where it may be split and is long: at least
    // [`SPLIT_LONG_REDUCTION`] times the longer result side.
    let split_groups = |t: usize| match split_k {
        Some(k) if k >= SPLIT_LONG_REDUCTION * m.max(n) => {
            let steps = k.div_ceil(SimtTile::depth_of(t)) as u64;
            groups(t).saturating_mul(steps / SPLIT_MIN_SLICE_STEPS)
        }
        _ => 0,
    };
    for (t, enough) in [(128, busy), (64, busy), (32, busy)] {
        if fits(t) && m.min(n) >= t && groups(t) >= enough {
            return Some((
                t,
                format!(
                    "{t}-tiles as both sides fill one and they still make {} groups, at least \
                     {enough} to keep the device busy",
                    groups(t)
                ),
            ));
        }
        if fits(t) && m.min(n) >= t && split_groups(t) >= enough {
            return Some((
                t,
                format!(
                    "{t}-tiles as both sides fill one and, with the reduction ({} steps, at \
                     least {SPLIT_LONG_REDUCTION} times the longer side) split, they make up \
                     to {} groups, at least {enough} to keep the device busy",
                    split_k.unwrap_or(0),
                    split_groups(t)
                ),
            ));
        }
    }
    fits(16).then(|| {
        let why = if m.min(n) >= 64 {
            format!(
                "16-tiles as larger ones would make fewer than {busy} groups (16-tiles: {})",
                groups(16)
            )
        } else {
            "16-tiles as a side is shorter than 64".to_string()
        };
        (16, why)
    })
}

/// Invocations per group of a pass of `total` independent invocations: `threads`, or fewer
/// (a power of two, at least [`MIN_GROUP_THREADS`]) where groups of `threads` would be fewer
/// than keep the device busy; with what to add to the reason.
fn spread_threads(total: u64, limits: &GpuLimits, threads: u32) -> (u32, String) {
    let busy = limits.busy_groups();
    let groups = |t: u32| total.div_ceil(u64::from(t));
    let mut t = threads;
    // Halving helps only while it makes more groups (a tiny pass keeps one group).
    while t > MIN_GROUP_THREADS && groups(t) < busy && groups(t / 2) > groups(t) {
        t /= 2;
    }
    if t == threads {
        (t, String::new())
    } else {
        (
            t,
            format!(
                ", in groups of {t}: groups of {threads} would make {} of the {busy} that keep \
                 the device busy",
                groups(threads)
            ),
        )
    }
}

/// The GPU passes of a routine's top-level statements on a device of `limits` (each as
/// [`gpu_schedule`]), where a reduction into an element that the statement before sets to a
/// constant starts from the constant instead, and a tiled product that writes every element of
/// the node the statement before zeroes starts from zero (`Gemm::overwrite`): that statement
/// then runs nothing.
pub fn gpu_schedules(
    stmts: &[&LowLevel],
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    allow_tf32: bool,
) -> Vec<Schedule> {
    let mut schedules: Vec<Schedule> = stmts
        .iter()
        .map(|s| gpu_schedule(s, limits, tuning, allow_tf32))
        .collect();
    for i in 1..stmts.len() {
        // A zeroing right before a tiled product that writes every element of the same node:
        // the product starts its sums from zero instead of reading the node.
        if let (LowLevel::ZeroOut(zeroed), ScheduleKind::Gpu(pass)) =
            (stmts[i - 1].unwrapped(), &schedules[i].kind)
            && let Some(gemm) = pass.tiled_product()
            && *zeroed == gemm.out
            && gemm.covers_out
            && matches!(
                schedules[i - 1].kind,
                ScheduleKind::Gpu(GpuPass::Zero { .. })
            )
        {
            if let ScheduleKind::Gpu(
                GpuPass::Tiles { gemm, .. } | GpuPass::MatrixTiles { gemm, .. },
            ) = &mut schedules[i].kind
            {
                gemm.overwrite = true;
            }
            absorb(
                &mut schedules,
                i,
                "its sums start from zero, as the zeroing before it asks",
                "the tiled product after it writes every element from zero",
            );
            continue;
        }
        let LowLevel::Set {
            tn,
            idcs,
            value: ScalarExpr::Constant(c),
        } = stmts[i - 1].unwrapped()
        else {
            continue;
        };
        let Some(r) = Accumulation::detect(stmts[i].unwrapped()) else {
            continue;
        };
        if r.tn != tn || r.idcs != idcs.as_slice() {
            continue;
        }
        if let ScheduleKind::Gpu(
            GpuPass::Reduction { start, .. } | GpuPass::GridReduction { start, .. },
        ) = &mut schedules[i].kind
        {
            *start = Some(*c);
            absorb(
                &mut schedules,
                i,
                &format!("it starts from {c}, set by the statement before"),
                "the reduction after it starts from the constant it sets",
            );
        }
    }
    // Zeroings right before a pass of fused attention of the nodes its nest writes: the GPU
    // pass stores every element of its outputs and keeps its state in registers.
    for i in 0..stmts.len() {
        let ScheduleKind::Gpu(GpuPass::Attention(a)) = &schedules[i].kind else {
            continue;
        };
        let written: Vec<Tnode> = a.op.nest_writes().into_iter().cloned().collect();
        for j in (0..i).rev() {
            match stmts[j].unwrapped() {
                LowLevel::ZeroOut(tn) if written.contains(tn) => {
                    schedules[j] = Schedule {
                        kind: ScheduleKind::Gpu(GpuPass::Nothing),
                        why: "the fused attention's GPU pass after it stores every element of \
                              its outputs and keeps its state in registers"
                            .into(),
                        parallel: None,
                    };
                }
                LowLevel::Comment(_) | LowLevel::Noop => {}
                _ => break,
            }
        }
    }
    // A pointwise statement right after a tiled product, over its result, runs in the
    // product's epilogue.
    for i in 1..stmts.len() {
        if !matches!(schedules[i].kind, ScheduleKind::Gpu(GpuPass::Grid { .. })) {
            continue;
        }
        let ScheduleKind::Gpu(
            GpuPass::Tiles { gemm, epilogue, .. } | GpuPass::MatrixTiles { gemm, epilogue, .. },
        ) = &mut schedules[i - 1].kind
        else {
            continue;
        };
        if let Some(e) = Epilogue::of(gemm, stmts[i].unwrapped()) {
            *epilogue = Some(e);
            let taken = "then the pointwise statement after it on each result (its epilogue)";
            schedules[i - 1].why = format!("{}; {taken}", schedules[i - 1].why);
            schedules[i] = Schedule {
                kind: ScheduleKind::Gpu(GpuPass::Nothing),
                why: "runs in the epilogue of the tiled product before it".into(),
                parallel: None,
            };
        }
    }
    schedules
}

/// Statement `i - 1`'s work is done by statement `i`: it runs nothing, and both say why.
fn absorb(schedules: &mut [Schedule], i: usize, taken: &str, given: &str) {
    schedules[i].why = format!("{}; {taken}", schedules[i].why);
    schedules[i - 1] = Schedule {
        kind: ScheduleKind::Gpu(GpuPass::Nothing),
        why: given.to_string(),
        parallel: None,
    };
}

/// The GPU pass of one top-level statement on a device of `limits`, with why; `f32` products
/// run on matrix units as TF32 only where `allow_tf32` ([`matrix`]).
pub fn gpu_schedule(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    allow_tf32: bool,
) -> Schedule {
    let (pass, why) = plan_pass_with(stmt, limits, tuning, true, allow_tf32);
    Schedule {
        kind: ScheduleKind::Gpu(pass),
        why,
        parallel: None,
    }
}

/// The GPU pass of one top-level statement on a device of `limits`, and why, for a renderer
/// that plans pieces of a recorded statement itself: like [`gpu_schedule`], but never a grid
/// reduction (whose partial results must be a node of the routine, made when the optimizer
/// plans it); such a statement is reduced by one group. `f32` products stay exact (no TF32):
/// the renderers that plan pieces (WGSL) have no matrix units.
pub fn plan_pass(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
) -> (GpuPass, String) {
    plan_pass_with(stmt, limits, tuning, false, false)
}

/// A local node of `elements` partial results in precision `prec`, labelled `label`: written
/// by a pass's first launch, read by its second (`why`).
fn partials_node(prec: Prec, elements: u64, label: &str, why: &str) -> Option<Tnode> {
    let tn = Tnode::new(prec, &[usize::try_from(elements).ok()?], &[label]).ok()?;
    tn.update_memory_mode(MemoryMode::Local, why).ok()?;
    Some(tn)
}

fn plan_pass_with(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    grid_reductions: bool,
    allow_tf32: bool,
) -> (GpuPass, String) {
    let stmt = stmt.unwrapped();
    let threads = limits.tuned_group_threads(tuning.gpu_threads);
    match stmt {
        LowLevel::Noop | LowLevel::Comment(_) => (GpuPass::Nothing, "nothing to run".into()),
        LowLevel::ZeroOut(tn) => {
            let elements = tn.num_elems() as u64;
            let (threads, smaller) = spread_threads(elements, limits, threads);
            (
                GpuPass::Zero { elements, threads },
                format!("one invocation per element{smaller}"),
            )
        }
        _ => match GpuAttention::plan(stmt, limits) {
            Some(Ok((plan, why))) => (GpuPass::Attention(plan), why),
            Some(Err(why_not)) => {
                let (pass, why) = plan_loops(stmt, limits, tuning, grid_reductions, allow_tf32);
                (
                    pass,
                    format!("a pass of fused attention left to its loops ({why_not}); {why}"),
                )
            }
            None => plan_loops(stmt, limits, tuning, grid_reductions, allow_tf32),
        },
    }
}

/// The pass of a statement that is neither a zeroing nor a whole attention pass.
fn plan_loops(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    grid_reductions: bool,
    allow_tf32: bool,
) -> (GpuPass, String) {
    let threads = limits.tuned_group_threads(tuning.gpu_threads);
    let groups_allowed = threads >= MIN_GROUP_THREADS;
    if limits.matrix_units
        && let Some((pass, why)) = matrix_product(stmt, limits, tuning, allow_tf32, grid_reductions)
    {
        return (pass, why);
    }
    if let Some((gemm, fused)) = f32_product(stmt)
        && gemm.m.extent >= 8
        && gemm.n.extent >= 8
    {
        let batch: usize = gemm.batch.iter().map(|d| d.extent).product();
        if let Some((tile, reason)) = product_tile(
            gemm.m.extent,
            gemm.n.extent,
            batch,
            grid_reductions.then_some(gemm.k.extent),
            limits,
            tuning.gpu_tile,
        ) && let Some(layout) = SimtTile::new(&gemm, tile, limits.max_shared_bytes)
        {
            let groups =
                (gemm.m.extent.div_ceil(tile) * gemm.n.extent.div_ceil(tile) * batch) as u64;
            // Few tiles and a long reduction: split it (the partial results are a node
            // the optimizer makes, so only where it plans the pass).
            let split = if grid_reductions {
                k_split(&gemm, layout.depth(), groups, limits)
            } else {
                None
            };
            let order = match &split {
                Some((_, why)) => why.clone(),
                None => "each element summed in the loop's order".to_string(),
            };
            let why = format!(
                "an f32 matrix product: {layout}; {} of {} bytes of shared memory, \
                 {tile} x {tile} results per group, {order}; {reason}",
                layout.shared_bytes(),
                limits.max_shared_bytes,
            );
            return (
                GpuPass::Tiles {
                    gemm,
                    fused,
                    layout,
                    groups,
                    epilogue: None,
                    split: split.map(|(k, _)| k),
                },
                why,
            );
        }
    }
    let (grid, inner) = grid_loops(stmt);
    if !grid.is_empty() {
        let total = grid_total(&grid);
        let loops = grid.len();
        let items = row_items(&inner);
        if groups_allowed && let Some(reason) = row_pass_reason(&items, total, limits, threads) {
            let threads = row_threads(&items, threads);
            return (
                GpuPass::Rows {
                    grid,
                    total,
                    threads,
                },
                format!(
                    "{loops} independent outer loop(s) {reason}: one group of {threads} \
                     per iteration; reductions combine strided shares in a fixed tree \
                     order, independent loops stride over the group, anything else runs \
                     on its first invocation"
                ),
            );
        }
        let (threads, smaller) = spread_threads(total, limits, threads);
        return (
            GpuPass::Grid {
                grid,
                total,
                threads,
            },
            format!("{loops} independent outer loop(s): one invocation per iteration{smaller}"),
        );
    }
    match Accumulation::detect_regroupable(stmt) {
        Some(r) if groups_allowed => {
            let total = r.len();
            let per_group = u64::from(threads) * GRID_REDUCTION_STEPS_PER_INVOCATION;
            let most_groups = total.div_ceil(per_group).min(limits.busy_groups());
            let chunk = total.div_ceil(most_groups.max(1));
            let groups = total.div_ceil(chunk.max(1));
            if grid_reductions
                && total >= GRID_REDUCTION_MIN
                && groups >= 2
                && let Some(partials) = partials_node(
                    r.tn.prec(),
                    groups,
                    "gpu_partials",
                    "the partial results of a GPU grid reduction, read by its second phase",
                )
            {
                return (
                    GpuPass::GridReduction {
                        total,
                        groups,
                        chunk,
                        threads,
                        partials,
                        start: None,
                    },
                    format!(
                        "{} loop(s) accumulating {total} steps into one element by {}: \
                         {groups} groups of {threads} reduce {chunk} consecutive steps \
                         each (strided shares, then a fixed tree) into partial results, \
                         then one group combines them in order",
                        r.loops.len(),
                        r.combine.name()
                    ),
                );
            }
            (
                GpuPass::Reduction {
                    threads,
                    start: None,
                },
                format!(
                    "{} loop(s) accumulating {total} steps into one element by {}: one \
                     group of {threads}, strided shares combined in a fixed tree order",
                    r.loops.len(),
                    r.combine.name()
                ),
            )
        }
        _ => (
            GpuPass::Single,
            "its iterations depend on each other and it is not a reduction into one \
             element"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests;

//! GPU passes as schedules: how each top-level statement maps onto a grid of thread groups on a
//! device that runs groups of invocations (a GPU, or the CUDA emulation), chosen here from the
//! device's limits ([`GpuLimits`]) and recorded in the routine's schedules with why, so that
//! every GPU renderer (CUDA, WGSL) follows one decision instead of re-deriving it.
//!
//! A statement becomes one pass:
//! - **zeroing**: one invocation per element;
//! - **tiled product**: an `f32` matrix product whose result sides both reach half a tile side,
//!   in tiles of `tile × tile` results per group of [`TILE_THREADS`] (16 × 16) invocations, the
//!   factors staged in shared memory 16 deep; 128-result tiles only where they still give
//!   enough groups to fill the device, and only tiles whose staging fits its shared memory;
//! - **grid**: the loops whose iterations are independent, one invocation per iteration, the
//!   rest of the nest inside, in program order;
//! - **rows**: a grid of at most [`ROW_REDUCTION_MAX_ROWS`] points around reductions of at least
//!   [`ROW_REDUCTION_MIN`] steps: one group per point, whose reductions combine strided shares
//!   in a fixed tree, whose independent loops stride over the group, and whose other statements
//!   run on its first invocation;
//! - **reduction**: a single loop accumulating into one element, by one group (strided shares,
//!   then a fixed tree);
//! - **single**: anything else, on one invocation.
//!
//! A pass changes results only by the fixed regrouping of reductions (a tree in a fixed order),
//! never by timing. The analyses the renderers need to render a pass (the grid's inner
//! statement, the accumulation, the row items) are the functions of this module.

use std::borrow::Cow;
use std::fmt;

use super::split_accumulation;
use super::{
    Blocking, Contraction, Gemm, Schedule, ScheduleKind, ScheduleTuning, iterations_independent,
};
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::ops::{BinOp, TernOp};
use crate::prec::Prec;
use crate::tnode::Tnode;

/// What GPU passes may assume of a device: read from its `DeviceInfo` by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    /// The most invocations in one group (workgroup, block).
    pub max_group_invocations: u32,
    /// Shared (workgroup) memory one group may use, in bytes.
    pub max_shared_bytes: usize,
    /// Invocations that run in lock step (warp, subgroup); 0 when unknown.
    pub subgroup_size: u32,
    /// Units that run groups in parallel (SMs, compute units); 0 when unknown.
    pub compute_units: usize,
}

impl GpuLimits {
    /// The limits every WebGPU device guarantees (256 invocations per workgroup, 16 KiB of
    /// workgroup memory), for rendering without a device at hand.
    pub fn portable() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 256,
            max_shared_bytes: 16 << 10,
            subgroup_size: 0,
            compute_units: 0,
        }
    }

    /// The limits every CUDA device of compute capability 5.0 or later has (1024 threads per
    /// block, 48 KiB of static shared memory, warps of 32), for rendering CUDA without a
    /// device at hand.
    pub fn cuda_minimum() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 1024,
            max_shared_bytes: 48 << 10,
            subgroup_size: 32,
            compute_units: 0,
        }
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
    fn busy_groups(&self) -> u64 {
        if self.compute_units > 0 {
            2 * self.compute_units as u64
        } else {
            256
        }
    }
}

/// The most invocations per group of grid, row and reduction passes.
pub const MAX_GROUP_THREADS: u32 = 256;
/// The fewest invocations per group that group reductions and row passes run on (below,
/// such statements run as grid or single-invocation passes).
pub const MIN_GROUP_THREADS: u32 = 64;
/// Invocations of a tiled product's group: 16 × 16.
pub const TILE_THREADS: u32 = 256;
/// The depth of the factors' tiles staged in shared memory.
pub const TILE_DEPTH: usize = 16;
/// A reduction inside a grid gets a group of its own when it is at least this long ...
pub const ROW_REDUCTION_MIN: u64 = 256;
/// ... and there are at most this many grid points (beyond, one invocation per point keeps
/// every lane busy already).
pub const ROW_REDUCTION_MAX_ROWS: u64 = 1 << 14;

/// Shared memory of a product tile of side `tile`: the left factor's `tile × 16` tile padded
/// to 17 columns (against bank conflicts) and the right factor's `16 × tile` tile, in `f32`.
pub fn tile_shared_bytes(tile: usize) -> usize {
    (tile * (TILE_DEPTH + 1) + TILE_DEPTH * tile) * 4
}

/// One loop of a pass's grid: its iterator and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridLoop {
    /// The loop's iterator.
    pub iter: Symbol,
    /// First iteration.
    pub from: i64,
    /// One past the last iteration.
    pub to: i64,
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
    /// (`tile / 16` × `tile / 16` per invocation), `groups` groups.
    Tiles {
        /// The product.
        gemm: Gemm,
        /// It accumulates by fused multiply-add (else multiply, then add).
        fused: bool,
        /// Results per side of a group's tile: 16, 64 or 128.
        tile: usize,
        /// Groups of the launch: tiles times batch elements.
        groups: u64,
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
    /// A loop accumulating into one element ([`Accumulation`]), reduced by one group.
    Reduction {
        /// Invocations of the group.
        threads: u32,
    },
    /// Anything else: one invocation.
    Single,
}

impl fmt::Display for GpuPass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuPass::Nothing => write!(f, "GPU pass: nothing"),
            GpuPass::Zero { elements, threads } => {
                write!(f, "GPU zeroing of {elements} elements, groups of {threads}")
            }
            GpuPass::Tiles {
                gemm, tile, groups, ..
            } => write!(
                f,
                "GPU tiled product M {} N {} K {} ({} batch loop(s)): {tile}×{tile} results per group of {TILE_THREADS}, {groups} groups",
                gemm.m.extent,
                gemm.n.extent,
                gemm.k.extent,
                gemm.batch.len()
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
            GpuPass::Reduction { threads } => {
                write!(f, "GPU reduction by one group of {threads}")
            }
            GpuPass::Single => write!(f, "GPU pass on one invocation"),
        }
    }
}

/// The grid of a statement: the loops whose iterations are independent, outermost first, and
/// the statement each invocation runs.
///
/// A perfect nest around one assignment contributes every loop whose iterations are
/// independent, wherever it sits: running such a loop outside the others changes no element's
/// order of operations (each element is written by one iteration of it, and its reductions keep
/// their order), so a matrix product's rows and columns both become the grid while its
/// reduction runs inside. Other nests contribute their longest independent prefix.
pub fn grid_loops(stmt: &LowLevel) -> (Vec<GridLoop>, Cow<'_, LowLevel>) {
    let (loops, inner) = stmt.perfect_nest();
    if matches!(inner, LowLevel::Set { .. }) && !loops.is_empty() {
        let independent = |&(index, from, to): &(Symbol, i64, i64)| {
            to > from && iterations_independent(inner, index)
        };
        let grid: Vec<GridLoop> = loops
            .iter()
            .copied()
            .filter(independent)
            .map(|(iter, from, to)| GridLoop { iter, from, to })
            .collect();
        let mut rest = Cow::Borrowed(inner);
        for &(index, from, to) in loops.iter().rev() {
            if !independent(&(index, from, to)) {
                rest = Cow::Owned(LowLevel::For {
                    index,
                    from,
                    to,
                    body: Box::new(rest.into_owned()),
                });
            }
        }
        return (grid, rest);
    }
    let mut grid = Vec::new();
    let mut cur = stmt;
    while let LowLevel::For {
        index,
        from,
        to,
        body,
    } = cur
    {
        if to <= from || !iterations_independent(body, *index) {
            break;
        }
        grid.push(GridLoop {
            iter: *index,
            from: *from,
            to: *to,
        });
        cur = body.unwrapped();
    }
    (grid, Cow::Borrowed(cur))
}

/// What a reduction accumulates besides the element itself.
#[derive(Clone, Copy)]
pub enum Rest<'a> {
    /// `s ⊕ v`.
    One(&'a ScalarExpr),
    /// `fma(a, b, s)`.
    Product(&'a ScalarExpr, &'a ScalarExpr),
}

/// A single loop accumulating into one element: `for i { s[o] = s[o] ⊕ v(i) }`.
#[derive(Clone, Copy)]
pub struct Accumulation<'a> {
    /// The loop's iterator.
    pub iter: Symbol,
    /// First iteration.
    pub from: i64,
    /// One past the last iteration.
    pub to: i64,
    /// The element's node.
    pub tn: &'a Tnode,
    /// The element's indices (not using the loop's iterator).
    pub idcs: &'a [AxisIndex],
    /// How the steps combine.
    pub combine: BinOp,
    /// What each step brings.
    pub rest: Rest<'a>,
}

impl<'a> Accumulation<'a> {
    /// Recognizes a single loop accumulating into one element.
    pub fn detect(stmt: &'a LowLevel) -> Option<Accumulation<'a>> {
        let LowLevel::For {
            index,
            from,
            to,
            body,
        } = stmt
        else {
            return None;
        };
        let LowLevel::Set { tn, idcs, value } = body.unwrapped() else {
            return None;
        };
        if idcs.iter().any(|i| i.symbols().contains(index)) || to <= from {
            return None;
        }
        let (combine, parts) = split_accumulation(tn, idcs, value)?;
        let rest = match parts.as_slice() {
            [v] => Rest::One(v),
            [a, b] => Rest::Product(a, b),
            _ => return None,
        };
        Some(Accumulation {
            iter: *index,
            from: *from,
            to: *to,
            tn,
            idcs,
            combine,
            rest,
        })
    }

    /// An accumulation whose steps may regroup: each step rounds to the element's precision,
    /// so only where that is the compute precision.
    fn detect_regroupable(stmt: &'a LowLevel) -> Option<Accumulation<'a>> {
        Accumulation::detect(stmt).filter(|r| r.tn.prec() == r.tn.prec().compute_prec())
    }
}

/// One statement of a row pass, run by the whole group in order, with a barrier after each:
/// later statements read what earlier ones stored.
pub struct RowItem<'a> {
    /// The statement.
    pub stmt: &'a LowLevel,
    /// How the group runs it.
    pub role: RowRole<'a>,
}

/// How a group runs one statement of a row pass.
pub enum RowRole<'a> {
    /// An accumulation into one element in its compute precision: a group reduction (strided
    /// shares in order, then a fixed tree).
    Reduce(Accumulation<'a>),
    /// A loop whose iterations are independent: strided over the group's invocations.
    Strided {
        /// The loop's iterator.
        index: Symbol,
        /// First iteration.
        from: i64,
        /// One past the last iteration.
        to: i64,
        /// The loop's body.
        body: &'a LowLevel,
    },
    /// Anything else: run by the group's first invocation.
    Lead,
}

/// The statements a group runs for one grid point of a row pass, classified.
pub fn row_items(inner: &LowLevel) -> Vec<RowItem<'_>> {
    let items: Vec<&LowLevel> = match inner.unwrapped() {
        LowLevel::Seq(items) => items.iter().collect(),
        other => vec![other],
    };
    items
        .into_iter()
        .map(|stmt| {
            let role = if let Some(r) = Accumulation::detect_regroupable(stmt) {
                RowRole::Reduce(r)
            } else {
                match stmt.unwrapped() {
                    LowLevel::For {
                        index,
                        from,
                        to,
                        body,
                    } if iterations_independent(body, *index) => RowRole::Strided {
                        index: *index,
                        from: *from,
                        to: *to,
                        body,
                    },
                    _ => RowRole::Lead,
                }
            };
            RowItem { stmt, role }
        })
        .collect()
}

/// Whether the statement under a grid of `total` points holds a reduction long enough to
/// spread over a group (and the grid is small enough to give each point a group).
fn is_row_pass(inner: &LowLevel, total: u64) -> bool {
    total <= ROW_REDUCTION_MAX_ROWS
        && row_items(inner).iter().any(|i| {
            matches!(&i.role, RowRole::Reduce(r) if (r.to - r.from) as u64 >= ROW_REDUCTION_MIN)
        })
}

/// A statement that is an `f32` matrix product, with whether it accumulates through a fused
/// multiply-add.
fn f32_product(stmt: &LowLevel) -> Option<(Gemm, bool)> {
    let c = Contraction::detect(stmt)?;
    if c.out.node.prec() != Prec::F32 {
        return None;
    }
    // The blocking is the CPU's and is not used by a tiled pass; any valid one will do.
    let g = c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3]))?;
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

/// The tile side of a product of `m × n` results per batch element on a device: 128 where
/// that still gives enough groups to keep the device busy, 64 where both sides fill one, else
/// 16; only sides whose staging fits the device's shared memory. `None` when not even the
/// smallest fits (or a group of [`TILE_THREADS`] is not allowed).
fn product_tile(
    m: usize,
    n: usize,
    batch: usize,
    limits: &GpuLimits,
    tuned: Option<usize>,
) -> Option<usize> {
    if limits.max_group_invocations < TILE_THREADS {
        return None;
    }
    let fits = |t: usize| tile_shared_bytes(t) <= limits.max_shared_bytes;
    if let Some(t) = tuned.filter(|t| ScheduleTuning::GPU_TILES.contains(t) && fits(*t)) {
        return Some(t);
    }
    let groups = |t: usize| (m.div_ceil(t) * n.div_ceil(t) * batch) as u64;
    if fits(128) && m.min(n) >= 128 && groups(128) >= limits.busy_groups() {
        Some(128)
    } else if fits(64) && m.min(n) >= 64 {
        Some(64)
    } else {
        fits(16).then_some(16)
    }
}

/// The GPU pass of one top-level statement on a device of `limits`, with why.
pub fn gpu_schedule(stmt: &LowLevel, limits: &GpuLimits, tuning: &ScheduleTuning) -> Schedule {
    let (pass, why) = plan_pass(stmt, limits, tuning);
    Schedule {
        kind: ScheduleKind::Gpu(pass),
        why,
        parallel: None,
    }
}

/// The GPU pass of one top-level statement on a device of `limits`, and why (what
/// [`gpu_schedule`] records).
pub fn plan_pass(
    stmt: &LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
) -> (GpuPass, String) {
    let stmt = stmt.unwrapped();
    let threads = limits.tuned_group_threads(tuning.gpu_threads);
    let groups_allowed = threads >= MIN_GROUP_THREADS;
    match stmt {
        LowLevel::Noop | LowLevel::Comment(_) => (GpuPass::Nothing, "nothing to run".into()),
        LowLevel::ZeroOut(tn) => (
            GpuPass::Zero {
                elements: tn.num_elems() as u64,
                threads,
            },
            "one invocation per element".into(),
        ),
        _ => {
            if let Some((gemm, fused)) = f32_product(stmt)
                && gemm.m.extent >= 8
                && gemm.n.extent >= 8
            {
                let batch: usize = gemm.batch.iter().map(|d| d.extent).product();
                if let Some(tile) =
                    product_tile(gemm.m.extent, gemm.n.extent, batch, limits, tuning.gpu_tile)
                {
                    let groups = (gemm.m.extent.div_ceil(tile)
                        * gemm.n.extent.div_ceil(tile)
                        * batch) as u64;
                    let why = format!(
                        "an f32 matrix product: factor tiles 16 deep in shared memory ({} of {} \
                         bytes), {tile} x {tile} results per group ({} per invocation), each \
                         element summed in the loop's order; {}",
                        tile_shared_bytes(tile),
                        limits.max_shared_bytes,
                        (tile / 16) * (tile / 16),
                        if tuning.gpu_tile == Some(tile) {
                            format!("{tile}-tiles as the schedule's tuning asks")
                        } else if tile == 128 {
                            format!(
                                "128-tiles as they still make {groups} groups, at least {} to \
                                 keep the device busy",
                                limits.busy_groups()
                            )
                        } else if tile == 64 {
                            "64-tiles as both sides fill one".to_string()
                        } else {
                            "16-tiles as a side is shorter than 64".to_string()
                        }
                    );
                    return (
                        GpuPass::Tiles {
                            gemm,
                            fused,
                            tile,
                            groups,
                        },
                        why,
                    );
                }
            }
            let (grid, inner) = grid_loops(stmt);
            if !grid.is_empty() {
                let total = grid
                    .iter()
                    .map(|l| (l.to - l.from) as u64)
                    .fold(1u64, u64::saturating_mul);
                let loops = grid.len();
                if groups_allowed && is_row_pass(&inner, total) {
                    return (
                        GpuPass::Rows {
                            grid,
                            total,
                            threads,
                        },
                        format!(
                            "{loops} independent outer loop(s) around reductions of at least \
                             {ROW_REDUCTION_MIN} steps: one group of {threads} per iteration; \
                             reductions combine strided shares in a fixed tree order, independent \
                             loops stride over the group, anything else runs on its first \
                             invocation"
                        ),
                    );
                }
                return (
                    GpuPass::Grid {
                        grid,
                        total,
                        threads,
                    },
                    format!("{loops} independent outer loop(s): one invocation per iteration"),
                );
            }
            match Accumulation::detect_regroupable(stmt) {
                Some(r) if groups_allowed => (
                    GpuPass::Reduction { threads },
                    format!(
                        "a loop accumulating into one element by {}: one group of {threads}, \
                         strided shares combined in a fixed tree order",
                        r.combine.name()
                    ),
                ),
                _ => (
                    GpuPass::Single,
                    "its iterations depend on each other and it is not a reduction into one \
                     element"
                        .into(),
                ),
            }
        }
    }
}

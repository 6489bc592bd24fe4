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

mod choose;
mod limits;
mod pass;

pub use analysis::{
    Accumulation, Rest, RowItem, RowRole, grid_loops, grid_total, independent_work,
    longest_reduction, row_items,
};
pub use attention::GpuAttention;
pub use attention::runs_as_attention;
pub use choose::{gpu_schedule, gpu_schedules, plan_pass};
pub use distribute::{distribute_loop, merged_pointwise, restructure};
pub use join::{JoinedLaunch, joined_launches};
pub use limits::*;
pub use matrix::{MatrixKind, MatrixTile};
pub use order::TileOrder;
pub use pass::*;
pub use plan::{DeviceModel, GpuPlan, PlannedPass};
pub use simt::SimtTile;

#[cfg(test)]
mod tests;

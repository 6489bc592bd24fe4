//! The GPU pass of a fused attention ([`arrayjit_ir::attention`]): the pass's loop nest, found whole
//! among a routine's statements ([`AttentionOp::of_statement`]), runs as FlashAttention-2's
//! work split on the device's `f32` lanes instead of its loops (whose batch, head and query
//! loops alone would make the grid, each invocation walking every key through global memory).
//!
//! - **Forward**: one group per (batch element, head, block of [`GpuAttention::rows`] query
//!   rows), one invocation per row. The group stages [`GpuAttention::block`] keys and their
//!   values at a time in shared memory (coalesced: consecutive invocations read consecutive
//!   features); each invocation keeps its query, its output accumulator and the block's
//!   scores in registers, and runs the online softmax one block at a time (the block's
//!   maximum first, so the accumulator is rescaled once per block). A causal group stops at
//!   the key of its last row: blocks above the diagonal are skipped, not masked.
//! - **Backward**, two launches, so that every gradient element is summed by one invocation
//!   in a fixed order (no atomics): the query gradients (one group per query block, the keys
//!   and values staged), then the key and value gradients (one group per key block, one
//!   invocation per key, the queries, output gradients, log-sum-exps and deltas staged; a
//!   causal group starts at its first key's row). Each weight is recomputed from the saved
//!   log-sum-exp, as the loops do.
//!
//! Dropout draws through [`AttentionSpec::keep_factor`], the loops' own expression. Results
//! agree with the loops within float rounding (the same operations, the blocks' maxima taken
//! first).

use std::fmt;
use std::sync::Arc;

use arrayjit_ir::attention::{AttentionOp, AttentionSpec};
use arrayjit_ir::low_level::LowLevel;
use arrayjit_ir::prec::Prec;

use super::GpuLimits;

/// Rows per group where the groups fill the device.
pub const ATTENTION_ROWS: u32 = 64;
/// The fewest rows per group (where larger groups would leave the device idle).
pub const ATTENTION_MIN_ROWS: u32 = 8;
/// The fewest invocations per group (rows × lanes) where larger groups would leave the device
/// idle: a warp.
pub const ATTENTION_GROUP_INVOCATIONS: u32 = 32;
/// The most keys (or queries) staged per step.
pub const ATTENTION_MAX_BLOCK: usize = 64;
/// The fewest keys staged per step: below, a head is too wide for the group's shared memory.
pub const ATTENTION_MIN_BLOCK: usize = 8;
/// The widest query, key or value row an invocation keeps in registers (with its accumulator).
pub const ATTENTION_MAX_FEATURES: usize = 128;
/// The most invocations per row.
pub const ATTENTION_MAX_LANES: u32 = 4;
/// The most invocations per group (rows × lanes).
pub const MAX_ATTENTION_THREADS: u32 = 256;

/// How one pass of fused attention runs on a GPU (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuAttention {
    /// The pass.
    pub op: Arc<AttentionOp>,
    /// Rows per group: query rows (keys in the key gradients' launch).
    pub rows: u32,
    /// Invocations per row (1, 2 or 4: neighbours in one subgroup), each holding every
    /// `lanes`-th feature of the row's vectors; their dot products combine by shuffles, so
    /// every lane holds the same sums. More invocations and fewer registers each.
    pub lanes: u32,
    /// Keys (queries, in the key gradients' launch) staged in shared memory per step.
    pub block: usize,
    /// The backward pass computes the key gradients and the value gradients in launches of
    /// their own (three launches), so that each binds fewer arrays (8 and 6 with dropout,
    /// instead of 9): for devices that bind few arrays per pass (WebGPU's guaranteed 8).
    pub separate_key_grads: bool,
}

impl GpuAttention {
    /// The GPU pass of `stmt` if it is a whole pass of fused attention: `None` if it is not
    /// one, `Some(Err(why))` if its loops run it (unpadded arrays of one compute precision,
    /// rows of at most [`ATTENTION_MAX_FEATURES`] features, a `u32` dropout step, and a block
    /// of [`ATTENTION_MIN_BLOCK`] keys in the group's shared memory are needed), else the
    /// pass and why.
    pub fn plan(
        stmt: &LowLevel,
        limits: &GpuLimits,
    ) -> Option<std::result::Result<(GpuAttention, String), String>> {
        let op = AttentionOp::of_statement(stmt.unwrapped())?;
        Some(Self::plan_op(op, limits))
    }

    fn plan_op(
        op: Arc<AttentionOp>,
        limits: &GpuLimits,
    ) -> std::result::Result<(GpuAttention, String), String> {
        let spec = op.spec();
        let d = spec.dims();
        let stats = spec.stats_prec();
        let step = spec.dropout.as_ref().map(|dr| &dr.step);
        if let Some(t) = step.filter(|t| t.prec() != Prec::U32 || t.padding().is_some()) {
            return Err(format!(
                "the dropout step {} is not an unpadded u32 node",
                t.debug_name()
            ));
        }
        if let Some(t) = op
            .inputs()
            .into_iter()
            .chain(op.outputs())
            .filter(|t| Some(*t) != step)
            .find(|t| t.prec().compute_prec() != stats || t.padding().is_some())
        {
            return Err(format!(
                "{} is {}{}: the GPU pass takes unpadded arrays computed in {}",
                t.debug_name(),
                t.prec().name(),
                if t.padding().is_some() {
                    ", padded"
                } else {
                    ""
                },
                stats.name()
            ));
        }
        let widest = d.features.max(d.value_features);
        if widest > ATTENTION_MAX_FEATURES {
            return Err(format!(
                "rows of {widest} features: an invocation keeps at most {ATTENTION_MAX_FEATURES} \
                 in registers"
            ));
        }
        let bytes = stats.size_in_bytes();
        // Staged per key (query): its key (query) and value (output gradient) rows, and the
        // query's log-sum-exp and delta in the key gradients' launch.
        let per_row = (d.features + d.value_features + 2) * bytes;
        let mut block = ATTENTION_MAX_BLOCK;
        while block >= ATTENTION_MIN_BLOCK && block * per_row > limits.max_shared_bytes {
            block /= 2;
        }
        if block < ATTENTION_MIN_BLOCK {
            return Err(format!(
                "{ATTENTION_MIN_BLOCK} rows of {} + {} features do not fit the group's {} bytes \
                 of shared memory",
                d.features, d.value_features, limits.max_shared_bytes
            ));
        }
        // Lanes per row: where the device shuffles within subgroups, as many (up to
        // ATTENTION_MAX_LANES) as divide the subgroup and both rows' features.
        let mut lanes = 1;
        while lanes < ATTENTION_MAX_LANES
            && limits.subgroup_size >= 2 * lanes
            && limits.subgroup_size.is_multiple_of(2 * lanes)
            && d.features.is_multiple_of(2 * lanes as usize)
            && d.value_features.is_multiple_of(2 * lanes as usize)
        {
            lanes *= 2;
        }
        let cap = limits.max_group_invocations.max(1);
        let most = ATTENTION_ROWS.min(1 << (31 - cap.leading_zeros()));
        while lanes > 1 && most * lanes > cap.min(MAX_ATTENTION_THREADS) {
            lanes /= 2;
        }
        let mut plan = GpuAttention {
            op: op.clone(),
            rows: most,
            lanes,
            block,
            separate_key_grads: false,
        };
        // Fewer rows per group where the groups would leave the device idle, down to groups
        // of one warp (32 invocations, or the group limit) and at least 8 rows.
        let busy = limits.busy_groups();
        let fewest = (ATTENTION_GROUP_INVOCATIONS.min(cap) / lanes).max(ATTENTION_MIN_ROWS);
        let mut smaller = String::new();
        let larger_groups = plan.groups(0);
        while plan.groups(0) < busy && plan.rows / 2 >= fewest {
            plan.rows /= 2;
        }
        if plan.rows < most {
            smaller = format!(
                " (groups of {most} rows would make {larger_groups} groups, fewer than the \
                 {busy} that keep the device busy; groups of {} make {})",
                plan.rows,
                plan.groups(0)
            );
        }
        let lanes_why = if plan.lanes > 1 {
            format!(
                " of {} invocations each (their dot products combined by subgroup shuffles)",
                plan.lanes
            )
        } else {
            String::new()
        };
        let why = format!(
            "{}: {} launch(es) of FlashAttention-2's split, groups of {} rows{lanes_why}{smaller}, \
             {} keys staged in {} of {} bytes of shared memory at a time{}",
            op.describe(),
            plan.launches(),
            plan.rows,
            plan.block,
            plan.shared_bytes(),
            limits.max_shared_bytes,
            if spec.causal {
                ", blocks above the diagonal skipped"
            } else {
                ""
            }
        );
        Ok((plan, why))
    }

    /// Invocations per group: rows × lanes.
    pub fn threads(&self) -> u32 {
        self.rows * self.lanes
    }

    /// This pass with one invocation per row (for a dialect without subgroup shuffles), as
    /// many rows per group as it had invocations (up to [`ATTENTION_ROWS`]).
    pub fn with_one_lane(&self) -> GpuAttention {
        GpuAttention {
            rows: (self.rows * self.lanes).min(ATTENTION_ROWS.max(self.rows)),
            lanes: 1,
            ..self.clone()
        }
    }

    /// The attention's spec.
    pub fn spec(&self) -> &AttentionSpec {
        self.op.spec()
    }

    /// Launches: one forward, two backward (query gradients, then key and value gradients),
    /// three where the key and value gradients are separate.
    pub fn launches(&self) -> u32 {
        match &*self.op {
            AttentionOp::Forward { .. } => 1,
            AttentionOp::Backward { .. } if self.separate_key_grads => 3,
            AttentionOp::Backward { .. } => 2,
        }
    }

    /// The gradients launch `k` of the backward pass computes: (keys, values); both false
    /// for the query gradients' launch.
    pub fn key_grads_of(&self, k: usize) -> (bool, bool) {
        match (k, self.separate_key_grads) {
            (0, _) => (false, false),
            (_, false) => (true, true),
            (1, true) => (true, false),
            _ => (false, true),
        }
    }

    /// This backward pass with the key and value gradients in launches of their own (see
    /// [`GpuAttention::separate_key_grads`]).
    pub fn with_separate_key_grads(&self) -> GpuAttention {
        GpuAttention {
            separate_key_grads: matches!(&*self.op, AttentionOp::Backward { .. }),
            ..self.clone()
        }
    }

    /// Whether launch `k` walks keys for blocks of query rows (the forward, the query
    /// gradients), rather than queries for blocks of keys (the key and value gradients).
    pub fn rows_are_queries(&self, k: usize) -> bool {
        k == 0
    }

    /// Groups of launch `k`: batch × heads × row blocks.
    pub fn groups(&self, k: usize) -> u64 {
        let d = self.spec().dims();
        let rows = if self.rows_are_queries(k) {
            d.queries
        } else {
            d.keys
        };
        (d.batch * d.heads * rows.div_ceil(self.rows as usize)) as u64
    }

    /// Bytes of shared memory a group stages at most.
    pub fn shared_bytes(&self) -> usize {
        let d = self.spec().dims();
        let extra = match &*self.op {
            AttentionOp::Forward { .. } => 0,
            AttentionOp::Backward { .. } => 2,
        };
        self.block
            * (d.features + d.value_features + extra)
            * self.spec().stats_prec().size_in_bytes()
    }

    /// The arrays launch `k` reads or writes (its state arrays are never touched): the pass's
    /// inputs (the value gradients' own launch needs neither the values nor the deltas), and
    /// the outputs it writes.
    pub fn kernel_arrays(&self, k: usize) -> Vec<&arrayjit_ir::tnode::Tnode> {
        let mut nodes = self.op.inputs();
        let outputs = self.op.outputs();
        match &*self.op {
            AttentionOp::Forward { .. } => nodes.extend(outputs),
            AttentionOp::Backward { delta, .. } => {
                let spec = self.spec();
                let (keys, values) = self.key_grads_of(k);
                if values && !keys {
                    nodes.retain(|t| *t != &spec.v && *t != delta);
                }
                // [grad_q, grad_k, grad_v]
                let written = [k == 0, keys, values];
                nodes.extend(
                    outputs
                        .into_iter()
                        .zip(written)
                        .filter_map(|(t, w)| w.then_some(t)),
                );
            }
        }
        nodes
    }
}

impl fmt::Display for GpuAttention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {}: groups of {} rows × {} lane(s), {} keys staged per step",
            self.op.describe(),
            self.rows,
            self.lanes,
            self.block
        )
    }
}

/// Whether `stmt` is a whole pass of fused attention that its GPU pass runs
/// ([`GpuAttention`]): it stays whole (neither distributed nor hoisted), or it would no longer
/// be found.
pub fn runs_as_attention(stmt: &LowLevel, limits: &GpuLimits) -> bool {
    matches!(GpuAttention::plan(stmt, limits), Some(Ok(_)))
}

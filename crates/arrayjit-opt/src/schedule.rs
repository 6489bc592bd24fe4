//! Schedules as data: how each top-level loop nest of an optimized routine is to be run, with
//! why. The interpreter ignores schedules (the loop code stays the reference semantics); a
//! renderer follows them. A schedule changes results only by float reassociation in a fixed
//! order, never by thread timing.
//!
//! The first schedule beyond plain loops is the **contraction**: a loop nest computing
//! `out[..] += lhs[..] * rhs[..]` over plain loop iterators (any einsum, transposed operands and
//! batch axes included). Its iterators fall into roles — batch (in all three), M (out and lhs),
//! N (out and rhs), K (lhs and rhs: reduced) — and the nest runs as a packed, cache-blocked,
//! register-blocked matrix product per batch element: `C[M, N] += A[M, K] · B[K, N]` with
//! general strides, so that any layout of the operands is packed into the micro-kernel's order.

use std::collections::HashMap;
use std::fmt;

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::ops::{BinOp, TernOp};
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

mod attention;
mod blocking;
mod contraction;
pub mod gpu;
pub mod hoist;
#[cfg(test)]
mod tests;
pub use attention::{ATTENTION_BLOCK_KEYS, ATTENTION_BLOCK_QUERIES, AttentionPlan};
pub use blocking::{Blocking, CacheShares, ScheduleTuning, StreamFetch};
pub use contraction::{
    Access, BATCH_SPLIT_MIN_PER_WORKER, BatchSplit, Contraction, Dim, FactorSide, Gemm,
    scheduled_product,
};
pub use gpu::{GpuLimits, GpuPass};

/// How one top-level statement runs, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The kind of schedule.
    pub kind: ScheduleKind,
    /// Why it was chosen (for reports, like memory-mode provenance).
    pub why: String,
    /// The outermost loop, split into ranges over the device's workers (the CPU's grid), if
    /// its iterations are independent and the nest is large enough. Each iteration computes
    /// the same values wherever it runs, so results do not depend on the worker count.
    pub parallel: Option<ParallelLoop>,
}

/// A loop whose iterations run on several workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParallelLoop {
    /// The loop's iterator.
    pub iter: Symbol,
    /// Iterations of the whole nest per iteration of this loop (its work unit).
    pub inner_iterations: u64,
    /// The nest's estimated work ([`nest_work`]), which decided the split.
    pub work: u64,
}

impl ParallelLoop {
    /// The outermost loop of `stmt` if its iterations are independent (see
    /// [`iterations_independent`]).
    pub fn detect(stmt: &LowLevel) -> Option<ParallelLoop> {
        ParallelLoop::detect_with_work(stmt, nest_work(stmt))
    }

    /// [`ParallelLoop::detect`] for a statement whose [`nest_work`] is known.
    fn detect_with_work(stmt: &LowLevel, work: u64) -> Option<ParallelLoop> {
        let LowLevel::For {
            index,
            from,
            to,
            body,
        } = stmt
        else {
            return None;
        };
        if !iterations_independent(body, *index) {
            return None;
        }
        let extent = (to - from).max(1) as u64;
        Some(ParallelLoop {
            iter: *index,
            inner_iterations: nest_iterations(stmt) / extent,
            work,
        })
    }
}

/// Whether iterations of a loop over `iter` running `body` touch disjoint data wherever one of
/// them writes: `body` writes something, zeroes no whole node, and every node it writes has
/// an axis indexed by exactly `iter` in every read and write of that node in `body`. Then
/// iteration `i` reads and writes only slice `i` of each written node, so the iterations can
/// run in any order or at once (split over workers), and two such loops over the same range
/// can be fused (iteration `i` of the second only needs iteration `i` of the first).
/// Iteration-private nodes ([`Tnode::is_iteration_private`]) are exempt: each iteration
/// writes its slice before reading it, and workers running iterations at once each have a
/// copy; but they alone do not make the iterations worth splitting.
pub fn iterations_independent(body: &LowLevel, iter: Symbol) -> bool {
    // Per written node: the axes indexed by exactly `iter` in every access seen so far.
    let mut axes: HashMap<usize, Vec<bool>> = HashMap::new();
    let mut ok = true;
    let narrow = |axes: &mut Vec<bool>, idcs: &[AxisIndex]| {
        for (d, keep) in axes.iter_mut().enumerate() {
            *keep &= idcs.get(d) == Some(&AxisIndex::Iterator(iter));
        }
    };
    body.visit(&mut |st| match st {
        LowLevel::Set { tn, .. } if tn.is_iteration_private() => {}
        LowLevel::Set { tn, idcs, .. } => {
            let a = axes
                .entry(tn.id())
                .or_insert_with(|| vec![true; idcs.len()]);
            narrow(a, idcs);
        }
        LowLevel::ZeroOut(_) => ok = false,
        _ => {}
    });
    if !ok || axes.is_empty() {
        return false;
    }
    body.visit_exprs(&mut |e| {
        if let ScalarExpr::Get(t, i) | ScalarExpr::GetMerge(t, i) = e
            && let Some(a) = axes.get_mut(&t.id())
        {
            narrow(a, i);
        }
    });
    axes.values().all(|a| a.contains(&true))
}

/// Loop iterations times `leaf` of what each iteration runs (a sequence adds up its
/// statements; at least 1).
fn nest_total(stmt: &LowLevel, leaf: &impl Fn(&LowLevel) -> u64) -> u64 {
    match stmt {
        LowLevel::For { from, to, body, .. } => {
            ((to - from).max(0) as u64).saturating_mul(nest_total(body, leaf))
        }
        LowLevel::Seq(items) => items
            .iter()
            .map(|i| nest_total(i, leaf))
            .fold(0, u64::saturating_add)
            .max(1),
        s => leaf(s),
    }
}

/// Estimated work of a statement: iterations times what each runs, where a store counts one
/// plus one per operation of its value (a loop's body adds up its statements). A nest of few
/// iterations with a heavy body (an optimizer's update) weighs like a long cheap copy.
pub fn nest_work(stmt: &LowLevel) -> u64 {
    nest_total(stmt, &|s| match s {
        LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => {
            let mut ops = 1u64;
            value.visit_all(&mut |e| {
                if matches!(
                    e,
                    ScalarExpr::Unop(..)
                        | ScalarExpr::Binop(..)
                        | ScalarExpr::Ternop(..)
                        | ScalarExpr::Random { .. }
                ) {
                    ops += 1;
                }
            });
            ops
        }
        _ => 1,
    })
}

/// Iterations of every loop of a statement, nested loops multiplied (at least 1).
pub fn nest_iterations(stmt: &LowLevel) -> u64 {
    nest_total(stmt, &|_| 1)
}

/// The kinds of schedules.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleKind {
    /// The loops as written.
    Loops,
    /// A blocked matrix product per batch element.
    Contraction(Gemm),
    /// The innermost loop reduces into one element: it runs over `lanes` independent
    /// accumulators (vectorizable), combined in a fixed order at the end.
    Reduction(ReductionPlan),
    /// Nothing to run: the next statement does this one's work (a zeroing before a blocked
    /// product that writes every element instead of adding to it, or before a pass of fused
    /// attention the blocked helper runs).
    Absorbed,
    /// The outermost loop's body is a sequence of statements (typically loops fused by the
    /// optimizer), each run by its own schedule: one per statement of the body, in order, each
    /// [`ScheduleKind::Loops`] or a [`ScheduleKind::Reduction`] without blocks (the outermost
    /// loop is the one split over workers).
    Fused(Vec<Schedule>),
    /// A pass of a device that runs groups of invocations (a GPU): see [`gpu`].
    Gpu(GpuPass),
    /// A whole pass of fused attention run by the CPU's blocked attention helper.
    Attention(AttentionPlan),
}

/// A reduction's plan: which loop, which combining operation, how many accumulators.
#[derive(Clone, Debug, PartialEq)]
pub struct ReductionPlan {
    /// The reduced (innermost) loop's iterator.
    pub iter: Symbol,
    /// How partial results combine: `Add` (also for the fused multiply-add form), `Max`, `Min`.
    pub combine: BinOp,
    /// Independent accumulators: element `r` of the loop goes to accumulator `r mod lanes`
    /// (the tail to accumulator 0); they are combined by folding in halves (of `w` lanes,
    /// lane `l + ⌈w/2⌉` into lane `l`, until one is left), then into the element. A long sum runs pairwise in the C backends: blocks of 128 steps of each
    /// accumulator, their sums added as a binary tree, as do the totals of outer loops that do
    /// not index the element (`arrayjit_codegen`'s `c::pairwise` states the order).
    pub lanes: usize,
    /// Elements of the reduced node's precision in one vector register of the target (1 where
    /// it has none): the accumulators fill `lanes / vector_lanes` registers, and the C
    /// renderer unrolls the loop over them by that much so that they stay in registers. Only
    /// a hint: any value gives the same results.
    pub vector_lanes: usize,
    /// For a long reduction that is the whole nest (no outer loop to split over workers): the
    /// loop is cut into fixed blocks of this many iterations, each reduced as above into a
    /// partial, and the partials are combined pairwise (a binary tree over the blocks in their
    /// order) — the blocks, and so the results, do not depend on how many workers run them.
    pub blocks: Option<u64>,
}

impl ReductionPlan {
    /// Recognizes a statement whose innermost loop accumulates into an element that does not
    /// depend on that loop: `out[o] = out[o] ⊕ v` (`⊕` = add, max, min, or the fused
    /// multiply-add form), for a node computed in its own (f32 or f64) precision, with `v` not
    /// reading `out`, and an innermost loop of at least `2 · lanes` iterations. `f32_lanes`
    /// is the target's vector width in `f32` elements.
    pub fn detect(stmt: &LowLevel, lanes: usize, f32_lanes: usize) -> Option<ReductionPlan> {
        let (loops, s) = stmt.perfect_nest();
        let depth = loops.len();
        let &(iter, from, to) = loops.last()?;
        let extent = to - from;
        // Too short a loop gains nothing from several accumulators.
        if extent < 2 * lanes as i64 {
            return None;
        }
        let LowLevel::Set { tn, idcs, value } = s else {
            return None;
        };
        if !matches!(tn.prec(), Prec::F32 | Prec::F64)
            || idcs.iter().any(|i| i.symbols().contains(&iter))
        {
            return None;
        }
        let (combine, _) = split_accumulation(tn, idcs, value)?;
        // Blocks of at least 2^16 iterations (a multiple of the lanes), at most 1024 of them.
        let block =
            ((extent as u64).div_ceil(1024).max(1 << 16)).div_ceil(lanes as u64) * lanes as u64;
        let blocks = (depth == 1 && extent as u64 >= 2 * block).then_some(block);
        let vector_lanes = if tn.prec() == Prec::F64 {
            f32_lanes / 2
        } else {
            f32_lanes
        };
        Some(ReductionPlan {
            iter,
            combine,
            lanes: lanes.max(1),
            vector_lanes: vector_lanes.max(1),
            blocks,
        })
    }
}

/// The parts of an accumulation `out[o] = out[o] ⊕ v` (⊕ an addition, maximum or minimum, on
/// either side) or `out[o] = fma(a, b, out[o])` (an addition of `a · b`): the combining
/// operation and what it combines in (`[v]` or `[a, b]`), none of which reads `out`.
pub fn split_accumulation<'a>(
    tn: &Tnode,
    idcs: &[AxisIndex],
    value: &'a ScalarExpr,
) -> Option<(BinOp, Vec<&'a ScalarExpr>)> {
    let is_out = |e: &ScalarExpr| matches!(e, ScalarExpr::Get(t, i) if t == tn && i == idcs);
    let (combine, rest): (BinOp, Vec<&ScalarExpr>) = match value {
        ScalarExpr::Binop(op @ (BinOp::Add | BinOp::Max | BinOp::Min), a, b) if is_out(a) => {
            (*op, vec![&**b])
        }
        ScalarExpr::Binop(op @ (BinOp::Add | BinOp::Max | BinOp::Min), a, b) if is_out(b) => {
            (*op, vec![&**a])
        }
        ScalarExpr::Ternop(TernOp::Fma, a, b, c) if is_out(c) => (BinOp::Add, vec![&**a, &**b]),
        _ => return None,
    };
    (!rest.iter().any(|e| e.reads(tn))).then_some((combine, rest))
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.parallel {
            write!(
                f,
                "outermost loop split over the workers (estimated work {}: iterations × \
                 operations); ",
                p.work
            )?;
        }
        match &self.kind {
            ScheduleKind::Loops => write!(f, "loops ({})", self.why),
            ScheduleKind::Reduction(r) => {
                if let Some(block) = r.blocks {
                    write!(
                        f,
                        "reduction split into blocks of {block} iterations, each "
                    )?;
                }
                write!(
                    f,
                    "reduction over {} accumulators combined by {:?} ({})",
                    r.lanes, r.combine, self.why
                )
            }
            ScheduleKind::Contraction(g) => write!(f, "{g} ({})", self.why),
            ScheduleKind::Absorbed => write!(f, "absorbed ({})", self.why),
            ScheduleKind::Gpu(pass) => write!(f, "{pass} ({})", self.why),
            ScheduleKind::Attention(plan) => write!(f, "{plan} ({})", self.why),
            ScheduleKind::Fused(parts) => {
                write!(f, "{} statements in one loop ({})", parts.len(), self.why)?;
                for (k, p) in parts.iter().enumerate() {
                    write!(f, "; [{k}] {p}")?;
                }
                Ok(())
            }
        }
    }
}

/// What schedules may use: the device's vector width and registers, cache sizes, and the
/// smallest contraction worth a blocked product.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSettings {
    /// `f32` lanes of the widest vector (4 without SIMD knowledge).
    pub f32_lanes: usize,
    /// Vector registers.
    pub vector_registers: usize,
    /// L1d, L2, L3 sizes in bytes (0 where unknown).
    pub cache_bytes: [usize; 3],
    /// How much of each cache blocked products' blocks may fill: measured per CPU (see
    /// [`CacheShares`]).
    pub cache_shares: CacheShares,
    /// Contractions with fewer floating-point operations stay loops.
    pub min_contraction_flops: f64,
    /// Schedule contractions as blocked products at all.
    pub enable_contractions: bool,
    /// Run innermost reductions over several accumulators.
    pub enable_reductions: bool,
    /// Split the outermost loop of nests with independent iterations over the device's
    /// workers when the nest's estimated work ([`nest_work`]: iterations times the operations
    /// of each) is at least this (`u64::MAX`: never); batches of small products are split when
    /// their multiply-adds reach it.
    pub min_parallel_work: u64,
    /// A kernel whose loops (blocked contractions aside) run fewer iterations than this in
    /// total is compiled with moderate optimization: the compiler's heaviest loop passes would
    /// cost more compile time than they could save at run time.
    pub light_kernel_iterations: u64,
    /// Choices varied around the heuristics (register tile, cache blocks, reduction
    /// accumulators); the default is the heuristics. The schedule search sets it.
    pub tuning: ScheduleTuning,
    /// For a device that runs groups of invocations (a GPU, the CUDA emulation): its limits.
    /// Then every statement gets a GPU pass ([`ScheduleKind::Gpu`]) chosen from them, and the
    /// CPU settings above do not apply. `None`: a CPU.
    pub gpu: Option<GpuLimits>,
    /// `f32` matrix products may run on a GPU's matrix units as TF32: inputs rounded to 10
    /// mantissa bits, about 3 decimal digits (as PyTorch's `allow_tf32`). Off by default:
    /// `f32` products are then exact `f32` products. Backends read `ARRAYJIT_ALLOW_TF32`.
    pub allow_tf32: bool,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        ScheduleSettings {
            f32_lanes: 8,
            vector_registers: 16,
            cache_bytes: [32 << 10, 256 << 10, 8 << 20],
            cache_shares: CacheShares::default(),
            min_contraction_flops: 32768.0,
            enable_contractions: true,
            enable_reductions: true,
            min_parallel_work: 1 << 18,
            light_kernel_iterations: 1 << 20,
            tuning: ScheduleTuning::default(),
            gpu: None,
            allow_tf32: false,
        }
    }
}

/// The schedule of a statement inside a loop's body: plain loops, or a reduction over several
/// accumulators (never blocked: the enclosing loop is the one split over workers).
pub fn body_schedule(item: &LowLevel, settings: &ScheduleSettings) -> Schedule {
    match reduction_schedule(item, settings, "") {
        Some(Schedule {
            kind: ScheduleKind::Reduction(plan),
            why,
            ..
        }) => Schedule {
            kind: ScheduleKind::Reduction(ReductionPlan {
                blocks: None,
                ..plan
            }),
            why,
            parallel: None,
        },
        _ => Schedule {
            kind: ScheduleKind::Loops,
            why: "a statement of the loop's body".into(),
            parallel: None,
        },
    }
}

/// The reduction schedule of a statement whose innermost loop reduces into one element, if
/// reductions are enabled (its reason starts with `why_prefix`).
///
/// The accumulators are the tuning's vectors (4 by default) when the loop has at least two
/// elements per accumulator. A shorter loop (the rows of 64 of attention scores) gets the most
/// vectors, halving down to one, that still leave at least 4 elements per accumulator: fewer
/// accumulators than elements to combine at the end, which is serial (a fixed order).
fn reduction_schedule(
    s: &LowLevel,
    settings: &ScheduleSettings,
    why_prefix: &str,
) -> Option<Schedule> {
    let width = settings.f32_lanes.max(1);
    let full = settings.tuning.reduction_lanes(width);
    let short_row = || {
        let (loops, _) = s.perfect_nest();
        let &(_, from, to) = loops.last()?;
        let mut vectors = full / width / 2;
        while vectors >= 1 {
            let lanes = vectors * width;
            if to - from >= 4 * lanes as i64 {
                return ReductionPlan::detect(s, lanes, width);
            }
            vectors /= 2;
        }
        None
    };
    let plan = ReductionPlan::detect(s, full, width).or_else(short_row)?;
    settings.enable_reductions.then(|| Schedule {
        why: format!(
            "{why_prefix}its innermost loop reduces into one element: {} accumulators ({} \
             vectors) break the dependency chain",
            plan.lanes,
            plan.lanes.div_ceil(width)
        ),
        kind: ScheduleKind::Reduction(plan),
        parallel: None,
    })
}

/// The schedule of every top-level statement, in order.
pub fn schedule(stmts: &[&LowLevel], settings: &ScheduleSettings) -> Vec<Schedule> {
    if let Some(limits) = &settings.gpu {
        return gpu::gpu_schedules(stmts, limits, &settings.tuning, settings.allow_tf32);
    }
    let mut cache: HashMap<usize, Blocking> = HashMap::new();
    let mut schedules: Vec<Schedule> = stmts
        .iter()
        .map(|s| {
            let blocking = *cache
                .entry(4)
                .or_insert_with(|| Blocking::for_settings(settings, 4));
            let mut schedule = match AttentionPlan::detect_with(s, settings, blocking) {
                Some(Ok(plan)) => {
                    return Schedule {
                        kind: ScheduleKind::Attention(plan),
                        why: "a whole pass of fused attention: the blocked helper runs it".into(),
                        parallel: None,
                    };
                }
                Some(Err(why)) => {
                    let mut loops = nest_schedule(s, settings, &mut cache);
                    loops.why = format!(
                        "a pass of fused attention left to its loops ({why}); {}",
                        loops.why
                    );
                    loops
                }
                None => nest_schedule(s, settings, &mut cache),
            };
            if !matches!(schedule.kind, ScheduleKind::Contraction(_)) {
                let work = nest_work(s);
                if work >= settings.min_parallel_work {
                    schedule.parallel = ParallelLoop::detect_with_work(s, work);
                }
            }
            schedule
        })
        .collect();
    // A zeroing right before a product that writes every element of the same node: the
    // product stores its first block instead of adding it, and the zeroing is not run.
    for i in 1..stmts.len() {
        let (before, after) = schedules.split_at_mut(i);
        if let (LowLevel::ZeroOut(zeroed), ScheduleKind::Contraction(g)) =
            (stmts[i - 1], &mut after[0].kind)
            && *zeroed == g.out
            && g.covers_out
            && matches!(before[i - 1].kind, ScheduleKind::Loops)
        {
            g.overwrite = true;
            before[i - 1] = Schedule {
                kind: ScheduleKind::Absorbed,
                why: "the blocked product after it writes every element".into(),
                parallel: None,
            };
        }
    }
    // Zeroings right before a pass of fused attention the blocked helper runs, of nodes its
    // nest writes: the helper writes every element of the pass's outputs and keeps its state in
    // buffers of its own (at GPT-2's T = 1024, four zeroings of 12 MiB a step of the bench).
    for i in 0..stmts.len() {
        let ScheduleKind::Attention(plan) = &schedules[i].kind else {
            continue;
        };
        for j in plan.op.zeroings_before(stmts, i) {
            if matches!(schedules[j].kind, ScheduleKind::Loops) {
                schedules[j] = Schedule {
                    kind: ScheduleKind::Absorbed,
                    why: "the blocked attention helper after it writes every element of the \
                          pass's outputs and keeps its state in buffers of its own"
                        .into(),
                    parallel: None,
                };
            }
        }
    }
    schedules
}

/// The schedule of one nest, before choosing a parallel loop.
fn nest_schedule(
    s: &LowLevel,
    settings: &ScheduleSettings,
    cache: &mut HashMap<usize, Blocking>,
) -> Schedule {
    if let LowLevel::For { body, .. } = s
        && let LowLevel::Seq(items) = &**body
    {
        let parts: Vec<Schedule> = items
            .iter()
            .map(|item| body_schedule(item, settings))
            .collect();
        if parts
            .iter()
            .any(|p| matches!(p.kind, ScheduleKind::Reduction(_)))
        {
            return Schedule {
                kind: ScheduleKind::Fused(parts),
                why: "the loop's body holds several statements, some of them reductions".into(),
                parallel: None,
            };
        }
    }
    let reduction = |why: String| {
        reduction_schedule(s, settings, &format!("{why}; ")).unwrap_or(Schedule {
            kind: ScheduleKind::Loops,
            why,
            parallel: None,
        })
    };
    let Some(c) = Contraction::detect_guarded(s) else {
        return reduction("not a contraction".into());
    };
    if !settings.enable_contractions {
        return reduction("blocked contractions are disabled in the schedule settings".into());
    }
    if c.flops() < settings.min_contraction_flops {
        return reduction(format!(
            "a contraction of {} FLOP, below min_contraction_flops = {}",
            c.flops(),
            settings.min_contraction_flops
        ));
    }
    let elem = c.out.node.prec().size_in_bytes();
    let blocking = *cache
        .entry(elem)
        .or_insert_with(|| Blocking::for_settings(settings, elem));
    match c.gemm(blocking) {
        Some(g) if !g.fills_register_tile() => reduction(format!(
            "a contraction whose product is {}×{} per batch element: it would leave most of the \
             {}×{} register tile empty, so the loops (vectorized as written) do better",
            g.m.extent, g.n.extent, g.blocking.mr, g.blocking.nr
        )),
        Some(mut g) => {
            let batch: u64 = g.batch.iter().map(|d| d.extent as u64).product();
            let per_product = (g.m.extent * g.n.extent * g.k.extent) as u64;
            g.batch_split =
                if batch < 2 || batch.saturating_mul(per_product) < settings.min_parallel_work {
                    BatchSplit::ByProduct
                } else if per_product < settings.min_parallel_work {
                    BatchSplit::ByBatch
                } else {
                    BatchSplit::ByBatchWhenEven
                };
            Schedule {
                parallel: None,
                why: format!(
                    "a contraction of {:.0} FLOP: packed, cache-blocked, register-blocked",
                    c.flops()
                ),
                kind: ScheduleKind::Contraction(g),
            }
        }
        None => reduction("a contraction over several reduction axes that do not merge".into()),
    }
}

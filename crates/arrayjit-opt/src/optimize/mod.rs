//! The optimizer of the loop IR: analysis of reads and writes, visit counting by bounded
//! symbolic tracing, memory-mode inference with provenance, virtualization (inlining of virtual
//! nodes into their uses, i.e. fusion), simplification and common-subexpression elimination.
//! An [`OptimizeCtx`] carries what the optimizer learned from earlier routines of a context
//! (the computations of their virtual nodes) into later ones.

mod analysis;
mod context;
mod contract;
mod cse;
mod fuse;
pub mod memory_plan;
mod simplify;
mod virtualize;
mod visits;

pub use context::OptimizeCtx;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrayjit_ir::assignments::Assignments;
use arrayjit_ir::error::{Error, Result};
use arrayjit_ir::indexing::StaticSymbol;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::memory::{MemoryMode, MemoryType, Sharing};
use arrayjit_ir::tnode::Tnode;

pub use analysis::NodeRole;
pub use memory_plan::{MemoryPlan, PlanItem, Slot};

use crate::schedule::{Schedule, ScheduleSettings};

/// Optimizer settings (thresholds are data, so that tests and heuristics can vary them).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizeSettings {
    /// A node is inlined only if no element is read more than this many times, unless it is
    /// cheap to recompute, a plain copy, or requested [`MemoryMode::Virtual`] (which accepts
    /// the recomputation).
    pub virtualize_max_visits: usize,
    /// A node is inlined only if its inlined computation (with everything inlined into it) has
    /// at most this many expression nodes. Sizes compound along chains of virtual nodes; the
    /// budget keeps optimization linear in program size and bounds expression depth (and so the
    /// stack every later pass and the C compiler need), at the cost of one materialized local
    /// every few hundred fused operations.
    pub virtualize_max_expr_size: usize,
    /// Loops are traced for at most this many iterations when counting visits.
    pub max_tracing_dim: usize,
    /// Local nodes (non-virtual, used only inside one routine) of at most this many bytes live
    /// on the kernel's stack; larger ones live in the stream's scratch pool, where locals whose
    /// lifetimes do not overlap share memory.
    pub stack_threshold_bytes: usize,
    /// The most bytes of locals one kernel keeps on the stack in total; locals beyond it (in
    /// program order) go to the scratch pool too. Kernels run on the caller's thread with the
    /// `Sync` scheduler (Rust test threads have 2 MiB of stack) and on worker threads of
    /// `scheduler::WORKER_STACK_BYTES` otherwise, so this stays far below both.
    pub kernel_stack_budget_bytes: usize,
    /// Alignment of arrays in pools (scratch and context pools).
    pub pool_alignment: usize,
    /// Inline virtual nodes at all (off: every undecided node is materialized or local).
    pub enable_virtualization: bool,
    /// Run the algebraic simplifier and constant folding.
    pub enable_simplification: bool,
    /// Rewrite `a * b + c` into fused multiply-adds (float nodes only).
    pub enable_fma: bool,
    /// Eliminate common subexpressions within a statement.
    pub enable_cse: bool,
    /// Fuse consecutive top-level loops over the same range whose iterations touch disjoint
    /// slices (row-wise passes become one pass); see `fuse`. On a CPU, the loops inside each
    /// statement too, level by level. On a GPU, also merge consecutive pointwise nests of the
    /// same loops into one pass ([`crate::schedule::gpu::merged_pointwise`]).
    pub enable_loop_fusion: bool,
    /// On a CPU, keep one slice per worker of a local array that one loop nest fills and
    /// reads slice by slice (array contraction: a fused softmax's exponentials stay one row
    /// in the L1 cache instead of an array of every row); see `contract`.
    pub enable_contraction: bool,
    /// What schedules may use (the device's vector width, registers and caches) and when a
    /// contraction becomes a blocked matrix product.
    pub schedule: ScheduleSettings,
    /// Time every top-level statement of the routine when it runs (see
    /// [`Optimized::profile_statements`]); off by default.
    pub profile_statements: bool,
}

impl Default for OptimizeSettings {
    fn default() -> Self {
        OptimizeSettings {
            virtualize_max_visits: 1,
            virtualize_max_expr_size: 512,
            max_tracing_dim: 5,
            stack_threshold_bytes: 16 * 1024,
            kernel_stack_budget_bytes: 128 * 1024,
            pool_alignment: 64,
            enable_virtualization: true,
            enable_simplification: true,
            enable_fma: true,
            enable_cse: true,
            enable_loop_fusion: true,
            enable_contraction: true,
            schedule: ScheduleSettings::default(),
            profile_statements: false,
        }
    }
}

impl OptimizeSettings {
    /// The default settings for a device that runs groups of invocations with `limits` (a
    /// GPU): every statement gets a GPU pass chosen from them.
    pub fn for_gpu(limits: crate::schedule::GpuLimits) -> OptimizeSettings {
        OptimizeSettings {
            schedule: ScheduleSettings {
                gpu: Some(limits),
                ..ScheduleSettings::default()
            },
            ..OptimizeSettings::default()
        }
    }
}

/// A routine's optimized loop code with everything a backend needs to compile and link it.
#[derive(Clone, Debug)]
pub struct Optimized {
    /// The routine's name (user text; sanitize before putting it in code).
    pub name: String,
    /// The optimized code.
    pub code: LowLevel,
    /// Static symbols bound per run (those the code uses), in the order of kernel arguments.
    pub bindings: Vec<StaticSymbol>,
    /// Every node the code uses (after inlining), with its role.
    pub nodes: Vec<NodeRole>,
    /// The node whose copy the code reads from the stream's merge buffer, if any.
    pub merge_node: Option<Tnode>,
    /// Where the local nodes too large for the stack live in the stream's scratch pool; locals
    /// whose statement intervals do not overlap share memory.
    pub scratch: MemoryPlan,
    /// How each top-level statement of `code` runs (one per statement, in order), with why.
    pub schedules: Vec<Schedule>,
    /// On a GPU, the runs of consecutive passes that may run together as one launch
    /// ([`crate::schedule::gpu::join`]); renderers that launch every pass alone may ignore it.
    pub joined: Vec<crate::schedule::gpu::JoinedLaunch>,
    /// Whether the kernel's own loops are light enough (see
    /// `ScheduleSettings::light_kernel_iterations`) to compile with moderate optimization.
    pub light_kernel: bool,
    /// The kernel times each top-level statement (wall-clock nanoseconds and calls, summed
    /// over runs) where its backend can (the C backends); the runtime reads them as the
    /// routine's statement profile.
    pub profile_statements: bool,
}

impl Optimized {
    /// Nodes stored in the context: the kernel's array arguments, sorted by id.
    pub fn materialized_nodes(&self) -> Vec<Tnode> {
        self.nodes
            .iter()
            .filter(|r| r.used && r.tn.modes().is_materialized())
            .map(|r| r.tn.clone())
            .collect()
    }

    /// Nodes that live on the kernel's stack.
    pub fn local_nodes(&self) -> Vec<Tnode> {
        self.nodes
            .iter()
            .filter(|r| r.used && r.tn.modes().is_local() && self.scratch.slot(&r.tn).is_none())
            .map(|r| r.tn.clone())
            .collect()
    }

    /// Materialized nodes the code reads before writing them: they must be in the context (or
    /// hosted) when linking.
    pub fn inputs(&self) -> Vec<Tnode> {
        self.nodes
            .iter()
            .filter(|r| r.used && r.input && r.tn.modes().is_materialized())
            .map(|r| r.tn.clone())
            .collect()
    }

    /// Materialized nodes the code writes.
    pub fn outputs(&self) -> Vec<Tnode> {
        self.nodes
            .iter()
            .filter(|r| r.used && r.written && r.tn.modes().is_materialized())
            .map(|r| r.tn.clone())
            .collect()
    }

    /// The top-level statements of the code, in order (what `schedules` describe).
    pub fn statements(&self) -> Vec<&LowLevel> {
        top_level(&self.code)
    }

    /// A report of every top-level statement's schedule and why, one per line.
    pub fn schedule_report(&self) -> String {
        let mut out = String::new();
        for (k, s) in self.schedules.iter().enumerate() {
            let _ = writeln!(out, "statement {k}: {s}");
        }
        out
    }

    /// The routine's GPU plan on a device model: each pass's shape, groups, work and estimated
    /// time (statements not scheduled for a GPU are listed as running on one invocation).
    pub fn gpu_plan(
        &self,
        device: &crate::schedule::gpu::DeviceModel,
    ) -> crate::schedule::gpu::GpuPlan {
        crate::schedule::gpu::GpuPlan::of(
            &self.name,
            &self.statements(),
            &self.schedules,
            &self.joined,
            device,
        )
    }

    /// Where a GPU backend keeps the routine's local nodes: all in one scratch buffer, each at
    /// a 16-byte aligned offset in node order, and which byte ranges are zeroed before each run
    /// (the locals that may read their initial zeros: [`arrayjit_ir::low_level::FirstUses`]).
    pub fn gpu_scratch(&self) -> GpuScratch {
        let mut locals = Vec::new();
        let mut bytes = 0usize;
        for n in self
            .nodes
            .iter()
            .filter(|n| n.used && n.tn.modes().is_local())
        {
            locals.push((n.tn.clone(), bytes));
            bytes += n.tn.size_in_bytes().div_ceil(16) * 16;
        }
        let first_uses = arrayjit_ir::low_level::FirstUses::of(self.statements());
        let mut zeroed: Vec<(usize, usize)> = Vec::new();
        for (tn, offset) in &locals {
            if !first_uses.needs_zeros(tn, 0) {
                continue;
            }
            let len = tn.size_in_bytes().div_ceil(16) * 16;
            match zeroed.last_mut() {
                Some((at, l)) if *at + *l == *offset => *l += len,
                _ => zeroed.push((*offset, len)),
            }
        }
        GpuScratch {
            locals,
            bytes,
            zeroed,
        }
    }

    /// A report of every node's final memory mode and why it was chosen, one per line.
    pub fn memory_report(&self) -> String {
        let mut out = String::new();
        for r in &self.nodes {
            let _ = writeln!(out, "{}", r.tn.header());
        }
        out
    }
}

/// A routine's scratch buffer on a GPU backend ([`Optimized::gpu_scratch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuScratch {
    /// Each local node with its byte offset in the buffer.
    pub locals: Vec<(Tnode, usize)>,
    /// The buffer's size in bytes.
    pub bytes: usize,
    /// Byte ranges `(offset, length)` zeroed before each run, in order, adjacent ones joined.
    pub zeroed: Vec<(usize, usize)>,
}

impl GpuScratch {
    /// Bytes zeroed before each run.
    pub fn zeroed_bytes(&self) -> usize {
        self.zeroed.iter().map(|&(_, len)| len).sum()
    }
}

/// Lowers and optimizes `assignments` into a routine named `name`; `bindings` are the static
/// symbols bound per run (symbols introduced by slices are added).
pub fn optimize(
    name: &str,
    bindings: &[StaticSymbol],
    assignments: &Assignments,
    settings: &OptimizeSettings,
) -> Result<Optimized> {
    optimize_in(&OptimizeCtx::empty(), name, bindings, assignments, settings)
}

/// Like [`optimize`], in an optimize context: virtual nodes that earlier routines of the
/// context computed are inlined here too, and this routine's virtual nodes are recorded for
/// later ones (see [`OptimizeCtx`]).
pub fn optimize_in(
    ctx: &OptimizeCtx,
    name: &str,
    bindings: &[StaticSymbol],
    assignments: &Assignments,
    settings: &OptimizeSettings,
) -> Result<Optimized> {
    let mut all_bindings = bindings.to_vec();
    for s in assignments.static_symbols() {
        if !all_bindings.contains(&s) {
            all_bindings.push(s);
        }
    }
    let code = assignments.lower(&all_bindings)?;
    optimize_low_level_in(ctx, name, &all_bindings, code, settings)
}

/// Optimizes already-lowered code (see [`optimize`]).
pub fn optimize_low_level(
    name: &str,
    bindings: &[StaticSymbol],
    code: LowLevel,
    settings: &OptimizeSettings,
) -> Result<Optimized> {
    optimize_low_level_in(&OptimizeCtx::empty(), name, bindings, code, settings)
}

/// Like [`optimize_low_level`], in an optimize context (see [`optimize_in`]).
pub fn optimize_low_level_in(
    ctx: &OptimizeCtx,
    name: &str,
    bindings: &[StaticSymbol],
    code: LowLevel,
    settings: &OptimizeSettings,
) -> Result<Optimized> {
    // Malformed code (wrong index arity, out-of-range or unbound indices) is rejected before
    // anything relies on its shape.
    arrayjit_ir::verify::check_bounds(&code, bindings)?;
    let mut stmts = match LowLevel::seq([code]) {
        LowLevel::Seq(items) => items,
        LowLevel::Noop => vec![],
        s => vec![s],
    };
    let mut bindings = bindings.to_vec();
    let bindings = &mut bindings;
    ctx.expand(&mut stmts, bindings);
    let bindings: &[StaticSymbol] = bindings;
    let analysis = analysis::analyze(&stmts, settings);
    let roles = analysis.roles();
    // Memory-mode decisions are undone if anything fails, so a failed call changes nothing.
    let saved: Vec<_> = analysis
        .nodes
        .values()
        .map(|n| (n.tn.clone(), n.tn.memory_mode()))
        .collect();
    let restore = || {
        for (tn, mode) in &saved {
            tn.restore_memory_mode(mode.clone());
        }
    };
    let virtuals = decide_memory_modes(name, &analysis, settings).inspect_err(|_| restore())?;
    let recorded: Vec<Tnode> = virtuals.keys().cloned().collect();
    let learned = ctx.computations(name, &stmts, &recorded, bindings);
    let code = virtualize::inline_virtual_nodes(stmts, &virtuals);
    let code = if settings.enable_simplification {
        simplify::simplify(code, settings.enable_fma)
    } else {
        code
    };
    let code = if settings.enable_cse {
        cse::eliminate_common_subexpressions(code)
    } else {
        code
    };
    let code = match (settings.enable_loop_fusion, &settings.schedule.gpu) {
        (false, _) => code,
        (true, Some(_)) => fuse::fuse_sibling_loops(code, &settings.schedule),
        (true, None) => fuse::fuse_nested_loops(code, &settings.schedule),
    };
    // On a GPU, reductions inlined into expressions get statements of their own, and nests
    // fused for the CPU's caches are distributed where their shared loops alone would leave
    // the device idle. On a CPU, those inlined into statements without loops get statements
    // of their own (compiled once per shape).
    let (code, distributed, new_locals) = match &settings.schedule.gpu {
        Some(limits) => crate::schedule::gpu::restructure(
            code,
            limits,
            &settings.schedule.tuning,
            settings.enable_loop_fusion,
        ),
        None => crate::schedule::hoist::hoist_for_cpu(code),
    };
    // On a CPU, intermediates that one loop nest fills and reads slice by slice keep one
    // slice per worker (`contract`); a GPU keeps its own locals.
    let (code, new_locals) = match (&settings.schedule.gpu, settings.enable_contraction) {
        (None, true) => {
            let (code, slices) =
                contract::contract_iteration_slices(code, settings.stack_threshold_bytes);
            (code, new_locals.into_iter().chain(slices).collect())
        }
        _ => (code, new_locals),
    };
    let used: std::collections::HashSet<usize> = code.nodes().iter().map(Tnode::id).collect();
    let mut nodes = roles;
    for r in &mut nodes {
        r.used = used.contains(&r.tn.id());
    }
    nodes.extend(new_locals.into_iter().map(|tn| NodeRole {
        tn,
        input: false,
        written: true,
        used: true,
    }));
    nodes.sort_by_key(|r| r.tn.id());
    arrayjit_ir::verify::check_bounds(&code, bindings).inspect_err(|_| restore())?;
    let merge_node = find_merge_node(name, &code).inspect_err(|_| restore())?;
    let mut schedules = crate::schedule::schedule(&top_level(&code), &settings.schedule);
    for (s, note) in schedules.iter_mut().zip(&distributed) {
        if let Some(note) = note {
            s.why = format!("{note}; {}", s.why);
        }
    }
    // On a GPU that runs independent passes together, passes go in the order of their
    // dependence levels, so that independent ones are neighbours.
    let (code, schedules) = match &settings.schedule.gpu {
        Some(limits) if limits.joined_launch_parameters > 0 => {
            in_leveled_order(code, schedules, limits)
        }
        _ => (code, schedules),
    };
    let scratch = plan_scratch(&code, &nodes, settings).inspect_err(|_| restore())?;
    ctx.record(learned);
    let statements = top_level(&code);
    // The partial results of grid reductions and split products are local nodes of the
    // routine.
    for s in &schedules {
        if let crate::schedule::ScheduleKind::Gpu(pass) = &s.kind
            && let Some(partials) = pass.partials()
        {
            nodes.push(NodeRole {
                tn: partials.clone(),
                input: false,
                written: true,
                used: true,
            });
        }
    }
    let joined = match &settings.schedule.gpu {
        Some(limits) => crate::schedule::gpu::joined_launches(&statements, &schedules, limits),
        None => Vec::new(),
    };
    let loop_work: u64 = statements
        .iter()
        .zip(&schedules)
        .filter(|(_, s)| {
            !matches!(
                s.kind,
                crate::schedule::ScheduleKind::Contraction(_)
                    | crate::schedule::ScheduleKind::Attention(_)
            )
        })
        .map(|(st, _)| crate::schedule::nest_iterations(st))
        .fold(0u64, u64::saturating_add);
    let light_kernel = loop_work < settings.schedule.light_kernel_iterations;
    // A routine takes only the static indices its code uses.
    let used_symbols = code.index_symbols();
    let bindings = bindings
        .iter()
        .filter(|b| used_symbols.contains(&b.symbol))
        .cloned()
        .collect();
    Ok(Optimized {
        name: name.to_string(),
        code,
        bindings,
        nodes,
        merge_node,
        scratch,
        schedules,
        joined,
        light_kernel,
        profile_statements: settings.profile_statements,
    })
}

/// The code's top-level statements and their schedules in the order of dependence levels
/// ([`crate::schedule::gpu::join::leveled_order`]), whichever placement's plan is estimated
/// fastest on a device of `limits` (the code's own order where none is faster).
fn in_leveled_order(
    code: LowLevel,
    schedules: Vec<Schedule>,
    limits: &crate::schedule::GpuLimits,
) -> (LowLevel, Vec<Schedule>) {
    use crate::schedule::gpu::join::{Placement, joined_launches, leveled_orders};
    // Each order's plan estimated on a model of the device (an H100's speeds scaled to its
    // compute units): joined passes save launches and run side by side.
    let model = crate::schedule::gpu::DeviceModel::from_limits("the device", *limits);
    let estimate = |order: &[usize]| {
        let stmts = top_level(&code);
        let stmts: Vec<&LowLevel> = order.iter().map(|&i| stmts[i]).collect();
        let scheds: Vec<Schedule> = order.iter().map(|&i| schedules[i].clone()).collect();
        let joined = joined_launches(&stmts, &scheds, limits);
        crate::schedule::gpu::GpuPlan::of("", &stmts, &scheds, &joined, &model).estimate_us()
    };
    let mut best: Vec<usize> = (0..schedules.len()).collect();
    let mut fastest = estimate(&best);
    let placements = [
        Placement::Earliest,
        Placement::Latest,
        Placement::SourcesFirst,
    ];
    for order in leveled_orders(&top_level(&code), &schedules, &placements) {
        let us = estimate(&order);
        if us < fastest {
            (best, fastest) = (order, us);
        }
    }
    if best.iter().enumerate().all(|(k, &i)| k == i) {
        return (code, schedules);
    }
    let LowLevel::Seq(items) = code else {
        return (code, schedules);
    };
    let mut items: Vec<Option<LowLevel>> = items.into_iter().map(Some).collect();
    let mut scheds: Vec<Option<Schedule>> = schedules.into_iter().map(Some).collect();
    let mut out_items = Vec::with_capacity(items.len());
    let mut out_scheds = Vec::with_capacity(items.len());
    for i in best {
        if let (Some(item), Some(sched)) = (items[i].take(), scheds[i].take()) {
            out_items.push(item);
            out_scheds.push(sched);
        }
    }
    (LowLevel::Seq(out_items), out_scheds)
}

/// The top-level statements of code.
fn top_level(code: &LowLevel) -> Vec<&LowLevel> {
    match code {
        LowLevel::Seq(items) => items.iter().collect(),
        LowLevel::Noop => vec![],
        s => vec![s],
    }
}

/// Places the local nodes too large for the stack in the scratch pool; a local's lifetime is
/// the interval of top-level statements that use it.
fn plan_scratch(
    code: &LowLevel,
    nodes: &[NodeRole],
    settings: &OptimizeSettings,
) -> Result<MemoryPlan> {
    let stmts = top_level(code);
    // The first and last top-level statement using each node, in one pass.
    let mut lifetimes: std::collections::HashMap<usize, (usize, usize)> =
        std::collections::HashMap::new();
    for (k, s) in stmts.iter().enumerate() {
        for tn in s.nodes() {
            lifetimes
                .entry(tn.id())
                .and_modify(|(_, last)| *last = k)
                .or_insert((k, k));
        }
    }
    // One decision for every local, in program order: on the stack while it is small and the
    // kernel's total stays within the budget, else in the scratch pool.
    let mut on_stack = 0usize;
    let items: Vec<PlanItem> = nodes
        .iter()
        .filter(|r| r.used && r.tn.modes().is_local())
        .filter(|r| {
            let size = r.tn.size_in_bytes();
            let fits = size <= settings.stack_threshold_bytes
                && on_stack.saturating_add(size) <= settings.kernel_stack_budget_bytes;
            if fits {
                on_stack += size;
            }
            !fits
        })
        .map(|r| PlanItem {
            node: r.tn.clone(),
            size: r.tn.size_in_bytes(),
            lifetime: Some(lifetimes.get(&r.tn.id()).copied().unwrap_or((0, 0))),
        })
        .collect();
    MemoryPlan::pack(&items, settings.pool_alignment, usize::MAX / 2)
}

fn find_merge_node(name: &str, code: &LowLevel) -> Result<Option<Tnode>> {
    let mut merges: Vec<Tnode> = Vec::new();
    code.visit_exprs(&mut |e| {
        if let ScalarExpr::GetMerge(t, _) = e
            && !merges.contains(t)
        {
            merges.push(t.clone());
        }
    });
    match merges.len() {
        0 => Ok(None),
        1 => Ok(merges.pop()),
        _ => Err(Error::Optimization {
            routine: name.to_string(),
            detail: format!(
                "the code reads the merge buffer as several nodes ({merges:?}); a stream has one merge \
                 buffer, so split the routine"
            ),
        }),
    }
}

/// Decides every node's memory mode; returns the nodes to inline.
fn decide_memory_modes(
    name: &str,
    analysis: &analysis::Analysis,
    settings: &OptimizeSettings,
) -> Result<BTreeMap<Tnode, ()>> {
    let optimization_error = |detail: String| Error::Optimization {
        routine: name.to_string(),
        detail,
    };
    // Requirements that follow from how the code uses each node.
    for info in analysis.nodes.values() {
        let tn = &info.tn;
        if tn.padding().is_some() {
            tn.update_memory_mode(MemoryMode::NeverVirtual, "optimizer: the node is padded")?;
        }
        if info.input {
            tn.update_memory_mode(
                MemoryMode::Materialized,
                format!("optimizer: {name} reads it before writing it (an input)"),
            )?;
        } else if info.is_output() {
            tn.update_memory_mode(
                MemoryMode::Materialized,
                format!("optimizer: {name} writes it and never reads it afterwards (a result)"),
            )?;
        }
    }
    // A node that cannot be inlined is never virtual; if it was requested virtual, that is an
    // error saying why.
    let refuse = |tn: &Tnode, why: String| -> Result<()> {
        if tn.modes().known_virtual() {
            return Err(optimization_error(format!(
                "{} was requested to be virtual but cannot be inlined: {why}",
                tn.debug_name()
            )));
        }
        tn.update_memory_mode(MemoryMode::NeverVirtual, format!("optimizer: {why}"))
    };
    // Plain copies read more often than the visit limit are inlined all the same, and what
    // they copy is kept.
    let (inlined_copies, kept_for_copies) = analysis::copies_to_inline(analysis, settings);
    // Virtualization candidates.
    let mut candidates: BTreeMap<Tnode, ()> = BTreeMap::new();
    for info in analysis.nodes.values() {
        let tn = &info.tn;
        if !analysis::may_be_virtual(tn) {
            continue;
        }
        let blocker = if !settings.enable_virtualization {
            Some("virtualization is disabled in the optimizer settings".to_string())
        } else if let Some(why) = kept_for_copies.get(tn) {
            Some(why.clone())
        } else if info.max_visits > settings.virtualize_max_visits
            && !info.cheap
            && !inlined_copies.contains(&tn.id())
            // The visit limit weighs recomputation against memory; a node requested virtual
            // (a dropout mask recomputed from its counter) has made that choice.
            && !tn.modes().known_virtual()
        {
            Some(format!(
                "an element is read {} times (more than virtualize_max_visits = {})",
                info.max_visits, settings.virtualize_max_visits
            ))
        } else {
            info.inline_blocker.clone()
        };
        match blocker {
            None => {
                candidates.insert(tn.clone(), ());
            }
            Some(why) => refuse(tn, why)?,
        }
    }
    // Drop candidates whose inputs change between their computation and their last use.
    loop {
        let hazards = analysis.hazards(&candidates);
        if hazards.is_empty() {
            break;
        }
        for (tn, why) in hazards {
            candidates.remove(&tn);
            refuse(&tn, why)?;
        }
    }
    // Drop candidates whose inlined expression would grow past the size budget.
    for (tn, why) in analysis.over_size_budget(&candidates, settings.virtualize_max_expr_size) {
        candidates.remove(&tn);
        refuse(&tn, why)?;
    }
    for tn in candidates.keys() {
        let uses = analysis.nodes[&tn.id()].read_stmts.len();
        tn.update_memory_mode(
            MemoryMode::Virtual,
            format!("optimizer: computed in {name} and read once per element, so inlined into its {uses} use(s)"),
        )?;
    }
    // Hosted nodes the routine writes change on devices (and reach the host by `to_host`):
    // `Hosted(Nonconstant)` (or plain `Hosted`) refines to `Hosted(ChangedOnDevices)`. A write
    // to a hosted constant or volatile node (changed only from the host) is refused when the
    // code is linked, naming the node and its mode's provenance.
    for info in analysis
        .nodes
        .values()
        .filter(|i| !i.write_stmts.is_empty())
    {
        let tn = &info.tn;
        if let Some(current) = tn.memory_mode()
            && matches!(
                current.mode,
                MemoryMode::Hosted(MemoryType::Unset | MemoryType::Nonconstant)
            )
        {
            tn.update_memory_mode(
                MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::Unset)),
                format!("{}; {name} writes it on the device", current.provenance),
            )?;
        }
    }
    // Everything still abstract defaults to its most local concrete mode.
    for info in analysis.nodes.values() {
        let tn = &info.tn;
        let Some(current) = tn.memory_mode() else {
            continue;
        };
        let target = current.mode.most_local();
        if target == current.mode {
            continue;
        }
        let before = &current.provenance;
        let nonzero_padding = tn.padding().is_some_and(|p| p.value != 0.0);
        if target == MemoryMode::Local && nonzero_padding {
            tn.update_memory_mode(
                MemoryMode::OnDevice(Sharing::Unset),
                format!("{before}; its margins hold a non-zero pad value, kept in a device array"),
            )?;
        } else if target == MemoryMode::Local && tn.size_in_bytes() > settings.stack_threshold_bytes
        {
            tn.update_memory_mode(
                MemoryMode::Local,
                format!(
                    "{before}; used only within {name}, and its {} bytes exceed the stack threshold of \
                     {} bytes, so it lives in the stream's scratch pool",
                    tn.size_in_bytes(),
                    settings.stack_threshold_bytes
                ),
            )?;
        } else if target == MemoryMode::Local {
            tn.update_memory_mode(
                MemoryMode::Local,
                format!(
                    "{before}; used only within {name} and small enough for the stack (it goes to \
                     the scratch pool instead if the kernel's stack budget is used up)"
                ),
            )?;
        } else {
            tn.update_memory_mode(target, format!("{before}; the most local mode this allows"))?;
        }
    }
    Ok(candidates)
}

#[cfg(test)]
mod tests;

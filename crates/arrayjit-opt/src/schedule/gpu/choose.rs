//! The policy that chooses each statement's GPU pass from the device's limits, with why
//! ([`gpu_schedules`]), and plans the passes a renderer splits ([`plan_pass`]).

use super::*;
use crate::schedule::{Blocking, Contraction, Gemm, Schedule, ScheduleKind, ScheduleTuning};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::memory::MemoryMode;
use arrayjit_ir::ops::TernOp;
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

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
    // Every node f32: a factor stored in bf16 (widened as read on a CPU) stays loops here.
    if [&c.out, &c.lhs, &c.rhs]
        .iter()
        .any(|a| a.node.prec() != Prec::F32)
    {
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
        for j in a.op.zeroings_before(stmts, i) {
            schedules[j] = Schedule {
                kind: ScheduleKind::Gpu(GpuPass::Nothing),
                why: "the fused attention's GPU pass after it stores every element of its \
                      outputs and keeps its state in registers"
                    .into(),
                parallel: None,
            };
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

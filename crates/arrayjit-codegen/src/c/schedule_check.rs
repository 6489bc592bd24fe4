//! The check that a routine's schedules describe its code before the C renderer trusts them:
//! `Optimized` is plain data a caller can build, so every schedule (and the scratch plan) is
//! derived again from its statement and must agree.

use arrayjit_ir::{LowLevel, Result};
use arrayjit_opt::schedule::{ReductionPlan, ScheduleKind};

/// Checks that the schedules (and the scratch plan) of a routine describe its code, so that code rendered from them
/// accesses exactly what the (bounds-verified) loops access: `Optimized` is plain data a caller
/// can build, and a blocked product or a split loop trusted blindly could reach outside its
/// arrays. Every schedule is derived again from its statement and must agree.
pub(crate) fn check_schedules(r: &arrayjit_opt::Optimized) -> Result<()> {
    use arrayjit_opt::schedule::{Contraction, ParallelLoop};
    let stmts = r.statements();
    let bad = |k: usize, what: &str| arrayjit_ir::Error::Optimization {
        routine: r.name.clone(),
        detail: format!("schedule {k} does not match its statement: {what}"),
    };
    // The scratch plan is data too: every slot must lie inside the scratch buffer the launch
    // checks for (one pool).
    let total = r.scratch.total_bytes();
    if let Some(slot) = r
        .scratch
        .slots
        .iter()
        .find(|s| s.pool != 0 || s.offset.checked_add(s.size).is_none_or(|end| end > total))
    {
        return Err(arrayjit_ir::Error::Optimization {
            routine: r.name.clone(),
            detail: format!(
                "scratch slot of {} (pool {}, offset {}, {} bytes) lies outside the scratch \
                 buffer of {total} bytes",
                slot.node.debug_name(),
                slot.pool,
                slot.offset,
                slot.size
            ),
        });
    }
    if r.schedules.is_empty() {
        return Ok(());
    }
    if r.schedules.len() != stmts.len() {
        return Err(bad(
            r.schedules.len(),
            &format!(
                "{} schedules for {} statements",
                r.schedules.len(),
                stmts.len()
            ),
        ));
    }
    for (k, (s, sched)) in stmts.iter().zip(&r.schedules).enumerate() {
        if let Some(p) = &sched.parallel
            && ParallelLoop::detect(s).map(|d| d.iter) != Some(p.iter)
        {
            return Err(bad(k, "its outermost loop cannot be split over workers"));
        }
        match &sched.kind {
            ScheduleKind::Loops => {}
            ScheduleKind::Attention(plan) => {
                let found = arrayjit_ir::AttentionOp::of_statement(s);
                if !found.is_some_and(|op| std::sync::Arc::ptr_eq(&op, &plan.op)) {
                    return Err(bad(
                        k,
                        "it is not the whole loop nest of that attention pass",
                    ));
                }
                if !matches!(
                    arrayjit_opt::schedule::AttentionPlan::detect(
                        s,
                        &arrayjit_opt::schedule::ScheduleSettings::default()
                    ),
                    Some(Ok(_))
                ) {
                    return Err(bad(
                        k,
                        "the blocked attention helper does not take this pass",
                    ));
                }
                if plan.block_queries == 0 || plan.block_keys == 0 {
                    return Err(bad(k, "empty attention blocks"));
                }
            }
            ScheduleKind::Gpu(_) => {
                return Err(bad(
                    k,
                    "it is a GPU pass: the routine was optimized for a device that runs groups of \
                     invocations; optimize it with this CPU backend's schedule settings",
                ));
            }
            ScheduleKind::Contraction(g) => {
                let b = &g.blocking;
                if !b.is_usable() {
                    return Err(bad(k, &format!("unusable blocking {b:?}")));
                }
                let mut expected = Contraction::detect_guarded(s)
                    .and_then(|c| c.gemm(g.blocking))
                    .ok_or_else(|| bad(k, "it is not a contraction of plain iterators"))?;
                expected.overwrite = g.overwrite;
                expected.batch_split = g.batch_split;
                if expected != *g {
                    return Err(bad(k, "the product's dimensions or strides differ"));
                }
                let absorbed_before = k > 0
                    && matches!(r.schedules[k - 1].kind, ScheduleKind::Absorbed)
                    && matches!(stmts[k - 1], LowLevel::ZeroOut(t) if *t == g.out);
                if g.overwrite && !(g.covers_out && absorbed_before) {
                    return Err(bad(
                        k,
                        "it overwrites without an absorbed zeroing of its result",
                    ));
                }
            }
            ScheduleKind::Absorbed => {
                let next_overwrites = r.schedules.get(k + 1).is_some_and(|n| {
                    matches!(&n.kind, ScheduleKind::Contraction(g)
                        if g.overwrite && matches!(s, LowLevel::ZeroOut(t) if *t == g.out))
                });
                // Or a zeroing among those right before an attention pass the helper runs.
                let before_attention = (k + 1..r.schedules.len())
                    .find(|&i| {
                        !matches!(
                            stmts[i].unwrapped(),
                            LowLevel::ZeroOut(_) | LowLevel::Comment(_) | LowLevel::Noop
                        )
                    })
                    .is_some_and(|i| {
                        matches!(&r.schedules[i].kind, ScheduleKind::Attention(plan)
                            if plan.op.zeroings_before(&stmts, i).contains(&k))
                    });
                if !next_overwrites && !before_attention {
                    return Err(bad(
                        k,
                        "no blocked product or attention pass after it does its work",
                    ));
                }
            }
            ScheduleKind::Reduction(p) => {
                check_reduction(s, p, true).map_err(|what| bad(k, what))?;
            }
            ScheduleKind::Fused(parts) => {
                let LowLevel::For { body, .. } = s else {
                    return Err(bad(
                        k,
                        "a fused schedule for a statement that is not a loop",
                    ));
                };
                let LowLevel::Seq(items) = &**body else {
                    return Err(bad(
                        k,
                        "a fused schedule for a loop whose body is one statement",
                    ));
                };
                if items.len() != parts.len() {
                    return Err(bad(
                        k,
                        "one schedule per statement of the fused body expected",
                    ));
                }
                for (item, part) in items.iter().zip(parts) {
                    match &part.kind {
                        ScheduleKind::Loops if part.parallel.is_none() => {}
                        ScheduleKind::Reduction(p) if part.parallel.is_none() => {
                            check_reduction(item, p, false).map_err(|what| bad(k, what))?;
                        }
                        _ => {
                            return Err(bad(
                                k,
                                "a statement of a fused body runs as plain loops or a reduction \
                                 on the enclosing loop's worker",
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks a reduction plan against its statement: at the top level its blocks are those the
/// statement calls for; inside a fused body it has none.
fn check_reduction(
    s: &LowLevel,
    p: &ReductionPlan,
    top_level: bool,
) -> std::result::Result<(), &'static str> {
    if !(1..=1024).contains(&p.lanes) {
        return Err("a reduction runs over 1 to 1024 accumulators");
    }
    // Only the loop, the operation and the blocks are compared (the vector width is a hint).
    let found =
        ReductionPlan::detect(s, p.lanes, 1).ok_or("its innermost loop is not a reduction")?;
    let blocks = if top_level { found.blocks } else { None };
    if found.iter != p.iter || found.combine != p.combine || p.blocks != blocks {
        return Err("the reduced loop, its operation or its blocks differ");
    }
    Ok(())
}

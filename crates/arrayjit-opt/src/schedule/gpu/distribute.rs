//! Distribution (loop fission) of fused nests for a GPU: the optimizer fuses sibling loops
//! for the CPU's caches, nesting several statements under shared outer loops. On a GPU the
//! shared loops alone would be the pass's grid, so a nest whose shared loops give too few
//! points to fill the device, around statements that hold more independent work of their own,
//! becomes one nest per statement: each then gets the grid (or row pass) its own loops allow.
//!
//! The converse runs after it ([`merge_pointwise_runs`]): consecutive statements that are
//! nests of the same loops around straight-line assignments (a normalization, then the cast of
//! its result) become one nest, so one pass computes both per grid point instead of a launch
//! each, where the merged loops' iterations stay independent (by the same rule).
//!
//! **Rule.** Distributing loops whose iterations are independent
//! ([`crate::schedule::iterations_independent`]: every node the body writes is indexed by the
//! loop's iterator in every access) over the statements of their body never changes a result:
//! iteration `i` of a later statement reads only slice `i` of what earlier statements wrote,
//! which the earlier nest has written by then, and nothing a later statement writes is read by
//! an earlier statement of another iteration. A loop of one iteration distributes whatever its
//! body does: that iteration runs its statements in order, as one nest or as several.

use super::analysis::{RowItem, grid_loops, grid_total, loop_prefix, row_items};
use super::attention::runs_as_attention;
use super::{GpuLimits, GridLoop, ROW_MIN_WIDTH};
use crate::schedule::ScheduleTuning;
use arrayjit_ir::indexing::Symbol;
use arrayjit_ir::low_level::LowLevel;

/// The statements of a nest whose outer loops are independent and whose body (under them) is
/// a sequence, each under the same loops: `for i { a; b }` → `for i { a }`, `for i { b }`.
/// `None` for any other statement (see the module's rule for why this is legal).
pub fn distribute_loop(stmt: &LowLevel) -> Option<Vec<LowLevel>> {
    let (loops, cur) = distributable_prefix(stmt.unwrapped());
    let LowLevel::Seq(items) = cur else {
        return None;
    };
    let items: Vec<&LowLevel> = items
        .iter()
        .filter(|s| !matches!(s, LowLevel::Noop | LowLevel::Comment(_)))
        .collect();
    if loops.is_empty() || items.len() < 2 {
        return None;
    }
    Some(
        items
            .into_iter()
            .map(|item| {
                loops
                    .iter()
                    .rev()
                    .fold(item.clone(), |body, l| LowLevel::For {
                        index: l.iter,
                        from: l.from,
                        to: l.to,
                        body: Box::new(body),
                    })
            })
            .collect(),
    )
}

/// The outer loops that distribute (see the module's rule) and the statement under them: the
/// loops of independent iterations and loops of a single iteration (such as the one
/// fusion puts around consecutive scalar statements), in any order.
fn distributable_prefix(stmt: &LowLevel) -> (Vec<GridLoop>, &LowLevel) {
    loop_prefix(stmt, |extent, body, index| {
        extent == 1 || crate::schedule::iterations_independent(body, index)
    })
}

/// Why a nest should be distributed on a device of `limits`, if it should: its shared loops
/// give fewer points than fill the device, and a statement under them either runs loops on
/// one invocation or holds independent loops of its own that a wider grid would spread.
fn distribution_reason(stmt: &LowLevel, limits: &GpuLimits, threads: u32) -> Option<String> {
    let (grid, inner) = grid_loops(stmt);
    if grid.is_empty() || !matches!(inner.unwrapped(), LowLevel::Seq(_)) {
        return None;
    }
    let items = row_items(&inner);
    let total = grid_total(&grid);
    let busy = limits.busy_invocations(threads);
    if items.len() < 2 || total >= busy {
        return None;
    }
    let underused = items.iter().filter(|i| i.underused()).count();
    if underused == 0 {
        return None;
    }
    let widest = items.iter().map(RowItem::width).max().unwrap_or(1);
    Some(format!(
        "distributed from a nest of {} statements under {} shared independent loop(s) of \
         {total} point(s), fewer than the {busy} invocations that fill the device, where {} \
         statement(s) hold more independent work of their own{}",
        items.len(),
        grid.len(),
        underused,
        if widest >= ROW_MIN_WIDTH {
            ""
        } else {
            " (and none is wide enough for a row pass)"
        }
    ))
}

fn distribute_into(
    stmt: LowLevel,
    note: Option<String>,
    limits: &GpuLimits,
    threads: u32,
    out: &mut Vec<(LowLevel, Option<String>)>,
) {
    if runs_as_attention(&stmt, limits) {
        out.push((stmt, note));
        return;
    }
    if let Some(why) = distribution_reason(&stmt, limits, threads)
        && let Some(pieces) = distribute_loop(&stmt)
    {
        let why = match note {
            Some(outer) => format!("{outer}; then {why}"),
            None => why,
        };
        for piece in pieces {
            distribute_into(piece, Some(why.clone()), limits, threads, out);
        }
    } else {
        out.push((stmt, note));
    }
}

/// The top-level statements of `code` restructured for a device of `limits`: every nest
/// distributed where the device calls for it (see the module's doc), then reductions hoisted
/// out of expressions ([`super::hoist`]), then (where `merge_pointwise`, the optimizer's loop
/// fusion setting) consecutive pointwise nests of the same loops merged; each statement with
/// why it was changed, if it was, and the local nodes made for hoisted reductions.
pub fn restructure(
    code: LowLevel,
    limits: &GpuLimits,
    tuning: &ScheduleTuning,
    merge_pointwise: bool,
) -> (
    LowLevel,
    Vec<Option<String>>,
    Vec<arrayjit_ir::tnode::Tnode>,
) {
    let stmts = match code {
        LowLevel::Seq(items) => items,
        LowLevel::Noop => vec![],
        s => vec![s],
    };
    let threads = limits.tuned_group_threads(tuning.gpu_threads);
    let mut distributed = Vec::with_capacity(stmts.len());
    for s in stmts {
        distribute_into(s, None, limits, threads, &mut distributed);
    }
    let (out, made) = super::hoist::hoist_reductions(distributed, limits, threads);
    let out = if merge_pointwise {
        merge_pointwise_runs(out)
    } else {
        out
    };
    let (stmts, notes): (Vec<LowLevel>, Vec<Option<String>>) =
        merge_scalar_runs(out).into_iter().unzip();
    let code = match stmts.len() {
        0 => LowLevel::Noop,
        1 => stmts.into_iter().next().unwrap_or(LowLevel::Noop),
        _ => LowLevel::Seq(stmts),
    };
    (code, notes, made)
}

/// Whether a statement is one assignment without loops (none in its value either): one
/// invocation runs it in a few operations.
fn is_scalar(stmt: &LowLevel) -> bool {
    match stmt.unwrapped() {
        LowLevel::Set { value, .. } => {
            let mut scoped = false;
            value.visit_all(&mut |e| {
                scoped |= matches!(e, arrayjit_ir::low_level::ScalarExpr::LocalScope { .. })
            });
            !scoped
        }
        _ => false,
    }
}

/// Runs of consecutive assignments without loops (an optimizer's scalar factors, computed
/// between the passes that use them) become one statement, a loop of one iteration around
/// them, so that one pass runs them in order instead of a launch each.
fn merge_scalar_runs(stmts: Vec<(LowLevel, Option<String>)>) -> Vec<(LowLevel, Option<String>)> {
    let mut out: Vec<(LowLevel, Option<String>)> = Vec::with_capacity(stmts.len());
    let mut run: Vec<LowLevel> = Vec::new();
    let flush = |run: &mut Vec<LowLevel>, out: &mut Vec<(LowLevel, Option<String>)>| match run.len()
    {
        0 => {}
        1 => out.push((run.remove(0), None)),
        n => out.push((
            LowLevel::For {
                index: Symbol::fresh(),
                from: 0,
                to: 1,
                body: Box::new(LowLevel::Seq(std::mem::take(run))),
            },
            Some(format!(
                "{n} consecutive assignments without loops run together, in order"
            )),
        )),
    };
    for (s, note) in stmts {
        if note.is_none() && is_scalar(&s) {
            run.push(s);
        } else {
            flush(&mut run, &mut out);
            out.push((s, note));
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Whether a statement is straight-line work: assignments (or a sequence of them) whose values
/// hold no loops of their own.
fn straight_line(stmt: &LowLevel) -> bool {
    match stmt {
        LowLevel::Seq(items) => items.iter().all(straight_line),
        LowLevel::Noop | LowLevel::Comment(_) => true,
        LowLevel::Set { .. } => is_scalar(stmt),
        _ => false,
    }
}

/// `a` then `b` as one nest, where both are nests of the same loops (same ranges, in order)
/// around straight-line assignments and the merged loops' iterations are still independent
/// ([`crate::schedule::iterations_independent`]): then each grid point's `b` reads of what
/// `a` writes only the element `a` wrote at that point, and `a` reads nothing `b` writes at
/// another point, so running both per point keeps every result. `None` otherwise.
pub fn merged_pointwise(a: &LowLevel, b: &LowLevel) -> Option<LowLevel> {
    let (loops_a, body_a) = a.unwrapped().perfect_nest();
    let (loops_b, body_b) = b.unwrapped().perfect_nest();
    let same_ranges = loops_a.len() == loops_b.len()
        && loops_a
            .iter()
            .zip(&loops_b)
            .all(|(x, y)| (x.1, x.2) == (y.1, y.2));
    if loops_a.is_empty() || !same_ranges || !straight_line(body_a) || !straight_line(body_b) {
        return None;
    }
    let body_b = loops_a
        .iter()
        .zip(&loops_b)
        .fold(body_b.clone(), |body, (x, y)| {
            body.substitute(y.0, &arrayjit_ir::indexing::AxisIndex::Iterator(x.0))
        });
    let mut items = Vec::new();
    for body in [body_a.clone(), body_b] {
        match body {
            LowLevel::Seq(inner) => items.extend(inner),
            other => items.push(other),
        }
    }
    let body = LowLevel::Seq(items);
    if !loops_a
        .iter()
        .all(|l| crate::schedule::iterations_independent(&body, l.0))
    {
        return None;
    }
    Some(
        loops_a
            .iter()
            .rev()
            .fold(body, |body, &(index, from, to)| LowLevel::For {
                index,
                from,
                to,
                body: Box::new(body),
            }),
    )
}

/// Runs of consecutive statements that [`merged_pointwise`] merges become one statement each,
/// with why.
fn merge_pointwise_runs(stmts: Vec<(LowLevel, Option<String>)>) -> Vec<(LowLevel, Option<String>)> {
    let mut out: Vec<(LowLevel, Option<String>, usize)> = Vec::with_capacity(stmts.len());
    for (s, note) in stmts {
        if let Some((last, last_note, count)) = out.last_mut()
            && let Some(m) = merged_pointwise(last, &s)
        {
            *last = m;
            *count += 1;
            if last_note.is_none() {
                *last_note = note;
            }
            continue;
        }
        out.push((s, note, 1));
    }
    out.into_iter()
        .map(|(s, note, count)| {
            if count == 1 {
                return (s, note);
            }
            let merged = format!(
                "{count} consecutive nests of the same loops around straight-line assignments \
                 merged into one (each grid point runs them in order; their iterations stay \
                 independent)"
            );
            let note = match note {
                Some(n) => format!("{n}; then {merged}"),
                None => merged,
            };
            (s, Some(note))
        })
        .collect()
}

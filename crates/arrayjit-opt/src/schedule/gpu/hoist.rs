//! Reductions inside expressions, hoisted into statements of their own for a GPU (the shape
//! of a hoistable scope and the rewrite of one are [`crate::schedule::hoist`]'s). Inlining
//! (fusion) leaves a reduction as a local scope inside the expression that uses it: `loss[] :=
//! (v: { v := 0; for i, j { v := v + x[i, j] } }) * c`. A GPU pass cannot spread such a scope:
//! the statement around it runs on one invocation (a scalar statement) or one invocation per
//! grid point, each walking the whole reduction. Here such a scope becomes an accumulation
//! into a local node of the routine, which the planner runs as a (grid) reduction or as a row
//! pass's group reduction:
//!
//! - in a statement without loops: `t[0] := 0; for i, j { t[0] := t[0] + x[i, j] }; loss[] :=
//!   t[0] * c` (scopes of at least [`HOIST_MIN_STEPS`] steps; the reduction then starts from
//!   the constant, see [`super::gpu_schedules`]);
//! - in a statement whose loops are all independent and give fewer points than fill the
//!   device: the same per point, under the loops (`t` indexed by them), so that each point's
//!   reduction runs on a group (scopes of at least [`super::ROW_MIN_WIDTH`] steps).
//!
//! The scopes of one statement share one local node, a slot each along its last axis, so the
//! statement reads one array however many reductions it holds (a gradient norm sums dozens).
//!
//! **Rule.** The local holds what the scope's variable held, step by step, and the
//! expression reads it where it read the scope: the same values, but for the regrouping the
//! GPU reductions apply to any accumulation (a fixed tree order).

use super::analysis::{grid_loops, grid_total};
use super::{GpuLimits, ROW_MIN_WIDTH};
use crate::schedule::hoist::{HOIST_MIN_STEPS, Scoped, hoisted_statements, local_node, scoped};
use arrayjit_ir::indexing::AxisIndex;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::tnode::Tnode;

/// The local node of a statement's hoisted reductions: `dims` in precision `prec`.
fn reduced_node(prec: arrayjit_ir::prec::Prec, dims: &[usize]) -> Option<Tnode> {
    local_node(
        prec,
        dims,
        "gpu_reduced",
        "a reduction hoisted out of an expression for a GPU pass",
    )
}

/// `value` with its scopes of at least `min_steps` steps replaced by reads of one new local
/// node of `dims` and one more axis, a slot per scope (at `idcs` and the slot), so that the
/// statement reads one array however many reductions it holds; the statements computing them
/// go to `before`, the node to `made`.
fn hoist_scopes(
    value: ScalarExpr,
    min_steps: u64,
    dims: &[usize],
    idcs: &[AxisIndex],
    before: &mut Vec<LowLevel>,
    made: &mut Vec<Tnode>,
) -> ScalarExpr {
    // Symbols a gather binds inside the value: a reduction reading one of them (a row chosen
    // by the gather's index) cannot leave the gather, where the symbol is unbound.
    let mut gathered = std::collections::BTreeSet::new();
    value.visit_all(&mut |x| {
        if let ScalarExpr::Gather { symbol, .. } = x {
            gathered.insert(*symbol);
        }
    });
    fn qualifies<'e>(
        e: &'e ScalarExpr,
        min_steps: u64,
        gathered: &std::collections::BTreeSet<arrayjit_ir::indexing::Symbol>,
    ) -> Option<Scoped<'e>> {
        let ScalarExpr::LocalScope { body, .. } = e else {
            return None;
        };
        if body.index_symbols().iter().any(|s| gathered.contains(s)) {
            return None;
        }
        scoped(e).filter(|s| s.steps() >= min_steps)
    }
    // Bottom-up, as the replacement below goes: scopes inside scopes' bodies are not seen.
    let mut scopes = Vec::new();
    let value = value.map_bottom_up(&mut |e| {
        if let Some(s) = qualifies(&e, min_steps, &gathered) {
            scopes.push(s.id.prec);
        }
        e
    });
    let Some(&prec) = scopes.first() else {
        return value;
    };
    if scopes.iter().any(|&p| p != prec) {
        return value;
    }
    let mut all_dims = dims.to_vec();
    all_dims.push(scopes.len());
    let Some(t) = reduced_node(prec, &all_dims) else {
        return value;
    };
    let mut slot = 0i64;
    let value = value.map_bottom_up(&mut |e| {
        let Some(s) = qualifies(&e, min_steps, &gathered) else {
            return e;
        };
        let mut at = idcs.to_vec();
        at.push(AxisIndex::Fixed(slot));
        slot += 1;
        before.extend(hoisted_statements(&s, &t, &at));
        ScalarExpr::Get(t.clone(), at)
    });
    made.push(t);
    value
}

/// One top-level statement with its scoped reductions hoisted where the device calls for it
/// (see the module's doc), and why, if any was.
fn hoist_statement(
    stmt: LowLevel,
    limits: &GpuLimits,
    threads: u32,
    made: &mut Vec<Tnode>,
) -> (Vec<LowLevel>, Option<String>) {
    if let LowLevel::Set { tn, idcs, value } = stmt.unwrapped() {
        let mut before = Vec::new();
        let value = hoist_scopes(value.clone(), HOIST_MIN_STEPS, &[], &[], &mut before, made);
        if before.is_empty() {
            return (vec![stmt], None);
        }
        let hoisted = before.len() / 2;
        before.push(LowLevel::Set {
            tn: tn.clone(),
            idcs: idcs.clone(),
            value,
        });
        return (
            before,
            Some(format!(
                "{hoisted} reduction(s) of at least {HOIST_MIN_STEPS} steps hoisted out of a \
                 statement without loops into accumulations of their own"
            )),
        );
    }
    let (grid, inner) = grid_loops(&stmt);
    let (loops, _) = stmt.perfect_nest();
    let total = grid_total(&grid);
    let LowLevel::Set { tn, idcs, value } = &*inner else {
        return (vec![stmt], None);
    };
    if grid.is_empty() || grid.len() != loops.len() || total >= limits.busy_invocations(threads) {
        return (vec![stmt], None);
    }
    let dims: Vec<usize> = grid.iter().map(|l| l.to.max(0) as usize).collect();
    let at: Vec<AxisIndex> = grid.iter().map(|l| AxisIndex::Iterator(l.iter)).collect();
    let mut body = Vec::new();
    let value = hoist_scopes(value.clone(), ROW_MIN_WIDTH, &dims, &at, &mut body, made);
    if body.is_empty() {
        return (vec![stmt], None);
    }
    let hoisted = body.len() / 2;
    body.push(LowLevel::Set {
        tn: tn.clone(),
        idcs: idcs.clone(),
        value,
    });
    let nest = grid
        .iter()
        .rev()
        .fold(LowLevel::Seq(body), |body, l| LowLevel::For {
            index: l.iter,
            from: l.from,
            to: l.to,
            body: Box::new(body),
        });
    (
        vec![nest],
        Some(format!(
            "{hoisted} reduction(s) per point of {total} grid point(s) hoisted out of the \
             expression into accumulations a group can share"
        )),
    )
}

/// The top-level statements of `code` with scoped reductions hoisted (see the module's doc),
/// each with why, and the local nodes made for them.
pub fn hoist_reductions(
    stmts: Vec<(LowLevel, Option<String>)>,
    limits: &GpuLimits,
    threads: u32,
) -> (Vec<(LowLevel, Option<String>)>, Vec<Tnode>) {
    let mut made = Vec::new();
    let mut out = Vec::with_capacity(stmts.len());
    for (s, note) in stmts {
        if super::attention::runs_as_attention(&s, limits) {
            out.push((s, note));
            continue;
        }
        let (pieces, why) = hoist_statement(s, limits, threads, &mut made);
        let why = match (note, why) {
            (Some(a), Some(b)) => Some(format!("{a}; then {b}")),
            (a, b) => a.or(b),
        };
        out.extend(pieces.into_iter().map(|p| (p, why.clone())));
    }
    (out, made)
}

//! Reductions inside expressions, hoisted into statements of their own for a GPU. Inlining
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
//! **On a CPU** ([`hoist_for_cpu`]) the scopes of a statement without loops are hoisted too,
//! each into a one-element local node of its own: a reduction then renders the same code
//! wherever it runs over arrays of the same shape, so the backends compile it once (a
//! gradient norm over twelve identical layers: one function per parameter shape, not one
//! inlined cascade per parameter), and the statement's schedule (several accumulators, split
//! over the workers) applies to it.
//!
//! **Rule.** The local holds what the scope's variable held, step by step, and the
//! expression reads it where it read the scope: the same values, but for the regrouping the
//! GPU reductions apply to any accumulation (a fixed tree order). Only scopes of the plain
//! shape `v := c; loops { v := v ⊕ e }` (⊕ an addition, maximum, minimum or fused
//! multiply-add, `c` a constant, `e` reading no local variable) are hoisted.

use super::analysis::{grid_loops, grid_total};
use super::{GpuLimits, ROW_MIN_WIDTH};
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr, ScopeId};
use crate::memory::MemoryMode;
use crate::ops::{BinOp, TernOp};
use crate::tnode::Tnode;

/// A scope in a statement without loops is hoisted when it takes at least this many steps (a
/// warp's worth: one invocation walking it would wait on each load in turn).
pub const HOIST_MIN_STEPS: u64 = 32;

/// A local scope of the plain accumulating shape.
struct Scoped<'a> {
    id: ScopeId,
    init: f64,
    loops: Vec<(Symbol, i64, i64)>,
    value: &'a ScalarExpr,
}

impl Scoped<'_> {
    fn steps(&self) -> u64 {
        self.loops
            .iter()
            .map(|&(_, from, to)| (to - from).max(0) as u64)
            .fold(1, u64::saturating_mul)
    }
}

/// Whether an expression reads no local variable and declares no scope.
fn closed(e: &ScalarExpr) -> bool {
    let mut ok = true;
    e.visit_all(&mut |x| {
        ok &= !matches!(x, ScalarExpr::GetLocal(_) | ScalarExpr::LocalScope { .. });
    });
    ok
}

/// Whether `value` accumulates into local `id`: `id ⊕ e`, `e ⊕ id` or `fma(a, b, id)`.
fn accumulates(value: &ScalarExpr, id: ScopeId) -> bool {
    let is_local = |e: &ScalarExpr| matches!(e, ScalarExpr::GetLocal(l) if *l == id);
    match value {
        ScalarExpr::Binop(BinOp::Add | BinOp::Max | BinOp::Min, a, b) => {
            (is_local(a) && closed(b)) || (is_local(b) && closed(a))
        }
        ScalarExpr::Ternop(TernOp::Fma, a, b, c) => is_local(c) && closed(a) && closed(b),
        _ => false,
    }
}

fn scoped(e: &ScalarExpr) -> Option<Scoped<'_>> {
    let ScalarExpr::LocalScope { id, body } = e else {
        return None;
    };
    let (init, nest) = match body.unwrapped() {
        LowLevel::Seq(items) => match items.as_slice() {
            [LowLevel::SetLocal(l, ScalarExpr::Constant(c)), nest] if l == id => (*c, nest),
            _ => return None,
        },
        nest => (0.0, nest),
    };
    let (loops, inner) = nest.perfect_nest();
    let LowLevel::SetLocal(l, value) = inner else {
        return None;
    };
    (l == id
        && !loops.is_empty()
        && loops.iter().all(|&(_, f, t)| t > f)
        && accumulates(value, *id))
    .then_some(Scoped {
        id: *id,
        init,
        loops,
        value,
    })
}

/// The local node of a statement's hoisted reductions: `dims` in precision `prec`.
fn reduced_node(prec: crate::prec::Prec, dims: &[usize]) -> Option<Tnode> {
    local_node(
        prec,
        dims,
        "gpu_reduced",
        "a reduction hoisted out of an expression for a GPU pass",
    )
}

/// A new local node of `dims` in `prec`, labelled `label`, local for `why`.
fn local_node(prec: crate::prec::Prec, dims: &[usize], label: &str, why: &str) -> Option<Tnode> {
    let tn = Tnode::new(prec, dims, &[label]).ok()?;
    tn.update_memory_mode(MemoryMode::Local, why).ok()?;
    Some(tn)
}

/// The scope's statements with its variable stored at `t[idcs]`: the initialization and the
/// accumulating nest.
fn hoisted_statements(s: &Scoped<'_>, t: &Tnode, idcs: &[AxisIndex]) -> [LowLevel; 2] {
    let id = s.id;
    let value = s.value.clone().map_bottom_up(&mut |e| match e {
        ScalarExpr::GetLocal(l) if l == id => ScalarExpr::Get(t.clone(), idcs.to_vec()),
        e => e,
    });
    let set = LowLevel::Set {
        tn: t.clone(),
        idcs: idcs.to_vec(),
        value,
    };
    let nest = s
        .loops
        .iter()
        .rev()
        .fold(set, |body, &(index, from, to)| LowLevel::For {
            index,
            from,
            to,
            body: Box::new(body),
        });
    let init = LowLevel::Set {
        tn: t.clone(),
        idcs: idcs.to_vec(),
        value: ScalarExpr::Constant(s.init),
    };
    [init, nest]
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
        gathered: &std::collections::BTreeSet<crate::indexing::Symbol>,
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

/// For a CPU: the top-level statements of `code` with the scoped reductions of at least
/// [`HOIST_MIN_STEPS`] steps of each statement without loops hoisted into statements of their
/// own, each accumulating into a one-element local node of its own (see the module's doc);
/// each statement with why, if it was changed, and the nodes made.
pub fn hoist_for_cpu(code: LowLevel) -> (LowLevel, Vec<Option<String>>, Vec<Tnode>) {
    let stmts = match code {
        LowLevel::Seq(items) => items,
        LowLevel::Noop => vec![],
        s => vec![s],
    };
    let mut made = Vec::new();
    let mut out: Vec<LowLevel> = Vec::with_capacity(stmts.len());
    let mut notes: Vec<Option<String>> = Vec::with_capacity(stmts.len());
    for stmt in stmts {
        let LowLevel::Set { tn, idcs, value } = stmt.unwrapped() else {
            out.push(stmt);
            notes.push(None);
            continue;
        };
        let mut before = Vec::new();
        let value = value.clone().map_bottom_up(&mut |e| {
            let Some(s) = scoped(&e).filter(|s| s.steps() >= HOIST_MIN_STEPS) else {
                return e;
            };
            let Some(t) = local_node(
                s.id.prec,
                &[1],
                "cpu_reduced",
                "a reduction hoisted out of an expression into a statement of its own (the \
                 same reduction over arrays of the same shape compiles once)",
            ) else {
                return e;
            };
            let at = [AxisIndex::Fixed(0)];
            before.extend(hoisted_statements(&s, &t, &at));
            made.push(t.clone());
            ScalarExpr::Get(t, at.to_vec())
        });
        if before.is_empty() {
            out.push(stmt);
            notes.push(None);
            continue;
        }
        let why = format!(
            "one of {} reduction(s) hoisted out of a statement without loops, each into a \
             statement and a local of its own",
            before.len() / 2
        );
        before.push(LowLevel::Set {
            tn: tn.clone(),
            idcs: idcs.clone(),
            value,
        });
        notes.extend(std::iter::repeat_n(Some(why), before.len()));
        out.extend(before);
    }
    let code = match out.len() {
        0 => LowLevel::Noop,
        1 => out.into_iter().next().unwrap_or(LowLevel::Noop),
        _ => LowLevel::Seq(out),
    };
    (code, notes, made)
}

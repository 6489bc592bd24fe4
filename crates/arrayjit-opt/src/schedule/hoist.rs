//! Reductions inside expressions, hoisted into statements of their own. Inlining (fusion)
//! leaves a reduction as a local scope inside the expression that uses it: `loss[] := (v: {
//! v := 0; for i, j { v := v + x[i, j] } }) * c`. This module finds scopes of the plain
//! accumulating shape and rewrites one into an accumulation into a local node; the CPU's use
//! is here, the GPU's (per grid point, a slot per scope) in [`super::gpu`]'s hoisting.
//!
//! **On a CPU** ([`hoist_for_cpu`]) the scopes of at least [`HOIST_MIN_STEPS`] steps of a
//! statement without loops are hoisted, each into a one-element local node of its own: a
//! reduction then renders the same code wherever it runs over arrays of the same shape, so
//! the backends compile it once (a gradient norm over twelve identical layers: one function
//! per parameter shape, not one inlined cascade per parameter), and the statement's schedule
//! (several accumulators, split over the workers) applies to it.
//!
//! **Rule.** The local holds what the scope's variable held, step by step, and the
//! expression reads it where it read the scope: the same values, but for the regrouping any
//! schedule of an accumulation may apply (in a fixed order). Only scopes of the plain shape
//! `v := c; loops { v := v ⊕ e }` (⊕ an addition, maximum, minimum or fused multiply-add,
//! `c` a constant, `e` reading no local variable) are hoisted.

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr, ScopeId};
use arrayjit_ir::memory::MemoryMode;
use arrayjit_ir::ops::{BinOp, TernOp};
use arrayjit_ir::tnode::Tnode;

/// A scope in a statement without loops is hoisted when it takes at least this many steps (a
/// warp's worth: one invocation walking it would wait on each load in turn).
pub const HOIST_MIN_STEPS: u64 = 32;

/// A local scope of the plain accumulating shape.
pub(super) struct Scoped<'a> {
    /// The scope's variable.
    pub(super) id: ScopeId,
    /// The constant it starts from.
    init: f64,
    /// Its loops (iterator, first value, one past the last), outermost first.
    loops: Vec<(Symbol, i64, i64)>,
    /// What each step accumulates into the variable.
    value: &'a ScalarExpr,
}

impl Scoped<'_> {
    pub(super) fn steps(&self) -> u64 {
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

pub(super) fn scoped(e: &ScalarExpr) -> Option<Scoped<'_>> {
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

/// A new local node of `dims` in `prec`, labelled `label`, local for `why`.
pub(super) fn local_node(
    prec: arrayjit_ir::prec::Prec,
    dims: &[usize],
    label: &str,
    why: &str,
) -> Option<Tnode> {
    let tn = Tnode::new(prec, dims, &[label]).ok()?;
    tn.update_memory_mode(MemoryMode::Local, why).ok()?;
    Some(tn)
}

/// The scope's statements with its variable stored at `t[idcs]`: the initialization and the
/// accumulating nest.
pub(super) fn hoisted_statements(s: &Scoped<'_>, t: &Tnode, idcs: &[AxisIndex]) -> [LowLevel; 2] {
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

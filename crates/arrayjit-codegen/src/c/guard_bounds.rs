//! Guards as loop bounds. A guard of [`arrayjit_ir::Projections::guards`] is lowered to
//! `where(g < 0, kept, value)` in the values its statements store (`kept`: the element as it
//! was, a local sum as it was, or the neutral element). Where every such test in a loop's body
//! is the same `g`, and `g` is `±index + rest` with `rest` a function of outer loops and static
//! indices only, the loop's iterations split into one interval where the guard holds and one
//! where it fails. Each runs its own copy of the body: the first with every test replaced by
//! its `value`, the second by its `kept`, where a store of an element's own value is dropped
//! (often all of it). So a causal product visits only the keys at or before its query, and a
//! decoding step only the cache slots written so far, instead of testing every slot. The
//! intervals run in the loop's order and each iteration stores what it stored before, so the
//! results are the same bits.

use arrayjit_ir::{AxisIndex, BinOp, LowLevel, ScalarExpr, Symbol, TernOp};

/// How a guard splits a loop over `index`: the guard holds for `index >= -rest` (`lower`) or
/// for `index <= rest`, with `rest` the guard without its `index` term.
pub(crate) struct GuardSplit {
    /// Whether the guard holds from a first index on (else up to a last one).
    pub lower: bool,
    /// The guard's other terms.
    pub rest: AxisIndex,
    /// The body where the guard holds.
    pub kept: LowLevel,
    /// The body where it fails (`None`: nothing to do there).
    pub skipped: Option<LowLevel>,
}

/// The guard `g` of a value `where(g < 0, kept, value)`, with `kept` and `value`.
fn guarded(value: &ScalarExpr) -> Option<(&AxisIndex, &ScalarExpr, &ScalarExpr)> {
    let ScalarExpr::Ternop(TernOp::Where, cond, kept, v) = value else {
        return None;
    };
    let ScalarExpr::Binop(BinOp::Cmplt, g, zero) = cond.as_ref() else {
        return None;
    };
    match (g.as_ref(), zero.as_ref()) {
        (ScalarExpr::EmbedIndex(g), ScalarExpr::Constant(z)) if *z == 0.0 => Some((g, kept, v)),
        _ => None,
    }
}

/// The guard of a statement's stored value, if it has one.
fn statement_guard(s: &LowLevel) -> Option<&AxisIndex> {
    match s {
        LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => {
            guarded(value).map(|(g, ..)| g)
        }
        _ => None,
    }
}

/// Collects the loop indices bound inside `s` and the guards of its statements; `false` if
/// two statements test different guards.
fn scan<'a>(s: &'a LowLevel, inner: &mut Vec<Symbol>, guard: &mut Option<&'a AxisIndex>) -> bool {
    match s {
        LowLevel::Seq(items) => items.iter().all(|i| scan(i, inner, guard)),
        LowLevel::For { index, body, .. } => {
            inner.push(*index);
            scan(body, inner, guard)
        }
        _ => match (statement_guard(s), *guard) {
            (Some(g), None) => {
                *guard = Some(g);
                true
            }
            (Some(g), Some(seen)) => g == seen,
            (None, _) => true,
        },
    }
}

/// `s` with each statement's guard test replaced by its value (`holds`) or by what it keeps;
/// a store of an element's (or a local's) own value is left out. `None` if nothing is left.
fn resolve(s: &LowLevel, holds: bool) -> Option<LowLevel> {
    match s {
        LowLevel::Seq(items) => {
            let kept: Vec<LowLevel> = items.iter().filter_map(|i| resolve(i, holds)).collect();
            (!kept.is_empty()).then_some(LowLevel::Seq(kept))
        }
        LowLevel::For {
            index,
            from,
            to,
            body,
        } => resolve(body, holds).map(|body| LowLevel::For {
            index: *index,
            from: *from,
            to: *to,
            body: Box::new(body),
        }),
        LowLevel::Set { tn, idcs, value } => match guarded(value) {
            Some((_, _, v)) if holds => Some(LowLevel::Set {
                tn: tn.clone(),
                idcs: idcs.clone(),
                value: v.clone(),
            }),
            Some((_, ScalarExpr::Get(kt, ki), _)) if kt == tn && ki == idcs => None,
            Some((_, k, _)) => Some(LowLevel::Set {
                tn: tn.clone(),
                idcs: idcs.clone(),
                value: k.clone(),
            }),
            None => Some(s.clone()),
        },
        LowLevel::SetLocal(id, value) => match guarded(value) {
            Some((_, _, v)) if holds => Some(LowLevel::SetLocal(*id, v.clone())),
            Some((_, ScalarExpr::GetLocal(k), _)) if k == id => None,
            Some((_, k, _)) => Some(LowLevel::SetLocal(*id, k.clone())),
            None => Some(s.clone()),
        },
        LowLevel::Noop => None,
        other => Some(other.clone()),
    }
}

/// How the shared guard of `body`'s statements splits the loop over `index`; `None` unless
/// some statement is guarded, all by the same guard, and it is `±index` plus terms of outer
/// loops and static indices.
pub(crate) fn guard_split(index: Symbol, body: &LowLevel) -> Option<GuardSplit> {
    let mut inner = Vec::new();
    let mut guard = None;
    if !scan(body, &mut inner, &mut guard) {
        return None;
    }
    let (terms, offset) = guard?.terms();
    let coefficient = terms.iter().find(|(_, s)| *s == index)?.0;
    if coefficient.abs() != 1 || terms.iter().any(|(_, s)| inner.contains(s)) {
        return None;
    }
    let rest = AxisIndex::affine(terms.into_iter().filter(|(_, s)| *s != index), offset);
    Some(GuardSplit {
        lower: coefficient == 1,
        rest,
        kept: resolve(body, true).unwrap_or(LowLevel::Noop),
        skipped: resolve(body, false),
    })
}

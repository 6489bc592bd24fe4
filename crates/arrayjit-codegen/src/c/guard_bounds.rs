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

use arrayjit_ir::{AxisIndex, BinOp, LowLevel, ScalarExpr, ScopeId, Symbol, TernOp};

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

/// A guarded value `where(g < 0, kept, value)`: the guard `g`, what is stored where it fails
/// (`kept`) and where it holds (`value`), and the local the test is bound to, if any.
struct Guarded<'a> {
    guard: &'a AxisIndex,
    kept: &'a ScalarExpr,
    value: &'a ScalarExpr,
    local: Option<ScopeId>,
}

impl Guarded<'_> {
    /// What is stored where the guard fails (the test's local read as 1).
    fn kept(&self) -> ScalarExpr {
        self.read_local_as(self.kept, 1.0)
    }

    /// What is stored where the guard holds (the test's local read as 0).
    fn value(&self) -> ScalarExpr {
        self.read_local_as(self.value, 0.0)
    }

    fn read_local_as(&self, e: &ScalarExpr, test_value: f64) -> ScalarExpr {
        match self.local {
            None => e.clone(),
            Some(id) => e.clone().map_bottom_up(&mut |x| match x {
                ScalarExpr::GetLocal(l) if l == id => ScalarExpr::Constant(test_value),
                x => x,
            }),
        }
    }
}

/// The guard of a value `where(g < 0, kept, value)`, its test written in place or bound to a
/// local that the value reads again (`where((l := g < 0), kept, … l …)`, as common
/// subexpressions leave a guard tested twice: a guarded exponential `where(l, 0, exp(where(l,
/// 0, x)))`). In `kept` and `value` such a local reads as the test's result there: 1 where the
/// guard fails, 0 where it holds. A local-bound test whose value holds local scopes of its own
/// is not taken (their bodies are not rewritten).
fn guarded(value: &ScalarExpr) -> Option<Guarded<'_>> {
    let ScalarExpr::Ternop(TernOp::Where, cond, kept, v) = value else {
        return None;
    };
    let (test, local) = match cond.as_ref() {
        ScalarExpr::LocalScope { id, body } => match body.as_ref() {
            LowLevel::SetLocal(l, test) if l == id => (test, Some(*id)),
            LowLevel::Seq(items) => match items.as_slice() {
                [LowLevel::SetLocal(l, test)] if l == id => (test, Some(*id)),
                _ => return None,
            },
            _ => return None,
        },
        test => (test, None),
    };
    let ScalarExpr::Binop(BinOp::Cmplt, g, zero) = test else {
        return None;
    };
    let (ScalarExpr::EmbedIndex(g), ScalarExpr::Constant(z)) = (g.as_ref(), zero.as_ref()) else {
        return None;
    };
    if *z != 0.0 {
        return None;
    }
    if local.is_some() {
        let mut scoped = false;
        for e in [kept.as_ref(), v.as_ref()] {
            e.visit_all(&mut |x| scoped |= matches!(x, ScalarExpr::LocalScope { .. }));
        }
        if scoped {
            return None;
        }
    }
    Some(Guarded {
        guard: g,
        kept,
        value: v,
        local,
    })
}

/// The guard of a statement's stored value, if it has one.
fn statement_guard(s: &LowLevel) -> Option<&AxisIndex> {
    match s {
        LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => {
            guarded(value).map(|g| g.guard)
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
            Some(g) if holds => Some(LowLevel::Set {
                tn: tn.clone(),
                idcs: idcs.clone(),
                value: g.value(),
            }),
            Some(Guarded {
                kept: ScalarExpr::Get(kt, ki),
                ..
            }) if kt == tn && ki == idcs => None,
            Some(g) => Some(LowLevel::Set {
                tn: tn.clone(),
                idcs: idcs.clone(),
                value: g.kept(),
            }),
            None => Some(s.clone()),
        },
        LowLevel::SetLocal(id, value) => match guarded(value) {
            Some(g) if holds => Some(LowLevel::SetLocal(*id, g.value())),
            Some(Guarded {
                kept: ScalarExpr::GetLocal(k),
                ..
            }) if k == id => None,
            Some(g) => Some(LowLevel::SetLocal(*id, g.kept())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::{Prec, Tnode, UnOp};

    /// A guarded exponential whose test common subexpressions bound to a local
    /// (`y[s] = where((l := t - s < 0), 0, exp(where(l, 0, x[s])))`) splits its loop like a
    /// test written in place: where the guard holds it stores `exp(x[s])` (the local read as
    /// 0), where it fails `0`.
    #[test]
    fn a_guard_bound_to_a_local_splits_the_loop() {
        let (t, s) = (Symbol::fresh(), Symbol::fresh());
        let x = Tnode::new(Prec::F32, &[8], &["x"]).unwrap();
        let y = Tnode::new(Prec::F32, &[8], &["y"]).unwrap();
        let l = ScopeId::fresh(Prec::F32);
        let test = ScalarExpr::binop(
            BinOp::Cmplt,
            ScalarExpr::EmbedIndex(AxisIndex::affine([(1, t), (-1, s)], 0)),
            ScalarExpr::Constant(0.0),
        );
        let read = ScalarExpr::Get(x.clone(), vec![AxisIndex::Iterator(s)]);
        let value = ScalarExpr::ternop(
            TernOp::Where,
            ScalarExpr::LocalScope {
                id: l,
                body: Box::new(LowLevel::SetLocal(l, test)),
            },
            ScalarExpr::Constant(0.0),
            ScalarExpr::unop(
                UnOp::Exp,
                ScalarExpr::ternop(
                    TernOp::Where,
                    ScalarExpr::GetLocal(l),
                    ScalarExpr::Constant(0.0),
                    read.clone(),
                ),
            ),
        );
        let body = LowLevel::Set {
            tn: y.clone(),
            idcs: vec![AxisIndex::Iterator(s)],
            value,
        };
        let split = guard_split(s, &body).expect("the loop splits at the guard");
        // t - s >= 0 holds up to s = t.
        assert!(!split.lower);
        let LowLevel::Set { value: kept, .. } = &split.kept else {
            panic!("{:?}", split.kept)
        };
        let resolved = ScalarExpr::unop(
            UnOp::Exp,
            ScalarExpr::ternop(
                TernOp::Where,
                ScalarExpr::Constant(0.0),
                ScalarExpr::Constant(0.0),
                read,
            ),
        );
        assert_eq!(*kept, resolved);
        let Some(LowLevel::Set { value: skipped, .. }) = &split.skipped else {
            panic!("{:?}", split.skipped)
        };
        assert_eq!(*skipped, ScalarExpr::Constant(0.0));
    }
}

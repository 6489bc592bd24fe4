//! Common-subexpression elimination within each statement: an operation tree that occurs more
//! than once in a statement's value is computed once into a local and read back.

use std::collections::HashMap;

use crate::low_level::{LowLevel, ScalarExpr, ScopeId};
use crate::prec::Prec;

/// Eliminates repeated subexpressions in every statement's value.
pub(super) fn eliminate_common_subexpressions(code: LowLevel) -> LowLevel {
    code.map_values(&mut cse_value)
}

/// A key for operation trees free of locals; `None` for leaves and trees that involve locals
/// (their values depend on where they are evaluated).
fn key(e: &ScalarExpr) -> Option<String> {
    fn pure(e: &ScalarExpr) -> bool {
        match e {
            ScalarExpr::LocalScope { .. } | ScalarExpr::GetLocal(_) => false,
            _ => {
                let mut ok = true;
                e.for_each_child(|c| ok &= pure(c));
                ok
            }
        }
    }
    match e {
        ScalarExpr::Unop(..) | ScalarExpr::Binop(..) | ScalarExpr::Ternop(..) if pure(e) => {
            Some(format!("{e:?}"))
        }
        _ => None,
    }
}

fn count(e: &ScalarExpr, counts: &mut HashMap<String, usize>) {
    if let Some(k) = key(e) {
        *counts.entry(k).or_insert(0) += 1;
    }
    e.for_each_child(|c| count(c, counts));
}

fn cse_value(value: ScalarExpr, prec: Prec) -> ScalarExpr {
    // Local-scope bodies are statements of their own.
    let value = value.map_bottom_up(&mut |e| match e {
        ScalarExpr::LocalScope { id, body } => ScalarExpr::LocalScope {
            id,
            body: Box::new(eliminate_common_subexpressions(*body)),
        },
        e => e,
    });
    let mut counts = HashMap::new();
    count(&value, &mut counts);
    if counts.values().all(|&n| n < 2) {
        return value;
    }
    let mut assigned: HashMap<String, ScopeId> = HashMap::new();
    rewrite(value, prec, &counts, &mut assigned)
}

/// Replaces repeated trees, in evaluation order: the first occurrence computes the local, the
/// later ones read it.
fn rewrite(
    e: ScalarExpr,
    prec: Prec,
    counts: &HashMap<String, usize>,
    assigned: &mut HashMap<String, ScopeId>,
) -> ScalarExpr {
    if let Some(k) = key(&e)
        && counts[&k] >= 2
    {
        if let Some(id) = assigned.get(&k) {
            return ScalarExpr::GetLocal(*id);
        }
        let id = ScopeId::fresh(prec);
        assigned.insert(k, id);
        return ScalarExpr::LocalScope {
            id,
            body: Box::new(LowLevel::SetLocal(id, e)),
        };
    }
    match e {
        ScalarExpr::Unop(op, a) => ScalarExpr::unop(op, rewrite(*a, prec, counts, assigned)),
        ScalarExpr::Binop(op, a, b) => {
            let a = rewrite(*a, prec, counts, assigned);
            ScalarExpr::binop(op, a, rewrite(*b, prec, counts, assigned))
        }
        ScalarExpr::Ternop(op, a, b, c) => {
            let a = rewrite(*a, prec, counts, assigned);
            let b = rewrite(*b, prec, counts, assigned);
            ScalarExpr::ternop(op, a, b, rewrite(*c, prec, counts, assigned))
        }
        e => e,
    }
}

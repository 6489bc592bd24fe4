//! Simplification: constant folding in the statement's precision, algebraic identities, fused
//! multiply-adds, flattening of local scopes that compute a plain expression, removal of empty
//! loops.

use arrayjit_ir::indexing::AxisIndex;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr, ScopeId};
use arrayjit_ir::ops::{BinOp, Scalar, TernOp, UnOp};
use arrayjit_ir::prec::Prec;

/// Simplifies every statement. A top-level statement stays one statement: where its loops of
/// one iteration go, a body of several statements keeps the innermost of them as a loop of one
/// iteration (its index a constant inside), so that a nest lowered as one statement is not split
/// into statements that schedules see apart. A fused attention pass of one batch element and
/// one head, whose backward is two gradient nests under the batch and head loops, stays the one
/// statement the blocked helper and the GPU pass take (split, it ran as its loops).
pub(super) fn simplify(code: LowLevel, fma: bool) -> LowLevel {
    let simplifier = Simplifier { fma };
    match code {
        LowLevel::Seq(items) => LowLevel::seq(
            items
                .into_iter()
                .map(|i| simplifier.top_level(i))
                .collect::<Vec<_>>(),
        ),
        other => simplifier.top_level(other),
    }
}

struct Simplifier {
    fma: bool,
}

fn constant(e: &ScalarExpr) -> Option<f64> {
    match e {
        ScalarExpr::Constant(c) => Some(*c),
        _ => None,
    }
}

/// A folded value as a constant, if it survives the round trip through `f64` exactly.
fn folded(s: Scalar) -> Option<ScalarExpr> {
    match s {
        Scalar::F(x) => Some(ScalarExpr::Constant(x)),
        Scalar::I(i) if i.unsigned_abs() <= 1u128 << 53 => Some(ScalarExpr::Constant(i as f64)),
        Scalar::I(_) => None,
    }
}

/// Number of reads of local `id` in `e`, including inside nested local scopes and gathers
/// (counted as `usize::MAX / 2` there, so they are never substituted).
fn local_reads(e: &ScalarExpr, id: ScopeId) -> usize {
    match e {
        ScalarExpr::GetLocal(l) if *l == id => 1,
        ScalarExpr::Gather { .. } => {
            let mut n = 0;
            e.visit_all(&mut |x| {
                if matches!(x, ScalarExpr::GetLocal(l) if *l == id) {
                    n = usize::MAX / 2;
                }
            });
            n
        }
        ScalarExpr::LocalScope { body, .. } => {
            let mut n = 0;
            body.visit_exprs(&mut |x| {
                if matches!(x, ScalarExpr::GetLocal(l) if *l == id) {
                    n = usize::MAX / 2;
                }
            });
            n
        }
        _ => {
            let mut n = 0;
            e.for_each_child(|c| n += local_reads(c, id));
            n
        }
    }
}

/// Whether `s` assigns local `id` from a value that reads it at most once.
fn assigns_only(s: &LowLevel, id: ScopeId) -> bool {
    match s {
        LowLevel::SetLocal(l, v) => *l == id && local_reads(v, id) <= 1,
        _ => false,
    }
}

impl Simplifier {
    /// A top-level statement simplified (see [`simplify`]): its loops of one iteration removed
    /// but the innermost one whose body is several statements.
    fn top_level(&self, s: LowLevel) -> LowLevel {
        match s {
            LowLevel::For {
                index,
                from,
                to,
                body,
            } if to - from == 1 => {
                let body = self.top_level(body.substitute(index, &AxisIndex::Fixed(from)));
                if matches!(body, LowLevel::Seq(_)) {
                    LowLevel::For {
                        index,
                        from,
                        to,
                        body: Box::new(body),
                    }
                } else {
                    body
                }
            }
            s => self.stmt(s),
        }
    }

    fn stmt(&self, s: LowLevel) -> LowLevel {
        match s {
            LowLevel::Seq(items) => {
                LowLevel::seq(items.into_iter().map(|i| self.stmt(i)).collect::<Vec<_>>())
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                if to - from == 1 {
                    // A single iteration: the loop variable is a constant.
                    return self.stmt(body.substitute(index, &AxisIndex::Fixed(from)));
                }
                let body = self.stmt(*body);
                if from >= to || body == LowLevel::Noop {
                    LowLevel::Noop
                } else {
                    LowLevel::For {
                        index,
                        from,
                        to,
                        body: Box::new(body),
                    }
                }
            }
            LowLevel::Set { tn, idcs, value } => {
                let value = self.expr(value, tn.prec());
                LowLevel::Set { tn, idcs, value }
            }
            LowLevel::SetLocal(id, value) => LowLevel::SetLocal(id, self.expr(value, id.prec)),
            s => s,
        }
    }

    /// Flattens a local scope whose body only assigns the local, without loops, into the
    /// expression it computes (when no value needs rounding to another precision). The body is
    /// already simplified: only the nodes around each substituted value are simplified again,
    /// so flattening nested scopes costs their size, not size times depth.
    fn flatten_scope(&self, id: ScopeId, body: LowLevel, prec: Prec) -> ScalarExpr {
        let flat = id.prec.compute_prec() == prec.compute_prec()
            && match &body {
                LowLevel::Seq(items) => items.iter().all(|s| assigns_only(s, id)),
                s => assigns_only(s, id),
            };
        if !flat {
            return ScalarExpr::LocalScope {
                id,
                body: Box::new(body),
            };
        }
        let items = match body {
            LowLevel::Seq(items) => items,
            s => vec![s],
        };
        let mut cur = Some(ScalarExpr::Constant(0.0));
        for s in items {
            if let LowLevel::SetLocal(_, v) = s {
                let next = self.substitute_local(v, id, &mut cur, prec);
                cur = Some(next);
            }
        }
        cur.unwrap_or(ScalarExpr::Constant(0.0))
    }

    /// `e` (simplified) with its one read of local `id` replaced by `value` (simplified), and
    /// the nodes above it simplified again.
    fn substitute_local(
        &self,
        e: ScalarExpr,
        id: ScopeId,
        value: &mut Option<ScalarExpr>,
        prec: Prec,
    ) -> ScalarExpr {
        match e {
            ScalarExpr::GetLocal(l) if l == id => value.take().unwrap_or(ScalarExpr::Constant(0.0)),
            ScalarExpr::Unop(op, a) => {
                let a = self.substitute_local(*a, id, value, prec);
                self.unop(op, a, prec)
            }
            ScalarExpr::Binop(op, a, b) => {
                let a = self.substitute_local(*a, id, value, prec);
                let b = self.substitute_local(*b, id, value, prec);
                self.binop(op, a, b, prec)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.substitute_local(*a, id, value, prec);
                let b = self.substitute_local(*b, id, value, prec);
                let c = self.substitute_local(*c, id, value, prec);
                self.ternop(op, a, b, c, prec)
            }
            e => e,
        }
    }

    fn expr(&self, e: ScalarExpr, prec: Prec) -> ScalarExpr {
        match e {
            ScalarExpr::LocalScope { id, body } => {
                let body = self.stmt(*body);
                self.flatten_scope(id, body, prec)
            }
            ScalarExpr::Unop(op, a) => {
                let a = self.expr(*a, prec);
                self.unop(op, a, prec)
            }
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(*a, prec);
                let b = self.expr(*b, prec);
                self.binop(op, a, b, prec)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(*a, prec);
                let b = self.expr(*b, prec);
                let c = self.expr(*c, prec);
                self.ternop(op, a, b, c, prec)
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                let index = self.expr(*index, prec);
                ScalarExpr::gather(symbol, extent, index, self.expr(*read, prec))
            }
            e => e,
        }
    }

    /// `op(a)` of a simplified operand.
    fn unop(&self, op: UnOp, a: ScalarExpr, prec: Prec) -> ScalarExpr {
        let cp = prec.compute_prec();
        if let Some(c) = constant(&a)
            && let Some(f) = folded(op.apply(cp, Scalar::F(c).convert(cp)))
        {
            return f;
        }
        match (op, a) {
            (UnOp::Identity, a) => a,
            (UnOp::Neg, ScalarExpr::Unop(UnOp::Neg, inner)) => *inner,
            (op, a) => ScalarExpr::unop(op, a),
        }
    }

    /// `op(a, b, c)` of simplified operands.
    fn ternop(
        &self,
        op: TernOp,
        a: ScalarExpr,
        b: ScalarExpr,
        c: ScalarExpr,
        prec: Prec,
    ) -> ScalarExpr {
        let cp = prec.compute_prec();
        if let (Some(x), Some(y), Some(z)) = (constant(&a), constant(&b), constant(&c)) {
            let conv = |v: f64| Scalar::F(v).convert(cp);
            if let Some(f) = folded(op.apply(cp, conv(x), conv(y), conv(z))) {
                return f;
            }
        }
        match (op, constant(&a)) {
            (TernOp::Where, Some(k)) => {
                if Scalar::F(k).convert(cp).to_f64() != 0.0 {
                    b
                } else {
                    c
                }
            }
            _ => ScalarExpr::ternop(op, a, b, c),
        }
    }

    /// `op(a, b)` of simplified operands.
    fn binop(&self, op: BinOp, a: ScalarExpr, b: ScalarExpr, prec: Prec) -> ScalarExpr {
        use BinOp::*;
        let cp = prec.compute_prec();
        let (ca, cb) = (constant(&a), constant(&b));
        if let (Some(x), Some(y)) = (ca, cb) {
            let conv = |v: f64| Scalar::F(v).convert(cp);
            if let Some(f) = folded(op.apply(cp, conv(x), conv(y))) {
                return f;
            }
        }
        match (op, ca, cb) {
            (Arg1, _, _) => return a,
            (Arg2, _, _) => return b,
            (Add, Some(0.0), _) => return b,
            (Add | Sub, _, Some(0.0)) => return a,
            (Mul, Some(1.0), _) => return b,
            (Mul | Div | Pow, _, Some(1.0)) => return a,
            (Mul, Some(z), _) | (Mul, _, Some(z)) if z == 0.0 && cp.is_integer() => {
                return ScalarExpr::Constant(0.0);
            }
            (Pow, _, Some(t))
                if t == 2.0
                    && cp.is_float()
                    && matches!(a, ScalarExpr::Get(..) | ScalarExpr::GetLocal(_)) =>
            {
                return ScalarExpr::binop(Mul, a.clone(), a);
            }
            _ => {}
        }
        if self.fma && op == Add && cp.is_float() {
            match (a, b) {
                (ScalarExpr::Binop(Mul, x, y), c) | (c, ScalarExpr::Binop(Mul, x, y)) => {
                    return ScalarExpr::ternop(TernOp::Fma, *x, *y, c);
                }
                (a, b) => return ScalarExpr::binop(op, a, b),
            }
        }
        ScalarExpr::binop(op, a, b)
    }
}

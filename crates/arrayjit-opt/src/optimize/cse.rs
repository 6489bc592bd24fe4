//! Common-subexpression elimination within each statement: an operation tree that occurs more
//! than once in a statement's value is computed once into a local and read back.

use std::collections::HashMap;

use arrayjit_ir::low_level::{LowLevel, ScalarExpr, ScopeId};
use arrayjit_ir::ops::{BinOp, TernOp, UnOp};
use arrayjit_ir::prec::Prec;

/// Eliminates repeated subexpressions in every statement's value.
pub(super) fn eliminate_common_subexpressions(code: LowLevel) -> LowLevel {
    code.map_values(&mut cse_value)
}

/// The structure of a pure operation tree, with its operands by interned number: two trees
/// get the same number exactly when they are equal, at O(1) per node.
#[derive(Hash, PartialEq, Eq)]
enum Shape {
    /// A leaf (array read, constant, index), by its printed form.
    Leaf(String),
    Unop(UnOp, u32),
    Binop(BinOp, u32, u32),
    Ternop(TernOp, u32, u32, u32),
}

/// Numbers of the trees of one statement value, in pre-order: each node's number (`None` for
/// trees that involve locals: their values depend on where they are evaluated), whether it is
/// an operation, and its subtree's length in the order.
#[derive(Default)]
struct Numbering {
    shapes: HashMap<Shape, u32>,
    preorder: Vec<(Option<u32>, bool, usize)>,
    /// Occurrences of each numbered operation tree.
    counts: HashMap<u32, usize>,
}

impl Numbering {
    fn intern(&mut self, shape: Shape) -> u32 {
        let next = self.shapes.len() as u32;
        *self.shapes.entry(shape).or_insert(next)
    }

    fn number(&mut self, e: &ScalarExpr) -> Option<u32> {
        let at = self.preorder.len();
        self.preorder.push((None, false, 1));
        let child = |n: &mut Self, c: &ScalarExpr| n.number(c);
        let (shape, is_op) = match e {
            ScalarExpr::LocalScope { .. } | ScalarExpr::GetLocal(_) => (None, false),
            ScalarExpr::Unop(op, a) => (child(self, a).map(|a| Shape::Unop(*op, a)), true),
            ScalarExpr::Binop(op, a, b) => {
                let a = child(self, a);
                let b = child(self, b);
                (a.zip(b).map(|(a, b)| Shape::Binop(*op, a, b)), true)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = child(self, a);
                let b = child(self, b);
                let c = child(self, c);
                let abc = a.zip(b).zip(c);
                (abc.map(|((a, b), c)| Shape::Ternop(*op, a, b, c)), true)
            }
            leaf => (Some(Shape::Leaf(format!("{leaf:?}"))), false),
        };
        let id = shape.map(|s| self.intern(s));
        if is_op && let Some(id) = id {
            *self.counts.entry(id).or_insert(0) += 1;
        }
        self.preorder[at] = (id, is_op, self.preorder.len() - at);
        id
    }
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
    let mut numbering = Numbering::default();
    numbering.number(&value);
    if numbering.counts.values().all(|&n| n < 2) {
        return value;
    }
    let mut rewriter = Rewriter {
        numbering: &numbering,
        prec,
        at: 0,
        assigned: HashMap::new(),
    };
    rewriter.rewrite(value)
}

/// Replaces repeated trees, in evaluation order: the first occurrence computes the local, the
/// later ones read it.
struct Rewriter<'a> {
    numbering: &'a Numbering,
    prec: Prec,
    /// The pre-order position of the tree being rewritten.
    at: usize,
    assigned: HashMap<u32, ScopeId>,
}

impl Rewriter<'_> {
    fn rewrite(&mut self, e: ScalarExpr) -> ScalarExpr {
        let (id, is_op, len) = self.numbering.preorder[self.at];
        if is_op
            && let Some(id) = id
            && self.numbering.counts[&id] >= 2
        {
            self.at += len;
            if let Some(local) = self.assigned.get(&id) {
                return ScalarExpr::GetLocal(*local);
            }
            let local = ScopeId::fresh(self.prec);
            self.assigned.insert(id, local);
            return ScalarExpr::LocalScope {
                id: local,
                body: Box::new(LowLevel::SetLocal(local, e)),
            };
        }
        self.at += 1;
        match e {
            ScalarExpr::Unop(op, a) => ScalarExpr::unop(op, self.rewrite(*a)),
            ScalarExpr::Binop(op, a, b) => {
                let a = self.rewrite(*a);
                ScalarExpr::binop(op, a, self.rewrite(*b))
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.rewrite(*a);
                let b = self.rewrite(*b);
                ScalarExpr::ternop(op, a, b, self.rewrite(*c))
            }
            e => e,
        }
    }
}

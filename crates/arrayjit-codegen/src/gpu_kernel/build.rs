//! Constructors of the kernel tree the kernel shapes are written with: variables, integer
//! arithmetic that folds the additions of 0 and products by 1 offsets bring, comparisons,
//! declarations and loops.

use std::ops::{Add, Div, Mul, Rem, Sub};

use super::{Arith, Expr, Stmt, Ty};

pub(super) fn var(name: &str) -> Expr<'static> {
    Expr::Var(name.to_string())
}

/// The invocation's index in the launch, its group's, and its index in the group.
pub(super) fn launch_index() -> Expr<'static> {
    var("aj_g")
}
pub(super) fn group_index() -> Expr<'static> {
    var("aj_grp")
}
pub(super) fn thread_index() -> Expr<'static> {
    var("aj_t")
}

impl From<i64> for Expr<'_> {
    fn from(v: i64) -> Self {
        Expr::Int(v)
    }
}

impl From<usize> for Expr<'_> {
    fn from(v: usize) -> Self {
        Expr::Int(v as i64)
    }
}

impl From<u64> for Expr<'_> {
    fn from(v: u64) -> Self {
        Expr::Int(v as i64)
    }
}

impl From<u32> for Expr<'_> {
    fn from(v: u32) -> Self {
        Expr::Int(v as i64)
    }
}

/// `a op b`, without the additions of 0 and the products by 1 that offsets and strides bring.
pub(super) fn folded<'a>(op: Arith, a: Expr<'a>, b: Expr<'a>) -> Expr<'a> {
    match (op, &a, &b) {
        (Arith::Add, Expr::Int(x), Expr::Int(y)) => Expr::Int(x + y),
        (Arith::Add, _, Expr::Int(0)) | (Arith::Mul | Arith::Div, _, Expr::Int(1)) => a,
        (Arith::Add, Expr::Int(0), _) | (Arith::Mul, Expr::Int(1), _) => b,
        _ => Expr::Arith(op, Box::new(a), Box::new(b)),
    }
}

macro_rules! arith_op {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<'a, T: Into<Expr<'a>>> $trait<T> for Expr<'a> {
            type Output = Expr<'a>;
            fn $method(self, other: T) -> Expr<'a> {
                folded($op, self, other.into())
            }
        }
    };
}
arith_op!(Add, add, Arith::Add);
arith_op!(Sub, sub, Arith::Sub);
arith_op!(Mul, mul, Arith::Mul);
arith_op!(Div, div, Arith::Div);
arith_op!(Rem, rem, Arith::Rem);

impl<'a> Expr<'a> {
    pub(super) fn cmp(self, op: Arith, other: impl Into<Expr<'a>>) -> Expr<'a> {
        Expr::Arith(op, Box::new(self), Box::new(other.into()))
    }
    pub(super) fn lt(self, other: impl Into<Expr<'a>>) -> Expr<'a> {
        self.cmp(Arith::Lt, other)
    }
    pub(super) fn ge(self, other: impl Into<Expr<'a>>) -> Expr<'a> {
        self.cmp(Arith::Ge, other)
    }
    pub(super) fn equals(self, other: impl Into<Expr<'a>>) -> Expr<'a> {
        self.cmp(Arith::Eq, other)
    }
    pub(super) fn and(self, other: Expr<'a>) -> Expr<'a> {
        self.cmp(Arith::And, other)
    }
    pub(super) fn item(array: &str, index: Expr<'a>) -> Expr<'a> {
        Expr::Item(array.to_string(), Box::new(index))
    }
}

pub(super) fn let_<'a>(name: &str, ty: Ty, value: Expr<'a>) -> Stmt<'a> {
    Stmt::Let {
        name: name.into(),
        ty,
        value,
        mutable: false,
        binds: None,
    }
}

pub(super) fn let_mut<'a>(name: &str, ty: Ty, value: Expr<'a>) -> Stmt<'a> {
    Stmt::Let {
        name: name.into(),
        ty,
        value,
        mutable: true,
        binds: None,
    }
}

pub(super) fn assign<'a>(place: Expr<'a>, value: impl Into<Expr<'a>>) -> Stmt<'a> {
    Stmt::Assign(place, value.into())
}

pub(super) fn array(name: &str, ty: Ty, len: usize, shared: bool) -> Stmt<'static> {
    Stmt::Array {
        name: name.into(),
        ty,
        len,
        shared,
    }
}

/// `for (var = from; var < to; var += step)`.
pub(super) fn range<'a>(
    name: &str,
    ty: Ty,
    from: impl Into<Expr<'a>>,
    to: impl Into<Expr<'a>>,
    step: i64,
    body: Vec<Stmt<'a>>,
) -> Stmt<'a> {
    Stmt::For {
        var: name.into(),
        ty,
        from: from.into(),
        cond: var(name).lt(to),
        next: var(name) + step,
        unroll: false,
        binds: None,
        body,
    }
}

/// `for (var = 0; var < n; ++var)`, unrolled.
pub(super) fn unrolled<'a>(name: &str, n: usize, body: Vec<Stmt<'a>>) -> Stmt<'a> {
    let mut l = range(name, Ty::Int, 0i64, n, 1, body);
    if let Stmt::For { unroll, .. } = &mut l {
        *unroll = true;
    }
    l
}

/// A loop whose variable stands for an IR iterator in its body.
pub(super) fn bound_to(mut l: Stmt<'_>, sym: arrayjit_ir::Symbol) -> Stmt<'_> {
    if let Stmt::For { binds, .. } = &mut l {
        *binds = Some(sym);
    }
    l
}

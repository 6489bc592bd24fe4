//! Scalar operations of the IR (unary, binary, ternary) and their exact semantics per precision,
//! which the interpreter implements and every backend must reproduce.
//!
//! Semantics: float operations are computed in the node's compute precision (`f32` for the 16-bit
//! floats) and rounded to it after each operation. Integer operations wrap around on overflow;
//! division and remainder by zero give 0; conversions from float to integer truncate toward zero,
//! saturate at the type's limits and map NaN to 0. Comparisons and logical operations give 1 or 0.

use std::fmt;

use crate::prec::Prec;

/// A unary operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum UnOp {
    Identity,
    Relu,
    /// Clamps to `[0, 1]`.
    Satur01,
    Exp,
    Exp2,
    Log,
    Log2,
    Sin,
    Cos,
    Sqrt,
    /// `1 / x`.
    Recip,
    /// `1 / sqrt(x)`.
    RecipSqrt,
    Neg,
    Tanh,
    Abs,
    /// Logical not: 1 if `x == 0`, else 0.
    Not,
    /// The error function `erf(x) = 2/√π ∫₀ˣ e^(−t²) dt` (GELU's exact form).
    Erf,
}

/// A binary operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum BinOp {
    /// Returns the first operand.
    Arg1,
    /// Returns the second operand (plain assignment when used as an accumulator).
    Arg2,
    Add,
    Sub,
    Mul,
    Div,
    /// `a` to the power `b`.
    Pow,
    /// `b` where `a > 0`, else 0 (the gradient gate of relu).
    ReluGate,
    Max,
    Min,
    /// Remainder with the sign of `a` (C `fmod` / `%`).
    Mod,
    /// `a < b`.
    Cmplt,
    /// `a == b`.
    Cmpeq,
    /// `a != b`.
    Cmpne,
    /// Both non-zero.
    And,
    /// Either non-zero.
    Or,
}

/// A ternary operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TernOp {
    /// `cond != 0 ? a : b`.
    Where,
    /// Fused multiply-add `a * b + c`.
    Fma,
}

/// A scalar value during interpretation: floats as `f64` (already rounded to their compute
/// precision), integers exactly as `i128`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A floating-point value.
    F(f64),
    /// An integer value.
    I(i128),
}

fn wrap_int(prec: Prec, x: i128) -> i128 {
    match prec {
        Prec::U8 => x as u8 as i128,
        Prec::U16 => x as u16 as i128,
        Prec::I32 => x as i32 as i128,
        Prec::U32 => x as u32 as i128,
        Prec::I64 => x as i64 as i128,
        Prec::U64 => x as u64 as i128,
        _ => x,
    }
}

fn saturate_float_to_int(prec: Prec, x: f64) -> i128 {
    match prec {
        Prec::U8 => x as u8 as i128,
        Prec::U16 => x as u16 as i128,
        Prec::I32 => x as i32 as i128,
        Prec::U32 => x as u32 as i128,
        Prec::I64 => x as i64 as i128,
        Prec::U64 => x as u64 as i128,
        _ => x as i128,
    }
}

impl Scalar {
    /// Converts to a value of compute precision `prec` (see the module docs for the rules).
    pub fn convert(self, prec: Prec) -> Scalar {
        let cp = prec.compute_prec();
        match (self, cp.is_float()) {
            (Scalar::F(x), true) => Scalar::F(cp.round_value(x)),
            (Scalar::I(i), true) => Scalar::F(cp.round_value(i as f64)),
            (Scalar::F(x), false) => Scalar::I(saturate_float_to_int(cp, x)),
            (Scalar::I(i), false) => Scalar::I(wrap_int(cp, i)),
        }
    }

    /// The value as `f64` (integers may lose precision beyond 2^53).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::F(x) => x,
            Scalar::I(i) => i as f64,
        }
    }

    fn truthy(self) -> bool {
        match self {
            Scalar::F(x) => x != 0.0,
            Scalar::I(i) => i != 0,
        }
    }
}

fn bool_value(prec: Prec, b: bool) -> Scalar {
    Scalar::I(b as i128).convert(prec)
}

/// Evaluates a float operation at the precision of `prec` (`f32` or `f64`).
fn float_op(prec: Prec, f32op: impl Fn(f32) -> f32, f64op: impl Fn(f64) -> f64, x: f64) -> f64 {
    if prec == Prec::F32 {
        f32op(x as f32) as f64
    } else {
        f64op(x)
    }
}

impl UnOp {
    /// The operation's name as printed in the IR.
    pub fn name(self) -> &'static str {
        use UnOp::*;
        match self {
            Identity => "id",
            Relu => "relu",
            Satur01 => "satur01",
            Exp => "exp",
            Exp2 => "exp2",
            Log => "log",
            Log2 => "log2",
            Sin => "sin",
            Cos => "cos",
            Sqrt => "sqrt",
            Recip => "recip",
            RecipSqrt => "recip_sqrt",
            Neg => "neg",
            Tanh => "tanh",
            Abs => "abs",
            Not => "not",
            Erf => "erf",
        }
    }

    /// Applies the operation to a value already in compute precision `prec`.
    pub fn apply(self, prec: Prec, x: Scalar) -> Scalar {
        use UnOp::*;
        let cp = prec.compute_prec();
        match x {
            Scalar::F(v) => {
                let r = match self {
                    Identity => v,
                    Relu => {
                        if v > 0.0 {
                            v
                        } else {
                            0.0
                        }
                    }
                    Satur01 => v.clamp(0.0, 1.0),
                    Exp => float_op(cp, f32::exp, f64::exp, v),
                    Exp2 => float_op(cp, f32::exp2, f64::exp2, v),
                    Log => float_op(cp, f32::ln, f64::ln, v),
                    Log2 => float_op(cp, f32::log2, f64::log2, v),
                    Sin => float_op(cp, f32::sin, f64::sin, v),
                    Cos => float_op(cp, f32::cos, f64::cos, v),
                    Sqrt => float_op(cp, f32::sqrt, f64::sqrt, v),
                    Recip => float_op(cp, |a| 1.0 / a, |a| 1.0 / a, v),
                    RecipSqrt => float_op(cp, |a| 1.0 / a.sqrt(), |a| 1.0 / a.sqrt(), v),
                    Neg => -v,
                    Tanh => float_op(cp, f32::tanh, f64::tanh, v),
                    Erf => float_op(cp, libm::erff, libm::erf, v),
                    Abs => v.abs(),
                    Not => (v == 0.0) as i32 as f64,
                };
                Scalar::F(cp.round_value(r))
            }
            Scalar::I(i) => {
                let via_float = |f: fn(f64) -> f64| Scalar::F(f(i as f64)).convert(cp);
                match self {
                    Identity => Scalar::I(i),
                    Relu => Scalar::I(i.max(0)),
                    Satur01 => Scalar::I(i.clamp(0, 1)),
                    Exp => via_float(f64::exp),
                    Exp2 => via_float(f64::exp2),
                    Log => via_float(f64::ln),
                    Log2 => via_float(f64::log2),
                    Sin => via_float(f64::sin),
                    Cos => via_float(f64::cos),
                    Sqrt => via_float(f64::sqrt),
                    Tanh => via_float(f64::tanh),
                    Erf => via_float(libm::erf),
                    RecipSqrt => via_float(|a| 1.0 / a.sqrt()),
                    Recip => Scalar::I(if i == 0 { 0 } else { wrap_int(cp, 1 / i) }),
                    Neg => Scalar::I(wrap_int(cp, -i)),
                    Abs => Scalar::I(wrap_int(cp, i.abs())),
                    Not => Scalar::I((i == 0) as i128),
                }
            }
        }
    }
}

/// Integer power with wrapping; negative exponents give 0 unless the base is ±1.
pub fn int_pow(prec: Prec, base: i128, exp: i128) -> i128 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    wrap_int(prec, -1)
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i128, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            result = wrap_int(prec, result.wrapping_mul(b));
        }
        b = wrap_int(prec, b.wrapping_mul(b));
        e >>= 1;
    }
    result
}

impl BinOp {
    /// The operation's name as printed in the IR.
    pub fn name(self) -> &'static str {
        use BinOp::*;
        match self {
            Arg1 => "arg1",
            Arg2 => "arg2",
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Pow => "**",
            ReluGate => "relu_gate",
            Max => "max",
            Min => "min",
            Mod => "%",
            Cmplt => "<",
            Cmpeq => "==",
            Cmpne => "!=",
            And => "&&",
            Or => "||",
        }
    }

    /// Whether the IR prints the operation infix.
    pub fn is_infix(self) -> bool {
        use BinOp::*;
        matches!(
            self,
            Add | Sub | Mul | Div | Pow | Mod | Cmplt | Cmpeq | Cmpne | And | Or
        )
    }

    /// The neutral element of the operation used as an accumulator (what a reduction starts
    /// from): 0 for `+ - || arg2`, 1 for `* && /`, the lowest value for `max`, the highest for
    /// `min`.
    pub fn neutral_element(self) -> f64 {
        use BinOp::*;
        match self {
            Mul | Div | And | Pow => 1.0,
            Max => f64::NEG_INFINITY,
            Min => f64::INFINITY,
            _ => 0.0,
        }
    }

    /// Applies the operation to two values already in compute precision `prec`.
    pub fn apply(self, prec: Prec, a: Scalar, b: Scalar) -> Scalar {
        use BinOp::*;
        let cp = prec.compute_prec();
        match self {
            Arg1 => return a,
            Arg2 => return b,
            Cmplt | Cmpeq | Cmpne => {
                let r = match (a, b) {
                    (Scalar::I(x), Scalar::I(y)) => match self {
                        Cmplt => x < y,
                        Cmpeq => x == y,
                        _ => x != y,
                    },
                    _ => {
                        let (x, y) = (a.to_f64(), b.to_f64());
                        match self {
                            Cmplt => x < y,
                            Cmpeq => x == y,
                            _ => x != y,
                        }
                    }
                };
                return bool_value(cp, r);
            }
            And => return bool_value(cp, a.truthy() && b.truthy()),
            Or => return bool_value(cp, a.truthy() || b.truthy()),
            _ => {}
        }
        match (a, b) {
            (Scalar::I(x), Scalar::I(y)) => Scalar::I(wrap_int(
                cp,
                match self {
                    Add => x.wrapping_add(y),
                    Sub => x.wrapping_sub(y),
                    Mul => x.wrapping_mul(y),
                    Div => {
                        if y == 0 {
                            0
                        } else {
                            x.wrapping_div(y)
                        }
                    }
                    Mod => {
                        if y == 0 {
                            0
                        } else {
                            x.wrapping_rem(y)
                        }
                    }
                    Pow => int_pow(cp, x, y),
                    ReluGate => {
                        if x > 0 {
                            y
                        } else {
                            0
                        }
                    }
                    Max => x.max(y),
                    Min => x.min(y),
                    _ => unreachable!("handled above"),
                },
            )),
            _ => {
                let (x, y) = (a.to_f64(), b.to_f64());
                let r = match self {
                    Add => x + y,
                    Sub => x - y,
                    Mul => x * y,
                    Div => x / y,
                    Mod => x % y,
                    Pow => float_op(cp, |p| p.powf(y as f32), |p| p.powf(y), x),
                    ReluGate => {
                        if x > 0.0 {
                            y
                        } else {
                            0.0
                        }
                    }
                    Max => x.max(y),
                    Min => x.min(y),
                    _ => unreachable!("handled above"),
                };
                Scalar::F(cp.round_value(r))
            }
        }
    }
}

impl TernOp {
    /// The operation's name as printed in the IR.
    pub fn name(self) -> &'static str {
        match self {
            TernOp::Where => "where",
            TernOp::Fma => "fma",
        }
    }

    /// Applies the operation to values already in compute precision `prec`.
    pub fn apply(self, prec: Prec, a: Scalar, b: Scalar, c: Scalar) -> Scalar {
        let cp = prec.compute_prec();
        match self {
            TernOp::Where => {
                if a.truthy() {
                    b
                } else {
                    c
                }
            }
            TernOp::Fma => match (a, b, c) {
                (Scalar::I(x), Scalar::I(y), Scalar::I(z)) => {
                    Scalar::I(wrap_int(cp, x.wrapping_mul(y).wrapping_add(z)))
                }
                _ => {
                    let (x, y, z) = (a.to_f64(), b.to_f64(), c.to_f64());
                    Scalar::F(float_op(
                        cp,
                        |p| p.mul_add(y as f32, z as f32),
                        |p| p.mul_add(y, z),
                        x,
                    ))
                }
            },
        }
    }
}

impl fmt::Display for UnOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
impl fmt::Display for BinOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
impl fmt::Display for TernOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics_wrap_and_guard_division() {
        let i = |x| Scalar::I(x);
        assert_eq!(BinOp::Add.apply(Prec::U8, i(250), i(10)), i(4));
        assert_eq!(BinOp::Div.apply(Prec::I32, i(7), i(0)), i(0));
        assert_eq!(
            BinOp::Div.apply(Prec::I32, i(i32::MIN as i128), i(-1)),
            i(i32::MIN as i128)
        );
        assert_eq!(BinOp::Mod.apply(Prec::I32, i(-7), i(3)), i(-1));
        assert_eq!(BinOp::Pow.apply(Prec::I64, i(3), i(4)), i(81));
        assert_eq!(UnOp::Neg.apply(Prec::U32, i(1)), i(u32::MAX as i128));
        assert_eq!(Scalar::F(1e20).convert(Prec::I32), i(i32::MAX as i128));
        assert_eq!(Scalar::F(f64::NAN).convert(Prec::U8), i(0));
    }

    #[test]
    fn float_semantics_round_to_compute_precision() {
        let f = |x| Scalar::F(x);
        assert_eq!(
            BinOp::Add.apply(Prec::F32, f(0.1f32 as f64), f(0.2f32 as f64)),
            f((0.1f32 + 0.2f32) as f64)
        );
        assert_eq!(BinOp::Max.apply(Prec::F64, f(f64::NAN), f(1.0)), f(1.0));
        assert_eq!(BinOp::Cmplt.apply(Prec::F32, f(1.0), f(2.0)), f(1.0));
        assert_eq!(
            TernOp::Where.apply(Prec::F32, f(0.0), f(1.0), f(2.0)),
            f(2.0)
        );
        assert_eq!(BinOp::Max.neutral_element(), f64::NEG_INFINITY);
        assert_eq!(
            Scalar::F(f64::NEG_INFINITY).convert(Prec::I32),
            Scalar::I(i32::MIN as i128)
        );
    }
}

//! Scalar operations, literals and conversions in WGSL, with the IR's semantics (see
//! `arrayjit_ir::ops`): what WGSL leaves undefined or defines otherwise (integer division by
//! zero, float-to-integer conversion, `pow` of a negative base) goes through helpers.

use arrayjit_ir::ops::Scalar;
use arrayjit_ir::{BinOp, Prec, UnOp};

use super::PassRenderer;

/// A helper function a pass calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Helper {
    /// Saturating `f32` to an integer type of 32 or 64 bits (NaN gives 0).
    F32ToInt(Prec),
    PowF32,
    /// Integer power with wrapping (negative exponents: 0 unless the base is ±1).
    PowInt(Prec),
    F32ToBf16,
    /// `erf` in `f32` (WGSL has none).
    ErfF32,
    /// The random op's uniform value (`arrayjit_ir::random::device_uniform`) in `f32`, for
    /// positions below 2^32 (WGSL indices are 32-bit).
    PhiloxUniform,
}

/// How a precision WGSL has no type for is packed into 32-bit words: elements per word's
/// shift (`index >> shift` is the word), bits per element, and the element mask.
#[derive(Clone, Copy, Debug)]
pub(super) struct Packing {
    pub(super) shift: u32,
    pub(super) bits: u32,
    pub(super) mask: u32,
}

/// The packing of `p`, if its elements share 32-bit words (bfloat16 and 16-bit unsigned: two
/// per word; 8-bit unsigned: four). Such arrays are `array<atomic<u32>>`: invocations writing
/// neighbouring elements of one word clear and set only their own bits.
pub(super) fn packing(p: Prec) -> Option<Packing> {
    match p {
        Prec::Bf16 | Prec::U16 => Some(Packing {
            shift: 1,
            bits: 16,
            mask: 0xffff,
        }),
        Prec::U8 => Some(Packing {
            shift: 2,
            bits: 8,
            mask: 0xff,
        }),
        _ => None,
    }
}

/// The WGSL element type of an array of precision `p`.
pub(super) fn storage_type(p: Prec) -> &'static str {
    match p {
        _ if packing(p).is_some() => "atomic<u32>",
        Prec::F16 => "f16",
        Prec::I32 => "i32",
        Prec::U32 => "u32",
        Prec::I64 => "i64",
        Prec::U64 => "u64",
        _ => "f32",
    }
}

/// The WGSL type a precision computes in (8- and 16-bit unsigned integers in `u32`, wrapped
/// after every operation).
pub(super) fn compute_type(p: Prec) -> &'static str {
    match p.compute_prec() {
        Prec::I32 => "i32",
        Prec::U32 | Prec::U8 | Prec::U16 => "u32",
        Prec::I64 => "i64",
        Prec::U64 => "u64",
        _ => "f32",
    }
}

/// `e` wrapped to the width of compute precision `p` (unchanged but for 8- and 16-bit
/// unsigned integers).
pub(super) fn narrow(p: Prec, e: String) -> String {
    match narrow_mask(p) {
        Some(m) => format!("({e} & {m}u)"),
        None => e,
    }
}

/// The mask that wraps a value of compute precision `p` to its width, for the narrow
/// unsigned integers.
pub(super) fn narrow_mask(p: Prec) -> Option<u32> {
    match p.compute_prec() {
        Prec::U8 => Some(0xff),
        Prec::U16 => Some(0xffff),
        _ => None,
    }
}

/// A literal of compute precision `p` for the IR constant `c` (converted as the interpreter
/// converts constants).
pub(super) fn literal(p: Prec, c: f64) -> String {
    let cp = p.compute_prec();
    match Scalar::F(c).convert(cp) {
        Scalar::F(v) => {
            let v = v as f32;
            if v.is_nan() {
                "bitcast<f32>(0x7fc00000u)".into()
            } else if v.is_infinite() {
                let bits = if v > 0.0 {
                    "0x7f800000u"
                } else {
                    "0xff800000u"
                };
                format!("bitcast<f32>({bits})")
            } else {
                format!("({v:e}f)")
            }
        }
        Scalar::I(i) => match cp {
            Prec::U32 | Prec::U8 | Prec::U16 => format!("{}u", i as u32),
            Prec::U64 => format!("{}lu", i as u64),
            Prec::I64 if i == i64::MIN as i128 => "(-9223372036854775807li - 1li)".into(),
            Prec::I64 => format!("({}li)", i as i64),
            _ if i == i32::MIN as i128 => "(-2147483647i - 1i)".into(),
            _ => format!("({}i)", i as i32),
        },
    }
}

impl PassRenderer<'_> {
    pub(super) fn unop(&mut self, op: UnOp, cp: Prec, a: &str) -> String {
        let e = self.unop_wide(op, cp, a);
        narrow(cp, e)
    }

    fn unop_wide(&mut self, op: UnOp, cp: Prec, a: &str) -> String {
        let t = compute_type(cp);
        let one_zero = |cond: String| format!("select({t}(0), {t}(1), {cond})");
        if cp.is_float() {
            return match op {
                UnOp::Identity => a.to_string(),
                UnOp::Relu => format!("select(0.0f, {a}, {a} > 0.0f)"),
                UnOp::Satur01 => format!("min(max({a}, 0.0f), 1.0f)"),
                UnOp::Exp => format!("exp({a})"),
                UnOp::Exp2 => format!("exp2({a})"),
                UnOp::Log => format!("log({a})"),
                UnOp::Log2 => format!("log2({a})"),
                UnOp::Sin => format!("sin({a})"),
                UnOp::Cos => format!("cos({a})"),
                UnOp::Sqrt => format!("sqrt({a})"),
                UnOp::Recip => format!("(1.0f / {a})"),
                UnOp::RecipSqrt => format!("(1.0f / sqrt({a}))"),
                UnOp::Neg => format!("(-{a})"),
                UnOp::Tanh => format!("tanh({a})"),
                UnOp::Erf => {
                    self.helpers.insert(Helper::ErfF32);
                    format!("{t}(aj_erf_f32(f32({a})))")
                }
                UnOp::Abs => format!("abs({a})"),
                UnOp::Not => one_zero(format!("{a} == 0.0f")),
            };
        }
        let signed = cp.is_signed_integer();
        let via_float = |s: &mut Self, f: &str| {
            let x = format!("{f}(f32({a}))");
            s.convert(&x, Prec::F32, cp)
        };
        match op {
            UnOp::Identity => a.to_string(),
            UnOp::Relu if signed => format!("max({a}, {t}(0))"),
            UnOp::Relu => a.to_string(),
            UnOp::Satur01 => format!("min(max({a}, {t}(0)), {t}(1))"),
            UnOp::Exp => via_float(self, "exp"),
            UnOp::Exp2 => via_float(self, "exp2"),
            UnOp::Log => via_float(self, "log"),
            UnOp::Log2 => via_float(self, "log2"),
            UnOp::Sin => via_float(self, "sin"),
            UnOp::Cos => via_float(self, "cos"),
            UnOp::Sqrt => via_float(self, "sqrt"),
            UnOp::Tanh => via_float(self, "tanh"),
            UnOp::Erf => {
                self.helpers.insert(Helper::ErfF32);
                via_float(self, "aj_erf_f32")
            }
            UnOp::RecipSqrt => via_float(self, "inverseSqrt"),
            UnOp::Recip => format!("select({t}(0), {t}(1) / {a}, {a} != {t}(0))"),
            UnOp::Neg => format!("({t}(0) - {a})"),
            UnOp::Abs if signed => format!("abs({a})"),
            UnOp::Abs => a.to_string(),
            UnOp::Not => one_zero(format!("{a} == {t}(0)")),
        }
    }

    pub(super) fn binop(&mut self, op: BinOp, cp: Prec, a: &str, b: &str) -> String {
        let e = self.binop_wide(op, cp, a, b);
        narrow(cp, e)
    }

    fn binop_wide(&mut self, op: BinOp, cp: Prec, a: &str, b: &str) -> String {
        let t = compute_type(cp);
        let one_zero = |cond: String| format!("select({t}(0), {t}(1), {cond})");
        let float = cp.is_float();
        match op {
            BinOp::Arg1 => a.to_string(),
            BinOp::Arg2 => b.to_string(),
            BinOp::Add => format!("({a} + {b})"),
            BinOp::Sub => format!("({a} - {b})"),
            BinOp::Mul => format!("({a} * {b})"),
            BinOp::Div if float => format!("({a} / {b})"),
            BinOp::Mod if float => format!("({a} % {b})"),
            // WGSL gives `a` for a division by zero; the IR gives 0.
            BinOp::Div => format!("select({a} / {b}, {t}(0), {b} == {t}(0))"),
            BinOp::Mod => format!("select({a} % {b}, {t}(0), {b} == {t}(0))"),
            BinOp::Pow => {
                let h = if cp.is_float() {
                    Helper::PowF32
                } else {
                    Helper::PowInt(int_type_prec(cp))
                };
                self.helpers.insert(h);
                format!("aj_pow_{t}({a}, {b})")
            }
            BinOp::ReluGate => format!("select({t}(0), {b}, {a} > {t}(0))"),
            BinOp::Max => format!("max({a}, {b})"),
            BinOp::Min => format!("min({a}, {b})"),
            BinOp::Cmplt => one_zero(format!("{a} < {b}")),
            BinOp::Cmpeq => one_zero(format!("{a} == {b}")),
            BinOp::Cmpne => one_zero(format!("{a} != {b}")),
            BinOp::And => one_zero(format!("({a} != {t}(0)) && ({b} != {t}(0))")),
            BinOp::Or => one_zero(format!("({a} != {t}(0)) || ({b} != {t}(0))")),
        }
    }
}

/// The 32- or 64-bit integer precision whose WGSL type computes `p`.
pub(super) fn int_type_prec(p: Prec) -> Prec {
    match compute_type(p) {
        "i32" => Prec::I32,
        "i64" => Prec::I64,
        "u64" => Prec::U64,
        _ => Prec::U32,
    }
}

/// The name of a helper for a type: `aj_{stem}_{type}`.
pub(super) fn helper_name(stem: &str, p: Prec) -> String {
    format!("aj_{stem}_{}", compute_type(p))
}

/// The WGSL of a helper function.
pub(super) fn helper_source(h: Helper) -> String {
    match h {
        Helper::F32ToInt(p) => {
            let t = compute_type(p);
            // Limits as f32 values and as literals of the type (2^31, 2^32, 2^63, 2^64).
            let (lo, lo_value, hi, hi_value) = match p {
                Prec::I32 => (
                    "-2147483648.0f",
                    "(-2147483647i - 1i)",
                    "2147483648.0f",
                    "2147483647i",
                ),
                Prec::I64 => (
                    "-9223372036854775808.0f",
                    "(-9223372036854775807li - 1li)",
                    "9223372036854775808.0f",
                    "9223372036854775807li",
                ),
                Prec::U64 => (
                    "0.0f",
                    "0lu",
                    "18446744073709551616.0f",
                    "18446744073709551615lu",
                ),
                _ => ("0.0f", "0u", "4294967296.0f", "4294967295u"),
            };
            format!(
                // NaN is tested on the bits: shader compilers may assume `x != x` is false.
                "fn aj_f32_to_{t}(x: f32) -> {t} {{\n  \
                 if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) {{ return {t}(0); }}\n  \
                 if (x >= {hi}) {{ return {hi_value}; }}\n  if (x <= {lo}) {{ return {lo_value}; }}\n  \
                 return {t}(x);\n}}\n"
            )
        }
        Helper::PowInt(p) => {
            let t = compute_type(p);
            let negative = if p.is_signed_integer() {
                format!(
                    "  if (y < {t}(0)) {{\n    if (x == {t}(1)) {{ return {t}(1); }}\n    \
                     if (x == {t}(-1)) {{ return select({t}(-1), {t}(1), (y & {t}(1)) == {t}(0)); }}\n    \
                     return {t}(0);\n  }}\n"
                )
            } else {
                String::new()
            };
            format!(
                "fn aj_pow_{t}(x: {t}, y: {t}) -> {t} {{\n{negative}  var r: {t} = {t}(1); var b: {t} = x; \
                 var e: {t} = y;\n  loop {{\n    if (e == {t}(0)) {{ break; }}\n    \
                 if ((e & {t}(1)) == {t}(1)) {{ r = r * b; }}\n    b = b * b; e = e >> 1u;\n  }}\n  \
                 return r;\n}}\n"
            )
        }
        // WGSL's pow is undefined for a negative base: odd and even integer exponents are
        // handled here, as C's pow does.
        Helper::PowF32 => {
            "fn aj_pow_f32(x: f32, y: f32) -> f32 {\n  if (y == 0.0f) { return 1.0f; }\n  \
             if (x >= 0.0f) { return pow(x, y); }\n  \
             if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u || \
             (bitcast<u32>(y) & 0x7fffffffu) > 0x7f800000u) { return x + y; }\n  \
             if (trunc(y) != y) { return bitcast<f32>(0x7fc00000u); }\n  \
             let m = pow(-x, y);\n  if (abs(y) < 16777216.0f && (i32(abs(y)) & 1) == 1) \
             { return -m; }\n  return m;\n}\n"
                .into()
        }
        // Round to nearest even, as the interpreter rounds; NaN stays a (quiet) NaN.
        Helper::F32ToBf16 => "fn aj_f32_to_bf16(x: f32) -> u32 {\n  let b = bitcast<u32>(x);\n  \
             if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }\n  \
             return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;\n}\n"
            .into(),
        // Philox4x32-10 as in the C helper; WGSL has no 64-bit product, so the high word of
        // each 32x32 product is assembled from 16-bit halves (no partial sum overflows).
        Helper::PhiloxUniform => "fn aj_mulhi(a: u32, b: u32) -> u32 {\n  \
             let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;\n  \
             let cross = ((al * bl) >> 16u) + ((ah * bl) & 0xffffu) + al * bh;\n  \
             return ah * bh + ((ah * bl) >> 16u) + (cross >> 16u);\n}\n\
             fn aj_philox_uniform(k: vec2<u32>, stream: u32, index: u32, step: u32) -> f32 {\n  \
             var c = vec4<u32>(index, 0u, stream, step);\n  var key = k;\n  \
             for (var r = 0; r < 10; r++) {\n    \
             let n = vec4<u32>(aj_mulhi(0xCD9E8D57u, c.z) ^ c.y ^ key.x, 0xCD9E8D57u * c.z, \
             aj_mulhi(0xD2511F53u, c.x) ^ c.w ^ key.y, 0xD2511F53u * c.x);\n    \
             c = n;\n    key = key + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);\n  }\n  \
             return f32(c.x >> 8u) * 5.9604644775390625e-8f;\n}\n"
            .into(),
        // |x| < 0.5: the Taylor series to x⁹ (relative error under 1e-6); beyond, Abramowitz and
        // Stegun 7.1.26 (absolute error under 1.5e-7), odd in x.
        Helper::ErfF32 => {
            "fn aj_erf_f32(x: f32) -> f32 {\n  let a = abs(x);\n  let x2 = x * x;\n  \
             let series = x * (1.1283791671f + x2 * (-0.3761263890f + x2 * (0.1128379167f + x2 * \
             (-0.0268661706f + x2 * 0.0052239776f))));\n  \
             let t = 1.0f / (1.0f + 0.3275911f * a);\n  \
             let poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * \
             (-1.453152027f + t * 1.061405429f))));\n  \
             let tail = sign(x) * (1.0f - poly * exp(-x2));\n  \
             return select(tail, series, a < 0.5f);\n}\n"
                .into()
        }
    }
}

//! The syntax table of C-like languages: type names, math function names, literals and the
//! helper functions that give integer and 16-bit float operations arrayjit's exact semantics.
//! Renderers for C and CUDA C are driven by a [`CSyntax`] value.

use std::collections::BTreeSet;

use arrayjit_ir::ops::Scalar;
use arrayjit_ir::{BinOp, Prec, TernOp, UnOp};
use arrayjit_opt::schedule::gpu::MatrixKind;

use super::ptx;

/// What differs between C dialects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CSyntax {
    /// Lines at the top of every file.
    pub includes: Vec<String>,
    /// Qualifiers before an exported kernel's return type.
    pub kernel_prefix: String,
    /// Qualifiers of helper functions.
    pub helper_prefix: String,
    /// Qualifiers of the math and select helpers (`aj_exp_f32`, `aj_max_f32`, ...), which must
    /// be inlined into their loops for the loops to vectorize: a call the compiler keeps
    /// leaves its loop scalar, and gcc's inliner declines helpers it estimates large (with
    /// their `fmaf`s counted as calls, the `erf` was).
    pub math_helper_prefix: String,
    /// The `restrict` keyword of the dialect.
    pub restrict: String,
    /// Qualifiers of functions outlined from a kernel (chunks run by workers, statements of
    /// fused loops), which the compiler must compile on their own: inlined into their loop,
    /// a statement's loop can stop vectorizing because the compiler propagates values from
    /// the statements before it.
    pub outlined_prefix: String,
    /// Whether the dialect's compilers take per-function optimization pragmas (GCC's
    /// `#pragma GCC optimize`), used to compile light kernels faster.
    pub optimize_pragmas: bool,
}

impl CSyntax {
    /// Plain C99 for host compilers (gcc, clang).
    pub fn c() -> CSyntax {
        CSyntax {
            includes: vec![
                "#include <stdint.h>".into(),
                "#include <string.h>".into(),
                "#include <math.h>".into(),
            ],
            kernel_prefix: String::new(),
            helper_prefix: "static inline".into(),
            math_helper_prefix: "static inline __attribute__((always_inline))".into(),
            restrict: "restrict".into(),
            outlined_prefix: "static __attribute__((noinline))".into(),
            optimize_pragmas: true,
        }
    }
}

/// The C type used to store one element of a precision (16-bit floats as raw bits).
pub fn c_storage_type(p: Prec) -> &'static str {
    match p {
        Prec::U8 => "uint8_t",
        Prec::U16 | Prec::F16 | Prec::Bf16 => "uint16_t",
        Prec::I32 => "int32_t",
        Prec::U32 => "uint32_t",
        Prec::I64 => "int64_t",
        Prec::U64 => "uint64_t",
        Prec::F32 => "float",
        Prec::F64 => "double",
    }
}

/// The C type arithmetic in a precision is done in (see [`Prec::compute_prec`]).
pub fn c_compute_type(p: Prec) -> &'static str {
    c_storage_type(p.compute_prec())
}

/// A short suffix naming a compute precision in helper names.
pub fn prec_suffix(p: Prec) -> &'static str {
    p.compute_prec().name()
}

/// A helper function the rendered code calls; collected while rendering and defined once per
/// file, in a fixed order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Helper {
    /// `uint16_t` half bits to `float`.
    F16ToF32,
    /// `float` to half bits, round to nearest even.
    F32ToF16,
    /// `uint16_t` bfloat16 bits to `float`.
    Bf16ToF32,
    /// `float` to bfloat16 bits, round to nearest even.
    F32ToBf16,
    /// Saturating `double` to integer conversion (NaN gives 0).
    FloatToInt(Prec),
    /// A unary operation at a compute precision.
    Un(UnOp, Prec),
    /// A binary operation at a compute precision.
    Bin(BinOp, Prec),
    /// `where` at a compute precision: a function, so that both values are computed before
    /// the choice (see [`render_ternop`]).
    Where(Prec),
    /// The random op's uniform value (`arrayjit_ir::random::device_uniform`), as `float`.
    PhiloxUniform,
    /// CUDA's matrix-unit operations (`ldmatrix`, `mma.sync`, TF32 rounding) as inline PTX,
    /// for NVRTC; the CUDA emulation's header defines its own (warp-collective) versions.
    MatrixUnits,
    /// CUDA's 128-bit loads of four `f32` elements (`aj_load4`); the CUDA emulation copies
    /// the bytes.
    VectorLoads,
    /// sm_90's warpgroup operations besides the product: the async-proxy fence, `wgmma`'s
    /// fence, commit and wait, and shared-memory matrix descriptors; the CUDA emulation's
    /// header defines its own.
    Warpgroup,
    /// `AJ_DYNAMIC_SHARED(bytes)`: declares `aj_dynamic_shared`, the block's dynamic shared
    /// memory (`extern __shared__`, sized at launch, on a KiB boundary: a block finding it
    /// elsewhere traps rather than multiply wrongly); the CUDA emulation's is per-block storage
    /// of `bytes`, like its static shared arrays.
    DynamicShared,
    /// sm_90's tensor memory accelerator: the tensor map parameter type (`aj_tensor_map`),
    /// `mbarrier`s and bulk tensor copies of 1 to 5 axes (`c::tensor_copies`); the CUDA
    /// emulation's header defines its own.
    TensorCopies,
    /// One warpgroup product (`wgmma.mma_async`: `m64nNk16` of 16-bit factors, `m64nNk8` of
    /// TF32 ones) with the factors' layouts (result side contiguous, else `k`), as a function
    /// of the accumulators and the factors' first staged elements.
    Wgmma {
        /// The factors' kind.
        kind: MatrixKind,
        /// Columns (`N`).
        n: usize,
        /// The left and right factors are staged with the result side contiguous.
        side_major: [bool; 2],
        /// The staged depth of `k`: 32 or 64 elements.
        depth: usize,
    },
}

impl Helper {
    /// The name of a helper that is one function (its call sites name it).
    pub fn function_name(&self) -> String {
        match self {
            Helper::Wgmma {
                kind,
                n,
                side_major,
                depth,
            } => format!(
                "aj_wgmma_{kind}_m64n{n}k{}_{}{}_d{depth}",
                kind.fragment_depth(),
                ["k", "s"][usize::from(side_major[0])],
                ["k", "s"][usize::from(side_major[1])]
            ),
            other => format!("{other:?}"),
        }
    }
}

fn int_limits(p: Prec) -> (String, String) {
    match p {
        Prec::U8 => ("0".into(), "UINT8_MAX".into()),
        Prec::U16 => ("0".into(), "UINT16_MAX".into()),
        Prec::U32 => ("0".into(), "UINT32_MAX".into()),
        Prec::U64 => ("0".into(), "UINT64_MAX".into()),
        Prec::I32 => ("INT32_MIN".into(), "INT32_MAX".into()),
        _ => ("INT64_MIN".into(), "INT64_MAX".into()),
    }
}

/// Renders a constant of compute precision `p` (after arrayjit's conversion rules).
pub fn literal(p: Prec, c: f64) -> String {
    let cp = p.compute_prec();
    match Scalar::F(c).convert(cp) {
        Scalar::F(x) => {
            let suffix = if cp == Prec::F32 { "f" } else { "" };
            let cast = if cp == Prec::F32 {
                "(float)"
            } else {
                "(double)"
            };
            if x.is_nan() {
                format!("{cast}NAN")
            } else if x.is_infinite() {
                format!("{}{cast}INFINITY", if x < 0.0 { "-" } else { "" })
            } else if cp == Prec::F32 {
                format!("{:?}{suffix}", x as f32)
            } else {
                format!("{x:?}")
            }
        }
        Scalar::I(i) => match cp {
            Prec::I32 if i == i32::MIN as i128 => "INT32_MIN".into(),
            Prec::I64 if i == i64::MIN as i128 => "INT64_MIN".into(),
            Prec::I64 => format!("INT64_C({i})"),
            Prec::U64 => format!("UINT64_C({i})"),
            Prec::U32 => format!("{i}u"),
            Prec::I32 => format!("{i}"),
            _ => format!("(({}){i})", c_storage_type(cp)),
        },
    }
}

/// The C math function of a float unary operation (`None` for operations rendered otherwise).
fn float_fn(op: UnOp, p: Prec) -> Option<String> {
    let base = match op {
        UnOp::Exp => "exp",
        UnOp::Exp2 => "exp2",
        UnOp::Log => "log",
        UnOp::Log2 => "log2",
        UnOp::Sin => "sin",
        UnOp::Cos => "cos",
        UnOp::Sqrt => "sqrt",
        UnOp::Tanh => "tanh",
        UnOp::Erf => "erf",
        UnOp::Abs => "fabs",
        _ => return None,
    };
    Some(format!("{base}{}", if p == Prec::F32 { "f" } else { "" }))
}

fn float_fn2(base: &str, p: Prec) -> String {
    format!("{base}{}", if p == Prec::F32 { "f" } else { "" })
}

/// The argument reduction and polynomial of the f32 exponential of `x`, shared by `aj_exp_f32`
/// and `aj_exp_normal_f32`: `p` = e^r with r = x − n·ln 2 (two-part ln 2, so r is exact to
/// |r| ≤ ln 2 / 2) by its degree-7 Taylor polynomial (truncation error < 0.1 ulp), and `n` =
/// round(x / ln 2) in two's complement (locals `shifter`, `kf`, `kb`, `r`, `p`, `n`). The caller
/// applies 2^n.
macro_rules! exp_f32_core {
    () => {
        "const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float kf = fmaf(x, 1.44269504088896341f, shifter);
  uint32_t kb; memcpy(&kb, &kf, 4);
  kf -= shifter;
  float r = fmaf(kf, -0.693145751953125f, x);
  r = fmaf(kf, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const uint32_t n = kb - 0x4B400000u; /* in two's complement */
"
    };
}

/// The body of `float aj_exp_f32(float x)`: exp(x) = 2^n · e^r (see `exp_f32_core`), with 2^n
/// applied as two exact power-of-two factors so that subnormal results are rounded once (the
/// exponent split as floor(n / 2) and the rest, in unsigned arithmetic: shifts rather than a
/// signed division, 8% faster, the same bits for every f32 input). Branch-free (selects and bit
/// moves only), so loops that call it vectorize, where a libm `expf` call stays scalar.
/// Below −104 (e^−104 rounds to 0) and above 89 (e^89 rounds to inf) the result is selected at
/// the end, not the argument clamped first: gcc turns the two clamps into mask juggling (10
/// vector instructions of the loop's 36) where two compares and two masked moves do, and the
/// exponential of a row ran 17% faster (0.348 → 0.290 ns per element from L1 on a Zen 4); the
/// lanes past the bounds compute garbage in unsigned arithmetic and are discarded. Faithfully
/// rounded: checked over every f32 input against `exp` in double, the largest error is 0.94 ulp
/// (glibc's `expf`: 0.50), so it differs from the interpreter by at most one ulp. NaN stays NaN
/// (both compares fail); ±inf give inf and 0.
pub(crate) const EXP_F32_BODY: &str = concat!(
    exp_f32_core!(),
    "  const uint32_t n1 = ((n + 256u) >> 1) - 128u, n2 = n - n1; /* floor(n / 2) and the rest */
  const uint32_t b1 = (n1 + 127u) << 23, b2 = (n2 + 127u) << 23;
  float s1, s2; memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);
  const float e = p * s1 * s2;
  return x < -104.0f ? 0.0f : (x > 89.0f ? INFINITY : e);"
);

/// The body of `float aj_log_f32(float x)`, branch-free like `aj_exp_f32` so loops over it
/// vectorize (libm's `logf` stays a scalar call): x = 2^k · m with m in [√2/2, √2) (subnormals
/// scaled by 2^25 first), f = m − 1, and log(1 + f) = f − f²/2 + s·(f²/2 + R) with s = f/(2 + f)
/// and R = 2·(s²/3 + s⁴/5 + s⁶/7 + s⁸/9), the series of 2·atanh(s) (|s| ≤ 0.172: the next term
/// is under 0.03 ulp); k·ln 2 is added in two parts (the high part exact in f32). Checked against
/// `ln` in double over the f32 range (`tests/math_functions.rs`): within 0.72 ulp. Negative inputs
/// and NaN give NaN, ±0 gives −inf, +inf gives +inf (computed on 1 and selected, not branched).
const LOG_F32_BODY: &str =
    "const int finite = x > 0.0f && x < INFINITY; /* not 0, <0, inf or NaN */
  const float xf = finite ? x : 1.0f;
  const int sub = xf < 1.17549435e-38f; /* subnormal */
  const float xs = xf * (sub ? 33554432.0f : 1.0f); /* 2^25 */
  uint32_t ix; memcpy(&ix, &xs, 4);
  ix += 0x3f800000u - 0x3f3504f3u; /* moves m into [sqrt(2)/2, sqrt(2)) */
  const int32_t k = (int32_t)(ix >> 23) - 127 - (sub ? 25 : 0);
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  float m; memcpy(&m, &ix, 4);
  const float f = m - 1.0f, s = f / (2.0f + f), z = s * s;
  const float r = z * fmaf(z, fmaf(z, fmaf(z, 0.2222222222f, 0.2857142857f), 0.4f), 0.6666666667f);
  const float hfsq = 0.5f * f * f, dk = (float)k;
  const float y = fmaf(dk, 6.9313812256e-01f, fmaf(s, hfsq + r, dk * 9.0580006145e-06f) - hfsq + f);
  const float special = x == 0.0f ? -INFINITY : (x == INFINITY ? x : NAN);
  /* y is finite: adding 0 * y keeps it live on both sides, so the select stays branch-free */
  return finite ? y : special + 0.0f * y;";

/// The body of `float aj_tanh_f32(float x)`, branch-free like `aj_exp_f32` (which it calls), so
/// loops over it vectorize where libm's `tanhf` stays scalar (GELU's tanh form is a large share
/// of a transformer step): below |x| = 0.625 the odd Taylor polynomial of tanh to x¹⁷ (its
/// truncation error there is under 0.2 ulp); above, `1 − 2 / (e^(2|x|) + 1)` with the sign of x.
/// Checked against `tanh` in double over the f32 range, the largest error is 1.08 ulp (glibc's
/// `tanhf` documents 2 ulp too). NaN stays NaN; ±inf give ±1.
const TANH_F32_BODY: &str = "const float a = fabsf(x), x2 = x * x;
  float p = 5.900274409e-04f;
  p = fmaf(p, x2, -1.455834387e-03f);
  p = fmaf(p, x2, 3.592128037e-03f);
  p = fmaf(p, x2, -8.863235530e-03f);
  p = fmaf(p, x2, 2.186948854e-02f);
  p = fmaf(p, x2, -5.396825397e-02f);
  p = fmaf(p, x2, 1.333333333e-01f);
  p = fmaf(p, x2, -3.333333333e-01f);
  const float small = fmaf(x * x2, p, x);
  const float e = aj_exp_f32(2.0f * a); /* inf past 44.4: 2 / inf = 0 */
  const float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
  return a < 0.625f ? small : big;";

/// The body of `float aj_exp_normal_f32(float x)`, e^x where 2^n (see `exp_f32_core`) is a
/// normal float, x in about [−87, 88]: `aj_exp_f32` without its clamps and with one exact
/// power-of-two factor. Only `aj_erf_f32` calls it, on [−17.9, −1.8] and, for the lanes whose
/// result it discards, (−1.9, 0]. A function of its own rather than written into the erf's body:
/// there, gcc 12 left loops that use the erf inside a larger expression scalar ("no vectype").
const EXP_NORMAL_F32_BODY: &str = concat!(
    exp_f32_core!(),
    "  const uint32_t b = (n + 127u) << 23;
  float scale; memcpy(&scale, &b, 4);
  return p * scale;"
);

/// The body of `float aj_erf_f32(float x)`, branch-free so loops over it vectorize where libm's
/// `erff` stays scalar (the exact GELU's erf was 8% of a GPT training step as `erff` calls). With
/// a = |x| (clamped to 3.95, where erf rounds to 1):
/// - below 1, `a + a·q(a²)` with q a degree-6 polynomial fitted (weighted least squares on
///   Chebyshev nodes) to erf(a)/a − 1;
/// - from 1, `1 − e^l` with l a degree-6 polynomial in a fitted to ln erfc(a) on [1, 3.95]
///   (Lawson's weighted minimax, weighted by erfc(a), so that the error it leaves in erf is
///   under 1e-9). l lies in [−17.9, −1.8], so e^l needs neither clamps nor a split scale
///   (`aj_exp_normal_f32`): one exponential and no division (the earlier form,
///   `1 − e^(−a²)·g(1/a)`, took a division, a degree-8 polynomial and the full-range `exp`; the
///   GELU's erf pass ran 1.5× as long: 1.97 against 1.32 ms for 2M elements on a 2-core EPYC);
/// - the sign of x last.
///
/// Checked against `erf` in double over every f32 in [0, 5], the largest error is 1.08 ulp (at
/// 1.07, just past the switch); `tests/math_functions.rs` holds it within 2 ulp over the whole
/// range. NaN stays NaN; ±inf give ±1.
const ERF_F32_BODY: &str = "const float a0 = fabsf(x);
  const float a = a0 > 3.95f ? 3.95f : a0; /* NaN passes */
  const float s = a * a;
  float q = 7.898209878e-05f;
  q = fmaf(q, s, -8.024353883e-04f);
  q = fmaf(q, s, 5.190053489e-03f);
  q = fmaf(q, s, -2.685480937e-02f);
  q = fmaf(q, s, 1.128361225e-01f);
  q = fmaf(q, s, -3.761262894e-01f);
  q = fmaf(q, s, 1.283791661e-01f);
  const float small = fmaf(a, q, a);
  float l = 1.855742157e-04f;
  l = fmaf(l, a, -2.939609345e-03f);
  l = fmaf(l, a, 2.180532739e-02f);
  l = fmaf(l, a, -1.030373871e-01f);
  l = fmaf(l, a, -6.382256746e-01f);
  l = fmaf(l, a, -1.127040029e+00f);
  l = fmaf(l, a, -3.537161683e-04f);
  const float big = 1.0f - aj_exp_normal_f32(l);
  return copysignf(a < 1.0f ? small : big, x);";

/// Renders `op(x)` at compute precision `p`, recording the helpers it needs.
pub fn render_unop(op: UnOp, p: Prec, x: &str, helpers: &mut BTreeSet<Helper>) -> String {
    let cp = p.compute_prec();
    let t = c_storage_type(cp);
    if cp.is_float() {
        // f32 exp, tanh and erf: the branch-free routines (tanh calls aj_exp_f32, which the
        // helper set orders before it: Exp < Tanh).
        if matches!(op, UnOp::Exp | UnOp::Tanh | UnOp::Erf) && cp == Prec::F32 {
            if op != UnOp::Erf {
                helpers.insert(Helper::Un(UnOp::Exp, cp));
            }
            helpers.insert(Helper::Un(op, cp));
            return format!("aj_{}_f32({x})", op.name());
        }
        // f32 log: its own branch-free routine.
        if op == UnOp::Log && cp == Prec::F32 {
            helpers.insert(Helper::Un(op, cp));
            return format!("aj_log_f32({x})");
        }
        if let Some(f) = float_fn(op, cp) {
            return format!("{f}({x})");
        }
        let one = literal(cp, 1.0);
        return match op {
            UnOp::Identity => x.to_string(),
            UnOp::Neg => format!("(-{x})"),
            UnOp::Recip => format!("({one} / {x})"),
            UnOp::RecipSqrt => format!("({one} / {}({x}))", float_fn2("sqrt", cp)),
            UnOp::Not => format!("(({x}) == 0 ? {one} : {})", literal(cp, 0.0)),
            UnOp::Relu | UnOp::Satur01 => {
                helpers.insert(Helper::Un(op, cp));
                format!("aj_{}_{}({x})", op.name(), prec_suffix(cp))
            }
            _ => unreachable!("float functions handled above"),
        };
    }
    match op {
        UnOp::Identity => x.to_string(),
        UnOp::Neg => format!("(({t})(0 - (uint64_t)({x})))"),
        UnOp::Not => format!("(({t})(({x}) == 0))"),
        UnOp::Exp
        | UnOp::Exp2
        | UnOp::Log
        | UnOp::Log2
        | UnOp::Sin
        | UnOp::Cos
        | UnOp::Sqrt
        | UnOp::Tanh
        | UnOp::Erf => {
            helpers.insert(Helper::FloatToInt(cp));
            let f = float_fn(op, Prec::F64).expect("math function");
            format!("aj_f2i_{}({f}((double)({x})))", prec_suffix(cp))
        }
        UnOp::RecipSqrt => {
            helpers.insert(Helper::FloatToInt(cp));
            format!("aj_f2i_{}(1.0 / sqrt((double)({x})))", prec_suffix(cp))
        }
        _ => {
            helpers.insert(Helper::Un(op, cp));
            format!("aj_{}_{}({x})", op.name(), prec_suffix(cp))
        }
    }
}

fn bin_helper_name(op: BinOp) -> &'static str {
    match op {
        BinOp::Div => "div",
        BinOp::Mod => "mod",
        BinOp::Pow => "pow",
        BinOp::ReluGate => "relu_gate",
        BinOp::Max => "max",
        BinOp::Min => "min",
        _ => "op",
    }
}

/// Renders the random op's uniform value at compute precision `p`: `index` is a 64-bit integer
/// expression, `step` a `u32` one.
pub fn render_random(
    seed: u64,
    stream: u32,
    index: &str,
    step: &str,
    p: Prec,
    helpers: &mut BTreeSet<Helper>,
) -> String {
    helpers.insert(Helper::PhiloxUniform);
    let u = format!(
        "aj_philox_uniform({seed}ull, {stream}u, (uint64_t)(int64_t)({index}), (uint32_t)({step}))"
    );
    convert(&u, Prec::F32, p, helpers)
}

/// Renders `op(a, b)` at compute precision `p`, recording the helpers it needs.
pub fn render_binop(
    op: BinOp,
    p: Prec,
    a: &str,
    b: &str,
    helpers: &mut BTreeSet<Helper>,
) -> String {
    let cp = p.compute_prec();
    let t = c_storage_type(cp);
    let boolean = |cond: String| format!("(({t})({cond}))");
    match op {
        BinOp::Arg1 => return a.to_string(),
        BinOp::Arg2 => return b.to_string(),
        BinOp::Cmplt => return boolean(format!("{a} < {b}")),
        BinOp::Cmpeq => return boolean(format!("{a} == {b}")),
        BinOp::Cmpne => return boolean(format!("{a} != {b}")),
        BinOp::And => return boolean(format!("({a}) != 0 && ({b}) != 0")),
        BinOp::Or => return boolean(format!("({a}) != 0 || ({b}) != 0")),
        _ => {}
    }
    if cp.is_float() {
        return match op {
            BinOp::Add => format!("({a} + {b})"),
            BinOp::Sub => format!("({a} - {b})"),
            BinOp::Mul => format!("({a} * {b})"),
            BinOp::Div => format!("({a} / {b})"),
            BinOp::Pow => format!("{}({a}, {b})", float_fn2("pow", cp)),
            BinOp::Mod => format!("{}({a}, {b})", float_fn2("fmod", cp)),
            _ => {
                helpers.insert(Helper::Bin(op, cp));
                format!("aj_{}_{}({a}, {b})", bin_helper_name(op), prec_suffix(cp))
            }
        };
    }
    match op {
        BinOp::Add => format!("(({t})((uint64_t)({a}) + (uint64_t)({b})))"),
        BinOp::Sub => format!("(({t})((uint64_t)({a}) - (uint64_t)({b})))"),
        BinOp::Mul => format!("(({t})((uint64_t)({a}) * (uint64_t)({b})))"),
        _ => {
            helpers.insert(Helper::Bin(op, cp));
            format!("aj_{}_{}({a}, {b})", bin_helper_name(op), prec_suffix(cp))
        }
    }
}

/// Renders `op(a, b, c)` at compute precision `p`.
///
/// `where` is a call of a helper rather than C's `?:`: its arguments are computed before it
/// chooses, so the loads of both values are unconditional and a loop over it vectorizes (a
/// blend). With `?:` the loads in each branch are conditional, and gcc left such loops scalar
/// (a causal mask's backward pass in the GPT step). Computing the value not chosen is safe:
/// every read's index is in range (checked at compile time, or guarded when it comes from
/// data), and the C operations that could trap (integer division, float-to-int conversion)
/// are helpers that guard themselves.
pub fn render_ternop(
    op: TernOp,
    p: Prec,
    (a, b, c): (&str, &str, &str),
    helpers: &mut BTreeSet<Helper>,
) -> String {
    let cp = p.compute_prec();
    let t = c_storage_type(cp);
    match op {
        TernOp::Where => {
            helpers.insert(Helper::Where(cp));
            format!("aj_where_{}({a}, {b}, {c})", prec_suffix(cp))
        }
        TernOp::Fma if cp.is_float() => format!("{}({a}, {b}, {c})", float_fn2("fma", cp)),
        TernOp::Fma => {
            format!("(({t})((uint64_t)({a}) * (uint64_t)({b}) + (uint64_t)({c})))")
        }
    }
}

/// Converts an expression of compute precision `from` to compute precision `to`.
pub fn convert(x: &str, from: Prec, to: Prec, helpers: &mut BTreeSet<Helper>) -> String {
    let (from, to) = (from.compute_prec(), to.compute_prec());
    if from == to {
        x.to_string()
    } else if from.is_float() && to.is_integer() {
        helpers.insert(Helper::FloatToInt(to));
        format!("aj_f2i_{}((double)({x}))", prec_suffix(to))
    } else {
        format!("(({})({x}))", c_storage_type(to))
    }
}

/// Loads a stored element of precision `stored` as a value of compute precision `to`.
pub fn load(x: &str, stored: Prec, to: Prec, helpers: &mut BTreeSet<Helper>) -> String {
    let as_compute = match stored {
        Prec::F16 => {
            helpers.insert(Helper::F16ToF32);
            format!("aj_f16_to_f32({x})")
        }
        Prec::Bf16 => {
            helpers.insert(Helper::Bf16ToF32);
            format!("aj_bf16_to_f32({x})")
        }
        _ => x.to_string(),
    };
    convert(&as_compute, stored, to, helpers)
}

/// Converts a value of the node's compute precision to its storage form.
pub fn store(x: &str, stored: Prec, helpers: &mut BTreeSet<Helper>) -> String {
    match stored {
        Prec::F16 => {
            helpers.insert(Helper::F32ToF16);
            format!("aj_f32_to_f16({x})")
        }
        Prec::Bf16 => {
            helpers.insert(Helper::F32ToBf16);
            format!("aj_f32_to_bf16({x})")
        }
        _ => x.to_string(),
    }
}

/// The C definition of a helper.
pub fn helper_definition(h: Helper, syntax: &CSyntax) -> String {
    let pre = &syntax.helper_prefix;
    match h {
        Helper::F16ToF32 => format!(
            "{pre} float aj_f16_to_f32(uint16_t h) {{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1fu) bits = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (mant << 13);
  else if (mant == 0) bits = sign;
  else {{
    uint32_t e = 0;
    while (!(mant & 0x400u)) {{ mant <<= 1; e++; }}
    bits = sign | ((113u - e) << 23) | ((mant & 0x3ffu) << 13);
  }}
  float f; memcpy(&f, &bits, 4); return f;
}}"
        ),
        Helper::F32ToF16 => format!(
            "{pre} uint16_t aj_f32_to_f16(float f) {{
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? (0x200u | (mant >> 13)) : 0u));
  int e = (int)exp - 112;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {{
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e), h = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }}
  uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}}"
        ),
        Helper::Bf16ToF32 => format!(
            "{pre} float aj_bf16_to_f32(uint16_t h) {{
  uint32_t bits = (uint32_t)h << 16; float f; memcpy(&f, &bits, 4); return f;
}}"
        ),
        Helper::F32ToBf16 => format!(
            "{pre} uint16_t aj_f32_to_bf16(float f) {{
  uint32_t x; memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  if ((x & 0x8000u) && (x & 0x17fffu)) return (uint16_t)((x >> 16) + 1u);
  return (uint16_t)(x >> 16);
}}"
        ),
        Helper::MatrixUnits => format!("#ifndef AJ_CUDA_EMULATION\n{}#endif", ptx::matrix_units(pre)),
        Helper::Warpgroup => format!("#ifndef AJ_CUDA_EMULATION\n{}#endif", ptx::warpgroup(pre)),
        Helper::TensorCopies => format!(
            "#ifndef AJ_CUDA_EMULATION\n{}#endif",
            super::tensor_copies::tensor_copies(pre)
        ),
        // The staged tiles' swizzles act on address bits up to 1 KiB: a block whose dynamic
        // shared memory did not start on a KiB boundary would multiply wrongly, so it traps
        // (a launch failure) instead.
        Helper::DynamicShared => "#ifdef AJ_CUDA_EMULATION
#define AJ_DYNAMIC_SHARED(bytes) static thread_local __align__(1024) unsigned char aj_dynamic_shared[bytes]
#else
#define AJ_DYNAMIC_SHARED(bytes) extern __shared__ __align__(1024) unsigned char aj_dynamic_shared[]; \\
  if (aj_shared_address(aj_dynamic_shared) & 1023u) __trap()
#endif"
            .to_string(),
        Helper::Wgmma {
            kind,
            n,
            side_major,
            depth,
        } => ptx::wgmma(pre, &h.function_name(), kind, n, side_major, depth),
        Helper::VectorLoads => format!(
            "#ifdef AJ_CUDA_EMULATION
{pre} void aj_load4(float *d, const float *s) {{ memcpy(d, s, 16); }}
#else
{pre} void aj_load4(float *d, const float *s) {{
  const float4 v = *(const float4 *)s;
  d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}}
#endif"
        ),
        // Philox4x32-10 (the rounds of `arrayjit_ir::random::Philox::block_with`); 24 bits of
        // the first word scaled to [0, 1), exact in float.
        Helper::PhiloxUniform => format!(
            "{pre} float aj_philox_uniform(uint64_t seed, uint32_t stream, uint64_t index, uint32_t step) {{
  uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32), c2 = stream, c3 = step;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {{
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }}
  return (float)(c0 >> 8) * 5.9604644775390625e-8f;
}}"
        ),
        Helper::FloatToInt(p) => {
            let t = c_storage_type(p);
            let (lo, hi) = int_limits(p);
            format!(
                "{pre} {t} aj_f2i_{s}(double x) {{
  if (x != x) return 0;
  if (x <= (double){lo}) return {lo};
  if (x >= (double){hi}) return {hi};
  return ({t})x;
}}",
                s = prec_suffix(p)
            )
        }
        Helper::Un(op, p) => {
            let math = &syntax.math_helper_prefix;
            let t = c_storage_type(p);
            let s = prec_suffix(p);
            let body = match op {
                UnOp::Relu => "return x > 0 ? x : 0;".to_string(),
                UnOp::Satur01 => "return x < 0 ? 0 : (x > 1 ? 1 : x);".to_string(),
                UnOp::Abs => format!("return x < 0 ? ({t})(0 - (uint64_t)x) : x;"),
                UnOp::Recip => "return x == 0 ? 0 : 1 / x;".to_string(),
                UnOp::Exp => EXP_F32_BODY.to_string(),
                UnOp::Tanh => TANH_F32_BODY.to_string(),
                UnOp::Erf => ERF_F32_BODY.to_string(),
                UnOp::Log => LOG_F32_BODY.to_string(),
                other => unreachable!("no helper for {other}"),
            };
            // The erf's exponential comes with it (only the erf calls it).
            let before = if op == UnOp::Erf {
                format!("{math} float aj_exp_normal_f32(float x) {{ {EXP_NORMAL_F32_BODY} }}\n")
            } else {
                String::new()
            };
            format!("{before}{math} {t} aj_{}_{s}({t} x) {{ {body} }}", op.name())
        }
        Helper::Where(p) => {
            let math = &syntax.math_helper_prefix;
            let t = c_storage_type(p);
            format!(
                "{math} {t} aj_where_{}({t} c, {t} a, {t} b) {{ return c != 0 ? a : b; }}",
                prec_suffix(p)
            )
        }
        Helper::Bin(op, p) => {
            let math = &syntax.math_helper_prefix;
            let t = c_storage_type(p);
            let s = prec_suffix(p);
            let signed = p.is_signed_integer();
            let body = match op {
                BinOp::ReluGate => "return a > 0 ? b : 0;".to_string(),
                // Floats: a NaN operand yields the other one (as `fmax`/`fmin` and the
                // interpreter do), in compare-and-select form that vectorizes, where the libm
                // call does not.
                BinOp::Max if p.is_float() => "return (b > a || a != a) ? b : a;".to_string(),
                BinOp::Min if p.is_float() => "return (b < a || a != a) ? b : a;".to_string(),
                BinOp::Max => "return a > b ? a : b;".to_string(),
                BinOp::Min => "return a < b ? a : b;".to_string(),
                BinOp::Div if signed => {
                    format!("if (b == 0) return 0; if (b == -1) return ({t})(0 - (uint64_t)a); return a / b;")
                }
                BinOp::Div => "if (b == 0) return 0; return a / b;".to_string(),
                BinOp::Mod if signed => "if (b == 0 || b == -1) return 0; return a % b;".to_string(),
                BinOp::Mod => "if (b == 0) return 0; return a % b;".to_string(),
                BinOp::Pow => {
                    let negative = if signed {
                        format!(
                            "if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b % 2 == 0) ? 1 : ({t})-1) : 0);\n  "
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "{negative}uint64_t r = 1, base = (uint64_t)a, e = (uint64_t)b;
  while (e > 0) {{ if (e & 1u) r = ({t})(r * base); base = ({t})(base * base); e >>= 1; }}
  return ({t})r;"
                    )
                }
                other => unreachable!("no helper for {other}"),
            };
            format!(
                "{math} {t} aj_{}_{s}({t} a, {t} b) {{\n  {body}\n}}",
                bin_helper_name(op)
            )
        }
    }
}

//! Generated math functions against `f64` references, element by element: the C backends compute
//! f32 `exp` and `log` with their own branch-free (vectorizable) routines instead of libm's
//! `expf`/`logf`, and promise a faithfully rounded result (under one ulp) over the whole f32
//! range, with the IEEE special cases (NaN, ±inf, overflow to inf, gradual underflow to
//! subnormals and 0); `tanh` and `erf` within two ulp.

use arrayjit::prelude::*;

/// 2^17 evenly spaced bit patterns over [0, top], each with its negation: every binade of the
/// range, subnormals included.
fn symmetric_bit_patterns(top: f32) -> Vec<f32> {
    let count = 1u32 << 17;
    let step = top.to_bits() / count;
    (0..count)
        .flat_map(|i| {
            let b = i * step;
            [f32::from_bits(b), -f32::from_bits(b)]
        })
        .collect()
}

/// `op` applied to `xs` by backend `name`'s compiled code, which must call the C backends' own
/// routine `routine` (not libm's).
fn run_f32_unop(name: &str, op: UnOp, routine: &str, xs: &[f32]) -> Vec<f64> {
    let x = Tnode::new(Prec::F32, &[xs.len()], &["x"]).unwrap();
    x.host()
        .set_values(&xs.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())
        .unwrap();
    let y = Tnode::new(Prec::F32, &[xs.len()], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let program = Assignments::pointwise_unop(&y, op, &x);
    let backend = arrayjit::runtime::backend(name).unwrap();
    let code = backend
        .compile(CompileRequest::routine(op.name(), &program))
        .unwrap();
    assert!(
        code.source().contains(routine),
        "{name}: the C backends render f32 {} with their own routine",
        op.name()
    );
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    Context::new(&stream).link(&code).unwrap().run().unwrap();
    y.host().get_values().unwrap()
}

/// Inputs: evenly spaced bit patterns over [-105, 105] (so every binade, subnormal results and
/// both overflow boundaries are covered), and the special values.
fn exp_inputs() -> Vec<f32> {
    let mut xs = symmetric_bit_patterns(105.0);
    xs.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN,
        88.72283,
        88.72284,
        89.0,
        -87.33654,
        -103.27893,
        -103.97208,
        -104.0,
        -104.5,
        1e-30,
        -1e-30,
        0.0,
        -0.0,
    ]);
    xs
}

/// Distance of `got` from the exact value `want` in units of the last place of `want` rounded
/// to f32 (the subnormal spacing below the normal range).
fn ulps(got: f32, want: f64) -> f64 {
    let rounded = want as f32;
    if rounded.is_infinite() || got.is_infinite() {
        return if got == rounded { 0.0 } else { f64::INFINITY };
    }
    let spacing = if rounded.abs() < f32::MIN_POSITIVE {
        f64::from(f32::from_bits(1))
    } else {
        f64::from(f32::from_bits(rounded.abs().to_bits() + 1) - rounded.abs())
    };
    (f64::from(got) - want).abs() / spacing
}

#[test]
fn exp_f32_is_faithfully_rounded_over_the_whole_range_on_every_cpu_backend() {
    let xs = exp_inputs();
    for name in ["sync_cc", "multicore_cc"] {
        let got = run_f32_unop(name, UnOp::Exp, "aj_exp_f32", &xs);
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &g) in xs.iter().zip(&got) {
            let g = g as f32;
            if x.is_nan() {
                assert!(g.is_nan(), "{name}: exp(NaN) = {g}");
                continue;
            }
            let e = ulps(g, f64::from(x).exp());
            assert!(
                e < 1.0,
                "{name}: exp({x:e}) = {g:e}, {e} ulp from {:e}",
                f64::from(x).exp()
            );
            if e > worst.0 {
                worst = (e, x);
            }
        }
        eprintln!(
            "{name}: worst error {:.3} ulp at x = {:e}",
            worst.0, worst.1
        );
        assert_eq!(got[xs.len() - 2], 1.0);
        assert_eq!(
            got[xs.iter().position(|v| *v == f32::NEG_INFINITY).unwrap()],
            0.0
        );
    }
}

/// Appends the special inputs of an odd function's check (huge, tiny, subnormal, ±0, ±inf, NaN);
/// returns the index of `+0`.
fn with_specials(xs: &mut Vec<f32>) -> usize {
    xs.extend([1e30, f32::MAX, f32::MIN_POSITIVE, 1e-40]);
    let zero_at = xs.len();
    xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    zero_at
}

/// Checks an odd, saturating f32 function of the C backends (`routine`, branch-free so loops
/// over it vectorize) on both CPU backends: within 2 ulp of `reference` in double at every
/// input, NaN kept, exactly ±1 from `tail` on, `+0` at `+0` (its index in `xs`); prints the
/// worst error.
fn check_odd_saturating(
    op: UnOp,
    routine: &str,
    xs: &[f32],
    reference: fn(f64) -> f64,
    tail: f32,
    zero_at: usize,
) {
    let what = op.name();
    for name in ["sync_cc", "multicore_cc"] {
        let got = run_f32_unop(name, op, routine, xs);
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &g) in xs.iter().zip(&got) {
            let g = g as f32;
            if x.is_nan() {
                assert!(g.is_nan(), "{name}: {what}(NaN) = {g}");
                continue;
            }
            let want = reference(f64::from(x));
            let e = ulps(g, want);
            assert!(
                e < 2.0,
                "{name}: {what}({x:e}) = {g:e}, {e} ulp from {want:e}"
            );
            if e > worst.0 {
                worst = (e, x);
            }
            if x.abs() >= tail {
                assert_eq!(g, x.signum(), "{name}: {what}({x}) is ±1 in f32");
            }
        }
        assert_eq!(got[zero_at].to_bits(), 0.0f64.to_bits(), "{what}(0)");
        eprintln!(
            "{name}: {what} worst error {:.3} ulp at x = {:e}",
            worst.0, worst.1
        );
    }
}

/// The C backends' f32 `tanh` (`aj_tanh_f32`) is within 2 ulp of `tanh` in double over the f32
/// range (glibc's `tanhf` documents 2 ulp too), odd, exactly ±1 in the tails and 0 at 0, and
/// keeps NaN.
#[test]
fn tanh_f32_is_within_two_ulp_over_the_whole_range_on_every_cpu_backend() {
    let mut xs = symmetric_bit_patterns(20.0);
    // Both sides of the switch from the polynomial, the tails, the specials.
    xs.extend([
        0.625,
        f32::from_bits(0.625f32.to_bits() - 1),
        f32::from_bits(0.625f32.to_bits() + 1),
        -0.625,
        9.0,
        44.0,
        45.0,
    ]);
    let zero_at = with_specials(&mut xs);
    check_odd_saturating(UnOp::Tanh, "aj_tanh_f32", &xs, f64::tanh, 10.0, zero_at);
}

/// The C backends' f32 `erf` (`aj_erf_f32`: the exact GELU) is within 2 ulp of `erf` in double
/// over the f32 range, odd (−0 kept), exactly ±1 in the tails and 0 at 0, and keeps NaN.
#[test]
fn erf_f32_is_within_two_ulp_over_the_whole_range_on_every_cpu_backend() {
    let mut xs = symmetric_bit_patterns(6.0);
    // Both sides of the switch between the two forms and of the clamp, the tails, the specials.
    xs.extend([
        1.0,
        f32::from_bits(1.0f32.to_bits() - 1),
        f32::from_bits(1.0f32.to_bits() + 1),
        -1.0,
        3.95,
        3.9,
        4.0,
    ]);
    let zero_at = with_specials(&mut xs);
    check_odd_saturating(UnOp::Erf, "aj_erf_f32", &xs, libm::erf, 4.0, zero_at);
    let got = run_f32_unop("sync_cc", UnOp::Erf, "aj_erf_f32", &xs);
    assert_eq!(got[zero_at + 1].to_bits(), (-0.0f64).to_bits(), "erf(-0)");
}

/// f32 `log` over every binade (subnormals included) is within one ulp of `ln` in double, exact
/// at 1, and keeps the special cases: −inf at ±0, NaN below 0 and at NaN, +inf at +inf.
#[test]
fn log_f32_is_faithfully_rounded_over_the_whole_range_on_every_cpu_backend() {
    let count = 1u32 << 17;
    let step = f32::MAX.to_bits() / count;
    let mut xs: Vec<f32> = (1..count).map(|i| f32::from_bits(i * step)).collect();
    xs.extend((0..4096).map(|i| 0.5 + i as f32 / 2048.0)); // densely around 1
    xs.extend([f32::MIN_POSITIVE, 1e-45, f32::MAX, 1.0, std::f32::consts::E]);
    let specials = xs.len();
    xs.extend([
        0.0,
        -0.0,
        -1.0,
        -1e-40,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
    ]);
    for name in ["sync_cc", "multicore_cc"] {
        let got = run_f32_unop(name, UnOp::Log, "aj_log_f32", &xs);
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &g) in xs[..specials].iter().zip(&got) {
            let want = f64::from(x).ln();
            let e = ulps(g as f32, want);
            assert!(e < 1.0, "{name}: log({x:e}) = {g:e}, {e} ulp from {want:e}");
            if e > worst.0 {
                worst = (e, x);
            }
        }
        eprintln!(
            "{name}: log worst error {:.3} ulp at x = {:e}",
            worst.0, worst.1
        );
        let at = |x: f32| got[xs.iter().position(|v| v.to_bits() == x.to_bits()).unwrap()];
        assert_eq!(at(1.0), 0.0);
        assert_eq!(at(0.0), f64::NEG_INFINITY);
        assert_eq!(at(-0.0), f64::NEG_INFINITY);
        assert_eq!(at(f32::INFINITY), f64::INFINITY);
        for x in [-1.0, -1e-40, f32::NEG_INFINITY] {
            assert!(at(x).is_nan(), "{name}: log({x}) = {}", at(x));
        }
        assert!(got[xs.len() - 1].is_nan());
    }
}

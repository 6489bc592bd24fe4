//! Views: reshapes against row-major order (NumPy's `reshape`) and slices (`narrow`), forward
//! and backward, and the cost the optimizer gives them: splits, unit axes, `keepdim`, slices
//! and transposes are views (nothing stored), a merge is one copy.

use arrayjit_ir::{InterpEnv, LowLevel, MemoryMode, MemoryType, Prec};
use arrayjit_opt::{OptimizeSettings, optimize};
use arrayjit_tensor::{Init, Tensor, forward_program, grad_program};

fn iota(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let t = Tensor::param_with_prec("x", Prec::F64, dims, Init::Zeros, 0, 0).unwrap();
    t.node()
        .host()
        .set_values(&(0..n).map(|i| i as f64).collect::<Vec<_>>())
        .unwrap();
    t
}

fn values(code: &LowLevel, t: &arrayjit_ir::Tnode) -> Vec<f64> {
    let mut env = InterpEnv::from_host_arrays(code);
    env.run(code, &[]).unwrap();
    env.values(t).unwrap()
}

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[2, 3, 8], &[2, 3, 2, 4]), // split heads
    (&[2, 3, 2, 4], &[2, 3, 8]), // merge heads
    (&[2, 3, 4], &[6, 4]),       // flatten leading axes
    (&[6, 4], &[4, 6]),          // mixed group
    (&[2, 3, 4], &[4, 3, 2]),    // mixed group over every axis
    (&[1, 5, 1, 3], &[5, 3, 1]), // unit axes removed and added
    (&[15], &[3, 1, 5]),
    (&[3, 5], &[15]),
    (&[1], &[1, 1]),
];

/// Row-major order is kept: a reshape of 0, 1, 2, … is 0, 1, 2, … in the new shape; the
/// gradient of `Σ w ⊙ reshape(x)` is `w` in the old shape.
#[test]
fn reshapes_keep_row_major_order_both_ways() {
    for &(from, to) in SHAPES {
        let n: usize = from.iter().product();
        let x = iota(from);
        let y = x.reshape(to).unwrap();
        assert_eq!(y.dims(), to);
        let code = forward_program(&[&y]).lower(&[]).unwrap();
        let want: Vec<f64> = (0..n).map(|i| i as f64).collect();
        assert_eq!(values(&code, y.node()), want, "{from:?} -> {to:?}");
        let w: Vec<f64> = (0..n).map(|i| (i * 7 % 11) as f64 - 5.0).collect();
        let wt = Tensor::input(Prec::F64, to, "w", &w).unwrap();
        let loss = y.mul(&wt).unwrap().sum_all().unwrap();
        let grads = grad_program(&loss).unwrap();
        let code = grads.program.lower(&[]).unwrap();
        assert_eq!(
            values(&code, x.grad().unwrap()),
            w,
            "{from:?} -> {to:?} grad"
        );
    }
}

/// What the optimizer keeps: a split read twice is inlined (no array of its own, its source
/// kept); a merge stores one merged copy.
#[test]
fn splits_are_views_and_a_merge_is_one_copy() {
    let x = Tensor::input(Prec::F32, &[4, 6], "x", &[0.5; 24]).unwrap();
    let e = x.exp().unwrap();
    let split = e.reshape(&[4, 2, 3]).unwrap();
    let y = split.mul(&split).unwrap().add(&split).unwrap();
    y.node()
        .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let opt = optimize(
        "split",
        &[],
        &forward_program(&[&y]),
        &OptimizeSettings::default(),
    )
    .unwrap();
    assert!(
        split.node().modes().known_virtual(),
        "{}",
        opt.memory_report()
    );
    assert!(!e.node().modes().known_virtual(), "{}", opt.memory_report());
    let got = values(&opt.code, y.node());
    let v = 0.5f32.exp() as f64;
    assert!(
        got.iter().all(|g| (g - (v * v + v)).abs() < 1e-5),
        "{got:?}"
    );

    let x = Tensor::input(Prec::F32, &[2, 3, 4], "x", &[1.0; 24]).unwrap();
    let merged = x.exp().unwrap().reshape(&[6, 4]).unwrap();
    let z = merged.mul(&merged).unwrap();
    z.node()
        .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let opt = optimize(
        "merge",
        &[],
        &forward_program(&[&z]),
        &OptimizeSettings::default(),
    )
    .unwrap();
    assert!(
        merged.node().modes().known_virtual(),
        "{}",
        opt.memory_report()
    );
    let report = opt.memory_report();
    assert!(report.contains("merged"), "{report}");
    let statements = match &opt.code {
        LowLevel::Seq(s) => s.len(),
        _ => 1,
    };
    assert_eq!(
        statements, 2,
        "the merge copy and the product:\n{}",
        opt.code
    );
}

/// `narrow` reads the window; its gradient is zero outside it; bad windows are errors.
#[test]
fn narrow_reads_a_window_and_its_gradient_is_zero_outside() {
    let x = iota(&[3, 5]);
    let y = x.narrow(1, 1, 3).unwrap();
    assert_eq!(y.dims(), &[3, 3]);
    let code = forward_program(&[&y]).lower(&[]).unwrap();
    assert_eq!(
        values(&code, y.node()),
        vec![1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 11.0, 12.0, 13.0]
    );
    let w = Tensor::input(
        Prec::F64,
        &[3, 3],
        "w",
        &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
    )
    .unwrap();
    let loss = y.mul(&w).unwrap().sum_all().unwrap();
    let code = grad_program(&loss).unwrap().program.lower(&[]).unwrap();
    assert_eq!(
        values(&code, x.grad().unwrap()),
        vec![0., 1., 2., 3., 0., 0., 4., 5., 6., 0., 0., 7., 8., 9., 0.]
    );
    for (axis, start, len) in [(2, 0, 1), (1, 3, 3), (0, usize::MAX, 2)] {
        let err = x.narrow(axis, start, len).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
    }
    let err = x.narrow(0, 1, 0).unwrap_err().to_string();
    assert!(err.contains("at least 1"), "an empty window: {err}");
}

/// A slice and a transpose read several times per element are inlined like a split.
#[test]
fn slices_and_transposes_are_views() {
    let x = Tensor::input(Prec::F32, &[4, 6], "x", &[0.5; 24]).unwrap();
    let e = x.exp().unwrap();
    let window = e.narrow(1, 2, 3).unwrap();
    let transposed = e.transpose(&[1, 0]).unwrap();
    let y = window.mul(&window).unwrap();
    let z = transposed.mul(&transposed).unwrap();
    for t in [&y, &z] {
        t.node()
            .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
    }
    let opt = optimize(
        "views",
        &[],
        &forward_program(&[&y, &z]),
        &OptimizeSettings::default(),
    )
    .unwrap();
    assert!(
        window.node().modes().known_virtual(),
        "{}",
        opt.memory_report()
    );
    assert!(
        transposed.node().modes().known_virtual(),
        "{}",
        opt.memory_report()
    );
    let v = (0.5f32.exp() as f64).powi(2);
    for t in [&y, &z] {
        let got = values(&opt.code, t.node());
        assert!(got.iter().all(|g| (g - v).abs() < 1e-5), "{got:?}");
    }
}

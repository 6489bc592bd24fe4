//! Dropout and random streams, run by the reference interpreter: the fraction dropped and the
//! scale of the kept values, the gradient through the same mask, fresh masks after each
//! advance and the same ones for the same seed and step, the mask recomputed rather than stored
//! once optimized, and the errors.

use arrayjit_ir::{InterpEnv, LowLevel, Prec};
use arrayjit_opt::{OptimizeSettings, optimize};
use arrayjit_tensor::rng::RandomStream;
use arrayjit_tensor::{Tensor, forward_program, grad_program};

fn run(code: &LowLevel, env: &mut InterpEnv) {
    env.run(code, &[]).unwrap();
}

fn ones(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::input(Prec::F32, dims, "x", &vec![1.0; n]).unwrap()
}

#[test]
fn dropout_zeros_a_fraction_p_and_scales_the_rest() {
    let rng = RandomStream::new(11, "dropout_step").unwrap();
    let x = ones(&[64, 256]);
    let y = x.dropout(0.3, &rng).unwrap();
    let code = forward_program(&[&y]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    run(&code, &mut env);
    let values = env.values(y.node()).unwrap();
    let dropped = values.iter().filter(|&&v| v == 0.0).count();
    let kept_scale = (1.0f32 / 0.7) as f64;
    assert!(values.iter().all(|&v| v == 0.0 || v == kept_scale));
    let fraction = dropped as f64 / values.len() as f64;
    // 16384 draws: the standard deviation of the fraction is 0.0036.
    assert!((fraction - 0.3).abs() < 0.015, "dropped {fraction}");
}

#[test]
fn the_gradient_flows_through_the_same_mask() {
    let rng = RandomStream::new(3, "dropout_step").unwrap();
    let n = 200;
    let x =
        Tensor::param_with_prec("x", Prec::F64, &[n], arrayjit_tensor::Init::Zeros, 0, 0).unwrap();
    let xs: Vec<f64> = (0..n).map(|i| 0.5 + i as f64 * 0.01).collect();
    x.node().host().set_values(&xs).unwrap();
    let ws: Vec<f64> = (0..n).map(|i| (i % 7) as f64 - 3.0).collect();
    let w = Tensor::input(Prec::F64, &[n], "w", &ws).unwrap();
    let y = x.dropout(0.5, &rng).unwrap();
    let loss = y.mul(&w).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let code = grads.program.lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    run(&code, &mut env);
    let ys = env.values(y.node()).unwrap();
    let gx = env.values(x.grad().unwrap()).unwrap();
    let mut kept = 0;
    for i in 0..n {
        // y = x · m with m ∈ {0, 2}: the gradient is w · m.
        let m = ys[i] / xs[i];
        assert!(m == 0.0 || (m - 2.0).abs() < 1e-12, "mask {m} at {i}");
        assert!((gx[i] - ws[i] * m).abs() < 1e-12, "gradient at {i}");
        kept += (m != 0.0) as usize;
    }
    assert!(kept > 60 && kept < 140, "{kept} of {n} kept");
}

fn mask_after(seed: u64, steps: usize, dims: &[usize]) -> Vec<f64> {
    let rng = RandomStream::new(seed, "step").unwrap();
    let y = ones(dims).dropout(0.5, &rng).unwrap();
    let code = forward_program(&[&y])
        .then(rng.advance())
        .lower(&[])
        .unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    for _ in 0..steps {
        run(&code, &mut env);
    }
    assert_eq!(env.values(rng.step().node()).unwrap(), vec![steps as f64]);
    env.values(y.node()).unwrap()
}

#[test]
fn each_step_draws_a_fresh_mask_and_the_same_seed_and_step_repeat_it() {
    let dims = [8, 32];
    let first = mask_after(5, 1, &dims);
    let second = mask_after(5, 2, &dims);
    assert_ne!(first, second, "the advance changes the mask");
    assert_eq!(
        first,
        mask_after(5, 1, &dims),
        "same seed and step, same mask"
    );
    assert_ne!(first, mask_after(6, 1, &dims), "another seed, another mask");
    // Two draws of one stream in one step differ.
    let rng = RandomStream::new(5, "step").unwrap();
    let (a, b) = (
        rng.uniform(Prec::F32, &dims).unwrap(),
        rng.uniform(Prec::F32, &dims).unwrap(),
    );
    let code = forward_program(&[&a, &b]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    run(&code, &mut env);
    let (va, vb) = (env.values(a.node()).unwrap(), env.values(b.node()).unwrap());
    assert_ne!(va, vb);
    assert!(va.iter().chain(&vb).all(|v| (0.0..1.0).contains(v)));
}

#[test]
fn the_mask_is_recomputed_in_the_backward_pass_not_stored() {
    let rng = RandomStream::new(9, "step").unwrap();
    let x = Tensor::param_with_prec(
        "x",
        Prec::F32,
        &[16, 16],
        arrayjit_tensor::Init::Zeros,
        0,
        0,
    )
    .unwrap();
    let y = x.dropout(0.25, &rng).unwrap();
    let loss = y.mul(&y).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let program = grads.program.then(rng.advance());
    optimize("dropout_step", &[], &program, &OptimizeSettings::default()).unwrap();
    // y = x · kept, kept = where(dropped, 0, scale), dropped = uniform < p: none is stored.
    let kept = &y.parents()[1];
    let dropped = &kept.parents()[0];
    let uniform = &dropped.parents()[0];
    assert!(
        uniform.label().starts_with("uniform"),
        "{}",
        uniform.label()
    );
    for t in [kept, dropped, uniform] {
        let mode = t.node().memory_mode().expect("a decided mode");
        assert!(mode.mode.is_virtual(), "{}: {mode}", t.label());
    }
}

#[test]
fn edge_probabilities_and_bad_arguments() {
    let rng = RandomStream::new(1, "step").unwrap();
    let x = ones(&[10]);
    let same = x.dropout(0.0, &rng).unwrap();
    assert_eq!(same.node(), x.node(), "p = 0 is the identity");
    let none = x.dropout(1.0, &rng).unwrap();
    let code = forward_program(&[&none]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    run(&code, &mut env);
    assert_eq!(env.values(none.node()).unwrap(), vec![0.0; 10]);
    for p in [-0.1, 1.5, f64::NAN] {
        let err = x.dropout(p, &rng).unwrap_err();
        assert!(
            matches!(&err, arrayjit_ir::Error::BadValue { what, .. } if what == "dropout probability"),
            "{err}"
        );
    }
    let err = rng.uniform(Prec::I32, &[3]).unwrap_err();
    assert!(
        matches!(&err, arrayjit_ir::Error::BadValue { value, expected, .. }
            if value == "i32" && expected == "a float precision"),
        "{err}"
    );
}

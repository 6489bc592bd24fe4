//! Fused attention run by the reference interpreter: its output and the gradients of the
//! query, key and value agree with attention written out of einsums and a softmax (which holds
//! the scores), for odd sizes, one position, one head, causal or not, with dropout drawing the
//! same masks; gradients agree with finite differences in f64; bad shapes are refused.

use arrayjit_ir::{AttentionLayout, InterpEnv, Prec};
use arrayjit_tensor::rng::RandomStream;
use arrayjit_tensor::{AttentionOptions, Init, Tensor, grad_program};

fn spread(n: usize, lo: f64, hi: f64, salt: usize) -> Vec<f64> {
    (0..n)
        .map(|i| lo + (hi - lo) * (((i * 37 + salt * 11) % 101) as f64 + 0.5) / 101.0)
        .collect()
}

fn param(prec: Prec, label: &str, dims: &[usize], salt: usize) -> Tensor {
    let t = Tensor::param_with_prec(label, prec, dims, Init::Zeros, 0, 0).unwrap();
    let n = dims.iter().product();
    t.node()
        .host()
        .set_values(&spread(n, -1.5, 1.5, salt))
        .unwrap();
    t
}

/// Attention written out: scores, mask, softmax, dropout, weighted sum (PyTorch's order of
/// axes, or time before heads).
fn unfused(
    layout: AttentionLayout,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    dropout: Option<(f64, &RandomStream)>,
) -> Tensor {
    let (sspec, ospec) = match layout {
        AttentionLayout::HeadsFirst => ("bhte,bhse->bhts", "bhts,bhse->bhte"),
        AttentionLayout::TimeFirst => ("bthe,bshe->bhts", "bhts,bshe->bthe"),
    };
    let e = q.dims()[3];
    let scores = Tensor::einsum(sspec, &[q, k])
        .unwrap()
        .scale(1.0 / (e as f64).sqrt())
        .unwrap();
    let scores = if causal {
        let t = scores.dims()[2];
        let mask = Tensor::causal_mask(q.prec(), t).unwrap();
        let hidden = Tensor::full(q.prec(), &[], -1e9).unwrap();
        Tensor::where_(&mask, &hidden, &scores).unwrap()
    } else {
        scores
    };
    let mut w = scores.softmax(3).unwrap();
    if let Some((p, rng)) = dropout {
        w = w.dropout(p, rng).unwrap();
    }
    Tensor::einsum(ospec, &[&w, v]).unwrap()
}

/// Runs `loss = Σ out ⊙ weights` forward and backward; the output and the gradients of q, k, v.
fn run(out: &Tensor, params: [&Tensor; 3]) -> Vec<Vec<f64>> {
    run_program(out, params).0
}

/// [`run`], and the program it ran.
fn run_program(out: &Tensor, params: [&Tensor; 3]) -> (Vec<Vec<f64>>, arrayjit_ir::Assignments) {
    let n: usize = out.dims().iter().product();
    let w = Tensor::input(out.prec(), out.dims(), "w", &spread(n, -1.0, 1.2, 5)).unwrap();
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let code = grads.program.lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    let mut results = vec![env.values(out.node()).unwrap()];
    for p in params {
        results.push(env.values(p.grad().expect("a gradient")).unwrap());
    }
    (results, grads.program)
}

/// The query, key and value parameters of `dims`, each with values of its own.
fn qkv(prec: Prec, dims: &[usize]) -> (Tensor, Tensor, Tensor) {
    (
        param(prec, "q", dims, 1),
        param(prec, "k", dims, 2),
        param(prec, "v", dims, 3),
    )
}

/// The output and the three gradients of [`run`] agree within `tol`.
fn assert_runs_close(what: &str, fused: &[Vec<f64>], reference: &[Vec<f64>], tol: f64) {
    for (part, (a, b)) in ["output", "grad q", "grad k", "grad v"]
        .iter()
        .zip(fused.iter().zip(reference))
    {
        assert_close(&format!("{what}: {part}"), a, b, tol);
    }
}

fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: fused {x} vs unfused {y} (scale {scale})"
        );
    }
}

struct Shape {
    batch: usize,
    heads: usize,
    time: usize,
    features: usize,
}

fn compare(layout: AttentionLayout, s: &Shape, causal: bool, dropout: Option<f64>, prec: Prec) {
    let dims = layout.order(s.batch, s.heads, s.time, s.features);
    let name = format!(
        "{layout:?} b{} h{} t{} e{} causal {causal} dropout {dropout:?} {prec:?}",
        s.batch, s.heads, s.time, s.features
    );
    // Two streams with the same seed: draw 0 of each is the same mask.
    let streams = (
        RandomStream::new(9, "step_a").unwrap(),
        RandomStream::new(9, "step_b").unwrap(),
    );
    let (q, k, v) = qkv(prec, &dims);
    let options = AttentionOptions {
        causal,
        scale: None,
        dropout: dropout.map(|p| (p, streams.0.clone())),
    };
    let fused = run(
        &Tensor::attention(layout, &q, &k, &v, &options).unwrap(),
        [&q, &k, &v],
    );
    let (q, k, v) = qkv(prec, &dims);
    let reference = run(
        &unfused(layout, &q, &k, &v, causal, dropout.map(|p| (p, &streams.1))),
        [&q, &k, &v],
    );
    let tol = if prec == Prec::F64 { 1e-10 } else { 2e-5 };
    assert_runs_close(&name, &fused, &reference, tol);
}

#[test]
fn fused_attention_agrees_with_the_written_out_one() {
    let shapes = [
        Shape {
            batch: 2,
            heads: 3,
            time: 7,
            features: 5,
        },
        Shape {
            batch: 1,
            heads: 1,
            time: 1,
            features: 4,
        },
        Shape {
            batch: 1,
            heads: 2,
            time: 13,
            features: 8,
        },
    ];
    for layout in [AttentionLayout::HeadsFirst, AttentionLayout::TimeFirst] {
        for s in &shapes {
            for causal in [false, true] {
                compare(layout, s, causal, None, Prec::F32);
            }
        }
    }
    for causal in [false, true] {
        compare(
            AttentionLayout::TimeFirst,
            &shapes[0],
            causal,
            Some(0.3),
            Prec::F32,
        );
        compare(
            AttentionLayout::HeadsFirst,
            &shapes[2],
            causal,
            Some(0.5),
            Prec::F64,
        );
    }
}

/// Large scores (where an unshifted exponential overflows f32) stay finite and agree.
#[test]
fn large_scores_do_not_overflow() {
    let dims = [1, 2, 6, 4];
    let big = |label: &str, salt| {
        let t = param(Prec::F32, label, &dims, salt);
        let n = dims.iter().product();
        let v: Vec<f64> = spread(n, -1.5, 1.5, salt)
            .iter()
            .map(|x| x * 20.0)
            .collect();
        t.node().host().set_values(&v).unwrap();
        t
    };
    let (q, k, v) = (big("q", 1), big("k", 2), big("v", 3));
    let fused = run(
        &Tensor::scaled_dot_product_attention(&q, &k, &v, &AttentionOptions::default()).unwrap(),
        [&q, &k, &v],
    );
    let (q2, k2, v2) = (big("q", 1), big("k", 2), big("v", 3));
    let reference = run(
        &unfused(AttentionLayout::HeadsFirst, &q2, &k2, &v2, false, None),
        [&q2, &k2, &v2],
    );
    for (a, b) in fused.iter().zip(&reference) {
        assert!(a.iter().all(|x| x.is_finite()));
        assert_close("large scores", a, b, 1e-4);
    }
}

/// Gradients of the fused operation against central finite differences (f64).
#[test]
fn gradients_match_finite_differences() {
    let dims = [1, 2, 5, 3];
    let (q, k, v) = qkv(Prec::F64, &dims);
    let options = AttentionOptions {
        causal: true,
        scale: Some(0.7),
        dropout: None,
    };
    let out = Tensor::scaled_dot_product_attention(&q, &k, &v, &options).unwrap();
    let n: usize = out.dims().iter().product();
    let w = Tensor::input(Prec::F64, out.dims(), "w", &spread(n, -1.0, 1.2, 5)).unwrap();
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    let code = grad_program(&loss).unwrap().program.lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    let forward = arrayjit_tensor::forward_program(&[&loss])
        .lower(&[])
        .unwrap();
    let loss_at = || {
        let mut env = InterpEnv::from_host_arrays(&forward);
        env.run(&forward, &[]).unwrap();
        env.values(loss.node()).unwrap()[0]
    };
    for p in [&q, &k, &v] {
        let analytic = env.values(p.grad().unwrap()).unwrap();
        let base = p.node().host().get_values().unwrap();
        for i in 0..base.len() {
            let eps = 1e-6;
            let mut x = base.clone();
            x[i] += eps;
            p.node().host().set_values(&x).unwrap();
            let up = loss_at();
            x[i] -= 2.0 * eps;
            p.node().host().set_values(&x).unwrap();
            let down = loss_at();
            p.node().host().set_values(&base).unwrap();
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                (numeric - analytic[i]).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "d/d{}[{i}]: analytic {} numeric {numeric}",
                p.label(),
                analytic[i]
            );
        }
    }
}

#[test]
fn bad_shapes_and_settings_are_refused() {
    let t = |dims: &[usize]| {
        Tensor::input(Prec::F32, dims, "x", &vec![0.0; dims.iter().product()]).unwrap()
    };
    let o = AttentionOptions::default();
    let err = |q: &Tensor, k: &Tensor, v: &Tensor, o: &AttentionOptions| {
        Tensor::scaled_dot_product_attention(q, k, v, o)
            .unwrap_err()
            .to_string()
    };
    let msg = err(&t(&[2, 3, 4]), &t(&[2, 3, 4]), &t(&[2, 3, 4]), &o);
    assert!(msg.contains("[batch, heads, time, features]"), "{msg}");
    let msg = err(&t(&[1, 2, 4, 8]), &t(&[1, 2, 4, 6]), &t(&[1, 2, 4, 8]), &o);
    assert!(msg.contains("features"), "{msg}");
    let msg = err(&t(&[1, 2, 4, 8]), &t(&[1, 2, 5, 8]), &t(&[1, 2, 4, 8]), &o);
    assert!(msg.contains("positions"), "{msg}");
    let msg = err(&t(&[1, 2, 4, 8]), &t(&[1, 3, 4, 8]), &t(&[1, 3, 4, 8]), &o);
    assert!(msg.contains("batch and head"), "{msg}");
    let bad_scale = AttentionOptions {
        scale: Some(f64::NAN),
        ..AttentionOptions::default()
    };
    let x = t(&[1, 1, 2, 2]);
    assert!(err(&x, &x, &x, &bad_scale).contains("scale"));
    let rng = RandomStream::new(1, "s").unwrap();
    let bad_p = AttentionOptions {
        dropout: Some((1.5, rng)),
        ..AttentionOptions::default()
    };
    assert!(err(&x, &x, &x, &bad_p).contains("dropout"));
}

/// Every node an assignment (at any depth of sequences and comments) accumulates into.
fn accumulated_nodes(a: &arrayjit_ir::Assignments, out: &mut Vec<arrayjit_ir::Tnode>) {
    use arrayjit_ir::Assignments as A;
    match a {
        A::Seq(items) => items.iter().for_each(|i| accumulated_nodes(i, out)),
        A::BlockComment(_, inner) => accumulated_nodes(inner, out),
        A::Accum { lhs, .. } => out.push(lhs.clone()),
        _ => {}
    }
}

/// The attention pass's gradients are the parameters' gradients themselves when each is the
/// parameter's only contribution (no copy into a gradient node of its own), and are summed
/// into the gradient as before when a parameter gets several (self-attention of one tensor, or
/// a tensor used beside the attention): the values agree with the written-out attention.
#[test]
fn the_passes_gradients_are_written_in_place_when_they_are_the_only_contribution() {
    let layout = AttentionLayout::TimeFirst;
    let dims = layout.order(2, 3, 7, 5);
    let options = AttentionOptions {
        causal: true,
        ..AttentionOptions::default()
    };
    // Sole contributions: q, k and v take the pass's outputs as their gradients.
    let (q, k, v) = qkv(Prec::F32, &dims);
    let out = Tensor::attention(layout, &q, &k, &v, &options).unwrap();
    let (fused, program) = run_program(&out, [&q, &k, &v]);
    let mut written = Vec::new();
    accumulated_nodes(&program, &mut written);
    for p in [&q, &k, &v] {
        let g = p.grad().unwrap();
        assert!(
            g.debug_name().contains("attention"),
            "{}'s gradient is the pass's output, not {}",
            p.node().debug_name(),
            g.debug_name()
        );
        assert!(
            !written.iter().any(|n| n.id() == g.id()),
            "no copy into {}",
            g.debug_name()
        );
    }
    let (q2, k2, v2) = qkv(Prec::F32, &dims);
    let reference = run(&unfused(layout, &q2, &k2, &v2, true, None), [&q2, &k2, &v2]);
    assert_runs_close("sole contributions", &fused, &reference, 2e-5);

    // One tensor as query, key and value: three contributions summed into its gradient.
    let x = param(Prec::F32, "x", &dims, 4);
    let fused = run(
        &Tensor::attention(layout, &x, &x, &x, &options).unwrap(),
        [&x, &x, &x],
    );
    let x2 = param(Prec::F32, "x", &dims, 4);
    let reference = run(&unfused(layout, &x2, &x2, &x2, true, None), [&x2, &x2, &x2]);
    assert_close("self-attention: output", &fused[0], &reference[0], 2e-5);
    assert_close("self-attention: grad x", &fused[1], &reference[1], 2e-5);

    // The query also used beside the attention (a residual): its gradient gets two.
    let (q, k, v) = qkv(Prec::F32, &dims);
    let out = Tensor::attention(layout, &q, &k, &v, &options)
        .unwrap()
        .add(&q)
        .unwrap();
    let fused = run(&out, [&q, &k, &v]);
    let (q2, k2, v2) = qkv(Prec::F32, &dims);
    let reference = run(
        &unfused(layout, &q2, &k2, &v2, true, None).add(&q2).unwrap(),
        [&q2, &k2, &v2],
    );
    assert_runs_close("residual", &fused, &reference, 2e-5);
}

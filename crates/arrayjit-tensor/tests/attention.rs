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
        ..AttentionOptions::default()
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
        ..AttentionOptions::default()
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

/// `[batch, time, heads, features]` attention in plain Rust, f64: query `t` sees keys
/// `s ≤ t + offset`, each score biased by `bias[b, s]`; the output.
fn shifted_reference(
    (q, k, v): (&[f64], &[f64], &[f64]),
    [batch, queries, keys, heads, e]: [usize; 5],
    offset: usize,
    bias: &[f64],
) -> Vec<f64> {
    let scale = 1.0 / (e as f64).sqrt();
    let mut out = vec![0.0; batch * queries * heads * e];
    for b in 0..batch {
        for h in 0..heads {
            for t in 0..queries {
                let qi = |f: usize| q[((b * queries + t) * heads + h) * e + f];
                let at = |x: &[f64], s: usize, f: usize| x[((b * keys + s) * heads + h) * e + f];
                let seen = (t + offset + 1).min(keys);
                let scores: Vec<f64> = (0..seen)
                    .map(|s| {
                        (0..e).map(|f| qi(f) * at(k, s, f)).sum::<f64>() * scale
                            + bias[b * keys + s]
                    })
                    .collect();
                let m = scores.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
                let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let total: f64 = w.iter().sum();
                for f in 0..e {
                    out[((b * queries + t) * heads + h) * e + f] =
                        (0..seen).map(|s| w[s] * at(v, s, f)).sum::<f64>() / total;
                }
            }
        }
    }
    out
}

/// A causal mask shifted by a static index bound per run (a key/value cache's step: queries at
/// slots `offset ..`) and a bias on the keys' scores: the output agrees with a plain f64
/// reference for several offsets of one compiled program, and the gradients of q, k and v with
/// that reference's finite differences.
#[test]
fn a_shifted_mask_and_a_key_bias_match_a_plain_reference() {
    let [batch, queries, keys, heads, e] = [2, 5, 12, 2, 4];
    let layout = AttentionLayout::TimeFirst;
    let (q, k, v) = (
        param(Prec::F64, "q", &[batch, queries, heads, e], 1),
        param(Prec::F64, "k", &[batch, keys, heads, e], 2),
        param(Prec::F64, "v", &[batch, keys, heads, e], 3),
    );
    let bias_values: Vec<f64> = (0..batch * keys)
        .map(|i| {
            if i % 5 == 1 {
                -40.0
            } else {
                0.3 * (i % 4) as f64 - 0.4
            }
        })
        .collect();
    let bias = Tensor::input(Prec::F64, &[batch, keys], "bias", &bias_values).unwrap();
    let offset = arrayjit_ir::StaticSymbol::new("offset", keys - queries + 1);
    let options = AttentionOptions {
        causal: true,
        causal_offset: Some(offset.clone()),
        key_bias: Some(bias),
        ..AttentionOptions::default()
    };
    let out = Tensor::attention(layout, &q, &k, &v, &options).unwrap();
    let n: usize = out.dims().iter().product();
    let w = spread(n, -1.0, 1.2, 5);
    let weights = Tensor::input(Prec::F64, out.dims(), "w", &w).unwrap();
    let loss = out.mul(&weights).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let code = grads.program.lower(std::slice::from_ref(&offset)).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    let values = |t: &Tensor| t.node().host().array().unwrap().to_vec_f64().unwrap();
    let (qv, kv, vv) = (values(&q), values(&k), values(&v));
    let dims = [batch, queries, keys, heads, e];
    for off in [0, 3, keys - queries] {
        env.run(&code, &[(offset.symbol, off as i64)]).unwrap();
        let want = shifted_reference((&qv, &kv, &vv), dims, off, &bias_values);
        assert_close(
            &format!("offset {off}: output"),
            &env.values(out.node()).unwrap(),
            &want,
            1e-12,
        );
        // Gradients of Σ out ⊙ w: central differences of the reference.
        let loss_of = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let o = shifted_reference((q, k, v), dims, off, &bias_values);
            o.iter().zip(&w).map(|(a, b)| a * b).sum()
        };
        for (which, (param, base)) in [(&q, &qv), (&k, &kv), (&v, &vv)].into_iter().enumerate() {
            let got = env.values(param.grad().expect("a gradient")).unwrap();
            for i in (0..base.len()).step_by(7) {
                let (mut plus, mut minus) = (base.clone(), base.clone());
                plus[i] += 1e-6;
                minus[i] -= 1e-6;
                let [lp, lm] = [&plus, &minus].map(|x| match which {
                    0 => loss_of(x, &kv, &vv),
                    1 => loss_of(&qv, x, &vv),
                    _ => loss_of(&qv, &kv, x),
                });
                let fd = (lp - lm) / 2e-6;
                assert!(
                    (got[i] - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                    "offset {off}: gradient {which} [{i}]: {} vs finite difference {fd}",
                    got[i]
                );
            }
        }
    }
}

/// A causal offset on an attention that is not causal, and a key bias of the wrong shape, are
/// refused with what to do.
#[test]
fn a_bad_offset_or_key_bias_is_refused() {
    let x = param(Prec::F32, "x", &[1, 3, 2, 4], 1);
    let offset = arrayjit_ir::StaticSymbol::new("offset", 4);
    let not_causal = AttentionOptions {
        causal_offset: Some(offset),
        ..AttentionOptions::default()
    };
    let msg = Tensor::attention(AttentionLayout::TimeFirst, &x, &x, &x, &not_causal)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("causal"), "{msg}");
    let bias = Tensor::input(Prec::F32, &[1, 4], "bias", &[0.0; 4]).unwrap();
    let bad_bias = AttentionOptions {
        causal: true,
        key_bias: Some(bias),
        ..AttentionOptions::default()
    };
    let msg = Tensor::attention(AttentionLayout::TimeFirst, &x, &x, &x, &bad_bias)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("key bias") && msg.contains("[1, 3]"), "{msg}");
}

//! Gradients of every operation checked against central finite differences, both computed by
//! the reference interpreter in f64.

use arrayjit_ir::{InterpEnv, Prec, Result};
use arrayjit_tensor::losses;
use arrayjit_tensor::{Init, Tensor, forward_program, grad_program};

fn param(label: &str, dims: &[usize], values: &[f64]) -> Tensor {
    let t = Tensor::param_with_prec(label, Prec::F64, dims, Init::Zeros, 0, 0).unwrap();
    t.node().host().set_values(values).unwrap();
    t
}

fn input(dims: &[usize], values: &[f64]) -> Tensor {
    Tensor::input(Prec::F64, dims, "input", values).unwrap()
}

fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|i| lo + (hi - lo) * ((i * 7 % n.max(1)) as f64 + 0.5) / n as f64)
        .collect()
}

fn run_scalar(code: &arrayjit_ir::LowLevel, node: &arrayjit_ir::Tnode) -> f64 {
    let mut env = InterpEnv::from_host_arrays(code);
    env.run(code, &[]).unwrap();
    env.values(node).unwrap()[0]
}

/// Checks d(loss)/d(param) for `loss = Σ out ⊙ w` with fixed random weights `w`.
fn check(name: &str, params: &[&Tensor], out: Result<Tensor>) {
    let out = out.unwrap_or_else(|e| panic!("{name}: {e}"));
    let n: usize = out.dims().iter().product();
    let w = input(out.dims(), &spread(n, -1.0, 1.3));
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let code = grads.program.lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    let fwd = forward_program(&[&loss]).lower(&[]).unwrap();
    for p in params {
        let analytic = env.values(p.grad().expect("gradient node")).unwrap();
        let base = p.node().host().get_values().unwrap();
        for i in 0..base.len() {
            let eps = 1e-6 * (1.0 + base[i].abs());
            let mut v = base.clone();
            v[i] = base[i] + eps;
            p.node().host().set_values(&v).unwrap();
            let up = run_scalar(&fwd, loss.node());
            v[i] = base[i] - eps;
            p.node().host().set_values(&v).unwrap();
            let down = run_scalar(&fwd, loss.node());
            p.node().host().set_values(&base).unwrap();
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                (numeric - analytic[i]).abs() <= 1e-5 * (1.0 + numeric.abs()),
                "{name}: d/d{}[{i}] analytic {} vs numeric {numeric}",
                p.label(),
                analytic[i]
            );
        }
    }
}

/// erf, GELU (both forms) and SiLU: gradients against finite differences, over negative,
/// small and large inputs.
#[test]
fn activations() {
    let x = param(
        "x",
        &[2, 4],
        &[-3.0, -1.5, -0.5, -0.1, 0.05, 0.25, 1.0, 2.5],
    );
    check("erf", &[&x], x.erf());
    check("gelu", &[&x], x.gelu());
    check("gelu_tanh", &[&x], x.gelu_tanh());
    check("silu", &[&x], x.silu());
    check("gelu of a product", &[&x], x.mul(&x).unwrap().gelu());
}

#[test]
fn elementwise_binary_ops_with_broadcasting() {
    let a = param("a", &[3, 1], &[0.5, -1.2, 2.0]);
    let b = param("b", &[4], &[1.5, 0.7, -0.9, 2.2]);
    check("add", &[&a, &b], a.add(&b));
    check("sub", &[&a, &b], a.sub(&b));
    check("mul", &[&a, &b], a.mul(&b));
    check("div", &[&a, &b], a.div(&b));
    check("maximum", &[&a, &b], a.maximum(&b));
    check("minimum", &[&a, &b], a.minimum(&b));
    let pos = param("pos", &[3, 1], &[0.5, 1.2, 2.0]);
    check("pow", &[&pos, &b], pos.pow(&b));
    let cond = input(&[4], &[1.0, 0.0, 1.0, 0.0]);
    check("where", &[&a, &b], Tensor::where_(&cond, &a, &b));
}

#[test]
fn elementwise_unary_ops() {
    let x = param("x", &[5], &[-1.3, -0.4, 0.3, 0.9, 1.7]);
    let pos = param("pos", &[5], &[0.2, 0.7, 1.1, 2.5, 3.3]);
    check("neg", &[&x], x.neg());
    check("relu", &[&x], x.relu());
    check("exp", &[&x], x.exp());
    check("tanh", &[&x], x.tanh());
    check("sigmoid", &[&x], x.sigmoid());
    check("scale", &[&x], x.scale(-2.5));
    check("add_scalar", &[&x], x.add_scalar(3.0));
    check("log", &[&pos], pos.log());
    check("sqrt", &[&pos], pos.sqrt());
    check("recip", &[&pos], pos.recip());
    check(
        "composite",
        &[&x, &pos],
        x.mul(&pos).unwrap().tanh().unwrap().mul(&x),
    );
}

#[test]
fn contractions_reductions_and_shapes() {
    let a = param("a", &[2, 3], &spread(6, -1.0, 1.0));
    let b = param("b", &[3, 4], &spread(12, -0.8, 1.1));
    check("matmul", &[&a, &b], a.matmul(&b));
    check(
        "einsum outer",
        &[&a, &b],
        Tensor::einsum("ij,kl->ijl", &[&a, &b]),
    );
    check(
        "einsum sum-only",
        &[&a, &b],
        Tensor::einsum("ij,kl->l", &[&a, &b]),
    );
    check("sum", &[&a], a.sum(&[1]));
    check("sum all", &[&a], a.sum_all());
    check("mean", &[&b], b.mean(&[0]));
    check("max", &[&b], b.max(&[1]));
    check("transpose", &[&a], a.transpose(&[1, 0]));
    check("reshape", &[&b], b.reshape(&[2, 6]));
    check(
        "einsum transpose-sum",
        &[&b],
        Tensor::einsum("ij->ji", &[&b]),
    );
}

#[test]
fn losses() {
    let pred = param("pred", &[4], &[0.3, -0.7, 1.2, 0.1]);
    let target = input(&[4], &[0.0, -1.0, 1.0, 0.5]);
    check("mse", &[&pred], losses::mse(&pred, &target));
    let labels = input(&[4], &[1.0, -1.0, 1.0, -1.0]);
    check("hinge", &[&pred], losses::hinge(&pred, &labels));
    let logits = param("logits", &[2, 3], &[0.2, -0.5, 1.1, 0.7, 0.3, -0.2]);
    let one_hot = input(&[2, 3], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    check(
        "softmax cross-entropy",
        &[&logits],
        losses::softmax_cross_entropy(&logits, &one_hot),
    );
}

#[test]
fn shape_errors_name_the_op_and_both_shapes() {
    let a = param("a", &[2, 3], &[0.0; 6]);
    let b = param("b", &[4], &[0.0; 4]);
    let err = a.add(&b).unwrap_err().to_string();
    assert!(
        err.contains("add") && err.contains("[2, 3]") && err.contains("[4]"),
        "{err}"
    );
    let err = a.matmul(&b).unwrap_err().to_string();
    assert!(err.contains("matmul"), "{err}");
    assert!(a.reshape(&[5]).is_err());
    assert!(a.sum(&[2]).is_err());
    assert!(a.transpose(&[0, 0]).is_err());
    let x = input(&[3], &[1.0, 2.0, 3.0]);
    assert!(
        grad_program(&x.exp().unwrap()).is_err(),
        "no parameter, no gradient"
    );
}

#[test]
fn operators_are_the_methods() {
    let a = param("a", &[2], &[1.5, -2.0]);
    let b = param("b", &[2], &[0.5, 4.0]);
    let e = (&(&(&a + &b).unwrap() * &a).unwrap() - &(-&b).unwrap()).unwrap();
    let e = (&e / &b).unwrap();
    check("operators", &[&a, &b], Ok(e.clone()));
    let code = forward_program(&[&e]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    // ((a + b) * a + b) / b
    assert_eq!(
        env.values(e.node()).unwrap(),
        vec![(2.0 * 1.5 + 0.5) / 0.5, (2.0 * -2.0 + 4.0) / 4.0]
    );
    assert!((&a + &param("c", &[3], &[0.0; 3])).is_err());
}

/// Gathers: an embedding lookup with repeated ids (their gradients add up in one row) and a
/// gather along a middle axis.
#[test]
fn gathers_scatter_their_gradients() {
    let table = param("table", &[4, 3], &spread(12, -1.0, 1.0));
    let ids = Tensor::ids(&[2, 3], "ids", &[1, 3, 1, 0, 1, 2], 4).unwrap();
    check("embedding", &[&table], table.embedding(&ids));
    let cube = param("cube", &[2, 4, 2], &spread(16, -2.0, 2.0));
    let picks = Tensor::ids(&[3], "picks", &[3, 3, 0], 4).unwrap();
    check("take axis 1", &[&cube], cube.take(&picks, 1));
}

/// Softmax and log-softmax over each axis, layer norm and RMS norm (gains and biases too), and
/// cross-entropy on integer targets over two leading axes.
#[test]
fn row_operations_and_integer_cross_entropy() {
    let x = param("x", &[2, 3, 4], &spread(24, -2.0, 2.5));
    for axis in 0..3 {
        check(&format!("softmax axis {axis}"), &[&x], x.softmax(axis));
        check(
            &format!("log_softmax axis {axis}"),
            &[&x],
            x.log_softmax(axis),
        );
    }
    let gain = param("gain", &[4], &[1.0, 0.5, -1.5, 2.0]);
    let bias = param("bias", &[4], &[0.1, -0.2, 0.3, 0.0]);
    check(
        "layer_norm",
        &[&x, &gain, &bias],
        x.layer_norm(&gain, &bias, 1e-5),
    );
    check("rms_norm", &[&x, &gain], x.rms_norm(&gain, 1e-5));
    check("sum_keepdim", &[&x], x.sum_keepdim(&[1]));
    check("narrow", &[&x], x.narrow(2, 1, 2));
    check(
        "narrow of a reshape",
        &[&x],
        x.reshape(&[6, 4]).and_then(|r| r.narrow(0, 2, 3)),
    );
    check("max_keepdim", &[&x], x.max_keepdim(&[2]));
    let targets = Tensor::ids(&[2, 3], "targets", &[0, 3, 2, 2, 1, 0], 4).unwrap();
    check("cross_entropy", &[&x], losses::cross_entropy(&x, &targets));
}

/// Masks computed in code: the causal mask is 1 exactly above the diagonal, and a masked
/// softmax puts no weight on the future.
#[test]
fn causal_masks_hide_the_future() {
    let mask = Tensor::causal_mask(Prec::F64, 3).unwrap();
    let code = forward_program(&[&mask]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    assert_eq!(
        env.values(mask.node()).unwrap(),
        vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    );
    let scores = param("scores", &[3, 3], &spread(9, -1.0, 1.0));
    let low = Tensor::full(Prec::F64, &[], -1e9).unwrap();
    let masked = Tensor::where_(&mask, &low, &scores).unwrap();
    check("masked softmax", &[&scores], masked.softmax(1));
}

/// Ids are checked where they enter: one outside the table is a typed error.
#[test]
fn out_of_range_ids_are_refused_on_entry() {
    let err = Tensor::ids(&[3], "ids", &[0, 5, 1], 5).unwrap_err();
    assert!(
        matches!(err, arrayjit_ir::Error::IndexOutOfBounds { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("id 5 at position 1"), "{err}");
    let ids = Tensor::ids(&[2], "ids", &[0, 1], 2).unwrap();
    assert!(ids.set_ids(&[2, 0], 2).is_err());
    assert_eq!(
        ids.values().unwrap(),
        vec![0.0, 1.0],
        "a refused update changes nothing"
    );
}

/// Backprop writes each gradient with its first contribution (no zero-fill before it) and adds
/// the later ones: a tensor used twice, a broadcast bias (whose first contribution is a sum),
/// and a residual add all get their finite-difference gradients.
#[test]
fn gradients_are_written_by_their_first_contribution() {
    use arrayjit_ir::{Assignments, FetchOp};
    let a = param("a", &[3, 4], &spread(12, -1.5, 1.5));
    let b = param("b", &[4], &[0.3, -0.4, 0.5, -0.6]);
    let build = || -> Result<Tensor> {
        let h = a.mul(&a)?.add(&b)?;
        h.tanh()?.add(&h)
    };
    check("residual", &[&a, &b], build());
    let loss = build().unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    let Assignments::Seq(stmts) = &grads.program else {
        panic!("a sequence")
    };
    let fills: Vec<f64> = stmts
        .iter()
        .filter_map(|s| match s {
            Assignments::Fetch {
                array,
                op: FetchOp::Constant(v),
            } if array.debug_name().starts_with("grad") => Some(*v),
            _ => None,
        })
        .collect();
    // Only the loss's seed: every other gradient has a contribution that writes it.
    assert_eq!(fills, vec![1.0]);
}

/// Dropout: with the step fixed the mask is fixed, so finite differences see the same mask the
/// backward pass recomputes.
#[test]
fn dropout() {
    let rng = arrayjit_tensor::rng::RandomStream::new(17, "dropout_step").unwrap();
    let x = param("x", &[3, 5], &spread(15, -2.0, 2.0));
    check("dropout", &[&x], x.dropout(0.4, &rng));
    check(
        "dropout of tanh",
        &[&x],
        x.tanh().unwrap().dropout(0.5, &rng),
    );
}

/// Guarded products (causal attention's): the gradients against finite differences, for the
/// guard on the result (scores), on the depth (the weighted sum of values), with an offset;
/// the forward values against the product with the skipped terms masked out by hand.
#[test]
fn guarded_products_skip_their_terms_and_their_gradients() {
    use arrayjit_ir::EinsumGuard;
    let (t, e) = (4, 3);
    let q = param("q", &[t, e], &spread(t * e, -1.0, 1.2));
    let k = param("k", &[t, e], &spread(t * e, -0.8, 0.9));
    let p = param("p", &[t, t], &spread(t * t, -0.7, 1.1));
    let causal = [EinsumGuard::at_most('s', 't', 0)];
    check(
        "scores",
        &[&q, &k],
        Tensor::guarded_product("te,se->ts", &q, &k, &causal),
    );
    check(
        "weighted values",
        &[&p, &k],
        Tensor::guarded_product("ts,se->te", &p, &k, &causal),
    );
    check(
        "strictly earlier keys",
        &[&p, &q],
        Tensor::guarded_product("ts,se->te", &p, &q, &[EinsumGuard::at_most('s', 't', -1)]),
    );
    // The values: the plain product of p with its upper triangle zeroed by hand.
    let out = Tensor::guarded_product("ts,se->te", &p, &k, &causal).unwrap();
    let code = forward_program(&[&out]).lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    let got = env.values(out.node()).unwrap();
    let (pv, kv) = (
        p.node().host().get_values().unwrap(),
        k.node().host().get_values().unwrap(),
    );
    for row in 0..t {
        for col in 0..e {
            let want: f64 = (0..=row).map(|s| pv[row * t + s] * kv[s * e + col]).sum();
            assert!((got[row * e + col] - want).abs() < 1e-12, "({row}, {col})");
        }
    }
    // A guard letter in only one of the result and the factors could not guard a gradient.
    let err = Tensor::guarded_product("ts,se->te", &p, &k, &[EinsumGuard::at_most('x', 't', 0)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("'x'") && err.contains("guard"), "{err}");
    let err = Tensor::guarded_product("ab,bc->ac", &p, &k, &[EinsumGuard::at_most('a', 'c', 0)]);
    assert!(err.is_ok(), "a and c are both in the result and a factor");
    let one_sided =
        Tensor::guarded_product("ab,bc->c", &p, &k, &[EinsumGuard::at_most('a', 'c', 0)])
            .unwrap_err()
            .to_string();
    assert!(one_sided.contains("only one"), "{one_sided}");
}

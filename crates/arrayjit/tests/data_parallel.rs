//! Data parallelism: gradient steps of a small two-layer regression model split across shards
//! (streams on two devices) equal the single-device full-batch steps within float tolerance.
//! Also reports the memory the pool planner's reuse saves on this example.

use arrayjit::prelude::*;
use arrayjit::runtime::{DataParallel, RuntimeConfig, backend_with_config};

const SHARDS: usize = 4;
const ROWS: usize = 8;
const FEATURES: usize = 3;
const HIDDEN: usize = 16;
const LR: f64 = 0.02;

fn data() -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = (0..SHARDS * ROWS * FEATURES)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0)
        .collect();
    let y: Vec<f64> = (0..SHARDS * ROWS)
        .map(|r| (x[r * FEATURES] - 0.5 * x[r * FEATURES + 1]).tanh() + 0.25 * x[r * FEATURES + 2])
        .collect();
    (x, y)
}

fn initial_w1() -> Vec<f64> {
    (0..FEATURES * HIDDEN)
        .map(|i| ((i * 13 % 17) as f64 - 8.0) / 16.0)
        .collect()
}

fn initial_w2() -> Vec<f64> {
    (0..HIDDEN)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) / 10.0)
        .collect()
}

fn node(dims: &[usize], label: &str) -> Tnode {
    Tnode::new(Prec::F32, dims, &[label]).unwrap()
}

fn hosted(dims: &[usize], label: &str, values: &[f64]) -> Tnode {
    let t = node(dims, label);
    t.host().set_values(values).unwrap();
    t
}

fn device_grad(dims: &[usize], label: &str) -> Tnode {
    let t = node(dims, label);
    t.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
        .unwrap();
    t
}

fn rhs(op: BinOp, a: &Tnode, b: &Tnode) -> AccumRhs {
    AccumRhs::Binop(op, Operand::Node(a.clone()), Operand::Node(b.clone()))
}

fn einsum(spec: &str, accum: BinOp, lhs: &Tnode, r: AccumRhs, init: bool) -> Assignments {
    Assignments::einsum(spec, accum, lhs, r, init).unwrap()
}

/// Gradients of `½ Σ (tanh(xs·w1)·w2 - ys)²` with respect to `w1` and `w2`.
fn gradients(
    xs: &Tnode,
    ys: &Tnode,
    w1: &Tnode,
    w2: &Tnode,
    g1: &Tnode,
    g2: &Tnode,
    rows: usize,
) -> Assignments {
    let z = node(&[rows, HIDDEN], "z");
    let a = node(&[rows, HIDDEN], "a");
    let out = node(&[rows], "out");
    let err = node(&[rows], "err");
    let da = node(&[rows, HIDDEN], "da");
    let t = node(&[rows, HIDDEN], "da_a");
    let t2 = node(&[rows, HIDDEN], "da_a_a");
    let dz = node(&[rows, HIDDEN], "dz");
    einsum("ij,jk->ik", BinOp::Add, &z, rhs(BinOp::Mul, xs, w1), true)
        .then(Assignments::pointwise_unop(&a, UnOp::Tanh, &z))
        .then(einsum(
            "ik,k->i",
            BinOp::Add,
            &out,
            rhs(BinOp::Mul, &a, w2),
            true,
        ))
        .then(Assignments::pointwise_binop(&err, BinOp::Sub, &out, ys))
        .then(einsum(
            "i,ik->k",
            BinOp::Add,
            g2,
            rhs(BinOp::Mul, &err, &a),
            true,
        ))
        .then(einsum(
            "i,k->ik",
            BinOp::Arg2,
            &da,
            rhs(BinOp::Mul, &err, w2),
            false,
        ))
        .then(Assignments::pointwise_binop(&t, BinOp::Mul, &da, &a))
        .then(Assignments::pointwise_binop(&t2, BinOp::Mul, &t, &a))
        .then(Assignments::pointwise_binop(&dz, BinOp::Sub, &da, &t2))
        .then(einsum(
            "ij,ik->jk",
            BinOp::Add,
            g1,
            rhs(BinOp::Mul, xs, &dz),
            true,
        ))
}

/// `w -= lr * g` for both parameters.
fn update(params: [&Tnode; 2], grads: [&Tnode; 2], lr: &Tnode) -> Assignments {
    let mut program = Assignments::Noop;
    for (w, g) in params.into_iter().zip(grads) {
        let step = node(w.dims(), "step");
        let spec = if w.dims().len() == 2 {
            ",jk->jk"
        } else {
            ",k->k"
        };
        let own = if w.dims().len() == 2 {
            "jk->jk"
        } else {
            "k->k"
        };
        program = program
            .then(einsum(
                spec,
                BinOp::Arg2,
                &step,
                rhs(BinOp::Mul, lr, g),
                false,
            ))
            .then(einsum(
                own,
                BinOp::Sub,
                w,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(step)),
                false,
            ));
    }
    program
}

fn single_device(steps: usize) -> Vec<f64> {
    let (x, y) = data();
    let b = arrayjit::backend("sync_cc").unwrap();
    let xs = hosted(&[SHARDS * ROWS, FEATURES], "x_all", &x);
    let ys = hosted(&[SHARDS * ROWS], "y_all", &y);
    let w1 = hosted(&[FEATURES, HIDDEN], "w1_ref", &initial_w1());
    let w2 = hosted(&[HIDDEN], "w2_ref", &initial_w2());
    let lr = hosted(&[], "lr", &[LR]);
    let g1 = device_grad(&[FEATURES, HIDDEN], "g1_ref");
    let g2 = device_grad(&[HIDDEN], "g2_ref");
    let grad = b
        .compile(CompileRequest::routine(
            "grad_full",
            &gradients(&xs, &ys, &w1, &w2, &g1, &g2, SHARDS * ROWS),
        ))
        .unwrap();
    let upd = b
        .compile(CompileRequest::routine(
            "update_full",
            &update([&w1, &w2], [&g1, &g2], &lr),
        ))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let rg = Context::new(&stream).link(&grad).unwrap();
    let ru = rg.context().link(&upd).unwrap();
    for _ in 0..steps {
        rg.run().unwrap();
        ru.run().unwrap();
    }
    let mut w = w1.host().get_values().unwrap();
    w.extend(w2.host().get_values().unwrap());
    w
}

struct Report {
    params: Vec<f64>,
    scratch_planned: usize,
    scratch_bump: usize,
    device_bytes: usize,
}

/// Trains `steps` data-parallel steps; `fuse_loops` turns the optimizer's loop fusion on.
fn data_parallel(
    steps: usize,
    backend_name: &str,
    stack_threshold: usize,
    fuse_loops: bool,
) -> Report {
    let (x, y) = data();
    let config = RuntimeConfig {
        num_devices: Some(2),
        ..Default::default()
    };
    let b = backend_with_config(backend_name, &config).unwrap();
    b.set_optimize_settings(arrayjit::opt::OptimizeSettings {
        stack_threshold_bytes: stack_threshold,
        enable_loop_fusion: fuse_loops,
        ..b.optimize_settings()
    });
    let x_all = hosted(&[SHARDS, ROWS, FEATURES], "x_shards", &x);
    let y_all = hosted(&[SHARDS, ROWS], "y_shards", &y);
    let shard = StaticSymbol::new("shard", SHARDS);
    let xs = node(&[ROWS, FEATURES], "xs");
    let ys = node(&[ROWS], "ys");
    let w1 = hosted(&[FEATURES, HIDDEN], "w1", &initial_w1());
    let w2 = hosted(&[HIDDEN], "w2", &initial_w2());
    let lr = hosted(&[], "lr", &[LR]);
    let g1 = device_grad(&[FEATURES, HIDDEN], "g1");
    let g2 = device_grad(&[HIDDEN], "g2");
    let slices = Assignments::Fetch {
        array: xs.clone(),
        op: FetchOp::Slice {
            batch: shard.clone(),
            sliced: x_all,
        },
    }
    .then(Assignments::Fetch {
        array: ys.clone(),
        op: FetchOp::Slice {
            batch: shard.clone(),
            sliced: y_all,
        },
    });
    let grad_program = slices.then(gradients(&xs, &ys, &w1, &w2, &g1, &g2, ROWS));
    let grad = b
        .compile(
            CompileRequest::routine("grad_shard", &grad_program)
                .bindings(std::slice::from_ref(&shard)),
        )
        .unwrap();
    let upd = b
        .compile(CompileRequest::routine(
            "update",
            &update([&w1, &w2], [&g1, &g2], &lr),
        ))
        .unwrap();
    let streams: Vec<Stream> = (0..SHARDS)
        .map(|i| b.get_device(i % 2).unwrap().new_stream().unwrap())
        .collect();
    let dp = DataParallel::new(
        &b,
        &streams,
        &grad,
        &upd,
        &[g1.clone(), g2.clone()],
        &[w1.clone(), w2.clone()],
    )
    .unwrap();
    for i in 0..SHARDS {
        dp.grad_routine(i)
            .unwrap()
            .set_static(&shard, i as i64)
            .unwrap();
    }
    for _ in 0..steps {
        dp.step().unwrap();
    }
    dp.await_all().unwrap();
    let device_bytes = (0..2).map(|d| b.get_device(d).unwrap().used_memory()).sum();
    let mut params = w1.host().get_values().unwrap();
    params.extend(w2.host().get_values().unwrap());
    let plan = &grad.optimized().scratch;
    println!("{plan}");
    Report {
        params,
        scratch_planned: plan.total_bytes(),
        scratch_bump: plan.bump_bytes(),
        device_bytes,
    }
}

#[test]
fn data_parallel_steps_equal_the_single_device_steps() {
    let steps = 3;
    let reference = single_device(steps);
    for name in ["multicore_cc", "sync_cc"] {
        for stack_threshold in [16 * 1024, 0] {
            let r = data_parallel(steps, name, stack_threshold, true);
            for (a, b) in r.params.iter().zip(&reference) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{name}: {:?} vs {reference:?}",
                    r.params
                );
            }
        }
    }
    let initial: Vec<f64> = initial_w1().into_iter().chain(initial_w2()).collect();
    assert!(
        reference
            .iter()
            .zip(&initial)
            .any(|(a, b)| (a - b).abs() > 1e-3)
    );
}

#[test]
fn pool_planner_reuse_on_the_data_parallel_example() {
    // All locals in the scratch pool, so the planner decides every temporary's place; loop
    // fusion off, since it joins this small example's row loops into one statement, where
    // every temporary lives as long as the others (nothing left to reuse).
    let r = data_parallel(1, "multicore_cc", 0, false);
    println!(
        "data-parallel example, gradient routine scratch: {} bytes planned vs {} bytes bump \
         allocated ({} saved per stream, {} streams); device memory in use: {} bytes",
        r.scratch_planned,
        r.scratch_bump,
        r.scratch_bump - r.scratch_planned,
        SHARDS,
        r.device_bytes
    );
    assert!(r.scratch_planned < r.scratch_bump);
}

#[test]
fn gradients_must_be_computed_by_the_gradient_routine() {
    let b = arrayjit::backend("multicore_cc").unwrap();
    let x = hosted(&[2], "x", &[1.0, 2.0]);
    let y = device_grad(&[2], "y");
    let not_grad = device_grad(&[2], "not_grad");
    let code = b
        .compile(CompileRequest::routine(
            "g",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let streams = vec![b.get_device(0).unwrap().new_stream().unwrap()];
    let err = DataParallel::new(&b, &streams, &code, &code, &[not_grad], &[])
        .err()
        .unwrap();
    assert!(err.to_string().contains("not_grad"), "{err}");
}

//! Data parallelism: linear-regression gradient steps split across shards (streams on two
//! devices) equal the single-device full-batch steps within float tolerance.

use arrayjit::prelude::*;
use arrayjit::runtime::{DataParallel, RuntimeConfig, backend_with_config};

const SHARDS: usize = 4;
const ROWS: usize = 8;
const FEATURES: usize = 3;
const LR: f64 = 0.01;

fn data() -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = (0..SHARDS * ROWS * FEATURES)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0)
        .collect();
    let true_w = [0.5, -1.25, 2.0];
    let y: Vec<f64> = (0..SHARDS * ROWS)
        .map(|r| {
            (0..FEATURES)
                .map(|j| x[r * FEATURES + j] * true_w[j])
                .sum::<f64>()
                + 0.1 * ((r % 5) as f64 - 2.0)
        })
        .collect();
    (x, y)
}

fn node(dims: &[usize], label: &str) -> Tnode {
    Tnode::new(Prec::F32, dims, &[label]).unwrap()
}

fn hosted(dims: &[usize], label: &str, values: &[f64]) -> Tnode {
    let t = node(dims, label);
    t.set_values(values).unwrap();
    t
}

/// `g = Σ_rows (xs·w - ys) xs` for rows `xs`, `ys`; returns the program.
fn gradient(xs: &Tnode, ys: &Tnode, w: &Tnode, g: &Tnode, rows: usize) -> Assignments {
    let pred = node(&[rows], "pred");
    let err = node(&[rows], "err");
    let rhs = |op, a: &Tnode, b: &Tnode| {
        AccumRhs::Binop(op, Operand::Node(a.clone()), Operand::Node(b.clone()))
    };
    Assignments::einsum("ij,j->i", BinOp::Add, &pred, rhs(BinOp::Mul, xs, w), true)
        .unwrap()
        .then(Assignments::pointwise_binop(&err, BinOp::Sub, &pred, ys))
        .then(
            Assignments::einsum("i,ij->j", BinOp::Add, g, rhs(BinOp::Mul, &err, xs), true).unwrap(),
        )
}

/// `w -= lr * g`.
fn update(w: &Tnode, g: &Tnode, lr: &Tnode) -> Assignments {
    let step = node(&[FEATURES], "step");
    Assignments::einsum(
        ",j->j",
        BinOp::Arg2,
        &step,
        AccumRhs::Binop(
            BinOp::Mul,
            Operand::Node(lr.clone()),
            Operand::Node(g.clone()),
        ),
        false,
    )
    .unwrap()
    .then(
        Assignments::einsum(
            "j->j",
            BinOp::Sub,
            w,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(step)),
            false,
        )
        .unwrap(),
    )
}

fn single_device(steps: usize) -> Vec<f64> {
    let (x, y) = data();
    let b = arrayjit::backend("sync_cc").unwrap();
    let xs = hosted(&[SHARDS * ROWS, FEATURES], "x_all", &x);
    let ys = hosted(&[SHARDS * ROWS], "y_all", &y);
    let w = hosted(&[FEATURES], "w_ref", &[0.0; FEATURES]);
    let lr = hosted(&[], "lr", &[LR]);
    let g = node(&[FEATURES], "g_ref");
    g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
        .unwrap();
    let grad = b
        .compile("grad_full", &gradient(&xs, &ys, &w, &g, SHARDS * ROWS), &[])
        .unwrap();
    let upd = b.compile("update_full", &update(&w, &g, &lr), &[]).unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let rg = Context::new(&stream).link(&grad).unwrap();
    let ru = rg.context().link(&upd).unwrap();
    for _ in 0..steps {
        rg.run().unwrap();
        ru.run().unwrap();
    }
    w.get_values().unwrap()
}

fn data_parallel(steps: usize, backend_name: &str) -> (Vec<f64>, usize) {
    let (x, y) = data();
    let config = RuntimeConfig {
        num_devices: Some(2),
        ..Default::default()
    };
    let b = backend_with_config(backend_name, &config).unwrap();
    let x_all = hosted(&[SHARDS, ROWS, FEATURES], "x_shards", &x);
    let y_all = hosted(&[SHARDS, ROWS], "y_shards", &y);
    let shard = StaticSymbol::new("shard", SHARDS);
    let xs = node(&[ROWS, FEATURES], "xs");
    let ys = node(&[ROWS], "ys");
    let w = hosted(&[FEATURES], "w", &[0.0; FEATURES]);
    let lr = hosted(&[], "lr", &[LR]);
    let g = node(&[FEATURES], "g");
    g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
        .unwrap();
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
    let grad_program = slices.then(gradient(&xs, &ys, &w, &g, ROWS));
    let grad = b
        .compile("grad_shard", &grad_program, std::slice::from_ref(&shard))
        .unwrap();
    let upd = b.compile("update", &update(&w, &g, &lr), &[]).unwrap();
    // Two streams on each of the two devices.
    let streams: Vec<Stream> = (0..SHARDS)
        .map(|i| b.get_device(i % 2).unwrap().new_stream().unwrap())
        .collect();
    let dp = DataParallel::new(
        &b,
        &streams,
        &grad,
        &upd,
        std::slice::from_ref(&g),
        std::slice::from_ref(&w),
    )
    .unwrap();
    for i in 0..SHARDS {
        dp.grad_routine(i)
            .unwrap()
            .set_static(&shard, i as i64)
            .unwrap();
    }
    let before = (0..2).map(|d| b.get_device(d).unwrap().used_memory()).sum();
    for _ in 0..steps {
        dp.step().unwrap();
    }
    dp.await_all().unwrap();
    (w.get_values().unwrap(), before)
}

#[test]
fn data_parallel_steps_equal_the_single_device_steps() {
    let steps = 3;
    let reference = single_device(steps);
    for name in ["multicore_cc", "sync_cc"] {
        let (w, _) = data_parallel(steps, name);
        for (a, b) in w.iter().zip(&reference) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{name}: {w:?} vs {reference:?}"
            );
        }
        assert!(
            w.iter().any(|v| v.abs() > 1e-3),
            "the parameters moved: {w:?}"
        );
    }
}

#[test]
fn gradients_must_be_computed_by_the_gradient_routine() {
    let b = arrayjit::backend("multicore_cc").unwrap();
    let x = hosted(&[2], "x", &[1.0, 2.0]);
    let y = node(&[2], "y");
    y.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
        .unwrap();
    let not_grad = node(&[2], "not_grad");
    not_grad
        .update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
        .unwrap();
    let code = b
        .compile("g", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
        .unwrap();
    let streams = vec![b.get_device(0).unwrap().new_stream().unwrap()];
    let err = DataParallel::new(&b, &streams, &code, &code, &[not_grad], &[])
        .err()
        .unwrap();
    assert!(err.to_string().contains("not_grad"), "{err}");
}

//! Tests of the optimizer: fusion of the relu(W·x + b) chain, memory-mode decisions, errors,
//! and a property test that optimization preserves results on generated programs.

use proptest::prelude::*;

use arrayjit_ir::assignments::{AccumRhs, Assignments, Operand};
use arrayjit_ir::error::Error;
use arrayjit_ir::interpret::InterpEnv;
use arrayjit_ir::low_level::LowLevel;
use arrayjit_ir::memory::{MemoryMode, MemoryType};
use arrayjit_ir::ops::{BinOp, UnOp};
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

use super::{OptimizeSettings, optimize};

fn hosted(prec: Prec, dims: &[usize], label: &str, values: impl Fn(usize) -> f64) -> Tnode {
    let t = Tnode::new(prec, dims, &[label]).unwrap();
    let n: usize = dims.iter().product();
    t.host()
        .set_values(&(0..n).map(values).collect::<Vec<_>>())
        .unwrap();
    t
}

/// `y[i, j] = op(a[i], b[j])`.
fn outer(y: &Tnode, op: BinOp, a: &Tnode, b: &Tnode) -> Assignments {
    Assignments::einsum(
        "i,j->ij",
        BinOp::Arg2,
        y,
        AccumRhs::Binop(op, Operand::Node(a.clone()), Operand::Node(b.clone())),
        false,
    )
    .unwrap()
}

fn top_level_statements(code: &LowLevel) -> usize {
    match code {
        LowLevel::Seq(items) => items.len(),
        LowLevel::Noop => 0,
        _ => 1,
    }
}

/// Builds `y = relu(w·x + b)`; returns (assignments, w, x, b, wx, pre, y).
fn mlp_layer() -> (Assignments, [Tnode; 6]) {
    let w = hosted(Prec::F32, &[3, 4], "w", |i| (i as f64 - 5.0) * 0.5);
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64 - 1.0);
    let b = hosted(Prec::F32, &[3], "b", |i| i as f64 * 0.25 - 1.0);
    let wx = Tnode::new(Prec::F32, &[3], &["wx"]).unwrap();
    let pre = Tnode::new(Prec::F32, &[3], &["pre"]).unwrap();
    let y = Tnode::new(Prec::F32, &[3], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let a = Assignments::einsum(
        "ij,j->i",
        BinOp::Add,
        &wx,
        AccumRhs::Binop(
            BinOp::Mul,
            Operand::Node(w.clone()),
            Operand::Node(x.clone()),
        ),
        true,
    )
    .unwrap()
    .then(Assignments::pointwise_binop(&pre, BinOp::Add, &wx, &b))
    .then(Assignments::pointwise_unop(&y, UnOp::Relu, &pre));
    (a, [w, x, b, wx, pre, y])
}

#[test]
fn relu_of_affine_fuses_into_one_loop() {
    let (a, [w, x, b, wx, pre, y]) = mlp_layer();
    let opt = optimize("layer", &[], &a, &OptimizeSettings::default()).unwrap();
    assert!(
        wx.modes().known_virtual() && pre.modes().known_virtual(),
        "{}",
        opt.memory_report()
    );
    assert_eq!(top_level_statements(&opt.code), 1, "{}", opt.code);
    assert_eq!(
        opt.materialized_nodes(),
        vec![w.clone(), x.clone(), b.clone(), y.clone()]
    );
    assert_eq!(opt.inputs(), vec![w.clone(), x.clone(), b.clone()]);
    assert_eq!(opt.outputs(), vec![y.clone()]);
    let report = opt.memory_report();
    assert!(report.contains("inlined"), "{report}");
    let mut env = InterpEnv::from_host_arrays(&opt.code);
    env.run(&opt.code, &[]).unwrap();
    let (wv, xv, bv) = (
        w.host().get_values().unwrap(),
        x.host().get_values().unwrap(),
        b.host().get_values().unwrap(),
    );
    let expected: Vec<f64> = (0..3)
        .map(|i| {
            let s: f64 = (0..4).map(|j| wv[i * 4 + j] * xv[j]).sum::<f64>() + bv[i];
            s.max(0.0)
        })
        .collect();
    assert_eq!(env.values(&y).unwrap(), expected, "{}", opt.code);
}

#[test]
fn broadcast_reads_keep_a_node_local() {
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64);
    let e = Tnode::new(Prec::F32, &[4], &["e"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4, 4], &["y"]).unwrap();
    let a = Assignments::pointwise_unop(&e, UnOp::Exp, &x).then(outer(&y, BinOp::Mul, &e, &e));
    let opt = optimize("outer", &[], &a, &OptimizeSettings::default()).unwrap();
    let mode = e.memory_mode().unwrap();
    assert_eq!(mode.mode, MemoryMode::Local);
    assert!(mode.provenance.contains("read"), "{mode}");
    assert!(opt.local_nodes().contains(&e));
    assert!(y.modes().is_materialized());
}

/// A plain copy read many times per element is inlined (its readers read what it copies), and
/// the node it copies is computed once; a copy through `0 + x` (how a first gradient
/// contribution lowers) counts too. Results are unchanged.
#[test]
fn plain_copies_are_inlined_and_their_source_is_computed_once() {
    for neutral_start in [false, true] {
        let x = hosted(Prec::F32, &[4], "x", |i| i as f64 * 0.5);
        let e = Tnode::new(Prec::F32, &[4], &["e"]).unwrap();
        let c = Tnode::new(Prec::F32, &[4], &["c"]).unwrap();
        let y = Tnode::new(Prec::F32, &[4, 4], &["y"]).unwrap();
        y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let copy = if neutral_start {
            Assignments::einsum(
                "i->i",
                BinOp::Add,
                &c,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(e.clone())),
                true,
            )
            .unwrap()
        } else {
            Assignments::pointwise_unop(&c, UnOp::Identity, &e)
        };
        let a = Assignments::pointwise_unop(&e, UnOp::Exp, &x)
            .then(copy)
            .then(outer(&y, BinOp::Mul, &c, &c));
        let opt = optimize("copy", &[], &a, &OptimizeSettings::default()).unwrap();
        assert!(c.modes().known_virtual(), "{}", opt.memory_report());
        let kept = e.memory_mode().unwrap();
        assert!(!e.modes().known_virtual(), "{}", opt.memory_report());
        assert!(kept.provenance.contains("plain copy"), "{kept}");
        assert_eq!(top_level_statements(&opt.code), 2, "{}", opt.code);
        let mut env = InterpEnv::from_host_arrays(&opt.code);
        env.run(&opt.code, &[]).unwrap();
        let ex: Vec<f64> = (0..4).map(|i| (i as f64 * 0.5).exp()).collect();
        for (k, got) in env.values(&y).unwrap().into_iter().enumerate() {
            let want = ex[k / 4] * ex[k % 4];
            assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
        }
    }
}

#[test]
fn a_virtual_request_that_cannot_hold_is_an_error() {
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64);
    let s = Tnode::new(Prec::F32, &[4], &["s"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4], &["y"]).unwrap();
    s.update_memory_mode(MemoryMode::Virtual, "test: fuse it")
        .unwrap();
    // `x` changes between `s`'s computation and its use: inlining would read the new `x`.
    let a = Assignments::pointwise_unop(&s, UnOp::Sqrt, &x)
        .then(Assignments::pointwise_unop(&x, UnOp::Neg, &x))
        .then(Assignments::pointwise_binop(&y, BinOp::Add, &s, &x));
    let err = optimize("bad", &[], &a, &OptimizeSettings::default()).unwrap_err();
    assert!(matches!(err, Error::Optimization { .. }), "{err}");
    assert!(err.to_string().contains("virtual"), "{err}");
}

/// The visit limit weighs recomputation against memory; a node requested virtual is inlined
/// however often it is read, and computes the same values.
#[test]
fn a_virtual_request_accepts_recomputation() {
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64);
    let s = Tnode::new(Prec::F32, &[4], &["s"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4, 4], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    s.update_memory_mode(MemoryMode::Virtual, "test: recompute it")
        .unwrap();
    let a = Assignments::pointwise_unop(&s, UnOp::Sqrt, &x).then(outer(&y, BinOp::Add, &s, &x));
    let opt = optimize("recompute", &[], &a, &OptimizeSettings::default()).unwrap();
    assert!(s.modes().known_virtual(), "{}", opt.memory_report());
    assert_eq!(top_level_statements(&opt.code), 1, "{}", opt.code);
    let mut env = InterpEnv::from_host_arrays(&opt.code);
    env.run(&opt.code, &[]).unwrap();
    for (k, got) in env.values(&y).unwrap().into_iter().enumerate() {
        let want = ((k / 4) as f64).sqrt() + (k % 4) as f64;
        assert!((got - want).abs() <= 1e-6 * (1.0 + want), "{got} vs {want}");
    }
}

#[test]
fn memory_mode_conflict_across_routines_names_both_provenances() {
    let (a, [_, _, _, wx, _, _]) = mlp_layer();
    optimize("first", &[], &a, &OptimizeSettings::default()).unwrap();
    // A second routine reading the (virtual) wx needs it materialized.
    let out = Tnode::new(Prec::F32, &[3], &["out"]).unwrap();
    let second = Assignments::pointwise_unop(&out, UnOp::Neg, &wx);
    let err = optimize("second", &[], &second, &OptimizeSettings::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::MemoryModeConflict(_)), "{msg}");
    assert!(msg.contains("first") && msg.contains("second"), "{msg}");
}

#[test]
fn simplification_folds_constants_in_the_statement_precision() {
    let y = Tnode::new(Prec::U8, &[2], &["y"]).unwrap();
    let a = Assignments::Fetch {
        array: y.clone(),
        op: arrayjit_ir::assignments::FetchOp::Constant(200.0),
    };
    let y2 = Tnode::new(Prec::U8, &[2], &["y2"]).unwrap();
    let b = Assignments::pointwise_binop(&y2, BinOp::Add, &y, &y);
    let prog = a.then(b);
    let unopt = prog.lower(&[]).unwrap();
    let mut env1 = InterpEnv::new();
    env1.run(&unopt, &[]).unwrap();
    let opt = optimize("fold", &[], &prog, &OptimizeSettings::default()).unwrap();
    let mut env2 = InterpEnv::new();
    env2.run(&opt.code, &[]).unwrap();
    assert_eq!(env1.values(&y2).unwrap(), vec![144.0, 144.0]);
    assert_eq!(env2.values(&y2).unwrap(), vec![144.0, 144.0]);
}

#[derive(Clone, Debug)]
enum Step {
    Unary(UnOp, usize),
    Binary(BinOp, usize, usize),
    /// Sum or max over the second axis of a 2-D node, broadcast back over it.
    ReduceBroadcast(BinOp, usize),
    /// Outer product of two 1-D slices (rows of 2-D nodes' first column).
    Transpose(usize),
    /// Matrix product (a reduction the optimizer may inline).
    Matmul(usize, usize),
    /// An update in place of an existing node by another (`t[i, j] -= s[i, j]`, or with `s`
    /// read transposed): values computed from the old `t` may be inlined only where each
    /// element reads it in the assignment that replaces it.
    Update(usize, usize, bool),
}

fn arb_step() -> impl Strategy<Value = Step> {
    let un = prop_oneof![
        Just(UnOp::Relu),
        Just(UnOp::Neg),
        Just(UnOp::Tanh),
        Just(UnOp::Erf),
        Just(UnOp::Abs),
        Just(UnOp::Satur01),
        Just(UnOp::Identity)
    ];
    let bin = prop_oneof![
        Just(BinOp::Add),
        Just(BinOp::Sub),
        Just(BinOp::Mul),
        Just(BinOp::Max),
        Just(BinOp::Min),
        Just(BinOp::Cmplt),
        Just(BinOp::ReluGate)
    ];
    prop_oneof![
        (un, 0..8usize).prop_map(|(o, a)| Step::Unary(o, a)),
        (bin, 0..8usize, 0..8usize).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (prop_oneof![Just(BinOp::Add), Just(BinOp::Max)], 0..8usize)
            .prop_map(|(o, a)| Step::ReduceBroadcast(o, a)),
        (0..8usize).prop_map(Step::Transpose),
        (0..8usize, 0..8usize).prop_map(|(a, b)| Step::Matmul(a, b)),
        (0..8usize, 0..8usize, any::<bool>()).prop_map(|(t, s, tr)| Step::Update(t, s, tr)),
    ]
}

/// Builds a program of square 2-D nodes from the steps; the last node is the hosted result.
fn build(prec: Prec, n: usize, steps: &[Step], seed: u64) -> (Assignments, Tnode) {
    let mut nodes = vec![
        hosted(prec, &[n, n], "in0", |i| {
            ((i as u64 * 7 + seed) % 9) as f64 * 0.5 - 2.0
        }),
        hosted(prec, &[n, n], "in1", |i| {
            ((i as u64 * 5 + seed * 3) % 7) as f64 * 0.5 - 1.5
        }),
    ];
    let mut prog = Assignments::Noop;
    for (k, step) in steps.iter().enumerate() {
        let pick = |i: usize| nodes[i % nodes.len()].clone();
        let out = Tnode::new(prec, &[n, n], &[&format!("t{k}")]).unwrap();
        if let Step::Update(t, src, transposed) = step {
            let target = pick(*t);
            let spec = if *transposed {
                "ij,ji->ij"
            } else {
                "ij,ij->ij"
            };
            prog = prog.then(
                Assignments::einsum(
                    spec,
                    BinOp::Arg2,
                    &target,
                    AccumRhs::Binop(
                        BinOp::Sub,
                        Operand::Node(target.clone()),
                        Operand::Node(pick(*src)),
                    ),
                    false,
                )
                .unwrap(),
            );
            nodes.push(target);
            continue;
        }
        let a = match step {
            Step::Unary(op, a) => Assignments::pointwise_unop(&out, *op, &pick(*a)),
            Step::Binary(op, a, b) => Assignments::pointwise_binop(&out, *op, &pick(*a), &pick(*b)),
            Step::ReduceBroadcast(op, a) => {
                let red = Tnode::new(prec, &[n], &[&format!("r{k}")]).unwrap();
                Assignments::einsum(
                    "ij->i",
                    *op,
                    &red,
                    AccumRhs::Unop(UnOp::Identity, Operand::Node(pick(*a))),
                    true,
                )
                .unwrap()
                .then(
                    Assignments::einsum(
                        "i,ij->ij",
                        BinOp::Arg2,
                        &out,
                        AccumRhs::Binop(BinOp::Sub, Operand::Node(red), Operand::Node(pick(*a))),
                        false,
                    )
                    .unwrap(),
                )
            }
            Step::Matmul(a, b) => Assignments::einsum(
                "ik,kj->ij",
                BinOp::Add,
                &out,
                AccumRhs::Binop(BinOp::Mul, Operand::Node(pick(*a)), Operand::Node(pick(*b))),
                true,
            )
            .unwrap(),
            Step::Update(..) => unreachable!("handled above"),
            Step::Transpose(a) => Assignments::einsum(
                "ji->ij",
                BinOp::Arg2,
                &out,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(pick(*a))),
                false,
            )
            .unwrap(),
        };
        prog = prog.then(a);
        nodes.push(out);
    }
    let result = nodes.last().unwrap().clone();
    result
        .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    (prog, result)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn optimization_preserves_results(
        steps in proptest::collection::vec(arb_step(), 1..10),
        seed in 0u64..100,
        int in any::<bool>(),
        max_visits in 1usize..3,
        max_expr_size in prop_oneof![Just(512usize), 1usize..40],
    ) {
        let prec = if int { Prec::I32 } else { Prec::F32 };
        let (prog, result) = build(prec, 3, &steps, seed);
        let unoptimized = prog.lower(&[]).unwrap();
        let mut reference = InterpEnv::from_host_arrays(&unoptimized);
        reference.run(&unoptimized, &[]).unwrap();
        let settings = OptimizeSettings {
            virtualize_max_visits: max_visits,
            virtualize_max_expr_size: max_expr_size,
            ..Default::default()
        };
        let opt = optimize("prop", &[], &prog, &settings).unwrap();
        let mut env = InterpEnv::from_host_arrays(&opt.code);
        env.run(&opt.code, &[]).unwrap();
        let (want, got) = (reference.values(&result).unwrap(), env.values(&result).unwrap());
        for (w, g) in want.iter().zip(&got) {
            if int {
                prop_assert_eq!(w, g);
            } else {
                prop_assert!((w - g).abs() <= 1e-5 * (1.0 + w.abs()), "{} vs {}\n{}", w, g, opt.code);
            }
        }
    }
}

#[test]
fn a_failed_optimization_changes_no_memory_mode() {
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64);
    let mid = Tnode::new(Prec::F32, &[4], &["mid"]).unwrap();
    let s = Tnode::new(Prec::F32, &[4], &["s"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4, 4], &["y"]).unwrap();
    s.update_memory_mode(MemoryMode::Virtual, "test: fuse it")
        .unwrap();
    // `mid` changes between `s`'s computation and its use, so `s` cannot be inlined.
    let a = Assignments::pointwise_unop(&mid, UnOp::Neg, &x)
        .then(Assignments::pointwise_unop(&s, UnOp::Sqrt, &mid))
        .then(Assignments::pointwise_unop(&mid, UnOp::Exp, &x))
        .then(outer(&y, BinOp::Add, &s, &mid));
    let before: Vec<_> = [&x, &mid, &s, &y].iter().map(|t| t.memory_mode()).collect();
    assert!(optimize("fails", &[], &a, &OptimizeSettings::default()).is_err());
    let after: Vec<_> = [&x, &mid, &s, &y].iter().map(|t| t.memory_mode()).collect();
    assert_eq!(before, after);
}

#[test]
fn huge_host_arrays_fail_cleanly() {
    let t = Tnode::new(Prec::F64, &[1 << 20, 1 << 20, 1 << 10], &["huge"]).unwrap();
    assert!(t.host().set_values(&[]).is_err());
    assert!(!t.host().exists());
    assert!(t.modes().is_unspecified());
}

#[test]
fn malformed_low_level_code_is_rejected_before_optimization() {
    use arrayjit_ir::indexing::AxisIndex;
    use arrayjit_ir::low_level::ScalarExpr;
    let t = Tnode::new(Prec::F32, &[3], &["t"]).unwrap();
    let y = Tnode::new(Prec::F32, &[3], &["y"]).unwrap();
    // Reads a 1-D node with two indices.
    let code = LowLevel::Set {
        tn: y,
        idcs: vec![AxisIndex::Fixed(0)],
        value: ScalarExpr::Get(t, vec![AxisIndex::Fixed(0), AxisIndex::Fixed(1)]),
    };
    let err =
        super::optimize_low_level("bad", &[], code, &OptimizeSettings::default()).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfBounds { .. }), "{err}");
}

/// Issue 7 item 4: a chain of virtual nodes is split where its inlined expression would exceed
/// the size budget; each split node says why, and the results stay the same.
#[test]
fn item04_inlining_respects_the_expression_size_budget() {
    let x = hosted(Prec::F32, &[4], "x", |i| i as f64);
    let mut prog = Assignments::Noop;
    let mut prev = x.clone();
    let mut chain = Vec::new();
    for k in 0..200 {
        let next = Tnode::new(Prec::F32, &[4], &[&format!("c{k}")]).unwrap();
        prog = prog.then(Assignments::pointwise_unop(&next, UnOp::Neg, &prev));
        chain.push(next.clone());
        prev = next;
    }
    prev.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let settings = OptimizeSettings {
        virtualize_max_expr_size: 64,
        ..Default::default()
    };
    let opt = optimize("chain", &[], &prog, &settings).unwrap();
    let split: Vec<&Tnode> = chain
        .iter()
        .filter(|t| !t.modes().known_virtual())
        .collect();
    // Every node but the result would fit alone; the chain is cut every few dozen nodes.
    assert!(split.len() > 200 / 64, "{} nodes kept", split.len());
    assert!(split.len() < 200 / 4, "{} nodes kept", split.len());
    let reason = split[0].header();
    assert!(reason.contains("virtualize_max_expr_size = 64"), "{reason}");
    let mut env = InterpEnv::from_host_arrays(&opt.code);
    env.run(&opt.code, &[]).unwrap();
    assert_eq!(env.values(&prev).unwrap(), vec![0.0, 1.0, 2.0, 3.0]);
}

#[test]
fn full_overwrites_are_recognized() {
    use arrayjit_ir::indexing::{AxisIndex, Symbol};
    use arrayjit_ir::low_level::ScalarExpr;
    let t = Tnode::new(Prec::F32, &[3, 4], &["t"]).unwrap();
    let u = Tnode::new(Prec::F32, &[3, 4], &["u"]).unwrap();
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let nest = |to_i: i64, value: ScalarExpr| LowLevel::For {
        index: i,
        from: 0,
        to: to_i,
        body: Box::new(LowLevel::For {
            index: j,
            from: 0,
            to: 4,
            body: Box::new(LowLevel::Set {
                tn: t.clone(),
                idcs: vec![AxisIndex::Iterator(i), AxisIndex::Iterator(j)],
                value,
            }),
        }),
    };
    let read = |n: &Tnode| {
        ScalarExpr::Get(
            n.clone(),
            vec![AxisIndex::Iterator(i), AxisIndex::Iterator(j)],
        )
    };
    assert!(nest(3, ScalarExpr::Constant(0.0)).overwrites_all(&t));
    assert!(nest(3, read(&u)).overwrites_all(&t));
    assert!(LowLevel::ZeroOut(t.clone()).overwrites_all(&t));
    // Not every row, reading itself, or another node.
    assert!(!nest(2, ScalarExpr::Constant(0.0)).overwrites_all(&t));
    assert!(!nest(3, read(&t)).overwrites_all(&t));
    assert!(!nest(3, ScalarExpr::Constant(0.0)).overwrites_all(&u));
    assert!(!LowLevel::ZeroOut(u.clone()).overwrites_all(&t));
}

/// A batch slice read by two blocked products stays an array: inlined, the products would read
/// the batch at a static index and no longer be recognized as products.
#[test]
fn a_batch_slice_read_by_products_is_not_inlined_into_them() {
    use crate::schedule::ScheduleKind;
    use arrayjit_ir::assignments::FetchOp;
    use arrayjit_ir::indexing::StaticSymbol;
    let batch = StaticSymbol::new("batch", 2);
    let batches = hosted(Prec::F32, &[2, 32, 64], "batches", |i| (i % 7) as f64);
    let w = hosted(Prec::F32, &[64, 32], "w", |i| (i % 5) as f64);
    let xb = Tnode::new(Prec::F32, &[32, 64], &["xb"]).unwrap();
    let y = Tnode::new(Prec::F32, &[32, 32], &["y"]).unwrap();
    let g = Tnode::new(Prec::F32, &[64, 32], &["g"]).unwrap();
    g.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let product = |spec: &str, out: &Tnode, a: &Tnode, b: &Tnode| {
        Assignments::einsum(
            spec,
            BinOp::Add,
            out,
            AccumRhs::Binop(
                BinOp::Mul,
                Operand::Node(a.clone()),
                Operand::Node(b.clone()),
            ),
            true,
        )
        .unwrap()
    };
    let a = Assignments::Fetch {
        array: xb.clone(),
        op: FetchOp::Slice {
            batch: batch.clone(),
            sliced: batches.clone(),
        },
    }
    .then(product("ik,kj->ij", &y, &xb, &w))
    .then(product("ki,kj->ij", &g, &xb, &y));
    let opt = optimize("batch", &[batch], &a, &OptimizeSettings::default()).unwrap();
    assert!(!xb.modes().known_virtual(), "{}", opt.memory_report());
    let products = opt
        .schedules
        .iter()
        .filter(|s| matches!(s.kind, ScheduleKind::Contraction(_)))
        .count();
    assert_eq!(products, 2, "{}", opt.schedule_report());
}

/// An update in place (`w := w - g(w)`, an optimizer's step) inlines the values computed from
/// the old `w` that it reads element by element: each element reads the old value in the
/// assignment that replaces it, so no temporary of `w`'s size is kept. Read transposed, the
/// update would read elements it has already replaced, so the temporary is kept. Both agree
/// with the program run unoptimized.
#[test]
fn an_update_in_place_inlines_what_it_reads_element_by_element() {
    for transposed in [false, true] {
        let w = hosted(Prec::F32, &[3, 3], "w", |i| i as f64 * 0.5 - 1.0);
        w.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "test: parameter",
        )
        .unwrap();
        let g = Tnode::new(Prec::F32, &[3, 3], &["g"]).unwrap();
        let h = Tnode::new(Prec::F32, &[3, 3], &["h"]).unwrap();
        let spec = if transposed { "ij,ji->ij" } else { "ij,ij->ij" };
        let a = Assignments::pointwise_binop(&g, BinOp::Mul, &w, &w)
            .then(Assignments::pointwise_unop(&h, UnOp::Neg, &g))
            .then(
                Assignments::einsum(
                    spec,
                    BinOp::Arg2,
                    &w,
                    AccumRhs::Binop(
                        BinOp::Add,
                        Operand::Node(w.clone()),
                        Operand::Node(h.clone()),
                    ),
                    false,
                )
                .unwrap(),
            );
        let unoptimized = a.lower(&[]).unwrap();
        let mut reference = InterpEnv::from_host_arrays(&unoptimized);
        reference.run(&unoptimized, &[]).unwrap();
        let opt = optimize("update", &[], &a, &OptimizeSettings::default()).unwrap();
        let report = opt.memory_report();
        if transposed {
            // `g` reads `w` and is kept; `h`, which reads only `g`, is still inlined.
            let g_mode = g.memory_mode().unwrap();
            assert!(!g.modes().known_virtual(), "{report}");
            assert!(g_mode.provenance.contains("overwritten"), "{g_mode}");
        } else {
            assert!(
                h.modes().known_virtual() && g.modes().known_virtual(),
                "{report}"
            );
            assert_eq!(top_level_statements(&opt.code), 1, "{}", opt.code);
        }
        let mut env = InterpEnv::from_host_arrays(&opt.code);
        env.run(&opt.code, &[]).unwrap();
        assert_eq!(
            env.values(&w).unwrap(),
            reference.values(&w).unwrap(),
            "transposed {transposed}\n{}",
            opt.code
        );
    }
}

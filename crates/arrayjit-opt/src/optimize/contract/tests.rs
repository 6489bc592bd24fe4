//! Tests of array contraction: which locals become iteration-private slices, that the loop
//! keeps being split over workers, and that the interpreter computes the same values with and
//! without it (and the softmax a plain reference computes).

use crate::optimize::{OptimizeSettings, Optimized, optimize, optimize_low_level};
use crate::schedule::{GpuLimits, ParallelLoop};
use arrayjit_ir::assignments::{AccumRhs, Assignments, Operand};
use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::interpret::InterpEnv;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::memory::{MemoryMode, MemoryType};
use arrayjit_ir::ops::{BinOp, UnOp};
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

fn hosted_input(dims: &[usize], seed: usize) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &["x"]).unwrap();
    let n: usize = dims.iter().product();
    t.host()
        .set_values(
            &(0..n)
                .map(|i| ((i * 37 + seed * 11) % 101) as f64 / 12.5 - 4.0)
                .collect::<Vec<_>>(),
        )
        .unwrap();
    t
}

fn result(dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

/// Softmax over the last axis of `x` (rows: the other axes), as four passes; returns the
/// program, the exponentials' node and the result. With `also`, a fifth statement sums the
/// exponentials over the first axis into a hosted result, so another statement reads them.
fn softmax(x: &Tnode, also: Option<&Tnode>) -> (Assignments, Tnode, Tnode) {
    let dims = x.dims().to_vec();
    let rows = &dims[..dims.len() - 1];
    let row_axes: String = (0..rows.len()).map(|i| (b'a' + i as u8) as char).collect();
    let reduce = format!("{row_axes}j->{row_axes}");
    let broadcast = format!("{row_axes}j,{row_axes}->{row_axes}j");
    let max = Tnode::new(Prec::F32, rows, &["row_max"]).unwrap();
    let shifted = Tnode::new(Prec::F32, &dims, &["shifted"]).unwrap();
    let e = Tnode::new(Prec::F32, &dims, &["e"]).unwrap();
    let total = Tnode::new(Prec::F32, rows, &["row_sum"]).unwrap();
    let y = result(&dims, "softmax");
    let id = |t: &Tnode| AccumRhs::Unop(UnOp::Identity, Operand::Node(t.clone()));
    let mut program = Assignments::einsum(&reduce, BinOp::Max, &max, id(x), true)
        .unwrap()
        .then(
            Assignments::einsum(
                &broadcast,
                BinOp::Arg2,
                &shifted,
                AccumRhs::Binop(BinOp::Sub, Operand::Node(x.clone()), Operand::Node(max)),
                false,
            )
            .unwrap(),
        )
        .then(Assignments::pointwise_unop(&e, UnOp::Exp, &shifted))
        .then(Assignments::einsum(&reduce, BinOp::Add, &total, id(&e), true).unwrap())
        .then(
            Assignments::einsum(
                &broadcast,
                BinOp::Arg2,
                &y,
                AccumRhs::Binop(BinOp::Div, Operand::Node(e.clone()), Operand::Node(total)),
                false,
            )
            .unwrap(),
        );
    if let Some(columns) = also {
        let spec = format!("{row_axes}j->j");
        program =
            program.then(Assignments::einsum(&spec, BinOp::Add, columns, id(&e), true).unwrap());
    }
    (program, e, y)
}

/// The iteration-private slices made of the node labelled `of`.
fn slices_of(opt: &Optimized, of: &str) -> Vec<Tnode> {
    let label = format!("{of}_slice");
    opt.nodes
        .iter()
        .filter(|r| r.used && r.tn.is_iteration_private() && r.tn.label() == [label.clone()])
        .map(|r| r.tn.clone())
        .collect()
}

fn slices(opt: &Optimized) -> Vec<Tnode> {
    opt.nodes
        .iter()
        .filter(|r| r.used && r.tn.is_iteration_private())
        .map(|r| r.tn.clone())
        .collect()
}

fn run(opt: &Optimized, y: &Tnode) -> Vec<f64> {
    let mut env = InterpEnv::from_host_arrays(&opt.code);
    env.run(&opt.code, &[]).unwrap();
    env.values(y).unwrap()
}

fn no_contraction() -> OptimizeSettings {
    OptimizeSettings {
        enable_contraction: false,
        ..OptimizeSettings::default()
    }
}

#[test]
fn a_softmax_keeps_one_row_of_exponentials_and_still_splits_its_rows() {
    let x = hosted_input(&[64, 300], 1);
    let (program, e, y) = softmax(&x, None);
    let opt = optimize("softmax", &[], &program, &OptimizeSettings::default()).unwrap();
    let made = slices_of(&opt, "e");
    assert_eq!(made.len(), 1, "{}\n{}", opt.code, opt.memory_report());
    assert_eq!(made[0].dims(), &[300]);
    // The row's maximum, read by two passes, becomes one element per row.
    assert_eq!(slices_of(&opt, "row_max")[0].dims(), &[1], "{}", opt.code);
    assert!(made[0].modes().is_local());
    let report = opt.memory_report();
    assert!(report.contains("array contraction"), "{report}");
    assert!(
        opt.nodes.iter().all(|r| r.tn != e || !r.used),
        "the whole array is no longer used: {}",
        opt.code
    );
    // The fused statement's rows are still independent: the slice does not stop the split.
    let fused = opt
        .statements()
        .into_iter()
        .find(|s| s.nodes().contains(&made[0]))
        .unwrap();
    assert!(ParallelLoop::detect(fused).is_some(), "{}", opt.code);
    // The same values as without contraction, bit for bit, and the softmax itself.
    let plain = optimize("softmax", &[], &program, &no_contraction()).unwrap();
    assert!(slices(&plain).is_empty());
    let got = run(&opt, &y);
    assert_eq!(got, run(&plain, &y));
    let xv = x.host().get_values().unwrap();
    for (r, row) in xv.chunks(300).enumerate() {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for (j, v) in row.iter().enumerate() {
            let want = (v - m).exp() / s;
            let have = got[r * 300 + j];
            assert!(
                (have - want).abs() <= 1e-6 * want.max(1e-3),
                "[{r}, {j}]: {have} vs {want}"
            );
        }
    }
}

#[test]
fn a_3d_softmax_keeps_the_slice_of_the_loop_around_every_use() {
    // The passes over the middle axis stay separate loops inside the fused outer one, so the
    // slice is one outer iteration's `[5, 200]`.
    let x = hosted_input(&[3, 5, 200], 2);
    let (program, _, y) = softmax(&x, None);
    let opt = optimize("softmax3", &[], &program, &OptimizeSettings::default()).unwrap();
    let made = slices_of(&opt, "e");
    assert!(made.iter().any(|t| t.dims() == [5, 200]), "{}", opt.code);
    let plain = optimize("softmax3", &[], &program, &no_contraction()).unwrap();
    assert_eq!(run(&opt, &y), run(&plain, &y));
}

#[test]
fn a_value_read_twice_in_a_fused_nest_becomes_one_element() {
    // t[i, j, k] := 2 x[i, j, k] and y[i, j, k] := t[i, j, k] + t[i, j, k] as two nests, which
    // fusion joins: three loops around every use of t.
    let x = hosted_input(&[4, 6, 50], 3);
    let t = Tnode::new(Prec::F32, &[4, 6, 50], &["twice"]).unwrap();
    let y = result(&[4, 6, 50], "y");
    let nest = |make: &dyn Fn(Vec<AxisIndex>) -> LowLevel| {
        let [i, j, k] = [(); 3].map(|_| Symbol::fresh());
        let at = vec![
            AxisIndex::Iterator(i),
            AxisIndex::Iterator(j),
            AxisIndex::Iterator(k),
        ];
        [(k, 50), (j, 6), (i, 4)]
            .into_iter()
            .fold(make(at), |body, (index, to)| LowLevel::For {
                index,
                from: 0,
                to,
                body: Box::new(body),
            })
    };
    let write = nest(&|at| LowLevel::Set {
        tn: t.clone(),
        idcs: at.clone(),
        value: ScalarExpr::binop(
            BinOp::Mul,
            ScalarExpr::Constant(2.0),
            ScalarExpr::Get(x.clone(), at),
        ),
    });
    let read = nest(&|at| LowLevel::Set {
        tn: y.clone(),
        idcs: at.clone(),
        value: ScalarExpr::binop(
            BinOp::Add,
            ScalarExpr::Get(t.clone(), at.clone()),
            ScalarExpr::Get(t.clone(), at),
        ),
    });
    let code = LowLevel::Seq(vec![write, read]);
    let opt = optimize_low_level("twice", &[], code.clone(), &OptimizeSettings::default()).unwrap();
    // Fusion joins the two inner loops, so every axis is pinned: one element per iteration.
    let made = slices(&opt);
    assert_eq!(made.len(), 1, "{}\n{}", opt.code, opt.memory_report());
    assert_eq!(made[0].dims(), &[1], "{}", opt.code);
    let got = run(&opt, &y);
    let xv = x.host().get_values().unwrap();
    let want: Vec<f64> = xv
        .iter()
        .map(|v| ((2.0 * v) as f32 + (2.0 * v) as f32) as f64)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn an_array_another_statement_reads_is_kept_whole() {
    let x = hosted_input(&[16, 100], 3);
    let columns = result(&[100], "column_sums");
    let (program, e, _) = softmax(&x, Some(&columns));
    let opt = optimize(
        "softmax_and_columns",
        &[],
        &program,
        &OptimizeSettings::default(),
    )
    .unwrap();
    assert!(slices_of(&opt, "e").is_empty(), "{}", opt.code);
    assert!(
        opt.nodes.iter().any(|r| r.tn == e && r.used),
        "{}",
        opt.code
    );
}

#[test]
fn results_gpus_and_large_slices_are_not_contracted() {
    // A result is not local.
    let x = hosted_input(&[8, 50], 4);
    let (program, e, _) = softmax(&x, None);
    e.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: kept")
        .unwrap();
    let opt = optimize("kept", &[], &program, &OptimizeSettings::default()).unwrap();
    assert!(slices_of(&opt, "e").is_empty(), "{}", opt.code);
    // A GPU keeps its own locals.
    let x = hosted_input(&[8, 50], 5);
    let (program, _, _) = softmax(&x, None);
    let gpu = OptimizeSettings::for_gpu(GpuLimits::portable());
    let opt = optimize("gpu", &[], &program, &gpu).unwrap();
    assert!(slices(&opt).is_empty(), "{}", opt.code);
    // A row above the stack threshold stays an array.
    let x = hosted_input(&[4, 5000], 6);
    let (program, _, _) = softmax(&x, None);
    let small_stack = OptimizeSettings {
        stack_threshold_bytes: 16 * 1024,
        ..OptimizeSettings::default()
    };
    let opt = optimize("long_rows", &[], &program, &small_stack).unwrap();
    assert!(slices_of(&opt, "e").is_empty(), "{}", opt.code);
}

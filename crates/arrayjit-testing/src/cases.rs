//! The programs of the conformance corpus.

use arrayjit_ir::{
    AccumRhs, Assignments, AxisIndex, AxisPadding, BinOp, FetchOp, MemoryMode, MemoryType, Operand,
    Padding, Prec, Projections, Result, StaticSymbol, Symbol, TernOp, Tnode, UnOp,
};

use super::case::{Case, case, output};

fn input(prec: Prec, dims: &[usize], label: &str, values: &[f64]) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    t.host().set_values(values)?;
    Ok(t)
}

fn node(t: &Tnode) -> Operand {
    Operand::Node(t.clone())
}

/// A deterministic spread of values in `[lo, hi]`.
fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|i| lo + (hi - lo) * ((i * 37 % n) as f64 / (n.max(2) - 1) as f64))
        .collect()
}

fn unary_ops(prec: Prec) -> Result<Case> {
    let n = 23;
    let x = input(prec, &[n], "x", &spread(n, -3.0, 3.0))?;
    let pos = input(prec, &[n], "pos", &spread(n, 0.125, 6.0))?;
    let mut program = Assignments::Noop;
    let mut results = vec![];
    let ops = [
        (UnOp::Identity, &x),
        (UnOp::Relu, &x),
        (UnOp::Satur01, &x),
        (UnOp::Exp, &x),
        (UnOp::Exp2, &x),
        (UnOp::Log, &pos),
        (UnOp::Log2, &pos),
        (UnOp::Sin, &x),
        (UnOp::Cos, &x),
        (UnOp::Sqrt, &pos),
        (UnOp::Recip, &pos),
        (UnOp::RecipSqrt, &pos),
        (UnOp::Neg, &x),
        (UnOp::Tanh, &x),
        (UnOp::Abs, &x),
        (UnOp::Not, &x),
        (UnOp::Erf, &x),
    ];
    for (op, arg) in ops {
        let y = output(prec, &[n], op.name())?;
        program = program.then(Assignments::pointwise_unop(&y, op, arg));
        results.push(y);
    }
    Ok(case(&format!("unary_{prec}"), program, results))
}

/// `erf` densely over [-6, 6]: both sides of every approximation's switch points, the tails
/// where it rounds to ±1, and 0.
fn erf_dense(prec: Prec) -> Result<Case> {
    let n = 1201;
    let values: Vec<f64> = (0..n)
        .map(|i| -6.0 + 12.0 * i as f64 / (n - 1) as f64)
        .collect();
    let x = input(prec, &[n], "x", &values)?;
    let y = output(prec, &[n], "erf")?;
    let program = Assignments::pointwise_unop(&y, UnOp::Erf, &x);
    Ok(case(&format!("erf_dense_{prec}"), program, vec![y]))
}

fn binary_ops(prec: Prec) -> Result<Case> {
    let n = 19;
    let a = input(prec, &[n], "a", &spread(n, -4.0, 4.0))?;
    let b = input(
        prec,
        &[n],
        "b",
        &spread(n, -2.0, 3.0)
            .iter()
            .map(|v| if *v == 0.0 { 0.5 } else { *v })
            .collect::<Vec<_>>(),
    )?;
    let pos = input(prec, &[n], "pos", &spread(n, 0.25, 3.0))?;
    let mut program = Assignments::Noop;
    let mut results = vec![];
    let ops = [
        (BinOp::Add, &a, &b),
        (BinOp::Sub, &a, &b),
        (BinOp::Mul, &a, &b),
        (BinOp::Div, &a, &b),
        (BinOp::Pow, &pos, &b),
        (BinOp::ReluGate, &a, &b),
        (BinOp::Max, &a, &b),
        (BinOp::Min, &a, &b),
        (BinOp::Mod, &a, &b),
        (BinOp::Cmplt, &a, &b),
        (BinOp::Cmpeq, &a, &a),
        (BinOp::Cmpne, &a, &b),
        (BinOp::And, &a, &b),
        (BinOp::Or, &a, &b),
        (BinOp::Arg1, &a, &b),
        (BinOp::Arg2, &a, &b),
    ];
    for (k, (op, x, y)) in ops.into_iter().enumerate() {
        let out = output(prec, &[n], &format!("bin{k}"))?;
        program = program.then(Assignments::pointwise_binop(&out, op, x, y));
        results.push(out);
    }
    for (k, op) in [TernOp::Where, TernOp::Fma].into_iter().enumerate() {
        let out = output(prec, &[n], &format!("tern{k}"))?;
        program = program.then(Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: out.clone(),
            rhs: AccumRhs::Ternop(op, node(&a), node(&b), node(&pos)),
            projections: Projections::pointwise(&[n], 3),
        });
        results.push(out);
    }
    Ok(case(&format!("binary_{prec}"), program, results))
}

fn broadcasting() -> Result<Case> {
    let m = input(Prec::F32, &[3, 5], "m", &spread(15, -2.0, 2.0))?;
    let row = input(Prec::F32, &[5], "row", &spread(5, 0.5, 1.5))?;
    let col = input(Prec::F32, &[3, 1], "col", &[1.0, -1.0, 2.0])?;
    let s = input(Prec::F32, &[], "s", &[0.25])?;
    let plus_row = output(Prec::F32, &[3, 5], "plus_row")?;
    let times_col = output(Prec::F32, &[3, 5], "times_col")?;
    let outer = output(Prec::F32, &[5, 3], "outer")?;
    let scaled = output(Prec::F32, &[3, 5], "scaled")?;
    let program = Assignments::einsum(
        "ij,j->ij",
        BinOp::Arg2,
        &plus_row,
        AccumRhs::Binop(BinOp::Add, node(&m), node(&row)),
        false,
    )?
    .then(Assignments::einsum(
        "ij,ij->ij",
        BinOp::Arg2,
        &times_col,
        AccumRhs::Binop(BinOp::Mul, node(&m), node(&col)),
        false,
    )?)
    .then(Assignments::einsum(
        "i,jk->ij",
        BinOp::Arg2,
        &outer,
        AccumRhs::Binop(BinOp::Mul, node(&row), node(&col)),
        false,
    )?)
    .then(Assignments::einsum(
        ",ij->ij",
        BinOp::Arg2,
        &scaled,
        AccumRhs::Binop(BinOp::Mul, node(&s), node(&m)),
        false,
    )?);
    Ok(case(
        "broadcasting",
        program,
        vec![plus_row, times_col, outer, scaled],
    ))
}

fn reductions() -> Result<Case> {
    let m = input(Prec::F32, &[4, 6], "m", &spread(24, -3.0, 3.0))?;
    let mut program = Assignments::Noop;
    let mut results = vec![];
    for (spec, op, dims) in [
        ("ij->i", BinOp::Add, vec![4]),
        ("ij->j", BinOp::Max, vec![6]),
        ("ij->i", BinOp::Min, vec![4]),
        ("ij->", BinOp::Add, vec![]),
        ("ij->j", BinOp::Mul, vec![6]),
    ] {
        let out = output(Prec::F32, &dims, &format!("{}_{}", op.name(), spec))?;
        program = program.then(Assignments::einsum(
            spec,
            op,
            &out,
            AccumRhs::Unop(UnOp::Identity, node(&m)),
            true,
        )?);
        results.push(out);
    }
    // A reduction accumulated on top of existing values (no neutral initialization).
    let acc = input(Prec::F32, &[4], "acc", &[1.0, 2.0, 3.0, 4.0])?;
    program = program.then(Assignments::einsum(
        "ij->i",
        BinOp::Add,
        &acc,
        AccumRhs::Unop(UnOp::Abs, node(&m)),
        false,
    )?);
    results.push(acc);
    Ok(case("reductions", program, results))
}

/// Long reductions along rows and columns (sum, max, min; f32 and i32), so that backends which
/// spread one element's reduction over many lanes (a GPU workgroup per element) do so here.
fn long_row_reductions() -> Result<Case> {
    let mut program = Assignments::Noop;
    let mut results = vec![];
    for (prec, dims) in [(Prec::F32, [7usize, 1000]), (Prec::I32, [3, 513])] {
        let n = dims[0] * dims[1];
        let values: Vec<f64> = spread(n, -4.0, 4.0)
            .into_iter()
            .map(|v| if prec.is_integer() { v.round() } else { v })
            .collect();
        let m = input(prec, &dims, &format!("m_{}", prec.name()), &values)?;
        for (spec, op, out_dims) in [
            ("ij->i", BinOp::Add, vec![dims[0]]),
            ("ij->i", BinOp::Max, vec![dims[0]]),
            ("ij->i", BinOp::Min, vec![dims[0]]),
            ("ij->j", BinOp::Add, vec![dims[1]]),
        ] {
            let out = output(
                prec,
                &out_dims,
                &format!("{}_{}_{}", prec.name(), op.name(), spec),
            )?;
            program = program.then(Assignments::einsum(
                spec,
                op,
                &out,
                AccumRhs::Unop(UnOp::Identity, node(&m)),
                true,
            )?);
            results.push(out);
        }
    }
    Ok(case("long_row_reductions", program, results))
}

/// `c = a · b` for square `n × n` f32 matrices with small integer entries (exact in f32).
pub fn matmul(n: usize) -> Result<(Case, Tnode, Tnode, Tnode)> {
    let a_vals: Vec<f64> = (0..n * n)
        .map(|p| ((p / n + p % n) % 7) as f64 - 3.0)
        .collect();
    let b_vals: Vec<f64> = (0..n * n)
        .map(|p| (((p / n) * (p % n)) % 5) as f64 - 2.0)
        .collect();
    let a = input(Prec::F32, &[n, n], "a", &a_vals)?;
    let b = input(Prec::F32, &[n, n], "b", &b_vals)?;
    let c = output(Prec::F32, &[n, n], "c")?;
    let program = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, node(&a), node(&b)),
        true,
    )?;
    Ok((
        case(&format!("matmul_{n}"), program, vec![c.clone()]),
        a,
        b,
        c,
    ))
}

fn padding_conv1d() -> Result<Case> {
    let n = 9;
    let pad = Padding {
        axes: vec![AxisPadding { left: 1, right: 1 }],
        value: 0.0,
    };
    let x = Tnode::new_padded(Prec::F32, &[n], pad, &["x_padded"])?;
    x.host().set_values(&spread(n, -1.0, 2.0))?;
    let w = input(Prec::F32, &[3], "kernel", &[0.25, 0.5, -1.0])?;
    let y = output(Prec::F32, &[n], "conv")?;
    let (i, k) = (Symbol::fresh(), Symbol::fresh());
    let projections = Projections {
        product_space: vec![n, 3],
        product_iterators: vec![i, k],
        lhs_dims: vec![n],
        rhs_dims: vec![vec![n], vec![3]],
        project_lhs: vec![AxisIndex::Iterator(i)],
        project_rhs: vec![
            vec![AxisIndex::affine([(1, i), (1, k)], -1)],
            vec![AxisIndex::Iterator(k)],
        ],
        guards: Vec::new(),
        debug_info: "conv1d with padding 1".into(),
    };
    let program = Assignments::Accum {
        initialize_neutral: true,
        accum: BinOp::Add,
        lhs: y.clone(),
        rhs: AccumRhs::Binop(BinOp::Mul, node(&x), node(&w)),
        projections,
    };
    // A padded output with a non-zero pad value: margins must keep it.
    let pad2 = Padding {
        axes: vec![AxisPadding { left: 2, right: 0 }],
        value: -7.0,
    };
    let z = Tnode::new_padded(Prec::F32, &[n], pad2, &["z_padded"])?;
    z.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "conformance: compared result",
    )?;
    let program = program.then(Assignments::pointwise_unop(&z, UnOp::Neg, &y));
    Ok(case("padding_conv1d", program, vec![y, z]))
}

fn static_index_loop() -> Result<Case> {
    let (batches, width) = (5, 3);
    let data = input(
        Prec::F32,
        &[batches, width],
        "dataset",
        &spread(batches * width, -5.0, 5.0),
    )?;
    let batch = StaticSymbol::new("batch", batches);
    let slice = Tnode::new(Prec::F32, &[width], &["batch_slice"])?;
    let acc = input(Prec::F32, &[width], "running_sum", &[0.0; 3])?;
    let last = output(Prec::F32, &[width], "last_doubled")?;
    let program = Assignments::Fetch {
        array: slice.clone(),
        op: FetchOp::Slice {
            batch: batch.clone(),
            sliced: data,
        },
    }
    .then(Assignments::einsum(
        "i->i",
        BinOp::Add,
        &acc,
        AccumRhs::Unop(UnOp::Identity, node(&slice)),
        false,
    )?)
    .then(Assignments::pointwise_binop(
        &last,
        BinOp::Add,
        &slice,
        &slice,
    ));
    Ok(Case {
        name: "static_index_loop".into(),
        program,
        bindings: vec![batch],
        runs: vec![vec![0], vec![3], vec![1], vec![4], vec![2]],
        results: vec![acc, last],
    })
}

fn virtual_and_local() -> Result<Case> {
    let w = input(Prec::F32, &[6, 4], "w", &spread(24, -1.0, 1.0))?;
    let x = input(Prec::F32, &[4], "x", &[0.5, -1.0, 2.0, 0.25])?;
    let b = input(Prec::F32, &[6], "b", &spread(6, -0.5, 0.5))?;
    let wx = Tnode::new(Prec::F32, &[6], &["wx"])?;
    let pre = Tnode::new(Prec::F32, &[6], &["pre"])?;
    let h = Tnode::new(Prec::F32, &[6], &["hidden"])?;
    let e = Tnode::new(Prec::F32, &[6], &["exp_hidden"])?;
    let gram = output(Prec::F32, &[6, 6], "gram")?;
    let sum = output(Prec::F32, &[], "sum")?;
    let program = Assignments::einsum(
        "ij,j->i",
        BinOp::Add,
        &wx,
        AccumRhs::Binop(BinOp::Mul, node(&w), node(&x)),
        true,
    )?
    .then(Assignments::pointwise_binop(&pre, BinOp::Add, &wx, &b))
    .then(Assignments::pointwise_unop(&h, UnOp::Tanh, &pre))
    .then(Assignments::pointwise_unop(&e, UnOp::Exp, &h))
    // e is read 6 times per element: local, not virtual.
    .then(Assignments::einsum(
        "i,j->ij",
        BinOp::Arg2,
        &gram,
        AccumRhs::Binop(BinOp::Mul, node(&e), node(&e)),
        false,
    )?)
    .then(Assignments::einsum(
        "i->",
        BinOp::Add,
        &sum,
        AccumRhs::Unop(UnOp::Identity, node(&e)),
        true,
    )?);
    Ok(case("virtual_and_local", program, vec![gram, sum]))
}

fn mixed_precisions() -> Result<Case> {
    let n = 12;
    let tricky = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        70000.0,
        6.0e-8,
        3.0e-5,
        -2.5,
        0.1,
        1.0 / 3.0,
        1.0e-10,
        2049.0,
    ];
    let x32 = input(Prec::F32, &[n], "x32", &tricky)?;
    let x16 = input(Prec::F16, &[n], "x16", &spread(n, -8.0, 8.0))?;
    let xbf = input(Prec::Bf16, &[n], "xbf", &spread(n, -100.0, 100.0))?;
    let x64 = input(Prec::F64, &[n], "x64", &spread(n, -1e6, 1e6))?;
    let to_f16 = output(Prec::F16, &[n], "to_f16")?;
    let to_bf16 = output(Prec::Bf16, &[n], "to_bf16")?;
    let from_f16 = output(Prec::F32, &[n], "from_f16")?;
    let half_math = output(Prec::F16, &[n], "half_math")?;
    let bf_math = output(Prec::Bf16, &[n], "bf_math")?;
    let wide = output(Prec::F64, &[n], "wide")?;
    let mixed = output(Prec::F32, &[n], "mixed")?;
    let program = Assignments::pointwise_unop(&to_f16, UnOp::Identity, &x32)
        .then(Assignments::pointwise_unop(&to_bf16, UnOp::Identity, &x32))
        .then(Assignments::pointwise_binop(
            &from_f16,
            BinOp::Mul,
            &x16,
            &x16,
        ))
        .then(Assignments::pointwise_binop(
            &half_math,
            BinOp::Add,
            &x16,
            &x32,
        ))
        .then(Assignments::pointwise_binop(
            &bf_math,
            BinOp::Mul,
            &xbf,
            &x16,
        ))
        .then(Assignments::pointwise_binop(&wide, BinOp::Div, &x64, &x16))
        .then(Assignments::pointwise_binop(&mixed, BinOp::Sub, &x64, &xbf));
    Ok(case(
        "mixed_precisions",
        program,
        vec![to_f16, to_bf16, from_f16, half_math, bf_math, wide, mixed],
    ))
}

fn integer_semantics() -> Result<Case> {
    let n = 10;
    let a = input(
        Prec::I32,
        &[n],
        "a",
        &[
            7.0,
            -7.0,
            i32::MIN as f64,
            2147483647.0,
            0.0,
            5.0,
            -1.0,
            100000.0,
            3.0,
            -9.0,
        ],
    )?;
    let b = input(
        Prec::I32,
        &[n],
        "b",
        &[0.0, 3.0, -1.0, 1.0, 0.0, -2.0, -1.0, 100000.0, 4.0, 2.0],
    )?;
    let f = input(
        Prec::F32,
        &[n],
        "f",
        &[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            3.0e9,
            -3.0e9,
            2.7,
            -2.7,
            0.5,
            255.5,
            300.0,
        ],
    )?;
    let u = input(
        Prec::U8,
        &[n],
        "u",
        &[250.0, 0.0, 1.0, 255.0, 128.0, 3.0, 7.0, 200.0, 100.0, 9.0],
    )?;
    let big = input(
        Prec::I64,
        &[n],
        "big",
        &[
            9.0e18,
            -9.0e18,
            1.0,
            4.0e9,
            -1.0,
            0.0,
            123456789.0,
            -5.0,
            2.0,
            3.0,
        ],
    )?;
    let ubig = input(
        Prec::U64,
        &[n],
        "ubig",
        &[1.8e19, 1.0, 0.0, 4.0e18, 7.0, 9.0, 2.0, 3.0, 5.0, 6.0],
    )?;
    let u16s = input(Prec::U16, &[n], "u16s", &spread(n, 0.0, 65535.0))?;
    let u32s = input(Prec::U32, &[n], "u32s", &spread(n, 0.0, 4.0e9))?;
    let mut program = Assignments::Noop;
    let mut results = vec![];
    let mut bin = |label: &str, prec: Prec, op: BinOp, x: &Tnode, y: &Tnode| -> Result<()> {
        let out = output(prec, &[n], label)?;
        program = std::mem::replace(&mut program, Assignments::Noop)
            .then(Assignments::pointwise_binop(&out, op, x, y));
        results.push(out);
        Ok(())
    };
    for (k, op) in [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Mod,
        BinOp::Pow,
        BinOp::Max,
        BinOp::Min,
        BinOp::ReluGate,
        BinOp::Cmplt,
    ]
    .into_iter()
    .enumerate()
    {
        bin(&format!("i32_{k}"), Prec::I32, op, &a, &b)?;
    }
    bin("u8_add", Prec::U8, BinOp::Add, &u, &u)?;
    bin("u8_mul", Prec::U8, BinOp::Mul, &u, &u)?;
    bin("u8_sub", Prec::U8, BinOp::Sub, &u, &u16s)?;
    bin("u16_mul", Prec::U16, BinOp::Mul, &u16s, &u16s)?;
    bin("u32_add", Prec::U32, BinOp::Add, &u32s, &u32s)?;
    bin("i64_mul", Prec::I64, BinOp::Mul, &big, &big)?;
    bin("i64_div", Prec::I64, BinOp::Div, &big, &a)?;
    bin("u64_add", Prec::U64, BinOp::Add, &ubig, &ubig)?;
    bin("u64_sub", Prec::U64, BinOp::Sub, &u, &ubig)?;
    bin("f_to_i32", Prec::I32, BinOp::Arg2, &a, &f)?;
    bin("f_to_u8", Prec::U8, BinOp::Arg2, &a, &f)?;
    bin("f_to_i64", Prec::I64, BinOp::Arg2, &a, &f)?;
    bin("i_plus_f", Prec::F32, BinOp::Add, &a, &f)?;
    for (k, op) in [
        UnOp::Neg,
        UnOp::Abs,
        UnOp::Relu,
        UnOp::Recip,
        UnOp::Sqrt,
        UnOp::Not,
        UnOp::Satur01,
    ]
    .into_iter()
    .enumerate()
    {
        let out = output(Prec::I32, &[n], &format!("i32_un{k}"))?;
        program = program.then(Assignments::pointwise_unop(&out, op, &a));
        results.push(out);
    }
    let neg_u = output(Prec::U32, &[n], "u32_neg")?;
    program = program.then(Assignments::pointwise_unop(&neg_u, UnOp::Neg, &u32s));
    results.push(neg_u);
    Ok(case("integer_semantics", program, results))
}

fn fetches() -> Result<Case> {
    let c = output(Prec::F32, &[2, 3], "constant")?;
    let fill = output(Prec::I32, &[2, 3], "fill")?;
    let range = output(Prec::I64, &[3, 4], "range")?;
    let range_f = output(Prec::F16, &[5], "range_f16")?;
    let program = Assignments::Fetch {
        array: c.clone(),
        op: FetchOp::Constant(2.5),
    }
    .then(Assignments::Fetch {
        array: fill.clone(),
        op: FetchOp::ConstantFill(vec![1.0, -2.0, 3.0, 1e10, -1e10, 6.0]),
    })
    .then(Assignments::Fetch {
        array: range.clone(),
        op: FetchOp::RangeOverOffsets,
    })
    .then(Assignments::Fetch {
        array: range_f.clone(),
        op: FetchOp::RangeOverOffsets,
    });
    Ok(case("fetches", program, vec![c, fill, range, range_f]))
}

/// Temporaries too large for the stack live in the scratch pool, sharing memory when their
/// lifetimes do not overlap (with loop fusion or array contraction off; with both on, as in the
/// corpus, the passes become one loop that keeps one element of each per iteration).
pub fn scratch_locals() -> Result<Case> {
    let n = 5000;
    let x = input(Prec::F32, &[n], "x", &spread(n, -2.0, 2.0))?;
    let t1 = Tnode::new(Prec::F32, &[n], &["t1"])?;
    let t2 = Tnode::new(Prec::F32, &[n], &["t2"])?;
    let t3 = Tnode::new(Prec::F32, &[n], &["t3"])?;
    let y = output(Prec::F32, &[n], "y")?;
    // Each temporary is read twice per element, so none is inlined.
    let program = Assignments::pointwise_unop(&t1, UnOp::Tanh, &x)
        .then(Assignments::pointwise_binop(&t2, BinOp::Mul, &t1, &t1))
        .then(Assignments::pointwise_binop(&t3, BinOp::Add, &t2, &t2))
        .then(Assignments::pointwise_binop(&y, BinOp::Sub, &t3, &t3))
        .then(Assignments::pointwise_binop(&y, BinOp::Add, &y, &x));
    Ok(case("scratch_locals", program, vec![y]))
}

/// The cases of this module: operations, reductions, precisions, fetches and locals.
pub(super) fn basic_cases() -> Result<Vec<Case>> {
    Ok(vec![
        unary_ops(Prec::F32)?,
        unary_ops(Prec::F64)?,
        unary_ops(Prec::F16)?,
        erf_dense(Prec::F32)?,
        erf_dense(Prec::F64)?,
        binary_ops(Prec::F32)?,
        binary_ops(Prec::F64)?,
        binary_ops(Prec::Bf16)?,
        broadcasting()?,
        reductions()?,
        long_row_reductions()?,
        matmul(17)?.0,
        padding_conv1d()?,
        static_index_loop()?,
        virtual_and_local()?,
        mixed_precisions()?,
        integer_semantics()?,
        fetches()?,
        scratch_locals()?,
    ])
}

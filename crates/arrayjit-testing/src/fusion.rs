//! Programs for loop fusion in the conformance corpus: row-wise passes that the optimizer fuses
//! into one loop (softmax over rows of odd lengths, f32 and f64: maximum, exponentials, sum,
//! division; rows split over workers whose exponentials become one row per worker), and square programs whose second pass reads other rows of what the first wrote
//! (column sums, a transpose), which must not be fused even though the loops have the same
//! range; and views (copies at a remapped index, as reshapes lower) inlined into readers that
//! read them several times.

use arrayjit_ir::{
    AccumRhs, Assignments, AxisIndex, BinOp, Operand, Prec, Projections, Result, Symbol, Tnode,
    UnOp,
};

use super::case::{Case, case, output};

fn fractions(prec: Prec, dims: &[usize], label: &str, seed: usize) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    let n: usize = dims.iter().product();
    t.host().set_values(
        &(0..n)
            .map(|i| ((i * 37 + seed * 11) % 101) as f64 / 12.5 - 4.0)
            .collect::<Vec<_>>(),
    )?;
    Ok(t)
}

/// `softmax(x)` over the rows of `x` (`[rows, len]`), as four passes.
fn softmax_rows(prec: Prec, rows: usize, len: usize, k: usize) -> Result<(Assignments, Tnode)> {
    let x = fractions(prec, &[rows, len], "x", k)?;
    softmax_over_last_axis(x, &format!("softmax{k}"))
}

/// `softmax(x)` over the last axis of `x` (its other axes are the rows), as four passes
/// (maximum, shifted exponentials, sum, division), into a hosted result labelled `label`.
pub(crate) fn softmax_over_last_axis(x: Tnode, label: &str) -> Result<(Assignments, Tnode)> {
    let prec = x.prec();
    let dims = x.dims().to_vec();
    let rows = &dims[..dims.len().saturating_sub(1)];
    // Einsum specs: one letter per row axis (a, b, ...), then j for the last axis.
    let row_axes: String = (0..rows.len()).map(|i| (b'a' + i as u8) as char).collect();
    let reduce = format!("{row_axes}j->{row_axes}");
    let broadcast = format!("{row_axes}j,{row_axes}->{row_axes}j");
    let max = Tnode::new(prec, rows, &["row_max"])?;
    let shifted = Tnode::new(prec, &dims, &["shifted"])?;
    let e = Tnode::new(prec, &dims, &["e"])?;
    let total = Tnode::new(prec, rows, &["row_sum"])?;
    let y = output(prec, &dims, label)?;
    let program = Assignments::einsum(
        &reduce,
        BinOp::Max,
        &max,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(x.clone())),
        true,
    )?
    .then(Assignments::einsum(
        &broadcast,
        BinOp::Arg2,
        &shifted,
        AccumRhs::Binop(BinOp::Sub, Operand::Node(x), Operand::Node(max)),
        false,
    )?)
    .then(Assignments::pointwise_unop(&e, UnOp::Exp, &shifted))
    .then(Assignments::einsum(
        &reduce,
        BinOp::Add,
        &total,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(e.clone())),
        true,
    )?)
    .then(Assignments::einsum(
        &broadcast,
        BinOp::Arg2,
        &y,
        AccumRhs::Binop(BinOp::Div, Operand::Node(e), Operand::Node(total)),
        false,
    )?);
    Ok((program, y))
}

/// Softmax over rows of lengths 129 and 1000 (tails after the reduction lanes), f32 and f64.
fn fused_softmax_rows() -> Result<Case> {
    let mut program = Assignments::Noop;
    let mut results = vec![];
    for (k, (prec, rows, len)) in [
        (Prec::F32, 7, 129),
        (Prec::F64, 17, 1000),
        (Prec::F32, 1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let (p, y) = softmax_rows(prec, rows, len, k)?;
        program = program.then(p);
        results.push(y);
    }
    Ok(case("fused_softmax_rows", program, results))
}

/// Softmax over f32 rows of 1000: long enough for a GPU to give each row a workgroup.
fn fused_softmax_long_f32_rows() -> Result<Case> {
    let (program, y) = softmax_rows(Prec::F32, 5, 1000, 3)?;
    Ok(case("fused_softmax_rows_f32_long", program, vec![y]))
}

/// Softmax over rows long and many enough that a CPU splits them over its workers: the rows'
/// exponentials, read twice, become one row per worker (the optimizer's array contraction), so
/// workers running rows at once must each have their own: `[96, 1000]` in f32 and `[40, 1000]`
/// in f64 (a row of 1000 per outer iteration), and `[8, 4, 1000]` in f32 (the passes over the
/// middle axis stay loops of their own, so one outer iteration's `[4, 1000]`).
fn contracted_softmax_rows() -> Result<Case> {
    let mut program = Assignments::Noop;
    let mut results = vec![];
    for (k, dims) in [
        (Prec::F32, vec![96, 1000]),
        (Prec::F64, vec![40, 1000]),
        (Prec::F32, vec![8, 4, 1000]),
    ]
    .into_iter()
    .enumerate()
    {
        let x = fractions(dims.0, &dims.1, "x", 7 + k)?;
        let (p, y) = softmax_over_last_axis(x, &format!("split_softmax{k}"))?;
        program = program.then(p);
        results.push(y);
    }
    Ok(case("fused_softmax_rows_split", program, results))
}

/// `a = 2x` (kept: it is a result), then passes over the same range that read other rows of
/// `a`: column sums and a transpose plus one.
fn cross_row_passes() -> Result<Case> {
    let n = 33;
    let x = fractions(Prec::F32, &[n, n], "x", 5)?;
    let two = Tnode::new(Prec::F32, &[n, n], &["two"])?;
    two.host().set_values(&vec![2.0; n * n])?;
    let a = output(Prec::F32, &[n, n], "a")?;
    let cols = output(Prec::F32, &[n], "column_sums")?;
    let t = output(Prec::F32, &[n, n], "transposed")?;
    let program = Assignments::pointwise_binop(&a, BinOp::Mul, &x, &two)
        .then(Assignments::einsum(
            "ij->j",
            BinOp::Add,
            &cols,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(a.clone())),
            true,
        )?)
        .then(Assignments::einsum(
            "ij->ji",
            BinOp::Arg2,
            &t,
            AccumRhs::Unop(UnOp::Neg, Operand::Node(a.clone())),
            false,
        )?);
    Ok(case("unfused_cross_row_passes", program, vec![a, cols, t]))
}

/// `lhs[its] = rhs[rhs_idx]` over `lhs`'s dims (a copy at a remapped index).
fn remapped_copy(
    lhs: &Tnode,
    rhs: &Tnode,
    its: Vec<Symbol>,
    rhs_idx: Vec<AxisIndex>,
) -> Assignments {
    Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: lhs.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(rhs.clone())),
        projections: Projections {
            product_space: lhs.dims().to_vec(),
            product_iterators: its.clone(),
            lhs_dims: lhs.dims().to_vec(),
            rhs_dims: vec![rhs.dims().to_vec()],
            project_lhs: its.into_iter().map(AxisIndex::Iterator).collect(),
            project_rhs: vec![rhs_idx],
            guards: Vec::new(),
            debug_info: "view".into(),
        },
    }
}

/// A split view (`v[a, b, c] = e[a, 3b + c]`), a transposed view with a unit axis
/// (`t[c, 0, a] = e[a, c]`) and a merged copy (`m[3a + b, c] = x[a, b, c]`), each read several
/// times per element by a later statement.
fn views_read_many_times() -> Result<Case> {
    let x = fractions(Prec::F32, &[4, 6], "x", 3)?;
    let e = Tnode::new(Prec::F32, &[4, 6], &["e"])?;
    let v = Tnode::new(Prec::F32, &[4, 2, 3], &["split_view"])?;
    let t = Tnode::new(Prec::F32, &[6, 1, 4], &["transposed_view"])?;
    let y = output(Prec::F32, &[4, 2, 3], "split_squared")?;
    let z = output(Prec::F32, &[6, 1, 4], "transposed_squared")?;
    let x3 = fractions(Prec::F32, &[2, 3, 4], "x3", 5)?;
    let m = Tnode::new(Prec::F32, &[6, 4], &["merged"])?;
    let w = output(Prec::F32, &[6, 4], "merged_squared")?;
    let [a, b, c] = [Symbol::fresh(), Symbol::fresh(), Symbol::fresh()];
    let [p, q, r] = [Symbol::fresh(), Symbol::fresh(), Symbol::fresh()];
    let [i, j, k] = [Symbol::fresh(), Symbol::fresh(), Symbol::fresh()];
    let square = |out: &Tnode, of: &Tnode| Assignments::pointwise_binop(out, BinOp::Mul, of, of);
    let program = Assignments::pointwise_unop(&e, UnOp::Exp, &x)
        .then(remapped_copy(
            &v,
            &e,
            vec![a, b, c],
            vec![
                AxisIndex::Iterator(a),
                AxisIndex::affine([(3, b), (1, c)], 0),
            ],
        ))
        .then(square(&y, &v))
        .then(Assignments::pointwise_binop(&y, BinOp::Add, &y, &v))
        .then(remapped_copy(
            &t,
            &e,
            vec![p, q, r],
            vec![AxisIndex::Iterator(r), AxisIndex::Iterator(p)],
        ))
        .then(square(&z, &t))
        .then(Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: m.clone(),
            rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(x3.clone())),
            projections: Projections {
                product_space: vec![2, 3, 4],
                product_iterators: vec![i, j, k],
                lhs_dims: vec![6, 4],
                rhs_dims: vec![vec![2, 3, 4]],
                project_lhs: vec![
                    AxisIndex::affine([(3, i), (1, j)], 0),
                    AxisIndex::Iterator(k),
                ],
                project_rhs: vec![vec![
                    AxisIndex::Iterator(i),
                    AxisIndex::Iterator(j),
                    AxisIndex::Iterator(k),
                ]],
                guards: Vec::new(),
                debug_info: "merge".into(),
            },
        })
        .then(square(&w, &m));
    Ok(case("views_read_many_times", program, vec![y, z, w]))
}

/// Row sums of an `f32` and of an `i32` matrix over the same rows, fused into one loop: on a
/// GPU one row pass holding group reductions in two element types.
fn fused_row_sums_in_two_precisions() -> Result<Case> {
    let (rows, len) = (6, 300);
    let x = fractions(Prec::F32, &[rows, len], "x", 7)?;
    let counts = Tnode::new(Prec::I32, &[rows, len], &["counts"])?;
    counts.host().set_values(
        &(0..rows * len)
            .map(|i| ((i * 29) % 23) as f64 - 11.0)
            .collect::<Vec<_>>(),
    )?;
    let sums = output(Prec::F32, &[rows], "f32_row_sums")?;
    let totals = output(Prec::I32, &[rows], "i32_row_sums")?;
    let row_sum = |out: &Tnode, of: Tnode| {
        Assignments::einsum(
            "ij->i",
            BinOp::Add,
            out,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(of)),
            true,
        )
    };
    let program = row_sum(&sums, x)?.then(row_sum(&totals, counts)?);
    Ok(case(
        "fused_row_sums_in_two_precisions",
        program,
        vec![sums, totals],
    ))
}

/// The fusion cases.
pub fn fusion_cases() -> Result<Vec<Case>> {
    Ok(vec![
        fused_softmax_rows()?,
        fused_softmax_long_f32_rows()?,
        contracted_softmax_rows()?,
        fused_row_sums_in_two_precisions()?,
        cross_row_passes()?,
        views_read_many_times()?,
    ])
}

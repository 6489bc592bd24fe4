//! Contraction- and reduction-heavy programs for the conformance corpus: einsums of odd sizes (1, 7, 17, 129,
//! 1000), transposed operands, batch axes (of one too), unit axes, merged and unmergeable reduction axes, and a
//! contraction feeding a pointwise consumer. Large ones run as blocked matrix products on CPU
//! backends, small ones as loops; all must agree with the interpreter. Integer-valued inputs
//! make f32 sums exact whatever the summation order, so blocking bugs show as exact mismatches;
//! the f64 cases use fractional values.

use arrayjit_ir::{AccumRhs, Assignments, BinOp, Operand, Prec, Result, Tnode, UnOp};

use super::case::{Case, case, output};

/// Values `-2..=2` in a deterministic pattern (exact products and sums in f32).
fn small_integers(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 5) as f64 - 2.0)
        .collect()
}

fn fractions(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 31 + seed * 17) % 97) as f64 / 48.5 - 1.0)
        .collect()
}

/// An input of dims `dims`: small integers in `f32` and other precisions but `f64`, whose
/// products and sums are exact in any order; fractions in `f64`.
pub(crate) fn input(prec: Prec, dims: &[usize], label: &str, seed: usize) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    let n = dims.iter().product();
    t.host().set_values(&if prec == Prec::F64 {
        fractions(n, seed)
    } else {
        small_integers(n, seed)
    })?;
    Ok(t)
}

/// Dims of the letters of `operand` given the size of each letter.
fn dims_of(operand: &str, size: &dyn Fn(char) -> usize) -> Vec<usize> {
    operand.chars().map(size).collect()
}

/// `out = lhs ·spec· rhs` for an einsum `"lhs,rhs->out"` with the given letter sizes.
fn einsum_case(name: &str, prec: Prec, spec: &str, sizes: &[(char, usize)]) -> Result<Case> {
    let size = |c: char| sizes.iter().find(|(l, _)| *l == c).map_or(1, |(_, s)| *s);
    let (inputs, out) = spec.split_once("->").unwrap_or((spec, ""));
    let (l, r) = inputs.split_once(',').unwrap_or((inputs, ""));
    let dims = [l, r, out].map(|operand| dims_of(operand, &size));
    product_case(name, [prec, prec, prec], spec, dims)
}

/// `c = a ·spec· b` for an einsum `spec` over inputs of dims `a` and `b` ([`input`]'s values)
/// in precisions `pa` and `pb` into a hosted result of dims `c` in precision `result`.
pub(crate) fn product_case(
    name: &str,
    [pa, pb, result]: [Prec; 3],
    spec: &str,
    [a, b, c]: [Vec<usize>; 3],
) -> Result<Case> {
    let a = input(pa, &a, "a", 1)?;
    let b = input(pb, &b, "b", 2)?;
    let c = output(result, &c, "c")?;
    let program = Assignments::einsum(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )?;
    Ok(case(name, program, vec![c]))
}

/// `y = relu(a·b + bias)` with the product a virtual-node candidate: it must stay a blocked
/// product, not be inlined into the consumer.
fn product_with_epilogue() -> Result<Case> {
    product_bias_relu("contraction_then_bias_relu", (33, 65, 47), false)
}

/// `y = relu(ab + bias)` after the product `ab = a·b` of `m × k` and `k × n` factors; with
/// `onto_values`, `ab` holds values first and the product adds onto them (`ab` is then a
/// compared result too).
pub(crate) fn product_bias_relu(
    name: &str,
    (m, k, n): (usize, usize, usize),
    onto_values: bool,
) -> Result<Case> {
    let a = input(Prec::F32, &[m, k], "a", 3)?;
    let b = input(Prec::F32, &[k, n], "b", 4)?;
    let bias = input(Prec::F32, &[n], "bias", 5)?;
    let ab = if onto_values {
        let ab = output(Prec::F32, &[m, n], "ab")?;
        ab.host()
            .set_values(&(0..m * n).map(|i| (i % 9) as f64 - 4.0).collect::<Vec<_>>())?;
        ab
    } else {
        Tnode::new(Prec::F32, &[m, n], &["ab"])?
    };
    let pre = Tnode::new(Prec::F32, &[m, n], &["pre"])?;
    let y = output(Prec::F32, &[m, n], "y")?;
    let program = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &ab,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        !onto_values,
    )?
    .then(Assignments::einsum(
        "ij,j->ij",
        BinOp::Arg2,
        &pre,
        AccumRhs::Binop(BinOp::Add, Operand::Node(ab.clone()), Operand::Node(bias)),
        false,
    )?)
    .then(Assignments::pointwise_unop(&y, UnOp::Relu, &pre));
    let results = if onto_values { vec![ab, y] } else { vec![y] };
    Ok(case(name, program, results))
}

/// Long reductions, scheduled over several accumulators on CPU backends: sums, max and min
/// along the last axis (lengths 1000 and 129, leaving a tail), a dot product in the fused
/// multiply-add form, over f32 integers (exact in any order) and f64 fractions.
fn long_reductions() -> Result<Case> {
    let mut program = Assignments::Noop;
    let mut results = vec![];
    for (k, (prec, op, rows, len)) in [
        (Prec::F32, BinOp::Add, 3, 1000),
        (Prec::F32, BinOp::Max, 5, 129),
        (Prec::F32, BinOp::Min, 2, 1000),
        (Prec::F64, BinOp::Add, 4, 1000),
    ]
    .into_iter()
    .enumerate()
    {
        let x = input(prec, &[rows, len], "x", k)?;
        let r = output(prec, &[rows], &format!("r{k}"))?;
        program = program.then(Assignments::einsum(
            "ij->i",
            op,
            &r,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
            true,
        )?);
        results.push(r);
    }
    let x = input(Prec::F32, &[1000], "x", 7)?;
    let y = input(Prec::F32, &[1000], "y", 8)?;
    let dot = output(Prec::F32, &[], "dot")?;
    program = program.then(Assignments::einsum(
        "i,i->",
        BinOp::Add,
        &dot,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(x), Operand::Node(y)),
        true,
    )?);
    results.push(dot);
    Ok(case("long_reductions", program, results))
}

/// Float max and min with NaN operands (the other operand wins, as in the interpreter),
/// pointwise and as a long row reduction.
fn max_min_with_nan() -> Result<Case> {
    let mut program = Assignments::Noop;
    let mut results = vec![];
    let nan = f64::NAN;
    for prec in [Prec::F32, Prec::F64] {
        let x = Tnode::new(prec, &[6], &["x"])?;
        x.host()
            .set_values(&[nan, 1.0, f64::NEG_INFINITY, 2.0, nan, -0.5])?;
        let y = Tnode::new(prec, &[6], &["y"])?;
        y.host().set_values(&[3.0, nan, nan, -1.0, nan, -0.25])?;
        for op in [BinOp::Max, BinOp::Min] {
            let r = output(prec, &[6], "r")?;
            program = program.then(Assignments::pointwise_binop(&r, op, &x, &y));
            results.push(r);
        }
        let long = Tnode::new(prec, &[2, 300], &["long"])?;
        long.host().set_values(
            &(0..600)
                .map(|i| {
                    if i % 7 == 3 {
                        nan
                    } else {
                        ((i * 13) % 101) as f64 - 50.0
                    }
                })
                .collect::<Vec<_>>(),
        )?;
        for op in [BinOp::Max, BinOp::Min] {
            let r = output(prec, &[2], "row")?;
            program = program.then(Assignments::einsum(
                "ij->i",
                op,
                &r,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(long.clone())),
                true,
            )?);
            results.push(r);
        }
    }
    Ok(case("max_min_with_nan", program, results))
}

/// The contraction cases (names starting with `gemm` are large enough to be scheduled as
/// blocked products on CPU backends).
pub fn contraction_cases() -> Result<Vec<Case>> {
    let f32 = Prec::F32;
    Ok(vec![
        einsum_case(
            "loops_matmul_1x1x1",
            f32,
            "ik,kj->ij",
            &[('i', 1), ('k', 1), ('j', 1)],
        )?,
        einsum_case(
            "loops_matmul_7x17x7",
            f32,
            "ik,kj->ij",
            &[('i', 7), ('k', 17), ('j', 7)],
        )?,
        // Axes of size 1 (a batch of one, a unit axis inside a factor): their loops run once
        // and are simplified away, leaving index 0; still one blocked product.
        einsum_case(
            "gemm_batch_of_one",
            f32,
            "bik,kj->bij",
            &[('b', 1), ('i', 64), ('k', 48), ('j', 40)],
        )?,
        einsum_case(
            "gemm_unit_axes_in_both_factors",
            f32,
            "iuk,kvj->iuj",
            &[('i', 70), ('u', 1), ('k', 33), ('v', 1), ('j', 50)],
        )?,
        einsum_case(
            "gemm_matmul_129x129x129",
            f32,
            "ik,kj->ij",
            &[('i', 129), ('k', 129), ('j', 129)],
        )?,
        einsum_case(
            "gemm_matmul_1000x17x7",
            f32,
            "ik,kj->ij",
            &[('i', 1000), ('k', 17), ('j', 7)],
        )?,
        einsum_case(
            "gemm_matmul_7x1000x17",
            f32,
            "ik,kj->ij",
            &[('i', 7), ('k', 1000), ('j', 17)],
        )?,
        einsum_case(
            "gemm_vector_matrix",
            f32,
            "k,kj->j",
            &[('k', 1000), ('j', 129)],
        )?,
        einsum_case(
            "gemm_matrix_vector",
            f32,
            "ik,k->i",
            &[('i', 129), ('k', 1000)],
        )?,
        einsum_case(
            "gemm_transposed_lhs",
            f32,
            "ki,kj->ij",
            &[('i', 17), ('k', 129), ('j', 129)],
        )?,
        einsum_case(
            "gemm_transposed_rhs",
            f32,
            "ik,jk->ij",
            &[('i', 129), ('k', 17), ('j', 129)],
        )?,
        einsum_case(
            "gemm_transposed_out",
            f32,
            "ik,kj->ji",
            &[('i', 129), ('k', 65), ('j', 17)],
        )?,
        einsum_case(
            "gemm_batched",
            f32,
            "bik,bkj->bij",
            &[('b', 3), ('i', 33), ('k', 17), ('j', 65)],
        )?,
        // Many small products: the batch is split over the workers, each product on one.
        einsum_case(
            "gemm_batch_of_small_products",
            f32,
            "bik,bjk->bij",
            &[('b', 67), ('i', 24), ('k', 13), ('j', 33)],
        )?,
        // Batches of products large enough to split themselves: split by batch element at run
        // time where the workers divide the batch evenly (2 on 2 workers), else each product
        // splits itself (3 on 2 workers).
        einsum_case(
            "gemm_even_batch_of_large_products",
            f32,
            "bik,bjk->bij",
            &[('b', 2), ('i', 65), ('k', 64), ('j', 66)],
        )?,
        einsum_case(
            "gemm_odd_batch_of_large_products",
            f32,
            "bki,bkj->bji",
            &[('b', 3), ('i', 65), ('k', 67), ('j', 66)],
        )?,
        // Rows of the left factor 4 KiB apart (1024 f32): packed rather than read in place,
        // four rows at a time through vector transposes, then the remaining rows.
        einsum_case(
            "gemm_rows_4kib_apart",
            f32,
            "ik,kj->ij",
            &[('i', 14), ('k', 1024), ('j', 5)],
        )?,
        // Few rows against a row-major right factor read in place (not packed): whole panels
        // and a partial one, depth blocks past the first adding onto the result, A's rows
        // read in place (row-major) and packed (column-major, with a partial sliver).
        einsum_case(
            "gemm_few_rows_right_factor_in_place",
            f32,
            "ik,kj->ij",
            &[('i', 40), ('k', 600), ('j', 100)],
        )?,
        einsum_case(
            "gemm_few_rows_packed_left_right_in_place",
            f32,
            "ki,kj->ij",
            &[('i', 30), ('k', 300), ('j', 70)],
        )?,
        // Batches of dot products (M = N = 1, as in a softmax or layer-norm gain gradient):
        // large enough for a blocked product, but it would fill one element of each register
        // tile, so they stay loops.
        einsum_case(
            "loops_batched_row_dot_products",
            f32,
            "bk,bk->b",
            &[('b', 300), ('k', 65)],
        )?,
        einsum_case(
            "loops_batched_column_dot_products",
            f32,
            "btd,btd->d",
            &[('b', 5), ('t', 65), ('d', 33)],
        )?,
        einsum_case(
            "gemm_conv_like",
            f32,
            "nhc,oc->nho",
            &[('n', 2), ('h', 65), ('c', 17), ('o', 9)],
        )?,
        einsum_case(
            "gemm_merged_reduction",
            f32,
            "ikl,klj->ij",
            &[('i', 33), ('k', 7), ('l', 17), ('j', 33)],
        )?,
        einsum_case(
            "loops_unmergeable_reduction",
            f32,
            "ikl,lkj->ij",
            &[('i', 33), ('k', 7), ('l', 17), ('j', 33)],
        )?,
        einsum_case(
            "gemm_f64_fractions",
            Prec::F64,
            "ik,kj->ij",
            &[('i', 65), ('k', 129), ('j', 33)],
        )?,
        product_with_epilogue()?,
        long_reductions()?,
        max_min_with_nan()?,
    ])
}

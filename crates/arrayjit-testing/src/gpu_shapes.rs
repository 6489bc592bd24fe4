//! Programs for the GPU planner's shapes in the conformance corpus: a sum of squares and a
//! maximum over two loops into one element, long enough for a two-phase grid reduction; a
//! mean whose sum is inlined into the scaling (a reduction inside an expression, hoisted into
//! an accumulation of its own), and two such sums in one expression; and softmax over the rows
//! of a batch of heads, fused under the batch loop (distributed, or run as row passes); small
//! independent passes that a GPU plan joins into one launch; and products with few results and
//! long reductions, which a plan for a large device splits along the reduction (split-K): a
//! weight gradient's shape (transposed left factor), a batched one, and one adding onto its
//! result's values with a bias and ReLU after it (its epilogue), over integers so that every
//! summation order gives the same bits.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, FetchOp, Operand, Prec, Result, StaticSymbol, Tnode, UnOp,
};

use super::case::{Case, case, output};

fn values(dims: &[usize], label: &str, seed: usize) -> Result<Tnode> {
    let t = Tnode::new(Prec::F32, dims, &[label])?;
    let n: usize = dims.iter().product();
    t.host().set_values(
        &(0..n)
            .map(|i| ((i * 53 + seed * 17) % 211) as f64 / 50.0 - 2.0)
            .collect::<Vec<_>>(),
    )?;
    Ok(t)
}

/// `Σ x²` and `max x` over a `[240, 300]` array (72 000 steps each) into one element.
fn long_reductions_into_one_element() -> Result<Case> {
    let x = values(&[240, 300], "x", 1)?;
    let squares = Tnode::new(Prec::F32, &[240, 300], &["squares"])?;
    let sum = output(Prec::F32, &[], "sum_of_squares")?;
    let max = output(Prec::F32, &[], "largest")?;
    let program = Assignments::pointwise_binop(&squares, BinOp::Mul, &x, &x)
        .then(Assignments::einsum(
            "ij->",
            BinOp::Add,
            &sum,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(squares)),
            true,
        )?)
        .then(Assignments::einsum(
            "ij->",
            BinOp::Max,
            &max,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
            true,
        )?);
    Ok(case(
        "long_reductions_into_one_element",
        program,
        vec![sum, max],
    ))
}

/// The mean of a `[64, 130]` array: its sum (never stored) scaled by a constant node.
fn mean_with_an_inlined_sum() -> Result<Case> {
    let x = values(&[64, 130], "x", 2)?;
    let total = Tnode::new(Prec::F32, &[], &["total"])?;
    let scale = Tnode::new(Prec::F32, &[], &["scale"])?;
    scale.host().set_values(&[1.0 / (64.0 * 130.0)])?;
    let mean = output(Prec::F32, &[], "mean")?;
    let program = Assignments::einsum(
        "ij->",
        BinOp::Add,
        &total,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
        true,
    )?
    .then(Assignments::pointwise_binop(
        &mean,
        BinOp::Mul,
        &total,
        &scale,
    ));
    Ok(case("mean_with_an_inlined_sum", program, vec![mean]))
}

/// `Σ x · a + Σ y · b` of two arrays of different shapes: two sums inlined into one expression
/// (hoisted into two slots of one local node).
fn two_inlined_sums() -> Result<Case> {
    let x = values(&[40, 70], "x", 4)?;
    let y = values(&[3, 500], "y", 5)?;
    let (sx, sy) = (
        Tnode::new(Prec::F32, &[], &["sx"])?,
        Tnode::new(Prec::F32, &[], &["sy"])?,
    );
    let (a, b) = (
        Tnode::new(Prec::F32, &[], &["a"])?,
        Tnode::new(Prec::F32, &[], &["b"])?,
    );
    a.host().set_values(&[0.25])?;
    b.host().set_values(&[-1.5])?;
    let (ax, by) = (
        Tnode::new(Prec::F32, &[], &["ax"])?,
        Tnode::new(Prec::F32, &[], &["by"])?,
    );
    let total = output(Prec::F32, &[], "weighted_total")?;
    let sum = |t: &Tnode, x: Tnode| {
        Assignments::einsum(
            "ij->",
            BinOp::Add,
            t,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
            true,
        )
    };
    let program = sum(&sx, x)?
        .then(sum(&sy, y)?)
        .then(Assignments::pointwise_binop(&ax, BinOp::Mul, &sx, &a))
        .then(Assignments::pointwise_binop(&by, BinOp::Mul, &sy, &b))
        .then(Assignments::pointwise_binop(&total, BinOp::Add, &ax, &by));
    Ok(case("two_inlined_sums", program, vec![total]))
}

/// Softmax over the rows of `[3, 5, 70]` (a batch of heads' rows).
fn batched_softmax() -> Result<Case> {
    let x = values(&[3, 5, 70], "x", 3)?;
    let (program, y) = super::fusion::softmax_over_last_axis(x, "batched_softmax")?;
    Ok(case("batched_softmax", program, vec![y]))
}

/// Small passes that leave a GPU idle and touch nothing the others write, so that a GPU plan
/// runs them side by side in one launch: a sum and a maximum into one element (a group
/// each), row sums of 6 rows (a group per row), a scaling (a grid), a slice picked by a static
/// index added into a running sum, and statements that read their results (after them).
fn joined_small_passes() -> Result<Case> {
    let m = values(&[6, 300], "m", 4)?;
    let v = values(&[300], "v", 5)?;
    let data = values(&[4, 40], "data", 6)?;
    let total = output(Prec::F32, &[], "total")?;
    let largest = output(Prec::F32, &[], "largest")?;
    let rows = output(Prec::F32, &[6], "row_sums")?;
    let doubled = output(Prec::F32, &[300], "doubled")?;
    let batch = StaticSymbol::new("batch", 4);
    let slice = Tnode::new(Prec::F32, &[40], &["slice"])?;
    let running = values(&[40], "running", 7)?;
    let shifted = output(Prec::F32, &[300], "shifted")?;
    let sum = |spec: &str, op, out: &Tnode, of: &Tnode| {
        Assignments::einsum(
            spec,
            op,
            out,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(of.clone())),
            true,
        )
    };
    let program = sum("ij->", BinOp::Add, &total, &m)?
        .then(sum("i->", BinOp::Max, &largest, &v)?)
        .then(sum("ij->i", BinOp::Add, &rows, &m)?)
        .then(Assignments::pointwise_binop(&doubled, BinOp::Add, &v, &v))
        .then(Assignments::Fetch {
            array: slice.clone(),
            op: FetchOp::Slice {
                batch: batch.clone(),
                sliced: data,
            },
        })
        .then(Assignments::einsum(
            "i->i",
            BinOp::Add,
            &running,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(slice)),
            false,
        )?)
        .then(Assignments::pointwise_binop(
            &shifted,
            BinOp::Mul,
            &doubled,
            &v,
        ));
    Ok(Case {
        name: "joined_small_passes".into(),
        program,
        bindings: vec![batch],
        runs: vec![vec![2], vec![0], vec![3]],
        results: vec![total, largest, rows, doubled, running, shifted],
    })
}

/// `c = a · b` by einsum `spec` over integer factors of dims `a` and `b` (values `-2..=2`: the
/// sums are exact in any order), into a hosted result of dims `c`.
pub fn long_product(name: &str, spec: &str, a: &[usize], b: &[usize], c: &[usize]) -> Result<Case> {
    long_product_in(Prec::F32, name, spec, a, b, c)
}

/// [`long_product`] with factors in `prec` (a 16-bit one for the matrix units) and an `f32`
/// result (a 16-bit result accumulated step by step, as the interpreter does, would round
/// away the sum's low bits; the matrix units accumulate in `f32`).
pub fn long_product_in(
    prec: Prec,
    name: &str,
    spec: &str,
    a: &[usize],
    b: &[usize],
    c: &[usize],
) -> Result<Case> {
    super::contractions::product_case(
        name,
        [prec, prec, Prec::F32],
        spec,
        [a, b, c].map(<[usize]>::to_vec),
    )
}

/// The GPU-shape cases.
pub fn gpu_shape_cases() -> Result<Vec<Case>> {
    Ok(vec![
        long_reductions_into_one_element()?,
        mean_with_an_inlined_sum()?,
        two_inlined_sums()?,
        batched_softmax()?,
        joined_small_passes()?,
        long_product(
            "split_product_weight_gradient",
            "ki,kj->ij",
            &[2000, 40],
            &[2000, 36],
            &[40, 36],
        )?,
        long_product(
            "split_product_batched",
            "bik,bkj->bij",
            &[2, 24, 700],
            &[2, 700, 20],
            &[2, 24, 20],
        )?,
        // `ab += a · b` onto `ab`'s values, then `y = relu(ab + bias)`: 33 × 47 results of
        // 1500 steps each.
        super::contractions::product_bias_relu(
            "split_product_onto_values_then_relu",
            (33, 1500, 47),
            true,
        )?,
    ])
}

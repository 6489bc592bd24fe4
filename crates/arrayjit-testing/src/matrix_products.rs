//! Products of 16-bit factors, which run on the matrix units where a device has them (the CUDA
//! emulation, tensor-core GPUs): `bf16` and `f16`, into a result of the factors' precision or
//! `f32`, with sides that are not multiples of a tile or a fragment, a `k` that is not a
//! multiple of the staging depth, factors whose contiguous axis is `k` or the result side (the
//! plain and the transposed fragment loads), and batch loops.
//!
//! Also products followed by a pointwise statement over their result, which GPU plans run in
//! the product's epilogue: a bias and a ReLU after an `f32` product and after a `bf16` one, and
//! a statement that reads another element of the result (which must not be moved into the
//! product: a group would read an element another group has not stored yet).
//!
//! The factors' values are small multiples of ½ (or whole numbers) whose products and partial
//! sums are exact in the result's precision, so every order of summation — the loop nest's,
//! rounding at each step, and the matrix units', in `f32` — gives the same bits, and a result
//! that differs shows a wrong layout, not a rounding.

use arrayjit_ir::{AccumRhs, Assignments, BinOp, Operand, Prec, Result, Tnode, UnOp};

use super::case::{Case, case, output};

/// A factor of `dims` with values from `{-step·r, …, step·r}`, a pattern varied by `seed`.
pub(crate) fn factor(
    prec: Prec,
    dims: &[usize],
    label: &str,
    seed: usize,
    r: i64,
    step: f64,
) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    let n: usize = dims.iter().product();
    let span = (2 * r + 1) as usize;
    t.host().set_values(
        &(0..n)
            .map(|i| (((i * 7 + seed * 13 + i / 5) % span) as i64 - r) as f64 * step)
            .collect::<Vec<_>>(),
    )?;
    Ok(t)
}

/// `out = Σ_k lhs · rhs` by the einsum `spec`.
pub(crate) fn product(spec: &str, out: &Tnode, lhs: &Tnode, rhs: &Tnode) -> Result<Assignments> {
    Assignments::einsum(
        spec,
        BinOp::Add,
        out,
        AccumRhs::Binop(
            BinOp::Mul,
            Operand::Node(lhs.clone()),
            Operand::Node(rhs.clone()),
        ),
        true,
    )
}

/// `bf16` `[70, 40] · [40, 90]`: partial tiles on both sides and a partial staging depth.
fn bf16_product() -> Result<Case> {
    let a = factor(Prec::Bf16, &[70, 40], "a", 1, 2, 0.5)?;
    let b = factor(Prec::Bf16, &[40, 90], "b", 2, 2, 0.5)?;
    let c = output(Prec::Bf16, &[70, 90], "c")?;
    Ok(case(
        "matrix_bf16_70x40x90",
        product("mk,kn->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// `f16` with the left factor stored `[k, m]` and the right `[n, k]`: both fragment loads
/// transposed relative to the plain product.
fn f16_transposed_factors() -> Result<Case> {
    let a = factor(Prec::F16, &[50, 33], "a_km", 3, 3, 0.5)?;
    let b = factor(Prec::F16, &[47, 50], "b_nk", 4, 3, 0.5)?;
    let c = output(Prec::F16, &[33, 47], "c")?;
    Ok(case(
        "matrix_f16_transposed_33x50x47",
        product("km,nk->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// `bf16` factors into an `f32` result, three batch elements of `[48, 72] · [72, 40]`.
fn bf16_batch_into_f32() -> Result<Case> {
    let a = factor(Prec::Bf16, &[3, 48, 72], "a", 5, 4, 0.25)?;
    let b = factor(Prec::Bf16, &[3, 72, 40], "b", 6, 4, 0.25)?;
    let c = output(Prec::F32, &[3, 48, 40], "c")?;
    Ok(case(
        "matrix_bf16_batch_into_f32",
        product("bmk,bkn->bmn", &c, &a, &b)?,
        vec![c],
    ))
}

/// A `bf16` product large enough for 128-tiles on a small device: `[144, 100] · [100, 136]`.
fn bf16_large_product() -> Result<Case> {
    let a = factor(Prec::Bf16, &[144, 100], "a", 7, 1, 1.0)?;
    let b = factor(Prec::Bf16, &[100, 136], "b", 8, 1, 1.0)?;
    let c = output(Prec::Bf16, &[144, 136], "c")?;
    Ok(case(
        "matrix_bf16_144x100x136",
        product("mk,kn->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// A `bf16` product with more than a band of tiles on each side at 32- and 64-tiles
/// (`[580, 24] · [24, 590]`: 19 × 19 and 10 × 10 tiles), so its groups take their tiles in
/// bands of rows ([`arrayjit_opt::schedule::gpu::TileOrder`]), the last band shorter.
fn bf16_banded_product() -> Result<Case> {
    let a = factor(Prec::Bf16, &[580, 24], "a", 12, 2, 0.5)?;
    let b = factor(Prec::Bf16, &[24, 590], "b", 13, 2, 0.5)?;
    let c = output(Prec::F32, &[580, 590], "c")?;
    Ok(case(
        "matrix_bf16_banded_580x24x590",
        product("mk,kn->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// `relu(a · b + bias)` over the columns, the product in `prec` factors into an `f32` result.
fn product_bias_relu(prec: Prec, name: &str) -> Result<Case> {
    let (m, k, n) = (70, 40, 90);
    let a = factor(prec, &[m, k], "a", 9, 2, 0.5)?;
    let b = factor(prec, &[k, n], "b", 10, 2, 0.5)?;
    let bias = factor(Prec::F32, &[n], "bias", 11, 8, 0.5)?;
    let c = Tnode::new(Prec::F32, &[m, n], &["c"])?;
    let biased = Tnode::new(Prec::F32, &[m, n], &["biased"])?;
    let y = output(Prec::F32, &[m, n], "y")?;
    let program = product("mk,kn->mn", &c, &a, &b)?
        .then(Assignments::einsum(
            "mn,n->mn",
            BinOp::Arg2,
            &biased,
            AccumRhs::Binop(BinOp::Add, Operand::Node(c), Operand::Node(bias)),
            false,
        )?)
        .then(Assignments::einsum(
            "mn->mn",
            BinOp::Arg2,
            &y,
            AccumRhs::Unop(UnOp::Relu, Operand::Node(biased)),
            false,
        )?);
    Ok(case(name, program, vec![y]))
}

/// `c - cᵀ` of a square product: reads another element of the product's result.
fn product_minus_its_transpose() -> Result<Case> {
    let n = 48;
    let a = factor(Prec::F32, &[n, n], "a", 12, 3, 0.5)?;
    let b = factor(Prec::F32, &[n, n], "b", 13, 3, 0.5)?;
    let c = Tnode::new(Prec::F32, &[n, n], &["c"])?;
    let y = output(Prec::F32, &[n, n], "y")?;
    let program = product("ik,kj->ij", &c, &a, &b)?.then(Assignments::einsum(
        "ij,ji->ij",
        BinOp::Arg2,
        &y,
        AccumRhs::Binop(BinOp::Sub, Operand::Node(c.clone()), Operand::Node(c)),
        false,
    )?);
    Ok(case("product_minus_its_transpose", program, vec![y]))
}

/// The cases of this family.
pub fn matrix_product_cases() -> Result<Vec<Case>> {
    Ok(vec![
        bf16_product()?,
        f16_transposed_factors()?,
        bf16_batch_into_f32()?,
        bf16_large_product()?,
        bf16_banded_product()?,
        product_bias_relu(Prec::F32, "f32_product_bias_relu")?,
        product_bias_relu(Prec::Bf16, "bf16_product_bias_relu")?,
        product_minus_its_transpose()?,
    ])
}

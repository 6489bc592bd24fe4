//! `f32` products in the shapes that vary the GPU's tiled `f32` product
//! ([`arrayjit_opt::schedule::gpu::simt`]): factors read by 128-bit loads and element by
//! element, each with `k` or the result side as its contiguous axis, a `k` that is and is not
//! a multiple of the staging depth, sides that are not multiples of a tile, batch loops, and a
//! product that adds onto its result's values instead of overwriting them.
//!
//! Values are small multiples of ½ whose products and sums are exact in `f32`, so any order of
//! summation gives the same bits (the tiled product keeps the loop's order anyway).

use arrayjit_ir::{Assignments, BinOp, Prec, Result};

use super::case::{Case, case, output};
use super::matrix_products::{factor, product};

/// `[130, 72] · [72, 260]`: both factors read by 128-bit loads where a tile's share allows
/// (the left along `k`, the right along its columns); `k` a multiple of 8, not of 16.
fn plain() -> Result<Case> {
    let a = factor(Prec::F32, &[130, 72], "a", 21, 3, 0.5)?;
    let b = factor(Prec::F32, &[72, 260], "b", 22, 3, 0.5)?;
    let c = output(Prec::F32, &[130, 260], "c")?;
    Ok(case(
        "simt_f32_130x72x260",
        product("mk,kn->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// The left factor stored `[k, m]` with `m = 66` and the right `[n, k]` with `k = 75`: no
/// extent a multiple of 4, so both are read element by element (along `m` and along `k`).
fn transposed_element_by_element() -> Result<Case> {
    let a = factor(Prec::F32, &[75, 66], "a_km", 23, 3, 0.5)?;
    let b = factor(Prec::F32, &[70, 75], "b_nk", 24, 3, 0.5)?;
    let c = output(Prec::F32, &[66, 70], "c")?;
    Ok(case(
        "simt_f32_transposed_66x75x70",
        product("km,nk->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// The left factor stored `[k, m]` and the right `[n, k]`, with extents that are multiples of
/// 4: both read by 128-bit loads, the left along its rows `m`, the right along `k`; `k = 36`
/// leaves a partial depth.
fn transposed_vector() -> Result<Case> {
    let a = factor(Prec::F32, &[36, 68], "a_km", 25, 3, 0.5)?;
    let b = factor(Prec::F32, &[132, 36], "b_nk", 26, 3, 0.5)?;
    let c = output(Prec::F32, &[68, 132], "c")?;
    Ok(case(
        "simt_f32_transposed_vector_68x36x132",
        product("km,nk->mn", &c, &a, &b)?,
        vec![c],
    ))
}

/// Three batch elements of `[40, 20] · [20, 36]` added onto the result's values (no zeroing:
/// every element starts from its value).
fn batch_accumulating() -> Result<Case> {
    let a = factor(Prec::F32, &[3, 40, 20], "a", 27, 2, 0.5)?;
    let b = factor(Prec::F32, &[3, 20, 36], "b", 28, 2, 0.5)?;
    let c = output(Prec::F32, &[3, 40, 36], "c")?;
    c.host().set_values(
        &(0..3 * 40 * 36)
            .map(|i| ((i % 9) as f64 - 4.0) * 0.5)
            .collect::<Vec<_>>(),
    )?;
    let program = Assignments::einsum(
        "bmk,bkn->bmn",
        BinOp::Add,
        &c,
        arrayjit_ir::AccumRhs::Binop(
            BinOp::Mul,
            arrayjit_ir::Operand::Node(a),
            arrayjit_ir::Operand::Node(b),
        ),
        false,
    )?;
    Ok(case("simt_f32_batch_accumulating", program, vec![c]))
}

/// The cases of this family.
pub fn simt_product_cases() -> Result<Vec<Case>> {
    Ok(vec![
        plain()?,
        transposed_element_by_element()?,
        transposed_vector()?,
        batch_accumulating()?,
    ])
}

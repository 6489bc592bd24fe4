//! Products of `f32` activations by a `bf16` factor into an `f32` result (a model's weights
//! stored in `bf16`): on a CPU the product helper widens the `bf16` factor as it reads it
//! (`arrayjit_opt::schedule::Gemm::widened_factor`), elsewhere they are loops. The shapes cover
//! each path of the helper: one row with the matrix's rows contiguous (a linear layer of a
//! decoding step) and with its columns contiguous (a tied output head), both with remainders of
//! a vector and of four; blocked products with partial panels, with the depth split into
//! blocks, with a transposed result; the narrow factor on the left; a single column.
//!
//! Values are small integers, exact in `bf16` and whose sums are exact in `f32` in any order,
//! so a result that differs shows a wrong layout or widening, not a rounding.

use arrayjit_ir::{Prec, Result};

use super::case::Case;
use super::contractions::product_case;

/// `c = a ·spec· b` with `a` in `pa`, `b` in `pb`, `c` in `f32`, letter sizes `sizes`.
fn widened_case(
    name: &str,
    [pa, pb]: [Prec; 2],
    spec: &str,
    sizes: &[(char, usize)],
) -> Result<Case> {
    let size = |c: char| sizes.iter().find(|(l, _)| *l == c).map_or(1, |(_, s)| *s);
    let dims = |operand: &str| operand.chars().map(size).collect::<Vec<_>>();
    let (inputs, out) = spec.split_once("->").unwrap_or((spec, ""));
    let (l, r) = inputs.split_once(',').unwrap_or((inputs, ""));
    product_case(
        name,
        [pa, pb, Prec::F32],
        spec,
        [dims(l), dims(r), dims(out)],
    )
}

/// The cases (see the module doc).
pub fn widened_cases() -> Result<Vec<Case>> {
    use Prec::{Bf16, F32};
    Ok(vec![
        // A decoding step's linear layer: x [1, 1, d] · W [d, heads, width], large enough to
        // be split over the workers by columns.
        widened_case(
            "widened_row_by_rows",
            [F32, Bf16],
            "btd,dhe->bthe",
            &[('b', 1), ('t', 1), ('d', 203), ('h', 3), ('e', 441)],
        )?,
        // A tied head: x [1, 1, d] · Eᵀ with E [vocabulary, d], split over the workers.
        widened_case(
            "widened_row_by_columns",
            [F32, Bf16],
            "btd,vd->btv",
            &[('b', 1), ('t', 1), ('d', 97), ('v', 2703)],
        )?,
        // Blocked: rows (b, t) merged, partial panels of columns.
        widened_case(
            "widened_blocked_partial_panels",
            [F32, Bf16],
            "btd,dn->btn",
            &[('b', 2), ('t', 37), ('d', 97), ('n', 70)],
        )?,
        // Blocked, the depth split into blocks, and a head's transposed factor.
        widened_case(
            "widened_blocked_deep_transposed",
            [F32, Bf16],
            "td,vd->tv",
            &[('t', 20), ('d', 700), ('v', 45)],
        )?,
        // A result stored column-major relative to the product's rows and columns.
        widened_case(
            "widened_blocked_transposed_result",
            [F32, Bf16],
            "mk,kn->nm",
            &[('m', 30), ('k', 50), ('n', 40)],
        )?,
        // The narrow factor on the left: a weight gradient's shape, then one column.
        widened_case(
            "widened_left_factor",
            [Bf16, F32],
            "ok,kn->on",
            &[('o', 70), ('k', 97), ('n', 33)],
        )?,
        widened_case(
            "widened_left_factor_one_column",
            [Bf16, F32],
            "ok,k->o",
            &[('o', 300), ('k', 97)],
        )?,
        // A single column of the right factor.
        widened_case(
            "widened_single_column",
            [F32, Bf16],
            "mk,k->m",
            &[('m', 250), ('k', 97)],
        )?,
    ])
}

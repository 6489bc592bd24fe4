//! Guarded accumulations for the conformance corpus ([`arrayjit_ir::Projections::guards`]):
//! the products of causal attention (scores, the weighted sum of values and the gradient
//! products, each with the guard on a different side of the product), a guard with an offset
//! on a column-major result, depths across several cache blocks, infinities in the terms a
//! guard skips, two guards (a band), and guarded reductions, copies and assignments. Large
//! products run as blocked products that skip whole tiles on CPU backends; the rest as loops.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, EinsumGuard, Operand, Prec, Result, StaticSymbol, Tnode, UnOp,
};

use super::case::{Case, case, output};
use super::contractions::input;

/// The product `c = a ·spec· b` with `guards`, over inputs of the letters' sizes.
fn guarded_product(
    name: &str,
    prec: Prec,
    spec: &str,
    sizes: &[(char, usize)],
    guards: &[EinsumGuard],
) -> Result<Case> {
    let size = |c: char| sizes.iter().find(|(l, _)| *l == c).map_or(1, |(_, s)| *s);
    let (inputs, out) = spec.split_once("->").unwrap_or((spec, ""));
    let (l, r) = inputs.split_once(',').unwrap_or((inputs, ""));
    let [a, b, c] = [l, r, out].map(|o| o.chars().map(size).collect::<Vec<_>>());
    let a = input(prec, &a, "a", 1)?;
    let b = input(prec, &b, "b", 2)?;
    // Stale values the product must replace (the result starts from zero): an element with
    // no term left must be zeroed, not skipped.
    let n: usize = c.iter().product();
    let c = output(prec, &c, "c")?;
    c.host().set_values(&vec![7.0; n])?;
    let program = Assignments::einsum_guarded(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
        guards,
    )?;
    Ok(case(name, program, vec![c]))
}

/// `te = ts · se` over `s ≤ t` where every skipped `a[t, s]` is infinite: a product that
/// multiplied them (by zero or anything) would give NaN or infinity.
fn infinities_above_the_guard() -> Result<Case> {
    let (t, e) = (70, 40);
    let a = Tnode::new(Prec::F32, &[t, t], &["a"])?;
    a.host().set_values(
        &(0..t * t)
            .map(|x| {
                let (row, col) = (x / t, x % t);
                if col > row {
                    f64::INFINITY
                } else {
                    ((x * 7) % 5) as f64 - 2.0
                }
            })
            .collect::<Vec<_>>(),
    )?;
    let b = input(Prec::F32, &[t, e], "b", 3)?;
    let c = output(Prec::F32, &[t, e], "c")?;
    let program = Assignments::einsum_guarded(
        "ts,se->te",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
        &[EinsumGuard::at_most('s', 't', 0)],
    )?;
    Ok(case("guarded_infinities_skipped", program, vec![c]))
}

/// A guard of the depth and one side with an infinity in the other factor, at a depth where
/// only some elements' terms pass: the rows (columns) that skip it must not see it (a product
/// that zeroed the guarded factor instead would give them `0 · ∞ = NaN`).
fn infinite_other_factor(name: &str, spec: &str, infinite: usize) -> Result<Case> {
    let (t, e) = (70, 40);
    let (inputs, _) = spec.split_once("->").unwrap_or((spec, ""));
    let (l, r) = inputs.split_once(',').unwrap_or((inputs, ""));
    let size = |c: char| if c == 'e' { e } else { t };
    let [a, b] = [l, r].map(|o| o.chars().map(size).collect::<Vec<_>>());
    let factors = [input(Prec::F32, &a, "a", 5)?, input(Prec::F32, &b, "b", 6)?];
    // Two infinities, of either sign, in the factor the guard does not depend on.
    let x = &factors[infinite];
    let mut values = x.host().get_values()?;
    let n = values.len();
    values[n / 3] = f64::INFINITY;
    values[n / 2 + 7] = f64::NEG_INFINITY;
    x.host().set_values(&values)?;
    let [a, b] = factors;
    let c_dims: Vec<usize> = spec
        .split("->")
        .nth(1)
        .unwrap_or("")
        .chars()
        .map(size)
        .collect();
    let c = output(Prec::F32, &c_dims, "c")?;
    let program = Assignments::einsum_guarded(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
        &[EinsumGuard::at_most('s', 't', 0)],
    )?;
    Ok(case(name, program, vec![c]))
}

/// Guarded reductions and copies as loops: a row maximum over the lower triangle, a row sum
/// read by one pointwise statement (inlined there or not), a strictly lower-triangular copy
/// (the rest at the neutral zero), and an assignment of the lower triangle over values already
/// there (the rest keeps them).
fn guarded_loops() -> Result<Case> {
    let n = 9;
    let x = input(Prec::F32, &[n, n], "x", 4)?;
    let at_most = |offset| [EinsumGuard::at_most('j', 'i', offset)];
    let row_max = output(Prec::F32, &[n], "row_max")?;
    let lower = output(Prec::F32, &[n, n], "strictly_lower")?;
    let kept = output(Prec::F32, &[n, n], "kept")?;
    kept.host()
        .set_values(&(0..n * n).map(|i| 100.0 + i as f64).collect::<Vec<_>>())?;
    let identity = || AccumRhs::Unop(UnOp::Identity, Operand::Node(x.clone()));
    // A guarded row sum that is not a result, read once: the optimizer may inline it into
    // its reader.
    let row_sum = Tnode::new(Prec::F32, &[n], &["row_sum"])?;
    let negated = output(Prec::F32, &[n], "negated")?;
    let program =
        Assignments::einsum_guarded("ij->i", BinOp::Max, &row_max, identity(), true, &at_most(0))?
            .then(Assignments::einsum_guarded(
                "ij->i",
                BinOp::Add,
                &row_sum,
                identity(),
                true,
                &at_most(1),
            )?)
            .then(Assignments::pointwise_unop(&negated, UnOp::Neg, &row_sum))
            .then(Assignments::einsum_guarded(
                "ij->ij",
                BinOp::Add,
                &lower,
                identity(),
                true,
                &at_most(-1),
            )?)
            .then(Assignments::einsum_guarded(
                "ij->ij",
                BinOp::Arg2,
                &kept,
                identity(),
                false,
                &at_most(0),
            )?);
    Ok(case(
        "guarded_loops",
        program,
        vec![row_max, lower, kept, negated],
    ))
}

/// `te += Σ_s a[t, s] · b[s, e]` over `s ≤ start + t`, with `start` bound per run: each run
/// adds a different triangle, so the result after all runs checks each run's guard.
fn guarded_by_static() -> Result<Case> {
    let (t, s, e) = (5, 40, 24);
    let start = StaticSymbol::new("start", s - t + 1);
    let a = input(Prec::F32, &[t, s], "a", 1)?;
    let b = input(Prec::F32, &[s, e], "b", 2)?;
    let c = output(Prec::F32, &[t, e], "c")?;
    c.host().set_values(&vec![0.5; t * e])?;
    let program = Assignments::einsum_guarded(
        "ts,se->te",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        false,
        &[EinsumGuard::at_most('s', 't', 0).plus_static(1, &start)],
    )?;
    let mut case = case("guarded_by_static", program, vec![c]);
    case.bindings = vec![start];
    case.runs = vec![vec![0], vec![17], vec![35], vec![3]];
    Ok(case)
}

/// A key cache: each run writes three rows at slot `start` ([`Assignments::write_at_static`])
/// and sums, for each new row `t`, the cache's rows `s ≤ start + t` (the slots written so far,
/// its own included). Rows no run writes keep their first values; a later run overwrites an
/// earlier one's rows.
fn cache_written_at_static() -> Result<Case> {
    let (slots, chunk, width) = (12, 3, 8);
    let start = StaticSymbol::new("start", slots - chunk + 1);
    let rows = input(Prec::F32, &[chunk, width], "rows", 3)?;
    let cache = output(Prec::F32, &[slots, width], "cache")?;
    cache.host().set_values(
        &(0..slots * width)
            .map(|k| k as f64 * 0.25)
            .collect::<Vec<_>>(),
    )?;
    let sums = output(Prec::F32, &[chunk, width], "sums")?;
    sums.host().set_values(&vec![0.0; chunk * width])?;
    let program =
        Assignments::write_at_static(&cache, &rows, 0, &start)?.then(Assignments::einsum_guarded(
            "se->te",
            BinOp::Add,
            &sums,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(cache.clone())),
            false,
            &[EinsumGuard::at_most('s', 't', 0).plus_static(1, &start)],
        )?);
    let mut case = case(
        "guarded_cache_written_at_static",
        program,
        vec![cache, sums],
    );
    case.bindings = vec![start];
    case.runs = vec![vec![0], vec![3], vec![9], vec![2]];
    Ok(case)
}

/// The corpus's guarded cases.
pub fn guarded_cases() -> Result<Vec<Case>> {
    let causal = [EinsumGuard::at_most('s', 't', 0)];
    let attention = [('b', 2), ('h', 3), ('t', 45), ('s', 45), ('e', 20)];
    Ok(vec![
        // The guard on the result's rows and columns (the scores).
        guarded_product(
            "guarded_scores",
            Prec::F32,
            "bthe,bshe->bhts",
            &attention,
            &causal,
        )?,
        // On the depth and the rows (the weighted sum of values; the query gradient).
        guarded_product(
            "guarded_mix",
            Prec::F32,
            "bhts,bshe->bthe",
            &attention,
            &causal,
        )?,
        // On the depth and the rows the other way (the key and value gradients).
        guarded_product(
            "guarded_key_gradient",
            Prec::F32,
            "bhts,bthe->bshe",
            &attention,
            &causal,
        )?,
        // On the depth and the columns.
        guarded_product(
            "guarded_columns",
            Prec::F32,
            "te,ts->es",
            &[('t', 67), ('s', 67), ('e', 37)],
            &causal,
        )?,
        // An offset, on a column-major result (the product runs transposed).
        guarded_product(
            "guarded_transposed_result",
            Prec::F32,
            "ik,kj->ji",
            &[('i', 50), ('j', 61), ('k', 33)],
            &[EinsumGuard::at_most('j', 'i', 2)],
        )?,
        // Depths across cache blocks (two of 280 where `kc` is 512, three of 192 where it is
        // 256); the first row has no term (left at zero).
        guarded_product(
            "guarded_long_depth",
            Prec::F32,
            "ts,se->te",
            &[('t', 560), ('s', 560), ('e', 33)],
            &[EinsumGuard::at_most('s', 't', -1)],
        )?,
        // Rows past the first depth block have no term in it (zeroed there).
        guarded_product(
            "guarded_key_gradient_long",
            Prec::F32,
            "ts,te->se",
            &[('t', 560), ('s', 560), ('e', 24)],
            &causal,
        )?,
        guarded_product(
            "guarded_mix_f64",
            Prec::F64,
            "bhts,bshe->bthe",
            &attention,
            &causal,
        )?,
        // A band: two guards.
        guarded_product(
            "guarded_band",
            Prec::F32,
            "ts,se->te",
            &[('t', 40), ('s', 40), ('e', 24)],
            &[
                EinsumGuard::at_most('s', 't', 0),
                EinsumGuard::at_most('t', 's', 3),
            ],
        )?,
        // Small enough to stay loops.
        guarded_product(
            "guarded_small_product",
            Prec::F32,
            "ij,jk->ik",
            &[('i', 5), ('j', 6), ('k', 7)],
            &[EinsumGuard::at_most('k', 'i', 0)],
        )?,
        infinities_above_the_guard()?,
        // `t` the rows, `s` the depth: `b` is the other factor.
        infinite_other_factor("guarded_rows_infinite_right_factor", "ts,se->te", 1)?,
        // `s` the columns, `t` the depth: `a` is the other factor.
        infinite_other_factor("guarded_columns_infinite_left_factor", "te,ts->es", 0)?,
        // A guard of rows, columns and depth at once: `e ≤ t - s + 30`.
        guarded_product(
            "guarded_three_terms",
            Prec::F32,
            "ts,se->te",
            &[('t', 60), ('s', 60), ('e', 45)],
            &[EinsumGuard {
                terms: vec![(1, 't'), (-1, 's'), (-1, 'e')],
                statics: Vec::new(),
                offset: 30,
            }],
        )?,
        guarded_loops()?,
        guarded_by_static()?,
        cache_written_at_static()?,
    ])
}

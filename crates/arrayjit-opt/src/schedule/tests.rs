//! Choosing which nests are split over workers: by estimated work, not iterations alone.

use super::*;
use arrayjit_ir::ops::UnOp;

/// `y[i, j] = value` over a `[rows, cols]` nest.
fn nest(y: &Tnode, rows: i64, cols: i64, value: impl Fn(&[AxisIndex]) -> ScalarExpr) -> LowLevel {
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let idcs = vec![AxisIndex::Iterator(i), AxisIndex::Iterator(j)];
    LowLevel::For {
        index: i,
        from: 0,
        to: rows,
        body: Box::new(LowLevel::For {
            index: j,
            from: 0,
            to: cols,
            body: Box::new(LowLevel::Set {
                tn: y.clone(),
                value: value(&idcs),
                idcs,
            }),
        }),
    }
}

#[test]
fn a_heavy_body_is_split_over_workers_where_a_copy_of_the_same_size_is_not() {
    let x = Tnode::new(Prec::F32, &[128, 512], &["x"]).unwrap();
    let y = Tnode::new(Prec::F32, &[128, 512], &["y"]).unwrap();
    let get = |i: &[AxisIndex]| ScalarExpr::Get(x.clone(), i.to_vec());
    let copy = nest(&y, 128, 512, get);
    // An optimizer-like update: four operations per element.
    let update = nest(&y, 128, 512, |i| {
        ScalarExpr::unop(
            UnOp::Sqrt,
            ScalarExpr::binop(
                BinOp::Div,
                ScalarExpr::binop(BinOp::Add, get(i), get(i)),
                ScalarExpr::binop(BinOp::Mul, get(i), ScalarExpr::Constant(2.0)),
            ),
        )
    });
    assert_eq!(nest_iterations(&copy), 65536);
    assert_eq!(nest_work(&copy), 65536);
    assert_eq!(nest_work(&update), 5 * 65536);
    let settings = ScheduleSettings::default();
    let schedules = schedule(&[&copy, &update], &settings);
    assert!(schedules[0].parallel.is_none(), "{}", schedules[0].why);
    assert!(schedules[1].parallel.is_some(), "{}", schedules[1].why);
}

/// A guarded einsum lowers to a contraction whose product carries the guard in its own rows,
/// columns and depth, and counts the terms it keeps; a guard that does not fit (a band of two
/// guards, a coefficient of 2) leaves the loops.
#[test]
fn guards_map_onto_the_products_rows_columns_and_depth() {
    use arrayjit_ir::assignments::{AccumRhs, Assignments, Operand};
    use arrayjit_ir::indexing::{EinsumGuard, Projections};
    let product = |spec: &str, guards: &[EinsumGuard]| {
        let a = Tnode::new(Prec::F32, &[4, 4], &["a"]).unwrap();
        let b = Tnode::new(Prec::F32, &[4, 4], &["b"]).unwrap();
        let c = Tnode::new(Prec::F32, &[4, 4], &["c"]).unwrap();
        let program = Assignments::Accum {
            initialize_neutral: true,
            accum: BinOp::Add,
            lhs: c.clone(),
            projections: Projections::einsum_guarded(spec, &[4, 4], &[&[4, 4], &[4, 4]], guards)
                .unwrap(),
            rhs: AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        };
        let LowLevel::Seq(items) = program.lower(&[]).unwrap() else {
            panic!("a zeroing and the product")
        };
        items
            .iter()
            .find_map(Contraction::detect_guarded)
            .and_then(|c| c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3], Default::default())))
    };
    let causal = [EinsumGuard::at_most('s', 't', 0)];
    // Scores: rows t, columns s: 10 of the 16 pairs, every depth.
    let scores = product("te,se->ts", &causal).unwrap();
    assert_eq!(scores.guard, Some([1, -1, 0, 0]));
    assert_eq!(scores.kept_fraction(), 10.0 / 16.0);
    assert_eq!(scores.guard_text().unwrap(), "terms where i - j >= 0");
    // The weighted sum: rows t, depth s.
    let mix = product("ts,se->te", &causal).unwrap();
    assert_eq!(mix.guard, Some([1, 0, -1, 0]));
    assert_eq!(mix.kept_fraction(), 40.0 / 64.0);
    // Strictly earlier keys, columns and depth.
    let strict = product("te,ts->es", &[EinsumGuard::at_most('s', 't', -1)]).unwrap();
    assert_eq!(strict.guard, Some([0, -1, 1, -1]));
    assert_eq!(strict.kept_fraction(), 24.0 / 64.0);
    // Unguarded: every term. The plain detector refuses a guarded statement.
    assert_eq!(product("ts,se->te", &[]).unwrap().kept_fraction(), 1.0);
    let band = [
        EinsumGuard::at_most('s', 't', 0),
        EinsumGuard::at_most('t', 's', 1),
    ];
    assert!(product("ts,se->te", &band).is_none());
    let doubled = EinsumGuard {
        terms: vec![(2, 't'), (-1, 's')],
        ..EinsumGuard::default()
    };
    assert!(product("ts,se->te", &[doubled]).is_none());
}

/// A product of `f32` by a `bf16` factor into `f32` is a contraction with the narrow factor
/// widened as read (on either side), unguarded only; other mixes (an `f16` factor, a `bf16`
/// result, two precisions of factors besides `f32`) stay loops.
#[test]
fn a_bf16_factor_times_f32_is_a_product_that_widens_it() {
    use arrayjit_ir::assignments::{AccumRhs, Assignments, Operand};
    use arrayjit_ir::indexing::{EinsumGuard, Projections};
    let product = |[pa, pb, pc]: [Prec; 3], guards: &[EinsumGuard]| {
        let a = Tnode::new(pa, &[4, 4], &["a"]).unwrap();
        let b = Tnode::new(pb, &[4, 4], &["b"]).unwrap();
        let c = Tnode::new(pc, &[4, 4], &["c"]).unwrap();
        let program = Assignments::Accum {
            initialize_neutral: true,
            accum: BinOp::Add,
            lhs: c.clone(),
            projections: Projections::einsum_guarded(
                "ik,kj->ij",
                &[4, 4],
                &[&[4, 4], &[4, 4]],
                guards,
            )
            .unwrap(),
            rhs: AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        };
        let LowLevel::Seq(items) = program.lower(&[]).unwrap() else {
            panic!("a zeroing and the product")
        };
        items
            .iter()
            .find_map(Contraction::detect_guarded)
            .and_then(|c| c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3], Default::default())))
    };
    use Prec::{Bf16, F16, F32};
    let right = product([F32, Bf16, F32], &[]).unwrap();
    assert_eq!(right.prec, F32);
    assert_eq!(right.widened_factor(), Some((FactorSide::Rhs, Bf16)));
    assert!(
        right
            .to_string()
            .ends_with("right factor in bf16 widened as read"),
        "{right}"
    );
    let left = product([Bf16, F32, F32], &[]).unwrap();
    assert_eq!(left.widened_factor(), Some((FactorSide::Lhs, Bf16)));
    assert_eq!(
        product([F32, F32, F32], &[]).unwrap().widened_factor(),
        None
    );
    assert!(product([F32, F16, F32], &[]).is_none());
    assert!(product([F32, Bf16, Bf16], &[]).is_none());
    assert!(product([F16, Bf16, F32], &[]).is_none());
    assert!(product([F32, Bf16, F32], &[EinsumGuard::at_most('j', 'i', 0)]).is_none());
    // Matrix units take two 16-bit factors, never one.
    let stmt = |[pa, pb]: [Prec; 2]| {
        let a = Tnode::new(pa, &[4, 4], &["a"]).unwrap();
        let b = Tnode::new(pb, &[4, 4], &["b"]).unwrap();
        let c = Tnode::new(F32, &[4, 4], &["c"]).unwrap();
        let program = Assignments::einsum(
            "ik,kj->ij",
            BinOp::Add,
            &c,
            AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
            true,
        )
        .unwrap();
        let LowLevel::Seq(items) = program.lower(&[]).unwrap() else {
            panic!("a zeroing and the product")
        };
        items
            .iter()
            .find_map(Contraction::detect_for_matrix_units)
            .is_some()
    };
    assert!(stmt([Bf16, Bf16]));
    assert!(!stmt([Bf16, F32]));
    assert!(!stmt([F32, Bf16]));
}

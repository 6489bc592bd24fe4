//! Choosing which nests are split over workers: by estimated work, not iterations alone.

use super::*;
use crate::ops::UnOp;

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

//! Loop fusion of sibling nests: consecutive top-level loops over the same range become one
//! loop whose body runs the bodies in order, when iteration `i` of each only touches slice `i`
//! of what they write (`schedule::iterations_independent` of the fused body). A row-wise
//! computation written as several passes (softmax: the row maximum, the exponentials, their
//! sum, the division) then makes one pass over the data, with each row still in cache from the
//! step before, and splits over workers once instead of once per pass.
//!
//! A zeroing between two fusable loops moves before the first one when that loop does not
//! touch the zeroed node. Loops scheduled as blocked contractions are never fused: their
//! schedule is worth more than the locality.

use crate::indexing::AxisIndex;
use crate::low_level::LowLevel;
use crate::schedule::{ScheduleSettings, iterations_independent};

/// Fuses the fusable runs of consecutive top-level loops of `code`.
pub(super) fn fuse_sibling_loops(code: LowLevel, settings: &ScheduleSettings) -> LowLevel {
    let items = match code {
        LowLevel::Seq(items) => items,
        other => return other,
    };
    let mut out: Vec<LowLevel> = Vec::with_capacity(items.len());
    // A zeroing waits: it goes before the loop it follows if the next loop fuses into that
    // loop, else in place.
    let mut pending_zeroing: Option<LowLevel> = None;
    for item in items {
        if let LowLevel::ZeroOut(_) = item {
            out.extend(pending_zeroing.replace(item));
            continue;
        }
        if let Some(prev) = out.last_mut()
            && let Some(joined) = fused(prev, &item, pending_zeroing.as_ref(), settings)
        {
            *prev = joined;
            if let Some(z) = pending_zeroing.take() {
                out.insert(out.len() - 1, z);
            }
            continue;
        }
        out.extend(pending_zeroing.take());
        out.push(item);
    }
    out.extend(pending_zeroing);
    LowLevel::seq(out)
}

/// `second` fused into `first` (its body appended under `first`'s loop), if that is legal:
/// same range, neither a blocked contraction, `zeroing` (moved before `first`) not touching
/// what `first` uses, and the fused body's iterations independent.
fn fused(
    first: &LowLevel,
    second: &LowLevel,
    zeroing: Option<&LowLevel>,
    settings: &ScheduleSettings,
) -> Option<LowLevel> {
    let (
        LowLevel::For {
            index,
            from,
            to,
            body,
        },
        LowLevel::For {
            index: i2,
            from: f2,
            to: t2,
            body: b2,
        },
    ) = (first, second)
    else {
        return None;
    };
    if (from, to) != (f2, t2)
        || to - from < 2
        || is_blocked_contraction(first, settings)
        || is_blocked_contraction(second, settings)
    {
        return None;
    }
    if let Some(LowLevel::ZeroOut(z)) = zeroing
        && first.nodes().contains(z)
    {
        return None;
    }
    let renamed = (**b2).clone().substitute(*i2, &AxisIndex::Iterator(*index));
    let body = LowLevel::seq([(**body).clone(), renamed]);
    iterations_independent(&body, *index).then(|| LowLevel::For {
        index: *index,
        from: *from,
        to: *to,
        body: Box::new(body),
    })
}

/// Whether the scheduler would run `stmt` as a blocked contraction.
fn is_blocked_contraction(stmt: &LowLevel, settings: &ScheduleSettings) -> bool {
    crate::schedule::scheduled_product(stmt, settings).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexing::Symbol;
    use crate::interpret::InterpEnv;
    use crate::low_level::ScalarExpr;
    use crate::ops::BinOp;
    use crate::prec::Prec;
    use crate::tnode::Tnode;

    fn it(s: Symbol) -> AxisIndex {
        AxisIndex::Iterator(s)
    }

    /// `for i in 0..n { for j in 0..n { out[i, j] = value(i, j) } }` with fresh iterators.
    fn rows(n: i64, out: &Tnode, value: impl Fn(Symbol, Symbol) -> ScalarExpr) -> LowLevel {
        let (i, j) = (Symbol::fresh(), Symbol::fresh());
        LowLevel::For {
            index: i,
            from: 0,
            to: n,
            body: Box::new(LowLevel::For {
                index: j,
                from: 0,
                to: n,
                body: Box::new(LowLevel::Set {
                    tn: out.clone(),
                    idcs: vec![it(i), it(j)],
                    value: value(i, j),
                }),
            }),
        }
    }

    fn node(label: &str, n: usize) -> Tnode {
        let t = Tnode::new(Prec::F32, &[n, n], &[label]).unwrap();
        t.host()
            .set_values(&(0..n * n).map(|v| v as f64).collect::<Vec<_>>())
            .unwrap();
        t
    }

    fn run(code: &LowLevel, out: &Tnode) -> Vec<f64> {
        let mut env = InterpEnv::from_host_arrays(code);
        env.run(code, &[]).unwrap();
        env.values(out).unwrap()
    }

    fn top_level(code: &LowLevel) -> usize {
        match code {
            LowLevel::Seq(items) => items.len(),
            _ => 1,
        }
    }

    #[test]
    fn row_wise_passes_fuse_and_compute_the_same() {
        let n = 5;
        let (x, a, b, z) = (node("x", 5), node("a", 5), node("b", 5), node("z", 5));
        let code = LowLevel::seq([
            rows(n, &a, |i, j| {
                ScalarExpr::binop(
                    BinOp::Mul,
                    ScalarExpr::Get(x.clone(), vec![it(i), it(j)]),
                    ScalarExpr::Constant(2.0),
                )
            }),
            // A zeroing of a node the first loop does not touch moves before it.
            LowLevel::ZeroOut(z.clone()),
            rows(n, &b, |i, j| {
                ScalarExpr::binop(
                    BinOp::Add,
                    ScalarExpr::Get(a.clone(), vec![it(i), AxisIndex::Fixed(0)]),
                    ScalarExpr::Get(a.clone(), vec![it(i), it(j)]),
                )
            }),
        ]);
        let fused = fuse_sibling_loops(code.clone(), &ScheduleSettings::default());
        assert_eq!(top_level(&fused), 2, "{fused}");
        assert!(matches!(&fused, LowLevel::Seq(s) if matches!(s[0], LowLevel::ZeroOut(_))));
        assert_eq!(run(&fused, &b), run(&code, &b));
    }

    #[test]
    fn passes_reading_other_rows_or_zeroing_what_the_first_uses_stay_apart() {
        let n = 5;
        let (x, a, b) = (node("x", 5), node("a", 5), node("b", 5));
        let first = rows(n, &a, |i, j| ScalarExpr::Get(x.clone(), vec![it(i), it(j)]));
        let settings = ScheduleSettings::default();
        // Reads a column of `a` (other rows) / the next row of `a`.
        for second in [
            rows(n, &b, |i, j| ScalarExpr::Get(a.clone(), vec![it(j), it(i)])),
            rows(n, &b, |i, j| {
                ScalarExpr::Get(a.clone(), vec![AxisIndex::affine([(1, i)], 1), it(j)])
            }),
        ] {
            let code = LowLevel::seq([first.clone(), second]);
            assert_eq!(top_level(&fuse_sibling_loops(code, &settings)), 2);
        }
        // A different range.
        let code = LowLevel::seq([
            first.clone(),
            rows(n - 1, &b, |_, _| ScalarExpr::Constant(1.0)),
        ]);
        assert_eq!(top_level(&fuse_sibling_loops(code, &settings)), 2);
        // The zeroing between them is of a node the first loop writes.
        let code = LowLevel::seq([
            first.clone(),
            LowLevel::ZeroOut(a.clone()),
            rows(n, &b, |i, j| ScalarExpr::Get(a.clone(), vec![it(i), it(j)])),
        ]);
        let out = fuse_sibling_loops(code.clone(), &settings);
        assert_eq!(out, code);
    }

    #[test]
    fn a_fused_loop_overwrites_what_its_first_use_writes_whole() {
        let n = 4;
        let (x, a, b) = (node("x", 4), node("a", 4), node("b", 4));
        let fuse = |second: LowLevel| {
            let code = LowLevel::seq([
                rows(n, &a, |i, j| ScalarExpr::Get(x.clone(), vec![it(i), it(j)])),
                second,
            ]);
            fuse_sibling_loops(code, &ScheduleSettings::default())
        };
        let same_row = fuse(rows(n, &b, |i, j| {
            ScalarExpr::Get(a.clone(), vec![it(i), it(j)])
        }));
        assert_eq!(top_level(&same_row), 1);
        assert!(same_row.overwrites_all(&a));
        assert!(same_row.overwrites_all(&b));
        assert!(!same_row.overwrites_all(&x));
        // `b` reads itself before writing: not an overwrite of `b`.
        let reads_itself = fuse(rows(n, &b, |i, j| {
            ScalarExpr::binop(
                BinOp::Add,
                ScalarExpr::Get(b.clone(), vec![it(i), it(j)]),
                ScalarExpr::Get(a.clone(), vec![it(i), it(j)]),
            )
        }));
        assert_eq!(top_level(&reads_itself), 1);
        assert!(!reads_itself.overwrites_all(&b));
        assert!(reads_itself.overwrites_all(&a));
    }
}

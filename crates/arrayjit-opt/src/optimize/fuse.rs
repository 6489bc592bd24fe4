//! Loop fusion of sibling nests: consecutive top-level loops over the same range become one
//! loop whose body runs the bodies in order, when iteration `i` of each only touches slice `i`
//! of what they write (`schedule::iterations_independent` of the fused body). A row-wise
//! computation written as several passes (softmax: the row maximum, the exponentials, their
//! sum, the division) then makes one pass over the data, with each row still in cache from the
//! step before, and splits over workers once instead of once per pass.
//!
//! A zeroing between two fusable loops moves before the first one when that loop does not
//! touch the zeroed node. Loops scheduled as blocked contractions or as a pass of fused
//! attention are never fused: their schedule is worth more than the locality.
//!
//! On a CPU the same fusion also runs inside each statement's loops ([`fuse_nested_loops`]),
//! level by level: the passes of one batch element over rows become one pass per row, and
//! the pointwise passes of one row one pass per element (a bias added and GELU applied in one
//! loop store the sum and use it from a register, instead of reading it back). Each level's
//! fusion is legal by the same test, now of the inner iterator; a pass with a sequential loop
//! in it (a reduction into an element) stays apart there, as the C compiler vectorizes it
//! across its enclosing loop. A GPU keeps its nests as they are: its passes are chosen from the
//! nest structure (`schedule::gpu`).

use crate::schedule::{ScheduleSettings, iterations_independent};
use arrayjit_ir::indexing::AxisIndex;
use arrayjit_ir::low_level::LowLevel;

/// Fuses the fusable runs of consecutive top-level loops of `code`.
pub(super) fn fuse_sibling_loops(code: LowLevel, settings: &ScheduleSettings) -> LowLevel {
    fuse_siblings(code, settings, false)
}

/// [`fuse_sibling_loops`]; `inside` (the loops are in a statement's loop) also keeps apart
/// loops with a sequential loop in them (see [`has_sequential_loop`]).
fn fuse_siblings(code: LowLevel, settings: &ScheduleSettings, inside: bool) -> LowLevel {
    let items = match code {
        LowLevel::Seq(items) => items,
        other => return other,
    };
    let mut out: Vec<LowLevel> = Vec::with_capacity(items.len());
    // A zeroing waits: it goes before the loop it follows if the next loop fuses into that
    // loop, else in place.
    let mut pending_zeroing: Option<LowLevel> = None;
    // Whether the last statement of `out` stays apart (`inside`, with a sequential loop);
    // a loop fused into it had none, so fusing never changes it.
    let mut last_apart = false;
    for item in items {
        if let LowLevel::ZeroOut(_) = item {
            out.extend(pending_zeroing.replace(item));
            continue;
        }
        let apart = inside && has_sequential_loop(&item);
        if let Some(prev) = out.last_mut()
            && !(last_apart || apart)
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
        last_apart = apart;
    }
    out.extend(pending_zeroing);
    LowLevel::seq(out)
}

/// [`fuse_sibling_loops`] at the top level and then inside every statement's loops, at every
/// depth (a statement scheduled as a blocked contraction is left whole).
pub(super) fn fuse_nested_loops(code: LowLevel, settings: &ScheduleSettings) -> LowLevel {
    fuse_nested(code, settings, false)
}

fn fuse_nested(code: LowLevel, settings: &ScheduleSettings, inside: bool) -> LowLevel {
    match fuse_siblings(code, settings, inside) {
        LowLevel::Seq(items) => LowLevel::seq(
            items
                .into_iter()
                .map(|item| fuse_inside(item, settings))
                .collect::<Vec<_>>(),
        ),
        single => fuse_inside(single, settings),
    }
}

/// The loops of `stmt`'s body fused ([`fuse_nested_loops`]), unless `stmt` is a blocked
/// contraction or no loop.
fn fuse_inside(stmt: LowLevel, settings: &ScheduleSettings) -> LowLevel {
    if is_blocked_contraction(&stmt, settings) {
        return stmt;
    }
    match stmt {
        LowLevel::For {
            index,
            from,
            to,
            body,
        } => LowLevel::For {
            index,
            from,
            to,
            body: Box::new(fuse_nested(*body, settings, true)),
        },
        other => other,
    }
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

/// Whether a loop nested in `stmt` (not `stmt` itself) has iterations that depend on each
/// other: a reduction into an element of a node (`s[i] = max(s[i], x[i, j])` over `j`). Such
/// a pass stays a loop of its own inside a statement: the C compiler vectorizes it across the
/// enclosing loop (one vector of rows, each summed in order), which a fused body with several
/// inner loops rules out, and may not reorder it along its own axis (the softmax of a GPT step
/// ran 2.4× as long with its row passes fused).
fn has_sequential_loop(stmt: &LowLevel) -> bool {
    fn any_sequential(s: &LowLevel) -> bool {
        match s {
            LowLevel::For { index, body, .. } => {
                !iterations_independent(body, *index) || any_sequential(body)
            }
            LowLevel::Seq(items) => items.iter().any(any_sequential),
            _ => false,
        }
    }
    match stmt {
        LowLevel::For { body, .. } => any_sequential(body),
        LowLevel::Seq(items) => items.iter().any(has_sequential_loop),
        _ => false,
    }
}

/// Whether the scheduler would run `stmt` on a helper: as a blocked contraction, or as a whole
/// pass of fused attention (whose nest must stay whole to be found).
fn is_blocked_contraction(stmt: &LowLevel, settings: &ScheduleSettings) -> bool {
    crate::schedule::scheduled_product(stmt, settings).is_some()
        || match &settings.gpu {
            Some(limits) => crate::schedule::gpu::runs_as_attention(stmt, limits),
            None => matches!(
                crate::schedule::AttentionPlan::detect(stmt, settings),
                Some(Ok(_))
            ),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::indexing::Symbol;
    use arrayjit_ir::interpret::InterpEnv;
    use arrayjit_ir::low_level::ScalarExpr;
    use arrayjit_ir::ops::BinOp;
    use arrayjit_ir::prec::Prec;
    use arrayjit_ir::tnode::Tnode;

    fn it(s: Symbol) -> AxisIndex {
        AxisIndex::Iterator(s)
    }

    /// `for i in 0..n { for j in 0..n { body(i, j) } }` with fresh iterators.
    fn nest(n: i64, body: impl Fn(Symbol, Symbol) -> LowLevel) -> LowLevel {
        let (i, j) = (Symbol::fresh(), Symbol::fresh());
        LowLevel::For {
            index: i,
            from: 0,
            to: n,
            body: Box::new(LowLevel::For {
                index: j,
                from: 0,
                to: n,
                body: Box::new(body(i, j)),
            }),
        }
    }

    /// `for i in 0..n { for j in 0..n { out[i, j] = value(i, j) } }` with fresh iterators.
    fn rows(n: i64, out: &Tnode, value: impl Fn(Symbol, Symbol) -> ScalarExpr) -> LowLevel {
        nest(n, |i, j| LowLevel::Set {
            tn: out.clone(),
            idcs: vec![it(i), it(j)],
            value: value(i, j),
        })
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

    /// `for b in 0..n { first; second }`, where each is a pass over rows of batch element `b`.
    fn batch(n: i64, passes: impl Fn(Symbol) -> Vec<LowLevel>) -> LowLevel {
        let b = Symbol::fresh();
        LowLevel::For {
            index: b,
            from: 0,
            to: n,
            body: Box::new(LowLevel::seq(passes(b))),
        }
    }

    /// The loops directly inside the loop `stmt` (1 for one loop or one statement).
    fn inner_count(stmt: &LowLevel) -> usize {
        match stmt {
            LowLevel::For { body, .. } => top_level(body),
            _ => 0,
        }
    }

    fn node3(label: &str, n: usize) -> Tnode {
        let t = Tnode::new(Prec::F32, &[n, n, n], &[label]).unwrap();
        t.host()
            .set_values(&(0..n * n * n).map(|v| v as f64 * 0.5).collect::<Vec<_>>())
            .unwrap();
        t
    }

    #[test]
    fn nested_passes_fuse_level_by_level_and_compute_the_same() {
        let n = 4;
        let (x, a, c) = (node3("x", 4), node3("a", 4), node3("c", 4));
        let (xr, ar, cr) = (x.clone(), a.clone(), c.clone());
        // for b { for i { for j { a = 2x } }; for i { for j { c = a + 1 } } }
        let code = batch(n, move |b| {
            let get = |t: &Tnode, i: Symbol, j: Symbol| {
                ScalarExpr::Get(t.clone(), vec![it(b), it(i), it(j)])
            };
            let pass = |out: &Tnode, value: &dyn Fn(Symbol, Symbol) -> ScalarExpr| {
                nest(n, |i, j| LowLevel::Set {
                    tn: out.clone(),
                    idcs: vec![it(b), it(i), it(j)],
                    value: value(i, j),
                })
            };
            vec![
                pass(&ar, &|i, j| {
                    ScalarExpr::binop(BinOp::Mul, get(&xr, i, j), ScalarExpr::Constant(2.0))
                }),
                pass(&cr, &|i, j| {
                    ScalarExpr::binop(BinOp::Add, get(&ar, i, j), ScalarExpr::Constant(1.0))
                }),
            ]
        });
        let settings = ScheduleSettings::default();
        // The top level alone: one statement, its two row passes apart.
        let top = fuse_sibling_loops(code.clone(), &settings);
        assert_eq!(inner_count(&top), 2, "{top}");
        // Nested: one pass over rows, and in it one pass over elements.
        let nested = fuse_nested_loops(code.clone(), &settings);
        assert_eq!(inner_count(&nested), 1, "{nested}");
        let LowLevel::For { body, .. } = &nested else {
            panic!("{nested}")
        };
        assert_eq!(inner_count(body), 1, "{nested}");
        assert_eq!(run(&nested, &c), run(&code, &c));
        assert_eq!(run(&nested, &a), run(&code, &a));
    }

    #[test]
    fn a_row_sum_and_its_readers_stay_apart_inside_the_row() {
        // for i { s[i, 0] = 0; for j { s[i, 0] += x[i, j] }; for j { b[i, j] = x[i, j] / s[i, 0] } }:
        // the rows fuse nothing (one statement), and inside a row the sum's loop writes the
        // same element at every j, so the division's loop may not join it.
        let n = 5;
        let (x, s, b) = (node("x", 5), node("s", 5), node("b", 5));
        let i = Symbol::fresh();
        let (j1, j2) = (Symbol::fresh(), Symbol::fresh());
        let sum_at = || vec![it(i), AxisIndex::Fixed(0)];
        let code = LowLevel::For {
            index: i,
            from: 0,
            to: n,
            body: Box::new(LowLevel::seq([
                LowLevel::Set {
                    tn: s.clone(),
                    idcs: sum_at(),
                    value: ScalarExpr::Constant(0.0),
                },
                LowLevel::For {
                    index: j1,
                    from: 0,
                    to: n,
                    body: Box::new(LowLevel::Set {
                        tn: s.clone(),
                        idcs: sum_at(),
                        value: ScalarExpr::binop(
                            BinOp::Add,
                            ScalarExpr::Get(s.clone(), sum_at()),
                            ScalarExpr::Get(x.clone(), vec![it(i), it(j1)]),
                        ),
                    }),
                },
                LowLevel::For {
                    index: j2,
                    from: 0,
                    to: n,
                    body: Box::new(LowLevel::Set {
                        tn: b.clone(),
                        idcs: vec![it(i), it(j2)],
                        value: ScalarExpr::binop(
                            BinOp::Div,
                            ScalarExpr::Get(x.clone(), vec![it(i), it(j2)]),
                            ScalarExpr::Get(s.clone(), sum_at()),
                        ),
                    }),
                },
            ])),
        };
        let nested = fuse_nested_loops(code.clone(), &ScheduleSettings::default());
        assert_eq!(nested, code);
    }

    #[test]
    fn row_passes_with_a_reduction_into_an_element_stay_apart_inside_a_statement() {
        // for b { for i { for j { m[b, i, 0] = max(m[b, i, 0], x[b, i, j]) } };
        //         for i { for j { c[b, i, j] = x[b, i, j] - m[b, i, 0] } } }:
        // legal to fuse over i, but the maximum's loop over j is sequential, so the passes stay
        // two (the C compiler vectorizes such a pass across rows).
        let n = 4;
        let (x, m, c) = (node3("x", 4), node3("m", 4), node3("c", 4));
        let code = batch(n, |b| {
            let at = |i: Symbol| vec![it(b), it(i), AxisIndex::Fixed(0)];
            vec![
                nest(n, |i, j| LowLevel::Set {
                    tn: m.clone(),
                    idcs: at(i),
                    value: ScalarExpr::binop(
                        BinOp::Max,
                        ScalarExpr::Get(m.clone(), at(i)),
                        ScalarExpr::Get(x.clone(), vec![it(b), it(i), it(j)]),
                    ),
                }),
                nest(n, |i, j| LowLevel::Set {
                    tn: c.clone(),
                    idcs: vec![it(b), it(i), it(j)],
                    value: ScalarExpr::binop(
                        BinOp::Sub,
                        ScalarExpr::Get(x.clone(), vec![it(b), it(i), it(j)]),
                        ScalarExpr::Get(m.clone(), at(i)),
                    ),
                }),
            ]
        });
        let nested = fuse_nested_loops(code.clone(), &ScheduleSettings::default());
        assert_eq!(inner_count(&nested), 2, "{nested}");
        assert_eq!(run(&nested, &c), run(&code, &c));
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

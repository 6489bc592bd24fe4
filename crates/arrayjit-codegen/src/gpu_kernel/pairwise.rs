//! Pairwise (cascade) order of the long sums a GPU group reduces: each invocation's share of
//! the steps runs in blocks, and the blocks' sums are added as the leaves of a binary tree, so
//! a share of `n` steps is within `O(log n)` roundings of exact rather than `O(n)`.
//!
//! **The order** (fixed: results depend neither on timing nor on the device):
//! - the range is cut into blocks of `threads ×` [`PAIRWISE_BLOCK_STEPS`] consecutive steps;
//!   each invocation sums its strided steps of a block from zero, in step order;
//! - block `b`'s sum is added to the pending sums where a binary counter of the blocks carries
//!   (level `l` holds the sum of a run of `2^l` blocks), each addition joining two halves;
//! - at the end the pending levels are added from the lowest to the highest;
//! - then the group's fixed tree combines the invocations (see `lower`'s `group_tree`).
//!
//! Maxima and minima are exact in any order and keep the plain strided loop, as do shares of
//! fewer than two blocks.

use arrayjit_ir::BinOp;
use arrayjit_opt::schedule::gpu::{Accumulation, GridLoop};

use super::build::{array, assign, bound_to, let_, let_mut, range, thread_index, var};
use super::{Arith, Expr, Stmt, Ty};

/// Steps of each invocation in one block of a pairwise sum.
pub const PAIRWISE_BLOCK_STEPS: u64 = 128;

/// The steps of `r` from flat step `lo` up to `hi` (at most `longest` of them), strided over
/// a group of `threads`, accumulated into `aj_acc`: pairwise where the sum spans two blocks or
/// more, else in step order.
pub(super) fn accumulated_steps<'a>(
    r: &Accumulation<'a>,
    (lo, hi, longest): (Expr<'a>, Expr<'a>, u64),
    threads: u32,
) -> Stmt<'a> {
    let span = u64::from(threads) * PAIRWISE_BLOCK_STEPS;
    let blocks = longest.div_ceil(span.max(1));
    let cp = r.tn.prec().compute_prec();
    if r.combine != BinOp::Add || blocks < 2 || !cp.is_float() {
        return strided_steps(r, lo, hi, threads);
    }
    // Block counts below 2^levels: the counter never carries past the last level.
    let levels = (u64::BITS - blocks.leading_zeros()) as usize;
    let ty = Ty::Compute(cp);
    let zero = || Expr::Lit(cp, BinOp::Add.neutral_element());
    let level = || Expr::item("aj_cas", var("aj_lv"));
    let add = |a: Expr<'a>, b: Expr<'a>| Expr::Combine(BinOp::Add, cp, Box::new(a), Box::new(b));
    let odd = |x: Expr<'a>| (x % 2i64).cmp(Arith::Ne, 0i64);
    let block_end = Expr::Select(
        Box::new((var("aj_b") + span).lt(hi.clone())),
        Box::new(var("aj_b") + span),
        Box::new(hi.clone()),
    );
    // Where bit `aj_lv` of the counter is clear the block's sum rests there; where set, the
    // run resting there joins it and the carry goes on.
    let carry = range(
        "aj_lv",
        Ty::Int,
        0i64,
        levels,
        1,
        vec![Stmt::If(
            var("aj_open").cmp(Arith::Ne, 0i64),
            vec![
                Stmt::If(
                    (var("aj_c") % 2i64).equals(0i64),
                    vec![assign(level(), var("aj_acc")), assign(var("aj_open"), 0i64)],
                ),
                Stmt::If(
                    var("aj_open").cmp(Arith::Ne, 0i64),
                    vec![
                        assign(var("aj_acc"), add(level(), var("aj_acc"))),
                        assign(var("aj_c"), var("aj_c") / 2i64),
                    ],
                ),
            ],
        )],
    );
    let block = vec![
        assign(var("aj_acc"), zero()),
        let_("aj_be", Ty::Index, block_end),
        strided_steps(r, var("aj_b"), var("aj_be"), threads),
        let_mut("aj_c", Ty::Index, var("aj_nb")),
        let_mut("aj_open", Ty::Int, Expr::Int(1)),
        carry,
        assign(var("aj_nb"), var("aj_nb") + 1i64),
    ];
    let finish = range(
        "aj_lv",
        Ty::Int,
        0i64,
        levels,
        1,
        vec![
            Stmt::If(
                odd(var("aj_c")),
                vec![assign(var("aj_acc"), add(var("aj_acc"), level()))],
            ),
            assign(var("aj_c"), var("aj_c") / 2i64),
        ],
    );
    Stmt::Block(vec![
        array("aj_cas", ty, levels, false),
        let_mut("aj_nb", Ty::Index, Expr::Int(0)),
        Stmt::For {
            var: "aj_b".into(),
            ty: Ty::Index,
            from: lo,
            cond: var("aj_b").lt(hi),
            next: var("aj_b") + span,
            unroll: false,
            binds: None,
            body: block,
        },
        assign(var("aj_acc"), zero()),
        let_mut("aj_c", Ty::Index, var("aj_nb")),
        finish,
    ])
}

/// The steps of an accumulation from flat step `lo` (an expression) up to `hi`, strided over
/// the group: `aj_acc = aj_acc ⊕ v(i)`, with the loops' iterators bound to the step's digits
/// (a single loop's iterator to the step itself, offset by the loop's start).
pub(super) fn strided_steps<'a>(
    r: &Accumulation<'a>,
    lo: Expr<'a>,
    hi: Expr<'a>,
    threads: u32,
) -> Stmt<'a> {
    let step = assign(
        var("aj_acc"),
        Expr::Step(r.clone(), Box::new(var("aj_acc"))),
    );
    match r.loops.as_slice() {
        [only] => {
            let from = Expr::Int(only.from);
            bound_to(
                range(
                    "aj_i",
                    Ty::Index,
                    thread_index() + lo + from.clone(),
                    hi + from,
                    threads as i64,
                    vec![step],
                ),
                only.iter,
            )
        }
        loops => {
            let mut body = vec![let_mut("aj_rr", Ty::Index, var("aj_i"))];
            for (pos, GridLoop { iter, from, to }) in loops.iter().enumerate().rev() {
                body.push(Stmt::Let {
                    name: format!("aj_d{pos}"),
                    ty: Ty::Index,
                    value: Expr::Int(*from) + var("aj_rr") % (to - from),
                    mutable: false,
                    binds: Some(*iter),
                });
                if pos > 0 {
                    body.push(assign(var("aj_rr"), var("aj_rr") / (to - from)));
                }
            }
            body.push(step);
            range(
                "aj_i",
                Ty::Index,
                thread_index() + lo,
                hi,
                threads as i64,
                body,
            )
        }
    }
}

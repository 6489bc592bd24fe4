//! Pairwise (cascade) summation for long floating-point sums in the C renderer: the order of
//! additions that keeps a sum of `n` values within `O(log n)` roundings instead of `O(n)`.
//!
//! **The order** (fixed, documented, independent of timing and of the worker count):
//! - a long reduced loop runs in blocks of [`PAIRWISE_BLOCK_STEPS`] steps of each of its
//!   `lanes` accumulators; each block's per-lane sums start from zero;
//! - block sums are combined as the leaves of a binary tree: block `b` is added to the pending
//!   sum of the blocks before it exactly where a binary counter carries (`cas[level]` holds the
//!   sum of a run of `2^level` blocks), so each sum adds two halves of equal size;
//! - at the end the pending levels are added from the lowest (the shortest runs, after the
//!   tail of fewer than a block) to the highest, then the lanes folded in halves (`ReductionPlan::lanes`).
//!
//! The same cascade collects the totals of a reduction's outer loops (the loops of a nest that
//! do not index the element summed into: a whole-array sum's rows), one total per iteration.
//! A long sum the optimizer inlined into its one reader (a loop nest adding into a local
//! variable) runs the same way, over [`local_sum_lanes`] accumulators
//! ([`KernelRenderer::local_sum`]).
//! Maxima and minima are exact in any order and keep the plain loop.

use std::collections::BTreeSet;
use std::fmt::Write;

use arrayjit_ir::{BinOp, LowLevel, Prec, Result, ScalarExpr, ScopeId, Symbol, TernOp};
use arrayjit_opt::schedule::ReductionPlan;

use crate::c::kernel::KernelRenderer;
use crate::c::syntax::{self as c_syntax, Helper, c_compute_type};

/// Steps of each lane in one block of a pairwise sum (NumPy's pairwise sum uses blocks of 128
/// elements): a block's own rounding error stays within 128 additions.
pub const PAIRWISE_BLOCK_STEPS: u64 = 128;

/// A cascade of partial sums, `width` lanes wide, declared in the C code as `cas{n}` with the
/// block counter `nb{n}`, adding by `op` in `prec`.
pub(crate) struct Cascade {
    n: usize,
    width: usize,
    levels: usize,
    op: BinOp,
    prec: Prec,
}

impl Cascade {
    /// Declares the levels and the counter of a cascade of at most `leaves` leaves at `pad`.
    /// (The counter stays below `leaves`, so it never carries past level `⌊log2 leaves⌋`.)
    pub(super) fn declare(
        n: usize,
        (width, leaves): (usize, u64),
        (op, prec): (BinOp, Prec),
        pad: &str,
        out: &mut String,
    ) -> Self {
        let levels = (u64::BITS - leaves.max(1).leading_zeros()) as usize;
        let t = c_compute_type(prec);
        let _ = writeln!(
            out,
            "{pad}{t} cas{n}[{levels}][{width}]; uint64_t nb{n} = 0; /* pairwise sum */"
        );
        Cascade {
            n,
            width,
            levels,
            op,
            prec,
        }
    }

    /// A cascade of one lane collecting one total per iteration of the outer loops of `loops`
    /// (all but the innermost).
    pub(super) fn over_outer_loops(
        n: usize,
        loops: &[(Symbol, i64, i64)],
        (op, prec): (BinOp, Prec),
        pad: &str,
        out: &mut String,
    ) -> Self {
        let leaves = loops[..loops.len().saturating_sub(1)]
            .iter()
            .map(|&(_, from, to)| (to - from).max(0) as u64)
            .product();
        Cascade::declare(n, (1, leaves), (op, prec), pad, out)
    }

    fn add(&self, a: &str, b: &str, helpers: &mut BTreeSet<Helper>) -> String {
        c_syntax::render_binop(self.op, self.prec, a, b, helpers)
    }

    /// Adds the `width` values of `block` (an array, or a scalar when the width is 1) as the
    /// next leaf. `block` is clobbered.
    pub(super) fn push(
        &self,
        block: &str,
        helpers: &mut BTreeSet<Helper>,
        pad: &str,
        out: &mut String,
    ) {
        let (n, w) = (self.n, self.width);
        let (value, level) = if w == 1 {
            (block.to_string(), format!("cas{n}[lv{n}][0]"))
        } else {
            (format!("{block}[w{n}]"), format!("cas{n}[lv{n}][w{n}]"))
        };
        let merged = self.add(&level, &value, helpers);
        let lanes = format!("for (int w{n} = 0; w{n} < {w}; ++w{n})");
        let _ = writeln!(out, "{pad}{{\n{pad}  int lv{n} = 0;");
        let _ = writeln!(
            out,
            "{pad}  for (uint64_t c{n} = nb{n}++; c{n} & 1u; c{n} >>= 1, ++lv{n}) {lanes} {value} = {merged};"
        );
        let _ = writeln!(out, "{pad}  {lanes} {level} = {value};\n{pad}}}");
    }

    /// Adds the pending levels into `into` (width values, or a scalar when the width is 1),
    /// the lowest first.
    pub(super) fn finish(
        &self,
        into: &str,
        helpers: &mut BTreeSet<Helper>,
        pad: &str,
        out: &mut String,
    ) {
        let (n, w, levels) = (self.n, self.width, self.levels);
        let (target, level) = if w == 1 {
            (into.to_string(), format!("cas{n}[lv{n}][0]"))
        } else {
            (format!("{into}[w{n}]"), format!("cas{n}[lv{n}][w{n}]"))
        };
        let merged = self.add(&target, &level, helpers);
        let _ = writeln!(
            out,
            "{pad}for (int lv{n} = 0; lv{n} < {levels}; ++lv{n}) if ((nb{n} >> lv{n}) & 1u) \
             for (int w{n} = 0; w{n} < {w}; ++w{n}) {target} = {merged};"
        );
    }

    /// Declares `sum` (a one-lane cascade's result) from zero and adds the pending levels
    /// into it.
    pub(super) fn finish_as(
        &self,
        sum: &str,
        helpers: &mut BTreeSet<Helper>,
        pad: &str,
        out: &mut String,
    ) {
        let zero = c_syntax::literal(self.prec, -0.0);
        let _ = writeln!(out, "{pad}{} {sum} = {zero};", c_compute_type(self.prec));
        self.finish(sum, helpers, pad, out);
    }
}

impl KernelRenderer<'_> {
    /// A sum into a local scope's variable ([`long_local_sum`]; the optimizer inlines a
    /// sum read by one statement this way): its innermost loop runs over
    /// [`local_sum_lanes`] accumulators in pairwise blocks (see [`KernelRenderer::reduce_range`]),
    /// the totals of its outer loops are summed pairwise, and the sum is added to the variable
    /// once — instead of one serial chain of additions, which in `f32` stalls once the sum
    /// reaches 2^24 times the values added.
    pub(crate) fn local_sum(
        &mut self,
        nest: &LowLevel,
        (id, value): (ScopeId, &ScalarExpr),
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let (loops, _) = nest.perfect_nest();
        let prec = id.prec;
        let lanes = local_sum_lanes(prec);
        let target = self.local(id.id);
        let scope = ScopeId::fresh(prec);
        let step = value.clone().map_bottom_up(&mut |e| match e {
            ScalarExpr::GetLocal(x) if x == id => ScalarExpr::GetLocal(scope),
            e => e,
        });
        let plan = ReductionPlan {
            iter: loops.last().expect("a long local sum has loops").0,
            combine: BinOp::Add,
            lanes,
            // At least 256-bit vectors on the CPUs the C backends target: one or two
            // registers (see `unroll_lanes`).
            vector_lanes: lanes / 2,
            blocks: None,
        };
        let pad = "  ".repeat(depth);
        let inner = format!("{pad}  ");
        let _ = writeln!(
            out,
            "{pad}{{ /* a long sum into {target}: {lanes} accumulators, pairwise */"
        );
        let cascade = (loops.len() > 1).then(|| {
            let n = self.loop_counter;
            self.loop_counter += 1;
            Cascade::over_outer_loops(n, &loops, (BinOp::Add, prec), &inner, out)
        });
        let sum = format!("{target}_sum");
        self.local_sum_nest(
            &loops,
            (&step, scope),
            &plan,
            (cascade.as_ref(), &sum),
            depth + 1,
            out,
        )?;
        if let Some(cascade) = &cascade {
            cascade.finish_as(&sum, self.helpers, &inner, out);
        }
        let added = c_syntax::render_binop(BinOp::Add, prec, &target, &sum, self.helpers);
        let _ = writeln!(out, "{inner}{target} = {added};");
        let _ = writeln!(out, "{pad}}}");
        Ok(())
    }

    /// The loops of a long local sum: the outer ones as written, the innermost by
    /// [`KernelRenderer::reduce_range`], its total pushed to the outer loops' `cascade` or,
    /// with no outer loop, declared as `sum`.
    fn local_sum_nest(
        &mut self,
        loops: &[(Symbol, i64, i64)],
        (step, scope): (&ScalarExpr, ScopeId),
        plan: &ReductionPlan,
        (cascade, sum): (Option<&Cascade>, &str),
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let pad = "  ".repeat(depth);
        match loops {
            [] => Ok(()),
            [(iter, from, to)] => {
                let total = self.reduce_range(
                    *iter,
                    (&from.to_string(), &to.to_string(), (to - from) as u64),
                    (step, scope),
                    plan,
                    depth,
                    out,
                )?;
                let prec = scope.prec;
                match cascade {
                    Some(cascade) => cascade.push(&total, self.helpers, &pad, out),
                    None => {
                        let _ = writeln!(out, "{pad}{} {sum} = {total};", c_compute_type(prec));
                    }
                }
                Ok(())
            }
            [(iter, from, to), rest @ ..] => {
                self.for_loop(*iter, *from, *to, depth, out, |k, out| {
                    k.local_sum_nest(rest, (step, scope), plan, (cascade, sum), depth + 1, out)
                })
            }
        }
    }
}

/// Accumulators of a long local sum ([`KernelRenderer::local_sum`]): one 512-bit vector.
fn local_sum_lanes(prec: Prec) -> usize {
    if prec == Prec::F64 { 8 } else { 16 }
}

/// A loop nest that sums into a local scope's variable — `v = v + x`, `v = x + v` or
/// `v = fma(a, b, v)` innermost, `x` (`a`, `b`) not reading `v` — of `f32` or `f64`, with an
/// innermost loop of at least two steps per accumulator: its variable and the value summed.
///
/// Short sums qualify too (a layer norm's row of 256, the rule [`ReductionPlan::detect`] applies
/// to sums into an array): written as one chain of additions, a sum is never vectorized (C
/// may not reorder floating-point additions), so each step waits for the last one's latency —
/// a row sum of a GPT step's layer norm ran at one addition per 3–4 cycles. Over the lanes it
/// runs as vector additions; a sum shorter than two pairwise blocks is one block, its lanes
/// folded in halves.
pub(crate) fn long_local_sum(nest: &LowLevel) -> Option<(ScopeId, &ScalarExpr)> {
    let (loops, inner) = nest.perfect_nest();
    let LowLevel::SetLocal(id, value) = inner else {
        return None;
    };
    if !matches!(id.prec, Prec::F32 | Prec::F64) {
        return None;
    }
    let lanes = local_sum_lanes(id.prec) as u64;
    let &(_, from, to) = loops.last()?;
    if u64::try_from(to - from).ok()? < 2 * lanes {
        return None;
    }
    let is_acc = |e: &ScalarExpr| matches!(e, ScalarExpr::GetLocal(x) if x == id);
    let reads_acc = |e: &ScalarExpr| {
        let mut found = false;
        e.visit_all(&mut |x| found |= is_acc(x));
        found
    };
    let summed_alone = match value {
        ScalarExpr::Binop(BinOp::Add, a, b) if is_acc(a) => !reads_acc(b),
        ScalarExpr::Binop(BinOp::Add, a, b) if is_acc(b) => !reads_acc(a),
        ScalarExpr::Ternop(TernOp::Fma, a, b, c) if is_acc(c) => !reads_acc(a) && !reads_acc(b),
        _ => false,
    };
    summed_alone.then_some((*id, value))
}

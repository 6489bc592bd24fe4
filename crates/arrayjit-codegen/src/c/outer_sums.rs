//! Sums along outer axes in the C backends, pairwise: a statement adding into elements indexed
//! by its inner loops across its outer loops (a column sum of a row-major array, a bias
//! gradient summed over a batch), which would otherwise keep one running sum per element.
//!
//! **The order** (fixed: independent of timing and of the worker count):
//! - the outer loops' iterations, flattened in loop order, run in blocks of
//!   [`PAIRWISE_BLOCK_STEPS`]; each block adds its iterations, in order, into a row of block
//!   sums that starts from zero — one per iteration of the inner loops, which run as written
//!   (and vectorize as before);
//! - the rows of block sums are added as the leaves of a binary tree ([`Cascade`], a lane per
//!   inner iteration), the pending levels at the end from the lowest to the highest;
//! - then each element adds the result once.
//!
//! The rows live on the stack: where the cascade's rows would take more than
//! [`OUTER_SUM_STACK_BYTES`], the statement keeps its running sums.

use std::fmt::Write;

use arrayjit_ir::{AxisIndex, BinOp, LowLevel, Prec, Result, ScalarExpr, ScopeId, Symbol, Tnode};
use arrayjit_opt::schedule::split_accumulation;

use crate::c::kernel::KernelRenderer;
use crate::c::pairwise::{Cascade, PAIRWISE_BLOCK_STEPS};
use crate::c::syntax::{self as c_syntax, c_compute_type};

/// The most stack the rows of an outer sum's cascade may take.
pub const OUTER_SUM_STACK_BYTES: u64 = 128 << 10;

/// A perfect nest summing across its outer loops into elements indexed by its inner loops
/// (see the module documentation).
pub(crate) struct OuterSum<'a> {
    tn: &'a Tnode,
    idcs: &'a [AxisIndex],
    value: &'a ScalarExpr,
    /// The loops that do not index the element (outermost first).
    outer: Vec<(Symbol, i64, i64)>,
    /// The loops that do.
    inner: Vec<(Symbol, i64, i64)>,
    /// Iterations of the outer loops.
    steps: u64,
    /// Iterations of the inner loops: the lanes of the cascade.
    width: u64,
}

fn extent(&(_, from, to): &(Symbol, i64, i64)) -> u64 {
    u64::try_from(to - from).unwrap_or(0)
}

/// Recognizes an [`OuterSum`]: `out[i] = out[i] + v` (or the fused multiply-add form) of
/// `f32` or `f64`, whose outer loops (at least one) do not index `out` and whose inner loops
/// (at least one) all do, over at least two blocks of outer iterations, with rows that fit
/// [`OUTER_SUM_STACK_BYTES`].
pub(crate) fn outer_sum(nest: &LowLevel) -> Option<OuterSum<'_>> {
    let (loops, stmt) = nest.perfect_nest();
    let LowLevel::Set { tn, idcs, value } = stmt else {
        return None;
    };
    if !matches!(tn.prec(), Prec::F32 | Prec::F64) {
        return None;
    }
    let (combine, _) = split_accumulation(tn, idcs, value)?;
    let indexes = |sym: Symbol| idcs.iter().any(|i| i.symbols().contains(&sym));
    let split = loops.iter().take_while(|l| !indexes(l.0)).count();
    if combine != BinOp::Add
        || split == 0
        || split == loops.len()
        || !loops[split..].iter().all(|l| indexes(l.0))
    {
        return None;
    }
    let (outer, inner) = (loops[..split].to_vec(), loops[split..].to_vec());
    let steps = outer
        .iter()
        .try_fold(1u64, |n, l| n.checked_mul(extent(l)))?;
    let width = inner
        .iter()
        .try_fold(1u64, |n, l| n.checked_mul(extent(l)))?;
    let leaves = steps.div_ceil(PAIRWISE_BLOCK_STEPS);
    let levels = u64::from(u64::BITS - leaves.leading_zeros());
    let bytes = (levels + 1)
        .checked_mul(width)?
        .checked_mul(tn.prec().compute_prec().size_in_bytes() as u64)?;
    (steps >= 2 * PAIRWISE_BLOCK_STEPS && width > 0 && bytes <= OUTER_SUM_STACK_BYTES).then_some(
        OuterSum {
            tn,
            idcs,
            value,
            outer,
            inner,
            steps,
            width,
        },
    )
}

impl KernelRenderer<'_> {
    /// Renders an [`OuterSum`] in the pairwise order of the module documentation.
    pub(crate) fn outer_sum(
        &mut self,
        sum: &OuterSum<'_>,
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let prec = sum.tn.prec();
        let t = c_compute_type(prec);
        let zero = c_syntax::literal(prec, -0.0);
        let n = self.loop_counter;
        self.loop_counter += 1;
        let (rows, step, first, lane) = (
            format!("osum{n}"),
            format!("os{n}"),
            format!("osb{n}"),
            format!("oz{n}"),
        );
        let (width, steps, block) = (sum.width, sum.steps, PAIRWISE_BLOCK_STEPS);
        let pad = "  ".repeat(depth);
        let in1 = format!("{pad}  ");
        let in2 = format!("{pad}    ");
        let clear = format!(
            "for (int64_t {lane} = 0; {lane} < {width}; ++{lane}) {rows}[{lane}] = {zero};"
        );
        let _ = writeln!(
            out,
            "{pad}{{ /* a sum along outer axes: blocks of {block} outer steps, pairwise */"
        );
        let cascade = Cascade::declare(
            n,
            (width as usize, steps.div_ceil(block)),
            (BinOp::Add, prec),
            &in1,
            out,
        );
        let _ = writeln!(out, "{in1}{t} {rows}[{width}];");
        let _ = writeln!(
            out,
            "{in1}for (int64_t {first} = 0; {first} < {steps}; {first} += {block}) {{"
        );
        let _ = writeln!(out, "{in2}{clear}");
        let _ = writeln!(
            out,
            "{in2}for (int64_t {step} = {first}; {step} < ({first} + {block} < {steps} ? {first} + {block} : {steps}); ++{step}) {{"
        );
        // The outer loops' iterators: the digits of the flat step, innermost fastest.
        let mut stride = 1u64;
        for l @ &(sym, from, _) in sum.outer.iter().rev() {
            self.symbols.insert(
                sym,
                format!("({from} + ({step} / {stride}) % {})", extent(l)),
            );
            stride *= extent(l);
        }
        let scope = ScopeId::fresh(prec);
        let added = sum.value.clone().map_bottom_up(&mut |e| match e {
            ScalarExpr::Get(t, i) if &t == sum.tn && i == sum.idcs => ScalarExpr::GetLocal(scope),
            e => e,
        });
        let rendered = self.over_inner(sum, depth + 3, out, &mut |k, lane_at, pad, out| {
            k.locals.insert(scope.id, format!("{rows}[{lane_at}]"));
            let mut prelude = String::new();
            let v = k.expr(&added, prec, pad.len() / 2, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}{rows}[{lane_at}] = {v};");
            Ok(())
        });
        self.locals.remove(&scope.id);
        for (sym, ..) in &sum.outer {
            self.symbols.remove(sym);
        }
        rendered?;
        let _ = writeln!(out, "{in2}}}");
        cascade.push(&rows, self.helpers, &in2, out);
        let _ = writeln!(out, "{in1}}}");
        let _ = writeln!(out, "{in1}{clear}");
        cascade.finish(&rows, self.helpers, &in1, out);
        // Each element adds its sum once.
        self.over_inner(sum, depth + 1, out, &mut |k, lane_at, pad, out| {
            let name = k.node(sum.tn)?.to_string();
            let element = format!("{name}[{}]", k.offset(sum.tn, sum.idcs)?);
            let current = c_syntax::convert(&element, prec, prec, k.helpers);
            let total = format!("{rows}[{lane_at}]");
            let combined = c_syntax::render_binop(BinOp::Add, prec, &current, &total, k.helpers);
            let stored = c_syntax::store(&combined, prec, k.helpers);
            let _ = writeln!(out, "{pad}{element} = {stored};");
            Ok(())
        })?;
        let _ = writeln!(out, "{pad}}}");
        Ok(())
    }

    /// The inner loops of an outer sum as written, with `leaf(renderer, lane, pad, out)` inside
    /// them, `lane` the flat position of the inner iteration (innermost fastest).
    fn over_inner(
        &mut self,
        sum: &OuterSum<'_>,
        depth: usize,
        out: &mut String,
        leaf: &mut dyn FnMut(&mut Self, &str, &str, &mut String) -> Result<()>,
    ) -> Result<()> {
        type Leaf<'l, 'r> =
            dyn FnMut(&mut KernelRenderer<'r>, &str, &str, &mut String) -> Result<()> + 'l;
        fn nest<'r>(
            k: &mut KernelRenderer<'r>,
            loops: &[(Symbol, i64, i64)],
            all: &[(Symbol, i64, i64)],
            depth: usize,
            out: &mut String,
            leaf: &mut Leaf<'_, 'r>,
        ) -> Result<()> {
            match loops {
                [] => {
                    let mut stride = 1u64;
                    let mut terms = Vec::new();
                    for l @ &(sym, from, _) in all.iter().rev() {
                        let at = k.symbols.get(&sym).cloned().unwrap_or_default();
                        terms.push(format!("({at} - {from}) * {stride}"));
                        stride *= extent(l);
                    }
                    let lane_at = terms.join(" + ");
                    leaf(k, &lane_at, &"  ".repeat(depth), out)
                }
                [(sym, from, to), rest @ ..] => {
                    k.for_loop(*sym, *from, *to, depth, out, |k, out| {
                        nest(k, rest, all, depth + 1, out, leaf)
                    })
                }
            }
        }
        nest(self, &sum.inner, &sum.inner, depth, out, leaf)
    }
}

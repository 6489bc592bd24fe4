//! What the GPU planner and the GPU renderers read off a statement: its grid (the loops whose
//! iterations are independent), accumulations into one element over one or several loops, the
//! statements a row pass runs per grid point, and how much independent work and reduction a
//! statement offers (what a plan is judged by).

use std::borrow::Cow;

use super::GridLoop;
use crate::schedule::{iterations_independent, split_accumulation};
use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::ops::BinOp;
use arrayjit_ir::tnode::Tnode;

/// The grid of a statement: the loops whose iterations are independent, outermost first, and
/// the statement each invocation runs.
///
/// A perfect nest around one assignment contributes every loop whose iterations are
/// independent, wherever it sits: running such a loop outside the others changes no element's
/// order of operations (each element is written by one iteration of it, and its reductions keep
/// their order), so a matrix product's rows and columns both become the grid while its
/// reduction runs inside. Other nests contribute their longest independent prefix.
pub fn grid_loops(stmt: &LowLevel) -> (Vec<GridLoop>, Cow<'_, LowLevel>) {
    let (loops, inner) = stmt.perfect_nest();
    if matches!(inner, LowLevel::Set { .. }) && !loops.is_empty() {
        let independent = |&(index, from, to): &(Symbol, i64, i64)| {
            to > from && iterations_independent(inner, index)
        };
        let grid: Vec<GridLoop> = loops
            .iter()
            .copied()
            .filter(independent)
            .map(|(iter, from, to)| GridLoop { iter, from, to })
            .collect();
        let mut rest = Cow::Borrowed(inner);
        for &(index, from, to) in loops.iter().rev() {
            if !independent(&(index, from, to)) {
                rest = Cow::Owned(LowLevel::For {
                    index,
                    from,
                    to,
                    body: Box::new(rest.into_owned()),
                });
            }
        }
        return (grid, rest);
    }
    let (grid, inner) = independent_prefix(stmt);
    (grid, Cow::Borrowed(inner))
}

/// The outermost loops of a statement whose iterations are independent (and not empty), each
/// directly inside the one before, and the statement under them.
pub(super) fn independent_prefix(stmt: &LowLevel) -> (Vec<GridLoop>, &LowLevel) {
    loop_prefix(stmt, |_, body, index| iterations_independent(body, index))
}

/// The outermost non-empty loops of a statement that `keep` accepts (given the loop's extent,
/// body and iterator), each directly inside the one before, and the statement under them.
pub(super) fn loop_prefix(
    stmt: &LowLevel,
    keep: impl Fn(i64, &LowLevel, Symbol) -> bool,
) -> (Vec<GridLoop>, &LowLevel) {
    let mut loops = Vec::new();
    let mut cur = stmt;
    while let LowLevel::For {
        index,
        from,
        to,
        body,
    } = cur
    {
        if to <= from || !keep(to - from, body, *index) {
            break;
        }
        loops.push(GridLoop {
            iter: *index,
            from: *from,
            to: *to,
        });
        cur = body.unwrapped();
    }
    (loops, cur)
}

/// Iterations of a grid: the product of its loops' extents.
pub fn grid_total(grid: &[GridLoop]) -> u64 {
    grid.iter()
        .map(GridLoop::extent)
        .fold(1u64, u64::saturating_mul)
}

/// What a reduction accumulates besides the element itself.
#[derive(Clone, Copy, Debug)]
pub enum Rest<'a> {
    /// `s ⊕ v`.
    One(&'a ScalarExpr),
    /// `fma(a, b, s)`.
    Product(&'a ScalarExpr, &'a ScalarExpr),
}

/// A nest of loops accumulating into one element: `for i.. { s[o] = s[o] ⊕ v(i..) }`. Its
/// steps are the nest's iterations in loop order (outermost slowest): the *flat* step `f`
/// stands for the iterators whose digits, innermost fastest, make `f`.
#[derive(Clone, Debug)]
pub struct Accumulation<'a> {
    /// The loops, outermost first (at least one, none empty).
    pub loops: Vec<GridLoop>,
    /// The element's node.
    pub tn: &'a Tnode,
    /// The element's indices (using none of the loops' iterators).
    pub idcs: &'a [AxisIndex],
    /// How the steps combine.
    pub combine: BinOp,
    /// What each step brings.
    pub rest: Rest<'a>,
}

impl<'a> Accumulation<'a> {
    /// Recognizes a perfect nest of loops accumulating into one element.
    pub fn detect(stmt: &'a LowLevel) -> Option<Accumulation<'a>> {
        let (loops, inner) = stmt.perfect_nest();
        let LowLevel::Set { tn, idcs, value } = inner else {
            return None;
        };
        if loops.is_empty()
            || loops.iter().any(|&(index, from, to)| {
                to <= from || idcs.iter().any(|i| i.symbols().contains(&index))
            })
        {
            return None;
        }
        let (combine, parts) = split_accumulation(tn, idcs, value)?;
        let rest = match parts.as_slice() {
            [v] => Rest::One(v),
            [a, b] => Rest::Product(a, b),
            _ => return None,
        };
        Some(Accumulation {
            loops: loops
                .into_iter()
                .map(|(iter, from, to)| GridLoop { iter, from, to })
                .collect(),
            tn,
            idcs,
            combine,
            rest,
        })
    }

    /// An accumulation whose steps may regroup: each step rounds to the element's precision,
    /// so only where that is the compute precision.
    pub fn detect_regroupable(stmt: &'a LowLevel) -> Option<Accumulation<'a>> {
        Accumulation::detect(stmt).filter(|r| r.tn.prec() == r.tn.prec().compute_prec())
    }

    /// Its steps: the product of the loops' extents.
    pub fn len(&self) -> u64 {
        grid_total(&self.loops)
    }

    /// Whether it has no step (never: every loop has one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One statement of a row pass, run by the whole group in order, with a barrier after each:
/// later statements read what earlier ones stored.
pub struct RowItem<'a> {
    /// The statement.
    pub stmt: &'a LowLevel,
    /// How the group runs it.
    pub role: RowRole<'a>,
}

/// How a group runs one statement of a row pass.
pub enum RowRole<'a> {
    /// An accumulation into one element in its compute precision: a group reduction (strided
    /// shares in order, then a fixed tree).
    Reduce(Accumulation<'a>),
    /// A loop whose iterations are independent: strided over the group's invocations.
    Strided {
        /// The loop's iterator.
        index: Symbol,
        /// First iteration.
        from: i64,
        /// One past the last iteration.
        to: i64,
        /// The loop's body.
        body: &'a LowLevel,
    },
    /// Anything else: run by the group's first invocation.
    Lead,
}

impl RowItem<'_> {
    /// The invocations the item can keep busy: a reduction's steps, a strided loop's
    /// iterations, 1 for the lead's work.
    pub fn width(&self) -> u64 {
        match &self.role {
            RowRole::Reduce(r) => r.len(),
            RowRole::Strided { from, to, .. } => (to - from).max(0) as u64,
            RowRole::Lead => 1,
        }
    }

    /// Whether the item runs on one invocation but holds loops (serial work a group would
    /// wait for), or is a strided loop whose iterations hold independent loops of their own
    /// (work a wider grid would spread).
    pub fn underused(&self) -> bool {
        match &self.role {
            RowRole::Lead => has_loop(self.stmt),
            RowRole::Strided { body, .. } => independent_work(body) > 1,
            RowRole::Reduce(_) => false,
        }
    }
}

/// Whether a statement holds a loop.
fn has_loop(stmt: &LowLevel) -> bool {
    let mut found = false;
    stmt.visit(&mut |s| found |= matches!(s, LowLevel::For { .. }));
    found
}

/// The statements a group runs for one grid point of a row pass, classified.
pub fn row_items(inner: &LowLevel) -> Vec<RowItem<'_>> {
    let items: Vec<&LowLevel> = match inner.unwrapped() {
        LowLevel::Seq(items) => items.iter().collect(),
        other => vec![other],
    };
    items
        .into_iter()
        .filter(|s| !matches!(s, LowLevel::Noop | LowLevel::Comment(_)))
        .map(|stmt| {
            let role = if let Some(r) = Accumulation::detect_regroupable(stmt) {
                RowRole::Reduce(r)
            } else {
                match stmt.unwrapped() {
                    LowLevel::For {
                        index,
                        from,
                        to,
                        body,
                    } if iterations_independent(body, *index) => RowRole::Strided {
                        index: *index,
                        from: *from,
                        to: *to,
                        body,
                    },
                    _ => RowRole::Lead,
                }
            };
            RowItem { stmt, role }
        })
        .collect()
}

/// The iterations a statement offers that could run at once: the product of the extents of
/// its independent loops, nested (for a sequence, its widest statement). Reductions count 1:
/// their steps depend on each other unless regrouped (see [`longest_reduction`]).
pub fn independent_work(stmt: &LowLevel) -> u64 {
    match stmt {
        LowLevel::Seq(items) => items.iter().map(independent_work).max().unwrap_or(1),
        LowLevel::For {
            index,
            from,
            to,
            body,
        } => {
            let inner = independent_work(body);
            if to > from && iterations_independent(body, *index) {
                inner.saturating_mul((to - from) as u64)
            } else {
                inner
            }
        }
        _ => 1,
    }
}

/// The most steps any one element of the statement accumulates: the product of the extents
/// of the loops around an assignment that its element does not depend on (1 without
/// reductions).
pub fn longest_reduction(stmt: &LowLevel) -> u64 {
    fn walk(s: &LowLevel, loops: &mut Vec<(Symbol, u64)>, best: &mut u64) {
        match s {
            LowLevel::Seq(items) => items.iter().for_each(|i| walk(i, loops, best)),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                loops.push((*index, (to - from).max(0) as u64));
                walk(body, loops, best);
                loops.pop();
            }
            LowLevel::Set { tn, idcs, value } => {
                if split_accumulation(tn, idcs, value).is_some() {
                    let steps = loops
                        .iter()
                        .filter(|(sym, _)| !idcs.iter().any(|i| i.symbols().contains(sym)))
                        .map(|&(_, n)| n)
                        .fold(1u64, u64::saturating_mul);
                    *best = (*best).max(steps);
                }
                scopes(value, best);
            }
            LowLevel::SetLocal(_, value) => scopes(value, best),
            _ => {}
        }
    }
    /// A local scope's steps: the loops around its assignments, all reducing into it.
    fn scopes(value: &ScalarExpr, best: &mut u64) {
        fn steps(s: &LowLevel) -> u64 {
            match s {
                LowLevel::For { from, to, body, .. } => {
                    ((to - from).max(0) as u64).saturating_mul(steps(body))
                }
                LowLevel::Seq(items) => items.iter().map(steps).max().unwrap_or(1),
                _ => 1,
            }
        }
        value.visit_all(&mut |e| {
            if let ScalarExpr::LocalScope { body, .. } = e {
                *best = (*best).max(steps(body));
            }
        });
    }
    let mut best = 1;
    walk(stmt, &mut Vec::new(), &mut best);
    best
}

/// Operations of a statement: every loop iteration's assignments and arithmetic, the loops of
/// local scopes inside expressions included (what one invocation would run for all of it).
pub fn operations(stmt: &LowLevel) -> u64 {
    match stmt {
        LowLevel::For { from, to, body, .. } => {
            ((to - from).max(0) as u64).saturating_mul(operations(body))
        }
        LowLevel::Seq(items) => items.iter().map(operations).fold(0, u64::saturating_add),
        LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => {
            1u64.saturating_add(expression_operations(value))
        }
        LowLevel::ZeroOut(tn) => tn.num_elems() as u64,
        LowLevel::Noop | LowLevel::Comment(_) => 0,
    }
}

fn expression_operations(e: &ScalarExpr) -> u64 {
    let own = match e {
        ScalarExpr::LocalScope { body, .. } => operations(body),
        ScalarExpr::Unop(..)
        | ScalarExpr::Binop(..)
        | ScalarExpr::Ternop(..)
        | ScalarExpr::Random { .. } => 1,
        _ => 0,
    };
    let mut children = 0u64;
    e.for_each_child(|c| children = children.saturating_add(expression_operations(c)));
    own.saturating_add(children)
}

//! How a statement maps onto the GPU: the grid of independent loops, rows (a group of threads
//! per grid point around long reductions), single-loop accumulations into one element (group
//! reductions) and tiled products. The WGSL and CUDA renderers share these decisions and render
//! them each in its own syntax.

use std::borrow::Cow;

use arrayjit_ir::schedule::{
    Blocking, Contraction, Gemm, iterations_independent, split_accumulation,
};
use arrayjit_ir::{AxisIndex, BinOp, LowLevel, Prec, ScalarExpr, Symbol, TernOp, Tnode};

/// The grid of a pass: loops of `stmt` whose iterations are independent, outermost first, with
/// their ranges, and the statement each invocation runs.
///
/// A perfect nest around one assignment contributes every loop whose iterations are
/// independent, wherever it sits: running such a loop outside the others changes no element's
/// order of operations (each element is written by one iteration of it, and its reductions keep
/// their order), so a matrix product's rows and columns both become the grid while its
/// reduction runs inside. Other nests contribute their longest independent prefix.
pub(crate) fn grid_loops(stmt: &LowLevel) -> (Vec<(Symbol, i64, i64)>, Cow<'_, LowLevel>) {
    let (loops, inner) = stmt.perfect_nest();
    if matches!(inner, LowLevel::Set { .. }) && !loops.is_empty() {
        let independent = |&(index, from, to): &(Symbol, i64, i64)| {
            to > from && iterations_independent(inner, index)
        };
        let grid: Vec<(Symbol, i64, i64)> = loops.iter().copied().filter(independent).collect();
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
    let mut grid = Vec::new();
    let mut cur = stmt;
    while let LowLevel::For {
        index,
        from,
        to,
        body,
    } = cur
    {
        if to <= from || !iterations_independent(body, *index) {
            break;
        }
        grid.push((*index, *from, *to));
        cur = body.unwrapped();
    }
    (grid, Cow::Borrowed(cur))
}

/// What a reduction accumulates besides the element itself.
pub(crate) enum Rest<'a> {
    /// `s ⊕ v`.
    One(&'a ScalarExpr),
    /// `fma(a, b, s)`.
    Product(&'a ScalarExpr, &'a ScalarExpr),
}

/// A single loop accumulating into one element: `for i { s[o] = s[o] ⊕ v(i) }`.
pub(crate) struct Accumulation<'a> {
    pub(crate) iter: Symbol,
    pub(crate) from: i64,
    pub(crate) to: i64,
    pub(crate) tn: &'a Tnode,
    pub(crate) idcs: &'a [AxisIndex],
    pub(crate) combine: BinOp,
    pub(crate) rest: Rest<'a>,
}

impl<'a> Accumulation<'a> {
    pub(crate) fn detect(stmt: &'a LowLevel) -> Option<Accumulation<'a>> {
        let LowLevel::For {
            index,
            from,
            to,
            body,
        } = stmt
        else {
            return None;
        };
        let LowLevel::Set { tn, idcs, value } = body.unwrapped() else {
            return None;
        };
        if idcs.iter().any(|i| i.symbols().contains(index)) || to <= from {
            return None;
        }
        let (combine, parts) = split_accumulation(tn, idcs, value)?;
        let rest = match parts.as_slice() {
            [v] => Rest::One(v),
            [a, b] => Rest::Product(a, b),
            _ => return None,
        };
        Some(Accumulation {
            iter: *index,
            from: *from,
            to: *to,
            tn,
            idcs,
            combine,
            rest,
        })
    }
}

/// A reduction inside a grid gets a group of threads of its own when it is at least this long ...
pub(crate) const ROW_REDUCTION_MIN: u64 = 256;
/// ... and there are at most this many grid points (beyond, one thread per point keeps every
/// lane busy already).
pub(crate) const ROW_REDUCTION_MAX_ROWS: u64 = 1 << 14;

/// One statement of a row pass (a group of threads per grid point), run by the whole group in
/// order, with a barrier after each: later statements read what earlier ones stored.
pub(crate) struct RowItem<'a> {
    /// The statement.
    pub(crate) stmt: &'a LowLevel,
    /// How the group runs it.
    pub(crate) role: RowRole<'a>,
}

/// How a group of threads runs one statement of a row pass.
pub(crate) enum RowRole<'a> {
    /// An accumulation into one element in its compute precision: a group reduction (strided
    /// shares in order, then a fixed tree).
    Reduce(Accumulation<'a>),
    /// A loop whose iterations are independent: strided over the group's threads.
    Strided {
        index: Symbol,
        from: i64,
        to: i64,
        body: &'a LowLevel,
    },
    /// Anything else: run by the group's first thread.
    Lead,
}

/// The statements a group runs for one grid point of a row pass, classified.
pub(crate) fn row_items(inner: &LowLevel) -> Vec<RowItem<'_>> {
    let items: Vec<&LowLevel> = match inner.unwrapped() {
        LowLevel::Seq(items) => items.iter().collect(),
        other => vec![other],
    };
    items
        .into_iter()
        .map(|stmt| {
            let role = if let Some(r) =
                Accumulation::detect(stmt).filter(|r| r.tn.prec() == r.tn.prec().compute_prec())
            {
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

/// Whether the statement under a grid of `total` points holds a reduction long enough to
/// spread over a group of threads (and the grid is small enough to give each point a group).
fn is_row_pass(inner: &LowLevel, total: u64) -> bool {
    total <= ROW_REDUCTION_MAX_ROWS
        && row_items(inner).iter().any(|i| {
            matches!(&i.role, RowRole::Reduce(r) if (r.to - r.from) as u64 >= ROW_REDUCTION_MIN)
        })
}

/// The side of a product tile (a workgroup of `TILE²` invocations).
pub(crate) const TILE: usize = 16;

/// A statement that is an `f32` matrix product large enough to tile (both result sides at
/// least half a tile), with whether it accumulates through a fused multiply-add.
pub(crate) fn tiled_product(stmt: &LowLevel) -> Option<(Gemm, bool)> {
    let c = Contraction::detect(stmt)?;
    if c.out.node.prec() != Prec::F32 {
        return None;
    }
    // The blocking is the CPU's and is not used here; any valid one will do.
    let g = c.gemm(Blocking::for_cpu(4, 16, 4, [0; 3]))?;
    if g.m.extent < TILE / 2 || g.n.extent < TILE / 2 {
        return None;
    }
    let (_, inner) = stmt.perfect_nest();
    let fused = matches!(
        inner,
        LowLevel::Set {
            value: ScalarExpr::Ternop(TernOp::Fma, ..),
            ..
        }
    );
    Some((g, fused))
}

/// How one top-level statement maps onto a GPU pass: the decision the WGSL and CUDA renderers
/// share (each renders it in its own syntax).
pub(crate) enum PassPlan<'a> {
    /// Nothing to run.
    Nothing,
    /// Zeroing a node.
    Zero(&'a Tnode),
    /// A tiled `f32` matrix product, with whether it accumulates by fused multiply-add.
    Tiles(Gemm, bool),
    /// One thread per iteration of the independent loops `grid`, each running `inner`.
    Grid {
        grid: Vec<(Symbol, i64, i64)>,
        inner: Cow<'a, LowLevel>,
        total: u64,
    },
    /// One group of threads per iteration of the independent loops `grid` (`total` of them),
    /// running the [`row_items`] of `inner` together.
    Rows {
        grid: Vec<(Symbol, i64, i64)>,
        inner: Cow<'a, LowLevel>,
        total: u64,
    },
    /// A loop accumulating into one element, reduced by one group of threads.
    Reduction(Accumulation<'a>),
    /// Anything else: one thread.
    Single,
}

impl PassPlan<'_> {
    /// Why a grid, reduction or single-thread pass has its shape (`group`: what the target
    /// calls a group of threads, "workgroup" or "block").
    pub(crate) fn why(&self, group: &str) -> String {
        match self {
            PassPlan::Grid { grid, .. } => format!(
                "{} independent outer loop(s): one invocation per iteration",
                grid.len()
            ),
            PassPlan::Rows { grid, .. } => format!(
                "{} independent outer loop(s) around long reductions: one {group} per \
                 iteration; reductions combine strided shares in a fixed tree order, independent \
                 loops stride over the threads, anything else runs on the first thread",
                grid.len(),
            ),
            PassPlan::Reduction(r) => format!(
                "a loop accumulating into one element by {}: one {group}, strided shares \
                 combined in a fixed tree order",
                r.combine.name()
            ),
            PassPlan::Single => "its iterations depend on each other and it is not a reduction \
                                 into one element"
                .to_string(),
            PassPlan::Nothing | PassPlan::Zero(_) | PassPlan::Tiles(..) => String::new(),
        }
    }
}

/// The pass plan of a top-level statement (already unwrapped).
pub(crate) fn plan(stmt: &LowLevel) -> PassPlan<'_> {
    match stmt {
        LowLevel::Noop | LowLevel::Comment(_) => PassPlan::Nothing,
        LowLevel::ZeroOut(tn) => PassPlan::Zero(tn),
        _ => {
            if let Some((g, fused)) = tiled_product(stmt) {
                return PassPlan::Tiles(g, fused);
            }
            let (grid, inner) = grid_loops(stmt);
            if !grid.is_empty() {
                let total = grid.iter().map(|(_, f, t)| (t - f) as u64).product();
                if is_row_pass(&inner, total) {
                    return PassPlan::Rows { grid, inner, total };
                }
                return PassPlan::Grid { grid, inner, total };
            }
            match Accumulation::detect(stmt) {
                // Each step rounds to the element's precision: only where that is the compute
                // precision may the steps regroup.
                Some(r) if r.tn.prec() == r.tn.prec().compute_prec() => PassPlan::Reduction(r),
                _ => PassPlan::Single,
            }
        }
    }
}

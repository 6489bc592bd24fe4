//! Assignments, the high-level IR: accumulating operations with projections, fetches,
//! sequences, comments; their checks and their lowering to the loop IR.

use std::collections::HashMap;
use std::sync::Arc;

use crate::access::check_access;
use crate::attention::AttentionOp;
use crate::error::{Error, Result};
use crate::indexing::{AxisIndex, EinsumGuard, Projections, StaticSymbol, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::ops::{BinOp, TernOp, UnOp};
use crate::tnode::Tnode;

/// Fetches larger than this many elements cannot be embedded as constants in code.
pub const MAX_EMBEDDED_ELEMENTS: usize = 16_384;

/// An operand of an accumulating operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// The node's own array in the context.
    Node(Tnode),
    /// The stream's merge buffer, holding a copy of the node received from another device.
    Merge(Tnode),
}

impl Operand {
    /// The node the operand refers to.
    pub fn node(&self) -> &Tnode {
        match self {
            Operand::Node(t) | Operand::Merge(t) => t,
        }
    }
}

/// The right-hand side of an accumulating operation.
#[derive(Clone, Debug, PartialEq)]
pub enum AccumRhs {
    /// `op(a)`.
    Unop(UnOp, Operand),
    /// `op(a, b)`.
    Binop(BinOp, Operand, Operand),
    /// `op(a, b, c)`.
    Ternop(TernOp, Operand, Operand, Operand),
}

impl AccumRhs {
    /// The operands in order.
    pub fn operands(&self) -> Vec<&Operand> {
        match self {
            AccumRhs::Unop(_, a) => vec![a],
            AccumRhs::Binop(_, a, b) => vec![a, b],
            AccumRhs::Ternop(_, a, b, c) => vec![a, b, c],
        }
    }
}

/// How a node is filled without reading other nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchOp {
    /// Every element holds the constant.
    Constant(f64),
    /// The logical elements hold these values (row-major), embedded in the code.
    ConstantFill(Vec<f64>),
    /// Every element holds its own flat (row-major, logical) position.
    RangeOverOffsets,
    /// Every element holds a uniform random value in `[0, 1)`: element at flat (row-major)
    /// position `i` is [`crate::random::device_uniform`]`(seed, stream, i, step)`, where `step` is
    /// the value of the one-element node `step` when the code runs (converted to `u32`). The
    /// values depend on nothing else, so a virtual node recomputes the same values wherever it
    /// is read.
    Random {
        /// The Philox key.
        seed: u64,
        /// Separates the draws made with one seed (one stream per random tensor).
        stream: u32,
        /// A one-element node (any precision) whose value selects the draw, advanced by the
        /// program between runs.
        step: Tnode,
    },
    /// The node is slice `batch` of `sliced` along its first axis; the node's dims are `sliced`'s
    /// dims without the first.
    Slice {
        /// The static index choosing the slice.
        batch: StaticSymbol,
        /// The node sliced.
        sliced: Tnode,
    },
    /// The node takes slices of `table` chosen by the ids held in `ids` (NumPy's
    /// `take(table, ids, axis)`, an embedding lookup for `axis` 0): its dims are `table`'s dims
    /// with axis `axis` replaced by `ids`'s dims. Ids are values, truncated toward zero; an id
    /// outside `0..table.dims()[axis]` is an error in the interpreter and reads NaN (zero for
    /// integer nodes) in compiled code, never memory outside `table` (see
    /// [`ScalarExpr::Gather`]).
    Gather {
        /// The node read.
        table: Tnode,
        /// The ids, one per selected slice.
        ids: Tnode,
        /// The axis of `table` the ids select along.
        axis: usize,
    },
}

/// The high-level IR of a computation.
#[derive(Clone, Debug, PartialEq)]
pub enum Assignments {
    /// Nothing.
    Noop,
    /// In order.
    Seq(Vec<Assignments>),
    /// A commented block.
    BlockComment(String, Box<Assignments>),
    /// `lhs[project_lhs] = accum(lhs[project_lhs], rhs(operands[project_rhs]))` over the product
    /// space. With `initialize_neutral`, the lhs starts from `accum`'s neutral element.
    Accum {
        /// Start from the neutral element of `accum` rather than the lhs's current values.
        initialize_neutral: bool,
        /// The accumulation (`Add` for `+=`, `Arg2` for plain assignment, `Max` for a max
        /// reduction, ...).
        accum: BinOp,
        /// The node written.
        lhs: Tnode,
        /// The operation on the operands.
        rhs: AccumRhs,
        /// How the iteration space maps onto the lhs and operands.
        projections: Projections,
    },
    /// One pass of fused attention (see [`crate::attention`]): loops over the keys with an
    /// online softmax, never an array of all the scores.
    Attention(Arc<AttentionOp>),
    /// Fills a node.
    Fetch {
        /// The node filled.
        array: Tnode,
        /// With what.
        op: FetchOp,
    },
}

impl Assignments {
    /// `lhs = op(a)` pointwise over `lhs`'s dims (the operand must have the same dims).
    pub fn pointwise_unop(lhs: &Tnode, op: UnOp, a: &Tnode) -> Assignments {
        Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: lhs.clone(),
            rhs: AccumRhs::Unop(op, Operand::Node(a.clone())),
            projections: Projections::pointwise(lhs.dims(), 1),
        }
    }

    /// `lhs = op(a, b)` pointwise (the operands must have `lhs`'s dims).
    pub fn pointwise_binop(lhs: &Tnode, op: BinOp, a: &Tnode, b: &Tnode) -> Assignments {
        Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: lhs.clone(),
            rhs: AccumRhs::Binop(op, Operand::Node(a.clone()), Operand::Node(b.clone())),
            projections: Projections::pointwise(lhs.dims(), 2),
        }
    }

    /// `lhs[.., start + t, ..] = src[.., t, ..]` along `axis`: `src` written into `lhs` from
    /// index `start` on, where `start` is bound per run (the rows a decoding step appends to
    /// a key/value cache). The other axes must agree; `start`'s range must keep every row
    /// inside `lhs` (`start.range + src's extent - 1 <= lhs's extent`), which lowering checks.
    /// The rest of `lhs` keeps its values, so `lhs` holds what earlier runs wrote.
    pub fn write_at_static(
        lhs: &Tnode,
        src: &Tnode,
        axis: usize,
        start: &StaticSymbol,
    ) -> Result<Assignments> {
        let (ld, sd) = (lhs.dims(), src.dims());
        let same_elsewhere = ld.len() == sd.len()
            && axis < ld.len()
            && ld
                .iter()
                .zip(sd)
                .enumerate()
                .all(|(k, (l, s))| k == axis || l == s);
        if !same_elsewhere {
            return Err(Error::shape_mismatch(
                format!(
                    "writing {} into {} at {}",
                    src.debug_name(),
                    lhs.debug_name(),
                    start.name
                ),
                &[sd, ld],
                format!(
                    "the two must have the same rank and agree on every axis but axis {axis} \
                     (got {sd:?} into {ld:?})"
                ),
            ));
        }
        let mut projections = Projections::pointwise(sd, 1);
        projections.lhs_dims = ld.to_vec();
        projections.project_lhs[axis] = AxisIndex::affine(
            [(1, projections.product_iterators[axis]), (1, start.symbol)],
            0,
        );
        projections.debug_info = format!("write at {} + axis {axis}", start.name).into();
        Ok(Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: lhs.clone(),
            rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(src.clone())),
            projections,
        })
    }

    /// An accumulation built from an einsum-like spec (see [`Projections::einsum`]).
    pub fn einsum(
        spec: &str,
        accum: BinOp,
        lhs: &Tnode,
        rhs: AccumRhs,
        initialize_neutral: bool,
    ) -> Result<Assignments> {
        Assignments::einsum_guarded(spec, accum, lhs, rhs, initialize_neutral, &[])
    }

    /// [`Assignments::einsum`] accumulating only the terms where every guard holds (see
    /// [`Projections::guards`]; the guards are written with the spec's letters).
    pub fn einsum_guarded(
        spec: &str,
        accum: BinOp,
        lhs: &Tnode,
        rhs: AccumRhs,
        initialize_neutral: bool,
        guards: &[EinsumGuard],
    ) -> Result<Assignments> {
        let dims: Vec<&[usize]> = rhs.operands().iter().map(|o| o.node().dims()).collect();
        Ok(Assignments::Accum {
            initialize_neutral,
            accum,
            lhs: lhs.clone(),
            projections: Projections::einsum_guarded(spec, lhs.dims(), &dims, guards)?,
            rhs,
        })
    }

    /// A pass of fused attention (registered, so schedules can find its loop nest).
    pub fn attention(op: AttentionOp) -> Assignments {
        Assignments::Attention(op.register())
    }

    /// Sequencing helper.
    pub fn then(self, next: Assignments) -> Assignments {
        match self {
            Assignments::Noop => next,
            Assignments::Seq(mut items) => {
                items.push(next);
                Assignments::Seq(items)
            }
            first => Assignments::Seq(vec![first, next]),
        }
    }

    /// Static symbols introduced by slices, in order of appearance.
    pub fn static_symbols(&self) -> Vec<StaticSymbol> {
        let mut out: Vec<StaticSymbol> = Vec::new();
        self.walk(&mut |a| {
            if let Assignments::Fetch {
                op: FetchOp::Slice { batch, .. },
                ..
            } = a
                && !out.contains(batch)
            {
                out.push(batch.clone());
            }
        });
        out
    }

    fn walk(&self, f: &mut impl FnMut(&Assignments)) {
        f(self);
        match self {
            Assignments::Seq(items) => items.iter().for_each(|a| a.walk(f)),
            Assignments::BlockComment(_, a) => a.walk(f),
            _ => {}
        }
    }

    /// Lowers to the loop IR, checking shapes and that every index stays inside its node
    /// (margins of padded nodes included) for every value of the loop iterators and of the
    /// static symbols in `bindings` (and those introduced by slices).
    pub fn lower(&self, bindings: &[StaticSymbol]) -> Result<LowLevel> {
        let mut statics: HashMap<Symbol, StaticSymbol> =
            bindings.iter().map(|b| (b.symbol, b.clone())).collect();
        for s in self.static_symbols() {
            statics.entry(s.symbol).or_insert(s);
        }
        self.lower_with(&statics)
    }

    fn lower_with(&self, statics: &HashMap<Symbol, StaticSymbol>) -> Result<LowLevel> {
        match self {
            Assignments::Noop => Ok(LowLevel::Noop),
            Assignments::Seq(items) => Ok(LowLevel::seq(
                items
                    .iter()
                    .map(|a| a.lower_with(statics))
                    .collect::<Result<Vec<_>>>()?,
            )),
            Assignments::BlockComment(c, body) => Ok(LowLevel::seq([
                LowLevel::Comment(c.clone()),
                body.lower_with(statics)?,
            ])),
            Assignments::Accum {
                initialize_neutral,
                accum,
                lhs,
                rhs,
                projections,
            } => lower_accum(*initialize_neutral, *accum, lhs, rhs, projections, statics),
            Assignments::Fetch { array, op } => lower_fetch(array, op, statics),
            Assignments::Attention(op) => op.lower(),
        }
    }
}

fn shape_error(op: &str, detail: String) -> Error {
    Error::shape_mismatch(op, &[], detail)
}

/// Wraps `body` in loops over `its` with extents `dims` (outermost first).
fn loop_nest(its: &[Symbol], dims: &[usize], body: LowLevel) -> LowLevel {
    its.iter()
        .zip(dims)
        .rev()
        .fold(body, |body, (&index, &d)| LowLevel::For {
            index,
            from: 0,
            to: d as i64,
            body: Box::new(body),
        })
}

fn lower_accum(
    initialize_neutral: bool,
    accum: BinOp,
    lhs: &Tnode,
    rhs: &AccumRhs,
    p: &Projections,
    statics: &HashMap<Symbol, StaticSymbol>,
) -> Result<LowLevel> {
    let what = format!("assignment to {} ({})", lhs.debug_name(), p.debug_info);
    if p.product_space.len() != p.product_iterators.len() {
        return Err(shape_error(
            &what,
            "product space and iterators differ in length".into(),
        ));
    }
    if p.lhs_dims != lhs.dims() {
        return Err(Error::shape_mismatch(
            &what,
            &[&p.lhs_dims, lhs.dims()],
            format!(
                "projections expect lhs dims {:?} but the node has {:?}",
                p.lhs_dims,
                lhs.dims()
            ),
        ));
    }
    let operands = rhs.operands();
    if operands.len() != p.project_rhs.len() || operands.len() != p.rhs_dims.len() {
        return Err(shape_error(
            &what,
            format!(
                "the operation has {} operand(s) but the projections describe {}",
                operands.len(),
                p.project_rhs.len()
            ),
        ));
    }
    let mut extents: HashMap<Symbol, usize> = p
        .product_iterators
        .iter()
        .copied()
        .zip(p.product_space.iter().copied())
        .collect();
    extents.extend(statics.iter().map(|(s, st)| (*s, st.range)));
    let bounds = |s: Symbol| extents.get(&s).copied();
    check_access(lhs, &p.project_lhs, &bounds, &what)?;
    let mut args = Vec::new();
    for (k, (op, (idcs, dims))) in operands
        .iter()
        .zip(p.project_rhs.iter().zip(&p.rhs_dims))
        .enumerate()
    {
        if dims.as_slice() != op.node().dims() {
            return Err(Error::shape_mismatch(
                &what,
                &[dims, op.node().dims()],
                format!(
                    "projections expect operand {k} dims {dims:?} but {} has {:?}",
                    op.node().debug_name(),
                    op.node().dims()
                ),
            ));
        }
        check_access(op.node(), idcs, &bounds, &what)?;
        args.push(match op {
            Operand::Node(t) => ScalarExpr::Get(t.clone(), idcs.clone()),
            Operand::Merge(t) => ScalarExpr::GetMerge(t.clone(), idcs.clone()),
        });
    }
    let mut args = args.into_iter();
    let mut next = || args.next().expect("arity checked above");
    let rhs_expr = match rhs {
        AccumRhs::Unop(op, _) => ScalarExpr::unop(*op, next()),
        AccumRhs::Binop(op, _, _) => {
            let a = next();
            ScalarExpr::binop(*op, a, next())
        }
        AccumRhs::Ternop(op, _, _, _) => {
            let (a, b) = (next(), next());
            ScalarExpr::ternop(*op, a, b, next())
        }
    };
    // When every lhs element is visited exactly once, the neutral start folds into the value.
    let lhs_its: Vec<Symbol> = p
        .project_lhs
        .iter()
        .filter_map(|i| match i {
            AxisIndex::Iterator(s) => Some(*s),
            _ => None,
        })
        .collect();
    let bijective = lhs_its.len() == p.project_lhs.len()
        && p.product_iterators.iter().all(|s| lhs_its.contains(s))
        && lhs_its.len() == p.product_iterators.len()
        && lhs_its
            .iter()
            .zip(lhs.dims())
            .all(|(s, &d)| extents.get(s) == Some(&d));
    let lhs_get = ScalarExpr::Get(lhs.clone(), p.project_lhs.clone());
    if !p.guards.is_empty() {
        let skipped = guard_conditions(lhs, p, &bounds, &what)?;
        // A skipped term leaves the element as it is: at the neutral element where the start
        // is folded into the value (every element is visited once), else at its current value.
        let neutral = ScalarExpr::Constant(accum.neutral_element());
        let (init, kept, inner) = if accum == BinOp::Arg2 {
            (LowLevel::Noop, lhs_get, rhs_expr)
        } else if initialize_neutral && bijective {
            let inner = ScalarExpr::binop(accum, neutral.clone(), rhs_expr);
            (LowLevel::Noop, neutral, inner)
        } else {
            let init = if initialize_neutral {
                neutral_fill(lhs, accum.neutral_element())
            } else {
                LowLevel::Noop
            };
            let inner = ScalarExpr::binop(accum, lhs_get.clone(), rhs_expr);
            (init, lhs_get, inner)
        };
        let value = skipped.into_iter().rev().fold(inner, |value, skip| {
            ScalarExpr::ternop(TernOp::Where, skip, kept.clone(), value)
        });
        let set = LowLevel::Set {
            tn: lhs.clone(),
            idcs: p.project_lhs.clone(),
            value,
        };
        let (its, dims) = loop_order(p);
        return Ok(LowLevel::seq([init, loop_nest(&its, &dims, set)]));
    }
    let (init, value) = if accum == BinOp::Arg2 {
        (LowLevel::Noop, rhs_expr)
    } else if initialize_neutral && bijective {
        (
            LowLevel::Noop,
            ScalarExpr::binop(
                accum,
                ScalarExpr::Constant(accum.neutral_element()),
                rhs_expr,
            ),
        )
    } else if initialize_neutral {
        (
            neutral_fill(lhs, accum.neutral_element()),
            ScalarExpr::binop(accum, lhs_get, rhs_expr),
        )
    } else {
        (LowLevel::Noop, ScalarExpr::binop(accum, lhs_get, rhs_expr))
    };
    let set = LowLevel::Set {
        tn: lhs.clone(),
        idcs: p.project_lhs.clone(),
        value,
    };
    let (its, dims) = loop_order(p);
    Ok(LowLevel::seq([init, loop_nest(&its, &dims, set)]))
}

/// Per guard of `p`, the condition that skips a term: `guard < 0`, the guard's value compared
/// in the statement's precision. Guards need a float result: a float keeps the sign of every
/// integer it rounds, where an unsigned or narrow integer precision would wrap.
fn guard_conditions(
    lhs: &Tnode,
    p: &Projections,
    bounds: &impl Fn(Symbol) -> Option<usize>,
    what: &str,
) -> Result<Vec<ScalarExpr>> {
    if !lhs.prec().compute_prec().is_float() {
        return Err(Error::BadValue {
            what: format!("{what}: the precision of a guarded accumulation's result"),
            value: lhs.prec().name().into(),
            expected: "a float precision (compute the guarded result in a float and cast it)"
                .into(),
        });
    }
    p.guards
        .iter()
        .map(|g| {
            // Static symbols are bound per run: their ranges are among `bounds`.
            if let Some(s) = g
                .symbols()
                .into_iter()
                .find(|s| !p.product_iterators.contains(s) && bounds(*s).is_none())
            {
                return Err(shape_error(
                    what,
                    format!(
                        "the guard {g} uses {s}, which is neither an iterator of the product \
                         space nor a static symbol the routine is compiled with (pass it among \
                         the bindings)"
                    ),
                ));
            }
            g.value_range(bounds)
                .map_err(|e| e.into_error(&lhs.debug_name(), what))?;
            Ok(ScalarExpr::binop(
                BinOp::Cmplt,
                ScalarExpr::EmbedIndex(g.clone()),
                ScalarExpr::Constant(0.0),
            ))
        })
        .collect()
}

/// The loop order of an accumulation: the product space's order, except that the iterator of
/// the lhs's last (contiguous) axis goes innermost when every operand that uses it uses it for
/// its own last axis, so the innermost loop walks memory contiguously (e.g. `i, k, j` for a
/// matrix product). Each lhs element still accumulates its terms in the same order, so results
/// are unchanged.
fn loop_order(p: &Projections) -> (Vec<Symbol>, Vec<usize>) {
    let mut its = p.product_iterators.clone();
    let mut dims = p.product_space.clone();
    let Some(AxisIndex::Iterator(last)) = p.project_lhs.last() else {
        return (its, dims);
    };
    let contiguous_everywhere = p.project_rhs.iter().all(|idcs| {
        idcs.iter().enumerate().all(|(axis, i)| {
            !i.symbols().contains(last)
                || (axis + 1 == idcs.len() && *i == AxisIndex::Iterator(*last))
        })
    });
    if let Some(pos) = its.iter().position(|s| s == last)
        && contiguous_everywhere
    {
        let s = its.remove(pos);
        let d = dims.remove(pos);
        its.push(s);
        dims.push(d);
    }
    (its, dims)
}

/// Sets every logical element of `tn` to `value` (a zero-out when possible).
fn neutral_fill(tn: &Tnode, value: f64) -> LowLevel {
    if value == 0.0 && tn.padding().is_none() {
        return LowLevel::ZeroOut(tn.clone());
    }
    let its: Vec<Symbol> = tn.dims().iter().map(|_| Symbol::fresh()).collect();
    loop_nest(
        &its,
        tn.dims(),
        LowLevel::Set {
            tn: tn.clone(),
            idcs: its.iter().map(|&s| AxisIndex::Iterator(s)).collect(),
            value: ScalarExpr::Constant(value),
        },
    )
}

/// The row-major flat position of the element at iterators `its` over `dims`.
fn flat_position(its: &[Symbol], dims: &[usize]) -> AxisIndex {
    let mut stride = 1i64;
    let mut terms = Vec::new();
    for (&s, &d) in its.iter().zip(dims).rev() {
        terms.push((stride, s));
        stride *= d as i64;
    }
    AxisIndex::affine(terms, 0)
}

fn lower_fetch(
    array: &Tnode,
    op: &FetchOp,
    statics: &HashMap<Symbol, StaticSymbol>,
) -> Result<LowLevel> {
    let what = format!("fetch into {}", array.debug_name());
    let dims = array.dims().to_vec();
    let its: Vec<Symbol> = dims.iter().map(|_| Symbol::fresh()).collect();
    let idcs: Vec<AxisIndex> = its.iter().map(|&s| AxisIndex::Iterator(s)).collect();
    let set = |value: ScalarExpr| LowLevel::Set {
        tn: array.clone(),
        idcs: idcs.clone(),
        value,
    };
    match op {
        FetchOp::Constant(c) => Ok(loop_nest(&its, &dims, set(ScalarExpr::Constant(*c)))),
        FetchOp::RangeOverOffsets => Ok(loop_nest(
            &its,
            &dims,
            set(ScalarExpr::EmbedIndex(flat_position(&its, &dims))),
        )),
        FetchOp::Random { seed, stream, step } => {
            if step.dims().iter().product::<usize>() != 1 {
                return Err(shape_error(
                    &what,
                    format!(
                        "the step node {} must hold one element, but its dims are {:?}",
                        step.debug_name(),
                        step.dims()
                    ),
                ));
            }
            if !array.prec().is_float() {
                return Err(Error::BadValue {
                    what: format!("{what}: the precision of random uniform values"),
                    value: array.prec().name().into(),
                    expected: "a float precision".into(),
                });
            }
            let step_value =
                ScalarExpr::Get(step.clone(), vec![AxisIndex::Fixed(0); step.dims().len()]);
            Ok(loop_nest(
                &its,
                &dims,
                set(ScalarExpr::random(
                    *seed,
                    *stream,
                    flat_position(&its, &dims),
                    step_value,
                )),
            ))
        }
        FetchOp::ConstantFill(values) => {
            let n: usize = dims.iter().product();
            if values.len() != n {
                return Err(shape_error(
                    &what,
                    format!(
                        "dims {dims:?} hold {n} elements but {} values were given",
                        values.len()
                    ),
                ));
            }
            if n > MAX_EMBEDDED_ELEMENTS {
                return Err(Error::BadValue {
                    what: format!("{what}: values embedded in code"),
                    value: n.to_string(),
                    expected: format!(
                        "at most {MAX_EMBEDDED_ELEMENTS}; set more on the host with \
                         Tnode::set_values"
                    ),
                });
            }
            let mut sets = Vec::with_capacity(n);
            for (flat, &v) in values.iter().enumerate() {
                let mut rest = flat;
                let mut idx = vec![0i64; dims.len()];
                for a in (0..dims.len()).rev() {
                    idx[a] = (rest % dims[a]) as i64;
                    rest /= dims[a];
                }
                sets.push(LowLevel::Set {
                    tn: array.clone(),
                    idcs: idx.into_iter().map(AxisIndex::Fixed).collect(),
                    value: ScalarExpr::Constant(v),
                });
            }
            Ok(LowLevel::seq(sets))
        }
        FetchOp::Slice { batch, sliced } => {
            let sd = sliced.dims();
            if sd.len() != dims.len() + 1 || sd[1..] != dims[..] {
                return Err(shape_error(
                    &what,
                    format!(
                        "a slice of {} with dims {sd:?} has dims {:?}, but the node has {dims:?}",
                        sliced.debug_name(),
                        sd.get(1..).unwrap_or(&[])
                    ),
                ));
            }
            let mut src = vec![AxisIndex::Iterator(batch.symbol)];
            src.extend(idcs.iter().cloned());
            let mut extents: HashMap<Symbol, usize> =
                its.iter().copied().zip(dims.iter().copied()).collect();
            extents.extend(statics.iter().map(|(s, st)| (*s, st.range)));
            check_access(sliced, &src, &|s| extents.get(&s).copied(), &what)?;
            Ok(loop_nest(
                &its,
                &dims,
                set(ScalarExpr::Get(sliced.clone(), src)),
            ))
        }
        FetchOp::Gather { table, ids, axis } => {
            let td = table.dims();
            let rank = ids.dims().len();
            let expected = (*axis < td.len()).then(|| {
                let mut d = td[..*axis].to_vec();
                d.extend_from_slice(ids.dims());
                d.extend_from_slice(&td[axis + 1..]);
                d
            });
            if expected.as_ref() != Some(&dims) {
                return Err(shape_error(
                    &what,
                    format!(
                        "gathering along axis {axis} of {} (dims {td:?}) by {} (dims {:?}) \
                         needs a node of dims {}, but the node has {dims:?}",
                        table.debug_name(),
                        ids.debug_name(),
                        ids.dims(),
                        expected.map_or("(none: no such axis)".into(), |e| format!("{e:?}"))
                    ),
                ));
            };
            if td[*axis] == 0 {
                return Err(shape_error(
                    &what,
                    format!(
                        "axis {axis} of {} is empty: there is nothing to gather",
                        table.debug_name()
                    ),
                ));
            }
            let symbol = Symbol::fresh();
            let id_idcs = idcs[*axis..axis + rank].to_vec();
            let mut table_idcs = idcs[..*axis].to_vec();
            table_idcs.push(AxisIndex::Iterator(symbol));
            table_idcs.extend_from_slice(&idcs[axis + rank..]);
            let mut extents: HashMap<Symbol, usize> =
                its.iter().copied().zip(dims.iter().copied()).collect();
            extents.insert(symbol, td[*axis]);
            let bounds = |s: Symbol| extents.get(&s).copied();
            check_access(ids, &id_idcs, &bounds, &what)?;
            check_access(table, &table_idcs, &bounds, &what)?;
            let value = ScalarExpr::gather(
                symbol,
                td[*axis],
                ScalarExpr::Get(ids.clone(), id_idcs),
                ScalarExpr::Get(table.clone(), table_idcs),
            );
            Ok(loop_nest(&its, &dims, set(value)))
        }
    }
}

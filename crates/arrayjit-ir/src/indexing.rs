//! Indexing: loop symbols, static symbols bound per run (like a batch index), axis indices
//! (fixed, iterator, affine) and projections (a product space with lhs/rhs index maps).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, OutOfBounds, Result};

static NEXT_SYMBOL: AtomicUsize = AtomicUsize::new(1);

/// An index variable: a loop iterator or a static index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(pub usize);

impl Symbol {
    /// A symbol never used before.
    pub fn fresh() -> Symbol {
        Symbol(NEXT_SYMBOL.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}", self.0)
    }
}

/// A symbol bound once per run of a routine (not by a loop), with the range of values it may
/// take: `0 <= value < range`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StaticSymbol {
    /// The symbol used in indices.
    pub symbol: Symbol,
    /// Exclusive upper bound of its values. Indexing with a static symbol needs a range so that
    /// every access can be checked before code runs.
    pub range: usize,
    /// A human name, e.g. `"batch"`.
    pub name: String,
}

impl StaticSymbol {
    /// A fresh static symbol taking values in `0..range`.
    pub fn new(name: &str, range: usize) -> StaticSymbol {
        StaticSymbol {
            symbol: Symbol::fresh(),
            range,
            name: name.to_string(),
        }
    }
}

/// The index of one axis of an access, as an affine function of symbols.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AxisIndex {
    /// A constant index.
    Fixed(i64),
    /// A symbol's value.
    Iterator(Symbol),
    /// `offset + Σ coeff·symbol`; kept normalized by [`AxisIndex::affine`].
    Affine {
        /// `(coefficient, symbol)` pairs, sorted by symbol, no zero coefficients.
        terms: Vec<(i64, Symbol)>,
        /// The constant term.
        offset: i64,
    },
}

impl AxisIndex {
    /// Normal form of `offset + Σ coeff·symbol`: merges repeated symbols, drops zero
    /// coefficients, and uses `Fixed` / `Iterator` when they fit.
    pub fn affine(terms: impl IntoIterator<Item = (i64, Symbol)>, offset: i64) -> AxisIndex {
        let mut merged: BTreeMap<Symbol, i64> = BTreeMap::new();
        for (c, s) in terms {
            let e = merged.entry(s).or_insert(0);
            // Wrapping: an index whose coefficients do not fit is rejected by the range check
            // (`AxisIndex::range_over`) that every access passes before code runs.
            *e = e.wrapping_add(c);
        }
        let terms: Vec<(i64, Symbol)> = merged
            .into_iter()
            .filter(|(_, c)| *c != 0)
            .map(|(s, c)| (c, s))
            .collect();
        match (terms.as_slice(), offset) {
            ([], o) => AxisIndex::Fixed(o),
            ([(1, s)], 0) => AxisIndex::Iterator(*s),
            _ => AxisIndex::Affine { terms, offset },
        }
    }

    /// The index as `(terms, offset)`.
    pub fn terms(&self) -> (Vec<(i64, Symbol)>, i64) {
        match self {
            AxisIndex::Fixed(o) => (vec![], *o),
            AxisIndex::Iterator(s) => (vec![(1, *s)], 0),
            AxisIndex::Affine { terms, offset } => (terms.clone(), *offset),
        }
    }

    /// The symbols this index depends on.
    pub fn symbols(&self) -> Vec<Symbol> {
        self.terms().0.into_iter().map(|(_, s)| s).collect()
    }

    /// This index plus a constant.
    pub fn shifted(&self, by: i64) -> AxisIndex {
        let (t, o) = self.terms();
        AxisIndex::affine(t, o.wrapping_add(by))
    }

    /// Replaces symbols by indices (affine substitution).
    pub fn substitute(&self, subst: &HashMap<Symbol, AxisIndex>) -> AxisIndex {
        let (terms, offset) = self.terms();
        let mut out_terms = Vec::new();
        let mut out_offset = offset;
        for (c, s) in terms {
            match subst.get(&s) {
                Some(idx) => {
                    let (t2, o2) = idx.terms();
                    // Wrapping, as in `affine`: the range check rejects what does not fit.
                    out_offset = out_offset.wrapping_add(c.wrapping_mul(o2));
                    out_terms.extend(t2.into_iter().map(|(c2, s2)| (c.wrapping_mul(c2), s2)));
                }
                None => out_terms.push((c, s)),
            }
        }
        AxisIndex::affine(out_terms, out_offset)
    }

    /// Evaluates the index with the given symbol values; `None` if a symbol is unbound or the
    /// value does not fit in an `i64`.
    pub fn eval(&self, env: &impl Fn(Symbol) -> Option<i64>) -> Option<i64> {
        let (terms, offset) = self.terms();
        terms.into_iter().try_fold(offset, |acc, (c, s)| {
            env(s)
                .and_then(|v| c.checked_mul(v))
                .and_then(|t| acc.checked_add(t))
        })
    }

    /// The inclusive range of values the index takes when each symbol ranges over
    /// `0..bounds(symbol)`. See [`AxisIndex::range_over`] for the errors.
    pub fn value_range(
        &self,
        bounds: &impl Fn(Symbol) -> Option<usize>,
    ) -> Result<(i64, i64), RangeError> {
        self.range_over(&|s| {
            bounds(s).map(|b| {
                (
                    0,
                    i64::try_from(b)
                        .unwrap_or(i64::MAX)
                        .saturating_sub(1)
                        .max(0),
                )
            })
        })
    }

    /// The inclusive range of values the index takes when each symbol `s` ranges over the
    /// inclusive interval `ranges(s)`.
    ///
    /// All arithmetic is checked. Beyond the range itself, the index must be computable in
    /// 64-bit arithmetic in any order of its terms (generated code evaluates `c·s` products and
    /// their sums in its own order): `|offset| + Σ |c|·max(|lo|, |hi|)` must fit in an `i64`.
    /// Otherwise the result is [`RangeError::Overflow`] — such an index could wrap around in
    /// compiled code and reach a wild address.
    pub fn range_over(
        &self,
        ranges: &impl Fn(Symbol) -> Option<(i64, i64)>,
    ) -> Result<(i64, i64), RangeError> {
        let (terms, offset) = self.terms();
        let overflow = || RangeError::Overflow {
            index: self.to_string(),
        };
        // i128 holds every product of two i64 exactly; the sums are checked.
        let mut magnitude: i128 = i128::from(offset).abs();
        let (mut lo, mut hi) = (i128::from(offset), i128::from(offset));
        for (c, s) in terms {
            let (slo, shi) = ranges(s).ok_or(RangeError::Unbound(s))?;
            let (a, b) = (
                i128::from(c) * i128::from(slo),
                i128::from(c) * i128::from(shi),
            );
            lo = lo.checked_add(a.min(b)).ok_or_else(overflow)?;
            hi = hi.checked_add(a.max(b)).ok_or_else(overflow)?;
            let biggest = i128::from(slo).abs().max(i128::from(shi).abs());
            magnitude = magnitude
                .checked_add(i128::from(c).abs() * biggest.max(1))
                .ok_or_else(overflow)?;
        }
        let limit = i128::from(i64::MAX);
        if magnitude > limit || lo < -limit || hi > limit {
            return Err(overflow());
        }
        Ok((lo as i64, hi as i64))
    }
}

/// Why [`AxisIndex::range_over`] could not give an index's range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeError {
    /// The symbol has no known range: it is neither a loop iterator nor a static symbol.
    Unbound(Symbol),
    /// Some value of the index, or of a partial sum of its terms, does not fit in an `i64`.
    Overflow {
        /// The index, printed.
        index: String,
    },
}

impl RangeError {
    /// The error for an access to `node` (a debug name) with this index, in `context`.
    pub fn into_error(self, node: &str, context: &str) -> Error {
        match self {
            RangeError::Unbound(s) => Error::StaticIndex {
                symbol: s.to_string(),
                detail: format!(
                    "{context}: an index of {node} uses it, but it is neither a loop iterator \
                     nor a static symbol with a range; pass it in the bindings"
                ),
            },
            RangeError::Overflow { index } => Error::IndexOutOfBounds {
                array: node.to_string(),
                problem: OutOfBounds::Overflow { index },
                during: context.to_string(),
            },
        }
    }
}

impl AxisIndex {
    /// Renders the index as an expression such as `i * 16 + j - 1`, largest coefficients
    /// first, naming symbols with `name` (which may refuse a symbol with an error).
    pub fn render_with<E>(
        &self,
        mut name: impl FnMut(Symbol) -> Result<String, E>,
    ) -> Result<String, E> {
        let (mut terms, offset) = self.terms();
        terms.sort_by_key(|(c, _)| std::cmp::Reverse(c.unsigned_abs()));
        let mut out = String::new();
        for (c, sym) in terms {
            let n = name(sym)?;
            let mag = c.unsigned_abs();
            let term = if mag == 1 { n } else { format!("{n} * {mag}") };
            let sign = match (out.is_empty(), c < 0) {
                (true, false) => "",
                (true, true) => "-",
                (false, false) => " + ",
                (false, true) => " - ",
            };
            out.push_str(sign);
            out.push_str(&term);
        }
        if out.is_empty() {
            return Ok(offset.to_string());
        }
        if offset != 0 {
            let sign = if offset > 0 { " + " } else { " - " };
            out.push_str(&format!("{sign}{}", offset.unsigned_abs()));
        }
        Ok(out)
    }
}

impl fmt::Display for AxisIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.render_with(|s| Ok::<_, std::convert::Infallible>(s.to_string()));
        f.write_str(&text.unwrap_or_else(|never| match never {}))
    }
}

/// How an assignment's iteration space maps onto its operands: the product space of
/// iterators, the index of the lhs and of each rhs as functions of those iterators.
#[derive(Clone, Debug, PartialEq)]
pub struct Projections {
    /// Extent of each iterator of the product space.
    pub product_space: Vec<usize>,
    /// The iterator symbol of each product-space axis.
    pub product_iterators: Vec<Symbol>,
    /// Logical dims of the lhs.
    pub lhs_dims: Vec<usize>,
    /// Logical dims of each rhs.
    pub rhs_dims: Vec<Vec<usize>>,
    /// Index of each lhs axis.
    pub project_lhs: Vec<AxisIndex>,
    /// Index of each axis of each rhs.
    pub project_rhs: Vec<Vec<AxisIndex>>,
    /// Conditions on the product space, affine functions of its iterators: a term is
    /// accumulated only where every guard is at least 0; the others are skipped, as if the
    /// product space left them out (a causal attention's `s ≤ t` is the guard `t - s`). An lhs
    /// element none of whose terms pass starts and stays at the neutral element (with
    /// `initialize_neutral`) or keeps its value. Empty: every term counts.
    pub guards: Vec<AxisIndex>,
    /// Where the projections came from, for messages (e.g. an einsum spec).
    pub debug_info: Arc<str>,
}

/// A guard of an einsum written with its letters: the terms where
/// `Σ coeff·letter + Σ coeff·static + offset` is negative are skipped (see
/// [`Projections::guards`]). Static symbols are bound per run, so one compiled routine can skip
/// a different part of the product space on every run (the keys a decoding step has not
/// written yet, say); the routine must then be compiled with them among its bindings.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct EinsumGuard {
    /// `(coefficient, letter)` pairs.
    pub terms: Vec<(i64, char)>,
    /// `(coefficient, static symbol)` pairs.
    pub statics: Vec<(i64, StaticSymbol)>,
    /// The constant term.
    pub offset: i64,
}

impl EinsumGuard {
    /// `earlier ≤ later + offset`: with `at_most('s', 't', 0)`, key position `s` at or before
    /// query position `t`, the mask of causal attention.
    pub fn at_most(earlier: char, later: char, offset: i64) -> EinsumGuard {
        EinsumGuard {
            terms: vec![(1, later), (-1, earlier)],
            statics: Vec::new(),
            offset,
        }
    }

    /// The guard with `coefficient · symbol` added: with
    /// `at_most('s', 't', 0).plus_static(1, &start)`, key `s` at or before query `t` counted
    /// from the run's `start` (the queries of a decoding step that begin at slot `start`).
    pub fn plus_static(mut self, coefficient: i64, symbol: &StaticSymbol) -> EinsumGuard {
        self.statics.push((coefficient, symbol.clone()));
        self
    }

    /// The letters it names.
    pub fn letters(&self) -> impl Iterator<Item = char> + '_ {
        self.terms.iter().map(|(_, c)| *c)
    }
}

impl fmt::Display for EinsumGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = self
            .terms
            .iter()
            .map(|(c, l)| (*c, l.to_string()))
            .chain(self.statics.iter().map(|(c, s)| (*c, s.name.clone())));
        let mut any = false;
        for (k, (c, l)) in named.enumerate() {
            any = true;
            let sign = match (k, c < 0) {
                (0, false) => "",
                (0, true) => "-",
                (_, false) => " + ",
                (_, true) => " - ",
            };
            match c.unsigned_abs() {
                1 => write!(f, "{sign}{l}")?,
                m => write!(f, "{sign}{m}{l}")?,
            }
        }
        match self.offset {
            0 if any => {}
            o if !any => write!(f, "{o}")?,
            o if o > 0 => write!(f, " + {o}")?,
            o => write!(f, " - {}", o.unsigned_abs())?,
        }
        f.write_str(" >= 0")
    }
}

impl Projections {
    /// Pointwise projections: the lhs and every rhs share `dims`, one iterator per axis.
    pub fn pointwise(dims: &[usize], num_rhs: usize) -> Projections {
        let its: Vec<Symbol> = dims.iter().map(|_| Symbol::fresh()).collect();
        let idx: Vec<AxisIndex> = its.iter().map(|&s| AxisIndex::Iterator(s)).collect();
        Projections {
            product_space: dims.to_vec(),
            product_iterators: its,
            lhs_dims: dims.to_vec(),
            rhs_dims: vec![dims.to_vec(); num_rhs],
            project_lhs: idx.clone(),
            project_rhs: vec![idx; num_rhs],
            guards: Vec::new(),
            debug_info: format!("pointwise {dims:?}").into(),
        }
    }

    /// Projections from an einsum-like spec such as `"ik,kj->ij"` (one letter per axis; a
    /// scalar operand is written as an empty string, e.g. `",i->i"`). Letters shared between
    /// operands must agree in size, except that an rhs axis of size 1 broadcasts (it is indexed
    /// at 0). Letters missing from the lhs are reduced over.
    pub fn einsum(spec: &str, lhs_dims: &[usize], rhs_dims: &[&[usize]]) -> Result<Projections> {
        Projections::einsum_impl(spec, lhs_dims, rhs_dims, false, &[])
    }

    /// [`Projections::einsum`] with `guards`, written with the spec's letters, as its
    /// [`Projections::guards`]. Every letter of a guard must be a letter of the spec.
    pub fn einsum_guarded(
        spec: &str,
        lhs_dims: &[usize],
        rhs_dims: &[&[usize]],
        guards: &[EinsumGuard],
    ) -> Result<Projections> {
        Projections::einsum_impl(spec, lhs_dims, rhs_dims, false, guards)
    }

    /// Like [`Projections::einsum`], but a result axis of size 1 may also meet a larger axis
    /// of an operand: it is indexed at 0, so the operand's values along that axis are
    /// accumulated into it (how gradients flow back to a broadcast operand).
    pub fn einsum_reduce_into(
        spec: &str,
        lhs_dims: &[usize],
        rhs_dims: &[&[usize]],
    ) -> Result<Projections> {
        Projections::einsum_impl(spec, lhs_dims, rhs_dims, true, &[])
    }

    fn einsum_impl(
        spec: &str,
        lhs_dims: &[usize],
        rhs_dims: &[&[usize]],
        lhs_broadcasts: bool,
        guards: &[EinsumGuard],
    ) -> Result<Projections> {
        let bad = |detail: String| Error::ShapeMismatch {
            op: format!("einsum {spec:?}"),
            shapes: vec![],
            detail,
        };
        let (rhs_spec, lhs_spec) = spec
            .split_once("->")
            .ok_or_else(|| bad("the spec needs `->` between the operands and the result".into()))?;
        let rhs_specs: Vec<&str> = rhs_spec.split(',').map(str::trim).collect();
        let lhs_spec = lhs_spec.trim();
        if rhs_specs.len() != rhs_dims.len() {
            return Err(bad(format!(
                "the spec names {} operand(s) but {} were given",
                rhs_specs.len(),
                rhs_dims.len()
            )));
        }
        let mut letters: Vec<char> = Vec::new();
        let mut extents: HashMap<char, usize> = HashMap::new();
        let mut record = |c: char, d: usize, who: &str, broadcastable: bool| -> Result<()> {
            if !c.is_ascii_alphabetic() {
                return Err(bad(format!("{c:?} in {who} is not an axis letter")));
            }
            match extents.get(&c) {
                None => {
                    letters.push(c);
                    extents.insert(c, d);
                }
                Some(&e) if e == d || (broadcastable && d == 1) => {}
                Some(&1) if letters.contains(&c) => {
                    extents.insert(c, d);
                }
                Some(&e) => {
                    return Err(bad(format!(
                        "axis {c:?} has size {e} elsewhere but {d} in {who}"
                    )));
                }
            }
            Ok(())
        };
        let check_arity = |s: &str, dims: &[usize], who: &str| -> Result<()> {
            if s.chars().count() != dims.len() {
                return Err(bad(format!(
                    "{who} is {s:?} ({} axes) but has dims {dims:?}",
                    s.chars().count()
                )));
            }
            Ok(())
        };
        check_arity(lhs_spec, lhs_dims, "the result")?;
        for (c, &d) in lhs_spec.chars().zip(lhs_dims) {
            record(c, d, "the result", lhs_broadcasts)?;
        }
        for (k, (s, dims)) in rhs_specs.iter().zip(rhs_dims).enumerate() {
            let who = format!("operand {k}");
            check_arity(s, dims, &who)?;
            for (c, &d) in s.chars().zip(dims.iter()) {
                record(c, d, &who, true)?;
            }
        }
        if !lhs_broadcasts {
            for (c, &d) in lhs_spec.chars().zip(lhs_dims) {
                if extents[&c] != d {
                    return Err(bad(format!(
                        "the result's axis {c:?} has size {d} but the operands give it size {}",
                        extents[&c]
                    )));
                }
            }
        }
        let syms: HashMap<char, Symbol> = letters.iter().map(|&c| (c, Symbol::fresh())).collect();
        let project = |s: &str, dims: &[usize]| -> Vec<AxisIndex> {
            s.chars()
                .zip(dims)
                .map(|(c, &d)| {
                    if d == 1 && extents[&c] != 1 {
                        AxisIndex::Fixed(0)
                    } else {
                        AxisIndex::Iterator(syms[&c])
                    }
                })
                .collect()
        };
        let guard_indices = guards
            .iter()
            .map(|g| {
                let terms = g
                    .terms
                    .iter()
                    .map(|&(c, l)| match syms.get(&l) {
                        Some(&s) => Ok((c, s)),
                        None => Err(bad(format!(
                            "the guard {g} names {l:?}, which is not a letter of the spec"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let statics = g.statics.iter().map(|(c, s)| (*c, s.symbol));
                Ok(AxisIndex::affine(
                    terms.into_iter().chain(statics),
                    g.offset,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut debug_info = format!("einsum {spec}");
        if !guards.is_empty() {
            let text: Vec<String> = guards.iter().map(|g| g.to_string()).collect();
            debug_info = format!("{debug_info} where {}", text.join(", "));
        }
        Ok(Projections {
            product_space: letters.iter().map(|c| extents[c]).collect(),
            product_iterators: letters.iter().map(|c| syms[c]).collect(),
            lhs_dims: lhs_dims.to_vec(),
            rhs_dims: rhs_dims.iter().map(|d| d.to_vec()).collect(),
            project_lhs: project(lhs_spec, lhs_dims),
            project_rhs: rhs_specs
                .iter()
                .zip(rhs_dims)
                .map(|(s, d)| project(s, d))
                .collect(),
            guards: guard_indices,
            debug_info: debug_info.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_normalizes_and_substitutes() {
        let (a, b) = (Symbol::fresh(), Symbol::fresh());
        assert_eq!(
            AxisIndex::affine([(1, a), (0, b)], 0),
            AxisIndex::Iterator(a)
        );
        assert_eq!(AxisIndex::affine([(2, a), (-2, a)], 3), AxisIndex::Fixed(3));
        let idx = AxisIndex::affine([(2, a), (1, b)], -1);
        let subst = HashMap::from([(a, AxisIndex::Fixed(4))]);
        assert_eq!(idx.substitute(&subst), AxisIndex::affine([(1, b)], 7));
        assert_eq!(idx.value_range(&|_| Some(3)), Ok((-1, 5)));
        assert_eq!(idx.eval(&|s| Some(if s == a { 1 } else { 2 })), Some(3));
    }

    #[test]
    fn einsum_matmul_and_broadcast() {
        let p = Projections::einsum("ik,kj->ij", &[2, 4], &[&[2, 3], &[3, 4]]).unwrap();
        assert_eq!(p.product_space, vec![2, 4, 3]);
        let q = Projections::einsum("ij,j->ij", &[2, 3], &[&[2, 3], &[1]]).unwrap();
        assert_eq!(q.project_rhs[1], vec![AxisIndex::Fixed(0)]);
        assert!(Projections::einsum("ik,kj->ij", &[2, 4], &[&[2, 3], &[5, 4]]).is_err());
        assert!(Projections::einsum("ik,kj", &[2, 4], &[&[2, 3], &[3, 4]]).is_err());
        assert!(Projections::einsum("ik->i", &[2], &[&[2, 3, 1]]).is_err());
    }
}

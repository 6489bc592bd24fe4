//! Contractions: recognizing a statement that is a matrix product ([`Contraction`], with
//! [`scheduled_product`] deciding whether a schedule runs it as one), and the product's plan
//! in the product's own terms ([`Gemm`]: batch, rows, columns, depth with their strides, the
//! blocking, a guard, a factor widened as read, how a batch splits over workers).

use std::fmt;

use super::{Blocking, ScheduleSettings};
use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::ops::{BinOp, TernOp};
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

/// A node's access in a contraction: per axis, the loop iterator indexing it, or `None` for an
/// axis of size 1 read at index 0 (a loop of one iteration, which simplification removes, as a
/// batch of 1 lowers).
#[derive(Clone, Debug, PartialEq)]
pub struct Access {
    /// The node.
    pub node: Tnode,
    /// The iterator of each axis.
    pub iters: Vec<Option<Symbol>>,
}

impl Access {
    /// The element stride of iterator `s` in this access (0 if it does not index the node).
    /// Nodes in contractions are unpadded, so storage is row-major over the logical dims.
    pub fn stride(&self, s: Symbol) -> usize {
        let dims = self.node.dims();
        self.iters
            .iter()
            .enumerate()
            .filter(|(_, it)| **it == Some(s))
            .map(|(axis, _)| dims[axis + 1..].iter().product::<usize>())
            .sum()
    }

    /// Whether iterator `s` indexes the node.
    fn uses(&self, s: Symbol) -> bool {
        self.iters.contains(&Some(s))
    }

    /// The iterators indexing the node, in axis order.
    fn looped(&self) -> impl Iterator<Item = Symbol> + '_ {
        self.iters.iter().flatten().copied()
    }
}

/// A loop nest of shape `out[o] = out[o] + lhs[l] * rhs[r]` (or the fused multiply-add form)
/// over loops starting at 0, every index a plain iterator (or 0 on an axis of size 1); with
/// guards ([`arrayjit_ir::indexing::Projections::guards`]) as their lowering writes them,
/// `out[o] = where(g < 0, out[o], out[o] + lhs[l] * rhs[r])`, a term counting only where every
/// guard `g` is at least 0.
#[derive(Clone, Debug, PartialEq)]
pub struct Contraction {
    /// The loops, outermost first: iterator and extent.
    pub loops: Vec<(Symbol, usize)>,
    /// The accumulated node.
    pub out: Access,
    /// The left factor.
    pub lhs: Access,
    /// The right factor.
    pub rhs: Access,
    /// The guards, affine in the loops' iterators (empty: every term counts).
    pub guards: Vec<AxisIndex>,
}

/// Per axis of `node`: the iterator indexing it, or `None` for index 0 on an axis of size 1;
/// `None` overall for any other index.
fn plain_iters(node: &Tnode, idcs: &[AxisIndex]) -> Option<Vec<Option<Symbol>>> {
    idcs.iter()
        .zip(node.dims())
        .map(|(i, &d)| match i {
            AxisIndex::Iterator(s) => Some(Some(*s)),
            AxisIndex::Fixed(0) if d == 1 => Some(None),
            _ => None,
        })
        .collect()
}

fn get(e: &ScalarExpr) -> Option<Access> {
    match e {
        ScalarExpr::Get(node, idcs) => Some(Access {
            node: node.clone(),
            iters: plain_iters(node, idcs)?,
        }),
        _ => None,
    }
}

/// The contraction `stmt` is, where the schedule runs it as a matrix product (blocked on a
/// CPU, tiled on a GPU): contractions are enabled, it has at least
/// [`ScheduleSettings::min_contraction_flops`], and its precisions suit the device — `f32` or
/// `f64` throughout, or on a GPU with matrix units also 16-bit factors
/// ([`Contraction::detect_for_matrix_units`]). The optimizer keeps such a node as an array
/// (never inlined into its consumer) and such a nest out of loop fusion.
///
/// A guarded contraction ([`Contraction::detect_guarded`]) is a product too: on a CPU the
/// blocked product skips the register tiles and depths its guard rules out, on a GPU the
/// tiled `f32` product skips the depth steps and checks each term only in the steps where the
/// guard fails for some of a group's results (never on the matrix units).
pub fn scheduled_product(stmt: &LowLevel, settings: &ScheduleSettings) -> Option<Contraction> {
    if !settings.enable_contractions {
        return None;
    }
    let c = match settings.gpu {
        Some(g) if g.matrix_units => {
            Contraction::detect_for_matrix_units(stmt).or_else(|| Contraction::detect_guarded(stmt))
        }
        _ => Contraction::detect_guarded(stmt),
    }?;
    (c.flops() >= settings.min_contraction_flops).then_some(c)
}

impl Contraction {
    /// Recognizes a contraction-shaped statement. Nodes must share one floating precision (or,
    /// unguarded, be `f32` but for one `bf16` factor) and be unpadded; the result's iterators must be distinct; every loop iterator must index the
    /// result or both factors (an iterator reducing one factor alone is not a contraction).
    pub fn detect(stmt: &LowLevel) -> Option<Contraction> {
        Contraction::detect_with(stmt, false, false)
    }

    /// Recognizes a contraction-shaped statement as [`Contraction::detect`] does, but also one
    /// with guards (see [`Contraction`]).
    pub fn detect_guarded(stmt: &LowLevel) -> Option<Contraction> {
        Contraction::detect_with(stmt, false, true)
    }

    /// Recognizes a contraction-shaped statement as [`Contraction::detect`] does, but also one
    /// whose factors share a 16-bit float precision (`bf16`, `f16`) and whose result is in it
    /// or in `f32`: the products a GPU's matrix units multiply.
    pub fn detect_for_matrix_units(stmt: &LowLevel) -> Option<Contraction> {
        Contraction::detect_with(stmt, true, false)
    }

    fn detect_with(stmt: &LowLevel, half_factors: bool, guarded: bool) -> Option<Contraction> {
        let (nest, s) = stmt.perfect_nest();
        let loops = nest
            .into_iter()
            .map(|(it, from, to)| (from == 0 && to > 0).then_some((it, to as usize)))
            .collect::<Option<Vec<_>>>()?;
        let LowLevel::Set { tn, idcs, value } = s else {
            return None;
        };
        let out = Access {
            node: tn.clone(),
            iters: plain_iters(tn, idcs)?,
        };
        let is_out = |e: &ScalarExpr| get(e).is_some_and(|a| a == out);
        // `where(g < 0, out, ...)` per guard, outermost first.
        let mut guards = Vec::new();
        let mut value = value;
        while let ScalarExpr::Ternop(TernOp::Where, skip, kept, inner) = value {
            let ScalarExpr::Binop(BinOp::Cmplt, g, zero) = &**skip else {
                return None;
            };
            match (&**g, &**zero) {
                (ScalarExpr::EmbedIndex(g), ScalarExpr::Constant(z))
                    if guarded && *z == 0.0 && is_out(kept) =>
                {
                    guards.push(g.clone());
                }
                _ => return None,
            }
            value = inner;
        }
        let (lhs, rhs) = match value {
            ScalarExpr::Ternop(TernOp::Fma, a, b, c) if is_out(c) => (get(a)?, get(b)?),
            ScalarExpr::Binop(BinOp::Add, x, y) => {
                let (acc, prod) = if is_out(x) { (x, y) } else { (y, x) };
                if !is_out(acc) {
                    return None;
                }
                match &**prod {
                    ScalarExpr::Binop(BinOp::Mul, a, b) => (get(a)?, get(b)?),
                    _ => return None,
                }
            }
            _ => return None,
        };
        let c = Contraction {
            loops,
            out,
            lhs,
            rhs,
            guards,
        };
        c.well_formed(half_factors).then_some(c)
    }

    /// Whether the nodes' precisions fit a product: one float precision (`f32`, `f64`); or,
    /// without guards and not for matrix units, an `f32` result and factor with the other factor in `bf16` (a weight
    /// stored in `bf16`, widened as it is read: see [`Gemm::widened_factor`]); or where
    /// `half_factors`, factors of one 16-bit float precision into a result of it or `f32`.
    fn precisions_fit(&self, half_factors: bool) -> bool {
        let (out, lhs, rhs) = (
            self.out.node.prec(),
            self.lhs.node.prec(),
            self.rhs.node.prec(),
        );
        let uniform = lhs == out && rhs == out;
        // Not for matrix units, whose fragments take two factors of one 16-bit precision.
        let widened = !half_factors
            && out == Prec::F32
            && self.guards.is_empty()
            && matches!(
                (lhs, rhs),
                (Prec::F32, Prec::Bf16) | (Prec::Bf16, Prec::F32)
            );
        (uniform && matches!(out, Prec::F32 | Prec::F64))
            || widened
            || (half_factors
                && lhs == rhs
                && matches!(lhs, Prec::Bf16 | Prec::F16)
                && (out == lhs || out == Prec::F32))
    }

    fn well_formed(&self, half_factors: bool) -> bool {
        let nodes = [&self.out, &self.lhs, &self.rhs];
        if !self.precisions_fit(half_factors)
            || nodes.iter().any(|a| a.node.padding().is_some())
            || self.lhs.node == self.out.node
            || self.rhs.node == self.out.node
        {
            return false;
        }
        let looped = |s: Symbol| self.loops.iter().any(|(l, _)| *l == s);
        let all_looped = nodes.iter().all(|a| a.looped().all(looped));
        // Iterators may index one node twice (a diagonal): not a plain matrix product.
        let distinct = |a: &Access| {
            let mut v: Vec<Symbol> = a.looped().collect();
            let n = v.len();
            v.sort();
            v.dedup();
            v.len() == n
        };
        // A guard's symbols that no loop of the nest binds are static indices (lowering
        // accepts no others): they shift the guard's offset at run time.
        all_looped
            && distinct(&self.out)
            && distinct(&self.lhs)
            && distinct(&self.rhs)
            && self.loops.iter().all(|&(s, _)| {
                let (o, l, r) = (self.out.uses(s), self.lhs.uses(s), self.rhs.uses(s));
                o || (l && r)
            })
    }

    fn extent(&self, s: Symbol) -> usize {
        self.loops
            .iter()
            .find(|(l, _)| *l == s)
            .map_or(1, |(_, e)| *e)
    }

    /// The iterators of a role, outermost loop first.
    fn role(&self, in_out: bool, in_lhs: bool, in_rhs: bool) -> Vec<Symbol> {
        self.loops
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| {
                self.out.uses(*s) == in_out
                    && self.lhs.uses(*s) == in_lhs
                    && self.rhs.uses(*s) == in_rhs
            })
            .collect()
    }

    /// Floating-point operations of the nest.
    pub fn flops(&self) -> f64 {
        2.0 * self.loops.iter().map(|(_, e)| *e as f64).product::<f64>()
    }

    /// The matrix-product plan: each role's iterators merged into one dimension where the
    /// strides allow (e.g. `n, h` of a `[n, h, c]` input), the rest as batch loops.
    pub fn gemm(&self, blocking: Blocking) -> Option<Gemm> {
        let accesses = [&self.out, &self.lhs, &self.rhs];
        let merge = |iters: Vec<Symbol>| -> Vec<Dim> {
            let mut groups: Vec<Dim> = Vec::new();
            // Innermost (smallest stride in the result or the factor holding it) last.
            let mut iters = iters;
            iters.sort_by_key(|s| {
                std::cmp::Reverse(
                    accesses
                        .iter()
                        .map(|a| a.stride(*s))
                        .find(|&st| st > 0)
                        .unwrap_or(0),
                )
            });
            for s in iters {
                let dim = Dim {
                    extent: self.extent(s),
                    strides: accesses.map(|a| a.stride(s)),
                };
                match groups.last_mut() {
                    Some(outer)
                        if (0..3).all(|t| {
                            outer.strides[t] == dim.strides[t] * dim.extent
                                || (outer.strides[t] == 0 && dim.strides[t] == 0)
                        }) =>
                    {
                        outer.extent *= dim.extent;
                        outer.strides = dim.strides;
                    }
                    _ => groups.push(dim),
                }
            }
            groups
        };
        let mut batch = merge(self.role(true, true, true));
        let split = |groups: Vec<Dim>, batch: &mut Vec<Dim>| -> Dim {
            let mut groups = groups;
            let inner = groups.pop().unwrap_or(Dim {
                extent: 1,
                strides: [0; 3],
            });
            batch.extend(groups);
            inner
        };
        let m = split(merge(self.role(true, true, false)), &mut batch);
        let n = split(merge(self.role(true, false, true)), &mut batch);
        let k_groups = merge(self.role(false, true, true));
        if k_groups.len() > 1 {
            // A reduction over several unmergeable axes: the blocked product would need a sum
            // over its own loops; keep the loops.
            return None;
        }
        let k = k_groups.into_iter().next()?;
        let (guard, guard_statics) = match self.guards.as_slice() {
            [] => (None, Vec::new()),
            [g] => {
                let (guard, statics) = self.gemm_guard(g, [&m, &n, &k])?;
                (Some(guard), statics)
            }
            _ => return None,
        };
        let (lhs_prec, rhs_prec) = (self.lhs.node.prec(), self.rhs.node.prec());
        Some(Gemm {
            // A factor widened as read multiplies in the result's precision.
            prec: if lhs_prec == rhs_prec {
                lhs_prec
            } else {
                self.out.node.prec()
            },
            out: self.out.node.clone(),
            lhs: self.lhs.node.clone(),
            rhs: self.rhs.node.clone(),
            batch,
            m,
            n,
            k,
            blocking,
            guard,
            guard_statics,
            overwrite: false,
            batch_split: BatchSplit::ByProduct,
            covers_out: self
                .out
                .iters
                .iter()
                .zip(self.out.node.dims())
                .all(|(it, &d)| it.map_or(1, |s| self.extent(s)) == d),
        })
    }
}

impl Contraction {
    /// A guard in the product's coordinates (see [`Gemm::guard`]): each of its iterators must
    /// be the whole of the rows, the columns or the reduction, with a coefficient of 1 or -1;
    /// its static indices go to [`Gemm::guard_statics`].
    fn gemm_guard(&self, g: &AxisIndex, mnk: [&Dim; 3]) -> Option<GemmGuard> {
        let (terms, offset) = g.terms();
        let mut coeffs = [0i64; 4];
        coeffs[3] = offset;
        let mut statics = Vec::new();
        for (c, s) in terms {
            if !self.loops.iter().any(|(l, _)| *l == s) {
                statics.push((c, s));
                continue;
            }
            let dim = Dim {
                extent: self.extent(s),
                strides: [&self.out, &self.lhs, &self.rhs].map(|a| a.stride(s)),
            };
            let axis = mnk.iter().position(|d| **d == dim)?;
            if !(c == 1 || c == -1) || coeffs[axis] != 0 {
                return None;
            }
            coeffs[axis] = c;
        }
        Some((coeffs, statics))
    }
}

/// A guard in a product's coordinates, `[gi, gj, gk, g0]`, and the static indices added to
/// `g0` at run time (see [`Gemm::guard`], [`Gemm::guard_statics`]).
type GemmGuard = ([i64; 4], Vec<(i64, Symbol)>);

/// One dimension of a matrix product: its extent and element strides in (out, lhs, rhs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim {
    /// Number of indices.
    pub extent: usize,
    /// Element stride in the result, the left factor and the right factor (0 where absent).
    pub strides: [usize; 3],
}

/// A blocked matrix product per batch element: `out[b, m, n] += lhs[b, m, k] · rhs[b, k, n]`
/// over general strides.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// The factors' precision: that of the result too, except in a product for a GPU's matrix
    /// units ([`Contraction::detect_for_matrix_units`]), whose 16-bit factors may accumulate
    /// into an `f32` result. In a product with a factor widened as read
    /// ([`Gemm::widened_factor`]), the precision the product multiplies in (the result's).
    pub prec: Prec,
    /// The result.
    pub out: Tnode,
    /// The left factor.
    pub lhs: Tnode,
    /// The right factor.
    pub rhs: Tnode,
    /// Batch loops around the product (outermost first).
    pub batch: Vec<Dim>,
    /// Rows.
    pub m: Dim,
    /// Columns.
    pub n: Dim,
    /// Reduction.
    pub k: Dim,
    /// Cache and register blocking.
    pub blocking: Blocking,
    /// The guard `[gi, gj, gk, g0]`: the term `lhs[b, i, k] · rhs[b, k, j]` counts only where
    /// `gi·i + gj·j + gk·k + g0 ≥ 0` (each coefficient -1, 0 or 1). The product skips the
    /// register tiles and depths where it fails for every element, and checks it element by
    /// element only where it passes for some (a band along the diagonal). `None`: every term
    /// counts.
    pub guard: Option<[i64; 4]>,
    /// Static indices added to the guard's offset `g0` at run time, `(coefficient, symbol)`
    /// (the slots a decoding step sees end at its `start`). Only the CPU's product helper
    /// takes them; [`Gemm::kept_fraction`] counts them as 0.
    pub guard_statics: Vec<(i64, Symbol)>,
    /// The product writes every element of the result instead of adding to it: the zeroing
    /// statement before it was absorbed (see [`super::ScheduleKind::Absorbed`]).
    pub overwrite: bool,
    /// Every axis of the result is indexed by a loop covering it entirely (so the product
    /// writes every element).
    pub covers_out: bool,
    /// How a batch of products is spread over the device's workers. Batch elements write
    /// disjoint parts of the result, and each is computed the same way wherever it runs, so
    /// the choice never changes a result.
    pub batch_split: BatchSplit,
}

/// How the products of a batch ([`Gemm::batch`]) are spread over a CPU device's workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchSplit {
    /// One product after another on the calling thread, each splitting itself over the
    /// workers where it is large enough (the product helper splits rows or columns).
    ByProduct,
    /// The batch elements split over the workers, each product on one worker: for a batch of
    /// products each too small to split itself, whose whole is large.
    ByBatch,
    /// Decided at run time from the number of workers: by batch element when every worker
    /// gets whole products in even shares (at least one per worker, and the count a multiple
    /// of the workers or at least [`BATCH_SPLIT_MIN_PER_WORKER`] per worker), otherwise
    /// [`BatchSplit::ByProduct`]. For a batch of products large enough to split themselves:
    /// splitting each one makes every worker pack the factor it shares with the others and
    /// meet at a barrier per product (on a 2-core VM the attention's 64 products of
    /// 128 × 128 × 64 scaled 1.4–1.6× from 1 to 2 workers that way, 1.8–1.9× by batch).
    ByBatchWhenEven,
}

/// Products per worker from which a batch is split by element even when its count is not a
/// multiple of the workers (one worker then runs at most 1 in 4 more than another).
pub const BATCH_SPLIT_MIN_PER_WORKER: usize = 4;

/// Which factor of a product is stored narrower than the product multiplies
/// ([`Gemm::widened_factor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorSide {
    /// The left factor (`lhs`).
    Lhs,
    /// The right factor (`rhs`).
    Rhs,
}

impl Gemm {
    /// The factor stored in a narrower precision than the product multiplies in (a `bf16`
    /// weight times `f32` activations into an `f32` result), with its precision: the CPU's
    /// product helper widens it as it reads it, so the product reads half the bytes of an
    /// `f32` weight (what a decoding step, which reads every weight once, is bound by). GPU
    /// passes do not take such products (they run as loops there). `None` when both
    /// factors are in [`Gemm::prec`] (or both in the 16-bit precision of matrix units).
    pub fn widened_factor(&self) -> Option<(FactorSide, Prec)> {
        let (l, r) = (self.lhs.prec(), self.rhs.prec());
        if l == r {
            None
        } else if l != self.prec {
            Some((FactorSide::Lhs, l))
        } else {
            Some((FactorSide::Rhs, r))
        }
    }
}

impl Gemm {
    /// Whether one product's `M × N` (each capped at the register tile's side) is at least
    /// the tile's shorter side. Below that — a batch of dot products (`M = N = 1`), tiny
    /// products — nearly all of the micro-kernel's work is on zero padding and the packing
    /// costs more than the product: measured on the GPT step, the 4096 dot products of 64
    /// elements of a softmax backward and the layer-norm gain gradients (128 dot products of
    /// 1024) took 29% of the step as blocked products. A matrix-vector product (`M = 1` or
    /// `N = 1` with the other side large) still packs its matrix in one pass and stays blocked.
    pub fn fills_register_tile(&self) -> bool {
        let b = &self.blocking;
        self.m.extent.min(b.mr) * self.n.extent.min(b.nr) >= b.mr.min(b.nr)
    }
}

impl Gemm {
    /// Floating-point operations of the product: 2 per multiply-add of every term its guard
    /// keeps.
    pub fn flops(&self) -> u64 {
        let batch: usize = self.batch.iter().map(|d| d.extent).product();
        let terms = (batch * self.m.extent * self.n.extent * self.k.extent) as f64;
        (2.0 * terms * self.kept_fraction()).round() as u64
    }

    /// The share of the product's terms its guard keeps (1 without one): exact up to 2²²
    /// row-column pairs, else counted on an even grid of that many, each pair's depths counted
    /// exactly.
    pub fn kept_fraction(&self) -> f64 {
        let Some([gi, gj, gk, g0]) = self.guard else {
            return 1.0;
        };
        let (m, n, k) = (
            self.m.extent as i64,
            self.n.extent as i64,
            self.k.extent as i64,
        );
        if m == 0 || n == 0 || k == 0 {
            return 1.0;
        }
        const SIDE: i64 = 2048;
        let (si, sj) = ((m / SIDE).max(1), (n / SIDE).max(1));
        let (mut kept, mut total) = (0i64, 0i64);
        for i in (0..m).step_by(si as usize) {
            for j in (0..n).step_by(sj as usize) {
                let rest = gi * i + gj * j + g0;
                // Depths d in 0..k with rest + gk · d ≥ 0.
                let depths = match gk {
                    0 if rest >= 0 => k,
                    0 => 0,
                    1.. => (k - (-rest).max(0)).clamp(0, k),
                    _ => (rest + 1).clamp(0, k),
                };
                kept += depths;
                total += k;
            }
        }
        kept as f64 / total as f64
    }

    /// The guard in words, `terms where i - k >= 0` (`i` a row, `j` a column, `k` a depth).
    pub fn guard_text(&self) -> Option<String> {
        let [gi, gj, gk, g0] = self.guard?;
        let guard = AxisIndex::affine([(gi, Symbol(1)), (gj, Symbol(2)), (gk, Symbol(3))], g0);
        let text = guard
            .render_with(|s| Ok::<_, fmt::Error>(["i", "j", "k"][s.0 - 1].to_string()))
            .ok()?;
        Some(format!("terms where {text} >= 0"))
    }
}

impl fmt::Display for Gemm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.blocking;
        write!(
            f,
            "contraction {} += {} · {}: {} batch loop(s){}, M {} N {} K {}, register tile {}×{}, blocks mc {} kc {} nc {}",
            self.out.label().join("."),
            self.lhs.label().join("."),
            self.rhs.label().join("."),
            self.batch.len(),
            match self.batch_split {
                BatchSplit::ByProduct => "",
                BatchSplit::ByBatch => " split over the workers",
                BatchSplit::ByBatchWhenEven => " split over the workers when they divide it evenly",
            },
            self.m.extent,
            self.n.extent,
            self.k.extent,
            b.mr,
            b.nr,
            b.mc,
            b.kc,
            b.nc
        )?;
        if let Some(text) = self.guard_text() {
            write!(f, ", {text}")?;
        }
        if let Some((side, prec)) = self.widened_factor() {
            let which = match side {
                FactorSide::Lhs => "left",
                FactorSide::Rhs => "right",
            };
            write!(f, ", {which} factor in {} widened as read", prec.name())?;
        }
        Ok(())
    }
}

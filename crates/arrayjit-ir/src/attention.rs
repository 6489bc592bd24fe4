//! Fused (flash) attention as one operation of the IR: `softmax(scale · q·kᵀ) · v` computed
//! row by row with an online softmax (a running maximum, a running sum and an accumulator
//! rescaled as the maximum grows: FlashAttention's recurrence), so the `[queries, keys]`
//! scores never exist as an array. The backward pass recomputes each score from the saved
//! row log-sum-exp (FlashAttention-2's backward) in two passes: one per query row for the
//! query gradient, one per key for the key and value gradients.
//!
//! The operation lowers to plain loops of the loop IR ([`AttentionOp::lower`]): that lowering
//! is its meaning. The interpreter runs it, and every backend renders it like any other loop
//! nest, so the shared differential corpus checks the operation on every backend. Its state
//! (running maximum, sum, the current key's weight) lives in small per-row arrays
//! (`[batch, heads, rows]`), never in a `[rows, keys]` one. `docs/attention.md` gives the
//! reasons for this shape and what comes next (schedules that run the block products on the
//! CPU's micro-kernels and a GPU's matrix units).

use std::sync::{Arc, Mutex, Weak};

use crate::assignments::check_access;
use crate::error::{Error, Result};
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr, ScopeId};
use crate::memory::MemoryMode;
use crate::ops::{BinOp, TernOp, UnOp};
use crate::prec::Prec;
use crate::tnode::Tnode;

/// Where the axes of the query, key, value and output arrays are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionLayout {
    /// `[batch, heads, time, features]` (PyTorch's `scaled_dot_product_attention`).
    HeadsFirst,
    /// `[batch, time, heads, features]` (what a projection `btd,dhe->bthe` gives).
    TimeFirst,
}

/// Dropout on the attention weights, drawn from the counter-based generator exactly as
/// [`crate::FetchOp::Random`] would fill a `[batch, heads, queries, keys]` array: the weight of
/// query `t` on key `s` is dropped where the uniform draw at position
/// `((b·heads + h)·queries + t)·keys + s` is below `p`, and kept ones are scaled by
/// `1 / (1 - p)`. The forward and backward passes recompute the same draws; no mask is stored.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionDropout {
    /// The probability of dropping a weight, in `[0, 1]`.
    pub p: f64,
    /// The generator's key.
    pub seed: u64,
    /// The generator's stream (one per draw of a random stream).
    pub stream: u32,
    /// The one-element `u32` node holding the step, read at run time.
    pub step: Tnode,
}

/// What an attention computes: `softmax(scale · q·kᵀ [masked]) · v` per batch element and head.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Queries: `[batch, heads, queries, features]` in [`AttentionSpec::layout`].
    pub q: Tnode,
    /// Keys: `[batch, heads, keys, features]`.
    pub k: Tnode,
    /// Values: `[batch, heads, keys, value_features]`.
    pub v: Tnode,
    /// The axis order of `q`, `k`, `v` and the output.
    pub layout: AttentionLayout,
    /// Query `t` sees key `s` only where `s ≤ t` (top-left aligned, as PyTorch's `is_causal`).
    pub causal: bool,
    /// The factor of the scores (usually `1 / √features`).
    pub scale: f64,
    /// Dropout on the weights, if any.
    pub dropout: Option<AttentionDropout>,
}

/// The sizes of an attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch elements.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Query rows.
    pub queries: usize,
    /// Keys (and values).
    pub keys: usize,
    /// Features of a query and a key.
    pub features: usize,
    /// Features of a value (and of the output).
    pub value_features: usize,
}

impl AttentionLayout {
    /// `[batch, heads, time, features]` in this layout's order.
    pub fn order(self, batch: usize, heads: usize, time: usize, features: usize) -> Vec<usize> {
        match self {
            AttentionLayout::HeadsFirst => vec![batch, heads, time, features],
            AttentionLayout::TimeFirst => vec![batch, time, heads, features],
        }
    }

    fn index(self, b: Symbol, h: Symbol, time: Symbol, f: Symbol) -> Vec<AxisIndex> {
        self.order_idx(
            AxisIndex::Iterator(b),
            AxisIndex::Iterator(h),
            AxisIndex::Iterator(time),
            AxisIndex::Iterator(f),
        )
    }

    fn order_idx(self, b: AxisIndex, h: AxisIndex, t: AxisIndex, f: AxisIndex) -> Vec<AxisIndex> {
        match self {
            AttentionLayout::HeadsFirst => vec![b, h, t, f],
            AttentionLayout::TimeFirst => vec![b, t, h, f],
        }
    }

    /// `(batch, heads, time, features)` of `dims` in this layout.
    fn split(self, dims: &[usize]) -> (usize, usize, usize, usize) {
        match self {
            AttentionLayout::HeadsFirst => (dims[0], dims[1], dims[2], dims[3]),
            AttentionLayout::TimeFirst => (dims[0], dims[2], dims[1], dims[3]),
        }
    }
}

const OP: &str = "scaled_dot_product_attention";

impl AttentionSpec {
    /// Checks the shapes and settings: `q`, `k`, `v` of rank 4 in `layout`, the same batch and
    /// heads, `k` and `v` the same keys, `q` and `k` the same features, no empty axis, float
    /// precisions, a finite scale, a dropout probability in `[0, 1]` with a one-element step.
    pub fn new(
        q: &Tnode,
        k: &Tnode,
        v: &Tnode,
        layout: AttentionLayout,
        causal: bool,
        scale: f64,
        dropout: Option<AttentionDropout>,
    ) -> Result<AttentionSpec> {
        let names = ["query", "key", "value"];
        let shapes = [q.dims(), k.dims(), v.dims()];
        let layout_text = match layout {
            AttentionLayout::HeadsFirst => "[batch, heads, time, features]",
            AttentionLayout::TimeFirst => "[batch, time, heads, features]",
        };
        for (name, (node, dims)) in names.iter().zip([q, k, v].iter().zip(shapes)) {
            if dims.len() != 4 {
                return Err(Error::shape_mismatch(
                    OP,
                    &shapes,
                    format!(
                        "the {name} {} must be {layout_text}, but has dims {dims:?}",
                        node.debug_name()
                    ),
                ));
            }
            if dims.contains(&0) {
                return Err(Error::shape_mismatch(
                    OP,
                    &shapes,
                    format!(
                        "the {name} {} has an empty axis (dims {dims:?}); attention needs at \
                         least one of everything",
                        node.debug_name()
                    ),
                ));
            }
            if !node.prec().is_float() {
                return Err(Error::BadValue {
                    what: format!("{OP}: the precision of the {name} {}", node.debug_name()),
                    value: node.prec().name().into(),
                    expected: "a float precision".into(),
                });
            }
        }
        let (qb, qh, _, qf) = layout.split(q.dims());
        let (kb, kh, kt, kf) = layout.split(k.dims());
        let (vb, vh, vt, _) = layout.split(v.dims());
        let problem = if (qb, qh) != (kb, kh) || (qb, qh) != (vb, vh) {
            Some("the batch and head axes of the query, key and value differ")
        } else if kt != vt {
            Some("the key and the value have different numbers of positions")
        } else if qf != kf {
            Some("the query and the key have different numbers of features")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::shape_mismatch(
                OP,
                &shapes,
                format!("{problem} (each is {layout_text})"),
            ));
        }
        if !scale.is_finite() {
            return Err(Error::BadValue {
                what: format!("{OP}: the scale of the scores"),
                value: scale.to_string(),
                expected: "a finite number".into(),
            });
        }
        if let Some(d) = &dropout {
            if !(0.0..=1.0).contains(&d.p) {
                return Err(Error::BadValue {
                    what: format!("{OP}: the dropout probability"),
                    value: d.p.to_string(),
                    expected: "a number in [0, 1]".into(),
                });
            }
            if d.step.dims().iter().product::<usize>() != 1 {
                return Err(Error::shape_mismatch(
                    OP,
                    &[d.step.dims()],
                    format!(
                        "the dropout step node {} must hold one element",
                        d.step.debug_name()
                    ),
                ));
            }
        }
        Ok(AttentionSpec {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            layout,
            causal,
            scale,
            dropout: dropout.filter(|d| d.p > 0.0),
        })
    }

    /// The sizes.
    pub fn dims(&self) -> AttentionDims {
        let (batch, heads, queries, features) = self.layout.split(self.q.dims());
        let (_, _, keys, _) = self.layout.split(self.k.dims());
        let (_, _, _, value_features) = self.layout.split(self.v.dims());
        AttentionDims {
            batch,
            heads,
            queries,
            keys,
            features,
            value_features,
        }
    }

    /// The output's dims: `[batch, heads, queries, value_features]` in the layout.
    pub fn out_dims(&self) -> Vec<usize> {
        let d = self.dims();
        self.layout
            .order(d.batch, d.heads, d.queries, d.value_features)
    }

    /// The dims of a per-row array (the log-sum-exp): `[batch, heads, queries]`.
    pub fn row_dims(&self) -> Vec<usize> {
        let d = self.dims();
        vec![d.batch, d.heads, d.queries]
    }

    /// The precision the row statistics are kept in: `f64` for `f64` inputs, else `f32`.
    pub fn stats_prec(&self) -> Prec {
        if [&self.q, &self.k, &self.v]
            .iter()
            .any(|t| t.prec().compute_prec() == Prec::F64)
        {
            Prec::F64
        } else {
            Prec::F32
        }
    }
}

/// The passes that exist, by the id of a state node only that pass writes (its key): what a
/// schedule looks up to know that a loop nest is a pass of fused attention (see
/// [`AttentionOp::of_statement`]). Entries of dropped passes are swept as new ones come.
static PASSES: Mutex<Vec<(usize, Weak<AttentionOp>)>> = Mutex::new(Vec::new());

/// One pass of fused attention.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionOp {
    /// `out = softmax(scale · q·kᵀ) · v` and `lse = log Σ exp(scale · q·kᵀ)` per query row.
    Forward {
        /// What is computed.
        spec: AttentionSpec,
        /// The output, in the layout.
        out: Tnode,
        /// The log-sum-exp of each row's scores, `[batch, heads, queries]`.
        lse: Tnode,
        /// The per-row state: running maximum, its next value, the running sum, the current
        /// score and weight, and the output's accumulator where the output is narrower than
        /// the statistics' precision.
        state: ForwardState,
    },
    /// The gradients of the query, key and value from the output's: per batch element and
    /// head, the query rows (`grad_q = scale · Σ_s dS[t, s] · k[s]`), then the keys
    /// (`grad_v = Σ_t P[t, s] ⊙ keep · dO[t]`, `grad_k = scale · Σ_t dS[t, s] · q[t]`), each
    /// weight recomputed from `lse`, with `dS = P ⊙ (dO·vᵀ ⊙ keep − delta)`.
    Backward {
        /// The forward's spec.
        spec: AttentionSpec,
        /// The forward's log-sum-exp.
        lse: Tnode,
        /// `Σ_f grad_out · out` per query row, `[batch, heads, queries]`.
        delta: Tnode,
        /// The output's gradient.
        grad_out: Tnode,
        /// The query gradient written.
        grad_q: Tnode,
        /// The key gradient written.
        grad_k: Tnode,
        /// The value gradient written.
        grad_v: Tnode,
        /// State: the current weight and score gradient per query row (`[batch, heads,
        /// queries]`), then per key (`[batch, heads, keys]`).
        state: [Tnode; 4],
    },
}

/// The forward pass's per-row state arrays (see [`AttentionOp::Forward`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardState {
    /// The running maximum of the row's scores.
    pub max: Tnode,
    /// The maximum after the current key.
    pub next_max: Tnode,
    /// The running sum of `exp(score − max)`.
    pub sum: Tnode,
    /// The current key's score.
    pub score: Tnode,
    /// The current key's weight `exp(score − next_max)`.
    pub weight: Tnode,
    /// The output accumulator, when the output's precision is narrower than the statistics'.
    pub acc: Option<Tnode>,
}

/// A per-row state array: never inlined (it is read and written across the loop over keys).
fn state_node(prec: Prec, dims: &[usize], label: &str) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &["attention", label])?;
    // Not `Local`: the routine's analysis sees a node that no later statement reads as a
    // result of the routine, so it stays on the device (a few values per row).
    t.update_memory_mode(
        MemoryMode::NeverVirtual,
        "attention: per-row state carried across the loop over keys",
    )?;
    Ok(t)
}

/// Checks a node the pass writes or reads besides the spec's, and keeps a written one from being
/// inlined (each of its elements is written once per key, so it must be an array).
fn check_node(name: &str, node: &Tnode, dims: &[usize]) -> Result<()> {
    if node.dims() != dims {
        return Err(Error::shape_mismatch(
            OP,
            &[dims, node.dims()],
            format!(
                "the {name} {} must have dims {dims:?}, but has {:?}",
                node.debug_name(),
                node.dims()
            ),
        ));
    }
    if !node.prec().is_float() {
        return Err(Error::BadValue {
            what: format!("{OP}: the precision of the {name} {}", node.debug_name()),
            value: node.prec().name().into(),
            expected: "a float precision".into(),
        });
    }
    node.update_memory_mode(
        MemoryMode::NeverVirtual,
        "attention: written or read across the fused attention's loops",
    )
}

impl AttentionOp {
    /// The forward pass writing `out` (the layout's `[batch, heads, queries,
    /// value_features]`) and `lse` (`[batch, heads, queries]`).
    pub fn forward(spec: &AttentionSpec, out: &Tnode, lse: &Tnode) -> Result<AttentionOp> {
        check_node("output", out, &spec.out_dims())?;
        check_node("log-sum-exp", lse, &spec.row_dims())?;
        let (prec, rows) = (spec.stats_prec(), spec.row_dims());
        let acc = if out.prec().compute_prec() == prec && out.prec() == prec {
            None
        } else {
            Some(state_node(prec, &spec.out_dims(), "accumulator")?)
        };
        Ok(AttentionOp::Forward {
            spec: spec.clone(),
            out: out.clone(),
            lse: lse.clone(),
            state: ForwardState {
                max: state_node(prec, &rows, "max")?,
                next_max: state_node(prec, &rows, "next_max")?,
                sum: state_node(prec, &rows, "sum")?,
                score: state_node(prec, &rows, "score")?,
                weight: state_node(prec, &rows, "weight")?,
                acc,
            },
        })
    }

    /// The backward pass (see [`AttentionOp::Backward`]).
    pub fn backward(
        spec: &AttentionSpec,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        [grad_q, grad_k, grad_v]: [&Tnode; 3],
    ) -> Result<AttentionOp> {
        check_node("log-sum-exp", lse, &spec.row_dims())?;
        check_node("row delta", delta, &spec.row_dims())?;
        check_node("output gradient", grad_out, &spec.out_dims())?;
        check_node("query gradient", grad_q, spec.q.dims())?;
        check_node("key gradient", grad_k, spec.k.dims())?;
        check_node("value gradient", grad_v, spec.v.dims())?;
        let d = spec.dims();
        let (prec, rows, cols) = (
            spec.stats_prec(),
            spec.row_dims(),
            vec![d.batch, d.heads, d.keys],
        );
        Ok(AttentionOp::Backward {
            spec: spec.clone(),
            lse: lse.clone(),
            delta: delta.clone(),
            grad_out: grad_out.clone(),
            grad_q: grad_q.clone(),
            grad_k: grad_k.clone(),
            grad_v: grad_v.clone(),
            state: [
                state_node(prec, &rows, "weight")?,
                state_node(prec, &rows, "score_grad")?,
                state_node(prec, &cols, "key_weight")?,
                state_node(prec, &cols, "key_score_grad")?,
            ],
        })
    }

    /// The state node only this pass writes, which identifies it.
    fn key(&self) -> &Tnode {
        match self {
            AttentionOp::Forward { state, .. } => &state.max,
            AttentionOp::Backward { state, .. } => &state[0],
        }
    }

    /// This pass, shared and known to [`AttentionOp::of_statement`].
    pub fn register(self) -> Arc<AttentionOp> {
        let op = Arc::new(self);
        let mut passes = PASSES.lock().unwrap_or_else(|e| e.into_inner());
        passes.retain(|(_, w)| w.strong_count() > 0);
        passes.push((op.key().id(), Arc::downgrade(&op)));
        op
    }

    /// The pass whose loop nest `stmt` is (a top-level statement of an optimized routine), if
    /// it is one whole: it writes the pass's key state node, every node it writes is one the
    /// pass's nest writes (outputs and state), and it reads nothing else than the pass's
    /// inputs and those. Optimizations keep a statement's meaning, so such a statement still
    /// computes the pass, and a schedule may run it another way (see
    /// [`crate::schedule::AttentionPlan`]).
    pub fn of_statement(stmt: &LowLevel) -> Option<Arc<AttentionOp>> {
        // The nest, not the zeroings before it.
        if !matches!(stmt, LowLevel::For { .. }) {
            return None;
        }
        let mut writes: Vec<Tnode> = Vec::new();
        stmt.visit(&mut |st| match st {
            LowLevel::Set { tn, .. } | LowLevel::ZeroOut(tn) if !writes.contains(tn) => {
                writes.push(tn.clone())
            }
            _ => {}
        });
        let op = {
            let passes = PASSES.lock().unwrap_or_else(|e| e.into_inner());
            passes
                .iter()
                .filter(|(id, _)| writes.iter().any(|w| w.id() == *id))
                .find_map(|(_, w)| w.upgrade())?
        };
        let written = op.nest_writes();
        if !writes.iter().all(|w| written.contains(&w)) {
            return None;
        }
        let inputs = op.inputs();
        let mut reads_ok = true;
        stmt.visit_exprs(&mut |e| match e {
            ScalarExpr::Get(tn, _) => {
                reads_ok &= inputs.contains(&tn) || written.contains(&tn);
            }
            ScalarExpr::GetMerge(..) => reads_ok = false,
            _ => {}
        });
        reads_ok.then_some(op)
    }

    /// The nodes the pass's main loop nest writes: its outputs and its state.
    pub fn nest_writes(&self) -> Vec<&Tnode> {
        let mut nodes = self.outputs();
        match self {
            AttentionOp::Forward { state, .. } => {
                nodes.extend([
                    &state.max,
                    &state.next_max,
                    &state.sum,
                    &state.score,
                    &state.weight,
                ]);
                nodes.extend(state.acc.as_ref());
            }
            AttentionOp::Backward { state, .. } => nodes.extend(state.iter()),
        }
        nodes
    }

    /// The spec of the attention this pass belongs to.
    pub fn spec(&self) -> &AttentionSpec {
        match self {
            AttentionOp::Forward { spec, .. } | AttentionOp::Backward { spec, .. } => spec,
        }
    }

    /// The nodes this pass writes that outlive it (its state arrays excluded).
    pub fn outputs(&self) -> Vec<&Tnode> {
        match self {
            AttentionOp::Forward { out, lse, .. } => vec![out, lse],
            AttentionOp::Backward {
                grad_q,
                grad_k,
                grad_v,
                ..
            } => vec![grad_q, grad_k, grad_v],
        }
    }

    /// The nodes this pass reads (its state arrays excluded).
    pub fn inputs(&self) -> Vec<&Tnode> {
        let spec = self.spec();
        let mut nodes = vec![&spec.q, &spec.k, &spec.v];
        if let Some(d) = &spec.dropout {
            nodes.push(&d.step);
        }
        match self {
            AttentionOp::Forward { .. } => {}
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                ..
            } => nodes.extend([lse, delta, grad_out]),
        }
        nodes
    }

    /// A short description for comments in generated code.
    pub fn describe(&self) -> String {
        let d = self.spec().dims();
        let pass = match self {
            AttentionOp::Forward { .. } => "forward",
            AttentionOp::Backward { .. } => "backward",
        };
        format!(
            "fused attention ({pass}): batch {} heads {} queries {} keys {} features {}/{}{}{}",
            d.batch,
            d.heads,
            d.queries,
            d.keys,
            d.features,
            d.value_features,
            if self.spec().causal { ", causal" } else { "" },
            match &self.spec().dropout {
                Some(dr) => format!(", dropout {}", dr.p),
                None => String::new(),
            }
        )
    }

    /// The loops that compute this pass (its meaning: the interpreter runs them, and every
    /// backend renders them). Checks every access stays inside its node.
    pub fn lower(&self) -> Result<LowLevel> {
        let spec = self.spec();
        let d = spec.dims();
        let l = Lowering {
            spec,
            d,
            b: Symbol::fresh(),
            h: Symbol::fresh(),
            t: Symbol::fresh(),
            s: Symbol::fresh(),
        };
        let body = match self {
            AttentionOp::Forward {
                out, lse, state, ..
            } => l.forward(out, lse, state),
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                grad_q,
                grad_k,
                grad_v,
                state,
                ..
            } => l.backward(lse, delta, grad_out, [grad_q, grad_k, grad_v], state),
        };
        l.check(&body)?;
        // Every array the loops accumulate into starts from zero in a statement of its own, so
        // the routine's analysis (statement by statement) sees it written before it is read:
        // none of them is an input of the routine.
        let zeroed = match self {
            AttentionOp::Forward { out, state, .. } => vec![
                state.acc.as_ref().unwrap_or(out),
                &state.max,
                &state.next_max,
                &state.sum,
                &state.score,
                &state.weight,
            ],
            AttentionOp::Backward {
                grad_q,
                grad_k,
                grad_v,
                state,
                ..
            } => vec![
                grad_q, grad_k, grad_v, &state[0], &state[1], &state[2], &state[3],
            ],
        };
        Ok(LowLevel::seq(
            std::iter::once(LowLevel::Comment(self.describe()))
                .chain(zeroed.into_iter().map(|t| LowLevel::ZeroOut(t.clone())))
                .chain([body]),
        ))
    }
}

/// The symbols and sizes of one lowering: `b`, `h` over batch and heads, `t` over queries,
/// `s` over keys.
struct Lowering<'a> {
    spec: &'a AttentionSpec,
    d: AttentionDims,
    b: Symbol,
    h: Symbol,
    t: Symbol,
    s: Symbol,
}

fn get(node: &Tnode, idcs: Vec<AxisIndex>) -> ScalarExpr {
    ScalarExpr::Get(node.clone(), idcs)
}

fn bin(op: BinOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
    ScalarExpr::binop(op, a, b)
}

fn konst(c: f64) -> ScalarExpr {
    ScalarExpr::Constant(c)
}

fn for_(index: Symbol, to: usize, body: LowLevel) -> LowLevel {
    LowLevel::For {
        index,
        from: 0,
        to: to as i64,
        body: Box::new(body),
    }
}

fn set(tn: &Tnode, idcs: Vec<AxisIndex>, value: ScalarExpr) -> LowLevel {
    LowLevel::Set {
        tn: tn.clone(),
        idcs,
        value,
    }
}

/// A finite stand-in for −∞ that every precision the statistics use holds: a masked score,
/// and the running maximum before the first key. `exp(NEG_LARGE − m)` is 0 for any score `m`
/// an attention can produce, and no `∞ − ∞` can arise.
const NEG_LARGE: f64 = -1e30;

impl Lowering<'_> {
    fn it(&self, s: Symbol) -> AxisIndex {
        AxisIndex::Iterator(s)
    }

    /// `[b, h, time]` of a per-row (or per-key) array.
    fn row(&self, time: Symbol) -> Vec<AxisIndex> {
        vec![self.it(self.b), self.it(self.h), self.it(time)]
    }

    fn row_get(&self, node: &Tnode, time: Symbol) -> ScalarExpr {
        get(node, self.row(time))
    }

    fn row_set(&self, node: &Tnode, time: Symbol, value: ScalarExpr) -> LowLevel {
        set(node, self.row(time), value)
    }

    /// An element of a `[batch, heads, time, features]` array (in the layout).
    fn at(&self, time: Symbol, f: Symbol) -> Vec<AxisIndex> {
        self.spec.layout.index(self.b, self.h, time, f)
    }

    /// `Σ_f a[time_a, f] · b[time_b, f]` over `extent` features, as a local.
    fn dot(&self, a: (&Tnode, Symbol), b: (&Tnode, Symbol), extent: usize) -> ScalarExpr {
        let f = Symbol::fresh();
        let id = ScopeId::fresh(self.spec.stats_prec());
        let term = bin(
            BinOp::Mul,
            get(a.0, self.at(a.1, f)),
            get(b.0, self.at(b.1, f)),
        );
        ScalarExpr::LocalScope {
            id,
            body: Box::new(for_(
                f,
                extent,
                LowLevel::SetLocal(id, bin(BinOp::Add, ScalarExpr::GetLocal(id), term)),
            )),
        }
    }

    /// `scale · q[t] · k[s]`.
    fn score(&self) -> ScalarExpr {
        bin(
            BinOp::Mul,
            self.dot(
                (&self.spec.q, self.t),
                (&self.spec.k, self.s),
                self.d.features,
            ),
            konst(self.spec.scale),
        )
    }

    /// Nonzero where key `s` is hidden from query `t` (`s > t`, causal only).
    fn hidden(&self) -> Option<ScalarExpr> {
        self.spec.causal.then(|| {
            bin(
                BinOp::Cmplt,
                ScalarExpr::EmbedIndex(AxisIndex::affine([(1, self.t), (-1, self.s)], 0)),
                konst(0.0),
            )
        })
    }

    /// `if hidden { masked } else { value }` (just `value` without a causal mask).
    fn unless_hidden(&self, masked: ScalarExpr, value: ScalarExpr) -> ScalarExpr {
        match self.hidden() {
            Some(h) => ScalarExpr::ternop(TernOp::Where, h, masked, value),
            None => value,
        }
    }

    /// The dropout factor of weight `(t, s)`: 0 where dropped, `1 / (1 − p)` where kept.
    fn keep_factor(&self) -> Option<ScalarExpr> {
        let dr = self.spec.dropout.as_ref()?;
        let d = self.d;
        let position = AxisIndex::affine(
            [
                ((d.heads * d.queries * d.keys) as i64, self.b),
                ((d.queries * d.keys) as i64, self.h),
                (d.keys as i64, self.t),
                (1, self.s),
            ],
            0,
        );
        let step = get(&dr.step, vec![AxisIndex::Fixed(0); dr.step.dims().len()]);
        let u = ScalarExpr::random(dr.seed, dr.stream, position, step);
        let kept = if dr.p < 1.0 { 1.0 / (1.0 - dr.p) } else { 0.0 };
        Some(ScalarExpr::ternop(
            TernOp::Where,
            bin(BinOp::Cmplt, u, konst(dr.p)),
            konst(0.0),
            konst(kept),
        ))
    }

    fn with_keep(&self, value: ScalarExpr) -> ScalarExpr {
        match self.keep_factor() {
            Some(k) => bin(BinOp::Mul, value, k),
            None => value,
        }
    }

    /// Loops over batch and heads around `body`.
    fn batch_heads(&self, body: LowLevel) -> LowLevel {
        for_(self.b, self.d.batch, for_(self.h, self.d.heads, body))
    }

    fn forward(&self, out: &Tnode, lse: &Tnode, st: &ForwardState) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let acc = st.acc.as_ref().unwrap_or(out);
        let f = Symbol::fresh();
        let f_end = Symbol::fresh();
        let ev = self.d.value_features;
        let max = || self.row_get(&st.max, t);
        let next = || self.row_get(&st.next_max, t);
        let weight = || self.row_get(&st.weight, t);
        // exp(max − next_max): how much the sums so far shrink as the maximum grows.
        let shrink = || ScalarExpr::unop(UnOp::Exp, bin(BinOp::Sub, max(), next()));
        let per_key = LowLevel::seq([
            self.row_set(
                &st.score,
                t,
                self.unless_hidden(konst(NEG_LARGE), self.score()),
            ),
            self.row_set(
                &st.next_max,
                t,
                bin(BinOp::Max, max(), self.row_get(&st.score, t)),
            ),
            self.row_set(
                &st.weight,
                t,
                ScalarExpr::unop(
                    UnOp::Exp,
                    bin(BinOp::Sub, self.row_get(&st.score, t), next()),
                ),
            ),
            self.row_set(
                &st.sum,
                t,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, self.row_get(&st.sum, t), shrink()),
                    weight(),
                ),
            ),
            for_(
                f,
                ev,
                set(
                    acc,
                    self.at(t, f),
                    bin(
                        BinOp::Add,
                        bin(BinOp::Mul, get(acc, self.at(t, f)), shrink()),
                        bin(
                            BinOp::Mul,
                            self.with_keep(weight()),
                            get(&self.spec.v, self.at(s, f)),
                        ),
                    ),
                ),
            ),
            self.row_set(&st.max, t, next()),
        ]);
        let row = LowLevel::seq([
            self.row_set(&st.max, t, konst(NEG_LARGE)),
            for_(s, self.d.keys, per_key),
            for_(
                f_end,
                ev,
                set(
                    out,
                    self.at(t, f_end),
                    bin(
                        BinOp::Div,
                        get(acc, self.at(t, f_end)),
                        self.row_get(&st.sum, t),
                    ),
                ),
            ),
            self.row_set(
                lse,
                t,
                bin(
                    BinOp::Add,
                    max(),
                    ScalarExpr::unop(UnOp::Log, self.row_get(&st.sum, t)),
                ),
            ),
        ]);
        self.batch_heads(for_(t, self.d.queries, row))
    }

    /// The weight `P[t, s] = exp(score − lse[t])` (0 where hidden).
    fn recomputed_weight(&self, lse: &Tnode) -> ScalarExpr {
        self.unless_hidden(
            konst(0.0),
            ScalarExpr::unop(
                UnOp::Exp,
                bin(BinOp::Sub, self.score(), self.row_get(lse, self.t)),
            ),
        )
    }

    /// `dS[t, s] = P ⊙ (dO[t]·v[s] ⊙ keep − delta[t])`, with `P` read from `weight`.
    fn score_grad(&self, weight: ScalarExpr, delta: &Tnode, grad_out: &Tnode) -> ScalarExpr {
        let dp = self.with_keep(self.dot(
            (grad_out, self.t),
            (&self.spec.v, self.s),
            self.d.value_features,
        ));
        bin(
            BinOp::Mul,
            weight,
            bin(BinOp::Sub, dp, self.row_get(delta, self.t)),
        )
    }

    /// Both gradient loops under one loop over batch and heads, so the pass is one nest.
    fn backward(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        [grad_q, grad_k, grad_v]: [&Tnode; 3],
        [w, sg, kw, ksg]: &[Tnode; 4],
    ) -> LowLevel {
        // The key loops use the query loop's symbols swapped: fresh ones keep every loop's
        // symbol its own.
        let keys = Lowering {
            t: Symbol::fresh(),
            s: Symbol::fresh(),
            ..*self
        };
        self.batch_heads(LowLevel::seq([
            self.grad_query(lse, delta, grad_out, grad_q, [w, sg]),
            keys.grad_key_value(lse, delta, grad_out, grad_k, grad_v, [kw, ksg]),
        ]))
    }

    /// The query gradient's loops for one batch element and head (`b`, `h`).
    fn grad_query(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        grad_q: &Tnode,
        [weight, sgrad]: [&Tnode; 2],
    ) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let f = Symbol::fresh();
        let per_key = LowLevel::seq([
            self.row_set(weight, t, self.recomputed_weight(lse)),
            self.row_set(
                sgrad,
                t,
                self.score_grad(self.row_get(weight, t), delta, grad_out),
            ),
            for_(
                f,
                self.d.features,
                set(
                    grad_q,
                    self.at(t, f),
                    bin(
                        BinOp::Add,
                        get(grad_q, self.at(t, f)),
                        bin(
                            BinOp::Mul,
                            bin(BinOp::Mul, self.row_get(sgrad, t), konst(self.spec.scale)),
                            get(&self.spec.k, self.at(s, f)),
                        ),
                    ),
                ),
            ),
        ]);
        for_(t, self.d.queries, for_(s, self.d.keys, per_key))
    }

    /// The key and value gradients' loops for one batch element and head.
    fn grad_key_value(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        grad_k: &Tnode,
        grad_v: &Tnode,
        [weight, sgrad]: [&Tnode; 2],
    ) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let (fk, fv) = (Symbol::fresh(), Symbol::fresh());
        let per_query = LowLevel::seq([
            self.row_set(weight, s, self.recomputed_weight(lse)),
            self.row_set(
                sgrad,
                s,
                self.score_grad(self.row_get(weight, s), delta, grad_out),
            ),
            for_(
                fv,
                self.d.value_features,
                set(
                    grad_v,
                    self.at(s, fv),
                    bin(
                        BinOp::Add,
                        get(grad_v, self.at(s, fv)),
                        bin(
                            BinOp::Mul,
                            self.with_keep(self.row_get(weight, s)),
                            get(grad_out, self.at(t, fv)),
                        ),
                    ),
                ),
            ),
            for_(
                fk,
                self.d.features,
                set(
                    grad_k,
                    self.at(s, fk),
                    bin(
                        BinOp::Add,
                        get(grad_k, self.at(s, fk)),
                        bin(
                            BinOp::Mul,
                            bin(BinOp::Mul, self.row_get(sgrad, s), konst(self.spec.scale)),
                            get(&self.spec.q, self.at(t, fk)),
                        ),
                    ),
                ),
            ),
        ]);
        for_(s, self.d.keys, for_(t, self.d.queries, per_query))
    }

    /// Checks every access of `body` against its node, with each loop's extent.
    fn check(&self, body: &LowLevel) -> Result<()> {
        let mut extents = std::collections::HashMap::new();
        collect_extents(body, &mut extents);
        let bounds = |s: Symbol| extents.get(&s).copied();
        let mut result = Ok(());
        let mut check = |tn: &Tnode, idcs: &[AxisIndex]| {
            if result.is_ok() {
                result = check_access(tn, idcs, &bounds, OP);
            }
        };
        body.visit(&mut |st| {
            if let LowLevel::Set { tn, idcs, .. } = st {
                check(tn, idcs);
            }
        });
        body.visit_exprs(&mut |e| {
            if let ScalarExpr::Get(tn, idcs) = e {
                check(tn, idcs);
            }
        });
        result
    }
}

fn collect_extents(body: &LowLevel, out: &mut std::collections::HashMap<Symbol, usize>) {
    // `visit` goes into the statements of local scopes too (the dot products' loops).
    body.visit(&mut |st| {
        if let LowLevel::For { index, to, .. } = st {
            out.insert(*index, *to as usize);
        }
    });
}

//! Fused (flash) attention as one operation of the IR: `softmax(scale · q·kᵀ) · v` computed
//! row by row with an online softmax (a running maximum, a running sum and an accumulator
//! rescaled as the maximum grows: FlashAttention's recurrence), so the `[queries, keys]`
//! scores never exist as an array. The backward pass recomputes each score from the saved
//! row log-sum-exp (FlashAttention-2's backward): per batch element and head, a loop per query
//! row for the query gradient, then one per key for the key and value gradients.
//!
//! The operation lowers to plain loops of the loop IR ([`AttentionOp::lower`]): that lowering
//! is its meaning. The interpreter runs it, and every backend renders it like any other loop
//! nest, so the shared differential corpus checks the operation on every backend. Its state
//! (running maximum, sum, the current key's weight) lives in small per-row arrays
//! (`[batch, heads, rows]`), never in a `[rows, keys]` one. `docs/attention.md` gives the
//! reasons for this shape; `arrayjit_opt::schedule::AttentionPlan` runs a pass on the CPU's
//! blocked helper (its block products on the product helper's micro-kernels); a GPU schedule
//! is still to come.

mod lower;

use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::indexing::{AxisIndex, StaticSymbol, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::memory::MemoryMode;
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
    /// Query `t` sees key `s` only where `s ≤ t` (top-left aligned, as PyTorch's `is_causal`),
    /// or `s ≤ t + offset` with a [`AttentionSpec::causal_offset`].
    pub causal: bool,
    /// The factor of the scores (usually `1 / √features`).
    pub scale: f64,
    /// Dropout on the weights, if any.
    pub dropout: Option<AttentionDropout>,
    /// With `causal`: the causal mask shifted by a value bound per run, query `t` seeing keys
    /// `s ≤ t + offset` (queries that are the slots `offset ..` of a key/value cache: the keys
    /// before them and their own). One compiled routine then serves every position, and the
    /// keys past the last query's are never read. See [`AttentionSpec::with_causal_offset`].
    pub causal_offset: Option<StaticSymbol>,
    /// Added to every score of key `s` of batch element `b` after scaling: a `[batch, keys]`
    /// array (a key padding mask: 0 where a key counts, a large negative number where it does
    /// not). Read as a constant: no gradient flows into it. See
    /// [`AttentionSpec::with_key_bias`].
    pub key_bias: Option<Tnode>,
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
            check_float(name, node)?;
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
            causal_offset: None,
            key_bias: None,
        })
    }

    /// This causal attention with its mask shifted by `offset` (see
    /// [`AttentionSpec::causal_offset`]): query `t` sees keys `s ≤ t + offset`. The routine
    /// that runs it must be compiled with `offset` among its bindings. Refused for an attention
    /// that is not causal (there is nothing to shift).
    pub fn with_causal_offset(self, offset: &StaticSymbol) -> Result<AttentionSpec> {
        if !self.causal {
            return Err(Error::BadValue {
                what: format!("{OP}: the causal offset {}", offset.name),
                value: "an offset on an attention that is not causal".into(),
                expected: "a causal attention (the offset shifts its mask)".into(),
            });
        }
        Ok(AttentionSpec {
            causal_offset: Some(offset.clone()),
            ..self
        })
    }

    /// This attention with `bias` (`[batch, keys]`, a float precision) added to every score of
    /// its key (see [`AttentionSpec::key_bias`]).
    pub fn with_key_bias(self, bias: &Tnode) -> Result<AttentionSpec> {
        let d = self.dims();
        check_node("key bias", bias, &[d.batch, d.keys])?;
        Ok(AttentionSpec {
            key_bias: Some(bias.clone()),
            ..self
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

    /// The dropout factor of the weight of query `t` on key `s` of batch element `b` and head
    /// `h` (iterators bound by whoever renders it): 0 where the weight is dropped, `1 / (1 − p)`
    /// where it is kept, from the uniform draw at the weight's position in `[batch, heads,
    /// queries, keys]` (see [`AttentionDropout`]); `None` without dropout. The loops and every
    /// schedule that runs a pass another way draw through this one expression.
    pub fn keep_factor(&self, b: Symbol, h: Symbol, t: Symbol, s: Symbol) -> Option<ScalarExpr> {
        let dr = self.dropout.as_ref()?;
        let d = self.dims();
        let position = AxisIndex::affine(
            [
                ((d.heads * d.queries * d.keys) as i64, b),
                ((d.queries * d.keys) as i64, h),
                (d.keys as i64, t),
                (1, s),
            ],
            0,
        );
        let step = ScalarExpr::Get(
            dr.step.clone(),
            vec![AxisIndex::Fixed(0); dr.step.dims().len()],
        );
        let u = ScalarExpr::random(dr.seed, dr.stream, position, step);
        let kept = if dr.p < 1.0 { 1.0 / (1.0 - dr.p) } else { 0.0 };
        Some(ScalarExpr::ternop(
            crate::ops::TernOp::Where,
            ScalarExpr::binop(crate::ops::BinOp::Cmplt, u, ScalarExpr::Constant(dr.p)),
            ScalarExpr::Constant(0.0),
            ScalarExpr::Constant(kept),
        ))
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

/// The `name`d node of an attention is in a float precision.
fn check_float(name: &str, node: &Tnode) -> Result<()> {
    if node.prec().is_float() {
        return Ok(());
    }
    Err(Error::BadValue {
        what: format!("{OP}: the precision of the {name} {}", node.debug_name()),
        value: node.prec().name().into(),
        expected: "a float precision".into(),
    })
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
    check_float(name, node)?;
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
    /// `arrayjit_opt::schedule::AttentionPlan`).
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
        // Every node it writes is the pass's, and it writes all the pass's outputs (a piece
        // of the nest, split off by a renderer, is not the pass).
        if !writes.iter().all(|w| written.contains(&w))
            || !op.outputs().into_iter().all(|o| writes.contains(o))
        {
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

    /// The statements right before statement `at` (this pass's nest) that only zero nodes
    /// its nest writes, skipping comments: dead work where the pass runs as a kernel of its own
    /// (the CPU's blocked helper, a GPU pass), which writes every element of the pass's
    /// outputs and keeps its state in buffers or registers of its own. Their indices, nearest
    /// first.
    pub fn zeroings_before(&self, stmts: &[&LowLevel], at: usize) -> Vec<usize> {
        let written = self.nest_writes();
        let mut found = Vec::new();
        for j in (0..at.min(stmts.len())).rev() {
            match stmts[j].unwrapped() {
                LowLevel::ZeroOut(tn) if written.contains(&tn) => found.push(j),
                LowLevel::Comment(_) | LowLevel::Noop => {}
                _ => break,
            }
        }
        found
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
        nodes.extend(&spec.key_bias);
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
            "fused attention ({pass}): batch {} heads {} queries {} keys {} features {}/{}{}{}{}",
            d.batch,
            d.heads,
            d.queries,
            d.keys,
            d.features,
            d.value_features,
            match (self.spec().causal, &self.spec().causal_offset) {
                (true, Some(o)) => format!(", causal from {}", o.name),
                (true, None) => ", causal".to_string(),
                (false, _) => String::new(),
            },
            if self.spec().key_bias.is_some() {
                ", key bias"
            } else {
                ""
            },
            match &self.spec().dropout {
                Some(dr) => format!(", dropout {}", dr.p),
                None => String::new(),
            }
        )
    }
}

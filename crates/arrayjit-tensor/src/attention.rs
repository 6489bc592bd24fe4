//! Fused attention in the front end: [`Tensor::scaled_dot_product_attention`] (PyTorch's axis
//! order) and [`Tensor::attention`] (either order), one operation of the IR
//! ([`arrayjit_ir::attention`]) forward and backward, so no `[queries, keys]` array of scores or
//! weights exists in either pass.

use std::sync::Arc;

use arrayjit_ir::{
    Assignments, AttentionDropout, AttentionLayout, AttentionOp, AttentionSpec, BinOp, Result,
    StaticSymbol, Tnode,
};

use crate::rng::RandomStream;
use crate::tensor::{Rhs, Tensor};

/// How [`Tensor::attention`] runs: mask, scale and dropout.
#[derive(Clone, Debug, Default)]
pub struct AttentionOptions {
    /// Query `t` sees key `s` only where `s ≤ t` (top-left aligned, as PyTorch's
    /// `is_causal`).
    pub causal: bool,
    /// The factor of the scores; `1 / √features` when `None`.
    pub scale: Option<f64>,
    /// Dropout on the attention weights: the probability and the stream the masks come from
    /// (the same draws [`Tensor::dropout`] would make on the `[batch, heads, queries, keys]`
    /// weights).
    pub dropout: Option<(f64, RandomStream)>,
    /// With `causal`: query `t` sees keys `s ≤ t + offset`, the offset a static symbol bound
    /// per run (queries that start at slot `offset` of a key/value cache). Compile the routine
    /// with the symbol among its bindings.
    pub causal_offset: Option<StaticSymbol>,
    /// `[batch, keys]` added to every score of its key after scaling (a key padding mask: 0
    /// where a key counts, a large negative number where it does not). A constant of the
    /// attention: no gradient flows into it.
    pub key_bias: Option<Tensor>,
}

impl Tensor {
    /// `softmax(scale · q·kᵀ) · v` for `q` `[batch, heads, queries, features]`, `k`
    /// `[batch, heads, keys, features]` and `v` `[batch, heads, keys, value_features]`, giving
    /// `[batch, heads, queries, value_features]` (PyTorch's `scaled_dot_product_attention`).
    /// Computed with an online softmax over the keys, forward and backward, never holding the
    /// scores (see [`arrayjit_ir::attention`]). Gradients flow to `q`, `k` and `v`.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        Tensor::attention(AttentionLayout::HeadsFirst, q, k, v, options)
    }

    /// [`Tensor::scaled_dot_product_attention`] with the axes in `layout`'s order (a
    /// projection `btd,dhe->bthe` gives [`AttentionLayout::TimeFirst`]).
    pub fn attention(
        layout: AttentionLayout,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        // Features are the last axis in either layout.
        let features = q.dims().get(3).copied().unwrap_or(1).max(1);
        let scale = options
            .scale
            .unwrap_or_else(|| 1.0 / (features as f64).sqrt());
        // Shapes and settings are checked before a draw is taken from the dropout stream.
        let shape_only = AttentionSpec::new(
            q.node(),
            k.node(),
            v.node(),
            layout,
            options.causal,
            scale,
            None,
        )?;
        let shape_only = match &options.causal_offset {
            Some(offset) => shape_only.with_causal_offset(offset)?,
            None => shape_only,
        };
        let shape_only = match &options.key_bias {
            Some(bias) => shape_only.with_key_bias(bias.node())?,
            None => shape_only,
        };
        let mut parents = vec![q.clone(), k.clone(), v.clone()];
        let dropout = match &options.dropout {
            Some((p, _)) if !(0.0..=1.0).contains(p) => {
                return Err(arrayjit_ir::Error::BadValue {
                    what: "scaled_dot_product_attention: the dropout probability".into(),
                    value: p.to_string(),
                    expected: "a number in [0, 1]".into(),
                });
            }
            Some((p, rng)) if *p > 0.0 => {
                let (_, stream) = rng.next_draw()?;
                parents.push(rng.step().clone());
                Some(AttentionDropout {
                    p: *p,
                    seed: rng.seed(),
                    stream,
                    step: rng.step().node().clone(),
                })
            }
            _ => None,
        };
        let spec = AttentionSpec {
            dropout,
            ..shape_only
        };
        // The bias is read by the pass (a parent, so that it is computed first); the backward
        // gives it no gradient, nor the dropout step (the parents after q, k and v).
        parents.extend(options.key_bias.iter().cloned());
        let out = Tnode::new(q.prec(), &spec.out_dims(), &["attention"])?;
        let lse = Tnode::new(spec.stats_prec(), &spec.row_dims(), &["attention", "lse"])?;
        let forward = Assignments::attention(AttentionOp::forward(&spec, &out, &lse)?);
        let backward_spec = spec.clone();
        Ok(Tensor::custom(
            out,
            forward,
            parents,
            Some(Arc::new(move |out: &Tensor, g: &Tensor| {
                attention_backward(&backward_spec, out, &lse, g)
            })),
        ))
    }
}

/// The gradients of `q`, `k` and `v` (and none for the dropout step) from the output's
/// gradient `g`: the row deltas `Σ_f g · out`, then the backward pass.
fn attention_backward(
    spec: &AttentionSpec,
    out: &Tensor,
    lse: &Tnode,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let rows = match spec.layout {
        AttentionLayout::HeadsFirst => "bhtf,bhtf->bht",
        AttentionLayout::TimeFirst => "bthf,bthf->bht",
    };
    let value = Tensor::from_node(out.node());
    let delta = Tensor::einsum_op(
        rows,
        Rhs::Bin(BinOp::Mul),
        &[g, &value],
        BinOp::Add,
        true,
        "attention_delta",
        None,
    )?;
    let prec = spec.q.prec();
    let grad_q = Tnode::new(prec, spec.q.dims(), &["attention", "grad_q"])?;
    let grad_k = Tnode::new(prec, spec.k.dims(), &["attention", "grad_k"])?;
    let grad_v = Tnode::new(spec.v.prec(), spec.v.dims(), &["attention", "grad_v"])?;
    let pass = AttentionOp::backward(
        spec,
        lse,
        delta.node(),
        g.node(),
        [&grad_q, &grad_k, &grad_v],
    )?;
    let dq = Tensor::custom(
        grad_q,
        Assignments::attention(pass),
        vec![delta.clone(), g.clone(), value],
        None,
    );
    // Written by the same pass: their only parent is that pass's tensor, so they are emitted
    // after it.
    let dk = Tensor::custom(grad_k, Assignments::Noop, vec![dq.clone()], None);
    let dv = Tensor::custom(grad_v, Assignments::Noop, vec![dq.clone()], None);
    // Gradients pair with the parents in order; the dropout step and the key bias get none.
    Ok(vec![Some(dq), Some(dk), Some(dv), None, None])
}

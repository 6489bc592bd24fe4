//! Neural-network blocks on the tensor front end: linear layers, layer norm, multi-head causal
//! self-attention, the transformer MLP, pre-norm decoder blocks, and a GPT (token and learned
//! position embeddings, decoder blocks, a final layer norm, and an output head tied to the token
//! embedding).
//!
//! Blocks hold their parameters as [`Tensor`]s and build graphs; they do not run anything.
//! Every parameter is drawn from the counter-based RNG with the model's seed and its own stream
//! number, so a seed gives the same model on every backend and in every run. Activations are
//! `[batch, time, width]`; attention keeps heads as their own axis (`[width, heads, head_width]`
//! projections), so no reshape or transpose is materialized. The `forward_with` variants
//! apply [`Dropout`] for training; `forward` is the evaluation path.

use arrayjit_ir::{AttentionLayout, EinsumGuard, Error, Prec, Result};

use crate::attention::AttentionOptions;
use crate::init::{Init, PendingDraws};
use crate::losses;
use crate::precision::Precision;
use crate::rng::RandomStream;
use crate::tensor::Tensor;

/// Hands out parameter stream numbers in order, so that each parameter of a model draws from
/// its own stream.
///
/// A factory made by [`ParamFactory::new`] draws each parameter's values as it makes it; one
/// made by [`ParamFactory::deferring`] leaves them to [`ParamFactory::take_pending`]'s
/// [`PendingDraws`], so that a caller can draw them while it compiles. Either way a seed gives
/// the same values.
#[derive(Debug)]
pub struct ParamFactory {
    seed: u64,
    next_stream: u32,
    params: Vec<Tensor>,
    /// `Some` for a deferring factory: the draws not made yet.
    pending: Option<PendingDraws>,
    /// The precision of matrix weights ([`ParamFactory::weight`]).
    weight_prec: Prec,
}

impl ParamFactory {
    /// A factory drawing from `seed`, streams from 0, each parameter's values drawn at once.
    pub fn new(seed: u64) -> ParamFactory {
        ParamFactory {
            seed,
            next_stream: 0,
            params: Vec::new(),
            pending: None,
            weight_prec: Prec::F32,
        }
    }

    /// This factory making its matrix weights ([`ParamFactory::weight`]) in `prec` (`f32`
    /// unless set; `bf16` for [`Precision::Bf16Weights`]). Other parameters stay `f32`.
    pub fn with_weight_prec(self, prec: Prec) -> ParamFactory {
        ParamFactory {
            weight_prec: prec,
            ..self
        }
    }

    /// A factory like [`ParamFactory::new`] whose parameters hold zeros until the draws taken
    /// with [`ParamFactory::take_pending`] are made.
    pub fn deferring(seed: u64) -> ParamFactory {
        ParamFactory {
            pending: Some(PendingDraws::default()),
            ..ParamFactory::new(seed)
        }
    }

    /// A new `f32` parameter.
    pub fn param(&mut self, label: &str, dims: &[usize], init: Init) -> Result<Tensor> {
        self.param_in(label, Prec::F32, dims, init)
    }

    /// A new matrix weight (a factor of the model's matrix products: linear weights,
    /// embeddings), in the factory's weight precision ([`ParamFactory::with_weight_prec`]).
    pub fn weight(&mut self, label: &str, dims: &[usize], init: Init) -> Result<Tensor> {
        self.param_in(label, self.weight_prec, dims, init)
    }

    /// A new parameter in `prec` (its values drawn in `f64` and rounded to it).
    pub fn param_in(
        &mut self,
        label: &str,
        prec: Prec,
        dims: &[usize],
        init: Init,
    ) -> Result<Tensor> {
        let (seed, stream) = (self.seed, self.next_stream);
        let p = match &mut self.pending {
            None => Tensor::param_with_prec(label, prec, dims, init, seed, stream)?,
            Some(pending) => {
                let p = Tensor::param_undrawn(label, prec, dims)?;
                pending.push(p.node().clone(), dims, init, seed, stream);
                p
            }
        };
        self.next_stream += 1;
        self.params.push(p.clone());
        Ok(p)
    }

    /// Every parameter made so far, in order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The draws this factory has not made yet (none for a factory that draws at once); later
    /// parameters start a new list.
    pub fn take_pending(&mut self) -> PendingDraws {
        self.pending
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

/// Einsum letters for the leading (batch-like) axes of `x`, all but its last.
fn lead_letters(x: &Tensor, op: &str) -> Result<String> {
    let rank = x.dims().len();
    if rank == 0 || rank > 12 {
        return Err(Error::ShapeMismatch {
            op: op.into(),
            shapes: vec![x.dims().to_vec()],
            detail: format!("expected 1 to 12 axes, got shape {:?}", x.dims()),
        });
    }
    Ok(('a'..='l').take(rank - 1).collect())
}

fn expect_width(op: &str, x: &Tensor, width: usize) -> Result<()> {
    if x.dims().last() != Some(&width) {
        return Err(Error::ShapeMismatch {
            op: op.into(),
            shapes: vec![x.dims().to_vec()],
            detail: format!(
                "the input's last axis must be {width}, got shape {:?}",
                x.dims()
            ),
        });
    }
    Ok(())
}

/// `x · W + b` over the last axis.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[inputs, outputs]`.
    pub weight: Tensor,
    /// `[outputs]`, if the layer has a bias.
    pub bias: Option<Tensor>,
    /// The precision its product multiplies in (`f32` unless set).
    pub precision: Precision,
}

impl Linear {
    /// Weights normal with standard deviation `std`, bias zero (when `bias`).
    pub fn new(
        f: &mut ParamFactory,
        label: &str,
        inputs: usize,
        outputs: usize,
        std: f64,
        bias: bool,
    ) -> Result<Linear> {
        let weight = f.weight(
            &format!("{label}.weight"),
            &[inputs, outputs],
            Init::Normal { mean: 0.0, std },
        )?;
        let bias = if bias {
            Some(f.param(&format!("{label}.bias"), &[outputs], Init::Zeros)?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            precision: Precision::F32,
        })
    }

    /// `[..., inputs] → [..., outputs]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        expect_width("linear", x, self.weight.dims()[0])?;
        let l = lead_letters(x, "linear")?;
        let y = self
            .precision
            .product(&format!("{l}x,xy->{l}y"), x, &self.weight)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

/// Layer norm over the last axis with a learned gain (ones) and bias (zeros).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `[width]`.
    pub gain: Tensor,
    /// `[width]`.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Gain 1, bias 0, epsilon 1e-5.
    pub fn new(f: &mut ParamFactory, label: &str, width: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gain: f.param(&format!("{label}.gain"), &[width], Init::Constant(1.0))?,
            bias: f.param(&format!("{label}.bias"), &[width], Init::Zeros)?,
            eps: 1e-5,
        })
    }

    /// Normalizes `[..., width]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.gain, &self.bias, self.eps)
    }
}

/// Multi-head causal self-attention: per-head query, key and value projections, scaled dot
/// products with the future masked out, softmax over keys, the weighted sum of values, and an
/// output projection.
#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    /// `[width, heads, head_width]` each.
    pub query: Tensor,
    /// Key projection.
    pub key: Tensor,
    /// Value projection.
    pub value: Tensor,
    /// `[heads, head_width, width]`.
    pub output: Tensor,
    /// `[width]` biases of the query, key, value and output projections.
    pub biases: [Tensor; 4],
    /// The precision its products multiply in (`f32` unless set).
    pub precision: Precision,
    /// How the scores and weights are computed ([`AttentionKind::Fused`] unless set).
    pub kind: AttentionKind,
}

/// How attention computes its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionKind {
    /// One fused operation with an online softmax ([`Tensor::attention`]): no
    /// `[batch, heads, time, time]` array of scores or weights in the forward or the backward
    /// pass, so memory grows with the context, not its square.
    #[default]
    Fused,
    /// Scores as guarded products, a masked softmax, then a guarded product with the values:
    /// holds `[batch, heads, time, time]` scores and weights (kept for the backward pass), and
    /// runs its products on the CPU product helper's micro-kernels (or a GPU's matrix units for
    /// `bf16` products).
    Unfused,
}

impl AttentionKind {
    /// The name used by the CLI and Python (`fused`, `unfused`).
    pub fn name(self) -> &'static str {
        match self {
            AttentionKind::Fused => "fused",
            AttentionKind::Unfused => "unfused",
        }
    }

    /// The kind named `name` (`fused` or `unfused`).
    pub fn parse(name: &str) -> Result<AttentionKind> {
        match name {
            "fused" => Ok(AttentionKind::Fused),
            "unfused" => Ok(AttentionKind::Unfused),
            other => Err(Error::BadValue {
                what: "attention".into(),
                value: other.into(),
                expected: "fused or unfused".into(),
            }),
        }
    }
}

impl CausalSelfAttention {
    /// `heads` heads splitting `width` evenly; projections normal with standard deviation
    /// `std` (the output projection's scaled by `out_scale`), biases zero.
    pub fn new(
        f: &mut ParamFactory,
        label: &str,
        width: usize,
        heads: usize,
        std: f64,
        out_scale: f64,
    ) -> Result<CausalSelfAttention> {
        if heads == 0 || !width.is_multiple_of(heads) {
            return Err(Error::BadValue {
                what: format!("{label}: heads"),
                value: heads.to_string(),
                expected: format!("a divisor of the width {width}"),
            });
        }
        let hw = width / heads;
        let normal = |s| Init::Normal { mean: 0.0, std: s };
        let query = f.weight(&format!("{label}.query"), &[width, heads, hw], normal(std))?;
        let key = f.weight(&format!("{label}.key"), &[width, heads, hw], normal(std))?;
        let value = f.weight(&format!("{label}.value"), &[width, heads, hw], normal(std))?;
        let output = f.weight(
            &format!("{label}.output"),
            &[heads, hw, width],
            normal(std * out_scale),
        )?;
        let mut bias = |name: &str, dims: &[usize]| {
            f.param(&format!("{label}.{name}_bias"), dims, Init::Zeros)
        };
        let biases = [
            bias("query", &[heads, hw])?,
            bias("key", &[heads, hw])?,
            bias("value", &[heads, hw])?,
            bias("output", &[width])?,
        ];
        Ok(CausalSelfAttention {
            query,
            key,
            value,
            output,
            biases,
            precision: Precision::F32,
            kind: AttentionKind::default(),
        })
    }

    /// `[batch, time, width] → [batch, time, width]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
    }

    /// [`CausalSelfAttention::forward`], with dropout on the attention weights and the output
    /// when training.
    pub fn forward_with(&self, x: &Tensor, dropout: Option<&Dropout>) -> Result<Tensor> {
        let dims = x.dims();
        if dims.len() != 3 || dims[2] != self.query.dims()[0] {
            return Err(Error::ShapeMismatch {
                op: "attention".into(),
                shapes: vec![dims.to_vec()],
                detail: format!(
                    "expected [batch, time, {}], got {dims:?}",
                    self.query.dims()[0]
                ),
            });
        }
        let (time, hw) = (dims[1], self.query.dims()[2]);
        let p = self.precision;
        // The input is cast once for the three projections.
        let x = &p.operand(x)?;
        let project =
            |w: &Tensor, b: &Tensor| -> Result<Tensor> { p.product("btd,dhe->bthe", x, w)?.add(b) };
        let q = project(&self.query, &self.biases[0])?;
        let k = project(&self.key, &self.biases[1])?;
        let v = project(&self.value, &self.biases[2])?;
        if self.kind == AttentionKind::Fused {
            let options = AttentionOptions {
                causal: true,
                scale: Some(1.0 / (hw as f64).sqrt()),
                dropout: dropout.map(|d| (d.p, d.rng.clone())),
                ..AttentionOptions::default()
            };
            let mixed = Tensor::attention(AttentionLayout::TimeFirst, &q, &k, &v, &options)?;
            let out = p
                .product("bthe,hed->btd", &mixed, &self.output)?
                .add(&self.biases[3])?;
            return Dropout::maybe(dropout, &out);
        }
        // Key `s` is seen from query `t` only where `s ≤ t`: the products skip the terms past
        // it (about half), and the scores there, left at 0, are then hidden from the softmax.
        // The weights there are exactly 0, so the weighted sum of values skips only zeros;
        // the gradient products carry the guard too. The guard only saves work, so `bf16`
        // products, which run on a GPU's matrix units (and those take no guard), go without.
        let causal = match p {
            Precision::F32 | Precision::Bf16Weights => vec![EinsumGuard::at_most('s', 't', 0)],
            Precision::Bf16Products => Vec::new(),
        };
        let scores = p
            .guarded_product("bthe,bshe->bhts", &q, &k, &causal)?
            .scale(1.0 / (hw as f64).sqrt())?;
        let future = Tensor::causal_mask(x.prec(), time)?;
        let hidden = Tensor::full(x.prec(), &[], -1e9)?;
        let weights = Tensor::where_(&future, &hidden, &scores)?.softmax(3)?;
        let weights = Dropout::maybe(dropout, &weights)?;
        let mixed = p.guarded_product("bhts,bshe->bthe", &weights, &v, &causal)?;
        let out = p
            .product("bthe,hed->btd", &mixed, &self.output)?
            .add(&self.biases[3])?;
        Dropout::maybe(dropout, &out)
    }

    /// The number of heads.
    pub fn heads(&self) -> usize {
        self.query.dims()[1]
    }
}

/// Dropout while training: each use draws a fresh mask from the stream (see
/// [`Tensor::dropout`]); add [`RandomStream::advance`] to the training step so every step
/// draws new masks.
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The probability of zeroing an element, in `[0, 1]`.
    pub p: f64,
    /// Where the masks come from.
    pub rng: RandomStream,
}

impl Dropout {
    /// Dropout with probability `p` from a new stream keyed by `seed` (its step node labelled
    /// `dropout_step`).
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::BadValue {
                what: "dropout probability".into(),
                value: p.to_string(),
                expected: "a number in [0, 1]".into(),
            });
        }
        Ok(Dropout {
            p,
            rng: RandomStream::new(seed, "dropout_step")?,
        })
    }

    /// `x` with dropout applied, or `x` itself without dropout.
    pub fn maybe(dropout: Option<&Dropout>, x: &Tensor) -> Result<Tensor> {
        match dropout {
            Some(d) => x.dropout(d.p, &d.rng),
            None => Ok(x.clone()),
        }
    }
}

/// Which GELU the MLP uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    /// `x · Φ(x)` with `erf`.
    Exact,
    /// The tanh approximation (GPT-2's).
    Tanh,
}

/// The transformer MLP: `linear → GELU → linear`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[width, hidden]`.
    pub up: Linear,
    /// `[hidden, width]`.
    pub down: Linear,
    /// The activation.
    pub gelu: Gelu,
}

impl Mlp {
    /// Weights normal with standard deviation `std` (the down projection's scaled by
    /// `out_scale`), biases zero.
    pub fn new(
        f: &mut ParamFactory,
        label: &str,
        width: usize,
        hidden: usize,
        std: f64,
        out_scale: f64,
        gelu: Gelu,
    ) -> Result<Mlp> {
        Ok(Mlp {
            up: Linear::new(f, &format!("{label}.up"), width, hidden, std, true)?,
            down: Linear::new(
                f,
                &format!("{label}.down"),
                hidden,
                width,
                std * out_scale,
                true,
            )?,
            gelu,
        })
    }

    /// `[..., width] → [..., width]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
    }

    /// [`Mlp::forward`], with dropout on the output when training.
    pub fn forward_with(&self, x: &Tensor, dropout: Option<&Dropout>) -> Result<Tensor> {
        let h = self.up.forward(x)?;
        let h = match self.gelu {
            Gelu::Exact => h.gelu()?,
            Gelu::Tanh => h.gelu_tanh()?,
        };
        Dropout::maybe(dropout, &self.down.forward(&h)?)
    }
}

/// A pre-norm decoder block: `x + attention(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Clone, Debug)]
pub struct DecoderBlock {
    /// Before attention.
    pub norm1: LayerNorm,
    /// Causal self-attention.
    pub attention: CausalSelfAttention,
    /// Before the MLP.
    pub norm2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
}

impl DecoderBlock {
    /// `[batch, time, width] → [batch, time, width]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
    }

    /// [`DecoderBlock::forward`], with dropout in the attention and the MLP when training.
    pub fn forward_with(&self, x: &Tensor, dropout: Option<&Dropout>) -> Result<Tensor> {
        let attended = self
            .attention
            .forward_with(&self.norm1.forward(x)?, dropout)?;
        let x = x.add(&attended)?;
        x.add(&self.mlp.forward_with(&self.norm2.forward(&x)?, dropout)?)
    }
}

/// The shape of a GPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Token ids are `0..vocabulary`.
    pub vocabulary: usize,
    /// The longest sequence (learned positions).
    pub context: usize,
    /// Model width.
    pub width: usize,
    /// Attention heads (dividing `width`).
    pub heads: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// MLP hidden width.
    pub hidden: usize,
    /// The MLP's activation.
    pub gelu: Gelu,
    /// The precision of its matrix products ([`Precision`]).
    pub precision: Precision,
    /// How its attention computes the weights ([`AttentionKind`]).
    pub attention: AttentionKind,
}

impl GptConfig {
    /// GPT-2 small's shape: vocabulary 50257, context 1024, width 768, 12 heads, 12 layers,
    /// MLP 3072 with GELU's tanh form, fused attention.
    pub fn gpt2_small() -> GptConfig {
        GptConfig {
            vocabulary: 50257,
            context: 1024,
            width: 768,
            heads: 12,
            layers: 12,
            hidden: 3072,
            gelu: Gelu::Tanh,
            precision: Precision::F32,
            attention: AttentionKind::Fused,
        }
    }

    /// The benchmark model: vocabulary 65, context 64, width 128, 4 heads, 2 layers,
    /// MLP 512 with exact GELU.
    pub fn small(vocabulary: usize) -> GptConfig {
        GptConfig {
            vocabulary,
            context: 64,
            width: 128,
            heads: 4,
            layers: 2,
            hidden: 512,
            gelu: Gelu::Exact,
            precision: Precision::F32,
            attention: AttentionKind::Fused,
        }
    }
}

/// A GPT: token + learned position embeddings, decoder blocks, a final layer norm, and logits
/// from the token embedding (weight tying).
#[derive(Clone, Debug)]
pub struct Gpt {
    /// The shape.
    pub config: GptConfig,
    /// `[vocabulary, width]`, also the output head.
    pub token_embedding: Tensor,
    /// `[context, width]`.
    pub position_embedding: Tensor,
    /// The blocks.
    pub blocks: Vec<DecoderBlock>,
    /// The final norm.
    pub final_norm: LayerNorm,
    params: Vec<Tensor>,
}

impl Gpt {
    /// A GPT with GPT-2's initialization (normal, standard deviation 0.02; residual output
    /// projections scaled by `1/sqrt(2 · layers)`), drawn from `seed`.
    pub fn new(config: GptConfig, seed: u64) -> Result<Gpt> {
        let (gpt, pending) = Gpt::with_pending_draws(config, seed)?;
        pending.draw()?;
        Ok(gpt)
    }

    /// [`Gpt::new`]'s model with its parameters' values not drawn yet: they hold zeros until
    /// the returned [`PendingDraws`] are drawn (e.g. on another thread while the model's
    /// routines compile). The values drawn are [`Gpt::new`]'s.
    pub fn with_pending_draws(config: GptConfig, seed: u64) -> Result<(Gpt, PendingDraws)> {
        let c = config;
        if c.vocabulary == 0 || c.context == 0 || c.width == 0 || c.layers == 0 || c.hidden == 0 {
            return Err(Error::BadValue {
                what: "GPT configuration".into(),
                value: format!("{c:?}"),
                expected: "every size positive".into(),
            });
        }
        let mut f = ParamFactory::deferring(seed).with_weight_prec(c.precision.weight_prec());
        let std = 0.02;
        let normal = Init::Normal { mean: 0.0, std };
        let token_embedding = f.weight("token_embedding", &[c.vocabulary, c.width], normal)?;
        let position_embedding = f.weight("position_embedding", &[c.context, c.width], normal)?;
        let out_scale = 1.0 / ((2 * c.layers) as f64).sqrt();
        let mut blocks = Vec::new();
        for l in 0..c.layers {
            let label = format!("block{l}");
            let mut block = DecoderBlock {
                norm1: LayerNorm::new(&mut f, &format!("{label}.norm1"), c.width)?,
                attention: CausalSelfAttention::new(
                    &mut f,
                    &format!("{label}.attention"),
                    c.width,
                    c.heads,
                    std,
                    out_scale,
                )?,
                norm2: LayerNorm::new(&mut f, &format!("{label}.norm2"), c.width)?,
                mlp: Mlp::new(
                    &mut f,
                    &format!("{label}.mlp"),
                    c.width,
                    c.hidden,
                    std,
                    out_scale,
                    c.gelu,
                )?,
            };
            block.attention.precision = c.precision;
            block.attention.kind = c.attention;
            block.mlp.up.precision = c.precision;
            block.mlp.down.precision = c.precision;
            blocks.push(block);
        }
        let final_norm = LayerNorm::new(&mut f, "final_norm", c.width)?;
        let gpt = Gpt {
            config,
            token_embedding,
            position_embedding,
            blocks,
            final_norm,
            params: f.params().to_vec(),
        };
        Ok((gpt, f.take_pending()))
    }

    /// Every parameter, in creation order (the order checkpoints and optimizers use).
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Number of trainable values.
    pub fn parameter_count(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.dims().iter().product::<usize>())
            .sum()
    }

    /// Logits `[batch, time, vocabulary]` for ids `[batch, time]` (`time` at most the
    /// context), without dropout (evaluation and sampling).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, None)
    }

    /// [`Gpt::forward`], with dropout (when given) after the embeddings, on the attention
    /// weights, and on each block's attention and MLP outputs, as GPT-2 trains.
    pub fn forward_with(&self, ids: &Tensor, dropout: Option<&Dropout>) -> Result<Tensor> {
        let c = &self.config;
        let dims = ids.dims();
        if dims.len() != 2 || dims[1] == 0 || dims[1] > c.context {
            return Err(Error::ShapeMismatch {
                op: "gpt".into(),
                shapes: vec![dims.to_vec()],
                detail: format!(
                    "ids must be [batch, time] with 1 <= time <= {}, got {dims:?}",
                    c.context
                ),
            });
        }
        let positions = if dims[1] == c.context {
            self.position_embedding.clone()
        } else {
            let first = Tensor::ids(
                &[dims[1]],
                "positions",
                &(0..dims[1]).collect::<Vec<_>>(),
                c.context,
            )?;
            self.position_embedding.take(&first, 0)?
        };
        let embedded = self.embed(ids, &positions)?;
        let mut x = Dropout::maybe(dropout, &embedded)?;
        for block in &self.blocks {
            x = block.forward_with(&x, dropout)?;
        }
        let x = self.final_norm.forward(&x)?;
        c.precision
            .product("btd,vd->btv", &x, &self.token_embedding)
    }

    /// The mean cross-entropy of predicting `targets` `[batch, time]` from `ids`.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.loss_with(ids, targets, None)
    }

    /// [`Gpt::loss`] through [`Gpt::forward_with`] (dropout when training).
    pub fn loss_with(
        &self,
        ids: &Tensor,
        targets: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        losses::cross_entropy(&self.forward_with(ids, dropout)?, targets)
    }

    /// The precision of the model's activations (`f32`; with [`Precision::Bf16Weights`] its
    /// matrix weights are stored in `bf16`).
    pub fn prec(&self) -> Prec {
        self.final_norm.gain.prec()
    }

    /// The first block's input: each id's token embedding plus its position's row of the
    /// position embedding (`positions`, taken already), in the activations' precision
    /// (embeddings stored in `bf16` are widened as they are read).
    pub(crate) fn embed(&self, ids: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let prec = self.prec();
        self.token_embedding
            .embedding(ids)?
            .cast(prec)?
            .add(&positions.cast(prec)?)
    }
}

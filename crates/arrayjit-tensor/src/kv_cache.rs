//! Generation with a key/value cache: a GPT's forward pass over a few new tokens per row that
//! appends their keys and values to per-layer caches kept on the device, and attends over
//! everything cached so far.
//!
//! How it is expressed, so that one compiled routine serves every position:
//! - The caches are `[batch, slots, heads, head_width]` arrays that live on the device across
//!   runs ([`KvCache`]). A step over `chunk` tokens writes them at slots
//!   `start .. start + chunk`, where `start` is a static index bound per run
//!   ([`arrayjit_ir::Assignments::write_at_static`]).
//! - Query `t` of the step (slot `start + t`) sees the slots `s ≤ start + t`, so the values a
//!   step has not written yet are never read, and a step's work grows with the position
//!   reached, not the cache's size. A step over several tokens (a prefill) runs fused attention
//!   with its causal mask shifted by `start` ([`arrayjit_ir::AttentionSpec::causal_offset`]):
//!   no `[heads, chunk, slots]` scores exist. A decoding step (one token) puts the guard
//!   `start + t - s ≥ 0` on the scores' and the weighted sum's products
//!   ([`arrayjit_ir::EinsumGuard::plus_static`]), which skip the rest; the scores it skips are
//!   `-∞` before the softmax (a guarded maximum starting from its neutral element), so they
//!   weigh exactly 0.
//! - Rows of different lengths share the slots by left padding: `key_mask` (`[batch, slots]`,
//!   0 for a slot that holds a real token, −10⁹ for padding) is added to the scores (the fused
//!   attention's key bias), and
//!   `positions` gives each token its own position (for the learned position embedding), so a
//!   padded row computes what it would alone.
//!
//! A prompt runs as steps of a fixed chunk (a prefill routine), then each new token as a step
//! of one (a decode routine); both are compiled once, whatever the prompt length and position.

use arrayjit_ir::{
    AttentionLayout, BinOp, EinsumGuard, Error, MemoryMode, MemoryType, Prec, Result, Sharing,
    StaticSymbol, Tnode, UnOp,
};

use crate::attention::AttentionOptions;
use crate::nn::{AttentionKind, CausalSelfAttention, DecoderBlock, Gpt};
use crate::tensor::Rhs;
use crate::tensor::Tensor;

/// The score added for a padding slot: far below any real score, yet finite, so that a padding
/// row (which sees only padding) still has a well-defined softmax.
pub const PADDING_SCORE: f64 = -1e9;

/// The keys and values of every layer for `batch` rows of up to `slots` tokens, kept on the
/// device between runs (`[batch, slots, heads, head_width]` each).
#[derive(Clone, Debug)]
pub struct KvCache {
    keys: Vec<Tnode>,
    values: Vec<Tnode>,
    batch: usize,
    slots: usize,
}

impl KvCache {
    /// Caches for `model`'s layers, `batch` rows of `slots` tokens (at most the model's
    /// context, since positions index the learned position embedding).
    pub fn new(model: &Gpt, batch: usize, slots: usize) -> Result<KvCache> {
        let c = &model.config;
        if batch == 0 || slots == 0 || slots > c.context {
            return Err(Error::BadValue {
                what: "key/value cache shape".into(),
                value: format!("batch {batch}, slots {slots}"),
                expected: format!(
                    "a positive batch and 1 to {} slots (the model's context)",
                    c.context
                ),
            });
        }
        let (heads, hw) = (c.heads, c.width / c.heads);
        let node = |kind: &str, layer: usize| -> Result<Tnode> {
            let tn = Tnode::new(
                Prec::F32,
                &[batch, slots, heads, hw],
                &[&format!("kv_cache.{layer}.{kind}")],
            )?;
            tn.update_memory_mode(
                MemoryMode::OnDevice(Sharing::Unset),
                "kv cache: written by one run, read by the next ones, never by the host",
            )?;
            Ok(tn)
        };
        let mut keys = Vec::with_capacity(c.layers);
        let mut values = Vec::with_capacity(c.layers);
        for layer in 0..c.layers {
            keys.push(node("keys", layer)?);
            values.push(node("values", layer)?);
        }
        Ok(KvCache {
            keys,
            values,
            batch,
            slots,
        })
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per row.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of every layer's keys and values.
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|t| t.dims().iter().product::<usize>() * t.prec().size_in_bytes())
            .sum()
    }
}

/// The graph of one cached step over `chunk` new tokens per row ([`Gpt::cached_step`]): its
/// inputs, set on the host before each run, and its logits.
#[derive(Clone, Debug)]
pub struct CachedStep {
    /// `[batch, chunk]` token ids.
    pub ids: Tensor,
    /// `[batch, chunk]` each token's position (its row of the position embedding).
    pub positions: Tensor,
    /// `[batch, slots]` added to the scores: 0 for a slot holding a real token,
    /// [`PADDING_SCORE`] for padding.
    pub key_mask: Tensor,
    /// The first slot the step writes, bound per run (`0 ..= slots - chunk`).
    pub start: StaticSymbol,
    /// Token ids are `0..vocabulary`.
    pub vocabulary: usize,
    /// Positions are `0..positions_upper` (the model's context).
    pub positions_upper: usize,
    /// `[batch, 1]`: which new token's logits the step computes (an index into the chunk),
    /// when built for one only ([`StepLogits::Picked`]).
    pub pick: Option<Tensor>,
    /// `[batch, chunk, vocabulary]` logits of the next token after each new one, or
    /// `[batch, 1, vocabulary]` after the picked one.
    pub logits: Tensor,
}

/// Which logits a cached step computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepLogits {
    /// After every new token (a sequence's logits at every position).
    All,
    /// After one new token per row, chosen per run ([`CachedStep::pick`]): what generation
    /// needs from a prompt. The output head, the largest product of a step over many tokens,
    /// then runs once per row.
    Picked,
}

impl CachedStep {
    /// New tokens per row.
    pub fn chunk(&self) -> usize {
        self.ids.dims()[1]
    }
}

/// The guard `start + t - s ≥ 0`: key slot `s` at or before query `t`'s slot.
fn seen(start: &StaticSymbol) -> EinsumGuard {
    EinsumGuard::at_most('s', 't', 0).plus_static(1, start)
}

/// `cache` with `rows` written at slots `start ..`: a tensor whose node is the cache itself,
/// so that readers of it come after the write.
fn appended(cache: &Tnode, rows: &Tensor, start: &StaticSymbol) -> Result<Tensor> {
    let forward = arrayjit_ir::Assignments::write_at_static(cache, rows.node(), 1, start)?;
    Ok(Tensor::custom(
        cache.clone(),
        forward,
        vec![rows.clone()],
        None,
    ))
}

impl CausalSelfAttention {
    /// Attention of `x` (`[batch, chunk, width]`, the step's new tokens) over the cached keys
    /// and values, after appending the new ones at `start` (see the module's doc).
    fn forward_cached(
        &self,
        x: &Tensor,
        keys: &Tnode,
        values: &Tnode,
        step: &StepInputs,
    ) -> Result<Tensor> {
        let hw = self.query.dims()[2];
        let p = self.precision;
        let x = &p.operand(x)?;
        let project =
            |w: &Tensor, b: &Tensor| -> Result<Tensor> { p.product("btd,dhe->bthe", x, w)?.add(b) };
        let q = project(&self.query, &self.biases[0])?;
        let k = appended(keys, &project(&self.key, &self.biases[1])?, &step.start)?;
        let v = appended(values, &project(&self.value, &self.biases[2])?, &step.start)?;
        let chunk = q.dims()[1];
        let mixed = if self.kind == AttentionKind::Fused && chunk > 1 {
            // Fused attention over the cache, its causal mask shifted to the step's first slot
            // and the padding added to the scores: no `[heads, chunk, slots]` scores exist, and
            // the keys past the last new token are never read.
            let options = AttentionOptions {
                causal: true,
                scale: Some(1.0 / (hw as f64).sqrt()),
                causal_offset: Some(step.start.clone()),
                key_bias: Some(step.key_mask.clone()),
                ..AttentionOptions::default()
            };
            Tensor::attention(AttentionLayout::TimeFirst, &q, &k, &v, &options)?
        } else {
            // One new token (decoding): its scores are one row per head, and the guarded
            // products read each cached key and value once, as the fused pass would, without
            // its blocks' packing.
            attend_guarded(&q, &k, &v, hw, step)?
        };
        p.product("bthe,hed->btd", &p.operand(&mixed)?, &self.output)?
            .add(&self.biases[3])
    }
}

/// The attention of the step's queries `q` over the cache's keys `k` and values `v` written
/// out: guarded products for the scores and the weighted sum, the padding added, a guarded
/// softmax.
fn attend_guarded(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    hw: usize,
    step: &StepInputs,
) -> Result<Tensor> {
    let guard = [seen(&step.start)];
    // The cache is f32: its products are too, whatever the projections' precision.
    let scores = Tensor::guarded_product("bthe,bshe->bhts", q, k, &guard)?
        .scale(1.0 / (hw as f64).sqrt())?;
    let visible = Tensor::einsum_op_guarded(
        "bhts,bs->bhts",
        Rhs::Bin(BinOp::Add),
        &[&scores, &step.key_mask],
        BinOp::Max,
        true,
        "visible_scores",
        None,
        None,
        &guard,
    )?;
    let weights = visible_softmax(&visible, &guard)?;
    Tensor::guarded_product("bhts,bshe->bthe", &weights, v, &guard)
}

/// The softmax over keys (`bhts`, along `s`) of scores that are `-∞` past the guard, with the
/// guard on every statement: the maximum and the sum skip the slots past it, and the
/// exponentials and weights there are 0 (the neutral element, stored without computing
/// anything), so that on the C backends each statement's loop stops at the slots seen (see
/// `arrayjit_codegen`'s guard bounds) instead of exponentiating `-∞` for the rest of the
/// cache. The values are those of the plain softmax.
fn visible_softmax(scores: &Tensor, guard: &[EinsumGuard]) -> Result<Tensor> {
    let op = |spec: &str, rhs: Rhs, inputs: &[&Tensor], accum: BinOp, label: &str| {
        Tensor::einsum_op_guarded(spec, rhs, inputs, accum, true, label, None, None, guard)
    };
    let reduce = |x: &Tensor, accum: BinOp, label: &str| {
        op("bhts->bht", Rhs::Un(UnOp::Identity), &[x], accum, label)
    };
    let by_row = |x: &Tensor, r: &Tensor, with: BinOp, label: &str| {
        op("bhts,bht->bhts", Rhs::Bin(with), &[x, r], BinOp::Add, label)
    };
    let shifted = by_row(
        scores,
        &reduce(scores, BinOp::Max, "max")?,
        BinOp::Sub,
        "shifted",
    )?;
    let e = op(
        "bhts->bhts",
        Rhs::Un(UnOp::Exp),
        &[&shifted],
        BinOp::Add,
        "exp",
    )?;
    by_row(&e, &reduce(&e, BinOp::Add, "sum")?, BinOp::Div, "weights")
}

/// What every layer of a step reads besides its input.
struct StepInputs {
    key_mask: Tensor,
    start: StaticSymbol,
}

impl DecoderBlock {
    fn forward_cached(
        &self,
        x: &Tensor,
        keys: &Tnode,
        values: &Tnode,
        step: &StepInputs,
    ) -> Result<Tensor> {
        let attended =
            self.attention
                .forward_cached(&self.norm1.forward(x)?, keys, values, step)?;
        let x = x.add(&attended)?;
        x.add(&self.mlp.forward(&self.norm2.forward(&x)?)?)
    }
}

impl Gpt {
    /// The graph of a step over `chunk` new tokens per row that appends to `cache` (see the
    /// module's doc); `label` prefixes its inputs' labels. Compile its logits' forward program
    /// with `start` among the bindings.
    pub fn cached_step(
        &self,
        cache: &KvCache,
        chunk: usize,
        label: &str,
        which: StepLogits,
    ) -> Result<CachedStep> {
        let c = &self.config;
        if cache.keys.len() != c.layers || cache.keys[0].dims()[2..] != [c.heads, c.width / c.heads]
        {
            return Err(Error::ShapeMismatch {
                op: "cached step".into(),
                shapes: vec![cache.keys[0].dims().to_vec()],
                detail: format!(
                    "the cache was made for another model: {} layers of {:?}, the model has {} \
                     layers of {} heads of {}",
                    cache.keys.len(),
                    cache.keys[0].dims(),
                    c.layers,
                    c.heads,
                    c.width / c.heads
                ),
            });
        }
        if chunk == 0 || chunk > cache.slots {
            return Err(Error::BadValue {
                what: "tokens per cached step".into(),
                value: chunk.to_string(),
                expected: format!("1 to the cache's {} slots", cache.slots),
            });
        }
        let (batch, slots) = (cache.batch, cache.slots);
        let zeros = vec![0; batch * chunk];
        let ids = Tensor::ids(
            &[batch, chunk],
            &format!("{label}_ids"),
            &zeros,
            c.vocabulary,
        )?;
        let positions = Tensor::ids(
            &[batch, chunk],
            &format!("{label}_positions"),
            &zeros,
            c.context,
        )?;
        let key_mask = Tensor::input(
            Prec::F32,
            &[batch, slots],
            &format!("{label}_key_mask"),
            &vec![0.0; batch * slots],
        )?;
        key_mask.node().update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "kv cache: the padding of the rows, set on the host",
        )?;
        let step = StepInputs {
            key_mask: key_mask.clone(),
            start: StaticSymbol::new(&format!("{label}_start"), slots - chunk + 1),
        };
        let embedded = self.embed(&ids, &self.position_embedding.take(&positions, 0)?)?;
        let mut x = embedded;
        for ((block, keys), values) in self.blocks.iter().zip(&cache.keys).zip(&cache.values) {
            x = block.forward_cached(&x, keys, values, &step)?;
        }
        let pick = match which {
            StepLogits::All => None,
            StepLogits::Picked => Some(Tensor::ids(
                &[batch, 1],
                &format!("{label}_pick"),
                &vec![0; batch],
                chunk,
            )?),
        };
        let x = match &pick {
            // Row `b`'s picked token `x[b, pick[b]]`: every row's pick gathered from every row
            // (`[batch, batch, 1, width]`), then the diagonal.
            Some(pick) => Tensor::einsum_op(
                "bbtd->btd",
                Rhs::Un(UnOp::Identity),
                &[&x.take(pick, 1)?],
                BinOp::Arg2,
                false,
                "picked",
                None,
            )?,
            None => x,
        };
        let x = self.final_norm.forward(&x)?;
        let logits = c
            .precision
            .product("btd,vd->btv", &x, &self.token_embedding)?;
        logits.node().update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "kv cache: logits read on the host",
        )?;
        Ok(CachedStep {
            ids,
            positions,
            key_mask,
            start: step.start,
            vocabulary: c.vocabulary,
            positions_upper: c.context,
            pick,
            logits,
        })
    }
}

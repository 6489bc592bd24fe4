//! Fused attention in the conformance corpus ([`arrayjit_ir::attention`]): the forward pass
//! (output and row log-sum-exp) and the backward pass, in either axis order, causal or not,
//! with dropout drawn inside the loops, an odd number of positions, one position and one head,
//! several blocks of the CPU helper's (neither size a multiple of a block), queries and keys of
//! different lengths, and half-precision inputs (whose output accumulates in a separate `f32`
//! array). Every backend must agree with the interpreter running the operation's loops.

use arrayjit_ir::{
    AccumRhs, Assignments, AttentionDropout, AttentionLayout, AttentionOp, AttentionSpec, BinOp,
    Operand, Prec, Result, StaticSymbol, Tnode,
};

use super::case::{Case, case, output};

/// Values in `[-1.5, 1.5)`, spread without a pattern a wrong index would hide.
fn spread_input(prec: Prec, dims: &[usize], label: &str, salt: usize) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    let n: usize = dims.iter().product();
    let values: Vec<f64> = (0..n)
        .map(|i| -1.5 + 3.0 * (((i * 37 + salt * 11) % 101) as f64 + 0.5) / 101.0)
        .collect();
    t.host().set_values(&values)?;
    Ok(t)
}

struct Sizes {
    batch: usize,
    heads: usize,
    /// Positions of the queries.
    time: usize,
    /// Positions of the keys and values (a causal mask is anchored at the top left: query `t`
    /// sees keys `0..=t`).
    key_time: usize,
    features: usize,
}

/// What a key/value cache's step adds to an attention: its causal mask shifted by a static
/// index (the offsets of the case's runs, the last one's results compared), and a bias on the
/// keys' scores.
#[derive(Default)]
struct Masks {
    /// The static index's values, one run each.
    offsets: Vec<i64>,
    /// A `[batch, keys]` bias: small values, and −30 on a few keys of the last batch element
    /// (as padding would be).
    bias: bool,
}

/// The forward pass, then both gradient passes from an output gradient, every result hosted.
fn attention_case(
    name: &str,
    prec: Prec,
    layout: AttentionLayout,
    s: Sizes,
    causal: bool,
    dropout: Option<f64>,
) -> Result<Case> {
    masked_attention_case(name, prec, layout, s, causal, dropout, Masks::default())
}

/// [`attention_case`] with the masks of a key/value cache's step.
fn masked_attention_case(
    name: &str,
    prec: Prec,
    layout: AttentionLayout,
    s: Sizes,
    causal: bool,
    dropout: Option<f64>,
    masks: Masks,
) -> Result<Case> {
    let dims = layout.order(s.batch, s.heads, s.time, s.features);
    let key_dims = layout.order(s.batch, s.heads, s.key_time, s.features);
    let q = spread_input(prec, &dims, "q", 1)?;
    let k = spread_input(prec, &key_dims, "k", 2)?;
    let v = spread_input(prec, &key_dims, "v", 3)?;
    let grad_out = spread_input(prec, &dims, "grad_out", 4)?;
    let dropout = match dropout {
        Some(p) => {
            let step = output(Prec::U32, &[], "step")?;
            step.host().set_values(&[3.0])?;
            Some(AttentionDropout {
                p,
                seed: 0x5eed_0000_0001,
                stream: 0x8000_0002,
                step,
            })
        }
        None => None,
    };
    let scale = 1.0 / (s.features as f64).sqrt();
    let mut spec = AttentionSpec::new(&q, &k, &v, layout, causal, scale, dropout)?;
    // Offsets up to the one where the last query sees the last key.
    let offset = StaticSymbol::new("offset", (s.key_time + 1).saturating_sub(s.time).max(1));
    if !masks.offsets.is_empty() {
        spec = spec.with_causal_offset(&offset)?;
    }
    if masks.bias {
        let bias = Tnode::new(Prec::F32, &[s.batch, s.key_time], &["key_bias"])?;
        let values: Vec<f64> = (0..s.batch * s.key_time)
            .map(|i| {
                let (b, key) = (i / s.key_time, i % s.key_time);
                if b + 1 == s.batch && key % 7 == 2 {
                    -30.0
                } else {
                    0.25 * ((key * 5 + b) % 9) as f64 - 1.0
                }
            })
            .collect();
        bias.host().set_values(&values)?;
        spec = spec.with_key_bias(&bias)?;
    }
    let out = output(prec, &spec.out_dims(), "out")?;
    let lse = output(spec.stats_prec(), &spec.row_dims(), "lse")?;
    let delta = Tnode::new(spec.stats_prec(), &spec.row_dims(), &["delta"])?;
    let grad_q = output(prec, &dims, "grad_q")?;
    let grad_k = output(prec, &key_dims, "grad_k")?;
    let grad_v = output(prec, &key_dims, "grad_v")?;
    let rows = match layout {
        AttentionLayout::HeadsFirst => "bhtf,bhtf->bht",
        AttentionLayout::TimeFirst => "bthf,bthf->bht",
    };
    let program = Assignments::attention(AttentionOp::forward(&spec, &out, &lse)?)
        .then(Assignments::einsum(
            rows,
            BinOp::Add,
            &delta,
            AccumRhs::Binop(
                BinOp::Mul,
                Operand::Node(grad_out.clone()),
                Operand::Node(out.clone()),
            ),
            true,
        )?)
        .then(Assignments::attention(AttentionOp::backward(
            &spec,
            &lse,
            &delta,
            &grad_out,
            [&grad_q, &grad_k, &grad_v],
        )?));
    let mut case = case(name, program, vec![out, lse, grad_q, grad_k, grad_v]);
    if !masks.offsets.is_empty() {
        case.bindings = vec![offset];
        case.runs = masks.offsets.iter().map(|&o| vec![o]).collect();
    }
    Ok(case)
}

/// A causal attention of one batch element and two heads of `features` in the projections'
/// layout (`[batch, time, heads, features]`), with dropout `p` if given: the shape of a GPT's
/// heads (64 features in GPT-2) at a context of `time`, forward and backward.
pub fn attention_head_case(
    name: &str,
    prec: Prec,
    time: usize,
    features: usize,
    dropout: Option<f64>,
) -> Result<Case> {
    let sizes = Sizes {
        batch: 1,
        heads: 2,
        time,
        key_time: time,
        features,
    };
    attention_case(name, prec, AttentionLayout::TimeFirst, sizes, true, dropout)
}

/// The cases of this module.
pub fn attention_cases() -> Result<Vec<Case>> {
    use AttentionLayout::*;
    let sizes = |batch, heads, time, features| Sizes {
        batch,
        heads,
        time,
        key_time: time,
        features,
    };
    let uneven = |batch, heads, time, key_time, features| Sizes {
        batch,
        heads,
        time,
        key_time,
        features,
    };
    Ok(vec![
        attention_case(
            "attention_heads_first",
            Prec::F32,
            HeadsFirst,
            sizes(2, 3, 7, 5),
            false,
            None,
        )?,
        attention_case(
            "attention_causal_time_first",
            Prec::F32,
            TimeFirst,
            sizes(2, 2, 13, 8),
            true,
            None,
        )?,
        attention_case(
            "attention_causal_dropout",
            Prec::F32,
            TimeFirst,
            sizes(1, 2, 9, 4),
            true,
            Some(0.25),
        )?,
        attention_case(
            "attention_one_position_one_head",
            Prec::F32,
            HeadsFirst,
            sizes(1, 1, 1, 3),
            true,
            None,
        )?,
        attention_case(
            "attention_f64",
            Prec::F64,
            HeadsFirst,
            sizes(1, 2, 6, 4),
            true,
            Some(0.5),
        )?,
        // Several blocks of queries and keys (the CPU helper's 128 × 128), neither size a
        // multiple of a block, causal and not.
        attention_case(
            "attention_causal_blocks",
            Prec::F32,
            TimeFirst,
            sizes(1, 2, 200, 8),
            true,
            None,
        )?,
        attention_case(
            "attention_blocks",
            Prec::F32,
            HeadsFirst,
            sizes(2, 1, 140, 12),
            false,
            None,
        )?,
        attention_case(
            "attention_dropout_blocks",
            Prec::F32,
            HeadsFirst,
            sizes(1, 2, 150, 8),
            true,
            Some(0.2),
        )?,
        // Queries and keys of different lengths, causal: the CPU helper's blocks on the
        // diagonal run in strips of rows or keys, and blocks cut short by the mask's end.
        attention_case(
            "attention_causal_more_keys",
            Prec::F32,
            TimeFirst,
            uneven(1, 2, 150, 290, 8),
            true,
            None,
        )?,
        attention_case(
            "attention_causal_fewer_keys",
            Prec::F32,
            HeadsFirst,
            uneven(1, 2, 270, 140, 12),
            true,
            None,
        )?,
        // One batch element and one head (the batch and head loops have one iteration each,
        // the backward's two gradient nests stay one statement), queries and keys of different
        // lengths, so the two nests cannot fuse.
        attention_case(
            "attention_causal_one_head_fewer_keys",
            Prec::F32,
            HeadsFirst,
            uneven(1, 1, 150, 70, 8),
            true,
            None,
        )?,
        // A key/value cache's step: the causal mask shifted by a static index bound per run
        // (the keys past the last query's never read), and a bias on the keys' scores.
        masked_attention_case(
            "attention_cached_offset_bias",
            Prec::F32,
            TimeFirst,
            uneven(2, 2, 20, 300, 8),
            true,
            None,
            Masks {
                offsets: vec![0, 137],
                bias: true,
            },
        )?,
        masked_attention_case(
            "attention_cached_offset_blocks",
            Prec::F32,
            HeadsFirst,
            uneven(1, 2, 150, 400, 8),
            true,
            None,
            Masks {
                offsets: vec![250, 61],
                bias: false,
            },
        )?,
        masked_attention_case(
            "attention_key_bias_dropout",
            Prec::F32,
            HeadsFirst,
            sizes(2, 2, 9, 5),
            false,
            Some(0.3),
            Masks {
                offsets: vec![],
                bias: true,
            },
        )?,
        attention_case(
            "attention_f16",
            Prec::F16,
            TimeFirst,
            sizes(1, 2, 5, 4),
            false,
            None,
        )?,
    ])
}

//! GPT-2's `config.json` (Hugging Face's `GPT2Config`): the fields arrayjit reads, checked,
//! and written back in the same layout.

use std::path::Path;

use arrayjit_ir::{Error, Result};
use arrayjit_tensor::Precision;
use arrayjit_tensor::nn::{AttentionKind, Gelu, GptConfig};
use serde_json::{Map, Value};

/// The shape of a GPT-2 checkpoint, from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// `vocab_size`.
    pub vocabulary: usize,
    /// `n_positions`: the longest sequence (rows of the position embedding).
    pub positions: usize,
    /// `n_embd`.
    pub width: usize,
    /// `n_head`.
    pub heads: usize,
    /// `n_layer`.
    pub layers: usize,
    /// `n_inner` (`null`: four times the width).
    pub hidden: usize,
    /// `layer_norm_epsilon`.
    pub layer_norm_epsilon: f64,
    /// `activation_function`: `gelu_new`, `gelu_pytorch_tanh` and `gelu_fast` are GELU's tanh
    /// form, `gelu` the exact one.
    pub gelu: Gelu,
    /// `eos_token_id`, if the config names one inside the vocabulary.
    pub end_of_text: Option<usize>,
}

impl Gpt2Config {
    /// GPT-2 small's configuration (124M parameters).
    pub fn small() -> Gpt2Config {
        Gpt2Config {
            vocabulary: 50257,
            positions: 1024,
            width: 768,
            heads: 12,
            layers: 12,
            hidden: 3072,
            layer_norm_epsilon: 1e-5,
            gelu: Gelu::Tanh,
            end_of_text: Some(50256),
        }
    }

    /// Reads and checks `config.json` at `path`: a GPT-2 (`model_type` `gpt2`) without the
    /// options arrayjit's blocks do not compute (cross-attention, unscaled or layer-scaled
    /// attention weights, another activation); each refusal names the field.
    pub fn read(path: &Path) -> Result<Gpt2Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            detail: format!("it is not JSON: {e}"),
        })?;
        Gpt2Config::from_json(&json).map_err(|detail| Error::Checkpoint {
            path: path.display().to_string(),
            detail,
        })
    }

    /// The configuration in a parsed `config.json`; `Err` says what is wrong.
    pub fn from_json(json: &Value) -> std::result::Result<Gpt2Config, String> {
        let obj = json
            .as_object()
            .ok_or("the configuration is not a JSON object")?;
        match obj.get("model_type").and_then(Value::as_str) {
            Some("gpt2") => {}
            Some(other) => {
                return Err(format!(
                    "model_type is {other:?}: a checkpoint of another architecture (only GPT-2, \
                     model_type \"gpt2\", loads here)"
                ));
            }
            None => return Err("it has no model_type (a GPT-2 config says \"gpt2\")".into()),
        }
        let size = |key: &str| -> std::result::Result<usize, String> {
            obj.get(key)
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{key} must be a positive integer, got {:?}", obj.get(key)))
        };
        let flag =
            |key: &str, default: bool| obj.get(key).and_then(Value::as_bool).unwrap_or(default);
        let refuse =
            |key: &str, why: &str| Err(format!("{key} = {} is not supported: {why}", obj[key]));
        if flag("add_cross_attention", false) {
            return refuse("add_cross_attention", "the blocks have no cross-attention");
        }
        if !flag("scale_attn_weights", true) {
            return refuse(
                "scale_attn_weights",
                "attention scores are always scaled by 1/sqrt(head width)",
            );
        }
        if flag("scale_attn_by_inverse_layer_idx", false) {
            return refuse(
                "scale_attn_by_inverse_layer_idx",
                "scores are not scaled per layer",
            );
        }
        let gelu = match obj.get("activation_function").and_then(Value::as_str) {
            None | Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => Gelu::Tanh,
            Some("gelu") => Gelu::Exact,
            Some(_) => {
                return refuse(
                    "activation_function",
                    "the MLP computes GELU (gelu_new, gelu_pytorch_tanh, gelu_fast or gelu)",
                );
            }
        };
        let width = size("n_embd")?;
        let heads = size("n_head")?;
        if !width.is_multiple_of(heads) {
            return Err(format!("n_head = {heads} does not divide n_embd = {width}"));
        }
        let hidden = match obj.get("n_inner") {
            None | Some(Value::Null) => 4 * width,
            Some(_) => size("n_inner")?,
        };
        let positions = match obj.get("n_positions") {
            Some(_) => size("n_positions")?,
            None => size("n_ctx")?,
        };
        let layer_norm_epsilon = match obj.get("layer_norm_epsilon") {
            None => 1e-5,
            Some(v) => v
                .as_f64()
                .filter(|e| *e > 0.0 && e.is_finite())
                .ok_or_else(|| format!("layer_norm_epsilon must be a positive number, got {v}"))?,
        };
        let vocabulary = size("vocab_size")?;
        let end_of_text = obj
            .get("eos_token_id")
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v < vocabulary);
        Ok(Gpt2Config {
            vocabulary,
            positions,
            width,
            heads,
            layers: size("n_layer")?,
            hidden,
            layer_norm_epsilon,
            gelu,
            end_of_text,
        })
    }

    /// The `config.json` `transformers` reads for this configuration (a `GPT2LMHeadModel`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("architectures", Value::from(vec!["GPT2LMHeadModel"]));
        put("model_type", "gpt2".into());
        put("vocab_size", self.vocabulary.into());
        put("n_positions", self.positions.into());
        put("n_embd", self.width.into());
        put("n_head", self.heads.into());
        put("n_layer", self.layers.into());
        put(
            "n_inner",
            if self.hidden == 4 * self.width {
                Value::Null
            } else {
                self.hidden.into()
            },
        );
        put(
            "activation_function",
            match self.gelu {
                Gelu::Tanh => "gelu_new",
                Gelu::Exact => "gelu",
            }
            .into(),
        );
        put("layer_norm_epsilon", self.layer_norm_epsilon.into());
        put("tie_word_embeddings", true.into());
        put("scale_attn_weights", true.into());
        if let Some(eos) = self.end_of_text {
            put("bos_token_id", eos.into());
            put("eos_token_id", eos.into());
        }
        Value::Object(m)
    }

    /// arrayjit's model of this shape: context `positions`, fused attention for whole
    /// sequences, products in `precision`.
    pub fn model_config(&self, precision: Precision) -> GptConfig {
        GptConfig {
            vocabulary: self.vocabulary,
            context: self.positions,
            width: self.width,
            heads: self.heads,
            layers: self.layers,
            hidden: self.hidden,
            gelu: self.gelu,
            precision,
            attention: AttentionKind::Fused,
        }
    }

    /// Parameters (the tied head counted once).
    pub fn parameter_count(&self) -> usize {
        let (d, f) = (self.width, self.hidden);
        let block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
        self.vocabulary * d + self.positions * d + self.layers * block + 2 * d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_counts_gpt2s_parameters() {
        assert_eq!(Gpt2Config::small().parameter_count(), 124_439_808);
    }

    #[test]
    fn round_trips_and_refuses_what_it_cannot_compute() {
        let c = Gpt2Config::small();
        assert_eq!(Gpt2Config::from_json(&c.to_json()).unwrap(), c);
        let mut j = c.to_json();
        j["model_type"] = "llama".into();
        assert!(
            Gpt2Config::from_json(&j)
                .unwrap_err()
                .contains("another architecture")
        );
        let mut j = c.to_json();
        j["activation_function"] = "relu".into();
        assert!(
            Gpt2Config::from_json(&j)
                .unwrap_err()
                .contains("activation_function")
        );
        let mut j = c.to_json();
        j["n_head"] = 5.into();
        assert!(
            Gpt2Config::from_json(&j)
                .unwrap_err()
                .contains("does not divide")
        );
        let mut j = c.to_json();
        j["add_cross_attention"] = true.into();
        assert!(
            Gpt2Config::from_json(&j)
                .unwrap_err()
                .contains("add_cross_attention")
        );
    }
}

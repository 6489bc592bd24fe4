//! GPT-2 checkpoints in Hugging Face's layout: loaded into arrayjit's GPT blocks
//! ([`Gpt2::from_pretrained`]), saved back so that `transformers` loads them
//! ([`Gpt2::save_pretrained`]), run for the logits of a sequence ([`Gpt2::logits`]) and for text
//! generation with a key/value cache ([`Gpt2::generate`]); and GPT-2's byte-level BPE
//! tokenizer ([`Gpt2Tokenizer`]).
//!
//! ```no_run
//! use arrayjit_train::gpt2::{Gpt2, Gpt2Tokenizer, Sampling};
//! # fn main() -> arrayjit_ir::Result<()> {
//! let backend = arrayjit_runtime::initialize(None)?;
//! // A directory with config.json, model.safetensors, vocab.json and merges.txt, e.g. from
//! // `huggingface-cli download gpt2 --local-dir gpt2`.
//! let dir = std::path::Path::new("gpt2");
//! let model = Gpt2::from_pretrained(dir, &backend)?;
//! let tokenizer = Gpt2Tokenizer::from_pretrained(dir)?;
//! let prompt = tokenizer.encode("The meaning of life is")?;
//! let tokens = model.generate(&prompt, 20, &Sampling::greedy(), &[])?;
//! println!("{}", tokenizer.decode(&tokens)?);
//! # Ok(()) }
//! ```
//!
//! Loading checks everything before it allocates anything on a device: `config.json` (a GPT-2,
//! without options the blocks do not compute), then every tensor of `model.safetensors` (present,
//! a numeric dtype, its shape, its bytes inside the file); f32, f16 and bf16 weights load
//! (converted to f32, or with [`Precision::Bf16Weights`] the matrix weights rounded to bf16:
//! half the memory, and decoding on a CPU about twice as fast, since a decoding step reads
//! every weight once). Each refusal is a typed error naming the file and the field or tensor.
//!
//! Generation compiles two routines once per batch size (a prefill over chunks of the prompt and
//! a decode of one token, see [`arrayjit_tensor::kv_cache`]) on first use; later generations of
//! any length, at any position, compile nothing.

mod config;
pub(crate) mod generate;
mod layout;
mod tokenizer;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrayjit_ir::{Error, Result};
use arrayjit_runtime::Backend;
use arrayjit_tensor::checkpoint::SafetensorsFile;
use arrayjit_tensor::nn::Gpt;
use arrayjit_tensor::{Precision, Tensor, checkpoint};

pub use config::Gpt2Config;
pub use generate::{GenerationTiming, LONG_PREFILL_CHUNK, Sampling, sample_token};
pub use tokenizer::Gpt2Tokenizer;

use generate::Generator;
use layout::layout;

/// The prefix `GPT2LMHeadModel` gives its transformer's tensors.
const PREFIX: &str = "transformer.";

/// Prompt tokens the short prefill routine takes per run, unless set
/// ([`Gpt2::set_prefill_chunk`]); a long prompt runs in chunks of [`LONG_PREFILL_CHUNK`]
/// first.
pub const DEFAULT_PREFILL_CHUNK: usize = 64;

/// Sets every layer norm's epsilon.
fn set_epsilon(model: &mut Gpt, eps: f64) {
    for norm in model
        .blocks
        .iter_mut()
        .flat_map(|b| [&mut b.norm1, &mut b.norm2])
        .chain([&mut model.final_norm])
    {
        norm.eps = eps;
    }
}

/// A GPT-2 on a backend, ready to compute logits and generate. Calls from several threads
/// are served one at a time.
pub struct Gpt2 {
    config: Gpt2Config,
    model: Gpt,
    backend: Backend,
    prefill_chunk: usize,
    /// Generation routines by batch size, compiled on first use.
    generators: Mutex<HashMap<usize, Arc<Generator>>>,
    /// Where the last generation's time went.
    last_timing: Mutex<Option<GenerationTiming>>,
    /// Held while routines run: their inputs, caches and logits serve one call at a time.
    running: Mutex<()>,
}

impl Gpt2 {
    /// Loads `dir/config.json` and `dir/model.safetensors` (Hugging Face's GPT-2 layout) with
    /// f32 products. All or nothing: see the module's doc.
    pub fn from_pretrained(dir: &Path, backend: &Backend) -> Result<Gpt2> {
        Gpt2::from_pretrained_with(dir, backend, Precision::F32)
    }

    /// [`Gpt2::from_pretrained`] in `precision`: [`Precision::F32`];
    /// [`Precision::Bf16Weights`] (the matrix weights and embeddings stored in bf16, everything
    /// else f32); or [`Precision::Bf16Products`] (f32 weights, products of operands rounded to
    /// bf16, as on a GPU's matrix units).
    pub fn from_pretrained_with(
        dir: &Path,
        backend: &Backend,
        precision: Precision,
    ) -> Result<Gpt2> {
        let config = Gpt2Config::read(&dir.join("config.json"))?;
        let weights = dir.join("model.safetensors");
        let mut file = SafetensorsFile::open(&weights)?;
        // The parameters' random draws are never made: every value comes from the file.
        let (mut model, _undrawn) = Gpt::with_pending_draws(config.model_config(precision), 0)?;
        set_epsilon(&mut model, config.layer_norm_epsilon);
        let stored = layout(&model);
        let prefix = if file.get(&format!("{PREFIX}wte.weight")).is_some() {
            PREFIX
        } else {
            ""
        };
        // Every tensor checked before any is read.
        for s in &stored {
            file.expect_shape(&format!("{prefix}{}", s.name), &s.shape)?;
        }
        let head = file.get("lm_head.weight").cloned();
        if let Some(head) = &head
            && head.shape != model.token_embedding.dims()
        {
            return Err(Error::ShapeMismatch {
                op: format!("loading lm_head.weight from {}", weights.display()),
                shapes: vec![head.shape.clone(), model.token_embedding.dims().to_vec()],
                detail: "the output head must be tied to wte.weight (the same shape and values)"
                    .into(),
            });
        }
        let mut params = Vec::new();
        let mut values = Vec::new();
        let mut embedding = None;
        for s in &stored {
            let name = format!("{prefix}{}", s.name);
            let v = file.read(&name)?;
            for (piece, part) in s.pieces.iter().zip(s.split(&v)) {
                params.push(piece.param.clone());
                values.push(part);
            }
            if s.name == "wte.weight" {
                embedding = Some(v);
            }
        }
        if head.is_some() && embedding != Some(file.read("lm_head.weight")?) {
            return Err(Error::Checkpoint {
                path: weights.display().to_string(),
                detail: "lm_head.weight differs from wte.weight: an untied output head, which \
                         GPT-2's blocks here do not have"
                    .into(),
            });
        }
        checkpoint::set_all(&params, values)?;
        Ok(Gpt2::with_model(config, model, backend))
    }

    /// A GPT-2 of `config` with random weights (GPT-2's initialization, drawn from `seed`):
    /// for benchmarks and tests, or to train from scratch.
    pub fn random(config: Gpt2Config, seed: u64, backend: &Backend) -> Result<Gpt2> {
        Gpt2::random_with(config, seed, backend, Precision::F32)
    }

    /// [`Gpt2::random`] in `precision` (see [`Gpt2::from_pretrained_with`]).
    pub fn random_with(
        config: Gpt2Config,
        seed: u64,
        backend: &Backend,
        precision: Precision,
    ) -> Result<Gpt2> {
        let mut model = Gpt::new(config.model_config(precision), seed)?;
        set_epsilon(&mut model, config.layer_norm_epsilon);
        Ok(Gpt2::with_model(config, model, backend))
    }

    fn with_model(config: Gpt2Config, model: Gpt, backend: &Backend) -> Gpt2 {
        Gpt2 {
            config,
            model,
            backend: backend.clone(),
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            generators: Mutex::new(HashMap::new()),
            last_timing: Mutex::new(None),
            running: Mutex::new(()),
        }
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` in Hugging Face's layout (f32, bf16
    /// weights as their exact f32 values; names
    /// prefixed `transformer.` as `GPT2LMHeadModel.save_pretrained` writes them), creating `dir`
    /// if needed. `transformers`' `GPT2LMHeadModel.from_pretrained(dir)` loads the result.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let stored = layout(&self.model);
        let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::with_capacity(stored.len());
        for s in &stored {
            let pieces = s
                .pieces
                .iter()
                .map(|p| p.param.values())
                .collect::<Result<Vec<_>>>()?;
            let bytes = s
                .join(&pieces)
                .into_iter()
                .flat_map(|v| (v as f32).to_le_bytes())
                .collect();
            data.push((format!("{PREFIX}{}", s.name), bytes, s.shape.clone()));
        }
        let path = dir.join("model.safetensors");
        let bad = |detail: String| Error::Checkpoint {
            path: path.display().to_string(),
            detail,
        };
        let views = data
            .iter()
            .map(|(name, bytes, shape)| {
                safetensors::tensor::TensorView::new(
                    safetensors::tensor::Dtype::F32,
                    shape.clone(),
                    bytes,
                )
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(format!("tensor {name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(metadata), &path)
            .map_err(|e| bad(format!("writing it: {e}")))?;
        let config_path = dir.join("config.json");
        let text = serde_json::to_string_pretty(&self.config.to_json())
            .map_err(|e| Error::invalid(format!("rendering the config: {e}")))?;
        std::fs::write(&config_path, text + "\n")
            .map_err(|e| Error::io(format!("writing {}", config_path.display()), e))
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The model's blocks (to train or inspect them).
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// Every parameter, in the model's order.
    pub fn params(&self) -> &[Tensor] {
        self.model.params()
    }

    /// Sets how many prompt tokens the prefill routine takes per run (for generators built
    /// after this call).
    pub fn set_prefill_chunk(&mut self, chunk: usize) -> Result<()> {
        if chunk == 0 || chunk > self.config.positions {
            return Err(Error::BadValue {
                what: "prefill chunk".into(),
                value: chunk.to_string(),
                expected: format!("1 to the model's {} positions", self.config.positions),
            });
        }
        self.prefill_chunk = chunk;
        Ok(())
    }

    /// The generation routines for `batch` rows, compiled and linked on first use: the first
    /// batch size into a context of its own, every later one into that context, so that all
    /// run on one stream and share its scratch pool (the parameters are one copy on the
    /// device either way).
    fn generator(&self, batch: usize) -> Result<Arc<Generator>> {
        let mut generators = self
            .generators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(g) = generators.get(&batch) {
            return Ok(g.clone());
        }
        let g = Arc::new(match generators.values().next() {
            Some(first) => first.sibling(&self.model, batch, self.prefill_chunk)?,
            None => Generator::new(&self.backend, &self.model, batch, self.prefill_chunk)?,
        });
        generators.insert(batch, g.clone());
        Ok(g)
    }

    /// Time spent compiling and linking generation routines so far.
    pub fn compile_time(&self) -> Duration {
        self.generators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|g| g.compile_time())
            .sum()
    }

    /// Runs of the generation routines and the routines' compiles so far, summed over batch
    /// sizes: `(runs, routines)`. A generation that compiled nothing new leaves `routines`
    /// unchanged.
    pub fn routine_counts(&self) -> (u64, usize) {
        let generators = self
            .generators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let routines: Vec<&arrayjit_runtime::Routine> =
            generators.values().flat_map(|g| g.routines()).collect();
        (
            routines.iter().map(|r| r.stats().runs).sum(),
            routines.len(),
        )
    }

    /// Where the generation routines of `batch` rows spent their time since this was last
    /// asked, statement by statement: `[prefill, long prefill, decode]` (the long prefill runs
    /// long prompts, see [`LONG_PREFILL_CHUNK`]), each `None` unless the routines
    /// were compiled to time their statements (`ARRAYJIT_DEBUG=2`, or
    /// `OptimizeSettings::profile_statements`) on a backend that can, or the routine does not
    /// exist.
    pub fn statement_profiles(
        &self,
        batch: usize,
    ) -> [Option<arrayjit_runtime::statement_profile::StatementProfile>; 3] {
        let generators = self
            .generators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match generators.get(&batch) {
            Some(g) => g.statement_profiles(),
            None => [None, None, None],
        }
    }

    /// Checks token ids: inside the vocabulary, at least one, at most `room` of them.
    fn check_ids(&self, what: &str, ids: &[usize], room: usize) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::invalid(format!(
                "{what} is empty: give at least one token"
            )));
        }
        if ids.len() > room {
            return Err(Error::BadValue {
                what: format!("{what}'s length"),
                value: ids.len().to_string(),
                expected: format!(
                    "at most {room} tokens (the model has {} positions)",
                    self.config.positions
                ),
            });
        }
        if let Some(bad) = ids.iter().find(|&&i| i >= self.config.vocabulary) {
            return Err(Error::BadValue {
                what: format!("a token id of {what}"),
                value: bad.to_string(),
                expected: format!("ids below the vocabulary's {}", self.config.vocabulary),
            });
        }
        Ok(())
    }

    /// The logits at every position of one sequence: `ids.len()` rows of `vocabulary` values
    /// (row `k`: the next token's after `ids[..=k]`).
    pub fn logits(&self, ids: &[usize]) -> Result<Vec<Vec<f32>>> {
        self.check_ids("the sequence", ids, self.config.positions)?;
        let generator = self.generator(1)?;
        let _running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (_, logits) = generator.prefill(&[ids.to_vec()], true)?;
        Ok(logits)
    }

    /// `count` tokens generated after `prompt` (fewer if one of `stop` comes: it is the last
    /// one returned). The prompt plus the new tokens must fit the model's positions.
    pub fn generate(
        &self,
        prompt: &[usize],
        count: usize,
        sampling: &Sampling,
        stop: &[usize],
    ) -> Result<Vec<usize>> {
        let mut rows = self.generate_batch(&[prompt.to_vec()], count, sampling, stop)?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// [`Gpt2::generate`] for several prompts at once (of any lengths: the shorter ones are
    /// left-padded, and the padding is hidden from attention, so each row gets what it would
    /// alone). Every row draws from its own counter of the seed's stream.
    pub fn generate_batch(
        &self,
        prompts: &[Vec<usize>],
        count: usize,
        sampling: &Sampling,
        stop: &[usize],
    ) -> Result<Vec<Vec<usize>>> {
        sampling.check()?;
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let room = self.config.positions.saturating_sub(count);
        for (k, p) in prompts.iter().enumerate() {
            let what = if prompts.len() == 1 {
                "the prompt".to_string()
            } else {
                format!("prompt {k}")
            };
            self.check_ids(&what, p, room).map_err(|e| {
                match (&e, p.len() <= self.config.positions) {
                    (Error::BadValue { what, .. }, true) if what.ends_with("length") => {
                        Error::BadValue {
                            what: format!("{what} plus the {count} tokens to generate"),
                            value: (p.len() + count).to_string(),
                            expected: format!(
                                "at most the model's {} positions",
                                self.config.positions
                            ),
                        }
                    }
                    _ => e,
                }
            })?;
        }
        let generator = self.generator(prompts.len())?;
        let _running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, timing) = generator.generate(prompts, count, sampling, stop)?;
        *self
            .last_timing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(timing);
        Ok(tokens)
    }

    /// Where the last generation's time went (its routines' compile is in
    /// [`Gpt2::compile_time`]).
    pub fn last_timing(&self) -> Option<GenerationTiming> {
        *self
            .last_timing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

//! A character-level GPT trained with one compiled step: the model of
//! [`arrayjit_tensor::nn::Gpt`], a vocabulary of the characters of a text, random windows of
//! the text as batches, AdamW with gradient clipping, held-out loss, sampling, and checkpoints
//! that resume training exactly (parameters, optimizer state and the dropout stream's step).
//!
//! Three routines are linked into one context, so they share the parameters: the training step
//! (forward, backprop, update), compiled when the trainer is built, and the loss alone (for
//! held-out text) and the logits of one window (for sampling), each compiled on its first use in
//! the same optimization context: the first step waits only for the step's code.
//!
//! ```no_run
//! use arrayjit_train::gpt::{CharVocab, GptTrainer, TrainerConfig};
//! # fn main() -> arrayjit_ir::Result<()> {
//! let text = arrayjit_train::gpt::SONNETS;
//! let vocab = CharVocab::from_text(text);
//! let data = vocab.encode(text)?;
//! let backend = arrayjit_runtime::initialize(None)?;
//! let config = TrainerConfig::small(vocab.len());
//! let mut trainer = GptTrainer::new(&backend, &config)?;
//! let (ids, targets) = arrayjit_train::gpt::batch(&data, config.batch, config.model.context, 0, 1)?;
//! let loss = trainer.train_step(&ids, &targets)?;
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrayjit_ir::{Assignments, Error, MemoryMode, MemoryType, Result, ResultExt, Tnode};
use arrayjit_opt::OptimizeCtx;
use arrayjit_runtime::{Backend, Code, CompileRequest, Context, PreparedLink, Routine};
use arrayjit_tensor::init::PendingDraws;
use arrayjit_tensor::nn::{Dropout, Gpt, GptConfig};
use arrayjit_tensor::rng::Philox;
use arrayjit_tensor::{Optimizer, Tensor, checkpoint, forward_program, grad_program};

/// Shakespeare's sonnets (1609, public domain), shipped as the demo's training text.
pub const SONNETS: &str = include_str!("../../../data/shakespeare-sonnets.txt");

/// The characters of a text, sorted: character `k` of the vocabulary is id `k`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
}

impl CharVocab {
    /// Every distinct character of `text`.
    pub fn from_text(text: &str) -> CharVocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab { chars }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<usize>> {
        text.chars()
            .map(|c| {
                self.chars.binary_search(&c).map_err(|_| Error::BadValue {
                    what: "character".into(),
                    value: format!("{c:?}"),
                    expected: "one of the vocabulary's".into(),
                })
            })
            .collect()
    }

    /// The text of `ids` (ids outside the vocabulary become `?`).
    pub fn decode(&self, ids: &[usize]) -> String {
        ids.iter()
            .map(|&i| self.chars.get(i).copied().unwrap_or('?'))
            .collect()
    }
}

/// `batch` windows of `context + 1` ids drawn from `data` with the counter-based RNG (`seed`,
/// `step`): the inputs (first `context` ids of each) and targets (the next id at each
/// position), both `batch · context` ids, row-major.
pub fn batch(
    data: &[usize],
    batch: usize,
    context: usize,
    step: u64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if data.len() <= context {
        return Err(Error::BadValue {
            what: "text length in ids".into(),
            value: data.len().to_string(),
            expected: format!(
                "more than the context ({context}): a window needs {} ids",
                context + 1
            ),
        });
    }
    let rng = Philox::new(seed, 0x6774);
    let starts = data.len() - context;
    let mut ids = Vec::with_capacity(batch * context);
    let mut targets = Vec::with_capacity(batch * context);
    for b in 0..batch {
        let u = rng.uniform(step * batch as u64 + b as u64);
        let s = ((u * starts as f64) as usize).min(starts - 1);
        ids.extend_from_slice(&data[s..s + context]);
        targets.extend_from_slice(&data[s + 1..s + context + 1]);
    }
    Ok((ids, targets))
}

/// What to train.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainerConfig {
    /// The model.
    pub model: GptConfig,
    /// Windows per step.
    pub batch: usize,
    /// The optimizer (AdamW: `Optimizer::Adam` with decoupled weight decay).
    pub optimizer: Optimizer,
    /// Global gradient-norm clipping.
    pub clip_norm: Option<f64>,
    /// Dropout probability while training (0: none), applied as GPT-2 does (see
    /// [`Gpt::forward_with`]); held-out loss and sampling run without it.
    pub dropout: f64,
    /// Seed of the parameters (and of the dropout masks).
    pub seed: u64,
}

impl TrainerConfig {
    /// The issue's benchmark model (context 64, width 128, 4 heads, 2 layers, MLP 512), batch
    /// 16, AdamW (lr 3e-3, weight decay 0.01), clipping at norm 1.
    pub fn small(vocabulary: usize) -> TrainerConfig {
        TrainerConfig {
            model: GptConfig::small(vocabulary),
            batch: 16,
            optimizer: Optimizer::Adam {
                lr: 3e-3,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 0.01,
            },
            clip_norm: Some(1.0),
            dropout: 0.0,
            seed: 1,
        }
    }
}

impl TrainerConfig {
    /// Floating-point operations of one training step's products, counted as people count
    /// them for transformers: forward multiply-adds (the projections, the MLP, the attention
    /// scores and weighted sums, the tied head) times 2, and the backward pass at twice the
    /// forward. Elementwise work, norms, the optimizer and the embedding's scatter-add are left
    /// out, so a rate from it compares steps of the same model, not with a matmul.
    pub fn step_flops(&self) -> f64 {
        let c = &self.model;
        let rows = (self.batch * c.context) as f64;
        let (d, f, v) = (c.width as f64, c.hidden as f64, c.vocabulary as f64);
        let per_layer = rows * (4.0 * d * d + 2.0 * d * f) + 2.0 * rows * c.context as f64 * d;
        let forward_macs = c.layers as f64 * per_layer + rows * d * v;
        3.0 * 2.0 * forward_macs
    }
}

/// Ids that feed one routine, and the loss or logits it produces.
struct Window {
    ids: Tensor,
    targets: Option<Tensor>,
    out: Tensor,
}

fn hosted(t: &Tensor, why: &str) -> Result<()> {
    t.node()
        .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), why)
}

/// A routine compiled and linked into the training step's context on its first use.
struct LazyRoutine {
    name: &'static str,
    program: Assignments,
    routine: OnceLock<Routine>,
    /// Its code, when it is being compiled ahead ([`GptTrainer::compile_ahead`]).
    ahead: Mutex<Option<Receiver<Result<Code>>>>,
}

impl LazyRoutine {
    fn new(name: &'static str, program: Assignments) -> LazyRoutine {
        LazyRoutine {
            name,
            program,
            routine: OnceLock::new(),
            ahead: Mutex::new(None),
        }
    }

    /// The code compiled ahead, waiting for it if it is not ready; `None` if none is being
    /// compiled (or the compiling thread ended without sending it).
    fn code_ahead(&self) -> Option<Result<Code>> {
        let receiver = self
            .ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        receiver.recv().ok()
    }
}

/// The thread compiling routines ahead ([`GptTrainer::compile_ahead`]): joined when the
/// trainer is dropped, so that no compile outlives it.
#[derive(Default)]
struct CompileAhead(Mutex<Option<JoinHandle<()>>>);

impl Drop for CompileAhead {
    fn drop(&mut self) {
        let handle = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            // A compile that panicked has already reported itself; its routine compiles again
            // on first use (which would say why).
            let _ = handle.join();
        }
    }
}

/// A GPT being trained on a backend.
pub struct GptTrainer {
    model: Gpt,
    vocabulary: usize,
    backend: Backend,
    /// The optimization context of every routine (the step's, then the lazy ones').
    optimize_ctx: OptimizeCtx,
    train: Window,
    eval: Window,
    sample: Window,
    train_step: Routine,
    eval_loss: LazyRoutine,
    logits: LazyRoutine,
    /// Time spent compiling and linking the lazy routines, when they were first used.
    lazy_compile: Mutex<Duration>,
    /// The thread compiling the lazy routines ahead, if one was started.
    compile_ahead: CompileAhead,
    /// The cached generation routines, built on the first sample.
    generator: OnceLock<crate::gpt2::generate::Generator>,
    /// The optimizer's state, saved with checkpoints.
    state: Vec<Tensor>,
    /// The learning rate node (hosted).
    pub learning_rate: Tnode,
    /// Steps taken (including those of a resumed checkpoint).
    pub steps: u64,
    /// Time spent optimizing, compiling (or loading from the cache) and linking the training
    /// step (see [`GptTrainer::lazy_compile_time`] for the other two routines).
    pub compile_and_link: Duration,
}

/// A GPT's three programs, built without a backend: the training step (forward, backprop,
/// clipped update), the held-out loss and the logits of one window, over one model's
/// parameters. [`GptTrainer::new`] compiles them; [`GptPrograms::routines`] gives them to
/// anything else that compiles or plans routines (ahead-of-time compiles, GPU plans).
pub struct GptPrograms {
    model: Gpt,
    train: Window,
    eval: Window,
    sample: Window,
    step: Assignments,
    eval_program: Assignments,
    sample_program: Assignments,
    state: Vec<Tensor>,
    learning_rate: Tnode,
}

impl GptPrograms {
    /// Builds a fresh model of `config` and its programs.
    pub fn new(config: &TrainerConfig) -> Result<GptPrograms> {
        let (programs, pending) = GptPrograms::with_pending_draws(config)?;
        pending.draw()?;
        Ok(programs)
    }

    /// [`GptPrograms::new`] with the model's parameter values not drawn yet (see
    /// [`Gpt::with_pending_draws`]): the programs can be compiled meanwhile, but nothing may
    /// run or read the parameters before the returned draws are made.
    pub fn with_pending_draws(config: &TrainerConfig) -> Result<(GptPrograms, PendingDraws)> {
        let c = config.model;
        if !c.precision.trainable() {
            return Err(Error::InvalidSetting {
                setting: "precision".into(),
                value: c.precision.name().into(),
                expected: "f32 or bf16 for training (weights stored in bf16 are for inference: \
                           an update smaller than a weight's last bit would be lost; bf16 \
                           multiplies in bf16 and keeps f32 weights)"
                    .into(),
            });
        }
        let (model, pending) = Gpt::with_pending_draws(c, config.seed)?;
        let dropout = if config.dropout > 0.0 {
            Some(Dropout::new(config.dropout, config.seed ^ 0xd209_0a7e)?)
        } else {
            None
        };
        let zeros = |n: usize| vec![0; n];
        let window = |label: &str,
                      batch: usize,
                      with_targets: bool,
                      dropout: Option<&Dropout>|
         -> Result<Window> {
            let n = batch * c.context;
            let ids = Tensor::ids(&[batch, c.context], label, &zeros(n), c.vocabulary)?;
            let targets = if with_targets {
                Some(Tensor::ids(
                    &[batch, c.context],
                    &format!("{label}_targets"),
                    &zeros(n),
                    c.vocabulary,
                )?)
            } else {
                None
            };
            let out = match &targets {
                Some(t) => model.loss_with(&ids, t, dropout)?,
                None => model.forward(&ids)?,
            };
            hosted(&out, "gpt: read on the host")?;
            Ok(Window { ids, targets, out })
        };
        let train = window("train_ids", config.batch, true, dropout.as_ref())?;
        let eval = window("eval_ids", config.batch, true, None)?;
        let sample = window("sample_ids", 1, false, None)?;
        let grads = grad_program(&train.out)?;
        let update = arrayjit_tensor::update_program_clipped(
            &config.optimizer,
            &grads.params,
            config.clip_norm,
        )?;
        let mut step = grads.program.then(update.program.clone());
        let mut state = update.state;
        if let Some(d) = &dropout {
            // After every read of the masks: the next step draws new ones.
            step = step.then(d.rng.advance());
            state.push(d.rng.step().clone());
        }
        let eval_program = forward_program(&[&eval.out]);
        let sample_program = forward_program(&[&sample.out]);
        let programs = GptPrograms {
            model,
            train,
            eval,
            sample,
            step,
            eval_program,
            sample_program,
            state,
            learning_rate: update.lr,
        };
        Ok((programs, pending))
    }

    /// The routines by name, in the order a trainer compiles them (each in the optimization
    /// context of the ones before): `gpt_train_step`, `gpt_eval_loss`, `gpt_logits`.
    pub fn routines(&self) -> [(&'static str, &Assignments); 3] {
        [
            ("gpt_train_step", &self.step),
            ("gpt_eval_loss", &self.eval_program),
            ("gpt_logits", &self.sample_program),
        ]
    }

    /// The model.
    pub fn model(&self) -> &Gpt {
        &self.model
    }
}

/// Whether [`GptTrainer::new`] makes the step's arrays beside its compile: on machines with
/// at least four hardware threads. The step compiles as a few units at once (its statement
/// functions in two or more, the product helper, the dispatch), which leave cores idle there,
/// so filling the parameters' arrays (on a CPU device mostly the system's first touch of their
/// memory) costs no time. On two, it only takes the cores from the compiler: on a 2-core VM,
/// the 12-layer width-768 model's link went from 155–175 to 6–8 ms, but its compile took
/// 200–400 ms longer.
pub fn links_beside_compile() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4)
}

impl GptTrainer {
    /// Builds the model and its three routines ([`GptPrograms`]), compiles the training step
    /// and links it on a new stream of device 0 (the other two compile on first use).
    ///
    /// Once the step is optimized, it renders and compiles on this thread while another draws
    /// the parameters' initial values (nothing in a compile reads them). On a machine with
    /// cores the compiler leaves idle ([`links_beside_compile`]) that thread then also makes
    /// the step's arrays, filled with those values ([`Context::prepare_link`]), so that the
    /// link only commits; elsewhere the arrays are made after the compile.
    pub fn new(backend: &Backend, config: &TrainerConfig) -> Result<GptTrainer> {
        GptTrainer::new_linking(backend, config, links_beside_compile())
    }

    /// [`GptTrainer::new`], making the step's arrays beside its compile (`beside`) or after it,
    /// whatever the machine's cores. The trainer is the same either way.
    pub fn new_linking(
        backend: &Backend,
        config: &TrainerConfig,
        beside: bool,
    ) -> Result<GptTrainer> {
        let (p, pending) = GptPrograms::with_pending_draws(config)?;
        let optimize_ctx = OptimizeCtx::empty();
        let started = Instant::now();
        let on_backend = || format!("building the GPT training step on {}", backend.name());
        let optimized = backend
            .optimize_in(&optimize_ctx, "gpt_train_step", &p.step, &[])
            .context(on_backend)?;
        let stream = backend.get_device(0)?.new_stream()?;
        let context = Context::new(&stream);
        // The other thread's work: the draws, then (beside the compile) the link's arrays.
        let prepare = || -> Result<Option<PreparedLink>> {
            pending.clone().draw()?;
            beside.then(|| context.prepare_link(&optimized)).transpose()
        };
        let (code, prepared) = std::thread::scope(|scope| {
            let preparing = std::thread::Builder::new()
                .name("arrayjit draws".into())
                .spawn_scoped(scope, prepare);
            let code = backend.compile(CompileRequest::optimized(std::slice::from_ref(&optimized)));
            let prepared = match preparing {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                // A thread the system refuses to start: the draws are made here instead.
                Err(_) => prepare(),
            };
            (code, prepared)
        });
        let code = code
            .context(on_backend)?
            .pop()
            .expect("one routine in, one code out");
        let train_step = prepared
            .and_then(|early| early.map_or_else(|| context.prepare_link(&optimized), Ok))
            .and_then(|prepared| prepared.finish(&code))
            .context(on_backend)?;
        let eval_loss = LazyRoutine::new("gpt_eval_loss", p.eval_program);
        let logits = LazyRoutine::new("gpt_logits", p.sample_program);
        Ok(GptTrainer {
            vocabulary: config.model.vocabulary,
            model: p.model,
            backend: backend.clone(),
            optimize_ctx,
            train: p.train,
            eval: p.eval,
            sample: p.sample,
            train_step,
            eval_loss,
            logits,
            lazy_compile: Mutex::new(Duration::ZERO),
            compile_ahead: CompileAhead::default(),
            generator: OnceLock::new(),
            state: p.state,
            learning_rate: p.learning_rate,
            steps: 0,
            compile_and_link: started.elapsed(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// Time spent compiling and linking the held-out-loss and sampling routines so far (they
    /// compile on first use).
    pub fn lazy_compile_time(&self) -> Duration {
        *self
            .lazy_compile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts compiling the held-out-loss and sampling routines on a thread of their own (in
    /// that order, in the step's optimize context, as their first uses would), so that their
    /// first use only links them, or waits for what is left of their compile. Worth it where
    /// the training steps leave a core idle (`sync_cc` on a machine of several cores); on a
    /// backend whose steps use every core it only moves the compile into the steps' time.
    /// Does nothing for routines built or being compiled already; returns whether a thread was
    /// started (a thread the system refuses leaves the routines to compile on first use).
    /// Dropping the trainer waits for the thread.
    pub fn compile_ahead(&self) -> bool {
        let mut slot = self
            .compile_ahead
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_some() {
            return false;
        }
        let mut work = Vec::new();
        let mut receivers = Vec::new();
        for lazy in [&self.eval_loss, &self.logits] {
            if lazy.routine.get().is_some() {
                continue;
            }
            let (sender, receiver) = std::sync::mpsc::channel();
            work.push((lazy.name, lazy.program.clone(), sender));
            receivers.push((lazy, receiver));
        }
        if work.is_empty() {
            return false;
        }
        let (backend, optimize_ctx) = (self.backend.clone(), self.optimize_ctx.clone());
        let started = std::thread::Builder::new()
            .name("arrayjit compile ahead".into())
            .spawn(move || {
                for (name, program, sender) in work {
                    // A receiver gone (the trainer dropped) leaves nothing to send to.
                    let _ = sender.send(backend.compile(
                        CompileRequest::routine(name, &program).in_context(&optimize_ctx),
                    ));
                }
            });
        let Ok(handle) = started else {
            return false;
        };
        // Each routine gets its own code (one that was linked meanwhile ignores it).
        for (lazy, receiver) in receivers {
            *lazy
                .ahead
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(receiver);
        }
        *slot = Some(handle);
        true
    }

    /// `lazy`'s routine, compiled and linked into the step's context if this is its first use.
    fn routine<'a>(&self, lazy: &'a LazyRoutine) -> Result<&'a Routine> {
        if let Some(r) = lazy.routine.get() {
            return Ok(r);
        }
        let started = Instant::now();
        let first_use = || format!("building {} on first use", lazy.name);
        let code = match lazy.code_ahead() {
            Some(code) => code,
            None => self.backend.compile(
                CompileRequest::routine(lazy.name, &lazy.program).in_context(&self.optimize_ctx),
            ),
        }
        .context(first_use)?;
        let routine = self.train_step.context().link(&code).context(first_use)?;
        // Another thread may have linked it meanwhile: either routine serves.
        let _ = lazy.routine.set(routine);
        *self
            .lazy_compile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += started.elapsed();
        Ok(lazy.routine.get().expect("set above"))
    }

    fn feed(&self, routine: &Routine, w: &Window, ids: &[usize], targets: &[usize]) -> Result<()> {
        w.ids.set_ids(ids, self.vocabulary)?;
        routine.context().from_host(w.ids.node())?;
        if let Some(t) = &w.targets {
            t.set_ids(targets, self.vocabulary)?;
            routine.context().from_host(t.node())?;
        }
        Ok(())
    }

    fn expect_len(&self, what: &str, got: usize, w: &Window) -> Result<()> {
        let want: usize = w.ids.dims().iter().product();
        if got != want {
            return Err(Error::ShapeMismatch {
                op: format!("gpt {what}"),
                shapes: vec![w.ids.dims().to_vec()],
                detail: format!("expected {want} ids ({:?}), got {got}", w.ids.dims()),
            });
        }
        Ok(())
    }

    /// One training step on `ids` and `targets` (`batch · context` each, from [`batch`]);
    /// returns the step's loss.
    pub fn train_step(&mut self, ids: &[usize], targets: &[usize]) -> Result<f64> {
        self.expect_len("train_step ids", ids.len(), &self.train)?;
        self.expect_len("train_step targets", targets.len(), &self.train)?;
        self.feed(&self.train_step, &self.train, ids, targets)?;
        self.train_step.run()?;
        self.steps += 1;
        self.train_step.context().to_host(self.train.out.node())?;
        Ok(self.train.out.values()?[0])
    }

    /// The training step's routine (for its run statistics and, when compiled to time its
    /// statements, [`Routine::statement_profile`]).
    pub fn step_routine(&self) -> &Routine {
        &self.train_step
    }

    /// The loss on `ids` and `targets` without training.
    pub fn eval_loss(&self, ids: &[usize], targets: &[usize]) -> Result<f64> {
        self.expect_len("eval_loss ids", ids.len(), &self.eval)?;
        self.expect_len("eval_loss targets", targets.len(), &self.eval)?;
        let routine = self.routine(&self.eval_loss)?;
        self.feed(routine, &self.eval, ids, targets)?;
        routine.run()?;
        routine.context().to_host(self.eval.out.node())?;
        Ok(self.eval.out.values()?[0])
    }

    /// The logits of the id following `prefix` (its last `context` ids are used).
    pub fn next_logits(&self, prefix: &[usize]) -> Result<Vec<f64>> {
        let t = self.model.config.context;
        if prefix.is_empty() {
            return Err(Error::invalid(
                "sampling needs at least one id to start from",
            ));
        }
        let tail = &prefix[prefix.len().saturating_sub(t)..];
        // Later positions never influence earlier ones (causal attention): pad after the tail.
        let mut window = tail.to_vec();
        window.resize(t, 0);
        let routine = self.routine(&self.logits)?;
        self.feed(routine, &self.sample, &window, &[])?;
        routine.run()?;
        routine.context().to_host(self.sample.out.node())?;
        let all = self.sample.out.values()?;
        let v = self.vocabulary;
        let at = tail.len() - 1;
        Ok(all[at * v..(at + 1) * v].to_vec())
    }

    /// `count` ids sampled after `prompt` at `temperature` (0: the most likely id), from the
    /// counter-based RNG with `seed`.
    ///
    /// While the sequence fits the context, each new id costs one decoding step with the
    /// key/value cache ([`crate::gpt2`]'s routines, linked into the training step's context on
    /// first use, so they read the parameters as training leaves them); past the context, each
    /// id is computed from the last `context` ids ([`GptTrainer::next_logits`]).
    pub fn generate(
        &self,
        prompt: &[usize],
        count: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Vec<usize>> {
        if prompt.is_empty() {
            return Err(Error::invalid(
                "sampling needs at least one id to start from",
            ));
        }
        if let Some(bad) = prompt.iter().find(|&&i| i >= self.vocabulary) {
            return Err(Error::BadValue {
                what: "a prompt id".into(),
                value: bad.to_string(),
                expected: format!("ids below the vocabulary's {}", self.vocabulary),
            });
        }
        let rng = Philox::new(seed, 0x5a4d);
        let context = self.model.config.context;
        let mut ids = prompt.to_vec();
        let mut k = 0;
        if count > 0 && prompt.len() < context {
            let generator = self.generator()?;
            let (pads, logits) = generator.prefill(&[ids.clone()], false)?;
            let mut logits: Vec<f64> = logits[0].iter().map(|&v| f64::from(v)).collect();
            loop {
                ids.push(sample(&logits, temperature, rng.uniform(k as u64)));
                k += 1;
                if k == count || ids.len() >= context {
                    break;
                }
                let slot = ids.len() - 1;
                let next = generator.decode(slot, &ids[slot..], &pads)?;
                logits = next[0].iter().map(|&v| f64::from(v)).collect();
            }
        }
        for k in k..count {
            let logits = self.next_logits(&ids)?;
            ids.push(sample(&logits, temperature, rng.uniform(k as u64)));
        }
        Ok(ids[prompt.len()..].to_vec())
    }

    /// The cached generation routines, compiled and linked into the step's context on first
    /// use.
    fn generator(&self) -> Result<&crate::gpt2::generate::Generator> {
        if let Some(g) = self.generator.get() {
            return Ok(g);
        }
        let started = Instant::now();
        let chunk = self
            .model
            .config
            .context
            .min(crate::gpt2::DEFAULT_PREFILL_CHUNK);
        let g = crate::gpt2::generate::Generator::linked(
            &self.backend,
            &self.model,
            1,
            chunk,
            Some((&self.optimize_ctx, self.train_step.context())),
        )
        .context(|| "building the cached sampling routines on first use".to_string())?;
        // Another thread may have built them meanwhile: either serves.
        let _ = self.generator.set(g);
        *self
            .lazy_compile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += started.elapsed();
        Ok(self.generator.get().expect("set above"))
    }

    fn saved(&self) -> Vec<Tensor> {
        let mut all = self.model.params().to_vec();
        all.extend(self.state.iter().cloned());
        all
    }

    /// Saves the parameters and the optimizer's state (safetensors).
    pub fn save(&self, path: &Path) -> Result<()> {
        let context = self.train_step.context();
        let saved = self.saved();
        for t in &saved {
            context.to_host(t.node())?;
        }
        checkpoint::save(&saved, path)
    }

    /// Loads what [`GptTrainer::save`] wrote (nothing changes on an error) and copies it to the
    /// device; returns the step count it reached (0 for an optimizer without one).
    pub fn load(&mut self, path: &Path) -> Result<u64> {
        let saved = self.saved();
        checkpoint::load(&saved, path)?;
        let context = self.train_step.context();
        for t in &saved {
            context.from_host(t.node())?;
        }
        let steps = self
            .state
            .iter()
            .find(|t| t.label() == "adam_step")
            .map(|t| t.values().map(|v| v[0] as u64))
            .transpose()?
            .unwrap_or(0);
        self.steps = steps;
        Ok(steps)
    }
}

/// An id drawn from `softmax(logits / temperature)` with the uniform number `u` (the arg max
/// at temperature 0).
pub fn sample(logits: &[f64], temperature: f64, u: f64) -> usize {
    let best =
        logits.iter().enumerate().fold(
            (0, f64::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        );
    if temperature <= 0.0 {
        return best.0;
    }
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| ((l - best.1) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w / total;
        if u < acc {
            return i;
        }
    }
    best.0
}

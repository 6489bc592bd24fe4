//! Generation with a key/value cache ([`arrayjit_tensor::kv_cache`]): a prefill routine over a
//! fixed chunk of tokens and a decode routine over one, compiled together once per batch size,
//! linked into one context that holds the caches; and sampling (greedy, temperature, top-k,
//! top-p) from the counter-based RNG.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use arrayjit_ir::{Error, Result, ResultExt};
use arrayjit_opt::OptimizeCtx;
use arrayjit_runtime::{Backend, CompileRequest, Context, Routine};
use arrayjit_tensor::forward_program;
use arrayjit_tensor::kv_cache::{CachedStep, KvCache, PADDING_SCORE, StepLogits};
use arrayjit_tensor::nn::Gpt;
use arrayjit_tensor::rng::Philox;

/// How each new token is drawn from the logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 takes the most likely token (greedy).
    pub temperature: f64,
    /// Draw among the `k` most likely tokens only.
    pub top_k: Option<usize>,
    /// Draw among the fewest most likely tokens whose probabilities add up to at least `p`
    /// (nucleus sampling), `0 < p <= 1`.
    pub top_p: Option<f64>,
    /// Seed of the draws: the same seed gives the same tokens.
    pub seed: u64,
}

impl Sampling {
    /// The most likely token every time.
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }

    /// Checks the settings, naming a bad one.
    pub fn check(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::BadValue {
                what: "temperature".into(),
                value: self.temperature.to_string(),
                expected: "a finite number >= 0 (0: greedy)".into(),
            });
        }
        if self.top_k == Some(0) {
            return Err(Error::BadValue {
                what: "top_k".into(),
                value: "0".into(),
                expected: "at least 1 (or none)".into(),
            });
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(Error::BadValue {
                what: "top_p".into(),
                value: p.to_string(),
                expected: "a number in (0, 1] (or none)".into(),
            });
        }
        Ok(())
    }

    /// The uniform number of row `row`'s `k`-th token.
    fn uniform(&self, rng: &Philox, k: usize, row: usize, rows: usize) -> f64 {
        rng.uniform((k * rows + row) as u64)
    }
}

/// A token drawn from `logits` with `sampling`, using the uniform number `u` in `[0, 1)`.
/// Greedy picks the first of equal maxima (as `argmax` does).
pub fn sample_token(logits: &[f32], sampling: &Sampling, u: f64) -> usize {
    let best =
        logits.iter().enumerate().fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        );
    if sampling.temperature <= 0.0 || logits.is_empty() {
        return best.0;
    }
    // Candidates, most likely first (ties by id).
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(k) = sampling.top_k {
        order.truncate(k.max(1));
    }
    let top = f64::from(best.1);
    let mut weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - top) / sampling.temperature).exp())
        .collect();
    if let Some(p) = sampling.top_p {
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let mut keep = weights.len();
        for (n, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= p {
                keep = n + 1;
                break;
            }
        }
        order.truncate(keep);
        weights.truncate(keep);
    }
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    for (&i, w) in order.iter().zip(&weights) {
        acc += w / total;
        if u < acc {
            return i;
        }
    }
    order.last().copied().unwrap_or(best.0)
}

/// Where a generation's time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationTiming {
    /// Prompt tokens of the longest row.
    pub prompt_tokens: usize,
    /// Running the prompt through the prefill routine, to the first new token's logits.
    pub prefill: Duration,
    /// Decoding steps run (each gives every row one more token's logits).
    pub decode_steps: usize,
    /// Their time, sampling on the host included.
    pub decode: Duration,
}

impl GenerationTiming {
    /// Decoding steps per second (0 without any).
    pub fn decode_steps_per_second(&self) -> f64 {
        if self.decode_steps == 0 || self.decode.is_zero() {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode.as_secs_f64()
    }
}

/// One cached step's graph and its routine.
struct StepRoutine {
    step: CachedStep,
    routine: Routine,
}

impl StepRoutine {
    /// Runs the step at slot `start` over `ids` and their `positions` (`batch · chunk` each),
    /// with `pick` (one index into the chunk per row) for a step that computes one token's
    /// logits per row; returns the logits (`batch · (chunk or 1) · vocabulary`) if `read`.
    fn run(
        &self,
        start: usize,
        ids: &[usize],
        positions: &[usize],
        pick: Option<&[usize]>,
        read: bool,
    ) -> Result<Option<Vec<f32>>> {
        let context = self.routine.context();
        let s = &self.step;
        s.ids.set_ids(ids, s.vocabulary)?;
        context.from_host(s.ids.node())?;
        s.positions.set_ids(positions, s.positions_upper)?;
        context.from_host(s.positions.node())?;
        if let (Some(node), Some(pick)) = (&s.pick, pick) {
            node.set_ids(pick, s.chunk())?;
            context.from_host(node.node())?;
        }
        self.routine.set_static(&s.start, start as i64)?;
        self.routine.run()?;
        if !read {
            return Ok(None);
        }
        let logits = s.logits.node();
        context.to_host(logits)?;
        let values = logits.host().array()?.to_vec_f64()?;
        Ok(Some(values.into_iter().map(|v| v as f32).collect()))
    }
}

/// Tokens the long prefill routine takes per run: large enough that its products run near the
/// product helper's speed (GPT-2 small's 512-token prompt, one core of an AMD EPYC (Zen 4):
/// 1285 ms in chunks of 64, 1023 in 128, 973 in 256, 928 in 512, with fused attention over the
/// cache), at most the cache's slots.
pub const LONG_PREFILL_CHUNK: usize = 512;

/// The prefill and decode routines of one batch size, and the caches they share (used by
/// [`crate::gpt2::Gpt2`] and by the character GPT's trainer).
pub struct Generator {
    cache: KvCache,
    prefill: StepRoutine,
    /// The prefill over [`LONG_PREFILL_CHUNK`] tokens (or the slots), for long prompts; `None`
    /// where that is not longer than `prefill`'s chunk.
    long_prefill: Option<StepRoutine>,
    decode: StepRoutine,
    /// The step over a chunk that computes every token's logits ([`Generator::prefill`] with
    /// `all`), compiled and linked on first use.
    every: CachedStep,
    every_routine: OnceLock<StepRoutine>,
    backend: Backend,
    optimize_ctx: OptimizeCtx,
    /// Time spent optimizing, compiling and linking the routines.
    compile_time: Mutex<Duration>,
}

/// Optimizes each cached step's logits for `backend` in `ctx`, with its `start` bound.
fn optimized(
    backend: &Backend,
    ctx: &OptimizeCtx,
    steps: &[(&str, &CachedStep)],
) -> Result<Vec<std::sync::Arc<arrayjit_opt::Optimized>>> {
    steps
        .iter()
        .map(|(name, step)| {
            backend.optimize_in(
                ctx,
                name,
                &forward_program(&[&step.logits]),
                std::slice::from_ref(&step.start),
            )
        })
        .collect()
}

impl Generator {
    /// Compiles both routines (one compiler run) for `batch` rows of the model's context, the
    /// prefill over `chunk` tokens, and links them into one new context.
    pub fn new(backend: &Backend, model: &Gpt, batch: usize, chunk: usize) -> Result<Generator> {
        Generator::linked(backend, model, batch, chunk, None)
    }

    /// [`Generator::new`], optimized in and linked into an existing optimization context and
    /// context (`within`) when given: a trainer's, so that generation reads the parameters as
    /// training leaves them on the device.
    pub fn linked(
        backend: &Backend,
        model: &Gpt,
        batch: usize,
        chunk: usize,
        within: Option<(&OptimizeCtx, &Context)>,
    ) -> Result<Generator> {
        let started = Instant::now();
        let slots = model.config.context;
        let cache = KvCache::new(model, batch, slots)?;
        let chunk = chunk.clamp(1, slots);
        let prefill = model.cached_step(&cache, chunk, "prefill", StepLogits::Picked)?;
        let long_chunk = LONG_PREFILL_CHUNK.min(slots);
        let long_prefill = if long_chunk > chunk {
            Some(model.cached_step(&cache, long_chunk, "prefill_long", StepLogits::Picked)?)
        } else {
            None
        };
        let decode = model.cached_step(&cache, 1, "decode", StepLogits::All)?;
        let every = model.cached_step(&cache, chunk, "prefill_all", StepLogits::All)?;
        let optimize_ctx = within.map_or_else(OptimizeCtx::empty, |(ctx, _)| ctx.clone());
        let building = || format!("building the generation routines on {}", backend.name());
        let mut steps = vec![("gpt2_prefill", &prefill), ("gpt2_decode", &decode)];
        steps.extend(long_prefill.as_ref().map(|s| ("gpt2_prefill_long", s)));
        let optimized = optimized(backend, &optimize_ctx, &steps).context(building)?;
        let mut codes = backend
            .compile(CompileRequest::optimized(&optimized))
            .context(building)?;
        let long_code = long_prefill.as_ref().and_then(|_| codes.pop());
        let decode_code = codes.pop().expect("a code per routine");
        let prefill_code = codes.pop().expect("a code per routine");
        let prefill_routine = match within {
            Some((_, context)) => context.link(&prefill_code),
            None => Context::new(&backend.get_device(0)?.new_stream()?).link(&prefill_code),
        }
        .context(building)?;
        let decode_routine = prefill_routine
            .context()
            .link(&decode_code)
            .context(building)?;
        let long_prefill = match (long_prefill, long_code) {
            (Some(step), Some(code)) => Some(StepRoutine {
                step,
                routine: prefill_routine.context().link(&code).context(building)?,
            }),
            _ => None,
        };
        Ok(Generator {
            cache,
            prefill: StepRoutine {
                step: prefill,
                routine: prefill_routine,
            },
            long_prefill,
            decode: StepRoutine {
                step: decode,
                routine: decode_routine,
            },
            every,
            every_routine: OnceLock::new(),
            backend: backend.clone(),
            optimize_ctx,
            compile_time: Mutex::new(started.elapsed()),
        })
    }

    /// Time spent optimizing, compiling and linking the routines so far.
    pub fn compile_time(&self) -> Duration {
        *self
            .compile_time
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The all-logits step's routine, compiled and linked on first use.
    fn every(&self) -> Result<&StepRoutine> {
        if let Some(r) = self.every_routine.get() {
            return Ok(r);
        }
        let started = Instant::now();
        let building = || "building the all-logits prefill routine on first use".to_string();
        let optimized = optimized(
            &self.backend,
            &self.optimize_ctx,
            &[("gpt2_prefill_all", &self.every)],
        )
        .context(building)?;
        let code = self
            .backend
            .compile(CompileRequest::optimized(&optimized))
            .context(building)?
            .pop()
            .expect("one routine in, one code out");
        let routine = self
            .prefill
            .routine
            .context()
            .link(&code)
            .context(building)?;
        // Another thread may have linked it meanwhile: either serves.
        let _ = self.every_routine.set(StepRoutine {
            step: self.every.clone(),
            routine,
        });
        *self
            .compile_time
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += started.elapsed();
        Ok(self.every_routine.get().expect("set above"))
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.cache.batch()
    }

    /// Sets the padding of every row (`pads[r]` slots before its first token) for `steps`.
    fn set_padding(&self, pads: &[usize], steps: &[&StepRoutine]) -> Result<()> {
        let slots = self.cache.slots();
        let mask: Vec<f64> = pads
            .iter()
            .flat_map(|&pad| (0..slots).map(move |s| if s < pad { PADDING_SCORE } else { 0.0 }))
            .collect();
        for step in steps {
            let node = step.step.key_mask.node();
            node.host().set_values(&mask)?;
            step.routine.context().from_host(node)?;
        }
        Ok(())
    }

    /// The prefill routine for a prompt with `remaining` tokens still to run: the long one
    /// where at least three quarters of its chunk are prompt tokens (it then costs less than
    /// chunks of the short one: a run of 512 tokens cost about as much as 370 tokens in chunks
    /// of 64 in the measurement of [`LONG_PREFILL_CHUNK`]), else the short one.
    fn prefill_step(&self, remaining: usize) -> &StepRoutine {
        match &self.long_prefill {
            Some(long) if 4 * remaining >= 3 * long.step.chunk() => long,
            _ => &self.prefill,
        }
    }

    /// Runs `tokens` (one row each, left-padded to the longest: `pads[r]` slots of padding)
    /// through a prefill routine, in chunks; returns the padding and the logits: at every slot
    /// of the longest row (`slots_used · batch` rows of `vocabulary`, by slot then row) if
    /// `all` (the all-logits routine, compiled on first use), else at the last slot only
    /// (`batch` rows), from the routines that compute only those (long chunks while much of
    /// the prompt is left, then short ones).
    pub fn prefill(&self, tokens: &[Vec<usize>], all: bool) -> Result<(Vec<usize>, Vec<Vec<f32>>)> {
        let every = if all { Some(self.every()?) } else { None };
        let batch = self.batch();
        let longest = tokens.iter().map(Vec::len).max().unwrap_or(0);
        let pads: Vec<usize> = tokens.iter().map(|t| longest - t.len()).collect();
        // Every routine this generation runs reads the padding.
        let used: Vec<&StepRoutine> = match every {
            Some(every) => vec![every, &self.decode],
            None => [
                Some(&self.prefill),
                self.long_prefill.as_ref(),
                Some(&self.decode),
            ]
            .into_iter()
            .flatten()
            .collect(),
        };
        self.set_padding(&pads, &used)?;
        let slots = self.cache.slots();
        let vocabulary = self.prefill.step.vocabulary;
        let mut out = Vec::new();
        let mut done = 0;
        while done < longest {
            let step = every.unwrap_or_else(|| self.prefill_step(longest - done));
            let chunk = step.step.chunk();
            // The last chunk may start earlier than `done` to stay inside the cache: it
            // computes some slots again, with the same values.
            let start = done.min(slots - chunk);
            let mut ids = Vec::with_capacity(batch * chunk);
            let mut positions = Vec::with_capacity(batch * chunk);
            for (row, pad) in tokens.iter().zip(&pads) {
                for slot in start..start + chunk {
                    let id = slot
                        .checked_sub(*pad)
                        .and_then(|k| row.get(k))
                        .copied()
                        .unwrap_or(0);
                    ids.push(id);
                    positions.push(slot.saturating_sub(*pad));
                }
            }
            let last = (start + chunk).min(longest);
            let holds_last = last == longest;
            if all {
                let logits = step
                    .run(start, &ids, &positions, None, true)?
                    .unwrap_or_default();
                for slot in done..last {
                    for row in 0..batch {
                        let at = (row * chunk + slot - start) * vocabulary;
                        out.push(logits[at..at + vocabulary].to_vec());
                    }
                }
            } else {
                // Every row's last prompt token sits at slot `longest - 1`.
                let pick = vec![(longest - 1).saturating_sub(start).min(chunk - 1); batch];
                let logits = step.run(start, &ids, &positions, Some(&pick), holds_last)?;
                if let Some(logits) = logits {
                    out.extend(logits.chunks_exact(vocabulary).map(<[f32]>::to_vec));
                }
            }
            done = last;
        }
        Ok((pads, out))
    }

    /// One decoding step: the token `ids[r]` of each row at slot `slot` (row `r`'s position
    /// `slot - pads[r]`); returns each row's logits.
    pub fn decode(&self, slot: usize, ids: &[usize], pads: &[usize]) -> Result<Vec<Vec<f32>>> {
        let positions: Vec<usize> = pads.iter().map(|p| slot.saturating_sub(*p)).collect();
        let logits = self
            .decode
            .run(slot, ids, &positions, None, true)?
            .unwrap_or_default();
        Ok(logits
            .chunks_exact(self.decode.step.vocabulary)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// A generator for another batch size linked into this one's optimization context and
    /// context: it runs on the same stream, sharing its scratch pool, and has caches, inputs
    /// and logits of its own.
    pub fn sibling(&self, model: &Gpt, batch: usize, chunk: usize) -> Result<Generator> {
        Generator::linked(
            &self.backend,
            model,
            batch,
            chunk,
            Some((&self.optimize_ctx, self.prefill.routine.context())),
        )
    }

    /// The statement profiles of the prefill, long prefill and decode routines (see
    /// [`crate::gpt2::Gpt2::statement_profiles`]).
    pub fn statement_profiles(
        &self,
    ) -> [Option<arrayjit_runtime::statement_profile::StatementProfile>; 3] {
        [
            self.prefill.routine.statement_profile(),
            self.long_prefill
                .as_ref()
                .and_then(|r| r.routine.statement_profile()),
            self.decode.routine.statement_profile(),
        ]
    }

    /// Times the routines ran and compiled since they were built (for checks that a
    /// generation compiled nothing new).
    pub fn routines(&self) -> Vec<&Routine> {
        let mut all = vec![&self.prefill.routine, &self.decode.routine];
        all.extend(self.long_prefill.as_ref().map(|r| &r.routine));
        all.extend(self.every_routine.get().map(|r| &r.routine));
        all
    }

    /// Draws `count` tokens after each of `prompts` (see [`crate::gpt2::Gpt2::generate_batch`]).
    pub fn generate(
        &self,
        prompts: &[Vec<usize>],
        count: usize,
        sampling: &Sampling,
        stop: &[usize],
    ) -> Result<(Vec<Vec<usize>>, GenerationTiming)> {
        let rows = prompts.len();
        let mut out = vec![Vec::with_capacity(count); rows];
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut timing = GenerationTiming {
            prompt_tokens: longest,
            ..GenerationTiming::default()
        };
        if count == 0 {
            return Ok((out, timing));
        }
        let started = Instant::now();
        let (pads, mut logits) = self.prefill(prompts, false)?;
        timing.prefill = started.elapsed();
        let started = Instant::now();
        let rng = Philox::new(sampling.seed, 0x6e78);
        let mut finished = vec![false; rows];
        for k in 0..count {
            let mut next = vec![0; rows];
            for row in 0..rows {
                if finished[row] {
                    continue;
                }
                let u = sampling.uniform(&rng, k, row, rows);
                let token = sample_token(&logits[row], sampling, u);
                out[row].push(token);
                next[row] = token;
                finished[row] = stop.contains(&token);
            }
            if k + 1 == count || finished.iter().all(|&f| f) {
                break;
            }
            logits = self.decode(longest + k, &next, &pads)?;
            timing.decode_steps += 1;
        }
        timing.decode = started.elapsed();
        Ok((out, timing))
    }
}

//! Schedule search: times variants of a routine's schedules on its backend and keeps the
//! fastest, stored next to the compile cache so later processes on the same machine reuse it.
//!
//! Semantics:
//! - The heuristics (from the device's description) always come first; a variant replaces the
//!   best so far only when it is faster by at least [`SearchSettings::min_gain`], and still is
//!   when both are timed again, so noise does not move the choice away from the heuristics.
//! - Variants are a [`ScheduleChoice`]: on a CPU the register tile and cache blocks of blocked
//!   products and the accumulators of vectorized reductions; on a GPU backend the tile of
//!   tiled products and the group size of every pass; and whether loops are fused. Candidates
//!   are timed on the backend's device 0 (the GPU itself where there is one). The search walks
//!   one knob at a time (coordinate descent), keeping the best value of each before the next.
//!   Variants whose rendered source equals one already timed are not compiled again, so a
//!   routine without products or reductions costs one compilation.
//! - A candidate runs on buffers of the routine's own sizes on device 0, floats filled with
//!   fixed pseudo-random values in [-1, 1) (products of zeros run faster than real ones on
//!   some devices), integers with zeros (they may index memory), every static index at 0.
//!   A run before the timed ones loads the code and captures its graph, and a second one sizes
//!   the batches, so neither a load nor a capture counts in any timing. Nothing the user holds
//!   (contexts, arrays) is touched.
//! - A schedule changes results only by float reassociation in a fixed order; any choice is
//!   valid for any routine (stored numbers are clamped where they are used), so a damaged or
//!   stale stored choice can cost speed, never correctness. One that does not parse is
//!   ignored (with a warning) and searched again.
//! - Compiling with search on ([`crate::backend::Backend::set_schedule_search`], or `ARRAYJIT_SEARCH=1`) uses
//!   the stored choice of each routine, searching first where none is stored. With search off
//!   (the default), stored choices are not consulted: results never change behind the user's
//!   back because some earlier process searched.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arrayjit_backends::{BufferHandle, CompiledBatch, LaunchRequest, LoweredBackend};
use arrayjit_ir::{Assignments, Error, Result, StaticSymbol};
use arrayjit_opt::schedule::ScheduleTuning;
use arrayjit_opt::{OptimizeSettings, Optimized, optimize};

/// What the search varies: the schedule tuning and loop fusion. Applied over the backend's
/// optimizer settings, it replaces only these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScheduleChoice {
    /// Register tile, cache blocks and reduction accumulators.
    pub tuning: ScheduleTuning,
    /// Fuse sibling loops (see `OptimizeSettings::enable_loop_fusion`).
    pub loop_fusion: bool,
}

impl ScheduleChoice {
    /// The choice the settings make now.
    pub fn of(settings: &OptimizeSettings) -> ScheduleChoice {
        ScheduleChoice {
            tuning: settings.schedule.tuning,
            loop_fusion: settings.enable_loop_fusion,
        }
    }

    /// The settings with this choice in place of theirs.
    pub fn apply(&self, settings: &OptimizeSettings) -> OptimizeSettings {
        let mut s = settings.clone();
        s.schedule.tuning = self.tuning;
        s.enable_loop_fusion = self.loop_fusion;
        s
    }

    /// Parses what [`ScheduleChoice`]'s `Display` writes, checking every field's range.
    pub fn parse(text: &str) -> std::result::Result<ScheduleChoice, String> {
        let mut choice = ScheduleChoice {
            tuning: ScheduleTuning::default(),
            loop_fusion: true,
        };
        // The GPU fields may be absent (choices stored before they existed): `auto`.
        let mut seen = [false; 11];
        for field in text.split_whitespace() {
            let (name, value) = field
                .split_once('=')
                .ok_or_else(|| format!("`{field}` is not name=value"))?;
            let int = |lo: i64, hi: i64| -> std::result::Result<i64, String> {
                value
                    .parse::<i64>()
                    .ok()
                    .filter(|v| (lo..=hi).contains(v))
                    .ok_or_else(|| format!("{name}={value}: expected a number from {lo} to {hi}"))
            };
            // `auto`, or one of the values `allowed`.
            let auto_or_one_of = |allowed: &[usize]| -> std::result::Result<Option<usize>, String> {
                if value == "auto" {
                    return Ok(None);
                }
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|v| allowed.contains(v))
                    .map(Some)
                    .ok_or_else(|| format!("{name}={value}: expected auto or one of {allowed:?}"))
            };
            let max_shift = ScheduleTuning::MAX_BLOCK_SCALE_LOG2 as i64;
            let slot = match name {
                "register_rows" => {
                    choice.tuning.register_rows = match value {
                        "auto" => None,
                        _ => Some(int(1, ScheduleTuning::MAX_REGISTER_ROWS as i64)? as usize),
                    };
                    0
                }
                "mc_log2" | "kc_log2" | "nc_log2" => {
                    let axis = ["mc_log2", "kc_log2", "nc_log2"]
                        .iter()
                        .position(|n| *n == name)
                        .unwrap_or(0);
                    choice.tuning.block_scale_log2[axis] = int(-max_shift, max_shift)? as i8;
                    1 + axis
                }
                "reduction_vectors" => {
                    choice.tuning.reduction_vectors =
                        int(1, ScheduleTuning::MAX_REDUCTION_VECTORS as i64)? as usize;
                    4
                }
                "gpu_threads" => {
                    choice.tuning.gpu_threads = match value {
                        "auto" => None,
                        _ => Some(int(1, 1024)? as u32),
                    };
                    6
                }
                "gpu_tile" => {
                    choice.tuning.gpu_tile = auto_or_one_of(&ScheduleTuning::GPU_TILES)?;
                    7
                }
                "gpu_stages" => {
                    choice.tuning.gpu_stages = match value {
                        "auto" => None,
                        _ => Some(int(
                            2,
                            arrayjit_opt::schedule::gpu::matrix::MAX_MATRIX_STAGES as i64,
                        )? as usize),
                    };
                    8
                }
                "gpu_stage_fragments" => {
                    choice.tuning.gpu_stage_fragments =
                        auto_or_one_of(&ScheduleTuning::GPU_STAGE_FRAGMENTS)?;
                    9
                }
                "gpu_tensor_copies" => {
                    choice.tuning.gpu_tensor_copies = match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(format!("gpu_tensor_copies={value}: expected on or off")),
                    };
                    10
                }
                "loop_fusion" => {
                    choice.loop_fusion = match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(format!("loop_fusion={value}: expected on or off")),
                    };
                    5
                }
                _ => return Err(format!("unknown field `{name}`")),
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(format!("field `{name}` given twice"));
            }
        }
        if seen[..6].iter().all(|s| *s) {
            Ok(choice)
        } else {
            Err(format!("incomplete choice `{}`", text.trim()))
        }
    }
}

impl fmt::Display for ScheduleChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tuning;
        match t.register_rows {
            Some(r) => write!(f, "register_rows={r}")?,
            None => write!(f, "register_rows=auto")?,
        }
        let [mc, kc, nc] = t.block_scale_log2;
        write!(
            f,
            " mc_log2={mc} kc_log2={kc} nc_log2={nc} reduction_vectors={} loop_fusion={}",
            t.reduction_vectors,
            if self.loop_fusion { "on" } else { "off" }
        )?;
        let auto = |v: Option<usize>| v.map_or_else(|| "auto".to_string(), |v| v.to_string());
        write!(
            f,
            " gpu_threads={} gpu_tile={} gpu_stages={} gpu_stage_fragments={} \
             gpu_tensor_copies={}",
            auto(t.gpu_threads.map(|v| v as usize)),
            auto(t.gpu_tile),
            auto(t.gpu_stages),
            auto(t.gpu_stage_fragments),
            if t.gpu_tensor_copies { "on" } else { "off" }
        )
    }
}

/// How long and how carefully the search times candidates.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchSettings {
    /// One timing batch repeats the kernel until it has run at least this long.
    pub batch_time: Duration,
    /// Timing batches per candidate; a candidate's time is its fastest batch's mean.
    pub batches: usize,
    /// A variant replaces the best so far only if faster by at least this fraction.
    pub min_gain: f64,
    /// The most candidates compiled (the heuristics included).
    pub max_compiles: usize,
    /// No new candidate is started after the search has run this long.
    pub time_budget: Duration,
}

impl Default for SearchSettings {
    fn default() -> Self {
        SearchSettings {
            batch_time: Duration::from_millis(20),
            batches: 3,
            min_gain: 0.05,
            max_compiles: 16,
            time_budget: Duration::from_secs(60),
        }
    }
}

/// One candidate of a search.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// What it varied.
    pub choice: ScheduleChoice,
    /// Seconds per run (`None`: it could not be compiled or run; see `note`).
    pub seconds: Option<f64>,
    /// What happened: timed, the same code as an earlier candidate, or why it failed.
    pub note: String,
}

/// What a search (or a lookup of a stored choice) found for one routine.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReport {
    /// The routine's name.
    pub routine: String,
    /// The key its choice is stored under (a hash of the routine's code and the machine).
    pub key: String,
    /// The choice came from the store; no candidate was timed.
    pub from_store: bool,
    /// The choice was written to the store (false without a compile cache).
    pub stored: bool,
    /// Every candidate, the heuristics first.
    pub candidates: Vec<Candidate>,
    /// The choice compiling uses.
    pub winner: ScheduleChoice,
}

impl SearchReport {
    /// Seconds per run of the heuristics' schedule and of the winner's (when timed).
    pub fn speedup(&self) -> Option<f64> {
        let heuristic = self.candidates.first()?.seconds?;
        let best = self
            .candidates
            .iter()
            .filter(|c| c.choice == self.winner)
            .find_map(|c| c.seconds)?;
        Some(heuristic / best)
    }
}

impl fmt::Display for SearchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from_store {
            return write!(
                f,
                "schedule of {}: stored choice {} (key {})",
                self.routine,
                self.winner,
                &self.key[..16.min(self.key.len())]
            );
        }
        writeln!(
            f,
            "schedule search for {} ({} candidates):",
            self.routine,
            self.candidates.len()
        )?;
        for c in &self.candidates {
            let time = c
                .seconds
                .map_or("      -".to_string(), |s| format!("{:9.3} ms", s * 1e3));
            let mark = if c.choice == self.winner { "*" } else { " " };
            writeln!(f, "  {mark} {time}  {}  ({})", c.choice, c.note)?;
        }
        write!(
            f,
            "  winner: {}{}{}",
            self.winner,
            self.speedup()
                .map_or(String::new(), |s| format!(", {s:.2}x the heuristics")),
            if self.stored { ", stored" } else { "" }
        )
    }
}

/// The key a routine's choice is stored under: a hash of the machine and of the source the
/// backend renders for the routine as the heuristics optimize it (renderers name loop indices
/// canonically, so the same program gives the same key in every process).
pub(crate) fn routine_key(lowered: &LoweredBackend, heuristic: &Optimized) -> Result<String> {
    let mut h = blake3::Hasher::new();
    for part in [
        "arrayjit schedule choice v1",
        &lowered.machine_identity(),
        lowered.render(&[heuristic])?.source(),
    ] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    for b in &heuristic.bindings {
        h.update(format!("{} {}", b.name, b.range).as_bytes());
    }
    Ok(h.finalize().to_hex().to_string())
}

/// One thing the search varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Knob {
    LoopFusion,
    ReductionVectors,
    RegisterRows,
    /// A cache block: 0 `mc`, 1 `kc`, 2 `nc`.
    Block(usize),
    /// The group size of GPU passes.
    GpuThreads,
    /// The tile side of tiled GPU products.
    GpuTile,
    /// The buffers of matrix-unit products' staged tiles.
    GpuStages,
    /// The depth of each buffer of matrix-unit products' staged tiles.
    GpuStageFragments,
    /// Whether sm_90's tensor memory accelerator stages warpgroup products' factors.
    GpuTensorCopies,
}

impl Knob {
    /// The knobs in the order they are tried from `start`: fusion only when it is on (a user
    /// who turned it off is not overruled); on a GPU backend (`gpu`) the tile of products,
    /// then the depth of matrix-unit products' buffers, whether sm_90's tensor memory accelerator
    /// stages them, their number, then the group size; on a CPU kc first (it sets the L1
    /// panel), then mc (L2), then nc
    /// (L3).
    fn all(start: ScheduleChoice, gpu: bool) -> Vec<Knob> {
        let mut knobs = Vec::new();
        if start.loop_fusion {
            knobs.push(Knob::LoopFusion);
        }
        if gpu {
            knobs.extend([
                Knob::GpuTile,
                Knob::GpuStageFragments,
                Knob::GpuTensorCopies,
                Knob::GpuStages,
                Knob::GpuThreads,
            ]);
            return knobs;
        }
        knobs.extend([
            Knob::ReductionVectors,
            Knob::RegisterRows,
            Knob::Block(1),
            Knob::Block(0),
            Knob::Block(2),
        ]);
        knobs
    }

    /// The variants of `from` in this knob alone (`from` itself left out).
    fn variants(self, from: ScheduleChoice) -> Vec<ScheduleChoice> {
        let vary = |f: &dyn Fn(&mut ScheduleChoice)| {
            let mut c = from;
            f(&mut c);
            c
        };
        let mut out = match self {
            Knob::LoopFusion => vec![vary(&|c| c.loop_fusion = !from.loop_fusion)],
            Knob::ReductionVectors => [2, 4, 8]
                .map(|v| vary(&|c| c.tuning.reduction_vectors = v))
                .to_vec(),
            Knob::RegisterRows => [None, Some(4), Some(6), Some(8)]
                .map(|r| vary(&|c| c.tuning.register_rows = r))
                .to_vec(),
            Knob::GpuThreads => ScheduleTuning::GPU_THREADS
                .map(|t| vary(&|c| c.tuning.gpu_threads = Some(t)))
                .to_vec(),
            Knob::GpuTile => ScheduleTuning::GPU_TILES
                .map(|t| vary(&|c| c.tuning.gpu_tile = Some(t)))
                .to_vec(),
            Knob::GpuStages => ScheduleTuning::GPU_STAGES
                .map(|t| vary(&|c| c.tuning.gpu_stages = Some(t)))
                .to_vec(),
            Knob::GpuStageFragments => ScheduleTuning::GPU_STAGE_FRAGMENTS
                .map(|f| vary(&|c| c.tuning.gpu_stage_fragments = Some(f)))
                .to_vec(),
            Knob::GpuTensorCopies => {
                vec![vary(&|c| {
                    c.tuning.gpu_tensor_copies = !from.tuning.gpu_tensor_copies;
                })]
            }
            Knob::Block(axis) => [-1i8, 1]
                .map(|d| {
                    vary(&|c| {
                        let s = &mut c.tuning.block_scale_log2[axis];
                        *s = (*s + d).clamp(
                            -ScheduleTuning::MAX_BLOCK_SCALE_LOG2,
                            ScheduleTuning::MAX_BLOCK_SCALE_LOG2,
                        );
                    })
                })
                .to_vec(),
        };
        out.retain(|c| *c != from);
        out
    }
}

/// A compiled candidate: its source and kernels, and its timings so far.
pub(crate) struct Timed {
    source: String,
    batch: Arc<dyn CompiledBatch>,
    /// Its fastest timing so far.
    pub(crate) seconds: f64,
}

/// Compiles and times `o`, or finds it among the candidates `timed` already holds (the same
/// rendered source): its index in `timed`, and whether it was new.
pub(crate) fn evaluate(
    lowered: &LoweredBackend,
    o: &Optimized,
    timed: &mut Vec<Timed>,
    settings: &SearchSettings,
) -> Result<(usize, bool)> {
    // Rendered once: its source tells a candidate seen before, and the same program compiles.
    let program = lowered.render(&[o])?;
    if let Some(i) = timed.iter().position(|t| t.source == program.source()) {
        return Ok((i, false));
    }
    let source = program.source().to_string();
    let batch = lowered.compile(program)?;
    let seconds = time_kernel(lowered, batch.as_ref(), settings)?;
    timed.push(Timed {
        source,
        batch,
        seconds,
    });
    Ok((timed.len() - 1, true))
}

/// How a candidate compared with the best so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compared {
    /// Not faster by the margin.
    NotFaster,
    /// Faster by the margin, and still when both were timed again.
    Faster,
    /// Faster by the margin at first, not when both were timed again.
    NotConfirmed,
}

impl Compared {
    /// The note a report gives a timed candidate that compared so.
    pub(crate) fn note(self) -> &'static str {
        match self {
            Compared::NotFaster => "timed",
            Compared::Faster => "timed; faster, confirmed by timing again",
            Compared::NotConfirmed => "timed; not faster when timed again",
        }
    }
}

/// Whether candidate `at` beats `best` by at least `min_gain`, confirmed against noise: when it
/// seems to, both are timed again (each keeps its faster timing) and compared once more.
pub(crate) fn compare(
    lowered: &LoweredBackend,
    timed: &mut [Timed],
    (at, best): (usize, usize),
    settings: &SearchSettings,
    min_gain: f64,
) -> Result<Compared> {
    let faster = |timed: &[Timed]| timed[at].seconds < timed[best].seconds * (1.0 - min_gain);
    if !faster(timed) {
        return Ok(Compared::NotFaster);
    }
    for i in [best, at] {
        let again = time_kernel(lowered, timed[i].batch.as_ref(), settings)?;
        timed[i].seconds = timed[i].seconds.min(again);
    }
    Ok(if faster(timed) {
        Compared::Faster
    } else {
        Compared::NotConfirmed
    })
}

/// Times candidates of one routine and returns the report (with the winner stored when the
/// backend has a cache). `base` holds the backend's settings (its choice is the heuristics)
/// and `heuristic` the routine optimized with them.
pub(crate) fn search(
    lowered: &LoweredBackend,
    (name, assignments, bindings): (&str, &Assignments, &[StaticSymbol]),
    base: &OptimizeSettings,
    heuristic: &Optimized,
    settings: &SearchSettings,
) -> Result<SearchReport> {
    let started = Instant::now();
    let key = routine_key(lowered, heuristic)?;
    let start = ScheduleChoice::of(base);
    let mut timed: Vec<Timed> = Vec::new();
    // The heuristics first: failing here is the routine's own failure.
    let (mut best_at, _) = evaluate(lowered, heuristic, &mut timed, settings)?;
    let mut candidates = vec![Candidate {
        choice: start,
        seconds: Some(timed[best_at].seconds),
        note: "the heuristics".into(),
    }];
    let mut best = start;
    // Coordinate descent: each knob's variants are tried on the best choice so far.
    'knobs: for knob in Knob::all(start, base.schedule.gpu.is_some()) {
        for choice in knob.variants(best) {
            if candidates.iter().any(|c| c.choice == choice) {
                continue;
            }
            if timed.len() >= settings.max_compiles || started.elapsed() >= settings.time_budget {
                break 'knobs;
            }
            let outcome = optimize(name, bindings, assignments, &choice.apply(base))
                .and_then(|o| evaluate(lowered, &o, &mut timed, settings));
            let (at, new) = match outcome {
                Ok(found) => found,
                Err(e) => {
                    candidates.push(Candidate {
                        choice,
                        seconds: None,
                        note: format!("failed: {e}"),
                    });
                    continue;
                }
            };
            let note = if new {
                let compared = compare(
                    lowered,
                    &mut timed,
                    (at, best_at),
                    settings,
                    settings.min_gain,
                )?;
                if compared == Compared::Faster {
                    (best, best_at) = (choice, at);
                }
                compared.note().to_string()
            } else {
                "the same kernels as an earlier candidate".to_string()
            };
            candidates.push(Candidate {
                choice,
                seconds: Some(timed[at].seconds),
                note,
            });
        }
    }
    let stored = lowered.store_schedule_choice(&key, &best.to_string())?;
    if !stored {
        unstored()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), best);
    }
    Ok(SearchReport {
        routine: name.to_string(),
        key,
        from_store: false,
        stored,
        candidates,
        winner: best,
    })
}

/// Choices found in this process by backends that keep no store (no compile cache), so that
/// compiling the same routine again does not search again.
fn unstored() -> &'static Mutex<HashMap<String, ScheduleChoice>> {
    static CHOICES: OnceLock<Mutex<HashMap<String, ScheduleChoice>>> = OnceLock::new();
    CHOICES.get_or_init(Default::default)
}

/// The stored choice for a routine optimized by the heuristics, if one is stored and valid
/// (or was found in this process by a backend without a store).
pub(crate) fn stored_choice(
    lowered: &LoweredBackend,
    heuristic: &Optimized,
) -> Option<ScheduleChoice> {
    let key = match routine_key(lowered, heuristic) {
        Ok(key) => key,
        Err(e) => {
            tracing::warn!(routine = %heuristic.name, "no schedule key: {e}");
            return None;
        }
    };
    if let Some(c) = unstored()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Some(*c);
    }
    match lowered.load_schedule_choice(&key) {
        Ok(Some(text)) => match ScheduleChoice::parse(&text) {
            Ok(c) => Some(c),
            Err(why) => {
                tracing::warn!(
                    routine = %heuristic.name,
                    "ignoring the stored schedule choice {key}: {why}; searching again"
                );
                None
            }
        },
        Ok(None) => None,
        Err(why) => {
            tracing::warn!(
                routine = %heuristic.name,
                "cannot read the stored schedule choice {key}: {why}; searching again"
            );
            None
        }
    }
}

/// Seconds per launch of the batch's first kernel: the fastest of `batches` timing batches.
pub(crate) fn time_kernel(
    lowered: &LoweredBackend,
    batch: &dyn CompiledBatch,
    settings: &SearchSettings,
) -> Result<f64> {
    let kernel = batch
        .kernels()
        .first()
        .ok_or_else(|| Error::invalid("a compiled routine without a kernel"))?;
    let args: Vec<BufferHandle> = kernel
        .buffer_sizes()
        .into_iter()
        .map(|bytes| lowered.runtime().alloc_zeroed(0, bytes))
        .collect::<Result<_>>()?;
    let precs = kernel
        .args
        .iter()
        .chain(kernel.merge.iter())
        .map(|t| t.prec());
    for (i, (prec, buffer)) in precs.zip(&args).enumerate() {
        if prec.is_float() {
            let values = timing_values(buffer.size_in_bytes() / prec.size_in_bytes(), i);
            let filled = arrayjit_ir::Ndarray::from_f64(prec, &[values.len()], &values)?;
            // SAFETY: the buffer is this function's own; nothing else uses it.
            unsafe {
                lowered
                    .runtime()
                    .copy_from_host(buffer, filled.as_bytes(), None)?
            };
        }
    }
    let statics = vec![0i64; kernel.statics.len()];
    // Launches go on a queue of the device's own where the backend has them (as on a GPU):
    // every timing waits for them.
    let queue = lowered.runtime().new_queue(0)?;
    let sync = || match &queue {
        Some(q) => q.synchronize(),
        None => lowered.runtime().synchronize(0),
    };
    let run_once = || -> Result<f64> {
        let t = Instant::now();
        // SAFETY: the buffers are this function's own, used by one launch at a time in order.
        unsafe { batch.launch(LaunchRequest::new(0, &args, &statics).on(queue.as_deref()))? };
        sync()?;
        Ok(t.elapsed().as_secs_f64().max(1e-9))
    };
    // The first run loads the code, captures a graph, warms caches and pages; the second
    // sizes the batches.
    run_once()?;
    let first = run_once()?;
    let reps = ((settings.batch_time.as_secs_f64() / first).ceil() as usize).clamp(1, 100_000);
    let mut best = f64::INFINITY;
    for _ in 0..settings.batches.max(1) {
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: as above; the queue runs the launches in order.
            unsafe { batch.launch(LaunchRequest::new(0, &args, &statics).on(queue.as_deref()))? };
        }
        sync()?;
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    Ok(best)
}

/// `count` values in [-1, 1) for timing buffer `salt`: a fixed linear congruential sequence
/// (the same every run, so timings compare like with like).
fn timing_values(count: usize, salt: usize) -> Vec<f64> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (salt as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_values_are_fixed_and_within_minus_one_to_one() {
        let a = timing_values(1000, 3);
        assert_eq!(a, timing_values(1000, 3));
        assert_ne!(a, timing_values(1000, 4));
        assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(a.iter().filter(|x| **x != 0.0).count() > 990);
    }

    #[test]
    fn choices_print_and_parse_back() {
        let c = ScheduleChoice {
            tuning: ScheduleTuning {
                register_rows: Some(6),
                block_scale_log2: [-1, 2, 0],
                reduction_vectors: 8,
                gpu_threads: Some(128),
                gpu_tile: Some(64),
                gpu_stages: Some(3),
                gpu_stage_fragments: Some(4),
                gpu_tensor_copies: true,
            },
            loop_fusion: false,
        };
        assert_eq!(ScheduleChoice::parse(&c.to_string()), Ok(c));
        let d = ScheduleChoice::of(&OptimizeSettings::default());
        assert_eq!(ScheduleChoice::parse(&format!("{d}\n")), Ok(d));
        // Choices stored before the GPU fields existed still parse, with those on auto.
        let old =
            "register_rows=auto mc_log2=0 kc_log2=0 nc_log2=0 reduction_vectors=4 loop_fusion=on";
        assert_eq!(ScheduleChoice::parse(old), Ok(d));
    }

    #[test]
    fn damaged_choices_are_refused_with_the_reason() {
        let good = ScheduleChoice::of(&OptimizeSettings::default()).to_string();
        for (bad, why) in [
            ("", "incomplete"),
            (
                "register_rows=99 mc_log2=0 kc_log2=0 nc_log2=0 reduction_vectors=4 loop_fusion=on",
                "from 1 to 16",
            ),
            (&good.replace("kc_log2=0", "kc_log2=-9"), "from -3 to 3"),
            (
                &good.replace("loop_fusion=on", "loop_fusion=maybe"),
                "on or off",
            ),
            (&format!("{good} reduction_vectors=2"), "twice"),
            (&format!("{good} speed=11"), "unknown field"),
            (
                &good.replace("gpu_tile=auto", "gpu_tile=48"),
                "one of [16, 32, 64, 128]",
            ),
            (
                &good.replace("gpu_threads=auto", "gpu_threads=0"),
                "from 1 to 1024",
            ),
            (
                &good.replace("gpu_stages=auto", "gpu_stages=9"),
                "from 2 to 6",
            ),
            (
                &good.replace("gpu_stage_fragments=auto", "gpu_stage_fragments=3"),
                "one of [2, 4]",
            ),
            (
                &good.replace("gpu_tensor_copies=off", "gpu_tensor_copies=yes"),
                "on or off",
            ),
            ("register_rows", "name=value"),
        ] {
            let e = ScheduleChoice::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn knobs_vary_one_thing_each() {
        let start = ScheduleChoice::of(&OptimizeSettings::default());
        let unfused = ScheduleChoice {
            loop_fusion: false,
            ..start
        };
        for from in [start, unfused] {
            for knob in Knob::all(start, false)
                .into_iter()
                .chain(Knob::all(start, true))
            {
                let variants = knob.variants(from);
                assert!(
                    !variants.is_empty() && !variants.contains(&from),
                    "{knob:?}"
                );
                for c in variants {
                    let differs = [
                        c.loop_fusion != from.loop_fusion,
                        c.tuning.reduction_vectors != from.tuning.reduction_vectors,
                        c.tuning.register_rows != from.tuning.register_rows,
                        c.tuning.block_scale_log2 != from.tuning.block_scale_log2,
                        c.tuning.gpu_threads != from.tuning.gpu_threads,
                        c.tuning.gpu_tile != from.tuning.gpu_tile,
                        c.tuning.gpu_stages != from.tuning.gpu_stages,
                        c.tuning.gpu_stage_fragments != from.tuning.gpu_stage_fragments,
                        c.tuning.gpu_tensor_copies != from.tuning.gpu_tensor_copies,
                    ];
                    assert_eq!(differs.iter().filter(|d| **d).count(), 1, "{knob:?} {c}");
                }
            }
        }
        // A user who turned fusion off is not overruled.
        assert!(!Knob::all(unfused, false).contains(&Knob::LoopFusion));
        // GPU backends vary the GPU knobs and not the CPU's blocking, and CPUs the reverse.
        let gpu = Knob::all(start, true);
        assert!(
            gpu.contains(&Knob::GpuTile)
                && gpu.contains(&Knob::GpuStages)
                && gpu.contains(&Knob::GpuStageFragments)
                && gpu.contains(&Knob::GpuTensorCopies)
                && gpu.contains(&Knob::GpuThreads)
        );
        assert!(
            !gpu.iter()
                .any(|k| matches!(k, Knob::Block(_) | Knob::RegisterRows))
        );
        assert!(!Knob::all(start, false).contains(&Knob::GpuTile));
    }
}

//! Seeing what arrayjit does: kernel listings on stderr (`ARRAYJIT_DEBUG`), per-routine
//! statistics ([`RoutineStats`]), and the timeline of [`arrayjit_ir::trace`] started from the
//! environment (`ARRAYJIT_TRACE`) or the API ([`start_trace`], [`stop_trace`]).
//!
//! `ARRAYJIT_DEBUG` (a whole number, 0 when unset):
//! - `1`: one line per compiled routine: its name, the backend, cache hit or compile time,
//!   the kernels of its batch and the bytes of its arrays; and one per linked routine: its
//!   stream and the memory it holds ([`RoutineMemory`]: device arrays, the pools its link
//!   allocated, scratch, host arrays, the peak);
//! - `2`: also one line per run with its time (on backends with device queues, the time to
//!   enqueue: the device runs it later); on the C backends routines are compiled to time
//!   their statements, and each run's line is followed by its three slowest statements
//!   ([`crate::statement_profile`]);
//! - `3`: also, per compiled routine, the optimized loop IR, the generated source, every
//!   node's memory mode with its reason and, on a GPU backend, the plan of its passes
//!   (`arrayjit_opt::schedule::gpu::GpuPlan`: shape, groups × threads, work, estimate).
//!
//! Lines go to stderr, each starting with `arrayjit:`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use arrayjit_backends::settings;
use arrayjit_ir::Result;
use arrayjit_ir::trace::{self, Trace, TraceConfig};
use arrayjit_opt::Optimized;

/// No level set by [`set_debug_level`]: the environment decides.
const FROM_ENV: u8 = u8::MAX;

static DEBUG_OVERRIDE: AtomicU8 = AtomicU8::new(FROM_ENV);

/// The listing level: the one set by [`set_debug_level`], else `ARRAYJIT_DEBUG` (0 to 3;
/// another value is an [`arrayjit_ir::Error::InvalidSetting`]).
pub fn debug_level() -> Result<u8> {
    match DEBUG_OVERRIDE.load(Ordering::Relaxed) {
        FROM_ENV => {
            let read = || settings::integer(&settings::process_env, "ARRAYJIT_DEBUG", 0..=3, 0);
            static ENV: OnceLock<Option<u8>> = OnceLock::new();
            match ENV.get_or_init(|| read().ok().map(|n| n as u8)) {
                Some(level) => Ok(*level),
                // Invalid: read again for the error (`InvalidSetting`, naming the value).
                None => read().map(|n| n as u8),
            }
        }
        level => Ok(level),
    }
}

/// Sets the listing level for the process (`None`: back to `ARRAYJIT_DEBUG`). Levels above 3
/// list as 3.
pub fn set_debug_level(level: Option<u8>) {
    let value = level.map_or(FROM_ENV, |l| l.min(3));
    DEBUG_OVERRIDE.store(value, Ordering::Relaxed);
}

/// Whether runs are listed (level 2 or more; an invalid setting lists nothing, and compiling
/// reports it).
pub(crate) fn lists_runs() -> bool {
    debug_level().is_ok_and(|l| l >= 2)
}

/// Starts recording a timeline (see [`arrayjit_ir::trace`]); a recording under way is
/// discarded.
pub fn start_trace(config: TraceConfig) {
    trace::start(config);
}

/// Stops recording and returns the timeline, if one was recorded.
pub fn stop_trace() -> Option<Trace> {
    trace::stop()
}

/// Starts recording when `ARRAYJIT_TRACE` names a file (once per process), and writes the
/// file when the process exits. An unwritable file is reported on stderr at exit.
pub(crate) fn trace_from_env() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let Ok(Some(path)) = settings::text(&settings::process_env, "ARRAYJIT_TRACE") else {
            return;
        };
        let _ = TRACE_PATH.set(path);
        trace::start(TraceConfig::default());
        // SAFETY: `write_trace_at_exit` is an `extern "C" fn()` that does not unwind.
        unsafe { libc::atexit(write_trace_at_exit) };
    });
}

static TRACE_PATH: OnceLock<String> = OnceLock::new();

extern "C" fn write_trace_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let (Some(path), Some(t)) = (TRACE_PATH.get(), trace::stop()) {
            match t.write(std::path::Path::new(path)) {
                Ok(()) => eprintln!(
                    "arrayjit: wrote the trace {path} ({} events); open it in ui.perfetto.dev",
                    t.events().len()
                ),
                Err(e) => eprintln!("arrayjit: {e}"),
            }
        }
    });
}

/// Lists a compiled batch at the current level: one line per routine (level 1), the loop IR,
/// source, memory modes and, on a GPU, the plan of passes (level 3).
pub(crate) fn list_compiled(
    backend: &str,
    gpu: Option<arrayjit_opt::schedule::GpuLimits>,
    optimized: &[std::sync::Arc<Optimized>],
    batch: &dyn arrayjit_backends::CompiledBatch,
    took: Duration,
) -> Result<()> {
    let level = debug_level()?;
    if level == 0 {
        return Ok(());
    }
    let outcome = match batch.cache_hit() {
        Some(true) => format!("cache hit in {:.1} ms", took.as_secs_f64() * 1e3),
        Some(false) => format!("compiled in {:.1} ms", took.as_secs_f64() * 1e3),
        None => format!("built in {:.1} ms", took.as_secs_f64() * 1e3),
    };
    let kernels = batch.kernels().len();
    for o in optimized {
        let arrays: Vec<_> = o
            .nodes
            .iter()
            .filter(|r| r.used && r.tn.modes().is_materialized())
            .collect();
        let bytes: usize = arrays.iter().map(|r| r.tn.size_in_bytes()).sum();
        eprintln!(
            "arrayjit: compiled {} on {backend}: {outcome}, {kernels} kernel(s) in its batch, \
             {} array(s) of {}",
            o.name,
            arrays.len(),
            human_bytes(bytes)
        );
        if level >= 3 {
            eprintln!("arrayjit: loop IR of {}:\n{}", o.name, o.code);
            eprintln!(
                "arrayjit: memory modes of {}:\n{}",
                o.name,
                o.memory_report()
            );
            if let Some(limits) = gpu {
                let model = arrayjit_opt::schedule::gpu::DeviceModel::from_limits(backend, limits);
                eprintln!("arrayjit: {}", o.gpu_plan(&model));
            }
        }
    }
    if level >= 3 {
        eprintln!("arrayjit: generated source:\n{}", batch.source());
    }
    Ok(())
}

/// `1.5 KiB`-style sizes.
fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

static RUN_TIMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the timing of every routine run on or off for the process ([`crate::routine::Routine::stats`]).
/// Runs are also timed while a trace is recorded or `ARRAYJIT_DEBUG` is 2 or more. Off by
/// default: an untimed run costs no clock reads.
pub fn set_run_timing(on: bool) {
    RUN_TIMING.store(on, Ordering::Relaxed);
}

/// Whether runs scheduled now are timed (see [`set_run_timing`]).
pub(crate) fn run_timing() -> bool {
    RUN_TIMING.load(Ordering::Relaxed) || trace::enabled() || lists_runs()
}

/// Runs of one routine: how many were scheduled, and how long the timed ones took (see
/// [`set_run_timing`]).
#[derive(Debug, Default)]
pub struct RoutineStats {
    runs: AtomicU64,
    timed: AtomicU64,
    nanos: AtomicU64,
    failed: AtomicU64,
    on_device: AtomicU64,
}

impl RoutineStats {
    /// Counts a run scheduled.
    pub(crate) fn scheduled(&self) {
        self.runs.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a timed run.
    pub(crate) fn record(&self, took: Duration, ok: bool) {
        self.timed.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(
            took.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a run timed by its device (the kernel's own time there), reported when the
    /// device knew it.
    pub(crate) fn record_on_device(&self, took: Duration) {
        self.record(took, true);
        self.on_device.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> RunStats {
        let timed = self.timed.load(Ordering::Relaxed);
        let nanos = self.nanos.load(Ordering::Relaxed);
        RunStats {
            runs: self.runs.load(Ordering::Relaxed),
            timed_runs: timed,
            failed: self.failed.load(Ordering::Relaxed),
            device_timed_runs: self.on_device.load(Ordering::Relaxed),
            total: Duration::from_nanos(nanos),
            mean: Duration::from_nanos(nanos / timed.max(1)),
            memory: RoutineMemory::default(),
        }
    }
}

/// The memory a routine holds while it runs, in bytes, as its link laid it out
/// ([`RunStats::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoutineMemory {
    /// The device arrays its kernels take (parameters, inputs, outputs, optimizer state and
    /// the other nodes kept between runs), whichever link allocated them.
    pub arrays: usize,
    /// Of [`RoutineMemory::arrays`], the bytes of the pools its own link allocated (the arrays
    /// new to its context; the others came from the contexts it was linked under).
    pub new_pools: usize,
    /// The stream's scratch its kernels' local nodes take while it runs.
    pub scratch: usize,
    /// The host arrays of the hosted nodes it uses (made or still to be made at their first
    /// read on the host), apart from those a device array uses in place (counted once, in
    /// [`RoutineMemory::arrays`]). A host array handed to a CPU device at link counts here
    /// too: the host makes it again at its next read of the node, and from then on both
    /// exist; until then, these bytes are not held.
    pub host: usize,
}

impl RoutineMemory {
    /// Everything the routine holds at its peak: its device arrays, the scratch and the host
    /// arrays. (On the CPU backends a device array and its node's host array are two copies
    /// in the same memory; both are counted, as both exist.)
    pub fn peak(&self) -> usize {
        self.arrays
            .saturating_add(self.scratch)
            .saturating_add(self.host)
    }
}

impl std::fmt::Display for RoutineMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peak memory {}: device arrays {} (of which {} in pools of this link), scratch {}, \
             host arrays {}",
            human_bytes(self.peak()),
            human_bytes(self.arrays),
            human_bytes(self.new_pools),
            human_bytes(self.scratch),
            human_bytes(self.host)
        )
    }
}

/// The `ARRAYJIT_DEBUG >= 1` line of a link: the routine, where, and its memory.
/// (`stream` names the stream only when the line is printed.)
pub(crate) fn list_linked(routine: &str, stream: impl FnOnce() -> String, memory: &RoutineMemory) {
    if debug_level().is_ok_and(|l| l >= 1) {
        eprintln!("arrayjit: linked {routine} on {}: {memory}", stream());
    }
}

/// A routine's runs so far and the memory it holds ([`crate::routine::Routine::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunStats {
    /// Runs scheduled.
    pub runs: u64,
    /// Runs timed (scheduled while timing was on; see [`set_run_timing`]) that have finished.
    pub timed_runs: u64,
    /// Timed runs whose kernel returned an error.
    pub failed: u64,
    /// Of the timed runs, those timed by the device itself: the kernel's time on a GPU, from
    /// timestamps it wrote (`wgpu` where the device has timestamp queries), counted once the
    /// host next waits for the device. The others are timed by the host around the launch:
    /// the kernel's time on CPU backends, the time to enqueue on a GPU without timestamps.
    pub device_timed_runs: u64,
    /// The time of the timed runs in all.
    pub total: Duration,
    /// Their mean time.
    pub mean: Duration,
    /// The memory the routine holds while it runs (from its link; the same for every run).
    pub memory: RoutineMemory,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_sizes() {
        let s = RoutineStats::default();
        assert_eq!(s.snapshot().mean, Duration::ZERO);
        s.scheduled();
        s.scheduled();
        s.scheduled();
        s.record(Duration::from_micros(10), true);
        s.record(Duration::from_micros(30), false);
        let snap = s.snapshot();
        assert_eq!((snap.runs, snap.timed_runs, snap.failed), (3, 2, 1));
        assert_eq!(snap.mean, Duration::from_micros(20));
        assert_eq!(snap.device_timed_runs, 0);
        s.record_on_device(Duration::from_micros(50));
        let snap = s.snapshot();
        assert_eq!(
            (snap.timed_runs, snap.device_timed_runs, snap.failed),
            (3, 1, 1)
        );
        assert_eq!(snap.total, Duration::from_micros(90));
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}

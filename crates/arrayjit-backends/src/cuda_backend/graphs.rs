//! A routine's passes as one CUDA graph: the launches of a run (the scratch's zeroing, then
//! every pass) are captured on the stream, instantiated once, and replayed by later runs: one
//! launch from the host instead of one per pass.
//!
//! Rules:
//! - One instantiated graph per (kernel, device, stream), kept with the arguments it was made
//!   with (device addresses, static indices, launch sizes). A run with the same arguments
//!   replays it. A run with others (a `batch` static that changes every step) captures its
//!   launches again and **updates the instantiated graph in place** (`cuGraphExecUpdate`):
//!   nothing is instantiated again unless the update is refused (the launches' shape changed).
//! - A capture never outlives its run: it is ended by a guard, also when a launch fails or
//!   panics inside it, so the stream never stays capturing.
//! - A launch that fails inside a capture, or a capture the driver invalidated (another thread
//!   did something a capture forbids), ends the capture, and the run launches its passes one by
//!   one, that run: what those launches return is the run's outcome. Graphs are turned off for
//!   the batch only for causes that will recur (a driver without graphs or updates): then every
//!   later run launches plainly.
//! - While a stream captures, the device's capture gate is held shared
//!   ([`super::devices::Gpu::capture_gate`]): what must not happen during any capture (freeing
//!   device memory, synchronizing the context) takes it exclusively.
//! - `ARRAYJIT_CUDA_GRAPHS=0` (or `false`, `no`, `off`) turns graphs off (plain launches).
//!
//! The cache speaks to the driver through [`CaptureDriver`], so its rules are tested here on a
//! fake stream that logs every call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arrayjit_ir::{Error, Result};

/// Why a capture, instantiation or update did not give a graph.
#[derive(Debug)]
pub(super) struct CaptureFailure {
    /// The driver's error.
    pub(super) error: Box<Error>,
    /// Whether every later try would fail the same way (graphs unsupported), so the batch
    /// stops trying; otherwise only this run launches plainly.
    pub(super) recurs: bool,
}

/// The driver calls a [`GraphCache`] makes on one stream: CUDA's (`graph_driver.rs`), or a
/// fake in tests.
pub(super) trait CaptureDriver {
    /// A captured graph (the template).
    type Graph;
    /// An instantiated graph.
    type Exec: Send;
    /// Starts capturing the stream (thread-local mode).
    fn begin_capture(&self) -> std::result::Result<(), CaptureFailure>;
    /// Ends the capture begun by [`CaptureDriver::begin_capture`]: the graph of what was
    /// enqueued since.
    fn end_capture(&self) -> std::result::Result<Self::Graph, CaptureFailure>;
    /// Instantiates a graph.
    fn instantiate(&self, graph: &Self::Graph) -> std::result::Result<Self::Exec, CaptureFailure>;
    /// Updates `exec` in place to `graph`'s launches; `Ok(false)` where the driver refuses
    /// (their shape differs), leaving `exec` as it was.
    fn update(
        &self,
        exec: &Self::Exec,
        graph: &Self::Graph,
    ) -> std::result::Result<bool, CaptureFailure>;
    /// Enqueues an instantiated graph on the stream.
    fn launch(&self, exec: &Self::Exec) -> Result<()>;
    /// The device's name, for the notice that graphs are off.
    fn label(&self) -> String;
}

/// What a batch's graph cache has done so far ([`super::CudaBatch::graph_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphCounts {
    /// Captures begun.
    pub captures: u64,
    /// Graphs instantiated.
    pub instantiations: u64,
    /// Instantiated graphs updated in place.
    pub updates: u64,
    /// Graph launches (replays and first launches).
    pub graph_launches: u64,
    /// Runs that launched their passes one by one (graphs off, unavailable, or a failed
    /// capture).
    pub plain_runs: u64,
}

#[derive(Default)]
struct Counters {
    captures: AtomicU64,
    instantiations: AtomicU64,
    updates: AtomicU64,
    graph_launches: AtomicU64,
    plain_runs: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// An instantiated graph and the arguments it holds now.
struct Kept<E> {
    key: Vec<u64>,
    exec: E,
}

/// Where a graph is kept: (kernel, device, stream).
pub(super) type GraphSlot = (usize, usize, usize);

/// The graphs of one compiled batch. The driver requires calls on one graph to be serialized:
/// every call on a kept graph is made under the cache's mutex.
pub(super) struct GraphCache<E> {
    graphs: Mutex<HashMap<GraphSlot, Kept<E>>>,
    unavailable: AtomicBool,
    counters: Counters,
}

impl<E> Default for GraphCache<E> {
    fn default() -> Self {
        GraphCache {
            graphs: Mutex::new(HashMap::new()),
            unavailable: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }
}

/// Whether the process uses graphs (`ARRAYJIT_CUDA_GRAPHS`, on by default); a value that does
/// not parse is an error.
pub(super) fn enabled() -> Result<bool> {
    crate::settings::flag(&crate::settings::process_env, "ARRAYJIT_CUDA_GRAPHS", true)
}

/// Ends a capture when dropped, unless it was ended: a launch that fails or panics inside the
/// capture never leaves the stream capturing.
struct Capturing<'a, D: CaptureDriver> {
    driver: &'a D,
    open: bool,
}

impl<D: CaptureDriver> Capturing<'_, D> {
    fn end(mut self) -> std::result::Result<D::Graph, CaptureFailure> {
        self.open = false;
        self.driver.end_capture()
    }
}

impl<D: CaptureDriver> Drop for Capturing<'_, D> {
    fn drop(&mut self) {
        if self.open {
            // What was captured is dropped with the capture: nothing of it ran.
            let _ = self.driver.end_capture();
        }
    }
}

impl<E: Send> GraphCache<E> {
    /// What the cache has done so far.
    pub(super) fn counts(&self) -> GraphCounts {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GraphCounts {
            captures: get(&c.captures),
            instantiations: get(&c.instantiations),
            updates: get(&c.updates),
            graph_launches: get(&c.graph_launches),
            plain_runs: get(&c.plain_runs),
        }
    }

    /// Runs a kernel's launches (`launch` enqueues them on the driver's stream) through the
    /// graph of `slot` for `key` (the launches' arguments): replayed where its key is `key`,
    /// else captured and updated in place (or instantiated, the first time); `launch` itself
    /// where graphs are off or unavailable, or this run's capture failed. The caller holds the
    /// device's capture gate shared.
    pub(super) fn run<D: CaptureDriver<Exec = E>>(
        &self,
        slot: GraphSlot,
        driver: &D,
        key: Vec<u64>,
        launch: impl Fn() -> Result<()>,
    ) -> Result<()> {
        if !enabled()? || self.unavailable.load(Ordering::Relaxed) {
            bump(&self.counters.plain_runs);
            return launch();
        }
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = graphs.get(&slot)
            && kept.key == key
        {
            bump(&self.counters.graph_launches);
            return driver.launch(&kept.exec);
        }
        bump(&self.counters.captures);
        let capture = match driver.begin_capture() {
            Ok(()) => Capturing { driver, open: true },
            Err(failure) => return self.plainly(driver, failure, &launch),
        };
        let launched = launch();
        let graph = capture.end();
        if launched.is_err() {
            // Nothing captured ran: the passes again, plainly; their error is the run's.
            bump(&self.counters.plain_runs);
            return launch();
        }
        let graph = match graph {
            Ok(g) => g,
            Err(failure) => return self.plainly(driver, failure, &launch),
        };
        if let Some(kept) = graphs.get_mut(&slot) {
            match driver.update(&kept.exec, &graph) {
                Ok(true) => {
                    bump(&self.counters.updates);
                    kept.key = key;
                    bump(&self.counters.graph_launches);
                    return driver.launch(&kept.exec);
                }
                // Another shape of launches: instantiated anew below.
                Ok(false) => {}
                Err(failure) => return self.plainly(driver, failure, &launch),
            }
        }
        let exec = match driver.instantiate(&graph) {
            Ok(e) => e,
            Err(failure) => return self.plainly(driver, failure, &launch),
        };
        bump(&self.counters.instantiations);
        drop(graph);
        bump(&self.counters.graph_launches);
        let launched = driver.launch(&exec);
        graphs.insert(slot, Kept { key, exec });
        launched
    }

    /// This run's passes launched one by one after a failed capture, instantiation or update;
    /// graphs are turned off for good where the failure will recur.
    fn plainly<D: CaptureDriver>(
        &self,
        driver: &D,
        failure: CaptureFailure,
        launch: &impl Fn() -> Result<()>,
    ) -> Result<()> {
        if failure.recurs {
            if !self.unavailable.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "{}: CUDA graphs are unavailable ({}); launching passes one by one",
                    driver.label(),
                    failure.error
                );
            }
        } else {
            tracing::debug!(
                "{}: a CUDA graph capture failed ({}); this run launches its passes one by one",
                driver.label(),
                failure.error
            );
        }
        bump(&self.counters.plain_runs);
        launch()
    }
}

#[cfg(test)]
mod tests;

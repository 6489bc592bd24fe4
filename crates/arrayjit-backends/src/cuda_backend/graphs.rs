//! A routine's passes as one CUDA graph: the launches of a run (the scratch's zeroing, then
//! every pass) are captured once on the stream and the graph is replayed by later runs, one
//! launch from the host instead of one per pass.
//!
//! Rules:
//! - A graph bakes in its launches' arguments: it is kept per kernel, device and stream, with
//!   the device addresses and static indices it was captured with, and captured again when a
//!   run passes others (a routine linked once passes the same buffers every run).
//! - Where capture or instantiation fails (a driver without graphs, a launch that cannot be
//!   captured), the batch stops trying and launches its passes one by one; a launch that
//!   fails inside a capture is that launch's error, and nothing of it has run.
//! - `ARRAYJIT_CUDA_GRAPHS=0` (or `false`, `no`, `off`) turns graphs off (plain launches).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrayjit_ir::Result;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::devices::Gpu;

/// A captured graph. `CudaGraph` holds raw driver handles; the driver requires calls on one
/// graph to be serialized, which the cache's mutex does.
struct Captured {
    key: Vec<u64>,
    graph: CudaGraph,
}

// SAFETY: a `Captured` is only reached through the `GraphCache`'s mutex, so no two threads
// use its graph at once; the handles themselves may move between threads.
unsafe impl Send for Captured {}

/// The graphs of one compiled batch.
#[derive(Default)]
pub(super) struct GraphCache {
    graphs: Mutex<HashMap<(usize, usize, usize), Captured>>,
    unavailable: AtomicBool,
}

/// Whether the process uses graphs (`ARRAYJIT_CUDA_GRAPHS`, on by default); a value that does
/// not parse is an error.
fn enabled() -> Result<bool> {
    crate::settings::flag(&crate::settings::process_env, "ARRAYJIT_CUDA_GRAPHS", true)
}

impl GraphCache {
    /// Runs kernel `kernel`'s launches (`launch` enqueues them on `stream`) through its graph
    /// for `key` (the launches' arguments), capturing it first where there is none or its key
    /// differs; `launch` itself where graphs are off or unavailable.
    pub(super) fn run(
        &self,
        kernel: usize,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        key: Vec<u64>,
        launch: impl Fn() -> Result<()>,
    ) -> Result<()> {
        if !enabled()? || self.unavailable.load(Ordering::Relaxed) {
            return launch();
        }
        let slot = (kernel, gpu.ordinal, Arc::as_ptr(stream) as usize);
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = graphs.get(&slot)
            && c.key == key
        {
            return c
                .graph
                .launch()
                .map_err(|e| gpu.driver_error("launching a CUDA graph", e));
        }
        graphs.remove(&slot);
        if stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .is_err()
        {
            self.give_up(gpu);
            return launch();
        }
        let launched = launch();
        let captured = stream.end_capture(CUgraphInstantiate_flags(0));
        launched?;
        match captured {
            Ok(Some(graph)) => {
                graph
                    .launch()
                    .map_err(|e| gpu.driver_error("launching a CUDA graph", e))?;
                graphs.insert(slot, Captured { key, graph });
                Ok(())
            }
            _ => {
                self.give_up(gpu);
                launch()
            }
        }
    }

    fn give_up(&self, gpu: &Gpu) {
        if !self.unavailable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{}: CUDA graphs are unavailable; launching passes one by one",
                gpu.label()
            );
        }
    }
}

//! CUDA's side of the graph cache ([`super::graphs::CaptureDriver`]): stream capture,
//! instantiation, in-place update (`cuGraphExecUpdate`) and launch of graphs on one stream,
//! with the driver's errors sorted into those that will recur (graphs unsupported) and those
//! of one run (a capture invalidated by another thread).

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaStream, DriverError, result};

use super::devices::Gpu;
use super::graphs::{CaptureDriver, CaptureFailure};

/// A captured graph; destroyed when dropped.
pub(super) struct OwnedGraph(sys::CUgraph);

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        // SAFETY: the graph came from `cuStreamEndCapture` and is destroyed once, here.
        if let Err(e) = unsafe { result::graph::destroy(self.0) } {
            tracing::debug!(error = %e, "destroying a CUDA graph failed");
        }
    }
}

/// An instantiated graph; destroyed when dropped.
pub(super) struct OwnedExec(sys::CUgraphExec);

// SAFETY: an instantiated graph may be used from any thread; the graph cache serializes every
// call on one (its mutex), as the driver requires.
unsafe impl Send for OwnedExec {}

impl Drop for OwnedExec {
    fn drop(&mut self) {
        // SAFETY: the graph exec came from `cuGraphInstantiate` and is destroyed once, here.
        if let Err(e) = unsafe { result::graph::exec_destroy(self.0) } {
            tracing::debug!(error = %e, "destroying an instantiated CUDA graph failed");
        }
    }
}

/// Graph calls on one CUDA stream of a device.
pub(super) struct StreamGraphs<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) stream: &'a CudaStream,
}

/// Whether a driver error will come back on every later try: the driver or device cannot do
/// graphs (or updates) at all. Capture errors caused by what another thread did, a lost
/// capture, memory: this run's only.
fn recurs(e: &DriverError) -> bool {
    matches!(
        e.0,
        CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_NOT_PERMITTED
    )
}

impl StreamGraphs<'_> {
    fn failure(&self, action: &str, e: DriverError) -> CaptureFailure {
        CaptureFailure {
            recurs: recurs(&e),
            error: Box::new(self.gpu.driver_error(action, e)),
        }
    }

    fn bound(&self, action: &str) -> Result<(), CaptureFailure> {
        self.gpu.bind(action).map_err(|error| CaptureFailure {
            error: Box::new(error),
            recurs: false,
        })
    }
}

impl CaptureDriver for StreamGraphs<'_> {
    type Graph = OwnedGraph;
    type Exec = OwnedExec;

    fn begin_capture(&self) -> Result<(), CaptureFailure> {
        self.bound("capturing a CUDA graph")?;
        // Thread-local: only this thread's own unsafe calls are refused while it captures;
        // other threads keep working (the capture gate keeps frees and context waits away).
        // SAFETY: the stream is live (borrowed from its queue).
        unsafe {
            result::stream::begin_capture(
                self.stream.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| self.failure("beginning a CUDA graph capture", e))
    }

    fn end_capture(&self) -> Result<OwnedGraph, CaptureFailure> {
        self.bound("capturing a CUDA graph")?;
        // SAFETY: the stream is live and capturing (begun by `begin_capture` on this thread).
        let graph = unsafe { result::stream::end_capture(self.stream.cu_stream()) }
            .map_err(|e| self.failure("ending a CUDA graph capture", e))?;
        if graph.is_null() {
            return Err(CaptureFailure {
                error: Box::new(arrayjit_ir::Error::invalid(
                    "the CUDA driver ended a capture without a graph",
                )),
                recurs: false,
            });
        }
        Ok(OwnedGraph(graph))
    }

    fn instantiate(&self, graph: &OwnedGraph) -> Result<OwnedExec, CaptureFailure> {
        self.bound("instantiating a CUDA graph")?;
        // SAFETY: the graph is a live captured graph.
        unsafe { result::graph::instantiate(graph.0, sys::CUgraphInstantiate_flags(0)) }
            .map(OwnedExec)
            .map_err(|e| self.failure("instantiating a CUDA graph", e))
    }

    fn update(&self, exec: &OwnedExec, graph: &OwnedGraph) -> Result<bool, CaptureFailure> {
        self.bound("updating a CUDA graph")?;
        let mut info = sys::CUgraphExecUpdateResultInfo {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: std::ptr::null_mut(),
            errorFromNode: std::ptr::null_mut(),
        };
        // SAFETY: both handles are live; the cache serializes calls on the instantiated graph.
        let r = unsafe { sys::cuGraphExecUpdate_v2(exec.0, graph.0, &mut info) };
        match r {
            CUresult::CUDA_SUCCESS => Ok(true),
            // The launches' shape differs (topology, kernels, node kinds): instantiate anew.
            CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(false),
            other => Err(self.failure("updating a CUDA graph", DriverError(other))),
        }
    }

    fn launch(&self, exec: &OwnedExec) -> arrayjit_ir::Result<()> {
        self.gpu.bind("launching a CUDA graph")?;
        // SAFETY: the instantiated graph is live; the stream is live.
        unsafe { result::graph::launch(exec.0, self.stream.cu_stream()) }
            .map_err(|e| self.gpu.driver_error("launching a CUDA graph", e))
    }

    fn label(&self) -> String {
        self.gpu.label()
    }
}

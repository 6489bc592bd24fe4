//! The `cuda` lowered backend (cargo feature `cuda`): NVIDIA GPUs through the CUDA driver API
//! and NVRTC, both loaded at run time by `cudarc` (nothing from CUDA is needed to build).
//!
//! - **Availability**: libcuda and libnvrtc are looked up *before* any call (cudarc panics on
//!   a missing library); a missing one, or a driver with no device, makes every call a
//!   [`Error::BackendUnavailable`](arrayjit_ir::Error::BackendUnavailable) saying what to install.
//! - **Devices**: one per GPU, each on its primary context; [`DeviceInfo`](crate::device_info::DeviceInfo) from the driver's
//!   attributes (multiprocessors, threads and shared memory per block, warp size, memory).
//! - **Code**: routines render to CUDA C ([`arrayjit_codegen::cuda`]), split into units that
//!   NVRTC compiles in parallel straight to CUBIN for the device's architecture ([`aot`]) with
//!   `--fmad=false` (no contraction the IR did not ask for), so loading a module compiles
//!   nothing; each unit is cached in memory and on disk ([`PtxCache`], in the compile cache
//!   folder). Hand-written source is one unit. Static indices are kernel
//!   parameters; the scratch buffer holding a routine's local nodes is zeroed on the stream
//!   before its first pass.
//! - **Streams and events**: each runtime stream gets a CUDA stream of its own
//!   ([`crate::device_runtime::DeviceRuntime::new_queue`]); markers are CUDA events, and a stream waiting for
//!   another's marker waits on the device (`cuStreamWaitEvent`).
//! - **Launches**: a routine's passes are captured as a CUDA graph per stream, instantiated
//!   once and replayed (`graphs`: one launch a run); a run with other arguments (a static
//!   index that changes every step) updates the graph in place; plain launches where graphs
//!   are unavailable or `ARRAYJIT_CUDA_GRAPHS=0`, or for the run whose capture failed. A timed launch
//!   ([`crate::compiled_batch::LaunchRequest::timed`]) records CUDA events around its passes and reports the
//!   device time between them once the stream is next waited for.
//! - **Memory**: buffers and pools are `cuMemAlloc` allocations (a pool's views are offsets
//!   into one), zeroed on the device's own stream and waited for before they are handed out
//!   (never on the legacy stream, which the backend's non-blocking streams do not wait for).
//!   A dropped allocation is freed in stream order (`releases`): once an event after the work
//!   queued on every stream of the device has passed, never while a stream captures, without
//!   synchronizing the context; the used bytes go down when it is really freed.
//!   Copies between devices go through the host.
//! - **Errors**: every driver or NVRTC failure is an [`Error::Driver`](arrayjit_ir::Error::Driver) naming the device and
//!   the action, with cudarc's error as its source.

pub mod aot;
mod batch;
mod buffers;
mod compiler;
mod devices;
mod graph_driver;
mod graphs;
mod ptx;
mod queue;
mod releases;
mod renderer;
pub mod resources;
mod runtime;
mod tensor_maps;

use std::sync::Arc;

use crate::lowered_backend::{BackendParts, LoweredBackend};

pub use batch::CudaBatch;
pub use buffers::CudaBuffer;
pub use compiler::CudaCompiler;
pub use devices::CudaDevices;
pub use graphs::GraphCounts;
pub use ptx::{
    PtxCache, PtxOrigin, compile_ptx, compile_ptx_with_options, compile_ptx_with_origin,
    default_nvrtc_flags, feature_arch,
};
pub use renderer::{CudaRenderer, CudaSource};
pub use runtime::CudaRuntime;

const NAME: &str = "cuda";

/// What to install when the backend cannot run.
const HOW_TO_ENABLE: &str = "install the NVIDIA driver (libcuda.so.1) and NVRTC (libnvrtc.so: \
    the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` with its lib folder on \
    LD_LIBRARY_PATH) on a machine with an NVIDIA GPU";

/// The `cuda` backend: the machine's GPUs ([`CudaDevices`], opened once per process), CUDA C
/// ([`CudaRenderer`]) compiled by NVRTC ([`CudaCompiler`]), and buffers, pools and streams on
/// them ([`CudaRuntime`]). Never fails: without the libraries or a GPU, every call says what is
/// missing.
pub fn backend() -> LoweredBackend {
    let devices = Arc::new(CudaDevices::opened());
    LoweredBackend::compose(
        NAME,
        BackendParts {
            compiler: Arc::new(CudaCompiler::new(devices.clone())),
            runtime: Arc::new(CudaRuntime::new(devices.clone())),
            renderer: Arc::new(CudaRenderer),
            devices,
        },
    )
}

//! Code compiled for a backend ([`CompiledBatch`]) and the one way to run it: a
//! [`LaunchRequest`] — which kernel, its buffers and static indices, the queue, and, where
//! wanted, launch dimensions chosen now and a sink for the device's own time.

use std::fmt::Debug;

use arrayjit_codegen::KernelInterface;
use arrayjit_ir::Result;

use crate::device_buffer::BufferHandle;
use crate::queue::Queue;

/// Receives a kernel's time on its device ([`LaunchRequest::timed`]), from whichever
/// thread learns it.
pub type DeviceTimeSink = Box<dyn FnOnce(std::time::Duration) + Send>;

/// Launch dimensions chosen at launch time (the reference's `launch_kernel ~global_dims
/// ?local_dims`), for kernels compiled from source given directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchAt {
    /// Threads per axis: `ceil(global / local)` blocks per axis run
    /// ([`arrayjit_codegen::LaunchDims::covering`]; the kernel skips the threads past it).
    pub global: [u32; 3],
    /// Threads per block, or `None` for the backend's pick: `cuda` and `cuda_emu` up to 256
    /// threads along x within the device's limits
    /// ([`arrayjit_codegen::LaunchDims::default_block`]); `wgpu` the shader's
    /// `@workgroup_size`, which a given block must equal.
    pub local: Option<[u32; 3]>,
}

/// One launch of a kernel of a batch: what [`CompiledBatch::launch`] takes.
pub struct LaunchRequest<'a> {
    /// The kernel's index in its batch ([`CompiledBatch::kernel_index`]).
    pub kernel: usize,
    /// One buffer per array argument of the kernel's interface, and the merge buffer last if
    /// it reads one.
    pub buffers: &'a [BufferHandle],
    /// The static indices' values, in the interface's order.
    pub statics: &'a [i64],
    /// The queue to enqueue on ([`crate::queue`]); `None`: finished before the call returns.
    pub queue: Queue<'a>,
    /// Launch dimensions chosen now ([`LaunchAt`]); `None`: as compiled (a routine's schedule,
    /// or the launch given at `compile_source`).
    pub dims: Option<LaunchAt>,
    /// Where the kernel's own time on its device goes once the device knows it, where wanted.
    pub timer: Option<DeviceTimeSink>,
}

impl<'a> LaunchRequest<'a> {
    /// Kernel `kernel` with these buffers and static indices, finished before the call
    /// returns, as compiled, untimed.
    pub fn new(kernel: usize, buffers: &'a [BufferHandle], statics: &'a [i64]) -> Self {
        LaunchRequest {
            kernel,
            buffers,
            statics,
            queue: None,
            dims: None,
            timer: None,
        }
    }

    /// Enqueued on `queue` (none: finished before the call returns).
    pub fn on(mut self, queue: Queue<'a>) -> Self {
        self.queue = queue;
        self
    }

    /// With launch dimensions chosen now.
    pub fn with_dims(mut self, global: [u32; 3], local: Option<[u32; 3]>) -> Self {
        self.dims = Some(LaunchAt { global, local });
        self
    }

    /// With the device's own time given to `sink` (see [`CompiledBatch::launch`]).
    pub fn timed(mut self, sink: DeviceTimeSink) -> Self {
        self.timer = Some(sink);
        self
    }
}

impl Debug for LaunchRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("kernel", &self.kernel)
            .field("buffers", &self.buffers.len())
            .field("statics", &self.statics)
            .field("queued", &self.queue.is_some())
            .field("dims", &self.dims)
            .field("timed", &self.timer.is_some())
            .finish()
    }
}

/// Code compiled for a backend: one or more kernels from one compilation.
pub trait CompiledBatch: Send + Sync + Debug {
    /// The kernels and how to call them.
    fn kernels(&self) -> &[KernelInterface];
    /// The generated source code.
    fn source(&self) -> &str;
    /// Whether the compiled code came from the compile cache (`Some(true)`), was compiled
    /// (`Some(false)`), or the backend does not say (`None`, the default).
    fn cache_hit(&self) -> Option<bool> {
        None
    }
    /// The index of the kernel named `name` (its interface's name or symbol), for
    /// [`LaunchRequest::kernel`].
    fn kernel_index(&self, name: &str) -> Option<usize> {
        self.kernels()
            .iter()
            .position(|k| k.name == name || k.symbol == name)
    }
    /// Runs a kernel as `request` says: enqueued on its queue when given, else finished
    /// before returning. Buffer sizes and static ranges are checked first; a mismatch is an
    /// error, never an out-of-bounds access.
    ///
    /// - **Dimensions chosen now** ([`LaunchRequest::dims`]) are taken only by kernels from
    ///   [`crate::lowered_backend::LoweredBackend::compile_source`] on `cuda`, `cuda_emu` and `wgpu`; a block
    ///   past the device's limits is an error before anything runs. Elsewhere they are an
    ///   error saying so (a C kernel runs once per call; routines launch as their schedule
    ///   says).
    /// - **Timing** ([`LaunchRequest::timer`]): `Ok(true)` when the sink will get the
    ///   kernel's own time on its device (a GPU backend reads timestamps the device writes
    ///   around the kernel's passes, usually after this returns, when the queue is next
    ///   waited for); `Ok(false)` when this backend does not time its device, so the caller
    ///   times the call itself (on a CPU backend, whose launches finish before they return,
    ///   that is the kernel's time). On an error the sink is dropped.
    ///
    /// # Safety
    /// The kernel reads and writes the buffers' memory without locks. While it runs (until it
    /// returns, or until the work of the queue has finished), nothing else may write a buffer
    /// it reads, or access a buffer it writes (see [`crate::lowered_backend::DATA_PLANE_CONTRACT`]). The
    /// runtime meets this by ordering every access to an array with events
    /// (`arrayjit_runtime`'s `host_sync` rules); code outside it must order its accesses
    /// itself.
    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool>;
    /// Makes the device state the batch keeps of its own, once, before its first launch:
    /// called by every link of one of its kernels into a context (`arrayjit_runtime`'s
    /// `Context::link`), so a failure (out of device memory) is the link's, before anything
    /// runs; a launch without a link (source given directly) makes it then. Compiling
    /// allocates no device memory. Default: there is none (the CPU backends, whose locals live
    /// on the stack or in the stream's scratch, and `cuda`, whose locals live in the scratch).
    fn link(&self) -> Result<()> {
        Ok(())
    }
    /// The time a kernel compiled to time its statements
    /// (`arrayjit_opt::Optimized::profile_statements`) spent in each top-level statement since
    /// this was last asked, and how many times each ran: `(nanoseconds, calls)` per statement,
    /// in order, and the counters reset. `None`: the kernel was not compiled to time its
    /// statements, or the backend cannot (GPU backends, the default).
    fn statement_times(&self, kernel: usize) -> Option<Vec<(u64, u64)>> {
        let _ = kernel;
        None
    }
}

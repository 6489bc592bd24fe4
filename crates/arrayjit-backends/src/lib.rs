//! arrayjit-backends: the third layer of arrayjit. A lowered backend turns optimized routines
//! into runnable code for its devices and owns its buffers: [`cc::CpuBackend`] renders C (the
//! `cc` backend) or emulated CUDA (`cuda_emu`), compiles it with the system compiler and runs it
//! on the CPU; `cuda_backend::CudaBackend` (cargo feature `cuda`) renders CUDA C and runs it
//! through NVRTC and the driver API; `wgpu_backend::WgpuBackend` (cargo feature `wgpu`) renders
//! WGSL and runs it on a GPU through wgpu; [`missing::MissingBackend`] stands in for a backend
//! that was not built or cannot run here and answers every call with a typed error.
//!
//! # The seam
//!
//! Everything above this layer (contexts, routines, host synchronization, merge buffers, pools,
//! data parallelism) is written once, against the parts of a backend (the reference's
//! `Device_info`, `Renderer`, `Compiler` and `Runtime`):
//!
//! - Device info: [`LoweredBackend::device_info`] says what each device is and can do
//!   ([`DeviceInfo`], from which schedules are chosen), and [`LoweredBackend::gpu_dialect`]
//!   the device strings a GPU renderer prints.
//! - Renderer and compiler: [`LoweredBackend::render_source`] and
//!   [`LoweredBackend::compile_batch`] turn optimized routines into a [`CompiledBatch`], with
//!   [`CompileOptions`]; `check_available` says what to install when the backend cannot run
//!   here. The CPU backends take these from [`cc::CpuKernels`] (C, or emulated CUDA as C++).
//! - Runtime: [`LoweredBackend::runtime`] is the backend's [`DeviceRuntime`] — buffers and
//!   pools (bookkept by one [`PoolTable`]), copies between the host and devices and between
//!   buffers, queues and `synchronize`. Every CPU backend shares [`cpu::CpuRuntime`].
//! - [`KernelInterface`] (from `arrayjit-codegen`): the one statement of how a kernel is
//!   called — its buffers in order (arrays, merge buffer, scratch) and its static indices.
//!   The renderer produces it, the runtime gathers buffers in its order, and [`check_launch`]
//!   checks every launch against it, whichever backend runs it.
//! - The runtime's registry (`arrayjit_runtime::registry`) names each backend and pairs its
//!   lowered backend with a scheduler: CPU backends get streams and events from the `Sync` or
//!   `Multicore` scheduler; the wgpu backend's queue runs work in submission order under the
//!   `Sync` scheduler (host reads wait for the queue).
//!
//! A new backend is an implementation of [`LoweredBackend`] and [`DeviceRuntime`] (and its
//! [`DeviceBuffer`] and [`CompiledBatch`]) plus one registry row; `docs/adding-a-backend.md`
//! walks through the parts, and the shared conformance corpus checks it against the
//! interpreter.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod array_buffer;
pub mod buffer;
pub mod cc;
pub mod compile_cache;
pub mod compiled_batch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_backend;
pub mod device_info;
pub mod device_runtime;
pub mod missing;
pub mod notice;
pub mod pool_table;
pub mod queue;
pub mod sanitizer;
pub mod settings;
#[cfg(feature = "wgpu")]
pub mod wgpu_backend;
pub mod worker_pool;

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use arrayjit_codegen::{KernelInterface, SourceKernel};
use arrayjit_ir::{Optimized, Result};

pub use array_buffer::ArrayBuffer;
pub use buffer::{CpuBuffer, MemoryCounter};
pub use compiled_batch::{CompiledBatch, LaunchAt, LaunchRequest};
pub use device_info::{DeviceInfo, DeviceKind};
pub use device_runtime::{
    DeviceRuntime, byte_range_end, patch_whole_buffer, read_through_whole_buffer,
};
pub use pool_table::{PoolMemory, PoolTable, Pools};
pub use queue::{DeviceQueue, Queue, QueueMarker};

/// A device buffer of some backend.
pub trait DeviceBuffer: Any + Send + Sync + Debug {
    /// Its size in bytes.
    fn size_in_bytes(&self) -> usize;
    /// The device ordinal it lives on.
    fn device(&self) -> usize;
    /// For downcasting to the backend's buffer type.
    fn as_any(&self) -> &dyn Any;
    /// The precision of the values it holds, when it knows (an [`ArrayBuffer`]); `None`: raw
    /// bytes (scratch, [`DeviceRuntime::alloc_zeroed`]).
    fn prec(&self) -> Option<arrayjit_ir::Prec> {
        None
    }
}

/// A shared handle to a device buffer.
pub type BufferHandle = Arc<dyn DeviceBuffer>;

/// Receives a kernel's time on its device ([`LaunchRequest::timed`]), from whichever
/// thread learns it.
pub type DeviceTimeSink = Box<dyn FnOnce(std::time::Duration) + Send>;

/// The checks every launch makes before a kernel runs, from its [`KernelInterface`]: one
/// buffer per argument, of this backend's buffer type `B` (`backend` names it in errors) and at
/// least the size the interface needs, and of the precision of its array when the buffer knows
/// its own ([`DeviceBuffer::prec`]); one value per static index, within its range. Returns
/// the buffers as `B`, in order. A mismatch is an error, never an out-of-bounds access.
pub fn check_launch<'a, B: DeviceBuffer>(
    k: &KernelInterface,
    args: &'a [BufferHandle],
    statics: &[i64],
    backend: &str,
) -> Result<Vec<&'a B>> {
    use arrayjit_ir::Error;
    let expected = k.buffer_sizes();
    let precs: Vec<arrayjit_ir::Prec> = k
        .args
        .iter()
        .chain(k.merge.iter())
        .map(|t| t.prec())
        .collect();
    if args.len() != expected.len() {
        return Err(Error::invalid(format!(
            "kernel {} takes {} buffers but {} were given",
            k.name,
            expected.len(),
            args.len()
        )));
    }
    let mut buffers = Vec::with_capacity(args.len());
    for (pos, (b, &need)) in args.iter().zip(&expected).enumerate() {
        let buffer = b.as_any().downcast_ref::<B>().ok_or_else(|| {
            Error::invalid(format!(
                "argument {pos} of {} is not a {backend} buffer",
                k.name
            ))
        })?;
        if buffer.size_in_bytes() < need {
            return Err(Error::ShapeMismatch {
                op: format!("launching {}", k.name),
                shapes: vec![],
                detail: format!(
                    "argument {pos} needs {need} bytes but its buffer has {}",
                    buffer.size_in_bytes()
                ),
            });
        }
        if let Some(&prec) = precs.get(pos) {
            array_buffer::check_prec(b, prec, &format!("argument {pos} of {}", k.name))?;
        }
        buffers.push(buffer);
    }
    if statics.len() != k.statics.len() {
        return Err(Error::invalid(format!(
            "kernel {} takes {} static indices but {} were given",
            k.name,
            k.statics.len(),
            statics.len()
        )));
    }
    for (s, &v) in k.statics.iter().zip(statics) {
        if v < 0 || v >= s.range as i64 {
            return Err(Error::StaticIndex {
                symbol: s.name.clone(),
                detail: format!("value {v} is outside 0..{}", s.range),
            });
        }
    }
    Ok(buffers)
}

/// The error for launching kernel `index` of a batch that has `len` kernels.
pub fn no_such_kernel(index: usize, len: usize) -> arrayjit_ir::Error {
    arrayjit_ir::Error::invalid(format!(
        "kernel index {index} but the batch has {len}; find kernels with kernel_index"
    ))
}

/// The error for launch dimensions given at launch time to kernel `kernel`, compiled from
/// assignments (see [`LaunchRequest::with_dims`]).
pub fn launch_dims_not_taken(kernel: &str) -> arrayjit_ir::Error {
    arrayjit_ir::Error::invalid(format!(
        "kernel {kernel} was compiled from assignments and launches as its schedule says; \
         launch dimensions at launch time are for compile_source kernels"
    ))
}

/// The name of a batch of routines in traces and listings: their names joined by `+`.
pub fn batch_name(routines: &[&Optimized]) -> String {
    let names: Vec<&str> = routines.iter().map(|r| r.name.as_str()).collect();
    names.join("+")
}

/// Options of one compilation (the reference's `Compiler.compile_options`), starting from a
/// backend's [`LoweredBackend::default_compile_options`] (its `default_options`): for `cc` and
/// `cuda_emu`, the host compiler's flags (by default `CcConfig::flags`, e.g. from
/// `ARRAYJIT_CC_FLAGS`); the other backends take none yet. Compiled code is cached per options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// The compiler's flags, in order.
    pub flags: Vec<String>,
}

/// The contract of the lowered layer's data plane: the calls that read or write a buffer's
/// memory ([`CompiledBatch::launch`], [`DeviceRuntime::copy_from_host`],
/// [`DeviceRuntime::copy_to_host`], their `_range` forms, [`DeviceRuntime::copy_buffer`],
/// [`DeviceRuntime::memset_zero`]) are `unsafe fn`: backends touch device memory (on the CPU,
/// plain host memory) without locks, so two of these calls racing on one buffer, one of them
/// writing, is a data race. A caller must order them: while a call writes a buffer (until it
/// returns, or until its queue's work has finished), nothing else accesses that buffer; while
/// it reads one, nothing writes it. Pool memory counts for every buffer viewing it.
///
/// Safe code does not need these calls: `arrayjit_runtime::Context` offers every transfer
/// (`from_host`, `to_host`, their ranges, `device_to_device`, `schedule_on_array` for work
/// of other layers), each ordered by the arrays' events. Calling one without `unsafe` does not
/// compile:
///
/// ```compile_fail,E0133
/// use arrayjit_backends::{BufferHandle, LoweredBackend};
/// fn racy(lowered: &dyn LoweredBackend, array: &BufferHandle) {
///     lowered.runtime().copy_from_host(array, &[0u8; 4], None).unwrap();
/// }
/// ```
///
/// ```compile_fail,E0133
/// use arrayjit_backends::{BufferHandle, CompiledBatch};
/// fn racy(batch: &dyn CompiledBatch, array: BufferHandle) {
///     batch.launch(arrayjit_backends::LaunchRequest::new(0, &[array], &[])).unwrap();
/// }
/// ```
pub const DATA_PLANE_CONTRACT: &str = "nothing else accesses a buffer while a call writes it, \
    and nothing writes it while a call reads it";

/// A lowered backend, composed of parts (see the crate documentation): what its devices are,
/// how routines are rendered and compiled for them, and its [`DeviceRuntime`] (buffers, pools,
/// copies), whose calls that touch buffer memory are `unsafe fn` ([`DATA_PLANE_CONTRACT`]).
pub trait LoweredBackend: Send + Sync + Debug {
    /// The backend's name (e.g. `"cc"`).
    fn name(&self) -> &str;
    /// `Ok` if the backend can run here, or why not.
    fn check_available(&self) -> Result<()>;
    /// The backend's runtime: its devices' buffers, pools, queues and copies.
    fn runtime(&self) -> &dyn DeviceRuntime;
    /// What device `device` is and can do; an error for a device that does not exist (or a
    /// backend that cannot run here).
    fn device_info(&self, device: usize) -> Result<DeviceInfo>;
    /// What the optimizer's schedules may assume of this backend's devices (vector width,
    /// registers, caches): from device 0's [`DeviceInfo`], or the portable defaults of
    /// [`ScheduleSettings`](arrayjit_ir::schedule::ScheduleSettings) when there is none.
    fn schedule_settings(&self) -> arrayjit_ir::schedule::ScheduleSettings {
        self.device_info(0)
            .map(|d| d.schedule_settings())
            .unwrap_or_default()
    }
    /// What the run time of a schedule on this backend depends on (device model, compiler and
    /// its flags, worker count): the schedule search keys the choices it stores with it.
    /// Default: [`LoweredBackend::debug_info`].
    fn machine_identity(&self) -> String {
        self.debug_info()
    }
    /// The schedule choice stored under `key` (a hexadecimal hash) by
    /// [`LoweredBackend::store_schedule_choice`]; `Ok(None)` when none is stored, `Err` with
    /// why when a stored one cannot be read. Default: nothing is ever stored.
    fn load_schedule_choice(&self, key: &str) -> std::result::Result<Option<String>, String> {
        let _ = key;
        Ok(None)
    }
    /// Stores a schedule choice (one line of text) under `key`, next to the backend's compile
    /// cache; returns whether it was stored (`false`: the backend keeps no cache).
    fn store_schedule_choice(&self, key: &str, choice: &str) -> Result<bool> {
        let _ = (key, choice);
        Ok(false)
    }
    /// The source [`LoweredBackend::compile_batch`] would compile for these routines, without
    /// compiling it: equal sources make equal kernels. Default: the routines' loop code (for
    /// backends without a renderer of their own).
    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        Ok(routines.iter().map(|r| format!("{}\n", r.code)).collect())
    }
    /// Compiles routines together (one library, one compilation).
    fn compile_batch(&self, routines: &[&Optimized]) -> Result<Arc<dyn CompiledBatch>>;
    /// The GPU dialect this backend's kernels are printed in (`cuda`, `cuda_emu`: CUDA; `wgpu`:
    /// WGSL), whose device strings the renderer uses (the reference's
    /// `Device_info.renderer_float4_str`, `renderer_smem_prefix`, `renderer_barrier_str`);
    /// `None` (the default) for C on CPUs.
    fn gpu_dialect(&self) -> Option<&'static arrayjit_codegen::gpu_dialect::GpuDialect> {
        None
    }
    /// The options [`LoweredBackend::compile_batch`] compiles with (the reference's
    /// `Compiler.default_options`). Default: none.
    fn default_compile_options(&self) -> CompileOptions {
        CompileOptions::default()
    }
    /// [`LoweredBackend::compile_batch`] with `options` instead of the default ones (the
    /// reference's `Compiler.compile ~options`). Default: the default options compile as
    /// usual; any other is an error saying the backend takes none.
    fn compile_batch_with(
        &self,
        routines: &[&Optimized],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        if *options == self.default_compile_options() {
            return self.compile_batch(routines);
        }
        Err(arrayjit_ir::Error::invalid(format!(
            "backend {} takes no compile options yet (given {:?}); compile with its defaults",
            self.name(),
            options.flags
        )))
    }
    /// Compiles source given directly, in the backend's language (the reference's `compile
    /// ~source_code` and `get_kernel`): for tools and tests that drive a backend's kernels
    /// themselves. Each [`SourceKernel`] names its exported symbol, its buffers and static
    /// indices ([`KernelInterface`]) and, on GPUs, its launch; launches are checked against the
    /// interfaces as for compiled routines, and the batch finds a kernel by name or symbol
    /// ([`CompiledBatch::kernel_index`]). The calling convention per backend:
    ///
    /// - `cc` (C): `void f(uint8_t *const *buffers, const int64_t *statics, const void
    ///   *workers)`, called once (the launch is ignored);
    /// - `cuda` (CUDA C for NVRTC) and `cuda_emu` (the same source run on the CPU):
    ///   `extern "C" __global__ void f(...)` with one pointer parameter per buffer, in the
    ///   interface's order, then one `long long` per static index; launched with the given grid
    ///   and block. Include no CUDA headers (`cuda_emu` provides the built-ins);
    /// - `wgpu` (WGSL): an entry point named by the symbol; buffer `i` of the interface at
    ///   `@group(0) @binding(i)`, and the static indices, when there are any, as
    ///   `array<i32>` at the binding after the last buffer; the grid is the workgroup count
    ///   (the shader declares its `@workgroup_size`).
    ///
    /// Default: an error saying the backend does not take source directly.
    ///
    /// # Safety
    /// The source runs as native code: it must export every kernel with the calling
    /// convention's signature, and a kernel must touch only the bytes its interface gives each
    /// buffer. Nothing can check what hand-written code does.
    unsafe fn compile_source(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<Arc<dyn CompiledBatch>> {
        let _ = (source, kernels);
        Err(arrayjit_ir::Error::invalid(format!(
            "backend {} does not compile source given directly; use cc, cuda_emu, cuda or wgpu",
            self.name()
        )))
    }
    /// [`LoweredBackend::compile_source`] with `options` instead of the default ones (the
    /// reference's `Compiler.compile ~options` for source given directly), checked as
    /// [`LoweredBackend::compile_batch_with`] checks them. Default: the default options compile
    /// as usual; any other is an error saying the backend takes none.
    ///
    /// # Safety
    /// As [`LoweredBackend::compile_source`].
    unsafe fn compile_source_with(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        if *options == self.default_compile_options() {
            // SAFETY: the caller's contract is this method's.
            return unsafe { self.compile_source(source, kernels) };
        }
        Err(arrayjit_ir::Error::invalid(format!(
            "backend {} takes no compile options yet (given {:?}); compile with its defaults",
            self.name(),
            options.flags
        )))
    }
    /// Backend-specific debug information.
    fn debug_info(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::{Error, Prec, StaticSymbol, Tnode};

    fn interface() -> KernelInterface {
        KernelInterface {
            name: "k".into(),
            symbol: "k".into(),
            args: vec![Tnode::new(Prec::F32, &[4], &["x"]).unwrap()],
            merge: None,
            statics: vec![StaticSymbol::new("batch", 3)],
            scratch_bytes: 8,
        }
    }

    fn cpu(bytes: usize) -> BufferHandle {
        Arc::new(CpuBuffer::zeroed(bytes, 0, Arc::default()).unwrap())
    }

    #[test]
    fn launches_are_checked_against_the_kernel_interface() {
        let k = interface();
        let ok = [cpu(16), cpu(8)];
        assert_eq!(
            check_launch::<CpuBuffer>(&k, &ok, &[2], "cc")
                .unwrap()
                .len(),
            2
        );
        let e = check_launch::<CpuBuffer>(&k, &ok[..1], &[2], "cc").unwrap_err();
        assert!(e.to_string().contains("takes 2 buffers but 1"), "{e}");
        let e = check_launch::<CpuBuffer>(&k, &[cpu(12), cpu(8)], &[2], "cc").unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = check_launch::<CpuBuffer>(&k, &ok, &[3], "cc").unwrap_err();
        assert!(matches!(e, Error::StaticIndex { .. }), "{e}");
        let e = check_launch::<CpuBuffer>(&k, &ok, &[], "cc").unwrap_err();
        assert!(e.to_string().contains("static indices"), "{e}");
        // Another backend's buffer type is refused by name.
        #[derive(Debug)]
        struct Other;
        impl DeviceBuffer for Other {
            fn size_in_bytes(&self) -> usize {
                64
            }
            fn device(&self) -> usize {
                0
            }
            fn as_any(&self) -> &dyn Any {
                self
            }
        }
        let other: [BufferHandle; 2] = [Arc::new(Other), cpu(8)];
        let e = check_launch::<CpuBuffer>(&k, &other, &[0], "cc").unwrap_err();
        assert!(e.to_string().contains("not a cc buffer"), "{e}");
    }
}

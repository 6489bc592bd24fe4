//! The lowered backend ([`LoweredBackend`]): what its devices are, how routines are rendered and
//! compiled for them ([`CompileOptions`]), and its runtime; and the contract of the data plane
//! its unsafe calls follow ([`DATA_PLANE_CONTRACT`]).

use std::fmt::Debug;
use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_ir::{Optimized, Result};

use crate::compiled_batch::CompiledBatch;
use crate::device_info::DeviceInfo;
use crate::device_runtime::DeviceRuntime;

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
    /// indices ([`KernelInterface`](arrayjit_codegen::KernelInterface)) and, on GPUs, its launch; launches are checked against the
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
    /// Default: [`LoweredBackend::compile_source_with`] with the default options.
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
        // SAFETY: this method's contract is `compile_source_with`'s.
        unsafe { self.compile_source_with(source, kernels, &self.default_compile_options()) }
    }
    /// [`LoweredBackend::compile_source`] with `options` instead of the default ones (the
    /// reference's `Compiler.compile ~options` for source given directly), checked as
    /// [`LoweredBackend::compile_batch_with`] checks them. `compile_source` calls it with the
    /// defaults, so a backend that takes source implements this one. Default: an error saying
    /// the backend does not take source directly.
    ///
    /// # Safety
    /// As [`LoweredBackend::compile_source`].
    unsafe fn compile_source_with(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let _ = (source, kernels, options);
        Err(arrayjit_ir::Error::invalid(format!(
            "backend {} does not compile source given directly; use cc, cuda_emu, cuda or wgpu",
            self.name()
        )))
    }
    /// Backend-specific debug information.
    fn debug_info(&self) -> String;
}

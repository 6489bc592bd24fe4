//! The lowered backend ([`LoweredBackend`]): one backend composed of its four parts
//! ([`BackendParts`]: devices, renderer, compiler, runtime), and the contract of the data plane
//! its unsafe calls follow ([`DATA_PLANE_CONTRACT`]).

use std::fmt::Debug;
use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_ir::{Result, trace};
use arrayjit_opt::Optimized;
use arrayjit_opt::schedule::ScheduleSettings;

use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler};
use crate::device_info::DeviceInfo;
use crate::device_runtime::DeviceRuntime;
use crate::devices::Devices;
use crate::renderer::{RenderedProgram, Renderer};

/// The name of a batch of routines in traces and listings: their names joined by `+`.
pub fn batch_name(routines: &[&Optimized]) -> String {
    let names: Vec<&str> = routines.iter().map(|r| r.name.as_str()).collect();
    names.join("+")
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
/// fn racy(lowered: &LoweredBackend, array: &BufferHandle) {
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

/// The four parts of a backend (the reference's `Device_info`, `Renderer`, `Compiler` and
/// `Runtime`), each its own object. Parts of one backend may share state behind them (the
/// CUDA compiler and runtime share the opened GPUs), and one object may serve as several
/// parts (the placeholder of a missing backend answers as all four).
#[derive(Clone, Debug)]
pub struct BackendParts {
    /// What the devices are and whether the backend can run here.
    pub devices: Arc<dyn Devices>,
    /// How routines (or source given directly) become a [`RenderedProgram`].
    pub renderer: Arc<dyn Renderer>,
    /// How a [`RenderedProgram`] becomes a [`CompiledBatch`].
    pub compiler: Arc<dyn Compiler>,
    /// Buffers, pools, queues and copies; its calls that touch buffer memory are `unsafe fn`
    /// ([`DATA_PLANE_CONTRACT`]).
    pub runtime: Arc<dyn DeviceRuntime>,
}

/// A lowered backend: a name and its four [`BackendParts`]. Everything above this layer
/// (contexts, routines, host synchronization, merge buffers, pools) is written against it; the
/// methods below are the parts' own, for callers that need not know which part answers.
#[derive(Clone, Debug)]
pub struct LoweredBackend {
    name: String,
    parts: BackendParts,
}

impl LoweredBackend {
    /// Backend `name`, composed of `parts`.
    pub fn compose(name: impl Into<String>, parts: BackendParts) -> LoweredBackend {
        LoweredBackend {
            name: name.into(),
            parts,
        }
    }

    /// The backend's name (e.g. `"cc"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its four parts.
    pub fn parts(&self) -> &BackendParts {
        &self.parts
    }

    /// Its device-info part.
    pub fn devices(&self) -> &dyn Devices {
        self.parts.devices.as_ref()
    }

    /// Its renderer.
    pub fn renderer(&self) -> &dyn Renderer {
        self.parts.renderer.as_ref()
    }

    /// Its compiler.
    pub fn compiler(&self) -> &dyn Compiler {
        self.parts.compiler.as_ref()
    }

    /// Its runtime: the devices' buffers, pools, queues and copies.
    pub fn runtime(&self) -> &dyn DeviceRuntime {
        self.parts.runtime.as_ref()
    }

    /// `Ok` if the backend can run here, or why not ([`Devices::check_available`]).
    pub fn check_available(&self) -> Result<()> {
        self.devices().check_available()
    }

    /// What device `device` is and can do ([`Devices::device_info`]).
    pub fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        self.devices().device_info(device)
    }

    /// What the optimizer's schedules may assume of the devices
    /// ([`Devices::schedule_settings`]); on a CPU, with the cache shares of products measured
    /// for this CPU ([`LoweredBackend::cpu_shares`]).
    pub fn schedule_settings(&self) -> ScheduleSettings {
        let mut settings = self.devices().schedule_settings();
        if settings.gpu.is_none() {
            settings.cache_shares = self.cpu_shares().shares;
        }
        settings
    }

    /// The limits of the devices' groups of invocations, for a backend whose devices run GPU
    /// passes (`None` on a CPU): [`LoweredBackend::schedule_settings`]'s `gpu`, without
    /// looking up the CPU's cache shares.
    pub fn gpu_limits(&self) -> Option<arrayjit_opt::schedule::GpuLimits> {
        self.devices().schedule_settings().gpu
    }

    /// The cache shares blocked products fill on the host CPU, and where they come from:
    /// `ARRAYJIT_CPU_SHARES`, a choice `arrayjit tune` stored in this backend's compile cache,
    /// the project's table of measured CPUs, or the vendor's default (see
    /// [`crate::cpu::tuning`]).
    pub fn cpu_shares(&self) -> crate::cpu::tuning::CpuShares {
        let cpu = crate::device_info::CpuInfo::host();
        if let Some(given) = crate::cpu::tuning::from_environment() {
            return given;
        }
        let stored = self.load_schedule_choice(&crate::cpu::tuning::stored_key(cpu));
        crate::cpu::tuning::resolve(cpu, stored)
    }

    /// Stores `shares` as this CPU's measured cache shares in the compile cache (false when
    /// the backend keeps no cache): backends made later, in this process or another, use
    /// them.
    pub fn store_cpu_shares(&self, shares: arrayjit_opt::schedule::CacheShares) -> Result<bool> {
        let cpu = crate::device_info::CpuInfo::host();
        self.store_schedule_choice(&crate::cpu::tuning::stored_key(cpu), &shares.to_string())
    }

    /// What the backend's compiler has done in this process ([`Compiler::compile_stats`]);
    /// `None` where it does not count.
    pub fn compile_stats(&self) -> Option<crate::compiler::CompileStats> {
        self.compiler().compile_stats()
    }

    /// What the run time of a schedule depends on ([`Devices::machine_identity`]).
    pub fn machine_identity(&self) -> String {
        self.devices().machine_identity()
    }

    /// One line on the backend ([`Devices::debug_info`]).
    pub fn debug_info(&self) -> String {
        self.devices().debug_info()
    }

    /// The GPU dialect the renderer prints ([`Renderer::gpu_dialect`]).
    pub fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        self.renderer().gpu_dialect()
    }

    /// The first step: renders routines for one compilation ([`Renderer::render`]); the
    /// program's [`source`](RenderedProgram::source) is exactly what
    /// [`LoweredBackend::compile`] compiles.
    pub fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let _render = trace::compile_phase("render", &batch_name(routines));
        self.renderer().render(routines)
    }

    /// The options [`LoweredBackend::compile`] compiles with
    /// ([`Compiler::default_options`]).
    pub fn default_compile_options(&self) -> CompileOptions {
        self.compiler().default_options()
    }

    /// The second step: compiles a program [`LoweredBackend::render`] made (one library, one
    /// compilation) with the default options. The third, linking the batch to a context's
    /// arrays, is the runtime's (`arrayjit_runtime::Context::link`).
    pub fn compile(&self, program: RenderedProgram) -> Result<Arc<dyn CompiledBatch>> {
        self.compile_with(program, &self.default_compile_options())
    }

    /// [`LoweredBackend::compile`] with `options` instead of the default ones (the
    /// reference's `Compiler.compile ~options`; [`Compiler::compile`]).
    pub fn compile_with(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        self.compiler().compile(program, options)
    }

    /// Compiles source given directly, in the backend's language, with the default options
    /// (the reference's `compile ~source_code` and `get_kernel`): for tools and tests that
    /// drive a backend's kernels themselves. Each [`SourceKernel`] names its exported symbol,
    /// its buffers and static indices ([`KernelInterface`](arrayjit_codegen::KernelInterface))
    /// and, on GPUs, its launch; launches are checked against the interfaces as for compiled
    /// routines, and the batch finds a kernel by name or symbol
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
    /// Source given directly enters the same pipeline as rendered routines: the renderer
    /// makes it a program ([`Renderer::render_given`]), the compiler compiles it.
    ///
    /// # Safety
    /// As [`Renderer::render_given`]: the source runs as native code.
    pub unsafe fn compile_source(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<Arc<dyn CompiledBatch>> {
        // SAFETY: this method's contract is `compile_source_with`'s.
        unsafe { self.compile_source_with(source, kernels, &self.default_compile_options()) }
    }

    /// [`LoweredBackend::compile_source`] with `options` instead of the default ones.
    ///
    /// # Safety
    /// As [`Renderer::render_given`].
    pub unsafe fn compile_source_with(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        // SAFETY: this method's contract is the renderer's.
        let program = unsafe { self.renderer().render_given(source, kernels) }?;
        self.compile_with(program, options)
    }

    /// The schedule choice stored under `key` ([`Compiler::load_schedule_choice`]).
    pub fn load_schedule_choice(&self, key: &str) -> std::result::Result<Option<String>, String> {
        self.compiler().load_schedule_choice(key)
    }

    /// Stores a schedule choice ([`Compiler::store_schedule_choice`]).
    pub fn store_schedule_choice(&self, key: &str, choice: &str) -> Result<bool> {
        self.compiler().store_schedule_choice(key, choice)
    }
}

//! The `cuda` lowered backend (cargo feature `cuda`): NVIDIA GPUs through the CUDA driver API
//! and NVRTC, both loaded at run time by `cudarc` (nothing from CUDA is needed to build).
//!
//! - **Availability**: libcuda and libnvrtc are looked up *before* any call (cudarc panics on
//!   a missing library); a missing one, or a driver with no device, makes every call a
//!   [`Error::BackendUnavailable`] saying what to install.
//! - **Devices**: one per GPU, each on its primary context; [`DeviceInfo`] from the driver's
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
//! - **Launches**: a routine's passes are captured once as a CUDA graph per stream and
//!   replayed by later runs with the same arguments (`graphs`: one launch a run; plain
//!   launches where graphs are unavailable or `ARRAYJIT_CUDA_GRAPHS=0`). A timed launch
//!   ([`crate::compiled_batch::LaunchRequest::timed`]) records CUDA events around its passes and reports the
//!   device time between them once the stream is next waited for.
//! - **Memory**: buffers and pools are `cuMemAlloc` allocations (a pool's views are offsets
//!   into one); freeing waits for the device first, so work still queued never reads freed
//!   memory. Copies between devices go through the host.
//! - **Errors**: every driver or NVRTC failure is an [`Error::Driver`] naming the device and
//!   the action, with cudarc's error as its source.

pub mod aot;
mod buffers;
mod graphs;
mod ptx;
mod queue;
pub mod resources;
mod runtime;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

use arrayjit_codegen::cuda::{CudaKernel, CudaPass, CudaProgram, render_cuda};
use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::kernel::check_symbol;
use arrayjit_codegen::{KernelInterface, LaunchDims, SourceKernel};
use arrayjit_ir::{Error, Optimized, Prec, Result, trace};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
use crate::device_buffer::BufferHandle;
use crate::device_info::{DeviceInfo, DeviceKind};
use crate::device_runtime::DeviceRuntime;
use crate::lowered_backend::{CompileOptions, LoweredBackend};
use crate::pool_table::PoolTable;
use crate::queue::Queue;

pub use buffers::CudaBuffer;
pub use ptx::{
    PtxCache, PtxOrigin, compile_ptx, compile_ptx_with_options, compile_ptx_with_origin,
    default_nvrtc_flags, feature_arch,
};
use queue::{CudaQueue, PendingTiming};

const NAME: &str = "cuda";

/// What to install when the backend cannot run.
const HOW_TO_ENABLE: &str = "install the NVIDIA driver (libcuda.so.1) and NVRTC (libnvrtc.so: \
    the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` with its lib folder on \
    LD_LIBRARY_PATH) on a machine with an NVIDIA GPU";

/// One GPU.
pub(crate) struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    /// `sm_XY`.
    arch: String,
    used: Arc<AtomicUsize>,
    /// For host reads and writes outside any runtime stream.
    default_stream: Arc<CudaStream>,
}

impl Gpu {
    fn label(&self) -> String {
        format!("{NAME}:{} ({})", self.ordinal, self.info.name)
    }

    fn driver_error(
        &self,
        action: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Driver {
            device: self.label(),
            action: action.to_string(),
            source: Box::new(e),
        }
    }

    /// Makes the device's context current on this thread (driver calls need it).
    fn bind(&self, action: &str) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.driver_error(action, e))
    }
}

/// Whether libcuda and libnvrtc can be loaded (cudarc panics when it needs one that cannot).
fn libraries_present() -> std::result::Result<(), String> {
    // SAFETY: these only try to open the libraries.
    let (cuda, nvrtc) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
        )
    };
    match (cuda, nvrtc) {
        (true, true) => Ok(()),
        (false, _) => Err("the CUDA driver library (libcuda.so) was not found".into()),
        (true, false) => Err("NVRTC (libnvrtc.so) was not found".into()),
    }
}

fn open() -> std::result::Result<Vec<Arc<Gpu>>, String> {
    libraries_present()?;
    let count = CudaContext::device_count().map_err(|e| format!("the CUDA driver: {e}"))?;
    if count <= 0 {
        return Err("the CUDA driver sees no GPU".into());
    }
    (0..count as usize)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(|e| format!("device {ordinal}: {e}"))?;
            // Ordering is the runtime's: no implicit waits on cudarc's own slices.
            // SAFETY: this backend never hands cudarc-tracked slices to kernels.
            unsafe { ctx.disable_event_tracking() };
            let attr = |a| ctx.attribute(a).unwrap_or(0).max(0);
            let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
            let info = DeviceInfo {
                name: ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
                kind: DeviceKind::Gpu,
                compute_units: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as usize,
                max_local_size: [
                    attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) as u32,
                    attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) as u32,
                    attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) as u32,
                ],
                max_local_invocations: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) as u32,
                max_shared_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)
                    as usize,
                subgroup_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE) as usize,
                vector_bytes: 16,
                vector_registers: 0,
                cache_bytes: [0, 0, attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) as usize],
                memory_bytes: ctx.total_mem().unwrap_or(0) as u64,
                precisions: Prec::ALL.to_vec(),
                matrix_units: major >= 8,
                warpgroup_mma: (major, minor) == (9, 0),
                joined_launch_parameters: arrayjit_ir::schedule::gpu::CUDA_JOINED_LAUNCH_PARAMETERS,
            };
            let default_stream = ctx
                .new_stream()
                .map_err(|e| format!("device {ordinal}: {e}"))?;
            Ok(Arc::new(Gpu {
                ordinal,
                arch: feature_arch(&format!("sm_{major}{minor}")),
                ctx,
                info,
                used: Arc::new(AtomicUsize::new(0)),
                default_stream,
            }))
        })
        .collect()
}

/// `Ok` unless NVRTC options choose an architecture: the backend compiles for each device's
/// own.
fn check_nvrtc_options(options: &CompileOptions) -> Result<()> {
    match options
        .flags
        .iter()
        .find(|f| f.starts_with("--gpu-architecture") || f.starts_with("-arch"))
    {
        Some(arch) => Err(Error::invalid(format!(
            "compile option {arch}: the cuda backend compiles for each device's own \
             architecture; leave it out"
        ))),
        None => Ok(()),
    }
}

/// The `cuda` lowered backend.
pub struct CudaBackend {
    gpus: std::result::Result<Vec<Arc<Gpu>>, String>,
    pools: PoolTable<CudaBuffer>,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpus {
            Ok(g) => write!(f, "CudaBackend({} device(s))", g.len()),
            Err(e) => write!(f, "CudaBackend(unavailable: {e})"),
        }
    }
}

impl Default for CudaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaBackend {
    /// The machine's GPUs, opened once per process. Never fails: without the libraries or a
    /// GPU, every call says what is missing ([`LoweredBackend::check_available`]).
    pub fn new() -> CudaBackend {
        static GPUS: OnceLock<std::result::Result<Vec<Arc<Gpu>>, String>> = OnceLock::new();
        CudaBackend {
            gpus: GPUS.get_or_init(open).clone(),
            pools: PoolTable::new(NAME),
        }
    }

    fn gpus(&self) -> Result<&[Arc<Gpu>]> {
        self.gpus
            .as_deref()
            .map_err(|reason| Error::BackendUnavailable {
                backend: NAME.into(),
                reason: reason.clone(),
                how_to_enable: HOW_TO_ENABLE.into(),
            })
    }

    fn gpu(&self, device: usize) -> Result<&Arc<Gpu>> {
        let gpus = self.gpus()?;
        gpus.get(device).ok_or_else(|| Error::NoSuchDevice {
            backend: NAME.into(),
            ordinal: device,
            num_devices: gpus.len(),
        })
    }
}

/// Routines compiled together; modules are loaded per device on first launch there.
pub struct CudaBatch {
    gpus: Vec<Arc<Gpu>>,
    program: CudaProgram,
    interfaces: Vec<KernelInterface>,
    /// Per device: the functions of every kernel's passes.
    loaded: Mutex<HashMap<usize, Arc<Loaded>>>,
    /// Whether device 0's PTX came from the cache.
    cache_hit: bool,
    /// The NVRTC options the PTX is compiled with (for each device's architecture).
    flags: Vec<String>,
    /// Each kernel's passes captured as a CUDA graph, per device and stream.
    graphs: graphs::GraphCache,
}

struct Loaded {
    _modules: Vec<Arc<CudaModule>>,
    functions: Vec<Vec<CudaFunction>>,
}

impl fmt::Debug for CudaBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        write!(f, "CudaBatch({names:?})")
    }
}

impl CudaBatch {
    /// The batch's routine names, joined by `+`.
    fn names(&self) -> String {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        names.join("+")
    }

    /// A batch of a program, compiled now for device 0 so that a compile error is the
    /// compile's, not a launch's (modules load per device on first launch there).
    fn compiled(
        gpus: Vec<Arc<Gpu>>,
        program: CudaProgram,
        flags: Vec<String>,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let names: Vec<&str> = program
            .kernels
            .iter()
            .map(|k| k.interface.name.as_str())
            .collect();
        let name = names.join("+");
        let mut phase = trace::compile_phase("compile", &name);
        let units = aot::compile_units(
            &program,
            &gpus[0].arch,
            &flags,
            aot::default_units(),
            ptx::process_cache(),
        )?;
        let cache_hit = units.iter().all(|u| u.origin != PtxOrigin::Compiled);
        if let (Some(p), true) = (phase.as_mut(), cache_hit) {
            p.rename(format!("cache hit {name}"));
        }
        drop(phase);
        let interfaces = program
            .kernels
            .iter()
            .map(|k| k.interface.clone())
            .collect();
        Ok(Arc::new(CudaBatch {
            gpus,
            program,
            interfaces,
            loaded: Mutex::new(HashMap::new()),
            cache_hit,
            flags,
            graphs: graphs::GraphCache::default(),
        }))
    }

    fn loaded(&self, gpu: &Gpu) -> Result<Arc<Loaded>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = loaded.get(&gpu.ordinal) {
            return Ok(l.clone());
        }
        // The same units as the compile (cached), for this device's architecture.
        let units = aot::compile_units(
            &self.program,
            &gpu.arch,
            &self.flags,
            aot::default_units(),
            ptx::process_cache(),
        )?;
        let _load = trace::compile_phase("load", &format!("{} on {}", self.names(), gpu.label()));
        gpu.bind("loading a module")?;
        let mut modules = Vec::with_capacity(units.len());
        let mut module_of: HashMap<&str, usize> = HashMap::new();
        let sources = self.program.units(aot::default_units());
        for (i, unit) in units.iter().enumerate() {
            let module = match gpu
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(unit.cubin.clone()))
            {
                Ok(m) => m,
                // A driver older than NVRTC may refuse its CUBIN: the unit's PTX then, which
                // the driver compiles itself.
                Err(cubin_error) => {
                    tracing::warn!(
                        "{} on {}: the driver refused NVRTC's CUBIN ({cubin_error}); loading PTX",
                        self.names(),
                        gpu.label()
                    );
                    let source = sources.get(i).map_or("", |(src, _)| src.as_str());
                    let (ptx, _) = compile_ptx_with_options(source, &gpu.arch, &self.flags)?;
                    gpu.ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                        .map_err(|e| gpu.driver_error("loading a module", e))?
                }
            };
            modules.push(module);
            for sym in &unit.symbols {
                module_of.insert(sym.as_str(), i);
            }
        }
        let functions = self
            .program
            .kernels
            .iter()
            .map(|k| {
                k.passes
                    .iter()
                    .map(|p| {
                        let module = module_of
                            .get(p.symbol.as_str())
                            .and_then(|&i| modules.get(i))
                            .ok_or_else(|| {
                                Error::invalid(format!(
                                    "kernel {} is in no compiled unit of {}",
                                    p.symbol,
                                    self.names()
                                ))
                            })?;
                        module
                            .load_function(&p.symbol)
                            .map_err(|e| gpu.driver_error("loading a kernel", e))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let l = Arc::new(Loaded {
            _modules: modules,
            functions,
        });
        loaded.insert(gpu.ordinal, l.clone());
        Ok(l)
    }

    fn launch_passes(
        &self,
        gpu: &Gpu,
        kernel: &CudaKernel,
        passes: &[(LaunchDims, &CudaPass, &CudaFunction)],
        buffers: &[&CudaBuffer],
        statics: &[i64],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let action = format!("launching {}", kernel.interface.name);
        gpu.bind(&action)?;
        let ptrs: Vec<u64> = buffers.iter().map(|b| b.device_ptr()).collect();
        if kernel.interface.scratch_bytes > 0
            && let Some(scratch) = buffers.last()
        {
            scratch.zero_on(gpu, stream, kernel.interface.scratch_bytes)?;
        }
        for (dims, pass, f) in passes {
            // Each pass takes the buffers (at byte offsets: a local's slice of the scratch)
            // and static indices its code uses (positions within the interface's, made when
            // the kernel was rendered).
            let args: Vec<u64> = pass
                .args
                .iter()
                .filter_map(|&(b, offset)| ptrs.get(b).map(|p| p + offset as u64))
                .collect();
            let mut builder = stream.launch_builder(f);
            for p in &args {
                builder.arg(p);
            }
            for s in pass.statics.iter().filter_map(|&j| statics.get(j)) {
                builder.arg(s);
            }
            let config = LaunchConfig {
                grid_dim: (dims.grid[0], dims.grid[1], dims.grid[2]),
                block_dim: (dims.block[0], dims.block[1], dims.block[2]),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel was rendered for exactly these parameters (checked against
            // its interface: one buffer of at least the needed size per pointer, statics in
            // range), and the runtime orders work touching a buffer.
            unsafe { builder.launch(config) }.map_err(|e| gpu.driver_error(&action, e))?;
        }
        Ok(())
    }
}

impl CompiledBatch for CudaBatch {
    fn kernels(&self) -> &[KernelInterface] {
        &self.interfaces
    }

    fn source(&self) -> &str {
        &self.program.source
    }

    fn cache_hit(&self) -> Option<bool> {
        Some(self.cache_hit)
    }

    /// A timed launch records CUDA events on the stream before and after the launch's passes:
    /// the sink gets the device time once both are done (when the stream is next waited for).
    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        let LaunchRequest {
            kernel,
            buffers,
            statics,
            queue,
            dims,
            timer,
        } = request;
        let timed = timer.is_some();
        let dims_now = match dims {
            Some(at) => Some(self.launch_now(kernel, buffers, at)?),
            None => None,
        };
        // SAFETY: this method's contract; a launch chosen now is within the device's limits.
        unsafe { self.run_kernel(kernel, buffers, statics, queue, dims_now, timer) }?;
        Ok(timed)
    }
}

impl CudaBatch {
    /// The launch of hand-written kernel `index` chosen now (see [`CompiledBatch::launch`]),
    /// checked against its device's limits; an error for a kernel rendered from a routine.
    fn launch_now(&self, index: usize, args: &[BufferHandle], at: LaunchAt) -> Result<LaunchDims> {
        let Some(kernel) = self.program.kernels.get(index) else {
            return Err(crate::launch_check::no_such_kernel(
                index,
                self.interfaces.len(),
            ));
        };
        let name = &kernel.interface.name;
        if !matches!(kernel.passes.as_slice(), [p] if matches!(p.shape, PassShape::Given(_))) {
            return Err(crate::launch_check::launch_dims_not_taken(name));
        }
        let device = args
            .first()
            .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
            .map_or(0, |b| b.device_ordinal());
        let info = &self
            .gpus
            .get(device)
            .ok_or_else(|| Error::NoSuchDevice {
                backend: NAME.into(),
                ordinal: device,
                num_devices: self.gpus.len(),
            })?
            .info;
        let block = at.local.unwrap_or_else(|| {
            LaunchDims::default_block(at.global, 256, info.max_local_invocations)
        });
        let dims = LaunchDims::covering(at.global, block)?;
        dims.check_within(
            name,
            info.max_local_size,
            u64::from(info.max_local_invocations),
        )?;
        Ok(dims)
    }

    /// Checks a launch and enqueues kernel `index` (on `queue`, or on the device's default
    /// stream, waited for), with its passes' launches or, for a hand-written kernel, `dims_now`.
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn run_kernel(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        queue: Queue<'_>,
        dims_now: Option<LaunchDims>,
        timer: Option<DeviceTimeSink>,
    ) -> Result<()> {
        let (kernel, iface) = match (self.program.kernels.get(index), self.interfaces.get(index)) {
            (Some(k), Some(i)) => (k, i),
            _ => {
                return Err(crate::launch_check::no_such_kernel(
                    index,
                    self.interfaces.len(),
                ));
            }
        };
        let buffers = crate::launch_check::check_launch::<CudaBuffer>(iface, args, statics, NAME)?;
        let device = buffers.first().map_or(0, |b| b.device_ordinal());
        if let Some(b) = buffers.iter().find(|b| b.device_ordinal() != device) {
            return Err(Error::invalid(format!(
                "{} gets buffers of devices {device} and {}; copy them to one device first",
                iface.name,
                b.device_ordinal()
            )));
        }
        let gpu = self.gpus.get(device).ok_or_else(|| Error::NoSuchDevice {
            backend: NAME.into(),
            ordinal: device,
            num_devices: self.gpus.len(),
        })?;
        let loaded = self.loaded(gpu)?;
        // Each pass with its launch (a hand-written kernel's one pass may take it now).
        let passes: Vec<(LaunchDims, &CudaPass, &CudaFunction)> = kernel
            .passes
            .iter()
            .zip(&loaded.functions[index])
            .map(|(p, f)| (dims_now.unwrap_or_else(|| p.launch()), p, f))
            .collect();
        match queue.and_then(|q| q.as_any().downcast_ref::<CudaQueue>()) {
            Some(q) if q.gpu.ordinal == device => {
                let start = match &timer {
                    Some(_) => Some(PendingTiming::start(gpu, &q.stream)?),
                    None => None,
                };
                // The graph is kept for these exact arguments and launches.
                let mut key: Vec<u64> = buffers.iter().map(|b| b.device_ptr()).collect();
                key.extend(statics.iter().map(|&s| s as u64));
                for (d, ..) in &passes {
                    key.extend(d.grid.iter().chain(&d.block).map(|&x| u64::from(x)));
                }
                self.graphs.run(index, gpu, &q.stream, key, || {
                    self.launch_passes(gpu, kernel, &passes, &buffers, statics, &q.stream)
                })?;
                if let (Some(start), Some(sink)) = (start, timer) {
                    q.add_timing(PendingTiming::finish(gpu, &q.stream, start, sink)?);
                }
                Ok(())
            }
            _ => {
                let stream = &gpu.default_stream;
                let start = match &timer {
                    Some(_) => Some(PendingTiming::start(gpu, stream)?),
                    None => None,
                };
                self.launch_passes(gpu, kernel, &passes, &buffers, statics, stream)?;
                let timing = match (start, timer) {
                    (Some(start), Some(sink)) => {
                        Some(PendingTiming::finish(gpu, stream, start, sink)?)
                    }
                    _ => None,
                };
                stream
                    .synchronize()
                    .map_err(|e| gpu.driver_error(&format!("running {}", iface.name), e))?;
                if let Some(t) = timing {
                    t.report();
                }
                Ok(())
            }
        }
    }
}

impl LoweredBackend for CudaBackend {
    fn runtime(&self) -> &dyn DeviceRuntime {
        self
    }

    fn gpu_dialect(&self) -> Option<&'static arrayjit_codegen::gpu_dialect::GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::CUDA)
    }

    fn name(&self) -> &str {
        NAME
    }

    fn check_available(&self) -> Result<()> {
        self.gpus().map(|_| ())
    }

    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        Ok(self.gpu(device)?.info.clone())
    }

    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        Ok(render_cuda(routines)?.source)
    }

    fn compile_batch(&self, routines: &[&Optimized]) -> Result<Arc<dyn CompiledBatch>> {
        self.compile_batch_with(routines, &self.default_compile_options())
    }

    /// NVRTC's options: `--fmad=false` ([`default_nvrtc_flags`]).
    fn default_compile_options(&self) -> CompileOptions {
        CompileOptions {
            flags: default_nvrtc_flags(),
        }
    }

    /// Compiles with other NVRTC options (e.g. `--use_fast_math`, `-lineinfo`); the
    /// architecture is always the device's, so an option choosing one is refused.
    fn compile_batch_with(
        &self,
        routines: &[&Optimized],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        check_nvrtc_options(options)?;
        let gpus = self.gpus()?.to_vec();
        let program = {
            let _render =
                trace::compile_phase("render", &crate::lowered_backend::batch_name(routines));
            render_cuda(routines)?
        };
        CudaBatch::compiled(gpus, program, options.flags.clone())
    }

    unsafe fn compile_source_with(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        check_nvrtc_options(options)?;
        let gpus = self.gpus()?.to_vec();
        let info = self.device_info(0)?;
        let kernels = kernels
            .iter()
            .map(|k| {
                check_symbol(&k.interface.symbol)?;
                k.launch.check_within(
                    &k.interface.name,
                    info.max_local_size,
                    u64::from(info.max_local_invocations),
                )?;
                Ok(CudaKernel {
                    interface: k.interface.clone(),
                    passes: vec![CudaPass {
                        symbol: k.interface.symbol.clone(),
                        shape: PassShape::Given(k.launch),
                        threads: k.launch.threads_per_block() as u32,
                        why: "hand-written, launched as given".into(),
                        args: (0..k.interface.buffer_sizes().len())
                            .map(|b| (b, 0))
                            .collect(),
                        statics: (0..k.interface.statics.len()).collect(),
                    }],
                    buffer_types: vec![],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let program = CudaProgram {
            source: source.to_string(),
            kernels,
            prelude: String::new(),
            functions: Vec::new(),
            function_symbols: Vec::new(),
        };
        CudaBatch::compiled(gpus, program, options.flags.clone())
    }

    fn debug_info(&self) -> String {
        match &self.gpus {
            Ok(gpus) => {
                let names: Vec<String> = gpus
                    .iter()
                    .map(|g| format!("{} {}", g.label(), g.arch))
                    .collect();
                format!("cuda backend: {}", names.join(", "))
            }
            Err(e) => format!("cuda backend: unavailable ({e})"),
        }
    }
}

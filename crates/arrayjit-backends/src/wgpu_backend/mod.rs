//! The `wgpu` lowered backend: routines rendered to WGSL compute passes
//! ([`arrayjit_codegen::wgsl`]) and run through wgpu on a GPU (Vulkan), or on a CPU through
//! Mesa's software Vulkan (lavapipe), which is how CI runs it.
//!
//! - One device: the adapter wgpu picks (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME` steer it). No
//!   adapter means the backend is unavailable, with what to install.
//! - Arrays are storage buffers; a pool is one buffer and its arrays are views at offsets,
//!   aligned to the device's storage-binding alignment ([`crate::device_runtime::DeviceRuntime::pool_alignment`]).
//! - The device's queue is the stream: work runs in submission order. Host copies go through
//!   staging buffers and wait for the queue; a launch records one compute pass per pass of the
//!   kernel and submits them.
//! - Every driver error (validation, out of memory, a lost device, a shader the driver refuses)
//!   is caught in an error scope and returned as [`Error::Driver`] with the driver's error as
//!   its source; an error that escapes a scope is kept and returned by the next call.
//! - Compiled pipelines are cached in memory by their WGSL source and entry point.

mod buffers;
mod queue;
mod runtime;
mod timestamps;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::kernel::check_symbol;
use arrayjit_codegen::wgsl::{WgslKernel, WgslPass, WgslTarget, render_wgsl};
use arrayjit_codegen::{KernelInterface, LaunchDims, SourceKernel};
use arrayjit_ir::{DeviceLimit, Error, Optimized, Result, trace};

use crate::compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
use crate::device_buffer::BufferHandle;
use crate::device_info::{DeviceInfo, DeviceKind};
use crate::device_runtime::DeviceRuntime;
use crate::lowered_backend::{CompileOptions, LoweredBackend};
use crate::pool_table::PoolTable;

pub use buffers::WgpuBuffer;

/// The name the backend reports in errors.
const NAME: &str = "wgpu";

/// The GPU once an adapter and device are open.
struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: DeviceInfo,
    target: WgslTarget,
    /// The most workgroups per dispatch dimension.
    max_groups: u32,
    /// Alignment of storage-buffer binding offsets.
    offset_alignment: usize,
    /// The largest storage-buffer binding in bytes.
    max_binding_bytes: u64,
    /// Compiled pipelines by WGSL source and entry point.
    pipelines: Mutex<HashMap<(String, String), wgpu::ComputePipeline>>,
    /// An error no error scope caught (reported by the next call).
    uncaptured: Arc<Mutex<Option<String>>>,
    /// Nanoseconds per timestamp tick, when the device writes timestamps in compute passes
    /// (`TIMESTAMP_QUERY`): timed launches report their device time from them.
    timestamp_period: Option<f64>,
}

/// The `wgpu` lowered backend (one device).
pub struct WgpuBackend {
    gpu: std::result::Result<Arc<Gpu>, String>,
    used: Arc<AtomicUsize>,
    pools: PoolTable<WgpuBuffer>,
}

impl fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpu {
            Ok(g) => write!(f, "WgpuBackend({})", g.info.name),
            Err(e) => write!(f, "WgpuBackend(unavailable: {e})"),
        }
    }
}

impl WgpuBackend {
    /// The adapter wgpu picks from the environment, opened once per process and shared by
    /// every `WgpuBackend` (opening a device takes tens of milliseconds, and listing the
    /// available backends makes one). Never fails: a machine without one gives a backend
    /// whose calls say so ([`LoweredBackend::check_available`]).
    pub fn new() -> WgpuBackend {
        static GPU: std::sync::OnceLock<std::result::Result<Arc<Gpu>, String>> =
            std::sync::OnceLock::new();
        WgpuBackend {
            gpu: GPU.get_or_init(|| open().map(Arc::new)).clone(),
            used: Arc::new(AtomicUsize::new(0)),
            pools: PoolTable::new(NAME),
        }
    }

    fn gpu(&self) -> Result<&Arc<Gpu>> {
        self.gpu
            .as_ref()
            .map_err(|reason| Error::BackendUnavailable {
                backend: NAME.into(),
                reason: reason.clone(),
                how_to_enable: "install a Vulkan driver: a GPU vendor's, or Mesa's software one \
                            (`apt-get install mesa-vulkan-drivers libvulkan1`); set \
                            WGPU_BACKEND=vulkan"
                    .into(),
            })
    }

    fn device_check(&self, device: usize) -> Result<&Arc<Gpu>> {
        let gpu = self.gpu()?;
        if device != 0 {
            return Err(Error::NoSuchDevice {
                backend: NAME.into(),
                ordinal: device,
                num_devices: 1,
            });
        }
        Ok(gpu)
    }
}

impl Default for WgpuBackend {
    fn default() -> Self {
        WgpuBackend::new()
    }
}

/// Opens the adapter and device, or says why not.
fn open() -> std::result::Result<Gpu, String> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .map_err(|e| format!("no GPU adapter: {e}"))?;
    let features = adapter.features()
        & (wgpu::Features::SHADER_F16
            | wgpu::Features::SHADER_INT64
            | wgpu::Features::TIMESTAMP_QUERY);
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("arrayjit"),
        required_features: features,
        required_limits: limits.clone(),
        ..Default::default()
    }))
    .map_err(|e| format!("the adapter refused a device: {e}"))?;
    let uncaptured: Arc<Mutex<Option<String>>> = Arc::default();
    let sink = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| e.to_string());
    }));
    let mut target = WgslTarget {
        f16: features.contains(wgpu::Features::SHADER_F16),
        int64: features.contains(wgpu::Features::SHADER_INT64),
        max_bindings: limits.max_storage_buffers_per_shader_stage as usize,
        ..WgslTarget::default()
    };
    let a = adapter.get_info();
    let info = DeviceInfo {
        name: format!("{} ({:?}, {})", a.name, a.backend, a.driver_info),
        kind: if a.device_type == wgpu::DeviceType::Cpu {
            DeviceKind::Cpu
        } else {
            DeviceKind::Gpu
        },
        compute_units: 0,
        max_local_size: [
            limits.max_compute_workgroup_size_x,
            limits.max_compute_workgroup_size_y,
            limits.max_compute_workgroup_size_z,
        ],
        max_local_invocations: limits.max_compute_invocations_per_workgroup,
        max_shared_bytes: limits.max_compute_workgroup_storage_size as usize,
        subgroup_size: a.subgroup_min_size.max(1) as usize,
        vector_bytes: 16,
        vector_registers: 0,
        cache_bytes: [0; 3],
        memory_bytes: 0,
        precisions: target.precisions(),
        matrix_units: false,
        warpgroup_mma: false,
        // Few storage buffers bind per shader: passes launch alone.
        joined_launch_parameters: 0,
    };
    if let Some(limits) = info.schedule_settings().gpu {
        target.limits = limits;
    }
    Ok(Gpu {
        device,
        info,
        target,
        max_groups: limits.max_compute_workgroups_per_dimension.max(1),
        offset_alignment: limits.min_storage_buffer_offset_alignment.max(4) as usize,
        max_binding_bytes: limits.max_storage_buffer_binding_size,
        pipelines: Mutex::new(HashMap::new()),
        uncaptured,
        timestamp_period: features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| f64::from(queue.get_timestamp_period()))
            .filter(|p| *p > 0.0),
        queue,
    })
}

impl Gpu {
    /// The device's name in messages.
    fn label(&self) -> String {
        format!("{NAME}:0 ({})", self.info.name)
    }

    /// Runs `f` inside validation and out-of-memory error scopes; a caught error (or one that
    /// escaped an earlier scope) is [`Error::Driver`] naming `action`.
    fn scoped<T>(&self, action: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(oom.pop()),
        ];
        if let Some(e) = errors.into_iter().flatten().next() {
            return Err(self.driver_error(action, Box::new(e)));
        }
        if let Some(e) = self
            .uncaptured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return Err(self.driver_error(action, e.into()));
        }
        value
    }

    fn driver_error(
        &self,
        action: &str,
        source: Box<dyn std::error::Error + Send + Sync>,
    ) -> Error {
        Error::Driver {
            device: self.label(),
            action: action.to_string(),
            source,
        }
    }

    /// Waits until the queue has run everything submitted.
    fn wait(&self, action: &str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| self.driver_error(action, Box::new(e)))
    }

    /// The compute pipeline of a pass, compiled once per source.
    fn pipeline(&self, pass: &WgslPass) -> Result<wgpu::ComputePipeline> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        let key = (pass.source.clone(), pass.entry_point.clone());
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let pipeline = self.scoped("compiling a WGSL pass", || {
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("arrayjit pass"),
                    source: wgpu::ShaderSource::Wgsl(pass.source.as_str().into()),
                });
            Ok(self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some("arrayjit pass"),
                    layout: None,
                    module: &module,
                    entry_point: Some(&pass.entry_point),
                    compilation_options: Default::default(),
                    cache: None,
                }))
        })?;
        cache.insert(key, pipeline.clone());
        Ok(pipeline)
    }
}

/// The bindings of group 0 that entry point `entry` of a WGSL module uses, ascending: a
/// pipeline's automatic layout holds exactly these. A module that does not parse or validate,
/// or lacks the entry point, is an error saying why.
/// What a hand-written WGSL entry point uses: its bindings of group 0 (sorted) and the
/// `@workgroup_size` it declares.
fn source_bindings(gpu: &Gpu, source: &str, entry: &str) -> Result<(Vec<u32>, [u32; 3])> {
    let action = format!("reading the WGSL of entry point {entry}");
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| gpu.driver_error(&action, e.emit_to_string(source).into()))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| gpu.driver_error(&action, e.emit_to_string(source).into()))?;
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| {
            let names: Vec<&str> = module
                .entry_points
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            Error::invalid(format!(
                "the WGSL source has no entry point {entry} (it has {names:?})"
            ))
        })?;
    let uses = info.get_entry_point(index);
    let mut bindings: Vec<u32> = module
        .global_variables
        .iter()
        .filter(|(handle, _)| !uses[*handle].is_empty())
        .filter_map(|(_, var)| var.binding.as_ref())
        .filter(|b| b.group == 0)
        .map(|b| b.binding)
        .collect();
    bindings.sort_unstable();
    bindings.dedup();
    Ok((bindings, module.entry_points[index].workgroup_size))
}

/// One compiled routine: its passes' pipelines and the buffers of its local nodes.
struct Kernel {
    rendered: WgslKernel,
    pipelines: Vec<wgpu::ComputePipeline>,
    locals: HashMap<u32, WgpuBuffer>,
    statics: Option<WgpuBuffer>,
}

/// Routines compiled together.
pub struct WgpuBatch {
    gpu: Arc<Gpu>,
    interfaces: Vec<KernelInterface>,
    kernels: Vec<Kernel>,
    source: String,
}

impl fmt::Debug for WgpuBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        write!(f, "WgpuBatch({names:?})")
    }
}

impl CompiledBatch for WgpuBatch {
    fn kernels(&self) -> &[KernelInterface] {
        &self.interfaces
    }

    fn source(&self) -> &str {
        &self.source
    }

    /// The device has one queue: every launch goes on it, in order (the request's queue is
    /// not needed). A timed launch reads timestamps the device writes around its passes.
    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        let LaunchRequest {
            kernel,
            buffers,
            statics,
            dims,
            timer,
            ..
        } = request;
        let grid_now = match dims {
            Some(at) => Some(self.launch_now(kernel, at)?),
            None => None,
        };
        // SAFETY: this method's contract.
        unsafe { self.run_kernel(kernel, buffers, statics, grid_now, timer) }
    }
}

impl WgpuBatch {
    /// The workgroups of hand-written kernel `index` launched over `at` now (see
    /// [`CompiledBatch::launch`]): its block must be the shader's `@workgroup_size`; an error
    /// for a kernel rendered from a routine or a grid past the device's limits.
    fn launch_now(&self, index: usize, at: LaunchAt) -> Result<[u32; 3]> {
        let LaunchAt { global, local } = at;
        let Some(k) = self.kernels.get(index) else {
            return Err(crate::launch_check::no_such_kernel(
                index,
                self.kernels.len(),
            ));
        };
        let name = &self.interfaces[index].name;
        // A hand-written shader's block is its @workgroup_size (checked at compile_source).
        let workgroup = match k.rendered.passes.as_slice() {
            [pass] => match pass.shape {
                PassShape::Given(given) => given.block,
                _ => [0; 3],
            },
            _ => [0; 3],
        };
        if workgroup == [0; 3] {
            return Err(crate::launch_check::launch_dims_not_taken(name));
        }
        let block = local.unwrap_or(workgroup);
        if block != workgroup {
            return Err(Error::invalid(format!(
                "kernel {name} is launched with blocks of {block:?} threads, but its shader \
                 declares @workgroup_size{workgroup:?}; give that block, or none"
            )));
        }
        let dims = LaunchDims::covering(global, block)?;
        if let Some(axis) = (0..3).find(|&a| dims.grid[a] > self.gpu.max_groups) {
            return Err(Error::limit_exceeded(
                self.gpu.label(),
                format!("kernel {name}, launched over {global:?} threads,"),
                DeviceLimit::GridExtent(axis),
                u64::from(dims.grid[axis]),
                u64::from(self.gpu.max_groups),
                "launch larger blocks or cover the work in several launches",
            ));
        }
        Ok(dims.grid)
    }

    /// Checks a launch and submits kernel `index`'s passes, dispatched as they say or, for a
    /// hand-written kernel, as `grid_now` workgroups.
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn run_kernel(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        grid_now: Option<[u32; 3]>,
        timer: Option<DeviceTimeSink>,
    ) -> Result<bool> {
        let (k, iface) = match (self.kernels.get(index), self.interfaces.get(index)) {
            (Some(k), Some(i)) => (k, i),
            _ => {
                return Err(crate::launch_check::no_such_kernel(
                    index,
                    self.kernels.len(),
                ));
            }
        };
        let buffers = crate::launch_check::check_launch::<WgpuBuffer>(iface, args, statics, NAME)?;
        let mut bound: HashMap<u32, &WgpuBuffer> = (0u32..).zip(buffers).collect();
        let mut words = Vec::with_capacity(statics.len());
        for (s, &v) in iface.statics.iter().zip(statics) {
            let v = i32::try_from(v).map_err(|_| Error::StaticIndex {
                symbol: s.name.clone(),
                detail: format!("value {v} is beyond what a WGSL index holds"),
            })?;
            words.extend_from_slice(&v.to_le_bytes());
        }
        for (b, buf) in &k.locals {
            bound.insert(*b, buf);
        }
        if let (Some(b), Some(buf)) = (k.rendered.statics_binding, &k.statics) {
            self.gpu
                .queue
                .write_buffer(&buf.buffer, buf.offset as u64, &words);
            bound.insert(b, buf);
        }
        let gpu = &self.gpu;
        gpu.scoped(&format!("running {}", iface.name), || {
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            // Timestamps at the start of the first pass and the end of the last.
            let timing = match (timer, gpu.timestamp_period) {
                (Some(sink), Some(period)) if !k.rendered.passes.is_empty() => {
                    Some((timestamps::Timing::new(&gpu.device), sink, period))
                }
                _ => None,
            };
            let last = k.rendered.passes.len().saturating_sub(1);
            for (i, (pass, pipeline)) in k.rendered.passes.iter().zip(&k.pipelines).enumerate() {
                let layout = pipeline.get_bind_group_layout(0);
                let entries = pass
                    .bindings
                    .iter()
                    .map(|b| {
                        let buf = bound.get(b).ok_or_else(|| {
                            Error::invalid(format!("binding {b} of {} has no buffer", iface.name))
                        })?;
                        Ok(wgpu::BindGroupEntry {
                            binding: *b,
                            resource: buf.binding(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &layout,
                    entries: &entries,
                });
                let [x, y, z] = grid_now.unwrap_or_else(|| pass.dispatch(gpu.max_groups));
                let mut cpass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: timing.as_ref().map(|(t, _, _)| t.writes(i == 0, i == last)),
                });
                cpass.set_pipeline(pipeline);
                cpass.set_bind_group(0, &group, &[]);
                cpass.dispatch_workgroups(x, y, z);
            }
            if let Some((t, _, _)) = &timing {
                t.resolve(&mut encoder);
            }
            gpu.queue.submit([encoder.finish()]);
            Ok(match timing {
                Some((t, sink, period)) => {
                    t.report(period, sink);
                    true
                }
                None => false,
            })
        })
    }
}

impl LoweredBackend for WgpuBackend {
    fn runtime(&self) -> &dyn DeviceRuntime {
        self
    }

    fn gpu_dialect(&self) -> Option<&'static arrayjit_codegen::gpu_dialect::GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::WGSL)
    }

    fn name(&self) -> &str {
        NAME
    }

    fn check_available(&self) -> Result<()> {
        self.gpu().map(|_| ())
    }

    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        Ok(self.device_check(device)?.info.clone())
    }

    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        let gpu = self.gpu()?;
        let mut s = String::new();
        for r in routines {
            s.push_str(&render_wgsl(r, &gpu.target)?.full_source());
        }
        Ok(s)
    }

    fn compile_batch(&self, routines: &[&Optimized]) -> Result<Arc<dyn CompiledBatch>> {
        let gpu = self.gpu()?.clone();
        let mut kernels = Vec::new();
        let mut interfaces = Vec::new();
        let mut source = String::new();
        for r in routines {
            // An array larger than one binding cannot be used by a pass: say so before running.
            for n in r.nodes.iter().filter(|n| n.used) {
                let bytes = n.tn.size_in_bytes() as u64;
                if bytes > gpu.max_binding_bytes {
                    return Err(Error::limit_exceeded(
                        gpu.label(),
                        format!("array {} of {}", n.tn.debug_name(), r.name),
                        DeviceLimit::BindingBytes,
                        bytes,
                        gpu.max_binding_bytes,
                        "split it into smaller arrays or use a CPU backend",
                    ));
                }
            }
            // (The renderer refuses precisions the target lacks.)
            let rendered = {
                let _render = trace::compile_phase("render", &r.name);
                render_wgsl(r, &gpu.target)?
            };
            source.push_str(&rendered.full_source());
            let pipelines = {
                let _compile = trace::compile_phase("compile", &r.name);
                rendered
                    .passes
                    .iter()
                    .map(|p| gpu.pipeline(p))
                    .collect::<Result<Vec<_>>>()?
            };
            let locals = rendered
                .locals
                .iter()
                .map(|(tn, b)| Ok((*b, buffers::allocate(&gpu, &self.used, tn.size_in_bytes())?)))
                .collect::<Result<HashMap<_, _>>>()?;
            let statics = match rendered.statics_binding {
                Some(_) => Some(buffers::allocate(&gpu, &self.used, 4 * r.bindings.len())?),
                None => None,
            };
            interfaces.push(rendered.interface.clone());
            kernels.push(Kernel {
                rendered,
                pipelines,
                locals,
                statics,
            });
        }
        Ok(Arc::new(WgpuBatch {
            gpu,
            interfaces,
            kernels,
            source,
        }))
    }

    /// WGSL goes to the driver as it is: only the default (empty) options.
    unsafe fn compile_source_with(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        if *options != self.default_compile_options() {
            return Err(Error::invalid(format!(
                "backend {NAME} takes no compile options (given {:?}): WGSL goes to the driver \
                 as it is",
                options.flags
            )));
        }
        let gpu = self.gpu()?.clone();
        let mut compiled = Vec::new();
        for k in kernels {
            let iface = &k.interface;
            check_symbol(&iface.symbol)?;
            // The shader declares its workgroup size, which the launch's block must be (a
            // shader's indexing depends on it); the grid is the workgroup count.
            k.launch
                .check(&iface.name, u64::from(gpu.info.max_local_invocations))?;
            let buffers = iface.buffer_sizes().len() as u32;
            let statics_binding = (!iface.statics.is_empty()).then_some(buffers);
            let (bindings, workgroup_size) = source_bindings(&gpu, source, &iface.symbol)?;
            if workgroup_size != k.launch.block {
                return Err(Error::invalid(format!(
                    "kernel {} launches blocks of {:?} threads, but entry point {} declares \
                     @workgroup_size{:?}; give the launch the shader's workgroup size",
                    iface.name, k.launch.block, iface.symbol, workgroup_size
                )));
            }
            let known = buffers + u32::from(statics_binding.is_some());
            if let Some(b) = bindings.iter().find(|&&b| b >= known) {
                return Err(Error::invalid(format!(
                    "entry point {} uses @binding({b}), but kernel {} has bindings 0..{known} \
                     (its buffers, then its static indices)",
                    iface.symbol, iface.name
                )));
            }
            let pass = WgslPass {
                source: source.to_string(),
                shape: PassShape::Given(k.launch),
                threads: k.launch.threads_per_block() as u32,
                bindings,
                why: "hand-written, dispatched as given".into(),
                entry_point: iface.symbol.clone(),
            };
            let pipelines = vec![gpu.pipeline(&pass)?];
            let statics = match statics_binding {
                Some(_) => Some(buffers::allocate(
                    &gpu,
                    &self.used,
                    4 * iface.statics.len(),
                )?),
                None => None,
            };
            compiled.push((
                iface.clone(),
                Kernel {
                    rendered: WgslKernel {
                        interface: iface.clone(),
                        locals: vec![],
                        statics_binding,
                        passes: vec![pass],
                    },
                    pipelines,
                    locals: HashMap::new(),
                    statics,
                },
            ));
        }
        let (interfaces, kernels) = compiled.into_iter().unzip();
        Ok(Arc::new(WgpuBatch {
            gpu,
            interfaces,
            kernels,
            source: source.to_string(),
        }))
    }

    fn debug_info(&self) -> String {
        match &self.gpu {
            Ok(g) => format!("wgpu backend: {}", g.info),
            Err(e) => format!("wgpu backend: unavailable ({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_codegen::gpu_kernel::PassShape;

    /// The shared device, or `None` (with why) on a machine without a Vulkan driver.
    fn gpu() -> Option<Arc<Gpu>> {
        let b = WgpuBackend::new();
        match b.gpu() {
            Ok(g) => Some(g.clone()),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn a_shader_the_driver_refuses_is_a_driver_error_with_its_source() {
        let Some(gpu) = gpu() else { return };
        let pass = WgslPass {
            source: "@compute @workgroup_size(1) fn main() { let x: f32 = nonsense; }".into(),
            shape: PassShape::Single,
            threads: 1,
            bindings: vec![],
            why: "test".into(),
            entry_point: "main".into(),
        };
        let e = gpu.pipeline(&pass).unwrap_err();
        let Error::Driver { device, source, .. } = &e else {
            panic!("expected a driver error, got {e}")
        };
        assert!(device.starts_with("wgpu:0"), "{device}");
        assert!(source.to_string().contains("Validation"), "{source}");
        // The device stays usable: a valid pass compiles afterwards.
        let ok = WgslPass {
            source: "@compute @workgroup_size(1) fn main() {}".into(),
            ..pass
        };
        gpu.pipeline(&ok).unwrap();
    }

    #[test]
    fn copies_round_trip_and_sizes_are_checked() {
        let Some(_) = gpu() else { return };
        let b = WgpuBackend::new();
        // An odd size: wgpu copies whole words, the backend pads and trims.
        let buf = b.alloc_zeroed(0, 6).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host(&buf, &[1, 2, 3, 4, 5, 6], None) }.unwrap();
        let mut back = [0u8; 6];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&buf, &mut back, None) }.unwrap();
        assert_eq!(back, [1, 2, 3, 4, 5, 6]);
        assert!(matches!(
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { b.copy_from_host(&buf, &[0; 5], None) },
            Err(Error::ShapeMismatch { .. })
        ));
        // Ranges: on words (direct), ending at the buffer's odd end (direct), inside a word
        // (through the whole buffer); neighbours keep their bytes.
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 0, &[7, 7, 7, 7], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 4, &[8, 8], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 1, &[9, 9], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&buf, &mut back, None) }.unwrap();
        assert_eq!(back, [7, 9, 9, 7, 8, 8]);
        let mut part = [0u8; 3];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host_range(&buf, 3, &mut part, None) }.unwrap();
        assert_eq!(part, [7, 8, 8]);
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host_range(&buf, 4, &mut part[..2], None) }.unwrap();
        assert_eq!(part[..2], [8, 8]);
        // SAFETY: the test's own buffers, one call at a time.
        assert!(unsafe { b.copy_from_host_range(&buf, 5, &[1, 1], None) }.is_err());
        // Pool views are aligned for binding and zeroed on request.
        let align = b.pool_alignment();
        b.alloc_pool(0, 7, 4 * align, align).unwrap();
        let view = b.pool_view(0, 7, align, 8).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host(&view, &[9; 8], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.memset_zero(0, 7, align, 8) }.unwrap();
        let mut z = [1u8; 8];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&view, &mut z, None) }.unwrap();
        assert_eq!(z, [0; 8]);
        assert!(b.alloc_pool(0, 8, 64, align / 2).is_err() || align <= 64);
        assert!(b.pool_view(0, 7, 4 * align, 1).is_err());
        b.free_pool(0, 7).unwrap();
        assert!(b.free_pool(0, 7).is_err());
    }
}

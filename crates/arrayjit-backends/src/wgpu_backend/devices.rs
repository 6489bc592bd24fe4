//! The device-info part of the `wgpu` backend ([`WgpuDevices`]): the adapter wgpu picks from
//! the environment, opened once per process, and what it says of itself.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use arrayjit_codegen::wgsl::{WgslPass, WgslTarget};
use arrayjit_ir::{Error, Result};

use super::NAME;
use crate::device_info::{DeviceInfo, DeviceKind};
use crate::devices::Devices;

/// The GPU once an adapter and device are open.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: DeviceInfo,
    pub(crate) target: WgslTarget,
    /// The most workgroups per dispatch dimension.
    pub(crate) max_groups: u32,
    /// Alignment of storage-buffer binding offsets.
    pub(crate) offset_alignment: usize,
    /// The largest storage-buffer binding in bytes.
    pub(crate) max_binding_bytes: u64,
    /// The largest buffer in bytes (a pool of arrays is one buffer).
    pub(crate) max_buffer_bytes: u64,
    /// Compiled pipelines by WGSL source and entry point.
    pub(crate) pipelines: Mutex<HashMap<(String, String), wgpu::ComputePipeline>>,
    /// An error no error scope caught (reported by the next call).
    pub(crate) uncaptured: Arc<Mutex<Option<String>>>,
    /// Nanoseconds per timestamp tick, when the device writes timestamps in compute passes
    /// (`TIMESTAMP_QUERY`): timed launches report their device time from them.
    pub(crate) timestamp_period: Option<f64>,
}

/// The one device of the `wgpu` backend, or why there is none, and the bytes allocated on it.
pub struct WgpuDevices {
    gpu: std::result::Result<Arc<Gpu>, String>,
    pub(crate) used: Arc<AtomicUsize>,
}

impl fmt::Debug for WgpuDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpu {
            Ok(g) => write!(f, "WgpuDevices({})", g.info.name),
            Err(e) => write!(f, "WgpuDevices(unavailable: {e})"),
        }
    }
}

impl WgpuDevices {
    /// The adapter wgpu picks from the environment, opened once per process and shared by
    /// every backend made (opening a device takes tens of milliseconds, and listing the
    /// available backends makes one). Never fails: a machine without one gives devices whose
    /// calls say so ([`Devices::check_available`]).
    pub fn opened() -> WgpuDevices {
        static GPU: std::sync::OnceLock<std::result::Result<Arc<Gpu>, String>> =
            std::sync::OnceLock::new();
        WgpuDevices {
            gpu: GPU.get_or_init(|| open().map(Arc::new)).clone(),
            used: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Whether the device opened (then there is one).
    pub fn is_open(&self) -> bool {
        self.gpu.is_ok()
    }

    pub(crate) fn gpu(&self) -> Result<&Arc<Gpu>> {
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

    /// The device `device`, which must be 0.
    pub(crate) fn device_check(&self, device: usize) -> Result<&Arc<Gpu>> {
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

impl Devices for WgpuDevices {
    fn check_available(&self) -> Result<()> {
        self.gpu().map(|_| ())
    }

    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        Ok(self.device_check(device)?.info.clone())
    }

    fn debug_info(&self) -> String {
        match &self.gpu {
            Ok(g) => format!("wgpu backend: {}", g.info),
            Err(e) => format!("wgpu backend: unavailable ({e})"),
        }
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
        max_opt_in_shared_bytes: limits.max_compute_workgroup_storage_size as usize,
        shared_bytes_per_unit: 0,
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
        max_buffer_bytes: limits.max_buffer_size,
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
    pub(crate) fn label(&self) -> String {
        format!("{NAME}:0 ({})", self.info.name)
    }

    /// Runs `f` inside validation and out-of-memory error scopes; a caught error (or one that
    /// escaped an earlier scope) is [`Error::Driver`] naming `action`.
    pub(crate) fn scoped<T>(&self, action: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
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

    pub(crate) fn driver_error(
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
    pub(crate) fn wait(&self, action: &str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| self.driver_error(action, Box::new(e)))
    }

    /// The compute pipeline of a pass, compiled once per source.
    pub(crate) fn pipeline(&self, pass: &WgslPass) -> Result<wgpu::ComputePipeline> {
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

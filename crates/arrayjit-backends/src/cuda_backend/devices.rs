//! The device-info part of the `cuda` backend ([`CudaDevices`]): the machine's GPUs, opened
//! once per process on their primary contexts, with what the driver says of each.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use arrayjit_ir::{Error, Prec, Result};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::releases::{FenceDriver, Releases};
use super::{HOW_TO_ENABLE, NAME, feature_arch};
use crate::device_info::{DeviceInfo, DeviceKind};
use crate::devices::Devices;

/// One GPU.
pub(crate) struct Gpu {
    pub(crate) ordinal: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) info: DeviceInfo,
    /// `sm_XY`.
    pub(crate) arch: String,
    pub(crate) used: Arc<AtomicUsize>,
    /// For host reads and writes outside any runtime stream.
    pub(crate) default_stream: Arc<CudaStream>,
    /// Held shared while a stream of the device captures a graph; taken exclusively by what
    /// must not happen during any capture: freeing memory, waiting for the whole context.
    pub(crate) capture_gate: RwLock<()>,
    /// Allocations dropped and not yet freed ([`super::releases`]).
    pub(crate) releases: Releases<Vec<CudaEvent>>,
    /// The device's live streams (the runtime's queues and the default stream): a release's
    /// fence is an event on each.
    pub(crate) streams: Mutex<Vec<Weak<CudaStream>>>,
}

impl Gpu {
    pub(crate) fn label(&self) -> String {
        format!("{NAME}:{} ({})", self.ordinal, self.info.name)
    }

    pub(crate) fn driver_error(
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

    /// Counts a stream of the device in release fences.
    pub(crate) fn register_stream(&self, stream: &Arc<CudaStream>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(stream));
    }

    /// The live streams of the device.
    pub(crate) fn live_streams(&self) -> Vec<Arc<CudaStream>> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|s| s.strong_count() > 0);
        streams.iter().filter_map(Weak::upgrade).collect()
    }

    /// Frees what was released and no work uses any more (with `wait`, after waiting for the
    /// work queued before the releases), unless a stream captures; counts the freed bytes
    /// out of `used`.
    pub(crate) fn reclaim(&self, wait: bool) {
        let freed = self
            .releases
            .reclaim(&DeviceFences(self), &self.capture_gate, wait);
        self.used.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Waits for every stream of the device (the context), never while a stream captures: the
    /// capture gate is taken exclusively first (captures are short: they only enqueue). Frees
    /// the releases then.
    pub(crate) fn synchronize_all(&self, action: &str) -> Result<()> {
        let _quiet = self.capture_gate.write().unwrap_or_else(|p| p.into_inner());
        self.bind(action)?;
        self.ctx
            .synchronize()
            .map_err(|e| self.driver_error(action, e))?;
        let freed = self.releases.reclaim_quiet(&DeviceFences(self), false);
        self.used.fetch_sub(freed, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the device's context current on this thread (driver calls need it).
    pub(crate) fn bind(&self, action: &str) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.driver_error(action, e))
    }
}

/// A device's release fences: an event on each of its live streams.
pub(super) struct DeviceFences<'a>(pub(super) &'a Gpu);

impl FenceDriver for DeviceFences<'_> {
    type Fence = Vec<CudaEvent>;

    fn fence(&self) -> Result<Vec<CudaEvent>> {
        let gpu = self.0;
        gpu.bind("recording a release fence")?;
        gpu.live_streams()
            .iter()
            .map(|s| {
                s.record_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                ))
                .map_err(|e| gpu.driver_error("recording a release fence", e))
            })
            .collect()
    }

    fn passed(&self, fence: &Vec<CudaEvent>) -> Result<bool> {
        let gpu = self.0;
        gpu.bind("querying a release fence")?;
        for event in fence {
            let done = event
                .try_is_complete()
                .map_err(|e| gpu.driver_error("querying a release fence", e))?;
            if !done {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn wait(&self, fence: &Vec<CudaEvent>) -> Result<()> {
        let gpu = self.0;
        gpu.bind("waiting for a release fence")?;
        fence.iter().try_for_each(|event| {
            event
                .synchronize()
                .map_err(|e| gpu.driver_error("waiting for a release fence", e))
        })
    }

    fn free(&self, ptr: u64) -> Result<()> {
        let gpu = self.0;
        gpu.bind("freeing device memory")?;
        // SAFETY: `ptr` came from `cuMemAlloc` in this context, was released by its last
        // owner, and every stream's work enqueued before the release has finished.
        unsafe { cudarc::driver::result::free_sync(ptr) }
            .map_err(|e| gpu.driver_error("freeing device memory", e))
    }

    fn label(&self) -> String {
        self.0.label()
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
                max_opt_in_shared_bytes: attr(
                    Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                ) as usize,
                shared_bytes_per_unit: attr(
                    Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                ) as usize,
                subgroup_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE) as usize,
                vector_bytes: 16,
                vector_registers: 0,
                cache_bytes: [0, 0, attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) as usize],
                memory_bytes: ctx.total_mem().unwrap_or(0) as u64,
                precisions: Prec::ALL.to_vec(),
                matrix_units: major >= 8,
                warpgroup_mma: (major, minor) == (9, 0),
                joined_launch_parameters:
                    arrayjit_opt::schedule::gpu::CUDA_JOINED_LAUNCH_PARAMETERS,
            };
            let default_stream = ctx
                .new_stream()
                .map_err(|e| format!("device {ordinal}: {e}"))?;
            let gpu = Gpu {
                ordinal,
                arch: feature_arch(&format!("sm_{major}{minor}")),
                ctx,
                info,
                used: Arc::new(AtomicUsize::new(0)),
                streams: Mutex::new(Vec::new()),
                capture_gate: RwLock::new(()),
                releases: Releases::default(),
                default_stream,
            };
            gpu.register_stream(&gpu.default_stream);
            Ok(Arc::new(gpu))
        })
        .collect()
}

/// The GPUs of the `cuda` backend, or why there are none.
pub struct CudaDevices {
    gpus: std::result::Result<Vec<Arc<Gpu>>, String>,
}

impl fmt::Debug for CudaDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpus {
            Ok(g) => write!(f, "CudaDevices({} device(s))", g.len()),
            Err(e) => write!(f, "CudaDevices(unavailable: {e})"),
        }
    }
}

impl CudaDevices {
    /// The machine's GPUs, opened once per process. Never fails: without the libraries or a
    /// GPU, every call says what is missing ([`Devices::check_available`]).
    pub fn opened() -> CudaDevices {
        static GPUS: OnceLock<std::result::Result<Vec<Arc<Gpu>>, String>> = OnceLock::new();
        CudaDevices {
            gpus: GPUS.get_or_init(open).clone(),
        }
    }

    /// How many GPUs there are (0 when the backend cannot run).
    pub fn count(&self) -> usize {
        self.gpus.as_ref().map_or(0, Vec::len)
    }

    pub(crate) fn gpus(&self) -> Result<&[Arc<Gpu>]> {
        self.gpus
            .as_deref()
            .map_err(|reason| Error::BackendUnavailable {
                backend: NAME.into(),
                reason: reason.clone(),
                how_to_enable: HOW_TO_ENABLE.into(),
            })
    }

    pub(crate) fn gpu(&self, device: usize) -> Result<&Arc<Gpu>> {
        let gpus = self.gpus()?;
        gpus.get(device).ok_or_else(|| Error::NoSuchDevice {
            backend: NAME.into(),
            ordinal: device,
            num_devices: gpus.len(),
        })
    }
}

impl Devices for CudaDevices {
    fn check_available(&self) -> Result<()> {
        self.gpus().map(|_| ())
    }

    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        Ok(self.gpu(device)?.info.clone())
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

//! Backends by name, devices, and compilation of assignments into code.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrayjit_backends::LoweredBackend;
use arrayjit_backends::cc::{CcBackend, CcConfig};
use arrayjit_backends::missing::MissingBackend;
use arrayjit_ir::{Assignments, Error, OptimizeSettings, Result, StaticSymbol, optimize};

use crate::routine::Code;
use crate::stream::Stream;

/// Every backend name arrayjit knows, available or not.
pub const KNOWN_BACKENDS: &[&str] = &["sync_cc", "cuda", "metal", "wgpu"];

/// The backend used when neither a name nor `ARRAYJIT_BACKEND` says otherwise.
pub const DEFAULT_BACKEND: &str = "sync_cc";

fn missing(name: &str) -> MissingBackend {
    let (reason, how) = match name {
        "cuda" => (
            "this build of arrayjit has no CUDA backend yet",
            "use sync_cc for now; the CUDA backend (cudarc: NVRTC + driver API) will need an NVIDIA driver",
        ),
        "metal" => (
            "this build of arrayjit has no Metal backend",
            "use sync_cc; Metal would need macOS with Apple GPUs",
        ),
        _ => (
            "this build of arrayjit has no wgpu backend yet",
            "use sync_cc for now; the wgpu backend will need a Vulkan, Metal or DX12 driver",
        ),
    };
    MissingBackend::new(name, reason, how)
}

/// The backend called `name` (see [`KNOWN_BACKENDS`]). An unknown name is
/// [`Error::UnknownBackend`], listing the available ones; a known but unavailable backend is
/// returned as a placeholder with no devices whose calls fail with
/// [`Error::BackendUnavailable`].
pub fn backend(name: &str) -> Result<Backend> {
    let trimmed = name.trim();
    let lowered: Arc<dyn LoweredBackend> = match trimmed {
        "sync_cc" | "cc" => Arc::new(CcBackend::new(CcConfig::from_env())),
        "cuda" | "metal" | "wgpu" => Arc::new(missing(trimmed)),
        _ => {
            return Err(Error::UnknownBackend {
                name: name.to_string(),
                available: available_backends().join(", "),
            });
        }
    };
    let canonical = if trimmed == "cc" { "sync_cc" } else { trimmed };
    Ok(Backend::from_lowered(canonical, lowered))
}

/// Resolves a backend (by name, or the default one) and checks that it can run here: the one
/// call that starts arrayjit. An unavailable backend is an error here rather than a placeholder.
pub fn initialize(name: Option<&str>) -> Result<Backend> {
    let b = match name {
        Some(n) => backend(n)?,
        None => default_backend()?,
    };
    b.check_available()?;
    Ok(b)
}

/// The backend named by `ARRAYJIT_BACKEND`, else `sync_cc`.
pub fn default_backend() -> Result<Backend> {
    match std::env::var("ARRAYJIT_BACKEND") {
        Ok(name) if !name.trim().is_empty() => backend(&name),
        _ => backend(DEFAULT_BACKEND),
    }
}

/// The names of the backends that can run here.
pub fn available_backends() -> Vec<&'static str> {
    KNOWN_BACKENDS
        .iter()
        .copied()
        .filter(|n| match *n {
            "sync_cc" => CcBackend::new(CcConfig::from_env())
                .check_available()
                .is_ok(),
            _ => false,
        })
        .collect()
}

pub(crate) struct BackendInner {
    pub name: String,
    pub lowered: Arc<dyn LoweredBackend>,
    pub settings: Mutex<OptimizeSettings>,
}

/// A backend: a lowered backend with a scheduler (`Sync` today).
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.inner.name)
    }
}

impl Backend {
    /// Wraps a lowered backend under a name.
    pub fn from_lowered(name: &str, lowered: Arc<dyn LoweredBackend>) -> Backend {
        Backend {
            inner: Arc::new(BackendInner {
                name: name.to_string(),
                lowered,
                settings: Mutex::new(OptimizeSettings::default()),
            }),
        }
    }

    /// The backend's name, e.g. `"sync_cc"`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The lowered backend underneath.
    pub fn lowered(&self) -> &Arc<dyn LoweredBackend> {
        &self.inner.lowered
    }

    /// `Ok` if the backend can run here, or why not.
    pub fn check_available(&self) -> Result<()> {
        self.inner.lowered.check_available()
    }

    /// Number of devices (0 for an unavailable backend).
    pub fn num_devices(&self) -> usize {
        self.inner.lowered.num_devices()
    }

    /// Device `ordinal`.
    pub fn get_device(&self, ordinal: usize) -> Result<Device> {
        self.check_available()?;
        let n = self.num_devices();
        if ordinal >= n {
            return Err(Error::NoSuchDevice {
                backend: self.name().to_string(),
                ordinal,
                num_devices: n,
            });
        }
        Ok(Device {
            backend: self.clone(),
            ordinal,
        })
    }

    /// The optimizer settings used by [`Backend::compile`].
    pub fn optimize_settings(&self) -> OptimizeSettings {
        self.inner
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the optimizer settings.
    pub fn set_optimize_settings(&self, settings: OptimizeSettings) {
        *self
            .inner
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = settings;
    }

    /// Optimizes and compiles one routine.
    pub fn compile(
        &self,
        name: &str,
        assignments: &Assignments,
        bindings: &[StaticSymbol],
    ) -> Result<Code> {
        let mut codes = self.compile_batch(&[(name, assignments)], bindings)?;
        Ok(codes.pop().expect("one routine in, one code out"))
    }

    /// Optimizes several routines and compiles them together (one compiler run).
    pub fn compile_batch(
        &self,
        routines: &[(&str, &Assignments)],
        bindings: &[StaticSymbol],
    ) -> Result<Vec<Code>> {
        self.check_available()?;
        let settings = self.optimize_settings();
        let optimized = routines
            .iter()
            .map(|(name, a)| optimize(name, bindings, a, &settings).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&arrayjit_ir::Optimized> = optimized.iter().map(|o| o.as_ref()).collect();
        let batch = self.inner.lowered.compile_batch(&refs)?;
        Ok(optimized
            .into_iter()
            .enumerate()
            .map(|(index, optimized)| Code {
                backend_name: self.name().to_string(),
                batch: batch.clone(),
                index,
                optimized,
            })
            .collect())
    }

    /// Backend-specific debug information.
    pub fn debug_info(&self) -> String {
        format!("{}: {}", self.name(), self.inner.lowered.debug_info())
    }
}

/// A device of a backend.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) backend: Backend,
    pub(crate) ordinal: usize,
}

impl Device {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The backend it belongs to.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        Ok(Stream::new(self.clone()))
    }

    /// How many streams to use on this device (1 for the `Sync` scheduler).
    pub fn suggested_num_streams(&self) -> usize {
        1
    }

    /// Bytes currently allocated for arrays on this device.
    pub fn used_memory(&self) -> usize {
        self.backend.inner.lowered.used_memory(self.ordinal)
    }

    /// A readable name, e.g. `"sync_cc:0"`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.backend.name(), self.ordinal)
    }
}

//! The device-info part of a CPU backend ([`CpuDevices`]): the host CPU, split into the
//! runtime's devices with their worker threads, as the renderer's code sees it; available when
//! the host compiler runs.

use std::sync::Arc;

use arrayjit_ir::{Error, Result};

use super::CcConfig;
use super::kernels::CpuKernels;
use super::toolchain;
use crate::cpu::CpuRuntime;
use crate::device_info::DeviceInfo;
use crate::devices::Devices;

/// The devices of a CPU backend.
#[derive(Debug)]
pub struct CpuDevices {
    config: CcConfig,
    kernels: Arc<dyn CpuKernels>,
    runtime: Arc<CpuRuntime>,
}

impl CpuDevices {
    /// The devices of `runtime`, as `kernels`' code sees them, compiled by `config`'s compiler.
    pub fn new(config: CcConfig, kernels: Arc<dyn CpuKernels>, runtime: Arc<CpuRuntime>) -> Self {
        CpuDevices {
            config,
            kernels,
            runtime,
        }
    }
}

impl Devices for CpuDevices {
    /// Available when the host compiler answers `--version`; for `cuda_emu`, the error says
    /// which C++ compiler to install.
    fn check_available(&self) -> Result<()> {
        let found =
            toolchain::compiler_identity(&self.config.compiler, self.config.compile_timeout);
        match found {
            Ok(_) => Ok(()),
            // The renderer may know better what to install (a C++ compiler for `cuda_emu`).
            Err(Error::BackendUnavailable { reason, .. })
                if self.kernels.how_to_enable(&self.config.compiler).is_some() =>
            {
                Err(Error::BackendUnavailable {
                    backend: self.kernels.name().into(),
                    reason,
                    how_to_enable: self
                        .kernels
                        .how_to_enable(&self.config.compiler)
                        .unwrap_or_default(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The host CPU with the device's worker threads, as the renderer's code sees it.
    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        Ok(self.kernels.device_info(self.runtime.device_info(device)?))
    }

    /// The compiler, its version and flags, the CPU's model and features, and the worker count.
    fn machine_identity(&self) -> String {
        format!(
            "cc `{}` ({}) flags {:?} on {} with {} worker(s)",
            self.config.compiler,
            toolchain::compiler_identity(&self.config.compiler, self.config.compile_timeout)
                .unwrap_or_default(),
            self.config.flags,
            toolchain::cpu_identity(),
            self.runtime.workers_per_device()
        )
    }

    fn debug_info(&self) -> String {
        use crate::device_runtime::DeviceRuntime;
        format!(
            "{} backend: compiler `{}` ({}), flags {:?}, cache {}, {} device(s) of {} worker(s)",
            self.kernels.name(),
            self.config.compiler,
            toolchain::compiler_identity(&self.config.compiler, self.config.compile_timeout)
                .unwrap_or_else(|e| e.to_string()),
            self.config.flags,
            self.config
                .cache_dir
                .as_ref()
                .map_or("disabled".into(), |p| p.display().to_string()),
            self.runtime.num_devices(),
            self.runtime.workers_per_device()
        )
    }
}

//! The backend registry: one row per backend name, saying how to make its lowered backend and
//! which scheduler runs its streams. Adding a backend is one new row here (and its lowered
//! backend in `arrayjit-backends`); a backend that this build lacks or that cannot run here is a
//! row whose lowered backend is a [`missing`] placeholder, so its name is still known and
//! every call explains how to enable it.

use std::sync::Arc;

use arrayjit_backends::cc::{self, CcConfig};
use arrayjit_backends::missing;
use arrayjit_backends::{LoweredBackend, built};
use arrayjit_ir::Result;

use crate::config::RuntimeConfig;
use crate::scheduler::SchedulerKind;

/// A lowered backend and the scheduler its streams use.
pub(crate) type Made = (Arc<LoweredBackend>, SchedulerKind);

/// One backend of the registry.
pub struct BackendEntry {
    /// The backend's name, as users write it (`sync_cc`).
    pub name: &'static str,
    /// Other names accepted for it.
    pub aliases: &'static [&'static str],
    /// One line on what it is.
    pub summary: &'static str,
    /// Whether it runs on the host's CPU cores (its devices are the CPU's).
    pub on_cpu: bool,
    /// Makes its lowered backend and scheduler for a configuration.
    pub(crate) make: fn(&str, &RuntimeConfig) -> Result<Made>,
}

impl BackendEntry {
    /// Whether `name` (trimmed) names this backend.
    pub fn answers_to(&self, name: &str) -> bool {
        let name = name.trim();
        self.name == name || self.aliases.contains(&name)
    }
}

/// Every backend arrayjit knows, available or not, in the order they are listed to users.
pub static REGISTRY: [BackendEntry; ROWS.len()] = ROWS;

/// The rows of [`REGISTRY`] (a constant, so that [`KNOWN_BACKENDS`] is computed from them).
const ROWS: [BackendEntry; 6] = [
    BackendEntry {
        name: "sync_cc",
        aliases: &["cc"],
        summary: "C compiled by the system compiler, run on the caller's thread",
        on_cpu: true,
        make: |_, config| Ok((cpu_backend(config, false)?, SchedulerKind::Sync)),
    },
    BackendEntry {
        name: "multicore_cc",
        aliases: &[],
        summary: "C compiled by the system compiler, one worker thread per stream",
        on_cpu: true,
        make: |_, config| {
            Ok((
                cpu_backend(config, true)?,
                SchedulerKind::Multicore {
                    queue_capacity: config.queue_capacity,
                },
            ))
        },
    },
    BackendEntry {
        name: "cuda",
        aliases: &[],
        summary: CUDA_SUMMARY,
        on_cpu: false,
        make: make_cuda,
    },
    BackendEntry {
        name: "cuda_emu",
        aliases: &[],
        summary: "the CUDA renderer's kernels on the CPU, under an emulation of blocks, threads, \
                  shared memory and barriers (checks the CUDA code without a GPU; slow)",
        on_cpu: true,
        make: |_, config| Ok((cuda_emulated(config)?, SchedulerKind::Sync)),
    },
    BackendEntry {
        name: "metal",
        aliases: &[],
        summary: "Apple GPUs (not in this build)",
        on_cpu: false,
        make: |name, _| {
            missing(
                name,
                "this build of arrayjit has no Metal backend",
                "use sync_cc; Metal would need macOS with Apple GPUs",
            )
        },
    },
    BackendEntry {
        name: "wgpu",
        aliases: &[],
        summary: WGPU_SUMMARY,
        on_cpu: false,
        make: make_wgpu,
    },
];

/// The names of every registered backend, in registry order.
pub const KNOWN_BACKENDS: &[&str] = &{
    let mut names = [""; ROWS.len()];
    let mut i = 0;
    while i < ROWS.len() {
        names[i] = ROWS[i].name;
        i += 1;
    }
    names
};

/// Whether `name` names a backend that runs on the host's CPU cores.
pub fn is_cpu_backend(name: &str) -> bool {
    find(name).is_some_and(|e| e.on_cpu)
}

/// The registry row answering to `name`, if any.
pub fn find(name: &str) -> Option<&'static BackendEntry> {
    REGISTRY.iter().find(|e| e.answers_to(name))
}

const CUDA_SUMMARY: &str = if built::CUDA {
    "CUDA C compiled by NVRTC, run on NVIDIA GPUs on CUDA streams"
} else {
    "NVIDIA GPUs (not in this build: cargo feature `cuda`)"
};

/// The `cuda` backend, or (in a build without it) its placeholder.
fn make_cuda(_: &str, _: &RuntimeConfig) -> Result<Made> {
    Ok((Arc::new(built::cuda()), SchedulerKind::Sync))
}

const WGPU_SUMMARY: &str = if built::WGPU {
    "WGSL compute passes on a GPU through wgpu (Vulkan; lavapipe on CPUs)"
} else {
    "GPUs through wgpu (not in this build: cargo feature `wgpu`)"
};

/// The `wgpu` backend, or (in a build without it) its placeholder.
fn make_wgpu(_: &str, _: &RuntimeConfig) -> Result<Made> {
    Ok((Arc::new(built::wgpu()), SchedulerKind::Sync))
}

/// The placeholder row of a backend this build lacks.
fn missing(name: &str, reason: &str, how_to_enable: &str) -> Result<Made> {
    Ok((
        Arc::new(missing::backend(name, reason, how_to_enable)),
        SchedulerKind::Sync,
    ))
}

/// A cc lowered backend for the configuration; with `share_cores`, each device gets its share
/// of the cores as workers (else one worker: the caller's thread runs the work).
fn cpu_backend(config: &RuntimeConfig, share_cores: bool) -> Result<Arc<LoweredBackend>> {
    let mut c = CcConfig::from_env()?;
    if let Some(n) = config.num_devices {
        c.num_devices = n;
    }
    if let Some(dir) = &config.cache_dir {
        c.cache_dir = Some(dir.clone());
    }
    if let Some(w) = config.workers_per_device {
        c.workers_per_device = Some(w);
    }
    if c.workers_per_device.is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        c.workers_per_device = Some(if share_cores {
            (cores / c.num_devices.max(1)).max(1)
        } else {
            1
        });
    }
    Ok(Arc::new(cc::backend(c)?))
}

/// The `cuda_emu` lowered backend, composed of the CPU runtime, the emulated CUDA renderer
/// (`EmulatedCudaKernels`) and the host's C++ compiler (`$CXX` or `c++`); one worker per device.
fn cuda_emulated(config: &RuntimeConfig) -> Result<Arc<LoweredBackend>> {
    let mut c = CcConfig::from_env()?;
    if let Some(n) = config.num_devices {
        c.num_devices = n;
    }
    if let Some(dir) = &config.cache_dir {
        c.cache_dir = Some(dir.clone());
    }
    Ok(Arc::new(cc::emulated_cuda_backend(
        c,
        &arrayjit_backends::settings::process_env,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_are_the_registry_rows() {
        let names: Vec<&str> = REGISTRY.iter().map(|e| e.name).collect();
        assert_eq!(KNOWN_BACKENDS, names.as_slice());
    }

    #[test]
    fn names_and_aliases_find_their_row_and_nothing_else() {
        assert_eq!(find(" cc ").map(|e| e.name), Some("sync_cc"));
        assert_eq!(find("multicore_cc").map(|e| e.name), Some("multicore_cc"));
        assert!(find("cuda_").is_none() && find("").is_none());
        // No name or alias answers for two rows.
        for e in &REGISTRY {
            for n in std::iter::once(&e.name).chain(e.aliases) {
                assert_eq!(
                    REGISTRY.iter().filter(|r| r.answers_to(n)).count(),
                    1,
                    "{n}"
                );
            }
        }
    }

    #[test]
    fn placeholder_rows_explain_how_to_enable_them() {
        // (wgpu too, where this build lacks the feature or the machine a Vulkan driver.)
        for name in ["cuda", "metal", "wgpu"] {
            let (lowered, _) = (find(name).unwrap().make)(name, &RuntimeConfig::default()).unwrap();
            if lowered.runtime().num_devices() > 0 {
                continue;
            }
            let e = lowered.check_available().unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
            assert_eq!(lowered.runtime().num_devices(), 0);
        }
    }
}

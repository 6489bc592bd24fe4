//! The CPU backends ([`backend`], [`emulated_cuda_backend`]), each composed of four parts: its
//! devices ([`CpuDevices`]), a renderer ([`CpuKernels`]), the host compiler ([`CcCompiler`]) and
//! the shared CPU runtime ([`CpuRuntime`]). The `cc` backend renders C ([`CKernels`]), compiles it
//! with the system C compiler (`$CC` or `cc`) into a shared library, loads it with
//! `libloading`, and runs kernels on the CPU over [`CpuBuffer`](crate::cpu::buffer::CpuBuffer)s. Libraries
//! are cached by a hash of (source, compiler, flags, CPU) in a private per-user folder.
//!
//! The same parts run the CUDA renderer's kernels on the CPU ([`EmulatedCudaKernels`], the
//! `cuda_emu` backend): compiled as C++ by `$CXX` or `c++` under an emulation of the CUDA
//! execution model ([`arrayjit_codegen::cuda_emulation`]), so the CUDA code path is checked
//! against the interpreter without a GPU. It is slow (threads are fibers on one core); it is a
//! checking tool, not a way to run fast.

mod batch;
mod compile;
mod compiler;
mod devices;
mod kernels;
mod library;
mod object_cache;
mod schedule_store;
mod shared_functions;
mod stats;
mod toolchain;

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use arrayjit_codegen::cuda_emulation::EMULATION_FLAGS;
use arrayjit_ir::{Error, Result};

use crate::cpu::{CpuRuntime, CpuRuntimeConfig};
use crate::lowered_backend::{BackendParts, LoweredBackend};
use crate::settings;

pub use crate::compile_cache::default_cache_dir;
pub use batch::CcBatch;
pub use compiler::CcCompiler;
pub use devices::CpuDevices;
pub use kernels::{
    CKernels, CallingConvention, CpuKernels, CpuProgram, CpuSource, EmulatedCudaKernels,
    RenderedKernels,
};
pub use stats::{CompileStats, compile_stats};

/// Settings of the `cc` backend. [`CcConfig::from_env`] reads them from the environment
/// variables named on the fields; a value outside the documented range, or one that does not
/// parse, is an [`Error::InvalidSetting`]. [`CcConfig::default`] is the built-in defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CcConfig {
    /// The compiler command (`$CC`, default `cc`); it may hold a wrapper or arguments
    /// (`ccache gcc`, `gcc -std=gnu11`), split on whitespace.
    pub compiler: String,
    /// Compiler flags (`$ARRAYJIT_CC_FLAGS` split on spaces, default
    /// [`DEFAULT_CC_FLAGS`]). `-shared` and `-fPIC` are needed for loading.
    pub flags: Vec<String>,
    /// If set, generated sources are kept in this folder (`$ARRAYJIT_BUILD_FILES`).
    pub build_files_dir: Option<PathBuf>,
    /// The compile cache folder; `None` disables the cache (`$ARRAYJIT_CACHE_DIR`, default
    /// `$XDG_CACHE_HOME/arrayjit/cc` or `~/.cache/arrayjit/cc`; `ARRAYJIT_NO_CACHE=1` disables).
    pub cache_dir: Option<PathBuf>,
    /// Number of CPU devices (`$ARRAYJIT_CPU_DEVICES`, in [`CPU_DEVICES_RANGE`], default 1).
    pub num_devices: usize,
    /// Size the compile cache is trimmed to, least recently used libraries first
    /// (`$ARRAYJIT_CACHE_MAX_MB` megabytes, in [`CACHE_MAX_MB_RANGE`], default 1024).
    pub cache_max_bytes: u64,
    /// How long one compiler run may take before it is killed and the compile fails
    /// (`$ARRAYJIT_CC_TIMEOUT_SECS` seconds, in [`CC_TIMEOUT_SECS_RANGE`], default 600). Also
    /// bounds `cc --version`.
    pub compile_timeout: std::time::Duration,
    /// Bytes left unused around every array of a context's pools (`$ARRAYJIT_POOL_GUARD_BYTES`,
    /// in [`POOL_GUARD_BYTES_RANGE`], default 0). With the AddressSanitizer runtime loaded,
    /// they are poisoned, so a kernel running past an array is reported.
    pub pool_guard_bytes: usize,
    /// Threads of each device's worker pool, which split a routine's parallel loops (blocked
    /// contractions today) (`$ARRAYJIT_CPU_WORKERS`, in [`CPU_WORKERS_RANGE`]). `None` lets the
    /// runtime decide: one for `sync_cc`, the device's share of the cores for `multicore_cc`.
    pub workers_per_device: Option<usize>,
    /// Use the host arrays of hosted constant and volatile nodes in place as their device
    /// arrays, with no copy (`$ARRAYJIT_USE_HOST_MEMORY`, a yes/no setting, default yes): the
    /// reference's `use_host_memory`, for unified memory like the CPU's. With it, the host
    /// arrays of nodes that devices change are handed to their first device array at link
    /// rather than copied (`DeviceRuntime::adopt_host_array`).
    pub use_host_memory: bool,
}

/// The default C compiler flags.
///
/// `-O1 -fexpensive-optimizations -fgcse -ftree-vectorize`: `-O1` and the three passes of
/// `-O2` that the generated loops need, for three quarters of `-O2`'s compile time (the GPT
/// step's statements: 0.69–0.75 s instead of 0.93 s, gcc 12, AMD EPYC family 25 model 17).
/// The loops come already shaped by the optimizer (fused, hoisted, their reductions split into
/// vector lanes), so `-O2`'s other passes find nothing to gain there. The explicit
/// `-ftree-vectorize` gives gcc's full ("dynamic") vectorizer cost model (plain `-O2` uses the
/// "very cheap" one, which leaves loops whose trip count is not a multiple of the vector width
/// scalar): gcc vectorizes every loop of the GPT step at this level that it did at `-O2`.
/// `-fexpensive-optimizations`: the register allocation that keeps a loop's constants in the
/// upper sixteen AVX-512 registers, and the `vzeroupper` before returning from vector code
/// (gcc inserts it only with this option: without it, SSE code after a kernel pays for the
/// dirty upper halves on Intel). `-fgcse`: its load motion takes the constants' loads out of
/// the loops (the exponential's polynomial read eight of them per vector at `-O1`). Measured
/// in alternated runs against `-O2`: the softmax row, the GPT step's 169 loop statements
/// (`bench --statements`) and the products alike within the host's noise. (Against `-O3`, on a
/// 2-core VM earlier: every `bench --quick` row as fast or faster.) The helpers set their own
/// level (the product's register-heavy micro-kernels, the attention's loops: see
/// `arrayjit_codegen`'s C renderer). clang takes the same flags (the two gcc passes' names
/// it ignores, with a warning).
///
/// `-fno-math-errno`: generated code never reads `errno`, and with it set `sqrtf` is no longer a
/// call that may write `errno`, so loops over it vectorize (the result is the same correctly
/// rounded square root). Without it gcc kept every loop with a square root scalar: AdamW's
/// update ran at 4.1 ns an element on a 2-core EPYC VM, and at 0.5 ns with it.
///
/// `-ffp-contract=off`: the compiler fuses no `a * b + c` of its own; the generated code has
/// `fmaf` where the loop IR has a fused multiply-add (the optimizer's FMA pass and the math
/// helpers), and the product helper turns contraction on for its own unit. gcc's default
/// (`fast`, in GNU C) also fused a product stored by one statement into a sum of the next where
/// it saw both, so fusing two loops, or inlining a node, changed results in the last bits (a
/// `bf16` training realization moved by 0.06 in loss after 300 steps); now the bits follow from
/// the loop IR alone, whatever loops the optimizer fuses and whichever of gcc or clang compiles.
pub const DEFAULT_CC_FLAGS: &[&str] = &[
    "-O1",
    "-fexpensive-optimizations",
    "-fgcse",
    "-ftree-vectorize",
    "-fno-math-errno",
    "-ffp-contract=off",
    "-march=native",
    "-fPIC",
    "-shared",
];

/// Accepted numbers of CPU devices (`ARRAYJIT_CPU_DEVICES`, [`CcConfig::num_devices`]).
pub const CPU_DEVICES_RANGE: RangeInclusive<u64> = 1..=1024;
/// Accepted compile-cache sizes in megabytes (`ARRAYJIT_CACHE_MAX_MB`; 0 keeps only the
/// libraries in use).
pub const CACHE_MAX_MB_RANGE: RangeInclusive<u64> = 0..=(16 << 20);
/// Accepted compiler timeouts in seconds (`ARRAYJIT_CC_TIMEOUT_SECS`).
pub const CC_TIMEOUT_SECS_RANGE: RangeInclusive<u64> = 1..=86_400;

/// Accepted worker counts per device (`ARRAYJIT_CPU_WORKERS`).
pub const CPU_WORKERS_RANGE: RangeInclusive<u64> = 1..=1024;

/// Accepted pool guard sizes in bytes (`ARRAYJIT_POOL_GUARD_BYTES`).
pub const POOL_GUARD_BYTES_RANGE: RangeInclusive<u64> = 0..=65_536;

const DEFAULT_CACHE_MAX_MB: u64 = 1024;
const DEFAULT_CC_TIMEOUT_SECS: u64 = 600;

impl Default for CcConfig {
    /// The built-in defaults, whatever the environment says.
    fn default() -> Self {
        CcConfig {
            compiler: "cc".into(),
            flags: DEFAULT_CC_FLAGS.iter().map(|s| s.to_string()).collect(),
            build_files_dir: None,
            cache_dir: default_cache_dir(),
            num_devices: 1,
            cache_max_bytes: DEFAULT_CACHE_MAX_MB << 20,
            compile_timeout: std::time::Duration::from_secs(DEFAULT_CC_TIMEOUT_SECS),
            pool_guard_bytes: 0,
            workers_per_device: None,
            use_host_memory: true,
        }
    }
}

impl CcConfig {
    /// The configuration from the environment variables documented on the fields.
    pub fn from_env() -> Result<CcConfig> {
        CcConfig::from_lookup(&settings::process_env)
    }

    /// The configuration from the variables `lookup` gives (the environment, or a map in
    /// tests).
    pub fn from_lookup(lookup: settings::Lookup<'_>) -> Result<CcConfig> {
        let defaults = CcConfig::default();
        let flags = match settings::text(lookup, "ARRAYJIT_CC_FLAGS")? {
            Some(f) => f.split_whitespace().map(String::from).collect(),
            None => defaults.flags,
        };
        let cache_dir = crate::compile_cache::cache_dir(lookup)?;
        let num_devices = settings::integer(lookup, "ARRAYJIT_CPU_DEVICES", CPU_DEVICES_RANGE, 1)?;
        let cache_max_mb = settings::integer(
            lookup,
            "ARRAYJIT_CACHE_MAX_MB",
            CACHE_MAX_MB_RANGE,
            DEFAULT_CACHE_MAX_MB,
        )?;
        let timeout = settings::integer(
            lookup,
            "ARRAYJIT_CC_TIMEOUT_SECS",
            CC_TIMEOUT_SECS_RANGE,
            DEFAULT_CC_TIMEOUT_SECS,
        )?;
        let guard = settings::integer(
            lookup,
            "ARRAYJIT_POOL_GUARD_BYTES",
            POOL_GUARD_BYTES_RANGE,
            0,
        )?;
        let workers = match settings::text(lookup, "ARRAYJIT_CPU_WORKERS")? {
            Some(_) => Some(
                settings::integer(lookup, "ARRAYJIT_CPU_WORKERS", CPU_WORKERS_RANGE, 1)? as usize,
            ),
            None => None,
        };
        Ok(CcConfig {
            use_host_memory: settings::flag(lookup, "ARRAYJIT_USE_HOST_MEMORY", true)?,
            workers_per_device: workers,
            pool_guard_bytes: guard as usize,
            compiler: settings::text(lookup, "CC")?.unwrap_or(defaults.compiler),
            flags,
            build_files_dir: settings::text(lookup, "ARRAYJIT_BUILD_FILES")?.map(PathBuf::from),
            cache_dir,
            // In range, so the conversions are exact.
            num_devices: num_devices as usize,
            cache_max_bytes: cache_max_mb << 20,
            compile_timeout: std::time::Duration::from_secs(timeout),
        })
    }

    /// Checks the fields a program may have set against their documented ranges.
    pub fn validate(&self) -> Result<()> {
        settings::check_range(
            "CcConfig::num_devices",
            self.num_devices as u64,
            CPU_DEVICES_RANGE,
        )?;
        settings::check_range(
            "CcConfig::pool_guard_bytes",
            self.pool_guard_bytes as u64,
            POOL_GUARD_BYTES_RANGE,
        )?;
        if let Some(w) = self.workers_per_device {
            settings::check_range("CcConfig::workers_per_device", w as u64, CPU_WORKERS_RANGE)?;
        }
        let timeout = self.compile_timeout;
        if timeout.is_zero() || timeout.as_secs() > *CC_TIMEOUT_SECS_RANGE.end() {
            return Err(Error::InvalidSetting {
                setting: "CcConfig::compile_timeout".into(),
                value: format!("{timeout:?}"),
                expected: format!(
                    "more than zero and at most {} seconds",
                    CC_TIMEOUT_SECS_RANGE.end()
                ),
            });
        }
        Ok(())
    }
}

/// The `cc` backend (C) with the given settings, or [`Error::InvalidSetting`] if one is out of
/// range (see [`CcConfig::validate`]).
pub fn backend(config: CcConfig) -> Result<LoweredBackend> {
    compose(config, Arc::new(CKernels::default()))
}

/// The `cuda_emu` backend, running the CUDA renderer's kernels on the CPU (see the module
/// documentation): the settings of `config` but the compiler, `$CXX` (through `lookup`) or
/// `c++`, and its flags, [`EMULATION_FLAGS`] for a shared library. One worker per device: the
/// emulated blocks run on the caller's thread.
pub fn emulated_cuda_backend(
    mut config: CcConfig,
    lookup: settings::Lookup<'_>,
) -> Result<LoweredBackend> {
    config.compiler = settings::text(lookup, "CXX")?.unwrap_or_else(|| "c++".into());
    config.flags = EMULATION_FLAGS
        .iter()
        .chain(&["-fPIC", "-shared"])
        .map(|s| s.to_string())
        .collect();
    config.workers_per_device = Some(1);
    compose(config, Arc::new(EmulatedCudaKernels))
}

/// A CPU backend of the given renderer, compiled by `config`'s compiler, on a new CPU runtime
/// of `config`'s devices.
pub fn compose(config: CcConfig, kernels: Arc<dyn CpuKernels>) -> Result<LoweredBackend> {
    Ok(LoweredBackend::compose(
        kernels.name(),
        parts(config, kernels)?,
    ))
}

/// The four parts of a CPU backend of the given renderer (see [`compose`]), for callers that
/// replace one (a test recording a runtime's calls, say).
pub fn parts(config: CcConfig, kernels: Arc<dyn CpuKernels>) -> Result<BackendParts> {
    config.validate()?;
    let runtime = Arc::new(CpuRuntime::new(
        kernels.name(),
        &CpuRuntimeConfig {
            num_devices: config.num_devices,
            workers_per_device: config.workers_per_device.unwrap_or(1),
            pool_guard_bytes: config.pool_guard_bytes,
            use_host_memory: config.use_host_memory,
        },
    )?);
    Ok(BackendParts {
        devices: Arc::new(CpuDevices::new(
            config.clone(),
            kernels.clone(),
            runtime.clone(),
        )),
        compiler: Arc::new(CcCompiler::new(
            config,
            kernels.name(),
            kernels.convention(),
            runtime.workers().clone(),
        )),
        renderer: kernels,
        runtime,
    })
}

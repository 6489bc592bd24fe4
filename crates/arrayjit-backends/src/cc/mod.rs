//! The `cc` backend: renders C, compiles it with the system C compiler (`$CC` or `cc`) into a
//! shared library, loads it with `libloading`, and runs kernels on the CPU over [`CpuBuffer`]s.
//! Libraries are cached by a hash of (source, compiler, flags, CPU) in a private per-user folder.
//!
//! The same machinery runs the CUDA renderer's kernels on the CPU ([`CcDialect::CudaEmulated`],
//! the `cuda_emu` backend): compiled as C++ by `$CXX` or `c++` under an emulation of the CUDA
//! execution model ([`arrayjit_codegen::cuda_emulation`]), so the CUDA code path is checked
//! against the interpreter without a GPU. It is slow (threads are fibers on one core); it is a
//! checking tool, not a way to run fast.

mod batch;
mod compile;
mod schedule_store;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrayjit_codegen::cuda_emulation::{EMULATION_FLAGS, emulated_source, render_cuda_emulated};
use arrayjit_codegen::{CSyntax, KernelInterface, SourceKernel, render_program};
use arrayjit_ir::{Error, Optimized, Result, trace};

use crate::batch_name;

use crate::buffer::{CpuBuffer, MemoryCounter};
use crate::settings;
use crate::worker_pool::WorkerPool;
use crate::{BufferHandle, CompileOptions, CompiledBatch, DeviceBuffer, LoweredBackend, Queue};

pub use crate::compile_cache::default_cache_dir;
pub use batch::CcBatch;
use batch::{EmulatedDimsFn, EmulatedFn, Entry, KernelFn, with_host_locks};
pub use compile::{CompileStats, compile_stats};

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
    /// reference's `use_host_memory`, for unified memory like the CPU's.
    pub use_host_memory: bool,
}

/// The default C compiler flags.
///
/// `-O2 -ftree-vectorize` rather than `-O3`: the explicit `-ftree-vectorize` gives gcc's full
/// ("dynamic") vectorizer cost model (plain `-O2` uses the "very cheap" one, which leaves loops
/// whose trip count is not a multiple of the vector width scalar), without -O3's other loop
/// passes. Measured on a 2-core VM against `-O3` in alternating runs: every `bench --quick` row
/// as fast or faster (the 16M sum 1.3–1.6× at one thread), and the GPT step's compile 10–15%
/// shorter. clang takes the same flags.
pub const DEFAULT_CC_FLAGS: &[&str] = &[
    "-O2",
    "-ftree-vectorize",
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

/// What a [`CcBackend`] renders and compiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcDialect {
    /// C for the host compiler: the `cc` backend.
    C,
    /// The CUDA renderer's kernels compiled as C++ under an emulation of the CUDA execution
    /// model: the `cuda_emu` backend.
    CudaEmulated,
}

/// The C compiler backend.
pub struct CcBackend {
    config: CcConfig,
    dialect: CcDialect,
    workers: Arc<Vec<WorkerPool>>,
    counters: Vec<Arc<MemoryCounter>>,
    pools: Vec<Mutex<BTreeMap<usize, Arc<CpuBuffer>>>>,
    syntax: CSyntax,
}

impl fmt::Debug for CcBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CcBackend({:?})", self.config)
    }
}

impl CcBackend {
    /// A backend with the given settings, or [`Error::InvalidSetting`] if one is out of range
    /// (see [`CcConfig::validate`]).
    pub fn new(config: CcConfig) -> Result<CcBackend> {
        config.validate()?;
        let counters = (0..config.num_devices)
            .map(|_| Arc::new(MemoryCounter::default()))
            .collect();
        let pools = (0..config.num_devices)
            .map(|_| Mutex::new(BTreeMap::new()))
            .collect();
        let workers = (0..config.num_devices)
            .map(|d| {
                WorkerPool::new(
                    config.workers_per_device.unwrap_or(1),
                    &format!("arrayjit cpu {d}"),
                )
                .map_err(|e| Error::Runtime {
                    stream: format!("cpu device {d}"),
                    detail: format!("cannot start the device's worker threads: {e}"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CcBackend {
            workers: Arc::new(workers),
            config,
            dialect: CcDialect::C,
            counters,
            pools,
            syntax: CSyntax::c(),
        })
    }

    /// A backend running the CUDA renderer's kernels on the CPU (see the module
    /// documentation): the settings of `config` but the compiler, `$CXX` (through `lookup`) or
    /// `c++`, and its flags, [`EMULATION_FLAGS`] for a shared library. One worker per device:
    /// the emulated blocks run on the caller's thread.
    pub fn cuda_emulated(mut config: CcConfig, lookup: settings::Lookup<'_>) -> Result<CcBackend> {
        config.compiler = settings::text(lookup, "CXX")?.unwrap_or_else(|| "c++".into());
        config.flags = EMULATION_FLAGS
            .iter()
            .chain(&["-fPIC", "-shared"])
            .map(|s| s.to_string())
            .collect();
        config.workers_per_device = Some(1);
        let mut backend = CcBackend::new(config)?;
        backend.dialect = CcDialect::CudaEmulated;
        Ok(backend)
    }

    /// What it renders and compiles.
    pub fn dialect(&self) -> CcDialect {
        self.dialect
    }

    /// The settings.
    pub fn config(&self) -> &CcConfig {
        &self.config
    }

    fn cpu<'a>(&self, b: &'a BufferHandle) -> Result<&'a CpuBuffer> {
        b.as_any().downcast_ref::<CpuBuffer>().ok_or_else(|| {
            Error::invalid(format!("buffer {b:?} does not belong to the cc backend"))
        })
    }

    fn pool(&self, device: usize, pool_id: usize) -> Result<Arc<CpuBuffer>> {
        self.device_check(device)?;
        self.pools[device]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pool_id)
            .cloned()
            .ok_or_else(|| Error::invalid(format!("device {device} has no pool {pool_id}")))
    }

    fn device_check(&self, device: usize) -> Result<()> {
        if device < self.counters.len() {
            Ok(())
        } else {
            Err(Error::NoSuchDevice {
                backend: "cc".into(),
                ordinal: device,
                num_devices: self.counters.len(),
            })
        }
    }
}

fn size_mismatch(what: &str, a: usize, b: usize) -> Error {
    Error::ShapeMismatch {
        op: what.into(),
        detail: format!("the buffer holds {a} bytes but {b} bytes were given"),
    }
}

impl LoweredBackend for CcBackend {
    fn name(&self) -> &str {
        match self.dialect {
            CcDialect::C => "cc",
            CcDialect::CudaEmulated => "cuda_emu",
        }
    }

    /// The host CPU (detected once per process) with the device's worker threads.
    fn device_info(&self, device: usize) -> Result<crate::DeviceInfo> {
        static CPU: std::sync::OnceLock<crate::device_info::CpuInfo> = std::sync::OnceLock::new();
        self.device_check(device)?;
        let cpu = CPU.get_or_init(crate::device_info::CpuInfo::detect);
        let workers = self.workers.get(device).map_or(1, WorkerPool::workers);
        let mut info = crate::DeviceInfo::cpu(cpu, workers);
        if self.dialect == CcDialect::CudaEmulated {
            // The CUDA code it runs may assume the block limits the emulation keeps to.
            use arrayjit_codegen::cuda_emulation as emu;
            info.name = format!("{} running emulated CUDA blocks", info.name);
            info.max_local_size = emu::EMULATED_MAX_BLOCK;
            info.max_local_invocations = emu::EMULATED_MAX_THREADS;
            info.max_shared_bytes = emu::EMULATED_SHARED_BYTES;
            info.subgroup_size = emu::EMULATED_WARP_SIZE;
        }
        Ok(info)
    }

    /// The compiler, its version and flags, the CPU's model and features, and the worker count.
    fn machine_identity(&self) -> String {
        format!(
            "cc `{}` ({}) flags {:?} on {} with {} worker(s)",
            self.config.compiler,
            compile::compiler_identity(&self.config.compiler, self.config.compile_timeout)
                .unwrap_or_default(),
            self.config.flags,
            compile::cpu_identity(),
            self.workers.first().map_or(1, WorkerPool::workers)
        )
    }

    fn load_schedule_choice(&self, key: &str) -> std::result::Result<Option<String>, String> {
        match &self.config.cache_dir {
            Some(dir) => schedule_store::load(&schedule_store::folder(dir), key),
            None => Ok(None),
        }
    }

    fn store_schedule_choice(&self, key: &str, choice: &str) -> Result<bool> {
        match &self.config.cache_dir {
            Some(dir) => {
                schedule_store::store(&schedule_store::folder(dir), key, choice).map(|()| true)
            }
            None => Ok(false),
        }
    }

    fn check_available(&self) -> Result<()> {
        let found = compile::compiler_identity(&self.config.compiler, self.config.compile_timeout);
        match (found, self.dialect) {
            (Ok(_), _) => Ok(()),
            (Err(e), CcDialect::C) => Err(e),
            (Err(Error::BackendUnavailable { reason, .. }), CcDialect::CudaEmulated) => {
                Err(Error::BackendUnavailable {
                    backend: "cuda_emu".into(),
                    reason,
                    how_to_enable: format!(
                        "install a C++ compiler (e.g. `apt-get install g++`) or point CXX at one \
                         (the compiler is `{}`)",
                        self.config.compiler
                    ),
                })
            }
            (Err(e), CcDialect::CudaEmulated) => Err(e),
        }
    }

    fn num_devices(&self) -> usize {
        self.counters.len()
    }

    fn host_memory_buffer(
        &self,
        device: usize,
        tn: &arrayjit_ir::Tnode,
    ) -> Result<Option<BufferHandle>> {
        self.device_check(device)?;
        if !self.config.use_host_memory {
            return Ok(None);
        }
        Ok(Some(Arc::new(CpuBuffer::host_alias(tn, device)?)))
    }

    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        self.device_check(device)?;
        Ok(Arc::new(CpuBuffer::zeroed(
            size_in_bytes,
            device,
            self.counters[device].clone(),
        )?))
    }

    unsafe fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], _: Queue<'_>) -> Result<()> {
        let d = self.cpu(dst)?;
        if d.size_in_bytes() != src.len() {
            return Err(size_mismatch(
                "copy from host",
                d.size_in_bytes(),
                src.len(),
            ));
        }
        // SAFETY: the runtime schedules copies and kernels touching an array in an order that
        // never overlaps a write with another access (the `host_sync` rules).
        unsafe { d.write(src) }
    }

    unsafe fn copy_to_host(&self, src: &BufferHandle, dst: &mut [u8], _: Queue<'_>) -> Result<()> {
        let s = self.cpu(src)?;
        if s.size_in_bytes() != dst.len() {
            return Err(size_mismatch("copy to host", s.size_in_bytes(), dst.len()));
        }
        // SAFETY: as in `copy_from_host`: no write of `src` runs meanwhile (a host array in
        // place is read under its node's host lock, so the host does not write it either).
        with_host_locks(&[s], || dst.copy_from_slice(unsafe { s.bytes() }));
        Ok(())
    }

    unsafe fn copy_from_host_range(
        &self,
        dst: &BufferHandle,
        offset: usize,
        src: &[u8],
        _: Queue<'_>,
    ) -> Result<()> {
        // SAFETY: as in `copy_from_host`.
        unsafe { self.cpu(dst)?.write_at(offset, src) }
    }

    unsafe fn copy_to_host_range(
        &self,
        src: &BufferHandle,
        offset: usize,
        dst: &mut [u8],
        _: Queue<'_>,
    ) -> Result<()> {
        let end = crate::byte_range_end(src, offset, dst.len())?;
        let s = self.cpu(src)?;
        // SAFETY: as in `copy_to_host`.
        with_host_locks(&[s], || {
            dst.copy_from_slice(&unsafe { s.bytes() }[offset..end])
        });
        Ok(())
    }

    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        _: Queue<'_>,
    ) -> Result<()> {
        let (d, s) = (self.cpu(dst)?, self.cpu(src)?);
        if d.size_in_bytes() != s.size_in_bytes() {
            return Err(size_mismatch(
                "device to device",
                d.size_in_bytes(),
                s.size_in_bytes(),
            ));
        }
        if std::ptr::eq(d.as_ptr(), s.as_ptr()) {
            // The same memory (one node's host array used in place by both): nothing to copy.
            return Ok(());
        }
        // SAFETY: as in `copy_from_host`; `d` and `s` are distinct arrays (views of one pool
        // never overlap: the planner places live arrays apart); a host array in place is read
        // under its node's host lock.
        with_host_locks(&[s], || unsafe { d.write(s.bytes()) })?;
        Ok(())
    }

    fn used_memory(&self, device: usize) -> usize {
        self.counters.get(device).map_or(0, |c| c.get())
    }

    fn alloc_pool(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
    ) -> Result<()> {
        self.device_check(device)?;
        if !alignment.is_power_of_two() {
            return Err(Error::invalid(format!(
                "pool alignment {alignment} is not a power of two"
            )));
        }
        let mut pools = self.pools[device].lock().unwrap_or_else(|e| e.into_inner());
        if pools.contains_key(&pool_id) {
            return Err(Error::invalid(format!(
                "device {device} already has a pool {pool_id}"
            )));
        }
        let buffer = CpuBuffer::zeroed_aligned(
            size_in_bytes,
            alignment,
            device,
            self.counters[device].clone(),
        )?;
        pools.insert(pool_id, Arc::new(buffer));
        Ok(())
    }

    fn pool_guard_bytes(&self) -> usize {
        self.config.pool_guard_bytes
    }

    fn guard_pool(&self, device: usize, pool_id: usize, unused: &[(usize, usize)]) -> Result<bool> {
        let pool = self.pool(device, pool_id)?;
        let mut checked = false;
        for &(offset, len) in unused {
            if offset
                .checked_add(len)
                .is_none_or(|end| end > pool.size_in_bytes())
            {
                return Err(Error::invalid(format!(
                    "guard range {offset}+{len} lies outside pool {pool_id} of {} bytes",
                    pool.size_in_bytes()
                )));
            }
            // SAFETY: the range lies inside the pool's allocation (checked above), and no array
            // of the plan uses it, so nothing accesses it legitimately; the pool is unpoisoned
            // before it is freed (`CpuBuffer`'s drop).
            checked |= unsafe { crate::sanitizer::poison(pool.as_ptr().add(offset), len) };
        }
        Ok(checked)
    }

    fn free_pool(&self, device: usize, pool_id: usize) -> Result<()> {
        self.device_check(device)?;
        self.pools[device]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pool_id)
            .map(|_| ())
            .ok_or_else(|| Error::invalid(format!("device {device} has no pool {pool_id} to free")))
    }

    unsafe fn memset_zero(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<()> {
        // SAFETY: the runtime zeroes a pool range only when no work uses it.
        unsafe {
            self.pool(device, pool_id)?
                .zero_range(offset, size_in_bytes)
        }
    }

    fn pool_view(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<BufferHandle> {
        let pool = self.pool(device, pool_id)?;
        Ok(Arc::new(CpuBuffer::view(&pool, offset, size_in_bytes)?))
    }

    fn pools(&self, device: usize) -> Vec<(usize, usize)> {
        self.pools.get(device).map_or(vec![], |p| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(id, b)| (*id, b.size_in_bytes()))
                .collect()
        })
    }

    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        Ok(match self.dialect {
            CcDialect::C => render_program(&self.syntax, routines)?.full_source(),
            CcDialect::CudaEmulated => render_cuda_emulated(routines)?.source,
        })
    }

    fn compile_batch(&self, routines: &[&Optimized]) -> Result<Arc<dyn CompiledBatch>> {
        self.compile_with_config(routines, &self.config)
    }

    /// CUDA for `cuda_emu`; none for C.
    fn gpu_dialect(&self) -> Option<&'static arrayjit_codegen::gpu_dialect::GpuDialect> {
        (self.dialect == CcDialect::CudaEmulated).then_some(&arrayjit_codegen::gpu_dialect::CUDA)
    }

    /// The host compiler's flags (`CcConfig::flags`).
    fn default_compile_options(&self) -> CompileOptions {
        CompileOptions {
            flags: self.config.flags.clone(),
        }
    }

    /// Compiles with the given host compiler flags instead of `CcConfig::flags`: they must
    /// still make a loadable shared library (`-shared` and `-fPIC`), else nothing is compiled.
    fn compile_batch_with(
        &self,
        routines: &[&Optimized],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        if let Some(missing) = ["-shared", "-fPIC"]
            .into_iter()
            .find(|f| !options.flags.iter().any(|g| g == f))
        {
            return Err(Error::invalid(format!(
                "compile options {:?} lack {missing}: the {} backend loads a shared library, so \
                 its flags must keep -shared and -fPIC (start from default_compile_options)",
                options.flags,
                self.name()
            )));
        }
        let config = CcConfig {
            flags: options.flags.clone(),
            ..self.config.clone()
        };
        self.compile_with_config(routines, &config)
    }

    unsafe fn compile_source(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<Arc<dyn CompiledBatch>> {
        let interfaces: Vec<KernelInterface> =
            kernels.iter().map(|k| k.interface.clone()).collect();
        let source = match self.dialect {
            CcDialect::C => source.to_string(),
            // The CUDA kernels, renamed, with entry points that launch them.
            CcDialect::CudaEmulated => emulated_source(source, kernels)?,
        };
        let units = [compile::Unit {
            suffix: "",
            source: &source,
        }];
        // SAFETY: the caller's source exports each kernel with the dialect's signature (this
        // method's safety contract); for emulated CUDA, the entry points written above do.
        unsafe { self.load_batch(&self.config, &units, interfaces, source.clone(), true) }
    }

    fn debug_info(&self) -> String {
        format!(
            "{} backend: compiler `{}` ({}), flags {:?}, cache {}, {} device(s) of {} worker(s)",
            self.name(),
            self.config.compiler,
            compile::compiler_identity(&self.config.compiler, self.config.compile_timeout)
                .unwrap_or_else(|e| e.to_string()),
            self.config.flags,
            self.config
                .cache_dir
                .as_ref()
                .map_or("disabled".into(), |p| p.display().to_string()),
            self.counters.len(),
            self.workers.first().map_or(1, WorkerPool::workers)
        )
    }
}

impl CcBackend {
    /// Renders routines in the backend's dialect, compiles them with `config` (its flags) and
    /// loads them.
    fn compile_with_config(
        &self,
        routines: &[&Optimized],
        config: &CcConfig,
    ) -> Result<Arc<dyn CompiledBatch>> {
        if self.dialect == CcDialect::CudaEmulated {
            return self.compile_emulated(routines, config);
        }
        let program = {
            let _render = trace::compile_phase("render", &batch_name(routines));
            render_program(&self.syntax, routines)?
        };
        let suffixes: Vec<String> = program
            .units
            .iter()
            .map(|u| format!("-{}", u.name))
            .collect();
        let units: Vec<compile::Unit> = std::iter::once(compile::Unit {
            suffix: "",
            source: &program.source,
        })
        .chain(
            program
                .units
                .iter()
                .zip(&suffixes)
                .map(|(u, suffix)| compile::Unit {
                    suffix,
                    source: &u.source,
                }),
        )
        .collect();
        let source = program.full_source();
        // SAFETY: every C kernel arrayjit generates has the `KernelFn` signature.
        unsafe { self.load_batch(config, &units, program.kernels, source, false) }
    }

    /// Renders the CUDA kernels with their emulation, compiles them as C++ and loads them.
    fn compile_emulated(
        &self,
        routines: &[&Optimized],
        config: &CcConfig,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let program = {
            let _render = trace::compile_phase("render", &batch_name(routines));
            render_cuda_emulated(routines)?
        };
        let units = [compile::Unit {
            suffix: "",
            source: &program.source,
        }];
        let kernels = program
            .kernels
            .iter()
            .map(|k| k.interface.clone())
            .collect();
        // SAFETY: every emulated entry point has the `EmulatedFn` signature
        // (`arrayjit_codegen::cuda_emulation`).
        unsafe { self.load_batch(config, &units, kernels, program.source.clone(), false) }
    }

    /// Compiles `units` into one library, loads it, and finds every kernel by its symbol with
    /// the dialect's signature.
    ///
    /// # Safety
    /// Every kernel's symbol must name a function of the dialect's signature: true of what the
    /// renderers generate, the caller's contract for source given directly.
    unsafe fn load_batch(
        &self,
        config: &CcConfig,
        units: &[compile::Unit],
        kernels: Vec<KernelInterface>,
        source: String,
        source_kernels: bool,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        let (library, cache_hit) = compile::compile_and_load(config, units, &names.join("+"))?;
        // Hand-written emulated CUDA also exports each kernel with its launch taken at call
        // time (`emulated_source`).
        let dims_entries = kernels
            .iter()
            .map(|k| {
                if !(source_kernels && self.dialect == CcDialect::CudaEmulated) {
                    return Ok(None);
                }
                let symbol = format!(
                    "{}{}",
                    k.symbol,
                    arrayjit_codegen::cuda_emulation::DIMS_SUFFIX
                );
                // SAFETY: `emulated_source` wrote this entry point with that signature.
                Ok(Some(unsafe { library.entry::<EmulatedDimsFn>(&symbol)? }))
            })
            .collect::<Result<Vec<_>>>()?;
        let entries = kernels
            .iter()
            .map(|k| {
                // SAFETY: the symbol has the dialect's signature (this function's contract).
                Ok(match self.dialect {
                    CcDialect::C => Entry::C(unsafe { library.entry::<KernelFn>(&k.symbol)? }),
                    CcDialect::CudaEmulated => {
                        Entry::Emulated(unsafe { library.entry::<EmulatedFn>(&k.symbol)? })
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(CcBatch {
            kernels,
            source,
            entries,
            dims_entries,
            workers: self.workers.clone(),
            cache_hit,
            _library: library,
        }))
    }
}

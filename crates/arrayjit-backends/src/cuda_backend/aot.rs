//! CUDA compiled ahead of time: a program's kernels split into units ([`CudaProgram::units`],
//! as many as [`units_for`] says: a function of the program, never of the machine) that NVRTC
//! compiles to CUBIN for one real architecture in parallel, on all cores, each cached on its own ([`PtxCache::compile_cubin`]). The `cuda` backend loads such units
//! (nothing is JIT-compiled by the driver), and [`compile_ahead_of_time`] makes them for a
//! named architecture on any machine with NVRTC, no GPU needed: CI checks every kernel that
//! way, and anyone can measure a routine's compile time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrayjit_codegen::cuda::{CudaProgram, render_cuda};
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use super::ptx::{PtxCache, PtxOrigin, default_nvrtc_flags, process_cache};

/// One unit of a program compiled to CUBIN.
#[derive(Clone, Debug)]
pub struct CubinUnit {
    /// The machine code.
    pub cubin: Vec<u8>,
    /// The kernels it defines.
    pub symbols: Vec<String>,
    /// Where it came from (NVRTC now, or a cache).
    pub origin: PtxOrigin,
}

/// About how many bytes of CUDA C (besides the prelude) one unit holds.
pub const UNIT_SOURCE_BYTES: usize = 24 * 1024;

/// The most units a program is split into.
pub const MAX_UNITS: usize = 64;

/// How many units `program` is split into: one per [`UNIT_SOURCE_BYTES`] of its functions, at
/// least 1 and at most [`MAX_UNITS`], or `ARRAYJIT_CUDA_UNITS` where set (1 to 64; set it alike
/// on the machine that builds a cache and the one that reads it).
///
/// The split is a function of the program alone, never of the machine: each unit's source is
/// in its cache key, so CUBIN compiled ahead of time on a 2-core build machine is a hit on a
/// 16-core GPU machine. The cores only decide how many units compile at once.
pub fn units_for(program: &CudaProgram) -> Result<usize> {
    let set = crate::settings::integer(
        &crate::settings::process_env,
        "ARRAYJIT_CUDA_UNITS",
        1..=MAX_UNITS as u64,
        0,
    )?;
    if set > 0 {
        return Ok(set as usize);
    }
    let total: usize = program.functions.iter().map(String::len).sum();
    Ok(total.div_ceil(UNIT_SOURCE_BYTES).clamp(1, MAX_UNITS))
}

/// Threads that compile units at once by default: the machine's cores.
pub fn compile_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Compiles a program's `units` units to CUBIN for `arch` with `flags`, on up to `workers`
/// threads, through `cache`; the units in order. The first failure is returned (every unit is
/// tried). The workers change how long it takes, never what is compiled or its cache keys.
pub fn compile_units(
    program: &CudaProgram,
    arch: &str,
    flags: &[String],
    units: usize,
    workers: usize,
    cache: &PtxCache,
) -> Result<Vec<CubinUnit>> {
    let parts = program.units(units);
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<CubinUnit>>>> =
        Mutex::new((0..parts.len()).map(|_| None).collect());
    let workers = workers.min(parts.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((source, symbols)) = parts.get(i) else {
                        break;
                    };
                    let unit = cache
                        .compile_cubin(source, arch, flags)
                        .map(|(cubin, origin)| CubinUnit {
                            cubin,
                            symbols: symbols.clone(),
                            origin,
                        });
                    done.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(unit);
                }
            });
        }
    });
    done.into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|u| {
            u.unwrap_or_else(|| {
                Err(arrayjit_ir::Error::invalid(
                    "a CUDA unit was left uncompiled (a compile thread stopped)",
                ))
            })
        })
        .collect()
}

/// Routines rendered and compiled to CUBIN for a named architecture, with how long each
/// phase took.
#[derive(Clone, Debug)]
pub struct CubinProgram {
    /// The architecture, e.g. `sm_90`.
    pub arch: String,
    /// The rendered program.
    pub program: CudaProgram,
    /// Its units, compiled.
    pub units: Vec<CubinUnit>,
    /// Time spent rendering CUDA C.
    pub render: Duration,
    /// Time spent compiling (or reading from the cache) every unit.
    pub compile: Duration,
}

impl CubinProgram {
    /// Units that NVRTC compiled now (the others came from a cache).
    pub fn compiled_units(&self) -> usize {
        self.units
            .iter()
            .filter(|u| u.origin == PtxOrigin::Compiled)
            .count()
    }

    /// Bytes of CUBIN in all.
    pub fn cubin_bytes(&self) -> usize {
        self.units.iter().map(|u| u.cubin.len()).sum()
    }
}

/// Renders routines (optimized for the target's GPU limits, e.g. `OptimizeSettings::for_gpu`
/// of a `DeviceModel`) as CUDA C and compiles them to CUBIN for `arch` (`sm_80`, `sm_90`) with
/// the backend's NVRTC options, in [`units_for`] units (the split the backend loads), through
/// the process's cache. Needs NVRTC, no GPU.
pub fn compile_ahead_of_time(routines: &[&Optimized], arch: &str) -> Result<CubinProgram> {
    compile_ahead_of_time_with(routines, arch, None, process_cache())
}

/// [`compile_ahead_of_time`] through `cache`, in `units` units (`None`: [`units_for`]; another
/// count makes units the backend will not look up).
pub fn compile_ahead_of_time_with(
    routines: &[&Optimized],
    arch: &str,
    units: Option<usize>,
    cache: &PtxCache,
) -> Result<CubinProgram> {
    // `sm_90` compiles as `sm_90a`, whose warpgroup products its kernels may use.
    let arch = super::feature_arch(arch);
    let started = Instant::now();
    let program = render_cuda(routines)?;
    let render = started.elapsed();
    let units = match units {
        Some(n) => n,
        None => units_for(&program)?,
    };
    let started = Instant::now();
    let units = compile_units(
        &program,
        &arch,
        &default_nvrtc_flags(),
        units,
        compile_workers(),
        cache,
    )?;
    Ok(CubinProgram {
        arch,
        program,
        units,
        render,
        compile: started.elapsed(),
    })
}

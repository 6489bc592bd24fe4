//! CUDA compiled ahead of time: a program's kernels split into units ([`CudaProgram::units`])
//! that NVRTC compiles to CUBIN for one real architecture in parallel, on all cores, each
//! cached on its own ([`PtxCache::compile_cubin`]). The `cuda` backend loads such units
//! (nothing is JIT-compiled by the driver), and [`compile_ahead_of_time`] makes them for a
//! named architecture on any machine with NVRTC, no GPU needed: CI checks every kernel that
//! way, and anyone can measure a routine's compile time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrayjit_codegen::cuda::{CudaProgram, render_cuda};
use arrayjit_ir::{Optimized, Result};

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

/// Units a program is split into by default: two per core (at least 1), so that cores that
/// finish early take more.
pub fn default_units() -> usize {
    2 * std::thread::available_parallelism().map_or(1, usize::from)
}

/// Compiles a program's units to CUBIN for `arch` with `flags`, on up to as many threads as
/// the machine has cores, through `cache`; the units in order. The first failure is returned
/// (every unit is tried).
pub fn compile_units(
    program: &CudaProgram,
    arch: &str,
    flags: &[String],
    units: usize,
    cache: &PtxCache,
) -> Result<Vec<CubinUnit>> {
    let parts = program.units(units);
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<CubinUnit>>>> =
        Mutex::new((0..parts.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(parts.len())
        .max(1);
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
/// the backend's NVRTC options, in [`default_units`] units, through the process's cache. Needs
/// NVRTC, no GPU.
pub fn compile_ahead_of_time(routines: &[&Optimized], arch: &str) -> Result<CubinProgram> {
    compile_ahead_of_time_with(routines, arch, default_units(), process_cache())
}

/// [`compile_ahead_of_time`] in `units` units through `cache`.
pub fn compile_ahead_of_time_with(
    routines: &[&Optimized],
    arch: &str,
    units: usize,
    cache: &PtxCache,
) -> Result<CubinProgram> {
    // `sm_90` compiles as `sm_90a`, whose warpgroup products its kernels may use.
    let arch = super::feature_arch(arch);
    let started = Instant::now();
    let program = render_cuda(routines)?;
    let render = started.elapsed();
    let started = Instant::now();
    let units = compile_units(&program, &arch, &default_nvrtc_flags(), units, cache)?;
    Ok(CubinProgram {
        arch,
        program,
        units,
        render,
        compile: started.elapsed(),
    })
}

//! The backends this build has: the one place that reads the GPU backends' cargo features
//! (`cuda`, `wgpu`, defined in this crate's manifest and forwarded unchanged by the facade,
//! the command-line tool and the Python module). Each GPU backend has a constructor here that
//! always exists: the backend when its feature is on, else the [`missing`](crate::missing)
//! placeholder saying how to build it.

use std::path::Path;
use std::time::Duration;

use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use crate::lowered_backend::LoweredBackend;

/// Whether this build has the `cuda` backend (cargo feature `cuda`).
pub const CUDA: bool = cfg!(feature = "cuda");

/// Whether this build has the `wgpu` backend (cargo feature `wgpu`).
pub const WGPU: bool = cfg!(feature = "wgpu");

/// The cargo features that choose backends, in the order their backends are listed.
pub const BACKEND_FEATURES: &[&str] = &["cuda", "wgpu"];

/// The `cuda` backend, or its placeholder in a build without it.
pub fn cuda() -> LoweredBackend {
    #[cfg(feature = "cuda")]
    {
        crate::cuda_backend::backend()
    }
    #[cfg(not(feature = "cuda"))]
    {
        crate::missing::backend(
            "cuda",
            "this build of arrayjit has no CUDA backend",
            "build with the cargo feature `cuda` (on by default in the `arrayjit` crate) and \
             install the NVIDIA driver and NVRTC",
        )
    }
}

/// The `wgpu` backend, or its placeholder in a build without it.
pub fn wgpu() -> LoweredBackend {
    #[cfg(feature = "wgpu")]
    {
        crate::wgpu_backend::backend()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        crate::missing::backend(
            "wgpu",
            "this build of arrayjit has no wgpu backend",
            "build with the cargo feature `wgpu` (e.g. `cargo run --features wgpu`) and install \
             a Vulkan driver",
        )
    }
}

/// Routines compiled to CUBIN ahead of time ([`cuda_compile_ahead_of_time`]): what it took and
/// made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CubinSummary {
    /// Time spent rendering CUDA C.
    pub render: Duration,
    /// Time spent compiling (or reading from the cache) every unit.
    pub compile: Duration,
    /// Units the program was split into (the backend's split).
    pub units: usize,
    /// Units NVRTC compiled now (the others came from the cache).
    pub compiled_units: usize,
    /// Bytes of CUBIN in all.
    pub cubin_bytes: usize,
    /// Kernel functions.
    pub kernels: usize,
    /// Bytes of CUDA C.
    pub source_bytes: usize,
}

/// Renders `routines` (optimized for a GPU model's limits) as CUDA C and compiles them to CUBIN
/// for `arch` (`sm_80`, `sm_90`) with NVRTC, no GPU needed, through a compile cache over
/// `cache_dir` (the folder `ARRAYJIT_CACHE_DIR` names for the `cuda` backend; a new cache each
/// call, as a later process finds it). In a build without the `cuda` feature, or without
/// NVRTC, a typed `BackendUnavailable` saying what to do.
pub fn cuda_compile_ahead_of_time(
    routines: &[&Optimized],
    arch: &str,
    cache_dir: &Path,
) -> Result<CubinSummary> {
    #[cfg(feature = "cuda")]
    {
        use crate::cuda_backend::{PtxCache, aot};
        let p =
            aot::compile_ahead_of_time_with(routines, arch, None, &PtxCache::new(Some(cache_dir)))?;
        Ok(CubinSummary {
            render: p.render,
            compile: p.compile,
            units: p.units.len(),
            compiled_units: p.compiled_units(),
            cubin_bytes: p.cubin_bytes(),
            kernels: p.program.functions.len(),
            source_bytes: p.program.source.len(),
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (routines, arch, cache_dir);
        Err(arrayjit_ir::Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "this build of arrayjit has no CUDA backend".into(),
            how_to_enable: "build with the cargo feature `cuda` (on by default in the `arrayjit` \
                            crate)"
                .into(),
        })
    }
}

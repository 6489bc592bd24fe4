//! The backends this build has: the one place that reads the GPU backends' cargo features
//! (`cuda`, `wgpu`, defined in this crate's manifest and forwarded unchanged by the facade,
//! the command-line tool and the Python module). Each GPU backend has a constructor here that
//! always exists: the backend when its feature is on, else the [`missing`](crate::missing)
//! placeholder saying how to build it.

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

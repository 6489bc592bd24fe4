//! The renderer part of a backend ([`Renderer`], the reference's `Renderer`): the source a
//! backend makes of optimized routines (C, CUDA C, WGSL), and the device strings a GPU renderer
//! prints.

use std::fmt::Debug;

use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

/// How a backend prints routines. One of the four parts a
/// [`LoweredBackend`](crate::lowered_backend::LoweredBackend) is composed of; its compiler
/// renders through the same renderer, so [`Renderer::render_source`] is exactly what is
/// compiled.
pub trait Renderer: Send + Sync + Debug {
    /// The source the backend's compiler would compile for these routines, without compiling
    /// it: equal sources make equal kernels.
    fn render_source(&self, routines: &[&Optimized]) -> Result<String>;
    /// The GPU dialect the kernels are printed in (`cuda`, `cuda_emu`: CUDA; `wgpu`: WGSL),
    /// whose device strings the renderer uses (the reference's
    /// `Device_info.renderer_float4_str`, `renderer_smem_prefix`, `renderer_barrier_str`);
    /// `None` (the default) for C on CPUs.
    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        None
    }
}

/// The renderer of a backend without one of its own: the routines' loop code, one per line.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopCodeRenderer;

impl Renderer for LoopCodeRenderer {
    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        Ok(routines.iter().map(|r| format!("{}\n", r.code)).collect())
    }
}

//! The renderer part of the `cuda` backend ([`CudaRenderer`]): routines to CUDA C
//! ([`arrayjit_codegen::cuda`]).

use arrayjit_codegen::cuda::render_cuda;
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use crate::renderer::Renderer;

/// CUDA C for NVRTC.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaRenderer;

impl Renderer for CudaRenderer {
    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        Ok(render_cuda(routines)?.source)
    }

    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::CUDA)
    }
}

//! The renderer part of the `cuda` backend ([`CudaRenderer`]): routines to CUDA C
//! ([`arrayjit_codegen::cuda`]), or source given directly, as the program ([`CudaSource`]) its
//! compiler takes.

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::cuda::{CudaProgram, render_cuda};
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use crate::lowered_backend::batch_name;
use crate::renderer::{RenderedProgram, Renderer};

/// The program the `cuda` renderer gives NVRTC (a [`RenderedProgram`]'s on `cuda`).
#[derive(Debug)]
pub enum CudaSource {
    /// Routines rendered: their kernels, passes and launches.
    Rendered(CudaProgram),
    /// CUDA C given directly (the program's source) with its kernels (the compiler checks
    /// their launches against the device).
    Given(Vec<SourceKernel>),
}

/// CUDA C for NVRTC.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaRenderer;

impl Renderer for CudaRenderer {
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let program = render_cuda(routines)?;
        Ok(RenderedProgram::new(
            super::NAME,
            batch_name(routines),
            program.source.clone(),
            CudaSource::Rendered(program),
        ))
    }

    unsafe fn render_given(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<RenderedProgram> {
        Ok(RenderedProgram::given(
            super::NAME,
            source.to_string(),
            kernels,
            CudaSource::Given,
        ))
    }

    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::CUDA)
    }
}

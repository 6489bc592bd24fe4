//! The renderer part of a backend ([`Renderer`], the reference's `Renderer`): the program a
//! backend makes of optimized routines (C, CUDA C, WGSL) or of source a caller supplies, as a
//! [`RenderedProgram`] its compiler takes; and the device strings a GPU renderer prints.
//!
//! Rendering is the first of the three steps every backend takes, each visible at the seam:
//! the renderer makes a [`RenderedProgram`], the compiler
//! ([`Compiler::compile`](crate::compiler::Compiler::compile)) turns that program and nothing
//! else into a [`CompiledBatch`](crate::compiled_batch::CompiledBatch), and a context links
//! the batch to its arrays (`arrayjit_runtime::Context::link`). No compiler renders.

use std::any::Any;
use std::fmt::{self, Debug};

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_ir::{Error, Result};
use arrayjit_opt::Optimized;

/// Routines, or source a caller supplied, rendered for one backend's compiler: the source as
/// listed (equal sources make equal kernels) and the program in the form that backend's
/// compiler takes (its kernels, their interfaces and launches, the units of a library). Made
/// by a [`Renderer`], consumed by the same backend's
/// [`Compiler::compile`](crate::compiler::Compiler::compile).
pub struct RenderedProgram {
    backend: String,
    name: String,
    source: String,
    program: Box<dyn Any + Send>,
}

impl RenderedProgram {
    /// The program `program` that backend `backend`'s renderer made of the routines (or
    /// kernels) named `name`, whose whole source is `source`.
    pub fn new<P: Any + Send>(
        backend: impl Into<String>,
        name: impl Into<String>,
        source: String,
        program: P,
    ) -> RenderedProgram {
        RenderedProgram {
            backend: backend.into(),
            name: name.into(),
            source,
            program: Box::new(program),
        }
    }

    /// Source given directly (with its `kernels`) as backend `backend`'s program, which
    /// `program` makes of the kernels (the source comes with it: [`RenderedProgram::into_parts`]);
    /// named after the kernels.
    pub fn given<P: Any + Send>(
        backend: &str,
        source: String,
        kernels: &[SourceKernel],
        program: impl FnOnce(Vec<SourceKernel>) -> P,
    ) -> RenderedProgram {
        let names: Vec<&str> = kernels.iter().map(|k| k.interface.name.as_str()).collect();
        let name = names.join("+");
        RenderedProgram::new(backend, name, source, program(kernels.to_vec()))
    }

    /// The backend whose renderer made it.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// What it was made of: the routines' names joined by `+` ([`batch_name`]), or the
    /// kernels' of source given directly.
    ///
    /// [`batch_name`]: crate::lowered_backend::batch_name
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All its source, as listed (`ARRAYJIT_DEBUG=3`, the schedule search's comparisons).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its source and the program in the form `compiler`'s backend takes (`P`), or
    /// [`Error::Unsupported`] when another backend's renderer made it.
    pub fn into_parts<P: Any>(self, compiler: &str) -> Result<(String, P)> {
        let RenderedProgram {
            backend,
            source,
            program,
            ..
        } = self;
        match program.downcast::<P>() {
            Ok(p) => Ok((source, *p)),
            Err(_) => Err(Error::Unsupported {
                backend: compiler.into(),
                what: format!("a program rendered by the {backend} backend's renderer"),
                instead: format!("compile what the {compiler} backend's own renderer renders"),
            }),
        }
    }
}

impl Debug for RenderedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenderedProgram")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("source_bytes", &self.source.len())
            .finish_non_exhaustive()
    }
}

/// How a backend prints routines. One of the four parts a
/// [`LoweredBackend`](crate::lowered_backend::LoweredBackend) is composed of; what it renders
/// is exactly what the backend's compiler compiles.
pub trait Renderer: Send + Sync + Debug {
    /// Renders routines for one compilation (one library, one module).
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram>;
    /// Source given directly, in the backend's language, as a program its compiler takes
    /// (the reference's `compile ~source_code`; see
    /// [`LoweredBackend::compile_source`](crate::lowered_backend::LoweredBackend::compile_source)
    /// for each backend's calling convention). A renderer whose backend takes no source
    /// returns [`refuse_source`](crate::compiler::refuse_source).
    ///
    /// # Safety
    /// The source runs as native code once compiled and launched: it must export every
    /// kernel with the calling convention's signature, and a kernel must touch only the bytes
    /// its interface gives each buffer. Nothing can check what hand-written code does.
    unsafe fn render_given(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<RenderedProgram>;
    /// The GPU dialect the kernels are printed in (`cuda`, `cuda_emu`: CUDA; `wgpu`: WGSL),
    /// whose device strings the renderer uses (the reference's
    /// `Device_info.renderer_float4_str`, `renderer_smem_prefix`, `renderer_barrier_str`);
    /// `None` (the default) for C on CPUs.
    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        None
    }
}

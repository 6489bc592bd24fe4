//! The renderer part of a CPU backend ([`CpuKernels`], a [`Renderer`]): what source it makes of
//! routines, how the compiled kernels are entered, and what the device looks like to that code.
//! Two exist: [`CKernels`] (C, the `cc` backend) and [`EmulatedCudaKernels`] (the CUDA
//! renderer's kernels under an emulation of the CUDA execution model, the `cuda_emu` backend).
//! A CPU backend is one of them, the host compiler ([`super::CcCompiler`]), its devices
//! ([`super::CpuDevices`]) and the shared [`crate::cpu::CpuRuntime`].

use arrayjit_codegen::cuda_emulation::{self as emu, emulated_source, render_cuda_emulated};
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_codegen::{CSyntax, KernelInterface, RenderedC, SharedFunctions, SourceKernel};
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use crate::device_info::DeviceInfo;
use crate::lowered_backend::batch_name;
use crate::renderer::{RenderedProgram, Renderer};

/// How the compiled kernels of a [`CpuKernels`] are called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallingConvention {
    /// `void f(uint8_t *const *buffers, const int64_t *statics, const void *workers)`: C
    /// kernels, splitting their parallel loops on the device's worker pool.
    C,
    /// `int f(uint8_t *const *buffers, const int64_t *statics)`, returning 0 or -1 when the
    /// emulated threads' stacks could not be had; kernels given as source also export a form
    /// taking the launch at call time
    /// ([`DIMS_SUFFIX`](arrayjit_codegen::cuda_emulation::DIMS_SUFFIX)).
    EmulatedCuda,
}

/// Routines rendered for the host compiler: the units of one library and its kernels.
#[derive(Clone, Debug)]
pub struct CpuProgram {
    /// The translation units, each a file-name suffix (empty for the kernels' own unit, which
    /// comes first) and its source.
    pub units: Vec<(String, String)>,
    /// The kernels, in the order of the routines.
    pub kernels: Vec<KernelInterface>,
    /// All the source, for listings and the rendered program's source (equal sources, equal
    /// kernels).
    pub source: String,
    /// The statement functions it defines and exports, and those it imports from libraries
    /// loaded before (C only; empty for emulated CUDA).
    pub shared: SharedFunctions,
}

/// Routines rendered once by a [`CpuKernels`], to be assembled into one library's units.
pub trait RenderedKernels: Send {
    /// The library's units, importing the statement functions for which `import(name, text)`
    /// holds instead of defining them (renderers without statement functions ignore it).
    /// Cheap next to the rendering: a compile that tries a library importing functions and
    /// falls back to one defining them all renders once.
    fn assemble(&self, import: &dyn Fn(&str, &str) -> bool) -> CpuProgram;
}

/// The program a CPU renderer gives the host compiler (a [`RenderedProgram`]'s on `cc` and
/// `cuda_emu`).
pub enum CpuSource {
    /// Routines rendered once; the compiler assembles them into a library's units
    /// ([`RenderedKernels::assemble`]), importing statement functions where it can.
    Rendered(Box<dyn RenderedKernels>),
    /// Source given directly (the program's source, as the compiler compiles it: one unit)
    /// exporting these kernels.
    Given(Vec<KernelInterface>),
}

/// Routines rendered by a CPU renderer as a [`RenderedProgram`] of backend `backend`: its
/// source is the library that defines every statement function itself.
fn rendered_program(
    backend: &str,
    routines: &[&Optimized],
    rendered: Box<dyn RenderedKernels>,
) -> RenderedProgram {
    let source = rendered.assemble(&|_, _| false).source;
    RenderedProgram::new(
        backend,
        batch_name(routines),
        source,
        CpuSource::Rendered(rendered),
    )
}

/// Source given directly (as the compiler compiles it) as a [`RenderedProgram`] of backend
/// `backend`.
fn given_program(backend: &str, source: String, kernels: &[SourceKernel]) -> RenderedProgram {
    RenderedProgram::given(backend, source, kernels, |kernels| {
        CpuSource::Given(kernels.into_iter().map(|k| k.interface).collect())
    })
}

/// The renderer part of a CPU backend: a [`Renderer`] whose programs ([`CpuSource`]) the host
/// compiler builds, and what that compiler and the devices need to know of its code.
pub trait CpuKernels: Renderer {
    /// The backend's name (`cc`, `cuda_emu`).
    fn name(&self) -> &'static str;
    /// How the compiled kernels are called.
    fn convention(&self) -> CallingConvention;
    /// The device as this code sees it, from the host CPU's description. Default: as is.
    fn device_info(&self, cpu: DeviceInfo) -> DeviceInfo {
        cpu
    }
    /// What to install when the compiler (`compiler`) is missing; `None` (the default): the
    /// compiler's own message says it.
    fn how_to_enable(&self, compiler: &str) -> Option<String> {
        let _ = compiler;
        None
    }
}

/// C for the host compiler: the `cc` backend's renderer.
#[derive(Clone, Debug)]
pub struct CKernels {
    syntax: CSyntax,
}

impl Default for CKernels {
    fn default() -> Self {
        CKernels {
            syntax: CSyntax::c(),
        }
    }
}

impl Renderer for CKernels {
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let rendered = RenderedC::render(&self.syntax, routines)?;
        Ok(rendered_program(self.name(), routines, Box::new(rendered)))
    }

    /// C is compiled as given.
    unsafe fn render_given(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<RenderedProgram> {
        Ok(given_program(self.name(), source.to_string(), kernels))
    }
}

impl RenderedKernels for RenderedC {
    fn assemble(&self, import: &dyn Fn(&str, &str) -> bool) -> CpuProgram {
        let program = RenderedC::assemble(self, import);
        // The kernels' unit also exports its statement functions and binds those it imports.
        let exports = program.shared.exports();
        let source = format!("{}{exports}", program.full_source());
        let units = std::iter::once((String::new(), format!("{}{exports}", program.source)))
            .chain(
                program
                    .units
                    .into_iter()
                    .map(|u| (format!("-{}", u.name), u.source)),
            )
            .collect();
        CpuProgram {
            units,
            kernels: program.kernels,
            source,
            shared: program.shared,
        }
    }
}

/// A program with nothing to import: every assembly is the program.
struct Assembled(CpuProgram);

impl RenderedKernels for Assembled {
    fn assemble(&self, _: &dyn Fn(&str, &str) -> bool) -> CpuProgram {
        self.0.clone()
    }
}

impl CpuKernels for CKernels {
    fn name(&self) -> &'static str {
        "cc"
    }

    fn convention(&self) -> CallingConvention {
        CallingConvention::C
    }
}

/// The CUDA renderer's kernels compiled as C++ under an emulation of the CUDA execution model
/// ([`arrayjit_codegen::cuda_emulation`]): the `cuda_emu` backend's renderer.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmulatedCudaKernels;

impl Renderer for EmulatedCudaKernels {
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let program = render_cuda_emulated(routines)?;
        let rendered = Assembled(CpuProgram {
            units: vec![(String::new(), program.source.clone())],
            kernels: program.kernels.into_iter().map(|k| k.interface).collect(),
            source: program.source,
            shared: SharedFunctions::default(),
        });
        Ok(rendered_program(self.name(), routines, Box::new(rendered)))
    }

    /// The CUDA kernels, renamed, with entry points that launch them.
    unsafe fn render_given(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<RenderedProgram> {
        Ok(given_program(
            self.name(),
            emulated_source(source, kernels)?,
            kernels,
        ))
    }

    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::CUDA)
    }
}

impl CpuKernels for EmulatedCudaKernels {
    fn name(&self) -> &'static str {
        "cuda_emu"
    }

    fn convention(&self) -> CallingConvention {
        CallingConvention::EmulatedCuda
    }

    /// The CUDA code it runs may assume the block limits the emulation keeps to.
    fn device_info(&self, mut info: DeviceInfo) -> DeviceInfo {
        info.name = format!("{} running emulated CUDA blocks", info.name);
        info.max_local_size = emu::EMULATED_MAX_BLOCK;
        info.max_local_invocations = emu::EMULATED_MAX_THREADS;
        info.max_shared_bytes = emu::EMULATED_SHARED_BYTES;
        info.max_opt_in_shared_bytes = emu::EMULATED_OPT_IN_SHARED_BYTES;
        info.shared_bytes_per_unit = emu::EMULATED_SHARED_BYTES_PER_UNIT;
        info.subgroup_size = emu::EMULATED_WARP_SIZE;
        // The emulation header implements `ldmatrix` and `mma.sync` as warp collectives, and
        // `wgmma.mma_async` from its shared-memory operands.
        info.matrix_units = true;
        info.warpgroup_mma = true;
        // Passes that leave the device idle run together, as on `cuda`.
        info.joined_launch_parameters = arrayjit_opt::schedule::gpu::CUDA_JOINED_LAUNCH_PARAMETERS;
        info
    }

    fn how_to_enable(&self, compiler: &str) -> Option<String> {
        Some(format!(
            "install a C++ compiler (e.g. `apt-get install g++`) or point CXX at one (the \
             compiler is `{compiler}`)"
        ))
    }
}

//! The compiler part of the `cuda` backend ([`CudaCompiler`]): the CUDA C its renderer made
//! (of routines, or given directly: [`CudaSource`]) compiled by NVRTC for each device's
//! architecture into a [`CudaBatch`].

use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::cuda::{CudaKernel, CudaPass, CudaProgram};
use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::kernel::check_symbol;
use arrayjit_ir::{Error, Result};

use super::batch::CudaBatch;
use super::default_nvrtc_flags;
use super::devices::CudaDevices;
use super::renderer::CudaSource;
use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler};
use crate::device_info::DeviceInfo;
use crate::renderer::RenderedProgram;

/// `Ok` unless NVRTC options choose an architecture: the backend compiles for each device's
/// own.
fn check_nvrtc_options(options: &CompileOptions) -> Result<()> {
    match options
        .flags
        .iter()
        .find(|f| f.starts_with("--gpu-architecture") || f.starts_with("-arch"))
    {
        Some(arch) => Err(Error::Unsupported {
            backend: super::NAME.into(),
            what: format!("compile option {arch}"),
            instead: "leave it out: the backend compiles for each device's own architecture".into(),
        }),
        None => Ok(()),
    }
}

/// NVRTC, compiling for the backend's GPUs.
#[derive(Debug)]
pub struct CudaCompiler {
    devices: Arc<CudaDevices>,
}

impl CudaCompiler {
    /// Compiles for `devices`' GPUs.
    pub fn new(devices: Arc<CudaDevices>) -> CudaCompiler {
        CudaCompiler { devices }
    }
}

impl Compiler for CudaCompiler {
    /// NVRTC's options: `--fmad=false` ([`default_nvrtc_flags`]).
    fn default_options(&self) -> CompileOptions {
        CompileOptions {
            flags: default_nvrtc_flags(),
        }
    }

    /// Compiles with other NVRTC options (e.g. `--use_fast_math`, `-lineinfo`); the
    /// architecture is always the device's, so an option choosing one is refused.
    fn compile(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        check_nvrtc_options(options)?;
        let gpus = self.devices.gpus()?.to_vec();
        let program = match program.into_parts::<CudaSource>(super::NAME)? {
            (_, CudaSource::Rendered(program)) => program,
            (source, CudaSource::Given(kernels)) => given_program(&gpus[0].info, source, &kernels)?,
        };
        CudaBatch::compiled(gpus, program, options.flags.clone())
    }
}

/// CUDA C given directly as a program of hand-written kernels, each launched as given: its
/// symbol and launch checked against the device (`info`).
fn given_program(
    info: &DeviceInfo,
    source: String,
    kernels: &[SourceKernel],
) -> Result<CudaProgram> {
    let kernels = kernels
        .iter()
        .map(|k| {
            check_symbol(&k.interface.symbol)?;
            k.launch.check_within(
                &k.interface.name,
                info.max_local_size,
                u64::from(info.max_local_invocations),
            )?;
            Ok(CudaKernel {
                interface: k.interface.clone(),
                passes: vec![CudaPass {
                    symbol: k.interface.symbol.clone(),
                    shape: PassShape::Given(k.launch),
                    threads: k.launch.threads_per_block() as u32,
                    why: "hand-written, launched as given".into(),
                    args: (0..k.interface.buffer_sizes().len())
                        .map(|b| (b, 0))
                        .collect(),
                    statics: (0..k.interface.statics.len()).collect(),
                    dynamic_shared_bytes: 0,
                    tensor_maps: Vec::new(),
                }],
                buffer_types: vec![],
                scratch_zeroed: match k.interface.scratch_bytes {
                    0 => Vec::new(),
                    bytes => vec![(0, bytes)],
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CudaProgram {
        source,
        kernels,
        prelude: String::new(),
        functions: Vec::new(),
        function_symbols: Vec::new(),
    })
}

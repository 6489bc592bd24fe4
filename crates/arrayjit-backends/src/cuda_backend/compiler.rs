//! The compiler part of the `cuda` backend ([`CudaCompiler`]): CUDA C (rendered, or given
//! directly) compiled by NVRTC for each device's architecture into a [`CudaBatch`].

use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::cuda::{CudaKernel, CudaPass, CudaProgram, render_cuda};
use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::kernel::check_symbol;
use arrayjit_ir::{Error, Result, trace};
use arrayjit_opt::Optimized;

use super::batch::CudaBatch;
use super::default_nvrtc_flags;
use super::devices::CudaDevices;
use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler};

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
        routines: &[&Optimized],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        check_nvrtc_options(options)?;
        let gpus = self.devices.gpus()?.to_vec();
        let program = {
            let _render =
                trace::compile_phase("render", &crate::lowered_backend::batch_name(routines));
            render_cuda(routines)?
        };
        CudaBatch::compiled(gpus, program, options.flags.clone())
    }

    unsafe fn compile_source(
        &self,
        source: &str,
        kernels: &[SourceKernel],
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        check_nvrtc_options(options)?;
        let gpus = self.devices.gpus()?.to_vec();
        let info = &gpus[0].info;
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
        let program = CudaProgram {
            source: source.to_string(),
            kernels,
            prelude: String::new(),
            functions: Vec::new(),
            function_symbols: Vec::new(),
        };
        CudaBatch::compiled(gpus, program, options.flags.clone())
    }
}

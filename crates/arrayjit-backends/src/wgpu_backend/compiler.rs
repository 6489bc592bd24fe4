//! The compiler part of the `wgpu` backend ([`WgpuCompiler`]): the WGSL its renderer made (of
//! routines, or given directly: [`WgslSource`]) made into the device's compute pipelines,
//! cached by source and entry point. It allocates no device memory: a batch makes its
//! kernels' own buffers (local nodes, static indices) when first linked
//! ([`CompiledBatch::link`]). It takes no compile options: WGSL goes to the driver as it is.

use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::kernel::check_symbol;
use arrayjit_codegen::wgsl::{WgslKernel, WgslPass};
use arrayjit_ir::{Error, Result, trace};

use super::NAME;
use super::batch::{Kernel, WgpuBatch};

use super::devices::{Gpu, WgpuDevices};
use super::renderer::{RenderedRoutine, WgslSource};
use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler, refuse_options_unless_default};
use crate::renderer::RenderedProgram;

/// Pipelines for the backend's device.
#[derive(Debug)]
pub struct WgpuCompiler {
    devices: Arc<WgpuDevices>,
}

impl WgpuCompiler {
    /// Compiles for `devices`' device.
    pub fn new(devices: Arc<WgpuDevices>) -> WgpuCompiler {
        WgpuCompiler { devices }
    }
}

impl Compiler for WgpuCompiler {
    fn compile(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        refuse_options_unless_default(NAME, options, &CompileOptions::default())?;
        let gpu = self.devices.gpu()?.clone();
        let (source, routines) = match program.into_parts::<WgslSource>(NAME)? {
            (source, WgslSource::Rendered(routines)) => (source, routines),
            (source, WgslSource::Given(kernels)) => {
                return self.compile_given(gpu, &source, &kernels);
            }
        };
        let mut kernels = Vec::new();
        let mut interfaces = Vec::new();
        for RenderedRoutine {
            name,
            kernel: rendered,
            statics,
        } in routines
        {
            let pipelines = {
                let _compile = trace::compile_phase("compile", &name);
                rendered
                    .passes
                    .iter()
                    .map(|p| gpu.pipeline(p))
                    .collect::<Result<Vec<_>>>()?
            };
            interfaces.push(rendered.interface.clone());
            kernels.push(Kernel {
                rendered,
                pipelines,
                statics,
            });
        }
        let used = self.devices.used.clone();
        Ok(Arc::new(WgpuBatch::new(
            gpu, interfaces, kernels, source, used,
        )))
    }
}

impl WgpuCompiler {
    /// WGSL given directly: each kernel's entry point, bindings and workgroup size checked
    /// against its interface and launch, and made a pipeline.
    fn compile_given(
        &self,
        gpu: Arc<Gpu>,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<Arc<dyn CompiledBatch>> {
        let mut compiled = Vec::new();
        for k in kernels {
            let iface = &k.interface;
            check_symbol(&iface.symbol)?;
            // The shader declares its workgroup size, which the launch's block must be (a
            // shader's indexing depends on it); the grid is the workgroup count.
            k.launch
                .check(&iface.name, u64::from(gpu.info.max_local_invocations))?;
            let buffers = iface.buffer_sizes().len() as u32;
            let statics_binding = (!iface.statics.is_empty()).then_some(buffers);
            let (bindings, workgroup_size) = source_bindings(&gpu, source, &iface.symbol)?;
            if workgroup_size != k.launch.block {
                return Err(Error::shape_mismatch(
                    format!(
                        "compiling kernel {} (entry point {})",
                        iface.name, iface.symbol
                    ),
                    &[
                        &k.launch.block.map(|d| d as usize),
                        &workgroup_size.map(|d| d as usize),
                    ],
                    "the launch's block (first) must be the shader's @workgroup_size (second)",
                ));
            }
            let known = buffers + u32::from(statics_binding.is_some());
            if let Some(b) = bindings.iter().find(|&&b| b >= known) {
                return Err(Error::BadValue {
                    what: format!("binding of entry point {}", iface.symbol),
                    value: b.to_string(),
                    expected: format!(
                        "one of kernel {}'s bindings 0..{known} (its buffers, then its static \
                         indices)",
                        iface.name
                    ),
                });
            }
            let pass = WgslPass {
                source: source.to_string(),
                shape: PassShape::Given(k.launch),
                threads: k.launch.threads_per_block() as u32,
                bindings,
                why: "hand-written, dispatched as given".into(),
                entry_point: iface.symbol.clone(),
            };
            let pipelines = vec![gpu.pipeline(&pass)?];
            compiled.push((
                iface.clone(),
                Kernel {
                    rendered: WgslKernel {
                        interface: iface.clone(),
                        locals: vec![],
                        statics_binding,
                        passes: vec![pass],
                    },
                    pipelines,
                    statics: iface.statics.len(),
                },
            ));
        }
        let (interfaces, kernels) = compiled.into_iter().unzip();
        let used = self.devices.used.clone();
        Ok(Arc::new(WgpuBatch::new(
            gpu,
            interfaces,
            kernels,
            source.to_string(),
            used,
        )))
    }
}

/// What a hand-written WGSL entry point uses: the bindings of group 0 that entry point `entry`
/// of a WGSL module uses, ascending (a pipeline's automatic layout holds exactly these), and
/// the `@workgroup_size` it declares. A module that does not parse or validate, or lacks the
/// entry point, is an error saying why.
fn source_bindings(gpu: &Gpu, source: &str, entry: &str) -> Result<(Vec<u32>, [u32; 3])> {
    let action = format!("reading the WGSL of entry point {entry}");
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| gpu.driver_error(&action, e.emit_to_string(source).into()))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| gpu.driver_error(&action, e.emit_to_string(source).into()))?;
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| {
            let names: Vec<&str> = module
                .entry_points
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            Error::BadValue {
                what: "WGSL entry point".into(),
                value: entry.into(),
                expected: format!("one the source has: {names:?}"),
            }
        })?;
    let uses = info.get_entry_point(index);
    let mut bindings: Vec<u32> = module
        .global_variables
        .iter()
        .filter(|(handle, _)| !uses[*handle].is_empty())
        .filter_map(|(_, var)| var.binding.as_ref())
        .filter(|b| b.group == 0)
        .map(|b| b.binding)
        .collect();
    bindings.sort_unstable();
    bindings.dedup();
    Ok((bindings, module.entry_points[index].workgroup_size))
}

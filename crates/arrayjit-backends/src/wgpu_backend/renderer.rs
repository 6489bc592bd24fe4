//! The renderer part of the `wgpu` backend ([`WgpuRenderer`]): routines to WGSL compute
//! passes ([`arrayjit_codegen::wgsl`]) for the device's target (its precisions and limits), or
//! WGSL given directly, as the program ([`WgslSource`]) its compiler makes pipelines of.

use std::sync::Arc;

use arrayjit_codegen::SourceKernel;
use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_codegen::wgsl::{WgslKernel, render_wgsl};
use arrayjit_ir::{DeviceLimit, Error, Result};
use arrayjit_opt::Optimized;

use super::NAME;
use super::devices::WgpuDevices;
use crate::lowered_backend::batch_name;
use crate::renderer::{RenderedProgram, Renderer};

/// One routine rendered for the device.
#[derive(Debug)]
pub struct RenderedRoutine {
    /// The routine's name.
    pub name: String,
    /// Its passes, bindings and locals.
    pub kernel: WgslKernel,
    /// How many static indices it binds.
    pub statics: usize,
}

/// The program the `wgpu` renderer gives its compiler (a [`RenderedProgram`]'s on `wgpu`).
#[derive(Debug)]
pub enum WgslSource {
    /// Routines rendered, one kernel each.
    Rendered(Vec<RenderedRoutine>),
    /// WGSL given directly (the program's source) with its kernels (the compiler checks their
    /// entry points, bindings and workgroup sizes).
    Given(Vec<SourceKernel>),
}

/// WGSL for the backend's device.
#[derive(Debug)]
pub struct WgpuRenderer {
    devices: Arc<WgpuDevices>,
}

impl WgpuRenderer {
    /// WGSL for `devices`' device.
    pub fn new(devices: Arc<WgpuDevices>) -> WgpuRenderer {
        WgpuRenderer { devices }
    }
}

impl Renderer for WgpuRenderer {
    /// Refuses, before rendering anything, a routine whose arrays or loop nests exceed what a
    /// pass can index or bind; the WGSL renderer refuses precisions the target lacks.
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let gpu = self.devices.gpu()?;
        let mut source = String::new();
        let mut rendered = Vec::new();
        for r in routines {
            // An array larger than one binding cannot be used by a pass: say so before running.
            // WGSL positions and counters are `i32`: a nest whose statements run more often
            // (a fused sum over more steps) would count past them.
            if let Some(steps) = r
                .statements()
                .iter()
                .map(|s| s.most_iterations())
                .find(|&n| n > i32::MAX as u64)
            {
                return Err(Error::limit_exceeded(
                    gpu.label(),
                    format!("a loop nest of {steps} iterations in {}", r.name),
                    DeviceLimit::IndexedElements,
                    steps,
                    i32::MAX as u64,
                    "split the computation into smaller pieces or use a CPU or CUDA backend",
                ));
            }
            for n in r.nodes.iter().filter(|n| n.used) {
                // WGSL positions are `i32`: a larger array's far elements have none.
                let elements = n.tn.num_elems() as u64;
                if elements > i32::MAX as u64 {
                    return Err(Error::limit_exceeded(
                        gpu.label(),
                        format!("array {} of {}", n.tn.debug_name(), r.name),
                        DeviceLimit::IndexedElements,
                        elements,
                        i32::MAX as u64,
                        "split it into smaller arrays or use a CPU or CUDA backend",
                    ));
                }
                let bytes = n.tn.size_in_bytes() as u64;
                if bytes > gpu.max_binding_bytes {
                    return Err(Error::limit_exceeded(
                        gpu.label(),
                        format!("array {} of {}", n.tn.debug_name(), r.name),
                        DeviceLimit::BindingBytes,
                        bytes,
                        gpu.max_binding_bytes,
                        "split it into smaller arrays or use a CPU backend",
                    ));
                }
            }
            let kernel = render_wgsl(r, &gpu.target)?;
            source.push_str(&kernel.full_source());
            rendered.push(RenderedRoutine {
                name: r.name.clone(),
                kernel,
                statics: r.bindings.len(),
            });
        }
        Ok(RenderedProgram::new(
            NAME,
            batch_name(routines),
            source,
            WgslSource::Rendered(rendered),
        ))
    }

    unsafe fn render_given(
        &self,
        source: &str,
        kernels: &[SourceKernel],
    ) -> Result<RenderedProgram> {
        Ok(RenderedProgram::given(
            NAME,
            source.to_string(),
            kernels,
            WgslSource::Given,
        ))
    }

    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::WGSL)
    }
}

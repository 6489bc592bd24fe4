//! The renderer part of the `wgpu` backend ([`WgpuRenderer`]): routines to WGSL compute
//! passes ([`arrayjit_codegen::wgsl`]) for the device's target (its precisions and limits).

use std::sync::Arc;

use arrayjit_codegen::gpu_dialect::GpuDialect;
use arrayjit_codegen::wgsl::render_wgsl;
use arrayjit_ir::Result;
use arrayjit_opt::Optimized;

use super::devices::WgpuDevices;
use crate::renderer::Renderer;

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
    fn render_source(&self, routines: &[&Optimized]) -> Result<String> {
        let gpu = self.devices.gpu()?;
        let mut s = String::new();
        for r in routines {
            s.push_str(&render_wgsl(r, &gpu.target)?.full_source());
        }
        Ok(s)
    }

    fn gpu_dialect(&self) -> Option<&'static GpuDialect> {
        Some(&arrayjit_codegen::gpu_dialect::WGSL)
    }
}

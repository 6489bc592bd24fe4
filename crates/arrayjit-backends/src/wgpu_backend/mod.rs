//! The `wgpu` lowered backend: routines rendered to WGSL compute passes
//! ([`arrayjit_codegen::wgsl`]) and run through wgpu on a GPU (Vulkan), or on a CPU through
//! Mesa's software Vulkan (lavapipe), which is how CI runs it.
//!
//! - One device: the adapter wgpu picks (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME` steer it). No
//!   adapter means the backend is unavailable, with what to install.
//! - Arrays are storage buffers; a pool is one buffer and its arrays are views at offsets,
//!   aligned to the device's storage-binding alignment ([`crate::device_runtime::DeviceRuntime::pool_alignment`]).
//! - The device's queue is the stream: work runs in submission order. Host copies go through
//!   staging buffers and wait for the queue; a launch records one compute pass per pass of the
//!   kernel and submits them.
//! - Every driver error (validation, out of memory, a lost device, a shader the driver refuses)
//!   is caught in an error scope and returned as [`Error::Driver`](arrayjit_ir::Error::Driver) with the driver's error as
//!   its source; an error that escapes a scope is kept and returned by the next call.
//! - Compiled pipelines are cached in memory by their WGSL source and entry point.

mod batch;
mod buffers;
mod compiler;
mod devices;
mod queue;
mod renderer;
mod runtime;
mod timestamps;

use std::sync::Arc;

use crate::lowered_backend::{BackendParts, LoweredBackend};

pub use batch::WgpuBatch;
pub use buffers::WgpuBuffer;
pub use compiler::WgpuCompiler;
pub use devices::WgpuDevices;
pub use renderer::{RenderedRoutine, WgpuRenderer, WgslSource};
pub use runtime::WgpuRuntime;

/// The name the backend reports in errors.
const NAME: &str = "wgpu";

/// The `wgpu` backend: the adapter wgpu picks ([`WgpuDevices`], opened once per process), WGSL
/// ([`WgpuRenderer`]) made into compute pipelines ([`WgpuCompiler`]), and storage buffers and
/// the device's queue ([`WgpuRuntime`]). Never fails: without an adapter, every call says what
/// to install.
pub fn backend() -> LoweredBackend {
    let devices = Arc::new(WgpuDevices::opened());
    LoweredBackend::compose(
        NAME,
        BackendParts {
            renderer: Arc::new(WgpuRenderer::new(devices.clone())),
            compiler: Arc::new(WgpuCompiler::new(devices.clone())),
            runtime: Arc::new(WgpuRuntime::new(devices.clone())),
            devices,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::devices::Gpu;
    use super::*;
    use crate::device_runtime::DeviceRuntime;
    use arrayjit_codegen::gpu_kernel::PassShape;
    use arrayjit_codegen::wgsl::WgslPass;
    use arrayjit_ir::Error;

    /// The shared device, or `None` (with why) on a machine without a Vulkan driver.
    fn gpu() -> Option<Arc<Gpu>> {
        match WgpuDevices::opened().gpu() {
            Ok(g) => Some(g.clone()),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn a_shader_the_driver_refuses_is_a_driver_error_with_its_source() {
        let Some(gpu) = gpu() else { return };
        let pass = WgslPass {
            source: "@compute @workgroup_size(1) fn main() { let x: f32 = nonsense; }".into(),
            shape: PassShape::Single,
            threads: 1,
            bindings: vec![],
            why: "test".into(),
            entry_point: "main".into(),
        };
        let e = gpu.pipeline(&pass).unwrap_err();
        let Error::Driver { device, source, .. } = &e else {
            panic!("expected a driver error, got {e}")
        };
        assert!(device.starts_with("wgpu:0"), "{device}");
        assert!(source.to_string().contains("Validation"), "{source}");
        // The device stays usable: a valid pass compiles afterwards.
        let ok = WgslPass {
            source: "@compute @workgroup_size(1) fn main() {}".into(),
            ..pass
        };
        gpu.pipeline(&ok).unwrap();
    }

    #[test]
    fn copies_round_trip_and_sizes_are_checked() {
        let Some(_) = gpu() else { return };
        let b = WgpuRuntime::new(Arc::new(WgpuDevices::opened()));
        // An odd size: wgpu copies whole words, the backend pads and trims.
        let buf = b.alloc_zeroed(0, 6).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host(&buf, &[1, 2, 3, 4, 5, 6], None) }.unwrap();
        let mut back = [0u8; 6];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&buf, &mut back, None) }.unwrap();
        assert_eq!(back, [1, 2, 3, 4, 5, 6]);
        assert!(matches!(
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { b.copy_from_host(&buf, &[0; 5], None) },
            Err(Error::SizeMismatch {
                expected: 6,
                given: 5,
                ..
            })
        ));
        // Ranges: on words (direct), ending at the buffer's odd end (direct), inside a word
        // (through the whole buffer); neighbours keep their bytes.
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 0, &[7, 7, 7, 7], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 4, &[8, 8], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host_range(&buf, 1, &[9, 9], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&buf, &mut back, None) }.unwrap();
        assert_eq!(back, [7, 9, 9, 7, 8, 8]);
        let mut part = [0u8; 3];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host_range(&buf, 3, &mut part, None) }.unwrap();
        assert_eq!(part, [7, 8, 8]);
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host_range(&buf, 4, &mut part[..2], None) }.unwrap();
        assert_eq!(part[..2], [8, 8]);
        // SAFETY: the test's own buffers, one call at a time.
        assert!(unsafe { b.copy_from_host_range(&buf, 5, &[1, 1], None) }.is_err());
        // Pool views are aligned for binding and zeroed on request.
        let align = b.pool_alignment();
        b.alloc_pool(0, 7, 4 * align, align).unwrap();
        let view = b.pool_view(0, 7, align, 8).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_from_host(&view, &[9; 8], None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.memset_zero(0, 7, align, 8) }.unwrap();
        let mut z = [1u8; 8];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { b.copy_to_host(&view, &mut z, None) }.unwrap();
        assert_eq!(z, [0; 8]);
        assert!(b.alloc_pool(0, 8, 64, align / 2).is_err() || align <= 64);
        assert!(b.pool_view(0, 7, 4 * align, 1).is_err());
        b.free_pool(0, 7).unwrap();
        assert!(b.free_pool(0, 7).is_err());
    }
}

//! The placeholder for a backend that was not built (cargo feature off) or cannot run here
//! (library or driver absent): it has zero devices, and every call returns
//! [`Error::BackendUnavailable`] naming the backend and what would enable it. One placeholder
//! object answers as all four parts of the backend ([`backend`]).

use std::sync::Arc;

use arrayjit_ir::{Error, Result};
use arrayjit_opt::Optimized;

use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler};
use crate::device_buffer::BufferHandle;
use crate::device_runtime::DeviceRuntime;
use crate::devices::Devices;
use crate::lowered_backend::{BackendParts, LoweredBackend};
use crate::queue::Queue;
use crate::renderer::{RenderedProgram, Renderer};

/// Backend `name` as a placeholder (see [`MissingBackend::new`]), its four parts one object.
pub fn backend(name: &str, reason: &str, how_to_enable: &str) -> LoweredBackend {
    let missing = Arc::new(MissingBackend::new(name, reason, how_to_enable));
    LoweredBackend::compose(
        name,
        BackendParts {
            devices: missing.clone(),
            renderer: missing.clone(),
            compiler: missing.clone(),
            runtime: missing,
        },
    )
}

/// A backend that is not available.
#[derive(Clone, Debug)]
pub struct MissingBackend {
    name: String,
    reason: String,
    how_to_enable: String,
}

impl MissingBackend {
    /// A placeholder for backend `name`, unavailable because of `reason`; `how_to_enable` tells
    /// the user what to do.
    pub fn new(name: &str, reason: &str, how_to_enable: &str) -> MissingBackend {
        MissingBackend {
            name: name.into(),
            reason: reason.into(),
            how_to_enable: how_to_enable.into(),
        }
    }

    fn error(&self) -> Error {
        Error::BackendUnavailable {
            backend: self.name.clone(),
            reason: self.reason.clone(),
            how_to_enable: self.how_to_enable.clone(),
        }
    }
}

impl Devices for MissingBackend {
    fn check_available(&self) -> Result<()> {
        Err(self.error())
    }

    fn device_info(&self, _: usize) -> Result<crate::device_info::DeviceInfo> {
        Err(self.error())
    }

    fn debug_info(&self) -> String {
        format!("{} (unavailable: {})", self.name, self.reason)
    }
}

impl Renderer for MissingBackend {
    fn render(&self, _: &[&Optimized]) -> Result<RenderedProgram> {
        Err(self.error())
    }

    unsafe fn render_given(
        &self,
        _: &str,
        _: &[arrayjit_codegen::SourceKernel],
    ) -> Result<RenderedProgram> {
        Err(self.error())
    }
}

impl Compiler for MissingBackend {
    fn compile(&self, _: RenderedProgram, _: &CompileOptions) -> Result<Arc<dyn CompiledBatch>> {
        Err(self.error())
    }
}

impl DeviceRuntime for MissingBackend {
    fn num_devices(&self) -> usize {
        0
    }

    fn alloc_zeroed(&self, _: usize, _: usize) -> Result<BufferHandle> {
        Err(self.error())
    }

    unsafe fn copy_from_host(&self, _: &BufferHandle, _: &[u8], _: Queue<'_>) -> Result<()> {
        Err(self.error())
    }

    unsafe fn copy_to_host(&self, _: &BufferHandle, _: &mut [u8], _: Queue<'_>) -> Result<()> {
        Err(self.error())
    }

    unsafe fn copy_buffer(&self, _: &BufferHandle, _: &BufferHandle, _: Queue<'_>) -> Result<()> {
        Err(self.error())
    }

    fn used_memory(&self, _: usize) -> usize {
        0
    }

    fn alloc_pool(&self, _: usize, _: usize, _: usize, _: usize) -> Result<()> {
        Err(self.error())
    }

    fn free_pool(&self, _: usize, _: usize) -> Result<()> {
        Err(self.error())
    }

    unsafe fn memset_zero(&self, _: usize, _: usize, _: usize, _: usize) -> Result<()> {
        Err(self.error())
    }

    fn pool_view(&self, _: usize, _: usize, _: usize, _: usize) -> Result<BufferHandle> {
        Err(self.error())
    }

    fn pools(&self, _: usize) -> Vec<(usize, usize)> {
        vec![]
    }
}

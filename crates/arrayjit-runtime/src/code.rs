//! Compiled code: one routine of a compiled batch, ready to be linked into contexts of its
//! backend.

use std::fmt;
use std::sync::Arc;

use arrayjit_backends::CompiledBatch;
use arrayjit_codegen::KernelInterface;
use arrayjit_ir::{Error, Result};
use arrayjit_opt::Optimized;

/// One compiled routine, ready to be linked into contexts of its backend.
#[derive(Clone)]
pub struct Code {
    pub(crate) backend_name: String,
    pub(crate) batch: Arc<dyn CompiledBatch>,
    pub(crate) index: usize,
    pub(crate) optimized: Arc<Optimized>,
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code({} on {})", self.optimized.name, self.backend_name)
    }
}

impl Code {
    /// The routine's name.
    pub fn name(&self) -> &str {
        &self.optimized.name
    }

    /// The optimized loop code and its node roles.
    pub fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    /// The generated source of the whole batch this code was compiled in.
    pub fn source(&self) -> &str {
        self.batch.source()
    }

    /// How to call the kernel: its buffers in order, its static indices.
    pub fn interface(&self) -> Result<&KernelInterface> {
        self.batch
            .kernels()
            .get(self.index)
            .ok_or_else(|| Error::NoSuchKernel {
                index: self.index,
                len: self.batch.kernels().len(),
            })
    }
}

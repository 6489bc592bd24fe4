//! The compiler part of a backend ([`Compiler`], the reference's `Compiler`): a
//! [`RenderedProgram`] (of routines, or of source given directly) to a [`CompiledBatch`], with
//! [`CompileOptions`]; and the store of schedule choices that lives beside its compile cache.

use std::fmt::Debug;
use std::sync::Arc;

use arrayjit_ir::{Error, Result};

use crate::compiled_batch::CompiledBatch;
use crate::renderer::RenderedProgram;

/// Options of one compilation (the reference's `Compiler.compile_options`), starting from a
/// compiler's [`Compiler::default_options`] (its `default_options`): for `cc` and `cuda_emu`,
/// the host compiler's flags (by default `CcConfig::flags`, e.g. from `ARRAYJIT_CC_FLAGS`); for
/// `cuda`, NVRTC's; `wgpu` takes none. Compiled code is cached per options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// The compiler's flags, in order.
    pub flags: Vec<String>,
}

/// Counters of a compiler's work in this process ([`Compiler::compile_stats`]). The C
/// backends count all their libraries together (one C compiler, one cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Libraries built by the compiler.
    pub compiled: usize,
    /// Libraries found in the cache.
    pub cache_hits: usize,
    /// Translation units of libraries built here whose objects were found in the cache
    /// (compiled before for another library), so the compiler did not run for them.
    pub object_hits: usize,
    /// Statement functions that libraries built or loaded here call from a library loaded
    /// before them instead of compiling them again (the forward pass that a training step,
    /// its held-out loss and its sampling share).
    pub imported_functions: usize,
    /// Microseconds spent in the compiler.
    pub compile_micros: u64,
}

/// How a backend compiles. One of the four parts a
/// [`LoweredBackend`](crate::lowered_backend::LoweredBackend) is composed of; it compiles what
/// the backend's [`Renderer`](crate::renderer::Renderer) rendered, and nothing else (it never
/// renders), into batches that launch on the backend's
/// [`DeviceRuntime`](crate::device_runtime::DeviceRuntime) buffers.
pub trait Compiler: Send + Sync + Debug {
    /// The options [`Compiler::compile`] is given by default (the reference's
    /// `Compiler.default_options`). Default: none.
    fn default_options(&self) -> CompileOptions {
        CompileOptions::default()
    }
    /// Compiles a program the backend's renderer made (one library, one compilation) with
    /// `options`; options the compiler cannot take are an error before anything is compiled
    /// (see [`refuse_options_unless_default`]), and so is a program of another backend's
    /// renderer ([`RenderedProgram::into_parts`]). A program of source given directly was
    /// made by the renderer's `unsafe` [`render_given`](crate::renderer::Renderer::render_given),
    /// whose caller vouched for it.
    fn compile(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>>;
    /// The schedule choice stored under `key` (a hexadecimal hash) by
    /// [`Compiler::store_schedule_choice`]; `Ok(None)` when none is stored, `Err` with why
    /// when a stored one cannot be read. Default: nothing is ever stored.
    fn load_schedule_choice(&self, key: &str) -> std::result::Result<Option<String>, String> {
        let _ = key;
        Ok(None)
    }
    /// Stores a schedule choice (one line of text) under `key`, next to the compile cache;
    /// returns whether it was stored (`false`: the compiler keeps no cache).
    fn store_schedule_choice(&self, key: &str, choice: &str) -> Result<bool> {
        let _ = (key, choice);
        Ok(false)
    }
    /// What this compiler has done in this process (libraries built and found in its cache,
    /// time in the compiler), where it counts. Default: `None`.
    fn compile_stats(&self) -> Option<CompileStats> {
        None
    }
}

/// `Ok` when `options` are `default` (the only ones backend `backend` takes), else
/// [`Error::Unsupported`] naming the options.
pub fn refuse_options_unless_default(
    backend: &str,
    options: &CompileOptions,
    default: &CompileOptions,
) -> Result<()> {
    if options == default {
        return Ok(());
    }
    Err(Error::Unsupported {
        backend: backend.into(),
        what: format!("compile options (given {:?})", options.flags),
        instead: "compile with its default options".into(),
    })
}

/// The [`Error::Unsupported`] of a compiler that takes no source given directly.
pub fn refuse_source(backend: &str) -> Error {
    Error::Unsupported {
        backend: backend.into(),
        what: "source given directly".into(),
        instead: "use cc, cuda_emu, cuda or wgpu for hand-written kernels".into(),
    }
}

//! The compiler part of a CPU backend ([`CcCompiler`]): compiles what the backend's renderer
//! ([`super::CpuKernels`]) rendered ([`CpuSource`]) with the host compiler into one shared
//! library (cached by a hash of source, compiler, flags and CPU), loads it and finds each
//! kernel by its symbol. Schedule choices are stored beside the compile cache.

use std::borrow::Cow;
use std::sync::Arc;

use arrayjit_codegen::KernelInterface;
use arrayjit_ir::{Error, Result};

use super::batch::{CcBatch, EmulatedDimsFn, EmulatedFn, Entry, KernelFn};
use super::kernels::{CallingConvention, CpuProgram, CpuSource};
use super::shared_functions::{self, Imports};
use super::{CcConfig, compile, library, schedule_store};
use crate::compiled_batch::CompiledBatch;
use crate::compiler::{CompileOptions, Compiler};
use crate::cpu::worker_pool::WorkerPool;
use crate::renderer::RenderedProgram;

/// The host compiler of a CPU backend.
#[derive(Debug)]
pub struct CcCompiler {
    config: CcConfig,
    backend: &'static str,
    convention: CallingConvention,
    workers: Arc<Vec<WorkerPool>>,
}

impl CcCompiler {
    /// Compiles backend `backend`'s programs, whose kernels are called with `convention`, with
    /// `config`'s compiler; the batches run on `workers` (one pool per device).
    pub fn new(
        config: CcConfig,
        backend: &'static str,
        convention: CallingConvention,
        workers: Arc<Vec<WorkerPool>>,
    ) -> CcCompiler {
        CcCompiler {
            config,
            backend,
            convention,
            workers,
        }
    }

    /// The settings.
    pub fn config(&self) -> &CcConfig {
        &self.config
    }
}

impl Compiler for CcCompiler {
    /// The host compiler's flags (`CcConfig::flags`).
    fn default_options(&self) -> CompileOptions {
        CompileOptions {
            flags: self.config.flags.clone(),
        }
    }

    /// Compiles with the given host compiler flags instead of `CcConfig::flags`: they must
    /// still make a loadable shared library (`-shared` and `-fPIC`), else nothing is compiled.
    fn compile(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let config = self.config_with(options)?;
        let rendered = match program.into_parts::<CpuSource>(self.backend)? {
            (_, CpuSource::Rendered(rendered)) => rendered,
            (source, CpuSource::Given(kernels)) => {
                let units = [compile::Unit {
                    suffix: "",
                    source: &source,
                }];
                // SAFETY: the source exports each kernel with the renderer's calling
                // convention (the contract of `render_given`, which made this program); for
                // emulated CUDA, the entry points it wrote do.
                return unsafe { self.load_batch(&config, &units, kernels, source.clone(), true) };
            }
        };
        // Statement functions equal to those of C libraries loaded before (of the same
        // compiler and flags) are called from there instead of compiled again.
        let flavor = format!("{} {}", config.compiler, config.flags.join(" "));
        let imports = match self.convention {
            CallingConvention::C => Imports::live(&flavor),
            CallingConvention::EmulatedCuda => Imports::none(),
        };
        // First with every function its own (noting whether any could be imported): a library
        // of that in the compile cache loads at once, which beats compiling one that imports.
        let offered = std::cell::Cell::new(false);
        let full = rendered.assemble(&|name, text| {
            offered.set(offered.get() || imports.offer(name, text));
            false
        });
        let importing = if !offered.get() || compile::is_cached(&config, &units_of(&full)) {
            None
        } else {
            Some(rendered.assemble(&|name, text| imports.offer(name, text)))
                .filter(|p| !p.shared.imported.is_empty())
        };
        if let Some(program) = importing {
            // SAFETY: every kernel arrayjit's renderers generate has their calling convention.
            if let Some(batch) = unsafe { self.load_rendered(&config, &flavor, program, &imports) }?
            {
                return Ok(batch);
            }
            // A library it imports from could not give every function: define them all.
        }
        // SAFETY: as above.
        unsafe { self.load_rendered(&config, &flavor, full, &Imports::none()) }?.ok_or_else(|| {
            Error::Runtime {
                stream: self.backend.into(),
                detail: "a library that imports no statement function still asked for one: a \
                         defect of the C renderer; please report it"
                    .into(),
            }
        })
    }

    fn load_schedule_choice(&self, key: &str) -> std::result::Result<Option<String>, String> {
        match &self.config.cache_dir {
            Some(dir) => schedule_store::load(&schedule_store::folder(dir), key),
            None => Ok(None),
        }
    }

    fn store_schedule_choice(&self, key: &str, choice: &str) -> Result<bool> {
        match &self.config.cache_dir {
            Some(dir) => {
                schedule_store::store(&schedule_store::folder(dir), key, choice).map(|()| true)
            }
            None => Ok(false),
        }
    }

    fn compile_stats(&self) -> Option<crate::compiler::CompileStats> {
        Some(super::stats::compile_stats())
    }
}

impl CcCompiler {
    /// The configuration with the host compiler flags of `options`: they must still make a
    /// loadable shared library (`-shared` and `-fPIC`), else an [`Error::InvalidSetting`] and
    /// nothing is compiled.
    /// The configuration's own flags are taken as they are (`CcConfig::validate` checked what
    /// it could; a compiler that then writes no library says so when loading).
    fn config_with(&self, options: &CompileOptions) -> Result<Cow<'_, CcConfig>> {
        if options.flags == self.config.flags {
            return Ok(Cow::Borrowed(&self.config));
        }
        if let Some(missing) = ["-shared", "-fPIC"]
            .into_iter()
            .find(|f| !options.flags.iter().any(|g| g == f))
        {
            return Err(Error::InvalidSetting {
                setting: "compile options".into(),
                value: options.flags.join(" "),
                expected: format!(
                    "flags with {missing}: the {} backend loads a shared library, so its flags \
                     must keep -shared and -fPIC (start from default_compile_options)",
                    self.backend
                ),
            });
        }
        Ok(Cow::Owned(CcConfig {
            flags: options.flags.clone(),
            ..self.config.clone()
        }))
    }

    /// Compiles a rendered program into one library, loads it, binds the statement functions
    /// it imports (`None` when one cannot be found: nothing of it may run) and records the
    /// ones it defines for libraries rendered later.
    ///
    /// # Safety
    /// As [`CcCompiler::load_batch`].
    unsafe fn load_rendered(
        &self,
        config: &CcConfig,
        flavor: &str,
        program: CpuProgram,
        imports: &Imports,
    ) -> Result<Option<Arc<dyn CompiledBatch>>> {
        let units = units_of(&program);
        let names: Vec<&str> = program.kernels.iter().map(|k| k.name.as_str()).collect();
        let (library, cache_hit) = compile::compile_and_load(config, &units, &names.join("+"))?;
        // SAFETY: the library was rendered with these imports.
        let Some(providers) = unsafe { imports.bind(&library, &program.shared.imported) }? else {
            return Ok(None);
        };
        if self.convention == CallingConvention::C {
            shared_functions::register(flavor, &library, &program.shared.defined);
        }
        // SAFETY: this function's contract.
        let batch = unsafe {
            self.batch_of(
                library,
                cache_hit,
                providers,
                program.kernels,
                program.source,
                false,
            )
        }?;
        Ok(Some(batch))
    }

    /// Compiles `units` into one library, loads it, and finds every kernel by its symbol with
    /// the renderer's calling convention.
    ///
    /// # Safety
    /// Every kernel's symbol must name a function of the calling convention's signature: true
    /// of what the renderers generate, the caller's contract for source given directly.
    unsafe fn load_batch(
        &self,
        config: &CcConfig,
        units: &[compile::Unit],
        kernels: Vec<KernelInterface>,
        source: String,
        source_kernels: bool,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        let (library, cache_hit) = compile::compile_and_load(config, units, &names.join("+"))?;
        // SAFETY: this function's contract.
        unsafe {
            self.batch_of(
                library,
                cache_hit,
                Vec::new(),
                kernels,
                source,
                source_kernels,
            )
        }
    }

    /// The batch of a loaded library: every kernel found by its symbol with the renderer's
    /// calling convention.
    ///
    /// # Safety
    /// As [`CcCompiler::load_batch`].
    unsafe fn batch_of(
        &self,
        library: Arc<library::LoadedLibrary>,
        cache_hit: bool,
        providers: Vec<Arc<library::LoadedLibrary>>,
        kernels: Vec<KernelInterface>,
        source: String,
        source_kernels: bool,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let convention = self.convention;
        // Hand-written emulated CUDA also exports each kernel with its launch taken at call
        // time (`emulated_source`).
        let dims_entries = kernels
            .iter()
            .map(|k| {
                if !(source_kernels && convention == CallingConvention::EmulatedCuda) {
                    return Ok(None);
                }
                let symbol = format!(
                    "{}{}",
                    k.symbol,
                    arrayjit_codegen::cuda_emulation::DIMS_SUFFIX
                );
                // SAFETY: `emulated_source` wrote this entry point with that signature.
                Ok(Some(unsafe { library.entry::<EmulatedDimsFn>(&symbol)? }))
            })
            .collect::<Result<Vec<_>>>()?;
        let entries = kernels
            .iter()
            .map(|k| {
                Ok(match convention {
                    CallingConvention::C => {
                        // SAFETY: the symbol has the convention's signature (this function's
                        // contract).
                        Entry::C(unsafe { library.entry::<KernelFn>(&k.symbol)? })
                    }
                    CallingConvention::EmulatedCuda => {
                        // SAFETY: as above.
                        Entry::Emulated(unsafe { library.entry::<EmulatedFn>(&k.symbol)? })
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(CcBatch {
            backend: self.backend,
            kernels,
            source,
            entries,
            dims_entries,
            workers: self.workers.clone(),
            cache_hit,
            _library: library,
            _providers: providers,
        }))
    }
}

/// The translation units of a rendered program, as the compiler takes them.
fn units_of(program: &CpuProgram) -> Vec<compile::Unit<'_>> {
    program
        .units
        .iter()
        .map(|(suffix, source)| compile::Unit { suffix, source })
        .collect()
}

//! Backends by name, devices, and compilation of assignments into code.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrayjit_backends::{CompileOptions, LoweredBackend};
use arrayjit_ir::{Assignments, Error, Result, StaticSymbol};
use arrayjit_opt::{OptimizeCtx, OptimizeSettings, optimize, optimize_in};

use arrayjit_backends::settings;

use crate::array_entry::SharedArrays;
use crate::code::Code;
use crate::compile_request::{CompileRequest, RoutineSource};
use crate::config::{RuntimeConfig, Strategy};
use crate::registry;
use crate::scheduler::SchedulerKind;
use crate::search::{self, ScheduleChoice, SearchReport, SearchSettings};

pub use crate::registry::KNOWN_BACKENDS;

/// The backend used when neither a name nor `ARRAYJIT_BACKEND` says otherwise.
pub const DEFAULT_BACKEND: &str = "sync_cc";

/// The backend called `name` (see [`KNOWN_BACKENDS`]). An unknown name is
/// [`Error::UnknownBackend`], listing the available ones; a known but unavailable backend is
/// returned as a placeholder with no devices whose calls fail with
/// [`Error::BackendUnavailable`].
pub fn backend(name: &str) -> Result<Backend> {
    backend_with_config(name, &RuntimeConfig::default())
}

/// Like [`backend`], with explicit settings.
pub fn backend_with_config(name: &str, config: &RuntimeConfig) -> Result<Backend> {
    config.validate()?;
    let entry = registry::find(name).ok_or_else(|| Error::UnknownBackend {
        name: name.to_string(),
        available: available_backends().join(", "),
    })?;
    let (lowered, scheduler) = (entry.make)(entry.name, config)?;
    let canonical = entry.name;
    let b = Backend::with_scheduler(canonical, lowered, scheduler, config.strategy);
    b.set_max_pool_bytes(config.max_pool_bytes_or_env()?);
    b.set_memory_limit(config.memory_limit_or_env()?);
    Ok(b)
}

/// The backends [`initialize`] made, one per name, with their settings: the process-wide
/// backends (the reference's `initialize` / `is_initialized`).
static INITIALIZED: Mutex<Vec<(&'static str, RuntimeConfig, Backend)>> = Mutex::new(Vec::new());

/// Resolves a backend (by name, or the default one) and checks that it can run here: the one
/// call that starts arrayjit. An unavailable backend is an error here rather than a placeholder.
///
/// The backend is process-wide: a later `initialize` of the same name returns the same backend
/// (same devices, so constants and arrays shared across streams are not duplicated). Use
/// [`backend`] for a separate instance.
pub fn initialize(name: Option<&str>) -> Result<Backend> {
    initialize_with_config(name, &RuntimeConfig::default())
}

/// Like [`initialize`], with a strategy, a number of CPU devices and queue settings. A backend
/// already initialized in this process with other settings is an [`Error::InvalidSetting`]
/// (its devices exist already); with the same settings it is returned.
pub fn initialize_with_config(name: Option<&str>, config: &RuntimeConfig) -> Result<Backend> {
    let name = name.map_or_else(default_backend_name, str::to_string);
    let canonical = registry::find(&name)
        .ok_or_else(|| Error::UnknownBackend {
            name: name.clone(),
            available: available_backends().join(", "),
        })?
        .name;
    let mut made = INITIALIZED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, settings, b)) = made.iter().find(|(n, ..)| *n == canonical) {
        if settings != config {
            return Err(Error::InvalidSetting {
                setting: format!("RuntimeConfig of initialize({canonical})"),
                value: format!("{config:?}"),
                expected: format!(
                    "the settings {canonical} was initialized with in this process \
                     ({settings:?}): a backend is initialized once per process; use \
                     backend_with_config for another instance"
                ),
            });
        }
        return Ok(b.clone());
    }
    let b = backend_with_config(canonical, config)?;
    b.check_available()?;
    made.push((canonical, config.clone(), b.clone()));
    Ok(b)
}

/// Whether [`initialize`] has made the backend called `name` in this process (false for an
/// unknown name; a backend made by [`backend`] does not count).
pub fn is_initialized(name: &str) -> bool {
    let Some(entry) = registry::find(name) else {
        return false;
    };
    INITIALIZED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|(n, ..)| *n == entry.name)
}

/// The backend named by `ARRAYJIT_BACKEND`, else `sync_cc`.
pub fn default_backend() -> Result<Backend> {
    backend(&default_backend_name())
}

/// `ARRAYJIT_BACKEND` if set, else [`DEFAULT_BACKEND`].
fn default_backend_name() -> String {
    std::env::var("ARRAYJIT_BACKEND")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_BACKEND.to_string())
}

/// The names of the backends that can run here: the registry rows whose lowered backend can
/// be made with the default settings and says it is available.
pub fn available_backends() -> Vec<&'static str> {
    registry::REGISTRY
        .iter()
        .filter(|e| {
            (e.make)(e.name, &RuntimeConfig::default())
                .is_ok_and(|(lowered, _)| lowered.check_available().is_ok())
        })
        .map(|e| e.name)
        .collect()
}

pub(crate) struct BackendInner {
    pub name: String,
    pub lowered: Arc<LoweredBackend>,
    pub settings: Mutex<OptimizeSettings>,
    pub scheduler: SchedulerKind,
    pub strategy: Strategy,
    /// Unique id of device 0; device `k` is `device_uid_base + k`.
    pub device_uid_base: usize,
    /// Per device: arrays shared across the device's streams (and deduplicated constants).
    pub shared_arrays: Vec<SharedArrays>,
    /// The next pool id.
    pub next_pool_id: AtomicUsize,
    /// Largest pool the planner allocates.
    pub max_pool_bytes: AtomicUsize,
    /// The most bytes each device's arrays may take (`usize::MAX`: no limit).
    pub memory_limit: AtomicUsize,
    /// Schedule search: on/off (`None`: `ARRAYJIT_SEARCH`) and how candidates are timed.
    pub search: Mutex<(Option<bool>, SearchSettings)>,
    /// Compile options other than the lowered backend's defaults, if set.
    pub compile_options: Mutex<Option<CompileOptions>>,
    /// TF32 products on matrix units: allowed or not (`None`: `ARRAYJIT_ALLOW_TF32`).
    pub allow_tf32: Mutex<Option<bool>>,
}

/// A backend: a lowered backend with a scheduler (`Sync` or `Multicore`).
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.inner.name)
    }
}

impl Backend {
    /// Wraps a lowered backend under a name, with the `Sync` scheduler.
    pub fn from_lowered(name: &str, lowered: Arc<LoweredBackend>) -> Backend {
        Backend::with_scheduler(name, lowered, SchedulerKind::Sync, Strategy::default())
    }

    /// Wraps a lowered backend under a name with a scheduler and strategy.
    pub fn with_scheduler(
        name: &str,
        lowered: Arc<LoweredBackend>,
        scheduler: SchedulerKind,
        strategy: Strategy,
    ) -> Backend {
        crate::observe::trace_from_env();
        static NEXT_DEVICE_UID: AtomicUsize = AtomicUsize::new(0);
        let n = lowered.runtime().num_devices();
        let schedule = lowered.schedule_settings();
        let pool_alignment = OptimizeSettings::default()
            .pool_alignment
            .max(lowered.runtime().pool_alignment());
        Backend {
            inner: Arc::new(BackendInner {
                name: name.to_string(),
                device_uid_base: NEXT_DEVICE_UID.fetch_add(n.max(1), Ordering::Relaxed),
                shared_arrays: (0..n).map(|_| SharedArrays::default()).collect(),
                lowered,
                // Schedules tuned to the lowered backend's devices.
                settings: Mutex::new(OptimizeSettings {
                    schedule,
                    pool_alignment,
                    ..OptimizeSettings::default()
                }),
                scheduler,
                strategy,
                next_pool_id: AtomicUsize::new(0),
                max_pool_bytes: AtomicUsize::new(crate::config::DEFAULT_MAX_POOL_BYTES),
                memory_limit: AtomicUsize::new(usize::MAX),
                search: Mutex::new((None, SearchSettings::default())),
                compile_options: Mutex::new(None),
                allow_tf32: Mutex::new(None),
            }),
        }
    }

    /// Sets the largest pool the link-time planner groups arrays into (at least one byte).
    /// An array larger than it gets a pool of its own; pools planned already stay as they are.
    pub fn set_max_pool_bytes(&self, bytes: usize) {
        self.inner
            .max_pool_bytes
            .store(bytes.max(1), Ordering::Relaxed);
    }

    /// The largest pool the link-time planner groups arrays into.
    pub fn max_pool_bytes(&self) -> usize {
        self.inner.max_pool_bytes.load(Ordering::Relaxed)
    }

    /// Sets the most bytes each device's arrays may take (`None`: no limit but the devices'
    /// free memory). A link that would pass it is an [`Error::DeviceOutOfMemory`] before
    /// anything is allocated; arrays already linked are kept whatever the new limit.
    pub fn set_memory_limit(&self, bytes: Option<usize>) {
        self.inner
            .memory_limit
            .store(bytes.map_or(usize::MAX, |b| b.max(1)), Ordering::Relaxed);
    }

    /// The most bytes each device's arrays may take, if limited (see
    /// [`Backend::set_memory_limit`]).
    pub fn memory_limit(&self) -> Option<usize> {
        let limit = self.inner.memory_limit.load(Ordering::Relaxed);
        (limit != usize::MAX).then_some(limit)
    }

    pub(crate) fn new_pool_id(&self) -> usize {
        self.inner.next_pool_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The scheduler the backend's streams use.
    pub fn scheduler(&self) -> SchedulerKind {
        self.inner.scheduler
    }

    /// The parallelism strategy.
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// Whether two handles refer to the same backend (e.g. two [`initialize`] calls).
    pub fn same_as(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The backend's name, e.g. `"sync_cc"`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The lowered backend underneath.
    pub fn lowered(&self) -> &Arc<LoweredBackend> {
        &self.inner.lowered
    }

    /// `Ok` if the backend can run here, or why not.
    pub fn check_available(&self) -> Result<()> {
        self.inner.lowered.check_available()
    }

    /// Number of devices (0 for an unavailable backend).
    pub fn num_devices(&self) -> usize {
        self.inner.lowered.runtime().num_devices()
    }

    /// The optimizer settings used by [`Backend::compile`].
    pub fn optimize_settings(&self) -> OptimizeSettings {
        self.inner
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the optimizer settings, keeping what the backend's devices require: a pool
    /// alignment below the backend's is raised to it, and GPU limits left out
    /// (`schedule.gpu: None`, as in `OptimizeSettings::default()`) are the device's, since a GPU
    /// backend's schedules and renderers need them. GPU limits given are used as given (e.g.
    /// smaller groups than the device allows); on a CPU backend they are ignored by its
    /// renderer.
    pub fn set_optimize_settings(&self, mut settings: OptimizeSettings) {
        if settings.schedule.gpu.is_none() {
            settings.schedule.gpu = self.inner.lowered.gpu_limits();
        }
        settings.pool_alignment = settings
            .pool_alignment
            .max(self.inner.lowered.runtime().pool_alignment());
        *self
            .inner
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = settings;
    }

    /// The options later compiles use (the reference's `Compiler.compile_options`): those set by
    /// [`Backend::set_compile_options`], else the lowered backend's defaults (its
    /// `default_options`: for `cc`, its C compiler's flags).
    pub fn compile_options(&self) -> CompileOptions {
        self.inner
            .compile_options
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| self.inner.lowered.default_compile_options())
    }

    /// Sets the options later compiles of this backend use (`None`: its defaults), e.g. the C
    /// compiler's flags without `-march=native` for code that must run on other machines, or
    /// without fast math. Options the backend cannot take are an error when compiling, and
    /// compiled code is cached per options.
    pub fn set_compile_options(&self, options: Option<CompileOptions>) {
        *self
            .inner
            .compile_options
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = options;
    }

    /// The one way to compile: optimizes the request's routines for this backend's settings
    /// (with the schedule search on, [`Backend::schedule_search_enabled`], each with its
    /// stored schedule choice, searched first where none is stored: see [`crate::search`]) in
    /// the request's optimize context, in order, then renders and compiles them together (one
    /// compiler run). What comes back is typed by how the request was made
    /// ([`CompileRequest::routine`]: a [`Code`]; [`CompileRequest::batch`] and
    /// [`CompileRequest::optimized`]: a `Vec<Code>`; [`CompileRequest::slots`]: a
    /// `Vec<Option<Code>>`). A request of only empty slots compiles nothing.
    pub fn compile<Out>(&self, request: CompileRequest<'_, Out>) -> Result<Out> {
        let fresh;
        let ctx = match request.ctx {
            Some(ctx) => ctx,
            None => {
                fresh = OptimizeCtx::empty();
                &fresh
            }
        };
        let optimized = request
            .slots
            .iter()
            .flatten()
            .map(|source| match source {
                RoutineSource::Assignments(name, assignments) => {
                    self.optimize_in(ctx, name, assignments, request.bindings)
                }
                RoutineSource::Optimized(o) => Ok(o.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut codes = if optimized.is_empty() {
            Vec::new()
        } else {
            self.compile_optimized(&optimized)?
        }
        .into_iter();
        let slots = request
            .slots
            .iter()
            .map(|s| s.as_ref().and_then(|_| codes.next()))
            .collect();
        request.give(slots)
    }

    /// The first half of [`Backend::compile`]: optimizes one routine for this backend's
    /// settings (and, with the schedule search on, its stored or searched schedule choice)
    /// without rendering or compiling it. The result says which arrays the routine needs, so
    /// a context can make them ([`Context::prepare_link`](crate::context::Context::prepare_link))
    /// while [`Backend::compile`] of [`CompileRequest::optimized`] compiles it on another
    /// thread.
    pub fn optimize_in(
        &self,
        ctx: &OptimizeCtx,
        name: &str,
        assignments: &Assignments,
        bindings: &[StaticSymbol],
    ) -> Result<Arc<arrayjit_opt::Optimized>> {
        self.check_available()?;
        let settings = self.compile_settings()?;
        let heuristic = {
            let _optimize = arrayjit_ir::trace::compile_phase("optimize", name);
            optimize_in(ctx, name, bindings, assignments, &settings)?
        };
        if !self.schedule_search_enabled()? {
            return Ok(Arc::new(heuristic));
        }
        let lowered = self.inner.lowered.as_ref();
        let choice = match search::stored_choice(lowered, &heuristic) {
            Some(choice) => choice,
            None => {
                let report = search::search(
                    lowered,
                    (name, assignments, bindings),
                    &settings,
                    &heuristic,
                    &self.search_settings(),
                )?;
                tracing::info!("{report}");
                report.winner
            }
        };
        if choice == ScheduleChoice::of(&settings) {
            Ok(Arc::new(heuristic))
        } else {
            optimize_in(ctx, name, bindings, assignments, &choice.apply(&settings)).map(Arc::new)
        }
    }

    /// The second half of [`Backend::compile`]: renders and compiles routines that
    /// [`Backend::optimize_in`] of this backend optimized, together (one compiler run), in
    /// order.
    fn compile_optimized(&self, optimized: &[Arc<arrayjit_opt::Optimized>]) -> Result<Vec<Code>> {
        self.check_available()?;
        // A precision the devices cannot compute in is an error before any compiler runs.
        let info = self.inner.lowered.device_info(0)?;
        for o in optimized {
            info.check_precisions(
                &format!("{}:0", self.name()),
                o.nodes.iter().filter(|r| r.used).map(|r| &r.tn),
            )?;
        }
        let refs: Vec<&arrayjit_opt::Optimized> = optimized.iter().map(|o| o.as_ref()).collect();
        let started = std::time::Instant::now();
        let options = self
            .inner
            .compile_options
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Render, then compile what was rendered; linking is the context's.
        let lowered = &self.inner.lowered;
        let program = lowered.render(&refs)?;
        let batch = match options {
            Some(options) => lowered.compile_with(program, &options)?,
            None => lowered.compile(program)?,
        };
        crate::observe::list_compiled(
            self.name(),
            self.optimize_settings().schedule.gpu,
            optimized,
            batch.as_ref(),
            started.elapsed(),
        )?;
        Ok(optimized
            .iter()
            .cloned()
            .enumerate()
            .map(|(index, optimized)| Code {
                backend_name: self.name().to_string(),
                batch: batch.clone(),
                index,
                optimized,
            })
            .collect())
    }

    /// Allows or forbids `f32` matrix products on a GPU's matrix units as TF32 (inputs rounded
    /// to 10 mantissa bits, as PyTorch's `allow_tf32`) for later compiles; `None` (the
    /// default) follows `ARRAYJIT_ALLOW_TF32` (a yes/no setting, off when unset). Optimizer
    /// settings that allow it ([`arrayjit_opt::schedule::ScheduleSettings::allow_tf32`]) allow it
    /// unless this forbids it.
    pub fn set_allow_tf32(&self, allow: Option<bool>) {
        *self
            .inner
            .allow_tf32
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = allow;
    }

    /// The optimizer settings compiles use: [`Backend::optimize_settings`] with TF32 allowed as
    /// [`Backend::set_allow_tf32`] says (an invalid `ARRAYJIT_ALLOW_TF32` is an
    /// [`Error::InvalidSetting`]), and statements timed while runs are listed
    /// (`ARRAYJIT_DEBUG` 2 or more).
    pub fn compile_settings(&self) -> Result<OptimizeSettings> {
        let mut settings = self.optimize_settings();
        // Listing runs (`ARRAYJIT_DEBUG` 2 or more) lists each run's slowest statements.
        settings.profile_statements |= crate::observe::lists_runs();
        let chosen = *self
            .inner
            .allow_tf32
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        settings.schedule.allow_tf32 = match chosen {
            Some(allow) => allow,
            None => {
                settings.schedule.allow_tf32
                    || settings::flag(&settings::process_env, "ARRAYJIT_ALLOW_TF32", false)?
            }
        };
        Ok(settings)
    }

    /// Turns the schedule search on or off for [`Backend::compile`]; `None` (the default)
    /// follows `ARRAYJIT_SEARCH` (a yes/no setting, off when unset).
    pub fn set_schedule_search(&self, on: Option<bool>) {
        self.inner
            .search
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0 = on;
    }

    /// Whether compiling uses searched schedule choices: the value given to
    /// [`Backend::set_schedule_search`], else `ARRAYJIT_SEARCH` (an invalid value is an
    /// [`Error::InvalidSetting`]).
    pub fn schedule_search_enabled(&self) -> Result<bool> {
        match self
            .inner
            .search
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
        {
            Some(on) => Ok(on),
            None => settings::flag(&settings::process_env, "ARRAYJIT_SEARCH", false),
        }
    }

    /// How the schedule search times candidates.
    pub fn search_settings(&self) -> SearchSettings {
        self.inner
            .search
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Replaces how the schedule search times candidates.
    pub fn set_search_settings(&self, settings: SearchSettings) {
        self.inner
            .search
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1 = settings;
    }

    /// Searches the schedules of one routine now, whether or not a choice is stored: times
    /// the heuristics' schedule and variants of it (see [`crate::search`]), stores the fastest
    /// next to the compile cache, and reports every candidate. [`Backend::compile`] uses the
    /// stored choice when the search is on.
    pub fn search_schedule(
        &self,
        name: &str,
        assignments: &Assignments,
        bindings: &[StaticSymbol],
    ) -> Result<SearchReport> {
        self.check_available()?;
        let settings = self.compile_settings()?;
        let heuristic = optimize(name, bindings, assignments, &settings)?;
        search::search(
            self.inner.lowered.as_ref(),
            (name, assignments, bindings),
            &settings,
            &heuristic,
            &self.search_settings(),
        )
    }

    /// Backend-specific debug information.
    pub fn debug_info(&self) -> String {
        format!("{}: {}", self.name(), self.inner.lowered.debug_info())
    }
}

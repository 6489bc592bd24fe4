//! Running the C compiler, the persistent compile cache, and loading shared libraries.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use arrayjit_ir::error::CompileFailure;
use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{Error, Result, trace};

use super::{CcConfig, object_cache};
use crate::compile_cache::{open_verified, private_dir, seal, unique_suffix};

/// Counters of compilations in this process.
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

static COMPILED: AtomicUsize = AtomicUsize::new(0);
static CACHE_HITS: AtomicUsize = AtomicUsize::new(0);
static COMPILE_MICROS: AtomicU64 = AtomicU64::new(0);

/// The compile counters of this process so far.
pub fn compile_stats() -> CompileStats {
    CompileStats {
        compiled: COMPILED.load(Ordering::Relaxed),
        cache_hits: CACHE_HITS.load(Ordering::Relaxed),
        object_hits: super::object_cache::OBJECT_HITS.load(Ordering::Relaxed),
        imported_functions: super::shared_functions::IMPORTED.load(Ordering::Relaxed),
        compile_micros: COMPILE_MICROS.load(Ordering::Relaxed),
    }
}

fn unavailable(compiler: &str, reason: String) -> Error {
    Error::BackendUnavailable {
        backend: "cc".into(),
        reason,
        how_to_enable: format!(
            "install a C compiler (e.g. `apt-get install gcc`) or point CC at one (CC is `{compiler}`)"
        ),
    }
}

/// The compiler as a command: `CC` may hold a wrapper or arguments (`ccache gcc`,
/// `gcc -std=gnu11`), split on whitespace as make and the `cc` crate do.
pub(super) fn compiler_command(compiler: &str) -> Command {
    let mut parts = compiler.split_whitespace();
    let mut cmd = Command::new(parts.next().unwrap_or("cc"));
    cmd.args(parts);
    cmd
}

/// The first line of `compiler --version`, cached per compiler; an error if it cannot run.
pub(super) fn compiler_identity(compiler: &str, timeout: Duration) -> Result<String> {
    static IDS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let ids = IDS.get_or_init(Default::default);
    if let Some(id) = ids.lock().unwrap_or_else(|e| e.into_inner()).get(compiler) {
        return Ok(id.clone());
    }
    let mut cmd = compiler_command(compiler);
    cmd.arg("--version");
    let out = run_with_timeout(cmd, timeout).map_err(|e| {
        unavailable(
            compiler,
            format!("the C compiler `{compiler} --version` could not be run: {e}"),
        )
    })?;
    if !out.status.success() {
        return Err(unavailable(
            compiler,
            format!("`{compiler} --version` failed with {}", out.status),
        ));
    }
    let id = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    ids.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(compiler.to_string(), id.clone());
    Ok(id)
}

/// What identifies this CPU for `-march=native` code: model and feature flags.
pub(super) fn cpu_identity() -> &'static str {
    static CPU: OnceLock<String> = OnceLock::new();
    CPU.get_or_init(|| {
        let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        format!(
            "{} | {} | {}",
            std::env::consts::ARCH,
            field("model name"),
            field("flags")
        )
    })
}

/// Runs `cmd` with its output captured; kills it and returns a `TimedOut` error if it runs
/// longer than `timeout`.
pub(super) fn run_with_timeout(mut cmd: Command, timeout: Duration) -> std::io::Result<Output> {
    use std::io::Read as _;
    use std::os::unix::process::CommandExt as _;
    // A process group of its own, so that a timeout kills the compiler's children too (they
    // would otherwise keep its pipes open).
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A compiler (or wrapper script) written just now can be briefly "busy" (ETXTBSY) while
    // another thread of the process forks with the file's write descriptor still inherited
    // (it closes at that child's exec): retry for a moment instead of failing.
    let mut attempts = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other?,
        }
    };
    // Drain both pipes on threads, so a chatty compiler cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= timeout {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill has no memory-safety preconditions; the group is the child's own.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "killed after {:.0} s (the timeout; set ARRAYJIT_CC_TIMEOUT_SECS to change it)",
                    timeout.as_secs_f64()
                ),
            ));
        }
        std::thread::sleep(
            Duration::from_millis(2)
                .max(started.elapsed() / 50)
                .min(Duration::from_millis(50)),
        );
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// The text of an error and all its sources, joined.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

/// At most `limit` bytes of `text`: its head and tail around a note of what was left out.
fn head_and_tail(text: &str, limit: usize, rest_at: Option<&Path>) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let half = limit / 2;
    let head_end = (0..=half)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let tail_start = (text.len() - half..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    let where_ = rest_at.map_or("".into(), |p| format!("; all of it is in {}", p.display()));
    format!(
        "{}\n[... {} bytes left out{where_} ...]\n{}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

/// How much compiler output an error message carries.
const STDERR_IN_ERROR: usize = 16 * 1024;

/// Build folders older than this are left over by a crashed process and are removed.
const STALE_BUILD_AGE: Duration = Duration::from_secs(3600);

/// Deletes the least recently used libraries of the cache until it holds at most `max_bytes`,
/// and build folders a crashed process left behind. Only this user's regular files are
/// counted or deleted; links are never followed. Failures only mean the cache stays larger.
/// Processes that loaded a library keep it when it is deleted (it is mapped). `keep`, the
/// library just added, is never deleted.
fn trim_cache(dir: &Path, max_bytes: u64, keep: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let now = SystemTime::now();
    let mut libs: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if meta.is_dir() && name.starts_with("arrayjit-build-") && age > STALE_BUILD_AGE {
            let _ = fs::remove_dir_all(&path);
        } else if meta.is_file()
            && meta.uid() == uid
            && (name.ends_with(".so") || name.ends_with(".o"))
            && path != keep
        {
            libs.push((meta.modified().unwrap_or(now), meta.len(), path));
        }
    }
    let keep_len = fs::symlink_metadata(keep).map_or(0, |m| m.len());
    let mut total: u64 = keep_len + libs.iter().map(|(_, len, _)| len).sum::<u64>();
    libs.sort();
    for (_, len, path) in libs {
        if total <= max_bytes {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// A loaded library; kept alive as long as any kernel from it may run.
pub(super) struct LoadedLibrary {
    library: libloading::Library,
    path: PathBuf,
}

impl LoadedLibrary {
    /// Loads the library at `path`, which [`open_verified`] just checked. The dynamic loader
    /// takes a path (and reuses an already loaded library of the same path), so the check and
    /// the load see the same file unless a process of this same user replaces it in between;
    /// the cache folder is private to this user.
    fn load(path: &Path) -> Result<LoadedLibrary> {
        // SAFETY: the library was produced by the C compiler from arrayjit's own generated
        // source (checked by its seal when it comes from the private cache); its only
        // initializers are the C runtime's.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| Error::LoadFailed {
            path: path.display().to_string(),
            detail: error_chain(&e),
        })?;
        Ok(LoadedLibrary {
            library,
            path: path.to_path_buf(),
        })
    }

    /// The exported function `symbol`, as a `F` (a function pointer type).
    ///
    /// # Safety
    /// `F` must be the function's signature.
    pub(super) unsafe fn entry<F: Copy>(&self, symbol: &str) -> Result<F> {
        // SAFETY: the caller names the signature the generated function has.
        let f =
            unsafe { self.library.get::<F>(symbol.as_bytes()) }.map_err(|e| Error::LoadFailed {
                path: self.path.display().to_string(),
                detail: format!("symbol {symbol}: {}", error_chain(&e)),
            })?;
        Ok(*f)
    }
}

/// One translation unit of a library: a suffix for its file name and its source.
#[derive(Clone, Copy, Debug)]
pub(super) struct Unit<'a> {
    /// Appended to the library's file stem (empty for the kernels' unit).
    pub suffix: &'a str,
    /// The C source.
    pub source: &'a str,
}

/// The cache key of a library's units for this compiler, its flags and this CPU.
fn cache_key(config: &CcConfig, compiler_id: &str, units: &[Unit]) -> String {
    let mut hasher = blake3::Hasher::new();
    for u in units {
        hasher.update(u.suffix.as_bytes());
        hasher.update(&[0]);
        hasher.update(u.source.as_bytes());
        hasher.update(&[0]);
    }
    for part in [
        &config.compiler,
        compiler_id,
        &config.flags.join(" "),
        cpu_identity(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    hasher.finalize().to_hex().to_string()
}

/// Whether the library of these units is in the compile cache, sound (its seal verified), so
/// that [`compile_and_load`] would load it without compiling.
pub(super) fn is_cached(config: &CcConfig, units: &[Unit]) -> bool {
    let (Some(dir), Ok(compiler_id)) = (
        config.cache_dir.as_ref(),
        compiler_identity(&config.compiler, config.compile_timeout),
    ) else {
        return false;
    };
    let key = cache_key(config, &compiler_id, units);
    open_verified(&dir.join(format!("{key}.so")), &key).is_ok()
}

/// Compiles the units into one library (or finds it in the cache) and loads it. The first
/// unit is the kernels'; several units are compiled in parallel, then linked.
pub(super) fn compile_and_load(
    config: &CcConfig,
    units: &[Unit],
    name: &str,
) -> Result<(Arc<LoadedLibrary>, bool)> {
    let compiler_id = compiler_identity(&config.compiler, config.compile_timeout)?;
    let key = cache_key(config, &compiler_id, units);
    let stem = format!(
        "{}_{}",
        sanitize_identifier(name)
            .chars()
            .take(40)
            .collect::<String>(),
        &key[..16]
    );

    if let Some(dir) = &config.build_files_dir {
        let written = fs::create_dir_all(dir).and_then(|()| {
            units
                .iter()
                .try_for_each(|u| fs::write(dir.join(format!("{stem}{}.c", u.suffix)), u.source))
        });
        if let Err(e) = written {
            tracing::warn!(
                "cannot keep the generated source in the build-files folder {}: {e}; compiling anyway",
                dir.display()
            );
        }
    }

    // A cache folder that cannot be made private (unwritable, or someone else's) is not used:
    // compiling without the cache is always safe.
    let cache_dir = config
        .cache_dir
        .as_ref()
        .filter(|dir| match private_dir(dir) {
            Ok(()) => true,
            Err(e) => {
                crate::notice::warn_user(&format!(
                    "compiling without the compile cache (ARRAYJIT_CACHE_DIR): {e}; every \
                     program is compiled anew"
                ));
                false
            }
        });
    if let Some(dir) = cache_dir {
        let lib = dir.join(format!("{key}.so"));
        let mut phase = trace::compile_phase("cache hit", name);
        match open_verified(&lib, &key) {
            Ok(file) => match LoadedLibrary::load(&lib) {
                Ok(loaded) => {
                    CACHE_HITS.fetch_add(1, Ordering::Relaxed);
                    // Mark it recently used, for the cache trimming.
                    let _ = file.set_modified(SystemTime::now());
                    return Ok((Arc::new(loaded), true));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "recompiling a cached library that failed to load")
                }
            },
            Err(why) if lib.exists() || fs::symlink_metadata(&lib).is_ok() => {
                tracing::warn!("not loading {}: {why}; recompiling", lib.display());
            }
            Err(_) => {}
        }
        if let Some(p) = phase.as_mut() {
            p.rename(format!("cache miss {name}"));
        }
    }

    // Build inside the cache folder (so the final rename is atomic); if that fails (full
    // disk, unwritable folder), in a private temporary folder without caching.
    let compiling = trace::compile_phase("compile", name);
    let uncached = || {
        let temp = std::env::temp_dir();
        build(config, &compiler_id, units, name, &stem, &temp, false).map(|b| (b, None))
    };
    let built = match cache_dir {
        Some(dir) => match build(config, &compiler_id, units, name, &stem, dir, true) {
            Err(Error::Io { context, source: e }) => {
                tracing::warn!(
                    "cannot build in the compile cache ({context}: {e}); compiling without it"
                );
                uncached()
            }
            other => other.map(|b| (b, Some(dir))),
        },
        None => uncached(),
    };
    drop(compiling);
    let ((work, lib_tmp), cache_dir) = built?;
    seal(&lib_tmp, &key).map_err(|e| Error::io(format!("writing {}", lib_tmp.display()), e))?;
    // Load first, from the private build folder: whatever happens to the cache afterwards
    // (another process trimming it) cannot take the library away.
    let loaded = {
        let _load = trace::compile_phase("load", name);
        LoadedLibrary::load(&lib_tmp)?
    };
    if let Some(dir) = cache_dir {
        let lib = dir.join(format!("{key}.so"));
        match fs::rename(&lib_tmp, &lib) {
            Ok(()) => trim_cache(dir, config.cache_max_bytes, &lib),
            Err(e) => tracing::warn!("cannot add {} to the compile cache: {e}", lib.display()),
        }
    }
    // The work folder (and, without a cache, the library file) goes; the library stays loaded.
    drop(work);
    Ok((Arc::new(loaded), false))
}

/// Writes the units into a new build folder under `parent` and compiles them into a library;
/// returns the folder and the library's path. One unit is compiled straight into the library;
/// several are compiled to objects in parallel (one compiler process each), then linked. With
/// `cache_objects`, `parent` is the compile cache and each unit's object is taken from it when
/// it was compiled before, and kept in it otherwise ([`super::object_cache`]). A compiler
/// failure keeps the failing unit's source (and the full compiler output) where the error says.
fn build(
    config: &CcConfig,
    compiler_id: &str,
    units: &[Unit],
    name: &str,
    stem: &str,
    parent: &Path,
    cache_objects: bool,
) -> Result<(tempfile::TempDir, PathBuf)> {
    let work = tempfile::Builder::new()
        .prefix("arrayjit-build-")
        .tempdir_in(parent)
        .map_err(|e| {
            Error::io(
                format!("creating a build folder in {}", parent.display()),
                e,
            )
        })?;
    let lib_tmp = work.path().join(format!("{stem}-{}.so", unique_suffix()));
    let mut sources = Vec::with_capacity(units.len());
    for u in units {
        let path = work.path().join(format!("{stem}{}.c", u.suffix));
        fs::File::create(&path)
            .and_then(|mut f| f.write_all(u.source.as_bytes()))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        sources.push(path);
    }
    let started = Instant::now();
    let result = if units.len() == 1 {
        let step = Step::new(config, &config.flags, &lib_tmp, &sources);
        step.run(config, units[0].source, stem, name)
    } else {
        // Objects: the library flags without `-shared`, plus `-c`.
        let mut object_flags: Vec<String> = config
            .flags
            .iter()
            .filter(|f| f.as_str() != "-shared")
            .cloned()
            .collect();
        object_flags.push("-c".into());
        let objects: Vec<PathBuf> = sources.iter().map(|s| s.with_extension("o")).collect();
        let compiled: Vec<Result<()>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = units
                .iter()
                .zip(sources.iter().zip(&objects))
                .map(|(u, (src, obj))| {
                    let step = Step::new(config, &object_flags, obj, std::slice::from_ref(src));
                    let unit_stem = format!("{stem}{}", u.suffix);
                    let object_flags = &object_flags;
                    scope.spawn(move || {
                        let key = cache_objects.then(|| {
                            object_cache::object_key(config, compiler_id, object_flags, u.source)
                        });
                        if let Some(key) = &key
                            && object_cache::fetch(parent, key, obj)
                        {
                            return Ok(());
                        }
                        step.run(config, u.source, &unit_stem, name)?;
                        if let Some(key) = &key {
                            object_cache::store(parent, key, obj);
                        }
                        Ok(())
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join().unwrap_or_else(|_| {
                        Err(unavailable(
                            &config.compiler,
                            "a compiler thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        compiled
            .into_iter()
            .collect::<Result<Vec<()>>>()
            .and_then(|_| {
                Step::new(config, &config.flags, &lib_tmp, &objects).run(
                    config,
                    units[0].source,
                    stem,
                    name,
                )
            })
    };
    COMPILE_MICROS.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    result?;
    if !lib_tmp.is_file() {
        return Err(Error::CompileFailed(Box::new(CompileFailure {
            routine: name.to_string(),
            command: format!("{} {}", config.compiler, config.flags.join(" ")),
            status: format!("success, but it wrote no library at {}", lib_tmp.display()),
            source_path: "(not kept)".into(),
            stderr: String::new(),
        })));
    }
    COMPILED.fetch_add(1, Ordering::Relaxed);
    Ok((work, lib_tmp))
}

/// One compiler invocation: `compiler flags -o output inputs`.
struct Step {
    cmd: Command,
    command_line: String,
}

impl Step {
    fn new(config: &CcConfig, flags: &[String], output: &Path, inputs: &[PathBuf]) -> Step {
        let mut cmd = compiler_command(&config.compiler);
        cmd.args(flags).arg("-o").arg(output).args(inputs);
        let inputs_text: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
        Step {
            cmd,
            command_line: format!(
                "{} {} -o {} {}",
                config.compiler,
                flags.join(" "),
                output.display(),
                inputs_text.join(" ")
            ),
        }
    }

    /// Runs the step; a failure is a `CompileFailed` naming the routine, with `source` kept
    /// for the user under `stem`.
    fn run(self, config: &CcConfig, source: &str, stem: &str, name: &str) -> Result<()> {
        let (status, stderr) = match run_with_timeout(self.cmd, config.compile_timeout) {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => (out.status.to_string(), out.stderr),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => (e.to_string(), vec![]),
            Err(e) => {
                return Err(unavailable(
                    &config.compiler,
                    format!("running `{}` failed: {e}", config.compiler),
                ));
            }
        };
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        let (kept_source, kept_stderr) = keep_failed_build(config, source, stem, &stderr);
        Err(Error::CompileFailed(Box::new(CompileFailure {
            routine: name.to_string(),
            command: self.command_line,
            status,
            source_path: kept_source
                .map_or_else(|| "(could not be kept)".into(), |p| p.display().to_string()),
            stderr: head_and_tail(&stderr, STDERR_IN_ERROR, kept_stderr.as_deref()),
        })))
    }
}

/// Keeps a failed build's source (and, when long, the compiler's output) for the user: in the
/// build-files folder if set, else in a private `failed` folder of the cache, else in the
/// temporary folder under a fresh name. The build folder itself is always removed.
fn keep_failed_build(
    config: &CcConfig,
    source: &str,
    stem: &str,
    stderr: &str,
) -> (Option<PathBuf>, Option<PathBuf>) {
    let long = stderr.len() > STDERR_IN_ERROR;
    let write_in = |dir: &Path| -> std::io::Result<(PathBuf, Option<PathBuf>)> {
        let src = dir.join(format!("{stem}.c"));
        fs::write(&src, source)?;
        let err = if long {
            let p = dir.join(format!("{stem}.stderr.txt"));
            fs::write(&p, stderr)?;
            Some(p)
        } else {
            None
        };
        Ok((src, err))
    };
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(d) = &config.build_files_dir {
        places.push(d.clone());
    }
    if let Some(d) = &config.cache_dir {
        places.push(d.join("failed"));
    }
    for dir in places {
        if (private_dir(&dir).is_ok() || config.build_files_dir.as_ref() == Some(&dir))
            && let Ok((src, err)) = write_in(&dir)
        {
            return (Some(src), err);
        }
    }
    match tempfile::Builder::new()
        .prefix(&format!("arrayjit-failed-{stem}-"))
        .tempdir()
        .map(|d| d.keep())
    {
        Ok(dir) => match write_in(&dir) {
            Ok((src, err)) => (Some(src), err),
            Err(_) => (None, None),
        },
        Err(_) => (None, None),
    }
}

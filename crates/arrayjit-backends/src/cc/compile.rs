//! Building a library: the C compiler run over a library's units, through the persistent
//! compile cache and the object cache, and the library loaded.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use arrayjit_ir::error::CompileFailure;
use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{Error, Result, trace};

use super::library::LoadedLibrary;
use super::stats::{CACHE_HITS, COMPILE_MICROS, COMPILED};
use super::toolchain::{
    compiler_command, compiler_identity, cpu_identity, run_with_timeout, unavailable,
};
use super::{CcConfig, object_cache};
use crate::compile_cache::{open_verified, private_dir, seal, unique_suffix};

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

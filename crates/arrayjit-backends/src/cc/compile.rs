//! Running the C compiler, the persistent compile cache, and loading shared libraries.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use arrayjit_ir::error::CompileFailure;
use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{Error, Result};

use super::{CcConfig, KernelFn};

/// Counters of compilations in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Libraries built by the compiler.
    pub compiled: usize,
    /// Libraries found in the cache.
    pub cache_hits: usize,
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
        compile_micros: COMPILE_MICROS.load(Ordering::Relaxed),
    }
}

/// `$XDG_CACHE_HOME/arrayjit/cc`, else `$HOME/.cache/arrayjit/cc`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("arrayjit").join("cc"))
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

/// The first line of `compiler --version`, cached per compiler; an error if it cannot run.
pub(super) fn compiler_identity(compiler: &str) -> Result<String> {
    static IDS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let ids = IDS.get_or_init(Default::default);
    if let Some(id) = ids.lock().unwrap_or_else(|e| e.into_inner()).get(compiler) {
        return Ok(id.clone());
    }
    let out = Command::new(compiler)
        .arg("--version")
        .output()
        .map_err(|e| {
            unavailable(
                compiler,
                format!("the C compiler `{compiler}` could not be run: {e}"),
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
fn cpu_identity() -> &'static str {
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

/// Ensures `dir` exists, belongs to this user and is private (mode 0700); returns an error
/// explaining the problem otherwise.
fn private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("creating the cache folder {}", dir.display()), e))?;
    let meta = fs::metadata(dir)
        .map_err(|e| Error::io(format!("inspecting the cache folder {}", dir.display()), e))?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if meta.uid() != uid {
        return Err(Error::invalid(format!(
            "the compile cache {} belongs to user {} but this process runs as {uid}; refusing to load \
             libraries from it (set ARRAYJIT_CACHE_DIR to a folder of your own)",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("making {} private", dir.display()), e))?;
    }
    Ok(())
}

/// A cached library is trusted only if it belongs to this user and nobody else can write it.
fn trusted_file(path: &Path) -> bool {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.uid() == uid && m.mode() & 0o022 == 0)
}

fn unique_suffix() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deletes the least recently used libraries of the cache until it holds at most `max_bytes`
/// (never `keep`, the library just added). Failures only mean the cache stays larger.
fn trim_cache(dir: &Path, max_bytes: u64, keep: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut libs: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "so") && p != keep)
        .filter_map(|p| {
            let m = fs::metadata(&p).ok()?;
            Some((m.modified().ok()?, m.len(), p))
        })
        .collect();
    let keep_len = fs::metadata(keep).map_or(0, |m| m.len());
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
    fn load(path: &Path) -> Result<LoadedLibrary> {
        // SAFETY: the library was produced by the C compiler from arrayjit's own generated
        // source (or found in the private cache under a hash of that source); its only
        // initializers are the C runtime's.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| Error::LoadFailed {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        Ok(LoadedLibrary {
            library,
            path: path.to_path_buf(),
        })
    }

    pub(super) fn kernel(&self, symbol: &str) -> Result<KernelFn> {
        // SAFETY: every kernel arrayjit generates has the `KernelFn` signature.
        let f = unsafe { self.library.get::<KernelFn>(symbol.as_bytes()) }.map_err(|e| {
            Error::LoadFailed {
                path: self.path.display().to_string(),
                detail: format!("symbol {symbol}: {e}"),
            }
        })?;
        Ok(*f)
    }
}

/// Compiles `source` (or finds it in the cache) and loads the library.
pub(super) fn compile_and_load(
    config: &CcConfig,
    source: &str,
    name: &str,
) -> Result<Arc<LoadedLibrary>> {
    let compiler_id = compiler_identity(&config.compiler)?;
    let mut hasher = blake3::Hasher::new();
    for part in [
        source,
        &config.compiler,
        &compiler_id,
        &config.flags.join(" "),
        cpu_identity(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    let key = hasher.finalize().to_hex().to_string();
    let short = &key[..16];
    let stem = format!(
        "{}_{short}",
        sanitize_identifier(name)
            .chars()
            .take(40)
            .collect::<String>()
    );

    if let Some(dir) = &config.build_files_dir {
        fs::create_dir_all(dir).map_err(|e| {
            Error::io(
                format!("creating the build-files folder {}", dir.display()),
                e,
            )
        })?;
        let path = dir.join(format!("{stem}.c"));
        fs::write(&path, source)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }

    // A cache folder that cannot be made private (unwritable, or someone else's) is not used:
    // compiling without the cache is always safe.
    let cache_dir = config
        .cache_dir
        .as_ref()
        .filter(|dir| match private_dir(dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "compiling without the compile cache");
                false
            }
        });
    let cached = match cache_dir {
        Some(dir) => {
            let lib = dir.join(format!("{key}.so"));
            if trusted_file(&lib)
                && let Ok(loaded) = LoadedLibrary::load(&lib)
            {
                CACHE_HITS.fetch_add(1, Ordering::Relaxed);
                // Mark it recently used, for the cache trimming.
                let _ = fs::File::options()
                    .append(true)
                    .open(&lib)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return Ok(Arc::new(loaded));
            }
            Some(lib)
        }
        None => None,
    };

    // Compile in a private temporary folder (inside the cache folder when there is one, so the
    // final rename is atomic).
    let tmp_parent = cache_dir.cloned().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("arrayjit-build-")
        .tempdir_in(&tmp_parent)
        .map_err(|e| {
            Error::io(
                format!("creating a build folder in {}", tmp_parent.display()),
                e,
            )
        })?;
    let src_path = work.path().join(format!("{stem}.c"));
    let lib_tmp = work.path().join(format!("{stem}-{}.so", unique_suffix()));
    fs::File::create(&src_path)
        .and_then(|mut f| f.write_all(source.as_bytes()))
        .map_err(|e| Error::io(format!("writing {}", src_path.display()), e))?;
    let mut cmd = Command::new(&config.compiler);
    cmd.args(&config.flags)
        .arg("-o")
        .arg(&lib_tmp)
        .arg(&src_path);
    let command_line = format!(
        "{} {} -o {} {}",
        config.compiler,
        config.flags.join(" "),
        lib_tmp.display(),
        src_path.display()
    );
    let started = Instant::now();
    let out = cmd.output().map_err(|e| {
        unavailable(
            &config.compiler,
            format!("running `{}` failed: {e}", config.compiler),
        )
    })?;
    COMPILE_MICROS.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    if !out.status.success() {
        // Keep the failing source where the user can read it.
        let kept = match &config.build_files_dir {
            Some(dir) => dir.join(format!("{stem}.c")),
            None => {
                let keep = work.keep();
                keep.join(format!("{stem}.c"))
            }
        };
        return Err(Error::CompileFailed(Box::new(CompileFailure {
            routine: name.to_string(),
            command: command_line,
            status: out.status.to_string(),
            source_path: kept.display().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })));
    }
    COMPILED.fetch_add(1, Ordering::Relaxed);
    let final_path = match cached {
        Some(lib) => {
            fs::rename(&lib_tmp, &lib).map_err(|e| {
                Error::io(
                    format!("moving the library into the cache at {}", lib.display()),
                    e,
                )
            })?;
            if let Some(dir) = cache_dir {
                trim_cache(dir, config.cache_max_bytes, &lib);
            }
            lib
        }
        None => lib_tmp,
    };
    let loaded = LoadedLibrary::load(&final_path)?;
    // Without a cache the library file is not needed once loaded; `work` removes it on drop.
    drop(work);
    Ok(Arc::new(loaded))
}

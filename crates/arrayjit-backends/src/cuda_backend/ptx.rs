//! NVRTC compiles, cached: in memory for the process, and on disk in the compile cache's `ptx`
//! folder ([`crate::compile_cache`]: private, sealed files keyed by a hash of what is made —
//! PTX or CUBIN —, the source, the architecture, NVRTC's version and the options), so a program
//! compiled once is not compiled again by a later process. A damaged or foreign cache file is
//! refused with a warning and the program compiled anew; a cache that cannot be used only costs
//! compile time.
//!
//! CUBIN ([`PtxCache::compile_cubin`]) is machine code for one real architecture (`sm_90`),
//! which the driver loads without compiling anything; NVRTC makes it without a GPU, so a
//! routine can be compiled ahead of time for a named architecture (see [`super::aot`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use arrayjit_ir::{Error, Result};

use super::{HOW_TO_ENABLE, NAME};
use crate::compile_cache::{self, private_dir, read_verified, write_sealed};

/// Where a [`PtxCache::compile`] found its PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxOrigin {
    /// NVRTC compiled it now.
    Compiled,
    /// This cache compiled or read it before, in this process.
    Memory,
    /// A sealed file of the disk cache.
    Disk,
}

/// A cache of NVRTC's PTX: in memory, and in the `ptx` folder of a compile cache folder.
#[derive(Debug)]
pub struct PtxCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<String, Vec<u8>>>,
}

impl PtxCache {
    /// A cache keeping its files in the `ptx` folder of `cache_dir` (`None`: memory only).
    pub fn new(cache_dir: Option<&Path>) -> PtxCache {
        PtxCache {
            dir: cache_dir.map(|d| d.join("ptx")),
            memory: Mutex::default(),
        }
    }

    /// A cache in the compile cache folder the environment chooses (`ARRAYJIT_CACHE_DIR`,
    /// `ARRAYJIT_NO_CACHE`); memory only, with a warning, if those settings do not parse.
    pub fn from_env() -> PtxCache {
        match compile_cache::cache_dir(&crate::settings::process_env) {
            Ok(dir) => PtxCache::new(dir.as_deref()),
            Err(e) => {
                crate::notice::warn_user(&format!("compiling CUDA without the disk cache: {e}"));
                PtxCache::new(None)
            }
        }
    }

    /// The PTX of `source` for `arch` (`sm_90`, or a virtual `compute_XY`), compiled by NVRTC
    /// with `--fmad=false` unless this cache holds it, and where it came from. A compile error
    /// is an [`Error::Render`] with NVRTC's log.
    pub fn compile(&self, source: &str, arch: &str) -> Result<(String, PtxOrigin)> {
        self.compile_with(source, arch, &default_nvrtc_flags())
    }

    /// [`PtxCache::compile`] with NVRTC options `flags` instead of the default
    /// [`default_nvrtc_flags`] (the architecture is always `arch`'s); cached per options.
    pub fn compile_with(
        &self,
        source: &str,
        arch: &str,
        flags: &[String],
    ) -> Result<(String, PtxOrigin)> {
        let (bytes, origin) = self.cached(Output::Ptx, source, arch, flags)?;
        let ptx = String::from_utf8(bytes).map_err(|_| Error::Render {
            routine: "a CUDA program".into(),
            language: "CUDA C".into(),
            detail: format!("NVRTC's PTX for {arch} is not text"),
        })?;
        Ok((ptx, origin))
    }

    /// The CUBIN of `source` for the real architecture `arch` (`sm_80`, `sm_90`: machine code
    /// the driver loads as it is), compiled by NVRTC with `flags` unless this cache holds it,
    /// and where it came from. Needs only NVRTC, no GPU. An architecture that is not `sm_XY`
    /// is an [`Error::InvalidArgument`]; a compile error an [`Error::Render`] with NVRTC's log.
    pub fn compile_cubin(
        &self,
        source: &str,
        arch: &str,
        flags: &[String],
    ) -> Result<(Vec<u8>, PtxOrigin)> {
        let digits = arch.strip_prefix("sm_").unwrap_or_default();
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::BadValue {
                what: "CUBIN architecture".into(),
                value: arch.into(),
                expected: "a real architecture such as sm_80 or sm_90".into(),
            });
        }
        self.cached(Output::Cubin, source, arch, flags)
    }

    fn cached(
        &self,
        output: Output,
        source: &str,
        arch: &str,
        flags: &[String],
    ) -> Result<(Vec<u8>, PtxOrigin)> {
        // SAFETY: this only tries to open the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::BackendUnavailable {
                backend: NAME.into(),
                reason: "NVRTC (libnvrtc.so) was not found".into(),
                how_to_enable: HOW_TO_ENABLE.into(),
            });
        }
        let key = cache_key(output, source, arch, flags);
        let memory = || self.memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(code) = memory().get(&key) {
            return Ok((code.clone(), PtxOrigin::Memory));
        }
        let file = self.dir.as_ref().and_then(|dir| match private_dir(dir) {
            Ok(()) => Some(dir.join(format!("{key}.{}", output.extension()))),
            Err(e) => {
                crate::notice::warn_user(&format!("compiling CUDA without the disk cache: {e}"));
                None
            }
        });
        if let Some(path) = &file {
            match read_verified(path, &key) {
                Ok(code) => {
                    memory().insert(key, code.clone());
                    return Ok((code, PtxOrigin::Disk));
                }
                Err(why) if std::fs::symlink_metadata(path).is_ok() => {
                    tracing::warn!("not using {}: {why}; compiling anew", path.display())
                }
                Err(_) => {}
            }
        }
        let code = nvrtc(output, source, arch, flags)?;
        if let Some(path) = &file
            && let Err(e) = write_sealed(path, &key, &code)
        {
            tracing::warn!("cannot add {} to the compile cache: {e}", path.display());
        }
        memory().insert(key, code.clone());
        Ok((code, PtxOrigin::Compiled))
    }
}

/// What NVRTC is asked to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// PTX (text, compiled by the driver when loaded).
    Ptx,
    /// CUBIN (machine code for one architecture).
    Cubin,
}

impl Output {
    fn extension(self) -> &'static str {
        match self {
            Output::Ptx => "ptx",
            Output::Cubin => "cubin",
        }
    }
}

/// Runs NVRTC on `source` for `arch` with `flags`.
fn nvrtc(output: Output, source: &str, arch: &str, flags: &[String]) -> Result<Vec<u8>> {
    nvrtc_with_log(output, source, arch, flags).map(|(code, _)| code)
}

/// [`nvrtc`], with NVRTC's log of a successful compile (ptxas's report, where asked for).
pub(crate) fn nvrtc_with_log(
    output: Output,
    source: &str,
    arch: &str,
    flags: &[String],
) -> Result<(Vec<u8>, String)> {
    use cudarc::nvrtc::{result, sys};
    let failed = |detail: String| Error::Render {
        routine: "a CUDA program".into(),
        language: "CUDA C".into(),
        detail: format!("NVRTC failed for {arch}: {detail}"),
    };
    let src =
        std::ffi::CString::new(source).map_err(|_| failed("the source holds a NUL byte".into()))?;
    let prog = result::create_program(&src, None).map_err(|e| failed(format!("{e:?}")))?;
    let options: Vec<String> = std::iter::once(format!("--gpu-architecture={arch}"))
        .chain(flags.iter().cloned())
        .collect();
    // SAFETY: `prog` was created above and is destroyed once, below; the buffers passed to
    // NVRTC are as large as it says they must be.
    unsafe {
        let log = || {
            result::get_program_log(prog)
                .map(|l| {
                    let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default()
        };
        let made = match result::compile_program(prog, &options) {
            Err(e) => Err(failed(format!("{e:?}\n{}", log()))),
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(prog)
                    .map(|p| {
                        let mut bytes: Vec<u8> = p.iter().map(|&c| c as u8).collect();
                        while bytes.last() == Some(&0) {
                            bytes.pop();
                        }
                        bytes
                    })
                    .map_err(|e| failed(format!("{e:?}"))),
                Output::Cubin => {
                    let mut size = 0usize;
                    match sys::nvrtcGetCUBINSize(prog, &mut size).result() {
                        Err(e) => Err(failed(format!("{e:?}"))),
                        Ok(()) => {
                            let mut cubin = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                                .result()
                                .map(|()| cubin)
                                .map_err(|e| failed(format!("{e:?}")))
                        }
                    }
                }
            },
        };
        let made = made.map(|code| (code, log()));
        let _ = result::destroy_program(prog);
        made
    }
}

/// NVRTC's version, `major.minor`.
fn nvrtc_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: called only once the library is known to be present; the pointers are valid.
        let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        format!("{major}.{minor} ({status:?})")
    })
}

/// The NVRTC options the backend compiles with unless told otherwise: no contraction of
/// multiplies and adds the IR did not ask for, so results match the interpreter's.
pub fn default_nvrtc_flags() -> Vec<String> {
    vec!["--fmad=false".to_string()]
}

/// The hash naming a program's PTX or CUBIN: what is made, source, architecture, compiler
/// version and options.
fn cache_key(output: Output, source: &str, arch: &str, flags: &[String]) -> String {
    let mut h = blake3::Hasher::new();
    let flags = flags.join(" ");
    let kind = match output {
        Output::Ptx => "ptx-v1",
        Output::Cubin => "cubin-v1",
    };
    for part in [kind, source, arch, nvrtc_version(), &flags] {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex().to_string()
}

/// The architecture NVRTC compiles for on a device of real architecture `arch`: `sm_90a` for
/// `sm_90`, whose warpgroup matrix operations (`wgmma`) are arch-specific features (code for
/// `sm_90a` runs only on sm_90 devices), else `arch` itself.
pub fn feature_arch(arch: &str) -> String {
    if arch == "sm_90" {
        "sm_90a".to_string()
    } else {
        arch.to_string()
    }
}

/// Compiles CUDA C to PTX for `arch` (`sm_90`, or a virtual `compute_XY`) with NVRTC, as the
/// backend does (`--fmad=false`), through the process's [`PtxCache`] in the environment's
/// compile cache folder. Needs only libnvrtc, no GPU: CI uses it to check every rendered
/// kernel. A compile error is an [`Error::Render`] with NVRTC's log.
pub fn compile_ptx(source: &str, arch: &str) -> Result<String> {
    compile_ptx_with_origin(source, arch).map(|(ptx, _)| ptx)
}

/// [`compile_ptx`], saying where the PTX came from.
pub fn compile_ptx_with_origin(source: &str, arch: &str) -> Result<(String, PtxOrigin)> {
    compile_ptx_with_options(source, arch, &default_nvrtc_flags())
}

/// [`compile_ptx_with_origin`] with NVRTC options `flags` (see [`PtxCache::compile_with`]).
pub fn compile_ptx_with_options(
    source: &str,
    arch: &str,
    flags: &[String],
) -> Result<(String, PtxOrigin)> {
    process_cache().compile_with(source, arch, flags)
}

/// The process's cache ([`PtxCache::from_env`]), shared by every compile.
pub(crate) fn process_cache() -> &'static PtxCache {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    CACHE.get_or_init(PtxCache::from_env)
}

//! The private, checksummed disk cache every compiler of arrayjit shares: the cc backend's
//! libraries, the cuda backend's PTX, and the schedule search's choices live in one folder
//! (`ARRAYJIT_CACHE_DIR`, default `$XDG_CACHE_HOME/arrayjit/cc` or `~/.cache/arrayjit/cc`) that
//! belongs to this user and nobody else can enter. Every cached artefact ends with a seal (a
//! marker and a blake3 digest of its cache key and its bytes) and is written to a fresh file,
//! sealed, then renamed into place, so a truncated, damaged or swapped file is never used, and
//! readers never see half a file. Files are opened without following links and used only when
//! they are this user's regular files that nobody else can write.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use arrayjit_ir::{Error, Result};

use crate::settings;

/// `$XDG_CACHE_HOME/arrayjit/cc`, else `$HOME/.cache/arrayjit/cc`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("arrayjit").join("cc"))
}

/// The cache folder the variables `lookup` gives choose: `None` when `ARRAYJIT_NO_CACHE` is
/// set, else `ARRAYJIT_CACHE_DIR`, else [`default_cache_dir`].
pub fn cache_dir(lookup: settings::Lookup<'_>) -> Result<Option<PathBuf>> {
    if settings::flag(lookup, "ARRAYJIT_NO_CACHE", false)? {
        return Ok(None);
    }
    Ok(match settings::text(lookup, "ARRAYJIT_CACHE_DIR")? {
        Some(dir) => Some(PathBuf::from(dir)),
        None => default_cache_dir(),
    })
}

/// Ensures `dir` exists, belongs to this user and is private (mode 0700); returns an error
/// explaining the problem otherwise.
pub(crate) fn private_dir(dir: &Path) -> Result<()> {
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
        return Err(Error::InvalidSetting {
            setting: "ARRAYJIT_CACHE_DIR".into(),
            value: dir.display().to_string(),
            expected: format!(
                "a folder of this user's own: it belongs to user {} but this process runs as \
                 {uid}, so no library is loaded from it",
                meta.uid()
            ),
        });
    }
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("making {} private", dir.display()), e))?;
    }
    Ok(())
}

/// Cached files end with this marker and a blake3 digest of the cache key and the
/// library's bytes, so that a truncated, damaged or swapped file is never loaded. The dynamic
/// loader ignores bytes after an ELF file's contents.
const SEAL_MAGIC: &[u8; 8] = b"AJSEAL01";
const SEAL_LEN: usize = 8 + 32;

fn seal_digest(key: &str, bytes: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(key.as_bytes());
    h.update(&[0]);
    h.update(bytes);
    *h.finalize().as_bytes()
}

/// Appends the seal to a freshly built library and flushes it to disk.
pub(crate) fn seal(path: &Path, key: &str) -> std::io::Result<()> {
    let bytes = fs::read(path)?;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(SEAL_MAGIC)?;
    f.write_all(&seal_digest(key, &bytes))?;
    f.sync_all()
}

/// Opens a sealed file without following links and checks it: a regular file of this user that
/// nobody else can write, whose seal matches `key` and its contents. Returns the open file
/// (what is loaded is what was checked), or why it was refused.
pub(crate) fn open_verified(path: &Path, key: &str) -> std::result::Result<fs::File, String> {
    verified(path, key).map(|(f, _)| f)
}

/// The body of a sealed file (without its seal), checked as [`open_verified`] checks it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the PTX cache
pub(crate) fn read_verified(path: &Path, key: &str) -> std::result::Result<Vec<u8>, String> {
    verified(path, key).map(|(_, body)| body)
}

/// The open file and its body, if it passes [`open_verified`]'s checks: a caller that marks
/// the entry used does so through the file that was checked, never by its path again.
pub(crate) fn verified(path: &Path, key: &str) -> std::result::Result<(fs::File, Vec<u8>), String> {
    use std::io::Read as _;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open it without following links: {e}"))?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "it belongs to user {} with mode {:o}; only this user's private files are loaded",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    let body_len = bytes
        .len()
        .checked_sub(SEAL_LEN)
        .ok_or("it is too short to be a sealed library (truncated?)")?;
    let (body, trailer) = bytes.split_at(body_len);
    if &trailer[..8] != SEAL_MAGIC || trailer[8..] != seal_digest(key, body) {
        return Err("its checksum does not match (damaged, truncated or replaced)".into());
    }
    bytes.truncate(body_len);
    Ok((f, bytes))
}

/// A suffix no other file of this process (or another live one) gets.
pub(crate) fn unique_suffix() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `bytes` as the sealed file `path` (in a folder [`private_dir`] accepted): to a fresh
/// file next to it, sealed and flushed, then renamed over `path`.
pub(crate) fn write_sealed(path: &Path, key: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", unique_suffix()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| seal(&tmp, key))
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

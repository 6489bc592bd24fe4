//! Compiled translation units kept in the compile cache, so that a unit compiled once is not
//! compiled again for another library.
//!
//! A library's units are compiled to objects and linked; the library is cached under a key of
//! all its units. Many units recur across libraries whose other units differ: the product
//! helper of a CPU (the same source for every routine with an `f32` product on that machine)
//! is one, compiled again for a model's training step, its held-out loss and its sampling
//! routine, and for every model after. Each unit's object is therefore also cached, under a
//! key of its own source, the compiler and its identity, the object flags and this CPU.
//!
//! Objects are sealed and checked exactly as libraries are ([`crate::compile_cache`]): a file
//! that is not this user's private regular file, or whose seal does not match its key and
//! contents, is never linked; it is compiled anew instead. A cache that cannot be written
//! only means the unit is compiled next time too.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::CcConfig;
use super::stats::OBJECT_HITS;
use super::toolchain::cpu_identity;
use crate::compile_cache::{verified, write_sealed};

/// The cache key of one unit compiled to an object with `object_flags`.
pub(super) fn object_key(
    config: &CcConfig,
    compiler_id: &str,
    object_flags: &[String],
    source: &str,
) -> String {
    let mut hasher = blake3::Hasher::new();
    for part in [
        "object",
        source,
        &config.compiler,
        compiler_id,
        &object_flags.join(" "),
        cpu_identity(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    hasher.finalize().to_hex().to_string()
}

/// The cached object's file in the cache folder `dir`.
fn cached_path(dir: &Path, key: &str) -> std::path::PathBuf {
    dir.join(format!("{key}.o"))
}

/// Writes the cached object of `key` to `dest` if the cache holds a sound one; whether it did.
pub(super) fn fetch(dir: &Path, key: &str, dest: &Path) -> bool {
    let cached = cached_path(dir, key);
    let (file, body) = match verified(&cached, key) {
        Ok(checked) => checked,
        Err(why) => {
            if fs::symlink_metadata(&cached).is_ok() {
                tracing::warn!("not linking {}: {why}; compiling it anew", cached.display());
            }
            return false;
        }
    };
    if fs::write(dest, body).is_err() {
        return false;
    }
    // Marked recently used, for the cache trimming.
    let _ = file.set_modified(SystemTime::now());
    OBJECT_HITS.fetch_add(1, Ordering::Relaxed);
    true
}

/// Keeps the freshly compiled object `obj` in the cache under `key`. A failure is only
/// logged: the unit is compiled again next time.
pub(super) fn store(dir: &Path, key: &str, obj: &Path) {
    let stored = fs::read(obj).and_then(|bytes| write_sealed(&cached_path(dir, key), key, &bytes));
    if let Err(e) = stored {
        tracing::warn!(
            "cannot keep the object {} in the compile cache: {e}",
            obj.display()
        );
    }
}

//! Schedule choices found by the schedule search, stored as one line of text per routine and
//! machine in a `schedules` folder of the compile cache. Files are read only when they are this
//! user's private regular files (never through a link); whatever they hold is parsed and
//! validated by the caller, so a damaged file costs a new search, never a wrong result.

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use arrayjit_ir::{Error, Result};

use crate::compile_cache::{private_dir, unique_suffix};

/// The longest stored choice read back (a choice is one short line).
const MAX_CHOICE_BYTES: u64 = 4096;

/// The folder of stored choices inside a compile cache folder.
pub(super) fn folder(cache_dir: &Path) -> PathBuf {
    cache_dir.join("schedules")
}

/// Whether `key` can name a file: hexadecimal digits only (the caller's hash).
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The choice stored under `key`, if there is a readable, private one; why not otherwise
/// (`Ok(None)`: nothing stored).
pub(super) fn load(dir: &Path, key: &str) -> std::result::Result<Option<String>, String> {
    if !valid_key(key) {
        return Err(format!("`{key}` is not a schedule key"));
    }
    let path = dir.join(format!("{key}.txt"));
    let mut f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let meta = f.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a private regular file of this user",
            path.display()
        ));
    }
    let mut text = String::new();
    (&mut f)
        .take(MAX_CHOICE_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Some(text))
}

/// Stores `choice` under `key`: written to a private temporary file, then renamed into place
/// (readers see the old choice or the new one, never a part).
pub(super) fn store(dir: &Path, key: &str, choice: &str) -> Result<()> {
    if !valid_key(key) {
        return Err(Error::BadValue {
            what: "schedule key".into(),
            value: key.into(),
            expected: "a hexadecimal hash".into(),
        });
    }
    private_dir(dir)?;
    let path = dir.join(format!("{key}.txt"));
    let tmp = dir.join(format!(".{key}.{}.tmp", unique_suffix()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(choice.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| fs::rename(&tmp, &path));
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("storing the schedule choice {}", path.display()), e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip_and_bad_files_are_refused() {
        let base = std::env::temp_dir().join(format!("aj-store-{}", unique_suffix()));
        let dir = folder(&base);
        assert_eq!(load(&dir, "abc123"), Ok(None));
        store(&dir, "abc123", "tuning line").unwrap();
        assert_eq!(load(&dir, "abc123"), Ok(Some("tuning line".into())));
        store(&dir, "abc123", "newer").unwrap();
        assert_eq!(load(&dir, "abc123"), Ok(Some("newer".into())));
        // Keys are hashes: anything else could name a path outside the folder.
        assert!(store(&dir, "../x", "y").is_err());
        assert!(load(&dir, "../x").is_err());
        // Others' writable files are not read.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir.join("abc123.txt"), fs::Permissions::from_mode(0o666)).unwrap();
        assert!(load(&dir, "abc123").unwrap_err().contains("private"));
        // Links are not followed.
        std::os::unix::fs::symlink(dir.join("abc123.txt"), dir.join("def.txt")).unwrap();
        assert!(load(&dir, "def").is_err());
        fs::remove_dir_all(&base).unwrap();
    }
}

//! A shared library the C compiler built, loaded, and the entry points read from it.

use std::path::{Path, PathBuf};

use arrayjit_ir::{Error, Result};

/// A loaded library; kept alive as long as any kernel from it may run.
pub(super) struct LoadedLibrary {
    library: libloading::Library,
    path: PathBuf,
}

impl LoadedLibrary {
    /// Loads the library at `path`, which the compile cache's `open_verified` just checked. The dynamic loader
    /// takes a path (and reuses an already loaded library of the same path), so the check and
    /// the load see the same file unless a process of this same user replaces it in between;
    /// the cache folder is private to this user.
    pub(super) fn load(path: &Path) -> Result<LoadedLibrary> {
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

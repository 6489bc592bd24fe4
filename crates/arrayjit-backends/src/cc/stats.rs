//! The `cc` backends' compile counters of this process: libraries compiled and found in the
//! cache, objects reused, statement functions imported.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub use crate::compiler::CompileStats;

pub(super) static COMPILED: AtomicUsize = AtomicUsize::new(0);
pub(super) static CACHE_HITS: AtomicUsize = AtomicUsize::new(0);
pub(super) static COMPILE_MICROS: AtomicU64 = AtomicU64::new(0);

/// Translation units whose objects a library found in the object cache.
pub(super) static OBJECT_HITS: AtomicUsize = AtomicUsize::new(0);
/// Statement functions libraries imported from libraries loaded before them.
pub(super) static IMPORTED: AtomicUsize = AtomicUsize::new(0);

/// The compile counters of this process so far.
pub fn compile_stats() -> CompileStats {
    CompileStats {
        compiled: COMPILED.load(Ordering::Relaxed),
        cache_hits: CACHE_HITS.load(Ordering::Relaxed),
        object_hits: OBJECT_HITS.load(Ordering::Relaxed),
        imported_functions: IMPORTED.load(Ordering::Relaxed),
        compile_micros: COMPILE_MICROS.load(Ordering::Relaxed),
    }
}

//! AddressSanitizer's manual poisoning, used when its runtime is loaded into the process (CI
//! preloads it and builds generated kernels with `-fsanitize=address`). Bytes of a pool that no
//! array uses are poisoned, so an instrumented kernel reading or writing past an array into
//! them is reported, even though arrays share one allocation. Without the runtime these are
//! no-ops.

use std::ffi::c_void;
use std::sync::OnceLock;

type RegionFn = unsafe extern "C" fn(*const c_void, usize);

struct Asan {
    poison: RegionFn,
    unpoison: RegionFn,
    /// Keeps the handle of the process image open for the functions' lifetime.
    _this: libloading::os::unix::Library,
}

fn asan() -> Option<&'static Asan> {
    static ASAN: OnceLock<Option<Asan>> = OnceLock::new();
    ASAN.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbols, when present, are AddressSanitizer's public interface with
        // exactly this signature (sanitizer/asan_interface.h).
        unsafe {
            let poison = *this
                .get::<RegionFn>(b"__asan_poison_memory_region\0")
                .ok()?;
            let unpoison = *this
                .get::<RegionFn>(b"__asan_unpoison_memory_region\0")
                .ok()?;
            Some(Asan {
                poison,
                unpoison,
                _this: this,
            })
        }
    })
    .as_ref()
}

/// Whether the AddressSanitizer runtime is loaded into this process.
pub fn asan_loaded() -> bool {
    asan().is_some()
}

/// Marks `len` bytes at `ptr` as not to be accessed; returns whether a sanitizer took note.
///
/// # Safety
/// `ptr..ptr + len` must lie inside one live allocation, and nothing may access those bytes
/// until they are unpoisoned (or the allocation is freed).
pub unsafe fn poison(ptr: *const u8, len: usize) -> bool {
    match asan() {
        Some(a) => {
            // SAFETY: as the caller promises.
            unsafe { (a.poison)(ptr.cast(), len) };
            true
        }
        None => false,
    }
}

/// Undoes [`poison`] for `len` bytes at `ptr`.
///
/// # Safety
/// `ptr..ptr + len` must lie inside one live allocation.
pub unsafe fn unpoison(ptr: *const u8, len: usize) {
    if let Some(a) = asan() {
        // SAFETY: as the caller promises.
        unsafe { (a.unpoison)(ptr.cast(), len) };
    }
}

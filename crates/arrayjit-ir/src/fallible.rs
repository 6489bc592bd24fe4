//! Fallible allocation of host vectors. Sizes that come from users (shapes, sample counts,
//! file headers) are reserved with `try_reserve_exact`, so a size the machine cannot hold is an
//! [`Error::OutOfMemory`] naming what was being allocated, never an abort; a large size beyond
//! what the host has available is an [`Error::DeviceOutOfMemory`] before anything is allocated
//! ([`crate::host_memory`]).

use crate::error::{Error, Result};
use crate::host_memory::{exceeds_available, host_out_of_memory};

/// An empty vector with room for exactly `n` elements, or [`Error::OutOfMemory`] for `what`.
pub fn try_vec_with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if let Some(available) = exceeds_available(bytes) {
        return Err(host_out_of_memory(what(), bytes, available));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        what: what(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    Ok(v)
}

/// `n` zero values from the allocator's zeroed memory, or [`Error::OutOfMemory`] for `what`.
/// Unlike [`try_vec_filled`], nothing is written: a large allocation comes as fresh pages the
/// system zeroes when first touched, so an array the host never writes costs no memset and a
/// host array filled right after is written once.
pub fn try_vec_zeroed<T: bytemuck::Zeroable>(
    n: usize,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let out_of_memory = |what: String| Error::OutOfMemory {
        what,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    };
    let layout = match std::alloc::Layout::array::<T>(n) {
        Ok(layout) => layout,
        Err(_) => return Err(out_of_memory(what())),
    };
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // The system would hand out the pages and fail only when they are written.
    if let Some(available) = exceeds_available(layout.size()) {
        return Err(host_out_of_memory(what(), layout.size(), available));
    }
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(out_of_memory(what()));
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `n` values of `T`
    // (so capacity `n` matches it), and all-zero bytes are a valid `T` (`Zeroable`), so all `n`
    // elements are initialized.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `n` copies of `value`, or [`Error::OutOfMemory`] for `what`.
pub fn try_vec_filled<T: Clone>(
    n: usize,
    value: T,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let mut v = try_vec_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// The values of `iter` (which yields `n` of them) collected without an unchecked allocation.
pub fn try_collect<T>(
    n: usize,
    iter: impl IntoIterator<Item = T>,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let mut v = try_vec_with_capacity(n, what)?;
    v.extend(iter);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_typed_errors() {
        let err = try_vec_filled(usize::MAX / 2, 0u64, || "a test vector".into()).unwrap_err();
        match err {
            // More than the host has available (found before allocating), or, where that is
            // unknown, more than the allocator gives.
            Error::DeviceOutOfMemory { what, needed, .. } => {
                assert_eq!(what, "a test vector");
                assert_eq!(needed, usize::MAX);
            }
            Error::OutOfMemory { what, bytes } => {
                assert_eq!(what, "a test vector");
                assert_eq!(bytes, usize::MAX);
            }
            e => panic!("unexpected {e}"),
        }
        assert_eq!(try_vec_filled(3, 7u8, String::new).unwrap(), vec![7, 7, 7]);
        assert_eq!(try_collect(3, 0..3, String::new).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn zeroed_vectors_are_zero_and_impossible_ones_typed_errors() {
        assert!(matches!(
            try_vec_zeroed::<f64>(usize::MAX / 4, || "a zeroed test vector".into()),
            Err(Error::OutOfMemory {
                bytes: usize::MAX,
                ..
            })
        ));
        // Too large for a layout at all.
        assert!(matches!(
            try_vec_zeroed::<u64>(usize::MAX, String::new),
            Err(Error::OutOfMemory { .. })
        ));
        assert!(try_vec_zeroed::<f32>(0, String::new).unwrap().is_empty());
        let v = try_vec_zeroed::<half::bf16>(1 << 20, String::new).unwrap();
        assert_eq!(v.len(), 1 << 20);
        assert!(v.iter().all(|x| x.to_f32() == 0.0));
        let mut w = try_vec_zeroed::<i32>(5, String::new).unwrap();
        w.push(4);
        assert_eq!(w, vec![0, 0, 0, 0, 0, 4]);
    }
}

//! Fallible allocation of host vectors. Sizes that come from users (shapes, sample counts,
//! file headers) are reserved with `try_reserve_exact`, so a size the machine cannot hold is an
//! [`Error::OutOfMemory`] naming what was being allocated, never an abort.

use crate::error::{Error, Result};

/// An empty vector with room for exactly `n` elements, or [`Error::OutOfMemory`] for `what`.
pub fn try_vec_with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        what: what(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    Ok(v)
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
            Error::OutOfMemory { what, bytes } => {
                assert_eq!(what, "a test vector");
                assert_eq!(bytes, usize::MAX);
            }
            e => panic!("unexpected {e}"),
        }
        assert_eq!(try_vec_filled(3, 7u8, String::new).unwrap(), vec![7, 7, 7]);
        assert_eq!(try_collect(3, 0..3, String::new).unwrap(), vec![0, 1, 2]);
    }
}

//! The pools of a backend's devices, by id: one bookkeeping for every runtime (CPU, CUDA, wgpu).
//! A runtime says how to allocate a pool's memory and how to view part of it ([`PoolMemory`]);
//! the table checks ids, devices and alignments, and answers every mistake with the same typed
//! errors whichever backend runs.
//!
//! Rules:
//! 1. A pool id is taken once per device: allocating it again is an error, and nothing is
//!    allocated.
//! 2. The alignment is a power of two (checked before the runtime allocates).
//! 3. Freeing or viewing a pool that does not exist is an error naming the backend, the device
//!    and the pool.
//! 4. A freed pool's memory lives on while views of it do (the views hold it); the table only
//!    forgets it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use arrayjit_ir::{Error, Result};

use crate::device_buffer::BufferHandle;

/// The memory of one pool, as a runtime holds it.
pub trait PoolMemory: Send + Sync {
    /// Its size in bytes, as the pool was asked for.
    fn pool_bytes(&self) -> usize;
    /// A buffer for bytes `offset..offset + size_in_bytes` of the pool; a range outside it is an
    /// error.
    fn view(&self, offset: usize, size_in_bytes: usize) -> Result<BufferHandle>;
}

/// A backend's pool table, whatever memory its pools hold: what [`crate::device_runtime::DeviceRuntime`]'s
/// default pool methods (`free_pool`, `pool_view`, `pools`) work on, so that each runtime
/// keeps the bookkeeping once ([`crate::device_runtime::DeviceRuntime::pool_table`]).
pub trait Pools: Send + Sync {
    /// The backend's name (for errors).
    fn backend(&self) -> &'static str;
    /// See [`PoolTable::view`].
    fn view(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<BufferHandle>;
    /// See [`PoolTable::remove`].
    fn remove(&self, device: usize, pool_id: usize) -> Result<()>;
    /// See [`PoolTable::list`].
    fn list(&self, device: usize) -> Vec<(usize, usize)>;
}

impl<P: PoolMemory> Pools for PoolTable<P> {
    fn backend(&self) -> &'static str {
        self.backend
    }

    fn view(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<BufferHandle> {
        PoolTable::view(self, device, pool_id, offset, size_in_bytes)
    }

    fn remove(&self, device: usize, pool_id: usize) -> Result<()> {
        PoolTable::remove(self, device, pool_id)
    }

    fn list(&self, device: usize) -> Vec<(usize, usize)> {
        PoolTable::list(self, device)
    }
}

/// The live pools of every device of one backend.
pub struct PoolTable<P> {
    backend: &'static str,
    pools: Mutex<BTreeMap<(usize, usize), P>>,
}

impl<P> fmt::Debug for PoolTable<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<(usize, usize)> = pools.keys().copied().collect();
        write!(f, "PoolTable({}: {ids:?})", self.backend)
    }
}

impl<P: PoolMemory> PoolTable<P> {
    /// An empty table for the backend named `backend` (named in errors).
    pub fn new(backend: &'static str) -> PoolTable<P> {
        PoolTable {
            backend,
            pools: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(usize, usize), P>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn missing(&self, device: usize, pool_id: usize) -> Error {
        Error::NoSuchPool {
            backend: self.backend.into(),
            device,
            pool_id,
        }
    }

    /// Makes pool `pool_id` on `device` with `allocate` (given the size and alignment), unless
    /// the id is taken or the alignment is not a power of two: then nothing is allocated.
    pub fn insert_with(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
        allocate: impl FnOnce(usize, usize) -> Result<P>,
    ) -> Result<()> {
        if !alignment.is_power_of_two() {
            return Err(Error::BadValue {
                what: "pool alignment".into(),
                value: alignment.to_string(),
                expected: "a power of two".into(),
            });
        }
        let mut pools = self.lock();
        if pools.contains_key(&(device, pool_id)) {
            return Err(Error::PoolIdTaken {
                backend: self.backend.into(),
                device,
                pool_id,
            });
        }
        let pool = allocate(size_in_bytes, alignment)?;
        pools.insert((device, pool_id), pool);
        Ok(())
    }

    /// Runs `f` on pool `pool_id` of `device`.
    pub fn with<R>(&self, device: usize, pool_id: usize, f: impl FnOnce(&P) -> R) -> Result<R> {
        let pools = self.lock();
        let pool = pools
            .get(&(device, pool_id))
            .ok_or_else(|| self.missing(device, pool_id))?;
        Ok(f(pool))
    }

    /// A buffer for bytes `offset..offset + size_in_bytes` of pool `pool_id` of `device`.
    pub fn view(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<BufferHandle> {
        self.with(device, pool_id, |p| p.view(offset, size_in_bytes))?
    }

    /// Forgets pool `pool_id` of `device`; its memory is released once no view holds it (after
    /// the table's lock is let go).
    pub fn remove(&self, device: usize, pool_id: usize) -> Result<()> {
        let removed = self.lock().remove(&(device, pool_id));
        match removed {
            Some(pool) => {
                drop(pool);
                Ok(())
            }
            None => Err(self.missing(device, pool_id)),
        }
    }

    /// The live pools of `device`: `(pool_id, size_in_bytes)`, by id.
    pub fn list(&self, device: usize) -> Vec<(usize, usize)> {
        self.lock()
            .iter()
            .filter(|((d, _), _)| *d == device)
            .map(|((_, id), p)| (*id, p.pool_bytes()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::buffer::{CpuBuffer, MemoryCounter};
    use std::sync::Arc;

    #[test]
    fn pools_are_kept_per_device_and_id_with_typed_errors() {
        let counter = Arc::new(MemoryCounter::default());
        let table: PoolTable<Arc<CpuBuffer>> = PoolTable::new("cc");
        let alloc = |size, align| {
            Ok(Arc::new(CpuBuffer::zeroed_aligned(
                size,
                align,
                0,
                counter.clone(),
            )?))
        };
        table.insert_with(0, 1, 64, 16, alloc).unwrap();
        table.insert_with(1, 1, 32, 16, alloc).unwrap();
        let e = table.insert_with(0, 1, 8, 16, alloc).unwrap_err();
        assert!(
            matches!(
                e,
                Error::PoolIdTaken {
                    device: 0,
                    pool_id: 1,
                    ..
                }
            ),
            "{e}"
        );
        let e = table.insert_with(0, 2, 8, 3, alloc).unwrap_err();
        assert!(
            matches!(&e, Error::BadValue { what, value, .. } if what == "pool alignment" && value == "3"),
            "{e}"
        );
        assert_eq!(table.list(0), vec![(1, 64)]);
        assert_eq!(table.list(1), vec![(1, 32)]);
        let view = table.view(0, 1, 16, 32).unwrap();
        assert_eq!(view.size_in_bytes(), 32);
        assert!(table.view(0, 1, 48, 32).is_err(), "a view past the pool");
        table.remove(0, 1).unwrap();
        let e = table.remove(0, 1).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NoSuchPool {
                    device: 0,
                    pool_id: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("cc:0 has no pool 1"), "{e}");
        assert!(table.view(0, 1, 0, 8).is_err());
        // The view keeps the freed pool's memory alive.
        assert_eq!(view.size_in_bytes(), 32);
        assert_eq!(table.list(0), vec![]);
    }
}

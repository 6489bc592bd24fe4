//! Device memory given back in stream order: a dropped allocation is not freed at once (work
//! still queued on some stream may use it) but waits in its device's release list until a
//! fence after everything enqueued so far has passed on every stream of the device.
//!
//! Rules:
//! - Nothing here synchronizes the context. A release records fences (an event on each live
//!   stream of the device) and frees only allocations whose fences have passed; blocking waits
//!   happen only where the caller asks (an allocation that ran out of memory, a device-wide
//!   wait the user asked for).
//! - Nothing here touches a stream while any stream of the device captures a graph: fences
//!   and frees are made only with the device's capture gate held exclusively, taken without
//!   waiting (a release made during a capture waits in the list for the next chance), or,
//!   for an allocation that ran out of memory, after the captures under way have ended.
//! - The device's count of used bytes goes down when memory is really freed, not when it is
//!   dropped; a free the driver refuses leaves the count as it was.
//!
//! The list speaks to the driver through [`FenceDriver`], so its rules are tested here on a fake
//! device.

use std::sync::{Arc, Mutex, RwLock, TryLockError};

use arrayjit_ir::Result;

/// The driver calls the release list makes on a device: CUDA's ([`super::devices::Gpu`]), or a
/// fake in tests.
pub(crate) trait FenceDriver {
    /// A point after all work enqueued so far on every stream of the device.
    type Fence;
    /// Records a fence now.
    fn fence(&self) -> Result<Self::Fence>;
    /// Whether the work before the fence has finished.
    fn passed(&self, fence: &Self::Fence) -> Result<bool>;
    /// Blocks until the work before the fence has finished.
    fn wait(&self, fence: &Self::Fence) -> Result<()>;
    /// Frees an allocation no work uses any more.
    fn free(&self, ptr: u64) -> Result<()>;
    /// The device's name, for warnings.
    fn label(&self) -> String;
}

/// An allocation waiting to be freed.
struct Pending<F> {
    ptr: u64,
    bytes: usize,
    /// Recorded at the first chance after the release (`None` until then).
    fence: Option<Arc<F>>,
}

/// A device's allocations waiting to be freed.
pub(crate) struct Releases<F> {
    pending: Mutex<Vec<Pending<F>>>,
}

impl<F> Default for Releases<F> {
    fn default() -> Self {
        Releases {
            pending: Mutex::new(Vec::new()),
        }
    }
}

impl<F> Releases<F> {
    /// Puts a dropped allocation of `bytes` in the list.
    pub(super) fn release(&self, ptr: u64, bytes: usize) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Pending {
                ptr,
                bytes,
                fence: None,
            });
    }

    /// Bytes released and not yet freed.
    pub(super) fn pending_bytes(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|p| p.bytes)
            .sum()
    }

    /// Frees what no work can use any more; the bytes freed. Without `wait`, does nothing
    /// while a capture holds `gate` and frees only what has passed its fence. With `wait`
    /// (an allocation that ran out of memory), waits for the captures under way to end, then
    /// for the fences: the caller must not hold `gate` itself.
    pub(super) fn reclaim<D: FenceDriver<Fence = F>>(
        &self,
        driver: &D,
        gate: &RwLock<()>,
        wait: bool,
    ) -> usize {
        let _quiet = if wait {
            gate.write().unwrap_or_else(|p| p.into_inner())
        } else {
            match gate.try_write() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                // A stream of the device captures: its graph must not get our events.
                Err(TryLockError::WouldBlock) => return 0,
            }
        };
        self.reclaim_quiet(driver, wait)
    }

    /// [`Releases::reclaim`] for a caller that holds the capture gate exclusively.
    pub(super) fn reclaim_quiet<D: FenceDriver<Fence = F>>(&self, driver: &D, wait: bool) -> usize {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            return 0;
        }
        // One fence serves every release made since the last chance.
        if pending.iter().any(|p| p.fence.is_none()) {
            match driver.fence() {
                Ok(fence) => {
                    let fence = Arc::new(fence);
                    for p in pending.iter_mut().filter(|p| p.fence.is_none()) {
                        p.fence = Some(fence.clone());
                    }
                }
                Err(e) => tracing::warn!(
                    device = %driver.label(),
                    error = %e,
                    "recording a release fence failed; the memory is freed at a later chance"
                ),
            }
        }
        let mut freed = 0;
        pending.retain(|p| {
            let Some(fence) = &p.fence else { return true };
            let done = if wait {
                driver.wait(fence).map(|()| true)
            } else {
                driver.passed(fence)
            };
            match done {
                Ok(false) => true,
                Ok(true) => {
                    match driver.free(p.ptr) {
                        Ok(()) => freed += p.bytes,
                        Err(e) => tracing::warn!(
                            device = %driver.label(),
                            error = %e,
                            "freeing device memory failed; its {} bytes stay counted as used",
                            p.bytes
                        ),
                    }
                    false
                }
                // The device failed: the memory is unusable either way, and the failure is
                // reported by the next wait on a stream.
                Err(e) => {
                    tracing::warn!(device = %driver.label(), error = %e, "a release fence failed");
                    true
                }
            }
        });
        freed
    }
}

#[cfg(test)]
mod tests;

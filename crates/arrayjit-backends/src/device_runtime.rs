//! The runtime part of a backend (the reference's `Runtime`): its devices' buffers, pools and
//! queues, and the copies between the host, buffers and devices. A backend names its runtime
//! ([`crate::lowered_backend::LoweredBackend::runtime`]); the CPU backends share one ([`crate::cpu::CpuRuntime`]).

use std::sync::Arc;

use arrayjit_ir::{OutOfBounds, RangeUnit, Result};

use crate::array_buffer;
use crate::device_buffer::BufferHandle;
use crate::queue::{DeviceQueue, Queue};

/// A backend's runtime: devices, buffers, pools, queues and copies. The calls that touch buffer
/// memory are `unsafe fn`; see [`crate::lowered_backend::DATA_PLANE_CONTRACT`].
pub trait DeviceRuntime: Send + Sync + std::fmt::Debug {
    /// How many devices the backend has (0 when unavailable).
    fn num_devices(&self) -> usize;
    /// Allocates a zero-filled buffer on a device.
    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle>;
    /// Allocates a zero-filled buffer for `num_elems` values of `prec` on a device (the
    /// reference's `alloc_zero_init_array`): the buffer knows its precision
    /// ([`crate::device_buffer::DeviceBuffer::prec`]), and launches and copies check it. Default: an
    /// [`alloc_zeroed`](DeviceRuntime::alloc_zeroed) buffer, typed.
    fn alloc_array(
        &self,
        device: usize,
        prec: arrayjit_ir::Prec,
        num_elems: usize,
    ) -> Result<BufferHandle> {
        let bytes = num_elems.checked_mul(prec.size_in_bytes()).ok_or_else(|| {
            arrayjit_ir::Error::OutOfMemory {
                what: format!("{num_elems} {} values", prec.name()),
                bytes: usize::MAX,
            }
        })?;
        array_buffer::typed(self.alloc_zeroed(device, bytes)?, prec, "a new array")
    }
    /// A queue of the device's own for one runtime stream, if the backend runs work
    /// asynchronously (see [`crate::queue`]); `None` (the default, every CPU backend): work finishes
    /// before the call that runs it returns.
    fn new_queue(&self, device: usize) -> Result<Option<Arc<dyn DeviceQueue>>> {
        let _ = device;
        Ok(None)
    }
    /// The host array of `tn` used in place as its array on `device` (the reference's
    /// `use_host_memory`, for unified memory such as the CPU's), if this backend does that;
    /// `Ok(None)` (the default): arrays are the device's own. The runtime uses it for hosted
    /// constant and volatile nodes, which devices never write.
    fn host_memory_buffer(
        &self,
        device: usize,
        tn: &arrayjit_ir::Tnode,
    ) -> Result<Option<BufferHandle>> {
        let _ = (device, tn);
        Ok(None)
    }
    /// Whether [`adopt_host_array`](DeviceRuntime::adopt_host_array) makes device arrays of
    /// host arrays on this backend (unified memory, like the CPU's). Default `false`.
    fn adopts_host_arrays(&self) -> bool {
        false
    }
    /// The array of a hosted node on `device` made of its host array itself, handed over by
    /// the host (`arrayjit_runtime::node_sync::hand_host_array_to_device`): the array is taken
    /// out of `array`, no byte is copied, and the buffer, typed with the array's precision,
    /// owns it from then on. The runtime does this for nodes that devices change, at their
    /// first link, where [`adopts_host_arrays`](DeviceRuntime::adopts_host_arrays). An error
    /// leaves the array where it was. Default: [`arrayjit_ir::Error::Unsupported`].
    fn adopt_host_array(
        &self,
        device: usize,
        array: &mut Option<arrayjit_ir::Ndarray>,
    ) -> Result<BufferHandle> {
        let _ = (device, array);
        Err(arrayjit_ir::Error::Unsupported {
            backend: format!("{self:?}"),
            what: "making a device array of a host array".into(),
            instead: "copy the host array to the device (the default link)".into(),
        })
    }
    /// Whether a copy from the host into a buffer that no work has used yet may run at once,
    /// on the calling thread ([`copy_from_host`](DeviceRuntime::copy_from_host) with no queue),
    /// with nothing to order it after: true where buffers are plain host memory (the CPU
    /// backends). The runtime then fills a new array from its node's host array directly
    /// instead of keeping a snapshot of the values for a copy scheduled later, which would
    /// hold a second copy of them meanwhile. Default `false`.
    fn copies_into_new_buffers_at_once(&self) -> bool {
        false
    }
    /// Copies host bytes into a buffer (sizes must match), on `queue` when given. The bytes
    /// may be reused as soon as this returns.
    ///
    /// # Safety
    /// Nothing else accesses `dst` until the copy has finished ([`crate::lowered_backend::DATA_PLANE_CONTRACT`]).
    unsafe fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], queue: Queue<'_>)
    -> Result<()>;
    /// Copies a buffer into host bytes (sizes must match), after the work of `queue` when
    /// given; the bytes hold the values when this returns.
    ///
    /// # Safety
    /// Nothing writes `src` until the copy has finished ([`crate::lowered_backend::DATA_PLANE_CONTRACT`]).
    unsafe fn copy_to_host(
        &self,
        src: &BufferHandle,
        dst: &mut [u8],
        queue: Queue<'_>,
    ) -> Result<()>;
    /// Copies `src` into bytes `offset..offset + src.len()` of a buffer, on `queue` when given
    /// (a range outside the buffer is an error, and nothing is copied). Default: the whole
    /// buffer through a temporary: read, patched, written back.
    ///
    /// # Safety
    /// As [`DeviceRuntime::copy_from_host`].
    unsafe fn copy_from_host_range(
        &self,
        dst: &BufferHandle,
        offset: usize,
        src: &[u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        // SAFETY: this method's contract is the helper's.
        unsafe { patch_whole_buffer(self, dst, offset, src, queue) }
    }
    /// Copies bytes `offset..offset + dst.len()` of a buffer into `dst`, after the work of
    /// `queue` when given (a range outside the buffer is an error, and nothing is copied).
    /// Default: the whole buffer through a temporary, then the range.
    ///
    /// # Safety
    /// As [`DeviceRuntime::copy_to_host`].
    unsafe fn copy_to_host_range(
        &self,
        src: &BufferHandle,
        offset: usize,
        dst: &mut [u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        // SAFETY: this method's contract is the helper's.
        unsafe { read_through_whole_buffer(self, src, offset, dst, queue) }
    }
    /// Copies one buffer into another of the same size (possibly across devices), on `queue`
    /// when given.
    ///
    /// # Safety
    /// Until the copy has finished, nothing else accesses `dst` and nothing writes `src`
    /// ([`crate::lowered_backend::DATA_PLANE_CONTRACT`]).
    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        queue: Queue<'_>,
    ) -> Result<()>;
    /// Waits until every launch and copy queued on a device, on any queue, has finished (a
    /// CPU backend runs them before returning, so there is nothing to wait for by default).
    fn synchronize(&self, device: usize) -> Result<()> {
        let _ = device;
        Ok(())
    }
    /// The bytes a device can still allocate, if the backend can tell (the default: `None`,
    /// unknown). The runtime compares what a link will allocate with it, and refuses a link
    /// that cannot fit before allocating anything.
    fn available_memory(&self, device: usize) -> Option<usize> {
        let _ = device;
        None
    }
    /// Bytes currently allocated for arrays on a device (pools included).
    fn used_memory(&self, device: usize) -> usize;
    /// Allocates pool `pool_id` on a device: `size_in_bytes` zeroed bytes aligned to
    /// `alignment` (a power of two). An id already in use is an error.
    fn alloc_pool(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
    ) -> Result<()>;
    /// [`DeviceRuntime::alloc_pool`] for arrays of one memory mode (`Some`), or of several
    /// (`None`), so a backend can choose the storage (e.g. memory the host can map for hosted
    /// nodes, private memory for device-only ones, as Metal does). The runtime calls this one;
    /// the default ignores the mode.
    fn alloc_pool_for(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
        mode: Option<arrayjit_ir::MemoryMode>,
    ) -> Result<()> {
        let _ = mode;
        self.alloc_pool(device, pool_id, size_in_bytes, alignment)
    }
    /// The alignment (a power of two) arrays in this backend's pools need, e.g. a GPU's
    /// storage-binding offset alignment. The runtime plans pools with at least this.
    fn pool_alignment(&self) -> usize {
        1
    }
    /// The most bytes one allocation (a pool) may have on this backend's devices, e.g. a GPU
    /// API's largest buffer. The runtime plans pools within it (default: no bound but memory).
    fn max_allocation_bytes(&self) -> usize {
        usize::MAX
    }
    /// Bytes the memory planner leaves unused around every array of a pool on this backend
    /// (0: arrays packed tight; see [`DeviceRuntime::guard_pool`]).
    fn pool_guard_bytes(&self) -> usize {
        0
    }
    /// Marks the byte ranges `(offset, length)` of a pool that no array uses, so that accesses
    /// to them are caught where the backend can (the CPU: AddressSanitizer poisoning when its
    /// runtime is loaded). Returns whether they are checked. Default: not checked.
    fn guard_pool(&self, device: usize, pool_id: usize, unused: &[(usize, usize)]) -> Result<bool> {
        let _ = (device, pool_id, unused);
        Ok(false)
    }
    /// The runtime's pool table, which the default `free_pool`, `pool_view` and `pools` use;
    /// `None` (the default) for a runtime that implements those itself.
    fn pool_table(&self) -> Option<&dyn crate::pool_table::Pools> {
        None
    }
    /// Frees a pool; buffers viewing it keep its memory alive until they are dropped. Default:
    /// through [`DeviceRuntime::pool_table`], after checking the device.
    fn free_pool(&self, device: usize, pool_id: usize) -> Result<()> {
        table_for(self, device)?.remove(device, pool_id)
    }
    /// Zeroes `size_in_bytes` at `offset` in a pool.
    ///
    /// # Safety
    /// Nothing else accesses those bytes of the pool (through any view) until this returns
    /// ([`crate::lowered_backend::DATA_PLANE_CONTRACT`]).
    unsafe fn memset_zero(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<()>;
    /// A buffer for bytes `offset..offset + size_in_bytes` of a pool. Default: through
    /// [`DeviceRuntime::pool_table`], after checking the device.
    fn pool_view(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<BufferHandle> {
        table_for(self, device)?.view(device, pool_id, offset, size_in_bytes)
    }
    /// The live pools of a device: `(pool_id, size_in_bytes)`, by id. Default: through
    /// [`DeviceRuntime::pool_table`] (none without one).
    fn pools(&self, device: usize) -> Vec<(usize, usize)> {
        self.pool_table().map_or_else(Vec::new, |t| t.list(device))
    }
}

/// The runtime's pool table for work on `device`: an error for a device it does not have, or
/// a runtime without a table.
fn table_for<R: DeviceRuntime + ?Sized>(
    runtime: &R,
    device: usize,
) -> Result<&dyn crate::pool_table::Pools> {
    let table = runtime.pool_table().ok_or_else(|| {
        arrayjit_ir::Error::invalid(
            "this runtime keeps no pool table: it must implement free_pool, pool_view and pools \
             itself (or return its PoolTable from pool_table)",
        )
    })?;
    if device >= runtime.num_devices() {
        return Err(arrayjit_ir::Error::NoSuchDevice {
            backend: table.backend().into(),
            ordinal: device,
            num_devices: runtime.num_devices(),
        });
    }
    Ok(table)
}

/// The end of bytes `offset..offset + len` of a buffer, or an error if they do not lie in it.
pub fn byte_range_end(buffer: &BufferHandle, offset: usize, len: usize) -> Result<usize> {
    OutOfBounds::range_end(offset, len, buffer.size_in_bytes(), RangeUnit::Bytes)
        .map_err(|problem| arrayjit_ir::Error::out_of_bounds("a device buffer", problem))
}

/// Copies `src` into bytes `offset..` of `dst` through the whole buffer: read, patched, written
/// back (for backends that cannot write part of a buffer; the default of
/// [`DeviceRuntime::copy_from_host_range`]).
///
/// # Safety
/// As [`DeviceRuntime::copy_from_host`] and [`DeviceRuntime::copy_to_host`] on `dst`.
pub unsafe fn patch_whole_buffer<R: DeviceRuntime + ?Sized>(
    runtime: &R,
    dst: &BufferHandle,
    offset: usize,
    src: &[u8],
    queue: Queue<'_>,
) -> Result<()> {
    let end = byte_range_end(dst, offset, src.len())?;
    let mut all = vec![0u8; dst.size_in_bytes()];
    // SAFETY: the caller has exclusive access to `dst` (this function's contract).
    unsafe { runtime.copy_to_host(dst, &mut all, queue)? };
    all[offset..end].copy_from_slice(src);
    // SAFETY: as above.
    unsafe { runtime.copy_from_host(dst, &all, queue) }
}

/// Copies bytes `offset..` of `src` into `dst` through the whole buffer (the default of
/// [`DeviceRuntime::copy_to_host_range`]).
///
/// # Safety
/// As [`DeviceRuntime::copy_to_host`] on `src`.
pub unsafe fn read_through_whole_buffer<R: DeviceRuntime + ?Sized>(
    runtime: &R,
    src: &BufferHandle,
    offset: usize,
    dst: &mut [u8],
    queue: Queue<'_>,
) -> Result<()> {
    let end = byte_range_end(src, offset, dst.len())?;
    let mut all = vec![0u8; src.size_in_bytes()];
    // SAFETY: nothing writes `src` meanwhile (this function's contract).
    unsafe { runtime.copy_to_host(src, &mut all, queue)? };
    dst.copy_from_slice(&all[offset..end]);
    Ok(())
}

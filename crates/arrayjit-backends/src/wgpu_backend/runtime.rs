//! The runtime part of the `wgpu` backend: buffers, pools, queues and copies.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrayjit_ir::{Error, Result};

use super::buffers::{self, WgpuBuffer};
use super::devices::{Gpu, WgpuDevices};
use super::queue;
use crate::device_buffer::BufferHandle;
use crate::device_runtime::DeviceRuntime;
use crate::pool_table::{PoolMemory, PoolTable};
use crate::queue::{DeviceQueue, Queue};

/// The runtime part of the `wgpu` backend: storage buffers (a pool is one buffer, its arrays
/// views at offsets) and the device's queue.
#[derive(Debug)]
pub struct WgpuRuntime {
    devices: Arc<WgpuDevices>,
    pools: PoolTable<WgpuBuffer>,
}

impl WgpuRuntime {
    /// The runtime of `devices`' device.
    pub fn new(devices: Arc<WgpuDevices>) -> WgpuRuntime {
        WgpuRuntime {
            devices,
            pools: PoolTable::new(super::NAME),
        }
    }

    fn gpu(&self) -> Result<&Arc<Gpu>> {
        self.devices.gpu()
    }

    fn device_check(&self, device: usize) -> Result<&Arc<Gpu>> {
        self.devices.device_check(device)
    }
}

impl DeviceRuntime for WgpuRuntime {
    fn num_devices(&self) -> usize {
        usize::from(self.devices.is_open())
    }

    fn pool_alignment(&self) -> usize {
        self.gpu().map_or(1, |g| g.offset_alignment)
    }

    fn max_allocation_bytes(&self) -> usize {
        self.gpu().map_or(usize::MAX, |g| {
            usize::try_from(g.max_buffer_bytes).unwrap_or(usize::MAX)
        })
    }

    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        let gpu = self.device_check(device)?;
        Ok(Arc::new(buffers::allocate(
            gpu,
            &self.devices.used,
            size_in_bytes,
        )?))
    }

    fn new_queue(&self, device: usize) -> Result<Option<Arc<dyn DeviceQueue>>> {
        let gpu = self.device_check(device)?.clone();
        Ok(Some(Arc::new(queue::WgpuQueue { gpu })))
    }

    // Copies go on the device's one queue, in order, whatever the runtime stream.
    unsafe fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], _: Queue<'_>) -> Result<()> {
        let gpu = self.gpu()?;
        buffers::write(gpu, buffers::of(dst)?, src)
    }

    unsafe fn copy_to_host(&self, src: &BufferHandle, dst: &mut [u8], _: Queue<'_>) -> Result<()> {
        let gpu = self.gpu()?;
        buffers::read(gpu, buffers::of(src)?, dst)
    }

    /// Directly when the range starts on a word (wgpu copies whole words) and ends on one or
    /// at the buffer's end; else the default's read, patch, write.
    unsafe fn copy_from_host_range(
        &self,
        dst: &BufferHandle,
        offset: usize,
        src: &[u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        let end = crate::device_runtime::byte_range_end(dst, offset, src.len())?;
        let d = buffers::of(dst)?;
        if buffers::word_aligned(d, offset, end) {
            return buffers::write(self.gpu()?, &d.view(offset, src.len())?, src);
        }
        // SAFETY: this method's contract is the helper's.
        unsafe { crate::device_runtime::patch_whole_buffer(self, dst, offset, src, queue) }
    }

    /// Directly when the range starts on a word; else through the whole buffer.
    unsafe fn copy_to_host_range(
        &self,
        src: &BufferHandle,
        offset: usize,
        dst: &mut [u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        crate::device_runtime::byte_range_end(src, offset, dst.len())?;
        let s = buffers::of(src)?;
        if (s.offset + offset).is_multiple_of(4) {
            return buffers::read(self.gpu()?, &s.view(offset, dst.len())?, dst);
        }
        // SAFETY: this method's contract is the helper's.
        unsafe { crate::device_runtime::read_through_whole_buffer(self, src, offset, dst, queue) }
    }

    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        _: Queue<'_>,
    ) -> Result<()> {
        let gpu = self.gpu()?;
        buffers::copy(gpu, buffers::of(dst)?, buffers::of(src)?)
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        let gpu = self.device_check(device)?;
        gpu.scoped("waiting for the queue", || {
            gpu.wait("waiting for the queue")
        })
    }

    fn used_memory(&self, _device: usize) -> usize {
        self.devices.used.load(Ordering::Relaxed)
    }

    fn alloc_pool(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
    ) -> Result<()> {
        let gpu = self.device_check(device)?;
        if !alignment.is_power_of_two() || !alignment.is_multiple_of(gpu.offset_alignment) {
            return Err(Error::BadValue {
                what: "pool alignment".into(),
                value: alignment.to_string(),
                expected: format!(
                    "a power of two and a multiple of the device's binding alignment {}",
                    gpu.offset_alignment
                ),
            });
        }
        self.pools
            .insert_with(device, pool_id, size_in_bytes, alignment, |size, _| {
                buffers::allocate(gpu, &self.devices.used, size)
            })
    }

    fn pool_table(&self) -> Option<&dyn crate::pool_table::Pools> {
        Some(&self.pools)
    }

    unsafe fn memset_zero(
        &self,
        device: usize,
        pool_id: usize,
        offset: usize,
        size_in_bytes: usize,
    ) -> Result<()> {
        let gpu = self.device_check(device)?;
        let view = self.pool_view(device, pool_id, offset, size_in_bytes)?;
        buffers::zero(gpu, buffers::of(&view)?)
    }
}

impl PoolMemory for WgpuBuffer {
    fn pool_bytes(&self) -> usize {
        self.size
    }

    fn view(&self, offset: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        Ok(Arc::new(WgpuBuffer::view(self, offset, size_in_bytes)?))
    }
}

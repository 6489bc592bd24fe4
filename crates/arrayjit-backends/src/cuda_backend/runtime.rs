//! The runtime part of the `cuda` backend: buffers, pools, queues and copies.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrayjit_ir::{Error, RangeUnit, Result};

use super::buffers::{self, CudaBuffer};
use super::devices::{CudaDevices, Gpu};
use super::queue::{self, CudaQueue};
use crate::device_buffer::BufferHandle;
use crate::device_runtime::DeviceRuntime;
use crate::pool_table::{PoolMemory, PoolTable};
use crate::queue::{DeviceQueue, Queue};

/// The runtime part of the `cuda` backend: buffers and pools in device memory, streams.
#[derive(Debug)]
pub struct CudaRuntime {
    devices: Arc<CudaDevices>,
    pools: PoolTable<CudaBuffer>,
}

impl CudaRuntime {
    /// The runtime of `devices`' GPUs.
    pub fn new(devices: Arc<CudaDevices>) -> CudaRuntime {
        CudaRuntime {
            devices,
            pools: PoolTable::new(super::NAME),
        }
    }

    fn gpu(&self, device: usize) -> Result<&Arc<Gpu>> {
        self.devices.gpu(device)
    }
}

impl DeviceRuntime for CudaRuntime {
    fn num_devices(&self) -> usize {
        self.devices.count()
    }

    fn pool_alignment(&self) -> usize {
        256
    }

    fn new_queue(&self, device: usize) -> Result<Option<Arc<dyn DeviceQueue>>> {
        let gpu = self.gpu(device)?.clone();
        gpu.bind("creating a stream")?;
        let stream = gpu
            .ctx
            .new_stream()
            .map_err(|e| gpu.driver_error("creating a stream", e))?;
        gpu.register_stream(&stream);
        Ok(Some(Arc::new(CudaQueue::new(gpu, stream))))
    }

    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        Ok(Arc::new(CudaBuffer::allocate(
            self.gpu(device)?,
            size_in_bytes,
            256,
        )?))
    }

    unsafe fn copy_from_host(
        &self,
        dst: &BufferHandle,
        src: &[u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        let d = buffers::of(dst)?;
        let gpu = self.gpu(d.device_ordinal())?;
        d.write(gpu, src, queue::stream_for(gpu, queue))
    }

    unsafe fn copy_to_host(
        &self,
        src: &BufferHandle,
        dst: &mut [u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        let s = buffers::of(src)?;
        let gpu = self.gpu(s.device_ordinal())?;
        s.read(gpu, dst, queue::stream_for(gpu, queue))
    }

    unsafe fn copy_from_host_range(
        &self,
        dst: &BufferHandle,
        offset: usize,
        src: &[u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        crate::device_runtime::byte_range_end(dst, offset, src.len())?;
        let d = buffers::of(dst)?.view(offset, src.len())?;
        let gpu = self.gpu(d.device_ordinal())?;
        d.write(gpu, src, queue::stream_for(gpu, queue))
    }

    unsafe fn copy_to_host_range(
        &self,
        src: &BufferHandle,
        offset: usize,
        dst: &mut [u8],
        queue: Queue<'_>,
    ) -> Result<()> {
        crate::device_runtime::byte_range_end(src, offset, dst.len())?;
        let s = buffers::of(src)?.view(offset, dst.len())?;
        let gpu = self.gpu(s.device_ordinal())?;
        s.read(gpu, dst, queue::stream_for(gpu, queue))
    }

    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        queue: Queue<'_>,
    ) -> Result<()> {
        let (d, s) = (buffers::of(dst)?, buffers::of(src)?);
        Error::check_same_size(
            "copying device to device",
            d.size_in_bytes_exact(),
            s.size_in_bytes_exact(),
            RangeUnit::Bytes,
        )?;
        let (gd, gs) = (self.gpu(d.device_ordinal())?, self.gpu(s.device_ordinal())?);
        if gd.ordinal == gs.ordinal {
            return d.copy_from(gd, s, queue::stream_for(gd, queue));
        }
        // Across devices: through the host.
        let mut staging = vec![0u8; s.size_in_bytes_exact()];
        s.read(gs, &mut staging, &gs.default_stream)?;
        d.write(gd, &staging, queue::stream_for(gd, queue))?;
        queue::stream_for(gd, queue)
            .synchronize()
            .map_err(|e| gd.driver_error("copying between devices", e))
    }

    fn synchronize(&self, device: usize) -> Result<()> {
        self.gpu(device)?.synchronize_all("waiting for the device")
    }

    fn available_memory(&self, device: usize) -> Option<usize> {
        // The driver's free figure for the device's context (unknown if it cannot be had),
        // after freeing what was released and is no longer used.
        let gpu = self.gpu(device).ok()?;
        gpu.reclaim(false);
        gpu.bind("asking for the free memory").ok()?;
        cudarc::driver::result::mem_get_info()
            .ok()
            .map(|(free, _total)| free)
    }

    /// Bytes allocated and not yet freed (released memory counts until its work is done).
    fn used_memory(&self, device: usize) -> usize {
        self.gpu(device).map_or(0, |g| {
            g.reclaim(false);
            g.used.load(Ordering::Relaxed)
        })
    }

    fn alloc_pool(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
    ) -> Result<()> {
        let gpu = self.gpu(device)?;
        self.pools
            .insert_with(device, pool_id, size_in_bytes, alignment, |size, align| {
                CudaBuffer::allocate(gpu, size, align)
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
        let view = self.pool_view(device, pool_id, offset, size_in_bytes)?;
        let gpu = self.gpu(device)?;
        let b = buffers::of(&view)?;
        b.zero_on(gpu, &gpu.default_stream, size_in_bytes)?;
        gpu.default_stream
            .synchronize()
            .map_err(|e| gpu.driver_error("zeroing pool memory", e))
    }
}

impl PoolMemory for CudaBuffer {
    fn pool_bytes(&self) -> usize {
        self.size_in_bytes_exact()
    }

    fn view(&self, offset: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        Ok(Arc::new(CudaBuffer::view(self, offset, size_in_bytes)?))
    }
}

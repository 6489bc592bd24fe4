//! Storage buffers of the `wgpu` backend: allocations (counted in the device's memory), views
//! of pools, and copies to, from and between them. wgpu copies whole 4-byte words, so every
//! allocation is rounded up to a multiple of 4 bytes; arrays in pools are aligned far more
//! than that, so the rounding never reaches another array.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrayjit_ir::{DeviceLimit, Error, OutOfBounds, RangeUnit, Result};

use super::devices::Gpu;
use crate::device_buffer::{BufferHandle, DeviceBuffer};

/// Bytes wgpu copies at a time.
const WORD: usize = 4;

fn words(bytes: usize) -> usize {
    bytes.div_ceil(WORD).max(1) * WORD
}

/// One allocation; gives its bytes back to the device's count when the last view goes.
struct Allocation {
    buffer: wgpu::Buffer,
    bytes: usize,
    used: Arc<AtomicUsize>,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::Relaxed);
        self.buffer.destroy();
    }
}

/// A storage buffer, or a view of part of a pool's buffer.
#[derive(Clone)]
pub struct WgpuBuffer {
    allocation: Arc<Allocation>,
    /// Where the view starts in the buffer.
    pub(super) offset: usize,
    /// The view's size in bytes.
    pub(super) size: usize,
    /// The buffer itself.
    pub(super) buffer: wgpu::Buffer,
}

impl fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WgpuBuffer({} bytes at {})", self.size, self.offset)
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn size_in_bytes(&self) -> usize {
        self.size
    }
    fn device(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl WgpuBuffer {
    /// Bytes `offset..offset + size` of this buffer, as a buffer of their own.
    pub(super) fn view(&self, offset: usize, size: usize) -> Result<WgpuBuffer> {
        OutOfBounds::range_end(offset, size, self.size, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a pool (making a view of it)", problem))?;
        Ok(WgpuBuffer {
            allocation: self.allocation.clone(),
            offset: self.offset + offset,
            size,
            buffer: self.buffer.clone(),
        })
    }

    /// The buffer as a binding (its whole view, in words).
    pub(super) fn binding(&self) -> wgpu::BindingResource<'_> {
        let room = self.allocation.bytes - self.offset;
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset as u64,
            size: std::num::NonZeroU64::new(words(self.size).min(room) as u64),
        })
    }
}

/// The wgpu buffer behind a handle, or an error for another backend's buffer.
pub(super) fn of(handle: &BufferHandle) -> Result<&WgpuBuffer> {
    handle
        .as_any()
        .downcast_ref::<WgpuBuffer>()
        .ok_or_else(|| Error::ForeignBuffer {
            what: "a buffer given to it".into(),
            backend: super::NAME.into(),
        })
}

/// A new zero-filled buffer of at least `size` bytes (wgpu zero-initializes buffers).
pub(super) fn allocate(gpu: &Gpu, used: &Arc<AtomicUsize>, size: usize) -> Result<WgpuBuffer> {
    let bytes = words(size);
    if bytes as u64 > gpu.max_buffer_bytes {
        return Err(Error::limit_exceeded(
            gpu.label(),
            format!("a buffer of {bytes} bytes"),
            DeviceLimit::BufferBytes,
            bytes as u64,
            gpu.max_buffer_bytes,
            "lower the pool size limit (ARRAYJIT_MAX_POOL_MB) or use smaller arrays",
        ));
    }
    let buffer = gpu.scoped(&format!("allocating {bytes} bytes"), || {
        Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("arrayjit array"),
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    })?;
    used.fetch_add(bytes, Ordering::Relaxed);
    Ok(WgpuBuffer {
        allocation: Arc::new(Allocation {
            buffer: buffer.clone(),
            bytes,
            used: used.clone(),
        }),
        offset: 0,
        size,
        buffer,
    })
}

fn same_size(what: &str, buffer: usize, host: usize) -> Result<()> {
    Error::check_same_size(what, buffer, host, RangeUnit::Bytes)
}

/// Whether bytes `start..end` of `b` can be written on their own: wgpu writes whole words
/// from a word boundary, so the range must start on one and end on one or at the buffer's end
/// (whose padding no one else uses).
pub(super) fn word_aligned(b: &WgpuBuffer, start: usize, end: usize) -> bool {
    (b.offset + start).is_multiple_of(WORD) && (end.is_multiple_of(WORD) || end == b.size)
}

/// Copies host bytes into a buffer (queued; runs before later work on the queue).
pub(super) fn write(gpu: &Gpu, dst: &WgpuBuffer, src: &[u8]) -> Result<()> {
    same_size("copying to the device", dst.size, src.len())?;
    gpu.scoped("copying to the device", || {
        if src.len().is_multiple_of(WORD) {
            gpu.queue.write_buffer(&dst.buffer, dst.offset as u64, src);
        } else {
            let mut padded = src.to_vec();
            padded.resize(words(src.len()), 0);
            gpu.queue
                .write_buffer(&dst.buffer, dst.offset as u64, &padded);
        }
        gpu.queue.submit([]);
        Ok(())
    })
}

/// Copies a buffer into host bytes, after everything queued before.
pub(super) fn read(gpu: &Gpu, src: &WgpuBuffer, dst: &mut [u8]) -> Result<()> {
    same_size("copying to the host", src.size, dst.len())?;
    let bytes = words(src.size) as u64;
    let staging = gpu.scoped("copying to the host", || {
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("arrayjit staging"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(&src.buffer, src.offset as u64, &staging, 0, bytes);
        gpu.queue.submit([encoder.finish()]);
        Ok(staging)
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait("copying to the host")?;
    let mapped = rx
        .recv()
        .map_err(|e| gpu.driver_error("copying to the host", Box::new(e)))?;
    mapped.map_err(|e| gpu.driver_error("copying to the host", Box::new(e)))?;
    {
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| gpu.driver_error("copying to the host", Box::new(e)))?;
        dst.copy_from_slice(&view[..dst.len()]);
    }
    staging.unmap();
    Ok(())
}

/// Copies one buffer into another of the same size (queued).
pub(super) fn copy(gpu: &Gpu, dst: &WgpuBuffer, src: &WgpuBuffer) -> Result<()> {
    same_size("copying between buffers", dst.size, src.size)?;
    gpu.scoped("copying between buffers", || {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let bytes = words(src.size) as u64;
        encoder.copy_buffer_to_buffer(
            &src.buffer,
            src.offset as u64,
            &dst.buffer,
            dst.offset as u64,
            bytes,
        );
        gpu.queue.submit([encoder.finish()]);
        Ok(())
    })
}

/// Zeroes a buffer (queued).
pub(super) fn zero(gpu: &Gpu, b: &WgpuBuffer) -> Result<()> {
    if b.size == 0 {
        return Ok(());
    }
    gpu.scoped("zeroing a buffer", || {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.clear_buffer(&b.buffer, b.offset as u64, Some(words(b.size) as u64));
        gpu.queue.submit([encoder.finish()]);
        Ok(())
    })
}

//! CUDA device memory: allocations (given back in stream order: [`super::releases`]) and
//! buffers that view them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrayjit_ir::{Error, OutOfBounds, RangeUnit, Result};
use cudarc::driver::CudaStream;
use cudarc::driver::result as cu;
use cudarc::driver::sys::CUdeviceptr;

use super::NAME;
use super::devices::Gpu;
use crate::device_buffer::{BufferHandle, DeviceBuffer};

/// One `cuMemAlloc` allocation.
struct Allocation {
    gpu: Arc<Gpu>,
    ptr: CUdeviceptr,
    bytes: usize,
}

impl Drop for Allocation {
    /// Work still queued may use the memory: it goes to the device's release list, freed once
    /// a fence after that work has passed (never synchronizing the context, never during a
    /// capture).
    fn drop(&mut self) {
        self.gpu.releases.release(self.ptr, self.bytes);
        self.gpu.reclaim(false);
    }
}

/// A range of device memory: a whole allocation or a view of a pool.
#[derive(Clone)]
pub struct CudaBuffer {
    alloc: Arc<Allocation>,
    /// Where the range starts in the allocation, after alignment.
    offset: usize,
    size: usize,
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaBuffer({} bytes at +{} on {})",
            self.size,
            self.offset,
            self.alloc.gpu.label()
        )
    }
}

impl DeviceBuffer for CudaBuffer {
    fn size_in_bytes(&self) -> usize {
        self.size
    }
    fn device(&self) -> usize {
        self.alloc.gpu.ordinal
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The CUDA buffer behind a handle.
pub(super) fn of(b: &BufferHandle) -> Result<&CudaBuffer> {
    b.as_any()
        .downcast_ref::<CudaBuffer>()
        .ok_or_else(|| Error::ForeignBuffer {
            what: "a buffer passed to it".into(),
            backend: NAME.into(),
        })
}

impl CudaBuffer {
    /// `size` zeroed bytes aligned to `alignment` (a power of two).
    pub(super) fn allocate(gpu: &Arc<Gpu>, size: usize, alignment: usize) -> Result<CudaBuffer> {
        let action = format!("allocating {size} bytes");
        // cuMemAlloc aligns to 256 bytes; more takes slack.
        let slack = alignment.max(256) - 256;
        let bytes = (size + slack).max(1);
        gpu.reclaim(false);
        gpu.bind(&action)?;
        let out_of_memory = |e: &cudarc::driver::DriverError| {
            e.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
        };
        // SAFETY: plain allocation of a new range in the bound context.
        let mut allocated = unsafe { cu::malloc_sync(bytes) };
        if allocated.as_ref().is_err_and(out_of_memory) && gpu.releases.pending_bytes() > 0 {
            // Memory released but not yet freed: wait for its fences, then try again.
            gpu.reclaim(true);
            gpu.bind(&action)?;
            // SAFETY: as above.
            allocated = unsafe { cu::malloc_sync(bytes) };
        }
        let ptr = allocated.map_err(|e| {
            if out_of_memory(&e) {
                Error::OutOfMemory {
                    what: format!("device memory on {}", gpu.label()),
                    bytes,
                }
            } else {
                gpu.driver_error(&action, e)
            }
        })?;
        let alloc = Arc::new(Allocation {
            gpu: gpu.clone(),
            ptr,
            bytes,
        });
        gpu.used.fetch_add(bytes, Ordering::Relaxed);
        // Zeroed on the device's own stream and waited for: `cuMemsetD8` would return before
        // the zeroing has run (it is asynchronous for device memory) and goes on the legacy
        // stream, which the backend's non-blocking streams do not wait for, so a copy or a
        // launch queued next on another stream could run first and be zeroed over (seen on
        // an H200: inputs read back as zeros, intermittently).
        let stream = &gpu.default_stream;
        // SAFETY: `ptr` is the allocation of `bytes` just made on this device's context.
        unsafe { cu::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }
            .and_then(|_| stream.synchronize())
            .map_err(|e| gpu.driver_error(&action, e))?;
        let align = alignment.max(1) as u64;
        let offset = (ptr.div_ceil(align) * align - ptr) as usize;
        Ok(CudaBuffer {
            alloc,
            offset,
            size,
        })
    }

    /// Bytes `offset..offset + size` of this buffer (a pool).
    pub(super) fn view(&self, offset: usize, size: usize) -> Result<CudaBuffer> {
        OutOfBounds::range_end(offset, size, self.size, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a pool (making a view of it)", problem))?;
        Ok(CudaBuffer {
            alloc: self.alloc.clone(),
            offset: self.offset + offset,
            size,
        })
    }

    pub(super) fn device_ordinal(&self) -> usize {
        self.alloc.gpu.ordinal
    }

    pub(super) fn size_in_bytes_exact(&self) -> usize {
        self.size
    }

    /// The device address of the range.
    pub(super) fn device_ptr(&self) -> u64 {
        self.alloc.ptr + self.offset as u64
    }

    fn same_size(&self, what: &str, other: usize) -> Result<()> {
        Error::check_same_size(what, self.size, other, RangeUnit::Bytes)
    }

    /// Copies host bytes in (queued on `stream`; the bytes may be reused on return: pageable
    /// memory is staged before the call returns).
    pub(super) fn write(&self, gpu: &Gpu, src: &[u8], stream: &CudaStream) -> Result<()> {
        self.same_size("copying to the device", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        gpu.bind("copying to the device")?;
        // SAFETY: the range holds `src.len()` bytes.
        unsafe { cu::memcpy_htod_async(self.device_ptr(), src, stream.cu_stream()) }
            .map_err(|e| gpu.driver_error("copying to the device", e))
    }

    /// Copies into host bytes after the work of `stream`; done when this returns.
    pub(super) fn read(&self, gpu: &Gpu, dst: &mut [u8], stream: &CudaStream) -> Result<()> {
        self.same_size("copying to the host", dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        gpu.bind("copying to the host")?;
        // SAFETY: the range holds `dst.len()` bytes; the stream is synchronized before `dst`
        // is released.
        unsafe { cu::memcpy_dtoh_async(dst, self.device_ptr(), stream.cu_stream()) }
            .and_then(|_| stream.synchronize())
            .map_err(|e| gpu.driver_error("copying to the host", e))
    }

    /// Copies another buffer of the same device and size in (queued on `stream`).
    pub(super) fn copy_from(&self, gpu: &Gpu, src: &CudaBuffer, stream: &CudaStream) -> Result<()> {
        if self.size == 0 || self.device_ptr() == src.device_ptr() {
            return Ok(());
        }
        gpu.bind("copying between buffers")?;
        // SAFETY: both ranges hold `size` bytes of this device.
        unsafe {
            cu::memcpy_dtod_async(
                self.device_ptr(),
                src.device_ptr(),
                self.size,
                stream.cu_stream(),
            )
        }
        .map_err(|e| gpu.driver_error("copying between buffers", e))
    }

    /// Zeroes the first `bytes` of the range (queued on `stream`).
    pub(super) fn zero_on(&self, gpu: &Gpu, stream: &CudaStream, bytes: usize) -> Result<()> {
        let bytes = bytes.min(self.size);
        if bytes == 0 {
            return Ok(());
        }
        gpu.bind("zeroing device memory")?;
        // SAFETY: the range holds at least `bytes` bytes.
        unsafe { cu::memset_d8_async(self.device_ptr(), 0, bytes, stream.cu_stream()) }
            .map_err(|e| gpu.driver_error("zeroing device memory", e))
    }
}

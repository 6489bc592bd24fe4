//! Host-memory buffers for the CPU backends: 64-byte aligned, zero-initialized, with per-device
//! memory accounting.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrayjit_ir::{Error, Result};

use crate::DeviceBuffer;

/// Counts the bytes allocated on one device.
#[derive(Debug, Default)]
pub struct MemoryCounter(AtomicUsize);

impl MemoryCounter {
    /// Bytes currently allocated.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A block of host memory used as a device array. Kernels write it through raw pointers; the
/// runtime serializes access per stream.
pub struct CpuBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
    size: usize,
    device: usize,
    counter: Arc<MemoryCounter>,
}

// SAFETY: the buffer owns its allocation; concurrent access is serialized by the runtime (a
// buffer is used by the stream of the context that holds it).
unsafe impl Send for CpuBuffer {}
// SAFETY: as above.
unsafe impl Sync for CpuBuffer {}

/// Alignment of CPU buffers (a cache line, enough for any SIMD load).
pub const CPU_BUFFER_ALIGNMENT: usize = 64;

impl CpuBuffer {
    /// A zero-filled buffer of `size` bytes on `device`, counted in `counter`.
    pub fn zeroed(size: usize, device: usize, counter: Arc<MemoryCounter>) -> Result<CpuBuffer> {
        let layout = Layout::from_size_align(size.max(1), CPU_BUFFER_ALIGNMENT)
            .map_err(|e| Error::invalid(format!("cannot allocate {size} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Runtime {
            stream: format!("cpu device {device}"),
            detail: format!("out of memory allocating {size} bytes"),
        })?;
        counter.0.fetch_add(size, Ordering::Relaxed);
        Ok(CpuBuffer {
            ptr,
            layout,
            size,
            device,
            counter,
        })
    }

    /// The start of the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The contents. The caller must ensure no kernel writes the buffer meanwhile (the runtime
    /// does, by running transfers and kernels of a stream one at a time).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds `size` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    /// Overwrites the contents with `src` (same length).
    pub fn write(&self, src: &[u8]) {
        debug_assert_eq!(src.len(), self.size);
        // SAFETY: `src` has `size` bytes (checked by callers) and cannot overlap a buffer we own.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), self.size.min(src.len()))
        }
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        self.counter.0.fetch_sub(self.size, Ordering::Relaxed);
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CpuBuffer({} bytes on device {})",
            self.size, self.device
        )
    }
}

impl DeviceBuffer for CpuBuffer {
    fn size_in_bytes(&self) -> usize {
        self.size
    }
    fn device(&self) -> usize {
        self.device
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

//! Host-memory buffers for the CPU backends: 64-byte aligned, zero-initialized, with per-device
//! memory accounting; or a node's host array, used in place or handed to the device.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arrayjit_ir::{Error, OutOfBounds, RangeUnit, Result};

use crate::device_buffer::DeviceBuffer;

/// Counts the bytes allocated on one device.
#[derive(Debug, Default)]
pub struct MemoryCounter(AtomicUsize);

impl MemoryCounter {
    /// Bytes currently allocated.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A block of host memory used as a device array: an allocation of its own (counted in the
/// device's memory), or a view of part of a pool (which it keeps alive). Kernels write it
/// through raw pointers; the runtime orders access with stream events.
pub struct CpuBuffer {
    ptr: NonNull<u8>,
    size: usize,
    device: usize,
    backing: Backing,
    /// Whether its memory was populated for writes ([`CpuBuffer::populate_once`]); only a
    /// buffer with memory of its own (not a view or a host array in place) uses it.
    populated: AtomicBool,
}

enum Backing {
    /// An allocation of its own, which starts at `base` (at or before the aligned `ptr`).
    Owned {
        base: NonNull<u8>,
        layout: Layout,
        counter: Arc<MemoryCounter>,
    },
    /// A view keeps its pool's memory alive.
    View { pool: Arc<CpuBuffer> },
    /// The host array of a node, used in place (`use_host_memory`): the node keeps the memory
    /// alive (a host array is never moved or replaced), and its host lock guards every access.
    Host { node: arrayjit_ir::Tnode },
    /// A node's host array handed to the device ([`CpuBuffer::adopt`]): owned like an
    /// allocation of its own (its storage does not move with it) and counted in the device's
    /// memory.
    Adopted {
        _array: arrayjit_ir::Ndarray,
        counter: Arc<MemoryCounter>,
    },
}

// SAFETY: the buffer owns its allocation (or its pool or node does); concurrent access is
// serialized by the runtime (a buffer is used by the stream of the context that holds it) and,
// for a host array in place, by the node's host lock.
unsafe impl Send for CpuBuffer {}
// SAFETY: as above.
unsafe impl Sync for CpuBuffer {}

/// Buffers from this size up are populated before kernels use them
/// ([`CpuBuffer::populate_once`]): below it the pages are few.
pub const POPULATE_FROM: usize = 1 << 20;

/// The whole pages of `len` bytes from `ptr`, populated for writes on the host's threads
/// (`MADV_POPULATE_WRITE`, Linux 5.14 and later); a refusal is no error (the pages then come
/// at first touch).
#[cfg(target_os = "linux")]
fn populate_for_writes(ptr: *mut u8, len: usize) {
    // SAFETY: sysconf only reads a system setting.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096);
    let start = (ptr as usize).next_multiple_of(page);
    let end = (ptr as usize + len) & !(page - 1);
    if end <= start {
        return;
    }
    let whole = end - start;
    let threads = arrayjit_ir::host_threads::threads_for(whole, 64 << 20);
    let per = arrayjit_ir::host_threads::part_length(whole, threads, page);
    let parts: Vec<(usize, usize)> = (start..end)
        .step_by(per)
        .map(|at| (at, per.min(end - at)))
        .collect();
    arrayjit_ir::host_threads::run_parts(parts, threads, |(at, len)| {
        // SAFETY: the range is whole pages inside the buffer's allocation, which outlives the
        // call; populating changes no value, so it cannot disturb a concurrent access.
        let _ = unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    });
}

/// Elsewhere the pages come as kernels first touch them.
#[cfg(not(target_os = "linux"))]
fn populate_for_writes(_ptr: *mut u8, _len: usize) {}

/// Alignment of CPU buffers (a cache line, enough for any SIMD load).
pub const CPU_BUFFER_ALIGNMENT: usize = 64;

/// The alignment up to which the system allocator zero-fills through `calloc` (which maps fresh
/// zero pages for large blocks) rather than clearing the memory itself.
const NATURAL_ALIGNMENT: usize = 16;

impl CpuBuffer {
    /// A zero-filled buffer of `size` bytes on `device`, counted in `counter`.
    pub fn zeroed(size: usize, device: usize, counter: Arc<MemoryCounter>) -> Result<CpuBuffer> {
        CpuBuffer::zeroed_aligned(size, CPU_BUFFER_ALIGNMENT, device, counter)
    }

    /// A zero-filled buffer aligned to `alignment` (at least [`CPU_BUFFER_ALIGNMENT`]).
    pub fn zeroed_aligned(
        size: usize,
        alignment: usize,
        device: usize,
        counter: Arc<MemoryCounter>,
    ) -> Result<CpuBuffer> {
        let alignment = alignment.max(CPU_BUFFER_ALIGNMENT);
        let invalid = |e: &dyn fmt::Display| Error::OutOfMemory {
            what: format!("a buffer aligned to {alignment} ({e})"),
            bytes: size,
        };
        if !alignment.is_power_of_two() {
            return Err(Error::BadValue {
                what: "buffer alignment".into(),
                value: alignment.to_string(),
                expected: "a power of two".into(),
            });
        }
        // Allocated at the allocator's natural alignment with room to align by hand, so that the
        // allocator can hand out fresh zero pages (calloc of a large block maps them, untouched)
        // instead of clearing every page now: the pages of a large pool are zero-filled by the
        // kernel when first used. A layout with the full alignment would be memset here.
        let padded = size
            .max(1)
            .checked_add(alignment)
            .ok_or_else(|| invalid(&"the size overflows"))?;
        let layout = Layout::from_size_align(padded, NATURAL_ALIGNMENT).map_err(|e| invalid(&e))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or_else(|| Error::OutOfMemory {
            what: format!("a buffer on cpu device {device}"),
            bytes: size,
        })?;
        // In bounds: the block has `alignment` spare bytes, and the offset is below that.
        let offset = raw.align_offset(alignment);
        debug_assert!(offset < alignment);
        // SAFETY: `offset + size <= padded`, so the pointer stays inside the allocation.
        let ptr = unsafe { base.add(offset) };
        counter.0.fetch_add(size, Ordering::Relaxed);
        Ok(CpuBuffer {
            ptr,
            size,
            device,
            backing: Backing::Owned {
                base,
                layout,
                counter,
            },
            populated: AtomicBool::new(false),
        })
    }

    /// The host array of `tn` used in place as its array on CPU device `device` (no memory of
    /// the device's own). An error if the node has no host array.
    ///
    /// Kernels and copies reading it hold the node's host lock ([`CpuBuffer::host_node`]);
    /// nothing may write it but the host.
    pub fn host_alias(tn: &arrayjit_ir::Tnode, device: usize) -> Result<CpuBuffer> {
        let (ptr, size) = tn
            .host()
            .with(|nd| {
                let bytes = nd.as_bytes();
                (bytes.as_ptr() as *mut u8, bytes.len())
            })
            .ok_or_else(|| Error::NotHosted {
                node: tn.debug_name(),
                detail: "using a host array in place needs one; set the node's values first".into(),
            })?;
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::invalid("an empty host array"))?;
        Ok(CpuBuffer {
            ptr,
            size,
            device,
            backing: Backing::Host { node: tn.clone() },
            populated: AtomicBool::new(false),
        })
    }

    /// A host array handed to `device` as its own memory (see
    /// `arrayjit_runtime::node_sync::hand_host_array_to_device`): its bytes, padding margins
    /// included, become the buffer's, and no byte is copied. Counted in `counter` until
    /// dropped.
    pub fn adopt(
        mut array: arrayjit_ir::Ndarray,
        device: usize,
        counter: Arc<MemoryCounter>,
    ) -> CpuBuffer {
        let bytes = array.as_bytes_mut();
        let size = bytes.len();
        // The storage is a heap allocation that stays where it is when `array` moves into the
        // buffer below; an empty one has a dangling, never dereferenced, pointer.
        let ptr = NonNull::new(bytes.as_mut_ptr()).unwrap_or(NonNull::dangling());
        counter.0.fetch_add(size, Ordering::Relaxed);
        CpuBuffer {
            ptr,
            size,
            device,
            backing: Backing::Adopted {
                _array: array,
                counter,
            },
            populated: AtomicBool::new(false),
        }
    }

    /// Has the system back every page of the buffer's memory (its pool's, for a view) with a
    /// page of its own, the first time it is called for that memory, before kernels use it
    /// (from [`POPULATE_FROM`] bytes up; a host array used in place is the host's business).
    ///
    /// Fresh memory maps the system's shared zero page where it is first read; a kernel that
    /// reads an array before writing it (an optimizer's moments, which start at zero) then
    /// copies that page on the write, and with several threads each copy costs a TLB
    /// shootdown, an interrupt to every other core, which in a virtual machine is an exit to
    /// the hypervisor. Populated for writes at once (Linux's `MADV_POPULATE_WRITE`, on the
    /// host's threads), the pages cost what first writes would. Values do not change, so it
    /// may overlap any access of the memory. Elsewhere, or where the system refuses, nothing
    /// happens and the pages come as the kernels touch them.
    pub fn populate_once(&self) {
        let block = match &self.backing {
            Backing::View { pool } => pool.as_ref(),
            Backing::Host { .. } => return,
            Backing::Owned { .. } | Backing::Adopted { .. } => self,
        };
        // A plain load first: after the first launch this is all every launch pays.
        if block.size < POPULATE_FROM
            || block.populated.load(Ordering::Relaxed)
            || block.populated.swap(true, Ordering::Relaxed)
        {
            return;
        }
        populate_for_writes(block.ptr.as_ptr(), block.size);
    }

    /// The node whose host array this buffer is, if it is one ([`CpuBuffer::host_alias`]).
    pub fn host_node(&self) -> Option<&arrayjit_ir::Tnode> {
        match &self.backing {
            Backing::Host { node } => Some(node),
            _ => None,
        }
    }

    fn refuse_host_write(&self, what: &str) -> Result<()> {
        match self.host_node() {
            Some(tn) => Err(Error::HostArrayInPlace {
                node: tn.debug_name(),
                action: what.into(),
            }),
            None => Ok(()),
        }
    }

    /// A view of bytes `offset..offset + size` of `pool`.
    pub fn view(pool: &Arc<CpuBuffer>, offset: usize, size: usize) -> Result<CpuBuffer> {
        OutOfBounds::range_end(offset, size, pool.size, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a pool (making a view of it)", problem))?;
        // SAFETY: `offset + size <= pool.size`, so the pointer stays inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(pool.ptr.as_ptr().add(offset)) };
        Ok(CpuBuffer {
            ptr,
            size,
            device: pool.device,
            backing: Backing::View { pool: pool.clone() },
            populated: AtomicBool::new(false),
        })
    }

    /// Sets bytes `offset..offset + size` to zero (a range outside the buffer is an error).
    ///
    /// # Safety
    /// Nothing else may read or write those bytes meanwhile: no kernel, copy or reference from
    /// [`CpuBuffer::bytes`] (of this buffer, its pool or another view of it) may be in use.
    /// The runtime ensures this by ordering every access of an array with stream events.
    pub unsafe fn zero_range(&self, offset: usize, size: usize) -> Result<()> {
        self.refuse_host_write("zeroing")?;
        OutOfBounds::range_end(offset, size, self.size, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a buffer (zeroing it)", problem))?;
        // SAFETY: the range is inside the buffer (checked above); exclusive access is the
        // caller's contract.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), 0, size) };
        Ok(())
    }

    /// The start of the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The contents.
    ///
    /// # Safety
    /// While the returned slice lives, nothing may write the buffer's bytes: no kernel, no copy
    /// into it, its pool or an overlapping view. The runtime ensures this by ordering every
    /// access of an array with stream events (see the runtime's `host_sync` rules).
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds `size` initialized bytes; no concurrent writer is the
        // caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    /// Overwrites bytes `offset..offset + src.len()` with `src` (a range outside the buffer is
    /// an error, and nothing is written).
    ///
    /// # Safety
    /// As for [`CpuBuffer::write`].
    pub unsafe fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.refuse_host_write("writing")?;
        OutOfBounds::range_end(offset, src.len(), self.size, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a buffer (writing it)", problem))?;
        // SAFETY: the range is inside the buffer (checked above); exclusive access and no
        // overlap are the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Overwrites the contents with `src`, which must have the buffer's length (else an error,
    /// and nothing is written).
    ///
    /// # Safety
    /// Nothing else may read or write the buffer's bytes meanwhile (no kernel, copy or slice
    /// from [`CpuBuffer::bytes`] of it, its pool or an overlapping view), and `src` must not be
    /// such a slice of this buffer.
    pub unsafe fn write(&self, src: &[u8]) -> Result<()> {
        self.refuse_host_write("writing")?;
        if src.len() != self.size {
            return Err(Error::ShapeMismatch {
                op: "CpuBuffer::write".into(),
                shapes: vec![],
                detail: format!(
                    "the buffer holds {} bytes but {} were given",
                    self.size,
                    src.len()
                ),
            });
        }
        // SAFETY: the buffer holds `size` bytes at `ptr`; exclusive access and no overlap with
        // `src` are the caller's contract, so they may be borrowed mutably meanwhile.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) };
        arrayjit_ir::host_threads::copy_bytes(dst, src);
        Ok(())
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if let Backing::Owned { counter, .. } | Backing::Adopted { counter, .. } = &self.backing {
            counter.0.fetch_sub(self.size, Ordering::Relaxed);
        }
        // An adopted array is dropped with the backing; an allocation of its own is freed here.
        if let Backing::Owned { base, layout, .. } = &self.backing {
            // SAFETY: `base` was allocated in `zeroed_aligned` with this layout; guards a pool's
            // planner poisoned are unpoisoned before the memory goes back to the allocator.
            unsafe {
                crate::cpu::sanitizer::unpoison(base.as_ptr(), layout.size());
                dealloc(base.as_ptr(), *layout)
            }
        }
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.backing {
            Backing::Owned { .. } => "",
            Backing::View { .. } => " (pool view)",
            Backing::Host { .. } => " (a host array in place)",
            Backing::Adopted { .. } => " (a host array handed to the device)",
        };
        write!(
            f,
            "CpuBuffer({} bytes on device {}{kind})",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of the whole pages of `buffer` are resident (Linux's `mincore`).
    #[cfg(target_os = "linux")]
    fn resident_pages(buffer: &CpuBuffer) -> usize {
        let page = 4096;
        let start = (buffer.as_ptr() as usize).next_multiple_of(page);
        let end = (buffer.as_ptr() as usize + buffer.size_in_bytes()) & !(page - 1);
        let mut vec = vec![0u8; (end - start) / page];
        // SAFETY: the range is whole pages of the buffer's allocation; `vec` has a byte per page.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn fresh_memory_is_populated_once_before_kernels_use_it() {
        let counter = Arc::new(MemoryCounter::default());
        let size = 8 * POPULATE_FROM;
        let pool = Arc::new(CpuBuffer::zeroed(size, 0, counter.clone()).unwrap());
        let view = CpuBuffer::view(&pool, POPULATE_FROM, POPULATE_FROM).unwrap();
        let fresh = resident_pages(&pool);
        // A large zero-filled block comes as untouched pages (calloc maps them).
        assert!(fresh < size / 4096 / 2, "{fresh} pages resident already");
        // Through a view, its pool's memory: every page, and the values stay zeros.
        view.populate_once();
        let populated = resident_pages(&pool);
        if populated == fresh {
            // Only a system without `MADV_POPULATE_WRITE` (Linux before 5.14) may leave them.
            let probe = CpuBuffer::zeroed(2 * POPULATE_FROM, 0, counter.clone()).unwrap();
            let at = (probe.as_ptr() as usize).next_multiple_of(4096);
            // SAFETY: one whole page inside the probe's allocation; values do not change.
            let rc =
                unsafe { libc::madvise(at as *mut libc::c_void, 4096, libc::MADV_POPULATE_WRITE) };
            assert_ne!(
                rc, 0,
                "the system populates, but the pool was not populated"
            );
            return;
        }
        assert!(
            populated >= size / 4096 - 2,
            "{populated} of {} pages",
            size / 4096
        );
        // SAFETY: nothing else uses the buffer.
        assert!(unsafe { pool.bytes() }.iter().all(|&b| b == 0));
        assert!(pool.populated.load(Ordering::Relaxed) && !view.populated.load(Ordering::Relaxed));
        // A small buffer is left alone, and a host array in place is the host's.
        let small = CpuBuffer::zeroed(POPULATE_FROM / 2, 0, counter.clone()).unwrap();
        small.populate_once();
        assert!(!small.populated.load(Ordering::Relaxed));
        // A host array handed over keeps its values.
        let mut nd = arrayjit_ir::Ndarray::zeros(arrayjit_ir::Prec::F32, &[POPULATE_FROM]).unwrap();
        nd.as_bytes_mut()[5] = 7;
        let adopted = CpuBuffer::adopt(nd, 0, counter.clone());
        adopted.populate_once();
        assert!(adopted.populated.load(Ordering::Relaxed));
        // SAFETY: nothing else uses the buffer.
        assert_eq!(unsafe { adopted.bytes() }[5], 7);
        assert_eq!(counter.get(), size + POPULATE_FROM / 2 + 4 * POPULATE_FROM);
    }

    #[test]
    fn item23_buffer_access_checks_lengths_and_ranges() {
        let counter = Arc::new(MemoryCounter::default());
        let pool = Arc::new(CpuBuffer::zeroed_aligned(256, 64, 0, counter.clone()).unwrap());
        assert_eq!(counter.get(), 256);
        let view = CpuBuffer::view(&pool, 64, 64).unwrap();
        assert!(
            CpuBuffer::view(&pool, 200, 64).is_err(),
            "a view past the pool"
        );
        assert!(
            CpuBuffer::view(&pool, usize::MAX, 2).is_err(),
            "an overflowing view"
        );
        // SAFETY: nothing else uses these buffers in this test.
        unsafe {
            assert!(
                view.write(&[1u8; 63]).is_err(),
                "a write of the wrong length"
            );
            assert!(
                view.bytes().iter().all(|&b| b == 0),
                "a failed write wrote nothing"
            );
            view.write(&[7u8; 64]).unwrap();
            assert_eq!(&pool.bytes()[64..128], &[7u8; 64]);
            assert!(pool.zero_range(250, 10).is_err());
            assert!(pool.zero_range(usize::MAX, 2).is_err());
            pool.zero_range(64, 32).unwrap();
            assert_eq!(&view.bytes()[..32], &[0u8; 32]);
            assert_eq!(&view.bytes()[32..], &[7u8; 32]);
        }
        drop(view);
        drop(pool);
        assert_eq!(counter.get(), 0, "memory is given back");
    }
}

//! The CPU runtime, shared by every CPU backend (`cc` runs C on it, `cuda_emu` emulated CUDA):
//! devices are slices of the host, each with a memory counter and a worker pool; buffers are
//! [`CpuBuffer`]s (host memory, or a hosted node's host array used in place or handed over);
//! pools live in a [`PoolTable`]; copies are `memcpy`s that finish before they return.

pub mod buffer;
pub mod sanitizer;
pub mod tuning;
pub mod worker_pool;

use std::sync::Arc;

use arrayjit_ir::{Error, OutOfBounds, RangeUnit, Result};

use crate::cpu::buffer::{CpuBuffer, MemoryCounter};
use crate::cpu::worker_pool::WorkerPool;
use crate::device_buffer::{BufferHandle, DeviceBuffer};
use crate::device_info::DeviceInfo;
use crate::device_runtime::DeviceRuntime;
use crate::pool_table::{PoolMemory, PoolTable};
use crate::queue::Queue;

/// The settings of a [`CpuRuntime`] (from the backend's `CcConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuRuntimeConfig {
    /// Number of devices.
    pub num_devices: usize,
    /// Threads of each device's worker pool.
    pub workers_per_device: usize,
    /// Bytes left unused around every array of a pool (poisoned under AddressSanitizer).
    pub pool_guard_bytes: usize,
    /// Whether hosted constant and volatile nodes' host arrays serve as their device arrays,
    /// and nodes changed on devices get theirs handed over.
    pub use_host_memory: bool,
}

/// The runtime of the CPU backends.
#[derive(Debug)]
pub struct CpuRuntime {
    backend: &'static str,
    counters: Vec<Arc<MemoryCounter>>,
    workers: Arc<Vec<WorkerPool>>,
    pools: PoolTable<Arc<CpuBuffer>>,
    pool_guard_bytes: usize,
    use_host_memory: bool,
}

impl PoolMemory for Arc<CpuBuffer> {
    fn pool_bytes(&self) -> usize {
        self.size_in_bytes()
    }

    fn view(&self, offset: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        Ok(Arc::new(CpuBuffer::view(self, offset, size_in_bytes)?))
    }
}

/// Runs `f` holding the host locks of the nodes whose host arrays `buffers` use in place, taken
/// in order of node id (so two launches never wait for each other's locks).
pub(crate) fn with_host_locks<R>(buffers: &[&CpuBuffer], f: impl FnOnce() -> R) -> R {
    let mut nodes: Vec<&arrayjit_ir::Tnode> =
        buffers.iter().filter_map(|b| b.host_node()).collect();
    nodes.sort_by_key(|t| t.id());
    nodes.dedup_by_key(|t| t.id());
    let _held: Vec<arrayjit_ir::tnode::HostLock<'_>> =
        nodes.iter().map(|t| t.host().lock()).collect();
    f()
}

impl CpuRuntime {
    /// The runtime of backend `backend` (named in errors and thread names), starting each
    /// device's worker threads.
    pub fn new(backend: &'static str, config: &CpuRuntimeConfig) -> Result<CpuRuntime> {
        let counters = (0..config.num_devices)
            .map(|_| Arc::new(MemoryCounter::default()))
            .collect();
        let workers = (0..config.num_devices)
            .map(|d| {
                WorkerPool::new(config.workers_per_device, &format!("arrayjit cpu {d}")).map_err(
                    |source| Error::ThreadSpawn {
                        thread: format!("the worker threads of {backend} device {d}"),
                        source,
                    },
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuRuntime {
            backend,
            counters,
            workers: Arc::new(workers),
            pools: PoolTable::new(backend),
            pool_guard_bytes: config.pool_guard_bytes,
            use_host_memory: config.use_host_memory,
        })
    }

    /// The worker pools, one per device (kernels split their parallel loops on them).
    pub fn workers(&self) -> &Arc<Vec<WorkerPool>> {
        &self.workers
    }

    /// The worker threads of device 0 (1 when there is no device).
    pub fn workers_per_device(&self) -> usize {
        self.workers.first().map_or(1, WorkerPool::workers)
    }

    /// The host CPU (detected once per process) as device `device`, with its worker threads.
    pub fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        self.device_check(device)?;
        let cpu = crate::device_info::CpuInfo::host();
        Ok(DeviceInfo::cpu(cpu, self.workers[device].workers()))
    }

    /// The buffer as a [`CpuBuffer`], or an error naming the backend.
    fn cpu<'a>(&self, b: &'a BufferHandle) -> Result<&'a CpuBuffer> {
        b.as_any()
            .downcast_ref::<CpuBuffer>()
            .ok_or_else(|| Error::ForeignBuffer {
                what: format!("buffer {b:?}"),
                backend: self.backend.into(),
            })
    }

    fn pool(&self, device: usize, pool_id: usize) -> Result<Arc<CpuBuffer>> {
        self.device_check(device)?;
        self.pools.with(device, pool_id, Arc::clone)
    }

    fn device_check(&self, device: usize) -> Result<()> {
        if device < self.counters.len() {
            Ok(())
        } else {
            Err(Error::NoSuchDevice {
                backend: self.backend.into(),
                ordinal: device,
                num_devices: self.counters.len(),
            })
        }
    }
}

impl DeviceRuntime for CpuRuntime {
    fn num_devices(&self) -> usize {
        self.counters.len()
    }

    fn host_memory_buffer(
        &self,
        device: usize,
        tn: &arrayjit_ir::Tnode,
    ) -> Result<Option<BufferHandle>> {
        self.device_check(device)?;
        if !self.use_host_memory {
            return Ok(None);
        }
        Ok(Some(Arc::new(CpuBuffer::host_alias(tn, device)?)))
    }

    fn adopts_host_arrays(&self) -> bool {
        // The same switch as host arrays used in place: host memory is the device's.
        self.use_host_memory
    }

    fn adopt_host_array(
        &self,
        device: usize,
        array: &mut Option<arrayjit_ir::Ndarray>,
    ) -> Result<BufferHandle> {
        self.device_check(device)?;
        let array = array
            .take()
            .ok_or_else(|| Error::invalid("no host array to make a device array of"))?;
        let prec = array.prec();
        let buffer = Arc::new(CpuBuffer::adopt(
            array,
            device,
            self.counters[device].clone(),
        ));
        Ok(crate::array_buffer::typed_host_array(buffer, prec))
    }

    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        self.device_check(device)?;
        Ok(Arc::new(CpuBuffer::zeroed(
            size_in_bytes,
            device,
            self.counters[device].clone(),
        )?))
    }

    fn available_memory(&self, _device: usize) -> Option<usize> {
        // A CPU device's arrays are host memory.
        arrayjit_ir::host_memory::available_host_memory()
    }

    fn copies_into_new_buffers_at_once(&self) -> bool {
        // A buffer is host memory, and a copy is a memcpy that is done when it returns.
        true
    }

    unsafe fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], _: Queue<'_>) -> Result<()> {
        let d = self.cpu(dst)?;
        Error::check_same_size(
            "copying from the host",
            d.size_in_bytes(),
            src.len(),
            RangeUnit::Bytes,
        )?;
        // SAFETY: the runtime schedules copies and kernels touching an array in an order that
        // never overlaps a write with another access (the `host_sync` rules).
        unsafe { d.write(src) }
    }

    unsafe fn copy_to_host(&self, src: &BufferHandle, dst: &mut [u8], _: Queue<'_>) -> Result<()> {
        let s = self.cpu(src)?;
        Error::check_same_size(
            "copying to the host",
            s.size_in_bytes(),
            dst.len(),
            RangeUnit::Bytes,
        )?;
        with_host_locks(&[s], || {
            // SAFETY: as in `copy_from_host`: no write of `src` runs meanwhile (a host array
            // in place is read under its node's host lock, so the host does not write it
            // either).
            let bytes = unsafe { s.bytes() };
            arrayjit_ir::host_threads::copy_bytes(dst, bytes)
        });
        Ok(())
    }

    unsafe fn copy_from_host_range(
        &self,
        dst: &BufferHandle,
        offset: usize,
        src: &[u8],
        _: Queue<'_>,
    ) -> Result<()> {
        // SAFETY: as in `copy_from_host`.
        unsafe { self.cpu(dst)?.write_at(offset, src) }
    }

    unsafe fn copy_to_host_range(
        &self,
        src: &BufferHandle,
        offset: usize,
        dst: &mut [u8],
        _: Queue<'_>,
    ) -> Result<()> {
        let end = crate::device_runtime::byte_range_end(src, offset, dst.len())?;
        let s = self.cpu(src)?;
        with_host_locks(&[s], || {
            // SAFETY: as in `copy_to_host`.
            dst.copy_from_slice(&unsafe { s.bytes() }[offset..end])
        });
        Ok(())
    }

    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        _: Queue<'_>,
    ) -> Result<()> {
        let (d, s) = (self.cpu(dst)?, self.cpu(src)?);
        Error::check_same_size(
            "copying device to device",
            d.size_in_bytes(),
            s.size_in_bytes(),
            RangeUnit::Bytes,
        )?;
        if std::ptr::eq(d.as_ptr(), s.as_ptr()) {
            // The same memory (one node's host array used in place by both): nothing to copy.
            return Ok(());
        }
        // SAFETY: as in `copy_from_host`; `d` and `s` are distinct arrays (views of one pool
        // never overlap: the planner places live arrays apart); a host array in place is read
        // under its node's host lock.
        with_host_locks(&[s], || unsafe { d.write(s.bytes()) })?;
        Ok(())
    }

    fn used_memory(&self, device: usize) -> usize {
        self.counters.get(device).map_or(0, |c| c.get())
    }

    fn alloc_pool(
        &self,
        device: usize,
        pool_id: usize,
        size_in_bytes: usize,
        alignment: usize,
    ) -> Result<()> {
        self.device_check(device)?;
        self.pools
            .insert_with(device, pool_id, size_in_bytes, alignment, |size, align| {
                Ok(Arc::new(CpuBuffer::zeroed_aligned(
                    size,
                    align,
                    device,
                    self.counters[device].clone(),
                )?))
            })
    }

    fn pool_guard_bytes(&self) -> usize {
        self.pool_guard_bytes
    }

    fn guard_pool(&self, device: usize, pool_id: usize, unused: &[(usize, usize)]) -> Result<bool> {
        let pool = self.pool(device, pool_id)?;
        let mut checked = false;
        for &(offset, len) in unused {
            OutOfBounds::range_end(offset, len, pool.size_in_bytes(), RangeUnit::Bytes).map_err(
                |problem| Error::IndexOutOfBounds {
                    array: format!("pool {pool_id}"),
                    problem,
                    during: "poisoning the guard bytes between its arrays".into(),
                },
            )?;
            // SAFETY: the range lies inside the pool's allocation (checked above), and no array
            // of the plan uses it, so nothing accesses it legitimately; the pool is unpoisoned
            // before it is freed (`CpuBuffer`'s drop).
            checked |= unsafe { crate::cpu::sanitizer::poison(pool.as_ptr().add(offset), len) };
        }
        Ok(checked)
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
        // SAFETY: the runtime zeroes a pool range only when no work uses it.
        unsafe {
            self.pool(device, pool_id)?
                .zero_range(offset, size_in_bytes)
        }
    }
}

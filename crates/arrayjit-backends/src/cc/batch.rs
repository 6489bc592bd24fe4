//! What the `cc` backend loads: a compiled library's kernels ([`CcBatch`]) and their launches
//! on the caller's thread (C kernels with the device's worker pool, emulated CUDA as fibers,
//! hand-written emulated CUDA with a launch chosen at call time).

use std::fmt;
use std::sync::Arc;

use arrayjit_codegen::KernelInterface;
use arrayjit_ir::{Error, Result};

use super::library;
use crate::compiled_batch::{CompiledBatch, LaunchAt, LaunchRequest};
use crate::cpu::buffer::CpuBuffer;
use crate::cpu::with_host_locks;
use crate::cpu::worker_pool::{ParallelHandle, WorkerPool};
use crate::device_buffer::BufferHandle;

/// The signature of every generated C kernel.
pub(super) type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, *const ParallelHandle);

/// The signature of every emulated CUDA routine: 0, -1 when the memory for its threads' stacks
/// could not be had, or -2 when the emulation saw a pipeline's race (see `cuda_emulation.hpp`).
pub(super) type EmulatedFn = unsafe extern "C" fn(*const *mut u8, *const i64) -> i32;

/// The entry point of a hand-written emulated kernel that takes its launch at call time (grid,
/// then block: six dimensions); returns as [`EmulatedFn`].
pub(super) type EmulatedDimsFn =
    unsafe extern "C" fn(*const *mut u8, *const i64, *const u32) -> i32;

/// A loaded kernel.
#[derive(Clone, Copy)]
pub(super) enum Entry {
    C(KernelFn),
    Emulated(EmulatedFn),
}

/// A compiled library and its kernels.
pub struct CcBatch {
    /// The backend's name, in errors.
    pub(super) backend: &'static str,
    pub(super) kernels: Vec<KernelInterface>,
    pub(super) source: String,
    pub(super) entries: Vec<Entry>,
    /// Per kernel: its entry point taking the launch at call time (hand-written emulated CUDA).
    pub(super) dims_entries: Vec<Option<EmulatedDimsFn>>,
    pub(super) cache_hit: bool,
    /// The worker pool of each device; a launch uses its buffers' device's.
    pub(super) workers: Arc<Vec<WorkerPool>>,
    pub(super) _library: Arc<library::LoadedLibrary>,
    /// The libraries whose statement functions this one calls (kept loaded while it lives).
    pub(super) _providers: Vec<Arc<library::LoadedLibrary>>,
}

impl fmt::Debug for CcBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.kernels.iter().map(|k| k.symbol.as_str()).collect();
        write!(f, "CcBatch({names:?})")
    }
}

impl CompiledBatch for CcBatch {
    fn kernels(&self) -> &[KernelInterface] {
        &self.kernels
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn cache_hit(&self) -> Option<bool> {
        Some(self.cache_hit)
    }

    fn statement_times(&self, kernel: usize) -> Option<Vec<(u64, u64)>> {
        type Reader = unsafe extern "C" fn(*mut u64, i64) -> i64;
        let symbol = format!("{}_statement_times", self.kernels.get(kernel)?.symbol);
        // SAFETY: the renderer exports `{symbol}_statement_times` with this signature from
        // kernels that time their statements (see `arrayjit_codegen`'s C renderer); other
        // kernels have no such symbol and the lookup fails.
        let read: Reader = unsafe { self._library.entry(&symbol) }.ok()?;
        // SAFETY: a null pointer asks only for the count.
        let n = unsafe { read(std::ptr::null_mut(), 0) };
        let mut counters = vec![0u64; usize::try_from(n).ok()?];
        // SAFETY: `counters` holds the `n` counters the reader copies.
        unsafe { read(counters.as_mut_ptr(), n) };
        Some(counters.chunks_exact(2).map(|c| (c[0], c[1])).collect())
    }

    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        // A CPU launch finishes before it returns: the caller times it (the sink is dropped).
        let LaunchRequest {
            kernel,
            buffers,
            statics,
            dims,
            ..
        } = request;
        match dims {
            // SAFETY: this method's contract.
            None => unsafe { self.run_kernel(kernel, buffers, statics, None) }?,
            // SAFETY: this method's contract.
            Some(at) => unsafe { self.launch_given(kernel, buffers, statics, at) }?,
        }
        Ok(false)
    }
}

impl CcBatch {
    /// A hand-written emulated CUDA kernel with its launch chosen now (see
    /// [`CompiledBatch::launch`]).
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn launch_given(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        at: LaunchAt,
    ) -> Result<()> {
        use arrayjit_codegen::LaunchDims;
        use arrayjit_codegen::cuda_emulation as emu;
        let LaunchAt { global, local } = at;
        let name = self.kernels.get(index).map_or("?", |k| k.name.as_str());
        let Some(entry) = self.dims_entries.get(index).copied().flatten() else {
            return Err(Error::Unsupported {
                backend: self.backend.into(),
                what: format!("launch dimensions at launch time for kernel {name}"),
                instead: "give them only to hand-written CUDA on cuda_emu (compile_source); cc \
                          runs C kernels once per call"
                    .into(),
            });
        };
        let block = local
            .unwrap_or_else(|| LaunchDims::default_block(global, 256, emu::EMULATED_MAX_THREADS));
        let dims = LaunchDims::covering(global, block)?;
        dims.check_within(
            name,
            emu::EMULATED_MAX_BLOCK,
            u64::from(emu::EMULATED_MAX_THREADS),
        )?;
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: this method's contract; the launch is within the emulation's limits.
        unsafe {
            self.run_kernel(
                index,
                args,
                statics,
                Some((entry, [gx, gy, gz, bx, by, bz])),
            )
        }
    }

    /// Checks a launch and runs kernel `index` on the caller's thread: through its own entry
    /// point, or through `with_dims`' entry point with that launch (grid, then block).
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn run_kernel(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        with_dims: Option<(EmulatedDimsFn, [u32; 6])>,
    ) -> Result<()> {
        let k = self
            .kernels
            .get(index)
            .ok_or_else(|| crate::launch_check::no_such_kernel(index, self.kernels.len()))?;
        let buffers =
            crate::launch_check::check_launch::<CpuBuffer>(k, args, statics, self.backend)?;
        let device = args.first().map_or(0, |b| b.device());
        let mut ptrs: Vec<*mut u8> = buffers.iter().map(|b| b.as_ptr()).collect();
        ptrs.push(std::ptr::null_mut());
        // SAFETY: the kernel was generated for exactly these arguments: the buffers are large
        // enough for every access (checked above, and the optimizer verified every index against
        // the node dims and static ranges), the static values are in range, and the runtime
        // serializes kernels and transfers on the buffers of a stream.
        // The worker pool outlives the call (held by this batch); its chunks finish before
        // the kernel returns.
        let par = self
            .workers
            .get(device)
            .map_or(std::ptr::null(), WorkerPool::handle);
        // Fresh memory gets its pages before the kernel reads it (see `populate_once`).
        for b in &buffers {
            b.populate_once();
        }
        // Host arrays used in place are read under their nodes' host locks while the kernel
        // runs, so the host cannot change them meanwhile.
        let status = with_host_locks(&buffers, || match (with_dims, self.entries[index]) {
            (Some((f, dims)), _) => {
                // SAFETY: (this call and the two below) the entry points take the kernel's
                // buffer and static arrays, checked against its interface above
                // (`check_launch`), which outlive the call; `dims` holds the launch's six
                // dimensions.
                unsafe { f(ptrs.as_ptr(), statics.as_ptr(), dims.as_ptr()) }
            }
            (None, Entry::C(f)) => {
                // SAFETY: as above; `par` is the device's worker pool or null (run inline).
                unsafe { f(ptrs.as_ptr(), statics.as_ptr(), par) };
                0
            }
            // SAFETY: as above.
            (None, Entry::Emulated(f)) => unsafe { f(ptrs.as_ptr(), statics.as_ptr()) },
        });
        // Only emulated routines report a status: -1 when their threads' stacks were not had,
        // -2 when the emulation saw a race of a pipeline, -3 when a thread waited on an
        // mbarrier whose phase could never complete (kernels' defects, not the user's).
        let detail = match status {
            0 => return Ok(()),
            -3 => format!(
                "an emulated kernel of {} waited on an mbarrier whose phase never completes \
                 (armed with more bytes than its tensor copies bring, or never armed; a GPU \
                 would hang): a defect of the CUDA renderer; please report it",
                k.name
            ),
            -2 => format!(
                "the emulated kernels of {} copied into shared memory that a warpgroup product \
                 still in flight reads (a pipeline that refills a buffer before waiting for its \
                 products): a defect of the CUDA renderer; please report it",
                k.name
            ),
            _ => format!(
                "no memory for the stacks of the emulated threads of {}; free memory or use a \
                 smaller routine",
                k.name
            ),
        };
        Err(Error::Runtime {
            stream: format!("{} device {device}", self.backend),
            detail,
        })
    }
}

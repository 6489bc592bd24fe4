//! The worker pool of a CPU device: the cores a device owns, shared by every stream of the
//! device, and the C-callable `parallel_for` that generated kernels use to split a loop into
//! chunks. The caller of `parallel_for` runs chunks too and returns when all are done, so a
//! kernel never waits on a pool busy with other streams' work (no deadlock, no more threads
//! than the pool's plus the callers'). Which chunk computes what is fixed by the kernel, so
//! results do not depend on which thread runs a chunk or on the number of workers.
//!
//! Waiting: a training step runs hundreds of parallel loops back to back, each a few tens of
//! microseconds, and putting a thread to sleep and waking it again costs about as much (a
//! futex call on each side, more in a virtual machine). So an idle worker, and a caller
//! waiting for its chunks, first spin for [`SPIN`] watching an atomic counter, and only then
//! sleep on a condition variable; a new job wakes sleepers only if there are any.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker, or a caller waiting for the last chunks of its job, spins before
/// it sleeps: longer than the serial code between two parallel loops of a step usually runs.
pub const SPIN: Duration = Duration::from_micros(200);

/// Spins until `ready()` holds or [`SPIN`] has passed; returns whether it holds.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return ready();
        }
    }
}

/// A chunk function of generated code: runs chunk `index` of the job whose context is `ctx`.
pub type ChunkFn = unsafe extern "C" fn(ctx: *mut c_void, index: i64);

/// The entry point generated code calls: runs `f(ctx, 0..chunks)` over the pool `pool`.
pub type ParallelFn =
    unsafe extern "C" fn(pool: *const c_void, f: ChunkFn, ctx: *mut c_void, chunks: i64);

/// What a kernel receives (its third argument): the pool, its entry point and how many threads
/// may work at once. Layout shared with the C `aj_par` struct.
#[repr(C)]
#[derive(Debug)]
pub struct ParallelHandle {
    /// The pool (opaque to C).
    pub pool: *const c_void,
    /// `parallel_for`.
    pub run: ParallelFn,
    /// Threads that may run chunks at once (workers + the caller).
    pub workers: i64,
}

// SAFETY: the handle's pointer is the pool's shared state (itself `Send + Sync`), only read;
// the handle is immutable after the pool is built.
unsafe impl Send for ParallelHandle {}
// SAFETY: as above.
unsafe impl Sync for ParallelHandle {}

struct Job {
    f: ChunkFn,
    ctx: *mut c_void,
    chunks: i64,
    next: AtomicI64,
    /// Chunks finished.
    done: AtomicI64,
    /// Guards the sleep of a caller waiting for the last chunks (see [`Job::wait`]).
    sleep: Mutex<()>,
    finished: Condvar,
}

// SAFETY: `ctx` points at the caller's data, which the caller keeps alive (and does not touch)
// until every chunk is done; chunks are independent by the kernel's construction.
unsafe impl Send for Job {}
// SAFETY: as above; the atomics and the mutex synchronize the rest.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs chunks until none are left.
    fn work(&self) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.chunks {
                return;
            }
            // SAFETY: the generated chunk function with the context it was given for.
            unsafe { (self.f)(self.ctx, index) };
            // Release: the chunk's writes happen before the caller sees the count.
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks {
                // Under the lock, so a caller between its check and its sleep cannot miss it.
                let _guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                self.finished.notify_all();
            }
        }
    }

    /// Returns when every chunk is done: spinning first, then sleeping.
    fn wait(&self) {
        let all_done = || self.done.load(Ordering::Acquire) >= self.chunks;
        if spin_until(all_done) {
            return;
        }
        let mut guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        while !all_done() {
            guard = self.finished.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Arc<Job>>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Jobs posted so far: what a spinning worker watches.
    posted: AtomicU64,
    /// Workers asleep on `wake` (counted under the queue's lock).
    sleepers: AtomicUsize,
}

/// A device's worker threads.
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    handle: Box<ParallelHandle>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerPool({} threads)", self.handle.workers)
    }
}

impl WorkerPool {
    /// A pool where `workers` threads run chunks at once: `workers - 1` threads of its own plus
    /// the caller. One worker means no threads: everything runs in the caller.
    pub fn new(workers: usize, name: &str) -> std::io::Result<WorkerPool> {
        let workers = workers.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            posted: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
        });
        let mut threads = Vec::new();
        for k in 1..workers {
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name} worker {k}"))
                    .spawn(move || worker(&shared))?,
            );
        }
        let mut pool = WorkerPool {
            shared,
            threads,
            handle: Box::new(ParallelHandle {
                pool: std::ptr::null(),
                run: parallel_for,
                workers: workers as i64,
            }),
        };
        pool.handle.pool = (&*pool.shared as *const Shared).cast();
        Ok(pool)
    }

    /// Threads that run chunks at once.
    pub fn workers(&self) -> usize {
        self.handle.workers as usize
    }

    /// The handle passed to kernels; valid while the pool lives.
    pub fn handle(&self) -> *const ParallelHandle {
        &*self.handle
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.shutdown {
                    return;
                }
                // A job stays queued while it has unclaimed chunks, so every idle worker joins.
                while let Some(front) = q.jobs.front() {
                    if front.next.load(Ordering::Relaxed) >= front.chunks {
                        q.jobs.pop_front();
                    } else {
                        break;
                    }
                }
                if let Some(job) = q.jobs.front() {
                    break job.clone();
                }
                // Nothing queued: spin (without the lock) for a new job, then sleep.
                let seen = shared.posted.load(Ordering::Acquire);
                drop(q);
                let posted = spin_until(|| shared.posted.load(Ordering::Acquire) != seen);
                q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                if posted || !q.jobs.is_empty() || q.shutdown {
                    continue;
                }
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        };
        job.work();
    }
}

/// Runs `f(ctx, i)` for every `i` in `0..chunks` on the pool and the calling thread; returns
/// when all are done.
///
/// # Safety
/// `pool` is null or the `pool` of a live [`ParallelHandle`]; `f` may be called concurrently
/// from several threads with distinct indices; `ctx` stays valid until this returns.
unsafe extern "C" fn parallel_for(pool: *const c_void, f: ChunkFn, ctx: *mut c_void, chunks: i64) {
    if chunks <= 0 {
        return;
    }
    // SAFETY: per the contract, null or a live pool's shared state.
    let shared = unsafe { pool.cast::<Shared>().as_ref() };
    let Some(shared) = shared.filter(|_| chunks > 1) else {
        for i in 0..chunks {
            // SAFETY: the caller's chunk function and context.
            unsafe { f(ctx, i) };
        }
        return;
    };
    let job = Arc::new(Job {
        f,
        ctx,
        chunks,
        next: AtomicI64::new(0),
        done: AtomicI64::new(0),
        sleep: Mutex::new(()),
        finished: Condvar::new(),
    });
    shared
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .jobs
        .push_back(job.clone());
    shared.posted.fetch_add(1, Ordering::AcqRel);
    // A worker counts itself asleep under the queue's lock after finding it empty, so one
    // that missed this job is counted by now (the push above took the same lock after it).
    if shared.sleepers.load(Ordering::SeqCst) > 0 {
        shared.wake.notify_all();
    }
    job.work();
    job.wait();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    unsafe extern "C" fn count(ctx: *mut c_void, index: i64) {
        // SAFETY: the test passes a live array of counters, one per chunk.
        let counters = unsafe { &*(ctx as *const Vec<AtomicUsize>) };
        counters[index as usize].fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn every_chunk_runs_once_with_any_pool_and_concurrent_callers() {
        for workers in [1, 2, 4] {
            let pool = WorkerPool::new(workers, "test").unwrap();
            let handle = pool.handle() as usize;
            let callers: Vec<_> = (0..3)
                .map(|_| {
                    std::thread::spawn(move || {
                        let counters: Vec<AtomicUsize> =
                            (0..97).map(|_| AtomicUsize::new(0)).collect();
                        // SAFETY: the pool outlives the callers (joined below); the context
                        // lives until the call returns.
                        unsafe {
                            let h = &*(handle as *const ParallelHandle);
                            (h.run)(h.pool, count, &counters as *const _ as *mut c_void, 97);
                        }
                        counters.iter().all(|c| c.load(Ordering::SeqCst) == 1)
                    })
                })
                .collect();
            for c in callers {
                assert!(c.join().unwrap(), "{workers} workers");
            }
            assert_eq!(pool.workers(), workers);
        }
    }
}

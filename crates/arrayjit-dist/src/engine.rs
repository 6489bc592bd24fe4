//! The engines behind a process group: one process, or MPI (cargo feature `mpi`). An engine
//! reduces and broadcasts typed elements in place; [`crate::group::ProcessGroup`] handles precisions
//! MPI lacks and the stream work.

use arrayjit_ir::{Prec, Result};

/// What moves data between the processes of a job.
pub(crate) trait Engine: Send + Sync {
    /// `mpi` or `single process`.
    fn name(&self) -> &str;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums `bytes` (elements of `prec`, native-endian) over every rank, in place. f16 and bf16,
    /// which MPI lacks, are the group's to widen first.
    fn all_reduce_sum(&self, bytes: &mut [u8], prec: Prec) -> Result<()>;
    /// Replaces `bytes` with rank `root`'s.
    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// Sets how long a collective may wait for the other ranks (engines whose collectives can
    /// wait at all).
    fn set_timeout(&self, _timeout: std::time::Duration) {}
}

/// A job of one process: every collective is the identity.
pub(crate) struct Single;

impl Engine for Single {
    fn name(&self) -> &str {
        "single process"
    }
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [u8], _: Prec) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: &mut [u8], _: usize) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(feature = "mpi")]
pub(crate) mod mpi_engine {
    //! MPI through the `mpi` crate: initialized once per process with
    //! `MPI_THREAD_SERIALIZED`, every call under one lock, finalized at exit.

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Condvar, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use arrayjit_ir::{Error, Result};
    use mpi::collective::SystemOperation;
    use mpi::datatype::Equivalence;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    use arrayjit_ir::Prec;

    use super::Engine;

    /// What the lock guards: the universe (finalized at exit) and the buffers collectives
    /// reuse (the send side of an all-reduce, and an aligned receive side for unaligned bytes),
    /// so that a collective allocates nothing once they have grown.
    struct State {
        universe: Option<mpi::environment::Universe>,
        send: Vec<u64>,
        recv: Vec<u64>,
    }

    /// The MPI state of the process and the lock serializing calls.
    static UNIVERSE: OnceLock<std::result::Result<Mutex<State>, String>> = OnceLock::new();

    extern "C" fn finalize_at_exit() {
        if let Some(Ok(u)) = UNIVERSE.get() {
            // Dropping the universe calls MPI_Finalize (mpirun reports a rank that exits
            // without it as failed).
            let taken = u.lock().unwrap_or_else(|e| e.into_inner()).universe.take();
            drop(taken);
        }
    }

    pub(crate) struct Mpi {
        rank: usize,
        size: usize,
    }

    /// How long a collective may block before the watchdog aborts the job, in milliseconds.
    static TIMEOUT_MS: AtomicU64 = AtomicU64::new(300_000);

    /// The collective in progress, if any: when it must end and what it is.
    static DEADLINE: Mutex<Option<(Instant, String)>> = Mutex::new(None);
    static DEADLINE_CHANGED: Condvar = Condvar::new();

    /// Starts the watchdog thread (once): when a collective is still blocked at its deadline
    /// (another rank died, failed, or stopped calling collectives), it says so on stderr and
    /// aborts the job with `MPI_Abort`, so that no rank hangs. A blocked MPI call cannot be
    /// cancelled, so the rank cannot return an error instead; the abort ends every rank and
    /// `mpirun` reports the failure.
    fn start_watchdog(rank: usize, size: usize) {
        let spawned = std::thread::Builder::new()
            .name("arrayjit-mpi-watchdog".into())
            .spawn(move || {
                let mut current = DEADLINE.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    match current.clone() {
                        None => {
                            current = DEADLINE_CHANGED
                                .wait(current)
                                .unwrap_or_else(|e| e.into_inner());
                        }
                        Some((deadline, what)) => {
                            let now = Instant::now();
                            if now < deadline {
                                current = DEADLINE_CHANGED
                                    .wait_timeout(current, deadline - now)
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                                continue;
                            }
                            eprintln!(
                                "arrayjit: rank {rank} of {size}: {what} did not complete within \
                                 {:.0} s: another rank failed, died or stopped calling \
                                 collectives; aborting the job (ARRAYJIT_DIST_TIMEOUT_SECS or \
                                 ProcessGroup::set_timeout sets the limit)",
                                TIMEOUT_MS.load(Ordering::Relaxed) as f64 / 1e3
                            );
                            SimpleCommunicator::world().abort(2);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            crate::engine::warn_no_watchdog(&e.to_string());
        }
    }

    /// Runs one blocking collective under the watchdog's deadline.
    fn watched<T>(what: &str, f: impl FnOnce() -> T) -> T {
        let limit = Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed));
        *DEADLINE.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now() + limit, what.to_string()));
        DEADLINE_CHANGED.notify_all();
        let value = f();
        *DEADLINE.lock().unwrap_or_else(|e| e.into_inner()) = None;
        DEADLINE_CHANGED.notify_all();
        value
    }

    fn lock() -> Result<std::sync::MutexGuard<'static, State>> {
        let guard = match UNIVERSE.get() {
            Some(Ok(u)) => u.lock().unwrap_or_else(|e| e.into_inner()),
            Some(Err(e)) => return Err(Error::invalid(e.clone())),
            None => return Err(Error::invalid("MPI is not initialized")),
        };
        if guard.universe.is_none() {
            return Err(Error::invalid("MPI was already finalized in this process"));
        }
        Ok(guard)
    }

    impl Mpi {
        /// Initializes MPI once per process (later calls reuse it).
        pub(crate) fn init() -> Result<Mpi> {
            let state = UNIVERSE.get_or_init(|| {
                match mpi::initialize_with_threading(mpi::Threading::Serialized) {
                    Some((universe, level)) if level >= mpi::Threading::Serialized => {
                        // SAFETY: `finalize_at_exit` is an `extern "C" fn()` that does not
                        // unwind.
                        unsafe { libc::atexit(finalize_at_exit) };
                        Ok(Mutex::new(State {
                            universe: Some(universe),
                            send: Vec::new(),
                            recv: Vec::new(),
                        }))
                    }
                    Some((_, level)) => Err(format!(
                        "the MPI library gives thread level {level:?}; arrayjit needs \
                         Serialized (build OpenMPI or MPICH with thread support)"
                    )),
                    None => Err("MPI was initialized by someone else".into()),
                }
            });
            if let Err(e) = state {
                return Err(Error::invalid(e.clone()));
            }
            let secs = arrayjit_backends::settings::integer(
                &arrayjit_backends::settings::process_env,
                "ARRAYJIT_DIST_TIMEOUT_SECS",
                1..=604_800,
                300,
            )?;
            let _held = lock()?;
            let world = SimpleCommunicator::world();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            static WATCHDOG: OnceLock<()> = OnceLock::new();
            WATCHDOG.get_or_init(|| {
                TIMEOUT_MS.store(secs * 1000, Ordering::Relaxed);
                start_watchdog(rank, size);
            });
            Ok(Mpi { rank, size })
        }
    }

    /// Grows `buffer` to hold at least `bytes` bytes and returns them (8-byte aligned).
    fn scratch(buffer: &mut Vec<u64>, bytes: usize) -> &mut [u8] {
        let words = bytes.div_ceil(8);
        if buffer.len() < words {
            buffer.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut::<u64, u8>(buffer)[..bytes]
    }

    /// Sums the elements of `T` that `bytes` hold over every rank: MPI_Allreduce from a copy
    /// of the input (in a reused buffer) into the bytes themselves, or through a reused aligned
    /// buffer when they are not aligned for `T`.
    fn sum_into<T: Equivalence + bytemuck::Pod>(
        world: &SimpleCommunicator,
        state: &mut State,
        bytes: &mut [u8],
    ) -> Result<()> {
        let send = scratch(&mut state.send, bytes.len());
        send.copy_from_slice(bytes);
        let send: &[T] = bytemuck::cast_slice(send);
        match bytemuck::try_cast_slice_mut::<u8, T>(bytes) {
            Ok(values) => world.all_reduce_into(send, values, SystemOperation::sum()),
            Err(_) => {
                let recv = scratch(&mut state.recv, bytes.len());
                world.all_reduce_into(
                    send,
                    bytemuck::cast_slice_mut::<u8, T>(recv),
                    SystemOperation::sum(),
                );
                bytes.copy_from_slice(recv);
            }
        }
        Ok(())
    }

    impl Engine for Mpi {
        fn name(&self) -> &str {
            "mpi"
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn all_reduce_sum(&self, bytes: &mut [u8], prec: Prec) -> Result<()> {
            let mut held = lock()?;
            let state = &mut *held;
            let world = SimpleCommunicator::world();
            watched("an all-reduce", || match prec {
                Prec::U8 => sum_into::<u8>(&world, state, bytes),
                Prec::U16 => sum_into::<u16>(&world, state, bytes),
                Prec::I32 => sum_into::<i32>(&world, state, bytes),
                Prec::U32 => sum_into::<u32>(&world, state, bytes),
                Prec::I64 => sum_into::<i64>(&world, state, bytes),
                Prec::U64 => sum_into::<u64>(&world, state, bytes),
                Prec::F32 => sum_into::<f32>(&world, state, bytes),
                Prec::F64 => sum_into::<f64>(&world, state, bytes),
                Prec::F16 | Prec::Bf16 => Err(Error::Unsupported {
                    backend: "MPI".into(),
                    what: format!("sums of {} values (it has no such type)", prec.name()),
                    instead: "widen them to f32 first".into(),
                }),
            })
        }
        fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
            let _held = lock()?;
            let world = SimpleCommunicator::world();
            watched("a broadcast", || {
                world.process_at_rank(root as i32).broadcast_into(bytes)
            });
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            let _held = lock()?;
            watched("a barrier", || SimpleCommunicator::world().barrier());
            Ok(())
        }
        fn set_timeout(&self, timeout: Duration) {
            TIMEOUT_MS.store(
                timeout.as_millis().clamp(1, u64::MAX as u128) as u64,
                Ordering::Relaxed,
            );
        }
    }
}

/// Says that collectives run without a timeout (the watchdog thread could not start).
#[cfg(feature = "mpi")]
fn warn_no_watchdog(why: &str) {
    arrayjit_backends::notice::warn_user(&format!(
        "MPI collectives run without a timeout: the watchdog thread did not start ({why})"
    ));
}

//! The engines behind a process group: one process, or MPI (cargo feature `mpi`). An engine
//! reduces and broadcasts typed elements in place; [`crate::ProcessGroup`] handles precisions
//! MPI lacks and the stream work.

use arrayjit_ir::Result;

/// Elements an engine reduces natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Native {
    U8,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

/// What moves data between the processes of a job.
pub(crate) trait Engine: Send + Sync {
    /// `mpi` or `single process`.
    fn name(&self) -> &str;
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums `bytes` (elements of `native`, native-endian) over every rank, in place.
    fn all_reduce_sum(&self, bytes: &mut [u8], native: Native) -> Result<()>;
    /// Replaces `bytes` with rank `root`'s.
    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()>;
    fn barrier(&self) -> Result<()>;
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
    fn all_reduce_sum(&self, _: &mut [u8], _: Native) -> Result<()> {
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

    use std::sync::{Mutex, OnceLock};

    use arrayjit_ir::{Error, Result};
    use mpi::collective::SystemOperation;
    use mpi::datatype::Equivalence;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    use super::{Engine, Native};

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
            let _held = lock()?;
            let world = SimpleCommunicator::world();
            Ok(Mpi {
                rank: world.rank() as usize,
                size: world.size() as usize,
            })
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
    ) {
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
        fn all_reduce_sum(&self, bytes: &mut [u8], native: Native) -> Result<()> {
            let mut held = lock()?;
            let state = &mut *held;
            let world = SimpleCommunicator::world();
            match native {
                Native::U8 => sum_into::<u8>(&world, state, bytes),
                Native::U16 => sum_into::<u16>(&world, state, bytes),
                Native::I32 => sum_into::<i32>(&world, state, bytes),
                Native::U32 => sum_into::<u32>(&world, state, bytes),
                Native::I64 => sum_into::<i64>(&world, state, bytes),
                Native::U64 => sum_into::<u64>(&world, state, bytes),
                Native::F32 => sum_into::<f32>(&world, state, bytes),
                Native::F64 => sum_into::<f64>(&world, state, bytes),
            }
            Ok(())
        }
        fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
            let _held = lock()?;
            let world = SimpleCommunicator::world();
            world.process_at_rank(root as i32).broadcast_into(bytes);
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            let _held = lock()?;
            SimpleCommunicator::world().barrier();
            Ok(())
        }
    }
}

//! arrayjit-dist: data-parallel work across processes. A [`ProcessGroup`] is this process's
//! place among the processes of one job — its rank and the world size — with the collectives
//! training needs: all-reduce (sum, mean), broadcast and barrier, on host bytes of any
//! precision ([`ProcessGroup::all_reduce`]) or on a context's array as stream work
//! ([`ProcessGroup::all_reduce_array`]).
//!
//! - **Engines**: MPI (cargo feature `mpi`, through the `mpi` crate: OpenMPI or MPICH) when the
//!   process was launched by `mpirun`/`mpiexec`; a single process otherwise. Launched by
//!   `mpirun` in a build without the feature, [`ProcessGroup::from_env`] is a typed error saying
//!   how to enable it, never a silent single-process run that would train on part of the data.
//! - **Precisions**: f32, f64 and the integer types reduce natively; f16 and bf16 (which MPI
//!   lacks) are widened to f32, reduced, and rounded back once, so every rank gets the same bits.
//! - **Stream work**: a collective on an array is a task of a communication stream of your
//!   choice, ordered by events like any other work: it waits for the array's last writer, and
//!   later work reading the array waits for it. Gradients of a finished layer can be reduced on
//!   the communication stream while the compute stream goes on.
//! - **Threads**: MPI runs with `MPI_THREAD_SERIALIZED` and every call holds one lock, so any
//!   thread (a stream's worker) may issue collectives; ranks must issue them in the same order.

#![warn(missing_docs)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod engine;
mod group;
pub mod testing;

pub use group::{LaunchKind, ProcessGroup, ReduceOp};

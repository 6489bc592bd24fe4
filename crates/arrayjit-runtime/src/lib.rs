//! arrayjit-runtime: the fourth layer of arrayjit, the user-facing backend API.
//!
//! Backends are chosen by name ([`backend`], or [`default_backend`] which reads
//! `ARRAYJIT_BACKEND`); a backend has devices, a device has streams, and a stream runs routines
//! linked into contexts. Contexts form a tree: linking code into a context returns a routine
//! whose context is a child holding every array the code needs. The `Sync` scheduler runs work
//! in the caller, so its events are always done; the `Multicore` scheduler gives every stream a
//! worker thread, and events order work across streams.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod array_entry;
mod backend;
mod code;
mod compile_request;
mod config;
mod context;
pub mod cpu_tune;
pub mod data_parallel;
mod device;
mod device_transfer;
mod host_sync;
mod link;
pub mod node_sync;
pub mod observe;
pub mod registry;
mod routine;
pub mod scheduler;
pub mod search;
pub mod statement_profile;
mod stream;
mod task;
mod task_queue;

pub use backend::{
    Backend, KNOWN_BACKENDS, available_backends, backend, backend_with_config, default_backend,
    initialize, initialize_with_config, is_initialized,
};
pub use code::Code;
pub use compile_request::CompileRequest;
pub use config::{
    DEFAULT_MAX_POOL_BYTES, MAX_POOL_BYTES_RANGE, MAX_POOL_ENV, MEMORY_LIMIT_ENV,
    QUEUE_CAPACITY_RANGE, RuntimeConfig, Strategy,
};
pub use context::{ArrayAccess, ChildMergeNode, Context, ScheduledArray};
pub use cpu_tune::{TuneCandidate, TuneReport, TuneSettings};
pub use data_parallel::DataParallel;
pub use device::Device;
pub use device_transfer::MergeBufferUse;
pub use link::PreparedLink;
pub use node_sync::{NodeSync, node_sync};
pub use observe::{
    RoutineMemory, RunStats, debug_level, set_debug_level, set_run_timing, start_trace, stop_trace,
};
pub use routine::Routine;
pub use scheduler::{Event, SchedulerKind};
pub use search::{ScheduleChoice, SearchReport, SearchSettings};
pub use statement_profile::{StatementProfile, StatementTime};
pub use stream::Stream;

#[cfg(test)]
mod tests;

//! arrayjit-backends: the third layer of arrayjit. A lowered backend turns optimized routines
//! into runnable code for its devices and owns its buffers: [`cc`] composes the CPU backends
//! (C compiled by the system compiler, or emulated CUDA as C++, run on the CPU);
//! `cuda_backend` (cargo feature `cuda`) renders CUDA C and runs it through NVRTC and the
//! driver API; `wgpu_backend` (cargo feature `wgpu`) renders WGSL and runs it on a GPU through
//! wgpu; [`missing`] stands in for a backend that was not built or cannot run here and answers
//! every call with a typed error.
//!
//! # The seam
//!
//! Everything above this layer (contexts, routines, host synchronization, merge buffers, pools,
//! data parallelism) is written once, against a [`LoweredBackend`]: a name and four parts
//! ([`BackendParts`], the reference's `Device_info`, `Renderer`, `Compiler` and `Runtime`), each
//! an object of its own behind a trait in the file named after it:
//!
//! - [`Devices`] (`devices.rs`): whether the backend can run here and what each device is and
//!   can do ([`DeviceInfo`], from which schedules are chosen).
//! - [`Renderer`] (`renderer.rs`): optimized routines, or source given directly, to a
//!   [`RenderedProgram`] (its source and the program its compiler takes), and the GPU dialect
//!   whose device strings it prints.
//! - [`Compiler`] (`compiler.rs`): a [`RenderedProgram`] to a [`CompiledBatch`] with
//!   [`CompileOptions`] (it never renders); launches go through one [`LaunchRequest`].
//! - [`DeviceRuntime`] (`device_runtime.rs`): buffers ([`DeviceBuffer`]) and pools (bookkept
//!   by one [`PoolTable`]), copies between the host and devices and between buffers, queues and
//!   `synchronize`. Every CPU backend shares [`cpu::CpuRuntime`].
//! - [`KernelInterface`](arrayjit_codegen::KernelInterface) (from `arrayjit-codegen`): the one
//!   statement of how a kernel is called — its buffers in order (arrays, merge buffer, scratch)
//!   and its static indices. The renderer produces it, the runtime gathers buffers in its
//!   order, and [`check_launch`] checks every launch against it, whichever backend runs it.
//! - The runtime's registry (`arrayjit_runtime::registry`) names each backend, composes it from
//!   its parts and pairs it with a scheduler: CPU backends get streams and events from the
//!   `Sync` or `Multicore` scheduler; the GPU backends' queues run work in submission order
//!   under the `Sync` scheduler (host reads wait for the queue).
//!
//! A new backend is its four parts (and its [`DeviceBuffer`] and [`CompiledBatch`]) plus one
//! registry row; `docs/adding-a-backend.md` walks through them with a worked example, and the
//! shared conformance corpus checks the result against the interpreter.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod array_buffer;
pub mod built;
pub mod cc;
pub mod compile_cache;
pub mod compiled_batch;
pub mod compiler;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_backend;
pub mod device_buffer;
pub mod device_info;
pub mod device_runtime;
pub mod devices;
pub mod launch_check;
pub mod lowered_backend;
pub mod missing;
pub mod notice;
pub mod pool_table;
pub mod queue;
pub mod renderer;
pub mod settings;
#[cfg(feature = "wgpu")]
pub mod wgpu_backend;

pub use array_buffer::ArrayBuffer;
pub use compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
pub use compiler::{CompileOptions, CompileStats, Compiler};
pub use cpu::buffer::{CpuBuffer, MemoryCounter};
pub use device_buffer::{BufferHandle, DeviceBuffer};
pub use device_info::{DeviceInfo, DeviceKind};
pub use device_runtime::{
    DeviceRuntime, byte_range_end, patch_whole_buffer, read_through_whole_buffer,
};
pub use devices::Devices;
pub use launch_check::{check_launch, launch_dims_not_taken, no_such_kernel};
pub use lowered_backend::{BackendParts, DATA_PLANE_CONTRACT, LoweredBackend, batch_name};
pub use pool_table::{PoolMemory, PoolTable, Pools};
pub use queue::{DeviceQueue, Queue, QueueMarker};
pub use renderer::{RenderedProgram, Renderer};

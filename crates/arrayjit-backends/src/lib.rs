//! arrayjit-backends: the third layer of arrayjit. A lowered backend turns optimized routines
//! into runnable code for its devices and owns its buffers: [`cc::CpuBackend`] renders C (the
//! `cc` backend) or emulated CUDA (`cuda_emu`), compiles it with the system compiler and runs it
//! on the CPU; `cuda_backend::CudaBackend` (cargo feature `cuda`) renders CUDA C and runs it
//! through NVRTC and the driver API; `wgpu_backend::WgpuBackend` (cargo feature `wgpu`) renders
//! WGSL and runs it on a GPU through wgpu; [`missing::MissingBackend`] stands in for a backend
//! that was not built or cannot run here and answers every call with a typed error.
//!
//! # The seam
//!
//! Everything above this layer (contexts, routines, host synchronization, merge buffers, pools,
//! data parallelism) is written once, against the parts of a backend (the reference's
//! `Device_info`, `Renderer`, `Compiler` and `Runtime`):
//!
//! - Device info: [`LoweredBackend::device_info`] says what each device is and can do
//!   ([`DeviceInfo`], from which schedules are chosen), and [`LoweredBackend::gpu_dialect`]
//!   the device strings a GPU renderer prints.
//! - Renderer and compiler: [`LoweredBackend::render_source`] and
//!   [`LoweredBackend::compile_batch`] turn optimized routines into a [`CompiledBatch`], with
//!   [`CompileOptions`]; `check_available` says what to install when the backend cannot run
//!   here. The CPU backends take these from [`cc::CpuKernels`] (C, or emulated CUDA as C++).
//! - Runtime: [`LoweredBackend::runtime`] is the backend's [`DeviceRuntime`] — buffers and
//!   pools (bookkept by one [`PoolTable`]), copies between the host and devices and between
//!   buffers, queues and `synchronize`. Every CPU backend shares [`cpu::CpuRuntime`].
//! - [`KernelInterface`](arrayjit_codegen::KernelInterface) (from `arrayjit-codegen`): the one statement of how a kernel is
//!   called — its buffers in order (arrays, merge buffer, scratch) and its static indices.
//!   The renderer produces it, the runtime gathers buffers in its order, and [`check_launch`]
//!   checks every launch against it, whichever backend runs it.
//! - The runtime's registry (`arrayjit_runtime::registry`) names each backend and pairs its
//!   lowered backend with a scheduler: CPU backends get streams and events from the `Sync` or
//!   `Multicore` scheduler; the wgpu backend's queue runs work in submission order under the
//!   `Sync` scheduler (host reads wait for the queue).
//!
//! A new backend is an implementation of [`LoweredBackend`] and [`DeviceRuntime`] (and its
//! [`DeviceBuffer`] and [`CompiledBatch`]) plus one registry row; `docs/adding-a-backend.md`
//! walks through the parts, and the shared conformance corpus checks it against the
//! interpreter.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod array_buffer;
pub mod buffer;
pub mod cc;
pub mod compile_cache;
pub mod compiled_batch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_backend;
pub mod device_buffer;
pub mod device_info;
pub mod device_runtime;
pub mod launch_check;
pub mod lowered_backend;
pub mod missing;
pub mod notice;
pub mod pool_table;
pub mod queue;
pub mod sanitizer;
pub mod settings;
#[cfg(feature = "wgpu")]
pub mod wgpu_backend;
pub mod worker_pool;

pub use array_buffer::ArrayBuffer;
pub use buffer::{CpuBuffer, MemoryCounter};
pub use compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
pub use device_buffer::{BufferHandle, DeviceBuffer};
pub use device_info::{DeviceInfo, DeviceKind};
pub use device_runtime::{
    DeviceRuntime, byte_range_end, patch_whole_buffer, read_through_whole_buffer,
};
pub use launch_check::{check_launch, launch_dims_not_taken, no_such_kernel};
pub use lowered_backend::{CompileOptions, DATA_PLANE_CONTRACT, LoweredBackend, batch_name};
pub use pool_table::{PoolMemory, PoolTable, Pools};
pub use queue::{DeviceQueue, Queue, QueueMarker};

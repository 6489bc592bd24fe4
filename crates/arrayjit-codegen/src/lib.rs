//! arrayjit-codegen: the second layer of arrayjit. Renderers from the optimized loop IR to
//! source code: C, driven by a table of syntax ([`c::syntax::CSyntax`]) so that other C-like
//! dialects (CUDA C, and CUDA C emulated on the host by [`cuda_emulation`]) share the renderer;
//! and WGSL ([`wgsl`]), compute passes for GPUs through wgpu. GPU pass shapes are lowered once
//! into a kernel tree ([`gpu_kernel`]) and printed per dialect; every kernel, rendered or
//! written by hand, is described by one [`kernel::KernelInterface`].

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod c;
pub mod cuda;
pub mod cuda_emulation;
pub mod gpu_dialect;
pub mod gpu_kernel;
pub mod kernel;
pub mod wgsl;

pub use c::kernel::CUnit;
pub use c::renderer::{CProgram, RenderedC, render_program, render_program_importing};
pub use c::statements::{BIND_SYMBOL, FIND_SYMBOL, SharedFunctions};
pub use c::syntax::CSyntax;
pub use kernel::{KernelInterface, LaunchDims, PARALLEL_TYPEDEF, SourceKernel};

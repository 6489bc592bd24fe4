//! arrayjit-tensor: the fifth layer of arrayjit, a thin tensor front end. Tensors with
//! NumPy-style broadcasting, elementwise operations, einsum contractions and reductions,
//! reshapes and transposes, reverse-mode autodiff, losses, optimizers, reproducible
//! initializers and datasets, and safetensors checkpoints. It only builds assignments; running
//! them is the runtime's business.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod activations;
pub mod attention;
pub mod autodiff;
pub mod checkpoint;
mod contract;
pub mod datasets;
pub mod gather;
pub mod init;
pub mod kv_cache;
pub mod losses;
pub mod nn;
mod normalize;
pub mod optim;
pub mod precision;
pub mod rng;
pub mod tensor;
mod views;

pub use attention::AttentionOptions;
pub use autodiff::{GradProgram, forward_program, grad_program};
pub use init::Init;
pub use optim::{Optimizer, Update, update_program, update_program_clipped};
pub use precision::Precision;
pub use tensor::{Kind, Rhs, Tensor, broadcast_dims};

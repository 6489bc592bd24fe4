//! arrayjit-train: training on top of the tensor front end and the runtime (the facade
//! re-exports it as `arrayjit::train`, with `arrayjit::gpt` and `arrayjit::buckets`). An MLP
//! model, and a loop that compiles forward + backward + update once, then runs it per batch with
//! the batch index as a static binding, on any backend by name, data parallel on request
//! ([`buckets`]: gradients all-reduced in buckets as backprop produces them); and a
//! character-level GPT trainer ([`gpt`]); GPT-2 checkpoints in Hugging Face's layout, its
//! tokenizer, and generation with a key/value cache ([`gpt2`]).
//!
//! ```
//! use arrayjit_tensor::{datasets::moons, Optimizer};
//! use arrayjit_train::{Classifier, LossKind, Mlp, TrainConfig};
//! # fn main() -> arrayjit_ir::Result<()> {
//! let (train, test) = moons(500, 0.1, 1)?.split(0.8, 1)?;
//! let backend = arrayjit_runtime::initialize(None)?; // ARRAYJIT_BACKEND or sync_cc
//! let config = TrainConfig {
//!     epochs: 60,
//!     batch_size: 20,
//!     optimizer: Optimizer::Sgd { lr: 0.05, momentum: 0.9, weight_decay: 1e-4 },
//!     loss: LossKind::Hinge,
//!     shards: 1,
//! };
//! // Forward + backprop + update compiled once into one routine, run per batch.
//! let classifier = Classifier::new(&backend, Mlp::new(&[2, 16, 16, 1], 1)?, &train, &config)?;
//! for epoch in 0..config.epochs {
//!     classifier.epoch(epoch)?;
//! }
//! assert!(classifier.accuracy(&test)? >= 0.95);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod buckets;
pub mod classifier;
pub mod gpt;
pub mod gpt2;
pub mod mlp_workload;

pub use classifier::{Classifier, EpochStats, LossKind, Mlp, TrainConfig};

//! arrayjit-opt: the optimizer of the loop IR and every schedule. It takes routines of
//! `arrayjit_ir` (assignments lowered to loops) and returns them optimized — visit counting,
//! memory-mode inference with provenance, virtualization (fusion), simplification, CSE, scratch
//! planning (`optimize`) — with how each loop nest is to run recorded as data: CPU blocking and
//! parallel loops, and every GPU pass chosen from the device's limits with why (`schedule`).
//! `arrayjit_ir` keeps the data model and the interpreter that defines what these passes must
//! preserve.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod optimize;
pub mod schedule;

pub use optimize::{
    OptimizeCtx, OptimizeSettings, Optimized, optimize, optimize_in, optimize_low_level,
    optimize_low_level_in,
};

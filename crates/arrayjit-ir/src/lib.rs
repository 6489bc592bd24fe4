//! arrayjit-ir: the first layer of arrayjit, its data model. Precisions, host arrays, tensor
//! nodes with memory modes, indexing and projections, assignments (the high-level IR), the loop
//! IR with its bounds verifier, and the reference interpreter that defines the semantics every
//! optimization (`arrayjit-opt`) and every backend is tested against.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod access;
pub mod assignments;
pub mod attention;
pub mod error;
pub mod fallible;
pub mod host_memory;
pub mod host_threads;
pub mod indexing;
pub mod interpret;
pub mod low_level;
pub mod memory;
pub mod ndarray;
pub mod ops;
pub mod prec;
pub mod random;
pub mod tnode;
pub mod trace;
pub mod verify;

pub use assignments::{AccumRhs, Assignments, FetchOp, Operand};
pub use attention::{AttentionDims, AttentionDropout, AttentionLayout, AttentionOp, AttentionSpec};
pub use error::{DeviceLimit, Error, OutOfBounds, RangeUnit, Result, ResultExt};
pub use indexing::{AxisIndex, EinsumGuard, Projections, StaticSymbol, Symbol};
pub use interpret::InterpEnv;
pub use low_level::{FirstUses, LowLevel, ScalarExpr, ScopeId};
pub use memory::{MemoryMode, MemoryType, ModeWithProvenance, Sharing};
pub use ndarray::{AxisPadding, Ndarray, Padding};
pub use ops::{BinOp, TernOp, UnOp};
pub use prec::Prec;
pub use tnode::{DelayedPrec, Tnode};

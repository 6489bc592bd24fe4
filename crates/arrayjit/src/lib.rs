//! arrayjit: an array JIT compiler runtime. Describe array computations once as assignments over
//! tensor nodes; arrayjit lowers them to a loop IR, fuses and simplifies them, renders C,
//! compiles it, links it into contexts on devices and runs it on streams.
//!
//! This facade re-exports the layers:
//! - [`ir`]: precisions, host arrays, tensor nodes, assignments, loop IR, optimizer, interpreter;
//! - [`codegen`]: renderers (C);
//! - [`backends`]: lowered backends (`cc`, the missing placeholder);
//! - [`runtime`]: backends by name, devices, streams, contexts, routines.
//!
//! ```
//! use arrayjit::prelude::*;
//! # fn main() -> arrayjit::Result<()> {
//! let x = Tnode::new(Prec::F32, &[3], &["x"])?;
//! x.set_values(&[1.0, -2.0, 3.0])?;
//! let y = Tnode::new(Prec::F32, &[3], &["y"])?;
//! y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "result")?;
//! let backend = arrayjit::default_backend()?;
//! let code = backend.compile("relu", &Assignments::pointwise_unop(&y, UnOp::Relu, &x), &[])?;
//! let stream = backend.get_device(0)?.new_stream()?;
//! let routine = Context::new(&stream).link(&code)?;
//! routine.run()?;
//! routine.context().to_host(&y)?;
//! assert_eq!(y.get_values()?, vec![1.0, 0.0, 3.0]);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]

pub mod bench;
pub mod conformance;
pub mod train;

pub use arrayjit_backends as backends;
pub use arrayjit_codegen as codegen;
pub use arrayjit_ir as ir;
pub use arrayjit_runtime as runtime;
pub use arrayjit_tensor as tensor;

pub use arrayjit_ir::{Error, Result};
pub use arrayjit_runtime::{available_backends, backend, default_backend, initialize};

/// The names most programs need.
pub mod prelude {
    pub use arrayjit_ir::{
        AccumRhs, Assignments, AxisIndex, BinOp, FetchOp, MemoryMode, MemoryType, Ndarray, Operand,
        Prec, Projections, Sharing, StaticSymbol, TernOp, Tnode, UnOp,
    };
    pub use arrayjit_runtime::{Backend, Context, MergeBufferUse, Routine, Stream};
}

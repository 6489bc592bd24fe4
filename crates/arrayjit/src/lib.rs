//! arrayjit: an array JIT compiler runtime. Describe array computations once, as tensors or as
//! assignments over tensor nodes; arrayjit lowers them to a loop IR, fuses and simplifies them,
//! renders C (or WGSL, or CUDA), compiles it, links it into contexts on devices and runs it on
//! streams.
//!
//! This facade re-exports the layers, each documented on its own:
//! - [`ir`] (`arrayjit-ir`): precisions, host arrays, tensor nodes and their memory modes,
//!   assignments, the loop IR, the optimizer, the reference interpreter, the [`ir::trace`]
//!   timeline recorder, and the one [`Error`] type;
//! - [`codegen`] (`arrayjit-codegen`): renderers to C, CUDA C and WGSL;
//! - [`backends`] (`arrayjit-backends`): lowered backends (`cc`, `cuda`, `wgpu`, the missing
//!   placeholder), buffers that know their precision, kernels from source;
//! - [`runtime`] (`arrayjit-runtime`): backends by name, devices, streams and events, contexts
//!   and routines, transfers, merge buffers, data parallelism, listings and statistics
//!   ([`runtime::observe`]);
//! - [`tensor`] (`arrayjit-tensor`): tensors with broadcasting and autodiff, losses, optimizers,
//!   datasets, checkpoints;
//! - [`train`] (`arrayjit-train`): an MLP classifier trained with one compiled step (data
//!   parallel on request, with gradients all-reduced in [`buckets`]), and the character-level
//!   [`gpt`] trainer.
//!
//! Beside it: `arrayjit-testing`, the shared conformance corpus every backend is checked with,
//! and `arrayjit-cli`, the `arrayjit` binary (backend info, the demos, the benchmark table) with
//! its command-line, progress and plotting dependencies.
//!
//! # Tensors and gradients
//!
//! ```
//! use arrayjit::prelude::*;
//! use arrayjit::tensor::{Init, Tensor, grad_program};
//! # fn main() -> arrayjit::Result<()> {
//! // f(w) = Σ (w · x)², with its gradient 2 (w · x) x.
//! let w = Tensor::param("w", &[3], Init::Constant(0.5), 1, 0)?;
//! let x = Tensor::input(Prec::F32, &[3], "x", &[1.0, 2.0, -1.0])?;
//! let loss = w.mul(&x)?.sum(&[0])?.pow(&Tensor::full(Prec::F32, &[], 2.0)?)?;
//! let program = grad_program(&loss)?;
//! let grad = w.grad().expect("w has a gradient").clone();
//! grad.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "read on the host")?;
//! loss.node().update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "printed")?;
//!
//! let backend = arrayjit::default_backend()?;             // ARRAYJIT_BACKEND, else sync_cc
//! let code = backend.compile(CompileRequest::routine("step", &program.program))?;
//! let stream = backend.get_device(0)?.new_stream()?;
//! let routine = Context::new(&stream).link(&code)?;
//! routine.run()?;
//! assert_eq!(loss.values()?, vec![1.0]);                 // (0.5 + 1 - 0.5)² = 1
//! assert_eq!(grad.host().get_values()?, vec![2.0, 4.0, -2.0]);  // 2 · 1 · x
//! # Ok(()) }
//! ```
//!
//! # Training, and checkpoints in each parameter's precision
//!
//! ```
//! use arrayjit::tensor::{checkpoint, datasets::moons, Optimizer};
//! use arrayjit::train::{Classifier, LossKind, Mlp, TrainConfig};
//! # fn main() -> arrayjit::Result<()> {
//! let (train, test) = moons(200, 0.1, 1)?.split(0.8, 1)?;
//! let backend = arrayjit::initialize(None)?;
//! let config = TrainConfig {
//!     epochs: 5,
//!     batch_size: 20,
//!     optimizer: Optimizer::Sgd { lr: 0.05, momentum: 0.9, weight_decay: 1e-4 },
//!     loss: LossKind::Hinge,
//!     shards: 1,
//! };
//! // Forward, backprop and update compiled once into one routine, run per batch.
//! let classifier = Classifier::new(&backend, Mlp::new(&[2, 16, 1], 1)?, &train, &config)?;
//! for epoch in 0..config.epochs {
//!     classifier.epoch(epoch)?;
//! }
//! assert!(classifier.accuracy(&test)? > 0.7);
//! let dir = std::env::temp_dir().join(format!("arrayjit-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).ok();
//! let path = dir.join("mlp.safetensors");
//! checkpoint::save(&classifier.model().params(), &path)?; // safetensors, readable by PyTorch
//! checkpoint::load(&classifier.model().params(), &path)?;
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
//!
//! # Contexts, routines and transfers
//!
//! A routine is compiled code linked into a context of a stream; linking makes a child context
//! holding every array the code needs. Hosted nodes move between host and devices by
//! themselves (reading on the host waits for the writer), or explicitly:
//!
//! ```
//! use arrayjit::prelude::*;
//! # fn main() -> arrayjit::Result<()> {
//! let x = Tnode::new(Prec::F32, &[4], &["x"])?;
//! x.host().set_values(&[1.0, -2.0, 3.0, -4.0])?;                 // a hosted input
//! let y = Tnode::new(Prec::F32, &[4], &["y"])?;
//! y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "result")?;
//! let backend = arrayjit::backend("multicore_cc")?;      // one worker thread per stream
//! let code = backend.compile(CompileRequest::routine(
//!     "relu",
//!     &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
//! ))?;
//! let device = backend.get_device(0)?;
//! let (s1, s2) = (device.new_stream()?, device.new_stream()?);
//! let r1 = Context::new(&s1).link(&code)?;
//! r1.run()?;                                             // queued on s1
//! x.host().set_value(&[1], 5.0)?;                               // waits for r1's read of x
//! r1.run()?;                                             // uploads x[1] only, then runs
//! assert_eq!(y.host().get_values()?, vec![1.0, 5.0, 3.0, 0.0]); // waits for s1, copies y back
//! // Another stream's context takes y from s1's context, after s1's write of it.
//! let ctx2 = Context::new(&s2).init_from_host(&x)?;
//! let r2 = ctx2.link(&code)?;
//! r2.context().device_to_device(&y, MergeBufferUse::No, r1.context())?;
//! r1.context().to_host_range(&y, 1..2)?;                 // part of an array
//! assert_eq!(y.host().get_value(&[1])?, 5.0);
//! println!("relu ran {} times", r1.stats().runs);
//! # Ok(()) }
//! ```
//!
//! # Seeing what it does
//!
//! `ARRAYJIT_DEBUG=1` lists every compiled routine (cache hit or compile time, kernels,
//! arrays), `=2` every run with its time, `=3` the loop IR, the generated source and every
//! node's memory mode with its reason. `ARRAYJIT_TRACE=trace.json` (or
//! [`runtime::start_trace`] / [`runtime::stop_trace`], or the binary's `--trace`) records a
//! timeline of streams, kernels, copies, waits and compilations for Perfetto.

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub use arrayjit_backends as backends;
pub use arrayjit_codegen as codegen;
pub use arrayjit_dist as dist;
pub use arrayjit_ir as ir;
pub use arrayjit_opt as opt;
pub use arrayjit_runtime as runtime;
pub use arrayjit_tensor as tensor;
pub use arrayjit_train as train;
pub use arrayjit_train::{buckets, gpt, gpt2};

pub use arrayjit_ir::{DeviceLimit, Error, Result, ResultExt};
pub use arrayjit_runtime::{
    available_backends, backend, default_backend, initialize, is_initialized,
};

/// Sends `tracing` output (arrayjit's warnings: an unusable compile cache, a stream dropped
/// with an unread error) to stderr, filtered by `RUST_LOG` (warnings by default), unless the
/// program installed a subscriber already. The binary and the examples call it first.
pub fn install_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The names most programs need.
pub mod prelude {
    pub use arrayjit_ir::{
        AccumRhs, Assignments, AxisIndex, BinOp, FetchOp, MemoryMode, MemoryType, Ndarray, Operand,
        Prec, Projections, ResultExt, Sharing, StaticSymbol, TernOp, Tnode, UnOp,
    };
    pub use arrayjit_runtime::{Backend, CompileRequest, Context, MergeBufferUse, Routine, Stream};
}

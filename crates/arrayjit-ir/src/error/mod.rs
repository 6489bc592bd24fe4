//! The one error type of arrayjit, shared by every layer, and its `Result` alias.

mod bounds;
mod compile_failure;

pub use bounds::{OutOfBounds, RangeUnit};
pub use compile_failure::{CompileFailure, Diagnostic};

use thiserror::Error;

use crate::prec::{Prec, UnknownPrecision};

impl From<UnknownPrecision> for Error {
    fn from(e: UnknownPrecision) -> Error {
        Error::InvalidArgument {
            what: e.to_string(),
        }
    }
}

/// Precisions as a comma list, for messages.
fn prec_list(precs: &[Prec]) -> String {
    precs
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `"{during}: "`, or nothing when `during` is empty.
fn during_prefix(during: &str) -> String {
    if during.is_empty() {
        String::new()
    } else {
        format!("{during}: ")
    }
}

/// A byte count for messages: `1.50 GiB (1610612736 bytes)`, or `512 bytes`.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = None;
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = Some(u);
    }
    match unit {
        Some(u) => format!("{value:.2} {u} ({bytes} bytes)"),
        None => format!("{bytes} bytes"),
    }
}

/// `Result` with [`enum@Error`] as the error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in arrayjit. Every message says what was wrong and what to do.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A value passed by the caller is not acceptable.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What was wrong and how to fix it.
        what: String,
    },
    /// Dimensions or sizes do not agree.
    #[error("shape mismatch in {op}: {detail}")]
    ShapeMismatch {
        /// The operation that found the mismatch.
        op: String,
        /// The shapes (dims) that disagree, in the order `detail` names them (e.g. the left
        /// operand's, then the right's; or the expected, then the given); empty where what
        /// disagrees is not a shape (sizes in bytes, a spec, an axis number).
        shapes: Vec<Vec<usize>>,
        /// What disagrees and what was expected.
        detail: String,
    },
    /// Two amounts that must match do not: the bytes of a buffer and of the data copied into
    /// it, the elements of an array and the values given for it.
    #[error("{op}: {given} {unit} given where {expected} are needed")]
    SizeMismatch {
        /// What was being done (e.g. `copying to the device`, `set_values of x#3`).
        op: String,
        /// The amount needed.
        expected: usize,
        /// The amount given.
        given: usize,
        /// What the amounts count.
        unit: RangeUnit,
    },
    /// An index lies outside the array, buffer or table it indexes.
    #[error("index out of bounds: {}{array}: {problem}", during_prefix(.during))]
    IndexOutOfBounds {
        /// What was indexed: a node's or array's name, a buffer, a pool.
        array: String,
        /// Which index, and what exists.
        problem: OutOfBounds,
        /// What was being done, where the array alone does not say (e.g. the assignment
        /// being lowered); empty otherwise.
        during: String,
    },
    /// A node's precision was asked to change after it was fixed by its first use.
    #[error(
        "the precision of {node} is already {fixed} (because: {fixed_provenance}), so it cannot \
         become {requested} (asked by: {requested_provenance}); call update_prec before anything \
         uses the node's precision (sizing, lowering, host values)"
    )]
    PrecisionFixed {
        /// The node.
        node: String,
        /// Its precision.
        fixed: String,
        /// Who asked for that precision.
        fixed_provenance: String,
        /// The precision asked for now.
        requested: String,
        /// Who asks for it.
        requested_provenance: String,
    },
    /// Two memory-mode requests for one tensor node contradict each other.
    #[error("{0}")]
    MemoryModeConflict(Box<ModeConflict>),
    /// A backend name that no backend answers to.
    #[error("unknown backend {name:?}; available backends: {available}")]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// The names that are known.
        available: String,
    },
    /// The backend exists but was not built or cannot run on this machine.
    #[error("backend {backend} is unavailable: {reason}; to enable it: {how_to_enable}")]
    BackendUnavailable {
        /// The backend's name.
        backend: String,
        /// Why it cannot be used.
        reason: String,
        /// What to do to make it usable.
        how_to_enable: String,
    },
    /// A device ordinal outside the backend's devices.
    #[error("backend {backend} has {num_devices} device(s); there is no device {ordinal}")]
    NoSuchDevice {
        /// The backend's name.
        backend: String,
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        num_devices: usize,
    },
    /// Code needs a tensor node that the context it is linked into or run in does not hold.
    #[error(
        "context {context} lacks tensor node {node}, which {routine} reads before writing it; \
         link the routine that computes it into this context first, or make the node hosted \
         (e.g. set its values on the host)"
    )]
    NodeNotInContext {
        /// The node's debug name.
        node: String,
        /// The context's description.
        context: String,
        /// The routine that needs the node.
        routine: String,
    },
    /// A tensor node has no host array but one was needed.
    #[error("tensor node {node} has no host array: {detail}")]
    NotHosted {
        /// The node's debug name.
        node: String,
        /// What needed the host array and what to do.
        detail: String,
    },
    /// A host write of a hosted constant whose values devices already hold: constants never
    /// change after their initialization.
    #[error(
        "tensor node {node} is a hosted constant (because: {provenance}) that devices already \
         hold; {op} would change it after its initialization: set its values before the first \
         routine reading it runs, or make it hosted nonconstant (or volatile) to change it from \
         the host"
    )]
    ConstantChanged {
        /// The node's debug name.
        node: String,
        /// Why the node is constant.
        provenance: String,
        /// The write refused (`set_values`, `set_value`, ...).
        op: String,
    },
    /// The optimizer cannot honour a request (e.g. a node required to be virtual cannot be inlined).
    #[error("cannot optimize {routine}: {detail}")]
    Optimization {
        /// The routine being optimized.
        routine: String,
        /// What went wrong.
        detail: String,
    },
    /// The external compiler failed.
    #[error("{0}")]
    CompileFailed(Box<CompileFailure>),
    /// Loading a compiled library or finding a symbol in it failed.
    #[error("loading compiled code from {path} failed: {detail}")]
    LoadFailed {
        /// The library's path.
        path: String,
        /// The loader's message.
        detail: String,
    },
    /// A static index was given a value outside its range, or was not given one.
    #[error("static index {symbol}: {detail}")]
    StaticIndex {
        /// The symbol's name.
        symbol: String,
        /// What was wrong.
        detail: String,
    },
    /// An I/O failure (build-files folder, compile cache, temporary files).
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file cannot be read into the parameters: it is not a safetensors file, it
    /// lacks a parameter, or a parameter's entry is malformed. Nothing was loaded.
    #[error("{path} is not a valid checkpoint for these parameters: {detail}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// Code reads the merge buffer as one node while the context or stream holds another.
    #[error("merge buffer mismatch: {detail}")]
    MergeBuffer {
        /// Which nodes and what to do.
        detail: String,
    },
    /// A task on a stream failed; the task's own error (or its panic) is the source. Later work
    /// of that stream was skipped until this error was reported.
    #[error("task {task} on {stream} failed: {source}")]
    TaskFailed {
        /// The stream the task ran on.
        stream: String,
        /// The task: its position in the stream's schedule and what it was.
        task: String,
        /// The task's own error.
        #[source]
        source: std::sync::Arc<Error>,
    },
    /// A task panicked; the panic was caught and became the task's error.
    #[error("the task panicked: {message}")]
    TaskPanicked {
        /// The panic's message.
        message: String,
    },
    /// Work was skipped because it waits for (or reads what was written by) work that failed.
    #[error(
        "work on {stream} was skipped: it depends on task {origin_task} on {origin_stream}, \
         which failed: {source}; fix that failure and recompute its results"
    )]
    UpstreamFailed {
        /// The stream whose work was skipped (or `"the host"`).
        stream: String,
        /// The stream where the original failure happened.
        origin_stream: String,
        /// The task that failed there.
        origin_task: String,
        /// The original task's own error.
        #[source]
        source: std::sync::Arc<Error>,
    },
    /// A setting (an environment variable or a configuration field) has a value outside its
    /// documented range, or one that does not parse.
    #[error(
        "setting {setting} = {value:?} is not valid: {expected}; fix it or unset it to use the default"
    )]
    InvalidSetting {
        /// The environment variable or configuration field.
        setting: String,
        /// The value given (lossily decoded if it was not UTF-8).
        value: String,
        /// What is accepted, with the default.
        expected: String,
    },
    /// A value given for a named parameter is not one it accepts (a learning rate, a mode
    /// name, an alignment, text that should parse as a precision or memory mode).
    #[error("{what} = {value} is not valid: {expected}")]
    BadValue {
        /// The parameter or what the value is for (e.g. "learning rate").
        what: String,
        /// The value given, as the caller wrote it.
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// An axis number outside a tensor's axes.
    #[error("axis {axis} of {what} is out of range: it has {rank} axes")]
    BadAxis {
        /// The tensor or operation.
        what: String,
        /// The axis given (negative axes count from the end where accepted).
        axis: i64,
        /// How many axes there are.
        rank: usize,
    },
    /// Dims with a zero: every axis of a tensor node needs at least one element.
    #[error(
        "tensor node {node:?}: dims {dims:?} have a zero at axis {axis}; every dim must be at least 1"
    )]
    EmptyDims {
        /// The node's label.
        node: String,
        /// The dims given.
        dims: Vec<usize>,
        /// The first axis of size zero.
        axis: usize,
    },
    /// A pool id that no pool of the device has (pools are made by linking a context and
    /// freed with it).
    #[error(
        "{backend}:{device} has no pool {pool_id}; pools are made by linking a context and freed with it"
    )]
    NoSuchPool {
        /// The backend.
        backend: String,
        /// The device ordinal.
        device: usize,
        /// The pool id asked for.
        pool_id: usize,
    },
    /// A pool id already in use on the device.
    #[error("{backend}:{device} already has a pool {pool_id}; free it first or use another id")]
    PoolIdTaken {
        /// The backend.
        backend: String,
        /// The device ordinal.
        device: usize,
        /// The pool id asked for.
        pool_id: usize,
    },
    /// A launch given the wrong number of buffers or static indices for its kernel.
    #[error("kernel {kernel} takes {expected} {what} but {given} were given")]
    WrongArgumentCount {
        /// The kernel (its routine's name).
        kernel: String,
        /// `buffers` or `static indices`.
        what: String,
        /// How many the kernel's interface has.
        expected: usize,
        /// How many the launch gave.
        given: usize,
    },
    /// A buffer of another backend (or of no backend's array) given where one of this
    /// backend's is needed.
    #[error("{what} is not a {backend} buffer; allocate it on that backend")]
    ForeignBuffer {
        /// Which argument or buffer.
        what: String,
        /// The backend that needs its own buffer.
        backend: String,
    },
    /// A kernel index outside a compiled batch.
    #[error("kernel index {index} but the batch has {len}; find kernels with kernel_index")]
    NoSuchKernel {
        /// The index given.
        index: usize,
        /// How many kernels the batch has.
        len: usize,
    },
    /// A write to the device array of a node that is its host array used in place (hosted
    /// constant or volatile nodes on unified memory): the node changes only on the host.
    #[error(
        "{action} {node}: its device array is its host array used in place, so it changes only \
         on the host; set its values there (ARRAYJIT_USE_HOST_MEMORY=0 gives it a device array \
         of its own)"
    )]
    HostArrayInPlace {
        /// The node's debug name.
        node: String,
        /// What was attempted (e.g. "copying into").
        action: String,
    },
    /// A part of a device copy was asked for while that copy lags the host.
    #[error(
        "{context}'s copy of {node} lags the host (the host or another copy changed it since); \
         copy part of a copy that holds the latest values, or use to_host"
    )]
    StaleCopy {
        /// The node's debug name.
        node: String,
        /// The context holding the lagging copy.
        context: String,
    },
    /// Code compiled for one backend linked into a context of another.
    #[error(
        "code compiled for backend {code_backend} cannot be linked into a context of {context_backend}; compile it for that backend"
    )]
    WrongBackend {
        /// The backend the code was compiled for.
        code_backend: String,
        /// The context's backend.
        context_backend: String,
    },
    /// A link prepared ahead (`Context::prepare_link`) was finished with the code of another
    /// routine, or of another optimization of it.
    #[error(
        "the link prepared for routine {prepared} cannot be finished with the code of {given}: finish it with the code compiled from the very optimized routine it was prepared for (Backend::compile of CompileRequest::optimized), or link the code with Context::link"
    )]
    PreparedLinkMismatch {
        /// The routine the link was prepared for.
        prepared: String,
        /// The routine of the code given.
        given: String,
    },
    /// A routine writes a node that its memory mode or sharing does not let devices write.
    #[error("routine {routine} writes {node}, {reason}")]
    WriteRefused {
        /// The routine.
        routine: String,
        /// The node's debug name.
        node: String,
        /// Why the write is refused and what to change.
        reason: String,
    },
    /// A node that has no gradient where one is needed (it does not depend on a parameter,
    /// or the gradient program was not built or does not compute it).
    #[error("{node} has no gradient: {detail}")]
    NoGradient {
        /// The node's debug name.
        node: String,
        /// Why, and what to do.
        detail: String,
    },
    /// Code reads a tensor node that the arrays it runs over do not hold (the interpreter's
    /// environment, a merge buffer holding another node).
    #[error("{holder} holds no array for tensor node {node}{detail}")]
    MissingNode {
        /// The node's debug name.
        node: String,
        /// What was to hold it (e.g. "the interpreter").
        holder: String,
        /// More on what it holds instead (empty, or starting with "; ").
        detail: String,
    },
    /// Work asked of one stream or device that must run on another (the stream of a
    /// routine it streams a merge buffer for, the device a context's arrays live on).
    #[error("{what} runs on {stream}, which is not {expected}")]
    WrongStream {
        /// The work (e.g. "streaming into context c for routine r").
        what: String,
        /// The stream it would run on.
        stream: String,
        /// Where it must run.
        expected: String,
    },
    /// A backend was asked for something it does not do (e.g. compile options on a backend
    /// that takes none, or source given directly to one without a compiler for it).
    #[error("backend {backend} does not support {what}; {instead}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// What was asked of it.
        what: String,
        /// What to do instead.
        instead: String,
    },
    /// Memory for something the caller asked for could not be had: the size is more than the
    /// machine can hold (or than an allocation may be).
    #[error(
        "out of memory: {what} needs {bytes} bytes, which cannot be allocated; use smaller \
         shapes or counts, or free memory"
    )]
    OutOfMemory {
        /// What was being allocated (e.g. "the host array of tensor node w (#3)").
        what: String,
        /// The bytes asked for (saturated at `usize::MAX` when the size itself overflows).
        bytes: usize,
    },
    /// Something needs more memory than its device (or the host) has available, or than the
    /// memory limit set for it leaves: found before anything was allocated, so nothing was.
    #[error(
        "out of memory on {device}: {what} needs {} more, but {} {} available ({bound}); lower \
         the batch size or the model's size, use a smaller precision (bf16 takes half of f32's \
         bytes), free routines and arrays made before, or raise the limit \
         (ARRAYJIT_MEMORY_LIMIT_MB) where one is set",
        human_bytes(*needed),
        human_bytes(*available),
        if *available == 1 { "is" } else { "are" }
    )]
    DeviceOutOfMemory {
        /// The device (e.g. "cpu device 0 of sync_cc", "the host").
        device: String,
        /// What needed the memory (e.g. "linking routine train_step").
        what: String,
        /// The bytes it needs beyond what it holds already.
        needed: usize,
        /// The bytes available to it.
        available: usize,
        /// What the available figure is: the device's free memory, or a memory limit less what
        /// is allocated already.
        bound: String,
    },
    /// A renderer cannot express an optimized routine in its language (a defect of arrayjit,
    /// not of the program: please report it with the routine).
    #[error("cannot render {routine} as {language}: {detail}")]
    Render {
        /// The routine.
        routine: String,
        /// The target language (`C`, `WGSL`).
        language: String,
        /// What could not be rendered.
        detail: String,
    },
    /// A device driver reported an error (validation, out of memory, a lost device, a shader
    /// the driver refused); the driver's own error is the source.
    #[error("device {device} failed while {action}: {source}")]
    Driver {
        /// The device, e.g. `wgpu:0 (llvmpipe)`.
        device: String,
        /// What arrayjit was doing.
        action: String,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A device cannot compute in a precision some node of a routine uses.
    #[error(
        "device {device} cannot compute in {prec} (needed by {node}); it supports {}: \
         choose a supported precision for the node or another backend",
        prec_list(.supported)
    )]
    UnsupportedPrecision {
        /// The device, e.g. `wgpu:0 (llvmpipe)`.
        device: String,
        /// The precision it lacks.
        prec: Prec,
        /// The node that uses it.
        node: String,
        /// The precisions the device supports.
        supported: Vec<Prec>,
    },
    /// A buffer holds another precision than the one its use needs (a kernel argument, an
    /// explicit array of a node, a copy between arrays).
    #[error(
        "{op}: the buffer holds {found} values but {expected} are needed; allocate it with \
         DeviceRuntime::alloc_array for the node's precision"
    )]
    PrecisionMismatch {
        /// Where the buffer was used.
        op: String,
        /// The precision needed.
        expected: Prec,
        /// The buffer's precision.
        found: Prec,
    },
    /// What a kernel, pass or array needs is more than a device allows (threads per block,
    /// workgroups per dispatch, bytes in one binding, bindings per pass, shared memory).
    #[error("{what} needs {needed} {limit}, but {device} allows at most {allowed}; {advice}")]
    LimitExceeded {
        /// The device, e.g. `wgpu:0 (llvmpipe)`, or `the device` where the caller does not know
        /// which.
        device: String,
        /// Who needs it: a kernel, a statement of a routine, an array.
        what: String,
        /// The limit exceeded.
        limit: DeviceLimit,
        /// How much is needed.
        needed: u64,
        /// The most the device allows.
        allowed: u64,
        /// What to do about it.
        advice: String,
    },
    /// An error with what was being done when it happened (see [`ResultExt::context`]); the
    /// error itself is the source, and [`Error::root_cause`] reaches it.
    #[error("{context}: {source}")]
    Context {
        /// What was being done, e.g. `loading checkpoint gpt.safetensors`.
        context: String,
        /// The error that happened.
        #[source]
        source: Box<Error>,
    },
    /// A thread the runtime needs could not be started (the system's limit on threads or
    /// memory was reached).
    #[error("cannot start {thread}: {source}; free threads or memory, or use fewer streams")]
    ThreadSpawn {
        /// Which thread(s): a stream's worker, a device's worker pool.
        thread: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A task of a stream waited for work of its own stream that cannot run before the task
    /// ends (a deadlock refused).
    #[error(
        "a task of {stream} waited for {}, which cannot run before the task ends; wait from another thread or stream",
        match .position { Some(p) => format!("the stream's position #{p}"), None => "the stream itself".to_string() }
    )]
    SelfWait {
        /// The stream.
        stream: String,
        /// The position waited for, scheduled after the task (`None`: all of the stream's work).
        position: Option<u64>,
    },
    /// Work was scheduled on a stream that is shutting down.
    #[error("{stream} is shutting down and takes no more work")]
    StreamClosed {
        /// The stream.
        stream: String,
    },
    /// A runtime failure on a stream or device.
    #[error("runtime error on {stream}: {detail}")]
    Runtime {
        /// The stream or device where it happened.
        stream: String,
        /// What went wrong.
        detail: String,
    },
}

/// A device limit, as [`Error::LimitExceeded`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceLimit {
    /// Threads (invocations) in one block (workgroup).
    ThreadsPerBlock,
    /// Threads of one block along an axis (0 = x, 1 = y, 2 = z).
    BlockExtent(
        /// The axis.
        usize,
    ),
    /// Blocks (workgroups) of one launch along an axis.
    GridExtent(
        /// The axis.
        usize,
    ),
    /// Bytes of one array bound to a kernel (a storage binding).
    BindingBytes,
    /// Arrays (storage buffers) bound to one pass.
    BindingsPerPass,
    /// Bytes of shared (workgroup) memory of one block.
    SharedBytes,
    /// Bytes of one allocation (a device buffer, which holds a pool of arrays).
    BufferBytes,
    /// Positions a kernel can count (a shading language's 32-bit positions): elements of one
    /// array, iterations of one loop nest.
    IndexedElements,
}

impl std::fmt::Display for DeviceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceLimit::ThreadsPerBlock => write!(f, "threads per block"),
            DeviceLimit::BlockExtent(axis) => write!(f, "threads along axis {axis} of a block"),
            DeviceLimit::GridExtent(axis) => write!(f, "blocks along axis {axis} of a launch"),
            DeviceLimit::BindingsPerPass => write!(f, "arrays bound to one pass"),
            DeviceLimit::BindingBytes => write!(f, "bytes in one binding"),
            DeviceLimit::SharedBytes => write!(f, "bytes of shared memory per block"),
            DeviceLimit::BufferBytes => write!(f, "bytes in one buffer"),
            DeviceLimit::IndexedElements => {
                write!(
                    f,
                    "array elements or loop iterations a kernel counts (32-bit positions)"
                )
            }
        }
    }
}

/// Context chaining for [`Result`]: says what was being done when an error happened, keeping
/// the error itself as the source ([`Error::Context`]).
pub trait ResultExt<T> {
    /// Wraps an error in [`Error::Context`] with `context()` (called only on failure).
    fn context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|source| Error::Context {
            context: context().into(),
            source: Box::new(source),
        })
    }
}

/// The details of [`Error::MemoryModeConflict`].
#[derive(Debug, Error)]
#[error(
    "memory mode contradiction for tensor node {node}: it is {old} (because: {old_provenance}), \
     which cannot be refined to {new} (requested because: {new_provenance}); \
     change one of the two requests"
)]
pub struct ModeConflict {
    /// The node's debug name.
    pub node: String,
    /// The mode the node already has (as `MemoryMode` displays it; parse it back with
    /// `str::parse`).
    pub old: String,
    /// Why it has that mode.
    pub old_provenance: String,
    /// The mode that was requested (as `MemoryMode` displays it).
    pub new: String,
    /// Why it was requested.
    pub new_provenance: String,
}

impl Error {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The original error: the own error of the task that failed first, through
    /// [`Error::TaskFailed`] and [`Error::UpstreamFailed`], and the error under any
    /// [`Error::Context`]; `self` for other errors. Match on it to tell kinds of failure apart.
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::TaskFailed { source, .. } | Error::UpstreamFailed { source, .. } => {
                source.root_cause()
            }
            Error::Context { source, .. } => source.root_cause(),
            other => other,
        }
    }

    /// The contexts the error went through, outermost first ([`Error::Context`], and the
    /// stream and task of [`Error::TaskFailed`]), e.g. for a log line per step.
    pub fn contexts(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut e = self;
        loop {
            match e {
                Error::Context { context, source } => {
                    out.push(context.clone());
                    e = source;
                }
                Error::TaskFailed {
                    stream,
                    task,
                    source,
                } => {
                    out.push(format!("task {task} on {stream}"));
                    e = source;
                }
                Error::UpstreamFailed {
                    origin_stream,
                    origin_task,
                    source,
                    ..
                } => {
                    out.push(format!("task {origin_task} on {origin_stream}"));
                    e = source;
                }
                _ => return out,
            }
        }
    }

    /// An [`Error::LimitExceeded`]: `what` needs `needed` of `limit` on `device`, which allows
    /// `allowed`; `advice` says what to do.
    pub fn limit_exceeded(
        device: impl Into<String>,
        what: impl Into<String>,
        limit: DeviceLimit,
        needed: u64,
        allowed: u64,
        advice: impl Into<String>,
    ) -> Error {
        Error::LimitExceeded {
            device: device.into(),
            what: what.into(),
            limit,
            needed,
            allowed,
            advice: advice.into(),
        }
    }

    /// A [`Error::ShapeMismatch`] found by `op` between `shapes` (see the field), said in
    /// `detail`.
    pub fn shape_mismatch(
        op: impl Into<String>,
        shapes: &[&[usize]],
        detail: impl Into<String>,
    ) -> Error {
        Error::ShapeMismatch {
            op: op.into(),
            shapes: shapes.iter().map(|s| s.to_vec()).collect(),
            detail: detail.into(),
        }
    }

    /// `Ok` when `given == expected`, else the [`Error::SizeMismatch`] of `op` (the one check
    /// of every copy between buffers and host data).
    pub fn check_same_size(
        op: impl Into<String>,
        expected: usize,
        given: usize,
        unit: RangeUnit,
    ) -> Result<()> {
        if given == expected {
            Ok(())
        } else {
            Err(Error::SizeMismatch {
                op: op.into(),
                expected,
                given,
                unit,
            })
        }
    }

    /// An [`Error::IndexOutOfBounds`] of `array`, with nothing said of what was being done.
    pub fn out_of_bounds(array: impl Into<String>, problem: OutOfBounds) -> Error {
        Error::IndexOutOfBounds {
            array: array.into(),
            problem,
            during: String::new(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>) -> Error {
        Error::InvalidArgument { what: what.into() }
    }

    /// Whether the error (or the one it wraps) is a lack of memory: [`Error::OutOfMemory`] (an
    /// allocation that could not be made) or [`Error::DeviceOutOfMemory`] (a request found too
    /// large before allocating).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self.root_cause(),
            Error::OutOfMemory { .. } | Error::DeviceOutOfMemory { .. }
        )
    }
}

#[cfg(test)]
mod tests;

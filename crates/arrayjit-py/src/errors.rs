//! Python exceptions for arrayjit's errors: one class per kind of failure, all under
//! `arrayjit.ArrayjitError`, with the Rust error's message unchanged. The kind is that of the
//! root cause (through context chains and failed tasks), so `except arrayjit.ShapeMismatchError`
//! catches a shape error wherever it was found; the chain stays in the message.

use arrayjit_ir::Error;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};

/// Declares the exception classes and [`register`], which adds each to the module: one list,
/// so no class is declared and left out of the module.
macro_rules! exceptions {
    ($($name:ident: $base:ty, $doc:literal;)+) => {
        $(create_exception!(arrayjit, $name, $base, $doc);)+

        /// Adds the exception classes to the module.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            $(m.add(stringify!($name), py.get_type::<$name>())?;)+
            Ok(())
        }
    };
}

exceptions! {
    ArrayjitError: PyException,
        "Base class of every error arrayjit raises.";
    InvalidArgumentError: ArrayjitError,
        "A value passed in is not acceptable (a bad setting, count or name).";
    ShapeMismatchError: ArrayjitError,
        "Shapes or sizes do not agree.";
    IndexOutOfBoundsError: ArrayjitError,
        "An index (or an id) lies outside what it indexes.";
    PrecisionError: ArrayjitError,
        "A precision that cannot be used here: fixed already, unsupported by the device, or another buffer's.";
    MemoryModeError: ArrayjitError,
        "Contradicting memory-mode requests for a tensor node, or a node without the host array a use needs.";
    BackendUnavailableError: ArrayjitError,
        "A backend or device that is unknown, not built, or cannot run on this machine.";
    CompileError: ArrayjitError,
        "Optimizing, rendering, compiling or loading generated code failed.";
    LimitExceededError: ArrayjitError,
        "What a kernel or array needs is more than the device allows.";
    OutOfMemoryError: ArrayjitError,
        "Memory for what was asked could not be had.";
    CheckpointError: ArrayjitError,
        "A checkpoint file cannot be read into the parameters (nothing was loaded).";
    DeviceError: ArrayjitError,
        "Work on a stream or device failed (a driver error, a failed or skipped task, a merge-buffer mismatch).";
    SettingError: ArrayjitError,
        "A setting (environment variable or configuration field) has a value outside its range.";
    IoError: ArrayjitError,
        "Reading or writing a file or folder failed.";
    BadValueError: InvalidArgumentError,
        "A value given for a named parameter is not one it accepts (the message lists what is).";
    AxisError: InvalidArgumentError,
        "An axis outside a tensor's axes, or dims with an axis of size zero.";
    UnsupportedError: ArrayjitError,
        "A backend was asked for something it does not do (compile options, source given directly).";
    PoolError: DeviceError,
        "A device pool id that does not exist, or one already taken.";
    LaunchError: DeviceError,
        "A kernel launch given the wrong number of buffers or static indices, another backend's buffer, or a kernel index outside its batch.";
}

/// Converts an arrayjit error into the Python exception of its kind, message unchanged.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e.root_cause() {
        Error::InvalidArgument { .. }
        | Error::StaticIndex { .. }
        | Error::WrongBackend { .. }
        | Error::PreparedLinkMismatch { .. } => InvalidArgumentError::new_err(message),
        Error::BadValue { .. } => BadValueError::new_err(message),
        Error::BadAxis { .. } | Error::EmptyDims { .. } => AxisError::new_err(message),
        Error::Unsupported { .. } => UnsupportedError::new_err(message),
        Error::NoSuchPool { .. } | Error::PoolIdTaken { .. } => PoolError::new_err(message),
        Error::NoGradient { .. } => InvalidArgumentError::new_err(message),
        Error::MissingNode { .. } => MemoryModeError::new_err(message),
        Error::WrongArgumentCount { .. }
        | Error::ForeignBuffer { .. }
        | Error::NoSuchKernel { .. } => LaunchError::new_err(message),
        Error::ShapeMismatch { .. } | Error::SizeMismatch { .. } => {
            ShapeMismatchError::new_err(message)
        }
        Error::IndexOutOfBounds { .. } => IndexOutOfBoundsError::new_err(message),
        Error::PrecisionFixed { .. }
        | Error::UnsupportedPrecision { .. }
        | Error::PrecisionMismatch { .. } => PrecisionError::new_err(message),
        Error::MemoryModeConflict(_)
        | Error::ConstantChanged { .. }
        | Error::NotHosted { .. }
        | Error::NodeNotInContext { .. }
        | Error::HostArrayInPlace { .. }
        | Error::StaleCopy { .. }
        | Error::WriteRefused { .. } => MemoryModeError::new_err(message),
        Error::UnknownBackend { .. }
        | Error::BackendUnavailable { .. }
        | Error::NoSuchDevice { .. } => BackendUnavailableError::new_err(message),
        Error::Optimization { .. }
        | Error::CompileFailed(_)
        | Error::LoadFailed { .. }
        | Error::Render { .. } => CompileError::new_err(message),
        Error::LimitExceeded { .. } => LimitExceededError::new_err(message),
        Error::OutOfMemory { .. } | Error::DeviceOutOfMemory { .. } => {
            OutOfMemoryError::new_err(message)
        }
        Error::Checkpoint { .. } => CheckpointError::new_err(message),
        Error::InvalidSetting { .. } => SettingError::new_err(message),
        Error::Io { .. } => IoError::new_err(message),
        _ => DeviceError::new_err(message),
    }
}

/// `Result<T>` into `PyResult<T>`.
pub trait IntoPy<T> {
    /// The Python exception of the error's kind.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for arrayjit_ir::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

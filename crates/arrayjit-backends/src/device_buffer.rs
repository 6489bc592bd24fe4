//! A device buffer of any backend ([`DeviceBuffer`]) and the shared handle every layer passes
//! around ([`BufferHandle`]).

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

/// A device buffer of some backend.
pub trait DeviceBuffer: Any + Send + Sync + Debug {
    /// Its size in bytes.
    fn size_in_bytes(&self) -> usize;
    /// The device ordinal it lives on.
    fn device(&self) -> usize;
    /// For downcasting to the backend's buffer type.
    fn as_any(&self) -> &dyn Any;
    /// The precision of the values it holds, when it knows (an [`crate::array_buffer::ArrayBuffer`]); `None`: raw
    /// bytes (scratch, [`crate::device_runtime::DeviceRuntime::alloc_zeroed`]).
    fn prec(&self) -> Option<arrayjit_ir::Prec> {
        None
    }
}

/// A shared handle to a device buffer.
pub type BufferHandle = Arc<dyn DeviceBuffer>;

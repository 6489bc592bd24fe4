//! Device queues: a device's own ordered queue of work (a CUDA stream, the wgpu queue) and the
//! markers recorded on it (CUDA events, wgpu submission indices).
//!
//! A backend whose devices run work asynchronously hands the runtime one [`DeviceQueue`] per
//! runtime stream ([`crate::device_runtime::DeviceRuntime::new_queue`]); the runtime then enqueues that
//! stream's launches and copies on it (the `queue` argument of [`crate::compiled_batch::CompiledBatch::launch`]
//! and of the copies), records a [`QueueMarker`] for every event it hands out, and waits for
//! markers where the host or another stream needs the results:
//!
//! - enqueueing returns as soon as the work is queued; an error *at enqueue time* (a refused
//!   launch, a bad argument) is the task's error, as on the CPU;
//! - a failure the device reports later (a faulting kernel, a lost device) surfaces when the
//!   runtime synchronizes the queue or a marker: [`crate::queue::DeviceQueue::synchronize`] and
//!   [`QueueMarker::synchronize`] return it;
//! - a stream waiting for another stream's event asks its own queue to wait for the marker
//!   on the device ([`DeviceQueue::wait_for`]), without blocking the host; a queue that cannot
//!   (a marker of another backend) says so and the runtime waits on the host instead.
//!
//! CPU backends have no queue: their work has finished when the task that runs it returns, and
//! the runtime's schedulers provide their streams and events.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use arrayjit_ir::Result;

/// A device's ordered queue of work.
pub trait DeviceQueue: Send + Sync + Debug {
    /// The device ordinal the queue belongs to.
    fn device(&self) -> usize;
    /// A marker that completes once all work enqueued so far has finished.
    fn record(&self) -> Result<Arc<dyn QueueMarker>>;
    /// Makes work enqueued later wait, on the device, for `marker`. Returns `Ok(false)` when
    /// this queue cannot wait for that marker on the device (another backend's marker): the
    /// caller must then wait on the host.
    fn wait_for(&self, marker: &dyn QueueMarker) -> Result<bool>;
    /// Blocks until all work enqueued so far has finished; returns a failure the device
    /// reported for it.
    fn synchronize(&self) -> Result<()>;
    /// For downcasting to the backend's queue type.
    fn as_any(&self) -> &dyn Any;
}

/// A point in a [`DeviceQueue`]: done once the work enqueued before it has finished.
pub trait QueueMarker: Send + Sync + Debug {
    /// Whether the work has finished (an error: the device failed, and
    /// [`QueueMarker::synchronize`] says how).
    fn is_done(&self) -> Result<bool>;
    /// Blocks until the work has finished; returns a failure the device reported for it.
    fn synchronize(&self) -> Result<()>;
    /// For downcasting to the backend's marker type.
    fn as_any(&self) -> &dyn Any;
}

/// Where a launch or copy goes: a device queue, or `None` for work that runs (or finishes)
/// before the call returns — every CPU backend, and host reads of a GPU backend outside any
/// stream.
pub type Queue<'a> = Option<&'a dyn DeviceQueue>;

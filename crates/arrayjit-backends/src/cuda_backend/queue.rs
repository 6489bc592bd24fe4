//! CUDA streams as the runtime streams' device queues, and CUDA events as their markers.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrayjit_ir::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::Gpu;
use crate::queue::{DeviceQueue, Queue, QueueMarker};

/// A runtime stream's CUDA stream.
pub(super) struct CudaQueue {
    pub(super) gpu: Arc<Gpu>,
    pub(super) stream: Arc<CudaStream>,
}

impl fmt::Debug for CudaQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaQueue({})", self.gpu.label())
    }
}

/// The stream work goes on: the queue's when it is one of this device's, else the device's
/// default stream.
pub(super) fn stream_for<'a>(gpu: &'a Gpu, queue: Queue<'a>) -> &'a Arc<CudaStream> {
    match queue.and_then(|q| q.as_any().downcast_ref::<CudaQueue>()) {
        Some(q) if q.gpu.ordinal == gpu.ordinal => &q.stream,
        _ => &gpu.default_stream,
    }
}

/// A CUDA event recorded on a stream.
struct CudaMarker {
    gpu: Arc<Gpu>,
    event: CudaEvent,
}

impl fmt::Debug for CudaMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaMarker({})", self.gpu.label())
    }
}

impl DeviceQueue for CudaQueue {
    fn device(&self) -> usize {
        self.gpu.ordinal
    }

    fn record(&self) -> Result<Arc<dyn QueueMarker>> {
        self.gpu.bind("recording an event")?;
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.gpu.driver_error("recording an event", e))?;
        Ok(Arc::new(CudaMarker {
            gpu: self.gpu.clone(),
            event,
        }))
    }

    fn wait_for(&self, marker: &dyn QueueMarker) -> Result<bool> {
        let Some(m) = marker.as_any().downcast_ref::<CudaMarker>() else {
            return Ok(false);
        };
        self.gpu.bind("waiting for an event")?;
        self.stream
            .wait(&m.event)
            .map_err(|e| self.gpu.driver_error("waiting for an event", e))?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.bind("waiting for a stream")?;
        self.stream
            .synchronize()
            .map_err(|e| self.gpu.driver_error("waiting for a stream", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl QueueMarker for CudaMarker {
    fn is_done(&self) -> Result<bool> {
        self.gpu.bind("querying an event")?;
        self.event
            .try_is_complete()
            .map_err(|e| self.gpu.driver_error("querying an event", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.bind("waiting for an event")?;
        self.event
            .synchronize()
            .map_err(|e| self.gpu.driver_error("waiting for an event", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

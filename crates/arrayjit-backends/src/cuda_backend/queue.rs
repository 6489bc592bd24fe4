//! CUDA streams as the runtime streams' device queues, and CUDA events as their markers. A
//! timed launch records a timing event before and after its passes; the device time between
//! them reaches the launch's sink once both have completed: when the stream is next waited for,
//! or at a later timed launch on it that finds them done.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrayjit_ir::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::devices::Gpu;
use crate::compiled_batch::DeviceTimeSink;
use crate::queue::{DeviceQueue, Queue, QueueMarker};

/// A runtime stream's CUDA stream.
pub(super) struct CudaQueue {
    pub(super) gpu: Arc<Gpu>,
    pub(super) stream: Arc<CudaStream>,
    /// Timed launches whose events have not been read yet, oldest first.
    pub(super) timings: Mutex<Vec<PendingTiming>>,
    /// Held while the stream captures a graph and while it is waited for: waiting for a
    /// capturing stream is refused by the driver and invalidates the capture.
    capture_lock: Mutex<()>,
}

/// The events around one timed launch, and where its device time goes.
pub(super) struct PendingTiming {
    pub(super) start: CudaEvent,
    pub(super) end: CudaEvent,
    pub(super) sink: DeviceTimeSink,
}

impl PendingTiming {
    /// Records the start event of a timed launch on `stream`.
    pub(super) fn start(gpu: &Gpu, stream: &CudaStream) -> Result<CudaEvent> {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu.driver_error("recording a timing event", e))
    }

    /// Records the end event after the launch's passes.
    pub(super) fn finish(
        gpu: &Gpu,
        stream: &CudaStream,
        start: CudaEvent,
        sink: DeviceTimeSink,
    ) -> Result<PendingTiming> {
        let end = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu.driver_error("recording a timing event", e))?;
        Ok(PendingTiming { start, end, sink })
    }

    /// Gives the sink the time between the events (waiting for them); a failed read drops it:
    /// the run stays untimed.
    pub(super) fn report(self) {
        if let Ok(ms) = self.start.elapsed_ms(&self.end) {
            (self.sink)(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3));
        }
    }
}

impl CudaQueue {
    /// A queue on `stream`.
    pub(super) fn new(gpu: Arc<Gpu>, stream: Arc<CudaStream>) -> CudaQueue {
        CudaQueue {
            gpu,
            stream,
            timings: Mutex::new(Vec::new()),
            capture_lock: Mutex::new(()),
        }
    }

    /// Keeps the stream from being waited for while the caller captures on it.
    pub(super) fn lock_for_capture(&self) -> std::sync::MutexGuard<'_, ()> {
        self.capture_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a timed launch's events until they can be read; reports those already done.
    pub(super) fn add_timing(&self, t: PendingTiming) {
        let mut pending = self.timings.lock().unwrap_or_else(|p| p.into_inner());
        pending.push(t);
        let done = pending
            .iter()
            .take_while(|t| t.end.try_is_complete().unwrap_or(false))
            .count();
        let ready: Vec<PendingTiming> = pending.drain(..done).collect();
        drop(pending);
        ready.into_iter().for_each(PendingTiming::report);
    }

    /// Reports every pending timing (their events are done once the stream is).
    fn report_all(&self) {
        let ready: Vec<PendingTiming> = self
            .timings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        ready.into_iter().for_each(PendingTiming::report);
    }
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
        // Not while another thread captures on this stream: the event would become a node of
        // that graph (it is then recorded after the capture, covering more work: still right).
        let _not_capturing = self.lock_for_capture();
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
        let waited = {
            let _not_capturing = self.lock_for_capture();
            self.gpu.bind("waiting for a stream")?;
            self.stream
                .synchronize()
                .map_err(|e| self.gpu.driver_error("waiting for a stream", e))
        };
        waited?;
        self.report_all();
        // The stream's work is done: memory released meanwhile may be freed now.
        self.gpu.reclaim(false);
        Ok(())
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

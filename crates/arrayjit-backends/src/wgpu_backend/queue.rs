//! The wgpu queue behind the runtime's streams. A wgpu device has one queue, which runs
//! submissions in order: every runtime stream on `wgpu` enqueues on it, so a stream waiting
//! for another stream's marker needs no device-side wait; a marker is a submission index,
//! done when wgpu reports the submission's work finished.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrayjit_ir::Result;

use super::devices::Gpu;
use crate::queue::{DeviceQueue, QueueMarker};

/// A runtime stream's handle on the device's queue.
pub(super) struct WgpuQueue {
    pub(super) gpu: Arc<Gpu>,
}

impl fmt::Debug for WgpuQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WgpuQueue({})", self.gpu.label())
    }
}

/// A submission of the queue.
struct WgpuMarker {
    gpu: Arc<Gpu>,
    index: wgpu::SubmissionIndex,
    done: Arc<AtomicBool>,
}

impl fmt::Debug for WgpuMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WgpuMarker({}, done: {})",
            self.gpu.label(),
            self.done.load(Ordering::Acquire)
        )
    }
}

impl DeviceQueue for WgpuQueue {
    fn device(&self) -> usize {
        0
    }

    fn record(&self) -> Result<Arc<dyn QueueMarker>> {
        let gpu = &self.gpu;
        let done = Arc::new(AtomicBool::new(false));
        let index = gpu.scoped("recording an event", || {
            let flag = done.clone();
            let index = gpu.queue.submit([]);
            gpu.queue
                .on_submitted_work_done(move || flag.store(true, Ordering::Release));
            Ok(index)
        })?;
        Ok(Arc::new(WgpuMarker {
            gpu: gpu.clone(),
            index,
            done,
        }))
    }

    fn wait_for(&self, marker: &dyn QueueMarker) -> Result<bool> {
        // The device's one queue runs submissions in order: work submitted after the marker's
        // submission already waits for it.
        Ok(marker
            .as_any()
            .downcast_ref::<WgpuMarker>()
            .is_some_and(|m| Arc::ptr_eq(&m.gpu, &self.gpu)))
    }

    fn synchronize(&self) -> Result<()> {
        let gpu = &self.gpu;
        gpu.scoped("waiting for the queue", || {
            gpu.wait("waiting for the queue")
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl QueueMarker for WgpuMarker {
    fn is_done(&self) -> Result<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        self.gpu
            .device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| self.gpu.driver_error("querying an event", Box::new(e)))?;
        Ok(self.done.load(Ordering::Acquire))
    }

    fn synchronize(&self) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.gpu
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(self.index.clone()),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| self.gpu.driver_error("waiting for an event", Box::new(e)))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

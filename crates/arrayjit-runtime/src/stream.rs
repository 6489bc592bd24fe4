//! Streams and events. Under the `Sync` scheduler a stream runs each task in the calling thread
//! as it is scheduled, so every event is done as soon as it exists.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrayjit_backends::BufferHandle;
use arrayjit_ir::{Result, Tnode};

use crate::backend::Device;

pub(crate) struct StreamInner {
    pub device: Device,
    pub id: usize,
    /// Held while a kernel or a transfer touches the stream's buffers.
    pub exec: Mutex<()>,
    /// The merge buffer: a copy of a node received from another context.
    pub merge: Mutex<Option<(Tnode, BufferHandle)>>,
}

/// A sequence of work on a device; work on one stream runs in order.
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl Stream {
    pub(crate) fn new(device: Device) -> Stream {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Stream {
            inner: Arc::new(StreamInner {
                device,
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                exec: Mutex::new(()),
                merge: Mutex::new(None),
            }),
        }
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// A readable name, e.g. `"sync_cc:0:stream3"`.
    pub fn name(&self) -> String {
        format!("{}:stream{}", self.inner.device.name(), self.inner.id)
    }

    /// An event that is done once all work scheduled so far has finished.
    pub fn all_work(&self) -> Event {
        Event { _private: () }
    }

    /// Blocks until the stream is idle; returns the first error a task reported, if any.
    pub fn await_work(&self) -> Result<()> {
        Ok(())
    }

    /// Whether the stream is waiting for work.
    pub fn is_idle(&self) -> bool {
        true
    }

    /// Per-stream debug information.
    pub fn debug_info(&self) -> String {
        let merge = self
            .inner
            .merge
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(t, b)| format!("{} ({} bytes)", t.debug_name(), b.size_in_bytes()))
            .unwrap_or_else(|| "empty".into());
        format!(
            "{} (sync scheduler, idle), merge buffer: {merge}",
            self.name()
        )
    }

    /// Exclusive access to the stream's buffers for one task.
    pub(crate) fn lock_exec(&self) -> MutexGuard<'_, ()> {
        self.inner.exec.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn same_as(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Exclusive access to the buffers of two streams (one lock if they are the same stream),
    /// always taken in stream-id order so that concurrent copies cannot deadlock.
    pub(crate) fn lock_exec_pair<'a>(
        &'a self,
        other: &'a Stream,
    ) -> (MutexGuard<'a, ()>, Option<MutexGuard<'a, ()>>) {
        if self.same_as(other) {
            return (self.lock_exec(), None);
        }
        if self.inner.id < other.inner.id {
            let a = self.lock_exec();
            (a, Some(other.lock_exec()))
        } else {
            let b = other.lock_exec();
            (self.lock_exec(), Some(b))
        }
    }
}

/// Tracks whether a stream has finished work up to a point of its schedule.
#[derive(Clone, Debug)]
pub struct Event {
    _private: (),
}

impl Event {
    /// Whether the work has finished.
    pub fn is_done(&self) -> bool {
        true
    }

    /// Blocks until the work has finished.
    pub fn sync(&self) {}
}

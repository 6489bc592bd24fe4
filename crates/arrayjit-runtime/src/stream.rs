//! Streams: ordered sequences of work on a device, run by the backend's scheduler (see
//! [`crate::scheduler`]), each with a merge buffer for data received from other contexts.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrayjit_backends::{BufferHandle, DeviceQueue};
use arrayjit_ir::{MemoryMode, Result, Tnode, trace};

use crate::device::Device;
use crate::scheduler::{Event, Runner, SchedulerKind, Task, TaskLabel};

/// A stream's merge buffer. Rules:
/// 1. `current` is what code reading `merge` reads: a node and the buffer holding it.
/// 2. A [`crate::device_transfer::MergeBufferUse::Copy`] copies into `own`, the stream's own buffer: a view of
///    the stream's merge pool, reused for any node that fits in it (the reference's
///    `alloc_buffer ?old_buffer`), else a larger pool replaces it. `own` is never another
///    context's array.
/// 3. A [`crate::device_transfer::MergeBufferUse::StreamingFor`] points `current` at the source context's
///    array without copying and keeps that array's entry in `streamed_from`; every run that
///    reads the streamed buffer is ordered after the source's last write and recorded as its
///    reader, like a run reading the array directly. It leaves `own` alone, so a later copy
///    never writes into the source's array.
#[derive(Default)]
pub(crate) struct MergeSlot {
    pub current: Option<MergeContents>,
    pub own: Option<BufferHandle>,
    /// The pool `own` views: `(pool id, bytes)`.
    pool: Option<(usize, usize)>,
}

/// What a stream's merge buffer holds now (see [`MergeSlot`]).
pub(crate) struct MergeContents {
    pub node: Tnode,
    pub buffer: BufferHandle,
    /// The source context's array, when streamed rather than copied.
    pub streamed_from: Option<Arc<crate::array_entry::ArrayEntry>>,
}

pub(crate) struct StreamInner {
    pub device: Device,
    pub id: usize,
    pub runner: Runner,
    /// The merge buffer: what code reading `merge` reads now, and the stream's own buffer
    /// that copies land in (see [`MergeSlot`]).
    pub merge: Mutex<MergeSlot>,
    /// The scratch pool for the large locals of the stream's routines: `(pool id, view)`.
    pub scratch: Mutex<Option<(usize, BufferHandle)>>,
}

impl Drop for StreamInner {
    /// Frees the stream's merge and scratch pools (views still held by work keep their memory).
    fn drop(&mut self) {
        let merge = self
            .merge
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .pool
            .take()
            .map(|(id, _)| id);
        let scratch = self
            .scratch
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(|(id, _)| id);
        let lowered = self.device.backend().lowered();
        for id in merge.into_iter().chain(scratch) {
            let _ = lowered.runtime().free_pool(self.device.ordinal(), id);
        }
    }
}

/// A sequence of work on a device; work on one stream runs in order. Cloning is cheap and
/// refers to the same stream; the stream's worker (if any) stops when the last handle is
/// dropped, after finishing the work already queued.
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
    pub(crate) fn new(device: Device) -> Result<Stream> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}:stream{id}", device.name());
        let queue = device
            .backend()
            .lowered()
            .runtime()
            .new_queue(device.ordinal())?;
        let runner = Runner::new(name, device.backend().scheduler(), queue)?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                device,
                id,
                runner,
                merge: Mutex::new(MergeSlot::default()),
                scratch: Mutex::new(None),
            }),
        })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// A readable name, e.g. `"multicore_cc:0:stream3"`.
    pub fn name(&self) -> String {
        self.inner.runner.shared.name.clone()
    }

    /// Schedules a host task on the stream, after everything scheduled so far. Returns the
    /// error an earlier task left on this stream, if any (the task is then not scheduled). A
    /// task that returns an error or panics fails; see [`crate::scheduler`] for what follows.
    pub fn schedule_task(&self, task: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.schedule(Box::new(task), TaskLabel::Fixed("host task"))
    }

    pub(crate) fn schedule(&self, task: Task, label: TaskLabel) -> Result<()> {
        self.inner.runner.schedule(task, label)
    }

    /// An event that is done once all work scheduled so far has finished.
    pub fn all_work(&self) -> Event {
        self.inner.runner.all_work()
    }

    /// Blocks until the stream is idle; returns the first error a task reported since the last
    /// check, naming the stream.
    pub fn await_work(&self) -> Result<()> {
        self.inner.runner.await_work()
    }

    /// Whether the stream has no unfinished work: its tasks have run and, on a backend with
    /// device queues (`cuda`, `wgpu`), the device has finished the work they enqueued. Once
    /// true it stays true until more work is scheduled; it equals `all_work().is_done()`.
    pub fn is_idle(&self) -> bool {
        self.inner.runner.is_idle()
    }

    /// Makes the stream wait for `event` before running anything scheduled later (nothing to
    /// do for an event of this stream: its work is already ordered). If the event's work
    /// failed, the waiting fails with [`arrayjit_ir::Error::UpstreamFailed`] naming the origin,
    /// and this stream's later work is skipped until that error is reported; when the failure
    /// is already known, this returns it at once.
    pub fn will_wait_for(&self, event: &Event) -> Result<()> {
        self.wait_for(event, true)
    }

    /// Orders later work after `event`; with `propagate`, the event's failure becomes this
    /// stream's (see [`Stream::will_wait_for`]); without, only the order matters (a writer
    /// waiting for earlier readers or writers does not use their values).
    pub(crate) fn wait_for(&self, event: &Event, propagate: bool) -> Result<()> {
        if propagate && let Some(e) = event.failure_for(&self.name()) {
            return Err(e);
        }
        if event.is_done() || event.is_on(&self.inner.runner.shared) {
            return Ok(());
        }
        let (event, waiter) = (event.clone(), self.name());
        let track = self.inner.runner.shared.trace_track;
        if let (Some(queue), Some(marker)) = (self.queue(), event.marker().cloned())
            && event.host_done()
        {
            // Both sides on device queues: the device waits, the host does not.
            return self.schedule(
                Box::new(move || {
                    if !queue.wait_for(&*marker)? {
                        event.wait();
                    }
                    trace_wait(&event, track);
                    match event.failure_for(&waiter) {
                        Some(e) if propagate => Err(e),
                        _ => Ok(()),
                    }
                }),
                TaskLabel::Fixed("wait for another stream"),
            );
        }
        self.schedule(
            Box::new(move || {
                event.wait();
                trace_wait(&event, track);
                match event.failure_for(&waiter) {
                    Some(e) if propagate => Err(e),
                    _ => Ok(()),
                }
            }),
            TaskLabel::Fixed("wait for another stream"),
        )
    }

    /// The device queue the stream's work is enqueued on, if the backend has queues (see
    /// [`arrayjit_backends::queue`]).
    pub(crate) fn queue(&self) -> Option<Arc<dyn DeviceQueue>> {
        self.inner.runner.queue().cloned()
    }

    /// How many tasks were scheduled on the stream so far (routine runs, copies, waits, host
    /// tasks): what tests use to see that an operation scheduled nothing.
    pub fn scheduled_tasks(&self) -> u64 {
        self.inner.runner.stats().0
    }

    /// Per-stream debug information.
    pub fn debug_info(&self) -> String {
        let merge = self
            .merge_lock()
            .current
            .as_ref()
            .map(|m| {
                format!(
                    "{} ({} bytes{})",
                    m.node.debug_name(),
                    m.buffer.size_in_bytes(),
                    if m.streamed_from.is_some() {
                        ", streamed from its source"
                    } else {
                        ""
                    }
                )
            })
            .unwrap_or_else(|| "empty".into());
        let (scheduled, completed, skipped, failed) = self.inner.runner.stats();
        let kind = match self.inner.runner.kind() {
            SchedulerKind::Sync if self.inner.runner.queue().is_some() => {
                "sync, enqueuing on a device queue".to_string()
            }
            SchedulerKind::Sync => "sync".to_string(),
            SchedulerKind::Multicore { queue_capacity } => {
                format!("multicore, queue of {queue_capacity}")
            }
        };
        format!(
            "{} ({kind}): {scheduled} tasks scheduled, {completed} finished, {skipped} skipped after \
             an error{}; merge buffer: {merge}",
            self.name(),
            if failed { ", an error is pending" } else { "" }
        )
    }

    pub(crate) fn merge_lock(&self) -> MutexGuard<'_, MergeSlot> {
        self.inner.merge.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream's own merge buffer for `tn` (see [`MergeSlot`] rule 2): the current one when
    /// it has the node's size and precision, else a view of the merge pool when the node fits
    /// in it, else a view of a new pool that replaces it (work already scheduled keeps the old
    /// one's memory alive). Recorded as `slot.own`.
    pub(crate) fn own_merge_buffer(
        &self,
        slot: &mut MergeSlot,
        tn: &Tnode,
    ) -> Result<BufferHandle> {
        let bytes = tn.size_in_bytes();
        if let Some(own) = &slot.own
            && own.size_in_bytes() == bytes
            && own.prec() == Some(tn.prec())
        {
            return Ok(own.clone());
        }
        let view = match slot.pool {
            Some((id, capacity)) if capacity >= bytes => self
                .device()
                .backend()
                .lowered()
                .runtime()
                .pool_view(self.device().ordinal(), id, 0, bytes)?,
            old => {
                let alignment = self
                    .device()
                    .backend()
                    .lowered()
                    .runtime()
                    .pool_alignment()
                    .max(64);
                let mode = MemoryMode::OnDevice(arrayjit_ir::Sharing::PerStream);
                let capacity = bytes.max(1);
                let (id, view) =
                    self.replace_pool(old.map(|(id, _)| id), capacity, bytes, alignment, mode)?;
                slot.pool = Some((id, capacity));
                view
            }
        };
        let buffer = arrayjit_backends::array_buffer::typed(
            view,
            tn.prec(),
            &format!("the merge buffer of {}", self.name()),
        )?;
        slot.own = Some(buffer.clone());
        Ok(buffer)
    }

    /// Makes the stream's scratch pool at least `bytes` large (a larger pool replaces a smaller
    /// one; work already scheduled keeps the old one alive).
    /// The bytes [`Stream::ensure_scratch`] would allocate for `bytes` of scratch: all of them
    /// when the stream's scratch is smaller (a new pool replaces it), else none.
    pub(crate) fn scratch_growth(&self, bytes: usize) -> usize {
        let scratch = self.inner.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if bytes == 0
            || scratch
                .as_ref()
                .is_some_and(|(_, b)| b.size_in_bytes() >= bytes)
        {
            0
        } else {
            bytes
        }
    }

    pub(crate) fn ensure_scratch(&self, bytes: usize, alignment: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut scratch = self.inner.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if scratch
            .as_ref()
            .is_some_and(|(_, b)| b.size_in_bytes() >= bytes)
        {
            return Ok(());
        }
        let old = scratch.as_ref().map(|(id, _)| *id);
        *scratch = Some(self.replace_pool(old, bytes, bytes, alignment, MemoryMode::Local)?);
        Ok(())
    }

    /// Allocates a new pool of the stream's device (`bytes`, `alignment`, arrays of `mode`),
    /// views its first `view_bytes`, then frees `old` (views held by scheduled work keep its
    /// memory alive). Returns the new pool's id and view; on failure `old` is kept as it was.
    fn replace_pool(
        &self,
        old: Option<usize>,
        bytes: usize,
        view_bytes: usize,
        alignment: usize,
        mode: MemoryMode,
    ) -> Result<(usize, BufferHandle)> {
        let backend = self.device().backend();
        let lowered = backend.lowered();
        let device = self.device().ordinal();
        let id = backend.new_pool_id();
        lowered
            .runtime()
            .alloc_pool_for(device, id, bytes, alignment, Some(mode))?;
        let view = match lowered.runtime().pool_view(device, id, 0, view_bytes) {
            Ok(view) => view,
            Err(e) => {
                let _ = lowered.runtime().free_pool(device, id);
                return Err(e);
            }
        };
        if let Some(old) = old {
            lowered.runtime().free_pool(device, old)?;
        }
        Ok((id, view))
    }

    /// The current scratch pool, if any.
    pub(crate) fn scratch(&self) -> Option<BufferHandle> {
        self.inner
            .scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, b)| b.clone())
    }

    pub(crate) fn same_as(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<StreamInner> {
        Arc::downgrade(&self.inner)
    }
}

/// While tracing: an arrow from the end of the task `event` waited for to the end of the
/// wait on `track` (now).
fn trace_wait(event: &Event, track: trace::Track) {
    if trace::enabled()
        && let Some((from, end)) = event.traced_end()
    {
        trace::flow(from, end, track, Instant::now());
    }
}

impl Device {
    /// A new stream on this device (for `multicore` backends, with its own worker thread).
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self.clone())
    }
}

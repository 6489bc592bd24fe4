//! Schedulers: how a stream runs its tasks. `Sync` runs each task in the caller as it is
//! scheduled. `Multicore` gives each stream a worker thread fed by a bounded queue: scheduling
//! blocks while the queue is full (backpressure), an idle worker sleeps on the queue (no busy
//! waiting), and events are positions in a stream's schedule that waiters sleep on.
//!
//! An error from a task is kept by its stream; later tasks of that stream are skipped (their
//! events still complete, so nothing waits forever) until the error is returned, with the
//! stream's name, by the next `schedule` or `await_work` on that stream. Other streams keep
//! working.

use std::fmt;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, ThreadId};

use arrayjit_ir::{Error, Result};

/// A unit of work on a stream.
pub type Task = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// Which scheduler a backend's streams use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulerKind {
    /// Tasks run in the calling thread when scheduled; every event is done when created.
    Sync,
    /// One worker thread per stream with a bounded queue of this many tasks.
    Multicore {
        /// Tasks a stream's queue holds before `schedule` blocks.
        queue_capacity: usize,
    },
}

#[derive(Default)]
struct Progress {
    scheduled: u64,
    completed: u64,
    error: Option<Error>,
    /// Tasks skipped because an earlier task failed.
    skipped: u64,
}

/// The state of one stream shared by its handles, its worker and its events.
pub(crate) struct StreamShared {
    pub name: String,
    progress: Mutex<Progress>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamShared {
    fn new(name: String) -> StreamShared {
        StreamShared {
            name,
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        }
    }

    fn wait_until(&self, seq: u64) {
        let mut p = lock(&self.progress);
        while p.completed < seq {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn finish(&self, result: Result<()>, ran: bool) {
        let mut p = lock(&self.progress);
        p.completed += 1;
        if !ran {
            p.skipped += 1;
        }
        if let Err(e) = result
            && p.error.is_none()
        {
            p.error = Some(e);
        }
        drop(p);
        self.changed.notify_all();
    }

    fn failed(&self) -> bool {
        lock(&self.progress).error.is_some()
    }

    /// Takes the kept error, naming the stream.
    fn take_error(&self) -> Result<()> {
        match lock(&self.progress).error.take() {
            None => Ok(()),
            Some(e) => Err(Error::Runtime {
                stream: self.name.clone(),
                detail: format!("a task failed: {e}"),
            }),
        }
    }
}

/// Runs the tasks of one stream.
pub(crate) struct Runner {
    pub shared: Arc<StreamShared>,
    kind: SchedulerKind,
    /// Serializes numbering and enqueueing, so queue order equals event order.
    sender: Mutex<Option<SyncSender<Task>>>,
    worker: Option<JoinHandle<()>>,
    worker_id: Option<ThreadId>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Runner({}, {:?})", self.shared.name, self.kind)
    }
}

impl Runner {
    pub fn new(name: String, kind: SchedulerKind) -> Result<Runner> {
        let shared = Arc::new(StreamShared::new(name.clone()));
        match kind {
            SchedulerKind::Sync => Ok(Runner {
                shared,
                kind,
                sender: Mutex::new(None),
                worker: None,
                worker_id: None,
            }),
            SchedulerKind::Multicore { queue_capacity } => {
                let (tx, rx) = sync_channel::<Task>(queue_capacity.max(1));
                let worker_shared = shared.clone();
                let handle = thread::Builder::new()
                    .name(format!("arrayjit {name}"))
                    .spawn(move || {
                        while let Ok(task) = rx.recv() {
                            if worker_shared.failed() {
                                drop(task);
                                worker_shared.finish(Ok(()), false);
                            } else {
                                let result = task();
                                worker_shared.finish(result, true);
                            }
                        }
                    })
                    .map_err(|e| Error::Runtime {
                        stream: name.clone(),
                        detail: format!("cannot start the stream's worker thread: {e}"),
                    })?;
                Ok(Runner {
                    shared,
                    kind,
                    worker_id: Some(handle.thread().id()),
                    sender: Mutex::new(Some(tx)),
                    worker: Some(handle),
                })
            }
        }
    }

    /// Schedules a task; returns the error a previous task left, if any (the new task is then
    /// not scheduled).
    pub fn schedule(&self, task: Task) -> Result<()> {
        self.shared.take_error()?;
        match self.kind {
            SchedulerKind::Sync => {
                lock(&self.shared.progress).scheduled += 1;
                let result = task();
                self.shared.finish(Ok(()), true);
                result.map_err(|e| Error::Runtime {
                    stream: self.shared.name.clone(),
                    detail: format!("a task failed: {e}"),
                })
            }
            SchedulerKind::Multicore { .. } => {
                let sender = lock(&self.sender);
                let tx = sender.as_ref().ok_or_else(|| Error::Runtime {
                    stream: self.shared.name.clone(),
                    detail: "the stream is shutting down".into(),
                })?;
                lock(&self.shared.progress).scheduled += 1;
                if tx.send(task).is_err() {
                    // The worker is gone; count the task as done so waiters do not hang.
                    self.shared.finish(Ok(()), false);
                    return Err(Error::Runtime {
                        stream: self.shared.name.clone(),
                        detail: "the stream's worker thread has stopped".into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// An event for all work scheduled so far.
    pub fn all_work(&self) -> Event {
        let seq = lock(&self.shared.progress).scheduled;
        Event {
            stream: Some(self.shared.clone()),
            seq,
        }
    }

    /// Waits for all work scheduled so far; returns a kept error.
    pub fn await_work(&self) -> Result<()> {
        if self.on_worker_thread() {
            return Err(Error::Runtime {
                stream: self.shared.name.clone(),
                detail: "a task of this stream waited for the stream itself, which would never \
                         finish; wait from another thread or stream"
                    .into(),
            });
        }
        self.all_work().sync();
        self.shared.take_error()
    }

    /// Whether the caller is this stream's own worker thread (i.e. inside one of its tasks).
    pub fn on_worker_thread(&self) -> bool {
        self.worker_id.is_some() && Some(thread::current().id()) == self.worker_id
    }

    pub fn is_idle(&self) -> bool {
        let p = lock(&self.shared.progress);
        p.completed == p.scheduled
    }

    pub fn kind(&self) -> SchedulerKind {
        self.kind
    }

    pub fn stats(&self) -> (u64, u64, u64, bool) {
        let p = lock(&self.shared.progress);
        (p.scheduled, p.completed, p.skipped, p.error.is_some())
    }
}

impl Drop for Runner {
    /// Closes the queue; the worker finishes the tasks already queued, then exits and is joined.
    fn drop(&mut self) {
        lock(&self.sender).take();
        if let Some(handle) = self.worker.take() {
            if Some(thread::current().id()) == self.worker_id {
                return; // Dropped by its own last task: the thread exits by itself.
            }
            let _ = handle.join();
        }
        if let Some(e) = lock(&self.shared.progress).error.take() {
            tracing::warn!(stream = %self.shared.name, error = %e, "stream dropped with an unreported error");
        }
    }
}

/// Tracks whether a stream has finished its work up to a point of its schedule. Cheap to clone.
#[derive(Clone)]
pub struct Event {
    stream: Option<Arc<StreamShared>>,
    seq: u64,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.stream {
            None => f.write_str("Event(done)"),
            Some(s) => write!(
                f,
                "Event({} #{}, done: {})",
                s.name,
                self.seq,
                self.is_done()
            ),
        }
    }
}

impl Event {
    /// An event that is already done.
    pub fn done() -> Event {
        Event {
            stream: None,
            seq: 0,
        }
    }

    /// Whether the work has finished.
    pub fn is_done(&self) -> bool {
        self.stream
            .as_ref()
            .is_none_or(|s| lock(&s.progress).completed >= self.seq)
    }

    /// Blocks until the work has finished (it does not report task errors: `await_work` on the
    /// stream does).
    pub fn sync(&self) {
        if let Some(s) = &self.stream {
            s.wait_until(self.seq);
        }
    }

    /// Whether the event belongs to the stream with this shared state.
    pub(crate) fn is_on(&self, shared: &Arc<StreamShared>) -> bool {
        self.stream.as_ref().is_some_and(|s| Arc::ptr_eq(s, shared))
    }
}

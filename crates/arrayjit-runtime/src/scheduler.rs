//! Schedulers: how a stream runs its tasks. `Sync` runs each task in the caller as it is
//! scheduled. `Multicore` gives each stream a worker thread fed by a bounded queue: scheduling
//! blocks while the queue is full (backpressure), an idle worker sleeps on the queue (no busy
//! waiting), and events are positions in a stream's schedule that waiters sleep on.
//!
//! Failure semantics, the same for both schedulers:
//! - A task fails when it returns an error or panics; a panic is caught and becomes the task's
//!   error ([`Error::TaskPanicked`]), its event completes and the worker keeps serving.
//! - After a task fails, **every later task of that stream is skipped** until the failure is
//!   reported: by the next `schedule` (which then does not schedule its task) or `await_work`
//!   of that stream. Tasks scheduled before the report are skipped even if the worker reaches
//!   them after it, so which tasks ran depends only on the order of calls, never on timing.
//!   With `Sync` the failing `schedule` reports at once, so nothing is skipped.
//! - A failure is reported once, as [`Error::TaskFailed`] with the stream's name, the task and
//!   the task's own error as its `source`.
//! - An event whose position is the failed task or one of the tasks skipped after it is
//!   *failed*: [`Event::sync`] returns the failure, and work that waits for it on another
//!   stream fails with [`Error::UpstreamFailed`] naming the original stream and task (so that
//!   stream's later work is skipped in turn). Failures travel with events forever: an event
//!   stays failed after its stream's failure was reported.
//!
//! Scheduling from inside a task:
//! - A task may schedule more work on its own stream; that work runs after the task (and
//!   everything scheduled before it) ends. Under `Multicore` the worker's own scheduling
//!   never blocks on a full queue (see the rules of `task_queue.rs`); under `Sync` it is deferred
//!   until the running task returns, then run by the same caller.
//! - A `Sync` stream runs one task at a time even when several threads schedule on it: a
//!   `schedule` that finds a task running queues its own, which the running thread runs after
//!   the tasks before it, and returns at once (a failure is then reported as for `Multicore`).
//! - Waiting, inside a task, for work of its own stream scheduled after that task can never
//!   end: `await_work` and [`Event::sync`] return an error instead, and [`Event::wait`]
//!   returns at once.
//!
//! Streams of a backend with device queues (see [`arrayjit_backends::queue`]) run under `Sync`:
//! a task *enqueues* its launches and copies on the stream's queue and returns. An event then
//! also holds a marker recorded on the queue, and is done when the device has finished the
//! work too; `await_work`, [`Event::sync`] and [`Event::wait`] wait for the device. A marker is
//! recorded on the queue *after* the work it stands for has been enqueued, always: an event
//! taken while tasks before its position have not run yet (another thread runs the stream, or
//! the caller is inside one of its tasks) gets its marker when the task at its position has
//! run, by the thread that ran it, before the position counts as done; so no marker is ever
//! recorded while another thread's task enqueues on that queue. A failure
//! the device reports after enqueueing (a faulting kernel, a lost device) is returned by the
//! wait that sees it, as [`Error::TaskFailed`] naming the stream and "work queued on the
//! device", with the driver's error as its source.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Instant;

use arrayjit_backends::{DeviceQueue, QueueMarker};
use arrayjit_ir::{Error, Result, trace};

use crate::task_queue::TaskQueue;

static NEXT_TRACK: AtomicU64 = AtomicU64::new(1);

pub use crate::task::Task;
pub(crate) use crate::task::TaskLabel;

/// End times of a stream's last tasks while a trace is recorded, for arrows from a producer's
/// task to the work waiting for it.
const TRACED_ENDS: usize = 4096;

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

/// The stack size of a multicore stream's worker thread. Kernels keep at most
/// `OptimizeSettings::kernel_stack_budget` bytes of locals on the stack, far below this.
pub const WORKER_STACK_BYTES: usize = 16 << 20;

/// A failed task and the tasks skipped after it: positions `first..=last` of the schedule
/// (`last` is open until the failure is reported).
struct FailureSpan {
    first: u64,
    last: Option<u64>,
    task: String,
    /// The task's own error (for a task that failed waiting on another stream, that
    /// `UpstreamFailed`, which names the origin).
    error: Arc<Error>,
}

#[derive(Default)]
struct Progress {
    scheduled: u64,
    completed: u64,
    /// Tasks skipped because an earlier task failed.
    skipped: u64,
    /// Every failure of the stream, in schedule order; the last may still be unreported.
    failures: Vec<FailureSpan>,
}

impl Progress {
    /// The failure covering position `seq`, if any.
    fn failure_at(&self, seq: u64) -> Option<&FailureSpan> {
        // Spans are disjoint and sorted; the candidate is the last one starting at or before.
        let i = self.failures.partition_point(|f| f.first <= seq);
        let span = self.failures.get(i.checked_sub(1)?)?;
        span.last.is_none_or(|l| seq <= l).then_some(span)
    }

    /// Whether the task at `seq` must be skipped: an unreported failure before it, or a
    /// reported one whose skipped range includes it.
    fn skips(&self, seq: u64) -> bool {
        self.failure_at(seq).is_some_and(|f| f.first < seq)
    }
}

/// Who runs a `Sync` stream's tasks: one thread at a time, the one whose `schedule` found the
/// stream idle; tasks scheduled meanwhile (by that thread's running task, or by other threads)
/// wait in `deferred`, in schedule order, and that thread runs them before it returns.
#[derive(Default)]
struct SyncRunner {
    running: Option<ThreadId>,
    deferred: VecDeque<(Task, TaskLabel)>,
}

/// The state of one stream shared by its handles, its worker and its events.
pub(crate) struct StreamShared {
    pub name: String,
    progress: Mutex<Progress>,
    changed: Condvar,
    /// The stream's worker thread (`Multicore` streams), set when it starts.
    worker: std::sync::OnceLock<ThreadId>,
    /// A `Sync` stream's runner: which thread runs its tasks now, and what waits for it.
    sync: Mutex<SyncRunner>,
    /// The stream's track in traces (unique per stream).
    pub trace_track: trace::Track,
    /// While tracing: when the last tasks ended, by position.
    traced_ends: Mutex<VecDeque<(u64, Instant)>>,
    /// The device queue the stream's tasks enqueue on, if the backend has queues.
    queue: Option<Arc<dyn DeviceQueue>>,
    /// Markers handed out and promised. Lock order: `markers`, then `progress`.
    markers: Mutex<MarkerBook>,
}

/// A device marker that an event holds: recorded at once when the event's tasks have all run,
/// else by the thread that runs the task at the event's position, right after it.
#[derive(Default)]
pub(crate) struct MarkerSlot(std::sync::OnceLock<Arc<dyn QueueMarker>>);

impl MarkerSlot {
    fn fill(&self, queue: &dyn DeviceQueue) {
        let m: Arc<dyn QueueMarker> = match queue.record() {
            Ok(m) => m,
            Err(e) => Arc::new(FailedMarker(Arc::new(e))),
        };
        let _ = self.0.set(m);
    }

    /// The marker, once recorded.
    fn get(&self) -> Option<&Arc<dyn QueueMarker>> {
        self.0.get()
    }
}

/// The markers of a stream with a device queue.
#[derive(Default)]
struct MarkerBook {
    /// The last marker handed out, with the position it covers (reused while nothing new was
    /// scheduled).
    last: Option<(u64, Arc<MarkerSlot>)>,
    /// Markers promised for positions whose tasks have not run yet, in position order.
    promised: VecDeque<(u64, Arc<MarkerSlot>)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// How many tasks (of any stream) the calling thread is running, nested.
    static RUNNING_TASKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether the calling thread is running a task of some stream: it must not wait for work of
/// other threads that may wait for its stream.
pub(crate) fn inside_any_task() -> bool {
    RUNNING_TASKS.with(|n| n.get() > 0)
}

/// Runs a task, turning a panic into its error.
fn run_catching(task: Task) -> Result<()> {
    RUNNING_TASKS.with(|n| n.set(n.get() + 1));
    let result = catch_task(task);
    RUNNING_TASKS.with(|n| n.set(n.get() - 1));
    result
}

/// Runs a task, turning a panic into its error.
fn catch_task(task: Task) -> Result<()> {
    catch_unwind(AssertUnwindSafe(task)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-text payload".into());
        Err(Error::TaskPanicked { message })
    })
}

/// The error reporting `span` of `stream`, seen from `waiter` (`None`: the stream itself
/// reports its own failure).
fn report(stream: &str, span: &FailureSpan, waiter: Option<&str>) -> Error {
    // A task that failed because it waited on a failed task names that origin.
    if let Error::UpstreamFailed {
        origin_stream,
        origin_task,
        source,
        ..
    } = &*span.error
    {
        return Error::UpstreamFailed {
            stream: waiter.unwrap_or(stream).to_string(),
            origin_stream: origin_stream.clone(),
            origin_task: origin_task.clone(),
            source: source.clone(),
        };
    }
    match waiter {
        None => Error::TaskFailed {
            stream: stream.to_string(),
            task: span.task.clone(),
            source: span.error.clone(),
        },
        Some(w) => Error::UpstreamFailed {
            stream: w.to_string(),
            origin_stream: stream.to_string(),
            origin_task: span.task.clone(),
            source: span.error.clone(),
        },
    }
}

impl StreamShared {
    fn new(name: String, queue: Option<Arc<dyn DeviceQueue>>) -> StreamShared {
        StreamShared {
            queue,
            markers: Mutex::new(MarkerBook::default()),
            name,
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
            worker: std::sync::OnceLock::new(),
            sync: Mutex::new(SyncRunner::default()),
            trace_track: trace::Track::Stream(NEXT_TRACK.fetch_add(1, AtomicOrdering::Relaxed)),
            traced_ends: Mutex::new(VecDeque::new()),
        }
    }

    /// Records a task's slice on the stream's track (tracing only).
    fn trace_task(&self, seq: u64, label: &TaskLabel, start: Instant, skipped: bool) {
        let end = Instant::now();
        trace::name_track(self.trace_track, &self.name);
        let mut args = vec![("position", trace::Arg::Int(seq))];
        if let TaskLabel::Copy(_, bytes) = label {
            args.push(("bytes", trace::Arg::Int(*bytes as u64)));
        }
        if skipped {
            args.push(("skipped", trace::Arg::Text("after a failure".into())));
        }
        trace::slice(
            self.trace_track,
            &label.trace_name(),
            label.category(),
            start,
            end,
            args,
        );
        let mut ends = lock(&self.traced_ends);
        if ends.len() == TRACED_ENDS {
            ends.pop_front();
        }
        ends.push_back((seq, end));
    }

    /// When the task at `seq` ended, if a trace recorded it recently.
    fn traced_end(&self, seq: u64) -> Option<Instant> {
        lock(&self.traced_ends)
            .iter()
            .rev()
            .find(|(s, _)| *s == seq)
            .map(|(_, t)| *t)
    }

    /// Whether the calling thread is running a task of this stream (its worker thread, or the
    /// caller of a `Sync` stream inside a task).
    fn inside_task(&self) -> bool {
        let me = thread::current().id();
        self.worker.get() == Some(&me) || lock(&self.sync).running == Some(me)
    }

    /// Waits until the task at `seq` has finished. Returns false without waiting when that
    /// can never happen: the caller is inside a task of this stream that comes before `seq`.
    fn wait_until(&self, seq: u64) -> bool {
        let mut p = lock(&self.progress);
        if p.completed < seq {
            drop(p);
            if self.inside_task() {
                return false;
            }
            p = lock(&self.progress);
        }
        while p.completed < seq {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        true
    }

    /// Runs (or skips) the next task of the worker's queue and records the outcome.
    fn run_next(&self, task: Task, label: TaskLabel) {
        let (seq, skip) = {
            let p = lock(&self.progress);
            (p.completed + 1, p.skips(p.completed + 1))
        };
        let traced = trace::enabled().then(Instant::now);
        let result = if skip {
            drop(task);
            Ok(())
        } else {
            run_catching(task)
        };
        if let Some(start) = traced {
            self.trace_task(seq, &label, start, skip);
        }
        // Markers promised for this position are recorded now, after its work was enqueued
        // and before the position counts as done (under `markers`, which `all_work` holds
        // while it decides to promise one).
        let mut book = self.queue.as_ref().map(|_| lock(&self.markers));
        if let (Some(book), Some(queue)) = (book.as_mut(), &self.queue) {
            while book.promised.front().is_some_and(|(at, _)| *at <= seq) {
                if let Some((_, slot)) = book.promised.pop_front() {
                    slot.fill(&**queue);
                }
            }
        }
        let mut p = lock(&self.progress);
        p.completed += 1;
        if skip {
            p.skipped += 1;
        }
        if let Err(e) = result {
            p.failures.push(FailureSpan {
                first: seq,
                last: None,
                task: format!("#{seq} ({label})"),
                error: Arc::new(e),
            });
        }
        drop(p);
        drop(book);
        self.changed.notify_all();
    }

    fn failed(&self) -> bool {
        lock(&self.progress)
            .failures
            .last()
            .is_some_and(|f| f.last.is_none())
    }

    /// Reports an unreported failure (once): closes its span at the last task scheduled so
    /// far, so that every task scheduled before this report is skipped.
    fn take_error(&self) -> Result<()> {
        let mut p = lock(&self.progress);
        let scheduled = p.scheduled;
        match p.failures.last_mut() {
            Some(span) if span.last.is_none() => {
                span.last = Some(scheduled.max(span.first));
                Err(report(&self.name, span, None))
            }
            _ => Ok(()),
        }
    }

    /// The failure covering position `seq` once it has finished, seen from `waiter`.
    fn failure(&self, seq: u64, waiter: Option<&str>) -> Option<Error> {
        let p = lock(&self.progress);
        if p.completed < seq {
            return None;
        }
        p.failure_at(seq)
            .map(|span| report(&self.name, span, waiter))
    }
}

/// Runs the tasks of one stream.
pub(crate) struct Runner {
    pub shared: Arc<StreamShared>,
    kind: SchedulerKind,
    /// The `Multicore` worker's queue (numbering happens under its lock, so queue order
    /// equals event order).
    tasks: Option<Arc<TaskQueue>>,
    worker: Option<JoinHandle<()>>,
    worker_id: Option<ThreadId>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Runner({}, {:?})", self.shared.name, self.kind)
    }
}

impl Runner {
    pub fn new(
        name: String,
        kind: SchedulerKind,
        queue: Option<Arc<dyn DeviceQueue>>,
    ) -> Result<Runner> {
        match kind {
            SchedulerKind::Sync => Ok(Runner {
                shared: Arc::new(StreamShared::new(name, queue)),
                kind,
                tasks: None,
                worker: None,
                worker_id: None,
            }),
            SchedulerKind::Multicore { .. } if queue.is_some() => Err(Error::Runtime {
                stream: name,
                detail: "a backend with device queues must run its streams under the Sync \
                         scheduler (its tasks only enqueue work); fix the registry row"
                    .into(),
            }),
            SchedulerKind::Multicore { queue_capacity } => {
                let shared = Arc::new(StreamShared::new(name.clone(), None));
                let tasks = Arc::new(TaskQueue::new(queue_capacity));
                let (rx, worker_shared) = (tasks.clone(), shared.clone());
                let handle = thread::Builder::new()
                    .name(format!("arrayjit {name}"))
                    .stack_size(WORKER_STACK_BYTES)
                    .spawn(move || {
                        let _ = worker_shared.worker.set(thread::current().id());
                        while let Some((task, label)) = rx.pop() {
                            worker_shared.run_next(task, label);
                        }
                    })
                    .map_err(|source| Error::ThreadSpawn {
                        thread: format!("the worker thread of {name}"),
                        source,
                    })?;
                Ok(Runner {
                    shared,
                    kind,
                    worker_id: Some(handle.thread().id()),
                    tasks: Some(tasks),
                    worker: Some(handle),
                })
            }
        }
    }

    /// Schedules a task; returns the error a previous task left, if any (the new task is then
    /// not scheduled). With `Sync`, runs it now and returns its own failure.
    pub fn schedule(&self, task: Task, label: TaskLabel) -> Result<()> {
        self.shared.take_error()?;
        match self.kind {
            SchedulerKind::Sync => {
                {
                    let mut sync = lock(&self.shared.sync);
                    // Numbered under this lock, so the run order is the schedule order.
                    lock(&self.shared.progress).scheduled += 1;
                    if sync.running.is_some() {
                        // A task of this stream is running (it scheduled this, or another
                        // thread runs it): the runner runs this after it.
                        sync.deferred.push_back((task, label));
                        return Ok(());
                    }
                    sync.running = Some(thread::current().id());
                }
                self.shared.run_next(task, label);
                loop {
                    let next = {
                        let mut sync = lock(&self.shared.sync);
                        let next = sync.deferred.pop_front();
                        if next.is_none() {
                            // Released under the lock that queues: nothing is left behind.
                            sync.running = None;
                        }
                        next
                    };
                    let Some((task, label)) = next else { break };
                    self.shared.run_next(task, label);
                }
                self.shared.take_error()
            }
            SchedulerKind::Multicore { .. } => {
                let tasks = self.tasks.as_ref().ok_or_else(|| Error::Runtime {
                    stream: self.shared.name.clone(),
                    detail: "the stream has no worker queue".into(),
                })?;
                // Only the worker runs this stream's tasks (no `Sync` runner state to consult).
                let from_worker = self.shared.worker.get() == Some(&thread::current().id());
                let number = || lock(&self.shared.progress).scheduled += 1;
                if tasks.push(task, label, from_worker, number).is_err() {
                    return Err(Error::StreamClosed {
                        stream: self.shared.name.clone(),
                    });
                }
                Ok(())
            }
        }
    }

    /// An event for all work scheduled so far (with a marker of the device queue, if any,
    /// recorded once that work has been enqueued: see the module doc).
    pub fn all_work(&self) -> Event {
        let shared = &self.shared;
        let Some(queue) = &shared.queue else {
            let seq = lock(&shared.progress).scheduled;
            return Event {
                stream: Some(shared.clone()),
                seq,
                marker: None,
            };
        };
        let mut book = lock(&shared.markers);
        let (seq, completed) = {
            let p = lock(&shared.progress);
            (p.scheduled, p.completed)
        };
        // Before any work there is nothing on the device to wait for.
        let marker = (seq > 0).then(|| match &book.last {
            Some((at, slot)) if *at == seq => slot.clone(),
            _ => {
                let slot = Arc::new(MarkerSlot::default());
                if completed >= seq {
                    slot.fill(&**queue);
                } else {
                    book.promised.push_back((seq, slot.clone()));
                }
                book.last = Some((seq, slot.clone()));
                slot
            }
        });
        Event {
            stream: Some(shared.clone()),
            seq,
            marker,
        }
    }

    /// The device queue the stream's work goes on, if the backend has queues.
    pub fn queue(&self) -> Option<&Arc<dyn DeviceQueue>> {
        self.shared.queue.as_ref()
    }

    /// Waits for all work scheduled so far; returns a kept error.
    pub fn await_work(&self) -> Result<()> {
        if self.inside_task() {
            return Err(Error::SelfWait {
                stream: self.shared.name.clone(),
                position: None,
            });
        }
        self.all_work().wait();
        self.shared.take_error()?;
        match &self.shared.queue {
            Some(queue) => queue
                .synchronize()
                .map_err(|e| device_failure(&self.shared.name, e)),
            None => Ok(()),
        }
    }

    /// Whether the caller is running one of this stream's tasks (its worker thread, or the
    /// caller of a `Sync` stream inside a task).
    pub fn inside_task(&self) -> bool {
        self.shared.inside_task()
    }

    /// Whether no work is pending: every task has run and, on a backend with device queues,
    /// the device has finished what they enqueued (the same test as `all_work().is_done()`).
    pub fn is_idle(&self) -> bool {
        self.all_work().is_done()
    }

    pub fn kind(&self) -> SchedulerKind {
        self.kind
    }

    pub fn stats(&self) -> (u64, u64, u64, bool) {
        let failed = self.shared.failed();
        let p = lock(&self.shared.progress);
        (p.scheduled, p.completed, p.skipped, failed)
    }
}

impl Drop for Runner {
    /// Closes the queue; the worker finishes the tasks already queued, then exits and is joined.
    fn drop(&mut self) {
        if let Some(tasks) = &self.tasks {
            tasks.close();
        }
        if let Some(handle) = self.worker.take() {
            if Some(thread::current().id()) == self.worker_id {
                return; // Dropped by its own last task: the thread exits by itself.
            }
            let _ = handle.join();
        }
        if self.shared.failed()
            && let Err(e) = self.shared.take_error()
        {
            arrayjit_backends::notice::warn_user(&format!(
                "stream {} was dropped with an error nobody read: {e}",
                self.shared.name
            ));
        }
    }
}

/// A failure the device reported for work already enqueued, as the stream's task failure.
fn device_failure(stream: &str, e: Error) -> Error {
    Error::TaskFailed {
        stream: stream.to_string(),
        task: "work queued on the device".into(),
        source: Arc::new(e),
    }
}

/// Stands for a marker the queue could not record: it reports that failure.
#[derive(Debug)]
struct FailedMarker(Arc<Error>);

impl QueueMarker for FailedMarker {
    fn is_done(&self) -> Result<bool> {
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        Err(Error::TaskFailed {
            stream: "a device queue".into(),
            task: "recording an event".into(),
            source: self.0.clone(),
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Tracks whether a stream has finished its work up to a point of its schedule (and, on a
/// backend with device queues, whether the device has). Cheap to clone.
#[derive(Clone)]
pub struct Event {
    stream: Option<Arc<StreamShared>>,
    seq: u64,
    /// Filled once the tasks up to `seq` have run (see [`MarkerSlot`]).
    marker: Option<Arc<MarkerSlot>>,
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
            marker: None,
        }
    }

    /// Whether the work has finished (on the device too; a device that failed counts as
    /// finished: [`Event::sync`] reports how).
    pub fn is_done(&self) -> bool {
        self.stream
            .as_ref()
            .is_none_or(|s| lock(&s.progress).completed >= self.seq)
            && self.marker().is_none_or(|m| m.is_done().unwrap_or(true))
    }

    /// Whether the event's tasks have run on the host (their device work may still run).
    pub(crate) fn host_done(&self) -> bool {
        self.stream
            .as_ref()
            .is_none_or(|s| lock(&s.progress).completed >= self.seq)
    }

    /// The device marker of the event, if its stream has a device queue and the tasks up to
    /// the event have run (before that, no marker of that work exists yet).
    pub(crate) fn marker(&self) -> Option<&Arc<dyn QueueMarker>> {
        self.marker.as_ref().and_then(|slot| slot.get())
    }

    /// Blocks until the work has finished; returns the failure of the event's work, if it failed
    /// (see the module doc: the failed task or a task skipped after it). Unlike `await_work` on
    /// the stream, this does not count as reporting the stream's failure.
    pub fn sync(&self) -> Result<()> {
        if let Some(s) = &self.stream
            && !s.wait_until(self.seq)
        {
            return Err(Error::SelfWait {
                stream: s.name.clone(),
                position: Some(self.seq),
            });
        }
        if let Some(e) = self.failure() {
            return Err(e);
        }
        match (self.marker(), &self.stream) {
            (Some(m), Some(s)) => m.synchronize().map_err(|e| device_failure(&s.name, e)),
            _ => Ok(()),
        }
    }

    /// Like [`Event::wait`], except inside a task of the event's own stream (on its worker
    /// thread): there every earlier task has finished and no later one can start before the
    /// caller's task ends, so it returns at once instead of waiting for itself.
    pub(crate) fn wait_unless_inside_its_stream(&self) {
        if let Some(s) = &self.stream
            && s.inside_task()
        {
            return;
        }
        self.wait()
    }

    /// Blocks until the work has finished, whatever its outcome. Inside a task of the event's
    /// own stream, waiting for work scheduled after that task would never end: it returns at
    /// once (use [`Event::sync`] to get an error instead).
    pub fn wait(&self) {
        if let Some(s) = &self.stream
            && !s.wait_until(self.seq)
        {
            return;
        }
        if let Some(m) = self.marker() {
            // A device failure is reported by `sync` or the stream's `await_work`.
            let _ = m.synchronize();
        }
    }

    /// The failure of the event's work if it has finished and failed, as
    /// [`Error::TaskFailed`] naming the stream and task (or the `UpstreamFailed` that failure
    /// was, naming its origin).
    pub fn failure(&self) -> Option<Error> {
        self.stream.as_ref()?.failure(self.seq, None)
    }

    /// Like [`Event::failure`], as the error of work on `waiter` that depends on this event.
    pub(crate) fn failure_for(&self, waiter: &str) -> Option<Error> {
        self.stream.as_ref()?.failure(self.seq, Some(waiter))
    }

    /// Where and when the event's last task ended, if a trace recorded it (for an arrow to
    /// the work waiting for it).
    pub(crate) fn traced_end(&self) -> Option<(trace::Track, Instant)> {
        let s = self.stream.as_ref()?;
        Some((s.trace_track, s.traced_end(self.seq)?))
    }

    /// Whether two events belong to the same stream.
    pub(crate) fn same_stream(&self, other: &Event) -> bool {
        match (&self.stream, &other.stream) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Whether the event belongs to the stream with this shared state.
    pub(crate) fn is_on(&self, shared: &Arc<StreamShared>) -> bool {
        self.stream.as_ref().is_some_and(|s| Arc::ptr_eq(s, shared))
    }
}

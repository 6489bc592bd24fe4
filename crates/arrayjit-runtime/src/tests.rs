//! Unit tests of the runtime's own mechanisms, below the public API the facade's tests use:
//! the schedulers' failure semantics, the host-sync rules of one array, the device index of
//! shared arrays, and configuration checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrayjit_backends::{BufferHandle, CpuBuffer, MemoryCounter};
use arrayjit_ir::{Error, Prec, Result, Tnode};

use crate::array_entry::{Access, ArrayEntry, SharedArrays};
use crate::backend::backend_with_config;
use crate::config::RuntimeConfig;
use crate::scheduler::{Event, Runner, SchedulerKind, TaskLabel};

const KINDS: [SchedulerKind; 2] = [
    SchedulerKind::Sync,
    SchedulerKind::Multicore { queue_capacity: 4 },
];

fn task(f: impl FnOnce() -> Result<()> + Send + 'static) -> crate::scheduler::Task {
    Box::new(f)
}

fn counting(counter: &Arc<AtomicUsize>) -> crate::scheduler::Task {
    let counter = counter.clone();
    task(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

#[test]
fn a_panicking_task_is_its_error_and_the_runner_keeps_serving() {
    for kind in KINDS {
        let runner = Runner::new(format!("test {kind:?}"), kind, None).unwrap();
        let result = runner
            .schedule(task(|| panic!("boom")), TaskLabel::Fixed("panicky"))
            .and_then(|()| runner.await_work());
        let err = result.unwrap_err();
        match err.root_cause() {
            Error::TaskPanicked { message, .. } => assert!(message.contains("boom"), "{err}"),
            other => panic!("{kind:?}: expected TaskPanicked under {err}, got {other:?}"),
        }
        assert!(err.to_string().contains("panicky"), "{err}");
        // Reported once; then the runner works again.
        let ran = Arc::new(AtomicUsize::new(0));
        runner
            .schedule(counting(&ran), TaskLabel::Fixed("after"))
            .unwrap();
        runner.await_work().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{kind:?}");
    }
}

#[test]
fn tasks_after_a_failure_are_skipped_until_it_is_reported() {
    let runner = Runner::new(
        "skips".into(),
        SchedulerKind::Multicore { queue_capacity: 64 },
        None,
    )
    .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    // Hold the worker so that every task below is queued before any runs.
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let g = gate.clone();
    runner
        .schedule(
            task(move || {
                drop(g.lock().unwrap());
                Ok(())
            }),
            TaskLabel::Fixed("gate"),
        )
        .unwrap();
    for k in 0..20 {
        let t = if k == 5 {
            task(|| Err(Error::invalid("task five fails")))
        } else {
            counting(&ran)
        };
        runner.schedule(t, TaskLabel::Fixed("work")).unwrap();
    }
    let event_before = runner.all_work();
    drop(held);
    let err = runner.await_work().unwrap_err();
    assert!(err.to_string().contains("task five fails"), "{err}");
    // Exactly the five tasks before the failure ran, whatever the timing.
    assert_eq!(ran.load(Ordering::SeqCst), 5);
    let (scheduled, completed, skipped, _) = runner.stats();
    assert_eq!((scheduled, completed, skipped), (21, 21, 14));
    // The event of the skipped work stays failed after the report.
    assert!(event_before.failure().is_some());
    assert!(event_before.sync().is_err());
    runner
        .schedule(counting(&ran), TaskLabel::Fixed("later"))
        .unwrap();
    runner.await_work().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 6);
}

#[test]
fn done_events_are_done_and_carry_no_failure() {
    let e = Event::done();
    assert!(e.is_done());
    assert!(e.failure().is_none());
    e.sync().unwrap();
    e.wait();
}

fn buffer(bytes: usize) -> BufferHandle {
    Arc::new(CpuBuffer::zeroed(bytes, 0, Arc::new(MemoryCounter::default())).unwrap())
}

#[test]
fn a_write_clears_the_readers_and_a_stream_keeps_one_reader_event() {
    let b = crate::backend::backend("multicore_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let tn = Tnode::new(Prec::F32, &[4], &["a"]).unwrap();
    let entry = ArrayEntry::new(tn.clone(), buffer(16), false);
    let log = Arc::new(Mutex::new(Vec::new()));
    let step = |s: &crate::stream::Stream, access: Access, name: &'static str| {
        let log = log.clone();
        entry
            .schedule_access(s, access, TaskLabel::Fixed(name), move || {
                log.lock().unwrap().push(name);
                Ok(())
            })
            .unwrap();
    };
    step(&s1, Access::Write, "w1");
    step(&s2, Access::Read, "r2");
    step(&s2, Access::Read, "r2b");
    // The write on s1 waits for both reads on s2 (rule 3) and the first write (rule 2).
    step(&s1, Access::Write, "w2");
    step(&s2, Access::Read, "r3");
    s1.await_work().unwrap();
    s2.await_work().unwrap();
    let log = log.lock().unwrap().clone();
    let at = |n: &str| log.iter().position(|x| *x == n).unwrap();
    assert!(at("w1") < at("r2") && at("r2") < at("r2b"), "{log:?}");
    assert!(at("r2b") < at("w2") && at("w2") < at("r3"), "{log:?}");
    assert!(entry.node().is_some());
    drop(tn);
    // The entry does not keep its node alive.
    assert!(entry.node().is_none());
}

#[test]
fn a_failed_writer_fails_the_readers_on_other_streams() {
    let b = crate::backend::backend("multicore_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let tn = Tnode::new(Prec::F32, &[4], &["a"]).unwrap();
    let entry = ArrayEntry::new(tn, buffer(16), false);
    entry
        .schedule_access(&s1, Access::Write, TaskLabel::Fixed("bad write"), || {
            Err(Error::invalid("no values"))
        })
        .unwrap();
    s1.all_work().wait();
    assert!(entry.writer_failed());
    let read = entry.schedule_access(&s2, Access::Read, TaskLabel::Fixed("read"), || Ok(()));
    let err = read.and_then(|()| s2.await_work()).unwrap_err();
    assert!(
        matches!(err, Error::UpstreamFailed { .. }) || err.to_string().contains("bad write"),
        "{err}"
    );
    assert!(s1.await_work().is_err());
}

#[test]
fn shared_arrays_live_with_their_node_and_the_index_is_swept() {
    let shared = SharedArrays::default();
    let keep = Tnode::new(Prec::F32, &[4], &["keep"]).unwrap();
    let kept = ArrayEntry::new(keep.clone(), buffer(16), true);
    shared.insert(&keep, &kept).unwrap();
    drop(kept);
    // Held by the node alone.
    assert!(shared.get(&keep).is_some());
    for k in 0..200 {
        let tn = Tnode::new(Prec::F32, &[4], &[&format!("t{k}")]).unwrap();
        let e = ArrayEntry::new(tn.clone(), buffer(16), true);
        shared.insert(&tn, &e).unwrap();
        assert!(shared.get(&tn).is_some());
    }
    assert_eq!(shared.live(), 1);
    assert!(
        shared.by_node_len() <= 2 * 16 + 1,
        "{}",
        shared.by_node_len()
    );
    let e = shared.get(&keep).unwrap();
    drop(keep);
    // A copy still held (as a context would) outlives its node, which it does not keep alive.
    assert!(e.node().is_none());
    drop(e);
    assert_eq!(shared.live(), 0);
}

#[test]
fn configurations_outside_their_ranges_are_refused() {
    for config in [
        RuntimeConfig {
            queue_capacity: 0,
            ..Default::default()
        },
        RuntimeConfig {
            queue_capacity: 65_537,
            ..Default::default()
        },
        RuntimeConfig {
            num_devices: Some(1025),
            ..Default::default()
        },
        RuntimeConfig {
            max_pool_bytes: Some(0),
            ..Default::default()
        },
        RuntimeConfig {
            memory_limit: Some(0),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidSetting { .. })
        ));
        assert!(backend_with_config("sync_cc", &config).is_err());
    }
    RuntimeConfig::default().validate().unwrap();
}

#[test]
fn devices_describe_themselves_from_their_backend() {
    let b = backend_with_config(
        "sync_cc",
        &RuntimeConfig {
            workers_per_device: Some(3),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let info = b.get_device(0).unwrap().info().unwrap();
    assert_eq!(info.kind, arrayjit_backends::DeviceKind::Cpu);
    assert_eq!(info.compute_units, 3);
    assert!(info.supports(Prec::F64) && info.supports(Prec::Bf16));
    assert_eq!(
        b.optimize_settings().schedule.f32_lanes,
        info.vector_bytes / 4
    );
    // A placeholder backend has no device to describe.
    let missing = crate::backend::backend("cuda").unwrap();
    assert!(matches!(
        missing.lowered().device_info(0),
        Err(Error::BackendUnavailable { .. })
    ));
}

/// A device queue whose work "runs" only when the test says so, and which can fail.
#[derive(Debug, Default)]
struct FakeQueue {
    /// Work enqueued (counted by the tasks) and finished on the "device".
    enqueued: AtomicUsize,
    finished: AtomicUsize,
    /// The device's failure, reported by every later wait.
    failure: Mutex<Option<String>>,
    /// Markers this queue was asked to wait for on the device.
    device_waits: AtomicUsize,
}

#[derive(Debug)]
struct FakeMarker {
    queue: Arc<FakeQueue>,
    at: usize,
}

impl FakeQueue {
    fn check(&self) -> Result<()> {
        match &*self.failure.lock().unwrap() {
            Some(f) => Err(Error::invalid(f.clone())),
            None => Ok(()),
        }
    }
}

/// The queue handed to the runner: shares the fake's state.
#[derive(Debug)]
struct FakeHandle(Arc<FakeQueue>);

impl arrayjit_backends::DeviceQueue for FakeHandle {
    fn device(&self) -> usize {
        0
    }
    fn record(&self) -> Result<Arc<dyn arrayjit_backends::QueueMarker>> {
        Ok(Arc::new(FakeMarker {
            queue: self.0.clone(),
            at: self.0.enqueued.load(Ordering::SeqCst),
        }))
    }
    fn wait_for(&self, marker: &dyn arrayjit_backends::QueueMarker) -> Result<bool> {
        let ours = marker.as_any().downcast_ref::<FakeMarker>().is_some();
        if ours {
            self.0.device_waits.fetch_add(1, Ordering::SeqCst);
        }
        Ok(ours)
    }
    fn synchronize(&self) -> Result<()> {
        let q = &self.0;
        q.finished
            .store(q.enqueued.load(Ordering::SeqCst), Ordering::SeqCst);
        q.check()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl arrayjit_backends::QueueMarker for FakeMarker {
    fn is_done(&self) -> Result<bool> {
        self.queue.check()?;
        Ok(self.queue.finished.load(Ordering::SeqCst) >= self.at)
    }
    fn synchronize(&self) -> Result<()> {
        self.queue.finished.fetch_max(self.at, Ordering::SeqCst);
        self.queue.check()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn events_of_a_queued_stream_wait_for_the_device_and_report_its_failures() {
    let fake = Arc::new(FakeQueue::default());
    let runner = Runner::new(
        "gpu".into(),
        SchedulerKind::Sync,
        Some(Arc::new(FakeHandle(fake.clone()))),
    )
    .unwrap();
    let enqueue = || {
        let fake = fake.clone();
        task(move || {
            fake.enqueued.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    runner
        .schedule(enqueue(), TaskLabel::Fixed("launch"))
        .unwrap();
    // The task ran on the host, but the device has not finished it.
    let event = runner.all_work();
    assert!(event.host_done());
    assert!(!event.is_done());
    // The same position reuses the marker; new work records a new one.
    assert!(Arc::ptr_eq(
        event.marker().unwrap(),
        runner.all_work().marker().unwrap()
    ));
    event.sync().unwrap();
    assert!(event.is_done());
    runner
        .schedule(enqueue(), TaskLabel::Fixed("launch"))
        .unwrap();
    let later = runner.all_work();
    assert!(!Arc::ptr_eq(
        event.marker().unwrap(),
        later.marker().unwrap()
    ));
    assert!(!later.is_done());
    runner.await_work().unwrap();
    assert!(later.is_done());
    // A failure the device reports after enqueueing: the next wait returns it, naming the
    // stream, with the driver's error as its source.
    runner
        .schedule(enqueue(), TaskLabel::Fixed("launch"))
        .unwrap();
    *fake.failure.lock().unwrap() = Some("illegal address".into());
    let failed = runner.all_work();
    let err = failed.sync().unwrap_err();
    assert!(
        matches!(&err, Error::TaskFailed { stream, task, .. }
        if stream == "gpu" && task.contains("queued on the device")),
        "{err}"
    );
    assert!(
        err.root_cause().to_string().contains("illegal address"),
        "{err}"
    );
    let err = runner.await_work().unwrap_err();
    assert!(err.to_string().contains("gpu"), "{err}");
    // A queue needs the Sync scheduler: its tasks only enqueue.
    let err = Runner::new(
        "bad".into(),
        SchedulerKind::Multicore { queue_capacity: 2 },
        Some(Arc::new(FakeHandle(fake.clone()))),
    )
    .unwrap_err();
    assert!(err.to_string().contains("Sync"), "{err}");
}

/// A marker is recorded after the work it stands for: an event taken while another thread
/// runs the stream (so the new task waits, deferred) covers that task's launches, and so does
/// one taken inside a task for its own stream. Before, the marker was recorded at once, ahead
/// of the deferred launches, and a wait on it did not wait for them.
#[test]
fn markers_are_recorded_after_the_deferred_work_they_stand_for() {
    let fake = Arc::new(FakeQueue::default());
    let runner = Arc::new(
        Runner::new(
            "gpu".into(),
            SchedulerKind::Sync,
            Some(Arc::new(FakeHandle(fake.clone()))),
        )
        .unwrap(),
    );
    let enqueue = |fake: &Arc<FakeQueue>| {
        let fake = fake.clone();
        task(move || {
            fake.enqueued.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    // Thread A runs a task that holds the stream until the test lets it go.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let a = {
        let (runner, fake) = (runner.clone(), fake.clone());
        std::thread::spawn(move || {
            runner
                .schedule(
                    task(move || {
                        entered_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                        fake.enqueued.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }),
                    TaskLabel::Fixed("held launch"),
                )
                .unwrap();
        })
    };
    entered_rx.recv().unwrap();
    // This thread's launch waits behind A's task; its event has no marker yet.
    runner
        .schedule(enqueue(&fake), TaskLabel::Fixed("launch"))
        .unwrap();
    let event = runner.all_work();
    assert!(!event.host_done());
    assert!(event.marker().is_none(), "a marker before its work");
    assert_eq!(fake.enqueued.load(Ordering::SeqCst), 0);
    release_tx.send(()).unwrap();
    a.join().unwrap();
    // Both launches are enqueued, and the marker covers both.
    assert_eq!(fake.enqueued.load(Ordering::SeqCst), 2);
    let marker = event.marker().expect("recorded once its work ran");
    let at = marker.as_any().downcast_ref::<FakeMarker>().unwrap().at;
    assert_eq!(at, 2, "the marker was recorded before the deferred launch");
    assert!(!event.is_done());
    event.sync().unwrap();
    assert!(fake.finished.load(Ordering::SeqCst) >= 2);
    // Inside a task: an event of the stream taken there covers that task's own launches,
    // enqueued after the event was taken.
    let inner: Arc<Mutex<Option<Event>>> = Arc::default();
    {
        let (runner2, inner, fake) = (runner.clone(), inner.clone(), fake.clone());
        runner
            .schedule(
                task(move || {
                    *inner.lock().unwrap() = Some(runner2.all_work());
                    fake.enqueued.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }),
                TaskLabel::Fixed("launch taking an event"),
            )
            .unwrap();
    }
    let inner = inner.lock().unwrap().take().unwrap();
    let at = inner
        .marker()
        .unwrap()
        .as_any()
        .downcast_ref::<FakeMarker>()
        .unwrap()
        .at;
    assert_eq!(at, 3);
    runner.await_work().unwrap();
}

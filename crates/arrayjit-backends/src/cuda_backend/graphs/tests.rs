//! The graph cache's rules on a fake stream that logs every driver call.

use std::cell::{Cell, RefCell};

use super::*;

/// A stream that captures, instantiates and updates graphs of named launches; a graph is the
/// list of launches captured, an instantiated graph the list it runs.
#[derive(Default)]
struct FakeStream {
    capturing: Cell<bool>,
    captured: RefCell<Vec<String>>,
    /// Launches that ran on the "device", in order.
    ran: RefCell<Vec<String>>,
    /// Driver calls, in order.
    calls: RefCell<Vec<&'static str>>,
    /// The next capture is invalidated (as when another thread synchronizes the context).
    invalidate_next: Cell<bool>,
    /// Beginning a capture fails for good (a driver without graphs).
    no_graphs: Cell<bool>,
    /// Updates are refused (another shape of launches).
    refuse_updates: Cell<bool>,
}

/// An instantiated fake graph (shared so an update is seen by later launches).
struct FakeExec(std::sync::Mutex<Vec<String>>);

impl FakeStream {
    /// Enqueues a launch: captured while capturing, else run.
    fn enqueue(&self, name: &str) -> Result<()> {
        if self.capturing.get() {
            self.captured.borrow_mut().push(name.to_string());
        } else {
            self.ran.borrow_mut().push(name.to_string());
        }
        Ok(())
    }

    fn count(&self, call: &str) -> usize {
        self.calls.borrow().iter().filter(|c| **c == call).count()
    }
}

fn failure(recurs: bool) -> CaptureFailure {
    CaptureFailure {
        error: Box::new(Error::invalid("fake driver failure")),
        recurs,
    }
}

impl CaptureDriver for FakeStream {
    type Graph = Vec<String>;
    type Exec = FakeExec;

    fn begin_capture(&self) -> std::result::Result<(), CaptureFailure> {
        self.calls.borrow_mut().push("begin");
        if self.no_graphs.get() {
            return Err(failure(true));
        }
        assert!(!self.capturing.get(), "a capture begun inside another");
        self.capturing.set(true);
        self.captured.borrow_mut().clear();
        Ok(())
    }

    fn end_capture(&self) -> std::result::Result<Self::Graph, CaptureFailure> {
        self.calls.borrow_mut().push("end");
        assert!(self.capturing.get(), "a capture ended twice");
        self.capturing.set(false);
        let graph = std::mem::take(&mut *self.captured.borrow_mut());
        if self.invalidate_next.replace(false) {
            return Err(failure(false));
        }
        Ok(graph)
    }

    fn instantiate(&self, graph: &Self::Graph) -> std::result::Result<FakeExec, CaptureFailure> {
        self.calls.borrow_mut().push("instantiate");
        Ok(FakeExec(std::sync::Mutex::new(graph.clone())))
    }

    fn update(
        &self,
        exec: &FakeExec,
        graph: &Self::Graph,
    ) -> std::result::Result<bool, CaptureFailure> {
        self.calls.borrow_mut().push("update");
        if self.refuse_updates.get() {
            return Ok(false);
        }
        *exec.0.lock().unwrap() = graph.clone();
        Ok(true)
    }

    fn launch(&self, exec: &FakeExec) -> Result<()> {
        self.calls.borrow_mut().push("graph");
        self.ran
            .borrow_mut()
            .extend(exec.0.lock().unwrap().iter().cloned());
        Ok(())
    }

    fn label(&self) -> String {
        "fake:0".into()
    }
}

/// A routine's launches with a `batch` static: the zeroing and three passes.
fn passes(stream: &FakeStream, batch: u64) -> Result<()> {
    stream.enqueue("zero scratch")?;
    for p in ["embed", "attend", "update"] {
        stream.enqueue(&format!("{p} batch={batch}"))?;
    }
    Ok(())
}

fn key(batch: u64) -> Vec<u64> {
    vec![0x7000_0000, 0x7100_0000, batch]
}

/// 100 runs whose `batch` static changes every time: one instantiation, then updates in
/// place; every run's launches run with its own static; the stream never stays capturing.
#[test]
fn a_static_that_changes_every_run_updates_the_graph_in_place() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    for batch in 0..100 {
        cache
            .run((0, 0, 1), &stream, key(batch), || passes(&stream, batch))
            .unwrap();
        let ran = stream.ran.borrow();
        assert_eq!(ran[ran.len() - 1], format!("update batch={batch}"));
    }
    let counts = cache.counts();
    assert_eq!(counts.instantiations, 1, "{counts:?}");
    assert_eq!(counts.updates, 99, "{counts:?}");
    assert_eq!(counts.graph_launches, 100, "{counts:?}");
    assert_eq!(counts.plain_runs, 0, "{counts:?}");
    assert_eq!(stream.count("instantiate"), 1);
    assert_eq!(stream.ran.borrow().len(), 400);
    assert!(!stream.capturing.get());
}

/// The same arguments replay the kept graph: one capture, one instantiation.
#[test]
fn the_same_arguments_replay_the_graph() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    for _ in 0..10 {
        cache
            .run((0, 0, 1), &stream, key(7), || passes(&stream, 7))
            .unwrap();
    }
    let counts = cache.counts();
    assert_eq!((counts.captures, counts.instantiations), (1, 1));
    assert_eq!(counts.graph_launches, 10);
    assert_eq!(stream.ran.borrow().len(), 40);
    // Another stream (or kernel) keeps a graph of its own.
    cache
        .run((0, 0, 2), &stream, key(7), || passes(&stream, 7))
        .unwrap();
    assert_eq!(cache.counts().instantiations, 2);
}

/// An invalidated capture: that run launches its passes plainly (they run once), and the next
/// run captures again; graphs stay on.
#[test]
fn an_invalidated_capture_runs_plainly_that_run_and_graphs_stay_on() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    stream.invalidate_next.set(true);
    cache
        .run((0, 0, 1), &stream, key(1), || passes(&stream, 1))
        .unwrap();
    assert_eq!(stream.ran.borrow().len(), 4, "the run's passes ran once");
    assert_eq!(cache.counts().plain_runs, 1);
    cache
        .run((0, 0, 1), &stream, key(1), || passes(&stream, 1))
        .unwrap();
    let counts = cache.counts();
    assert_eq!((counts.instantiations, counts.graph_launches), (1, 1));
    assert_eq!(stream.ran.borrow().len(), 8);
}

/// A driver without graphs: graphs are turned off for the batch; every run launches plainly
/// without trying again.
#[test]
fn a_driver_without_graphs_turns_them_off_for_good() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    stream.no_graphs.set(true);
    for batch in 0..3 {
        cache
            .run((0, 0, 1), &stream, key(batch), || passes(&stream, batch))
            .unwrap();
    }
    assert_eq!(stream.count("begin"), 1);
    assert_eq!(cache.counts().plain_runs, 3);
    assert_eq!(stream.ran.borrow().len(), 12);
}

/// A launch that fails inside the capture: the capture is ended, nothing captured ran, and the
/// passes run plainly; their error is the run's. A panic inside the capture ends it too.
#[test]
fn a_failing_or_panicking_launch_never_leaves_the_stream_capturing() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    let tries = Cell::new(0);
    let err = cache
        .run((0, 0, 1), &stream, key(1), || {
            tries.set(tries.get() + 1);
            stream.enqueue("zero scratch")?;
            Err(Error::invalid("launch refused"))
        })
        .unwrap_err();
    assert!(err.to_string().contains("launch refused"), "{err}");
    assert_eq!(tries.get(), 2, "captured once, then launched plainly");
    assert_eq!(*stream.ran.borrow(), ["zero scratch"]);
    assert!(!stream.capturing.get());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cache.run((0, 0, 1), &stream, key(2), || -> Result<()> {
            stream.enqueue("zero scratch")?;
            panic!("a kernel argument could not be built")
        })
    }));
    assert!(panicked.is_err());
    assert!(!stream.capturing.get(), "the capture was left open");
    assert_eq!(stream.count("begin"), stream.count("end"));
    // The cache still works after the panic.
    cache
        .run((0, 0, 1), &stream, key(3), || passes(&stream, 3))
        .unwrap();
    assert_eq!(cache.counts().instantiations, 1);
}

/// An update the driver refuses (the launches' shape changed): instantiated anew, once.
#[test]
fn a_refused_update_instantiates_anew() {
    let stream = FakeStream::default();
    let cache = GraphCache::<FakeExec>::default();
    cache
        .run((0, 0, 1), &stream, key(1), || passes(&stream, 1))
        .unwrap();
    stream.refuse_updates.set(true);
    cache
        .run((0, 0, 1), &stream, key(2), || passes(&stream, 2))
        .unwrap();
    let counts = cache.counts();
    assert_eq!((counts.instantiations, counts.updates), (2, 0));
    assert_eq!(
        stream.ran.borrow().last().map(String::as_str),
        Some("update batch=2")
    );
}

//! Regression tests for stream failure semantics and host synchronisation (reliability issue,
//! items 7–11 and 24): panics become task errors, failures travel with events, what is skipped
//! after a failure is deterministic, writers wait for readers, and `to_host` reads the copy
//! asked for.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::time::Duration;

use arrayjit::Error;
use arrayjit::prelude::*;

mod common;
use common::{hosted_input, hosted_output};

fn multicore() -> Backend {
    arrayjit::backend("multicore_cc").unwrap()
}

#[test]
fn item07_a_panicking_task_fails_its_event_and_the_worker_keeps_serving() {
    for name in ["multicore_cc", "sync_cc"] {
        let b = arrayjit::backend(name).unwrap();
        let dev = b.get_device(0).unwrap();
        let (s, waiter) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
        let scheduled = s.schedule_task(|| panic!("boom"));
        let event = s.all_work();
        let err = match scheduled {
            Err(e) => e, // sync: the failing schedule reports it at once
            Ok(()) => s.await_work().unwrap_err(),
        };
        let Error::TaskFailed { stream, task, .. } = &err else {
            panic!("{name}: expected TaskFailed, got {err}");
        };
        assert_eq!(stream, &s.name());
        assert!(task.contains("host task"), "{task}");
        assert!(
            matches!(err.root_cause(), Error::TaskPanicked { message } if message == "boom"),
            "{err}"
        );
        // The event completed, and carries the failure.
        assert!(event.is_done());
        assert!(matches!(event.sync(), Err(Error::TaskFailed { .. })));
        // A stream waiting on it fails instead of hanging.
        let waited = waiter
            .will_wait_for(&event)
            .and_then(|()| waiter.await_work());
        assert!(
            matches!(&waited, Err(Error::UpstreamFailed { origin_stream, .. }) if *origin_stream == s.name()),
            "{name}: {waited:?}"
        );
        // The worker keeps serving.
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        s.schedule_task(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        s.await_work().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn item08_failures_propagate_across_streams_through_events() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (a, bs) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let (release, gate) = channel::<()>();
    a.schedule_task(move || {
        gate.recv().ok();
        Err(Error::invalid("the producer broke"))
    })
    .unwrap();
    // A routine on A that the failure makes A skip: its output is never produced.
    let x = hosted_input(&[3], "x", &[1.0, -2.0, 3.0]);
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "produce",
            &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
        ))
        .unwrap();
    let ra = Context::new(&a).link(&code).unwrap();
    ra.run().unwrap();
    // B waits for A's work, then runs a task that must not run on stale inputs.
    bs.will_wait_for(&a.all_work()).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    bs.schedule_task(move || {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    release.send(()).unwrap();
    let err = bs.await_work().unwrap_err();
    match &err {
        Error::UpstreamFailed {
            stream,
            origin_stream,
            origin_task,
            ..
        } => {
            assert_eq!(stream, &bs.name());
            assert_eq!(origin_stream, &a.name());
            assert!(origin_task.starts_with("#1 "), "{origin_task}");
        }
        other => panic!("expected UpstreamFailed, got {other}"),
    }
    assert!(err.to_string().contains("the producer broke"), "{err}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "B's task ran on stale inputs"
    );
    // A transfer of the node A should have produced fails too, naming A.
    let ctx_b = Context::new(&bs).link(&code).unwrap();
    let moved = ctx_b
        .context()
        .device_to_device(&y, MergeBufferUse::No, ra.context())
        .and_then(|()| bs.await_work());
    assert!(
        matches!(&moved, Err(Error::UpstreamFailed { origin_stream, .. }) if *origin_stream == a.name()),
        "{moved:?}"
    );
    assert!(matches!(a.await_work(), Err(Error::TaskFailed { .. })));
}

#[test]
fn item09_what_runs_after_a_failure_is_deterministic() {
    for _ in 0..3 {
        let b = multicore();
        let s = b.get_device(0).unwrap().new_stream().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let mut reported_at = None;
        let mut accepted_after = 0;
        for i in 1..=2000usize {
            let r = ran.clone();
            let result = s.schedule_task(move || {
                if i == 500 {
                    return Err(Error::invalid("task 500 fails"));
                }
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            match result {
                Err(e) => {
                    assert!(reported_at.is_none(), "reported twice: {e}");
                    assert!(e.to_string().contains("task 500 fails"), "{e}");
                    reported_at = Some(i);
                }
                Ok(()) if reported_at.is_some() => accepted_after += 1,
                Ok(()) => {}
            }
        }
        let awaited = s.await_work();
        assert_eq!(awaited.is_err(), reported_at.is_none(), "{awaited:?}");
        // Tasks 1..499 ran, 500 failed, everything after it was skipped until the failure was
        // reported, and every task accepted after the report ran.
        assert_eq!(ran.load(Ordering::SeqCst), 499 + accepted_after);
    }
}

#[test]
fn item09_results_of_failed_work_are_errors_until_recomputed() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let x = hosted_input(&[3], "x", &[1.0, -2.0, 3.0]);
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "relu",
            &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
        ))
        .unwrap();
    let r = Context::new(&s).link(&code).unwrap();
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![1.0, 0.0, 3.0]);
    x.host().set_values(&[-5.0, 6.0, -7.0]).unwrap();
    let (release, gate) = channel::<()>();
    s.schedule_task(move || {
        gate.recv().ok();
        Err(Error::invalid("upstream broke"))
    })
    .unwrap();
    r.run().unwrap(); // skipped: the task before it fails
    release.send(()).unwrap();
    assert!(matches!(s.await_work(), Err(Error::TaskFailed { .. })));
    // The failure was reported, but y was never recomputed: reading it is an error, every
    // time, rather than the stale [1, 0, 3].
    for _ in 0..2 {
        let err = y.host().get_values().unwrap_err();
        assert!(err.to_string().contains("upstream broke"), "{err}");
    }
    // Recomputing it makes it readable again.
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![0.0, 6.0, 0.0]);
}

#[test]
fn item10_a_writer_waits_for_pending_readers_on_other_streams() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (sa, sb) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_input(&[4], "x", &[1.0, 2.0, 3.0, 4.0]);
    let shared = Tnode::new(Prec::F32, &[4], &["shared"]).unwrap();
    shared
        .update_memory_mode(
            MemoryMode::OnDevice(Sharing::SharedCrossStreams),
            "test: shared",
        )
        .unwrap();
    let out = hosted_output(&[4], "out");
    let write = b
        .compile(CompileRequest::routine(
            "write",
            &Assignments::pointwise_unop(&shared, UnOp::Neg, &x),
        ))
        .unwrap();
    let read = b
        .compile(CompileRequest::routine(
            "read",
            &Assignments::pointwise_unop(&out, UnOp::Identity, &shared),
        ))
        .unwrap();
    let writer = Context::new(&sa).link(&write).unwrap();
    let reader = Context::new(&sb).link(&read).unwrap();
    writer.run().unwrap();
    // The reader is held back on its stream; the next write must wait for it.
    let (release, gate) = channel::<()>();
    sb.schedule_task(move || {
        gate.recv().ok();
        Ok(())
    })
    .unwrap();
    reader.run().unwrap();
    x.host().set_values(&[10.0, 20.0, 30.0, 40.0]).unwrap();
    writer.run().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !sa.is_idle(),
        "the writer overwrote a node another stream has yet to read"
    );
    release.send(()).unwrap();
    sb.await_work().unwrap();
    sa.await_work().unwrap();
    assert_eq!(
        out.host().get_values().unwrap(),
        vec![-1.0, -2.0, -3.0, -4.0]
    );
}

#[test]
fn item11_to_host_reads_the_copy_asked_for() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (sa, sb) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_input(&[2], "x", &[1.0, 2.0]);
    let y = hosted_output(&[2], "y");
    let code = b
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let ra = Context::new(&sa).link(&code).unwrap();
    let rb = Context::new(&sb).link(&code).unwrap();
    ra.run().unwrap();
    x.host().set_values(&[5.0, 6.0]).unwrap();
    rb.run().unwrap();
    ra.context().to_host(&y).unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-1.0, -2.0]);
    rb.context().to_host(&y).unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-5.0, -6.0]);
}

#[test]
fn item24_task_errors_keep_their_cause() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    s.schedule_task(|| {
        Err(Error::out_of_bounds(
            "typed",
            arrayjit::ir::OutOfBounds::Element { index: 3, len: 2 },
        ))
    })
    .unwrap();
    let err = s.await_work().unwrap_err();
    let Error::TaskFailed { source, .. } = &err else {
        panic!("expected TaskFailed, got {err}");
    };
    assert!(
        matches!(**source, Error::IndexOutOfBounds { .. }),
        "{source}"
    );
    assert!(matches!(err.root_cause(), Error::IndexOutOfBounds { .. }));
    // The standard source chain has it too.
    let chained = std::error::Error::source(&err).expect("a source");
    assert_eq!(chained.to_string(), source.to_string());
    assert!(err.to_string().contains(&s.name()), "{err}");
}

//! Streams, events and host/device synchronisation on the `multicore_cc` backend (and, where
//! the semantics are shared, on `sync_cc`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrayjit::Error;
use arrayjit::prelude::*;

mod common;
use arrayjit::runtime::{ArrayAccess, RuntimeConfig, Strategy, backend_with_config};
use common::{hosted_input, hosted_output};

#[path = "streams/merge_buffers.rs"]
mod merge_buffers;

fn multicore() -> Backend {
    arrayjit::backend("multicore_cc").unwrap()
}

#[test]
fn events_complete_in_order_and_sync_blocks() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let g = gate.clone();
    s.schedule_task(move || {
        drop(g.lock().unwrap());
        Ok(())
    })
    .unwrap();
    let first = s.all_work();
    let counter = Arc::new(AtomicUsize::new(0));
    let c = counter.clone();
    s.schedule_task(move || {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    let second = s.all_work();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!first.is_done() && !second.is_done() && !s.is_idle());
    drop(held);
    second.sync().unwrap();
    assert!(first.is_done() && second.is_done());
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    s.await_work().unwrap();
    assert!(s.is_idle());
    assert!(s.debug_info().contains("2 finished"), "{}", s.debug_info());
}

#[test]
fn will_wait_for_orders_work_across_streams() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (a, c) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    a.schedule_task(move || {
        std::thread::sleep(Duration::from_millis(30));
        l.lock().unwrap().push("a");
        Ok(())
    })
    .unwrap();
    c.will_wait_for(&a.all_work()).unwrap();
    let l = log.clone();
    c.schedule_task(move || {
        l.lock().unwrap().push("c");
        Ok(())
    })
    .unwrap();
    c.await_work().unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["a", "c"]);
}

#[test]
fn a_failed_task_is_reported_with_the_stream_name_and_others_keep_working() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (bad, good) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    bad.schedule_task(|| Err(Error::invalid("the host task broke")))
        .unwrap();
    let skipped = Arc::new(AtomicUsize::new(0));
    let s2 = skipped.clone();
    // Scheduling may race with the failure: either it is refused, or the task is skipped.
    let refused = bad.schedule_task(move || {
        s2.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    good.schedule_task(move || {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    good.await_work().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // The error is reported once: by the refused schedule if the failure came first, else by
    // the await.
    let err = match refused {
        Err(e) => {
            bad.await_work().unwrap();
            e
        }
        Ok(()) => bad.await_work().unwrap_err(),
    };
    let msg = err.to_string();
    assert!(
        msg.contains(&bad.name()) && msg.contains("the host task broke"),
        "{msg}"
    );
    assert_eq!(skipped.load(Ordering::SeqCst), 0);
    // The error was reported once; the stream works again.
    bad.schedule_task(|| Ok(())).unwrap();
    bad.await_work().unwrap();
}

#[test]
fn the_next_schedule_returns_a_pending_error() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    s.schedule_task(|| Err(Error::invalid("boom"))).unwrap();
    assert!(
        s.all_work().sync().is_err(),
        "the event of a failed task is failed"
    );
    let err = s.schedule_task(|| Ok(())).unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
}

#[test]
fn dropping_a_stream_finishes_queued_work_and_joins_its_thread() {
    let b = multicore();
    let done = Arc::new(AtomicUsize::new(0));
    {
        let s = b.get_device(0).unwrap().new_stream().unwrap();
        for _ in 0..50 {
            let d = done.clone();
            s.schedule_task(move || {
                std::thread::sleep(Duration::from_micros(200));
                d.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        }
    }
    assert_eq!(done.load(Ordering::SeqCst), 50);
}

/// Regression (issue 22, defect 3): `is_idle` means no work pending, the device's included,
/// on every backend: never true while `all_work()` is not done.
#[test]
fn is_idle_means_no_work_pending_device_included() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let s = b.get_device(0).unwrap().new_stream().unwrap();
        assert!(s.is_idle(), "{name}: a new stream is idle");
        let (case, ..) = arrayjit_testing::matmul(256).unwrap();
        let code = b
            .compile(CompileRequest::routine("matmul", &case.program))
            .unwrap();
        let r = Context::new(&s).link(&code).unwrap();
        for _ in 0..5 {
            if b.scheduler() != arrayjit::runtime::scheduler::SchedulerKind::Sync {
                // Hold the worker so that work is certainly pending.
                s.schedule_task(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(())
                })
                .unwrap();
            }
            r.run().unwrap();
            // Sampled in this order, idle-then-not-done is a contradiction (done stays done).
            let idle = s.is_idle();
            let done = s.all_work().is_done();
            assert!(
                !idle || done,
                "{name}: is_idle while all_work() is not done"
            );
            if b.scheduler() != arrayjit::runtime::scheduler::SchedulerKind::Sync {
                assert!(!idle, "{name}: idle while a task sleeps");
            }
            s.await_work().unwrap();
            assert!(s.is_idle() && s.all_work().is_done(), "{name}");
        }
    }
}

#[test]
fn a_full_queue_applies_backpressure() {
    let config = RuntimeConfig {
        queue_capacity: 2,
        ..Default::default()
    };
    let b = backend_with_config("multicore_cc", &config).unwrap();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    for _ in 0..20 {
        let c = count.clone();
        s.schedule_task(move || {
            std::thread::sleep(Duration::from_millis(1));
            c.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    }
    // With a queue of 2, scheduling 20 tasks had to wait for most of them to run.
    assert!(
        count.load(Ordering::SeqCst) >= 17,
        "{}",
        count.load(Ordering::SeqCst)
    );
    s.await_work().unwrap();
}

#[test]
fn strategies_steer_the_suggested_number_of_streams() {
    let n = |name: &str, strategy| {
        let config = RuntimeConfig {
            strategy,
            num_devices: Some(2),
            ..Default::default()
        };
        let b = backend_with_config(name, &config).unwrap();
        assert_eq!(b.num_devices(), 2);
        b.get_device(1).unwrap().suggested_num_streams()
    };
    assert_eq!(n("multicore_cc", Strategy::OnlyDevicesParallel), 1);
    let config = RuntimeConfig {
        strategy: Strategy::ForParallelCopying,
        ..Default::default()
    };
    let b = arrayjit::runtime::initialize_with_config(Some("multicore_cc"), &config).unwrap();
    assert_eq!(b.get_device(0).unwrap().suggested_num_streams(), 2);
    assert_eq!(n("multicore_cc", Strategy::ForParallelCopying), 2);
    assert!(n("multicore_cc", Strategy::MostParallelStreams) >= 1);
    assert_eq!(n("sync_cc", Strategy::MostParallelStreams), 1);
}

/// `acc += g` read from the stream's merge buffer, elementwise.
fn add_merge_buffer(acc: &Tnode, g: &Tnode) -> Assignments {
    Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Add,
        lhs: acc.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Merge(g.clone())),
        projections: Projections::pointwise(g.dims(), 1),
    }
}

/// The CPU backends, and `wgpu` and `cuda` where they can run here (their streams enqueue on
/// device queues: events and waits go through device markers).
fn backends_with_streams() -> Vec<Backend> {
    arrayjit_testing::backends_under_test(&["sync_cc", "multicore_cc", "cuda_emu", "wgpu", "cuda"])
        .unwrap()
}

#[test]
fn hosted_results_reach_the_host_when_read_and_host_writes_reach_devices() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let x = hosted_input(&[3], "x", &[1.0, 2.0, 3.0]);
        let y = hosted_output(&[3], "y");
        let code = b
            .compile(CompileRequest::routine(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
            ))
            .unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let r = Context::new(&stream).link(&code).unwrap();
        r.run().unwrap();
        // No explicit to_host: reading waits for the device and transfers.
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![2.0, 4.0, 6.0],
            "{name}"
        );
        // Writing the input on the host makes the device reload it before the next run.
        x.host().set_values(&[10.0, 20.0, 30.0]).unwrap();
        assert!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copies_not_lagging_host()
                .is_empty()
        );
        r.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![20.0, 40.0, 60.0],
            "{name}"
        );
        assert_eq!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copies_not_lagging_host(),
            vec![r.context().copy_id(&x).unwrap()]
        );
    }
}

#[test]
fn a_hosted_node_changed_on_one_device_reaches_another_through_the_host() {
    let config = RuntimeConfig {
        num_devices: Some(2),
        ..Default::default()
    };
    let b = backend_with_config("multicore_cc", &config).unwrap();
    let x = hosted_input(&[2], "x", &[1.0, 2.0]);
    let w = hosted_input(&[2], "w", &[0.0, 0.0]);
    let y = hosted_output(&[2], "y");
    let write_w = b
        .compile(CompileRequest::routine(
            "write_w",
            &Assignments::pointwise_binop(&w, BinOp::Mul, &x, &x),
        ))
        .unwrap();
    let read_w = b
        .compile(CompileRequest::routine(
            "read_w",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &w),
        ))
        .unwrap();
    let s0 = b.get_device(0).unwrap().new_stream().unwrap();
    let s1 = b.get_device(1).unwrap().new_stream().unwrap();
    let r0 = Context::new(&s0).link(&write_w).unwrap();
    let r1 = Context::new(&s1).link(&read_w).unwrap();
    r0.run().unwrap();
    // Device 1 lags: its run first pulls w to the host from device 0, then uploads it.
    r1.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-1.0, -4.0]);
    // A host write of the node devices change (a deliberate difference from the reference's
    // "changes on host only via to_host"): both devices' copies lag and reload.
    w.host().set_values(&[3.0, 5.0]).unwrap();
    r1.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-3.0, -5.0]);
    w.host().set_value(&[1], 6.0).unwrap();
    r1.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-3.0, -6.0]);
    // Device 0 writes it again; device 1 pulls the new values through the host.
    r0.run().unwrap();
    r1.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-1.0, -4.0]);
    assert_eq!(w.host().get_values().unwrap(), vec![1.0, 4.0]);
}

/// Regression (issue 22, defect 2): a task that schedules onto its own stream, past a full
/// queue, must not hang; the work it schedules runs after it, in order. Run in a thread with
/// a deadline so that a hang fails the test.
#[test]
fn a_task_scheduling_onto_its_own_full_stream_does_not_deadlock() {
    for (name, capacity) in [("multicore_cc", 1), ("multicore_cc", 2), ("sync_cc", 1)] {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let config = RuntimeConfig {
                queue_capacity: capacity,
                ..Default::default()
            };
            let b = backend_with_config(name, &config).unwrap();
            let s = b.get_device(0).unwrap().new_stream().unwrap();
            let log = Arc::new(Mutex::new(Vec::new()));
            let (inner, l) = (s.clone(), log.clone());
            s.schedule_task(move || {
                for k in 0..3 {
                    let l = l.clone();
                    inner.schedule_task(move || {
                        l.lock().unwrap().push(format!("inner {k}"));
                        Ok(())
                    })?;
                }
                // Waiting inside the task for what it scheduled is an error, not a hang.
                let err = inner.all_work().sync().unwrap_err();
                assert!(err.to_string().contains("wait from another"), "{err}");
                l.lock().unwrap().push("outer".to_string());
                Ok(())
            })
            .unwrap();
            // The first wait covers the outer task; the inner ones are scheduled while it runs,
            // so once it has ended the second wait covers them.
            s.await_work().unwrap();
            s.await_work().unwrap();
            let _ = done_tx.send(log.lock().unwrap().clone());
        });
        let log = done_rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{name} (queue of {capacity}) deadlocked"));
        assert_eq!(
            log,
            ["outer", "inner 0", "inner 1", "inner 2"],
            "{name}: work a task schedules runs after it, in order"
        );
    }
}

/// Tasks scheduled on a context's array reach its bytes only through `ScheduledArray`, ordered
/// after the writer and before later readers; a read-only task cannot change them.
#[test]
fn tasks_on_an_array_read_and_update_it_in_order() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let s = b.get_device(0).unwrap().new_stream().unwrap();
        let x = hosted_input(&[3], "x", &[1.0, 2.0, 3.0]);
        let g = Tnode::new(Prec::F32, &[3], &["g"]).unwrap();
        g.update_memory_mode(
            MemoryMode::OnDevice(Sharing::PerStream),
            "test: device array",
        )
        .unwrap();
        let y = hosted_output(&[3], "y");
        let make = b
            .compile(CompileRequest::routine(
                "make",
                &Assignments::pointwise_unop(&g, UnOp::Identity, &x),
            ))
            .unwrap();
        let read = b
            .compile(CompileRequest::routine(
                "read",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &g),
            ))
            .unwrap();
        let rm = Context::new(&s).link(&make).unwrap();
        let rr = rm.context().link(&read).unwrap();
        rm.run().unwrap();
        let f32s = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        rr.context()
            .schedule_on_array(&g, &s, ArrayAccess::ReadWrite, "triple", move |array| {
                array.read(|bytes| *seen2.lock().unwrap() = f32s(bytes))?;
                array.update(|bytes| {
                    let tripled: Vec<u8> = f32s(bytes)
                        .iter()
                        .flat_map(|v| (3.0 * v).to_ne_bytes())
                        .collect();
                    bytes.copy_from_slice(&tripled);
                    Ok(())
                })
            })
            .unwrap();
        rr.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![-3.0, -6.0, -9.0],
            "{name}"
        );
        assert_eq!(*seen.lock().unwrap(), vec![1.0, 2.0, 3.0], "{name}");
        // A read-only task that tries to change the array fails, and the array is unchanged.
        // (A Sync stream reports the failure at once, others when awaited.)
        let err = rr
            .context()
            .schedule_on_array(&g, &s, ArrayAccess::Read, "sneaky", |array| {
                array.update(|bytes| {
                    bytes.fill(0);
                    Ok(())
                })
            })
            .and_then(|()| s.await_work())
            .unwrap_err();
        assert!(
            err.to_string().contains("ArrayAccess::Read"),
            "{name}: {err}"
        );
        rr.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![-3.0, -6.0, -9.0],
            "{name}"
        );
    }
}

/// A `Sync` stream used from several threads runs one task at a time, in an order that
/// matches its events: tasks scheduled while another thread's task runs are run by that thread
/// after it (the scheduling call returns at once), and every task is counted once.
#[test]
fn a_sync_stream_scheduled_from_two_threads_runs_one_task_at_a_time() {
    use std::sync::atomic::AtomicBool;
    let b = arrayjit::backend("sync_cc").unwrap();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let busy = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (s, busy, overlaps, ran) = (s.clone(), busy.clone(), overlaps.clone(), ran.clone());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let (busy, overlaps, ran) = (busy.clone(), overlaps.clone(), ran.clone());
                    s.schedule_task(move || {
                        if busy.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_micros(20));
                        ran.fetch_add(1, Ordering::SeqCst);
                        busy.store(false, Ordering::SeqCst);
                        Ok(())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    s.await_work().unwrap();
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two tasks of one stream ran at once"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 400);
    assert!(s.is_idle() && s.all_work().is_done());
    assert_eq!(s.scheduled_tasks(), 400);
    assert!(
        s.debug_info().contains("400 finished"),
        "{}",
        s.debug_info()
    );
}

#[test]
fn shared_nodes_may_be_written_from_one_stream_only() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_input(&[2], "x", &[1.0, 2.0]);
    let table = Tnode::new(Prec::F32, &[2], &["table"]).unwrap();
    table
        .update_memory_mode(
            MemoryMode::OnDevice(Sharing::SharedCrossStreams),
            "test: shared",
        )
        .unwrap();
    let y = hosted_output(&[2], "y");
    let fill = b
        .compile(CompileRequest::routine(
            "fill",
            &Assignments::pointwise_unop(&table, UnOp::Neg, &x),
        ))
        .unwrap();
    let read = b
        .compile(CompileRequest::routine(
            "read",
            &Assignments::pointwise_unop(&y, UnOp::Abs, &table),
        ))
        .unwrap();
    let r1 = Context::new(&s1).link(&fill).unwrap();
    r1.run().unwrap();
    // Another stream reads the same array (no copy) after the writer.
    let r2 = Context::new(&s2).link(&read).unwrap();
    r2.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![1.0, 2.0]);
    // But may not write it.
    let err = Context::new(&s2).link(&fill).unwrap_err();
    assert!(err.to_string().contains("shared across streams"), "{err}");
}

#[test]
fn per_stream_copies_of_a_hosted_node_on_one_device_stay_consistent() {
    let b = multicore();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_input(&[2], "x", &[1.0, 2.0]);
    let w = hosted_input(&[2], "w", &[0.0, 0.0]);
    let y = hosted_output(&[2], "y");
    let write_w = b
        .compile(CompileRequest::routine(
            "write_w",
            &Assignments::pointwise_binop(&w, BinOp::Add, &x, &x),
        ))
        .unwrap();
    let read_w = b
        .compile(CompileRequest::routine(
            "read_w",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &w),
        ))
        .unwrap();
    let r1 = Context::new(&s1).link(&write_w).unwrap();
    let r2 = Context::new(&s2).link(&read_w).unwrap();
    assert_ne!(
        r1.context().copy_id(&w).unwrap(),
        r2.context().copy_id(&w).unwrap()
    );
    r1.run().unwrap();
    // Stream 2's copy lags although it is on the same device: it is refreshed before the run.
    r2.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-2.0, -4.0]);
}

#[test]
fn init_from_host_puts_a_hosted_node_in_a_child_context() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let ctx = Context::new(&s);
    let x = hosted_input(&[3], "x", &[4.0, 5.0, 6.0]);
    let child = ctx.init_from_host(&x).unwrap();
    assert!(child.has(&x) && !ctx.has(&x));
    assert_eq!(child.parent().unwrap().describe(), ctx.describe());
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "sqrt",
            &Assignments::pointwise_unop(&y, UnOp::Sqrt, &x),
        ))
        .unwrap();
    let r = child.link(&code).unwrap();
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap()[0], 2.0);
    let not_hosted = Tnode::new(Prec::F32, &[3], &["nh"]).unwrap();
    assert!(matches!(
        ctx.init_from_host(&not_hosted),
        Err(Error::NotHosted { .. })
    ));
}

#[test]
fn a_task_reading_its_own_streams_results_does_not_deadlock() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let x = hosted_input(&[2], "x", &[3.0, 4.0]);
    let y = hosted_output(&[2], "y");
    let code = b
        .compile(CompileRequest::routine(
            "square",
            &Assignments::pointwise_binop(&y, BinOp::Mul, &x, &x),
        ))
        .unwrap();
    let r = Context::new(&s).link(&code).unwrap();
    r.run().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (y2, seen2, s2) = (y.clone(), seen.clone(), s.clone());
    s.schedule_task(move || {
        // Reading the hosted result inside a later task of the same stream copies directly.
        seen2.lock().unwrap().extend(y2.host().get_values()?);
        // Awaiting one's own stream is an error, not a hang.
        assert!(matches!(
            s2.await_work(),
            Err(arrayjit::Error::SelfWait { position: None, .. })
        ));
        Ok(())
    })
    .unwrap();
    s.await_work().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![9.0, 16.0]);
}

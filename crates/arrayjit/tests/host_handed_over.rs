//! Host arrays handed to devices (rule 6 of the runtime's `host_sync`): on the CPU backends
//! the first array of a node that devices change is made of its host array itself, without a
//! copy; the host array is made again from it at the host's next read. Checked on every
//! backend with streams available here (those that do not hand arrays over must give the same
//! values): the values the host and other streams see, host writes meanwhile, links that fail
//! or are abandoned, and the switch that turns it off.

use std::sync::Arc;

use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::opt::OptimizeCtx;
use arrayjit::prelude::*;

mod common;
use common::{hosted_input, hosted_output, update_program};

/// The CPU backends, and `wgpu` and `cuda` where they can run here.
fn backends() -> Vec<Backend> {
    arrayjit_testing::backends_under_test(&["sync_cc", "multicore_cc", "cuda_emu", "wgpu", "cuda"])
        .unwrap()
}

/// Whether the backend makes device arrays of host arrays.
fn hands_over(b: &Backend) -> bool {
    b.lowered().runtime().adopts_host_arrays()
}

/// A hosted parameter `w` the routine changes, with its host values.
fn parameter(label: &str, values: &[f64]) -> Tnode {
    let w = hosted_input(&[values.len()], label, values);
    w.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "test: a parameter",
    )
    .unwrap();
    w
}

#[test]
fn a_parameter_becomes_its_array_and_the_host_gets_its_values_back() {
    let mut handing = 0;
    for b in backends() {
        let name = b.name().to_string();
        let (prog, x, w, y) = update_program();
        let device = b.get_device(0).unwrap();
        let before = device.used_memory();
        let routine = Context::new(&device.new_stream().unwrap())
            .link(&b.compile(CompileRequest::routine("update", &prog)).unwrap())
            .unwrap();
        if hands_over(&b) {
            handing += 1;
            assert!(w.host().is_on_device(), "{name}: w was copied");
            assert!(
                w.host().exists(),
                "{name}: a handed-over array still exists"
            );
            assert!(w.host().with(|_| ()).is_none(), "{name}: the host kept w");
            assert!(w.debug_info().contains("handed to a device copy"), "{name}");
            assert!(w.debug_info().contains("no copy"), "{name}");
            // `x` is only read: it is not changed on devices, and keeps its host array.
            assert!(!x.host().is_on_device(), "{name}");
            // `w` is the host's memory, now counted as the device's.
            assert!(device.used_memory() - before >= 16, "{name}");
        } else {
            assert!(!w.host().is_on_device(), "{name}");
        }
        routine.run().unwrap();
        // The host's read makes the host array again, from the device's values.
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![11.0, 22.0, 33.0, 44.0],
            "{name}"
        );
        assert!(!w.host().is_on_device(), "{name}");
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![22.0, 44.0, 66.0, 88.0],
            "{name}"
        );
        // Later runs and reads go as after any device write (rule 4).
        routine.run().unwrap();
        routine.run().unwrap();
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![13.0, 26.0, 39.0, 52.0],
            "{name}"
        );
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![26.0, 52.0, 78.0, 104.0],
            "{name}"
        );
        drop(routine);
        assert_eq!(device.used_memory(), before, "{name}: memory kept");
    }
    assert!(
        handing > 0 || arrayjit_testing::backends_under_test(&["sync_cc"]).is_err(),
        "no backend handed arrays over"
    );
}

#[test]
fn host_writes_and_other_streams_see_the_latest_values() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, _, w, y) = update_program();
        let device = b.get_device(0).unwrap();
        let routine = Context::new(&device.new_stream().unwrap())
            .link(&b.compile(CompileRequest::routine("update", &prog)).unwrap())
            .unwrap();
        // Before anything ran: another stream's routine reading `w` gets the host's values
        // (its new array is filled from the host array, made again from the first array).
        let z = hosted_output(&[4], "z");
        let read = Assignments::pointwise_binop(&z, BinOp::Add, &w, &w);
        let other = Context::new(&device.new_stream().unwrap())
            .link(&b.compile(CompileRequest::routine("read", &read)).unwrap())
            .unwrap();
        assert!(
            !w.host().is_on_device(),
            "{name}: given back for the second array"
        );
        other.run().unwrap();
        assert_eq!(
            z.host().get_values().unwrap(),
            vec![20.0, 40.0, 60.0, 80.0],
            "{name}"
        );
        // One element written on the host while the array is handed over: the routine sees
        // it (its array then lags in that element) and the others keep the device's values.
        w.host().set_value(&[2], 100.0).unwrap();
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![22.0, 44.0, 206.0, 88.0],
            "{name}"
        );
        // The other stream's routine gets the latest values (its array lags, and is
        // uploaded from the host, which first gets them back from the first array).
        other.run().unwrap();
        assert_eq!(
            z.host().get_values().unwrap(),
            vec![22.0, 44.0, 206.0, 88.0],
            "{name}"
        );
        // Every value written on the host: both routines see them.
        w.host().set_values(&[1.0, 1.0, 1.0, 1.0]).unwrap();
        other.run().unwrap();
        assert_eq!(z.host().get_values().unwrap(), vec![2.0; 4], "{name}");
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![4.0, 6.0, 8.0, 10.0],
            "{name}"
        );
    }
}

#[test]
fn the_values_outlive_the_routine_until_the_host_reads_them() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, _, w, y) = update_program();
        let device = b.get_device(0).unwrap();
        let before = device.used_memory();
        let routine = Context::new(&device.new_stream().unwrap())
            .link(&b.compile(CompileRequest::routine("update", &prog)).unwrap())
            .unwrap();
        routine.run().unwrap();
        drop(routine);
        // The pending refreshes keep the arrays that hold the values (`y`'s in its pool).
        assert!(device.used_memory() > before, "{name}");
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![11.0, 22.0, 33.0, 44.0],
            "{name}"
        );
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![22.0, 44.0, 66.0, 88.0],
            "{name}"
        );
        assert_eq!(device.used_memory(), before, "{name}: memory kept");
    }
}

#[test]
fn a_zero_filled_host_array_is_handed_over_too() {
    for b in backends() {
        let name = b.name().to_string();
        // An optimizer's moment: host zeros the routine accumulates into.
        let m = parameter("m", &[0.0; 4]);
        let x = hosted_input(&[4], "x", &[1.0, 2.0, 3.0, 4.0]);
        let prog = Assignments::pointwise_binop(&m, BinOp::Add, &m, &x);
        let routine = Context::new(&b.get_device(0).unwrap().new_stream().unwrap())
            .link(&b.compile(CompileRequest::routine("moment", &prog)).unwrap())
            .unwrap();
        assert_eq!(m.host().is_on_device(), hands_over(&b), "{name}");
        // Read before any run: the zeros it was handed over with.
        assert_eq!(m.host().get_values().unwrap(), vec![0.0; 4], "{name}");
        routine.run().unwrap();
        routine.run().unwrap();
        assert_eq!(
            m.host().get_values().unwrap(),
            vec![2.0, 4.0, 6.0, 8.0],
            "{name}"
        );
    }
}

#[test]
fn an_abandoned_or_failed_link_gives_the_host_array_back() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, _, w, _) = update_program();
        let device = b.get_device(0).unwrap();
        let context = Context::new(&device.new_stream().unwrap());
        let before = device.used_memory();
        let ctx = OptimizeCtx::empty();
        let optimized = b.optimize_in(&ctx, "update", &prog, &[]).unwrap();
        // Abandoned.
        let prepared = context.prepare_link(&optimized).unwrap();
        assert_eq!(w.host().is_on_device(), hands_over(&b), "{name}");
        drop(prepared);
        assert!(!w.host().is_on_device(), "{name}: not given back");
        assert!(w.host().with(|_| ()).is_some(), "{name}");
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![10.0, 20.0, 30.0, 40.0],
            "{name}"
        );
        assert_eq!(device.used_memory(), before, "{name}: memory kept");
        // Failed: finished with the code of another optimization.
        let again = b.optimize_in(&ctx, "update", &prog, &[]).unwrap();
        let other = b
            .compile(CompileRequest::optimized(&[again]))
            .unwrap()
            .pop()
            .unwrap();
        let prepared = context.prepare_link(&optimized).unwrap();
        assert!(prepared.finish(&other).is_err(), "{name}");
        assert!(!w.host().is_on_device(), "{name}: not given back");
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![10.0, 20.0, 30.0, 40.0],
            "{name}"
        );
        assert_eq!(device.used_memory(), before, "{name}: memory kept");
        // The host array, given back, is handed over again by a link that completes.
        let code = b
            .compile(CompileRequest::optimized(&[optimized]))
            .unwrap()
            .pop()
            .unwrap();
        let routine = context.link(&code).unwrap();
        assert_eq!(w.host().is_on_device(), hands_over(&b), "{name}");
        routine.run().unwrap();
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![11.0, 22.0, 33.0, 44.0],
            "{name}"
        );
    }
}

#[test]
fn without_host_memory_in_place_arrays_are_copied() {
    if arrayjit_testing::backends_under_test(&["sync_cc"])
        .unwrap()
        .is_empty()
    {
        return;
    }
    let mut config = CcConfig::from_env().unwrap();
    config.use_host_memory = false;
    let copying = Backend::from_lowered("sync_cc", Arc::new(cc::backend(config).unwrap()));
    assert!(!hands_over(&copying));
    let (prog, _, w, y) = update_program();
    let routine = Context::new(&copying.get_device(0).unwrap().new_stream().unwrap())
        .link(
            &copying
                .compile(CompileRequest::routine("update", &prog))
                .unwrap(),
        )
        .unwrap();
    assert!(!w.host().is_on_device());
    assert!(w.host().with(|_| ()).is_some());
    routine.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![22.0, 44.0, 66.0, 88.0]);
}

#[test]
fn host_reads_on_another_thread_see_whole_states_while_links_hand_arrays_over() {
    for b in backends() {
        let name = b.name().to_string();
        let w = parameter("w", &[10.0, 20.0, 30.0, 40.0]);
        let x = hosted_input(&[4], "x", &[1.0, 2.0, 3.0, 4.0]);
        let code = b
            .compile(CompileRequest::routine(
                "update",
                &Assignments::pointwise_binop(&w, BinOp::Add, &w, &x),
            ))
            .unwrap();
        let device = b.get_device(0).unwrap();
        let runs = 20;
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Each read is a state after some number of runs, never a mix or a lost value.
            let reader = scope.spawn(|| {
                let mut reads = 0;
                let mut last = 0.0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || reads == 0 {
                    let v = w.host().get_values().unwrap();
                    let k = v[0] - 10.0;
                    assert!(k >= last && k <= runs as f64 && k.fract() == 0.0, "{v:?}");
                    for (i, vi) in v.iter().enumerate() {
                        let step = (i + 1) as f64;
                        assert_eq!(*vi, 10.0 * step + k * step, "{v:?}");
                    }
                    last = k;
                    reads += 1;
                }
                reads
            });
            // Each link into a new context hands `w` over again, or copies it if the host
            // has not made it again yet.
            for _ in 0..runs {
                let routine = Context::new(&device.new_stream().unwrap())
                    .link(&code)
                    .unwrap();
                routine.run().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Release);
            assert!(reader.join().unwrap() > 0, "{name}");
        });
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![30.0, 60.0, 90.0, 120.0],
            "{name}"
        );
    }
}

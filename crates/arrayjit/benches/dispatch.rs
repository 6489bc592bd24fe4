//! Dispatch overhead: scheduling one run of an empty routine and awaiting it, on `sync_cc` and
//! `multicore_cc`; plus a cross-stream device-to-device copy into a merge buffer; and the
//! runs again with a timeline being recorded.
//! Run with `cargo bench -p arrayjit --bench dispatch`.

use std::hint::black_box;

use arrayjit::prelude::*;
use criterion::{Criterion, criterion_group, criterion_main};

fn empty_routine(b: &Backend) -> Routine {
    let code = b
        .compile(CompileRequest::routine("empty", &Assignments::Noop))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    Context::new(&stream).link(&code).unwrap()
}

fn tiny_routine(b: &Backend) -> Routine {
    let x = Tnode::new(Prec::F32, &[4], &["x"]).unwrap();
    x.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "bench")
        .unwrap();
    let code = b
        .compile(CompileRequest::routine(
            "tiny",
            &Assignments::Fetch {
                array: x,
                op: FetchOp::Constant(1.0),
            },
        ))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    Context::new(&stream).link(&code).unwrap()
}

/// The machine's floor for a cross-thread round trip: send a message to a worker thread over a
/// std channel and wait for its reply.
fn thread_round_trip(c: &mut Criterion) {
    let (to_worker, from_main) = std::sync::mpsc::sync_channel::<u64>(1);
    let (to_main, from_worker) = std::sync::mpsc::sync_channel::<u64>(1);
    let worker = std::thread::spawn(move || {
        while let Ok(v) = from_main.recv() {
            if to_main.send(v + 1).is_err() {
                break;
            }
        }
    });
    c.bench_function(
        "baseline: std channel round trip to a worker thread",
        |bench| {
            bench.iter(|| {
                to_worker.send(1).unwrap();
                black_box(from_worker.recv().unwrap());
            })
        },
    );
    drop(to_worker);
    worker.join().unwrap();
}

fn dispatch(c: &mut Criterion) {
    for name in ["sync_cc", "multicore_cc"] {
        let b = arrayjit::backend(name).unwrap();
        let empty = empty_routine(&b);
        c.bench_function(
            &format!("{name}: schedule + await empty routine"),
            |bench| {
                bench.iter(|| {
                    empty.run().unwrap();
                    black_box(empty.context().stream().await_work()).unwrap();
                })
            },
        );
        let tiny = tiny_routine(&b);
        c.bench_function(
            &format!("{name}: 100 runs of a 4-element fill, one await"),
            |bench| {
                bench.iter(|| {
                    for _ in 0..100 {
                        tiny.run().unwrap();
                    }
                    black_box(tiny.context().stream().await_work()).unwrap();
                })
            },
        );
    }
}

/// The same 100 runs with a timeline being recorded (`arrayjit_ir::trace`), the recording
/// restarted for every batch so its memory stays small: the cost of tracing on.
fn dispatch_traced(c: &mut Criterion) {
    for name in ["sync_cc", "multicore_cc"] {
        let b = arrayjit::backend(name).unwrap();
        let tiny = tiny_routine(&b);
        c.bench_function(
            &format!("{name}: 100 runs of a 4-element fill, one await, tracing on"),
            |bench| {
                bench.iter(|| {
                    arrayjit::runtime::start_trace(Default::default());
                    for _ in 0..100 {
                        tiny.run().unwrap();
                    }
                    black_box(tiny.context().stream().await_work()).unwrap();
                    black_box(arrayjit::runtime::stop_trace());
                })
            },
        );
    }
}

criterion_group!(benches, thread_round_trip, dispatch, dispatch_traced);
criterion_main!(benches);

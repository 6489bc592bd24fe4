//! Seeing what arrayjit does: the timeline of a data-parallel run (one test: the recorder is
//! global) and per-routine statistics. The `arrayjit` command's `ARRAYJIT_DEBUG` listings,
//! `ARRAYJIT_TRACE` and `--trace` are tested with the command (`arrayjit-cli`'s
//! `tests/observability.rs`).

use std::collections::HashMap;

use arrayjit::ir::trace::{Event, Track};
use arrayjit::prelude::*;
use arrayjit::tensor::{Tensor, forward_program};

// The demo of the binary, whose code this test traces.
#[path = "../../arrayjit-cli/src/moons.rs"]
#[allow(dead_code)]
mod moons;

/// The data-parallel demo on `multicore_cc` (two shards, so two streams exchanging gradients
/// through merge buffers) traced: every stream is a named track whose slices follow one
/// another; kernels carry their routine's name, copies their bytes; every wait is an arrow
/// from a slice that ends on the producer's stream to a later wait on another stream; the
/// compile track holds each compilation's phases.
#[test]
fn a_data_parallel_run_traces_streams_kernels_copies_waits_and_compiles() {
    arrayjit::runtime::start_trace(Default::default());
    let config = moons::MoonsConfig {
        backend: Some("multicore_cc".into()),
        epochs: 2,
        samples: 200,
        output: None,
        shards: 2,
        ..Default::default()
    };
    let report = moons::run(&config, |_| {}).unwrap();
    // Whether the demo's streams ever wait for each other depends on timing (a producer that
    // finished before its consumer scheduled the wait needs none): one wait that certainly
    // blocks, on streams of their own, so the arrows are always checked.
    let lowered = arrayjit::backend("multicore_cc").unwrap().lowered().clone();
    let pair = arrayjit::runtime::Backend::with_scheduler(
        "traced_pair",
        lowered,
        arrayjit::runtime::scheduler::SchedulerKind::Multicore { queue_capacity: 8 },
        Default::default(),
    );
    let dev = pair.get_device(0).unwrap();
    let (producer, consumer) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    producer
        .schedule_task(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            Ok(())
        })
        .unwrap();
    consumer.will_wait_for(&producer.all_work()).unwrap();
    consumer.await_work().unwrap();
    let trace = arrayjit::runtime::stop_trace().unwrap();
    assert!(arrayjit::runtime::stop_trace().is_none());
    assert_eq!(report.losses.len(), 2);
    assert_eq!(trace.dropped(), 0);

    let mut slices: HashMap<Track, Vec<&Event>> = HashMap::new();
    for e in trace.events().iter().filter(|e| e.flow().is_none()) {
        slices.entry(e.track()).or_default().push(e);
    }
    // (Other tests of this file may run meanwhile, on sync_cc: their streams are left out.)
    let streams: Vec<Track> = slices
        .keys()
        .copied()
        .filter(|t| matches!(t, Track::Stream(_)))
        .filter(|t| trace.track_name(*t).unwrap().starts_with("multicore_cc:"))
        .collect();
    assert!(streams.len() >= 2, "{streams:?}");
    for t in &streams {
        let name = trace.track_name(*t).unwrap();
        let mut s = slices[t].clone();
        s.sort_by(|a, b| a.start_us().total_cmp(&b.start_us()));
        // One task at a time per stream: each slice ends before the next starts.
        for w in s.windows(2) {
            assert!(
                w[0].start_us() + w[0].duration_us() <= w[1].start_us() + 0.01,
                "{name}: {} overlaps {}",
                w[0].name(),
                w[1].name()
            );
        }
        assert!(s.iter().any(|e| e.category() == "kernel"), "{name}");
    }
    let named = |cat: &str| {
        trace
            .events()
            .iter()
            .filter(|e| e.category() == cat)
            .map(|e| e.name().to_string())
            .collect::<Vec<_>>()
    };
    let kernels = named("kernel");
    assert!(
        kernels.iter().any(|k| k == "shard_gradients"),
        "{kernels:?}"
    );
    assert!(kernels.iter().any(|k| k == "update"), "{kernels:?}");
    // Copies and merge-buffer transfers carry their bytes.
    for e in trace
        .events()
        .iter()
        .filter(|e| e.category() == "copy" || e.category() == "merge")
    {
        let bytes = e.args().iter().find(|(k, _)| *k == "bytes");
        assert!(
            matches!(bytes, Some((_, arrayjit::ir::trace::Arg::Int(n))) if *n > 0),
            "{}: {:?}",
            e.name(),
            e.args()
        );
    }
    assert!(!named("merge").is_empty());
    // Waits: arrows from the producer's slice to a later wait on another stream.
    let mut flows: HashMap<u64, Vec<&Event>> = HashMap::new();
    for e in trace.events() {
        if let Some((id, _)) = e.flow() {
            flows.entry(id).or_default().push(e);
        }
    }
    assert!(!flows.is_empty());
    let within = |e: &Event, cat: Option<&str>| {
        slices[&e.track()].iter().any(|s| {
            cat.is_none_or(|c| s.category() == c)
                && s.start_us() <= e.start_us() + 0.01
                && e.start_us() <= s.start_us() + s.duration_us() + 0.01
        })
    };
    for (id, pair) in &flows {
        assert_eq!(pair.len(), 2, "flow {id}");
        let (from, to) = if pair[0].flow().unwrap().1 {
            (pair[0], pair[1])
        } else {
            (pair[1], pair[0])
        };
        assert_ne!(from.track(), to.track(), "flow {id}");
        assert!(
            from.start_us() <= to.start_us() + 0.01,
            "flow {id}: waits before its producer"
        );
        assert!(
            within(from, None),
            "flow {id}: starts outside a producer's slice"
        );
        assert!(within(to, Some("wait")), "flow {id}: ends outside a wait");
    }
    // Compilations: optimize, render, then a compile or a cache hit, named by routine.
    let phases = named("compile");
    for phase in ["optimize shard_gradients", "render shard_gradients"] {
        assert!(phases.iter().any(|p| p.starts_with(phase)), "{phases:?}");
    }
    assert!(
        phases
            .iter()
            .any(|p| p.starts_with("compile ") || p.starts_with("cache hit ")),
        "{phases:?}"
    );
    // The file form is valid JSON in the Chrome trace format.
    let json: serde_json::Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name")
    );
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "X" && e["cat"] == "kernel")
    );
}

/// Per-routine statistics: runs, and the time of those run while timing was on, from the API;
/// on `wgpu` (where the device has timestamp queries, as lavapipe does) the device's own time.
/// One test, since the timing switch is global.
#[test]
fn routines_count_their_runs_and_time() {
    routine_stats_on("sync_cc");
    for backend in arrayjit_testing::backends_under_test(&["wgpu"]).unwrap() {
        routine_device_time_on(&backend);
    }
}

/// Runs timed by the device report the kernel's time there, once the host waits for it; a
/// routine of several passes (a pointwise pass and two reductions: the first and the last
/// pass write the timestamps, the ones between none).
fn routine_device_time_on(backend: &Backend) {
    let x = Tensor::input(
        Prec::F32,
        &[1 << 16],
        "x",
        &(0..1 << 16).map(f64::from).collect::<Vec<_>>(),
    )
    .unwrap();
    let y = x.relu().unwrap();
    let total = y.sum_all().unwrap();
    let largest = y.max(&[0]).unwrap();
    for t in [&y, &total, &largest] {
        t.node()
            .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "read")
            .unwrap();
    }
    let code = backend
        .compile(CompileRequest::routine(
            "relu_timed",
            &forward_program(&[&y, &total, &largest]),
        ))
        .unwrap();
    let y = y.node().clone();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    arrayjit::runtime::set_run_timing(true);
    let started = std::time::Instant::now();
    for _ in 0..5 {
        routine.run().unwrap();
    }
    // Reading the result waits for the queue, which delivers the timestamps.
    assert_eq!(y.host().get_values().unwrap()[3], 3.0);
    let wall = started.elapsed();
    arrayjit::runtime::set_run_timing(false);
    let stats = routine.stats();
    assert_eq!(
        (stats.runs, stats.timed_runs, stats.failed),
        (5, 5, 0),
        "{stats:?}"
    );
    assert_eq!(stats.device_timed_runs, 5, "{stats:?}");
    assert!(
        stats.total > std::time::Duration::ZERO && stats.total <= wall,
        "device time {:?} within the wall time {wall:?}",
        stats.total
    );
}

fn routine_stats_on(name: &str) {
    let backend = arrayjit::backend(name).unwrap();
    let x = Tnode::new(Prec::F32, &[4], &["x"]).unwrap();
    x.host().set_values(&[1.0, -1.0, 2.0, -2.0]).unwrap();
    let y = Tnode::new(Prec::F32, &[4], &["y"]).unwrap();
    let code = backend
        .compile(CompileRequest::routine(
            "relu",
            &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
        ))
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    assert_eq!(routine.stats().runs, 0);
    routine.run().unwrap();
    arrayjit::runtime::set_run_timing(true);
    for _ in 0..3 {
        routine.run().unwrap();
    }
    arrayjit::runtime::set_run_timing(false);
    let stats = routine.stats();
    assert_eq!((stats.runs, stats.failed), (4, 0));
    // The first run was untimed (unless the trace test of this file was recording then).
    assert!(stats.timed_runs >= 3, "{stats:?}");
    assert_eq!(stats.device_timed_runs, 0, "a CPU backend times the call");
    assert!(stats.total >= stats.mean && stats.mean > std::time::Duration::ZERO);
}

/// A routine's stats say the memory it holds: its device arrays (and which its own link
/// allocated), the scratch and the host arrays, and their sum as the peak; on every backend.
#[test]
fn routines_report_the_memory_they_hold() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let hosted = |label: &str| {
            let t = Tnode::new(Prec::F32, &[1000], &[label]).unwrap();
            t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                .unwrap();
            t
        };
        let (x, y, z) = (hosted("x"), hosted("y"), hosted("z"));
        x.host().set_values(&[1.0; 1000]).unwrap();
        let first = backend
            .compile(CompileRequest::routine(
                "neg",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap();
        let second = backend
            .compile(CompileRequest::routine(
                "relu",
                &Assignments::pointwise_unop(&z, UnOp::Relu, &y),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let r1 = Context::new(&stream).link(&first).unwrap();
        let m1 = r1.stats().memory;
        // x and y, 4000 bytes each, on the device and on the host; both new to the context.
        assert_eq!((m1.arrays, m1.host), (8000, 8000), "{name}: {m1:?}");
        assert!(m1.new_pools >= 8000, "{name}: {m1:?}");
        assert_eq!(m1.peak(), m1.arrays + m1.scratch + m1.host, "{name}");
        // The second routine, linked under the first, finds y there: its link allocates z only.
        let r2 = r1.context().link(&second).unwrap();
        let m2 = r2.stats().memory;
        assert_eq!((m2.arrays, m2.host), (8000, 8000), "{name}: {m2:?}");
        assert!(
            (4000..8000).contains(&m2.new_pools),
            "{name}: only z is new: {m2:?}"
        );
        r1.run().unwrap();
        r2.run().unwrap();
        assert_eq!(z.host().get_values().unwrap()[0], 0.0, "{name}");
        // Running changes nothing of it.
        assert_eq!(r2.stats().memory, m2, "{name}");
    }
}

//! Memory a link cannot have is refused before anything is allocated (issue 39 item 3, issue 40
//! item 2): a backend's memory limit and a device's free memory bound what a link may
//! allocate; the error is a typed `DeviceOutOfMemory` with both figures, and the backend works
//! normally afterwards.

use std::time::{Duration, Instant};

use arrayjit::Error;
use arrayjit::prelude::*;

/// `x` (hosted, `n` values `0, 1, ...`) and `y = 2 x` (hosted result) and the program.
fn doubling(n: usize) -> (Tnode, Tnode, Assignments) {
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.host().set_values_with(|i| (i % 1000) as f64).unwrap();
    let y = Tnode::new(Prec::F32, &[n], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let prog = Assignments::pointwise_binop(&y, BinOp::Add, &x, &x);
    (x, y, prog)
}

#[test]
fn a_link_beyond_the_memory_limit_is_refused_before_allocating_on_every_backend() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let n = 1 << 20;
        let (_x, y, prog) = doubling(n);
        let code = backend
            .compile(CompileRequest::routine("double", &prog))
            .unwrap();
        let device = backend.get_device(0).unwrap();
        let stream = device.new_stream().unwrap();
        let used = device.used_memory();
        backend.set_memory_limit(Some(used + (1 << 20)));
        let started = Instant::now();
        let err = Context::new(&stream).link(&code).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "{name}");
        match &err {
            Error::DeviceOutOfMemory {
                what,
                needed,
                available,
                bound,
                ..
            } => {
                // x and y, 4 MiB each (and any scratch).
                assert!(*needed >= 8 << 20, "{name}: {err}");
                assert!(*available <= 1 << 20, "{name}: {err}");
                assert!(what.contains("double"), "{name}: {err}");
                // The arrays the memory would go to are named, with their sizes.
                assert!(
                    what.contains("largest new arrays") && what.contains("y#"),
                    "{name}: {err}"
                );
                assert!(bound.contains("memory limit"), "{name}: {err}");
            }
            other => panic!("{name}: expected DeviceOutOfMemory, got {other:?}"),
        }
        assert!(err.is_out_of_memory());
        assert!(
            err.to_string().contains("ARRAYJIT_MEMORY_LIMIT_MB"),
            "{err}"
        );
        assert_eq!(device.used_memory(), used, "{name}: nothing allocated");
        // Without the limit (or with room), the same code links and computes.
        backend.set_memory_limit(Some(used + (64 << 20)));
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host(&y).unwrap();
        stream.await_work().unwrap();
        let got = y.host().get_values().unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &v)| v == 2.0 * (i % 1000) as f64),
            "{name}"
        );
        backend.set_memory_limit(None);
        assert_eq!(backend.memory_limit(), None);
    }
}

#[test]
fn a_link_beyond_the_device_is_refused_within_a_second() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let device = backend.get_device(0).unwrap();
        let Some((free, bound)) = device.available_memory() else {
            eprintln!("{name}: its free memory is unknown; only a memory limit bounds it");
            continue;
        };
        // 1 TiB of f32, more than any device here holds (and within what one CUDA launch
        // covers: 2^31 - 1 blocks): a hosted result that the link must allocate on the device.
        let big = Tnode::new(Prec::F32, &[1 << 38], &["big"]).unwrap();
        big.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let prog = Assignments::Fetch {
            array: big.clone(),
            op: FetchOp::Constant(1.0),
        };
        let code = backend
            .compile(CompileRequest::routine("huge", &prog))
            .unwrap();
        let stream = device.new_stream().unwrap();
        let used = device.used_memory();
        let started = Instant::now();
        match Context::new(&stream).link(&code) {
            Err(Error::DeviceOutOfMemory {
                needed, available, ..
            }) => {
                assert!(needed >= 1 << 40, "{name}");
                assert!(
                    available <= free.max(available) && available < needed,
                    "{name}"
                );
            }
            other => panic!("{name} ({bound}): expected DeviceOutOfMemory, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(1), "{name}");
        assert_eq!(device.used_memory(), used, "{name}: nothing allocated");
        // The backend works normally afterwards.
        let (_x, y, prog) = doubling(1000);
        let code = backend
            .compile(CompileRequest::routine("double", &prog))
            .unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host(&y).unwrap();
        stream.await_work().unwrap();
        assert_eq!(y.host().get_value(&[999]).unwrap(), 1998.0, "{name}");
    }
}

#[test]
fn a_memory_limit_of_zero_bytes_is_refused_as_a_setting() {
    let config = arrayjit::runtime::RuntimeConfig {
        memory_limit: Some(0),
        ..Default::default()
    };
    assert!(matches!(
        arrayjit::runtime::backend_with_config("sync_cc", &config),
        Err(Error::InvalidSetting { .. })
    ));
}

/// Compiling allocates no device memory on any backend (render, compile, then link): the
/// device state a compiled batch keeps of its own (wgpu's local nodes and static indices) is
/// made when a context links it, and counted from then.
#[test]
fn compiling_allocates_no_device_memory_on_every_backend() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        // Local nodes (in the CPU's scratch pool, wgpu's own buffers, CUDA's scratch) and a
        // static index.
        let case = arrayjit_testing::scratch_locals().unwrap();
        let device = backend.get_device(0).unwrap();
        let used = device.used_memory();
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        assert_eq!(device.used_memory(), used, "{name}: compiling allocated");
        let stream = device.new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        assert!(
            device.used_memory() > used,
            "{name}: linking allocated nothing"
        );
        // And it computes what the interpreter does.
        arrayjit_testing::check_case_code(&case, &backend, &code).unwrap();
        drop(routine);
    }
}

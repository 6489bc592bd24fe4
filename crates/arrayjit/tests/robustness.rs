//! Regression tests for the hostile-input and failure-semantics defects of the reliability
//! issue: each test is named after the defect it pins down and asserts the typed error or the
//! correct value.

use arrayjit::Error;
use arrayjit::ir::{AxisPadding, LowLevel, Padding, ScalarExpr, Symbol};
use arrayjit::prelude::*;

mod common;
use common::{hosted_iota, hosted_output};
use proptest::prelude::*;

/// `y[lhs] = x[rhs]` over a `[4]` product space, with the given axis indices in terms of the
/// product iterator.
fn copy_with(lhs: (i64, i64), rhs: (i64, i64), dims: usize) -> (Assignments, Tnode) {
    let x = hosted_iota(&[dims], "x");
    let y = hosted_output(&[dims], "y");
    let mut p = Projections::pointwise(&[4], 1);
    let it = p.product_iterators[0];
    p.lhs_dims = vec![dims];
    p.rhs_dims = vec![vec![dims]];
    p.project_lhs = vec![AxisIndex::affine([(lhs.0, it)], lhs.1)];
    p.project_rhs = vec![vec![AxisIndex::affine([(rhs.0, it)], rhs.1)]];
    let prog = Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: y.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
        projections: p,
    };
    (prog, y)
}

/// Item 1: a coefficient with `c·3 ≡ 1 (mod 2^64)` used to pass the check as range 0..=1.
#[test]
fn item01_bounds_verifier_overflow_is_a_typed_error() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let wild = 0xAAAA_AAAA_AAAA_AAABu64 as i64;
    for (lhs, rhs) in [
        ((1, 0), (wild, 0)),
        ((wild, 0), (1, 0)),
        ((1, 0), (1, i64::MAX)),
    ] {
        let (prog, _) = copy_with(lhs, rhs, 4);
        let err = backend
            .compile(CompileRequest::routine("wild", &prog))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::IndexOutOfBounds {
                    problem: arrayjit::ir::OutOfBounds::Overflow { .. },
                    ..
                }
            ),
            "{err}"
        );
    }
    // The verifier of optimized code rejects the same index on its own.
    let it = Symbol::fresh();
    let x = Tnode::new(Prec::F32, &[4], &["x"]).unwrap();
    let code = LowLevel::For {
        index: it,
        from: 0,
        to: 4,
        body: Box::new(LowLevel::Set {
            tn: x.clone(),
            idcs: vec![AxisIndex::affine([(wild, it)], 0)],
            value: ScalarExpr::Constant(1.0),
        }),
    };
    let err = arrayjit::ir::verify::check_bounds(&code, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfBounds {
                problem: arrayjit::ir::OutOfBounds::Overflow { .. },
                ..
            }
        ),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Item 1, as a property: whatever the affine coefficients and offsets, lowering either
    /// refuses the program with a typed error, or every index it accepts lies inside the node
    /// for every iterator value (checked in exact 128-bit arithmetic).
    #[test]
    fn item01_adversarial_affine_indices_are_refused_or_in_bounds(
        c in prop_oneof![any::<i64>(), -3i64..=3, Just(i64::MIN), Just(i64::MAX)],
        o in prop_oneof![any::<i64>(), -3i64..=3, Just(i64::MIN), Just(i64::MAX)],
        on_lhs in any::<bool>(),
    ) {
        let (lhs, rhs) = if on_lhs { ((c, o), (1, 0)) } else { ((1, 0), (c, o)) };
        let (prog, _) = copy_with(lhs, rhs, 4);
        match prog.lower(&[]) {
            Err(e) => prop_assert!(
                matches!(e, Error::IndexOutOfBounds { .. } | Error::ShapeMismatch { .. }),
                "{e}"
            ),
            Ok(_) => {
                for i in 0..4i128 {
                    let v = i128::from(c) * i + i128::from(o);
                    prop_assert!((0..4).contains(&v), "c={c} o={o} i={i} gives {v}");
                }
            }
        }
    }
}

/// Item 2: padding whose padded size overflows is refused when the node is made.
#[test]
fn item02_padding_overflow_is_refused() {
    let pad = Padding {
        axes: vec![AxisPadding {
            left: usize::MAX,
            right: 2,
        }],
        value: 0.0,
    };
    let err = Tnode::new_padded(Prec::F32, &[2], pad.clone(), &["p"]).unwrap_err();
    assert!(
        matches!(&err, Error::OutOfMemory { what, bytes: usize::MAX } if what.contains("padding")),
        "{err}"
    );
    let err = Ndarray::zeros_padded(Prec::F32, &[2], pad).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    // Padding that fits in `usize` but not in memory is refused as well.
    let big = Padding {
        axes: vec![AxisPadding {
            left: 1 << 62,
            right: 0,
        }],
        value: 0.0,
    };
    assert!(Tnode::new_padded(Prec::F32, &[2], big, &["q"]).is_err());
}

/// Item 20: links that fail (here: writing a shared node from a second stream) allocate
/// nothing, however often they are tried, and decide nothing: `x`, which both streams' code
/// only reads, is not made shared across streams by a link that failed.
#[test]
fn item20_failed_links_leak_no_pools() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_iota(&[1 << 16], "x");
    let table = Tnode::new(Prec::F32, &[1 << 16], &["table"]).unwrap();
    table
        .update_memory_mode(MemoryMode::OnDevice(Sharing::SharedCrossStreams), "test")
        .unwrap();
    let big = hosted_output(&[1 << 16], "big");
    let prog = Assignments::pointwise_unop(&table, UnOp::Neg, &x)
        .then(Assignments::pointwise_unop(&big, UnOp::Abs, &x));
    let code = b.compile(CompileRequest::routine("fill", &prog)).unwrap();
    let _r1 = Context::new(&s1).link(&code).unwrap();
    let before = dev.used_memory();
    for _ in 0..20 {
        let err = Context::new(&s2).link(&code).unwrap_err();
        assert!(err.to_string().contains("shared across streams"), "{err}");
    }
    assert_eq!(dev.used_memory(), before, "failed links grew device memory");
    let mode = x.memory_mode().map(|m| m.mode);
    assert_ne!(
        mode,
        Some(MemoryMode::Hosted(
            arrayjit::ir::MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams)
        )),
        "a failed link decided the sharing of x"
    );
}

/// A chain of `n` locals of `[4096]` f32 (16 KiB each, each read twice so none is inlined):
/// `t1 = x + x`, `t(k+1) = t(k) + t(k)`, `y = t(n) + t(n)`, so `y = x · 2^(n+1)`.
fn chain_of_locals(n: usize) -> (Assignments, Tnode, Tnode) {
    let x = hosted_iota(&[4096], "x");
    let y = hosted_output(&[4096], "y");
    let mut prev = x.clone();
    let mut prog = Assignments::Noop;
    for k in 0..n {
        let t = Tnode::new(Prec::F32, &[4096], &[&format!("t{k}")]).unwrap();
        prog = prog.then(Assignments::pointwise_binop(&t, BinOp::Add, &prev, &prev));
        prev = t;
    }
    prog = prog.then(Assignments::pointwise_binop(&y, BinOp::Add, &prev, &prev));
    (prog, x, y)
}

/// Item 3: the total stack of a kernel is budgeted; locals beyond it go to the scratch pool,
/// so a long chain of large locals runs even on a thread with a small stack.
#[test]
fn item03_kernel_stack_is_budgeted_in_total() {
    for name in ["sync_cc", "multicore_cc"] {
        let (prog, _x, y) = chain_of_locals(48); // 768 KiB of locals
        let b = arrayjit::backend(name).unwrap();
        // Array contraction would keep one element of each local per iteration of the fused
        // loop (the chain is pointwise): off, so that the locals are whole arrays.
        b.set_optimize_settings(arrayjit::opt::OptimizeSettings {
            enable_contraction: false,
            ..b.optimize_settings()
        });
        let code = b.compile(CompileRequest::routine("chain", &prog)).unwrap();
        let opt = code.optimized();
        let budget = b.optimize_settings().kernel_stack_budget_bytes;
        let locals: usize = opt
            .nodes
            .iter()
            .filter(|r| r.used && r.tn.modes().is_local())
            .map(|r| r.tn.size_in_bytes())
            .sum();
        assert!(locals >= 48 * 16384, "{locals}");
        assert!(
            locals - opt.scratch.slots.len() * 16384 <= budget,
            "stack {} > budget {budget}",
            locals - opt.scratch.slots.len() * 16384
        );
        // Run on a thread whose stack is far smaller than the locals.
        let handle = std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(move || {
                let stream = b.get_device(0).unwrap().new_stream().unwrap();
                let r = Context::new(&stream).link(&code).unwrap();
                r.run().unwrap();
                y.host().get_values().unwrap()
            })
            .unwrap();
        let got = handle.join().unwrap();
        let scale = 2f64.powi(49);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, i as f64 * scale, "{name}: element {i}");
        }
    }
}

/// Item 5: shapes too large for the machine are typed errors in the front end too, for every
/// initializer and for optimizer state, and nothing of their size is allocated on the way.
#[test]
fn item05_huge_shapes_in_the_front_end_are_errors() {
    use arrayjit::tensor::{Init, Tensor};
    for init in [
        Init::Zeros,
        Init::Constant(1.0),
        Init::Normal {
            mean: 0.0,
            std: 1.0,
        },
        Init::KaimingUniform,
    ] {
        // 4 TiB: more than the host has available (found before allocating, with the
        // figures), or, where that figure is unknown, more than the allocator gives.
        match Tensor::param("h", &[1 << 40], init, 1, 0) {
            Err(Error::DeviceOutOfMemory {
                what,
                needed,
                available,
                ..
            }) => {
                assert!(what.contains("host array"), "{what}");
                assert_eq!(needed, 4 << 40);
                assert!(available < needed);
            }
            Err(Error::OutOfMemory { what, bytes }) => {
                assert!(what.contains("host array"), "{what}");
                assert_eq!(bytes, 4 << 40);
            }
            other => panic!("{init:?}: expected OutOfMemory, got {other:?}"),
        }
        assert!(Tensor::param("h", &[1 << 40, 1 << 40], init, 1, 0).is_err());
    }
    assert!(matches!(
        Init::Zeros.values(&[1 << 40, 1 << 40], 1, 0),
        Err(Error::OutOfMemory {
            bytes: usize::MAX,
            ..
        })
    ));
    assert!(
        Init::Zeros
            .values(&[1 << 61], 1, 0)
            .is_err_and(|e| e.is_out_of_memory())
    );
    assert!(
        Tensor::zeros_input(Prec::F32, &[1 << 40], "state").is_err_and(|e| e.is_out_of_memory())
    );
    // A wrong number of values is found before the array is allocated.
    assert!(matches!(
        Tensor::input(Prec::F32, &[1 << 40], "x", &[1.0]),
        Err(Error::SizeMismatch {
            expected: 1_099_511_627_776,
            given: 1,
            ..
        })
    ));
    // Reasonable shapes still work, with the same values as before.
    let p = Tensor::param("w", &[3, 2], Init::KaimingUniform, 7, 1).unwrap();
    let want: Vec<f64> = Init::KaimingUniform
        .values(&[3, 2], 7, 1)
        .unwrap()
        .iter()
        .map(|&v| v as f32 as f64)
        .collect();
    assert_eq!(p.values().unwrap(), want);
}

/// Item 6: every setting has a documented range; outside it, or unparsable, is a typed error
/// naming the variable, the value and the range, never an abort or a silent default.
#[test]
fn item06_configuration_values_are_checked() {
    use arrayjit::backends::cc::CcConfig;
    use arrayjit::runtime::{RuntimeConfig, backend_with_config};
    use std::ffi::OsString;
    for (variable, range) in [
        ("ARRAYJIT_CPU_DEVICES", "from 1 to 1024"),
        ("ARRAYJIT_CACHE_MAX_MB", "from 0 to 16777216"),
        ("ARRAYJIT_CC_TIMEOUT_SECS", "from 1 to 86400"),
    ] {
        for value in [
            "1000000000000",
            "18446744073709551615",
            "-1",
            "abc",
            "lots",
            "99999999999999999999999",
        ] {
            let lookup = |name: &str| (name == variable).then(|| OsString::from(value));
            let message = match CcConfig::from_lookup(&lookup) {
                Err(e @ Error::InvalidSetting { .. }) => e.to_string(),
                other => panic!("{variable}={value}: expected InvalidSetting, got {other:?}"),
            };
            assert!(
                message.contains(variable) && message.contains(value) && message.contains(range),
                "{message}"
            );
        }
    }
    // 0 is outside the device and timeout ranges but a valid cache size.
    for (variable, ok) in [
        ("ARRAYJIT_CPU_DEVICES", false),
        ("ARRAYJIT_CC_TIMEOUT_SECS", false),
        ("ARRAYJIT_CACHE_MAX_MB", true),
    ] {
        let lookup = |name: &str| (name == variable).then(|| OsString::from("0"));
        assert_eq!(CcConfig::from_lookup(&lookup).is_ok(), ok, "{variable}=0");
    }
    let lookup = |name: &str| (name == "ARRAYJIT_NO_CACHE").then(|| OsString::from("please"));
    assert!(matches!(
        CcConfig::from_lookup(&lookup),
        Err(Error::InvalidSetting { .. })
    ));
    // Values in range are taken as given.
    let lookup = |name: &str| match name {
        "ARRAYJIT_CPU_DEVICES" => Some(OsString::from("3")),
        "ARRAYJIT_CACHE_MAX_MB" => Some(OsString::from("0")),
        "ARRAYJIT_CC_TIMEOUT_SECS" => Some(OsString::from(" 42 ")),
        "ARRAYJIT_NO_CACHE" => Some(OsString::from("yes")),
        _ => None,
    };
    let config = CcConfig::from_lookup(&lookup).unwrap();
    assert_eq!(config.num_devices, 3);
    assert_eq!(config.cache_max_bytes, 0);
    assert_eq!(config.compile_timeout.as_secs(), 42);
    assert_eq!(config.cache_dir, None);

    // Configuration given in code.
    for (config, field) in [
        (
            RuntimeConfig {
                queue_capacity: usize::MAX,
                ..Default::default()
            },
            "queue_capacity",
        ),
        (
            RuntimeConfig {
                queue_capacity: 1 << 26,
                ..Default::default()
            },
            "queue_capacity",
        ),
        (
            RuntimeConfig {
                queue_capacity: 0,
                ..Default::default()
            },
            "queue_capacity",
        ),
        (
            RuntimeConfig {
                num_devices: Some(1 << 40),
                ..Default::default()
            },
            "num_devices",
        ),
        (
            RuntimeConfig {
                num_devices: Some(0),
                ..Default::default()
            },
            "num_devices",
        ),
        (
            RuntimeConfig {
                max_pool_bytes: Some(0),
                ..Default::default()
            },
            "max_pool_bytes",
        ),
    ] {
        match backend_with_config("multicore_cc", &config) {
            Err(e @ Error::InvalidSetting { .. }) => {
                assert!(e.to_string().contains(field), "{e}")
            }
            other => panic!("{config:?}: expected InvalidSetting, got {other:?}"),
        }
    }
    let config = CcConfig {
        num_devices: 1 << 40,
        ..CcConfig::default()
    };
    assert!(matches!(
        arrayjit::backends::cc::backend(config),
        Err(Error::InvalidSetting { .. })
    ));
    // The largest queue accepted works.
    let b = backend_with_config(
        "multicore_cc",
        &RuntimeConfig {
            queue_capacity: 65_536,
            ..Default::default()
        },
    )
    .unwrap();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    s.schedule_task(|| Ok(())).unwrap();
    s.await_work().unwrap();
}

/// Item 21: a device copy of a hosted constant (shared by all streams of the device) lives as
/// long as its node: once every handle to throwaway constants is dropped, their device memory
/// and registry entries are gone (200 here, to keep the C compile short; with 1,000 the 4 MB
/// that stayed before the fix goes too). Device-only arrays shared across streams
/// follow the same rule, and stay while their node lives.
#[test]
fn item21_hosted_constants_are_freed_with_their_nodes() {
    // Device copies of constants: with host memory used in place (the cc default) there are
    // none to free, so this test turns that off.
    let mut config = arrayjit::backends::cc::CcConfig::from_env().unwrap();
    config.use_host_memory = false;
    let b = arrayjit::runtime::Backend::from_lowered(
        "sync_cc",
        std::sync::Arc::new(arrayjit::backends::cc::backend(config).unwrap()),
    );
    let dev = b.get_device(0).unwrap();
    let stream = dev.new_stream().unwrap();
    let baseline = dev.used_memory();
    let y = Tnode::new(Prec::F32, &[1024], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
        .unwrap();
    let mut prog = Assignments::Fetch {
        array: y.clone(),
        op: FetchOp::Constant(0.0),
    };
    let mut ids = Vec::new();
    for k in 0..200 {
        let c = common::hosted_input(&[1024], &format!("c{k}"), &[k as f64; 1024]);
        c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: a constant")
            .unwrap();
        ids.push(c.id());
        prog = prog.then(Assignments::pointwise_binop(&y, BinOp::Add, &y, &c));
    }
    let code = b
        .compile(CompileRequest::routine("constants", &prog))
        .unwrap();
    drop(prog);
    let ctx = Context::new(&stream);
    let routine = ctx.link(&code).unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    let linked = dev.used_memory() - baseline;
    assert!(linked >= 200 * 4096, "{linked} bytes linked");
    assert_eq!(dev.shared_array_count(), 200);
    drop((routine, ctx, code));
    // The code held the last handles to the constants.
    assert!(
        ids.iter()
            .all(|&id| arrayjit::ir::tnode::find(id).is_none())
    );
    let left = dev.used_memory() - baseline;
    assert!(
        left <= 4096,
        "{left} bytes left of {linked} after every handle was dropped"
    );
    assert_eq!(dev.shared_array_count(), 0);

    // A device-only array shared across streams keeps its values while its node lives.
    let shared = Tnode::new(Prec::F32, &[4], &["shared"]).unwrap();
    shared
        .update_memory_mode(MemoryMode::OnDevice(Sharing::SharedCrossStreams), "test")
        .unwrap();
    let out = hosted_output(&[4], "out");
    let write = b
        .compile(CompileRequest::routine(
            "write",
            &Assignments::pointwise_unop(&shared, UnOp::Neg, &hosted_iota(&[4], "x")),
        ))
        .unwrap();
    let read = b
        .compile(CompileRequest::routine(
            "read",
            &Assignments::pointwise_unop(&out, UnOp::Identity, &shared),
        ))
        .unwrap();
    {
        let r = Context::new(&stream).link(&write).unwrap();
        r.run().unwrap();
        stream.await_work().unwrap();
    }
    let r = Context::new(&stream).link(&read).unwrap();
    r.run().unwrap();
    stream.await_work().unwrap();
    assert_eq!(
        out.host().get_values().unwrap(),
        vec![0.0, -1.0, -2.0, -3.0]
    );
}

/// Many scalar results from the same hosted scalar: the optimizer runs their statements under
/// one loop of a single iteration, which bound more arrays than a WGSL pass may (32) and could
/// not be split (`distribute_loop` took only loops of independent iterations): a
/// `LimitExceeded` on wgpu. Now split into passes that fit; every backend computes them.
#[test]
fn a_fused_run_of_scalar_statements_over_many_arrays_runs_on_every_backend() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let x = Tnode::new(Prec::F32, &[], &["x"]).unwrap();
        x.host().set_values(&[3.0]).unwrap();
        let outs: Vec<Tnode> = (0..48)
            .map(|k| {
                let y = Tnode::new(Prec::F32, &[], &[&format!("y{k}")]).unwrap();
                y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
                    .unwrap();
                y
            })
            .collect();
        let prog = Assignments::Seq(
            outs.iter()
                .map(|y| Assignments::pointwise_binop(y, BinOp::Mul, &x, &x))
                .collect(),
        );
        let code = backend
            .compile(CompileRequest::routine("scalars", &prog))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        for y in &outs {
            routine.context().to_host(y).unwrap();
        }
        stream.await_work().unwrap();
        for y in &outs {
            assert_eq!(y.host().get_value(&[]).unwrap(), 9.0, "{name}");
        }
    }
}

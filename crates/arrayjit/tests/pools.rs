//! Pools: the backend's pool interface, the link-time planner (deterministic, printable,
//! lifetime reuse for scratch locals), per-device constants, finalize, and memory accounting.

use arrayjit::Error;
use arrayjit::prelude::*;
use arrayjit_testing::{check_case, scratch_locals};

fn hosted(dims: &[usize], label: &str, values: &[f64]) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.host().set_values(values).unwrap();
    t
}

fn result(dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

#[test]
fn backend_pool_interface() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let lowered = b.lowered();
    let before = lowered.runtime().used_memory(0);
    lowered
        .runtime()
        .alloc_pool(0, 1_000_001, 4096, 128)
        .unwrap();
    assert_eq!(lowered.runtime().used_memory(0), before + 4096);
    assert!(lowered.runtime().pools(0).contains(&(1_000_001, 4096)));
    assert!(
        lowered.runtime().alloc_pool(0, 1_000_001, 16, 64).is_err(),
        "duplicate id"
    );
    assert!(
        lowered.runtime().alloc_pool(0, 1_000_002, 16, 48).is_err(),
        "alignment not a power of two"
    );
    assert!(
        lowered.runtime().alloc_pool(3, 1_000_003, 16, 64).is_err(),
        "no such device"
    );
    let view = lowered
        .runtime()
        .pool_view(0, 1_000_001, 1024, 256)
        .unwrap();
    // SAFETY: the test's own buffers, one call at a time.
    unsafe { lowered.runtime().copy_from_host(&view, &[7u8; 256], None) }.unwrap();
    let mut back = vec![0u8; 256];
    // SAFETY: the test's own buffers, one call at a time.
    unsafe { lowered.runtime().copy_to_host(&view, &mut back, None) }.unwrap();
    assert_eq!(back, vec![7u8; 256]);
    // SAFETY: the test's own buffers, one call at a time.
    unsafe { lowered.runtime().memset_zero(0, 1_000_001, 1024 + 128, 128) }.unwrap();
    // SAFETY: the test's own buffers, one call at a time.
    unsafe { lowered.runtime().copy_to_host(&view, &mut back, None) }.unwrap();
    assert_eq!(&back[..128], &[7u8; 128][..]);
    assert_eq!(&back[128..], &[0u8; 128][..]);
    assert!(
        lowered
            .runtime()
            .pool_view(0, 1_000_001, 4000, 200)
            .is_err(),
        "view past the end"
    );
    // SAFETY: the test's own buffers, one call at a time.
    assert!(unsafe { lowered.runtime().memset_zero(0, 1_000_001, 4000, 200) }.is_err());
    assert!(
        lowered.runtime().pool_view(0, 42_424_242, 0, 1).is_err(),
        "unknown pool"
    );
    // A device the backend does not have: the same typed error from every runtime.
    let devices = lowered.runtime().num_devices();
    for e in [
        lowered.runtime().free_pool(devices, 1_000_001).unwrap_err(),
        lowered
            .runtime()
            .pool_view(devices, 1_000_001, 0, 1)
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, arrayjit::Error::NoSuchDevice { ordinal, .. } if ordinal == devices),
            "{e}"
        );
    }
    assert!(lowered.runtime().pools(devices).is_empty());
    lowered.runtime().free_pool(0, 1_000_001).unwrap();
    assert!(lowered.runtime().free_pool(0, 1_000_001).is_err());
    // The view keeps the memory alive (and counted) until it is dropped.
    assert_eq!(lowered.runtime().used_memory(0), before + 4096);
    drop(view);
    assert_eq!(lowered.runtime().used_memory(0), before);
}

#[test]
fn scratch_locals_share_memory_and_agree_with_the_interpreter() {
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        // Loop fusion off: it joins the four passes into one loop, where the temporaries'
        // lifetimes overlap (the corpus checks that program fused).
        b.set_optimize_settings(arrayjit::opt::OptimizeSettings {
            enable_loop_fusion: false,
            ..b.optimize_settings()
        });
        let case = scratch_locals().unwrap();
        let code = b
            .compile(CompileRequest::routine("scratch", &case.program))
            .unwrap();
        let plan = &code.optimized().scratch;
        assert_eq!(plan.slots.len(), 3, "{plan}");
        // t1 (statements 0-1) and t3 (2-3) do not overlap in time: they share memory.
        assert!(plan.total_bytes() < plan.bump_bytes(), "{plan}");
        assert_eq!(plan.total_bytes(), 2 * 20_032, "{plan}");
        check_case(&scratch_locals().unwrap(), &b).unwrap();
    }
}

#[test]
fn link_time_plans_are_deterministic_and_printable() {
    let plan_text = || {
        let b = arrayjit::backend("sync_cc").unwrap();
        let x = hosted(&[10], "x", &[1.0; 10]);
        let w = hosted(&[3, 10], "w", &[0.5; 30]);
        let y = result(&[3], "y");
        let p = Assignments::einsum(
            "ij,j->i",
            BinOp::Add,
            &y,
            AccumRhs::Binop(BinOp::Mul, Operand::Node(w), Operand::Node(x)),
            true,
        )
        .unwrap();
        let code = b.compile(CompileRequest::routine("plan", &p)).unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let r = Context::new(&stream).link(&code).unwrap();
        r.run().unwrap();
        assert_eq!(y.host().get_values().unwrap(), vec![5.0; 3]);
        r.context().memory_plan().unwrap().to_string()
    };
    let (a, b) = (plan_text(), plan_text());
    assert_eq!(a, b);
    assert!(a.contains("1 pool(s)") && a.contains("whole pool"), "{a}");
    // Offsets are aligned to 64 bytes: w (120 bytes) at 0, x (40) at 128, y (12) at 192.
    assert!(a.contains("@        0:      120 bytes"), "{a}");
}

#[test]
fn finalize_returns_a_contexts_memory() {
    let b = arrayjit::backend("multicore_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let before = dev.used_memory();
    let x = hosted(&[1000], "x", &[1.0; 1000]);
    let y = result(&[1000], "y");
    let code = b
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = dev.new_stream().unwrap();
    let r = Context::new(&stream).link(&code).unwrap();
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap()[999], -1.0);
    let plan_bytes = r.context().memory_plan().unwrap().total_bytes();
    assert_eq!(dev.used_memory(), before + plan_bytes);
    r.context().finalize().unwrap();
    drop(r);
    stream.await_work().unwrap();
    assert_eq!(dev.used_memory(), before);
}

#[test]
fn constants_are_shared_per_device_and_never_written() {
    let b = arrayjit::backend("multicore_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let table = hosted(&[256], "table", &[2.0; 256]);
    table
        .update_memory_mode(
            MemoryMode::Hosted(MemoryType::Constant),
            "test: a constant table",
        )
        .unwrap();
    let x = hosted(&[256], "x", &[3.0; 256]);
    let y = result(&[256], "y");
    let code = b
        .compile(CompileRequest::routine(
            "scale",
            &Assignments::pointwise_binop(&y, BinOp::Mul, &x, &table),
        ))
        .unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let before = dev.used_memory();
    let r1 = Context::new(&s1).link(&code).unwrap();
    let after_first = dev.used_memory();
    let r2 = Context::new(&s2).link(&code).unwrap();
    let after_second = dev.used_memory();
    // The table (a constant) uses its host array in place (cc's `use_host_memory`): no device
    // memory. The second context allocates y only, not x (hosted, read by routines of both
    // streams and written by none, so shared: see `Context::link`).
    assert_eq!(after_first - before, 2048);
    assert_eq!(after_second - after_first, 1024);
    assert_eq!(
        x.memory_mode().unwrap().mode,
        MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams))
    );
    r1.run().unwrap();
    r2.run().unwrap();
    assert_eq!(y.host().get_values().unwrap()[0], 6.0);
    let write = b
        .compile(CompileRequest::routine(
            "overwrite",
            &Assignments::pointwise_unop(&table, UnOp::Neg, &x),
        ))
        .unwrap();
    let err = Context::new(&s1).link(&write).unwrap_err();
    assert!(
        matches!(&err, Error::WriteRefused { routine, reason, .. }
            if routine == "overwrite" && reason.contains("constant")),
        "{err}"
    );
}

#[test]
fn an_array_larger_than_a_pool_gets_a_pool_of_its_own() {
    // The pool size limit groups arrays; it never refuses one (issue 40).
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = b.name();
        b.set_max_pool_bytes(1024);
        let values: Vec<f64> = (0..1000).map(f64::from).collect();
        let x = hosted(&[1000], "x", &values);
        let y = result(&[1000], "y");
        let code = b
            .compile(CompileRequest::routine(
                "big",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let r = Context::new(&stream).link(&code).unwrap();
        r.run().unwrap();
        let got = y.host().get_values().unwrap();
        assert!(got.iter().zip(&values).all(|(g, v)| *g == -v), "{name}");
    }
}

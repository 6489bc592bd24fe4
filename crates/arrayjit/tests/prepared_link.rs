//! Links prepared ahead of the compiled code (`Context::prepare_link`, `PreparedLink::finish`),
//! on every backend with streams available here: the arrays made while the routine compiles
//! on another thread serve the routine as a plain link's would, a finish with other code is a
//! typed error that leaves nothing behind, and an abandoned preparation frees what it made.

use arrayjit::Error;
use arrayjit::opt::OptimizeCtx;
use arrayjit::prelude::*;
use arrayjit::runtime::PreparedLink;

mod common;
use common::{hosted_output, update_program};

/// The CPU backends, and `wgpu` and `cuda` where they can run here.
fn backends() -> Vec<Backend> {
    arrayjit_testing::backends_under_test(&["sync_cc", "multicore_cc", "cuda_emu", "wgpu", "cuda"])
        .unwrap()
}

#[test]
fn arrays_made_while_the_routine_compiles_serve_it_as_a_link_would() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, x, w, y) = update_program();
        let ctx = OptimizeCtx::empty();
        let optimized = b.optimize_in(&ctx, "update", &prog, &[]).unwrap();
        let context = Context::new(&b.get_device(0).unwrap().new_stream().unwrap());
        let (codes, prepared) = std::thread::scope(|scope| {
            let preparing = scope.spawn(|| context.prepare_link(&optimized));
            let codes = b.compile(CompileRequest::optimized(std::slice::from_ref(&optimized)));
            (codes, preparing.join().unwrap())
        });
        let code = codes.unwrap().pop().unwrap();
        let prepared: PreparedLink = prepared.unwrap();
        assert_eq!(prepared.routine_name(), "update", "{name}");
        let routine = prepared.finish(&code).unwrap();
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![22.0, 44.0, 66.0, 88.0],
            "{name}"
        );
        // A host write after the arrays were made reaches the routine (host_sync rule 4).
        x.host().set_values(&[0.5, 0.5, 0.5, 0.5]).unwrap();
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![23.0, 45.0, 67.0, 89.0],
            "{name}"
        );
        assert_eq!(
            w.host().get_values().unwrap(),
            vec![11.5, 22.5, 33.5, 44.5],
            "{name}"
        );
        // The same program linked the plain way computes the same.
        let (prog2, _, _, y2) = update_program();
        let plain = Context::new(&b.get_device(0).unwrap().new_stream().unwrap())
            .link(
                &b.compile(CompileRequest::routine("update", &prog2))
                    .unwrap(),
            )
            .unwrap();
        plain.run().unwrap();
        assert_eq!(
            y2.host().get_values().unwrap(),
            vec![22.0, 44.0, 66.0, 88.0],
            "{name}"
        );
    }
}

#[test]
fn finishing_with_other_code_is_an_error_that_leaves_nothing_behind() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, _, w, y) = update_program();
        let ctx = OptimizeCtx::empty();
        let device = b.get_device(0).unwrap();
        let context = Context::new(&device.new_stream().unwrap());
        let before = device.used_memory();
        let optimized = b.optimize_in(&ctx, "update", &prog, &[]).unwrap();
        // The same routine optimized again is another optimization: its code does not match.
        let again = b.optimize_in(&ctx, "update", &prog, &[]).unwrap();
        let other = b
            .compile(CompileRequest::optimized(&[again]))
            .unwrap()
            .pop()
            .unwrap();
        let mode_before = w.memory_mode().map(|m| m.mode);
        let prepared = context.prepare_link(&optimized).unwrap();
        assert!(
            device.used_memory() > before,
            "{name}: the prepared link made no arrays"
        );
        let err = prepared.finish(&other).unwrap_err();
        assert!(
            matches!(&err, Error::PreparedLinkMismatch { prepared, given }
                if prepared == "update" && given == "update"),
            "{name}: {err}"
        );
        assert!(
            err.to_string().contains("CompileRequest::optimized"),
            "{err}"
        );
        assert_eq!(
            device.used_memory(),
            before,
            "{name}: the failed finish kept memory"
        );
        assert!(!context.has(&w) && !context.has(&y), "{name}");
        // The sharing of `w`, which the routine writes, was not decided by the failed finish
        // (a link that commits makes it per stream).
        assert_eq!(w.memory_mode().map(|m| m.mode), mode_before, "{name}");
        assert!(
            !matches!(
                mode_before,
                Some(MemoryMode::Hosted(MemoryType::ChangedOnDevices(
                    Sharing::PerStream
                )))
            ),
            "{name}: {mode_before:?}"
        );
        context.link(&other).unwrap();
        assert_eq!(
            w.memory_mode().map(|m| m.mode),
            Some(MemoryMode::Hosted(MemoryType::ChangedOnDevices(
                Sharing::PerStream
            ))),
            "{name}"
        );
    }
}

#[test]
fn an_abandoned_preparation_frees_its_arrays() {
    for b in backends() {
        let name = b.name().to_string();
        let (prog, ..) = update_program();
        let device = b.get_device(0).unwrap();
        let context = Context::new(&device.new_stream().unwrap());
        let before = device.used_memory();
        let optimized = b
            .optimize_in(&OptimizeCtx::empty(), "update", &prog, &[])
            .unwrap();
        let prepared = context.prepare_link(&optimized).unwrap();
        assert!(prepared.new_pool_bytes() > 0, "{name}: {prepared:?}");
        assert!(device.used_memory() > before, "{name}");
        drop(prepared);
        assert_eq!(
            device.used_memory(),
            before,
            "{name}: dropped arrays kept memory"
        );
    }
}

#[test]
fn a_preparation_refuses_what_a_link_refuses() {
    // An input that is neither in the context nor hosted cannot be linked, prepared or not.
    let b = arrayjit::backend("sync_cc").unwrap();
    let x = Tnode::new(Prec::F32, &[4], &["unhosted"]).unwrap();
    x.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
        .unwrap();
    let y = hosted_output(&[4], "y");
    let prog = Assignments::pointwise_unop(&y, UnOp::Neg, &x);
    let optimized = b
        .optimize_in(&OptimizeCtx::empty(), "negate", &prog, &[])
        .unwrap();
    let context = Context::new(&b.get_device(0).unwrap().new_stream().unwrap());
    let err = context.prepare_link(&optimized).unwrap_err();
    assert!(matches!(err, Error::NodeNotInContext { .. }), "{err}");
}

#[test]
fn code_of_another_backend_is_refused_and_leaves_nothing_behind() {
    let (sync, multi) = (
        arrayjit::backend("sync_cc").unwrap(),
        arrayjit::backend("multicore_cc").unwrap(),
    );
    let (prog, ..) = update_program();
    let code = sync
        .compile(CompileRequest::routine("update", &prog))
        .unwrap();
    let device = multi.get_device(0).unwrap();
    let context = Context::new(&device.new_stream().unwrap());
    let before = device.used_memory();
    let err = context.link(&code).unwrap_err();
    assert!(
        matches!(&err, Error::WrongBackend { code_backend, context_backend }
            if code_backend == "sync_cc" && context_backend == "multicore_cc"),
        "{err}"
    );
    assert_eq!(device.used_memory(), before);
}

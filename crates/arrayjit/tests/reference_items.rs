//! Conformance tests named after the items of the reference documents in
//! `../shared/reference/` they cover (`<document>__<item>`), run on both CPU backends (and any
//! backend named in the test), so a reader can map a reference item to the test that checks it.

#![allow(non_snake_case)] // `<document>__<item>`: the double underscore separates the two.

use arrayjit::ir::tnode;
use arrayjit::prelude::*;
use arrayjit::runtime::ChildMergeNode;

#[path = "common/reference.rs"]
#[allow(dead_code)]
mod reference;
use reference::*;

#[path = "reference_items/tnode_items.rs"]
mod tnode_items;

/// Runs `f` with a `tracing` subscriber that keeps events at `max` or more severe; returns what
/// it logged and `f`'s result.
fn capture_logs<R>(max: tracing::Level, f: impl FnOnce() -> R) -> (String, R) {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(max)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    (text, result)
}

/// `ocannl-backend-intf-device.txt`, `optimize_ctx` / `empty_optimize_ctx` / `make_context
/// ?optimize_ctx` / `make_child ?optimize_ctx`: a context remembers the computations of the
/// virtual nodes of the routines compiled in it, so a later routine reading such a node inlines
/// it too; without the context, the same routine fails with a memory-mode conflict.
#[test]
fn backend_intf_device__optimize_ctx_inlines_virtual_nodes_of_earlier_routines() {
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let program = || {
            let x = input("x", &[1.0, -2.0, 3.0]);
            let t = Tnode::new(Prec::F32, &[3], &["t"]).unwrap();
            let y1 = Tnode::new(Prec::F32, &[3], &["y1"]).unwrap();
            let y2 = Tnode::new(Prec::F32, &[3], &["y2"]).unwrap();
            for y in [&y1, &y2] {
                y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
                    .unwrap();
            }
            let first = Assignments::pointwise_unop(&t, UnOp::Relu, &x)
                .then(Assignments::pointwise_unop(&y1, UnOp::Abs, &t));
            let second = Assignments::pointwise_unop(&y2, UnOp::Neg, &t);
            (t, y1, y2, first, second)
        };
        // In one context: the second routine recomputes t from x.
        let (t, y1, y2, first, second) = program();
        let root = Context::new(&stream);
        let code1 = root
            .compile(CompileRequest::routine("first", &first))
            .unwrap();
        assert_eq!(t.memory_mode().unwrap().mode, MemoryMode::Virtual);
        let learned = root.optimize_ctx().computed_nodes();
        assert_eq!(learned.len(), 1);
        assert_eq!(learned[0].0, t);
        assert_eq!(learned[0].1, "first");
        let r1 = root.link(&code1).unwrap();
        r1.run().unwrap();
        // A child shares what the root learned.
        let code2 = r1
            .context()
            .compile(CompileRequest::routine("second", &second))
            .unwrap();
        assert!(
            !code2.optimized().nodes.iter().any(|r| r.used && r.tn == t),
            "t was not inlined"
        );
        let r2 = r1.context().link(&code2).unwrap();
        r2.run().unwrap();
        assert_eq!(
            y1.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
        assert_eq!(
            y2.host().get_values().unwrap(),
            vec![-1.0, 0.0, -3.0],
            "{name}"
        );
        // A context made with that optimize context knows it too.
        let other = Context::with_optimize_ctx(&stream, root.optimize_ctx().clone());
        assert!(
            other
                .compile(CompileRequest::routine("second_again", &second))
                .is_ok()
        );
        // An empty optimize context (a child given one, or plain compile) does not.
        let (_, _, _, first, second) = program();
        let fresh = Context::new(&stream);
        fresh
            .compile(CompileRequest::routine("first", &first))
            .unwrap();
        let forgetful = fresh
            .make_child(
                Some(arrayjit::opt::OptimizeCtx::empty()),
                ChildMergeNode::Inherit,
            )
            .unwrap();
        let e = forgetful
            .compile(CompileRequest::routine("second", &second))
            .unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::MemoryModeConflict(_)),
            "{name}: {e}"
        );
        assert!(
            backend
                .compile(CompileRequest::routine("second", &second))
                .is_err()
        );
    }
}

/// `ocannl-backend-intf-device.txt`, `make_context ?ctx_buffers`: a context over device arrays
/// the caller made, whose bytes are the nodes' values; hosted nodes, wrong sizes and devices
/// are refused.
#[test]
fn backend_intf_device__make_context_with_explicit_arrays() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let lowered = backend.lowered();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let a = Tnode::new(Prec::F32, &[3], &["a"]).unwrap();
        a.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: given")
            .unwrap();
        let buffer = lowered.runtime().alloc_zeroed(0, 12).unwrap();
        let bytes: Vec<u8> = [1.0f32, -2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_from_host(&buffer, &bytes, None) }.unwrap();
        let y = result("y", 3);
        let ctx = Context::with_arrays(
            &stream,
            vec![(a.clone(), buffer)],
            arrayjit::opt::OptimizeCtx::empty(),
        )
        .unwrap();
        assert!(ctx.has(&a));
        let code = backend
            .compile(CompileRequest::routine(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &a),
            ))
            .unwrap();
        ctx.link(&code).unwrap().run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
        // Refused: a hosted node, a buffer of the wrong size.
        let h = input("h", &[1.0, 2.0, 3.0]);
        let b = lowered.runtime().alloc_zeroed(0, 12).unwrap();
        let empty = arrayjit::opt::OptimizeCtx::empty;
        assert!(Context::with_arrays(&stream, vec![(h, b)], empty()).is_err());
        let small = lowered.runtime().alloc_zeroed(0, 8).unwrap();
        let e = Context::with_arrays(&stream, vec![(a.clone(), small)], empty()).unwrap_err();
        assert!(matches!(e, arrayjit::Error::ShapeMismatch { .. }), "{e}");
    }
}

/// `ocannl-lowered-backend-missing.txt` / `ocannl-schedulers-multicore.txt`, `initialize` and
/// `is_initialized`: one backend per name in the process; a second `initialize` returns it
/// (same devices), so a hosted constant read from streams of both handles has one array; other
/// settings for an initialized backend are refused; unknown and unavailable names are errors
/// and leave nothing initialized.
#[test]
fn backend_any_common__initialize_is_process_wide() {
    // (No other test of this file initializes a backend.)
    assert!(!arrayjit::is_initialized("multicore_cc"));
    let a = arrayjit::initialize(Some("multicore_cc")).unwrap();
    assert!(arrayjit::is_initialized("multicore_cc"));
    let b = arrayjit::initialize(Some("multicore_cc")).unwrap();
    assert!(a.same_as(&b));
    let (da, db) = (a.get_device(0).unwrap(), b.get_device(0).unwrap());
    assert_eq!(da.uid(), db.uid());
    // A separate instance is not the process-wide one.
    assert!(!arrayjit::backend("multicore_cc").unwrap().same_as(&a));
    // A node shared across streams, written on a stream of one handle and read on a stream of
    // the other: one array on the device, holding the writer's values.
    let x = input("x", &[1.0, 2.0]);
    let table = Tnode::new(Prec::F32, &[2], &["table"]).unwrap();
    table
        .update_memory_mode(
            MemoryMode::OnDevice(Sharing::SharedCrossStreams),
            "test: shared",
        )
        .unwrap();
    let y = result("y", 2);
    let fill = a
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
    let writer = Context::new(&da.new_stream().unwrap()).link(&fill).unwrap();
    writer.run().unwrap();
    let reader = Context::new(&db.new_stream().unwrap()).link(&read).unwrap();
    reader.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![1.0, 2.0]);
    assert_eq!(
        writer.context().copy_id(&table).unwrap(),
        reader.context().copy_id(&table).unwrap()
    );
    // Other settings: refused, naming the ones in use.
    let other = arrayjit::runtime::RuntimeConfig {
        queue_capacity: 7,
        ..Default::default()
    };
    let e = arrayjit::runtime::initialize_with_config(Some("multicore_cc"), &other).unwrap_err();
    assert!(
        matches!(e, arrayjit::Error::InvalidSetting { .. })
            && e.to_string().contains("once per process"),
        "{e}"
    );
    // Unknown and unavailable backends.
    assert!(matches!(
        arrayjit::initialize(Some("tpu")),
        Err(arrayjit::Error::UnknownBackend { .. })
    ));
    assert!(!arrayjit::is_initialized("tpu"));
    assert!(arrayjit::initialize(Some("metal")).is_err());
    assert!(!arrayjit::is_initialized("metal"));
}

/// `ocannl-lowered-backend-missing.txt` / `ocannl-schedulers-multicore.txt`, `make_child
/// ?ctx_arrays`: a child of the same stream whose parent is the given context, holding the
/// parent's arrays when none are given, else exactly the given ones (checked like
/// `make_context ?ctx_arrays`); a merge node other than the parent's is refused.
#[test]
fn backend_device_common__make_child_with_ctx_arrays() {
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let lowered = backend.lowered();
        let a = Tnode::new(Prec::F32, &[3], &["a"]).unwrap();
        a.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: given")
            .unwrap();
        let array_of = |values: [f32; 3]| {
            let buffer = lowered.runtime().alloc_zeroed(0, 12).unwrap();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
            // SAFETY: the test's own buffer, before any work uses it.
            unsafe { lowered.runtime().copy_from_host(&buffer, &bytes, None) }.unwrap();
            buffer
        };
        let empty = arrayjit::opt::OptimizeCtx::empty();
        let parent = Context::with_arrays(
            &stream,
            vec![(a.clone(), array_of([1.0, -2.0, 3.0]))],
            empty,
        )
        .unwrap();
        // No arrays given: the parent's.
        let same = parent.make_child(None, ChildMergeNode::Inherit).unwrap();
        assert!(
            same.parent()
                .is_some_and(|p| p.describe() == parent.describe())
        );
        assert_eq!(same.copy_id(&a).unwrap(), parent.copy_id(&a).unwrap());
        // Arrays given: exactly those, on the same stream.
        let child = parent
            .make_child_with_arrays(
                vec![(a.clone(), array_of([-4.0, 5.0, -6.0]))],
                None,
                ChildMergeNode::Inherit,
            )
            .unwrap();
        assert!(
            child
                .parent()
                .is_some_and(|p| p.describe() == parent.describe())
        );
        assert!(child.stream().name() == parent.stream().name());
        assert_ne!(child.copy_id(&a).unwrap(), parent.copy_id(&a).unwrap());
        let y = result("y", 3);
        let code = backend
            .compile(CompileRequest::routine(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &a),
            ))
            .unwrap();
        child.link(&code).unwrap().run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![0.0, 5.0, 0.0],
            "{name}"
        );
        parent.link(&code).unwrap().run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
        let without = parent
            .make_child_with_arrays(vec![], None, ChildMergeNode::Inherit)
            .unwrap();
        assert!(!without.has(&a));
        // Refused: a wrong size, a hosted node.
        let wrong = lowered.runtime().alloc_zeroed(0, 8).unwrap();
        let e = parent
            .make_child_with_arrays(vec![(a.clone(), wrong)], None, ChildMergeNode::Inherit)
            .unwrap_err();
        assert!(matches!(e, arrayjit::Error::ShapeMismatch { .. }), "{e}");
        let hosted = input("h", &[1.0, 2.0, 3.0]);
        let e = parent
            .make_child_with_arrays(
                vec![(hosted, array_of([0.0; 3]))],
                None,
                ChildMergeNode::Inherit,
            )
            .unwrap_err();
        assert!(e.to_string().contains("hosted"), "{e}");
        // The merge-buffer node: inherited, set to another, or cleared.
        let (g, other) = (input("g", &[0.0]), input("other", &[0.0]));
        let merging = parent
            .make_child(None, ChildMergeNode::Node(g.clone()))
            .unwrap();
        assert_eq!(merging.merge_node(), Some(&g));
        let inherits = merging.make_child(None, ChildMergeNode::Inherit).unwrap();
        assert_eq!(inherits.merge_node(), Some(&g));
        let switched = merging
            .make_child_with_arrays(vec![], None, ChildMergeNode::Node(other.clone()))
            .unwrap();
        assert_eq!(switched.merge_node(), Some(&other));
        let cleared = merging.make_child(None, ChildMergeNode::Nothing).unwrap();
        assert_eq!(cleared.merge_node(), None);
    }
}

//! Conformance tests named after the items of the reference documents in
//! `../shared/reference/` they cover (`<document>__<item>`), run on both CPU backends (and any
//! backend named in the test), so a reader can map a reference item to the test that checks it.

#![allow(non_snake_case)] // `<document>__<item>`: the double underscore separates the two.

use arrayjit::prelude::*;

const CPU_BACKENDS: [&str; 2] = ["sync_cc", "multicore_cc"];

fn input(label: &str, values: &[f64]) -> Tnode {
    let t = Tnode::new(Prec::F32, &[values.len()], &[label]).unwrap();
    t.set_values(values).unwrap();
    t
}

/// An f32 node of `n` elements that routines write and the host reads.
fn result(label: &str, n: usize) -> Tnode {
    let t = Tnode::new(Prec::F32, &[n], &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

/// The backend named `name` and a new stream on its device 0.
fn backend_and_stream(name: &str) -> (Backend, Stream) {
    let backend = arrayjit::backend(name).unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    (backend, stream)
}

fn mode(tn: &Tnode) -> MemoryMode {
    tn.memory_mode().unwrap().mode
}

/// `ocannl-ir-tnode.txt`, `memory_type`: `Nonconstant` is "one of `Changed_on_devices`,
/// `Volatile`"; a hosted node that a routine writes changes on devices, and the optimizer says
/// so (with the routine's name in the provenance). Read-only hosted nodes keep their type.
#[test]
fn tnode__memory_type_nonconstant_refines_to_changed_on_devices_when_written() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let x = input("x", &[1.0, -2.0, 3.0]);
        x.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "test: an input",
        )
        .unwrap();
        let y = Tnode::new(Prec::F32, &[3], &["y"]).unwrap();
        y.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "test: a result",
        )
        .unwrap();
        let code = backend
            .compile(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
                &[],
            )
            .unwrap();
        assert_eq!(
            mode(&y),
            MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::Unset))
        );
        let why = y.memory_mode().unwrap().provenance;
        assert!(
            why.contains("test: a result") && why.contains("relu writes it"),
            "{why}"
        );
        // Read only: still one of the two.
        assert_eq!(mode(&x), MemoryMode::Hosted(MemoryType::Nonconstant));
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![1.0, 0.0, 3.0], "{name}");
        // Asking for the abstract type again is already satisfied.
        y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: again")
            .unwrap();
    }
}

/// `ocannl-ir-tnode.txt`, `memory_type`: `Volatile` "will only change on any device via a
/// from_host call": routines read it (and see the host's new values after `from_host`), and a
/// routine writing it is refused at link time, naming the node, its mode and why it has it.
#[test]
fn tnode__memory_type_volatile_changes_only_from_the_host() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let x = input("x", &[1.0, -2.0, 3.0]);
        x.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Volatile),
            "test: fed by the host",
        )
        .unwrap();
        let y = Tnode::new(Prec::F32, &[3], &["y"]).unwrap();
        y.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "test: a result",
        )
        .unwrap();
        let read = backend
            .compile(
                "read",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
                &[],
            )
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&read).unwrap();
        routine.run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![1.0, 0.0, 3.0], "{name}");
        x.set_values(&[-1.0, 5.0, 0.5]).unwrap();
        routine.context().from_host(&x).unwrap();
        routine.run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![0.0, 5.0, 0.5], "{name}");
        // A routine writing it.
        let z = input("z", &[1.0, 1.0, 1.0]);
        let write = backend
            .compile(
                "write_x",
                &Assignments::pointwise_unop(&x, UnOp::Neg, &z),
                &[],
            )
            .unwrap();
        let e = routine.context().link(&write).unwrap_err().to_string();
        assert!(
            e.contains("write_x") && e.contains("hosted volatile") && e.contains("fed by the host"),
            "{e}"
        );
        // Nothing changed: the first routine still runs.
        routine.run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![0.0, 5.0, 0.5], "{name}");
    }
}

/// `ocannl-ir-tnode.txt`, `memory_type`: `Constant` "does not change after initialization": a
/// routine writing a hosted constant is refused at link time.
#[test]
fn tnode__memory_type_constant_is_never_written_on_devices() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let c = input("c", &[1.0, 2.0]);
        c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
            .unwrap();
        let z = input("z", &[1.0, 1.0]);
        let write = backend
            .compile(
                "write_c",
                &Assignments::pointwise_unop(&c, UnOp::Neg, &z),
                &[],
            )
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let e = Context::new(&stream).link(&write).unwrap_err().to_string();
        assert!(
            e.contains("write_c") && e.contains("hosted constant") && e.contains("weights"),
            "{e}"
        );
    }
}

/// `ocannl-ir-tnode.txt`, `delayed_prec` and `update_prec`: a node's precision can be decided
/// after it is made, until its first use fixes it; later requests for another precision are a
/// typed error naming both, and change nothing.
#[test]
fn tnode__delayed_prec_and_update_prec() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let x = Tnode::new_delayed_prec(Prec::F32, &[3], &["x"]).unwrap();
        assert!(!x.prec_is_fixed());
        x.update_prec(Prec::F16, "test: first thought").unwrap();
        x.update_prec(Prec::F64, "test: the model computes in f64")
            .unwrap();
        x.set_values(&[1.5, -2.25, 3.0]).unwrap(); // first use: fixed
        assert!(x.prec_is_fixed());
        assert_eq!(x.prec(), Prec::F64);
        assert_eq!(x.size_in_bytes(), 24);
        x.update_prec(Prec::F64, "test: the same again").unwrap();
        let e = x.update_prec(Prec::Bf16, "test: too late").unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, arrayjit::Error::PrecisionFixed { .. })
                && text.contains("f64")
                && text.contains("the model computes in f64")
                && text.contains("too late"),
            "{text}"
        );
        assert_eq!(x.prec(), Prec::F64);
        // Never asked for: the default, fixed by the first use (here: lowering).
        let y = Tnode::new_delayed_prec(Prec::F32, &[3], &["y"]).unwrap();
        y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let code = backend
            .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
            .unwrap();
        assert_eq!(y.prec(), Prec::F32);
        assert!(y.update_prec(Prec::F64, "test: after compiling").is_err());
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![-1.5, 2.25, -3.0], "{name}");
    }
}

/// `ocannl-ir-tnode.txt`, `create_from_padded`: a node over an existing padded host array, which
/// is moved in: the node's logical dims are the array's less its margins, and code reads the
/// margins as they are.
#[test]
fn tnode__create_from_padded() {
    use arrayjit::ir::{AxisPadding, Padding};
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        // Storage 1 + 3 + 1 with margins holding the pad value 0.
        let nd = Ndarray::from_f64(Prec::F32, &[5], &[0.0, 1.0, 2.0, 3.0, 0.0]).unwrap();
        let padding = Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }],
            value: 0.0,
        };
        let x = Tnode::from_padded_host_array(nd, Some(padding.clone()), &["x"]).unwrap();
        assert_eq!(x.dims(), &[3]);
        assert_eq!(x.padded_dims(), &[5]);
        assert_eq!(x.padding(), Some(&padding));
        assert!(x.is_hosted());
        assert_eq!(x.get_values().unwrap(), vec![1.0, 2.0, 3.0]);
        let y = result("y", 3);
        let code = backend
            .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![-1.0, -2.0, -3.0], "{name}");
        // Margins that leave no element are refused.
        let small = Ndarray::from_f64(Prec::F32, &[2], &[0.0, 0.0]).unwrap();
        assert!(Tnode::from_padded_host_array(small, Some(padding.clone()), &["z"]).is_err());
    }
}

/// `ocannl-ir-tnode.txt`, `create_with_reshape`: a node over an existing host array read with
/// other dims (row-major, same element count), moved in; a count that does not match is a
/// shape error.
#[test]
fn tnode__create_with_reshape() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let base = Ndarray::from_f64(Prec::F32, &[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let m = Tnode::from_reshaped_host_array(base, &[2, 3], None, &["m"]).unwrap();
        assert_eq!(m.dims(), &[2, 3]);
        assert_eq!(m.get_value(&[1, 0]).unwrap(), 4.0);
        // Row sums through a contraction.
        let r = result("r", 2);
        let sum = Assignments::einsum(
            "ij->i",
            BinOp::Add,
            &r,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
            true,
        )
        .unwrap();
        let code = backend.compile("row_sums", &sum, &[]).unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(r.get_values().unwrap(), vec![6.0, 15.0], "{name}");
        let base = Ndarray::from_f64(Prec::F32, &[6], &[0.0; 6]).unwrap();
        let e = Tnode::from_reshaped_host_array(base, &[4, 2], None, &["bad"]).unwrap_err();
        assert!(matches!(e, arrayjit::Error::ShapeMismatch { .. }), "{e}");
    }
}

/// `ocannl-ir-tnode.txt`, `backend_info`, `update_code_name`, `log_debug_info`: the runtime
/// notes where a linked array lives; a code name given by the user is sanitized and stays
/// unique; the debug information says everything known of the node.
#[test]
fn tnode__backend_info_update_code_name_and_log_debug_info() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let x = input("x", &[1.0, 2.0]);
        let y = result("y", 2);
        y.update_code_name("***");
        assert_eq!(y.code_name(), format!("n{}_y", y.id()));
        y.update_code_name("my output; DROP */ evil");
        assert_eq!(y.code_name(), format!("n{}_my_output_DROP_evil", y.id()));
        let code = backend
            .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
            .unwrap();
        // The generated code names the array by it (with its position), never by raw text.
        assert!(code.source().contains("my_output_DROP_evil_"), "{name}");
        assert!(!code.source().contains("DROP */"), "{name}");
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        let info = y.backend_info();
        assert!(
            info.contains("routine neg") && info.contains("pool"),
            "{name}: {info}"
        );
        let debug = y.debug_info();
        assert!(
            debug.contains(&y.header()) && debug.contains("host array") && debug.contains(&info),
            "{debug}"
        );
        y.log_debug_info();
    }
}

/// `ocannl-ir-tnode.txt`, `print_accessible_headers` / `log_accessible_headers` and the
/// `Registry`: the headers of every live node a predicate accepts; dropped nodes are gone.
#[test]
fn tnode__print_accessible_headers() {
    let a = input("registry_probe_a", &[1.0]);
    let b = input("registry_probe_b", &[2.0]);
    let ours = |t: &Tnode| t.label().iter().any(|l| l.starts_with("registry_probe"));
    let headers = Tnode::accessible_headers(ours);
    assert_eq!(headers, vec![a.header(), b.header()]);
    drop(b);
    assert_eq!(Tnode::accessible_headers(ours), vec![a.header()]);
    Tnode::print_accessible_headers(ours);
    Tnode::log_accessible_headers(ours);
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
        let code1 = root.compile("first", &first, &[]).unwrap();
        assert_eq!(t.memory_mode().unwrap().mode, MemoryMode::Virtual);
        let learned = root.optimize_ctx().computed_nodes();
        assert_eq!(learned.len(), 1);
        assert_eq!(learned[0].0, t);
        assert_eq!(learned[0].1, "first");
        let r1 = root.link(&code1).unwrap();
        r1.run().unwrap();
        // A child shares what the root learned.
        let code2 = r1.context().compile("second", &second, &[]).unwrap();
        assert!(
            !code2.optimized().nodes.iter().any(|r| r.used && r.tn == t),
            "t was not inlined"
        );
        let r2 = r1.context().link(&code2).unwrap();
        r2.run().unwrap();
        assert_eq!(y1.get_values().unwrap(), vec![1.0, 0.0, 3.0], "{name}");
        assert_eq!(y2.get_values().unwrap(), vec![-1.0, 0.0, -3.0], "{name}");
        // A context made with that optimize context knows it too.
        let other = Context::with_optimize_ctx(&stream, root.optimize_ctx().clone());
        assert!(other.compile("second_again", &second, &[]).is_ok());
        // An empty optimize context (a child given one, or plain compile) does not.
        let (_, _, _, first, second) = program();
        let fresh = Context::new(&stream);
        fresh.compile("first", &first, &[]).unwrap();
        let forgetful = fresh
            .make_child(Some(arrayjit::ir::OptimizeCtx::empty()), None)
            .unwrap();
        let e = forgetful.compile("second", &second, &[]).unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::MemoryModeConflict(_)),
            "{name}: {e}"
        );
        assert!(backend.compile("second", &second, &[]).is_err());
    }
}

/// `ocannl-ir-tnode.txt`, `known_not_materialized`, `known_constant`, `known_volatile`,
/// `known_non_cross_stream`, `potentially_cross_stream`, `default_to_most_local` and the
/// `is_*_force` queries, and `update_memory_sharing`.
#[test]
fn tnode__known_queries_force_and_update_memory_sharing() {
    let node = |label: &str| Tnode::new(Prec::F32, &[2], &[label]).unwrap();
    let undecided = node("u");
    assert!(undecided.potentially_cross_stream() && !undecided.known_non_cross_stream());
    assert!(!undecided.known_constant() && !undecided.known_not_materialized());
    // Forcing settles the most local mode: virtual.
    assert!(undecided.is_virtual_force("test: force").unwrap());
    assert!(undecided.known_not_materialized() && undecided.known_non_cross_stream());
    let m = node("m");
    m.update_memory_mode(MemoryMode::Materialized, "test: keep it")
        .unwrap();
    assert!(m.is_materialized_force("test: force").unwrap());
    assert_eq!(
        m.memory_mode().unwrap().mode,
        MemoryMode::OnDevice(Sharing::Unset)
    );
    assert!(!m.is_hosted_force("test: force").unwrap());
    assert!(m.potentially_cross_stream());
    m.update_memory_sharing(Sharing::PerStream, "test: one per stream")
        .unwrap();
    assert!(m.known_non_cross_stream());
    // Another sharing now contradicts it, naming both requests.
    let e = m
        .update_memory_sharing(Sharing::SharedCrossStreams, "test: shared after all")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("one per stream") && e.contains("shared after all"),
        "{e}"
    );
    // Hosted nonconstant keeps being hosted: it changes on devices, shared.
    let h = node("h");
    h.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    h.update_memory_sharing(Sharing::SharedCrossStreams, "test: shared")
        .unwrap();
    assert_eq!(
        h.memory_mode().unwrap().mode,
        MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams))
    );
    assert!(h.potentially_cross_stream());
    // Constant and volatile.
    let c = node("c");
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
        .unwrap();
    assert!(c.known_constant() && c.potentially_cross_stream());
    assert!(
        c.update_memory_sharing(Sharing::PerStream, "test: no")
            .is_err()
    );
    let v = node("v");
    v.update_memory_mode(MemoryMode::Hosted(MemoryType::Volatile), "test: fed")
        .unwrap();
    assert!(v.known_volatile() && v.known_non_cross_stream());
    // Local nodes have nothing to share.
    let l = node("l");
    l.update_memory_mode(MemoryMode::Local, "test: scratch")
        .unwrap();
    assert!(
        l.update_memory_sharing(Sharing::SharedCrossStreams, "test: no")
            .is_err()
    );
}

/// `ocannl-lowered-backend-missing.txt`, `compile_batch` (over optional routines) and
/// `link_batch`: empty slots stay empty, the routines compile in one run, link one after the
/// other (a later routine finds the arrays an earlier one made), and a failed link leaves no
/// memory behind.
#[test]
fn lowered_backend__compile_batch_with_empty_slots_and_link_batch() {
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let x = input("x", &[1.0, -2.0]);
        let a = Tnode::new(Prec::F32, &[2], &["a"]).unwrap();
        a.update_memory_mode(
            MemoryMode::OnDevice(Sharing::Unset),
            "test: kept on the device",
        )
        .unwrap();
        let y = result("y", 2);
        let first = Assignments::pointwise_unop(&a, UnOp::Neg, &x);
        let second = Assignments::pointwise_unop(&y, UnOp::Relu, &a);
        let root = Context::new(&stream);
        let codes = backend
            .compile_batch_slots(
                root.optimize_ctx(),
                &[Some(("first", &first)), None, Some(("second", &second))],
                &[],
            )
            .unwrap();
        assert!(codes[0].is_some() && codes[1].is_none() && codes[2].is_some());
        let (last, routines) = root.link_batch(&codes).unwrap();
        assert!(routines[1].is_none());
        assert!(last.has(&a) && last.has(&y));
        routines[0].as_ref().unwrap().run().unwrap();
        routines[2].as_ref().unwrap().run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![0.0, 2.0], "{name}");
        // A batch whose second link fails (it writes a hosted constant) frees what the first
        // link allocated.
        let c = input("c", &[0.0, 0.0]);
        c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
            .unwrap();
        let bad = backend
            .compile("bad", &Assignments::pointwise_unop(&c, UnOp::Neg, &x), &[])
            .unwrap();
        let device = backend.get_device(0).unwrap();
        let before = device.used_memory();
        let e = root.link_batch(&[codes[0].clone(), Some(bad)]).unwrap_err();
        assert!(e.to_string().contains("hosted constant"), "{e}");
        // Uploads the first link scheduled keep their arrays until they have run.
        stream.await_work().unwrap();
        assert_eq!(device.used_memory(), before, "{name}");
        // All slots empty: nothing to compile.
        let none = backend
            .compile_batch_slots(root.optimize_ctx(), &[None, None], &[])
            .unwrap();
        assert!(none.iter().all(Option::is_none));
    }
}

/// `rune-backend-intf.txt` / `ocannl-lowered-backend-missing.txt`, `compile` of source and
/// getting a kernel by name: hand-written C on the cc backends, launched on the backend's own
/// buffers with the launch checks of compiled routines; a compile error says what failed; a
/// backend that takes no source says so.
#[test]
fn lowered_backend__compile_source_and_get_kernel() {
    use arrayjit::codegen::{KernelInterface, SourceKernel};
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let lowered = backend.lowered();
        let x = Tnode::new(Prec::F32, &[4], &["x"]).unwrap();
        let interface = KernelInterface {
            name: "double".into(),
            symbol: "aj_test_double".into(),
            args: vec![x],
            merge: None,
            statics: vec![],
            scratch_bytes: 0,
        };
        let source = "#include <stdint.h>\n\
            void aj_test_double(uint8_t *const *args, const int64_t *statics, const void *w) {\n\
              (void)statics; (void)w;\n\
              float *x = (float *)args[0];\n\
              for (int i = 0; i < 4; ++i) x[i] *= 2.0f;\n\
            }\n";
        // SAFETY: the kernel has the cc signature and touches its buffer's 16 bytes only.
        let batch =
            unsafe { lowered.compile_source(source, &[SourceKernel::cpu(interface.clone())]) }
                .unwrap();
        let k = batch.kernel_index("double").unwrap();
        assert_eq!(batch.kernel_index("aj_test_double"), Some(k));
        assert_eq!(batch.kernel_index("missing"), None);
        let buffer = lowered.alloc_zeroed(0, 16).unwrap();
        let values: Vec<u8> = [1.0f32, 2.0, -3.0, 0.5]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        lowered.copy_from_host(&buffer, &values, None).unwrap();
        batch
            .launch(k, std::slice::from_ref(&buffer), &[], None)
            .unwrap();
        let mut out = vec![0u8; 16];
        lowered.copy_to_host(&buffer, &mut out, None).unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![2.0, 4.0, -6.0, 1.0], "{name}");
        // Launch checks: a buffer too small is refused before the kernel runs.
        let small = lowered.alloc_zeroed(0, 8).unwrap();
        assert!(batch.launch(k, &[small], &[], None).is_err());
        // A compile error is typed and says what failed.
        let e = unsafe { lowered.compile_source("this is not C", &[SourceKernel::cpu(interface)]) }
            .unwrap_err();
        assert!(matches!(e, arrayjit::Error::CompileFailed(_)), "{e}");
    }
    let metal = arrayjit::backend("metal").unwrap();
    let e = unsafe { metal.lowered().compile_source("", &[]) }.unwrap_err();
    assert!(
        matches!(e, arrayjit::Error::BackendUnavailable { .. }) && e.to_string().contains("metal"),
        "{e}"
    );
}

/// `ocannl-ir-tnode.txt`, `sharing` and its "possible algorithm for deciding sharing within a
/// single device": a hosted node that routines on two streams of a device read and none
/// writes is shared across the streams (one array, one upload, and a within-device copy is a
/// no-op); a node a routine writes becomes per stream, and a later request to share it is an
/// error naming both provenances.
#[test]
fn tnode__sharing_inferred_across_streams() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let device = backend.get_device(0).unwrap();
        let (s1, s2) = (device.new_stream().unwrap(), device.new_stream().unwrap());
        let x = input("x", &[1.0, -2.0, 3.0]);
        x.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: data")
            .unwrap();
        let out = |label: &str| {
            let y = Tnode::new(Prec::F32, &[3], &[label]).unwrap();
            y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
                .unwrap();
            y
        };
        let (y1, y2) = (out("y1"), out("y2"));
        let a = backend
            .compile(
                "relu_x",
                &Assignments::pointwise_unop(&y1, UnOp::Relu, &x),
                &[],
            )
            .unwrap();
        let b = backend
            .compile(
                "neg_x",
                &Assignments::pointwise_unop(&y2, UnOp::Neg, &x),
                &[],
            )
            .unwrap();
        let shared_before = device.shared_array_count();
        let r1 = Context::new(&s1).link(&a).unwrap();
        // One stream reading it decides nothing yet.
        assert_eq!(
            x.memory_mode().unwrap().mode,
            MemoryMode::Hosted(MemoryType::Nonconstant)
        );
        let r2 = Context::new(&s2).link(&b).unwrap();
        let m = x.memory_mode().unwrap();
        assert_eq!(
            m.mode,
            MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams)),
            "{name}"
        );
        assert!(
            m.provenance.contains("relu_x") && m.provenance.contains("neg_x"),
            "{}",
            m.provenance
        );
        assert_eq!(device.shared_array_count(), shared_before + 1, "{name}");
        assert_eq!(
            r1.context().copy_id(&x).unwrap(),
            r2.context().copy_id(&x).unwrap()
        );
        r1.run().unwrap();
        r2.run().unwrap();
        assert_eq!(y1.get_values().unwrap(), vec![1.0, 0.0, 3.0], "{name}");
        assert_eq!(y2.get_values().unwrap(), vec![-1.0, 2.0, -3.0], "{name}");
        // New host values reach both streams through the one array.
        x.set_values(&[-1.0, 4.0, 0.0]).unwrap();
        r1.context().from_host(&x).unwrap();
        r1.run().unwrap();
        r2.run().unwrap();
        assert_eq!(y1.get_values().unwrap(), vec![0.0, 4.0, 0.0], "{name}");
        assert_eq!(y2.get_values().unwrap(), vec![1.0, -4.0, 0.0], "{name}");
        // Within one device, moving the shared node between the streams copies nothing.
        r2.context()
            .device_to_device(&x, MergeBufferUse::No, r1.context())
            .unwrap();
        // The results were written by routines: per stream.
        assert_eq!(
            y1.memory_mode().unwrap().mode,
            MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::PerStream)),
            "{name}"
        );
        let e = y1
            .update_memory_sharing(Sharing::SharedCrossStreams, "test: share the result")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("relu_x writes it") && e.contains("share the result"),
            "{e}"
        );
    }
}

/// A cc backend that records the memory mode of every pool the runtime asks for, and every
/// upload from the host (`(byte offset, bytes)`).
#[derive(Debug)]
struct RecordingPools {
    inner: arrayjit::backends::cc::CcBackend,
    modes: std::sync::Mutex<Vec<Option<MemoryMode>>>,
    uploads: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl RecordingPools {
    fn new() -> std::sync::Arc<RecordingPools> {
        use arrayjit::backends::cc::{CcBackend, CcConfig};
        std::sync::Arc::new(RecordingPools {
            inner: CcBackend::new(CcConfig::from_env().unwrap()).unwrap(),
            modes: Default::default(),
            uploads: Default::default(),
        })
    }
}

mod recording {
    use super::RecordingPools;
    use arrayjit::backends::{BufferHandle, CompiledBatch, DeviceInfo, LoweredBackend, Queue};
    use arrayjit::ir::{MemoryMode, Optimized, Result};
    use std::sync::Arc;

    impl LoweredBackend for RecordingPools {
        fn name(&self) -> &str {
            "recording"
        }
        fn check_available(&self) -> Result<()> {
            self.inner.check_available()
        }
        fn num_devices(&self) -> usize {
            self.inner.num_devices()
        }
        fn alloc_zeroed(&self, device: usize, size: usize) -> Result<BufferHandle> {
            self.inner.alloc_zeroed(device, size)
        }
        fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], q: Queue<'_>) -> Result<()> {
            self.uploads.lock().unwrap().push((0, src.len()));
            self.inner.copy_from_host(dst, src, q)
        }
        fn copy_from_host_range(
            &self,
            dst: &BufferHandle,
            offset: usize,
            src: &[u8],
            q: Queue<'_>,
        ) -> Result<()> {
            self.uploads.lock().unwrap().push((offset, src.len()));
            self.inner.copy_from_host_range(dst, offset, src, q)
        }
        fn copy_to_host(&self, src: &BufferHandle, dst: &mut [u8], q: Queue<'_>) -> Result<()> {
            self.inner.copy_to_host(src, dst, q)
        }
        fn copy_buffer(&self, d: &BufferHandle, s: &BufferHandle, q: Queue<'_>) -> Result<()> {
            self.inner.copy_buffer(d, s, q)
        }
        fn used_memory(&self, device: usize) -> usize {
            self.inner.used_memory(device)
        }
        fn alloc_pool(&self, device: usize, id: usize, size: usize, align: usize) -> Result<()> {
            self.inner.alloc_pool(device, id, size, align)
        }
        fn alloc_pool_for(
            &self,
            device: usize,
            id: usize,
            size: usize,
            align: usize,
            mode: Option<MemoryMode>,
        ) -> Result<()> {
            self.modes.lock().unwrap().push(mode);
            self.inner.alloc_pool(device, id, size, align)
        }
        fn device_info(&self, device: usize) -> Result<DeviceInfo> {
            self.inner.device_info(device)
        }
        fn free_pool(&self, device: usize, id: usize) -> Result<()> {
            self.inner.free_pool(device, id)
        }
        fn memset_zero(&self, device: usize, id: usize, offset: usize, size: usize) -> Result<()> {
            self.inner.memset_zero(device, id, offset, size)
        }
        fn pool_view(
            &self,
            device: usize,
            id: usize,
            offset: usize,
            size: usize,
        ) -> Result<BufferHandle> {
            self.inner.pool_view(device, id, offset, size)
        }
        fn pools(&self, device: usize) -> Vec<(usize, usize)> {
            self.inner.pools(device)
        }
        fn compile_batch(&self, routines: &[&Optimized]) -> Result<Arc<dyn CompiledBatch>> {
            self.inner.compile_batch(routines)
        }
        fn debug_info(&self) -> String {
            self.inner.debug_info()
        }
    }
}

/// `ocannl-backend-intf-device.txt`, `alloc_pool ?mode`: the runtime tells the backend the
/// memory mode of a pool's arrays when they share one (here: the device-only arrays of one
/// link, and the stream's scratch, local), so a backend can choose the storage.
#[test]
fn backend_intf_device__alloc_pool_gets_the_memory_mode() {
    let lowered = RecordingPools::new();
    let backend = Backend::from_lowered("recording", lowered.clone());
    let x = input("x", &[1.0, 2.0]);
    let a = Tnode::new(Prec::F32, &[2], &["a"]).unwrap();
    a.update_memory_mode(
        MemoryMode::OnDevice(Sharing::PerStream),
        "test: device only",
    )
    .unwrap();
    let code = backend
        .compile("neg", &Assignments::pointwise_unop(&a, UnOp::Neg, &x), &[])
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let ctx = Context::new(&stream).init_from_host(&x).unwrap();
    ctx.link(&code).unwrap().run().unwrap();
    let modes = lowered.modes.lock().unwrap().clone();
    assert!(
        modes.contains(&Some(MemoryMode::OnDevice(Sharing::PerStream))),
        "{modes:?}"
    );
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
        let buffer = lowered.alloc_zeroed(0, 12).unwrap();
        let bytes: Vec<u8> = [1.0f32, -2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        lowered.copy_from_host(&buffer, &bytes, None).unwrap();
        let y = result("y", 3);
        let ctx = Context::with_arrays(
            &stream,
            vec![(a.clone(), buffer)],
            arrayjit::ir::OptimizeCtx::empty(),
        )
        .unwrap();
        assert!(ctx.has(&a));
        let code = backend
            .compile(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &a),
                &[],
            )
            .unwrap();
        ctx.link(&code).unwrap().run().unwrap();
        assert_eq!(y.get_values().unwrap(), vec![1.0, 0.0, 3.0], "{name}");
        // Refused: a hosted node, a buffer of the wrong size.
        let h = input("h", &[1.0, 2.0, 3.0]);
        let b = lowered.alloc_zeroed(0, 12).unwrap();
        let empty = arrayjit::ir::OptimizeCtx::empty;
        assert!(Context::with_arrays(&stream, vec![(h, b)], empty()).is_err());
        let small = lowered.alloc_zeroed(0, 8).unwrap();
        let e = Context::with_arrays(&stream, vec![(a.clone(), small)], empty()).unwrap_err();
        assert!(matches!(e, arrayjit::Error::ShapeMismatch { .. }), "{e}");
    }
}

/// `ocannl-lowered-backend-missing.txt`, `use_host_memory`: on the CPU backends a hosted
/// volatile or constant node's host array is its device array, used in place: no device memory,
/// no copies; host changes reach the next run; a host write waits for the work scheduled to
/// read the array before it (checked with a large array on `multicore_cc`, where runs are
/// asynchronous); `ARRAYJIT_USE_HOST_MEMORY=0` (here `CcConfig::use_host_memory`) turns it off.
#[test]
fn lowered_backend__use_host_memory() {
    use arrayjit::backends::cc::{CcBackend, CcConfig};
    let n = 1 << 22; // 16 MiB of f32
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let device = backend.get_device(0).unwrap();
        let stream = device.new_stream().unwrap();
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.set_values_with(|k| (k % 7) as f64).unwrap();
        x.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Volatile),
            "test: fed by the host",
        )
        .unwrap();
        let y = result("y", n);
        let code = backend
            .compile(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
                &[],
            )
            .unwrap();
        let before = device.used_memory();
        let routine = Context::new(&stream).link(&code).unwrap();
        // Only y got device memory.
        assert_eq!(device.used_memory() - before, 4 * n, "{name}");
        assert!(
            x.backend_info().contains("in place"),
            "{}",
            x.backend_info()
        );
        routine.run().unwrap();
        // The host write waits for the run scheduled before it: y sees the old values.
        x.set_values_with(|_| -1.0).unwrap();
        let got = y.get_values().unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(k, &v)| v == 2.0 * (k % 7) as f64),
            "{name}: the run saw a host write made after it"
        );
        // The next run sees the new values, with no from_host.
        routine.run().unwrap();
        assert!(y.get_values().unwrap().iter().all(|&v| v == -2.0), "{name}");
        // Between two streams, moving the node copies nothing (both use the host array).
        let other = Context::new(&device.new_stream().unwrap())
            .init_from_host(&x)
            .unwrap();
        other
            .device_to_device(&x, MergeBufferUse::No, routine.context())
            .unwrap();
        routine.context().to_host(&x).unwrap();
        assert_eq!(x.get_value(&[3]).unwrap(), -1.0);
    }
    // Off: x gets a device array of its own.
    let mut config = CcConfig::from_env().unwrap();
    config.use_host_memory = false;
    let backend = Backend::from_lowered(
        "sync_cc",
        std::sync::Arc::new(CcBackend::new(config).unwrap()),
    );
    let device = backend.get_device(0).unwrap();
    let x = input("x", &[1.0, 2.0]);
    x.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
        .unwrap();
    let y = result("y", 2);
    let code = backend
        .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
        .unwrap();
    let before = device.used_memory();
    let r = Context::new(&device.new_stream().unwrap())
        .link(&code)
        .unwrap();
    assert!(device.used_memory() - before >= 16);
    r.run().unwrap();
    assert_eq!(y.get_values().unwrap(), vec![-1.0, -2.0]);
}

/// `use_host_memory` with host writes made by a task of the reading stream itself: the write
/// does not wait for the routine scheduled after it on the same stream (which cannot run before
/// the task ends), and that routine sees the write.
#[test]
fn lowered_backend__use_host_memory_host_write_inside_a_task() {
    let backend = arrayjit::backend("multicore_cc").unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let x = input("x", &[1.0, 2.0]);
    x.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Volatile),
        "test: fed by the host",
    )
    .unwrap();
    let y = result("y", 2);
    let code = backend
        .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
        .unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    let x2 = x.clone();
    stream
        .schedule_task(move || x2.set_values(&[5.0, 6.0]))
        .unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    assert_eq!(y.get_values().unwrap(), vec![-5.0, -6.0]);
}

/// `use_host_memory` under load: two streams read one in-place host array while the host
/// rewrites it 200 times; every run sees exactly the version written before it was scheduled,
/// whole (no run sees half of one version and half of the next).
#[test]
fn lowered_backend__use_host_memory_under_concurrent_streams() {
    let backend = arrayjit::backend("multicore_cc").unwrap();
    let device = backend.get_device(0).unwrap();
    let n = 1 << 16;
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.set_values_with(|_| 0.0).unwrap();
    x.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Volatile),
        "test: fed by the host",
    )
    .unwrap();
    let (y1, y2) = (result("y1", n), result("y2", n));
    let copy = |y: &Tnode, name: &str| {
        backend
            .compile(
                name,
                &Assignments::pointwise_unop(y, UnOp::Identity, &x),
                &[],
            )
            .unwrap()
    };
    let r1 = Context::new(&device.new_stream().unwrap())
        .link(&copy(&y1, "copy1"))
        .unwrap();
    let r2 = Context::new(&device.new_stream().unwrap())
        .link(&copy(&y2, "copy2"))
        .unwrap();
    for k in 1..=200 {
        x.set_values_with(|_| k as f64).unwrap();
        r1.run().unwrap();
        r2.run().unwrap();
        if k % 20 == 0 {
            for y in [&y1, &y2] {
                let v = y.get_values().unwrap();
                assert!(
                    v.iter().all(|&e| e == k as f64),
                    "version {k}: {:?}",
                    &v[..4]
                );
            }
        }
    }
}

/// `ocannl-lowered-backend-missing.txt`, `to_host` with an offset and a partial size: elements of a copy
/// holding the latest values reach the host array, the rest waits for the full refresh; a
/// lagging copy and a range outside the array are errors.
#[test]
fn lowered_backend__to_host_with_offset_and_partial_size() {
    // wgpu (where a Vulkan driver is) takes the trait's default: the whole buffer, then the part.
    let gpu = arrayjit::available_backends()
        .into_iter()
        .filter(|b| *b == "wgpu");
    for name in CPU_BACKENDS.into_iter().chain(gpu) {
        let (backend, stream) = backend_and_stream(name);
        let n = 1000;
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.set_values_with(|k| k as f64).unwrap();
        let y = result("y", n);
        let code = backend
            .compile(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
                &[],
            )
            .unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host_range(&y, 10..20).unwrap();
        // Read the host array as it is (no refresh): only elements 10..20 came over.
        let raw = y
            .with_host(|nd| nd.to_vec_f64())
            .expect("to_host_range makes the host array")
            .unwrap();
        assert_eq!(raw[9], 0.0, "{name}");
        assert_eq!(
            &raw[10..20],
            &(10..20).map(|k| 2.0 * k as f64).collect::<Vec<_>>()[..]
        );
        assert_eq!(raw[20], 0.0, "{name}");
        // The full refresh is still pending: reading the values brings the rest.
        assert_eq!(y.get_values().unwrap()[999], 1998.0, "{name}");
        // Out of range.
        let e = routine.context().to_host_range(&y, 990..1001).unwrap_err();
        assert!(matches!(e, arrayjit::Error::IndexOutOfBounds { .. }), "{e}");
        // The host changed y: the device copy lags, so a part of it would be stale.
        y.set_value(&[0], 5.0).unwrap();
        assert!(routine.context().to_host_range(&y, 0..1).is_err(), "{name}");
    }
}

/// `ocannl-lowered-backend-missing.txt`, `from_host` with an offset and a partial size: after
/// `set_value`, a copy lags in that element only, and uploading that part makes it current (the
/// next run uploads nothing more and sees the change); a copy lagging wholly stays lagging.
#[test]
fn lowered_backend__from_host_with_offset_and_partial_size() {
    let gpu = arrayjit::available_backends()
        .into_iter()
        .filter(|b| *b == "wgpu");
    for name in CPU_BACKENDS.into_iter().chain(gpu) {
        let (backend, stream) = backend_and_stream(name);
        let n = 100;
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.set_values_with(|k| k as f64).unwrap();
        x.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: data")
            .unwrap();
        let y = result("y", n);
        let code = backend
            .compile(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
                &[],
            )
            .unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        let copy = routine.context().copy_id(&x).unwrap();
        assert!(x.copy_not_lagging(copy));
        // Two elements change on the host: the copy lags there only.
        x.set_value(&[5], 100.0).unwrap();
        x.set_value(&[7], 200.0).unwrap();
        assert_eq!(x.copy_lagging_ranges(copy), Some(vec![(5, 6), (7, 8)]));
        routine.context().from_host_range(&x, 5..6).unwrap();
        assert!(!x.copy_not_lagging(copy), "{name}: element 7 still lags");
        routine.context().from_host_range(&x, 7..8).unwrap();
        assert!(x.copy_not_lagging(copy), "{name}");
        routine.run().unwrap();
        let got = y.get_values().unwrap();
        assert_eq!((got[5], got[6], got[7]), (200.0, 12.0, 400.0), "{name}");
        // A whole-array change: a part does not make the copy current.
        x.set_values_with(|_| 1.0).unwrap();
        routine.context().from_host_range(&x, 0..10).unwrap();
        assert!(!x.copy_not_lagging(copy), "{name}");
        routine.run().unwrap();
        assert!(y.get_values().unwrap().iter().all(|&v| v == 2.0), "{name}");
        // Out of range.
        let e = routine.context().from_host_range(&x, 95..101).unwrap_err();
        assert!(matches!(e, arrayjit::Error::IndexOutOfBounds { .. }), "{e}");
    }
}

/// `ocannl-ir-tnode.txt`, `devices_not_lagging_host` per element range, as a routine's run
/// uses it: a copy lagging the host in a few elements (`set_value`) gets only those uploaded
/// before the run; a copy lagging in more than half of the array, or wholly, gets the whole
/// array.
#[test]
fn tnode__run_uploads_only_the_lagging_elements() {
    let lowered = RecordingPools::new();
    let backend = Backend::from_lowered("recording", lowered.clone());
    let n = 1000;
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.set_values_with(|k| k as f64).unwrap();
    x.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: data")
        .unwrap();
    let y = result("y", n);
    let code = backend
        .compile("neg", &Assignments::pointwise_unop(&y, UnOp::Neg, &x), &[])
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    let uploads = |expected: &[(usize, usize)]| {
        let got = std::mem::take(&mut *lowered.uploads.lock().unwrap());
        assert_eq!(got, expected);
    };
    uploads(&[(0, 4 * n)]);
    x.set_value(&[10], 5.5).unwrap();
    x.set_value(&[11], 6.5).unwrap();
    x.set_value(&[900], -1.0).unwrap();
    routine.run().unwrap();
    uploads(&[(40, 8), (3600, 4)]);
    let got = y.get_values().unwrap();
    assert_eq!(
        (got[10], got[11], got[12], got[900]),
        (-5.5, -6.5, -12.0, 1.0)
    );
    // Nothing changed: nothing uploaded.
    routine.run().unwrap();
    uploads(&[]);
    // More than half of the array: the whole of it, once.
    for k in 0..600 {
        x.set_value(&[k], 1.0).unwrap();
    }
    routine.run().unwrap();
    uploads(&[(0, 4 * n)]);
    assert_eq!(y.get_values().unwrap()[599], -1.0);
}

/// `rune-backend-intf.txt`, `device_buffer` (a native buffer with its size and dtype) and
/// `allocate_buffer ~dtype`; `ocannl-lowered-backend-missing.txt`, `alloc_zero_init_array`:
/// buffers know the precision of their values. A context's arrays do; a launch with a buffer of
/// another precision than the kernel's array, an explicit array of another precision than its
/// node's, are errors that name both precisions; raw bytes are checked by size only.
#[test]
fn lowered_backend__buffers_know_their_precision() {
    use arrayjit::codegen::{KernelInterface, SourceKernel};
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let lowered = backend.lowered();
        let half = lowered.alloc_array(0, Prec::F16, 8).unwrap();
        assert_eq!((half.prec(), half.size_in_bytes()), (Some(Prec::F16), 16));
        assert_eq!(lowered.alloc_zeroed(0, 16).unwrap().prec(), None);

        // A routine's arrays know their node's precision.
        let x = Tnode::new(Prec::F64, &[2], &["x"]).unwrap();
        x.set_values(&[1.0, -1.0]).unwrap();
        let y = Tnode::new(Prec::F16, &[2], &["y"]).unwrap();
        y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let code = backend
            .compile(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
                &[],
            )
            .unwrap();
        let ctx = Context::new(&stream);
        let routine = ctx.link(&code).unwrap();
        routine.run().unwrap();
        let linked = routine.context();
        assert_eq!(linked.array(&x).unwrap().prec(), Some(Prec::F64), "{name}");
        assert_eq!(linked.array(&y).unwrap().prec(), Some(Prec::F16), "{name}");
        assert_eq!(y.get_values().unwrap(), vec![1.0, 0.0], "{name}");

        // A kernel of f32 arrays refuses an f16 buffer of the right size, by name.
        let v = Tnode::new(Prec::F32, &[4], &["v"]).unwrap();
        let interface = KernelInterface {
            name: "zero".into(),
            symbol: "aj_test_zero".into(),
            args: vec![v.clone()],
            merge: None,
            statics: vec![],
            scratch_bytes: 0,
        };
        let source = "#include <stdint.h>\n\
            void aj_test_zero(uint8_t *const *args, const int64_t *statics, const void *w) {\n\
              (void)statics; (void)w;\n\
              float *v = (float *)args[0];\n\
              for (int i = 0; i < 4; ++i) v[i] = 0.0f;\n\
            }\n";
        // SAFETY: the kernel has the cc signature and touches its buffer's 16 bytes only.
        let batch =
            unsafe { lowered.compile_source(source, &[SourceKernel::cpu(interface.clone())]) }
                .unwrap();
        let e = batch
            .launch(0, std::slice::from_ref(&half), &[], None)
            .unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::PrecisionMismatch { .. })
                && e.to_string().contains("argument 0 of zero")
                && e.to_string().contains("holds f16 values but f32"),
            "{e}"
        );
        let single = lowered.alloc_array(0, Prec::F32, 4).unwrap();
        batch
            .launch(0, std::slice::from_ref(&single), &[], None)
            .unwrap();

        // An explicit array of another precision than its node's is refused.
        let a = Tnode::new(Prec::F32, &[4], &["a"]).unwrap();
        let e = Context::with_arrays(
            &stream,
            vec![(a.clone(), half.clone())],
            arrayjit::ir::OptimizeCtx::empty(),
        )
        .unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::PrecisionMismatch { .. })
                && e.to_string().contains("an explicit array of"),
            "{e}"
        );
        // Raw bytes of the right size take the node's precision.
        let raw = lowered.alloc_zeroed(0, 16).unwrap();
        let ctx = Context::with_arrays(
            &stream,
            vec![(a.clone(), raw)],
            arrayjit::ir::OptimizeCtx::empty(),
        )
        .unwrap();
        assert_eq!(ctx.array(&a).unwrap().prec(), Some(Prec::F32), "{name}");
    }
}

/// The row sums a hand-written GPU kernel computes in the test below: 4 rows of 64, plus the
/// static index `k`, in CUDA C (for `cuda` and `cuda_emu`) and in WGSL (for `wgpu`). Both
/// use a 2-D block of 32 × 2 threads, shared memory and barriers.
const ROW_SUMS_CUDA: &str = include_str!("fixtures/row_sums.cu");

const ROW_SUMS_WGSL: &str = include_str!("fixtures/row_sums.wgsl");

/// `rune-backend-intf.txt`, `Compiler.compile ~source_code`, `Runtime.get_kernel` and
/// `launch_kernel ~global_dims ?local_dims`: hand-written GPU kernels compile from source and
/// launch on a 2-D grid with the given blocks, on every GPU-style backend here (`cuda_emu`
/// everywhere a C++ compiler is; `wgpu` where a Vulkan driver is; `cuda` where a GPU is), with
/// the values checked against exact sums. Bad launches and sources are typed errors.
#[test]
fn rune_backend_intf__compile_source_and_launch_with_dims() {
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    use arrayjit::ir::StaticSymbol;
    let x = Tnode::new(Prec::F32, &[4, 64], &["x"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4], &["y"]).unwrap();
    let interface = KernelInterface {
        name: "row_sums".into(),
        symbol: "aj_row_sums".into(),
        args: vec![x, y],
        merge: None,
        statics: vec![StaticSymbol::new("k", 10)],
        scratch_bytes: 0,
    };
    let launch = LaunchDims {
        grid: [2, 2, 1],
        block: [32, 2, 1],
    };
    let kernel = SourceKernel::gpu(interface, launch);
    let values: Vec<f32> = (0..256).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let expected: Vec<f32> = values
        .chunks(64)
        .map(|row| row.iter().sum::<f32>() + 3.0)
        .collect();
    let available = arrayjit::available_backends();
    let mut ran = vec![];
    for (name, source) in [
        ("cuda_emu", ROW_SUMS_CUDA),
        ("cuda", ROW_SUMS_CUDA),
        ("wgpu", ROW_SUMS_WGSL),
    ] {
        if !available.contains(&name) {
            eprintln!("{name}: skipped, not available here");
            continue;
        }
        let backend = arrayjit::backend(name).unwrap();
        let lowered = backend.lowered();
        // SAFETY: the kernel reads 256 floats of x and writes 4 of y, the sizes of its
        // interface's buffers.
        let batch =
            unsafe { lowered.compile_source(source, std::slice::from_ref(&kernel)) }.unwrap();
        let k = batch.kernel_index("row_sums").unwrap();
        let xs = lowered.alloc_array(0, Prec::F32, 256).unwrap();
        let ys = lowered.alloc_array(0, Prec::F32, 4).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        lowered.copy_from_host(&xs, &bytes, None).unwrap();
        batch
            .launch(k, &[xs.clone(), ys.clone()], &[3], None)
            .unwrap();
        lowered.synchronize(0).unwrap();
        let mut out = vec![0u8; 16];
        lowered.copy_to_host(&ys, &mut out, None).unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, expected, "{name}");
        // A static index outside its range is refused before the kernel runs.
        let e = batch.launch(k, &[xs, ys], &[10], None).unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::StaticIndex { .. }),
            "{name}: {e}"
        );
        // A launch with an empty dimension, a symbol that is no identifier: refused.
        let mut empty = kernel.clone();
        empty.launch.block = [0, 1, 1];
        let e = unsafe { lowered.compile_source(source, &[empty]) }.unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{name}: {e}");
        let mut bad = kernel.clone();
        bad.interface.symbol = "row sums".into();
        let e = unsafe { lowered.compile_source(source, &[bad]) }.unwrap_err();
        assert!(e.to_string().contains("not an identifier"), "{name}: {e}");
        ran.push(name);
    }
    if available.contains(&"wgpu") {
        // WGSL: an entry point the source lacks, and a binding the kernel does not have.
        let lowered = arrayjit::backend("wgpu").unwrap().lowered().clone();
        let mut missing = kernel.clone();
        missing.interface.symbol = "aj_missing".into();
        let e = unsafe { lowered.compile_source(ROW_SUMS_WGSL, &[missing]) }.unwrap_err();
        assert!(e.to_string().contains("no entry point aj_missing"), "{e}");
        let mut no_statics = kernel.clone();
        no_statics.interface.statics.clear();
        let e = unsafe { lowered.compile_source(ROW_SUMS_WGSL, &[no_statics]) }.unwrap_err();
        assert!(e.to_string().contains("@binding(2)"), "{e}");
    }
    eprintln!("ran on {ran:?}");
}

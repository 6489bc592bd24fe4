//! The items of `ocannl-ir-tnode.txt`: memory types and modes with their provenance, sharing,
//! precisions, padding and reshaping, headers and debug information, points of a node.

use super::*;

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
            .compile(CompileRequest::routine(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
            ))
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
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
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
            .compile(CompileRequest::routine(
                "read",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&read).unwrap();
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
        x.host().set_values(&[-1.0, 5.0, 0.5]).unwrap();
        routine.context().from_host(&x).unwrap();
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![0.0, 5.0, 0.5],
            "{name}"
        );
        // A routine writing it.
        let z = input("z", &[1.0, 1.0, 1.0]);
        let write = backend
            .compile(CompileRequest::routine(
                "write_x",
                &Assignments::pointwise_unop(&x, UnOp::Neg, &z),
            ))
            .unwrap();
        let e = routine.context().link(&write).unwrap_err().to_string();
        assert!(
            e.contains("write_x") && e.contains("hosted volatile") && e.contains("fed by the host"),
            "{e}"
        );
        // Nothing changed: the first routine still runs.
        routine.run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![0.0, 5.0, 0.5],
            "{name}"
        );
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
            .compile(CompileRequest::routine(
                "write_c",
                &Assignments::pointwise_unop(&c, UnOp::Neg, &z),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let e = Context::new(&stream).link(&write).unwrap_err().to_string();
        assert!(
            e.contains("write_c") && e.contains("hosted constant") && e.contains("weights"),
            "{e}"
        );
    }
}

/// `ocannl-ir-tnode.txt`, `Constant`: "never changes after initialization". Its host values
/// may be set (and set again) until a device holds them; after a routine read it, every host
/// write (`set_values`, `set_value`, `set_values_with`) is a typed `ConstantChanged` naming the
/// node, why it is constant and the write, and changes nothing on the host or the device.
#[test]
fn tnode__hosted_constant_host_writes_end_at_initialization() {
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let c = input("c", &[1.0, 2.0]);
        c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
            .unwrap();
        c.host().set_values(&[3.0, 4.0]).unwrap();
        c.host().set_value(&[0], 5.0).unwrap();
        let y = result("y", 2);
        let code = backend
            .compile(CompileRequest::routine(
                "neg",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &c),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let ctx = Context::new(&stream).link(&code).unwrap();
        ctx.run().unwrap();
        assert_eq!(y.host().get_values().unwrap(), vec![-5.0, -4.0], "{name}");
        for e in [
            c.host().set_values(&[7.0, 8.0]).unwrap_err(),
            c.host().set_value(&[1], 7.0).unwrap_err(),
            c.host().set_values_with(|_| 7.0).unwrap_err(),
        ] {
            let text = e.to_string();
            assert!(
                matches!(&e, arrayjit::Error::ConstantChanged { node, provenance, .. }
                    if node.contains('c') && provenance == "test: weights"),
                "{name}: {text}"
            );
            assert!(text.contains("set_value"), "{text}");
        }
        assert_eq!(c.host().get_values().unwrap(), vec![5.0, 4.0], "{name}");
        ctx.run().unwrap();
        assert_eq!(y.host().get_values().unwrap(), vec![-5.0, -4.0], "{name}");
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
        x.host().set_values(&[1.5, -2.25, 3.0]).unwrap(); // first use: fixed
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
            .compile(CompileRequest::routine(
                "neg",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap();
        assert_eq!(y.prec(), Prec::F32);
        assert!(y.update_prec(Prec::F64, "test: after compiling").is_err());
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![-1.5, 2.25, -3.0],
            "{name}"
        );
    }
    // `delayed_prec` as text: printed and read back (`sexp_of_delayed_prec`,
    // `delayed_prec_of_sexp`); anything else is a typed error listing the forms.
    use arrayjit::ir::DelayedPrec;
    for d in [
        DelayedPrec::Specified(Prec::Bf16),
        DelayedPrec::Default(Prec::F32),
    ] {
        assert_eq!(d.to_string().parse::<DelayedPrec>().unwrap(), d);
    }
    assert_eq!(
        "  Default   F64 ".parse::<DelayedPrec>().unwrap(),
        DelayedPrec::Default(Prec::F64)
    );
    for bad in ["", "default", "f33", "later f32", "default f32 f64"] {
        let e = bad.parse::<DelayedPrec>().unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::BadValue { what, value, .. }
                if what == "delayed precision" && value == bad)
                && e.to_string().contains("f32"),
            "{bad:?}: {e}"
        );
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
        assert!(x.modes().is_hosted());
        assert_eq!(x.host().get_values().unwrap(), vec![1.0, 2.0, 3.0]);
        let y = result("y", 3);
        let code = backend
            .compile(CompileRequest::routine(
                "neg",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        assert_eq!(
            y.host().get_values().unwrap(),
            vec![-1.0, -2.0, -3.0],
            "{name}"
        );
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
    use arrayjit::ir::{AxisPadding, Padding};
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        // The row sums of a 2-D node, through a contraction compiled on the backend.
        let row_sums = |m: Tnode, label: &str| {
            let r = result(label, 2);
            let sum = Assignments::einsum(
                "ij->i",
                BinOp::Add,
                &r,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
                true,
            )
            .unwrap();
            let code = backend
                .compile(CompileRequest::routine(label, &sum))
                .unwrap();
            Context::new(&stream).link(&code).unwrap().run().unwrap();
            r.host().get_values().unwrap()
        };
        let base = Ndarray::from_f64(Prec::F32, &[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let m = Tnode::from_reshaped_host_array(base, &[2, 3], None, &["m"]).unwrap();
        assert_eq!(m.dims(), &[2, 3]);
        assert_eq!(m.host().get_value(&[1, 0]).unwrap(), 4.0);
        assert_eq!(row_sums(m, "row_sums"), vec![6.0, 15.0], "{name}");
        let base = Ndarray::from_f64(Prec::F32, &[6], &[0.0; 6]).unwrap();
        let e = Tnode::from_reshaped_host_array(base, &[4, 2], None, &["bad"]).unwrap_err();
        assert!(
            matches!(
                e,
                arrayjit::Error::SizeMismatch {
                    expected: 8,
                    given: 6,
                    ..
                }
            ),
            "{e}"
        );
        // `~from_padded:false`: unpadded data laid into padded storage, margins at the pad
        // value; the logical values and the sums are those of the data.
        let padding = Padding {
            axes: vec![
                AxisPadding { left: 1, right: 0 },
                AxisPadding { left: 0, right: 1 },
            ],
            value: -1.0,
        };
        let base = Ndarray::from_f64(Prec::F32, &[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let p = Tnode::from_reshaped_unpadded_host_array(base, &[2, 3], padding.clone(), &["p"])
            .unwrap();
        assert_eq!(p.dims(), &[2, 3]);
        assert_eq!(p.padded_dims(), &[3, 4]);
        assert_eq!(
            p.host().get_values().unwrap(),
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        let stored: Vec<f32> = p
            .host()
            .with(|nd| {
                nd.as_bytes()
                    .chunks(4)
                    .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                    .collect()
            })
            .unwrap();
        assert_eq!(
            stored,
            vec![
                -1.0, -1.0, -1.0, -1.0, 1.0, 2.0, 3.0, -1.0, 4.0, 5.0, 6.0, -1.0
            ]
        );
        assert_eq!(row_sums(p, "padded_row_sums"), vec![6.0, 15.0], "{name}");
        // Bit for bit: a 64-bit integer no f64 holds exactly survives.
        let big = (1i64 << 60) + 1;
        let mut base = Ndarray::zeros(Prec::I64, &[2]).unwrap();
        base.as_bytes_mut()[..8].copy_from_slice(&big.to_ne_bytes());
        let one_axis = Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }],
            value: 0.0,
        };
        let q = Tnode::from_reshaped_unpadded_host_array(base, &[2], one_axis, &["q"]).unwrap();
        let bytes = q.host().with(|nd| nd.as_bytes()[8..16].to_vec()).unwrap();
        assert_eq!(i64::from_ne_bytes(bytes.try_into().unwrap()), big);
        // A count that does not match the dims, or padding of the wrong rank: errors.
        let base = Ndarray::from_f64(Prec::F32, &[5], &[0.0; 5]).unwrap();
        assert!(Tnode::from_reshaped_unpadded_host_array(base, &[2, 3], padding, &["e"]).is_err());
        let base = Ndarray::from_f64(Prec::F32, &[6], &[0.0; 6]).unwrap();
        let rank1 = Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }],
            value: 0.0,
        };
        assert!(Tnode::from_reshaped_unpadded_host_array(base, &[2, 3], rank1, &["e"]).is_err());
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
            .compile(CompileRequest::routine(
                "neg",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap();
        // The generated code names the array by it (with its position), never by raw text.
        assert!(code.source().contains("my_output_DROP_evil_"), "{name}");
        assert!(!code.source().contains("DROP */"), "{name}");
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        let info = arrayjit::runtime::node_sync(&y).unwrap().note();
        assert!(
            info.contains("routine neg") && info.contains("pool"),
            "{name}: {info}"
        );
        let debug = y.debug_info();
        assert!(
            debug.contains(&y.header()) && debug.contains("host array") && debug.contains(&info),
            "{debug}"
        );
        // The device wrote y: a host refresh is pending until the host reads it.
        assert!(
            arrayjit::runtime::node_sync(&y)
                .unwrap()
                .prepare_read_pending(),
            "{name}"
        );
        assert!(debug.contains("host refresh is pending"), "{debug}");
        assert_eq!(y.host().get_values().unwrap(), vec![-1.0, -2.0], "{name}");
        assert!(
            !arrayjit::runtime::node_sync(&y)
                .unwrap()
                .prepare_read_pending(),
            "{name}"
        );
        assert!(!y.debug_info().contains("pending"), "{}", y.debug_info());
        // Logged at the level asked for, and only there.
        let (logged, _) = capture_logs(tracing::Level::INFO, || {
            y.log_debug_info(tracing::Level::INFO);
            y.log_debug_info(tracing::Level::DEBUG);
        });
        assert_eq!(logged.matches(&y.header()).count(), 1, "{name}: {logged}");
        assert!(
            logged.contains("INFO") && logged.contains("arrayjit::tnode"),
            "{logged}"
        );
    }
}

/// `ocannl-ir-tnode.txt`, `print_accessible_headers` / `log_accessible_headers` and the
/// `Registry`: the headers of every live node a predicate accepts; dropped nodes are gone.
#[test]
fn tnode__print_accessible_headers() {
    let a = input("registry_probe_a", &[1.0]);
    let b = input("registry_probe_b", &[2.0]);
    let ours = |t: &Tnode| t.label().iter().any(|l| l.starts_with("registry_probe"));
    let headers = tnode::accessible_headers(ours);
    assert_eq!(headers, vec![a.header(), b.header()]);
    drop(b);
    assert_eq!(tnode::accessible_headers(ours), vec![a.header()]);
    let mut printed = Vec::new();
    tnode::write_accessible_headers(&mut printed, ours).unwrap();
    assert_eq!(
        String::from_utf8(printed).unwrap(),
        format!("{}\n", a.header())
    );
    let (logged, _) = capture_logs(tracing::Level::DEBUG, || {
        tnode::log_accessible_headers(ours, tracing::Level::DEBUG)
    });
    assert_eq!(logged.lines().count(), 1, "{logged}");
    assert!(logged.contains(&a.header()), "{logged}");
    let (quiet, _) = capture_logs(tracing::Level::INFO, || {
        tnode::log_accessible_headers(ours, tracing::Level::DEBUG)
    });
    assert!(quiet.is_empty(), "{quiet}");
    tnode::print_accessible_headers(ours);
}

/// `ocannl-ir-tnode.txt`, `known_not_materialized`, `known_constant`, `known_volatile`,
/// `known_non_cross_stream`, `potentially_cross_stream`, `default_to_most_local` and the
/// `is_*_force` queries, and `update_memory_sharing`.
#[test]
fn tnode__known_queries_force_and_update_memory_sharing() {
    let node = |label: &str| Tnode::new(Prec::F32, &[2], &[label]).unwrap();
    let undecided = node("u");
    assert!(
        undecided.modes().potentially_cross_stream() && !undecided.modes().known_non_cross_stream()
    );
    assert!(!undecided.modes().known_constant() && !undecided.modes().known_not_materialized());
    // Forcing settles the most local mode: virtual.
    assert!(undecided.modes().is_virtual_force("test: force").unwrap());
    assert!(
        undecided.modes().known_not_materialized() && undecided.modes().known_non_cross_stream()
    );
    let m = node("m");
    m.update_memory_mode(MemoryMode::Materialized, "test: keep it")
        .unwrap();
    assert!(m.modes().is_materialized_force("test: force").unwrap());
    assert_eq!(
        m.memory_mode().unwrap().mode,
        MemoryMode::OnDevice(Sharing::Unset)
    );
    assert!(!m.modes().is_hosted_force("test: force").unwrap());
    assert!(m.modes().potentially_cross_stream());
    m.modes()
        .update_sharing(Sharing::PerStream, "test: one per stream")
        .unwrap();
    assert!(m.modes().known_non_cross_stream());
    // Another sharing now contradicts it, naming both requests.
    let e = m
        .modes()
        .update_sharing(Sharing::SharedCrossStreams, "test: shared after all")
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
    h.modes()
        .update_sharing(Sharing::SharedCrossStreams, "test: shared")
        .unwrap();
    assert_eq!(
        h.memory_mode().unwrap().mode,
        MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::SharedCrossStreams))
    );
    assert!(h.modes().potentially_cross_stream());
    // Constant and volatile.
    let c = node("c");
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
        .unwrap();
    assert!(c.modes().known_constant() && c.modes().potentially_cross_stream());
    // Both keep their modes whatever sharing is asked (the reference "preserves the memory
    // mode"): devices never write them.
    for sharing in [Sharing::PerStream, Sharing::SharedCrossStreams] {
        c.modes().update_sharing(sharing, "test: kept").unwrap();
        assert_eq!(
            c.memory_mode().unwrap().mode,
            MemoryMode::Hosted(MemoryType::Constant)
        );
        assert_eq!(c.memory_mode().unwrap().provenance, "test: weights");
    }
    let v = node("v");
    v.update_memory_mode(MemoryMode::Hosted(MemoryType::Volatile), "test: fed")
        .unwrap();
    assert!(v.modes().known_volatile() && v.modes().known_non_cross_stream());
    for sharing in [Sharing::PerStream, Sharing::SharedCrossStreams] {
        v.modes().update_sharing(sharing, "test: kept").unwrap();
        assert_eq!(
            v.memory_mode().unwrap().mode,
            MemoryMode::Hosted(MemoryType::Volatile)
        );
    }
    // Local nodes have nothing to share.
    let l = node("l");
    l.update_memory_mode(MemoryMode::Local, "test: scratch")
        .unwrap();
    assert!(
        l.modes()
            .update_sharing(Sharing::SharedCrossStreams, "test: no")
            .is_err()
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
            .compile(CompileRequest::routine(
                "relu_x",
                &Assignments::pointwise_unop(&y1, UnOp::Relu, &x),
            ))
            .unwrap();
        let b = backend
            .compile(CompileRequest::routine(
                "neg_x",
                &Assignments::pointwise_unop(&y2, UnOp::Neg, &x),
            ))
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
        assert_eq!(
            y1.host().get_values().unwrap(),
            vec![1.0, 0.0, 3.0],
            "{name}"
        );
        assert_eq!(
            y2.host().get_values().unwrap(),
            vec![-1.0, 2.0, -3.0],
            "{name}"
        );
        // New host values reach both streams through the one array.
        x.host().set_values(&[-1.0, 4.0, 0.0]).unwrap();
        r1.context().from_host(&x).unwrap();
        r1.run().unwrap();
        r2.run().unwrap();
        assert_eq!(
            y1.host().get_values().unwrap(),
            vec![0.0, 4.0, 0.0],
            "{name}"
        );
        assert_eq!(
            y2.host().get_values().unwrap(),
            vec![1.0, -4.0, 0.0],
            "{name}"
        );
        // Within one device, moving the shared node between the streams copies nothing: no
        // task (copy or wait) is scheduled on either stream.
        let before = (
            r1.context().stream().scheduled_tasks(),
            r2.context().stream().scheduled_tasks(),
        );
        r2.context()
            .device_to_device(&x, MergeBufferUse::No, r1.context())
            .unwrap();
        let after = (
            r1.context().stream().scheduled_tasks(),
            r2.context().stream().scheduled_tasks(),
        );
        assert_eq!(
            before, after,
            "{name}: a copy of a shared array was scheduled"
        );
        assert_eq!(
            r1.context().copy_id(&x).unwrap(),
            r2.context().copy_id(&x).unwrap()
        );
        // The results were written by routines: per stream.
        assert_eq!(
            y1.memory_mode().unwrap().mode,
            MemoryMode::Hosted(MemoryType::ChangedOnDevices(Sharing::PerStream)),
            "{name}"
        );
        let e = y1
            .modes()
            .update_sharing(Sharing::SharedCrossStreams, "test: share the result")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("relu_x writes it") && e.contains("share the result"),
            "{e}"
        );
    }
}

/// `ocannl-ir-tnode.txt`, `points_1d` / `points_2d` (`?from_axis ~xdim ~ydim`): one axis holds
/// coordinates, every other index is a point, in row-major order of the others; a scalar, an
/// axis or coordinate past the dims are errors.
#[test]
fn tnode__points_1d_and_2d() {
    // dims [2, 3, 2]: axis 1 holds 3 coordinates; points are (i, k) for i < 2, k < 2.
    let values: Vec<f64> = (0..12).map(f64::from).collect();
    let t = input("pts", &values);
    let t3 = Tnode::new(Prec::F32, &[2, 3, 2], &["pts3"]).unwrap();
    t3.host().set_values(&values).unwrap();
    // element (i, c, k) is 6i + 2c + k.
    assert_eq!(
        t3.host().points_1d(Some(1), 2).unwrap(),
        vec![4.0, 5.0, 10.0, 11.0]
    );
    assert_eq!(
        t3.host().points_2d(Some(1), 0, 2).unwrap(),
        vec![(0.0, 4.0), (1.0, 5.0), (6.0, 10.0), (7.0, 11.0)]
    );
    // The default coordinate axis is the last.
    assert_eq!(
        t3.host().points_2d(None, 1, 0).unwrap(),
        (0..6)
            .map(|p| (2.0 * p as f64 + 1.0, 2.0 * p as f64))
            .collect::<Vec<_>>()
    );
    assert_eq!(t.host().points_1d(None, 5).unwrap(), vec![5.0]);
    // A coordinate axis the node lacks, then coordinates past the axis's end.
    let e = t3.host().points_1d(Some(3), 0).unwrap_err();
    assert!(
        matches!(
            e,
            arrayjit::Error::BadAxis {
                axis: 3,
                rank: 3,
                ..
            }
        ),
        "{e}"
    );
    for e in [
        t3.host().points_1d(Some(1), 3).unwrap_err(),
        t3.host().points_2d(None, 0, 2).unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                arrayjit::Error::IndexOutOfBounds {
                    problem: arrayjit::ir::OutOfBounds::Axis { .. },
                    ..
                }
            ),
            "{e}"
        );
    }
    let scalar = Tnode::new(Prec::F32, &[], &["s"]).unwrap();
    scalar.host().set_values(&[1.0]).unwrap();
    assert!(scalar.host().points_1d(None, 0).is_err());
    // A node without values: NotHosted, not a panic.
    let empty = Tnode::new(Prec::F32, &[2, 2], &["e"]).unwrap();
    assert!(matches!(
        empty.host().points_1d(None, 0),
        Err(arrayjit::Error::NotHosted { .. })
    ));
}

/// `ocannl-ir-tnode.txt`, `known_non_virtual` / `known_virtual`: decided from the memory mode,
/// false while undecided; a mode that still allows `Virtual` is not known either way.
#[test]
fn tnode__known_non_virtual_and_known_virtual() {
    let node = |mode: Option<MemoryMode>| {
        let t = Tnode::new(Prec::F32, &[2], &["k"]).unwrap();
        if let Some(m) = mode {
            t.update_memory_mode(m, "test").unwrap();
        }
        t
    };
    let cases = [
        (None, false, false),
        (Some(MemoryMode::Virtual), false, true),
        (Some(MemoryMode::EffectivelyConstant), false, false),
        (Some(MemoryMode::NeverVirtual), true, false),
        (Some(MemoryMode::Local), true, false),
        (Some(MemoryMode::DeviceOnly), true, false),
        (Some(MemoryMode::OnDevice(Sharing::Unset)), true, false),
        (Some(MemoryMode::Materialized), true, false),
        (Some(MemoryMode::Hosted(MemoryType::Constant)), true, false),
        (Some(MemoryMode::Hosted(MemoryType::Volatile)), true, false),
    ];
    for (mode, non_virtual, virtual_) in cases {
        let t = node(mode);
        assert_eq!(t.modes().known_non_virtual(), non_virtual, "{mode:?}");
        assert_eq!(t.modes().known_virtual(), virtual_, "{mode:?}");
    }
}

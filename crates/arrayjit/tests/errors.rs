//! Every error path a user can reach: each returns a typed error with a message that says what
//! was wrong and what to do, and leaves nothing corrupted.

use std::sync::Arc;

use arrayjit::Error;
use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::ir::OutOfBounds;
use arrayjit::prelude::*;
use arrayjit::runtime::Backend;

fn hosted_input(dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    let n: usize = dims.iter().product();
    t.host()
        .set_values(&(0..n).map(|i| i as f64).collect::<Vec<_>>())
        .unwrap();
    t
}

fn hosted_output(dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

#[test]
fn unknown_backend_lists_the_available_ones() {
    let err = arrayjit::backend("tpu").unwrap_err();
    assert!(matches!(err, Error::UnknownBackend { .. }));
    let msg = err.to_string();
    assert!(msg.contains("tpu") && msg.contains("sync_cc"), "{msg}");
}

#[test]
fn missing_backends_have_no_devices_and_explain_themselves() {
    // wgpu is missing unless this build has the feature and the machine a Vulkan driver;
    // cuda unless it has an NVIDIA GPU with its driver.
    let available = arrayjit::available_backends();
    let wgpu_here = available.contains(&"wgpu");
    for name in ["cuda", "metal", "wgpu"] {
        if available.contains(&name) {
            continue;
        }
        let b = arrayjit::backend(name).unwrap();
        assert_eq!(b.num_devices(), 0);
        let err = b.get_device(0).unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
        assert!(err.to_string().contains(name), "{err}");
        let x = hosted_input(&[2], "x");
        let y = hosted_output(&[2], "y");
        let err = b
            .compile(CompileRequest::routine(
                "r",
                &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
            ))
            .unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    }
    assert_eq!(
        matches!(
            arrayjit::initialize(Some("wgpu")),
            Err(Error::BackendUnavailable { .. })
        ),
        !wgpu_here
    );
    assert_eq!(
        arrayjit::initialize(Some("sync_cc")).unwrap().name(),
        "sync_cc"
    );
}

#[test]
fn no_such_device() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let err = b.get_device(5).unwrap_err();
    assert!(
        matches!(err, Error::NoSuchDevice { ordinal: 5, .. }),
        "{err}"
    );
}

#[test]
fn memory_mode_contradiction_is_reported_with_both_reasons() {
    let t = Tnode::new(Prec::F32, &[3], &["t"]).unwrap();
    t.update_memory_mode(MemoryMode::Virtual, "user: fuse it")
        .unwrap();
    let err = t.host().set_values(&[1.0, 2.0, 3.0]).unwrap_err();
    let msg = err.to_string();
    let Error::MemoryModeConflict(conflict) = &err else {
        panic!("expected a mode conflict, got {err}")
    };
    assert_eq!(
        conflict.old.parse::<MemoryMode>().unwrap(),
        MemoryMode::Virtual
    );
    assert!(matches!(
        conflict.new.parse::<MemoryMode>().unwrap(),
        MemoryMode::Hosted(_)
    ));
    assert_eq!(conflict.old_provenance, "user: fuse it");
    assert!(
        msg.contains("user: fuse it") && msg.contains("host"),
        "{msg}"
    );
    // Nothing changed.
    assert!(t.modes().known_virtual());
    assert!(!t.host().exists());
}

#[test]
fn linking_code_that_needs_a_node_the_context_lacks() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let hidden = Tnode::new(Prec::F32, &[3], &["hidden"]).unwrap();
    hidden
        .update_memory_mode(MemoryMode::OnDevice(Sharing::Unset), "test: device only")
        .unwrap();
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "reads_hidden",
            &Assignments::pointwise_unop(&y, UnOp::Relu, &hidden),
        ))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let ctx = Context::new(&stream);
    let err = ctx.link(&code).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NodeNotInContext { .. }), "{msg}");
    assert!(
        msg.contains("hidden") && msg.contains("reads_hidden"),
        "{msg}"
    );
    // Linking the producer first makes it work: the child context holds the node.
    let x = hosted_input(&[3], "x");
    let producer = b
        .compile(CompileRequest::routine(
            "make_hidden",
            &Assignments::pointwise_unop(&hidden, UnOp::Neg, &x),
        ))
        .unwrap();
    let r1 = ctx.link(&producer).unwrap();
    let r2 = r1.context().link(&code).unwrap();
    r1.run().unwrap();
    r2.run().unwrap();
    r2.context().to_host(&y).unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![0.0, 0.0, 0.0]);
    assert!(r2.context().parent().is_some());
}

#[test]
fn wrong_size_host_arrays_are_rejected() {
    let t = Tnode::new(Prec::F32, &[2, 3], &["t"]).unwrap();
    let err = t.host().set_values(&[1.0; 5]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                expected: 6,
                given: 5,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        t.host().set_value(&[2, 0], 1.0),
        Err(Error::IndexOutOfBounds {
            problem: OutOfBounds::Axis {
                axis: 0,
                lo: 2,
                hi: 2,
                min: 0,
                max: 1
            },
            ..
        })
    ));
    assert!(matches!(
        t.host().get_value(&[1]),
        Err(Error::IndexOutOfBounds {
            problem: OutOfBounds::Rank { given: 1, rank: 2 },
            ..
        })
    ));
    assert!(matches!(
        Ndarray::from_f64(Prec::F32, &[2], &[1.0]),
        Err(Error::SizeMismatch {
            expected: 2,
            given: 1,
            ..
        })
    ));
}

#[test]
fn bad_shapes_in_assignments_are_typed_errors() {
    let a = hosted_input(&[2, 3], "a");
    let b = hosted_input(&[4, 5], "b");
    let c = hosted_output(&[2, 5], "c");
    let err = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a.clone()), Operand::Node(b)),
        true,
    )
    .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    // Projections that reach outside a node are caught before any code runs.
    let y = hosted_output(&[3], "y");
    let mut p = Projections::pointwise(&[3], 1);
    p.project_rhs[0][0] = p.project_rhs[0][0].shifted(1);
    p.rhs_dims = vec![vec![3]];
    let x = hosted_input(&[3], "x");
    let prog = Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: y,
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(x)),
        projections: p,
    };
    let err = arrayjit::backend("sync_cc")
        .unwrap()
        .compile(CompileRequest::routine("shifted", &prog))
        .unwrap_err();
    // The shifted read takes x at 1..=3; x allows 0..=2.
    assert!(
        matches!(
            &err,
            Error::IndexOutOfBounds {
                problem: OutOfBounds::Axis { axis: 0, lo: 1, hi: 3, min: 0, max: 2 },
                array,
                ..
            } if array.starts_with("x#")
        ),
        "{err}"
    );
}

#[test]
fn static_indices_are_checked() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let data = hosted_input(&[4, 2], "data");
    let batch = StaticSymbol::new("batch", 4);
    let row = hosted_output(&[2], "row");
    let prog = Assignments::Fetch {
        array: row.clone(),
        op: FetchOp::Slice {
            batch: batch.clone(),
            sliced: data,
        },
    };
    let code = b
        .compile(CompileRequest::routine("slice", &prog).bindings(std::slice::from_ref(&batch)))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    let err = routine.run().unwrap_err();
    assert!(
        matches!(err, Error::StaticIndex { .. }) && err.to_string().contains("set_static"),
        "{err}"
    );
    assert!(routine.set_static(&batch, 4).is_err());
    assert!(routine.set_static(&batch, -1).is_err());
    routine.set_static(&batch, 3).unwrap();
    routine.run().unwrap();
    routine.context().to_host(&row).unwrap();
    assert_eq!(row.host().get_values().unwrap(), vec![6.0, 7.0]);
}

fn cc_backend(config: CcConfig) -> Backend {
    Backend::from_lowered("sync_cc", Arc::new(cc::backend(config).unwrap()))
}

#[test]
fn compile_failure_reports_stderr_and_keeps_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CcConfig::from_env().unwrap();
    config.flags.push("-DARRAYJIT_TEST_FAILURE".into());
    config.flags.push("-include".into());
    config
        .flags
        .push("/nonexistent/arrayjit-missing-header.h".into());
    config.cache_dir = Some(dir.path().join("cache"));
    let b = cc_backend(config);
    let x = hosted_input(&[2], "x");
    let y = hosted_output(&[2], "y");
    let err = b
        .compile(CompileRequest::routine(
            "doomed",
            &Assignments::pointwise_unop(&y, UnOp::Exp, &x),
        ))
        .unwrap_err();
    let Error::CompileFailed(failure) = &err else {
        panic!("expected CompileFailed, got {err}")
    };
    let (stderr, source_path) = (&failure.stderr, &failure.source_path);
    assert!(stderr.contains("arrayjit-missing-header"), "{stderr}");
    // The same, as parsed diagnostics: one fatal error naming the header.
    let diagnostics = failure.diagnostics();
    assert!(
        diagnostics
            .iter()
            .any(|d| d.severity.contains("error") && d.message.contains("arrayjit-missing-header")),
        "{diagnostics:?} from {stderr}"
    );
    let kept = std::fs::read_to_string(source_path).unwrap();
    assert!(kept.contains("aj0_doomed"), "{kept}");
}

#[test]
fn a_missing_compiler_makes_the_backend_unavailable() {
    let mut config = CcConfig::from_env().unwrap();
    config.compiler = "/nonexistent/arrayjit-cc".into();
    let b = cc_backend(config);
    let err = b.check_available().unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("CC"), "{err}");
    assert!(b.get_device(0).is_err());
}

#[test]
fn cache_hits_skip_the_compiler_and_build_files_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(dir.path().join("cache"));
    config.build_files_dir = Some(dir.path().join("build"));
    let b = cc_backend(config);
    let run = || {
        let x = hosted_input(&[4], "x");
        let y = hosted_output(&[4], "y");
        let code = b
            .compile(CompileRequest::routine(
                "cached",
                &Assignments::pointwise_unop(&y, UnOp::Sqrt, &x),
            ))
            .unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let r = Context::new(&stream).link(&code).unwrap();
        r.run().unwrap();
        r.context().to_host(&y).unwrap();
        y.host().get_values().unwrap()
    };
    let before = arrayjit::backends::cc::compile_stats();
    let first = run();
    let second = run();
    let after = arrayjit::backends::cc::compile_stats();
    assert_eq!(first, second);
    assert_eq!(first[3], 3f32.sqrt() as f64);
    assert!(
        after.cache_hits > before.cache_hits,
        "{before:?} -> {after:?}"
    );
    let cache = dir.path().join("cache");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("build"))
        .unwrap()
        .collect();
    assert!(!kept.is_empty());
}

#[test]
fn labels_with_c_metacharacters_compile_and_run() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let x = Tnode::new(
        Prec::F32,
        &[3],
        &["x\"); exit(1); //", "*/ #define float int"],
    )
    .unwrap();
    x.host().set_values(&[1.0, -2.0, 3.0]).unwrap();
    let y = Tnode::new(Prec::F32, &[3], &["y\n#error boom"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
        .unwrap();
    let prog = Assignments::BlockComment(
        "*/ #error injected /*".into(),
        Box::new(Assignments::pointwise_unop(&y, UnOp::Neg, &x)),
    );
    let code = b
        .compile(CompileRequest::routine("routine\"; #error", &prog))
        .unwrap();
    assert!(
        !code.source().contains("#error") && !code.source().contains("#define"),
        "{}",
        code.source()
    );
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let r = Context::new(&stream).link(&code).unwrap();
    r.run().unwrap();
    r.context().to_host(&y).unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-1.0, 2.0, -3.0]);
}

#[test]
fn merge_buffer_reads_need_a_copy_first() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let grad = hosted_input(&[3], "grad");
    let total = hosted_input(&[3], "total");
    let add_merge = Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Add,
        lhs: total.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Merge(grad.clone())),
        projections: Projections::pointwise(&[3], 1),
    };
    let touch = hosted_output(&[3], "touch");
    let producer = b
        .compile(CompileRequest::routine(
            "produce",
            &Assignments::pointwise_unop(&touch, UnOp::Identity, &grad),
        ))
        .unwrap();
    let consumer = b
        .compile(CompileRequest::routine("merge_add", &add_merge))
        .unwrap();
    let src = Context::new(&s1).link(&producer).unwrap();
    let dst = Context::new(&s2).link(&consumer).unwrap();
    let err = dst.run().unwrap_err();
    assert!(matches!(err, Error::MergeBuffer { .. }), "{err}");
    dst.context()
        .device_to_device(&grad, MergeBufferUse::Copy, src.context())
        .unwrap();
    dst.run().unwrap();
    dst.context().to_host(&total).unwrap();
    assert_eq!(total.host().get_values().unwrap(), vec![0.0, 2.0, 4.0]);
}

#[test]
fn used_memory_counts_context_arrays() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let dev = b.get_device(0).unwrap();
    let before = dev.used_memory();
    let x = hosted_input(&[1000], "x");
    let y = hosted_output(&[1000], "y");
    let code = b
        .compile(CompileRequest::routine(
            "mem",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = dev.new_stream().unwrap();
    let r = Context::new(&stream).link(&code).unwrap();
    assert!(
        dev.used_memory() >= before + 8000,
        "{} -> {}",
        before,
        dev.used_memory()
    );
    drop(r);
    assert!(!b.debug_info().is_empty() && stream.debug_info().contains("stream"));
}

#[test]
fn compile_batch_puts_routines_in_one_library() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let x = hosted_input(&[4], "x");
    let double = hosted_output(&[4], "double");
    let square = hosted_output(&[4], "square");
    let p1 = Assignments::pointwise_binop(&double, BinOp::Add, &x, &x);
    let p2 = Assignments::pointwise_binop(&square, BinOp::Mul, &x, &x);
    let codes = b
        .compile(CompileRequest::batch(&[("double", &p1), ("square", &p2)]))
        .unwrap();
    assert_eq!(codes.len(), 2);
    assert_eq!(codes[0].source(), codes[1].source());
    assert!(
        codes[0].source().contains("void aj0_double(")
            && codes[0].source().contains("void aj1_square(")
    );
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let r1 = Context::new(&stream).link(&codes[0]).unwrap();
    let r2 = r1.context().link(&codes[1]).unwrap();
    r1.run().unwrap();
    r2.run().unwrap();
    r2.context().to_host(&double).unwrap();
    r2.context().to_host(&square).unwrap();
    assert_eq!(
        double.host().get_values().unwrap(),
        vec![0.0, 2.0, 4.0, 6.0]
    );
    assert_eq!(
        square.host().get_values().unwrap(),
        vec![0.0, 1.0, 4.0, 9.0]
    );
}

#[test]
fn host_writes_reach_the_device_with_from_host() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let x = hosted_input(&[3], "x");
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let r = Context::new(&stream).link(&code).unwrap();
    x.host().set_values(&[5.0, 6.0, 7.0]).unwrap();
    r.context().from_host(&x).unwrap();
    r.run().unwrap();
    r.context().to_host(&y).unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-5.0, -6.0, -7.0]);
    // A node the context does not hold cannot be transferred.
    let other = hosted_input(&[3], "other");
    assert!(matches!(
        r.context().from_host(&other),
        Err(Error::NodeNotInContext { .. })
    ));
}

#[test]
fn the_compile_cache_is_trimmed_to_its_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(dir.path().join("cache"));
    config.cache_max_bytes = 1; // Keeps only the newest library.
    let b = cc_backend(config);
    let compile = |op: UnOp| {
        let x = hosted_input(&[4], "x");
        let y = hosted_output(&[4], "y");
        b.compile(CompileRequest::routine(
            "trim",
            &Assignments::pointwise_unop(&y, op, &x),
        ))
        .unwrap();
    };
    compile(UnOp::Neg);
    compile(UnOp::Exp);
    compile(UnOp::Sqrt);
    let libs: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "so"))
        .collect();
    assert_eq!(libs.len(), 1, "{libs:?}");
}

#[test]
fn an_unusable_cache_folder_means_compiling_without_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(file.join("cache"));
    let b = cc_backend(config);
    let x = hosted_input(&[3], "x");
    let y = hosted_output(&[3], "y");
    let code = b
        .compile(CompileRequest::routine(
            "no_cache",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let r = Context::new(&stream).link(&code).unwrap();
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![0.0, -1.0, -2.0]);
}

/// A shape mismatch carries the shapes that disagree as data (in the order its message names
/// them), so callers need not parse the message.
#[test]
fn shape_mismatches_carry_the_shapes_that_disagree() {
    use arrayjit::tensor::Tensor;
    let t = |dims: &[usize], label: &str| Tensor::zeros_input(Prec::F32, dims, label).unwrap();
    let shapes = |e: Error| match e {
        Error::ShapeMismatch { shapes, .. } => shapes,
        other => panic!("not a shape mismatch: {other}"),
    };
    let (a, b) = (t(&[2, 3], "a"), t(&[4, 5], "b"));
    assert_eq!(
        shapes(a.matmul(&b).unwrap_err()),
        vec![vec![2, 3], vec![4, 5]]
    );
    assert_eq!(
        shapes(a.add(&t(&[4], "c")).unwrap_err()),
        vec![vec![2, 3], vec![4]]
    );
    assert_eq!(
        shapes(a.reshape(&[7]).unwrap_err()),
        vec![vec![2, 3], vec![7]]
    );
    // Too few values for a host array: the counts, as data.
    let e = arrayjit::ir::Ndarray::from_f64(Prec::F32, &[2, 2], &[1.0]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::SizeMismatch {
                expected: 4,
                given: 1,
                unit: arrayjit::ir::RangeUnit::Elements,
                ..
            }
        ),
        "{e}"
    );
}

/// Guards that cannot be kept are refused before any code runs: a guard letter not in the
/// spec, a guard of an iterator outside the product space, and a guarded accumulation into an
/// integer node (whose precision could not hold a negative guard value).
#[test]
fn guards_that_cannot_hold_are_typed_errors() {
    use arrayjit::ir::{AxisIndex, EinsumGuard, Symbol};
    let spec = "ij->i";
    let guarded = |lhs: &Tnode, x: &Tnode, p: Projections| Assignments::Accum {
        initialize_neutral: true,
        accum: BinOp::Add,
        lhs: lhs.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(x.clone())),
        projections: p,
    };
    let p = |guards: &[EinsumGuard]| Projections::einsum_guarded(spec, &[3], &[&[3, 4]], guards);
    let err = p(&[EinsumGuard::at_most('j', 'k', 0)]).unwrap_err();
    assert!(
        matches!(err, Error::ShapeMismatch { .. }) && err.to_string().contains("'k'"),
        "{err}"
    );
    let backend = arrayjit::backend("sync_cc").unwrap();
    let x = hosted_input(&[3, 4], "x");
    let y = hosted_output(&[3], "y");
    let mut stray = p(&[]).unwrap();
    stray.guards.push(AxisIndex::Iterator(Symbol::fresh()));
    let err = backend
        .compile(CompileRequest::routine("stray", &guarded(&y, &x, stray)))
        .unwrap_err();
    assert!(
        matches!(err, Error::ShapeMismatch { .. })
            && err
                .to_string()
                .contains("neither an iterator of the product space nor a static symbol"),
        "{err}"
    );
    // A static index the routine is not compiled with: the same error, pointing at the
    // bindings.
    let start = arrayjit::ir::StaticSymbol::new("start", 2);
    let unbound = p(&[EinsumGuard::at_most('j', 'i', 0).plus_static(1, &start)]).unwrap();
    let err = backend
        .compile(CompileRequest::routine(
            "unbound",
            &guarded(&y, &x, unbound.clone()),
        ))
        .unwrap_err();
    assert!(err.to_string().contains("bindings"), "{err}");
    backend
        .compile(CompileRequest::routine("bound", &guarded(&y, &x, unbound)).bindings(&[start]))
        .unwrap();
    let counts = Tnode::new(Prec::U8, &[3], &["counts"]).unwrap();
    let lower = p(&[EinsumGuard::at_most('j', 'i', 0)]).unwrap();
    let err = backend
        .compile(CompileRequest::routine(
            "integer",
            &guarded(&counts, &x, lower),
        ))
        .unwrap_err();
    assert!(
        matches!(err, Error::BadValue { .. }) && err.to_string().contains("float"),
        "{err}"
    );
}

//! The shared differential corpus, run on every available backend and compared with the
//! interpreter; plus the 256×256 matmul checked against a hand-computed reference.

use arrayjit::runtime::{CompileRequest, Context};
use arrayjit_testing::{all_cases, check_case, matmul};

/// The corpus on backend `name` against the interpreter, where it runs here (one test per
/// backend, so the harness runs them side by side); `false` where it does not (and is not
/// required).
fn corpus_agrees_on(name: &str) -> bool {
    let Some(backend) = arrayjit_testing::backend_under_test(name).unwrap() else {
        return false;
    };
    let info = backend.get_device(0).unwrap().info().unwrap();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for case in all_cases().unwrap() {
        match check_case(&case, &backend) {
            Ok(()) => {}
            // A precision the device lacks is a typed error, checked to be one it lacks.
            Err(arrayjit::Error::UnsupportedPrecision { prec, .. }) if !info.supports(prec) => {
                skipped.push(format!("{} ({prec})", case.name));
            }
            Err(e) => failures.push(format!("{name} / {}: {e}", case.name)),
        }
    }
    if !skipped.is_empty() {
        eprintln!(
            "{name}: skipped {} case(s) in precisions {} lacks: {}",
            skipped.len(),
            info.name,
            skipped.join(", ")
        );
    }
    // The CPU backends run every precision.
    assert!(
        !name.ends_with("_cc") || skipped.is_empty(),
        "{name} skipped {skipped:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    true
}

#[test]
fn corpus_agrees_with_the_interpreter_on_sync_cc() {
    assert!(
        corpus_agrees_on("sync_cc"),
        "sync_cc must be available where tests run"
    );
}

#[test]
fn corpus_agrees_with_the_interpreter_on_multicore_cc() {
    corpus_agrees_on("multicore_cc");
}

#[test]
fn corpus_agrees_with_the_interpreter_on_cuda_emu() {
    corpus_agrees_on("cuda_emu");
}

#[test]
fn corpus_agrees_with_the_interpreter_on_wgpu() {
    corpus_agrees_on("wgpu");
}

#[test]
fn corpus_agrees_with_the_interpreter_on_cuda() {
    corpus_agrees_on("cuda");
}

#[test]
fn corpus_agrees_with_the_interpreter_on_metal() {
    corpus_agrees_on("metal");
}

/// Every known backend has its test above.
#[test]
fn every_known_backend_runs_the_corpus() {
    let source = include_str!("differential.rs");
    for name in arrayjit::runtime::KNOWN_BACKENDS {
        assert!(
            source.contains(&format!(
                "fn corpus_agrees_with_the_interpreter_on_{name}()"
            )),
            "no corpus test for {name}"
        );
    }
}

#[test]
fn matmul_256_matches_interpreter_and_hand_computed_reference() {
    let n = 256;
    let (case, a, b, c) = matmul(n).unwrap();
    let (av, bv) = (
        a.host().get_values().unwrap(),
        b.host().get_values().unwrap(),
    );
    let mut expected = vec![0.0f64; n * n];
    for i in 0..n {
        for k in 0..n {
            let aik = av[i * n + k];
            for j in 0..n {
                expected[i * n + j] += aik * bv[k * n + j];
            }
        }
    }
    let backend = arrayjit::backend("sync_cc").unwrap();
    // Against the interpreter (exact here: integer-valued f32 products and sums).
    check_case(&case, &backend).unwrap();
    // Against the hand-computed reference.
    assert_eq!(c.host().get_values().unwrap(), expected);
    // And once more from a fresh context, to see the linked routine is reusable.
    let code = backend
        .compile(CompileRequest::routine("matmul_again", &case.program))
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    routine.context().to_host(&c).unwrap();
    assert_eq!(c.host().get_values().unwrap(), expected);
}

/// The large contraction cases really run as blocked products on the CPU backends (so the
/// corpus checks the blocked kernels, not only the loops), and the small or unmergeable ones
/// stay loops; the schedule says why.
#[test]
fn contraction_cases_are_scheduled_as_blocked_products() {
    use arrayjit::opt::schedule::{BatchSplit, ScheduleKind};
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::contraction_cases().unwrap() {
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let blocked = opt
            .schedules
            .iter()
            .filter(|s| matches!(s.kind, ScheduleKind::Contraction(_)))
            .count();
        // Reductions at the top level or inside fused loops (with the loop setting their
        // initial values).
        let reductions = opt
            .schedules
            .iter()
            .flat_map(|s| match &s.kind {
                ScheduleKind::Fused(parts) => parts.iter().collect(),
                _ => vec![s],
            })
            .filter(|s| matches!(s.kind, ScheduleKind::Reduction(_)))
            .count();
        if case.name == "max_min_with_nan" {
            continue;
        }
        if case.name == "long_reductions" {
            // At least four of the five are at least 2 · lanes long on any SIMD width.
            assert!(reductions >= 4, "{}", opt.schedule_report());
            continue;
        }
        let want = usize::from(!case.name.starts_with("loops"));
        assert_eq!(blocked, want, "{}:\n{}", case.name, opt.schedule_report());
        // Only a batch of products too small to split themselves is always split by batch
        // element; batches of larger products where the workers divide them evenly.
        let batch_split = opt.schedules.iter().find_map(|s| match &s.kind {
            ScheduleKind::Contraction(g) => Some(g.batch_split),
            _ => None,
        });
        let expected = match case.name.as_str() {
            "gemm_batch_of_small_products" => BatchSplit::ByBatch,
            "gemm_even_batch_of_large_products" | "gemm_odd_batch_of_large_products" => {
                BatchSplit::ByBatchWhenEven
            }
            _ => BatchSplit::ByProduct,
        };
        assert_eq!(
            batch_split.unwrap_or(BatchSplit::ByProduct),
            expected,
            "{}:\n{}",
            case.name,
            opt.schedule_report()
        );
        // The zeroing before a product covering its whole result is absorbed into it.
        let absorbed = opt
            .schedules
            .iter()
            .filter(|s| matches!(s.kind, ScheduleKind::Absorbed))
            .count();
        assert_eq!(absorbed, want, "{}:\n{}", case.name, opt.schedule_report());
    }
}

/// The products with a `bf16` factor run on the product helper's widening unit on the CPU
/// backends (so the corpus checks its row, packed and single-column paths), the narrow factor
/// on the side the case puts it; elsewhere they are loops.
#[test]
fn widened_cases_run_on_the_widening_helper() {
    use arrayjit::opt::schedule::{FactorSide, ScheduleKind};
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::widened_cases().unwrap() {
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let widened: Vec<_> = opt
            .schedules
            .iter()
            .filter_map(|s| match &s.kind {
                ScheduleKind::Contraction(g) => g.widened_factor(),
                _ => None,
            })
            .collect();
        let side = if case.name.starts_with("widened_left") {
            FactorSide::Lhs
        } else {
            FactorSide::Rhs
        };
        assert_eq!(
            widened,
            [(side, arrayjit::ir::Prec::Bf16)],
            "{}:\n{}",
            case.name,
            opt.schedule_report()
        );
        let entry = match side {
            FactorSide::Lhs => "_wbf16_a(",
            FactorSide::Rhs => "_wbf16_b(",
        };
        assert!(code.source().contains(entry), "{}", case.name);
    }
}

/// The large guarded products run as blocked products with their guard on the CPU backends
/// and as tiled products with their guard on a GPU (so the corpus checks the tiles and steps
/// they skip and the ones they check term by term); a band (two guards) and the small or
/// non-product cases stay loops.
/// The attention passes of the corpus run on the CPU's blocked helper where it takes them (f32,
/// no dropout) and as their loops otherwise, each schedule saying why.
#[test]
fn attention_cases_run_on_the_blocked_helper() {
    use arrayjit::opt::schedule::ScheduleKind;
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::attention_cases().unwrap() {
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let helper = opt
            .schedules
            .iter()
            .filter(|s| matches!(s.kind, ScheduleKind::Attention(_)))
            .count();
        let report = opt.schedule_report();
        let takes = !case.name.contains("f64") && !case.name.contains("f16");
        if takes {
            assert_eq!(helper, 2, "{}:\n{report}", case.name);
        } else {
            assert_eq!(helper, 0, "{}:\n{report}", case.name);
            assert!(
                report.contains("a pass of fused attention left to its loops"),
                "{}:\n{report}",
                case.name
            );
        }
    }
}

#[test]
fn guarded_cases_are_scheduled_as_guarded_products() {
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    // The cases that are no product for a blocked or tiled kernel (a guard with a static symbol
    // included: the kernels take guards of their own loops only).
    const LOOPS: [&str; 5] = [
        "guarded_band",
        "guarded_small_product",
        "guarded_loops",
        "guarded_by_static",
        "guarded_cache_written_at_static",
    ];
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::guarded_cases().unwrap() {
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let guards: Vec<_> = opt
            .schedules
            .iter()
            .filter_map(|s| match &s.kind {
                ScheduleKind::Contraction(g) => Some(g.guard),
                _ => None,
            })
            .collect();
        if LOOPS.contains(&case.name.as_str()) {
            assert!(
                guards.is_empty(),
                "{}:\n{}",
                case.name,
                opt.schedule_report()
            );
        } else {
            assert!(
                matches!(guards.as_slice(), [Some(_)]),
                "{}:\n{}",
                case.name,
                opt.schedule_report()
            );
        }
    }
    // On a GPU (the emulated one), the f32 ones run as tiled products with their guard.
    let Some(gpu) = arrayjit_testing::backend_under_test("cuda_emu").unwrap() else {
        return;
    };
    for case in arrayjit_testing::guarded_cases().unwrap() {
        let code = gpu
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let tiled = opt
            .schedules
            .iter()
            .filter(|s| {
                matches!(&s.kind, ScheduleKind::Gpu(GpuPass::Tiles { gemm, .. })
                    if gemm.guard.is_some())
            })
            .count();
        // The tiled product on a GPU is an f32 one.
        let loops = LOOPS.contains(&case.name.as_str()) || case.name == "guarded_mix_f64";
        let want = usize::from(!loops);
        assert_eq!(tiled, want, "{}:\n{}", case.name, opt.schedule_report());
    }
}

/// The row-wise passes of the fusion cases run as one fused loop on the CPU backends (so the
/// corpus checks fused code), with the reductions inside still over several accumulators; the
/// passes that read other rows stay separate loops.
#[test]
fn fusion_cases_fuse_exactly_the_row_wise_passes() {
    use arrayjit::opt::schedule::ScheduleKind;
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::fusion_cases().unwrap() {
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        let opt = code.optimized();
        let fused: Vec<&Vec<_>> = opt
            .schedules
            .iter()
            .filter_map(|s| match &s.kind {
                ScheduleKind::Fused(parts) => Some(parts),
                _ => None,
            })
            .collect();
        if case.name.starts_with("fused_") {
            // The 7×129 and 17×1000 softmaxes (the 1×1 one is too short to fuse), the two
            // softmaxes split over workers, the one long f32 softmax, or the two row sums.
            let expected = match case.name.as_str() {
                "fused_softmax_rows" => 2,
                "fused_softmax_rows_split" => 3,
                _ => 1,
            };
            assert_eq!(fused.len(), expected, "{}", opt.schedule_report());
            // The split softmaxes' exponentials are one outer iteration's rows per worker:
            // the array contraction runs in the corpus, on every CPU backend.
            if case.name == "fused_softmax_rows_split" {
                let mut slices: Vec<Vec<usize>> = opt
                    .nodes
                    .iter()
                    .filter(|r| r.used && r.tn.is_iteration_private())
                    .filter(|r| r.tn.label() == ["e_slice"])
                    .map(|r| r.tn.dims().to_vec())
                    .collect();
                slices.sort();
                assert_eq!(
                    slices,
                    vec![vec![4, 1000], vec![1000], vec![1000]],
                    "{}",
                    opt.memory_report()
                );
            }
            for parts in fused {
                let reductions = parts
                    .iter()
                    .filter(|p| matches!(p.kind, ScheduleKind::Reduction(_)))
                    .count();
                if case.name.starts_with("fused_softmax_rows") {
                    assert_eq!(reductions, 2, "{}", opt.schedule_report());
                } else {
                    // The two row sums in one loop; the `i32` one is not vectorized.
                    assert_eq!(parts.len(), 2, "{}", opt.schedule_report());
                    assert_eq!(reductions, 1, "{}", opt.schedule_report());
                }
            }
        } else {
            assert!(fused.is_empty(), "{}", opt.schedule_report());
            assert!(
                opt.statements().len() >= 3,
                "{}",
                opt.code.to_pretty_string()
            );
        }
    }
}

/// On the GPU backends the attention passes of the corpus run as the GPU's attention pass
/// (FlashAttention-2's split: one launch forward, two backward; on CUDA with 1, 2 or 4 lanes
/// per row as the features divide), and agree with the interpreter there; the pass of one
/// query and one key is simplified into statements.
#[test]
fn attention_cases_run_as_gpu_passes() {
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    for name in ["cuda_emu", "wgpu"] {
        let Some(backend) = arrayjit_testing::backend_under_test(name).unwrap() else {
            continue;
        };
        let info = backend.get_device(0).unwrap().info().unwrap();
        // And heads of GPT-2's width (64 features: the kernels' unrolled rows) over two
        // blocks of rows, the second partial, with dropout.
        let heads = arrayjit_testing::attention_head_case(
            "attention_gpt2_heads",
            arrayjit::ir::Prec::F32,
            80,
            64,
            Some(0.1),
        )
        .unwrap();
        let cases = arrayjit_testing::attention_cases().unwrap();
        for case in cases.into_iter().chain([heads]) {
            let code = match backend.compile(
                CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings),
            ) {
                Ok(code) => code,
                Err(arrayjit::Error::UnsupportedPrecision { prec, .. }) if !info.supports(prec) => {
                    continue;
                }
                Err(e) => panic!("{name} / {}: {e}", case.name),
            };
            let opt = code.optimized();
            let lanes: Vec<u32> = opt
                .schedules
                .iter()
                .filter_map(|s| match &s.kind {
                    ScheduleKind::Gpu(GpuPass::Attention(a)) => Some(a.lanes),
                    _ => None,
                })
                .collect();
            let passes = lanes.len();
            // On CUDA (warps of 32) a row of GPT-2's 64 features takes 4 lanes.
            if name == "cuda_emu" && case.name == "attention_gpt2_heads" {
                assert_eq!(lanes, [4, 4]);
            }
            let report = opt.schedule_report();
            if !case.name.contains("one_position") {
                assert_eq!(passes, 2, "{name} / {}:\n{report}", case.name);
            }
            arrayjit_testing::check_case(&case, &backend)
                .unwrap_or_else(|e| panic!("{name} / {}: {e}\n{report}", case.name));
        }
    }
}

/// The backward pass with the key and value gradients in launches of their own (what a
/// WebGPU device that binds 8 arrays gets with dropout) agrees with the interpreter on
/// cuda_emu, with dropout and without, over several blocks of rows.
#[test]
fn attention_with_separate_key_gradients_agrees_on_cuda_emu() {
    use arrayjit::opt::optimize::OptimizeCtx;
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    let Some(backend) = arrayjit_testing::backend_under_test("cuda_emu").unwrap() else {
        return;
    };
    for dropout in [None, Some(0.3)] {
        let case = arrayjit_testing::attention_head_case(
            "attention_separate_key_grads",
            arrayjit::ir::Prec::F32,
            70,
            16,
            dropout,
        )
        .unwrap();
        let opt = backend
            .optimize_in(
                &OptimizeCtx::empty(),
                &case.name,
                &case.program,
                &case.bindings,
            )
            .unwrap();
        let mut separate = (*opt).clone();
        let mut changed = 0;
        for s in &mut separate.schedules {
            if let ScheduleKind::Gpu(GpuPass::Attention(a)) = &mut s.kind
                && a.launches() == 2
            {
                *a = a.with_separate_key_grads();
                assert_eq!(a.launches(), 3);
                changed += 1;
            }
        }
        assert_eq!(changed, 1, "{}", opt.schedule_report());
        let code = backend
            .compile(CompileRequest::optimized(&[std::sync::Arc::new(separate)]))
            .unwrap()
            .remove(0);
        arrayjit_testing::check_case_code(&case, &backend, &code)
            .unwrap_or_else(|e| panic!("dropout {dropout:?}: {e}"));
    }
}

/// Guarded loops on the C backends visit only the iterations their guard keeps: the loop is
/// split where the guard starts or stops holding (`aj_split`), for guards of the loops' own
/// iterators and of static indices alike, and the corpus above checks that the split loops
/// compute the same values.
#[test]
fn guarded_loops_are_split_where_their_guard_changes() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    for case in arrayjit_testing::guarded_cases().unwrap() {
        if ![
            "guarded_loops",
            "guarded_by_static",
            "guarded_cache_written_at_static",
        ]
        .contains(&case.name.as_str())
        {
            continue;
        }
        let code = backend
            .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))
            .unwrap();
        assert!(
            code.source().contains("aj_split"),
            "{}:\n{}",
            case.name,
            code.source()
        );
    }
}

/// Two passes of fused attention with different features in one library (an unmasked one
/// without dropout beside a causal one with dropout) share one CPU attention unit, which keeps
/// the features of both (`AttentionPaths`: a feature no pass uses becomes a constant of the
/// unit); both agree with the interpreter, on each CPU backend.
#[test]
fn attention_passes_with_different_features_share_a_unit_that_keeps_both() {
    for name in ["sync_cc", "multicore_cc"] {
        let backend = arrayjit::backend(name).unwrap();
        // Fresh cases per backend: a check consumes their initial host values.
        let cases = arrayjit_testing::attention_cases().unwrap();
        let pick = |n: &str| cases.iter().find(|c| c.name == n).unwrap();
        let (plain, masked) = (
            pick("attention_heads_first"),
            pick("attention_causal_dropout"),
        );
        assert!(plain.bindings.is_empty() && masked.bindings.is_empty());
        let both = arrayjit_testing::Case {
            name: "attention_two_kinds_of_pass".into(),
            program: plain.program.clone().then(masked.program.clone()),
            bindings: vec![],
            runs: vec![],
            results: [plain.results.clone(), masked.results.clone()].concat(),
        };
        let code = backend
            .compile(CompileRequest::routine(&both.name, &both.program))
            .unwrap();
        let source = code.source();
        assert!(
            source.contains("attention paths: dropout=1 bias=0 causal=1 unmasked=1"),
            "{name}: the unit does not keep both passes' features"
        );
        assert!(
            source.contains("#define AJ_ATT_CAUSAL(c) ((c)->causal)")
                && source.contains("#define AJ_ATT_DROP(c) ((c)->drop)"),
            "{name}"
        );
        check_case(&both, &backend).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

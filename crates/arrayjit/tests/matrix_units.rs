//! Products on matrix units (tensor cores), checked without a GPU: every variant — `bf16`,
//! `f16` and TF32 fragments, 32-, 64- and 128-tiles, plain and transposed fragment loads,
//! asynchronous and element-by-element copies, warps (`mma.sync`) and warpgroups (`wgmma`) — is
//! planned as a matrix-unit pass where the device has matrix units and runs on `cuda_emu`
//! (whose header implements `ldmatrix` and `mma.sync` as warp collectives and `wgmma` from the
//! canonical layouts), and on `cuda` where a GPU is there, in agreement with the interpreter;
//! TF32 is used only when allowed, and rounds as TF32 does; NVRTC compiles every variant for
//! sm_80 and sm_90 (`sm_90a` for warpgroups) where it is installed.

#[cfg(feature = "cuda")]
use arrayjit::backends::cuda_backend::compile_ptx;
use arrayjit::codegen::cuda::render_cuda;
use arrayjit::ir::{AccumRhs, Assignments, BinOp, Error, Operand, Prec, Tnode};
use arrayjit::opt::schedule::gpu::{GpuLimits, MatrixKind, MatrixTile};
use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
use arrayjit::opt::{OptimizeSettings, optimize};
use arrayjit::runtime::{Backend, CompileRequest, Context};
use arrayjit_testing::{Case, check_case, matrix_product_cases};

#[cfg(feature = "cuda")]
#[path = "matrix_units/nvrtc.rs"]
mod nvrtc;

/// The matrix-unit passes of a routine's schedules: (kind, tile).
fn matrix_passes(schedules: &[arrayjit::opt::schedule::Schedule]) -> Vec<(MatrixKind, usize)> {
    layouts(schedules)
        .iter()
        .map(|l| (l.kind, l.tile))
        .collect()
}

/// The layouts of the matrix-unit passes of a routine's schedules.
fn layouts(schedules: &[arrayjit::opt::schedule::Schedule]) -> Vec<MatrixTile> {
    schedules
        .iter()
        .filter_map(|s| match &s.kind {
            ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, .. }) => Some(*layout),
            _ => None,
        })
        .collect()
}

/// The `cuda_emu` backend, where this machine has a C++ compiler.
fn cuda_emu() -> Option<Backend> {
    arrayjit_testing::all_backends_under_test()
        .unwrap()
        .into_iter()
        .find(|b| b.name() == "cuda_emu")
}

/// `b`'s settings with the GPU tile tuned to `tile` and TF32 allowed or not.
fn tuned(b: &Backend, tile: Option<usize>, allow_tf32: bool) -> OptimizeSettings {
    let mut s = b.optimize_settings();
    s.schedule.tuning.gpu_tile = tile;
    s.schedule.allow_tf32 = allow_tf32;
    s
}

/// `c = a · b` of `f32` `[m, k] · [k, n]` with the values given.
fn f32_product(m: usize, k: usize, n: usize, a: &[f64], b: &[f64]) -> (Case, Tnode) {
    let at = Tnode::new(Prec::F32, &[m, k], &["a"]).unwrap();
    let bt = Tnode::new(Prec::F32, &[k, n], &["b"]).unwrap();
    at.host().set_values(a).unwrap();
    bt.host().set_values(b).unwrap();
    product_case(
        &format!("f32_product_{m}x{k}x{n}"),
        "mk,kn->mn",
        at,
        bt,
        &[m, n],
    )
}

/// The case `c = a · b` (einsum `spec`) into a new hosted `f32` result `c` of shape `dims`,
/// compared after its run; and `c`.
fn product_case(name: &str, spec: &str, a: Tnode, b: Tnode, dims: &[usize]) -> (Case, Tnode) {
    let c = Tnode::new(Prec::F32, dims, &["c"]).unwrap();
    c.update_memory_mode(
        arrayjit::ir::MemoryMode::Hosted(arrayjit::ir::MemoryType::Nonconstant),
        "compared",
    )
    .unwrap();
    let program = Assignments::einsum(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    (
        Case {
            name: name.to_string(),
            program,
            bindings: vec![],
            runs: vec![],
            results: vec![c.clone()],
        },
        c,
    )
}

/// The factors `a` and `b` of the einsum `spec` (over letters `m`, `k`, `n` of the sizes
/// given) in `prec`, element `i` of each `value(i, seed)` (seeds 5 and 7).
fn einsum_factors(
    spec: &str,
    [m, k, n]: [usize; 3],
    prec: Prec,
    value: impl Fn(usize, usize) -> f64,
) -> (Tnode, Tnode) {
    let (sa, sb) = spec.split_once("->").unwrap().0.split_once(',').unwrap();
    let node = |label: &str, letters: &str, seed: usize| {
        let dims: Vec<usize> = letters
            .chars()
            .map(|c| match c {
                'm' => m,
                'k' => k,
                _ => n,
            })
            .collect();
        let t = Tnode::new(prec, &dims, &[label]).unwrap();
        let count: usize = dims.iter().product();
        let values: Vec<f64> = (0..count).map(|i| value(i, seed)).collect();
        t.host().set_values(&values).unwrap();
        t
    };
    (node("a", sa, 5), node("b", sb, 7))
}

/// The backends here whose devices have matrix units (`cuda_emu`; `cuda` on a GPU of sm_80 or
/// later).
fn with_matrix_units() -> Vec<Backend> {
    arrayjit_testing::all_backends_under_test()
        .unwrap()
        .into_iter()
        .filter(|b| {
            b.optimize_settings()
                .schedule
                .gpu
                .is_some_and(|g| g.matrix_units)
        })
        .collect()
}

#[test]
fn sixteen_bit_products_run_on_matrix_units_in_every_tile() {
    let backends = with_matrix_units();
    if backends.is_empty() {
        eprintln!("skipped: no backend with matrix units here");
    }
    for b in backends {
        sixteen_bit_products_in_every_tile(&b);
    }
}

/// Every 16-bit case of the corpus in 32-, 64- and 128-tiles on `b`, on warps and (where the
/// device has them) on warpgroups, with both kinds of copies.
fn sixteen_bit_products_in_every_tile(b: &Backend) {
    let original = b.optimize_settings();
    let mut copies = std::collections::BTreeSet::new();
    let mut warpgroups = std::collections::BTreeSet::new();
    let mut dynamic = std::collections::BTreeSet::new();
    let mut banded = std::collections::BTreeSet::new();
    let has_warpgroups = original.schedule.gpu.is_some_and(|g| g.warpgroup_mma);
    let has_opt_in = original
        .schedule
        .gpu
        .is_some_and(|g| g.max_opt_in_shared_bytes > g.max_shared_bytes);
    let mut deep = std::collections::BTreeSet::new();
    for (tile, on_warpgroups, fragments) in [
        (32, false, 2),
        (64, false, 2),
        (128, false, 2),
        (64, true, 2),
        (128, true, 2),
        (64, true, 4),
        (128, true, 4),
    ] {
        if on_warpgroups && !has_warpgroups {
            continue;
        }
        let mut settings = tuned(b, Some(tile), false);
        if let Some(g) = settings.schedule.gpu.as_mut() {
            g.warpgroup_mma = on_warpgroups;
        }
        settings.schedule.tuning.gpu_stage_fragments = Some(fragments);
        b.set_optimize_settings(settings);
        for case in matrix_product_cases().unwrap() {
            let code = b
                .compile(CompileRequest::routine(&case.name, &case.program))
                .unwrap();
            copies.extend(
                layouts(&code.optimized().schedules)
                    .iter()
                    .flat_map(|l| l.async_copy),
            );
            let passes = matrix_passes(&code.optimized().schedules);
            // Every case with 16-bit factors has one product on the matrix units.
            let sixteen = case.name.contains("bf16") || case.name.contains("f16");
            assert_eq!(
                passes.len(),
                usize::from(sixteen),
                "{}: {passes:?}",
                case.name
            );
            assert!(passes.iter().all(|p| p.1 == tile), "{}", case.name);
            warpgroups.extend(
                layouts(&code.optimized().schedules)
                    .iter()
                    .map(|l| l.warpgroups),
            );
            dynamic.extend(
                layouts(&code.optimized().schedules)
                    .iter()
                    .map(|l| l.dynamic_shared),
            );
            banded.extend(
                layouts(&code.optimized().schedules)
                    .iter()
                    .map(|l| (l.warpgroups, l.order.band_rows > 1)),
            );
            deep.extend(
                layouts(&code.optimized().schedules)
                    .iter()
                    .map(|l| (l.warpgroups, l.depth())),
            );
            check_case(&case, b).unwrap_or_else(|e| {
                panic!(
                    "{}: {tile}-tiles (warpgroups {on_warpgroups}, {fragments} fragments deep): \
                     {e}",
                    b.name()
                )
            });
        }
    }
    b.set_optimize_settings(original);
    // Factors copied asynchronously and element by element both ran, and warpgroups where
    // the device has them.
    assert_eq!(copies.len(), 2);
    assert_eq!(warpgroups.len(), if has_warpgroups { 2 } else { 1 });
    // Buffers in static shared memory and, where the device lets kernels opt in to more, in
    // dynamic shared memory (the 128-tiles' deeper pipelines).
    assert_eq!(dynamic.len(), if has_opt_in { 2 } else { 1 }, "{dynamic:?}");
    // Buffers 32 deep (2 fragments) on warps, and 32 and 64 deep on warpgroups (whose
    // `k`-contiguous rows then take the 64- and the 128-byte swizzle).
    let mut want = std::collections::BTreeSet::from([(false, 32)]);
    if has_warpgroups {
        want.extend([(true, 32), (true, 64)]);
    }
    assert_eq!(deep, want);
    // Tiles taken row by row and in bands, on warps and (where the device has them) on
    // warpgroups.
    for on_warpgroups in [false, has_warpgroups] {
        for in_bands in [false, true] {
            assert!(banded.contains(&(on_warpgroups, in_bands)), "{banded:?}");
        }
    }
}

/// Products with long reductions run through every buffer of their pipelines many times (the
/// corpus's reductions are shorter than the deepest pipelines): 128-tiles of `bf16` over 1024
/// and 1000 steps, on warps and on warpgroups (whose products stay in flight for a step while
/// the next step refills the buffer multiplied two steps before), with asynchronous and
/// element-by-element copies, agree with the interpreter; the emulation runs each warpgroup
/// product when it is waited for and reports a copy into a buffer a product in flight reads.
#[test]
fn long_reductions_cycle_through_the_pipelines_buffers() {
    for b in with_matrix_units() {
        let original = b.optimize_settings();
        let has_warpgroups = original.schedule.gpu.is_some_and(|g| g.warpgroup_mma);
        for (on_warpgroups, fragments) in [(false, 2), (true, 2), (true, 4)] {
            if on_warpgroups && !has_warpgroups {
                continue;
            }
            let mut settings = tuned(&b, Some(128), false);
            if let Some(g) = settings.schedule.gpu.as_mut() {
                g.warpgroup_mma = on_warpgroups;
            }
            settings.schedule.tuning.gpu_stage_fragments = Some(fragments);
            b.set_optimize_settings(settings);
            for (spec, m, k, n) in [("mk,kn->mn", 128, 1024, 128), ("km,kn->mn", 124, 1000, 128)] {
                let (a, bt) = einsum_factors(spec, [m, k, n], Prec::Bf16, |i, seed| {
                    ((i * seed) % 5) as f64 - 2.0
                });
                let name = format!("long_{}_{m}x{k}x{n}", spec.replace([',', '-', '>'], "_"));
                let (case, _) = product_case(&name, spec, a, bt, &[m, n]);
                let code = b
                    .compile(CompileRequest::routine(&case.name, &case.program))
                    .unwrap();
                let [layout] = layouts(&code.optimized().schedules)[..] else {
                    panic!("{}", code.optimized().schedule_report());
                };
                assert_eq!(
                    (layout.tile, layout.warpgroups),
                    (128, on_warpgroups),
                    "{}",
                    case.name
                );
                check_case(&case, &b).unwrap_or_else(|e| {
                    panic!(
                        "{}: {} (warpgroups {on_warpgroups}, {} buffers {} deep): {e}",
                        b.name(),
                        case.name,
                        layout.stages,
                        layout.depth()
                    )
                });
            }
        }
        b.set_optimize_settings(original);
    }
}

/// The matrix units' buffers fill the shared memory that leaves room for two groups per SM:
/// on sm_90 (227 KiB per block where a kernel opts in, 228 KiB per SM) a 128-tile of `bf16`
/// takes 6 buffers (96 KiB), on sm_80 (163 / 164 KiB) 5, and where a device has no opt-in the
/// 48 KiB a kernel declares statically hold 3. Beyond 48 KiB the kernel declares its buffers
/// in dynamic shared memory and its pass says how much its launch gives each group; a tuning
/// caps the buffers; NVRTC compiles the kernel with an extern shared array.
#[test]
fn deeper_pipelines_take_dynamic_shared_memory_where_the_device_has_it() {
    let n = 4096;
    let node = |l: &str| Tnode::new(Prec::Bf16, &[n, n], &[l]).unwrap();
    let program = Assignments::einsum(
        "mk,kn->mn",
        BinOp::Add,
        &Tnode::new(Prec::F32, &[n, n], &["c"]).unwrap(),
        AccumRhs::Binop(
            BinOp::Mul,
            Operand::Node(node("a")),
            Operand::Node(node("b")),
        ),
        true,
    )
    .unwrap();
    let plan = |limits: GpuLimits, stages: Option<usize>| {
        let mut limits = limits;
        limits.compute_units = 132;
        limits.matrix_units = true;
        let mut settings = OptimizeSettings::for_gpu(limits);
        settings.schedule.tuning.gpu_stages = stages;
        let opt = optimize("mm", &[], &program, &settings).unwrap();
        let [layout] = layouts(&opt.schedules)[..] else {
            panic!("{}", opt.schedule_report());
        };
        (opt, layout)
    };
    let sm_90 = GpuLimits::cuda_arch("sm_90").unwrap();
    for (limits, stages, dynamic) in [
        (sm_90, 6, true),
        (GpuLimits::cuda_arch("sm_80").unwrap(), 5, true),
        (GpuLimits::cuda_minimum(), 3, false),
    ] {
        let (opt, layout) = plan(limits, None);
        assert_eq!(layout.tile, 128);
        assert_eq!(
            (layout.stages, layout.dynamic_shared),
            (stages, dynamic),
            "{limits:?}"
        );
        let report = opt.schedule_report();
        assert_eq!(
            report.contains("dynamic shared memory"),
            dynamic,
            "{report}"
        );
        let program = render_cuda(&[&opt]).unwrap();
        let passes = &program.kernels[0].passes;
        let bytes: Vec<usize> = passes.iter().map(|p| p.dynamic_shared_bytes).collect();
        if dynamic {
            assert_eq!(bytes, [layout.shared_bytes()]);
            assert!(
                program
                    .source
                    .contains(&format!("AJ_DYNAMIC_SHARED({});", layout.shared_bytes())),
                "{}",
                program.source
            );
        } else {
            assert_eq!(bytes, [0]);
            assert!(!program.source.contains("AJ_DYNAMIC_SHARED"));
        }
    }
    // A tuning caps the buffers (and within 48 KiB they are static again).
    let (_, capped) = plan(sm_90, Some(3));
    assert_eq!((capped.stages, capped.dynamic_shared), (3, false));
    let (opt, layout) = plan(sm_90, None);
    assert!(layout.warpgroups && layout.shared_bytes() == (6 * 16) << 10);
    #[cfg(feature = "cuda")]
    match compile_ptx(&render_cuda(&[&opt]).unwrap().source, "sm_90a") {
        // The buffers in dynamic shared memory, checked to start on a KiB boundary.
        Ok(ptx) => assert!(
            ptx.contains(".extern .shared") && ptx.contains("trap;"),
            "{ptx}"
        ),
        Err(Error::BackendUnavailable { reason, .. }) => eprintln!("skipped: {reason}"),
        Err(e) => panic!("{e}"),
    }
    #[cfg(not(feature = "cuda"))]
    eprintln!(
        "skipped: NVRTC's check of {} bytes of CUDA needs the cuda feature",
        render_cuda(&[&opt]).unwrap().source.len()
    );
}

#[test]
fn tf32_runs_only_where_allowed_and_rounds_as_tf32() {
    let Some(b) = cuda_emu() else {
        eprintln!("skipped: cuda_emu is not available here");
        return;
    };
    // Values exact in TF32 (multiples of 1/8 up to 2): the product agrees with the loop nest.
    let (m, k, n) = (40, 52, 36);
    let a: Vec<f64> = (0..m * k)
        .map(|i| ((i * 5 % 33) as f64 - 16.0) / 8.0)
        .collect();
    let bv: Vec<f64> = (0..k * n)
        .map(|i| ((i * 3 % 29) as f64 - 14.0) / 8.0)
        .collect();
    for (allow, want) in [(false, None), (true, Some(MatrixKind::Tf32))] {
        b.set_optimize_settings(tuned(&b, None, allow));
        let (case, _) = f32_product(m, k, n, &a, &bv);
        let code = b
            .compile(CompileRequest::routine(&case.name, &case.program))
            .unwrap();
        let passes = matrix_passes(&code.optimized().schedules);
        assert_eq!(passes.first().map(|p| p.0), want, "allow_tf32 {allow}");
        check_case(&case, &b).unwrap_or_else(|e| panic!("allow_tf32 {allow}: {e}"));
    }
    // 1 + 2^-12 is not a TF32 value: TF32 rounds it to 1 (10 mantissa bits), f32 keeps it.
    let x = 1.0 + 2f64.powi(-12);
    let sum_of = |allow: bool| {
        b.set_optimize_settings(tuned(&b, None, allow));
        let (case, c) = f32_product(16, 16, 16, &vec![x; 256], &vec![1.0; 256]);
        let code = b
            .compile(CompileRequest::routine(&case.name, &case.program))
            .unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host(&c).unwrap();
        c.host().array().unwrap().to_vec_f64().unwrap()[0]
    };
    assert_eq!(sum_of(false), 16.0 * (x as f32) as f64);
    assert_eq!(sum_of(true), 16.0);
    // The backend's own switch overrides the settings (and ARRAYJIT_ALLOW_TF32).
    b.set_allow_tf32(Some(false));
    let settings = tuned(&b, None, true);
    b.set_optimize_settings(settings);
    assert!(!b.compile_settings().unwrap().schedule.allow_tf32);
    b.set_allow_tf32(None);
}

/// TF32 on warpgroups (`wgmma` `m64nNk8`, which reads TF32 factors only `k`-major): in every
/// layout of the factors (a factor whose result side is contiguous is transposed while it is
/// staged), in 64- and 128-tiles, over sides that are not multiples of the
/// tile and a reduction that cycles through the buffers, the products agree with the
/// interpreter on values exact in TF32; and the staging rounds to TF32 (to nearest, ties
/// away), which the emulation's warpgroup products rely on (they ignore an element's low 13
/// bits, as the hardware does).
#[test]
fn tf32_products_run_on_warpgroups_in_every_layout() {
    for b in with_matrix_units() {
        let original = b.optimize_settings();
        if !original.schedule.gpu.is_some_and(|g| g.warpgroup_mma) {
            continue;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (tile, fragments) in [(64, 2), (128, 2)] {
            let mut settings = tuned(&b, Some(tile), true);
            settings.schedule.tuning.gpu_stage_fragments = Some(fragments);
            b.set_optimize_settings(settings);
            for (spec, m, k, n) in [
                ("mk,kn->mn", 130, 44, 72),
                ("km,kn->mn", 70, 300, 136),
                ("mk,nk->mn", 64, 36, 130),
                ("km,nk->mn", 136, 52, 64),
            ] {
                // Multiples of 1/8 in [-2, 2]: exact in TF32, and every sum exact in f32.
                let (a, bt) = einsum_factors(spec, [m, k, n], Prec::F32, |i, seed| {
                    ((i * seed % 33) as f64 - 16.0) / 8.0
                });
                let name = format!("tf32_{}_{m}x{k}x{n}", spec.replace([',', '-', '>'], "_"));
                let (case, _) = product_case(&name, spec, a, bt, &[m, n]);
                let code = b
                    .compile(CompileRequest::routine(&case.name, &case.program))
                    .unwrap();
                let [layout] = layouts(&code.optimized().schedules)[..] else {
                    panic!("{}", code.optimized().schedule_report());
                };
                assert_eq!(
                    (layout.kind, layout.tile, layout.warpgroups, layout.depth()),
                    (MatrixKind::Tf32, tile, true, 8 * fragments),
                    "{name}"
                );
                assert!(layout.rounds_while_staging() && layout.async_copy == [false; 2]);
                seen.insert(spec);
                check_case(&case, &b).unwrap_or_else(|e| {
                    panic!(
                        "{}: {name} ({tile}-tiles, {} buffers {} deep): {e}",
                        b.name(),
                        layout.stages,
                        layout.depth()
                    )
                });
            }
        }
        assert_eq!(seen.len(), 4);
        // 1 + 3 · 2^-12 lies 3/4 of a TF32 step above 1: rounded, it is 1 + 2^-10 (truncated,
        // 1). The right factor of `mk,kn` (columns contiguous) is transposed while staged.
        let x = 1.0 + 3.0 * 2f64.powi(-12);
        let mut settings = tuned(&b, Some(64), true);
        settings.schedule.tuning.gpu_stage_fragments = Some(2);
        b.set_optimize_settings(settings);
        for (a_value, b_value) in [(x, 1.0), (1.0, x)] {
            let (case, c) = f32_product(64, 16, 64, &[a_value; 1024], &[b_value; 1024]);
            let code = b
                .compile(CompileRequest::routine(&case.name, &case.program))
                .unwrap();
            assert!(layouts(&code.optimized().schedules)[0].warpgroups);
            let stream = b.get_device(0).unwrap().new_stream().unwrap();
            let routine = Context::new(&stream).link(&code).unwrap();
            routine.run().unwrap();
            routine.context().to_host(&c).unwrap();
            let values = c.host().array().unwrap().to_vec_f64().unwrap();
            let want = 16.0 * (1.0 + 2f64.powi(-10));
            assert!(
                values.iter().all(|&v| v == want),
                "{}: {:?}",
                b.name(),
                &values[..4]
            );
        }
        b.set_optimize_settings(original);
    }
}

/// A pointwise statement over a product's result runs in the product's epilogue on the `f32`
/// tiles and on the matrix units (its own statement then runs nothing); a statement reading
/// another element of the result does not; all agree with the interpreter on the GPU backends.
#[test]
fn pointwise_statements_after_products_run_in_their_epilogue() {
    let mut ran = 0;
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        if b.optimize_settings().schedule.gpu.is_none() {
            continue;
        }
        let info = b.get_device(0).unwrap().info().unwrap();
        let matrix_units = b
            .optimize_settings()
            .schedule
            .gpu
            .is_some_and(|g| g.matrix_units);
        // Without matrix units a bf16 product is no tiled product (it has no epilogue).
        for (name, epilogue) in [
            ("f32_product_bias_relu", true),
            ("bf16_product_bias_relu", matrix_units),
            ("product_minus_its_transpose", false),
        ] {
            let case = matrix_product_cases()
                .unwrap()
                .into_iter()
                .find(|c| c.name == name)
                .unwrap();
            let code = match b.compile(CompileRequest::routine(&case.name, &case.program)) {
                Ok(code) => code,
                Err(Error::UnsupportedPrecision { prec, .. }) if !info.supports(prec) => continue,
                Err(e) => panic!("{}: {name}: {e}", b.name()),
            };
            let schedules = &code.optimized().schedules;
            let with_epilogue = schedules.iter().any(|s| {
                matches!(
                    &s.kind,
                    ScheduleKind::Gpu(
                        GpuPass::Tiles {
                            epilogue: Some(_),
                            ..
                        } | GpuPass::MatrixTiles {
                            epilogue: Some(_),
                            ..
                        }
                    )
                )
            });
            assert_eq!(
                with_epilogue,
                epilogue,
                "{} {name}: {}",
                b.name(),
                code.optimized().schedule_report()
            );
            check_case(&case, &b).unwrap_or_else(|e| panic!("{}: {e}", b.name()));
            ran += 1;
        }
    }
    eprintln!("ran {ran} epilogue cases");
}

/// On every backend with matrix units, planned for a small device (8 units: 16 groups keep it
/// busy), 16-bit and TF32 products with long reductions split along them in every tile, on
/// warps and on warpgroups where the device has them (whose loops then run a slice's first
/// step before testing for its end), and agree with the interpreter.
#[test]
fn matrix_unit_products_split_along_long_reductions_in_every_tile() {
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    let cases = [
        arrayjit_testing::long_product_in(
            Prec::Bf16,
            "split_bf16_weight_gradient",
            "ki,kj->ij",
            &[2048, 64],
            &[2048, 64],
            &[64, 64],
        )
        .unwrap(),
        arrayjit_testing::long_product_in(
            Prec::F16,
            "split_f16_batched",
            "bik,bkj->bij",
            &[2, 40, 1024],
            &[2, 1024, 48],
            &[2, 40, 48],
        )
        .unwrap(),
        // TF32 (allowed below): small integers, exact in TF32, and every sum exact in f32.
        arrayjit_testing::long_product_in(
            Prec::F32,
            "split_tf32_weight_gradient",
            "ki,kj->ij",
            &[2048, 64],
            &[2048, 64],
            &[64, 64],
        )
        .unwrap(),
    ];
    for b in with_matrix_units() {
        let original = b.optimize_settings();
        let has_warpgroups = original.schedule.gpu.is_some_and(|g| g.warpgroup_mma);
        for (tile, on_warpgroups) in [(32, false), (64, false), (64, true), (128, true)] {
            if on_warpgroups && !has_warpgroups {
                continue;
            }
            let mut settings = tuned(&b, Some(tile), true);
            if let Some(g) = settings.schedule.gpu.as_mut() {
                g.warpgroup_mma = on_warpgroups;
                g.compute_units = 8;
            }
            b.set_optimize_settings(settings);
            for case in &cases {
                // TF32 in 32-tiles on warps and 64-tiles on warpgroups only: its emulation is
                // the slowest, and the larger tiles add no layout of their own.
                if case.name.contains("tf32") && tile != if on_warpgroups { 64 } else { 32 } {
                    continue;
                }
                let code = b
                    .compile(CompileRequest::routine(&case.name, &case.program))
                    .unwrap();
                let split = code.optimized().schedules.iter().any(|s| {
                    matches!(
                        &s.kind,
                        ScheduleKind::Gpu(GpuPass::MatrixTiles { split: Some(_), .. })
                    )
                });
                assert!(
                    split,
                    "{} / {}: {tile}-tiles not split",
                    b.name(),
                    case.name
                );
                check_case(case, &b).unwrap_or_else(|e| {
                    panic!(
                        "{}: {tile}-tiles (warpgroups {on_warpgroups}), split: {e}",
                        b.name()
                    )
                });
            }
        }
        b.set_optimize_settings(original);
    }
}

//! GPU passes are schedules chosen in the IR from the device's limits: the choices follow the
//! limits, every GPU renderer follows the recorded choice (the corpus agrees with the
//! interpreter on the GPU backends with other group sizes than the default), products with few
//! results and long reductions split along them (and take larger tiles for it), and a renderer
//! refuses a routine scheduled for the other kind of device with a typed error.

use arrayjit::codegen::cuda::render_cuda;
use arrayjit::codegen::wgsl::{WgslTarget, render_wgsl};
use arrayjit::ir::Error;
use arrayjit::opt::schedule::{GpuLimits, GpuPass, ScheduleKind};
use arrayjit::opt::{OptimizeSettings, optimize};
use arrayjit::runtime::CompileRequest;
use arrayjit_testing::{all_cases, check_case, long_product, matmul};

/// The GPU passes of the matmul case's routine on a device of `limits`.
fn matmul_passes(n: usize, limits: GpuLimits) -> Vec<GpuPass> {
    let (case, ..) = matmul(n).unwrap();
    let opt = optimize("mm", &[], &case.program, &OptimizeSettings::for_gpu(limits)).unwrap();
    opt.schedules
        .iter()
        .map(|s| match &s.kind {
            ScheduleKind::Gpu(p) => p.clone(),
            other => panic!("not a GPU pass: {other:?}"),
        })
        .collect()
}

fn tile_of(passes: &[GpuPass]) -> Option<usize> {
    passes.iter().find_map(|p| match p {
        GpuPass::Tiles { layout, .. } => Some(layout.tile),
        _ => None,
    })
}

#[test]
fn product_tiles_follow_shared_memory_and_the_device_size() {
    // 48 KiB and a size that still makes enough 128-tiles for a small device: 128.
    let cuda = GpuLimits {
        compute_units: 8,
        ..GpuLimits::cuda_minimum()
    };
    assert_eq!(tile_of(&matmul_passes(512, cuda)), Some(128));
    // The same product on a device of 132 units gives only 16 groups of 128, 64 of 64 and 256
    // of 32, fewer than two per unit: 16-tiles (1024 groups). At 2048, 64-tiles make 1024 groups.
    let big = GpuLimits {
        compute_units: 132,
        ..GpuLimits::cuda_minimum()
    };
    assert_eq!(tile_of(&matmul_passes(512, big)), Some(16));
    assert_eq!(tile_of(&matmul_passes(2048, big)), Some(64));
    // At 1024, 64-tiles make 256 groups (under two per unit): 32-tiles (1024 groups, four
    // results per invocation) rather than 16-tiles (one).
    assert_eq!(tile_of(&matmul_passes(1024, big)), Some(32));
    // WebGPU's 16 KiB stage one buffer of a 128-tile (8.25 KiB), not two (16.5 KiB).
    let portable = GpuLimits {
        compute_units: 8,
        ..GpuLimits::portable()
    };
    let passes = matmul_passes(512, portable);
    assert_eq!(tile_of(&passes), Some(128));
    assert!(
        passes
            .iter()
            .any(|p| matches!(p, GpuPass::Tiles { layout, .. } if layout.stages == 1)),
        "{passes:?}"
    );
    // 48 KiB take two.
    assert!(
        matmul_passes(512, cuda)
            .iter()
            .any(|p| matches!(p, GpuPass::Tiles { layout, .. } if layout.stages == 2))
    );
    // 4 KiB stages only 16-tiles; 2 KiB none: the product runs as a grid.
    let small = |bytes| GpuLimits {
        max_shared_bytes: bytes,
        max_opt_in_shared_bytes: bytes,
        ..GpuLimits::portable()
    };
    assert_eq!(tile_of(&matmul_passes(256, small(4096))), Some(16));
    let passes = matmul_passes(256, small(2048));
    assert_eq!(tile_of(&passes), None);
    assert!(passes.iter().any(|p| matches!(p, GpuPass::Grid { .. })));
}

#[test]
fn group_sizes_follow_the_device_limit() {
    let limits = |n| GpuLimits {
        max_group_invocations: n,
        ..GpuLimits::portable()
    };
    assert_eq!(limits(1024).group_threads(), 256);
    assert_eq!(limits(256).group_threads(), 256);
    assert_eq!(limits(192).group_threads(), 128);
    assert_eq!(limits(64).group_threads(), 64);
    // Below 64 invocations no group reductions or tiles: grids and single passes only, and
    // attention passes (an invocation per row, no group reductions) in groups within the limit.
    for case in all_cases().unwrap() {
        let opt = optimize(
            &case.name,
            &case.bindings,
            &case.program,
            &OptimizeSettings::for_gpu(limits(32)),
        )
        .unwrap();
        for s in &opt.schedules {
            if let ScheduleKind::Gpu(GpuPass::Attention(a)) = &s.kind {
                assert!(a.rows <= 32, "{}: {s}", case.name);
                continue;
            }
            assert!(
                matches!(
                    s.kind,
                    ScheduleKind::Gpu(
                        GpuPass::Nothing
                            | GpuPass::Zero { .. }
                            | GpuPass::Grid { .. }
                            | GpuPass::Single
                    )
                ),
                "{}: {s}",
                case.name
            );
        }
    }
}

#[test]
fn renderers_refuse_routines_scheduled_for_the_other_kind_of_device() {
    let (case, ..) = matmul(64).unwrap();
    let cpu = optimize("mm", &[], &case.program, &OptimizeSettings::default()).unwrap();
    let e = render_cuda(&[&cpu]).unwrap_err();
    assert!(
        matches!(&e, Error::Render { detail, .. } if detail.contains("not as a GPU pass")),
        "{e}"
    );
    let e = render_wgsl(&cpu, &WgslTarget::default()).unwrap_err();
    assert!(
        matches!(&e, Error::Render { detail, .. } if detail.contains("not as a GPU pass")),
        "{e}"
    );
    let gpu = optimize(
        "mm",
        &[],
        &case.program,
        &OptimizeSettings::for_gpu(GpuLimits::portable()),
    )
    .unwrap();
    let e =
        arrayjit::codegen::render_program(&arrayjit::codegen::CSyntax::c(), &[&gpu]).unwrap_err();
    assert!(e.to_string().contains("GPU pass"), "{e}");
}

/// The GPU backends follow the recorded group size and tile: the corpus, with groups of 64
/// (reductions and row passes on 64 invocations, products as grids), agrees with the
/// interpreter; so does a product in 16-tiles (a device with 4 KiB of shared memory).
#[test]
fn the_corpus_agrees_on_cuda_emu_with_small_groups() {
    corpus_with_small_groups_on("cuda_emu");
}

/// See [`the_corpus_agrees_on_cuda_emu_with_small_groups`].
#[test]
fn the_corpus_agrees_on_wgpu_with_small_groups() {
    corpus_with_small_groups_on("wgpu");
}

/// See [`the_corpus_agrees_on_cuda_emu_with_small_groups`].
#[test]
fn the_corpus_agrees_on_cuda_with_small_groups() {
    corpus_with_small_groups_on("cuda");
}

/// See [`the_corpus_agrees_on_cuda_emu_with_small_groups`].
#[test]
fn the_corpus_agrees_on_metal_with_small_groups() {
    corpus_with_small_groups_on("metal");
}

/// The corpus with small groups and the 16-tile product on GPU backend `name`, where it runs
/// here (one test per backend, so the harness runs them side by side).
fn corpus_with_small_groups_on(name: &str) {
    let groups_of_64 = GpuLimits {
        max_group_invocations: 64,
        max_shared_bytes: 48 << 10,
        max_opt_in_shared_bytes: 48 << 10,
        shared_bytes_per_unit: 0,
        subgroup_size: 32,
        compute_units: 0,
        matrix_units: false,
        warpgroup_mma: false,
        joined_launch_parameters: 0,
    };
    let small_shared = GpuLimits {
        max_group_invocations: 256,
        max_shared_bytes: 4096,
        max_opt_in_shared_bytes: 4096,
        shared_bytes_per_unit: 0,
        subgroup_size: 32,
        compute_units: 0,
        matrix_units: false,
        warpgroup_mma: false,
        joined_launch_parameters: 0,
    };
    let mut ran = 0;
    let mut failures = Vec::new();
    for b in arrayjit_testing::backends_under_test(&[name]).unwrap() {
        let settings = b.optimize_settings();
        assert!(settings.schedule.gpu.is_some(), "{name} is a GPU backend");
        let info = b.get_device(0).unwrap().info().unwrap();
        let with_limits = |limits: GpuLimits| OptimizeSettings {
            schedule: arrayjit::opt::schedule::ScheduleSettings {
                gpu: Some(limits),
                ..settings.schedule.clone()
            },
            ..settings.clone()
        };
        b.set_optimize_settings(with_limits(groups_of_64));
        let mut reductions = 0;
        for case in all_cases().unwrap() {
            match check_case(&case, &b) {
                Ok(()) => ran += 1,
                Err(Error::UnsupportedPrecision { prec, .. }) if !info.supports(prec) => {
                    continue;
                }
                Err(e) => failures.push(format!("{} / {}: {e}", b.name(), case.name)),
            }
            let code = b
                .compile(
                    CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings),
                )
                .unwrap();
            reductions += code
                .optimized()
                .schedules
                .iter()
                .filter(|s| {
                    matches!(
                        s.kind,
                        ScheduleKind::Gpu(
                            GpuPass::Reduction { threads: 64, .. }
                                | GpuPass::Rows { threads: 64, .. }
                        )
                    )
                })
                .count();
        }
        assert!(reductions > 0, "{}: no pass ran on groups of 64", b.name());
        b.set_optimize_settings(with_limits(small_shared));
        let (case, ..) = matmul(64).unwrap();
        if let Err(e) = check_case(&case, &b) {
            failures.push(format!("{} / 16-tiles: {e}", b.name()));
        }
        let code = b
            .compile(CompileRequest::routine("mm64", &case.program))
            .unwrap();
        assert!(
            code.optimized()
                .schedules
                .iter()
                .any(|s| matches!(s.kind, ScheduleKind::Gpu(GpuPass::Tiles { layout, .. }) if layout.tile == 16)),
            "{}",
            code.optimized().schedule_report()
        );
        b.set_optimize_settings(settings);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{name}: {ran} corpus runs with groups of 64");
}

/// A row pass holding reductions in two element types runs both as group reductions, each
/// over a shared array of its own type (WGSL declares its workgroup arrays once per module),
/// in both dialects.
#[test]
fn a_row_pass_reduces_in_two_element_types_on_the_group() {
    let case = all_cases()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "fused_row_sums_in_two_precisions")
        .unwrap();
    let opt = optimize(
        &case.name,
        &case.bindings,
        &case.program,
        &OptimizeSettings::for_gpu(GpuLimits::portable()),
    )
    .unwrap();
    assert!(
        opt.schedules
            .iter()
            .any(|s| matches!(s.kind, ScheduleKind::Gpu(GpuPass::Rows { .. }))),
        "{}",
        opt.schedule_report()
    );
    let wgsl = render_wgsl(&opt, &WgslTarget::default())
        .unwrap()
        .full_source();
    let cuda = render_cuda(&[&opt]).unwrap().source;
    for (source, f32_array, i32_array) in [
        (
            &wgsl,
            "var<workgroup> aj_red_f32: array<f32, 256>;",
            "var<workgroup> aj_red_i32: array<i32, 256>;",
        ),
        (
            &cuda,
            "__shared__ __align__(16) float aj_red_f32[256];",
            "__shared__ __align__(16) int32_t aj_red_i32[256];",
        ),
    ] {
        assert!(source.contains(f32_array), "{source}");
        assert!(source.contains(i32_array), "{source}");
        assert_eq!(source.matches("aj_red_i32[aj_t] = aj_acc;").count(), 1);
    }
}

/// The schedule's tuning sets the tile of products and the group size of passes, within what
/// the device allows (a tile whose staging does not fit is not used; groups are never larger
/// than the device's).
#[test]
fn the_tuning_sets_tiles_and_group_sizes_within_the_limits() {
    use arrayjit::opt::schedule::ScheduleTuning;
    let tuned = |limits: GpuLimits, gpu_threads, gpu_tile| {
        let (case, ..) = matmul(256).unwrap();
        let mut settings = OptimizeSettings::for_gpu(limits);
        settings.schedule.tuning = ScheduleTuning {
            gpu_threads,
            gpu_tile,
            ..ScheduleTuning::default()
        };
        let opt = optimize("mm", &[], &case.program, &settings).unwrap();
        opt.schedules
            .iter()
            .map(|s| match &s.kind {
                ScheduleKind::Gpu(p) => (p.clone(), s.why.clone()),
                other => panic!("not a GPU pass: {other:?}"),
            })
            .collect::<Vec<_>>()
    };
    let cuda = GpuLimits::cuda_minimum();
    let passes = tuned(cuda, None, Some(16));
    let (tiles, why) = passes
        .iter()
        .find(|(p, _)| matches!(p, GpuPass::Tiles { .. }))
        .unwrap();
    assert!(
        matches!(tiles, GpuPass::Tiles { layout, .. } if layout.tile == 16),
        "{tiles:?}"
    );
    assert!(why.contains("tuning"), "{why}");
    // 128-tiles do not fit 4 KiB: the heuristic's tile instead (16, the only one that fits).
    let small = GpuLimits {
        max_shared_bytes: 4096,
        max_opt_in_shared_bytes: 4096,
        ..GpuLimits::portable()
    };
    assert_eq!(
        tile_of(
            &tuned(small, None, Some(128))
                .into_iter()
                .map(|(p, _)| p)
                .collect::<Vec<_>>()
        ),
        Some(16)
    );
    // Groups of 64 where asked; never more than the device allows (a pointwise pass over 64K
    // elements, which groups of 256 still cover with 256 groups).
    let grid_threads = |limits: GpuLimits, gpu_threads| {
        let x = arrayjit::ir::Tnode::new(arrayjit::ir::Prec::F32, &[1 << 16], &["x"]).unwrap();
        let y = arrayjit::ir::Tnode::new(arrayjit::ir::Prec::F32, &[1 << 16], &["y"]).unwrap();
        let program = arrayjit::ir::Assignments::pointwise_unop(&y, arrayjit::ir::UnOp::Relu, &x);
        let mut settings = OptimizeSettings::for_gpu(limits);
        settings.schedule.tuning = ScheduleTuning {
            gpu_threads,
            ..ScheduleTuning::default()
        };
        let opt = optimize("relu", &[], &program, &settings).unwrap();
        opt.schedules.iter().find_map(|s| match &s.kind {
            ScheduleKind::Gpu(GpuPass::Grid { threads, .. }) => Some(*threads),
            _ => None,
        })
    };
    assert_eq!(grid_threads(cuda, Some(64)), Some(64));
    let small = GpuLimits {
        max_group_invocations: 128,
        ..cuda
    };
    assert_eq!(grid_threads(small, Some(256)), Some(128));
}

/// On a GPU backend the schedule search varies the tile and the group size (not the CPU's
/// blocking), times the candidates on the device, and every candidate computes the product.
#[test]
fn the_search_varies_gpu_tiles_and_groups_on_gpu_backends() {
    use arrayjit::runtime::SearchSettings;
    use std::time::Duration;
    let backends = arrayjit_testing::backends_under_test(&["cuda_emu", "wgpu"]).unwrap();
    for b in backends {
        b.set_search_settings(SearchSettings {
            batch_time: Duration::from_millis(1),
            batches: 1,
            max_compiles: 8,
            ..SearchSettings::default()
        });
        let (case, ..) = matmul(128).unwrap();
        let report = b.search_schedule("mm", &case.program, &[]).unwrap();
        let text = report.to_string();
        assert!(
            report
                .candidates
                .iter()
                .any(|c| c.choice.tuning.gpu_tile.is_some() && c.seconds.is_some()),
            "{}: {text}",
            b.name()
        );
        assert!(
            report
                .candidates
                .iter()
                .all(|c| c.choice.tuning.register_rows.is_none()
                    && c.choice.tuning.block_scale_log2 == [0; 3]),
            "{}: {text}",
            b.name()
        );
        // The winner compiles and agrees with the interpreter.
        let mut settings = b.optimize_settings();
        settings.schedule.tuning = report.winner.tuning;
        settings.enable_loop_fusion = report.winner.loop_fusion;
        b.set_optimize_settings(settings);
        let (case, ..) = matmul(128).unwrap();
        check_case(&case, &b).unwrap();
    }
}

/// Settings built from `OptimizeSettings::default()` (which knows no device) keep the GPU
/// backend's limits and pool alignment: the device's facts are not dropped by a user tuning
/// something else, and the routine still runs as GPU passes and agrees with the interpreter.
#[test]
fn settings_from_the_defaults_keep_the_devices_gpu_limits() {
    let mut ran = 0;
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let before = b.optimize_settings();
        let Some(limits) = before.schedule.gpu else {
            continue;
        };
        b.set_optimize_settings(OptimizeSettings {
            enable_fma: false,
            pool_alignment: 1,
            ..OptimizeSettings::default()
        });
        let now = b.optimize_settings();
        assert_eq!(now.schedule.gpu, Some(limits), "{}", b.name());
        assert!(!now.enable_fma, "{}: the setting given is kept", b.name());
        let required = b.lowered().runtime().pool_alignment();
        assert!(now.pool_alignment >= required, "{}", b.name());
        let (case, ..) = matmul(64).unwrap();
        check_case(&case, &b).unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        let code = b
            .compile(CompileRequest::routine("mm64", &case.program))
            .unwrap();
        assert!(
            code.optimized()
                .schedules
                .iter()
                .all(|s| matches!(s.kind, ScheduleKind::Gpu(_))),
            "{}: {}",
            b.name(),
            code.optimized().schedule_report()
        );
        b.set_optimize_settings(before);
        ran += 1;
    }
    eprintln!("checked on {ran} GPU backend(s)");
}

/// Passes joined into one launch compute the same bits as passes launched alone, in program
/// order: the corpus cases whose GPU plans join passes (small reductions, rows, grids,
/// zeroings, a static index) give identical results with and without joining on every GPU
/// backend under test that joins.
#[test]
fn joined_launches_compute_the_bits_of_passes_launched_alone() {
    let mut compared = 0;
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let settings = b.optimize_settings();
        let Some(limits) = settings.schedule.gpu else {
            continue;
        };
        if limits.joined_launch_parameters == 0 {
            continue;
        }
        let run = |joined: usize| -> Vec<(String, Vec<u64>)> {
            b.set_optimize_settings(OptimizeSettings {
                schedule: arrayjit::opt::schedule::ScheduleSettings {
                    gpu: Some(GpuLimits {
                        joined_launch_parameters: joined,
                        ..limits
                    }),
                    ..settings.schedule.clone()
                },
                ..settings.clone()
            });
            let mut out = Vec::new();
            for case in all_cases().unwrap().into_iter().filter(|c| {
                ["joined_small_passes", "reductions", "long_row_reductions"]
                    .contains(&c.name.as_str())
            }) {
                check_case(&case, &b).unwrap_or_else(|e| panic!("{}: {e}", b.name()));
                for r in &case.results {
                    let bits = r
                        .host()
                        .get_values()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    out.push((format!("{} / {}", case.name, r.label().join("_")), bits));
                }
            }
            out
        };
        let alone = run(0);
        let together = run(limits.joined_launch_parameters);
        assert_eq!(alone, together, "{}", b.name());
        b.set_optimize_settings(settings);
        compared += 1;
    }
    println!("compared on {compared} backend(s)");
}

/// The tiled pass of a product case on a device of `limits`: its tile, and its slices (1 when
/// the reduction is not split).
fn product_pass(case: &arrayjit_testing::Case, limits: GpuLimits) -> (usize, u64) {
    let opt = optimize(
        &case.name,
        &[],
        &case.program,
        &OptimizeSettings::for_gpu(limits),
    )
    .unwrap();
    opt.schedules
        .iter()
        .find_map(|s| match &s.kind {
            ScheduleKind::Gpu(GpuPass::Tiles { layout, split, .. }) => {
                Some((layout.tile, split.as_ref().map_or(1, |k| k.slices)))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{}: no tiled pass", case.name))
}

#[test]
fn long_reductions_split_into_slices_and_take_larger_tiles() {
    let large = GpuLimits {
        compute_units: 132,
        ..GpuLimits::cuda_minimum()
    };
    let gradient = |m, k, n| long_product("g", "ki,kj->ij", &[k, m], &[k, n], &[m, n]).unwrap();
    // A weight gradient of the GPT step at batch 128: 128 x 128 results over 8192 steps. Its
    // 16-tiles alone make 64 groups for 264; split, 32-tiles make 16 x 32 slices of 256 steps.
    assert_eq!(product_pass(&gradient(128, 8192, 128), large), (32, 32));
    // 128 x 512 over 8192: 64-tiles, 16 of them, 32 slices.
    assert_eq!(product_pass(&gradient(128, 8192, 512), large), (64, 32));
    // At batch 16 (1024 steps) the reduction is too short for larger tiles (under 4 times the
    // longer side for 128 x 512): 16-tiles, split into slices of at least 16 depth steps.
    assert_eq!(product_pass(&gradient(128, 1024, 128), large), (16, 4));
    // Square products keep their tiles and their loop order: enough tiles, or too short a
    // reduction for slices.
    let square = |n| long_product("s", "ik,kj->ij", &[n, n], &[n, n], &[n, n]).unwrap();
    assert_eq!(product_pass(&square(1024), large), (32, 1));
    assert_eq!(product_pass(&square(256), large), (16, 1));
    // The pieces a renderer plans itself (WGSL's binding split) never split: the partial
    // results must be a node of the routine.
    let case = gradient(128, 8192, 128);
    let opt = optimize("g", &[], &case.program, &OptimizeSettings::for_gpu(large)).unwrap();
    let product = opt.code.unwrapped().clone();
    let stmts = match &product {
        arrayjit::ir::LowLevel::Seq(items) => items.clone(),
        other => vec![other.clone()],
    };
    for stmt in &stmts {
        let (pass, _) = arrayjit::opt::schedule::gpu::plan_pass(
            stmt,
            &large,
            &arrayjit::opt::schedule::ScheduleTuning::default(),
        );
        assert!(
            !matches!(pass, GpuPass::Tiles { split: Some(_), .. }),
            "{pass}"
        );
    }
}

/// On every GPU backend, planned for a small device (8 units: 16 groups keep it busy), a
/// product split along its reduction into 32-tiles agrees with the interpreter, as does one
/// of 16-tiles with a batch axis, and the plan says so.
#[test]
fn split_products_agree_with_the_interpreter_on_gpu_backends() {
    let cases = [
        (
            long_product(
                "split_32_tiles",
                "ki,kj->ij",
                &[1024, 64],
                &[1024, 64],
                &[64, 64],
            )
            .unwrap(),
            (32, 4),
        ),
        (
            long_product(
                "split_batched_16_tiles",
                "bik,bkj->bij",
                &[3, 20, 600],
                &[3, 600, 24],
                &[3, 20, 24],
            )
            .unwrap(),
            (16, 2),
        ),
    ];
    let mut ran = 0;
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let settings = b.optimize_settings();
        let Some(limits) = settings.schedule.gpu else {
            continue;
        };
        let small = GpuLimits {
            compute_units: 8,
            ..limits
        };
        let mut planned = settings.clone();
        planned.schedule.gpu = Some(small);
        b.set_optimize_settings(planned);
        for (case, want) in &cases {
            assert_eq!(product_pass(case, small), *want, "{}", case.name);
            let checked = check_case(case, &b);
            assert!(checked.is_ok(), "{} / {}: {checked:?}", b.name(), case.name);
            ran += 1;
        }
        b.set_optimize_settings(settings);
    }
    if std::env::var("ARRAYJIT_REQUIRE_BACKENDS").is_ok_and(|v| v.contains("cuda_emu")) {
        assert!(ran > 0, "no GPU backend ran the split products");
    }
}

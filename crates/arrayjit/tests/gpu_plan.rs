//! The GPT trainer's GPU plans, read without a device: every routine (step, held-out loss,
//! sampling) planned for the limits of a 132-SM device keeps the device busy, by the issue's
//! measures.

use arrayjit::gpt::{GptPrograms, TrainerConfig};
use arrayjit::opt::optimize::{OptimizeCtx, OptimizeSettings, optimize_in};
use arrayjit::opt::schedule::gpu::{DeviceModel, GpuPlan};
use arrayjit::runtime::CompileRequest;

fn gpt_plans(device: &DeviceModel, batch: usize) -> Vec<GpuPlan> {
    let mut plans = gpt_plans_with(device, batch, arrayjit::tensor::nn::AttentionKind::Fused);
    plans.extend(gpt_plans_with(
        device,
        batch,
        arrayjit::tensor::nn::AttentionKind::Unfused,
    ));
    plans
}

fn gpt_plans_with(
    device: &DeviceModel,
    batch: usize,
    attention: arrayjit::tensor::nn::AttentionKind,
) -> Vec<GpuPlan> {
    let mut config = TrainerConfig::small(65);
    config.batch = batch;
    // The model's attention: fused (the default), or unfused (its products tiled).
    config.model.attention = attention;
    let programs = GptPrograms::new(&config).expect("programs");
    let settings = OptimizeSettings::for_gpu(device.limits);
    let ctx = OptimizeCtx::empty();
    programs
        .routines()
        .iter()
        .map(|(name, program)| {
            optimize_in(&ctx, name, &[], program, &settings)
                .expect("optimized")
                .gpu_plan(device)
        })
        .collect()
}

/// The measures of a plan that keeps the device busy, for a device of `units` units:
/// what breaks them, one line per pass.
fn idle_passes(plan: &GpuPlan, units: u64) -> Vec<String> {
    let mut bad = Vec::new();
    for p in &plan.passes {
        let line = |what: &str| {
            format!(
                "{} statement {} ({} × {}): {what}; {}",
                plan.routine, p.statement, p.groups, p.threads, p.why
            )
        };
        if p.independent > 1 << 16 && p.groups < 2 * units {
            bad.push(line(&format!(
                "{} independent iterations on fewer than {} groups",
                p.independent,
                2 * units
            )));
        }
        if p.shape == "single" && p.ops > 4096 {
            bad.push(line(&format!("{} operations on one invocation", p.ops)));
        }
        if p.reduced_by_one_group > 1 << 16 {
            bad.push(line(&format!(
                "{} steps reduced by one group",
                p.reduced_by_one_group
            )));
        }
        // A product whose few groups each walk a long reduction (a weight gradient summed
        // over batch × context on 64 groups took 38% of the b128 step on an H200).
        if p.shape.contains("tiles") && p.groups < 2 * units && p.reduced_by_one_group > 2048 {
            bad.push(line(&format!(
                "a product of {} groups for {units} units, each summing {} steps",
                p.groups, p.reduced_by_one_group
            )));
        }
    }
    bad
}

/// Every routine of the GPT trainer (step, held-out loss, sampling), at batch 16 and 128, with
/// fused attention and with unfused, planned for a 132-SM device: no pass with more than 64K independent iterations runs on
/// fewer than 2 × 132 groups, no single-invocation pass does more than 4096 operations, no
/// reduction of more than 64K steps runs on one group, and no product on fewer than 2 × 132
/// groups sums more than 2048 steps in each (its reduction is split instead).
#[test]
fn gpt_plans_keep_a_132_unit_device_busy() {
    let device = DeviceModel::h100();
    assert_eq!(device.limits.compute_units, 132);
    for batch in [16, 128] {
        for plan in gpt_plans(&device, batch) {
            let bad = idle_passes(&plan, 132);
            assert!(
                bad.is_empty(),
                "batch {batch}:\n{}\n\n{plan}",
                bad.join("\n")
            );
            assert!(plan.estimate_us() > 0.0);
        }
    }
}

/// The plan is data: its listing names every pass with its shape and estimate, and the
/// measures above catch a plan that leaves the device idle (the same step planned as if the
/// device had 2 units keeps its shared loops as small grids).
#[test]
fn a_plan_lists_its_passes_and_the_measures_catch_idle_ones() {
    let device = DeviceModel::h100();
    let plans = gpt_plans(&device, 16);
    let listing = plans[0].to_string();
    assert!(listing.starts_with("GPU plan of gpt_train_step on NVIDIA H100 SXM (sm_90)"));
    for shape in ["tiles", "rows", "grid", "reduction", "grid reduction"] {
        assert!(
            plans[0].passes.iter().any(|p| p.shape == shape),
            "no {shape} pass:\n{listing}"
        );
    }
    let small = DeviceModel::from_limits(
        "a 2-unit device",
        arrayjit::opt::schedule::GpuLimits {
            compute_units: 2,
            ..device.limits
        },
    );
    let idle: usize = gpt_plans(&small, 16)
        .iter()
        .map(|p| idle_passes(p, 132).len())
        .sum();
    assert!(
        idle > 0,
        "a plan for 2 units should leave a 132-unit device idle"
    );
}

/// The corpus on the GPU backends planned for a 132-unit device (distributed nests, hoisted
/// reductions, row passes, grid reductions, products split along their reductions) agrees
/// with the interpreter; the GPU-shape cases
/// take the shapes they are there for.
#[test]
fn the_corpus_agrees_on_gpu_backends_planned_for_a_large_device() {
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    use arrayjit_testing::{all_cases, check_case};
    let mut failures = Vec::new();
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let settings = b.optimize_settings();
        let Some(limits) = settings.schedule.gpu else {
            continue;
        };
        let info = b.get_device(0).unwrap().info().unwrap();
        let mut large = settings.clone();
        large.schedule.gpu = Some(arrayjit::opt::schedule::GpuLimits {
            compute_units: 132,
            ..limits
        });
        b.set_optimize_settings(large);
        let mut shapes = std::collections::BTreeSet::new();
        for case in all_cases().unwrap() {
            match check_case(&case, &b) {
                Ok(()) => {}
                Err(arrayjit::Error::UnsupportedPrecision { prec, .. }) if !info.supports(prec) => {
                    continue;
                }
                Err(e) => failures.push(format!("{} / {}: {e}", b.name(), case.name)),
            }
            let code = b
                .compile(
                    CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings),
                )
                .unwrap();
            for s in &code.optimized().schedules {
                match &s.kind {
                    ScheduleKind::Gpu(GpuPass::GridReduction { start, .. }) => {
                        shapes.insert(format!("grid reduction (start {start:?})"));
                    }
                    ScheduleKind::Gpu(GpuPass::Reduction { start: Some(_), .. }) => {
                        shapes.insert("reduction from a constant".to_string());
                    }
                    ScheduleKind::Gpu(GpuPass::Tiles {
                        split: Some(_),
                        gemm,
                        epilogue,
                        ..
                    }) => {
                        shapes.insert("split product".to_string());
                        if epilogue.is_some() && !gemm.overwrite {
                            shapes.insert("split product onto its values, epilogue".to_string());
                        }
                        if !gemm.batch.is_empty() {
                            shapes.insert("split batched product".to_string());
                        }
                    }
                    _ if s.why.contains("distributed") => {
                        shapes.insert("distributed".to_string());
                    }
                    _ if s.why.contains("hoisted") => {
                        shapes.insert("hoisted".to_string());
                    }
                    _ => {}
                }
            }
        }
        b.set_optimize_settings(settings);
        for want in [
            "grid reduction (start None)",
            "hoisted",
            "distributed",
            "split product",
            "split product onto its values, epilogue",
            "split batched product",
        ] {
            assert!(
                shapes.contains(want),
                "{}: no {want} pass in the corpus: {shapes:?}",
                b.name()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The GPT step's kernels planned for an H200 with TF32 allowed and with its products in
/// `bf16` (batch 128: split products on the matrix units among them; and again with the tensor
/// memory accelerator staging the warpgroup products' factors), compiled by NVRTC for
/// `sm_90a`: no kernel spills registers, and ptxas runs every warpgroup product as issued
/// (it serializes them where a path reaches their accumulators around them).
#[test]
#[cfg(feature = "cuda")]
fn gpt_step_kernels_compile_for_sm_90a_without_spills_or_serialized_products() {
    use arrayjit::Error;
    use arrayjit::backends::cuda_backend::resources::kernel_resources;
    use arrayjit::codegen::cuda::render_cuda;
    use arrayjit::opt::schedule::gpu::MatrixKind;
    use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
    use arrayjit::tensor::precision::Precision;
    let device = DeviceModel::named("h200").unwrap();
    for (allow_tf32, precision, tensor_copies) in [
        (true, Precision::F32, false),
        (false, Precision::Bf16Products, false),
        (false, Precision::Bf16Products, true),
    ] {
        let mut config = TrainerConfig::small(65);
        config.batch = 128;
        config.model.precision = precision;
        let programs = GptPrograms::new(&config).expect("programs");
        let mut settings = OptimizeSettings::for_gpu(device.limits);
        settings.schedule.allow_tf32 = allow_tf32;
        settings.schedule.tuning.gpu_tensor_copies = tensor_copies;
        let ctx = OptimizeCtx::empty();
        for (name, program) in programs.routines() {
            let optimized = optimize_in(&ctx, name, &[], program, &settings).expect("optimized");
            if !name.contains("train_step") {
                continue;
            }
            // With TF32 allowed, the step's large products run on warpgroups.
            let tf32_on_warpgroups = optimized.schedules.iter().any(|s| {
                matches!(
                    &s.kind,
                    ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, .. })
                        if layout.warpgroups && layout.kind == MatrixKind::Tf32
                )
            });
            assert_eq!(tf32_on_warpgroups, allow_tf32);
            // Where the tuning asks, the tensor memory accelerator stages warpgroup factors.
            let staged = optimized.schedules.iter().any(|s| {
                matches!(
                    &s.kind,
                    ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, .. })
                        if layout.tensor_copy.contains(&true)
                )
            });
            assert_eq!(staged, tensor_copies);
            let source = render_cuda(&[&optimized]).unwrap().source;
            let kernels = match kernel_resources(&source, "sm_90a") {
                Ok(k) => k,
                Err(Error::BackendUnavailable { reason, .. }) => {
                    eprintln!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            assert!(kernels.len() > 50, "{}", kernels.len());
            for k in &kernels {
                assert!(
                    k.spill_bytes == 0 && k.performance_notes.is_empty(),
                    "tf32 {allow_tf32}, {precision:?}, tensor copies {tensor_copies}: {k:?}"
                );
            }
        }
    }
}

/// The GPT trainer's fused attention runs as the GPU's attention passes (one forward launch,
/// two backward per layer), none left to its loops: at its context of 64, groups of one warp
/// (8 rows × 4 lanes), enough of them to keep a 132-SM device busy.
#[test]
fn fused_attention_runs_as_gpu_attention_passes() {
    let device = DeviceModel::h100();
    let plans = gpt_plans_with(&device, 16, arrayjit::tensor::nn::AttentionKind::Fused);
    let step = plans
        .iter()
        .find(|p| p.routine == "gpt_train_step")
        .expect("a training step");
    let attention: Vec<_> = step
        .passes
        .iter()
        .filter(|p| p.shape == "attention")
        .collect();
    // Two layers: a forward and a backward pass each.
    assert_eq!(attention.len(), 4, "{step}");
    assert_eq!(
        attention.iter().map(|p| p.launches).sum::<u32>(),
        6,
        "{step}"
    );
    for p in &attention {
        // 4096 rows of 32 features: 8 rows × 4 lanes per group, 512 groups.
        assert_eq!((p.groups, p.threads), (512, 32), "{step}");
        assert!(p.why.contains("FlashAttention-2"), "{}", p.why);
    }
    assert!(
        !step
            .passes
            .iter()
            .any(|p| p.why.contains("left to its loops")),
        "{step}"
    );
}

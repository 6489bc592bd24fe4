//! The CUDA renderer over the whole shared corpus, checked without a GPU: every case renders,
//! its passes map statements onto the GPU as the module documentation says (tiled products,
//! block reductions, rows, grids), and — where NVRTC is installed (CI installs NVIDIA's NVRTC wheel)
//! — every rendered file compiles to PTX. Running the kernels needs a GPU: the differential
//! corpus runs on `cuda` wherever `arrayjit info` lists it available.

#![cfg(feature = "cuda")]

use arrayjit::backends::cuda_backend::compile_ptx;
use arrayjit::codegen::cuda::render_cuda;
use arrayjit::codegen::gpu_kernel::PassShape;
use arrayjit::ir::Error;
use arrayjit::opt::{OptimizeSettings, optimize};
use arrayjit_testing::{all_cases, matmul};

/// A virtual architecture every NVRTC from CUDA 11.8 to 13 compiles for.
const ARCH: &str = "compute_80";

/// A corpus case optimized for the smallest CUDA device's limits.
fn for_cuda_minimum(case: &arrayjit_testing::Case) -> arrayjit::opt::Optimized {
    optimize(
        &case.name,
        &case.bindings,
        &case.program,
        &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::cuda_minimum()),
    )
    .unwrap()
}

#[test]
fn every_corpus_case_renders_to_cuda_that_nvrtc_compiles() {
    let mut sources = Vec::new();
    let mut shapes = Vec::new();
    for case in all_cases().unwrap() {
        let opt = for_cuda_minimum(&case);
        let program = render_cuda(&[&opt]).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let k = &program.kernels[0];
        assert_eq!(k.interface.name, case.name);
        for p in &k.passes {
            // Every pass but the single-thread one runs whole blocks.
            let (blocks, threads) = p.launch_dims();
            assert!(blocks >= 1 && threads >= 1, "{}: {p:?}", case.name);
            shapes.push(p.shape.clone());
        }
        sources.push((case.name.clone(), program.source));
    }
    let tiled = shapes
        .iter()
        .filter(|s| matches!(s, PassShape::Tiles(_)))
        .count();
    let reductions = shapes
        .iter()
        .filter(|s| matches!(s, PassShape::Reduction))
        .count();
    let grids = shapes
        .iter()
        .filter(|s| matches!(s, PassShape::Grid(_)))
        .count();
    let rows = shapes
        .iter()
        .filter(|s| matches!(s, PassShape::Rows(_)))
        .count();
    let joined = shapes
        .iter()
        .filter(|s| matches!(s, PassShape::Joined { .. }))
        .count();
    assert!(
        tiled > 0 && reductions > 0 && grids > 0 && rows > 0 && joined > 0,
        "{shapes:?}"
    );
    // The products of the differential test (128), of 1024 and of the device bench (2048) are
    // tiled: 16-tiles where larger ones would leave most units idle, 64 × 64 per block from
    // 256 such tiles on (a device that does not say its units), 128 × 128 likewise.
    for (n, tile) in [(128, 16), (1024, 64), (2048, 128)] {
        let (m, ..) = matmul(n).unwrap();
        let opt = optimize(
            "matmul",
            &m.bindings,
            &m.program,
            &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::cuda_minimum()),
        )
        .unwrap();
        let p = render_cuda(&[&opt]).unwrap();
        let passes = &p.kernels[0].passes;
        assert!(
            passes
                .iter()
                .any(|p| matches!(p.shape, PassShape::Tiles(_))),
            "{passes:?}"
        );
        let layout = opt.schedules.iter().find_map(|s| match &s.kind {
            arrayjit::opt::schedule::ScheduleKind::Gpu(
                arrayjit::opt::schedule::GpuPass::Tiles { layout, .. },
            ) => Some(*layout),
            _ => None,
        });
        assert_eq!(layout.map(|l| l.tile), Some(tile), "matmul {n}");
        let staged = layout.unwrap().stages * layout.unwrap().staged_elements();
        assert!(
            p.source.contains(&format!("aj_ta[{staged}]")),
            "matmul {n}: the source does not stage {tile}-tiles"
        );
        sources.push((format!("matmul_{n}"), p.source));
    }
    // A hand-written kernel for `compile_source` (run on cuda_emu in reference_items_backends.rs).
    sources.push((
        "hand-written row sums".into(),
        include_str!("fixtures/row_sums.cu").into(),
    ));
    let mut failures = Vec::new();
    for (name, source) in &sources {
        match compile_ptx(source, ARCH) {
            Ok(ptx) => assert!(ptx.contains(".entry"), "{name}: no kernel in the PTX"),
            Err(Error::BackendUnavailable { reason, .. }) => {
                eprintln!("skipping the NVRTC compile of the corpus: {reason}");
                return;
            }
            Err(e) => failures.push(format!("{name}: {e}\n{source}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("NVRTC compiled {} CUDA files of the corpus", sources.len());
}

/// The PTX of a compile that must not have come from a cache; `None` (the test says it skipped)
/// where NVRTC is not installed.
fn freshly_compiled(
    result: Result<(String, arrayjit::backends::cuda_backend::PtxOrigin), Error>,
) -> Option<String> {
    match result {
        Ok((ptx, origin)) => {
            assert_eq!(
                origin,
                arrayjit::backends::cuda_backend::PtxOrigin::Compiled
            );
            Some(ptx)
        }
        Err(Error::BackendUnavailable { reason, .. }) => {
            eprintln!("skipped: {reason}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// NVRTC's PTX is kept in the compile cache folder: a later process (a new cache here) reads
/// it instead of compiling; a damaged file, or one others may write, is refused and the program
/// compiled anew.
#[test]
fn ptx_is_cached_on_disk_and_damaged_files_are_refused() {
    use arrayjit::backends::cuda_backend::{PtxCache, PtxOrigin};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let nonce = std::process::id();
    let source = format!(
        "/* {nonce} */ extern \"C\" __global__ void k(float *x) {{ x[threadIdx.x] = 1.0f; }}"
    );
    let first = PtxCache::new(Some(dir.path()));
    let Some(ptx) = freshly_compiled(first.compile(&source, ARCH)) else {
        return;
    };
    assert_eq!(first.compile(&source, ARCH).unwrap().1, PtxOrigin::Memory);
    let fresh = || {
        PtxCache::new(Some(dir.path()))
            .compile(&source, ARCH)
            .unwrap()
    };
    assert_eq!(fresh(), (ptx.clone(), PtxOrigin::Disk));
    let files: Vec<_> = std::fs::read_dir(dir.path().join("ptx"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    // One byte changed: refused, compiled again, and the file replaced by a good one.
    let mut bytes = std::fs::read(file).unwrap();
    bytes[10] ^= 1;
    std::fs::write(file, &bytes).unwrap();
    assert_eq!(fresh(), (ptx.clone(), PtxOrigin::Compiled));
    assert_eq!(fresh(), (ptx.clone(), PtxOrigin::Disk));
    // Writable by others: refused.
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(fresh(), (ptx.clone(), PtxOrigin::Compiled));
    // A different architecture is a different file.
    let other = PtxCache::new(Some(dir.path()))
        .compile(&source, "compute_75")
        .unwrap();
    assert_eq!(other.1, PtxOrigin::Compiled);
    assert_ne!(other.0, ptx);
}

/// `Compiler.compile ~options` on the cuda backend: NVRTC compiles with the options given
/// (the architecture always the device's), cached per options; an option NVRTC refuses is a
/// render error with its log. Needs NVRTC only (CI installs it), no GPU.
#[test]
fn nvrtc_compiles_with_the_options_given_and_caches_per_options() {
    use arrayjit::backends::cuda_backend::{PtxCache, PtxOrigin, default_nvrtc_flags};
    let nonce = std::process::id();
    // `a * b + c`: contracted to an fma only when --fmad allows it.
    let source = format!(
        "/* {nonce} */ extern \"C\" __global__ void k(float *x) {{\n  \
         x[threadIdx.x] = x[threadIdx.x] * x[threadIdx.x + 32] + x[threadIdx.x + 64];\n}}"
    );
    let cache = PtxCache::new(None);
    let Some(strict) = freshly_compiled(cache.compile_with(&source, ARCH, &default_nvrtc_flags()))
    else {
        return;
    };
    assert!(!strict.contains("fma.rn.f32"), "{strict}");
    // The defaults are what compile uses: the same entry.
    assert_eq!(
        cache.compile(&source, ARCH).unwrap(),
        (strict.clone(), PtxOrigin::Memory)
    );
    let fused = cache
        .compile_with(&source, ARCH, &["--fmad=true".to_string()])
        .unwrap();
    assert_eq!(
        fused.1,
        PtxOrigin::Compiled,
        "other options are another entry"
    );
    assert!(fused.0.contains("fma.rn.f32"), "{}", fused.0);
    let e = cache
        .compile_with(&source, ARCH, &["--no-such-nvrtc-option".to_string()])
        .unwrap_err();
    assert!(matches!(e, Error::Render { .. }), "{e}");
}

/// Ahead of time, without a GPU: the whole corpus as one program and the GPT trainer's step
/// (planned for an H100) compile to CUBIN in parallel units for sm_80 and sm_90; the units are
/// ELF images defining every kernel; a later process reads them from the disk cache; an
/// architecture that is not a real one is refused.
#[test]
fn routines_compile_to_cubin_ahead_of_time_for_named_architectures() {
    use arrayjit::backends::cuda_backend::aot::compile_ahead_of_time_with;
    use arrayjit::backends::cuda_backend::{PtxCache, PtxOrigin};
    use arrayjit::gpt::{GptPrograms, TrainerConfig};
    use arrayjit::opt::schedule::gpu::DeviceModel;
    let corpus: Vec<_> = all_cases().unwrap().iter().map(for_cuda_minimum).collect();
    let h100 = DeviceModel::h100();
    let programs = GptPrograms::new(&TrainerConfig::small(65)).unwrap();
    let (name, step) = programs.routines()[0];
    let step = optimize(name, &[], step, &OptimizeSettings::for_gpu(h100.limits)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::new(Some(dir.path()));
    let corpus_refs: Vec<_> = corpus.iter().collect();
    let mut jobs = vec![
        ("corpus", corpus_refs.clone(), "sm_80"),
        ("corpus", corpus_refs, "sm_90"),
    ];
    jobs.push(("gpt step", vec![&step], "sm_90"));
    for (what, routines, arch) in &jobs {
        let p = match compile_ahead_of_time_with(routines, arch, Some(4), &cache) {
            Ok(p) => p,
            Err(Error::BackendUnavailable { reason, .. }) => {
                eprintln!("skipped: {reason}");
                return;
            }
            Err(e) => panic!("{what} for {arch}: {e}"),
        };
        assert!(
            p.units.len() > 1 && p.units.len() <= 4,
            "{what}: {} units",
            p.units.len()
        );
        let defined: usize = p.units.iter().map(|u| u.symbols.len()).sum();
        assert_eq!(
            defined,
            p.program.functions.len(),
            "{what}: every kernel in one unit"
        );
        for u in &p.units {
            assert!(
                u.cubin.starts_with(b"\x7fELF"),
                "{what} for {arch}: not an ELF image"
            );
            assert_eq!(u.origin, PtxOrigin::Compiled);
        }
        eprintln!(
            "{what} for {arch}: {} kernels, render {:?}, NVRTC {:?} in {} units",
            p.program.functions.len(),
            p.render,
            p.compile,
            p.units.len()
        );
    }
    // A later process: every unit from the disk cache.
    let later = PtxCache::new(Some(dir.path()));
    let again = compile_ahead_of_time_with(&[&step], "sm_90", Some(4), &later).unwrap();
    assert!(again.units.iter().all(|u| u.origin == PtxOrigin::Disk));
    let e = compile_ahead_of_time_with(&[&step], "compute_90", Some(4), &later).unwrap_err();
    assert!(
        matches!(&e, Error::BadValue { value, .. } if value == "compute_90"),
        "{e}"
    );
}

/// The GPT demo's training step, optimized for an H100 model.
fn gpt_step_for_h100() -> arrayjit::opt::Optimized {
    use arrayjit::gpt::{GptPrograms, TrainerConfig};
    use arrayjit::opt::schedule::gpu::DeviceModel;
    let programs = GptPrograms::new(&TrainerConfig::small(65)).unwrap();
    let (name, step) = programs.routines()[0];
    optimize(
        name,
        &[],
        step,
        &OptimizeSettings::for_gpu(DeviceModel::h100().limits),
    )
    .unwrap()
}

/// CUBIN built ahead of time on a machine of 2 cores is what a 16-core GPU machine looks up:
/// the backend's split (`units_for`) depends on the program alone, so the units compiled by 2
/// workers into a cache are all read back from it by 16 workers in a later process, in the
/// split the backend loads.
#[test]
fn cubin_cache_keys_do_not_depend_on_the_machine_s_cores() {
    use arrayjit::backends::cuda_backend::aot::{compile_units, units_for};
    use arrayjit::backends::cuda_backend::{PtxCache, PtxOrigin, default_nvrtc_flags};
    let step = gpt_step_for_h100();
    let program = arrayjit::codegen::cuda::render_cuda(&[&step]).unwrap();
    let split = units_for(&program).unwrap();
    assert!(split > 1, "the GPT step is {split} unit(s)");
    eprintln!(
        "the GPT step: {} bytes of functions in {split} units",
        program.functions.iter().map(String::len).sum::<usize>()
    );
    let dir = tempfile::tempdir().unwrap();
    let flags = default_nvrtc_flags();
    let on_two = match compile_units(
        &program,
        "sm_90a",
        &flags,
        split,
        2,
        &PtxCache::new(Some(dir.path())),
    ) {
        Ok(u) => u,
        Err(Error::BackendUnavailable { reason, .. }) => {
            eprintln!("skipped: {reason}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let on_sixteen = compile_units(
        &program,
        "sm_90a",
        &flags,
        units_for(&program).unwrap(),
        16,
        &PtxCache::new(Some(dir.path())),
    )
    .unwrap();
    assert_eq!(on_two.len(), on_sixteen.len());
    assert!(on_sixteen.iter().all(|u| u.origin == PtxOrigin::Disk));
    for (a, b) in on_two.iter().zip(&on_sixteen) {
        assert_eq!(a.symbols, b.symbols);
        assert_eq!(a.cubin, b.cubin);
    }
}

/// Small passes that touch nothing the others write run side by side in one launch: the
/// corpus's `joined_small_passes` (two zeroings, a sum and a maximum into one element, row
/// sums, a scaling, a picked slice, then a statement reading the scaling) makes 8 passes that
/// run in at most 3 launches, blocks numbered across their parts; the passes with barriers
/// (reductions, rows) share one block size. On a device that joins nothing (WebGPU's budget),
/// every pass launches alone, in program order.
#[test]
fn independent_small_passes_run_as_one_launch() {
    let case = all_cases()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "joined_small_passes")
        .unwrap();
    let opt = for_cuda_minimum(&case);
    let plan = opt.gpu_plan(&arrayjit::opt::schedule::gpu::DeviceModel::h100());
    assert_eq!(plan.passes.len(), 8, "{plan}");
    assert!(plan.launches() <= 3, "{plan}");
    assert!(!opt.joined.is_empty());
    for j in &opt.joined {
        assert!(j.statements.len() >= 2 && j.threads == 256, "{j:?}");
    }
    let program = render_cuda(&[&opt]).unwrap();
    let passes = &program.kernels[0].passes;
    assert_eq!(passes.len() as u32, plan.launches(), "{passes:?}");
    let joined: Vec<_> = passes
        .iter()
        .filter(|p| matches!(p.shape, PassShape::Joined { .. }))
        .collect();
    assert_eq!(joined.len(), opt.joined.len(), "{passes:?}");
    assert!(
        joined
            .iter()
            .any(|p| matches!(p.shape, PassShape::Joined { barriers: true, .. }))
    );
    assert!(program.source.contains("aj_launch_grp"));
    let alone = OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits {
        joined_launch_parameters: 0,
        ..arrayjit::opt::schedule::GpuLimits::cuda_minimum()
    });
    let opt = optimize(&case.name, &case.bindings, &case.program, &alone).unwrap();
    assert!(opt.joined.is_empty());
    let program = render_cuda(&[&opt]).unwrap();
    assert_eq!(program.kernels[0].passes.len(), 8);
    assert!(
        !program.kernels[0]
            .passes
            .iter()
            .any(|p| matches!(p.shape, PassShape::Joined { .. }))
    );
}

/// GPT-2's heads (64 features, causal; f32 and bf16, with and without dropout) at a context of
/// 1024 render as the GPU's attention pass for sm_80 and sm_90 limits — one forward launch and
/// two backward, each row's features on 4 lanes of a warp, groups of 8 rows (larger ones would
/// be too few for a device whose units are not known), 64 keys staged per step — and compile
/// with NVRTC for both.
#[test]
fn attention_passes_compile_with_nvrtc_for_sm_80_and_sm_90() {
    use arrayjit::opt::schedule::{GpuLimits, GpuPass, ScheduleKind};
    let mut sources = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        let limits = GpuLimits::cuda_arch(arch).unwrap();
        for prec in [arrayjit::ir::Prec::F32, arrayjit::ir::Prec::Bf16] {
            for dropout in [None, Some(0.1)] {
                let case =
                    arrayjit_testing::attention_head_case("gpt2_heads", prec, 1024, 64, dropout)
                        .unwrap();
                let opt = optimize(
                    &case.name,
                    &case.bindings,
                    &case.program,
                    &OptimizeSettings::for_gpu(limits),
                )
                .unwrap();
                let passes: Vec<_> = opt
                    .schedules
                    .iter()
                    .filter_map(|s| match &s.kind {
                        ScheduleKind::Gpu(GpuPass::Attention(a)) => {
                            Some((a.rows, a.lanes, a.block))
                        }
                        _ => None,
                    })
                    .collect();
                assert_eq!(passes, [(8, 4, 64), (8, 4, 64)], "{arch} {prec}");
                let program = render_cuda(&[&opt]).unwrap();
                let launches: Vec<_> = program.kernels[0]
                    .passes
                    .iter()
                    .filter(|p| p.why.contains("FlashAttention-2"))
                    .map(|p| p.launch_dims())
                    .collect();
                // 1024 rows in blocks of 8, 2 heads; 32 invocations per group.
                assert_eq!(launches, [(256, 32); 3], "{arch} {prec}");
                assert!(program.source.contains("__shfl_xor_sync"));
                sources.push((format!("{arch} {prec} {dropout:?}"), arch, program.source));
            }
        }
    }
    for (name, arch, source) in &sources {
        match compile_ptx(source, &arch.replace("sm_", "compute_")) {
            Ok(ptx) => assert!(ptx.contains(".entry"), "{name}: no kernel in the PTX"),
            Err(Error::BackendUnavailable { reason, .. }) => {
                eprintln!("skipping the NVRTC compile of the attention passes: {reason}");
                return;
            }
            Err(e) => panic!("{name}: {e}\n{source}"),
        }
    }
    // Compiled for sm_90a, no attention kernel spills registers: each invocation holds 16 of
    // a row's 64 features.
    let (name, _, source) = &sources[sources.len() - 1];
    match arrayjit::backends::cuda_backend::resources::kernel_resources(source, "sm_90a") {
        Ok(kernels) => {
            for k in kernels.iter().filter(|k| k.name.contains("gpt2_heads")) {
                eprintln!("{name}: {k:?}");
                assert_eq!(k.spill_bytes, 0, "{name}: {k:?}");
            }
        }
        Err(Error::BackendUnavailable { reason, .. }) => eprintln!("skipped: {reason}"),
        Err(e) => panic!("{name}: {e}"),
    }
}

/// Only the locals that may read their initial zeros are zeroed before a run: the GPT step
/// planned for an H100 keeps most of its locals in scratch, and zeroes a part of it only;
/// the corpus's zeroed ranges lie inside the scratch, in order, without overlaps.
#[test]
fn only_locals_read_before_written_are_zeroed() {
    let step = gpt_step_for_h100();
    let program = render_cuda(&[&step]).unwrap();
    let k = &program.kernels[0];
    eprintln!(
        "GPT step: {} of {} scratch bytes zeroed in {} range(s)",
        k.zeroed_scratch_bytes(),
        k.interface.scratch_bytes,
        k.scratch_zeroed.len()
    );
    assert!(k.interface.scratch_bytes > 0);
    assert!(k.zeroed_scratch_bytes() < k.interface.scratch_bytes);
    let (mut zeroed, mut total) = (0, 0);
    for case in all_cases().unwrap() {
        let opt = for_cuda_minimum(&case);
        let program = render_cuda(&[&opt]).unwrap();
        let k = &program.kernels[0];
        let mut end = 0;
        for &(offset, len) in &k.scratch_zeroed {
            assert!(
                offset >= end && len > 0,
                "{}: {:?}",
                case.name,
                k.scratch_zeroed
            );
            end = offset + len;
        }
        assert!(end <= k.interface.scratch_bytes, "{}", case.name);
        zeroed += k.zeroed_scratch_bytes();
        total += k.interface.scratch_bytes;
    }
    eprintln!("corpus: {zeroed} of {total} scratch bytes zeroed");
}

//! What NVRTC makes of the matrix-unit kernels (where it is installed; no GPU needed): every
//! variant compiles for sm_80 and sm_90 (`sm_90a` for warpgroups), and tiled products fit two
//! groups per SM without spilling registers.

use super::*;

/// Every variant renders for a device with matrix units (sm_80 limits) and compiles with NVRTC
/// for sm_80 and sm_90; a device without them keeps the products off the matrix units.
#[test]
fn every_matrix_variant_compiles_with_nvrtc_for_sm_80_and_sm_90() {
    let sm80 = GpuLimits::cuda_arch("sm_80").unwrap();
    assert!(sm80.matrix_units);
    assert!(!GpuLimits::cuda_arch("sm_75").unwrap().matrix_units);
    assert!(GpuLimits::cuda_arch("sm_90a").unwrap().matrix_units);
    assert!(GpuLimits::cuda_arch("compute_80").is_none());
    let mut sources = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for tile in [32, 64, 128] {
        for allow_tf32 in [false, true] {
            let mut settings = OptimizeSettings::for_gpu(sm80);
            settings.schedule.tuning.gpu_tile = Some(tile);
            settings.schedule.allow_tf32 = allow_tf32;
            let mut cases = matrix_product_cases().unwrap();
            let (f32_case, _) = f32_product(70, 44, 66, &[0.5; 70 * 44], &[0.25; 44 * 66]);
            cases.push(f32_case);
            // A long reduction on few tiles: split along it (two kernels).
            cases.push(
                arrayjit_testing::long_product_in(
                    Prec::Bf16,
                    "split_bf16",
                    "ki,kj->ij",
                    &[2048, 64],
                    &[2048, 64],
                    &[64, 64],
                )
                .unwrap(),
            );
            for case in cases {
                let opt = optimize(&case.name, &case.bindings, &case.program, &settings).unwrap();
                for (kind, t) in matrix_passes(&opt.schedules) {
                    seen.insert((format!("{kind}"), t));
                }
                let program = render_cuda(&[&opt]).unwrap();
                sources.push((
                    format!("{} {tile} tf32 {allow_tf32}", case.name),
                    program.source,
                ));
            }
        }
    }
    let want: std::collections::BTreeSet<_> = ["bf16", "f16", "tf32"]
        .iter()
        .flat_map(|k| [32, 64, 128].map(|t| (k.to_string(), t)))
        .collect();
    assert_eq!(seen, want);
    // Without matrix units the 16-bit products are not matrix passes.
    let case = &matrix_product_cases().unwrap()[0];
    let opt = optimize(
        &case.name,
        &case.bindings,
        &case.program,
        &OptimizeSettings::for_gpu(GpuLimits::cuda_minimum()),
    )
    .unwrap();
    assert!(matrix_passes(&opt.schedules).is_empty());
    assert!(
        sources
            .iter()
            .any(|(_, s)| s.contains("aj_ldmatrix_x4_trans("))
    );
    assert!(sources.iter().any(|(_, s)| s.contains("aj_mma_tf32(")));
    assert!(sources.iter().any(|(_, s)| s.contains("aj_copy_async16(")));
    assert!(
        sources
            .iter()
            .any(|(name, s)| name.starts_with("split_bf16")
                && s.contains("aj_mma_")
                && s.contains("aj_n")),
        "no split matrix-unit product"
    );
    for arch in ["compute_80", "compute_90"] {
        for (name, source) in &sources {
            match compile_ptx(source, arch) {
                // The exact f32 product (TF32 not allowed) stays on the f32 lanes.
                Ok(ptx) => assert_eq!(
                    ptx.contains("mma.sync.aligned"),
                    source.contains("aj_mma_"),
                    "{name} for {arch}"
                ),
                Err(Error::BackendUnavailable { reason, .. }) => {
                    eprintln!("skipped the NVRTC compiles: {reason}");
                    return;
                }
                Err(e) => panic!("{name} for {arch}: {e}\n{source}"),
            }
        }
    }
}

/// Occupancy read from ptxas's report (NVRTC only, no GPU): the `f32` tiled product and the
/// matrix-unit products of a 4096 × 4096 product — 128-tiles on a 132-SM device — keep their
/// registers within what lets two groups share an SM, without spilling, on sm_80 and sm_90.
#[test]
fn tiled_products_fit_two_groups_per_sm_without_spills() {
    use arrayjit::backends::cuda_backend::resources::kernel_resources;
    let n = 4096;
    let variants = [
        (Prec::F32, false),
        (Prec::F32, true),
        (Prec::Bf16, false),
        (Prec::F16, false),
    ];
    // Each architecture plans with its own limits (its shared memory sets the matrix units'
    // buffers); sm_90's warpgroup products have a test of their own below.
    for arch in ["sm_80", "sm_90"] {
        let mut limits = GpuLimits::cuda_arch(arch).unwrap();
        limits.compute_units = 132;
        limits.warpgroup_mma = false;
        for (prec, allow_tf32) in variants {
            let nodes: Vec<Tnode> = ["a", "b", "c"]
                .iter()
                .map(|l| Tnode::new(prec, &[n, n], &[l]).unwrap())
                .collect();
            let program = Assignments::einsum(
                "mk,kn->mn",
                BinOp::Add,
                &nodes[2],
                AccumRhs::Binop(
                    BinOp::Mul,
                    Operand::Node(nodes[0].clone()),
                    Operand::Node(nodes[1].clone()),
                ),
                true,
            )
            .unwrap();
            let mut settings = OptimizeSettings::for_gpu(limits);
            settings.schedule.allow_tf32 = allow_tf32;
            let opt = optimize("mm", &[], &program, &settings).unwrap();
            let tiles: Vec<_> = opt
                .schedules
                .iter()
                .filter_map(|s| match &s.kind {
                    ScheduleKind::Gpu(GpuPass::Tiles { layout, .. }) => {
                        Some((layout.tile, 256, 0, 0))
                    }
                    ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, .. }) => Some((
                        layout.tile,
                        layout.threads(),
                        layout.stages,
                        if layout.dynamic_shared {
                            layout.shared_bytes() as u32
                        } else {
                            0
                        },
                    )),
                    _ => None,
                })
                .collect();
            let [(tile, threads, stages, dynamic)] = tiles[..] else {
                panic!("{prec} tf32 {allow_tf32}: {}", opt.schedule_report());
            };
            assert_eq!(tile, 128, "{prec}");
            let source = render_cuda(&[&opt]).unwrap().source;
            if prec != Prec::F32 {
                // The buffers of 16-bit factors, as many as leave room for two groups per SM:
                // one depth waited for, the others left in flight.
                assert!(stages >= 4, "{prec} {arch}: {stages} buffers");
                match compile_ptx(&source, arch) {
                    Ok(ptx) => assert!(
                        ptx.contains(&format!("cp.async.wait_group {};", stages - 2)),
                        "{ptx}"
                    ),
                    Err(Error::BackendUnavailable { reason, .. }) => {
                        eprintln!("skipped: {reason}");
                        return;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            if prec == Prec::F32 && !allow_tf32 {
                // The SIMT tiles read both factors by 128-bit global loads and their runs of
                // four by 128-bit shared loads.
                match compile_ptx(&source, arch) {
                    Ok(ptx) => {
                        assert!(ptx.contains("ld.shared.v4.f32"), "{ptx}");
                        assert!(
                            ptx.contains(".global.nc.v4.f32") || ptx.contains("ld.global.v4.f32"),
                            "{ptx}"
                        );
                    }
                    Err(Error::BackendUnavailable { reason, .. }) => {
                        eprintln!("skipped: {reason}");
                        return;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let kernels = match kernel_resources(&source, arch) {
                Ok(k) => k,
                Err(Error::BackendUnavailable { reason, .. }) => {
                    eprintln!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            assert_eq!(kernels.len(), 1, "{kernels:?}");
            let k = &kernels[0];
            assert!(
                k.registers > 0 && k.spill_bytes == 0,
                "{prec} tf32 {allow_tf32} {arch}: {k:?}"
            );
            let blocks = k.blocks_per_sm_with(arch, threads, dynamic);
            assert!(blocks >= 2, "{prec} tf32 {allow_tf32} {arch}: {k:?}");
            eprintln!(
                "{prec} (tf32 {allow_tf32}) {arch}: {} registers, {} B static and {dynamic} B \
                 dynamic shared ({stages} buffers), {blocks} blocks/SM",
                k.registers, k.shared_bytes,
            );
        }
    }
}

/// On sm_90 the 64- and 128-tiles of 16-bit factors, and of TF32 ones where allowed, run on
/// warpgroups (`wgmma.mma_async`), in every layout of the factors (either axis contiguous in
/// each): NVRTC compiles them for `sm_90a`, and ptxas keeps the 128-tiles within two groups
/// per SM without spilling. (The same kernels run on `cuda_emu`, whose header decodes the
/// factors' canonical layouts, in `sixteen_bit_products_run_on_matrix_units_in_every_tile`
/// and `tf32_products_run_on_warpgroups_in_every_layout`.)
#[test]
fn warpgroup_products_compile_for_sm_90a_in_every_layout() {
    use arrayjit::backends::cuda_backend::resources::kernel_resources;
    let mut limits = GpuLimits::cuda_arch("sm_90").unwrap();
    assert!(limits.warpgroup_mma && !GpuLimits::cuda_arch("sm_80").unwrap().warpgroup_mma);
    limits.compute_units = 132;
    for spec in ["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "km,nk->mn"] {
        for (prec, n, fragments) in [
            (Prec::Bf16, 4096, 2),
            (Prec::F16, 1024, 2),
            (Prec::Bf16, 4096, 4),
            (Prec::F16, 1024, 4),
            (Prec::F32, 4096, 2),
            (Prec::F32, 1024, 2),
        ] {
            let node = |l: &str| Tnode::new(prec, &[n, n], &[l]).unwrap();
            let (a, b) = (node("a"), node("b"));
            let c = Tnode::new(Prec::F32, &[n, n], &["c"]).unwrap();
            let program = Assignments::einsum(
                spec,
                BinOp::Add,
                &c,
                AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
                true,
            )
            .unwrap();
            // 4096: 128-tiles on 132 SMs; 1024 asks for 64-tiles (32 would be chosen).
            let mut settings = OptimizeSettings::for_gpu(limits);
            settings.schedule.tuning.gpu_tile = (n == 1024).then_some(64);
            settings.schedule.tuning.gpu_stage_fragments = Some(fragments);
            settings.schedule.allow_tf32 = prec == Prec::F32;
            let opt = optimize("mm", &[], &program, &settings).unwrap();
            let [layout] = layouts(&opt.schedules)[..] else {
                panic!("{spec}: {}", opt.schedule_report());
            };
            assert!(layout.warpgroups, "{spec} {prec}: {layout:?}");
            assert_eq!(
                layout.depth(),
                layout.kind.fragment_depth() * fragments,
                "{spec} {prec}: {layout:?}"
            );
            let source = render_cuda(&[&opt]).unwrap().source;
            let ptx = match compile_ptx(&source, "sm_90a") {
                Ok(ptx) => ptx,
                Err(Error::BackendUnavailable { reason, .. }) => {
                    eprintln!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{spec} {prec}: {e}"),
            };
            assert!(ptx.contains("wgmma.mma_async"), "{spec}");
            let kernels = kernel_resources(&source, "sm_90a").unwrap();
            // No kernel spills, and ptxas runs the warpgroup products as issued (it serializes
            // them where it cannot prove their accumulators untouched while they run).
            for k in &kernels {
                assert_eq!(k.spill_bytes, 0, "{spec} {prec}: {k:?}");
                assert!(k.performance_notes.is_empty(), "{spec} {prec}: {k:?}");
            }
            // The product's kernel (the routine may have others, e.g. one that zeroes).
            let k = kernels.iter().max_by_key(|k| k.registers).unwrap();
            let dynamic = if layout.dynamic_shared {
                layout.shared_bytes() as u32
            } else {
                0
            };
            let blocks = k.blocks_per_sm_with("sm_90a", layout.threads(), dynamic);
            assert!(blocks >= 2, "{spec} {prec}: {k:?}");
            eprintln!(
                "{spec} {prec} {}-tiles, {} buffers {} deep: {} registers, {} B static and \
                 {dynamic} B dynamic shared, {blocks} blocks/SM",
                layout.tile,
                layout.stages,
                layout.depth(),
                k.registers,
                k.shared_bytes,
            );
        }
    }
}

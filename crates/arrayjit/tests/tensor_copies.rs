//! Warpgroup products whose factors sm_90's tensor memory accelerator stages (bulk tensor
//! copies landing on one `mbarrier` per buffer), checked without a GPU: the schedule takes
//! them only where the tuning asks and the factors' layouts allow; on `cuda_emu` (whose header
//! copies each box with the accelerator's swizzle and zero fill, lands it only when a thread
//! waits on its barrier, and ends a launch whose wait can never complete) every layout, depth,
//! batch and split agrees with the interpreter, as on `cuda` where an sm_90 GPU is there; and
//! NVRTC compiles them for `sm_90a` without spills or serialized products; and the emulation
//! itself, driven by a hand-written kernel, lands a box only at a wait and ends a wait that
//! can never complete with an error.

use arrayjit::ir::{AccumRhs, Assignments, BinOp, Operand, Prec, Tnode};
use arrayjit::opt::schedule::gpu::{GpuLimits, MatrixTile};
use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
use arrayjit::opt::{OptimizeSettings, optimize};
use arrayjit::runtime::{Backend, CompileRequest};
use arrayjit_testing::{Case, check_case};

/// The layouts of the matrix-unit passes of a routine's schedules, with whether each splits
/// its reduction.
fn layouts(schedules: &[arrayjit::opt::schedule::Schedule]) -> Vec<(MatrixTile, bool)> {
    schedules
        .iter()
        .filter_map(|s| match &s.kind {
            ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, split, .. }) => {
                Some((*layout, split.is_some()))
            }
            _ => None,
        })
        .collect()
}

/// The backends here with warpgroup products (`cuda_emu`; `cuda` on an sm_90 GPU).
fn with_warpgroups() -> Vec<Backend> {
    arrayjit_testing::all_backends_under_test()
        .unwrap()
        .into_iter()
        .filter(|b| {
            b.optimize_settings()
                .schedule
                .gpu
                .is_some_and(|g| g.warpgroup_mma)
        })
        .collect()
}

/// `c = a · b` by einsum `spec` over letters `b` (batch), `m`, `k`, `n` of the sizes given
/// and `h` (a second batch axis, of 3),
/// factors in `prec` with small multiples of 1/8 (exact in 16 bits, every sum exact in
/// `f32`), into a hosted `f32` result.
fn product(spec: &str, sizes: [usize; 4], prec: Prec) -> Case {
    let [batch, m, k, n] = sizes;
    let (inputs, out) = spec.split_once("->").unwrap();
    let (sa, sb) = inputs.split_once(',').unwrap();
    let dims = |letters: &str| -> Vec<usize> {
        letters
            .chars()
            .map(|c| match c {
                'b' => batch,
                'h' => 3,
                'm' => m,
                'k' => k,
                _ => n,
            })
            .collect()
    };
    let node = |label: &str, letters: &str, seed: usize| {
        let d = dims(letters);
        let t = Tnode::new(prec, &d, &[label]).unwrap();
        let count: usize = d.iter().product();
        let values: Vec<f64> = (0..count)
            .map(|i| ((i * seed % 33) as f64 - 16.0) / 8.0)
            .collect();
        t.host().set_values(&values).unwrap();
        t
    };
    let (a, b) = (node("a", sa, 5), node("b", sb, 7));
    let c = Tnode::new(Prec::F32, &dims(out), &["c"]).unwrap();
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
    Case {
        name: format!(
            "tma_{}_{batch}x{m}x{k}x{n}_{prec}",
            spec.replace([',', '-', '>'], "_")
        ),
        program,
        bindings: vec![],
        runs: vec![],
        results: vec![c],
    }
}

/// On every backend with warpgroups: both factors staged by the accelerator in all four
/// layouts (`k` or the result side contiguous in each factor), 64- and 128-tiles, 32 and 64
/// deep (the 64- and 128-byte swizzles), sides and reductions that are not multiples of the
/// tile or the depth (the accelerator's zero fill), batches whose factors move along some
/// batch axes and not others (tensor maps of 3 and 4 axes), and reductions split into
/// slices; each agrees with the interpreter.
#[test]
fn tensor_copied_products_agree_with_the_interpreter_in_every_layout() {
    let cases = [
        (product("mk,kn->mn", [1, 130, 72, 200], Prec::Bf16), 64, 2),
        // Every buffer filled many times over (its barrier's phases alternate).
        (product("mk,kn->mn", [1, 64, 1000, 64], Prec::Bf16), 64, 2),
        // `k` of 100: the left factor's rows (200 bytes) are copied element by element.
        (product("mk,kn->mn", [1, 70, 100, 136], Prec::F16), 64, 2),
        (product("km,kn->mn", [1, 72, 200, 136], Prec::F16), 64, 4),
        (product("mk,nk->mn", [1, 136, 104, 64], Prec::Bf16), 128, 2),
        (product("km,nk->mn", [1, 64, 48, 130], Prec::Bf16), 128, 4),
        (product("bmk,bkn->bmn", [3, 64, 40, 72], Prec::Bf16), 64, 2),
        (product("bmk,kn->bmn", [2, 72, 64, 64], Prec::F16), 64, 4),
        (
            product("mbk,bnk->bmn", [2, 64, 32, 128], Prec::Bf16),
            128,
            2,
        ),
        (
            product("bmhk,bhnk->bhmn", [2, 64, 32, 64], Prec::Bf16),
            64,
            2,
        ),
    ];
    for b in with_warpgroups() {
        let original = b.optimize_settings();
        let mut mapped_axes = std::collections::BTreeSet::new();
        let mut staged = std::collections::BTreeSet::new();
        for (case, tile, fragments) in &cases {
            let mut settings = b.optimize_settings();
            settings.schedule.tuning.gpu_tile = Some(*tile);
            settings.schedule.tuning.gpu_stage_fragments = Some(*fragments);
            settings.schedule.tuning.gpu_tensor_copies = true;
            b.set_optimize_settings(settings);
            let code = b
                .compile(CompileRequest::routine(&case.name, &case.program))
                .unwrap();
            let [(layout, _)] = layouts(&code.optimized().schedules)[..] else {
                panic!("{}", code.optimized().schedule_report());
            };
            assert!(layout.warpgroups && layout.tile == *tile, "{layout:?}");
            // Both factors mapped, but where one's rows are not 16-byte runs (copied element
            // by element while the other's boxes are in flight).
            let want = [1, 2].map(|f| layout.async_copy[f - 1]);
            assert_eq!(layout.tensor_copy, want, "{}: {layout:?}", case.name);
            staged.insert(layout.tensor_copy);
            let report = code.optimized().schedule_report();
            assert!(
                report.contains("by the tensor memory accelerator"),
                "{report}"
            );
            let gemm = code
                .optimized()
                .schedules
                .iter()
                .find_map(|s| match &s.kind {
                    ScheduleKind::Gpu(GpuPass::MatrixTiles { gemm, .. }) => Some(gemm.clone()),
                    _ => None,
                })
                .unwrap();
            mapped_axes.extend(layout.tensor_maps(&gemm).iter().map(|m| m.axes.len()));
            check_case(case, &b).unwrap_or_else(|e| {
                panic!(
                    "{}: {} ({tile}-tiles, {} buffers {} deep): {e}",
                    b.name(),
                    case.name,
                    layout.stages,
                    layout.depth()
                )
            });
        }
        assert_eq!(
            mapped_axes,
            std::collections::BTreeSet::from([2, 3, 4]),
            "tensor maps of 2, 3 and 4 axes"
        );
        assert_eq!(
            staged,
            std::collections::BTreeSet::from([[true, true], [false, true]])
        );
        // Split reductions: a small device (8 units) splits the long ones into slices, whose
        // first copies are issued only where the slice has those steps.
        let split = [
            arrayjit_testing::long_product_in(
                Prec::Bf16,
                "tma_split_weight_gradient",
                "ki,kj->ij",
                &[2048, 64],
                &[2048, 64],
                &[64, 64],
            )
            .unwrap(),
            arrayjit_testing::long_product_in(
                Prec::F16,
                "tma_split_batched",
                "bik,bkj->bij",
                &[2, 64, 1000],
                &[2, 1000, 128],
                &[2, 64, 128],
            )
            .unwrap(),
        ];
        for (case, tile) in split.iter().zip([64, 128]) {
            let mut settings = b.optimize_settings();
            settings.schedule.tuning.gpu_tile = Some(tile);
            settings.schedule.tuning.gpu_stage_fragments = None;
            settings.schedule.tuning.gpu_tensor_copies = true;
            if let Some(g) = settings.schedule.gpu.as_mut() {
                g.compute_units = 8;
            }
            b.set_optimize_settings(settings);
            let code = b
                .compile(CompileRequest::routine(&case.name, &case.program))
                .unwrap();
            let [(layout, true)] = layouts(&code.optimized().schedules)[..] else {
                panic!("not split: {}", code.optimized().schedule_report());
            };
            assert_eq!(layout.tensor_copy, [true; 2], "{}: {layout:?}", case.name);
            check_case(case, &b)
                .unwrap_or_else(|e| panic!("{}: {} split: {e}", b.name(), case.name));
        }
        b.set_optimize_settings(original);
    }
}

/// The accelerator is the tuning's choice (off by default), and only for 16-bit warpgroup
/// factors whose layout it can map: never on sm_80's warps, never for TF32, never for a
/// factor whose rows are not 16-byte runs (its other factor still may be).
#[test]
fn tensor_copies_only_where_asked_and_the_layout_allows() {
    let sm90 = GpuLimits::cuda_arch("sm_90").unwrap();
    let sm80 = GpuLimits::cuda_arch("sm_80").unwrap();
    let plan = |limits: GpuLimits, asked: bool, prec: Prec, dims: [usize; 3]| {
        let [m, k, n] = dims;
        let a = Tnode::new(prec, &[m, k], &["a"]).unwrap();
        let b = Tnode::new(prec, &[k, n], &["b"]).unwrap();
        let c = Tnode::new(Prec::F32, &[m, n], &["c"]).unwrap();
        let program = Assignments::einsum(
            "mk,kn->mn",
            BinOp::Add,
            &c,
            AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
            true,
        )
        .unwrap();
        let mut settings = OptimizeSettings::for_gpu(limits);
        settings.schedule.tuning.gpu_tensor_copies = asked;
        settings.schedule.tuning.gpu_tile = Some(64);
        settings.schedule.allow_tf32 = true;
        let opt = optimize("mm", &[], &program, &settings).unwrap();
        let [(layout, _)] = layouts(&opt.schedules)[..] else {
            panic!("{}", opt.schedule_report());
        };
        layout.tensor_copy
    };
    assert_eq!(plan(sm90, false, Prec::Bf16, [256, 256, 256]), [false; 2]);
    assert_eq!(plan(sm90, true, Prec::Bf16, [256, 256, 256]), [true; 2]);
    assert_eq!(plan(sm80, true, Prec::Bf16, [256, 256, 256]), [false; 2]);
    assert_eq!(plan(sm90, true, Prec::F32, [256, 256, 256]), [false; 2]);
    // `k` of 100: the left factor's rows (200 bytes) are not 16-byte runs; the right
    // factor's (its columns, 512 bytes) are.
    assert_eq!(plan(sm90, true, Prec::F16, [256, 100, 256]), [false, true]);
}

/// The tensor-copied products compile with NVRTC for `sm_90a` in every layout and depth:
/// bulk tensor copies and mbarrier waits in the PTX, no spills, no serialized warpgroup
/// products, and two groups per SM.
#[test]
#[cfg(feature = "cuda")]
fn tensor_copied_products_compile_for_sm_90a_in_every_layout() {
    use arrayjit::Error;
    use arrayjit::backends::cuda_backend::compile_ptx;
    use arrayjit::backends::cuda_backend::resources::kernel_resources;
    use arrayjit::codegen::cuda::render_cuda;
    let mut limits = GpuLimits::cuda_arch("sm_90").unwrap();
    limits.compute_units = 132;
    for spec in ["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "km,nk->mn"] {
        for (n, fragments) in [(4096, 2), (4096, 4), (1024, 2)] {
            let node = |l: &str| Tnode::new(Prec::Bf16, &[n, n], &[l]).unwrap();
            let c = Tnode::new(Prec::F32, &[n, n], &["c"]).unwrap();
            let program = Assignments::einsum(
                spec,
                BinOp::Add,
                &c,
                AccumRhs::Binop(
                    BinOp::Mul,
                    Operand::Node(node("a")),
                    Operand::Node(node("b")),
                ),
                true,
            )
            .unwrap();
            let mut settings = OptimizeSettings::for_gpu(limits);
            settings.schedule.tuning.gpu_tile = (n == 1024).then_some(64);
            settings.schedule.tuning.gpu_stage_fragments = Some(fragments);
            settings.schedule.tuning.gpu_tensor_copies = true;
            let opt = optimize("mm", &[], &program, &settings).unwrap();
            let [(layout, _)] = layouts(&opt.schedules)[..] else {
                panic!("{spec}: {}", opt.schedule_report());
            };
            assert_eq!(layout.tensor_copy, [true; 2], "{spec}: {layout:?}");
            let source = render_cuda(&[&opt]).unwrap().source;
            let ptx = match compile_ptx(&source, "sm_90a") {
                Ok(ptx) => ptx,
                Err(Error::BackendUnavailable { reason, .. }) => {
                    eprintln!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{spec}: {e}\n{source}"),
            };
            for instruction in [
                "cp.async.bulk.tensor",
                "mbarrier.try_wait.parity",
                "mbarrier.arrive.expect_tx",
                "wgmma.mma_async",
            ] {
                assert!(ptx.contains(instruction), "{spec}: no {instruction}");
            }
            assert!(!ptx.contains("cp.async.cg"), "{spec}: cp.async copies left");
            let kernels = kernel_resources(&source, "sm_90a").unwrap();
            for k in &kernels {
                assert_eq!(k.spill_bytes, 0, "{spec}: {k:?}");
                assert!(k.performance_notes.is_empty(), "{spec}: {k:?}");
            }
            let k = kernels.iter().max_by_key(|k| k.registers).unwrap();
            let dynamic = if layout.dynamic_shared {
                layout.group_shared_bytes() as u32
            } else {
                0
            };
            let blocks = k.blocks_per_sm_with("sm_90a", layout.threads(), dynamic);
            assert!(blocks >= 2, "{spec}: {k:?}");
            eprintln!(
                "{spec} {}-tiles, {} buffers {} deep, tensor copies: {} registers, {} B static \
                 and {dynamic} B dynamic shared, {blocks} blocks/SM",
                layout.tile,
                layout.stages,
                layout.depth(),
                k.registers,
                k.shared_bytes,
            );
        }
    }
}

/// The emulation's tensor copies and mbarriers, driven by a hand-written kernel: a box lands
/// when a thread waits on its barrier (swizzled, zeros past the tensor's end), not before, so
/// a kernel that reads the buffer before any wait reads what was there; and a wait whose phase
/// can never complete (armed with more bytes than the copies bring) ends the launch with a
/// typed error instead of hanging, as a GPU would.
#[test]
fn emulated_tensor_copies_land_when_waited_for_and_a_stuck_wait_is_an_error() {
    use arrayjit::backends::LaunchRequest;
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    let Some(backend) = arrayjit_testing::backend_under_test("cuda_emu").unwrap() else {
        return;
    };
    // A 40 x 32 tensor of 16-bit values 1 + (row * 32 + column) % 7 (written by the kernel
    // after y's 128 floats), copied as a 64 x 32 box (rows 40 to 63 past its end: zeros) into
    // 64-byte swizzled rows. Mode 0 waits, mode 1 reads before waiting, mode 2 arms 16 bytes
    // too many. Each thread then reads 16 elements of the box, unswizzled.
    let source = r#"
extern "C" __global__ void aj_boxes(float *y, long long mode) {
  __shared__ __align__(1024) uint16_t box[64 * 32];
  __shared__ long long bar[1];
  unsigned t = threadIdx.x;
  uint16_t *tensor = (uint16_t *)(y + 128);
  for (unsigned i = t; i < 40 * 32; i += 128) tensor[i] = (uint16_t)(1 + i % 7);
  for (unsigned i = t; i < 64 * 32; i += 128) box[i] = 100;
  if (t == 0) { aj_mbar_init(&bar[0]); aj_mbar_init_fence(); }
  __syncthreads();
  if (t == 0) {
    aj_tensor_map map = {(const unsigned char *)tensor, 2u, 2u, 64u, {32, 40}, {2, 64}, {32, 64}};
    aj_mbar_expect(&bar[0], 64 * 32 * 2 + (mode == 2 ? 16 : 0));
    aj_tma_load_2d(box, &map, 0, 0, &bar[0]);
  }
  float sum = 0.0f;
  if (mode == 1) for (unsigned k = 0; k < 16; ++k) sum += box[t * 16 + k];
  aj_mbar_wait(&bar[0], 0);
  if (mode != 1) {
    for (unsigned k = 0; k < 16; ++k) {
      unsigned e = t * 16 + k, row = e / 32, col = e % 32;
      uintptr_t a = (uintptr_t)box + row * 64 + col * 2;
      a ^= ((a >> 7) & 3u) << 4;
      sum += *(const uint16_t *)a;
    }
  }
  y[t] = sum;
}
"#;
    let y = Tnode::new(Prec::F32, &[128 + 640], &["y"]).unwrap();
    let interface = KernelInterface {
        name: "boxes".into(),
        symbol: "aj_boxes".into(),
        args: vec![y],
        merge: None,
        statics: vec![arrayjit::ir::StaticSymbol::new("mode", 3)],
        scratch_bytes: 0,
    };
    let launch = LaunchDims {
        grid: [1, 1, 1],
        block: [128, 1, 1],
    };
    let lowered = backend.lowered();
    // SAFETY: the kernel writes 128 floats of y and 40 x 32 16-bit values after them (640
    // floats' bytes), within its interface's buffer, and its copy reads only those.
    let batch =
        unsafe { lowered.compile_source(source, &[SourceKernel::gpu(interface, launch)]) }.unwrap();
    let k = batch.kernel_index("boxes").unwrap();
    let ys = lowered
        .runtime()
        .alloc_array(0, Prec::F32, 128 + 640)
        .unwrap();
    let run = |mode: i64| -> arrayjit::Result<Vec<f32>> {
        // SAFETY: the test's own buffer, one call at a time.
        unsafe { batch.launch(LaunchRequest::new(k, std::slice::from_ref(&ys), &[mode])) }?;
        lowered.runtime().synchronize(0)?;
        let mut out = vec![0u8; (128 + 640) * 4];
        // SAFETY: the test's own buffer, one call at a time.
        unsafe { lowered.runtime().copy_to_host(&ys, &mut out, None) }?;
        Ok(out[..128 * 4]
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect())
    };
    // Thread t reads row t / 2, columns 16 (t % 2) to 16 (t % 2) + 15.
    let want: Vec<f32> = (0..128usize)
        .map(|t| {
            let row = t / 2;
            if row >= 40 {
                return 0.0;
            }
            (0..16)
                .map(|k| (1 + (row * 32 + 16 * (t % 2) + k) % 7) as f32)
                .sum()
        })
        .collect();
    assert_eq!(run(0).unwrap(), want);
    // Before any thread has waited, the box still holds what the kernel stored there: thread
    // 0 reads it first (the emulation runs a block's threads in order between barriers, and
    // lands the box at the first wait).
    assert_eq!(run(1).unwrap()[0], 1600.0);
    let stuck = run(2).unwrap_err().to_string();
    assert!(stuck.contains("never completes"), "{stuck}");
    // The backend is fine afterwards.
    assert_eq!(run(0).unwrap(), want);
}

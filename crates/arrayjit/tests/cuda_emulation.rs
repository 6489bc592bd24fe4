//! The `cuda_emu` backend: the CUDA renderer's kernels run on the CPU under an emulation of the
//! CUDA execution model. The shared corpus, the random programs and training run on it with
//! every other available backend; this file checks what they do not reach: the largest product
//! tiles (128 × 128 per block, rendered only for products with 256 such tiles or more), and
//! the error when no C++ compiler is there.

use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::prelude::*;

/// `cuda_emu` where it can run; a skip otherwise (an error when `ARRAYJIT_REQUIRE_BACKENDS`
/// lists it).
fn skip_unless_available() -> Option<arrayjit::runtime::Backend> {
    arrayjit_testing::backend_under_test("cuda_emu").unwrap()
}

/// A 2048 × 16 by 16 × 2048 product: 256 tiles of 128 × 128, so the largest tiles, with a
/// short `k` so that the emulation stays quick. Checked against a product computed here.
#[test]
fn the_128_tiles_compute_the_product() {
    let Some(backend) = skip_unless_available() else {
        return;
    };
    let (m, k, n) = (2048, 16, 2048);
    let a_vals: Vec<f64> = (0..m * k).map(|p| ((p * 7) % 13) as f64 - 6.0).collect();
    let b_vals: Vec<f64> = (0..k * n).map(|p| ((p * 5) % 11) as f64 - 5.0).collect();
    let a = Tnode::new(Prec::F32, &[m, k], &["a"]).unwrap();
    a.host().set_values(&a_vals).unwrap();
    let b = Tnode::new(Prec::F32, &[k, n], &["b"]).unwrap();
    b.host().set_values(&b_vals).unwrap();
    let c = Tnode::new(Prec::F32, &[m, n], &["c"]).unwrap();
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let program = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    let code = backend
        .compile(CompileRequest::routine("tiles_128", &program))
        .unwrap();
    let tiles = code.optimized().schedules.iter().any(|s| {
        matches!(&s.kind, arrayjit::opt::schedule::ScheduleKind::Gpu(
            arrayjit::opt::schedule::GpuPass::Tiles { layout, .. }) if layout.tile == 128)
    });
    assert!(
        tiles,
        "not planned as 128-tiles: {}",
        code.optimized().schedule_report()
    );
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    let got = c.host().get_values().unwrap();
    // Small integers: every partial sum is exact in f32, whatever the order.
    for i in (0..m).step_by(97) {
        for j in 0..n {
            let want: f64 = (0..k).map(|q| a_vals[i * k + q] * b_vals[q * n + j]).sum();
            assert_eq!(got[i * n + j], want, "c[{i}][{j}]");
        }
    }
}

#[test]
fn without_a_cpp_compiler_cuda_emu_says_what_to_install() {
    let lookup = |name: &str| (name == "CXX").then(|| "/nonexistent/c++".into());
    let backend = cc::emulated_cuda_backend(CcConfig::default(), &lookup).unwrap();
    assert_eq!(backend.name(), "cuda_emu");
    let e = backend.check_available().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, arrayjit::Error::BackendUnavailable { .. }),
        "{text}"
    );
    assert!(
        text.contains("cuda_emu") && text.contains("CXX") && text.contains("g++"),
        "{text}"
    );
}

/// The emulation runs a warpgroup product when a `wgmma.wait_group` requires it, as late as the
/// PTX ISA lets a GPU read its operands: a hand-written kernel issues a product of ones, then
/// refills its left factor with twos before waiting, and gets the product of the twos — so a
/// pipeline that refills a buffer too early fails here as on a GPU (the kernels' products stay
/// in flight for a step). Waiting first gives the product of the ones.
#[test]
fn warpgroup_products_run_when_waited_for() {
    use arrayjit::backends::LaunchRequest;
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    let Some(backend) = skip_unless_available() else {
        return;
    };
    let source = r#"
extern "C" __global__ void aj_products(float *y, long long wait_first) {
  /* 64 rows of the left factor and 128 of the right, 16 of depth in 64-byte rows. */
  __shared__ __align__(1024) uint16_t a[64 * 32];
  __shared__ __align__(1024) uint16_t b[128 * 32];
  unsigned t = threadIdx.x;
  for (unsigned i = t; i < 64 * 32; i += 128) a[i] = 0x3f80; /* bf16 1.0 */
  for (unsigned i = t; i < 128 * 32; i += 128) b[i] = 0x3f80;
  __syncthreads();
  float d[64];
  for (int r = 0; r < 64; ++r) d[r] = 0.0f;
  aj_wgmma_fence();
  aj_emu_wgmma(d, a, b, 0, 128, 0, 0, 32);
  aj_wgmma_commit();
  if (wait_first) aj_wgmma_wait(0);
  __syncthreads();
  for (unsigned i = t; i < 64 * 32; i += 128) a[i] = 0x4000; /* bf16 2.0 */
  __syncthreads();
  aj_wgmma_wait(0);
  y[t] = d[0] + d[63];
}
"#;
    let y = Tnode::new(Prec::F32, &[128], &["y"]).unwrap();
    let interface = KernelInterface {
        name: "products".into(),
        symbol: "aj_products".into(),
        args: vec![y],
        merge: None,
        statics: vec![arrayjit::ir::StaticSymbol::new("wait_first", 2)],
        scratch_bytes: 0,
    };
    let launch = LaunchDims {
        grid: [1, 1, 1],
        block: [128, 1, 1],
    };
    let lowered = backend.lowered();
    // SAFETY: the kernel writes 128 floats of y, the size of its interface's buffer.
    let batch =
        unsafe { lowered.compile_source(source, &[SourceKernel::gpu(interface, launch)]) }.unwrap();
    let k = batch.kernel_index("products").unwrap();
    let ys = lowered.runtime().alloc_array(0, Prec::F32, 128).unwrap();
    for (wait_first, each) in [(0, 2.0 * 16.0), (1, 16.0)] {
        // SAFETY: the test's own buffer, one call at a time.
        unsafe {
            batch.launch(LaunchRequest::new(
                k,
                std::slice::from_ref(&ys),
                &[wait_first],
            ))
        }
        .unwrap();
        lowered.runtime().synchronize(0).unwrap();
        let mut out = vec![0u8; 128 * 4];
        // SAFETY: the test's own buffer, one call at a time.
        unsafe { lowered.runtime().copy_to_host(&ys, &mut out, None) }.unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            got.iter().all(|&v| v == 2.0 * each),
            "wait first {wait_first}: {:?}",
            &got[..4]
        );
    }
}

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
    arrayjit_testing::backends_under_test(&["cuda_emu"])
        .unwrap()
        .pop()
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
    let code = backend.compile("tiles_128", &program, &[]).unwrap();
    let tiles = code.optimized().schedules.iter().any(|s| {
        matches!(&s.kind, arrayjit::ir::schedule::ScheduleKind::Gpu(
            arrayjit::ir::schedule::GpuPass::Tiles { layout, .. }) if layout.tile == 128)
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

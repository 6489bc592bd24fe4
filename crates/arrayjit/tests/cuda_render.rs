//! The CUDA renderer over the whole shared corpus, checked without a GPU: every case renders,
//! its passes map statements onto the GPU as the module documentation says (tiled products,
//! block reductions, grids), and — where NVRTC is installed (CI installs NVIDIA's NVRTC wheel)
//! — every rendered file compiles to PTX. Running the kernels needs a GPU: the differential
//! corpus runs on `cuda` wherever `arrayjit info` lists it available.

#![cfg(feature = "cuda")]

use arrayjit::backends::cuda_backend::compile_ptx;
use arrayjit::codegen::cuda::render_cuda;
use arrayjit::codegen::wgsl::PassShape;
use arrayjit::conformance::{all_cases, matmul};
use arrayjit::ir::{Error, OptimizeSettings, optimize};

/// A virtual architecture every NVRTC from CUDA 11.8 to 13 compiles for.
const ARCH: &str = "compute_80";

#[test]
fn every_corpus_case_renders_to_cuda_that_nvrtc_compiles() {
    let mut sources = Vec::new();
    let mut shapes = Vec::new();
    for case in all_cases().unwrap() {
        let opt = optimize(
            &case.name,
            &case.bindings,
            &case.program,
            &OptimizeSettings::default(),
        )
        .unwrap();
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
    assert!(tiled > 0 && reductions > 0 && grids > 0, "{shapes:?}");
    // The product of the differential test is tiled.
    let (m, ..) = matmul(128).unwrap();
    let opt = optimize(
        "matmul",
        &m.bindings,
        &m.program,
        &OptimizeSettings::default(),
    )
    .unwrap();
    let p = render_cuda(&[&opt]).unwrap();
    assert!(
        p.kernels[0]
            .passes
            .iter()
            .any(|p| matches!(p.shape, PassShape::Tiles(_))),
        "{:?}",
        p.kernels[0].passes
    );
    sources.push(("matmul".into(), p.source));
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

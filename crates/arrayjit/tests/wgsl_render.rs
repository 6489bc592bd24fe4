//! The WGSL renderer over the whole shared corpus, checked without a GPU: every pass of every
//! case parses and validates with naga (the WGSL front end wgpu itself uses), a case in a
//! precision WGSL lacks is a typed error naming it, and the passes map statements onto the GPU
//! as the module documentation says (grids, workgroup reductions, zeroing).

use arrayjit::codegen::gpu_kernel::PassShape;
use arrayjit::codegen::wgsl::{WgslTarget, render_wgsl};
use arrayjit::ir::Error;
use arrayjit::opt::{OptimizeSettings, optimize};
use arrayjit_testing::{all_cases, matmul};

fn validate(source: &str, target: &WgslTarget) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut caps = naga::valid::Capabilities::empty();
    if target.f16 {
        caps |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if target.int64 {
        caps |= naga::valid::Capabilities::SHADER_INT64;
    }
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map(|_| ())
        .map_err(|e| e.emit_to_string(source))
}

#[test]
fn every_corpus_case_renders_to_valid_wgsl_or_names_its_precision() {
    let target = WgslTarget {
        f16: true,
        int64: true,
        max_bindings: 32,
        ..WgslTarget::default()
    };
    let supported = target.precisions();
    let (mut rendered, mut refused, mut failures) = (0, 0, Vec::new());
    let (mut tiled, mut rows) = (Vec::new(), Vec::new());
    for case in all_cases().unwrap() {
        let opt = match optimize(
            &case.name,
            &case.bindings,
            &case.program,
            &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::portable()),
        ) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{}: optimize: {e}", case.name));
                continue;
            }
        };
        let needs_unsupported = opt
            .nodes
            .iter()
            .any(|r| r.used && !supported.contains(&r.tn.prec()));
        match render_wgsl(&opt, &target) {
            Ok(kernel) => {
                assert!(
                    !needs_unsupported,
                    "{} rendered an unsupported precision",
                    case.name
                );
                rendered += 1;
                if kernel
                    .passes
                    .iter()
                    .any(|p| matches!(p.shape, PassShape::Tiles(_)))
                {
                    tiled.push(case.name.clone());
                }
                if kernel
                    .passes
                    .iter()
                    .any(|p| matches!(p.shape, PassShape::Rows(_)))
                {
                    rows.push(case.name.clone());
                }
                for (i, pass) in kernel.passes.iter().enumerate() {
                    if let Err(e) = validate(&pass.source, &target) {
                        failures.push(format!("{} pass {i}:\n{e}\n{}", case.name, pass.source));
                    }
                }
            }
            Err(Error::UnsupportedPrecision { prec, .. }) if needs_unsupported => {
                assert!(!supported.contains(&prec));
                refused += 1;
            }
            Err(e) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!(
        "{rendered} cases rendered, {refused} refused for their precision; tiled products in {tiled:?}"
    );
    // The corpus runs the tiled products and per-element workgroup reductions on wgpu: keep
    // some in it.
    assert!(tiled.len() >= 2, "{tiled:?}");
    for case in ["long_row_reductions", "fused_softmax_rows_f32_long"] {
        assert!(rows.contains(&case.to_string()), "{rows:?}");
    }
    assert!(rendered > 20, "{rendered} rendered, {refused} refused");
}

#[test]
fn products_are_tiled_and_small_ones_are_grids() {
    // 64: 16-tiles (one 64-tile would leave the device idle).
    for (n, expected) in [
        (64, PassShape::Tiles(16)),
        (32, PassShape::Tiles(4)),
        (5, PassShape::Grid(25)),
    ] {
        let (case, ..) = matmul(n).unwrap();
        let opt = optimize(
            "mm",
            &[],
            &case.program,
            &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::portable()),
        )
        .unwrap();
        let kernel = render_wgsl(&opt, &WgslTarget::default()).unwrap();
        let shapes: Vec<&PassShape> = kernel.passes.iter().map(|p| &p.shape).collect();
        assert!(shapes.contains(&&expected), "{}", kernel.full_source());
        for p in &kernel.passes {
            validate(&p.source, &WgslTarget::default()).unwrap();
        }
    }
}

#[test]
fn passes_stay_within_the_binding_limit_or_say_why() {
    // WebGPU's guaranteed minimum: fused loops split back into one pass per statement.
    let target = WgslTarget {
        f16: true,
        int64: true,
        max_bindings: 8,
        ..WgslTarget::default()
    };
    let mut split = 0;
    for case in all_cases().unwrap() {
        let opt = optimize(
            &case.name,
            &case.bindings,
            &case.program,
            &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::portable()),
        )
        .unwrap();
        let statements = opt.statements().len();
        match render_wgsl(&opt, &target) {
            Ok(kernel) => {
                for p in &kernel.passes {
                    assert!(p.bindings.len() <= 8, "{}: {:?}", case.name, p.bindings);
                    validate(&p.source, &target).unwrap();
                }
                split += usize::from(kernel.passes.len() > statements);
            }
            Err(Error::LimitExceeded {
                limit,
                needed,
                allowed,
                ..
            }) => {
                assert_eq!(
                    limit,
                    arrayjit::DeviceLimit::BindingsPerPass,
                    "{}",
                    case.name
                );
                assert!(needed > allowed && allowed == 8, "{}: {needed}", case.name);
            }
            Err(Error::UnsupportedPrecision { .. }) => {}
            Err(e) => panic!("{}: {e}", case.name),
        }
    }
    assert!(split > 0, "no case needed splitting");
}

/// GPT-2's heads (64 features, causal) render as the GPU's attention pass on a device of
/// WebGPU's guaranteed limits (8 bindings, 16 KiB of workgroup memory): the forward pass and
/// both backward launches, each binding only the arrays it uses, staging 16 keys at a time;
/// with dropout the key gradients' launch would bind 9 arrays, so the key and the value
/// gradients take a launch each (8 and 6 arrays). Every pass validates.
#[test]
fn attention_renders_as_its_gpu_pass_within_webgpu_limits() {
    let target = WgslTarget::default();
    assert_eq!(target.max_bindings, 8);
    for (dropout, attention_kernels) in [(None, 3), (Some(0.1), 4)] {
        let case = arrayjit_testing::attention_head_case(
            "gpt2_heads",
            arrayjit::ir::Prec::F32,
            80,
            64,
            dropout,
        )
        .unwrap();
        let opt = optimize(
            &case.name,
            &case.bindings,
            &case.program,
            &OptimizeSettings::for_gpu(arrayjit::opt::schedule::GpuLimits::portable()),
        )
        .unwrap();
        let kernel = render_wgsl(&opt, &target).unwrap();
        let attention: Vec<_> = kernel
            .passes
            .iter()
            .filter(|p| p.why.contains("FlashAttention-2"))
            .collect();
        assert_eq!(attention.len(), attention_kernels, "dropout {dropout:?}");
        for p in &attention {
            // 80 rows in groups of 32 (64-row groups would leave a device idle): 3 blocks
            // per head, 2 heads.
            assert_eq!((p.shape.clone(), p.threads), (PassShape::Tiles(6), 32));
            assert!(p.bindings.len() <= 8, "{:?}", p.bindings);
            assert!(p.why.contains("16 keys staged"), "{}", p.why);
        }
        for p in &kernel.passes {
            validate(&p.source, &target).unwrap_or_else(|e| panic!("{}:\n{e}", p.why));
        }
    }
}

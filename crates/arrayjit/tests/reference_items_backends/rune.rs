//! The items of `rune-backend-intf.txt`: source compiled and launched with dims chosen at
//! launch, device limits, compile options per compile, the renderer's device strings.

use super::*;

/// The row sums a hand-written GPU kernel computes in the test below: 4 rows of 64, plus the
/// static index `k`, in CUDA C (for `cuda` and `cuda_emu`) and in WGSL (for `wgpu`). Both
/// use a 2-D block of 32 × 2 threads, shared memory and barriers.
const ROW_SUMS_CUDA: &str = include_str!("../fixtures/row_sums.cu");

const ROW_SUMS_WGSL: &str = include_str!("../fixtures/row_sums.wgsl");

/// `rune-backend-intf.txt`, `Compiler.compile ~source_code`, `Runtime.get_kernel` and
/// `launch_kernel ~global_dims ?local_dims`: hand-written GPU kernels compile from source and
/// launch on a 2-D grid with the given blocks, on every GPU-style backend here (`cuda_emu`
/// everywhere a C++ compiler is; `wgpu` where a Vulkan driver is; `cuda` where a GPU is), with
/// the values checked against exact sums. Bad launches and sources are typed errors.
#[test]
fn rune_backend_intf__compile_source_and_launch_with_dims() {
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    use arrayjit::ir::StaticSymbol;
    let x = Tnode::new(Prec::F32, &[4, 64], &["x"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4], &["y"]).unwrap();
    let interface = KernelInterface {
        name: "row_sums".into(),
        symbol: "aj_row_sums".into(),
        args: vec![x, y],
        merge: None,
        statics: vec![StaticSymbol::new("k", 10)],
        scratch_bytes: 0,
    };
    let launch = LaunchDims {
        grid: [2, 2, 1],
        block: [32, 2, 1],
    };
    let kernel = SourceKernel::gpu(interface, launch);
    let values: Vec<f32> = (0..256).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let expected: Vec<f32> = values
        .chunks(64)
        .map(|row| row.iter().sum::<f32>() + 3.0)
        .collect();
    let available = arrayjit_testing::backends_under_test(&["cuda_emu", "cuda", "wgpu"]).unwrap();
    let mut ran = vec![];
    for backend in &available {
        let name = backend.name();
        let source = if name == "wgpu" {
            ROW_SUMS_WGSL
        } else {
            ROW_SUMS_CUDA
        };
        let lowered = backend.lowered();
        // SAFETY: the kernel reads 256 floats of x and writes 4 of y, the sizes of its
        // interface's buffers.
        let batch =
            unsafe { lowered.compile_source(source, std::slice::from_ref(&kernel)) }.unwrap();
        let k = batch.kernel_index("row_sums").unwrap();
        let xs = lowered.runtime().alloc_array(0, Prec::F32, 256).unwrap();
        let ys = lowered.runtime().alloc_array(0, Prec::F32, 4).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_from_host(&xs, &bytes, None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { batch.launch(LaunchRequest::new(k, &[xs.clone(), ys.clone()], &[3])) }.unwrap();
        lowered.runtime().synchronize(0).unwrap();
        let mut out = vec![0u8; 16];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_to_host(&ys, &mut out, None) }.unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, expected, "{name}");
        // A static index outside its range is refused before the kernel runs.
        // SAFETY: the test's own buffers, one call at a time.
        let e = unsafe { batch.launch(LaunchRequest::new(k, &[xs, ys], &[10])) }.unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::StaticIndex { .. }),
            "{name}: {e}"
        );
        // A launch with an empty dimension, a symbol that is no identifier: refused.
        let mut empty = kernel.clone();
        empty.launch.block = [0, 1, 1];
        let e = unsafe { lowered.compile_source(source, &[empty]) }.unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{name}: {e}");
        let mut bad = kernel.clone();
        bad.interface.symbol = "row sums".into();
        let e = unsafe { lowered.compile_source(source, &[bad]) }.unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::BadValue { what, .. } if what == "kernel symbol"),
            "{name}: {e}"
        );
        ran.push(name);
    }
    if available.iter().any(|b| b.name() == "wgpu") {
        // WGSL: an entry point the source lacks, and a binding the kernel does not have.
        let lowered = arrayjit::backend("wgpu").unwrap().lowered().clone();
        let mut missing = kernel.clone();
        missing.interface.symbol = "aj_missing".into();
        let e = unsafe { lowered.compile_source(ROW_SUMS_WGSL, &[missing]) }.unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::BadValue { what, value, .. }
                if what == "WGSL entry point" && value == "aj_missing"),
            "{e}"
        );
        // A block other than the shader's @workgroup_size is refused, naming both.
        let mut other_block = kernel.clone();
        other_block.launch.block = [64, 1, 1];
        let e = unsafe { lowered.compile_source(ROW_SUMS_WGSL, &[other_block]) }.unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::ShapeMismatch { shapes, .. }
                if *shapes == vec![vec![64, 1, 1], vec![32, 2, 1]]),
            "{e}"
        );
        let mut no_statics = kernel.clone();
        no_statics.interface.statics.clear();
        let e = unsafe { lowered.compile_source(ROW_SUMS_WGSL, &[no_statics]) }.unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::BadValue { value, .. } if value == "2"),
            "{e}"
        );
    }
    // A test that ran nowhere proves nothing: cuda_emu needs only a C++ compiler.
    assert!(
        !ran.is_empty(),
        "no backend ran the source kernel (cuda_emu, cuda, wgpu all unavailable)"
    );
    eprintln!("ran on {ran:?}");
}

/// `rune-backend-intf.txt`, `Device_info.max_shared_memory` / `max_workgroup_size`: every
/// backend states its block and shared-memory limits, and a hand-written kernel launched past
/// them is refused before it runs. CPU backends run one invocation per kernel call; `cuda_emu`
/// keeps to CUDA's limits, which it emulates; wgpu reports its adapter's (at least WebGPU's
/// required minimums).
#[test]
fn rune_backend_intf__device_info_limits() {
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name();
        let info = backend.get_device(0).unwrap().info().unwrap();
        let [x, y, z] = info.max_local_size;
        assert!(
            u64::from(info.max_local_invocations) <= u64::from(x) * u64::from(y) * u64::from(z),
            "{name}: {info}"
        );
        match name {
            "sync_cc" | "multicore_cc" => {
                assert_eq!(
                    (info.max_local_size, info.max_local_invocations),
                    ([1, 1, 1], 1)
                );
                assert_eq!(info.max_shared_bytes, 0, "{name}");
            }
            "cuda_emu" => {
                assert_eq!(info.max_local_size, [1024, 1024, 64]);
                assert_eq!(info.max_local_invocations, 1024);
                assert_eq!(info.max_shared_bytes, 48 * 1024);
                assert_eq!(info.subgroup_size, 32);
            }
            "wgpu" => {
                assert!(info.max_local_invocations >= 256, "{info}");
                assert!(info.max_shared_bytes >= 16 * 1024, "{info}");
            }
            "cuda" => {
                assert!(info.max_local_invocations >= 1024, "{info}");
                assert!(info.max_shared_bytes >= 48 * 1024, "{info}");
            }
            _ => {}
        }
        if matches!(name, "cuda_emu" | "cuda") {
            // One thread past the limit: refused at compile_source, naming the limit.
            let interface = KernelInterface {
                name: "too_big".into(),
                symbol: "too_big".into(),
                args: vec![],
                merge: None,
                statics: vec![],
                scratch_bytes: 0,
            };
            let kernel = SourceKernel::gpu(
                interface,
                LaunchDims {
                    grid: [1, 1, 1],
                    block: [info.max_local_invocations + 1, 1, 1],
                },
            );
            let source = "extern \"C\" __global__ void too_big() {}";
            let e = unsafe { backend.lowered().compile_source(source, &[kernel]) }.unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("at most {}", info.max_local_invocations)),
                "{name}: {e}"
            );
        }
    }
}

/// `rune-backend-intf.txt`, `launch_kernel ~global_dims ?local_dims` with the dimensions chosen
/// at launch: `global` threads per axis in blocks of `local` (`ceil(global / local)` blocks);
/// `local = None` lets the backend pick (cuda and cuda_emu: up to 256 threads along x; wgpu:
/// the shader's `@workgroup_size`). The same row-sum kernel gives the same sums under other
/// launches; blocks past the device's limits, or other than a shader's, are refused.
#[test]
fn rune_backend_intf__launch_kernel_with_dims_chosen_at_launch() {
    use arrayjit::codegen::{KernelInterface, LaunchDims, SourceKernel};
    use arrayjit::ir::StaticSymbol;
    let x = Tnode::new(Prec::F32, &[4, 64], &["x"]).unwrap();
    let y = Tnode::new(Prec::F32, &[4], &["y"]).unwrap();
    let sums = SourceKernel::gpu(
        KernelInterface {
            name: "row_sums".into(),
            symbol: "aj_row_sums".into(),
            args: vec![x, y],
            merge: None,
            statics: vec![StaticSymbol::new("k", 10)],
            scratch_bytes: 0,
        },
        LaunchDims {
            grid: [2, 2, 1],
            block: [32, 2, 1],
        },
    );
    let values: Vec<f32> = (0..256).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let expected: Vec<f32> = values
        .chunks(64)
        .map(|r| r.iter().sum::<f32>() + 2.0)
        .collect();
    // A kernel that does not care about its block: y[i] = i for i < n.
    const IOTA: &str = "extern \"C\" __global__ void aj_iota(float *y, long long n) {\n\
        unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n\
        if (i < (unsigned long long)n) y[i] = (float)i;\n}\n";
    let z = Tnode::new(Prec::F32, &[1000], &["z"]).unwrap();
    let iota = SourceKernel::gpu(
        KernelInterface {
            name: "iota".into(),
            symbol: "aj_iota".into(),
            args: vec![z],
            merge: None,
            statics: vec![StaticSymbol::new("n", 1001)],
            scratch_bytes: 0,
        },
        LaunchDims::SINGLE,
    );
    let f32s = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mut ran = vec![];
    for backend in arrayjit_testing::backends_under_test(&["cuda_emu", "cuda", "wgpu"]).unwrap() {
        let name = backend.name();
        let lowered = backend.lowered();
        let wgsl = name == "wgpu";
        let source = if wgsl { ROW_SUMS_WGSL } else { ROW_SUMS_CUDA };
        // SAFETY: the kernel reads 256 floats of x and writes 4 of y, its interface's sizes.
        let batch = unsafe { lowered.compile_source(source, std::slice::from_ref(&sums)) }.unwrap();
        let xs = lowered.runtime().alloc_array(0, Prec::F32, 256).unwrap();
        let ys = lowered.runtime().alloc_array(0, Prec::F32, 4).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_from_host(&xs, &bytes, None) }.unwrap();
        let launches: Vec<([u32; 3], Option<[u32; 3]>)> = if wgsl {
            // The shader's block is [32, 2, 1]: 4 rows as 4×1 or 2×2 workgroups.
            vec![([128, 2, 1], None), ([64, 4, 1], Some([32, 2, 1]))]
        } else {
            vec![
                ([256, 1, 1], Some([64, 1, 1])),
                ([64, 4, 1], Some([32, 2, 1])),
                ([32, 8, 1], Some([16, 4, 1])),
            ]
        };
        for (global, local) in launches {
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { lowered.runtime().copy_from_host(&ys, &[0u8; 16], None) }.unwrap();
            let args = [xs.clone(), ys.clone()];
            // SAFETY: as above; the launch covers 4 blocks of 64 threads, what the kernel reads.
            unsafe { batch.launch(LaunchRequest::new(0, &args, &[2]).with_dims(global, local)) }
                .unwrap();
            lowered.runtime().synchronize(0).unwrap();
            let mut out = vec![0u8; 16];
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { lowered.runtime().copy_to_host(&ys, &mut out, None) }.unwrap();
            assert_eq!(f32s(&out), expected, "{name}: {global:?} in {local:?}");
        }
        let info = backend.get_device(0).unwrap().info().unwrap();
        let refused = |global: [u32; 3], local: Option<[u32; 3]>| {
            // SAFETY: refused before anything runs.
            unsafe {
                batch.launch(
                    LaunchRequest::new(0, &[xs.clone(), ys.clone()], &[2]).with_dims(global, local),
                )
            }
            .unwrap_err()
        };
        if wgsl {
            let e = refused([64, 1, 1], Some([64, 1, 1]));
            assert!(
                matches!(&e, arrayjit::Error::ShapeMismatch { shapes, .. }
                    if *shapes == vec![vec![64, 1, 1], vec![32, 2, 1]]),
                "{e}"
            );
        } else {
            let too_many = info.max_local_invocations + 1;
            let e = refused([too_many, 1, 1], Some([too_many, 1, 1]));
            assert!(
                matches!(
                    &e,
                    arrayjit::Error::LimitExceeded {
                        limit: arrayjit::DeviceLimit::ThreadsPerBlock,
                        needed,
                        allowed,
                        ..
                    } if *needed == u64::from(too_many)
                        && *allowed == u64::from(info.max_local_invocations)
                ),
                "{name}: {e}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("at most {}", info.max_local_invocations)),
                "{name}: {e}"
            );
            let deep = info.max_local_size[2] + 1;
            let e = refused([1, 1, deep], Some([1, 1, deep]));
            assert!(
                matches!(
                    &e,
                    arrayjit::Error::LimitExceeded {
                        limit: arrayjit::DeviceLimit::BlockExtent(2),
                        ..
                    }
                ),
                "{name}: {e}"
            );
            assert!(e.to_string().contains("along axis 2"), "{name}: {e}");
            // CUDA's grid holds 65,535 blocks along y and z: refused before the driver, on
            // the device and its emulation alike.
            let e = refused([1, 131_072, 1], Some([1, 1, 1]));
            assert!(
                matches!(
                    &e,
                    arrayjit::Error::LimitExceeded {
                        limit: arrayjit::DeviceLimit::GridExtent(1),
                        needed: 131_072,
                        allowed: 65_535,
                        ..
                    }
                ),
                "{name}: {e}"
            );
            // The backend picks the block: the block-agnostic kernel fills every element.
            // SAFETY: the kernel writes z[i] for i < n = 1000, z's size.
            let fill =
                unsafe { lowered.compile_source(IOTA, std::slice::from_ref(&iota)) }.unwrap();
            let zs = lowered.runtime().alloc_array(0, Prec::F32, 1000).unwrap();
            // SAFETY: the test's own buffer; the launch covers at least 1000 threads.
            unsafe {
                fill.launch(
                    LaunchRequest::new(0, std::slice::from_ref(&zs), &[1000])
                        .with_dims([1000, 1, 1], None),
                )
            }
            .unwrap();
            lowered.runtime().synchronize(0).unwrap();
            let mut out = vec![0u8; 4000];
            // SAFETY: the test's own buffer, one call at a time.
            unsafe { lowered.runtime().copy_to_host(&zs, &mut out, None) }.unwrap();
            assert_eq!(
                f32s(&out),
                (0..1000).map(|i| i as f32).collect::<Vec<_>>(),
                "{name}"
            );
        }
        let e = refused([0, 1, 1], None);
        assert!(e.to_string().contains("at least 1"), "{name}: {e}");
        ran.push(name.to_string());
    }
    assert!(
        !ran.is_empty(),
        "no backend took launch dimensions (cuda_emu needs only a C++ compiler)"
    );
}

/// `rune-backend-intf.txt`, `Compiler.default_options` / `compile ~options`: a backend states
/// the options it compiles with; `cc` and `cuda_emu` compile with other host compiler flags
/// when asked (a flag the compiler refuses fails that compile, naming it; flags that cannot
/// make a loadable library are refused first); backends that take no options refuse others;
/// clearing the options compiles with the defaults again.
#[test]
fn rune_backend_intf__compile_options_per_compile() {
    use arrayjit::backends::CompileOptions;
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let defaults = backend.compile_options();
        assert_eq!(
            defaults,
            backend.lowered().default_compile_options(),
            "{name}"
        );
        let x = input("x", &[1.0, -2.0, 3.0]);
        let y = result("y", 3);
        let program = Assignments::pointwise_unop(&y, UnOp::Relu, &x);
        let run = |code: &arrayjit::runtime::Code| {
            let stream = backend.get_device(0).unwrap().new_stream().unwrap();
            Context::new(&stream).link(code).unwrap().run().unwrap();
            assert_eq!(
                y.host().get_values().unwrap(),
                vec![1.0, 0.0, 3.0],
                "{name}"
            );
        };
        let host_compiled = name.ends_with("_cc") || name == "cuda_emu";
        if host_compiled {
            assert!(
                defaults.flags.iter().any(|f| f == "-shared"),
                "{name}: {defaults:?}"
            );
            // Unoptimized, no fast math: still right.
            let mut flags: Vec<String> = defaults
                .flags
                .iter()
                .filter(|f| !f.starts_with("-O"))
                .cloned()
                .collect();
            flags.extend(["-O0".to_string(), "-fno-fast-math".to_string()]);
            backend.set_compile_options(Some(CompileOptions {
                flags: flags.clone(),
            }));
            assert_eq!(backend.compile_options().flags, flags);
            run(&backend
                .compile(CompileRequest::routine("relu_o0", &program))
                .unwrap());
            // The flags reach the compiler: one it does not know fails the compile.
            flags.push("-fno-such-flag-arrayjit".into());
            backend.set_compile_options(Some(CompileOptions { flags }));
            let e = backend
                .compile(CompileRequest::routine("relu_bad", &program))
                .unwrap_err();
            assert!(
                matches!(e, arrayjit::Error::CompileFailed(_)),
                "{name}: {e}"
            );
            assert!(
                e.to_string().contains("no-such-flag-arrayjit"),
                "{name}: {e}"
            );
            // Flags that cannot make a shared library: refused before compiling.
            backend.set_compile_options(Some(CompileOptions {
                flags: vec!["-O2".into()],
            }));
            let e = backend
                .compile(CompileRequest::routine("relu_static", &program))
                .unwrap_err();
            assert!(
                matches!(e.root_cause(), arrayjit::Error::InvalidSetting { value, expected, .. }
                    if value == "-O2" && expected.contains("-shared")),
                "{name}: {e}"
            );
        } else {
            backend.set_compile_options(Some(CompileOptions {
                flags: vec!["--use_fast_math".into()],
            }));
            let e = backend
                .compile(CompileRequest::routine("relu_fast", &program))
                .unwrap_err();
            assert!(
                matches!(e.root_cause(), arrayjit::Error::Unsupported { backend, .. } if *backend == name),
                "{name}: {e}"
            );
            // Its own defaults, given explicitly, compile as usual.
            backend.set_compile_options(Some(defaults.clone()));
            run(&backend
                .compile(CompileRequest::routine("relu_defaults", &program))
                .unwrap());
        }
        backend.set_compile_options(None);
        assert_eq!(backend.compile_options(), defaults);
        run(&backend
            .compile(CompileRequest::routine("relu", &program))
            .unwrap());
    }
}

/// `rune-backend-intf.txt`, `Device_info.renderer_float4_str`, `renderer_smem_prefix`,
/// `renderer_barrier_str`: each GPU-style backend states its dialect's strings as data, and the
/// source it renders for a tiled product declares its shared tiles and waits at its barriers
/// with exactly them; C on CPUs has no dialect.
#[test]
fn rune_backend_intf__renderer_device_strings() {
    let (case, ..) = arrayjit_testing::matmul(256).unwrap();
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name();
        let dialect = backend.lowered().gpu_dialect();
        match name {
            "sync_cc" | "multicore_cc" => {
                assert!(dialect.is_none(), "{name}");
                continue;
            }
            "cuda" | "cuda_emu" => assert_eq!(dialect.map(|d| d.name), Some("CUDA")),
            "wgpu" => assert_eq!(dialect.map(|d| d.name), Some("WGSL")),
            _ => {}
        }
        let Some(d) = dialect else { continue };
        let source = backend
            .compile(CompileRequest::routine("matmul", &case.program))
            .unwrap()
            .source()
            .to_string();
        assert!(
            source.contains(d.barrier),
            "{name}: no {:?} in\n{source}",
            d.barrier
        );
        assert!(
            source.contains(d.smem_prefix),
            "{name}: no shared declaration ({:?}) in\n{source}",
            d.smem_prefix
        );
        assert!(d.float4.is_some(), "{name}");
    }
}

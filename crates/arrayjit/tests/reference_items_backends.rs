//! Conformance tests of the reference items about backends (`ocannl-lowered-backend-missing.txt`,
//! `rune-backend-intf.txt`, `alloc_pool`, and what a run uploads), named `<document>__<item>`
//! like those of `reference_items.rs`, and run on both CPU backends (and any backend named in
//! the test).

#![allow(non_snake_case)] // `<document>__<item>`: the double underscore separates the two.

use arrayjit::backends::LaunchRequest;
use arrayjit::prelude::*;

#[path = "common/reference.rs"]
#[allow(dead_code)]
mod reference;
use reference::*;

#[path = "reference_items_backends/rune.rs"]
mod rune;

/// `ocannl-lowered-backend-missing.txt`, `compile_batch` (over optional routines) and
/// `link_batch`: empty slots stay empty, the routines compile in one run, link one after the
/// other (a later routine finds the arrays an earlier one made), and a failed link leaves no
/// memory behind.
#[test]
fn lowered_backend__compile_batch_with_empty_slots_and_link_batch() {
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let x = input("x", &[1.0, -2.0]);
        let a = Tnode::new(Prec::F32, &[2], &["a"]).unwrap();
        a.update_memory_mode(
            MemoryMode::OnDevice(Sharing::Unset),
            "test: kept on the device",
        )
        .unwrap();
        let y = result("y", 2);
        let first = Assignments::pointwise_unop(&a, UnOp::Neg, &x);
        let second = Assignments::pointwise_unop(&y, UnOp::Relu, &a);
        let root = Context::new(&stream);
        let codes = backend
            .compile(
                CompileRequest::slots(&[Some(("first", &first)), None, Some(("second", &second))])
                    .in_context(root.optimize_ctx()),
            )
            .unwrap();
        assert!(codes[0].is_some() && codes[1].is_none() && codes[2].is_some());
        let (last, routines) = root.link_batch(&codes).unwrap();
        assert!(routines[1].is_none());
        assert!(last.has(&a) && last.has(&y));
        routines[0].as_ref().unwrap().run().unwrap();
        routines[2].as_ref().unwrap().run().unwrap();
        assert_eq!(y.host().get_values().unwrap(), vec![0.0, 2.0], "{name}");
        // A batch whose second link fails (it writes a hosted constant) frees what the first
        // link allocated.
        let c = input("c", &[0.0, 0.0]);
        c.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
            .unwrap();
        let bad = backend
            .compile(CompileRequest::routine(
                "bad",
                &Assignments::pointwise_unop(&c, UnOp::Neg, &x),
            ))
            .unwrap();
        let device = backend.get_device(0).unwrap();
        let before = device.used_memory();
        let e = root.link_batch(&[codes[0].clone(), Some(bad)]).unwrap_err();
        assert!(e.to_string().contains("hosted constant"), "{e}");
        // Uploads the first link scheduled keep their arrays until they have run.
        stream.await_work().unwrap();
        assert_eq!(device.used_memory(), before, "{name}");
        // All slots empty: nothing to compile.
        let none = backend
            .compile(CompileRequest::slots(&[None, None]).in_context(root.optimize_ctx()))
            .unwrap();
        assert!(none.iter().all(Option::is_none));
    }
}

/// `rune-backend-intf.txt` / `ocannl-lowered-backend-missing.txt`, `compile` of source and
/// getting a kernel by name: hand-written C on the cc backends, launched on the backend's own
/// buffers with the launch checks of compiled routines; a compile error says what failed; a
/// backend that takes no source says so.
#[test]
fn lowered_backend__compile_source_and_get_kernel() {
    use arrayjit::codegen::{KernelInterface, SourceKernel};
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let lowered = backend.lowered();
        let x = Tnode::new(Prec::F32, &[4], &["x"]).unwrap();
        let interface = KernelInterface {
            name: "double".into(),
            symbol: "aj_test_double".into(),
            args: vec![x],
            merge: None,
            statics: vec![],
            scratch_bytes: 0,
        };
        let source = "#include <stdint.h>\n\
            void aj_test_double(uint8_t *const *args, const int64_t *statics, const void *w) {\n\
              (void)statics; (void)w;\n\
              float *x = (float *)args[0];\n\
              for (int i = 0; i < 4; ++i) x[i] *= 2.0f;\n\
            }\n";
        // SAFETY: the kernel has the cc signature and touches its buffer's 16 bytes only.
        let batch =
            unsafe { lowered.compile_source(source, &[SourceKernel::cpu(interface.clone())]) }
                .unwrap();
        let k = batch.kernel_index("double").unwrap();
        assert_eq!(batch.kernel_index("aj_test_double"), Some(k));
        assert_eq!(batch.kernel_index("missing"), None);
        let buffer = lowered.runtime().alloc_zeroed(0, 16).unwrap();
        let values: Vec<u8> = [1.0f32, 2.0, -3.0, 0.5]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_from_host(&buffer, &values, None) }.unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { batch.launch(LaunchRequest::new(k, std::slice::from_ref(&buffer), &[])) }.unwrap();
        // A C kernel runs once per call: it takes no launch dimensions.
        // SAFETY: as above (refused before it runs).
        let e = unsafe {
            batch.launch(
                LaunchRequest::new(k, std::slice::from_ref(&buffer), &[])
                    .with_dims([4, 1, 1], None),
            )
        }
        .unwrap_err();
        assert!(
            matches!(&e, arrayjit::Error::Unsupported { what, .. } if what.contains("launch dimensions")),
            "{e}"
        );
        let mut out = vec![0u8; 16];
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { lowered.runtime().copy_to_host(&buffer, &mut out, None) }.unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![2.0, 4.0, -6.0, 1.0], "{name}");
        // Launch checks: a buffer too small is refused before the kernel runs.
        let small = lowered.runtime().alloc_zeroed(0, 8).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        assert!(unsafe { batch.launch(LaunchRequest::new(k, &[small], &[])) }.is_err());
        // A compile error is typed and says what failed.
        // SAFETY: refused before anything runs.
        let e = unsafe {
            lowered.compile_source("this is not C", &[SourceKernel::cpu(interface.clone())])
        }
        .unwrap_err();
        assert!(matches!(e, arrayjit::Error::CompileFailed(_)), "{e}");
        // With options (`Compiler.compile ~options`): the host compiler's flags, here without
        // optimization and with a macro the source reads; flags that cannot make a shared
        // library are refused before anything is compiled.
        let mut flags = lowered.default_compile_options().flags;
        flags.extend(["-O0".to_string(), "-DAJ_FACTOR=3.0f".to_string()]);
        let options = arrayjit::backends::CompileOptions { flags };
        let scaled = source.replace("2.0f", "AJ_FACTOR");
        // SAFETY: as above.
        let batch = unsafe {
            lowered.compile_source_with(&scaled, &[SourceKernel::cpu(interface.clone())], &options)
        }
        .unwrap();
        let k = batch.kernel_index("double").unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { batch.launch(LaunchRequest::new(k, std::slice::from_ref(&buffer), &[])) }.unwrap();
        // SAFETY: as above.
        unsafe { lowered.runtime().copy_to_host(&buffer, &mut out, None) }.unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![6.0, 12.0, -18.0, 3.0], "{name}");
        let no_library = arrayjit::backends::CompileOptions {
            flags: vec!["-O1".into()],
        };
        // SAFETY: refused before anything runs.
        let e = unsafe {
            lowered.compile_source_with(source, &[SourceKernel::cpu(interface)], &no_library)
        }
        .unwrap_err();
        assert!(e.to_string().contains("-shared"), "{name}: {e}");
    }
    let metal = arrayjit::backend("metal").unwrap();
    let e = unsafe { metal.lowered().compile_source("", &[]) }.unwrap_err();
    assert!(
        matches!(e, arrayjit::Error::BackendUnavailable { .. }) && e.to_string().contains("metal"),
        "{e}"
    );
}

/// A cc backend whose runtime records the memory mode of every pool it is asked for, and
/// every upload from the host (`(byte offset, bytes)`): cc's parts with the runtime part
/// replaced by one wrapping cc's own.
#[derive(Debug)]
struct RecordingPools {
    inner: std::sync::Arc<dyn arrayjit::backends::DeviceRuntime>,
    modes: std::sync::Mutex<Vec<Option<MemoryMode>>>,
    uploads: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl RecordingPools {
    /// The recording runtime, and the backend composed with it.
    fn new() -> (
        std::sync::Arc<RecordingPools>,
        std::sync::Arc<arrayjit::backends::LoweredBackend>,
    ) {
        use arrayjit::backends::LoweredBackend;
        use arrayjit::backends::cc::{self, CKernels, CcConfig};
        let mut parts = cc::parts(
            CcConfig::from_env().unwrap(),
            std::sync::Arc::new(CKernels::default()),
        )
        .unwrap();
        let recording = std::sync::Arc::new(RecordingPools {
            inner: parts.runtime.clone(),
            modes: Default::default(),
            uploads: Default::default(),
        });
        parts.runtime = recording.clone();
        let lowered = LoweredBackend::compose("recording", parts);
        (recording, std::sync::Arc::new(lowered))
    }
}

mod recording {
    use super::RecordingPools;
    use arrayjit::backends::{BufferHandle, DeviceRuntime, Queue};
    use arrayjit::ir::{MemoryMode, Result};

    impl DeviceRuntime for RecordingPools {
        fn num_devices(&self) -> usize {
            self.inner.num_devices()
        }
        fn alloc_zeroed(&self, device: usize, size: usize) -> Result<BufferHandle> {
            self.inner.alloc_zeroed(device, size)
        }
        unsafe fn copy_from_host(
            &self,
            dst: &BufferHandle,
            src: &[u8],
            q: Queue<'_>,
        ) -> Result<()> {
            self.uploads.lock().unwrap().push((0, src.len()));
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { self.inner.copy_from_host(dst, src, q) }
        }
        unsafe fn copy_from_host_range(
            &self,
            dst: &BufferHandle,
            offset: usize,
            src: &[u8],
            q: Queue<'_>,
        ) -> Result<()> {
            self.uploads.lock().unwrap().push((offset, src.len()));
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { self.inner.copy_from_host_range(dst, offset, src, q) }
        }
        unsafe fn copy_to_host(
            &self,
            src: &BufferHandle,
            dst: &mut [u8],
            q: Queue<'_>,
        ) -> Result<()> {
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { self.inner.copy_to_host(src, dst, q) }
        }
        unsafe fn copy_buffer(
            &self,
            d: &BufferHandle,
            s: &BufferHandle,
            q: Queue<'_>,
        ) -> Result<()> {
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { self.inner.copy_buffer(d, s, q) }
        }
        fn used_memory(&self, device: usize) -> usize {
            self.inner.used_memory(device)
        }
        fn alloc_pool(&self, device: usize, id: usize, size: usize, align: usize) -> Result<()> {
            self.inner.alloc_pool(device, id, size, align)
        }
        fn alloc_pool_for(
            &self,
            device: usize,
            id: usize,
            size: usize,
            align: usize,
            mode: Option<MemoryMode>,
        ) -> Result<()> {
            self.modes.lock().unwrap().push(mode);
            self.inner.alloc_pool(device, id, size, align)
        }
        fn free_pool(&self, device: usize, id: usize) -> Result<()> {
            self.inner.free_pool(device, id)
        }
        unsafe fn memset_zero(
            &self,
            device: usize,
            id: usize,
            offset: usize,
            size: usize,
        ) -> Result<()> {
            // SAFETY: the test's own buffers, one call at a time.
            unsafe { self.inner.memset_zero(device, id, offset, size) }
        }
        fn pool_view(
            &self,
            device: usize,
            id: usize,
            offset: usize,
            size: usize,
        ) -> Result<BufferHandle> {
            self.inner.pool_view(device, id, offset, size)
        }
        fn pools(&self, device: usize) -> Vec<(usize, usize)> {
            self.inner.pools(device)
        }
    }
}

/// `ocannl-backend-intf-device.txt`, `alloc_pool ?mode`: the runtime tells the backend the
/// memory mode of a pool's arrays when they share one (here: the device-only arrays of one
/// link, and the stream's scratch, local), so a backend can choose the storage.
#[test]
fn backend_intf_device__alloc_pool_gets_the_memory_mode() {
    let (recording, lowered) = RecordingPools::new();
    let backend = Backend::from_lowered("recording", lowered);
    let x = input("x", &[1.0, 2.0]);
    let a = Tnode::new(Prec::F32, &[2], &["a"]).unwrap();
    a.update_memory_mode(
        MemoryMode::OnDevice(Sharing::PerStream),
        "test: device only",
    )
    .unwrap();
    let code = backend
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&a, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let ctx = Context::new(&stream).init_from_host(&x).unwrap();
    ctx.link(&code).unwrap().run().unwrap();
    let modes = recording.modes.lock().unwrap().clone();
    assert!(
        modes.contains(&Some(MemoryMode::OnDevice(Sharing::PerStream))),
        "{modes:?}"
    );
}

/// `ocannl-lowered-backend-missing.txt`, `use_host_memory`: on the CPU backends a hosted
/// volatile or constant node's host array is its device array, used in place: no device memory,
/// no copies; host changes reach the next run; a host write waits for the work scheduled to
/// read the array before it (checked with a large array on `multicore_cc`, where runs are
/// asynchronous); `ARRAYJIT_USE_HOST_MEMORY=0` (here `CcConfig::use_host_memory`) turns it off.
#[test]
fn lowered_backend__use_host_memory() {
    use arrayjit::backends::cc::{self, CcConfig};
    let n = 1 << 22; // 16 MiB of f32
    for name in CPU_BACKENDS {
        let backend = arrayjit::backend(name).unwrap();
        let device = backend.get_device(0).unwrap();
        let stream = device.new_stream().unwrap();
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.host().set_values_with(|k| (k % 7) as f64).unwrap();
        x.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Volatile),
            "test: fed by the host",
        )
        .unwrap();
        let y = result("y", n);
        let code = backend
            .compile(CompileRequest::routine(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
            ))
            .unwrap();
        let before = device.used_memory();
        let routine = Context::new(&stream).link(&code).unwrap();
        // Only y got device memory.
        assert_eq!(device.used_memory() - before, 4 * n, "{name}");
        assert!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .note()
                .contains("in place"),
            "{}",
            arrayjit::runtime::node_sync(&x).unwrap().note()
        );
        routine.run().unwrap();
        // The host write waits for the run scheduled before it: y sees the old values.
        x.host().set_values_with(|_| -1.0).unwrap();
        let got = y.host().get_values().unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(k, &v)| v == 2.0 * (k % 7) as f64),
            "{name}: the run saw a host write made after it"
        );
        // The next run sees the new values, with no from_host.
        routine.run().unwrap();
        assert!(
            y.host().get_values().unwrap().iter().all(|&v| v == -2.0),
            "{name}"
        );
        // Between two streams, moving the node copies nothing (both use the host array).
        let other = Context::new(&device.new_stream().unwrap())
            .init_from_host(&x)
            .unwrap();
        other
            .device_to_device(&x, MergeBufferUse::No, routine.context())
            .unwrap();
        routine.context().to_host(&x).unwrap();
        assert_eq!(x.host().get_value(&[3]).unwrap(), -1.0);
    }
    // Off: x gets a device array of its own.
    let mut config = CcConfig::from_env().unwrap();
    config.use_host_memory = false;
    let backend =
        Backend::from_lowered("sync_cc", std::sync::Arc::new(cc::backend(config).unwrap()));
    let device = backend.get_device(0).unwrap();
    let x = input("x", &[1.0, 2.0]);
    x.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: weights")
        .unwrap();
    let y = result("y", 2);
    let code = backend
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let before = device.used_memory();
    let r = Context::new(&device.new_stream().unwrap())
        .link(&code)
        .unwrap();
    assert!(device.used_memory() - before >= 16);
    r.run().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-1.0, -2.0]);
}

/// `use_host_memory` with host writes made by a task of the reading stream itself: the write
/// does not wait for the routine scheduled after it on the same stream (which cannot run before
/// the task ends), and that routine sees the write.
#[test]
fn lowered_backend__use_host_memory_host_write_inside_a_task() {
    let backend = arrayjit::backend("multicore_cc").unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let x = input("x", &[1.0, 2.0]);
    x.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Volatile),
        "test: fed by the host",
    )
    .unwrap();
    let y = result("y", 2);
    let code = backend
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    let x2 = x.clone();
    stream
        .schedule_task(move || x2.host().set_values(&[5.0, 6.0]))
        .unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    assert_eq!(y.host().get_values().unwrap(), vec![-5.0, -6.0]);
}

/// `use_host_memory` under load: two streams read one in-place host array while the host
/// rewrites it 200 times; every run sees exactly the version written before it was scheduled,
/// whole (no run sees half of one version and half of the next).
#[test]
fn lowered_backend__use_host_memory_under_concurrent_streams() {
    let backend = arrayjit::backend("multicore_cc").unwrap();
    let device = backend.get_device(0).unwrap();
    let n = 1 << 16;
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.host().set_values_with(|_| 0.0).unwrap();
    x.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Volatile),
        "test: fed by the host",
    )
    .unwrap();
    let (y1, y2) = (result("y1", n), result("y2", n));
    let copy = |y: &Tnode, name: &str| {
        backend
            .compile(CompileRequest::routine(
                name,
                &Assignments::pointwise_unop(y, UnOp::Identity, &x),
            ))
            .unwrap()
    };
    let r1 = Context::new(&device.new_stream().unwrap())
        .link(&copy(&y1, "copy1"))
        .unwrap();
    let r2 = Context::new(&device.new_stream().unwrap())
        .link(&copy(&y2, "copy2"))
        .unwrap();
    for k in 1..=200 {
        x.host().set_values_with(|_| k as f64).unwrap();
        r1.run().unwrap();
        r2.run().unwrap();
        if k % 20 == 0 {
            for y in [&y1, &y2] {
                let v = y.host().get_values().unwrap();
                assert!(
                    v.iter().all(|&e| e == k as f64),
                    "version {k}: {:?}",
                    &v[..4]
                );
            }
        }
    }
}

/// `ocannl-lowered-backend-missing.txt`, `to_host` with an offset and a partial size: elements of a copy
/// holding the latest values reach the host array, the rest waits for the full refresh; a
/// lagging copy and a range outside the array are errors.
#[test]
fn lowered_backend__to_host_with_offset_and_partial_size() {
    // wgpu (where a Vulkan driver is) takes the trait's default: the whole buffer, then the part.
    let gpu = arrayjit_testing::backends_under_test(&["wgpu"]).unwrap();
    for name in CPU_BACKENDS.into_iter().chain(gpu.iter().map(|b| b.name())) {
        let (backend, stream) = backend_and_stream(name);
        let n = 1000;
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.host().set_values_with(|k| k as f64).unwrap();
        let y = result("y", n);
        let code = backend
            .compile(CompileRequest::routine(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
            ))
            .unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host_range(&y, 10..20).unwrap();
        // Read the host array as it is (no refresh): only elements 10..20 came over.
        let raw = y
            .host()
            .with(|nd| nd.to_vec_f64())
            .expect("to_host_range makes the host array")
            .unwrap();
        assert_eq!(raw[9], 0.0, "{name}");
        assert_eq!(
            &raw[10..20],
            &(10..20).map(|k| 2.0 * k as f64).collect::<Vec<_>>()[..]
        );
        assert_eq!(raw[20], 0.0, "{name}");
        // The full refresh is still pending: reading the values brings the rest.
        assert_eq!(y.host().get_values().unwrap()[999], 1998.0, "{name}");
        // Out of range.
        let e = routine.context().to_host_range(&y, 990..1001).unwrap_err();
        assert!(matches!(e, arrayjit::Error::IndexOutOfBounds { .. }), "{e}");
        // The host changed y: the device copy lags, so a part of it would be stale.
        y.host().set_value(&[0], 5.0).unwrap();
        assert!(routine.context().to_host_range(&y, 0..1).is_err(), "{name}");
    }
}

/// `ocannl-lowered-backend-missing.txt`, `from_host` with an offset and a partial size: after
/// `set_value`, a copy lags in that element only, and uploading that part makes it current (the
/// next run uploads nothing more and sees the change); a copy lagging wholly stays lagging.
#[test]
fn lowered_backend__from_host_with_offset_and_partial_size() {
    let gpu = arrayjit_testing::backends_under_test(&["wgpu"]).unwrap();
    for name in CPU_BACKENDS.into_iter().chain(gpu.iter().map(|b| b.name())) {
        let (backend, stream) = backend_and_stream(name);
        let n = 100;
        let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
        x.host().set_values_with(|k| k as f64).unwrap();
        x.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: data")
            .unwrap();
        let y = result("y", n);
        let code = backend
            .compile(CompileRequest::routine(
                "double",
                &Assignments::pointwise_binop(&y, BinOp::Add, &x, &x),
            ))
            .unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        let copy = routine.context().copy_id(&x).unwrap();
        assert!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copy_not_lagging(copy)
        );
        // Two elements change on the host: the copy lags there only.
        x.host().set_value(&[5], 100.0).unwrap();
        x.host().set_value(&[7], 200.0).unwrap();
        assert_eq!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copy_lagging_ranges(copy),
            Some(vec![(5, 6), (7, 8)])
        );
        routine.context().from_host_range(&x, 5..6).unwrap();
        assert!(
            !arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copy_not_lagging(copy),
            "{name}: element 7 still lags"
        );
        routine.context().from_host_range(&x, 7..8).unwrap();
        assert!(
            arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copy_not_lagging(copy),
            "{name}"
        );
        routine.run().unwrap();
        let got = y.host().get_values().unwrap();
        assert_eq!((got[5], got[6], got[7]), (200.0, 12.0, 400.0), "{name}");
        // A whole-array change: a part does not make the copy current.
        x.host().set_values_with(|_| 1.0).unwrap();
        routine.context().from_host_range(&x, 0..10).unwrap();
        assert!(
            !arrayjit::runtime::node_sync(&x)
                .unwrap()
                .copy_not_lagging(copy),
            "{name}"
        );
        routine.run().unwrap();
        assert!(
            y.host().get_values().unwrap().iter().all(|&v| v == 2.0),
            "{name}"
        );
        // Out of range.
        let e = routine.context().from_host_range(&x, 95..101).unwrap_err();
        assert!(matches!(e, arrayjit::Error::IndexOutOfBounds { .. }), "{e}");
    }
}

/// `ocannl-ir-tnode.txt`, `devices_not_lagging_host` per element range, as a routine's run
/// uses it: a copy lagging the host in a few elements (`set_value`) gets only those uploaded
/// before the run; a copy lagging in more than half of the array, or wholly, gets the whole
/// array.
#[test]
fn tnode__run_uploads_only_the_lagging_elements() {
    let (recording, lowered) = RecordingPools::new();
    let backend = Backend::from_lowered("recording", lowered);
    let n = 1000;
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.host().set_values_with(|k| k as f64).unwrap();
    x.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: data")
        .unwrap();
    let y = result("y", n);
    let code = backend
        .compile(CompileRequest::routine(
            "neg",
            &Assignments::pointwise_unop(&y, UnOp::Neg, &x),
        ))
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    let uploads = |expected: &[(usize, usize)]| {
        let got = std::mem::take(&mut *recording.uploads.lock().unwrap());
        assert_eq!(got, expected);
    };
    uploads(&[(0, 4 * n)]);
    x.host().set_value(&[10], 5.5).unwrap();
    x.host().set_value(&[11], 6.5).unwrap();
    x.host().set_value(&[900], -1.0).unwrap();
    routine.run().unwrap();
    uploads(&[(40, 8), (3600, 4)]);
    let got = y.host().get_values().unwrap();
    assert_eq!(
        (got[10], got[11], got[12], got[900]),
        (-5.5, -6.5, -12.0, 1.0)
    );
    // Nothing changed: nothing uploaded.
    routine.run().unwrap();
    uploads(&[]);
    // More than half of the array: the whole of it, once.
    for k in 0..600 {
        x.host().set_value(&[k], 1.0).unwrap();
    }
    routine.run().unwrap();
    uploads(&[(0, 4 * n)]);
    assert_eq!(y.host().get_values().unwrap()[599], -1.0);
}

/// `rune-backend-intf.txt`, `device_buffer` (a native buffer with its size and dtype) and
/// `allocate_buffer ~dtype`; `ocannl-lowered-backend-missing.txt`, `alloc_zero_init_array`:
/// buffers know the precision of their values. A context's arrays do; a launch with a buffer of
/// another precision than the kernel's array, an explicit array of another precision than its
/// node's, are errors that name both precisions; raw bytes are checked by size only.
#[test]
fn lowered_backend__buffers_know_their_precision() {
    use arrayjit::codegen::{KernelInterface, SourceKernel};
    for name in CPU_BACKENDS {
        let (backend, stream) = backend_and_stream(name);
        let lowered = backend.lowered();
        let half = lowered.runtime().alloc_array(0, Prec::F16, 8).unwrap();
        assert_eq!((half.prec(), half.size_in_bytes()), (Some(Prec::F16), 16));
        assert_eq!(lowered.runtime().alloc_zeroed(0, 16).unwrap().prec(), None);

        // A routine's arrays know their node's precision.
        let x = Tnode::new(Prec::F64, &[2], &["x"]).unwrap();
        x.host().set_values(&[1.0, -1.0]).unwrap();
        let y = Tnode::new(Prec::F16, &[2], &["y"]).unwrap();
        y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let code = backend
            .compile(CompileRequest::routine(
                "relu",
                &Assignments::pointwise_unop(&y, UnOp::Relu, &x),
            ))
            .unwrap();
        let ctx = Context::new(&stream);
        let routine = ctx.link(&code).unwrap();
        routine.run().unwrap();
        let linked = routine.context();
        assert_eq!(linked.array(&x).unwrap().prec(), Some(Prec::F64), "{name}");
        assert_eq!(linked.array(&y).unwrap().prec(), Some(Prec::F16), "{name}");
        assert_eq!(y.host().get_values().unwrap(), vec![1.0, 0.0], "{name}");

        // A kernel of f32 arrays refuses an f16 buffer of the right size, by name.
        let v = Tnode::new(Prec::F32, &[4], &["v"]).unwrap();
        let interface = KernelInterface {
            name: "zero".into(),
            symbol: "aj_test_zero".into(),
            args: vec![v.clone()],
            merge: None,
            statics: vec![],
            scratch_bytes: 0,
        };
        let source = "#include <stdint.h>\n\
            void aj_test_zero(uint8_t *const *args, const int64_t *statics, const void *w) {\n\
              (void)statics; (void)w;\n\
              float *v = (float *)args[0];\n\
              for (int i = 0; i < 4; ++i) v[i] = 0.0f;\n\
            }\n";
        // SAFETY: the kernel has the cc signature and touches its buffer's 16 bytes only.
        let batch =
            unsafe { lowered.compile_source(source, &[SourceKernel::cpu(interface.clone())]) }
                .unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        let e = unsafe { batch.launch(LaunchRequest::new(0, std::slice::from_ref(&half), &[])) }
            .unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::PrecisionMismatch { .. })
                && e.to_string().contains("argument 0 of zero")
                && e.to_string().contains("holds f16 values but f32"),
            "{e}"
        );
        let single = lowered.runtime().alloc_array(0, Prec::F32, 4).unwrap();
        // SAFETY: the test's own buffers, one call at a time.
        unsafe { batch.launch(LaunchRequest::new(0, std::slice::from_ref(&single), &[])) }.unwrap();

        // An explicit array of another precision than its node's is refused.
        let a = Tnode::new(Prec::F32, &[4], &["a"]).unwrap();
        let e = Context::with_arrays(
            &stream,
            vec![(a.clone(), half.clone())],
            arrayjit::opt::OptimizeCtx::empty(),
        )
        .unwrap_err();
        assert!(
            matches!(e, arrayjit::Error::PrecisionMismatch { .. })
                && e.to_string().contains("an explicit array of"),
            "{e}"
        );
        // Raw bytes of the right size take the node's precision.
        let raw = lowered.runtime().alloc_zeroed(0, 16).unwrap();
        let ctx = Context::with_arrays(
            &stream,
            vec![(a.clone(), raw)],
            arrayjit::opt::OptimizeCtx::empty(),
        )
        .unwrap();
        assert_eq!(ctx.array(&a).unwrap().prec(), Some(Prec::F32), "{name}");
    }
}

//! The skeleton backend of `docs/adding-a-backend.md`: a backend written outside
//! `arrayjit-backends`, from its four parts only, that runs the optimized loop code through the
//! IR interpreter over byte buffers of its own. Composed with [`LoweredBackend::compose`] and
//! wrapped by [`Backend::from_lowered`] (the registry row's job), it must pass the whole
//! conformance corpus: if a step of the guide were missing, it would fail here.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrayjit::backends::compiler::refuse_source;
use arrayjit::backends::device_info::CpuInfo;
use arrayjit::backends::{
    BackendParts, BufferHandle, CompileOptions, CompiledBatch, Compiler, DeviceBuffer, DeviceInfo,
    DeviceRuntime, Devices, LaunchRequest, LoweredBackend, PoolMemory, PoolTable, Queue,
    RenderedProgram, Renderer, check_launch,
};
use arrayjit::codegen::{KernelInterface, SourceKernel};
use arrayjit::ir::interpret::InterpEnv;
use arrayjit::ir::{Error, Ndarray, OutOfBounds, RangeUnit, Result, Tnode};
use arrayjit::opt::Optimized;
use arrayjit::runtime::Backend;

const NAME: &str = "skeleton";

/// Part 1, the devices: one, the host as the interpreter sees it.
#[derive(Debug)]
struct SkeletonDevices;

impl Devices for SkeletonDevices {
    fn check_available(&self) -> Result<()> {
        Ok(())
    }

    fn device_info(&self, device: usize) -> Result<DeviceInfo> {
        if device != 0 {
            return Err(Error::NoSuchDevice {
                backend: NAME.into(),
                ordinal: device,
                num_devices: 1,
            });
        }
        let mut info = DeviceInfo::cpu(&CpuInfo::detect(), 1);
        info.name = "the IR interpreter".into();
        Ok(info)
    }

    fn debug_info(&self) -> String {
        "skeleton backend: optimized loop code run by the IR interpreter".into()
    }
}

/// A buffer: a window onto shared bytes (a whole allocation, or a view into a pool).
#[derive(Clone, Debug)]
struct SkeletonBuffer {
    memory: Arc<Mutex<Vec<u8>>>,
    offset: usize,
    len: usize,
}

impl SkeletonBuffer {
    fn zeroed(len: usize) -> SkeletonBuffer {
        SkeletonBuffer {
            memory: Arc::new(Mutex::new(vec![0; len])),
            offset: 0,
            len,
        }
    }

    /// Bytes `offset..offset + n` of the window, in the shared memory, or a typed error.
    fn range(&self, offset: usize, n: usize) -> Result<std::ops::Range<usize>> {
        let end = OutOfBounds::range_end(offset, n, self.len, RangeUnit::Bytes)
            .map_err(|problem| Error::out_of_bounds("a skeleton buffer", problem))?;
        Ok(self.offset + offset..self.offset + end)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let range = self.range(offset, out.len())?;
        out.copy_from_slice(&self.memory.lock().unwrap()[range]);
        Ok(())
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let range = self.range(offset, bytes.len())?;
        self.memory.lock().unwrap()[range].copy_from_slice(bytes);
        Ok(())
    }
}

impl DeviceBuffer for SkeletonBuffer {
    fn size_in_bytes(&self) -> usize {
        self.len
    }

    fn device(&self) -> usize {
        0
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl PoolMemory for SkeletonBuffer {
    fn pool_bytes(&self) -> usize {
        self.len
    }

    fn view(&self, offset: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        let range = self.range(offset, size_in_bytes)?;
        Ok(Arc::new(SkeletonBuffer {
            memory: self.memory.clone(),
            offset: range.start,
            len: size_in_bytes,
        }))
    }
}

/// The buffer as this backend's, or a typed error.
fn own(buffer: &BufferHandle) -> Result<&SkeletonBuffer> {
    buffer
        .as_any()
        .downcast_ref::<SkeletonBuffer>()
        .ok_or_else(|| Error::invalid("not a skeleton buffer"))
}

/// Part 4, the runtime: byte buffers, pools through the shared `PoolTable`, no queues (work
/// finishes before the call that runs it returns).
#[derive(Debug)]
struct SkeletonRuntime {
    pools: PoolTable<SkeletonBuffer>,
    used: AtomicUsize,
}

impl DeviceRuntime for SkeletonRuntime {
    fn num_devices(&self) -> usize {
        1
    }

    fn alloc_zeroed(&self, device: usize, size_in_bytes: usize) -> Result<BufferHandle> {
        SkeletonDevices.device_info(device)?;
        self.used.fetch_add(size_in_bytes, Ordering::Relaxed);
        Ok(Arc::new(SkeletonBuffer::zeroed(size_in_bytes)))
    }

    unsafe fn copy_from_host(&self, dst: &BufferHandle, src: &[u8], _: Queue<'_>) -> Result<()> {
        let dst = own(dst)?;
        if dst.len != src.len() {
            return Err(Error::shape_mismatch(
                "copy_from_host",
                &[],
                format!("{} bytes into a buffer of {}", src.len(), dst.len),
            ));
        }
        dst.write(0, src)
    }

    unsafe fn copy_to_host(&self, src: &BufferHandle, dst: &mut [u8], _: Queue<'_>) -> Result<()> {
        let src = own(src)?;
        if src.len != dst.len() {
            return Err(Error::shape_mismatch(
                "copy_to_host",
                &[],
                format!("a buffer of {} bytes into {}", src.len, dst.len()),
            ));
        }
        src.read(0, dst)
    }

    unsafe fn copy_buffer(
        &self,
        dst: &BufferHandle,
        src: &BufferHandle,
        _: Queue<'_>,
    ) -> Result<()> {
        let mut bytes = vec![0; own(src)?.len];
        own(src)?.read(0, &mut bytes)?;
        // SAFETY: the caller's contract covers both buffers.
        unsafe { self.copy_from_host(dst, &bytes, None) }
    }

    fn used_memory(&self, _: usize) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn alloc_pool(&self, device: usize, id: usize, size: usize, alignment: usize) -> Result<()> {
        SkeletonDevices.device_info(device)?;
        self.pools
            .insert_with(device, id, size, alignment, |size, _| {
                self.used.fetch_add(size, Ordering::Relaxed);
                Ok(SkeletonBuffer::zeroed(size))
            })
    }

    fn pool_table(&self) -> Option<&dyn arrayjit::backends::Pools> {
        Some(&self.pools)
    }

    unsafe fn memset_zero(
        &self,
        device: usize,
        id: usize,
        offset: usize,
        size: usize,
    ) -> Result<()> {
        let view = self.pool_view(device, id, offset, size)?;
        own(&view)?.write(0, &vec![0; size])
    }
}

/// What the compiler makes: the routines, run by the interpreter at launch.
#[derive(Debug)]
struct SkeletonBatch {
    routines: Vec<Optimized>,
    interfaces: Vec<KernelInterface>,
    source: String,
}

/// The array of `tn` over `bytes` (its padded storage).
fn array_of(tn: &Tnode, bytes: &[u8]) -> Result<Ndarray> {
    let mut nd = match tn.padding() {
        Some(p) => Ndarray::zeros_padded(tn.prec(), tn.dims(), p.clone())?,
        None => Ndarray::zeros(tn.prec(), tn.dims())?,
    };
    let n = nd.size_in_bytes();
    nd.as_bytes_mut().copy_from_slice(&bytes[..n]);
    Ok(nd)
}

impl CompiledBatch for SkeletonBatch {
    fn kernels(&self) -> &[KernelInterface] {
        &self.interfaces
    }

    fn source(&self) -> &str {
        &self.source
    }

    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        let (Some(routine), Some(iface)) = (
            self.routines.get(request.kernel),
            self.interfaces.get(request.kernel),
        ) else {
            return Err(arrayjit::backends::no_such_kernel(
                request.kernel,
                self.routines.len(),
            ));
        };
        // Step one of every launch: the shared check against the kernel's interface.
        let buffers =
            check_launch::<SkeletonBuffer>(iface, request.buffers, request.statics, NAME)?;
        let mut env = InterpEnv::new();
        let read = |tn: &Tnode, b: &SkeletonBuffer| -> Result<Ndarray> {
            let mut bytes = vec![0; b.len];
            b.read(0, &mut bytes)?;
            array_of(tn, &bytes)
        };
        for (tn, b) in iface.args.iter().zip(&buffers) {
            env.set_array(tn, read(tn, b)?)?;
        }
        if let (Some(tn), Some(b)) = (&iface.merge, buffers.get(iface.args.len())) {
            env.set_merge(tn, read(tn, b)?)?;
        }
        // (Local nodes live in the interpreter; the scratch buffer goes unused.)
        let statics: Vec<_> = iface
            .statics
            .iter()
            .map(|s| s.symbol)
            .zip(request.statics.iter().copied())
            .collect();
        env.run(&routine.code, &statics)?;
        for (tn, b) in iface.args.iter().zip(&buffers) {
            if let Some(nd) = env.array(tn) {
                b.write(0, nd.as_bytes())?;
            }
        }
        Ok(false)
    }
}

/// Part 2, the renderer: the routines as they are (the interpreter runs their loop code),
/// listed as the loop code; it takes no source.
#[derive(Debug)]
struct SkeletonRenderer;

impl Renderer for SkeletonRenderer {
    fn render(&self, routines: &[&Optimized]) -> Result<RenderedProgram> {
        let source = routines.iter().map(|r| format!("{}\n", r.code)).collect();
        let names: Vec<&str> = routines.iter().map(|r| r.name.as_str()).collect();
        let program: Vec<Optimized> = routines.iter().map(|r| (*r).clone()).collect();
        Ok(RenderedProgram::new(NAME, names.join("+"), source, program))
    }

    unsafe fn render_given(&self, _: &str, _: &[SourceKernel]) -> Result<RenderedProgram> {
        Err(refuse_source(NAME))
    }
}

/// Part 3, the compiler: keeps the rendered routines; takes no options.
#[derive(Debug)]
struct SkeletonCompiler;

impl Compiler for SkeletonCompiler {
    fn compile(
        &self,
        program: RenderedProgram,
        options: &CompileOptions,
    ) -> Result<Arc<dyn CompiledBatch>> {
        arrayjit::backends::compiler::refuse_options_unless_default(
            NAME,
            options,
            &CompileOptions::default(),
        )?;
        let (source, routines): (String, Vec<Optimized>) = program.into_parts(NAME)?;
        let interfaces = routines
            .iter()
            .map(|r| KernelInterface::of(r, format!("skeleton_{}", r.name)))
            .collect();
        Ok(Arc::new(SkeletonBatch {
            routines,
            interfaces,
            source,
        }))
    }
}

/// The composition (what a registry row's `make` does), under the `Sync` scheduler.
fn skeleton() -> Backend {
    let lowered = LoweredBackend::compose(
        NAME,
        BackendParts {
            devices: Arc::new(SkeletonDevices),
            renderer: Arc::new(SkeletonRenderer),
            compiler: Arc::new(SkeletonCompiler),
            runtime: Arc::new(SkeletonRuntime {
                pools: PoolTable::new(NAME),
                used: AtomicUsize::new(0),
            }),
        },
    );
    Backend::from_lowered(NAME, Arc::new(lowered))
}

#[test]
fn a_backend_of_four_parts_passes_the_conformance_corpus() {
    let backend = skeleton();
    let cases = arrayjit_testing::all_cases().unwrap();
    assert!(cases.len() > 50, "the corpus has {} cases", cases.len());
    for case in &cases {
        arrayjit_testing::check_case(case, &backend)
            .unwrap_or_else(|e| panic!("case {}: {e}", case.name));
    }
}

#[test]
fn the_skeleton_refuses_what_it_does_not_do_with_typed_errors() {
    let backend = skeleton();
    let lowered = backend.lowered();
    assert_eq!(lowered.name(), NAME);
    assert!(lowered.gpu_dialect().is_none());
    // SAFETY: refused before anything runs.
    let e = unsafe { lowered.compile_source("", &[]) }.unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { ref backend, .. } if backend == NAME),
        "{e}"
    );
    let options = CompileOptions {
        flags: vec!["-O3".into()],
    };
    let program = lowered.render(&[]).unwrap();
    let e = lowered.compile_with(program, &options).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // A program another backend's renderer made is refused, typed, before anything compiles.
    let cc = arrayjit::backend("sync_cc").unwrap();
    let foreign = cc.lowered().render(&[]).unwrap();
    assert_eq!(foreign.backend(), "cc");
    let e = lowered.compile(foreign).unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { ref backend, ref what, .. }
            if backend == NAME && what.contains("cc backend's renderer")),
        "{e}"
    );
    assert!(matches!(
        lowered.device_info(1),
        Err(Error::NoSuchDevice { ordinal: 1, .. })
    ));
    // Pool bookkeeping comes from the shared table: a taken id and a missing pool are typed.
    let runtime = lowered.runtime();
    runtime.alloc_pool(0, 3, 64, 8).unwrap();
    assert!(runtime.alloc_pool(0, 3, 64, 8).is_err());
    assert_eq!(runtime.pools(0), vec![(3, 64)]);
    runtime.free_pool(0, 3).unwrap();
    assert!(runtime.free_pool(0, 3).is_err());
}

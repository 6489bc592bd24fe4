//! Routines compiled together for the `cuda` backend ([`CudaBatch`]): modules loaded per
//! device on first launch there, passes launched (or replayed as a CUDA graph) on a stream.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use arrayjit_codegen::cuda::{CudaKernel, CudaPass, CudaProgram};
use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::{KernelInterface, LaunchDims};
use arrayjit_ir::{DeviceLimit, Error, Result, trace};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::devices::Gpu;
use super::graph_driver::{OwnedExec, StreamGraphs};
use super::ptx::{self, PtxOrigin, compile_ptx_with_options};
use super::queue::{CudaQueue, PendingTiming};
use super::{CudaBuffer, NAME, aot, graphs};
use crate::compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
use crate::device_buffer::BufferHandle;
use crate::queue::Queue;

/// Routines compiled together; modules are loaded per device on first launch there.
pub struct CudaBatch {
    /// Each kernel's passes captured as a CUDA graph, per device and stream. Declared first,
    /// so dropped first: an instantiated graph refers to the modules' functions.
    graphs: graphs::GraphCache<OwnedExec>,
    gpus: Vec<Arc<Gpu>>,
    program: CudaProgram,
    interfaces: Vec<KernelInterface>,
    /// Per device: the functions of every kernel's passes.
    loaded: Mutex<HashMap<usize, Arc<Loaded>>>,
    /// Whether device 0's PTX came from the cache.
    cache_hit: bool,
    /// The NVRTC options the PTX is compiled with (for each device's architecture).
    flags: Vec<String>,
}

struct Loaded {
    _modules: Vec<Arc<CudaModule>>,
    functions: Vec<Vec<CudaFunction>>,
}

impl fmt::Debug for CudaBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        write!(f, "CudaBatch({names:?})")
    }
}

impl Drop for CudaBatch {
    fn drop(&mut self) {
        let c = self.graphs.counts();
        if c != graphs::GraphCounts::default() {
            tracing::debug!(
                "{}: CUDA graphs: {} captures, {} instantiations, {} updates in place, {} graph \
                 launches, {} plain runs",
                self.names(),
                c.captures,
                c.instantiations,
                c.updates,
                c.graph_launches,
                c.plain_runs
            );
        }
    }
}

impl CudaBatch {
    /// What the batch's CUDA graphs have done so far: captures, instantiations, updates in
    /// place, graph launches and runs launched pass by pass.
    pub fn graph_counts(&self) -> graphs::GraphCounts {
        self.graphs.counts()
    }

    /// The batch's routine names, joined by `+`.
    fn names(&self) -> String {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        names.join("+")
    }

    /// A batch of a program, compiled now for device 0 so that a compile error is the
    /// compile's, not a launch's (modules load per device on first launch there).
    pub(crate) fn compiled(
        gpus: Vec<Arc<Gpu>>,
        program: CudaProgram,
        flags: Vec<String>,
    ) -> Result<Arc<dyn CompiledBatch>> {
        let names: Vec<&str> = program
            .kernels
            .iter()
            .map(|k| k.interface.name.as_str())
            .collect();
        let name = names.join("+");
        let mut phase = trace::compile_phase("compile", &name);
        let units = aot::compile_units(
            &program,
            &gpus[0].arch,
            &flags,
            aot::units_for(&program)?,
            aot::compile_workers(),
            ptx::process_cache(),
        )?;
        let cache_hit = units.iter().all(|u| u.origin != PtxOrigin::Compiled);
        if let (Some(p), true) = (phase.as_mut(), cache_hit) {
            p.rename(format!("cache hit {name}"));
        }
        drop(phase);
        let interfaces = program
            .kernels
            .iter()
            .map(|k| k.interface.clone())
            .collect();
        Ok(Arc::new(CudaBatch {
            gpus,
            program,
            interfaces,
            loaded: Mutex::new(HashMap::new()),
            cache_hit,
            flags,
            graphs: graphs::GraphCache::default(),
        }))
    }

    fn loaded(&self, gpu: &Gpu) -> Result<Arc<Loaded>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = loaded.get(&gpu.ordinal) {
            return Ok(l.clone());
        }
        // The same units as the compile (cached), for this device's architecture.
        let split = aot::units_for(&self.program)?;
        let units = aot::compile_units(
            &self.program,
            &gpu.arch,
            &self.flags,
            split,
            aot::compile_workers(),
            ptx::process_cache(),
        )?;
        let _load = trace::compile_phase("load", &format!("{} on {}", self.names(), gpu.label()));
        gpu.bind("loading a module")?;
        let mut modules = Vec::with_capacity(units.len());
        let mut module_of: HashMap<&str, usize> = HashMap::new();
        let sources = self.program.units(split);
        for (i, unit) in units.iter().enumerate() {
            let module = match gpu
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(unit.cubin.clone()))
            {
                Ok(m) => m,
                // A driver older than NVRTC may refuse its CUBIN: the unit's PTX then, which
                // the driver compiles itself.
                Err(cubin_error) => {
                    tracing::warn!(
                        "{} on {}: the driver refused NVRTC's CUBIN ({cubin_error}); loading PTX",
                        self.names(),
                        gpu.label()
                    );
                    let source = sources.get(i).map_or("", |(src, _)| src.as_str());
                    let (ptx, _) = compile_ptx_with_options(source, &gpu.arch, &self.flags)?;
                    gpu.ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                        .map_err(|e| gpu.driver_error("loading a module", e))?
                }
            };
            modules.push(module);
            for sym in &unit.symbols {
                module_of.insert(sym.as_str(), i);
            }
        }
        let functions = self
            .program
            .kernels
            .iter()
            .map(|k| {
                k.passes
                    .iter()
                    .map(|p| {
                        let module = module_of
                            .get(p.symbol.as_str())
                            .and_then(|&i| modules.get(i))
                            .ok_or_else(|| {
                                Error::invalid(format!(
                                    "kernel {} is in no compiled unit of {}",
                                    p.symbol,
                                    self.names()
                                ))
                            })?;
                        let f = module
                            .load_function(&p.symbol)
                            .map_err(|e| gpu.driver_error("loading a kernel", e))?;
                        allow_dynamic_shared(gpu, &f, p)?;
                        Ok(f)
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let l = Arc::new(Loaded {
            _modules: modules,
            functions,
        });
        loaded.insert(gpu.ordinal, l.clone());
        Ok(l)
    }

    fn launch_passes(
        &self,
        gpu: &Gpu,
        kernel: &CudaKernel,
        passes: &[(LaunchDims, &CudaPass, &CudaFunction)],
        buffers: &[&CudaBuffer],
        statics: &[i64],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let action = format!("launching {}", kernel.interface.name);
        gpu.bind(&action)?;
        let ptrs: Vec<u64> = buffers.iter().map(|b| b.device_ptr()).collect();
        // Only the locals that may read their initial zeros (the plan says how many bytes).
        if kernel.interface.scratch_bytes > 0
            && let Some(scratch) = buffers.last()
        {
            for &(offset, len) in &kernel.scratch_zeroed {
                scratch.view(offset, len)?.zero_on(gpu, stream, len)?;
            }
        }
        for (dims, pass, f) in passes {
            // Each pass takes the buffers (at byte offsets: a local's slice of the scratch)
            // and static indices its code uses (positions within the interface's, made when
            // the kernel was rendered).
            let args: Vec<u64> = pass
                .args
                .iter()
                .filter_map(|&(b, offset)| ptrs.get(b).map(|p| p + offset as u64))
                .collect();
            let maps = super::tensor_maps::encode(gpu, pass, &args)?;
            let mut builder = stream.launch_builder(f);
            for p in &args {
                builder.arg(p);
            }
            for s in pass.statics.iter().filter_map(|&j| statics.get(j)) {
                builder.arg(s);
            }
            for m in &maps {
                builder.arg(m);
            }
            let config = LaunchConfig {
                grid_dim: (dims.grid[0], dims.grid[1], dims.grid[2]),
                block_dim: (dims.block[0], dims.block[1], dims.block[2]),
                shared_mem_bytes: pass.dynamic_shared_bytes as u32,
            };
            // SAFETY: the kernel was rendered for exactly these parameters (checked against
            // its interface: one buffer of at least the needed size per pointer, statics in
            // range), and the runtime orders work touching a buffer.
            unsafe { builder.launch(config) }.map_err(|e| gpu.driver_error(&action, e))?;
        }
        Ok(())
    }
}

impl CompiledBatch for CudaBatch {
    fn kernels(&self) -> &[KernelInterface] {
        &self.interfaces
    }

    fn source(&self) -> &str {
        &self.program.source
    }

    fn cache_hit(&self) -> Option<bool> {
        Some(self.cache_hit)
    }

    /// A timed launch records CUDA events on the stream before and after the launch's passes:
    /// the sink gets the device time once both are done (when the stream is next waited for).
    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        let LaunchRequest {
            kernel,
            buffers,
            statics,
            queue,
            dims,
            timer,
        } = request;
        let timed = timer.is_some();
        let dims_now = match dims {
            Some(at) => Some(self.launch_now(kernel, buffers, at)?),
            None => None,
        };
        // SAFETY: this method's contract; a launch chosen now is within the device's limits.
        unsafe { self.run_kernel(kernel, buffers, statics, queue, dims_now, timer) }?;
        Ok(timed)
    }
}

impl CudaBatch {
    /// The launch of hand-written kernel `index` chosen now (see [`CompiledBatch::launch`]),
    /// checked against its device's limits; an error for a kernel rendered from a routine.
    fn launch_now(&self, index: usize, args: &[BufferHandle], at: LaunchAt) -> Result<LaunchDims> {
        let Some(kernel) = self.program.kernels.get(index) else {
            return Err(crate::launch_check::no_such_kernel(
                index,
                self.interfaces.len(),
            ));
        };
        let name = &kernel.interface.name;
        if !matches!(kernel.passes.as_slice(), [p] if matches!(p.shape, PassShape::Given(_))) {
            return Err(crate::launch_check::launch_dims_not_taken(NAME, name));
        }
        let device = args
            .first()
            .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
            .map_or(0, |b| b.device_ordinal());
        let info = &self
            .gpus
            .get(device)
            .ok_or_else(|| Error::NoSuchDevice {
                backend: NAME.into(),
                ordinal: device,
                num_devices: self.gpus.len(),
            })?
            .info;
        let block = at.local.unwrap_or_else(|| {
            LaunchDims::default_block(at.global, 256, info.max_local_invocations)
        });
        let dims = LaunchDims::covering(at.global, block)?;
        dims.check_within(
            name,
            info.max_local_size,
            u64::from(info.max_local_invocations),
        )?;
        Ok(dims)
    }

    /// Checks a launch and enqueues kernel `index` (on `queue`, or on the device's default
    /// stream, waited for), with its passes' launches or, for a hand-written kernel, `dims_now`.
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn run_kernel(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        queue: Queue<'_>,
        dims_now: Option<LaunchDims>,
        timer: Option<DeviceTimeSink>,
    ) -> Result<()> {
        let (kernel, iface) = match (self.program.kernels.get(index), self.interfaces.get(index)) {
            (Some(k), Some(i)) => (k, i),
            _ => {
                return Err(crate::launch_check::no_such_kernel(
                    index,
                    self.interfaces.len(),
                ));
            }
        };
        let buffers = crate::launch_check::check_launch::<CudaBuffer>(iface, args, statics, NAME)?;
        let device = buffers.first().map_or(0, |b| b.device_ordinal());
        if let Some(b) = buffers.iter().find(|b| b.device_ordinal() != device) {
            return Err(Error::invalid(format!(
                "{} gets buffers of devices {device} and {}; copy them to one device first",
                iface.name,
                b.device_ordinal()
            )));
        }
        let gpu = self.gpus.get(device).ok_or_else(|| Error::NoSuchDevice {
            backend: NAME.into(),
            ordinal: device,
            num_devices: self.gpus.len(),
        })?;
        let loaded = self.loaded(gpu)?;
        // Each pass with its launch (a hand-written kernel's one pass may take it now).
        let passes: Vec<(LaunchDims, &CudaPass, &CudaFunction)> = kernel
            .passes
            .iter()
            .zip(&loaded.functions[index])
            .map(|(p, f)| (dims_now.unwrap_or_else(|| p.launch()), p, f))
            .collect();
        match queue.and_then(|q| q.as_any().downcast_ref::<CudaQueue>()) {
            Some(q) if q.gpu.ordinal == device => {
                let start = match &timer {
                    Some(_) => Some(PendingTiming::start(gpu, &q.stream)?),
                    None => None,
                };
                // The graph is kept for these exact arguments and launches.
                let mut key: Vec<u64> = buffers.iter().map(|b| b.device_ptr()).collect();
                key.extend(statics.iter().map(|&s| s as u64));
                for (d, ..) in &passes {
                    key.extend(d.grid.iter().chain(&d.block).map(|&x| u64::from(x)));
                }
                {
                    // No free or context-wide wait while this stream captures, and nobody
                    // waits for this stream meanwhile (the graphs module's rules).
                    let _capturing = gpu.capture_gate.read().unwrap_or_else(|p| p.into_inner());
                    let _stream = q.lock_for_capture();
                    let slot = (index, gpu.ordinal, Arc::as_ptr(&q.stream) as usize);
                    let driver = StreamGraphs {
                        gpu,
                        stream: &q.stream,
                    };
                    self.graphs.run(slot, &driver, key, || {
                        self.launch_passes(gpu, kernel, &passes, &buffers, statics, &q.stream)
                    })?;
                }
                if let (Some(start), Some(sink)) = (start, timer) {
                    q.add_timing(PendingTiming::finish(gpu, &q.stream, start, sink)?);
                }
                Ok(())
            }
            _ => {
                let stream = &gpu.default_stream;
                let start = match &timer {
                    Some(_) => Some(PendingTiming::start(gpu, stream)?),
                    None => None,
                };
                self.launch_passes(gpu, kernel, &passes, &buffers, statics, stream)?;
                let timing = match (start, timer) {
                    (Some(start), Some(sink)) => {
                        Some(PendingTiming::finish(gpu, stream, start, sink)?)
                    }
                    _ => None,
                };
                stream
                    .synchronize()
                    .map_err(|e| gpu.driver_error(&format!("running {}", iface.name), e))?;
                if let Some(t) = timing {
                    t.report();
                }
                Ok(())
            }
        }
    }
}

/// Allows a pass's function the dynamic shared memory its launches take, where it takes more
/// than a block may declare statically; a typed limit where the device has less (a kernel
/// planned for another device).
fn allow_dynamic_shared(gpu: &Gpu, f: &CudaFunction, pass: &CudaPass) -> Result<()> {
    let bytes = pass.dynamic_shared_bytes;
    if bytes == 0 {
        return Ok(());
    }
    let allowed = gpu
        .info
        .max_opt_in_shared_bytes
        .max(gpu.info.max_shared_bytes);
    if bytes > allowed {
        return Err(Error::LimitExceeded {
            device: gpu.label(),
            what: format!("kernel {}", pass.symbol),
            limit: DeviceLimit::SharedBytes,
            needed: bytes as u64,
            allowed: allowed as u64,
            advice: "compile the routine for this device (its plan chose shared memory for \
                     another one)"
                .into(),
        });
    }
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        i32::try_from(bytes).unwrap_or(i32::MAX),
    )
    .map_err(|e| gpu.driver_error("allowing a kernel its dynamic shared memory", e))
}

//! Routines compiled together for the `wgpu` backend ([`WgpuBatch`]): a launch records one
//! compute pass per pass of the kernel and submits them to the device's queue.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use arrayjit_codegen::gpu_kernel::PassShape;
use arrayjit_codegen::wgsl::WgslKernel;
use arrayjit_codegen::{KernelInterface, LaunchDims};
use arrayjit_ir::{DeviceLimit, Error, Result};

use super::NAME;
use super::buffers::{self, WgpuBuffer};
use super::devices::Gpu;
use super::timestamps;
use crate::compiled_batch::{CompiledBatch, DeviceTimeSink, LaunchAt, LaunchRequest};
use crate::device_buffer::BufferHandle;

/// One compiled routine: its passes' pipelines.
pub(crate) struct Kernel {
    pub(crate) rendered: WgslKernel,
    pub(crate) pipelines: Vec<wgpu::ComputePipeline>,
    /// How many static indices its launches bind.
    pub(crate) statics: usize,
}

/// The device buffers one kernel keeps of its own: its local nodes' (by binding) and its
/// static indices'.
struct KernelBuffers {
    locals: HashMap<u32, WgpuBuffer>,
    statics: Option<WgpuBuffer>,
}

/// Routines compiled together.
pub struct WgpuBatch {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) interfaces: Vec<KernelInterface>,
    pub(crate) kernels: Vec<Kernel>,
    pub(crate) source: String,
    /// The device's memory counter, which the kernels' own buffers count in.
    pub(crate) used: Arc<AtomicUsize>,
    /// The kernels' own buffers, made at the first link (or launch), in kernel order.
    buffers: Mutex<Option<Arc<Vec<KernelBuffers>>>>,
}

impl WgpuBatch {
    /// A batch of `kernels` (with their `interfaces`) for `gpu`, whose buffers count in
    /// `used`; it allocates nothing until linked.
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        interfaces: Vec<KernelInterface>,
        kernels: Vec<Kernel>,
        source: String,
        used: Arc<AtomicUsize>,
    ) -> WgpuBatch {
        WgpuBatch {
            gpu,
            interfaces,
            kernels,
            source,
            used,
            buffers: Mutex::new(None),
        }
    }

    /// The kernels' own buffers, made on first use: each local node's, and the static
    /// indices' where a kernel binds any. A failed allocation makes none (and a later call
    /// tries again).
    fn kernel_buffers(&self) -> Result<Arc<Vec<KernelBuffers>>> {
        let mut made = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = made.as_ref() {
            return Ok(b.clone());
        }
        let buffers = self
            .kernels
            .iter()
            .map(|k| {
                let locals = k
                    .rendered
                    .locals
                    .iter()
                    .map(|(tn, b)| {
                        Ok((
                            *b,
                            buffers::allocate(&self.gpu, &self.used, tn.size_in_bytes())?,
                        ))
                    })
                    .collect::<Result<HashMap<_, _>>>()?;
                let statics = match k.rendered.statics_binding {
                    Some(_) => Some(buffers::allocate(&self.gpu, &self.used, 4 * k.statics)?),
                    None => None,
                };
                Ok(KernelBuffers { locals, statics })
            })
            .collect::<Result<Vec<_>>>()?;
        let buffers = Arc::new(buffers);
        *made = Some(buffers.clone());
        Ok(buffers)
    }
}

impl fmt::Debug for WgpuBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.interfaces.iter().map(|k| k.name.as_str()).collect();
        write!(f, "WgpuBatch({names:?})")
    }
}

impl CompiledBatch for WgpuBatch {
    /// Allocates each kernel's local nodes and static indices, once.
    fn link(&self) -> Result<()> {
        self.kernel_buffers().map(|_| ())
    }

    fn kernels(&self) -> &[KernelInterface] {
        &self.interfaces
    }

    fn source(&self) -> &str {
        &self.source
    }

    /// The device has one queue: every launch goes on it, in order (the request's queue is
    /// not needed). A timed launch reads timestamps the device writes around its passes.
    unsafe fn launch(&self, request: LaunchRequest<'_>) -> Result<bool> {
        let LaunchRequest {
            kernel,
            buffers,
            statics,
            dims,
            timer,
            ..
        } = request;
        let grid_now = match dims {
            Some(at) => Some(self.launch_now(kernel, at)?),
            None => None,
        };
        // SAFETY: this method's contract.
        unsafe { self.run_kernel(kernel, buffers, statics, grid_now, timer) }
    }
}

impl WgpuBatch {
    /// The workgroups of hand-written kernel `index` launched over `at` now (see
    /// [`CompiledBatch::launch`]): its block must be the shader's `@workgroup_size`; an error
    /// for a kernel rendered from a routine or a grid past the device's limits.
    fn launch_now(&self, index: usize, at: LaunchAt) -> Result<[u32; 3]> {
        let LaunchAt { global, local } = at;
        let Some(k) = self.kernels.get(index) else {
            return Err(crate::launch_check::no_such_kernel(
                index,
                self.kernels.len(),
            ));
        };
        let name = &self.interfaces[index].name;
        // A hand-written shader's block is its @workgroup_size (checked at compile_source).
        let workgroup = match k.rendered.passes.as_slice() {
            [pass] => match pass.shape {
                PassShape::Given(given) => given.block,
                _ => [0; 3],
            },
            _ => [0; 3],
        };
        if workgroup == [0; 3] {
            return Err(crate::launch_check::launch_dims_not_taken(NAME, name));
        }
        let block = local.unwrap_or(workgroup);
        if block != workgroup {
            return Err(Error::shape_mismatch(
                format!("launching {name}"),
                &[&block.map(|d| d as usize), &workgroup.map(|d| d as usize)],
                "the block (first) must be the shader's @workgroup_size (second); give that block, \
                 or none",
            ));
        }
        let dims = LaunchDims::covering(global, block)?;
        if let Some(axis) = (0..3).find(|&a| dims.grid[a] > self.gpu.max_groups) {
            return Err(Error::limit_exceeded(
                self.gpu.label(),
                format!("kernel {name}, launched over {global:?} threads,"),
                DeviceLimit::GridExtent(axis),
                u64::from(dims.grid[axis]),
                u64::from(self.gpu.max_groups),
                "launch larger blocks or cover the work in several launches",
            ));
        }
        Ok(dims.grid)
    }

    /// Checks a launch and submits kernel `index`'s passes, dispatched as they say or, for a
    /// hand-written kernel, as `grid_now` workgroups.
    ///
    /// # Safety
    /// As [`CompiledBatch::launch`].
    unsafe fn run_kernel(
        &self,
        index: usize,
        args: &[BufferHandle],
        statics: &[i64],
        grid_now: Option<[u32; 3]>,
        timer: Option<DeviceTimeSink>,
    ) -> Result<bool> {
        let (k, iface) = match (self.kernels.get(index), self.interfaces.get(index)) {
            (Some(k), Some(i)) => (k, i),
            _ => {
                return Err(crate::launch_check::no_such_kernel(
                    index,
                    self.kernels.len(),
                ));
            }
        };
        let buffers = crate::launch_check::check_launch::<WgpuBuffer>(iface, args, statics, NAME)?;
        let mut bound: HashMap<u32, &WgpuBuffer> = (0u32..).zip(buffers).collect();
        let mut words = Vec::with_capacity(statics.len());
        for (s, &v) in iface.statics.iter().zip(statics) {
            let v = i32::try_from(v).map_err(|_| Error::StaticIndex {
                symbol: s.name.clone(),
                detail: format!("value {v} is beyond what a WGSL index holds"),
            })?;
            words.extend_from_slice(&v.to_le_bytes());
        }
        let own = self.kernel_buffers()?;
        let own = own
            .get(index)
            .ok_or_else(|| crate::launch_check::no_such_kernel(index, self.kernels.len()))?;
        for (b, buf) in &own.locals {
            bound.insert(*b, buf);
        }
        if let (Some(b), Some(buf)) = (k.rendered.statics_binding, &own.statics) {
            self.gpu
                .queue
                .write_buffer(&buf.buffer, buf.offset as u64, &words);
            bound.insert(b, buf);
        }
        let gpu = &self.gpu;
        gpu.scoped(&format!("running {}", iface.name), || {
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            // Timestamps at the start of the first pass and the end of the last.
            let timing = match (timer, gpu.timestamp_period) {
                (Some(sink), Some(period)) if !k.rendered.passes.is_empty() => {
                    Some((timestamps::Timing::new(&gpu.device), sink, period))
                }
                _ => None,
            };
            let last = k.rendered.passes.len().saturating_sub(1);
            for (i, (pass, pipeline)) in k.rendered.passes.iter().zip(&k.pipelines).enumerate() {
                let layout = pipeline.get_bind_group_layout(0);
                let entries = pass
                    .bindings
                    .iter()
                    .map(|b| {
                        let buf = bound.get(b).ok_or_else(|| {
                            Error::invalid(format!("binding {b} of {} has no buffer", iface.name))
                        })?;
                        Ok(wgpu::BindGroupEntry {
                            binding: *b,
                            resource: buf.binding(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &layout,
                    entries: &entries,
                });
                let [x, y, z] = grid_now.unwrap_or_else(|| pass.dispatch(gpu.max_groups));
                let mut cpass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: timing
                        .as_ref()
                        .and_then(|(t, _, _)| t.writes(i == 0, i == last)),
                });
                cpass.set_pipeline(pipeline);
                cpass.set_bind_group(0, &group, &[]);
                cpass.dispatch_workgroups(x, y, z);
            }
            if let Some((t, _, _)) = &timing {
                t.resolve(&mut encoder);
            }
            gpu.queue.submit([encoder.finish()]);
            Ok(match timing {
                Some((t, sink, period)) => {
                    t.report(period, sink);
                    true
                }
                None => false,
            })
        })
    }
}

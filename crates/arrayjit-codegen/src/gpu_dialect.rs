//! The device strings of the GPU dialects, as data (the reference's
//! `Device_info.renderer_float4_str`, `renderer_smem_prefix` and `renderer_barrier_str`): the
//! CUDA and WGSL renderers print shared-memory declarations and barriers from a [`GpuDialect`]
//! rather than from literals of their own, and a backend says which dialect its devices run
//! (`LoweredBackend::gpu_dialect` in `arrayjit-backends`). Also what both GPU renderers read
//! from a routine's schedules: the GPU pass of a statement and the rest of a grid pass's nest.

use arrayjit_ir::{Error, LowLevel, Result};
use arrayjit_opt::schedule::gpu::{GridLoop, grid_loops};
use arrayjit_opt::schedule::{GpuPass, Schedule, ScheduleKind};

/// How a dialect declares an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArraySyntax {
    /// C-like: `<prefix><type> <name>[<len>];`.
    C,
    /// WGSL: `<prefix><name>: array<<type>, <len>>;`.
    Wgsl,
}

/// The strings a GPU dialect's kernels are printed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuDialect {
    /// The dialect's name, e.g. `"CUDA"`.
    pub name: &'static str,
    /// The four-float vector type, if the dialect has one (`renderer_float4_str`).
    pub float4: Option<&'static str>,
    /// What starts a declaration in memory shared by a block (`renderer_smem_prefix`).
    pub smem_prefix: &'static str,
    /// The statement that waits for every thread of the block (`renderer_barrier_str`).
    pub barrier: &'static str,
    /// How arrays are declared.
    pub array_syntax: ArraySyntax,
    /// The width of the subgroups (warps) whose lanes the dialect's kernels exchange values
    /// between by shuffles, if they do.
    pub subgroup: Option<u32>,
}

impl GpuDialect {
    /// The declaration of `name`, an array of `len` values of type `ty` in shared memory.
    pub fn shared_array(&self, ty: &str, name: &str, len: &str) -> String {
        match self.array_syntax {
            ArraySyntax::C => format!("{}{ty} {name}[{len}];", self.smem_prefix),
            ArraySyntax::Wgsl => format!("{}{name}: array<{ty}, {len}>;", self.smem_prefix),
        }
    }
}

/// CUDA C (NVRTC, and `cuda_emu` on the CPU).
pub const CUDA: GpuDialect = GpuDialect {
    name: "CUDA",
    float4: Some("float4"),
    smem_prefix: "__shared__ ",
    barrier: "__syncthreads();",
    array_syntax: ArraySyntax::C,
    subgroup: Some(32),
};

/// WGSL (wgpu).
pub const WGSL: GpuDialect = GpuDialect {
    name: "WGSL",
    float4: Some("vec4<f32>"),
    smem_prefix: "var<workgroup> ",
    barrier: "workgroupBarrier();",
    array_syntax: ArraySyntax::Wgsl,
    subgroup: None,
};

/// The GPU pass a statement's schedule records, or an error saying the routine was not
/// scheduled for a device that runs groups of invocations.
pub(crate) fn gpu_pass<'a>(
    routine: &str,
    language: &str,
    sched: Option<&'a Schedule>,
) -> Result<&'a GpuPass> {
    match sched {
        Some(Schedule {
            kind: ScheduleKind::Gpu(pass),
            ..
        }) => Ok(pass),
        other => Err(Error::Render {
            routine: routine.to_string(),
            language: language.into(),
            detail: format!(
                "a statement is scheduled as {}, not as a GPU pass: optimize the routine with the \
                 device's schedule settings (`OptimizeSettings::for_gpu`, or the backend's \
                 `schedule_settings()`)",
                other.map_or_else(|| "nothing".to_string(), ToString::to_string)
            ),
        }),
    }
}

/// The rest of a grid pass's nest: the statement under its grid loops, which must be the
/// loops the schedule recorded.
pub(crate) fn grid_inner<'a>(
    routine: &str,
    language: &str,
    stmt: &'a LowLevel,
    grid: &[GridLoop],
) -> Result<std::borrow::Cow<'a, LowLevel>> {
    let (loops, inner) = grid_loops(stmt);
    if loops != grid {
        return Err(Error::Render {
            routine: routine.to_string(),
            language: language.into(),
            detail: "a grid pass's loops are not the statement's independent loops".into(),
        });
    }
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_arrays_are_declared_in_each_dialects_syntax() {
        assert_eq!(
            CUDA.shared_array("float", "aj_t", "256"),
            "__shared__ float aj_t[256];"
        );
        assert_eq!(
            WGSL.shared_array("f32", "aj_t", "256"),
            "var<workgroup> aj_t: array<f32, 256>;"
        );
    }
}

//! The CUDA kernels of a program as C++ for the host compiler, with an emulation of the CUDA
//! execution model (`cuda_emulation.hpp`: blocks, threads, `__shared__` memory, barriers and
//! warp shuffles on fibers). The `cuda_emu` backend runs them on the CPU, so the CUDA renderer's
//! kernels — the same source NVRTC compiles, but for its first lines — are checked against the
//! interpreter on machines without a GPU.
//!
//! Each routine gets one exported entry point, named by its interface's symbol, that zeroes the
//! scratch buffer and launches the passes in order with their launch dimensions, as the `cuda`
//! backend does on a stream:
//!
//! ```c
//! int entry(void *const *buffers, const long long *statics);  /* 0, or -1: no memory for fibers */
//! ```

use std::fmt::Write as _;

use arrayjit_ir::{Error, Result};
use arrayjit_opt::Optimized;

use crate::c::syntax::CSyntax;
use crate::cuda::{CudaProgram, render_with};
use crate::gpu_kernel::PassShape;
use crate::kernel::SourceKernel;
use crate::kernel::check_symbol;

/// The emulation of the CUDA execution model every emulated program starts with.
pub const EMULATION_HEADER: &str = include_str!("cuda_emulation.hpp");

/// The block limits the emulation keeps to, those of CUDA devices: at most this many threads
/// per block.
pub const EMULATED_MAX_THREADS: u32 = 1024;
/// Largest block per dimension (x, y, z), as on CUDA devices.
pub const EMULATED_MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// Static `__shared__` memory a kernel may declare per block, as on CUDA devices (48 KiB).
pub const EMULATED_SHARED_BYTES: usize = 48 * 1024;
/// Shared memory a kernel may use where it opts in to dynamic shared memory, and a unit's, as
/// on sm_90 (227 and 228 KiB), so that the deeper pipelines of devices that have it run here.
pub const EMULATED_OPT_IN_SHARED_BYTES: usize = 227 * 1024;
/// See [`EMULATED_OPT_IN_SHARED_BYTES`].
pub const EMULATED_SHARED_BYTES_PER_UNIT: usize = 228 * 1024;
/// Threads per warp: warp shuffles exchange within runs of this many threads.
pub const EMULATED_WARP_SIZE: usize = 32;

/// The suffix of the entry point of a hand-written kernel that takes its launch at call time:
/// `int <symbol>__aj_dims(void *const *buffers, const long long *statics, const unsigned
/// dims[6])`, grid then block.
pub const DIMS_SUFFIX: &str = "__aj_dims";

/// The host compiler flags emulated programs need besides `-shared -fPIC`: C++, and no
/// floating-point contraction the IR did not ask for (NVRTC runs with `--fmad=false`).
pub const EMULATION_FLAGS: &[&str] = &["-x", "c++", "-std=c++17", "-O1", "-ffp-contract=off"];

/// The CUDA dialect compiled by the host's C++ compiler under the emulation header.
fn emulated_syntax() -> CSyntax {
    CSyntax {
        includes: vec![EMULATION_HEADER.to_string()],
        ..CSyntax::cuda()
    }
}

/// Whether a pass of this shape synchronizes the threads of a block.
fn uses_barriers(shape: &PassShape) -> bool {
    matches!(
        shape,
        PassShape::Tiles(_)
            | PassShape::Rows(_)
            | PassShape::Reduction
            | PassShape::Joined { barriers: true, .. }
    )
}

/// Renders routines as one C++ file: the CUDA kernels, then one entry point per routine (see
/// the module documentation). `kernels` are those of the CUDA program, in the routines' order.
pub fn render_cuda_emulated(routines: &[&Optimized]) -> Result<CudaProgram> {
    let mut program = render_with(&emulated_syntax(), routines)?;
    let mut launchers = String::from(
        "\n/* Entry points: the passes of each routine, in order. A pass's pointer argument is \
         a buffer at a byte offset, converted to the parameter's type. */\n\
         struct aj_arg {\n  unsigned char *p;\n  template <class T> operator T *() const { return (T *)p; }\n};\n",
    );
    for k in &program.kernels {
        let statics = k.interface.statics.len();
        // One thunk per pass (passes may share a function): named after the pass's position.
        for (pos, p) in k.passes.iter().enumerate() {
            // The buffers and static indices the pass takes, by their positions.
            let mut args: Vec<String> = p
                .args
                .iter()
                .filter(|&&(i, _)| i < k.buffer_types.len())
                .map(|&(i, offset)| format!("aj_arg{{(unsigned char *)aj_b[{i}] + {offset}}}"))
                .collect();
            args.extend(
                p.statics
                    .iter()
                    .filter(|&&j| j < statics)
                    .map(|j| format!("aj_s[{j}]")),
            );
            // Tensor maps: the emulation's own struct, filled from the factor's address.
            for m in &p.tensor_maps {
                let &(b, offset) = p.args.get(m.arg).ok_or_else(|| Error::Render {
                    routine: k.interface.name.clone(),
                    language: "emulated CUDA".into(),
                    detail: format!("{}'s tensor map names a pointer it does not take", p.symbol),
                })?;
                let list = |v: Vec<usize>| {
                    v.iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let eb = m.shape.element_bytes;
                args.push(format!(
                    "aj_tensor_map{{(const unsigned char *)aj_b[{b}] + {offset}, {eb}u, {}u, {}u, \
                     {{{}}}, {{{}}}, {{{}}}}}",
                    m.shape.axes.len(),
                    m.shape.swizzle_bytes,
                    list(m.shape.axes.iter().map(|a| a.extent).collect()),
                    list(m.shape.axes.iter().map(|a| a.stride * eb).collect()),
                    list(m.shape.axes.iter().map(|a| a.boxed).collect()),
                ));
            }
            let _ = writeln!(
                launchers,
                "static void {0}_t{pos}(void *const *aj_b, const long long *aj_s) {{\n  \
                 (void)aj_b; (void)aj_s;\n  {1}({2});\n}}",
                k.interface.symbol,
                p.symbol,
                args.join(", ")
            );
        }
        let _ = writeln!(
            launchers,
            "extern \"C\" int {}(void *const *aj_b, const long long *aj_s) {{",
            k.interface.symbol
        );
        if k.interface.scratch_bytes > 0 {
            // As on the device, only the ranges that may read their zeros are zeroed; the rest
            // is filled with NaNs first, so a local read before it is written shows up in the
            // results (the differential corpus compares them) instead of reading old zeros.
            let scratch = k.buffer_types.len() - 1;
            let _ = writeln!(
                launchers,
                "  memset(aj_b[{scratch}], 0xff, {});",
                k.interface.scratch_bytes
            );
            for &(offset, len) in &k.scratch_zeroed {
                let _ = writeln!(
                    launchers,
                    "  memset((unsigned char *)aj_b[{scratch}] + {offset}, 0, {len});"
                );
            }
        }
        for (pos, p) in k.passes.iter().enumerate() {
            let (blocks, threads) = p.launch_dims();
            let _ = writeln!(
                launchers,
                "  {{ const int aj_st = aj_launch({}_t{pos}, aj_b, aj_s, {blocks}u, {threads}u, {}); \
                 if (aj_st) return aj_st; }}",
                k.interface.symbol,
                i32::from(uses_barriers(&p.shape))
            );
        }
        launchers.push_str("  return 0;\n}\n");
    }
    program.source.push_str(&launchers);
    Ok(program)
}

/// Hand-written CUDA kernels as one C++ file for the host compiler: the emulation header, the
/// source with each kernel renamed (`<symbol>__aj_kernel`), then one exported entry point per
/// kernel, named by its symbol, that zeroes the scratch buffer and launches the kernel with its
/// [`LaunchDims`](crate::kernel::LaunchDims) (as fibers: hand-written code may synchronize), and a
/// second one, `<symbol>`[`DIMS_SUFFIX`], taking the launch at call time. Each
/// pointer parameter of a kernel takes the next buffer of its interface, each integer parameter
/// the next static index. The source must not include CUDA headers: the emulation header
/// provides the built-ins (`threadIdx`, `blockIdx`, `blockDim`, `gridDim`, `__syncthreads`,
/// `__shfl_down_sync`, `__shared__`).
pub fn emulated_source(source: &str, kernels: &[SourceKernel]) -> Result<String> {
    let mut out = format!("{EMULATION_HEADER}\n");
    for k in kernels {
        check_symbol(&k.interface.symbol)?;
        k.launch
            .check(&k.interface.name, u64::from(EMULATED_MAX_THREADS))?;
        let _ = writeln!(out, "#define {0} {0}__aj_kernel", k.interface.symbol);
    }
    out.push_str("#line 1 \"kernel source\"\n");
    out.push_str(source);
    out.push_str("\n/* Entry points: each kernel launched with its dimensions. */\n");
    for k in kernels {
        let sym = &k.interface.symbol;
        let [gx, gy, gz] = k.launch.grid;
        let [bx, by, bz] = k.launch.block;
        let buffers = k.interface.buffer_sizes().len();
        let _ = writeln!(
            out,
            "#undef {sym}\n\
             static void {sym}__aj_thunk(void *const *aj_b, const long long *aj_s) {{\n  \
             aj_call_source({sym}__aj_kernel, aj_b, aj_s);\n}}\n\
             extern \"C\" int {sym}(void *const *aj_b, const long long *aj_s) {{"
        );
        let zero_scratch = if k.interface.scratch_bytes > 0 {
            format!(
                "  memset(aj_b[{}], 0, {});\n",
                buffers - 1,
                k.interface.scratch_bytes
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{zero_scratch}  aj_dim3 aj_grid = {{{gx}u, {gy}u, {gz}u}}, aj_block = {{{bx}u, {by}u, {bz}u}};\n  \
             return aj_launch_dims({sym}__aj_thunk, aj_b, aj_s, aj_grid, aj_block, 1);\n}}"
        );
        // The same kernel with its launch chosen by the caller: grid, then block, in `aj_d`.
        let _ = writeln!(
            out,
            "extern \"C\" int {sym}{DIMS_SUFFIX}(void *const *aj_b, const long long *aj_s, \
             const unsigned *aj_d) {{\n{zero_scratch}  \
             aj_dim3 aj_grid = {{aj_d[0], aj_d[1], aj_d[2]}}, aj_block = {{aj_d[3], aj_d[4], aj_d[5]}};\n  \
             return aj_launch_dims({sym}__aj_thunk, aj_b, aj_s, aj_grid, aj_block, 1);\n}}"
        );
    }
    Ok(out)
}

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

use arrayjit_ir::{Optimized, Result};

use crate::CSyntax;
use crate::cuda::{CudaProgram, render_with};
use crate::wgsl::PassShape;

/// The emulation of the CUDA execution model every emulated program starts with.
pub const EMULATION_HEADER: &str = include_str!("cuda_emulation.hpp");

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
        PassShape::Tiles(_) | PassShape::Rows(_) | PassShape::Reduction
    )
}

/// Renders routines as one C++ file: the CUDA kernels, then one entry point per routine (see
/// the module documentation). `kernels` are those of the CUDA program, in the routines' order.
pub fn render_cuda_emulated(routines: &[&Optimized]) -> Result<CudaProgram> {
    let mut program = render_with(&emulated_syntax(), routines)?;
    let mut launchers =
        String::from("\n/* Entry points: the passes of each routine, in order. */\n");
    for k in &program.kernels {
        let statics = k.interface.statics.len();
        for p in &k.passes {
            let mut args: Vec<String> = k
                .buffer_types
                .iter()
                .enumerate()
                .map(|(i, t)| format!("({t})aj_b[{i}]"))
                .collect();
            args.extend((0..statics).map(|i| format!("aj_s[{i}]")));
            let _ = writeln!(
                launchers,
                "static void {0}_thunk(void *const *aj_b, const long long *aj_s) {{\n  \
                 (void)aj_b; (void)aj_s;\n  {0}({1});\n}}",
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
            let _ = writeln!(
                launchers,
                "  memset(aj_b[{}], 0, {});",
                k.buffer_types.len() - 1,
                k.interface.scratch_bytes
            );
        }
        for p in &k.passes {
            let (blocks, threads) = p.launch_dims();
            let _ = writeln!(
                launchers,
                "  if (aj_launch({}_thunk, aj_b, aj_s, {blocks}u, {threads}u, {})) return -1;",
                p.symbol,
                i32::from(uses_barriers(&p.shape))
            );
        }
        launchers.push_str("  return 0;\n}\n");
    }
    program.source.push_str(&launchers);
    Ok(program)
}

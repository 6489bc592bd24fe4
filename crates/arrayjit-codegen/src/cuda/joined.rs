//! A joined launch in CUDA C ([`arrayjit_opt::schedule::gpu::join`]): one `__global__`
//! function whose blocks are numbered across its parts, each block running the part its number
//! falls in.
//!
//! Each part is its statement's pass printed as it would be alone, with its parameters named
//! after the part (`p0_b0`, `p1_s0`, ...) and inside a scope that defines what the pass's body
//! reads: `aj_grp` (the block's number within the part) and `aj_g` (`aj_grp` times the
//! launch's block size plus `aj_t`). Parts' shared arrays are declared once, at the top, at
//! the largest size a part asks for: blocks run one part each, so parts may use the same
//! memory. A part returns only from its own blocks, and a part with barriers takes whole
//! blocks of the launch's size, so every barrier is reached by its whole block.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use arrayjit_ir::{Error, LowLevel, Result};
use arrayjit_opt::schedule::gpu::JoinedLaunch;

use super::statement::RoutineContext;
use super::{CudaPass, SharedArrays};
use crate::c::syntax::Helper;
use crate::gpu_dialect::CUDA as DIALECT;
use crate::gpu_kernel::PassShape;

/// A joined launch printed: its function's text (named [`crate::cuda`]'s placeholder) and
/// its pass, whose symbol the caller sets.
pub(crate) struct JoinedFunction {
    pub(crate) text: String,
    pub(crate) pass: CudaPass,
}

fn render_err(cx: &RoutineContext<'_>, detail: String) -> Error {
    Error::Render {
        routine: cx.r.name.clone(),
        language: "CUDA C".into(),
        detail,
    }
}

/// Blocks a part of this shape takes in a launch of `threads` per block, and whether it
/// synchronizes its blocks; an error for a shape that cannot be a part, or a part with
/// barriers whose block size is not the launch's.
fn part_blocks(shape: &PassShape, own: u32, threads: u32) -> Option<(u64, bool)> {
    let t = u64::from(threads.max(1));
    match shape {
        PassShape::Grid(n) | PassShape::Zero(n) => Some((n.div_ceil(t).max(1), false)),
        PassShape::Single => Some((1, false)),
        PassShape::Rows(n) if own == threads => Some(((*n).max(1), true)),
        PassShape::Reduction if own == threads => Some((1, true)),
        _ => None,
    }
}

/// The function of a joined launch of `stmts` (the routine's top-level statements).
pub(crate) fn render_joined(
    cx: &RoutineContext<'_>,
    stmts: &[&LowLevel],
    join: &JoinedLaunch,
    helpers: &mut BTreeSet<Helper>,
) -> Result<JoinedFunction> {
    let threads = join.threads.max(1);
    let mut shared = SharedArrays::new();
    let mut signature = Vec::new();
    let mut static_params = Vec::new();
    let mut args = Vec::new();
    let mut statics = Vec::new();
    let mut parts = String::new();
    let mut first_block = 0u64;
    let mut barriers = false;
    for (p, &i) in join.statements.iter().enumerate() {
        let stmt = stmts.get(i).ok_or_else(|| {
            render_err(
                cx,
                format!("a joined launch names statement {i}, past the routine's end"),
            )
        })?;
        let part = cx.render_statement(i, stmt, helpers, &format!("p{p}_"), Some(&mut shared))?;
        // Products, the only passes with dynamic shared memory, never join.
        let [
            super::statement::RenderedKernel {
                shape,
                threads: own,
                body,
                dynamic_shared_bytes: 0,
                ..
            },
        ] = part.kernels.as_slice()
        else {
            return Err(render_err(
                cx,
                format!(
                    "statement {i} of a joined launch prints {} kernels, not one without \
                     dynamic shared memory",
                    part.kernels.len()
                ),
            ));
        };
        let (blocks, synchronizes) = part_blocks(shape, *own, threads).ok_or_else(|| {
            render_err(
                cx,
                format!(
                    "statement {i}'s pass ({shape:?}, blocks of {own}) cannot run in a joined \
                     launch of blocks of {threads}"
                ),
            )
        })?;
        barriers |= synchronizes;
        let end = first_block + blocks;
        let _ = writeln!(
            parts,
            "  {}if (aj_launch_grp < {end}LL) {{\n  const long long aj_grp = aj_launch_grp - \
             {first_block}LL;\n  const long long aj_g = aj_grp * {threads} + aj_t;\n  (void)aj_g; \
             (void)aj_grp;\n{body}  }}",
            if p == 0 { "" } else { "else " },
        );
        first_block = end;
        signature.extend(part.buffer_params);
        static_params.extend(part.static_params);
        args.extend(part.args);
        statics.extend(part.statics);
    }
    // Buffers first, then static indices: the order every launcher passes them in.
    signature.extend(static_params);
    if first_block > u64::from(u32::MAX >> 1) {
        return Err(render_err(
            cx,
            format!("a joined launch of {first_block} blocks, more than a launch holds"),
        ));
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "/* {} */\n{} void __launch_bounds__({threads}) {}({}) {{\n  const long long \
         aj_launch_grp = blockIdx.x;\n  const int aj_t = threadIdx.x;\n  (void)aj_t;",
        join.why,
        cx.syntax.kernel_prefix,
        super::SYMBOL_PLACEHOLDER,
        signature.join(", ")
    );
    for (name, (ty, len)) in &shared {
        let _ = writeln!(
            text,
            "  {}",
            DIALECT.shared_array(ty, name, &len.to_string())
        );
    }
    text.push_str(&parts);
    text.push_str("}\n");
    Ok(JoinedFunction {
        text,
        pass: CudaPass {
            symbol: String::new(),
            shape: PassShape::Joined {
                groups: first_block,
                barriers,
            },
            threads,
            why: join.why.clone(),
            args,
            statics,
            dynamic_shared_bytes: 0,
            tensor_maps: Vec::new(),
        },
    })
}

//! The CUDA C renderer: the C family's statement and expression rendering (the CUDA dialect of
//! [`CSyntax`]) inside the GPU passes the optimizer recorded as the routine's schedules
//! ([`arrayjit_ir::schedule::gpu`], the same ones the WGSL renderer follows): one `__global__`
//! function per top-level statement of a routine, launched in order on one stream, with the
//! block size and tile of its schedule.
//!
//! - **Zeroing**: one thread per element.
//! - **Tiled product**: `tile × tile` results per block of 16 × 16 threads (`tile / 16`
//!   squared per thread, strided by 16 so that neighbouring threads touch neighbouring
//!   addresses), staging 16-deep tiles of both factors in shared memory (the left one padded
//!   against bank conflicts); each element sums its `k` in the loop's order, so the bits are
//!   those of the loop nest (NVRTC runs with `--fmad=false`: no contraction the IR did not ask
//!   for).
//! - **Grid**: the loops whose iterations are independent become one thread each; the rest of
//!   the nest runs in the thread, in program order.
//! - **Rows**: one block per grid point: its reductions run as block reductions (below), its
//!   independent loops stride over the threads, anything else runs on thread 0, with a barrier
//!   between statements.
//! - **Block reduction**: strided shares, combined in a fixed tree order in shared memory, the
//!   last five levels by warp shuffles in the same order (blocks of at least 64 threads).
//! - **One thread**: anything else, with its reason.
//!
//! A routine optimized without GPU schedules (for a CPU) is a render error that says so.
//!
//! Every kernel takes the interface's buffers in order as typed pointers (arrays, merge
//! buffer, then the scratch buffer holding the routine's local nodes), then the static indices
//! as `long long` values — kernel parameters by value, never a host pointer. The scratch is
//! zeroed before the first pass (a local starts at zero, as on the CPU).
//!
//! NVRTC compiles without the standard headers: the file starts with the fixed-width integer
//! types and the float constants the C family's helpers use.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::schedule::Schedule;
use arrayjit_ir::schedule::gpu::{
    Accumulation, GpuPass, GridLoop, Rest, RowItem, RowRole, TILE_THREADS, row_items,
};
use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{Error, LowLevel, Optimized, Result, TernOp, Tnode};

use crate::c_renderer::{KernelInterface, KernelRenderer, node_name};
use crate::c_syntax::{self, CSyntax, Helper, c_compute_type, c_storage_type};
use crate::gpu_dialect::{CUDA as DIALECT, gpu_pass, grid_inner};
use crate::wgsl::PassShape;

/// Threads per warp: every NVIDIA GPU's.
const WARP: u32 = 32;

/// Lines every CUDA file starts with: NVRTC has no standard headers.
const PRELUDE: &str = "typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 4294967295U
#define UINT64_MAX 18446744073709551615ULL
#define INT8_C(x) x
#define INT16_C(x) x
#define INT32_C(x) x
#define INT64_C(x) x##LL
#define UINT8_C(x) x
#define UINT16_C(x) x##U
#define UINT32_C(x) x##U
#define UINT64_C(x) x##ULL
#define NAN __int_as_float(0x7fc00000)
#define INFINITY __int_as_float(0x7f800000)";

impl CSyntax {
    /// CUDA C for NVRTC.
    pub fn cuda() -> CSyntax {
        CSyntax {
            includes: vec![PRELUDE.to_string()],
            kernel_prefix: "extern \"C\" __global__".into(),
            helper_prefix: "static __device__ __forceinline__".into(),
            restrict: "__restrict__".into(),
            outlined_prefix: "static __device__".into(),
            optimize_pragmas: false,
        }
    }
}

/// One `__global__` function of a routine and how to launch it.
#[derive(Clone, Debug)]
pub struct CudaPass {
    /// Its symbol.
    pub symbol: String,
    /// How it covers its statement.
    pub shape: PassShape,
    /// Threads per block (1 for a single-thread pass; a hand-written kernel's are in its
    /// shape).
    pub threads: u32,
    /// Why this shape.
    pub why: String,
}

impl CudaPass {
    /// Blocks and threads per block of its launch, in x (see [`CudaPass::launch`]).
    pub fn launch_dims(&self) -> (u32, u32) {
        let t = self.threads.max(1);
        match self.shape {
            PassShape::Single => (1, 1),
            PassShape::Reduction => (1, t),
            PassShape::Tiles(blocks) | PassShape::Rows(blocks) => (blocks.max(1) as u32, t),
            PassShape::Grid(n) | PassShape::Zero(n) => (n.div_ceil(t as u64).max(1) as u32, t),
            PassShape::Given(d) => (d.grid[0], d.block[0]),
        }
    }

    /// Its launch in three dimensions: [`CudaPass::launch_dims`] in x for rendered passes, a
    /// hand-written kernel's as given.
    pub fn launch(&self) -> crate::LaunchDims {
        match self.shape {
            PassShape::Given(d) => d,
            _ => {
                let (blocks, threads) = self.launch_dims();
                crate::LaunchDims::linear(blocks, threads)
            }
        }
    }
}

/// A routine rendered as CUDA kernels.
#[derive(Clone, Debug)]
pub struct CudaKernel {
    /// How to call it (the scratch buffer holds every local node).
    pub interface: KernelInterface,
    /// The passes, launched in order.
    pub passes: Vec<CudaPass>,
    /// The C type of each buffer parameter of every pass, in the interface's order (arrays,
    /// merge buffer, scratch), e.g. `const float *`.
    pub buffer_types: Vec<String>,
}

/// Routines rendered into one CUDA C file.
#[derive(Clone, Debug)]
pub struct CudaProgram {
    /// The source for NVRTC.
    pub source: String,
    /// The kernels, in the order of the routines given.
    pub kernels: Vec<CudaKernel>,
}

/// Renders routines into one CUDA C file.
pub fn render_cuda(routines: &[&Optimized]) -> Result<CudaProgram> {
    render_with(&CSyntax::cuda(), routines)
}

/// Renders routines into one file in a CUDA dialect (`syntax.includes` opens the file).
pub(crate) fn render_with(syntax: &CSyntax, routines: &[&Optimized]) -> Result<CudaProgram> {
    let mut helpers = BTreeSet::new();
    let mut bodies = String::new();
    let mut kernels = Vec::new();
    for (index, r) in routines.iter().enumerate() {
        let stem = format!("aj{index}_{}", sanitize_identifier(&r.name));
        kernels.push(render_routine(r, &stem, syntax, &mut helpers, &mut bodies)?);
    }
    let mut source = String::from("/* Generated by arrayjit. */\n");
    for inc in &syntax.includes {
        let _ = writeln!(source, "{inc}");
    }
    source.push('\n');
    for h in &helpers {
        let _ = writeln!(source, "{}\n", c_syntax::helper_definition(*h, syntax));
    }
    source.push_str(&bodies);
    Ok(CudaProgram { source, kernels })
}

fn render_err(routine: &str, detail: String) -> Error {
    Error::Render {
        routine: routine.to_string(),
        language: "CUDA C".into(),
        detail,
    }
}

fn render_routine(
    r: &Optimized,
    stem: &str,
    syntax: &CSyntax,
    helpers: &mut BTreeSet<Helper>,
    out: &mut String,
) -> Result<CudaKernel> {
    let mut interface = KernelInterface::of(r, stem.to_string());
    // Every local node lives in the scratch buffer, 16-byte aligned.
    let mut locals = Vec::new();
    let mut scratch = 0usize;
    for n in r.nodes.iter().filter(|n| n.used && n.tn.is_local()) {
        locals.push((n.tn.clone(), scratch));
        scratch += n.tn.size_in_bytes().div_ceil(16) * 16;
    }
    interface.scratch_bytes = scratch;
    // Parameters and the prologue binding names, shared by every pass.
    let mut params = Vec::new();
    let mut buffer_types = Vec::new();
    let mut nodes: HashMap<Tnode, String> = HashMap::new();
    for (pos, tn) in interface.args.iter().enumerate() {
        let name = node_name(tn, pos);
        buffer_types.push(format!("{} *", c_storage_type(tn.prec())));
        params.push(format!("{}{} {name}", buffer_types[pos], syntax.restrict));
        nodes.insert(tn.clone(), name);
    }
    let merge = interface.merge.clone().map(|m| {
        let name = format!("merge_{}", node_name(&m, interface.args.len()));
        buffer_types.push(format!("const {} *", c_storage_type(m.prec())));
        params.push(format!(
            "{}{} {name}",
            buffer_types.last().map_or("", String::as_str),
            syntax.restrict
        ));
        (m, name)
    });
    let mut prologue = String::new();
    if scratch > 0 {
        buffer_types.push("unsigned char *".into());
        params.push(format!("unsigned char *{} aj_scratch", syntax.restrict));
        for (pos, (tn, offset)) in locals.iter().enumerate() {
            let name = format!("{}_l{pos}", node_name(tn, interface.args.len() + 1));
            let t = c_storage_type(tn.prec());
            let _ = writeln!(
                prologue,
                "  {t} *const {name} = ({t} *)(aj_scratch + {offset});"
            );
            nodes.insert(tn.clone(), name);
        }
    }
    let mut symbols = HashMap::new();
    for (pos, s) in r.bindings.iter().enumerate() {
        params.push(format!("const long long s{pos}"));
        symbols.insert(s.symbol, format!("s{pos}"));
    }
    let signature = params.join(", ");
    let stmts: Vec<&LowLevel> = match &r.code {
        LowLevel::Seq(items) => items.iter().collect(),
        s => vec![s],
    };
    let mut passes = Vec::new();
    for (i, stmt) in stmts.into_iter().enumerate() {
        let mut k = KernelRenderer {
            helpers: &mut *helpers,
            nodes: nodes.clone(),
            merge: merge.clone(),
            symbols: symbols.clone(),
            loop_counter: 0,
            locals: HashMap::new(),
            local_counter: 0,
            routine: r.name.clone(),
        };
        let Some((shape, threads, why, body)) =
            render_pass(&mut k, stmt.unwrapped(), r.schedules.get(i))?
        else {
            continue;
        };
        let symbol = format!("{stem}_p{}", passes.len());
        let bounds = if shape == PassShape::Single {
            String::new()
        } else {
            format!("__launch_bounds__({threads}) ")
        };
        let _ = writeln!(
            out,
            "/* {why} */\n{} void {bounds}{symbol}({signature}) {{\n  const long long aj_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n  (void)aj_g;\n{prologue}{body}}}\n",
            syntax.kernel_prefix
        );
        passes.push(CudaPass {
            symbol,
            shape,
            threads,
            why,
        });
    }
    Ok(CudaKernel {
        interface,
        passes,
        buffer_types,
    })
}

/// The shape, threads per block, reason and body of the pass of one top-level statement, by
/// its schedule (`None`: it does nothing).
fn render_pass(
    k: &mut KernelRenderer<'_>,
    stmt: &LowLevel,
    sched: Option<&Schedule>,
) -> Result<Option<(PassShape, u32, String, String)>> {
    let mut body = String::new();
    let pass = gpu_pass(&k.routine, "CUDA C", sched)?;
    let why = sched.map(|s| s.why.clone()).unwrap_or_default();
    let shape = match pass {
        GpuPass::Nothing => return Ok(None),
        GpuPass::Zero { elements, threads } => {
            let LowLevel::ZeroOut(tn) = stmt else {
                return Err(render_err(
                    &k.routine,
                    "a zeroing pass for another statement".into(),
                ));
            };
            let name = k.node(tn)?.to_string();
            let _ = writeln!(body, "  if (aj_g < {elements}) {name}[aj_g] = 0;");
            (PassShape::Zero(*elements), *threads)
        }
        GpuPass::Tiles {
            gemm, fused, tile, ..
        } => {
            let blocks = tiled(k, gemm, *fused, *tile, &mut body)?;
            (PassShape::Tiles(blocks), TILE_THREADS)
        }
        GpuPass::Grid {
            grid,
            total,
            threads,
        } => {
            let inner = grid_inner(&k.routine, "CUDA C", stmt, grid)?;
            let _ = writeln!(
                body,
                "  if (aj_g >= {total}LL) return;\n  long long aj_r = aj_g;"
            );
            bind_grid(k, grid, &mut body);
            k.stmt(&inner, 1, &mut body)?;
            (PassShape::Grid(*total), *threads)
        }
        GpuPass::Rows {
            grid,
            total,
            threads,
        } => {
            let inner = grid_inner(&k.routine, "CUDA C", stmt, grid)?;
            // One block per grid point: exactly `total` blocks, so every thread of a block
            // reaches every barrier.
            let _ = writeln!(body, "  long long aj_r = blockIdx.x;");
            bind_grid(k, grid, &mut body);
            rows(k, &row_items(&inner), *threads, &mut body)?;
            (PassShape::Rows(*total), *threads)
        }
        GpuPass::Reduction { threads } => {
            let acc = Accumulation::detect(stmt).ok_or_else(|| {
                render_err(
                    &k.routine,
                    "a reduction pass for a statement that is not one".into(),
                )
            })?;
            block_reduction(k, &acc, *threads, &mut body)?;
            (PassShape::Reduction, *threads)
        }
        GpuPass::Single => {
            let _ = writeln!(body, "  if (aj_g != 0) return;");
            k.stmt(stmt, 1, &mut body)?;
            (PassShape::Single, 1)
        }
    };
    Ok(Some((shape.0, shape.1, why, body)))
}

/// Binds the grid loops' iterators to the digits of `aj_r` (innermost fastest).
fn bind_grid(k: &mut KernelRenderer<'_>, grid: &[GridLoop], out: &mut String) {
    for (
        pos,
        GridLoop {
            iter: index,
            from,
            to,
        },
    ) in grid.iter().enumerate().rev()
    {
        let name = format!("g{pos}");
        let _ = writeln!(
            out,
            "  const long long {name} = {from} + aj_r % {ext};\n  aj_r /= {ext};",
            ext = to - from
        );
        k.symbols.insert(*index, name);
    }
}

/// The statements of one grid point, run by the whole block in order with a barrier after
/// each (later statements read what earlier ones stored; `__syncthreads` makes the block's
/// global writes visible to the block): reductions as block reductions, independent loops
/// strided over the threads, anything else on thread 0.
fn rows(
    k: &mut KernelRenderer<'_>,
    items: &[RowItem<'_>],
    threads: u32,
    out: &mut String,
) -> Result<()> {
    for (pos, item) in items.iter().enumerate() {
        out.push_str("  {\n");
        match &item.role {
            RowRole::Reduce(r) => block_reduction(k, r, threads, out)?,
            RowRole::Strided {
                index,
                from,
                to,
                body,
            } => {
                let i = format!("aj_j{pos}");
                let _ = writeln!(
                    out,
                    "  for (long long {i} = {from} + threadIdx.x; {i} < {to}; {i} += {threads}) {{"
                );
                k.symbols.insert(*index, i);
                k.stmt(body, 2, out)?;
                k.symbols.remove(index);
                out.push_str("  }\n");
            }
            RowRole::Lead => {
                out.push_str("  if (threadIdx.x == 0) {\n");
                k.stmt(item.stmt, 2, out)?;
                out.push_str("  }\n");
            }
        }
        let _ = writeln!(out, "  }}\n  {}", DIALECT.barrier);
    }
    Ok(())
}

/// `acc ⊕ v(i)` (or `fma(a, b, acc)`) of an accumulation, in the element's compute precision.
fn accumulated(
    k: &mut KernelRenderer<'_>,
    r: &Accumulation<'_>,
    acc: &str,
    prelude: &mut String,
) -> Result<String> {
    let p = r.tn.prec();
    let cp = p.compute_prec();
    Ok(match r.rest {
        Rest::One(v) => {
            let v = k.expr(v, p, 2, prelude)?;
            c_syntax::render_binop(r.combine, cp, acc, &v, k.helpers)
        }
        Rest::Product(a, b) => {
            let a = k.expr(a, p, 2, prelude)?;
            let b = k.expr(b, p, 2, prelude)?;
            c_syntax::render_ternop(TernOp::Fma, cp, &a, &b, acc)
        }
    })
}

/// One block of `threads` (a power of two, at least two warps) reduces the loop: strided
/// shares in order, then a fixed tree in shared memory, its last levels by warp shuffles.
fn block_reduction(
    k: &mut KernelRenderer<'_>,
    r: &Accumulation<'_>,
    threads: u32,
    out: &mut String,
) -> Result<()> {
    let p = r.tn.prec();
    let cp = p.compute_prec();
    let t = c_compute_type(cp);
    let name = k.node(r.tn)?.to_string();
    let offset = k.offset(r.tn, r.idcs)?;
    let neutral = c_syntax::literal(cp, r.combine.neutral_element());
    k.symbols.insert(r.iter, "aj_i".into());
    let mut prelude = String::new();
    let part = accumulated(k, r, "aj_acc", &mut prelude)?;
    k.symbols.remove(&r.iter);
    let tree = c_syntax::render_binop(
        r.combine,
        cp,
        "aj_red[threadIdx.x]",
        "aj_red[threadIdx.x + aj_s]",
        k.helpers,
    );
    // The last five levels of the tree within the first warp, by shuffles: lane `l` combines
    // its value with lane `l + s`'s, as the shared-memory levels combine slots `l` and `l + s`,
    // so the order (and the bits) are those of the whole tree. The shuffled value is held in a
    // variable first: every lane must run the shuffle, whatever the combination evaluates.
    let warp = c_syntax::render_binop(r.combine, cp, "aj_v", "aj_o", k.helpers);
    let current = c_syntax::load(&format!("{name}[{offset}]"), p, cp, k.helpers);
    let last = c_syntax::render_binop(r.combine, cp, &current, "aj_v", k.helpers);
    let store = c_syntax::store(&last, p, k.helpers);
    let _ = write!(
        out,
        "  {shared_red}\n  {t} aj_acc = {neutral};\n  \
         for (long long aj_i = {from} + threadIdx.x; aj_i < {to}; aj_i += {threads}) {{\n{prelude}    \
         aj_acc = {part};\n  }}\n  aj_red[threadIdx.x] = aj_acc;\n  {barrier}\n  \
         for (unsigned aj_s = {half}; aj_s >= {WARP}; aj_s /= 2) {{\n    \
         if (threadIdx.x < aj_s) aj_red[threadIdx.x] = {tree};\n    {barrier}\n  }}\n  \
         if (threadIdx.x < {WARP}) {{\n    {t} aj_v = aj_red[threadIdx.x];\n    \
         for (unsigned aj_s = {half_warp}; aj_s > 0; aj_s /= 2) {{\n      \
         const {t} aj_o = __shfl_down_sync(0xffffffffu, aj_v, aj_s);\n      aj_v = {warp};\n    }}\n    \
         if (threadIdx.x == 0) {name}[{offset}] = {store};\n  }}\n",
        shared_red = DIALECT.shared_array(t, "aj_red", &threads.to_string()),
        barrier = DIALECT.barrier,
        from = r.from,
        to = r.to,
        half = threads / 2,
        half_warp = WARP / 2,
    );
    Ok(())
}

/// The tiled product; returns the number of blocks.
fn tiled(
    k: &mut KernelRenderer<'_>,
    g: &arrayjit_ir::schedule::Gemm,
    fused: bool,
    t: usize,
    out: &mut String,
) -> Result<u64> {
    let c = k.node(&g.out)?.to_string();
    let a = k.node(&g.lhs)?.to_string();
    let b = k.node(&g.rhs)?.to_string();
    let (m, n, kk) = (g.m.extent, g.n.extent, g.k.extent);
    // `t × t` results per block of 16 × 16 threads (`t / 16` × `t / 16` each, strided by 16):
    // the schedule's tile (see `arrayjit_ir::schedule::gpu`).
    let r = t / 16;
    let (tiles_m, tiles_n) = (m.div_ceil(t), n.div_ceil(t));
    let batch: usize = g.batch.iter().map(|d| d.extent).product();
    let blocks = (tiles_m * tiles_n * batch) as u64;
    if blocks > u32::MAX as u64 {
        return Err(render_err(
            &k.routine,
            format!("a product of {blocks} tiles is more than one launch holds"),
        ));
    }
    let _ = writeln!(
        out,
        "  {}\n  {}\n  \
         const long long aj_grp = blockIdx.x;\n  const long long aj_tn = aj_grp % {tiles_n};\n  \
         const long long aj_tm = (aj_grp / {tiles_n}) % {tiles_m};\n  long long aj_bt = aj_grp / {};",
        DIALECT.shared_array("float", "aj_ta", &format!("{t} * 17")),
        DIALECT.shared_array("float", "aj_tb", &format!("16 * {t}")),
        tiles_n * tiles_m
    );
    let mut offsets = [String::from("0"), String::from("0"), String::from("0")];
    for (d, dim) in g.batch.iter().enumerate().rev() {
        let _ = writeln!(
            out,
            "  const long long aj_b{d} = aj_bt % {e};\n  aj_bt /= {e};",
            e = dim.extent
        );
        for (o, stride) in offsets.iter_mut().zip(dim.strides) {
            if stride != 0 {
                o.push_str(&format!(" + aj_b{d} * {stride}LL"));
            }
        }
    }
    let [oc, oa, ob] = &offsets;
    let update = if fused {
        "aj_acc[aj_i][aj_j] = fmaf(aj_x[aj_i], aj_y[aj_j], aj_acc[aj_i][aj_j]);"
    } else {
        "aj_acc[aj_i][aj_j] = __fadd_rn(aj_acc[aj_i][aj_j], __fmul_rn(aj_x[aj_i], aj_y[aj_j]));"
    };
    let _ = write!(
        out,
        "  const int aj_tx = threadIdx.x % 16, aj_ty = threadIdx.x / 16;\n  \
         float aj_acc[{r}][{r}];\n  \
         #pragma unroll\n  for (int aj_i = 0; aj_i < {r}; ++aj_i)\n    #pragma unroll\n    for (int aj_j = 0; aj_j < {r}; ++aj_j) {{\n      \
         const long long aj_row = aj_tm * {t} + aj_ty + 16 * aj_i, aj_col = aj_tn * {t} + aj_tx + 16 * aj_j;\n      \
         aj_acc[aj_i][aj_j] = (aj_row < {m} && aj_col < {n}) ? {c}[{oc} + aj_row * {rsc}LL + aj_col * {csc}LL] : 0.0f;\n    }}\n  \
         for (long long aj_k0 = 0; aj_k0 < {kk}; aj_k0 += 16) {{\n    \
         #pragma unroll\n    for (int aj_q = 0; aj_q < {r}; ++aj_q) {{\n      \
         const int aj_e = threadIdx.x + {TILE_THREADS} * aj_q;\n      \
         const long long aj_ar = aj_tm * {t} + aj_e / 16, aj_ak = aj_k0 + aj_e % 16;\n      \
         aj_ta[(aj_e / 16) * 17 + aj_e % 16] = (aj_ar < {m} && aj_ak < {kk}) ? {a}[{oa} + aj_ar * {rsa}LL + aj_ak * {csa}LL] : 0.0f;\n      \
         const long long aj_bk = aj_k0 + aj_e / {t}, aj_bc = aj_tn * {t} + aj_e % {t};\n      \
         aj_tb[aj_e] = (aj_bk < {kk} && aj_bc < {n}) ? {b}[{ob} + aj_bk * {rsb}LL + aj_bc * {csb}LL] : 0.0f;\n    }}\n    \
         {barrier}\n    const int aj_kn = ({kk} - aj_k0) < 16 ? (int)({kk} - aj_k0) : 16;\n    \
         for (int aj_kk = 0; aj_kk < aj_kn; ++aj_kk) {{\n      float aj_x[{r}], aj_y[{r}];\n      \
         #pragma unroll\n      for (int aj_i = 0; aj_i < {r}; ++aj_i) aj_x[aj_i] = aj_ta[(aj_ty + 16 * aj_i) * 17 + aj_kk];\n      \
         #pragma unroll\n      for (int aj_j = 0; aj_j < {r}; ++aj_j) aj_y[aj_j] = aj_tb[aj_kk * {t} + aj_tx + 16 * aj_j];\n      \
         #pragma unroll\n      for (int aj_i = 0; aj_i < {r}; ++aj_i)\n        #pragma unroll\n        for (int aj_j = 0; aj_j < {r}; ++aj_j) {update}\n    }}\n    \
         {barrier}\n  }}\n  \
         #pragma unroll\n  for (int aj_i = 0; aj_i < {r}; ++aj_i)\n    #pragma unroll\n    for (int aj_j = 0; aj_j < {r}; ++aj_j) {{\n      \
         const long long aj_row = aj_tm * {t} + aj_ty + 16 * aj_i, aj_col = aj_tn * {t} + aj_tx + 16 * aj_j;\n      \
         if (aj_row < {m} && aj_col < {n}) {c}[{oc} + aj_row * {rsc}LL + aj_col * {csc}LL] = aj_acc[aj_i][aj_j];\n    }}\n",
        rsc = g.m.strides[0],
        csc = g.n.strides[0],
        rsa = g.m.strides[1],
        csa = g.k.strides[1],
        rsb = g.k.strides[2],
        csb = g.n.strides[2],
        barrier = DIALECT.barrier,
    );
    Ok(blocks)
}

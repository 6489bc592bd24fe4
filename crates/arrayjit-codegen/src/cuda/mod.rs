//! The CUDA C renderer: the C family's statement and expression rendering (the CUDA dialect of
//! [`CSyntax`]) inside the GPU passes the optimizer recorded as the routine's schedules
//! ([`arrayjit_opt::schedule::gpu`], the same ones the WGSL renderer follows): one `__global__`
//! function per top-level statement of a routine, launched in order on one stream, with the
//! block size and tile of its schedule.
//!
//! The passes' bodies are the kernel trees of [`crate::gpu_kernel`] (written once for every
//! GPU dialect) printed in CUDA C: `long long` positions, `int` counters, `#pragma unroll` on
//! the tiled product's register loops, `__syncthreads` for every barrier, and the last five
//! levels of a block reduction by warp shuffles. NVRTC runs with `--fmad=false`: no
//! contraction the IR did not ask for.
//!
//! Passes the plan joins ([`arrayjit_opt::schedule::gpu::join`]) are one `__global__` function
//! whose blocks are numbered across the parts (`joined`): each part's body as it would be
//! alone, its parameters named after the part (`p0_b0`, `p1_s0`).
//!
//! A routine optimized without GPU schedules (for a CPU) is a render error that says so.
//!
//! Every kernel takes, as typed pointers, the arrays its code uses (in the interface's order),
//! the merge buffer if it reads it, and the slice of the scratch buffer of each local node it
//! uses, then the static indices it uses as `long long` values — kernel parameters by value,
//! never a host pointer; [`CudaPass::args`] and [`CudaPass::statics`] say which. Parameters are
//! named by position (`b0`, `b1`, ...), so passes running the same statement over other arrays
//! of the same shapes (a model's layers) print the same function, which the program holds once.
//! The scratch is zeroed before the first pass (a local starts at zero, as on the CPU).
//!
//! NVRTC compiles without the standard headers: the file starts with the fixed-width integer
//! types and the float constants the C family's helpers use.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{
    AxisIndex, BinOp, Error, LowLevel, Prec, Result, ScalarExpr, Symbol, TernOp, Tnode,
};
use arrayjit_opt::Optimized;
use arrayjit_opt::schedule::Schedule;
use arrayjit_opt::schedule::gpu::tensor_map::TensorMapShape;
use arrayjit_opt::schedule::gpu::{JoinedLaunch, MatrixKind, TILE_GROUPS_PER_UNIT};

use crate::c::kernel::KernelRenderer;
use crate::c::syntax::{self as c_syntax, CSyntax, Helper, c_compute_type, c_storage_type};
use crate::gpu_dialect::{CUDA as DIALECT, GpuDialect, gpu_pass};
use crate::gpu_kernel::{self, Barrier, KernelDialect, MatrixOp, PassShape, Ty};
use crate::kernel::KernelInterface;

mod joined;
mod statement;

use statement::RoutineContext;

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
            math_helper_prefix: "static __device__ __forceinline__".into(),
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
    /// Its pointer parameters, in order: the position of a buffer in its kernel's buffer list
    /// (arrays, merge buffer, scratch) and a byte offset into it (a local node's slice of the
    /// scratch; 0 for the others). Only the arrays, merge buffer and locals its code uses.
    pub args: Vec<(usize, usize)>,
    /// The static indices it takes, as positions in its kernel's statics, in order.
    pub statics: Vec<usize>,
    /// Bytes of dynamic shared memory each block of its launch takes (0: none): beyond the
    /// 48 KiB a kernel may declare statically, so the function must be allowed them
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) before it is launched.
    pub dynamic_shared_bytes: usize,
    /// The tensor maps it takes after its pointers and static indices (a warpgroup product
    /// whose factors the tensor memory accelerator stages), in order.
    pub tensor_maps: Vec<CudaTensorMap>,
}

/// A tensor map a pass takes by value (`const __grid_constant__`): which of its pointer
/// parameters is the factor, and how the accelerator sees it. The backend encodes it from
/// that pointer at launch (`cuTensorMapEncodeTiled`; the emulation fills its own struct).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTensorMap {
    /// The factor's position in [`CudaPass::args`].
    pub arg: usize,
    /// Its axes, box and swizzle.
    pub shape: TensorMapShape,
}

impl CudaPass {
    /// Blocks of its launch along x, counted without overflow (a hand-written kernel's as
    /// given).
    fn blocks_x(&self) -> u64 {
        let t = u64::from(self.threads.max(1));
        match self.shape {
            PassShape::Single | PassShape::Reduction => 1,
            PassShape::Tiles(blocks)
            | PassShape::Rows(blocks)
            | PassShape::Joined { groups: blocks, .. } => blocks.max(1),
            PassShape::Grid(n) | PassShape::Zero(n) => n.div_ceil(t).max(1),
            PassShape::Given(d) => u64::from(d.grid[0]),
        }
    }

    /// Its launch checked against CUDA's grid: a typed limit where the plan asks for more
    /// blocks than a device can launch (rendering refuses such a program).
    pub fn check_grid(&self) -> Result<()> {
        let grid = match self.shape {
            PassShape::Given(d) => d.grid.map(u64::from),
            _ => [self.blocks_x(), 1, 1],
        };
        crate::kernel::LaunchDims::check_cuda_grid(&self.symbol, grid)
    }

    /// Blocks and threads per block of its launch, in x (see [`CudaPass::launch`]; the blocks
    /// within CUDA's grid once [`CudaPass::check_grid`] passed).
    pub fn launch_dims(&self) -> (u32, u32) {
        match self.shape {
            PassShape::Single => (1, 1),
            PassShape::Given(d) => (d.grid[0], d.block[0]),
            _ => (
                u32::try_from(self.blocks_x()).unwrap_or(u32::MAX),
                self.threads.max(1),
            ),
        }
    }

    /// Its launch in three dimensions: [`CudaPass::launch_dims`] in x for rendered passes, a
    /// hand-written kernel's as given.
    pub fn launch(&self) -> crate::kernel::LaunchDims {
        match self.shape {
            PassShape::Given(d) => d,
            _ => {
                let (blocks, threads) = self.launch_dims();
                crate::kernel::LaunchDims::linear(blocks, threads)
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
    /// Byte ranges `(offset, length)` of the scratch buffer zeroed before the first pass, in
    /// order, adjacent ranges joined: the locals that may read their initial zeros
    /// ([`arrayjit_ir::FirstUses`]); locals whose first statement overwrites them all are not
    /// zeroed. Hand-written kernels zero their whole scratch.
    pub scratch_zeroed: Vec<(usize, usize)>,
}

impl CudaKernel {
    /// Bytes of scratch zeroed before each run.
    pub fn zeroed_scratch_bytes(&self) -> usize {
        self.scratch_zeroed.iter().map(|&(_, len)| len).sum()
    }
}

/// Routines rendered into one CUDA C file.
#[derive(Clone, Debug)]
pub struct CudaProgram {
    /// The source for NVRTC: [`CudaProgram::prelude`], then every function.
    pub source: String,
    /// The kernels, in the order of the routines given.
    pub kernels: Vec<CudaKernel>,
    /// What every unit of the program starts with: the fixed-width types, the helpers.
    pub prelude: String,
    /// The `__global__` functions, in the order of the kernels' passes; passes whose code is
    /// the same (the same statement over other arrays of the same shapes, e.g. a model's
    /// layers) share one.
    pub functions: Vec<String>,
    /// The symbol each function defines.
    pub function_symbols: Vec<String>,
}

/// The functions of a program being rendered, each once.
#[derive(Default)]
struct Functions {
    texts: Vec<String>,
    symbols: Vec<String>,
    /// The symbol of each function, by its text with [`SYMBOL_PLACEHOLDER`] for its name.
    by_text: HashMap<String, String>,
}

/// What stands for a function's name while it is compared with the others.
pub(crate) const SYMBOL_PLACEHOLDER: &str = "@aj_symbol@";

impl CudaProgram {
    /// The program split into at most `units` files that compile independently (each the
    /// prelude and a run of consecutive functions of about equal size), with the symbols each
    /// defines. A program without functions is one unit.
    pub fn units(&self, units: usize) -> Vec<(String, Vec<String>)> {
        let symbols: Vec<&str> = if self.functions.is_empty() {
            self.kernels
                .iter()
                .flat_map(|k| k.passes.iter().map(|p| p.symbol.as_str()))
                .collect()
        } else {
            self.function_symbols.iter().map(String::as_str).collect()
        };
        if self.functions.is_empty() || symbols.len() != self.functions.len() {
            return vec![(
                self.source.clone(),
                symbols.iter().map(|s| s.to_string()).collect(),
            )];
        }
        let total: usize = self.functions.iter().map(String::len).sum();
        let per_unit = total.div_ceil(units.clamp(1, self.functions.len()));
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        let mut size = usize::MAX;
        for (f, sym) in self.functions.iter().zip(symbols) {
            if size >= per_unit {
                out.push((self.prelude.clone(), Vec::new()));
                size = 0;
            }
            if let Some((src, syms)) = out.last_mut() {
                src.push_str(f);
                syms.push(sym.to_string());
            }
            size += f.len();
        }
        out
    }
}

/// Renders routines into one CUDA C file.
pub fn render_cuda(routines: &[&Optimized]) -> Result<CudaProgram> {
    render_with(&CSyntax::cuda(), routines)
}

/// Renders routines into one file in a CUDA dialect (`syntax.includes` opens the file).
pub(crate) fn render_with(syntax: &CSyntax, routines: &[&Optimized]) -> Result<CudaProgram> {
    let mut helpers = BTreeSet::new();
    let mut functions = Functions::default();
    let mut kernels = Vec::new();
    for (index, r) in routines.iter().enumerate() {
        let stem = format!("aj{index}_{}", sanitize_identifier(&r.name));
        kernels.push(render_routine(
            r,
            &stem,
            syntax,
            &mut helpers,
            &mut functions,
        )?);
    }
    let Functions {
        texts: functions,
        symbols: function_symbols,
        ..
    } = functions;
    let mut prelude = String::from("/* Generated by arrayjit. */\n");
    for inc in &syntax.includes {
        let _ = writeln!(prelude, "{inc}");
    }
    prelude.push('\n');
    for h in &helpers {
        let _ = writeln!(prelude, "{}\n", c_syntax::helper_definition(*h, syntax));
    }
    let source = format!("{prelude}{}", functions.concat());
    // A plan's launch beyond CUDA's grid is refused here, for the device and its emulation
    // alike, before anything is compiled.
    for pass in kernels.iter().flat_map(|k: &CudaKernel| &k.passes) {
        pass.check_grid()?;
    }
    Ok(CudaProgram {
        source,
        kernels,
        prelude,
        functions,
        function_symbols,
    })
}

fn render_routine(
    r: &Optimized,
    stem: &str,
    syntax: &CSyntax,
    helpers: &mut BTreeSet<Helper>,
    functions: &mut Functions,
) -> Result<CudaKernel> {
    let mut interface = KernelInterface::of(r, stem.to_string());
    // Every local node lives in the scratch buffer, 16-byte aligned; only the locals that may
    // read their initial zeros are zeroed before a run.
    let arrayjit_opt::optimize::GpuScratch {
        locals,
        bytes: scratch,
        zeroed: scratch_zeroed,
    } = r.gpu_scratch();
    interface.scratch_bytes = scratch;
    // Each buffer's pointer type, in the interface's order; a pass declares those it uses.
    let mut buffer_types: Vec<String> = interface
        .args
        .iter()
        .map(|tn| format!("{} *", c_storage_type(tn.prec())))
        .collect();
    let merge = interface.merge.clone().map(|m| {
        buffer_types.push(format!("const {} *", c_storage_type(m.prec())));
        (m, "aj_merge".to_string())
    });
    if scratch > 0 {
        buffer_types.push("unsigned char *".into());
    }
    let stmts: Vec<&LowLevel> = match &r.code {
        LowLevel::Seq(items) => items.iter().collect(),
        s => vec![s],
    };
    let cx = RoutineContext {
        r,
        interface: &interface,
        locals: &locals,
        buffer_types: &buffer_types,
        merge,
        syntax,
    };
    // Statements whose passes run in a joined launch, by the launch's first part.
    let joins: HashMap<usize, &JoinedLaunch> = r
        .joined
        .iter()
        .filter_map(|j| j.statements.first().map(|&first| (first, j)))
        .collect();
    let joined_parts: std::collections::HashSet<usize> = r
        .joined
        .iter()
        .flat_map(|j| j.statements.iter().copied())
        .collect();
    let mut passes = Vec::new();
    for (i, &stmt) in stmts.iter().enumerate() {
        if let Some(join) = joins.get(&i) {
            let pass = joined::render_joined(&cx, &stmts, join, helpers)?;
            let symbol = functions.add(pass.text, stem, passes.len());
            passes.push(CudaPass {
                symbol,
                ..pass.pass
            });
            continue;
        }
        if joined_parts.contains(&i) {
            continue;
        }
        let part = cx.render_statement(i, stmt, helpers, "", None)?;
        let params = [part.buffer_params, part.static_params].concat();
        for statement::RenderedKernel {
            shape,
            threads,
            why,
            body,
            dynamic_shared_bytes,
            tensor_maps,
        } in part.kernels
        {
            let tensor_maps = tensor_maps
                .into_iter()
                .map(|(node, shape)| {
                    let arg = part
                        .arg_nodes
                        .iter()
                        .position(|n| n.as_ref() == Some(&node))
                        .ok_or_else(|| Error::Render {
                            routine: r.name.clone(),
                            language: "CUDA C".into(),
                            detail: format!(
                                "a tensor map of {} that the pass takes no pointer to",
                                node.header()
                            ),
                        })?;
                    Ok(CudaTensorMap { arg, shape })
                })
                .collect::<Result<Vec<_>>>()?;
            let signature = params
                .iter()
                .cloned()
                .chain(tensor_maps.iter().map(|m| {
                    format!(
                        "const __grid_constant__ aj_tensor_map {}",
                        gpu_kernel::tensor_map_param(m.shape.factor)
                    )
                }))
                .collect::<Vec<_>>()
                .join(", ");
            // Tiled products cap their registers so that two groups share an SM.
            let bounds = match shape {
                PassShape::Single => String::new(),
                PassShape::Tiles(_) => {
                    format!("__launch_bounds__({threads}, {TILE_GROUPS_PER_UNIT}) ")
                }
                _ => format!("__launch_bounds__({threads}) "),
            };
            let mut text = String::new();
            let _ = writeln!(
                text,
                "/* {why} */\n{} void {bounds}{SYMBOL_PLACEHOLDER}({signature}) {{\n  const long long aj_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n  const long long aj_grp = blockIdx.x;\n  const int aj_t = threadIdx.x;\n  (void)aj_g; (void)aj_grp; (void)aj_t;\n{body}}}\n",
                syntax.kernel_prefix
            );
            let symbol = functions.add(text, stem, passes.len());
            passes.push(CudaPass {
                symbol,
                shape,
                threads,
                why,
                args: part.args.clone(),
                statics: part.statics.clone(),
                dynamic_shared_bytes,
                tensor_maps,
            });
        }
    }
    Ok(CudaKernel {
        interface,
        passes,
        buffer_types,
        scratch_zeroed,
    })
}

impl Functions {
    /// The symbol of a function with this text (its name [`SYMBOL_PLACEHOLDER`]): the one
    /// already held, or a new one named after the routine's stem and the pass's position.
    fn add(&mut self, text: String, stem: &str, position: usize) -> String {
        if let Some(existing) = self.by_text.get(&text) {
            return existing.clone();
        }
        let symbol = format!("{stem}_p{position}");
        self.texts.push(text.replace(SYMBOL_PLACEHOLDER, &symbol));
        self.symbols.push(symbol.clone());
        self.by_text.insert(text, symbol.clone());
        symbol
    }
}

/// The shape, threads per block, reason and body of each kernel of the pass of one top-level
/// statement, by its schedule (none: it does nothing): the kernel tree of its pass
/// ([`crate::gpu_kernel`]) printed in CUDA C.
pub(super) fn render_pass(
    k: &mut KernelRenderer<'_>,
    stmt: &LowLevel,
    sched: Option<&Schedule>,
    shared: Option<&mut SharedArrays>,
) -> Result<Vec<statement::RenderedKernel>> {
    let pass = gpu_pass(&k.routine, "CUDA C", sched)?;
    let why = sched.map(|s| s.why.clone()).unwrap_or_default();
    let printed = gpu_kernel::print_pass(&mut CudaDialect(k, shared), stmt, pass)?;
    // A warpgroup product's tensor maps go to its first kernel, the product.
    let mut tensor_maps = match pass {
        arrayjit_opt::schedule::GpuPass::MatrixTiles { gemm, layout, .. } => layout
            .tensor_maps(gemm)
            .into_iter()
            .map(|m| (if m.factor == 1 { &gemm.lhs } else { &gemm.rhs }.clone(), m))
            .collect(),
        _ => Vec::new(),
    };
    Ok(printed
        .into_iter()
        .map(|p| statement::RenderedKernel {
            shape: p.shape,
            threads: p.threads,
            why: why.clone(),
            body: p.body,
            dynamic_shared_bytes: p.dynamic_shared_bytes,
            tensor_maps: std::mem::take(&mut tensor_maps),
        })
        .collect())
}

/// Shared arrays a joined launch declares once, at its top (its parts run in different
/// blocks, so they may use the same memory): each array's declared type and the most
/// elements a part asks for, by name.
pub(crate) type SharedArrays = std::collections::BTreeMap<String, (String, usize)>;

/// The C family's renderer printing a kernel tree in CUDA C, collecting shared arrays into
/// the second field where given.
struct CudaDialect<'k, 'a>(&'k mut KernelRenderer<'a>, Option<&'k mut SharedArrays>);

impl KernelDialect for CudaDialect<'_, '_> {
    fn syntax(&self) -> &'static GpuDialect {
        &DIALECT
    }

    fn routine(&self) -> (&str, &'static str) {
        (&self.0.routine, "CUDA C")
    }

    fn ty(&self, ty: Ty) -> &'static str {
        match ty {
            Ty::Int => "int",
            Ty::Index => "long long",
            Ty::Compute(p) => c_compute_type(p.compute_prec()),
            Ty::Word => "uint32_t",
            Ty::Half => "uint16_t",
        }
    }

    fn int(&self, v: i64) -> String {
        if i32::try_from(v).is_ok() {
            v.to_string()
        } else {
            format!("{v}LL")
        }
    }

    fn declare(&self, name: &str, ty: Ty, mutable: bool, value: &str) -> String {
        let constant = if mutable { "" } else { "const " };
        format!("{constant}{} {name} = {value};", self.ty(ty))
    }

    fn local_array(&self, name: &str, ty: Ty, len: usize) -> String {
        format!("{} {name}[{len}];", self.ty(ty))
    }

    fn shared_array(&mut self, name: &str, ty: Ty, len: usize) -> Result<Option<String>> {
        // 16-byte aligned: fragment loads and 128-bit loads read 16-byte runs; staged 16-bit
        // and TF32 (word) factor tiles of whole KiB on a KiB boundary: the swizzles of
        // warpgroup products act on address bits up to 1 KiB.
        let bytes = match ty {
            Ty::Half => 2 * len,
            Ty::Word => 4 * len,
            _ => 0,
        };
        let align = if bytes > 0 && bytes.is_multiple_of(1024) {
            1024
        } else {
            16
        };
        let ty = format!("__align__({align}) {}", self.ty(ty));
        if let Some(collected) = self.1.as_deref_mut() {
            let entry = collected.entry(name.to_string()).or_insert((ty, 0));
            entry.1 = entry.1.max(len);
            return Ok(None);
        }
        Ok(Some(DIALECT.shared_array(&ty, name, &len.to_string())))
    }

    fn dynamic_shared(&mut self, arrays: &[(String, Ty, usize)], bytes: usize) -> Result<String> {
        if self.1.is_some() {
            return Err(Error::Render {
                routine: self.0.routine.clone(),
                language: "CUDA C".into(),
                detail: "dynamic shared memory in a joined launch".into(),
            });
        }
        self.0.helpers.insert(Helper::DynamicShared);
        let mut out = format!("AJ_DYNAMIC_SHARED({bytes});\n");
        for (name, ty, offset) in arrays {
            let ty = self.ty(*ty);
            let _ = writeln!(
                out,
                "{ty} *const {name} = ({ty} *)(aj_dynamic_shared + {offset});"
            );
        }
        Ok(out)
    }

    fn for_header(&self, var: &str, ty: Ty, from: &str, cond: &str, next: &str) -> String {
        format!(
            "for ({} {var} = {from}; {cond}; {var} = {next}) {{",
            self.ty(ty)
        )
    }

    fn at_least_once(&self, var: &str, count: &str) -> Option<(String, String)> {
        Some((
            format!("{{ int {var} = 0; do {{"),
            format!("}} while (++{var} < {count}); }}"),
        ))
    }

    fn unroll(&self) -> Option<&'static str> {
        Some("#pragma unroll")
    }

    fn select(&self, cond: &str, a: &str, b: &str) -> String {
        format!("({cond} ? {a} : {b})")
    }

    fn mul_add(&self, fused: bool, acc: &str, x: &str, y: &str) -> String {
        // NVRTC runs with `--fmad=false`; the unfused form rounds the product first, as the
        // loop nest does.
        if fused {
            format!("fmaf({x}, {y}, {acc})")
        } else {
            format!("__fadd_rn({acc}, __fmul_rn({x}, {y}))")
        }
    }

    fn shuffle_down(&self, value: &str, offset: &str) -> String {
        format!("__shfl_down_sync(0xffffffffu, {value}, {offset})")
    }

    fn shuffle_xor(&self, value: &str, mask: &str) -> String {
        format!("__shfl_xor_sync(0xffffffffu, {value}, {mask})")
    }

    fn barrier(&self, _: Barrier) -> &'static str {
        // `__syncthreads` orders the block's global and shared accesses alike.
        DIALECT.barrier
    }

    fn literal(&self, p: Prec, v: f64) -> String {
        c_syntax::literal(p, v)
    }

    fn node(&mut self, tn: &Tnode) -> Result<String> {
        self.0.node(tn).map(str::to_string)
    }

    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<String> {
        self.0.offset(tn, idcs)
    }

    fn load(&mut self, name: &str, offset: &str, stored: Prec, to: Prec) -> String {
        c_syntax::load(&format!("{name}[{offset}]"), stored, to, self.0.helpers)
    }

    fn store(&mut self, name: &str, offset: &str, stored: Prec, value: &str) -> String {
        let v = c_syntax::store(value, stored, self.0.helpers);
        format!("{name}[{offset}] = {v};")
    }

    fn zero_extent(&self, tn: &Tnode) -> u64 {
        tn.num_elems() as u64
    }

    fn zero(&mut self, tn: &Tnode, index: &str) -> Result<String> {
        Ok(format!("{}[{index}] = 0;", self.0.node(tn)?))
    }

    fn combine(&mut self, op: BinOp, cp: Prec, a: &str, b: &str) -> String {
        c_syntax::render_binop(op, cp, a, b, self.0.helpers)
    }

    fn unary(&mut self, op: arrayjit_ir::UnOp, cp: Prec, a: &str) -> String {
        c_syntax::render_unop(op, cp, a, self.0.helpers)
    }

    fn fma(&mut self, cp: Prec, a: &str, b: &str, c: &str) -> String {
        c_syntax::render_ternop(TernOp::Fma, cp, (a, b, c), self.0.helpers)
    }

    fn bind(&mut self, sym: Symbol, name: &str) {
        self.0.symbols.insert(sym, name.to_string());
    }

    fn unbind(&mut self, sym: Symbol) {
        self.0.symbols.remove(&sym);
    }

    fn ir_expr(
        &mut self,
        e: &ScalarExpr,
        prec: Prec,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String> {
        self.0.expr(e, prec, depth, prelude)
    }

    fn ir_stmt(&mut self, s: &LowLevel, depth: usize, out: &mut String) -> Result<()> {
        self.0.stmt(s, depth, out)
    }

    fn bits(&mut self, name: &str, offset: &str) -> String {
        format!("{name}[{offset}]")
    }

    fn load_vector(
        &mut self,
        place: &str,
        name: &str,
        offset: &str,
        stored: Prec,
        lanes: usize,
    ) -> Option<String> {
        (stored == Prec::F32 && lanes == 4).then(|| {
            self.0.helpers.insert(Helper::VectorLoads);
            format!("aj_load4(&{place}, {name} + ({offset}));")
        })
    }

    fn tf32(&mut self, value: &str) -> Result<String> {
        self.0.helpers.insert(Helper::MatrixUnits);
        Ok(format!("aj_tf32({value})"))
    }

    fn matrix(&mut self, op: &MatrixOp<'_>, places: &[String]) -> Result<String> {
        self.0.helpers.insert(Helper::MatrixUnits);
        if op.is_warpgroup() {
            self.0.helpers.insert(Helper::Warpgroup);
        }
        Ok(match (op, places) {
            (MatrixOp::Load { trans, .. }, [words, row]) => format!(
                "aj_ldmatrix_x4{}(&{words}, &{row});",
                if *trans { "_trans" } else { "" }
            ),
            (MatrixOp::Multiply { kind, .. }, [acc, a, b]) => {
                format!("aj_mma_{}(&{acc}, &{a}, &{b});", kind.name())
            }
            (MatrixOp::CopyAsync { .. }, [dst, src, valid]) => {
                format!("aj_copy_async16(&{dst}, &{src}, {valid});")
            }
            (MatrixOp::CommitCopies, []) => "aj_commit_copies();".to_string(),
            (MatrixOp::FenceAsyncProxy, []) => "aj_fence_async_proxy();".to_string(),
            (MatrixOp::WarpgroupFence, []) => "aj_wgmma_fence();".to_string(),
            (MatrixOp::WarpgroupCommit, []) => "aj_wgmma_commit();".to_string(),
            (MatrixOp::WarpgroupWait { pending }, []) => format!("aj_wgmma_wait({pending});"),
            (
                MatrixOp::WarpgroupMultiply {
                    kind,
                    n,
                    side_major,
                    depth,
                    ..
                },
                [acc, a, b],
            ) => {
                if *kind == MatrixKind::Tf32 && side_major.contains(&true) {
                    return Err(Error::Render {
                        routine: self.0.routine.clone(),
                        language: "CUDA C".into(),
                        detail: "a TF32 warpgroup product of a factor that is not k-major (wgmma takes TF32 \
                                 factors only k-major)"
                            .into(),
                    });
                }
                let helper = Helper::Wgmma {
                    kind: *kind,
                    n: *n,
                    side_major: *side_major,
                    depth: *depth,
                };
                self.0.helpers.insert(helper);
                format!("{}(&{acc}, &{a}, &{b});", helper.function_name())
            }
            (MatrixOp::WaitCopies { pending }, []) => format!("aj_wait_copies({pending});"),
            (MatrixOp::BarrierInit { .. }, [bar]) => {
                self.0.helpers.insert(Helper::TensorCopies);
                format!("aj_mbar_init(&{bar});")
            }
            (MatrixOp::BarrierInitFence, []) => "aj_mbar_init_fence();".to_string(),
            (MatrixOp::ExpectBytes { bytes, .. }, [bar]) => {
                format!("aj_mbar_expect(&{bar}, {bytes}u);")
            }
            (MatrixOp::BarrierWait { .. }, [bar, parity]) => {
                format!("aj_mbar_wait(&{bar}, (uint32_t)({parity}));")
            }
            (MatrixOp::TensorCopy { map, coords, .. }, [dst, at @ .., bar])
                if at.len() == coords.len() =>
            {
                self.0.helpers.insert(Helper::TensorCopies);
                let rank = at.len();
                let at: String = at.iter().map(|c| format!(", (int)({c})")).collect();
                format!("aj_tma_load_{rank}d(&{dst}, &{map}{at}, &{bar});")
            }
            _ => {
                return Err(Error::Render {
                    routine: self.0.routine.clone(),
                    language: "CUDA C".into(),
                    detail: "a matrix operation with the wrong number of operands".into(),
                });
            }
        })
    }
}

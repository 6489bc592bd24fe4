//! The WGSL renderer: an optimized routine as a sequence of compute passes, one per top-level
//! statement, each its own WGSL module. Each statement's pass is the GPU schedule the optimizer
//! recorded for it ([`arrayjit_opt::schedule::gpu`]: grid, rows, workgroup reduction, tiled
//! product, zeroing or one invocation, with the group size and tile chosen from the device's
//! limits and why), rendered here in WGSL as the CUDA renderer renders it in CUDA C:
//!
//! The passes' bodies are the kernel trees of [`crate::gpu_kernel`], the shapes written once for
//! every GPU dialect, printed in WGSL by the dialect in `dialect.rs`; zeroing runs one
//! invocation per element (per word for packed precisions).
//!
//! A routine optimized without GPU schedules (for a CPU) is a render error that says so. A
//! statement split for the binding limit (below) gets one pass per piece, each planned for the
//! target's limits ([`WgslTarget::limits`]) by the same planner.
//!
//! Every array the routine uses is a storage buffer binding: the kernel's arguments (in the
//! [`KernelInterface`]'s order), then the merge buffer, then the routine's local nodes, which the
//! compiled kernel owns (so the interface asks for no scratch buffer), then the static indices
//! as an `array<i32>`. Arithmetic follows the IR's semantics (`arrayjit_ir::ops`): integers
//! wrap (8- and 16-bit unsigned ones compute in `u32`, masked after every operation), division
//! and remainder by zero give 0, float-to-integer conversions saturate and map NaN to 0; 16-bit
//! floats are computed in `f32`. WGSL has no 8- or 16-bit integers and no bfloat16: their
//! arrays are packed in `array<atomic<u32>>` words, each invocation clearing and setting only
//! its element's bits (bfloat16 rounded to nearest even, as the interpreter rounds). `f16` needs
//! the device's `SHADER_F16`, `i64` and `u64` its `SHADER_INT64`; `f64` is not rendered yet (Vulkan
//! has no `f64` exponential or logarithm): a routine using a precision its target lacks is an
//! [`Error::UnsupportedPrecision`]. NaN is tested on the bits (shader compilers may assume
//! `x != x` is false), and a pass binds at most the device's storage-buffer limit: fused loops
//! that would need more split back into one pass per statement.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::{
    AxisIndex, DeviceLimit, Error, LowLevel, Prec, Result, ScalarExpr, Symbol, TernOp, Tnode,
};
use arrayjit_opt::Optimized;

use crate::c::kernel::node_name;
use crate::gpu_dialect::WGSL as DIALECT;
use crate::kernel::KernelInterface;

mod dialect;
mod ops;

use crate::gpu_kernel::PassShape;
use arrayjit_opt::schedule::gpu::{Accumulation, GpuAttention, GpuLimits, GpuPass, plan_pass};
use arrayjit_opt::schedule::{ScheduleKind, ScheduleTuning};
use ops::{
    Helper, compute_type, helper_source, literal, narrow, narrow_mask, packing, storage_type,
};

/// What the target device's WGSL accepts beyond the core language, and its binding limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslTarget {
    /// `f16` storage and arithmetic (`enable f16;`, wgpu's `SHADER_F16`).
    pub f16: bool,
    /// `i64` and `u64` (wgpu's `SHADER_INT64`).
    pub int64: bool,
    /// The most storage buffers one pass may bind (the device's
    /// `max_storage_buffers_per_shader_stage`; 8 is WebGPU's guaranteed minimum).
    pub max_bindings: usize,
    /// The device's group limits: the passes of statements split for the binding limit are
    /// planned with them (the others follow the routine's schedules).
    pub limits: GpuLimits,
}

impl Default for WgslTarget {
    fn default() -> Self {
        WgslTarget {
            f16: false,
            int64: false,
            max_bindings: 8,
            limits: GpuLimits::portable(),
        }
    }
}

impl WgslTarget {
    /// The precisions a routine may use on this target.
    pub fn precisions(&self) -> Vec<Prec> {
        let mut p = vec![
            Prec::U8,
            Prec::U16,
            Prec::I32,
            Prec::U32,
            Prec::F32,
            Prec::Bf16,
        ];
        if self.f16 {
            p.push(Prec::F16);
        }
        if self.int64 {
            p.extend([Prec::I64, Prec::U64]);
        }
        p
    }
}

/// One compute pass: a WGSL module and its entry point (`main` for rendered passes).
#[derive(Clone, Debug)]
pub struct WgslPass {
    /// The module's source.
    pub source: String,
    /// How it covers its statement.
    pub shape: PassShape,
    /// Invocations per workgroup (1 for a single-invocation pass; a hand-written kernel's
    /// are in its shape).
    pub threads: u32,
    /// The bindings the module declares, ascending.
    pub bindings: Vec<u32>,
    /// Why this shape.
    pub why: String,
    /// The entry point's name: `main` for rendered passes, a hand-written kernel's symbol.
    pub entry_point: String,
}

impl WgslPass {
    /// Invocations needed in total.
    pub fn invocations(&self) -> u64 {
        match self.shape {
            PassShape::Grid(n) | PassShape::Zero(n) => n,
            PassShape::Reduction => self.threads as u64,
            PassShape::Tiles(groups)
            | PassShape::Rows(groups)
            | PassShape::Joined { groups, .. } => groups * self.threads as u64,
            PassShape::Single => 1,
            PassShape::Given(d) => d.blocks() * d.threads_per_block(),
        }
    }

    /// Workgroups to dispatch in x and y (x at most `max_x`): enough groups of
    /// [`WgslPass::threads`] for every invocation; the shader skips the ones past the end.
    pub fn workgroups(&self, max_x: u32) -> (u32, u32) {
        match self.shape {
            PassShape::Reduction | PassShape::Single => (1, 1),
            PassShape::Given(d) => (d.grid[0], d.grid[1]),
            _ => {
                let groups = self
                    .invocations()
                    .div_ceil(self.threads.max(1) as u64)
                    .max(1);
                let max_x = max_x.max(1) as u64;
                if groups <= max_x {
                    (groups as u32, 1)
                } else {
                    (max_x as u32, groups.div_ceil(max_x) as u32)
                }
            }
        }
    }

    /// Workgroups to dispatch in x, y and z: [`WgslPass::workgroups`], or a hand-written
    /// kernel's grid as given.
    pub fn dispatch(&self, max_x: u32) -> [u32; 3] {
        match self.shape {
            PassShape::Given(d) => d.grid,
            _ => {
                let (x, y) = self.workgroups(max_x);
                [x, y, 1]
            }
        }
    }
}

/// A routine rendered for WGSL.
#[derive(Clone, Debug)]
pub struct WgslKernel {
    /// How to call it (no scratch: the kernel owns its local nodes' buffers).
    pub interface: KernelInterface,
    /// The local nodes whose buffers the kernel owns, with their bindings.
    pub locals: Vec<(Tnode, u32)>,
    /// The binding of the static indices (`array<i32>`), if the routine has any.
    pub statics_binding: Option<u32>,
    /// The passes, in order.
    pub passes: Vec<WgslPass>,
}

impl WgslKernel {
    /// Every pass's source, for reports and golden tests.
    pub fn full_source(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.passes.iter().enumerate() {
            let _ = writeln!(s, "// pass {i}: {:?} ({})\n{}", p.shape, p.why, p.source);
        }
        s
    }
}

/// Renders a routine for a WGSL target.
pub fn render_wgsl(r: &Optimized, target: &WgslTarget) -> Result<WgslKernel> {
    let mut interface = KernelInterface::of(r, format!("aj_{}", r.name));
    interface.scratch_bytes = 0;
    let supported = target.precisions();
    for role in r.nodes.iter().filter(|n| n.used) {
        let p = role.tn.prec();
        if !supported.contains(&p) {
            return Err(Error::UnsupportedPrecision {
                device: "the WGSL target".into(),
                prec: p,
                node: role.tn.debug_name(),
                supported: supported.clone(),
            });
        }
    }
    let mut nodes: HashMap<Tnode, (String, u32)> = HashMap::new();
    let mut binding = 0u32;
    for tn in &interface.args {
        nodes.insert(tn.clone(), (node_name(tn, binding as usize), binding));
        binding += 1;
    }
    let merge = interface.merge.clone().map(|m| {
        let b = binding;
        binding += 1;
        (m, b)
    });
    let mut locals = Vec::new();
    // Every local node, on the CPU's stack or in its scratch pool alike.
    let all_locals = r
        .nodes
        .iter()
        .filter(|n| n.used && n.tn.modes().is_local())
        .map(|n| n.tn.clone());
    for tn in all_locals {
        nodes.insert(tn.clone(), (node_name(&tn, binding as usize), binding));
        locals.push((tn, binding));
        binding += 1;
    }
    let statics_binding = (!r.bindings.is_empty()).then_some(binding);
    let mut passes = Vec::new();
    let statements = r.statements();
    // A product whose epilogue would bind more arrays than a pass may: the product runs
    // without it, and the epilogue's statement as a pass of its own.
    let mut without_epilogue: HashMap<usize, (GpuPass, String)> = HashMap::new();
    for (i, sched) in r.schedules.iter().enumerate() {
        if let ScheduleKind::Gpu(pass) = &sched.kind
            && let Some(product) = strip_epilogue(pass)
            && let Some(stmt) = statements.get(i)
            && let Some(next) = statements.get(i + 1)
        {
            let mut nodes: BTreeSet<Tnode> = stmt.nodes().into_iter().collect();
            nodes.extend(next.nodes());
            if nodes.len() + 1 > target.max_bindings {
                let why = format!(
                    "{} ({} arrays with its epilogue: more than a pass binds, so the epilogue \
                     runs as a pass of its own)",
                    sched.why,
                    nodes.len()
                );
                without_epilogue.insert(i, (product, why));
                without_epilogue.insert(
                    i + 1,
                    plan_pass(next, &target.limits, &recorded_tuning(pass)),
                );
            }
        }
    }
    for (i, stmt) in statements.into_iter().enumerate() {
        let sched = r.schedules.get(i);
        let (recorded, recorded_why) = match without_epilogue.get(&i) {
            Some((pass, why)) => (pass, why.clone()),
            None => (
                crate::gpu_dialect::gpu_pass(&r.name, "WGSL", sched)?,
                sched.map(|s| s.why.clone()).unwrap_or_default(),
            ),
        };
        let mut pieces = Vec::new();
        // A pass of fused attention binds only the arrays each of its kernels uses (and the
        // static indices where its causal mask has an offset): where its backward needs more
        // than a pass may bind, the key and value gradients take launches of their own; where
        // it still does, its loops are split and planned piece by piece.
        // WGSL kernels use no subgroup shuffles: one invocation per row.
        let attention = match recorded {
            GpuPass::Attention(a) => attention_within(&a.with_one_lane(), target.max_bindings),
            _ => None,
        };
        let adjusted;
        let (recorded, recorded_why) = match attention {
            Some(a) => {
                pieces.push(Cow::Borrowed(stmt));
                let why = if a.separate_key_grads {
                    format!(
                        "{recorded_why}; the key and value gradients in launches of their own, \
                         each binding at most {} arrays",
                        target.max_bindings
                    )
                } else {
                    recorded_why
                };
                adjusted = GpuPass::Attention(a);
                (&adjusted, why)
            }
            None => {
                split_for_bindings(
                    Cow::Borrowed(stmt),
                    target.max_bindings,
                    &r.name,
                    &mut pieces,
                )?;
                (recorded, recorded_why)
            }
        };
        let split = !matches!(pieces.as_slice(), [Cow::Borrowed(_)]);
        for piece in &pieces {
            // A statement split for the binding limit: each piece gets its own pass, planned
            // for the device as the optimizer plans every statement.
            let planned;
            let (pass, why) = if split {
                planned = plan_pass(piece, &target.limits, &recorded_tuning(recorded));
                (&planned.0, planned.1.clone())
            } else {
                (recorded, recorded_why.clone())
            };
            // A fresh renderer per kernel: each module binds only the arrays it uses.
            for k in 0..crate::gpu_kernel::kernel_count(pass) {
                let mut pass_renderer = PassRenderer {
                    routine: &r.name,
                    nodes: &nodes,
                    merge: merge.as_ref(),
                    statics: r
                        .bindings
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (s.symbol, i))
                        .collect(),
                    statics_binding,
                    symbols: HashMap::new(),
                    used: BTreeSet::new(),
                    uses_merge: false,
                    uses_statics: false,
                    scalars: HashMap::new(),
                    counter: 0,
                    helpers: BTreeSet::new(),
                    shared: BTreeMap::new(),
                    threads: 1,
                };
                passes.extend(pass_renderer.render(piece, pass, k, why.clone())?);
            }
        }
    }
    Ok(WgslKernel {
        interface,
        locals,
        statics_binding,
        passes,
    })
}

/// An attention pass whose launches each bind at most `max_bindings` arrays: as planned, or
/// with the key and value gradients in launches of their own; `None` where neither does.
fn attention_within(a: &GpuAttention, max_bindings: usize) -> Option<GpuAttention> {
    // A causal offset is a static index: the kernels bind the static indices' array too.
    let statics = usize::from(a.spec().causal_offset.is_some());
    let fits = |a: &GpuAttention| {
        (0..a.launches() as usize).all(|k| a.kernel_arrays(k).len() + statics <= max_bindings)
    };
    if fits(a) {
        return Some(a.clone());
    }
    let separate = a.with_separate_key_grads();
    fits(&separate).then_some(separate)
}

/// A tiled product's pass without its epilogue, if it has one.
fn strip_epilogue(pass: &GpuPass) -> Option<GpuPass> {
    let mut product = pass.clone();
    match &mut product {
        GpuPass::Tiles { epilogue, .. } | GpuPass::MatrixTiles { epilogue, .. }
            if epilogue.is_some() =>
        {
            *epilogue = None;
            Some(product)
        }
        _ => None,
    }
}

/// The tuning a recorded pass was planned with, as far as it shows (its group size and tile),
/// so that the pieces of a split statement are planned alike.
fn recorded_tuning(pass: &GpuPass) -> ScheduleTuning {
    let (gpu_threads, gpu_tile) = match pass {
        GpuPass::Zero { threads, .. }
        | GpuPass::Grid { threads, .. }
        | GpuPass::Rows { threads, .. }
        | GpuPass::Reduction { threads, .. } => (Some(*threads), None),
        GpuPass::Tiles { layout, .. } => (None, Some(layout.tile)),
        GpuPass::MatrixTiles { layout, .. } => (None, Some(layout.tile)),
        GpuPass::GridReduction { threads, .. } => (Some(*threads), None),
        GpuPass::Nothing | GpuPass::Single | GpuPass::Attention(_) => (None, None),
    };
    ScheduleTuning {
        gpu_threads,
        gpu_tile,
        ..ScheduleTuning::default()
    }
}

/// Pushes `stmt`, or the passes it splits into, so that no pass binds more storage buffers
/// than the target allows: loops whose iterations are independent around a sequence (loops
/// fused by the optimizer) become one nest per statement of the sequence
/// ([`arrayjit_opt::schedule::gpu::distribute_loop`], which says why that is legal). A statement
/// that alone needs too many is an [`Error::LimitExceeded`].
fn split_for_bindings<'a>(
    stmt: Cow<'a, LowLevel>,
    max_bindings: usize,
    routine: &str,
    out: &mut Vec<Cow<'a, LowLevel>>,
) -> Result<()> {
    // Arrays, plus one for the static indices a statement may read.
    let needed = stmt.nodes().len() + 1;
    if needed <= max_bindings {
        out.push(stmt);
        return Ok(());
    }
    if let Some(pieces) = arrayjit_opt::schedule::gpu::distribute_loop(&stmt) {
        for piece in pieces {
            split_for_bindings(Cow::Owned(piece), max_bindings, routine, out)?;
        }
        return Ok(());
    }
    Err(Error::limit_exceeded(
        "the device",
        format!("a statement of {routine} (with its static indices)"),
        DeviceLimit::BindingsPerPass,
        needed as u64,
        max_bindings as u64,
        "compute it in smaller statements (fewer arrays each), or use a backend without the limit",
    ))
}

struct PassRenderer<'a> {
    routine: &'a str,
    nodes: &'a HashMap<Tnode, (String, u32)>,
    merge: Option<&'a (Tnode, u32)>,
    statics: HashMap<Symbol, usize>,
    statics_binding: Option<u32>,
    symbols: HashMap<Symbol, String>,
    used: BTreeSet<Tnode>,
    uses_merge: bool,
    uses_statics: bool,
    /// Canonical names of scalar locals (by scope id).
    scalars: HashMap<usize, String>,
    counter: usize,
    helpers: BTreeSet<Helper>,
    /// The workgroup arrays the pass declares: element type and length, by name.
    shared: BTreeMap<String, (&'static str, usize)>,
    /// Invocations per workgroup of the pass.
    threads: u32,
}

impl PassRenderer<'_> {
    fn err(&self, detail: String) -> Error {
        Error::Render {
            routine: self.routine.to_string(),
            language: "WGSL".into(),
            detail,
        }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    fn node(&mut self, tn: &Tnode) -> Result<String> {
        let (name, _) = self.nodes.get(tn).ok_or_else(|| {
            self.err(format!(
                "{} is neither an argument nor a local node",
                tn.debug_name()
            ))
        })?;
        self.used.insert(tn.clone());
        Ok(name.clone())
    }

    fn scalar(&mut self, id: usize) -> String {
        let n = self.scalars.len();
        self.scalars
            .entry(id)
            .or_insert_with(|| format!("v{n}"))
            .clone()
    }

    fn affine(&mut self, idx: &AxisIndex) -> Result<String> {
        let mut statics = false;
        let text = idx
            .render_with(|sym| {
                if let Some(n) = self.symbols.get(&sym) {
                    Ok(n.clone())
                } else if let Some(i) = self.statics.get(&sym) {
                    statics = true;
                    Ok(format!("aj_statics[{i}]"))
                } else {
                    Err(self.err(format!("symbol {sym} is not bound")))
                }
            })
            .map(|s| format!("({s})"))?;
        self.uses_statics |= statics;
        Ok(text)
    }

    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<String> {
        if tn.num_elems() > i32::MAX as usize {
            return Err(self.err(format!(
                "{} has {} elements, more than a WGSL index reaches",
                tn.debug_name(),
                tn.num_elems()
            )));
        }
        self.affine(&tn.flat_index(idcs))
    }

    /// Converts `x` of compute precision `from` to compute precision `to`.
    fn convert(&mut self, x: &str, from: Prec, to: Prec) -> String {
        let (from, to) = (from.compute_prec(), to.compute_prec());
        if from == to {
            return x.to_string();
        }
        let narrow = narrow_mask(to);
        match (from.is_float(), to) {
            (true, _) if !to.is_float() => {
                let int = ops::int_type_prec(to);
                self.helpers.insert(Helper::F32ToInt(int));
                let f = ops::helper_name("f32_to", int);
                match narrow {
                    Some(m) => format!("min({f}({x}), {m}u)"),
                    None => format!("{f}({x})"),
                }
            }
            _ => match narrow {
                Some(m) => format!("(u32({x}) & {m}u)"),
                None => format!("{}({x})", compute_type(to)),
            },
        }
    }

    /// Element `offset` of array `name` of precision `stored`, in compute precision `prec`.
    fn read_elem(&mut self, name: &str, offset: &str, stored: Prec, prec: Prec) -> String {
        let v = match packing(stored) {
            Some(p) => {
                let bits = format!(
                    "((atomicLoad(&{name}[({offset}) >> {}u]) >> (u32(({offset}) & {}) * {}u)) & {}u)",
                    p.shift,
                    (1u32 << p.shift) - 1,
                    p.bits,
                    p.mask
                );
                if stored == Prec::Bf16 {
                    format!("bitcast<f32>({bits} << 16u)")
                } else {
                    bits
                }
            }
            None if stored == Prec::F16 => format!("f32({name}[{offset}])"),
            None => format!("{name}[{offset}]"),
        };
        self.convert(&v, stored, prec)
    }

    /// The statement storing `v` (in `p`'s compute precision) as element `offset` of `name`.
    fn write_elem(&mut self, name: &str, offset: &str, p: Prec, v: &str) -> String {
        match packing(p) {
            Some(k) => {
                let bits = if p == Prec::Bf16 {
                    self.helpers.insert(Helper::F32ToBf16);
                    format!("aj_f32_to_bf16({v})")
                } else {
                    v.to_string()
                };
                // The value first: it may read the element being replaced.
                format!(
                    "{{ let aj_v: u32 = {bits}; let aj_o: i32 = {offset}; \
                     let aj_sh: u32 = u32(aj_o & {}) * {}u; \
                     atomicAnd(&{name}[aj_o >> {}u], ~({}u << aj_sh)); \
                     atomicOr(&{name}[aj_o >> {}u], (aj_v & {}u) << aj_sh); }}",
                    (1u32 << k.shift) - 1,
                    k.bits,
                    k.shift,
                    k.mask,
                    k.shift,
                    k.mask
                )
            }
            None if p == Prec::F16 => format!("{name}[{offset}] = f16({v});"),
            None => format!("{name}[{offset}] = {v};"),
        }
    }

    /// Words (for packed precisions) or elements zeroed by a zeroing of `tn`, and the
    /// statement zeroing number `i`.
    fn zero_unit(&self, tn: &Tnode, name: &str, i: &str) -> (usize, String) {
        match packing(tn.prec()) {
            Some(_) => (
                tn.size_in_bytes().div_ceil(4),
                format!("atomicStore(&{name}[{i}], 0u);"),
            ),
            None => {
                let z = match tn.prec() {
                    Prec::F16 => format!("f16({})", literal(Prec::F32, 0.0)),
                    p => literal(p, 0.0),
                };
                (tn.num_elems(), format!("{name}[{i}] = {z};"))
            }
        }
    }

    fn stmt(&mut self, s: &LowLevel, depth: usize, out: &mut String) -> Result<()> {
        let pad = "  ".repeat(depth);
        match s {
            LowLevel::Noop | LowLevel::Comment(_) => {}
            LowLevel::Seq(items) => {
                for i in items {
                    self.stmt(i, depth, out)?;
                }
            }
            LowLevel::For { .. }
                if let Some(acc) = Accumulation::detect(s)
                    && acc.tn.prec() == acc.tn.prec().compute_prec() =>
            {
                self.register_accumulation(&acc, depth, out)?;
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                let name = self.fresh("i");
                let _ = writeln!(
                    out,
                    "{pad}for (var {name}: i32 = {from}; {name} < {to}; {name} = {name} + 1) {{"
                );
                self.symbols.insert(*index, name);
                self.stmt(body, depth + 1, out)?;
                self.symbols.remove(index);
                let _ = writeln!(out, "{pad}}}");
            }
            LowLevel::ZeroOut(tn) => {
                let name = self.node(tn)?;
                let i = self.fresh("z");
                let (n, zero) = self.zero_unit(tn, &name, &i);
                let _ = writeln!(
                    out,
                    "{pad}for (var {i}: i32 = 0; {i} < {n}; {i} = {i} + 1) {{ {zero} }}"
                );
            }
            LowLevel::Set { tn, idcs, value } => {
                let mut prelude = String::new();
                let v = self.expr(value, tn.prec(), depth, &mut prelude)?;
                let name = self.node(tn)?;
                let offset = self.offset(tn, idcs)?;
                out.push_str(&prelude);
                let store = self.write_elem(&name, &offset, tn.prec(), &v);
                let _ = writeln!(out, "{pad}{store}");
            }
            LowLevel::SetLocal(id, value) => {
                let mut prelude = String::new();
                let v = self.expr(value, id.prec, depth, &mut prelude)?;
                out.push_str(&prelude);
                let name = self.scalar(id.id);
                let _ = writeln!(out, "{pad}{name} = {v};");
            }
        }
        Ok(())
    }

    fn expr(
        &mut self,
        e: &ScalarExpr,
        prec: Prec,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String> {
        let cp = prec.compute_prec();
        Ok(match e {
            ScalarExpr::LocalScope { id, body } => {
                let pad = "  ".repeat(depth);
                let name = self.scalar(id.id);
                let _ = writeln!(
                    prelude,
                    "{pad}var {name}: {} = {};",
                    compute_type(id.prec),
                    literal(id.prec, 0.0)
                );
                self.stmt(body, depth, prelude)?;
                self.convert(&name, id.prec, prec)
            }
            ScalarExpr::GetLocal(id) => {
                let name = self.scalar(id.id);
                self.convert(&name, id.prec, prec)
            }
            ScalarExpr::Get(tn, idcs) => {
                let (name, offset) = (self.node(tn)?, self.offset(tn, idcs)?);
                self.read_elem(&name, &offset, tn.prec(), prec)
            }
            ScalarExpr::GetMerge(tn, idcs) => {
                match self.merge {
                    Some((m, _)) if m == tn => {}
                    _ => {
                        return Err(self.err(format!(
                            "the merge buffer does not hold {}",
                            tn.debug_name()
                        )));
                    }
                }
                self.uses_merge = true;
                let offset = self.offset(tn, idcs)?;
                self.read_elem("aj_merge", &offset, tn.prec(), prec)
            }
            ScalarExpr::EmbedIndex(i) => {
                let x = self.affine(i)?;
                self.convert(&x, Prec::I32, prec)
            }
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => {
                let index = self.affine(index)?;
                let step = self.expr(step, Prec::U32, depth, prelude)?;
                self.helpers.insert(Helper::PhiloxUniform);
                let u = format!(
                    "aj_philox_uniform(vec2<u32>({}u, {}u), {stream}u, u32({index}), u32({step}))",
                    *seed as u32,
                    (*seed >> 32) as u32
                );
                self.convert(&u, Prec::F32, prec)
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                // As in the C renderer: an invalid index reads element 0 of the gathered axis
                // and the value is replaced by the poison value.
                let ix = self.expr(index, prec, depth, prelude)?;
                let name = self.fresh("gather");
                let pad = "  ".repeat(depth);
                let t = compute_type(cp);
                let _ = writeln!(
                    prelude,
                    "{pad}let {name}_v: {t} = {ix};\n\
                     {pad}let {name}_ok: bool = {name}_v >= {t}(0) && {name}_v < {t}({extent});\n\
                     {pad}let {name}: i32 = select(0i, i32({name}_v), {name}_ok);"
                );
                self.symbols.insert(*symbol, name.clone());
                let read = self.expr(read, prec, depth, prelude);
                self.symbols.remove(symbol);
                let poison = literal(prec, f64::NAN);
                format!("select({poison}, {}, {name}_ok)", read?)
            }
            ScalarExpr::Constant(c) => literal(prec, *c),
            ScalarExpr::Unop(op, a) => {
                let a = self.expr(a, prec, depth, prelude)?;
                self.unop(*op, cp, &a)
            }
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(a, prec, depth, prelude)?;
                let b = self.expr(b, prec, depth, prelude)?;
                self.binop(*op, cp, &a, &b)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(a, prec, depth, prelude)?;
                let b = self.expr(b, prec, depth, prelude)?;
                let c = self.expr(c, prec, depth, prelude)?;
                let t = compute_type(cp);
                match op {
                    TernOp::Where => format!("select({c}, {b}, {a} != {t}(0))"),
                    TernOp::Fma if cp.is_float() => format!("fma({a}, {b}, {c})"),
                    TernOp::Fma => narrow(cp, format!("({a} * {b} + {c})")),
                }
            }
        })
    }

    /// Renders kernel `k` of the pass of one top-level statement by its schedule (`None` for
    /// a statement that does nothing): the kernel tree of its pass ([`crate::gpu_kernel`])
    /// printed in WGSL.
    fn render(
        &mut self,
        stmt: &LowLevel,
        pass: &GpuPass,
        k: usize,
        why: String,
    ) -> Result<Option<WgslPass>> {
        let Some(printed) = crate::gpu_kernel::print_kernel(self, stmt.unwrapped(), pass, k)?
        else {
            return Ok(None);
        };
        self.threads = printed.threads;
        Ok(Some(self.module(printed.shape, why, &printed.body)))
    }
}

impl PassRenderer<'_> {
    /// The module of one pass around its entry point's body.
    fn module(&mut self, shape: PassShape, why: String, body: &str) -> WgslPass {
        let mut src = String::new();
        let mut bindings = Vec::new();
        let f16 = self.used.iter().any(|t| t.prec() == Prec::F16)
            || self
                .merge
                .is_some_and(|(m, _)| self.uses_merge && m.prec() == Prec::F16);
        if f16 {
            src.push_str("enable f16;\n");
        }
        let mut used: Vec<(u32, String, Prec)> = self
            .used
            .iter()
            .map(|tn| {
                let (name, b) = &self.nodes[tn];
                (*b, name.clone(), tn.prec())
            })
            .collect();
        if self.uses_merge
            && let Some((m, b)) = self.merge
        {
            used.push((*b, "aj_merge".into(), m.prec()));
        }
        used.sort();
        for (b, name, p) in &used {
            let access = if name == "aj_merge" {
                "read"
            } else {
                "read_write"
            };
            let _ = writeln!(
                src,
                "@group(0) @binding({b}) var<storage, {access}> {name}: array<{}>;",
                storage_type(*p)
            );
            bindings.push(*b);
        }
        if self.uses_statics
            && let Some(b) = self.statics_binding
        {
            let _ = writeln!(
                src,
                "@group(0) @binding({b}) var<storage, read> aj_statics: array<i32>;"
            );
            bindings.push(b);
        }
        bindings.sort_unstable();
        for (name, (ty, len)) in &self.shared {
            let _ = writeln!(src, "{}", DIALECT.shared_array(ty, name, &len.to_string()));
        }
        for h in &self.helpers {
            src.push_str(&helper_source(*h));
        }
        let size = match shape {
            PassShape::Single => 1,
            _ => self.threads,
        };
        let _ = write!(
            src,
            "@compute @workgroup_size({size})\nfn main(@builtin(workgroup_id) aj_wid: vec3<u32>, \
             @builtin(num_workgroups) aj_nwg: vec3<u32>, @builtin(local_invocation_index) aj_l: \
             u32) {{\n  let aj_grp: i32 = i32(aj_wid.y * aj_nwg.x + aj_wid.x);\n  \
             let aj_t: i32 = i32(aj_l);\n  let aj_g: i32 = aj_grp * {size} + aj_t;\n{body}}}\n"
        );
        WgslPass {
            source: src,
            shape,
            threads: size,
            bindings,
            why,
            entry_point: "main".into(),
        }
    }
}

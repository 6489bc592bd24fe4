//! One top-level statement of a routine as CUDA kernels: the buffers and static indices its
//! code uses ([`PassBinding`]), named by position, and its pass printed with them.

use std::collections::{BTreeSet, HashMap};

use arrayjit_ir::{AxisIndex, LowLevel, Result, ScalarExpr, Tnode};
use arrayjit_opt::Optimized;
use arrayjit_opt::schedule::gpu::tensor_map::TensorMapShape;
use arrayjit_opt::schedule::{GpuPass, Schedule, ScheduleKind};

use super::{SharedArrays, render_pass};
use crate::c::kernel::KernelRenderer;
use crate::c::syntax::{CSyntax, Helper, c_storage_type};
use crate::gpu_kernel::PassShape;
use crate::kernel::KernelInterface;

/// What every statement of a routine being rendered sees: the routine, its interface, where
/// its locals live in the scratch buffer, the buffers' C types and the merge buffer.
pub(crate) struct RoutineContext<'r> {
    pub(crate) r: &'r Optimized,
    pub(crate) interface: &'r KernelInterface,
    pub(crate) locals: &'r [(Tnode, usize)],
    pub(crate) buffer_types: &'r [String],
    pub(crate) merge: Option<(Tnode, String)>,
    pub(crate) syntax: &'r CSyntax,
}

/// One kernel of a statement's pass, printed.
pub(crate) struct RenderedKernel {
    /// How it covers its statement.
    pub(crate) shape: PassShape,
    /// Threads per block.
    pub(crate) threads: u32,
    /// Why its pass has this shape.
    pub(crate) why: String,
    /// Its body.
    pub(crate) body: String,
    /// Bytes of dynamic shared memory per block (see [`super::CudaPass::dynamic_shared_bytes`]).
    pub(crate) dynamic_shared_bytes: usize,
    /// The tensor maps it takes, each with the factor it maps (see
    /// [`super::CudaPass::tensor_maps`]).
    pub(crate) tensor_maps: Vec<(Tnode, TensorMapShape)>,
}

/// One statement's kernels, printed.
pub(crate) struct RenderedStatement {
    /// Its buffer parameters' declarations, in order.
    pub(crate) buffer_params: Vec<String>,
    /// Its static indices' declarations, in order (after the buffers in a signature).
    pub(crate) static_params: Vec<String>,
    /// Each kernel, printed.
    pub(crate) kernels: Vec<RenderedKernel>,
    /// See [`CudaPass::args`].
    pub(crate) args: Vec<(usize, usize)>,
    /// See [`CudaPass::statics`].
    pub(crate) statics: Vec<usize>,
    /// The node each pointer parameter holds (none: the merge buffer), in order.
    pub(crate) arg_nodes: Vec<Option<Tnode>>,
}

impl RoutineContext<'_> {
    /// The kernels of top-level statement `i`, their parameters named by position after
    /// `prefix` (`b0`, `s0` and `aj_merge` for an empty one); shared arrays are declared in
    /// the bodies, or collected into `shared` where given (a joined launch declares them once).
    pub(crate) fn render_statement(
        &self,
        i: usize,
        stmt: &LowLevel,
        helpers: &mut BTreeSet<Helper>,
        prefix: &str,
        shared: Option<&mut SharedArrays>,
    ) -> Result<RenderedStatement> {
        let r = self.r;
        let sched = r.schedules.get(i);
        let binding = PassBinding::of(stmt, sched, self.interface, self.locals, r);
        // Names by position in the pass, so that the same statement over other arrays of the
        // same shapes prints the same function.
        let mut pass_nodes: HashMap<Tnode, String> = HashMap::new();
        let mut signature = Vec::new();
        let mut pass_merge = None;
        let restrict = &self.syntax.restrict;
        for (k, (b, _, tn)) in binding.args.iter().enumerate() {
            match tn {
                Some(tn) => {
                    let ty = format!("{} *", c_storage_type(tn.prec()));
                    let name = format!("{prefix}b{k}");
                    signature.push(format!("{ty}{restrict} {name}"));
                    pass_nodes.insert(tn.clone(), name);
                }
                None => {
                    let ty = self
                        .buffer_types
                        .get(*b)
                        .map_or("const void *", String::as_str);
                    let name = format!("{prefix}aj_merge");
                    signature.push(format!("{ty}{restrict} {name}"));
                    pass_merge = self.merge.clone().map(|(m, _)| (m, name));
                }
            }
        }
        let mut pass_symbols = HashMap::new();
        let mut static_params = Vec::new();
        for (k, &j) in binding.statics.iter().enumerate() {
            static_params.push(format!("const long long {prefix}s{k}"));
            if let Some(st) = r.bindings.get(j) {
                pass_symbols.insert(st.symbol, format!("{prefix}s{k}"));
            }
        }
        let mut k = KernelRenderer {
            helpers,
            nodes: pass_nodes,
            merge: pass_merge,
            symbols: pass_symbols,
            loop_counter: 0,
            locals: HashMap::new(),
            local_counter: 0,
            routine: r.name.clone(),
            element_views: binding.views.clone(),
            outer_cascade: None,
            pairwise_sums: false,
        };
        let kernels = render_pass(&mut k, stmt.unwrapped(), sched, shared)?;
        Ok(RenderedStatement {
            buffer_params: signature,
            static_params,
            kernels,
            args: binding.args.iter().map(|&(b, o, _)| (b, o)).collect(),
            arg_nodes: binding.args.into_iter().map(|(_, _, tn)| tn).collect(),
            statics: binding.statics,
        })
    }
}

/// What one statement's kernels bind: the buffers (positions in the interface's order: arrays,
/// merge buffer, scratch) and static indices (positions in the interface's statics) its code
/// uses, and the local nodes whose scratch slices it declares.
struct PassBinding {
    /// Each pointer parameter: the buffer's position, a byte offset into it, and the node it
    /// holds (none for the merge buffer).
    args: Vec<(usize, usize, Option<Tnode>)>,
    statics: Vec<usize>,
    /// Locals bound at their one element (their accesses render at offset 0).
    views: std::collections::HashSet<usize>,
}

impl PassBinding {
    fn of(
        stmt: &LowLevel,
        sched: Option<&Schedule>,
        interface: &KernelInterface,
        locals: &[(Tnode, usize)],
        r: &Optimized,
    ) -> PassBinding {
        // A product's epilogue runs in its pass: the pass uses what both statements use.
        let with_epilogue;
        let stmt = match sched.map(|s| &s.kind) {
            Some(ScheduleKind::Gpu(
                GpuPass::Tiles {
                    epilogue: Some(e), ..
                }
                | GpuPass::MatrixTiles {
                    epilogue: Some(e), ..
                },
            )) => {
                with_epilogue = LowLevel::Seq(vec![stmt.clone(), e.stmt.clone()]);
                &with_epilogue
            }
            _ => stmt,
        };
        let mut used: std::collections::HashSet<usize> =
            stmt.nodes().iter().map(Tnode::id).collect();
        let partials = match sched.map(|s| &s.kind) {
            Some(ScheduleKind::Gpu(pass)) => pass.partials(),
            _ => None,
        };
        if let Some(partials) = partials {
            used.insert(partials.id());
        }
        let mut reads_merge = false;
        stmt.visit_exprs(&mut |e| reads_merge |= matches!(e, ScalarExpr::GetMerge(..)));
        let mut args: Vec<(usize, usize, Option<Tnode>)> = interface
            .args
            .iter()
            .enumerate()
            .filter(|(_, tn)| used.contains(&tn.id()))
            .map(|(pos, tn)| (pos, 0, Some(tn.clone())))
            .collect();
        let mut next = interface.args.len();
        if interface.merge.is_some() {
            if reads_merge {
                args.push((next, 0, None));
            }
            next += 1;
        }
        // Each local the pass uses: its slice of the scratch buffer, or the one element of it
        // that every access reads or writes (so that passes on other elements print the same).
        let mut views = std::collections::HashSet::new();
        for (tn, offset) in locals.iter().filter(|(tn, _)| used.contains(&tn.id())) {
            let element = match partials {
                Some(partials) if partials == tn => None,
                _ => single_element(stmt, tn),
            };
            match element {
                Some(e) => {
                    views.insert(tn.id());
                    args.push((
                        next,
                        offset + e * tn.prec().size_in_bytes(),
                        Some(tn.clone()),
                    ));
                }
                None => args.push((next, *offset, Some(tn.clone()))),
            }
        }
        let symbols = stmt.index_symbols();
        let statics = r
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, s)| symbols.contains(&s.symbol))
            .map(|(pos, _)| pos)
            .collect();
        PassBinding {
            args,
            statics,
            views,
        }
    }
}

/// The element of `tn` that every access of `stmt` reads or writes, where they all use the
/// same constant indices.
fn single_element(stmt: &LowLevel, tn: &Tnode) -> Option<usize> {
    let mut at: Option<Vec<AxisIndex>> = None;
    let mut same = true;
    let mut see = |idcs: &[AxisIndex]| match &at {
        Some(a) => same &= a.as_slice() == idcs,
        None => at = Some(idcs.to_vec()),
    };
    stmt.visit(&mut |s| {
        if let LowLevel::Set { tn: t, idcs, .. } = s
            && t == tn
        {
            see(idcs);
        }
    });
    stmt.visit_exprs(&mut |e| {
        if let ScalarExpr::Get(t, idcs) | ScalarExpr::GetMerge(t, idcs) = e
            && t == tn
        {
            see(idcs);
        }
    });
    let at = at.filter(|_| same)?;
    if !at.iter().all(|i| matches!(i, AxisIndex::Fixed(_))) {
        return None;
    }
    match tn.flat_index(&at) {
        AxisIndex::Fixed(e) => usize::try_from(e).ok(),
        _ => None,
    }
}

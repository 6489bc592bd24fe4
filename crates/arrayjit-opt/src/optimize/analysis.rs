//! Read/write analysis of top-level statements: which nodes are inputs or results, how often
//! each element is read (counted by `visits`), and what would stop a node from being inlined.

use std::collections::{BTreeMap, HashMap, HashSet};

use rustc_hash::FxHashSet;

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::ops::{BinOp, UnOp};
use arrayjit_ir::tnode::Tnode;

use super::OptimizeSettings;
use super::visits;

/// How a routine uses one node.
#[derive(Clone, Debug)]
pub struct NodeRole {
    /// The node.
    pub tn: Tnode,
    /// The routine reads it before writing it.
    pub input: bool,
    /// The routine writes it.
    pub written: bool,
    /// The optimized code still reads or writes it (false for virtual nodes, which are inlined).
    pub used: bool,
}

/// What the analysis found about one node.
#[derive(Clone, Debug)]
pub(super) struct NodeInfo {
    pub tn: Tnode,
    /// Top-level statements that write the node.
    pub write_stmts: Vec<usize>,
    /// Top-level statements that read the node and do not write it.
    pub read_stmts: Vec<usize>,
    /// Read before written.
    pub input: bool,
    /// Most reads of one element (loops cut to the tracing bound; see `visits`). Counted only
    /// where it can decide the node's memory mode (`visits_matter`), 0 elsewhere.
    pub max_visits: usize,
    /// Why the node's computation cannot be inlined into its uses, if it cannot.
    pub inline_blocker: Option<String>,
    /// Its computation reads no array (constants and indices only), so recomputing it at every
    /// use costs nothing: it may be inlined however often it is read.
    pub cheap: bool,
    /// The node it is a plain copy of, if it is one (see `plain_copy_source`).
    pub copy_of: Option<Tnode>,
}

impl NodeInfo {
    /// Written, and not read by a later statement.
    pub fn is_output(&self) -> bool {
        match self.write_stmts.iter().max() {
            None => false,
            Some(&last) => self.read_stmts.iter().all(|&r| r < last),
        }
    }
}

#[derive(Default)]
struct StmtInfo {
    writes: Vec<Tnode>,
    /// Every `Set` of the statement: the node and its indices, in order.
    sets: Vec<(Tnode, Vec<AxisIndex>)>,
    /// The statement is a perfect loop nest around one `Set` whose indices name every loop's
    /// iterator: each element it writes is written once.
    writes_each_once: bool,
    reads: Vec<(Tnode, Vec<AxisIndex>)>,
    /// Expression nodes in the statement's values (what inlining the statement copies).
    expr_size: usize,
}

/// The analysis of a routine's top-level statements.
pub(super) struct Analysis {
    pub nodes: BTreeMap<usize, NodeInfo>,
    stmts: Vec<StmtInfo>,
}

fn collect_stmt(s: &LowLevel, info: &mut StmtInfo) {
    fn sets(s: &LowLevel, out: &mut Vec<(Tnode, Vec<AxisIndex>)>) {
        match s {
            LowLevel::Seq(items) => items.iter().for_each(|i| sets(i, out)),
            LowLevel::For { body, .. } => sets(body, out),
            LowLevel::Set { tn, idcs, .. } => out.push((tn.clone(), idcs.clone())),
            _ => {}
        }
    }
    sets(s, &mut info.sets);
    let (loops, inner) = s.perfect_nest();
    info.writes_each_once = matches!(inner, LowLevel::Set { idcs, .. }
        if loops.iter().all(|(l, ..)| idcs.contains(&AxisIndex::Iterator(*l))));
    info.writes = s.written_nodes();
    s.visit_exprs(&mut |e| {
        info.expr_size += 1;
        if let ScalarExpr::Get(tn, idcs) = e {
            info.reads.push((tn.clone(), idcs.clone()));
        }
    });
}

/// Why statement `s` is not a pure computation of `tn` that can be instantiated per element,
/// if it is not. Records in `fixed_axes` the axes written at fixed indices.
fn computation_blocker(
    s: &LowLevel,
    tn: &Tnode,
    fixed_axes: &mut HashSet<usize>,
) -> Option<String> {
    fn walk(
        s: &LowLevel,
        tn: &Tnode,
        loops: &mut HashMap<Symbol, (i64, i64)>,
        pattern: &mut Option<Vec<AxisIndex>>,
        fixed_axes: &mut HashSet<usize>,
    ) -> Option<String> {
        match s {
            LowLevel::Noop | LowLevel::Comment(_) => None,
            LowLevel::ZeroOut(t) if t == tn => None,
            LowLevel::Seq(items) => items
                .iter()
                .find_map(|i| walk(i, tn, loops, pattern, fixed_axes)),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                loops.insert(*index, (*from, *to));
                let r = walk(body, tn, loops, pattern, fixed_axes);
                loops.remove(index);
                r
            }
            LowLevel::Set { tn: t, idcs, value } if t == tn => {
                let mut seen = HashSet::new();
                for (axis, (i, &d)) in idcs.iter().zip(tn.dims()).enumerate() {
                    match i {
                        AxisIndex::Fixed(_) => {
                            fixed_axes.insert(axis);
                        }
                        AxisIndex::Iterator(s) => {
                            if loops.get(s) != Some(&(0, d as i64)) || !seen.insert(*s) {
                                return Some(format!(
                                    "its computation writes axis {axis} with a loop that does not cover the axis exactly once"
                                ));
                            }
                        }
                        AxisIndex::Affine { .. } => {
                            return Some(format!(
                                "its computation writes axis {axis} at an affine index"
                            ));
                        }
                    }
                }
                match pattern {
                    Some(p) if p != idcs => {
                        return Some("its computation writes it at differing indices".into());
                    }
                    _ => *pattern = Some(idcs.clone()),
                }
                let mut bad_self_read = false;
                value.visit_all(&mut |e| {
                    if let ScalarExpr::Get(t2, i2) = e
                        && t2 == tn
                        && i2 != idcs
                    {
                        bad_self_read = true;
                    }
                });
                bad_self_read
                    .then(|| "its computation reads it at other indices than it writes".into())
            }
            LowLevel::Set { tn: other, .. } | LowLevel::ZeroOut(other) => Some(format!(
                "the statement computing it also writes {}",
                other.debug_name()
            )),
            LowLevel::SetLocal(..) => Some("its computation sets a local variable".into()),
        }
    }
    walk(s, tn, &mut HashMap::new(), &mut None, fixed_axes)
}

/// Analyzes the routine's top-level statements.
pub(super) fn analyze(stmts: &[LowLevel], settings: &OptimizeSettings) -> Analysis {
    let mut infos: Vec<StmtInfo> = Vec::with_capacity(stmts.len());
    let mut nodes: BTreeMap<usize, NodeInfo> = BTreeMap::new();
    for (k, s) in stmts.iter().enumerate() {
        let mut info = StmtInfo::default();
        collect_stmt(s, &mut info);
        let new_info = |tn: &Tnode| NodeInfo {
            tn: tn.clone(),
            write_stmts: vec![],
            read_stmts: vec![],
            input: false,
            max_visits: 0,
            inline_blocker: None,
            cheap: false,
            copy_of: None,
        };
        for tn in &info.writes {
            let n = nodes.entry(tn.id()).or_insert_with(|| new_info(tn));
            if n.write_stmts.is_empty() {
                // The first write reads the old value (e.g. `+=` without a zero-out): an input.
                let self_read = info.reads.iter().any(|(t, _)| t == tn);
                let zero_out_first = matches!(s, LowLevel::ZeroOut(_));
                if self_read && !zero_out_first {
                    n.input = true;
                }
            }
            n.write_stmts.push(k);
        }
        for (tn, _) in &info.reads {
            let n = nodes.entry(tn.id()).or_insert_with(|| new_info(tn));
            if info.writes.contains(tn) {
                continue;
            }
            if n.write_stmts.is_empty() {
                n.input = true;
            }
            if n.read_stmts.last() != Some(&k) {
                n.read_stmts.push(k);
            }
        }
        infos.push(info);
    }
    for n in nodes.values_mut() {
        n.inline_blocker =
            inline_blocker(n, stmts, &infos).or_else(|| contraction_blocker(n, stmts, settings));
        n.cheap =
            !n.write_stmts.is_empty() && n.write_stmts.iter().all(|&w| infos[w].reads.is_empty());
        n.copy_of = match n.write_stmts[..] {
            [w] => plain_copy_source(&stmts[w], &n.tn).and_then(|(src, plain_reads)| {
                // A view that reads its source at other than plain loop indices (a reshape's
                // affine index, a slice's offset, a batch's static index) is not inlined into a
                // blocked product: the product would no longer read an array in place.
                (plain_reads
                    || !n
                        .read_stmts
                        .iter()
                        .any(|&r| is_blocked_product(&stmts[r], settings)))
                .then_some(src)
            }),
            _ => None,
        };
    }
    // Visits are counted only where they can decide a memory mode (see `visits_matter`), and
    // only statements reading such a node are traced.
    let wanted: FxHashSet<usize> = nodes
        .values()
        .filter(|n| visits_matter(n, settings))
        .map(|n| n.tn.id())
        .collect();
    let mut traced: Vec<usize> = nodes
        .values()
        .filter(|n| wanted.contains(&n.tn.id()))
        .flat_map(|n| n.read_stmts.iter().copied())
        .collect();
    traced.sort_unstable();
    traced.dedup();
    let counted: Vec<(usize, FxHashSet<usize>)> = traced
        .into_iter()
        .map(|k| {
            let ids = infos[k]
                .reads
                .iter()
                .map(|(tn, _)| tn.id())
                .filter(|&id| wanted.contains(&id))
                .filter(|&id| !infos[k].writes.iter().any(|w| w.id() == id))
                .collect();
            (k, ids)
        })
        .collect();
    for (id, count) in visits::max_visits(stmts, &counted, settings.max_tracing_dim) {
        if let Some(n) = nodes.get_mut(&id) {
            n.max_visits = count;
        }
    }
    Analysis {
        nodes,
        stmts: infos,
    }
}

/// The node statement `s` copies into `tn`, if it is a plain copy: a loop nest whose one `Set`
/// writes `tn` with the value of one element of another node of the same precision (`0 + x`, as
/// a first gradient contribution lowers, and `id(x)` count as `x`), either at the same index
/// (same shape), or as a view: every element of `tn` written once, at plain loop iterators, from
/// an element of the source at any index (a reshape, transpose, slice or broadcast). Inlining
/// such a node replaces each read of it by a read of the node it copies, which costs the same as
/// long as that node is computed once.
/// Also says whether the source is read at plain indices of the nest's own loops (a static
/// index, as a batch slice reads, is not one).
fn plain_copy_source(s: &LowLevel, tn: &Tnode) -> Option<(Tnode, bool)> {
    let (loops, inner) = s.perfect_nest();
    let LowLevel::Set { tn: t, idcs, value } = inner else {
        return None;
    };
    let mut v = value;
    loop {
        v = match v {
            ScalarExpr::Unop(UnOp::Identity, x) => x,
            ScalarExpr::Binop(BinOp::Add, z, x) if matches!(**z, ScalarExpr::Constant(c) if c == 0.0) => {
                x
            }
            _ => break,
        };
    }
    match v {
        ScalarExpr::Get(src, read)
            if t == tn
                && src != tn
                && src.prec() == tn.prec()
                && ((read == idcs && src.dims() == tn.dims())
                    || writes_each_element_once(&loops, idcs, tn.dims())) =>
        {
            let own_loop = |i: &AxisIndex| matches!(i, AxisIndex::Iterator(s) if loops.iter().any(|(l, ..)| l == s));
            Some((src.clone(), read.iter().all(own_loop)))
        }
        _ => None,
    }
}

/// Whether the schedule would run `s` as a blocked matrix product.
fn is_blocked_product(s: &LowLevel, settings: &OptimizeSettings) -> bool {
    crate::schedule::scheduled_product(s, &settings.schedule).is_some()
}

/// Whether a perfect nest of `loops` around a write at `idcs` writes each element of a node of
/// `dims` exactly once: each axis is indexed by its own loop running over the whole axis (or is
/// fixed at 0 on an axis of size 1), and no loop is left over.
fn writes_each_element_once(
    loops: &[(Symbol, i64, i64)],
    idcs: &[AxisIndex],
    dims: &[usize],
) -> bool {
    let mut used = 0;
    idcs.len() == dims.len()
        && idcs.iter().zip(dims).all(|(i, &d)| match i {
            AxisIndex::Iterator(s) => {
                used += 1;
                loops.iter().filter(|(l, ..)| l == s).count() == 1
                    && idcs.iter().filter(|j| *j == i).count() == 1
                    && loops
                        .iter()
                        .any(|&(l, from, to)| l == *s && from == 0 && to == d as i64)
            }
            AxisIndex::Fixed(0) => d == 1,
            _ => false,
        })
        && used == loops.len()
}

/// Whether a node's visit count can decide its memory mode: only a node that may still become
/// virtual (not an input or a result, which are materialized; not blocked from inlining; not
/// cheap, which is inlined however often it is read) is refused for being read more than
/// `virtualize_max_visits` times per element.
fn visits_matter(n: &NodeInfo, settings: &OptimizeSettings) -> bool {
    settings.enable_virtualization
        && !n.input
        && !n.is_output()
        && !n.cheap
        && n.inline_blocker.is_none()
        && n.tn.padding().is_none()
        && may_be_virtual(&n.tn)
}

/// Whether the node's memory mode (if any) still allows it to be virtual.
pub(super) fn may_be_virtual(tn: &Tnode) -> bool {
    tn.memory_mode()
        .is_none_or(|m| m.mode.covers(arrayjit_ir::memory::MemoryMode::Virtual))
}

/// The plain copies that are inlined although they are read more often than the visit limit,
/// by id, and the node kept (computed once) at the root of each one's copy chain, with why: a
/// reader of such a copy reads what it copies instead, so the copy costs neither memory nor a
/// pass of its own. A copy whose root was requested virtual is left to the visit limit.
pub(super) fn copies_to_inline(
    analysis: &Analysis,
    settings: &OptimizeSettings,
) -> (HashSet<usize>, BTreeMap<Tnode, String>) {
    let mut inlined = HashSet::new();
    let mut kept = BTreeMap::new();
    if !settings.enable_virtualization {
        return (inlined, kept);
    }
    for info in analysis.nodes.values() {
        let Some(mut root) = info.copy_of.clone() else {
            continue;
        };
        if info.max_visits <= settings.virtualize_max_visits
            || info.inline_blocker.is_some()
            || !may_be_virtual(&info.tn)
        {
            continue;
        }
        // Bounded: a (malformed) cycle of copies ends the walk.
        for _ in 0..analysis.nodes.len() {
            match analysis
                .nodes
                .get(&root.id())
                .and_then(|n| n.copy_of.clone())
            {
                Some(next) => root = next,
                None => break,
            }
        }
        if root.modes().known_virtual() {
            continue;
        }
        inlined.insert(info.tn.id());
        kept.entry(root).or_insert_with(|| {
            format!(
                "{} is a plain copy of it read {} times per element, so it is computed once and \
                 the copy is inlined",
                info.tn.debug_name(),
                info.max_visits
            )
        });
    }
    (inlined, kept)
}

/// A node computed by a contraction large enough for a blocked matrix product is never
/// inlined: inlining would recompute the product's inner reduction inside its consumer, one
/// scalar chain per element, without blocking or vectorization.
fn contraction_blocker(
    n: &NodeInfo,
    stmts: &[LowLevel],
    settings: &OptimizeSettings,
) -> Option<String> {
    n.write_stmts.iter().find_map(|&w| {
        let c = crate::schedule::scheduled_product(&stmts[w], &settings.schedule)?;
        Some(format!(
            "it is a contraction of {:.0} FLOP, computed by a blocked matrix product rather \
             than recomputed inside its consumer",
            c.flops()
        ))
    })
}

fn inline_blocker(n: &NodeInfo, stmts: &[LowLevel], infos: &[StmtInfo]) -> Option<String> {
    if n.tn.padding().is_some() {
        return Some("the node is padded".into());
    }
    let last_write = *n.write_stmts.iter().max()?;
    if n.read_stmts.iter().any(|&r| r < last_write) {
        return Some("it is read before its computation is complete".into());
    }
    let mut fixed_axes = HashSet::new();
    for &w in &n.write_stmts {
        if let Some(why) = computation_blocker(&stmts[w], &n.tn, &mut fixed_axes) {
            return Some(why);
        }
    }
    for &r in &n.read_stmts {
        for (t, idcs) in &infos[r].reads {
            if t == &n.tn
                && fixed_axes
                    .iter()
                    .any(|&a| !matches!(idcs[a], AxisIndex::Fixed(_)))
            {
                return Some("it is computed per fixed index but read at a varying index".into());
            }
        }
    }
    None
}

impl Analysis {
    /// The roles of all nodes, by id.
    pub fn roles(&self) -> Vec<NodeRole> {
        self.nodes
            .values()
            .map(|n| NodeRole {
                tn: n.tn.clone(),
                input: n.input,
                written: !n.write_stmts.is_empty(),
                used: true,
            })
            .collect()
    }

    /// The last statement of each candidate where its value is used, following uses through the
    /// computations of other candidates it is inlined into. A candidate is read only after its
    /// computation is complete, so a consumer is written later than what it reads: candidates
    /// are resolved from the last written to the first, without recursion.
    fn last_uses(&self, candidates: &BTreeMap<Tnode, ()>) -> HashMap<usize, usize> {
        let mut order: Vec<&NodeInfo> = candidates.keys().map(|tn| &self.nodes[&tn.id()]).collect();
        order.sort_by_key(|n| std::cmp::Reverse(n.write_stmts.iter().max().copied()));
        let mut last_uses: HashMap<usize, usize> = HashMap::with_capacity(order.len());
        for info in order {
            let tn = &info.tn;
            let mut last = info.write_stmts.iter().copied().max().unwrap_or(0);
            for &r in &info.read_stmts {
                let consumer_last_use = self.stmts[r]
                    .writes
                    .iter()
                    .filter(|w| *w != tn && candidates.contains_key(*w))
                    .find_map(|w| last_uses.get(&w.id()).copied());
                last = last.max(consumer_last_use.unwrap_or(r));
            }
            last_uses.insert(tn.id(), last);
        }
        last_uses
    }

    /// Candidates whose inlined computation would exceed `max_size` expression nodes, with the
    /// reason. Inlining instantiates a candidate's computation at each read, so sizes compound
    /// along chains (and multiply where a cheap node is read many times); a candidate over the
    /// budget is computed once instead, which also bounds the depth of every expression.
    pub fn over_size_budget(
        &self,
        candidates: &BTreeMap<Tnode, ()>,
        max_size: usize,
    ) -> Vec<(Tnode, String)> {
        let mut order: Vec<&NodeInfo> = candidates.keys().map(|tn| &self.nodes[&tn.id()]).collect();
        order.sort_by_key(|n| n.write_stmts.iter().max().copied());
        let mut sizes: HashMap<usize, usize> = HashMap::with_capacity(order.len());
        let mut out = Vec::new();
        for info in order {
            let mut size = 0usize;
            for &w in &info.write_stmts {
                let stmt = &self.stmts[w];
                size = size.saturating_add(stmt.expr_size);
                for (u, _) in &stmt.reads {
                    if u != &info.tn
                        && let Some(&inlined) = sizes.get(&u.id())
                    {
                        size = size.saturating_add(inlined);
                    }
                }
            }
            if size > max_size {
                out.push((
                    info.tn.clone(),
                    format!(
                        "inlining it would build an expression of {size} operations (more than \
                         virtualize_max_expr_size = {max_size}), so it is computed once"
                    ),
                ));
            } else {
                sizes.insert(info.tn.id(), size);
            }
        }
        out
    }

    /// Whether candidate `x`, which reads `u`, may be inlined although `u` is written before
    /// `x`'s last use, because that write is an update in place that `x` feeds element by
    /// element (an optimizer's `w := w - lr · g(w)`): the only write of `u` after `x`'s is its
    /// last use, one `Set` of `u` at indices `I`, each element written once, that reads `u`
    /// only at `I` and, of the candidates that depend on `u`, only ones computed element by
    /// element from `u` at `I`. Each element then reads `u`'s old value in the very assignment
    /// that replaces it.
    fn updated_in_place(
        &self,
        x: &Tnode,
        u: &Tnode,
        last: usize,
        candidates: &BTreeMap<Tnode, ()>,
    ) -> bool {
        let Some(&w) = self.nodes[&x.id()].write_stmts.first() else {
            return false;
        };
        let later: Vec<usize> = self.nodes[&u.id()]
            .write_stmts
            .iter()
            .copied()
            .filter(|&k| k > w && k <= last)
            .collect();
        if later != [last] {
            return false;
        }
        // Candidates written from `x`'s statement to the update that depend on `u`, and
        // whether each is computed element by element from `u` (and from such candidates) at
        // the element it writes.
        let mut depends: HashMap<usize, bool> = HashMap::new();
        for k in w..last {
            let stmt = &self.stmts[k];
            let [(y, at)] = &stmt.sets[..] else {
                for y in stmt.writes.iter().filter(|y| candidates.contains_key(*y)) {
                    if stmt
                        .reads
                        .iter()
                        .any(|(r, _)| r == u || depends.contains_key(&r.id()))
                    {
                        depends.insert(y.id(), false);
                    }
                }
                continue;
            };
            if !candidates.contains_key(y) {
                continue;
            }
            let mut reads_u = false;
            let mut pointwise = true;
            for (r, idcs) in &stmt.reads {
                let feeds = if r == u {
                    true
                } else {
                    match depends.get(&r.id()) {
                        Some(&p) => {
                            pointwise &= p;
                            true
                        }
                        None => false,
                    }
                };
                if feeds {
                    reads_u = true;
                    pointwise &= idcs == at;
                }
            }
            if reads_u {
                depends.insert(y.id(), pointwise);
            }
        }
        if depends.get(&x.id()) != Some(&true) {
            return false;
        }
        let update = &self.stmts[last];
        let [(target, at)] = &update.sets[..] else {
            return false;
        };
        target == u
            && update.writes_each_once
            && update.reads.iter().all(|(r, idcs)| {
                let feeds = r == u || depends.contains_key(&r.id());
                !feeds || (idcs == at && depends.get(&r.id()) != Some(&false))
            })
    }

    /// Candidates whose computation reads a node that is written again before the candidate's
    /// last use (inlining would read the new value), with the reason.
    pub fn hazards(&self, candidates: &BTreeMap<Tnode, ()>) -> Vec<(Tnode, String)> {
        let last_uses = self.last_uses(candidates);
        let mut out = Vec::new();
        for tn in candidates.keys() {
            let info = &self.nodes[&tn.id()];
            let last = last_uses[&tn.id()];
            let hazard = info.write_stmts.iter().find_map(|&w| {
                self.stmts[w].reads.iter().find_map(|(u, _)| {
                    (u != tn)
                        .then(|| &self.nodes[&u.id()])
                        .and_then(|ui| ui.write_stmts.iter().find(|&&k| k > w && k <= last))
                        .map(|_| u.clone())
                })
            });
            if let Some(u) = hazard
                && !self.updated_in_place(tn, &u, last, candidates)
            {
                out.push((
                    tn.clone(),
                    format!(
                        "{} which it reads is overwritten before its last use",
                        u.debug_name()
                    ),
                ));
            }
        }
        out
    }
}

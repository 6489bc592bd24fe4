//! Passes that leave the device idle, run together: consecutive small passes whose statements
//! touch no node the others write become the parts of one launch ([`JoinedLaunch`]).
//!
//! A routine's tail is often a long run of tiny passes: an optimizer's per-parameter norms
//! (one group each), its updates of small parameters, single-invocation bookkeeping; a
//! small model's step is mostly passes that take about as long as their launch. Alone, each
//! pays a launch and the tiny ones occupy one or a few compute units while the rest of the
//! device waits. Joined, their groups are numbered one after the other in one launch: every
//! group runs the part its number falls in, so the parts run side by side.
//!
//! Rules:
//! - **What joins**: zeroing, grid, rows, group-reduction and single-invocation passes whose
//!   own launch makes fewer than [`JOIN_MAX_WAVES`] times the groups that keep the device busy
//!   ([`GpuLimits::busy_groups`]): for those, a launch of their own is a large part of their
//!   time (a pass of a few waves takes about as long as its launch).
//!   Products (their staging and registers are tuned to their own launch) and grid reductions
//!   (two phases) run alone.
//! - **Independence**: a part joins only if it writes no node that the parts before it in the
//!   launch read or write, and reads no node they write (statements that run nothing between
//!   two parts count with the part after them, whose pass does their work). The parts then
//!   compute what they compute one after the other, whatever order their groups run in: the
//!   results are the same bits.
//! - **One group size**: parts with barriers (rows, group reductions) keep their group size,
//!   so their trees combine the same pairs; a launch holds only parts of one such size. Grid
//!   and zeroing parts take the launch's size (their invocations just number differently),
//!   single-invocation parts run on the first invocation of their one group.
//! - **Parameters**: the parts' buffers and static indices together stay within the device's
//!   budget for one launch ([`GpuLimits::joined_launch_parameters`]; 0: no joining, as on
//!   WebGPU, whose bindings per shader are few).
//! - **Order** ([`leveled_order`]): before joining, the passes are put in the order of their
//!   dependence levels — each runs right after the last pass it depends on (reads what it
//!   writes, or writes what it touches), in program order among those of one level — so that
//!   independent passes far apart in the program (an optimizer's steps for each parameter)
//!   become neighbours; or, counted from the end, each runs right before the first pass that
//!   depends on it, or those that depend on nothing first and the others as late as possible
//!   ([`Placement`]). The optimizer takes whichever order's plan is estimated fastest on a
//!   model of the device ([`super::plan`]; the program's own order where none is faster). A statement whose
//!   work another's pass does (a zeroing the next product or reduction starts from, an
//!   epilogue the product before runs) moves with it. A launch covers consecutive statements
//!   of the order.
//!
//! Joining is a permission, not a requirement: a renderer that launches each part on its own
//! computes the same results.

use std::collections::{BTreeSet, HashMap};

use super::{GpuLimits, GpuPass};
use crate::schedule::{Schedule, ScheduleKind};
use arrayjit_ir::indexing::AxisIndex;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::tnode::Tnode;

/// The parts of a node a statement reads or writes: all of it, or only elements at constant
/// flat positions (as the hoisted sums of one expression, each into its own element of one
/// local).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Whole,
    Elements(BTreeSet<i64>),
}

impl Part {
    fn overlaps(&self, other: &Part) -> bool {
        match (self, other) {
            (Part::Elements(a), Part::Elements(b)) => !a.is_disjoint(b),
            _ => true,
        }
    }

    fn add(&mut self, other: &Part) {
        match (&mut *self, other) {
            (Part::Elements(a), Part::Elements(b)) => a.extend(b),
            _ => *self = Part::Whole,
        }
    }
}

/// Records that part `p` of node `id` is accessed, beside what `map` already holds of it.
fn note(map: &mut HashMap<usize, Part>, id: usize, p: &Part) {
    match map.get_mut(&id) {
        Some(q) => q.add(p),
        None => {
            map.insert(id, p.clone());
        }
    }
}

/// What statements touch (read or write) and write, node by node.
#[derive(Clone, Debug, Default)]
struct Footprint {
    touched: HashMap<usize, Part>,
    written: HashMap<usize, Part>,
}

impl Footprint {
    fn of(stmt: &LowLevel) -> Footprint {
        let mut f = Footprint::default();
        let part = |tn: &Tnode, idcs: &[AxisIndex]| {
            let fixed = idcs.iter().all(|i| matches!(i, AxisIndex::Fixed(_)));
            match tn.flat_index(idcs) {
                AxisIndex::Fixed(e) if fixed => Part::Elements(BTreeSet::from([e])),
                _ => Part::Whole,
            }
        };
        stmt.visit(&mut |s| match s {
            LowLevel::Set { tn, idcs, .. } => {
                let p = part(tn, idcs);
                note(&mut f.written, tn.id(), &p);
                note(&mut f.touched, tn.id(), &p);
            }
            LowLevel::ZeroOut(tn) => {
                note(&mut f.written, tn.id(), &Part::Whole);
                note(&mut f.touched, tn.id(), &Part::Whole);
            }
            _ => {}
        });
        stmt.visit_exprs(&mut |e| {
            if let ScalarExpr::Get(tn, idcs) = e {
                note(&mut f.touched, tn.id(), &part(tn, idcs));
            }
        });
        f
    }

    fn add(&mut self, other: &Footprint) {
        for (map, from) in [
            (&mut self.touched, &other.touched),
            (&mut self.written, &other.written),
        ] {
            for (id, p) in from {
                note(map, *id, p);
            }
        }
    }

    /// Whether running `self` and `other` in either order could differ: one writes what the
    /// other touches.
    fn conflicts(&self, other: &Footprint) -> bool {
        let meets = |a: &HashMap<usize, Part>, b: &HashMap<usize, Part>| {
            a.iter()
                .any(|(id, p)| b.get(id).is_some_and(|q| p.overlaps(q)))
        };
        meets(&self.written, &other.touched) || meets(&other.written, &self.touched)
    }
}

/// A pass joins others only while its own launch makes fewer than this many times the groups
/// that keep the device busy: beyond, its launch is a small part of its time.
pub const JOIN_MAX_WAVES: u64 = 8;

/// Consecutive passes run by one launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinedLaunch {
    /// The top-level statements whose passes are its parts, in order; the statements between
    /// them run nothing.
    pub statements: Vec<usize>,
    /// Invocations per group of the launch.
    pub threads: u32,
    /// Why these passes run together.
    pub why: String,
}

impl JoinedLaunch {
    /// Groups a part of `shape` takes in a launch of `threads` invocations per group: one per
    /// grid point or `threads` elements for grid and zeroing parts (`elements` of them), its
    /// own groups for rows, one for a reduction or a single invocation.
    pub fn part_groups(pass: &GpuPass, threads: u32) -> u64 {
        let t = u64::from(threads.max(1));
        match pass {
            GpuPass::Zero { elements, .. } => elements.div_ceil(t).max(1),
            GpuPass::Grid { total, .. } => total.div_ceil(t).max(1),
            GpuPass::Rows { total, .. } => (*total).max(1),
            _ => 1,
        }
    }
}

/// Whether a pass may be a part of a joined launch, and the group size it requires (rows and
/// group reductions: their own), if any.
fn joinable(pass: &GpuPass) -> Option<Option<u32>> {
    match pass {
        GpuPass::Zero { .. } | GpuPass::Grid { .. } | GpuPass::Single => Some(None),
        GpuPass::Rows { threads, .. } | GpuPass::Reduction { threads, .. } => Some(Some(*threads)),
        _ => None,
    }
}

/// The group size a pass launches with on its own.
fn own_threads(pass: &GpuPass) -> u32 {
    match pass {
        GpuPass::Zero { threads, .. }
        | GpuPass::Grid { threads, .. }
        | GpuPass::Rows { threads, .. }
        | GpuPass::Reduction { threads, .. } => *threads,
        _ => 1,
    }
}

/// A launch being gathered.
#[derive(Default)]
struct Gathering {
    statements: Vec<usize>,
    /// Group size its barrier parts require.
    fixed: Option<u32>,
    /// The largest group size of its other parts.
    widest: u32,
    footprint: Footprint,
    parameters: usize,
}

impl Gathering {
    fn close(self, out: &mut Vec<JoinedLaunch>, schedules: &[Schedule]) {
        if self.statements.len() < 2 {
            return;
        }
        let threads = self.fixed.unwrap_or(self.widest).max(1);
        let groups: u64 = self
            .statements
            .iter()
            .filter_map(|&i| match &schedules[i].kind {
                ScheduleKind::Gpu(p) => Some(JoinedLaunch::part_groups(p, threads)),
                _ => None,
            })
            .sum();
        let why = format!(
            "{} passes touching no node another writes run side by side as one launch of {groups} \
             group(s) of {threads}",
            self.statements.len()
        );
        out.push(JoinedLaunch {
            statements: self.statements,
            threads,
            why,
        });
    }
}

/// Whether a schedule's pass runs the statement after it as its epilogue.
fn has_epilogue(sched: &Schedule) -> bool {
    matches!(
        &sched.kind,
        ScheduleKind::Gpu(
            GpuPass::Tiles {
                epilogue: Some(_),
                ..
            } | GpuPass::MatrixTiles {
                epilogue: Some(_),
                ..
            }
        )
    )
}

/// The latest level at which each node, or element of one, was accessed.
#[derive(Default)]
struct Levels {
    /// Per node: the latest level of an access to all of it, and to any part of it.
    node: HashMap<usize, (Option<usize>, usize)>,
    /// Per node and element: the latest level of an access to that element.
    element: HashMap<(usize, i64), usize>,
}

impl Levels {
    /// The latest level of an access that overlaps `part` of node `id`.
    fn latest(&self, id: usize, part: &Part) -> Option<usize> {
        let &(whole, any) = self.node.get(&id)?;
        match part {
            Part::Whole => Some(any),
            Part::Elements(es) => es
                .iter()
                .filter_map(|e| self.element.get(&(id, *e)).copied())
                .chain(whole)
                .max(),
        }
    }

    fn record(&mut self, id: usize, part: &Part, level: usize) {
        let entry = self.node.entry(id).or_insert((None, level));
        entry.1 = entry.1.max(level);
        match part {
            Part::Whole => entry.0 = Some(entry.0.map_or(level, |l| l.max(level))),
            Part::Elements(es) => {
                for e in es {
                    let l = self.element.entry((id, *e)).or_insert(level);
                    *l = (*l).max(level);
                }
            }
        }
    }
}

/// Where [`leveled_order`] puts each pass among those its dependences allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Right after the last pass it depends on (a forward pass's weight casts all at the
    /// start).
    Earliest,
    /// Right before the first pass that depends on it (an optimizer's per-parameter norms
    /// all just before the norm that adds them up).
    Latest,
    /// Passes that depend on no earlier pass first (a forward pass's weight casts), the others
    /// as late as possible. A valid order too: nothing precedes such a pass, and every pass
    /// after one comes at least a level later.
    SourcesFirst,
}

/// An order of dependence levels (see the module's doc) of a routine's top-level statements
/// and their GPU schedules, as the statements' indices; the identity where a statement is not
/// scheduled as a GPU pass.
pub fn leveled_order(
    statements: &[&LowLevel],
    schedules: &[Schedule],
    placement: Placement,
) -> Vec<usize> {
    leveled_orders(statements, schedules, &[placement])
        .pop()
        .unwrap_or_else(|| (0..statements.len()).collect())
}

/// [`leveled_order`] for each of `placements`, in order, from one analysis of the statements.
pub fn leveled_orders(
    statements: &[&LowLevel],
    schedules: &[Schedule],
    placements: &[Placement],
) -> Vec<Vec<usize>> {
    let identity: Vec<usize> = (0..statements.len()).collect();
    if schedules.len() != statements.len()
        || schedules
            .iter()
            .any(|s| !matches!(s.kind, ScheduleKind::Gpu(_)))
    {
        return vec![identity; placements.len()];
    }
    // Units that move together: a pass with the statements whose work it does.
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut pending: Vec<usize> = Vec::new();
    for (i, sched) in schedules.iter().enumerate() {
        if !matches!(sched.kind, ScheduleKind::Gpu(GpuPass::Nothing)) {
            pending.push(i);
            units.push(std::mem::take(&mut pending));
            continue;
        }
        let epilogue_of_previous = pending.is_empty()
            && i > 0
            && has_epilogue(&schedules[i - 1])
            && units.last().and_then(|u| u.last()) == Some(&(i - 1));
        match units.last_mut() {
            Some(unit) if epilogue_of_previous => unit.push(i),
            _ => pending.push(i),
        }
    }
    if !pending.is_empty() {
        units.push(pending);
    }
    // Each unit's level counted from the start (as early as possible) and, going backwards,
    // from the end (as late as possible).
    let footprints: Vec<Footprint> = units
        .iter()
        .map(|unit| {
            let mut f = Footprint::default();
            for &i in unit {
                f.add(&Footprint::of(statements[i]));
            }
            f
        })
        .collect();
    let from_start = levels(&footprints, 0..units.len());
    let from_end = levels(&footprints, (0..units.len()).rev());
    let deepest = from_end.iter().copied().max().unwrap_or(0);
    placements
        .iter()
        .map(|placement| {
            let mut keyed: Vec<(usize, usize)> = (0..units.len())
                .map(|u| {
                    let latest = deepest - from_end[u];
                    let key = match placement {
                        Placement::Earliest => from_start[u],
                        Placement::Latest => latest,
                        // A pass that depends on none may run first, with the others of its
                        // kind.
                        Placement::SourcesFirst if from_start[u] == 0 => 0,
                        Placement::SourcesFirst => latest + 1,
                    };
                    (key, u)
                })
                .collect();
            // Program order within a level.
            keyed.sort();
            keyed
                .into_iter()
                .flat_map(|(_, u)| units[u].iter().copied())
                .collect()
        })
        .collect()
}

/// Each unit's level, visiting them in `visit` order: one past the latest level that wrote a
/// part of a node it touches, or touched a part of a node it writes (0 where none did).
fn levels(footprints: &[Footprint], visit: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut writes = Levels::default();
    let mut touches = Levels::default();
    let mut out = vec![0; footprints.len()];
    for u in visit {
        let f = &footprints[u];
        let after = f
            .touched
            .iter()
            .filter_map(|(id, p)| writes.latest(*id, p))
            .chain(
                f.written
                    .iter()
                    .filter_map(|(id, p)| touches.latest(*id, p)),
            )
            .max();
        let level = after.map_or(0, |l| l + 1);
        for (id, p) in &f.written {
            writes.record(*id, p, level);
        }
        for (id, p) in &f.touched {
            touches.record(*id, p, level);
        }
        out[u] = level;
    }
    out
}

/// The launches that join consecutive passes of a routine (see the module's doc), given its
/// top-level statements and their schedules; empty where the device joins nothing.
pub fn joined_launches(
    statements: &[&LowLevel],
    schedules: &[Schedule],
    limits: &GpuLimits,
) -> Vec<JoinedLaunch> {
    let budget = limits.joined_launch_parameters;
    let mut out = Vec::new();
    if budget == 0 {
        return out;
    }
    let busy = limits.busy_groups();
    let mut open = Gathering::default();
    // What the statements since the last part touch: those that run nothing have their work
    // done by the next part's pass.
    let mut pending = Footprint::default();
    for (i, (stmt, sched)) in statements.iter().zip(schedules).enumerate() {
        let pass = match &sched.kind {
            ScheduleKind::Gpu(p) => p,
            _ => {
                std::mem::take(&mut open).close(&mut out, schedules);
                continue;
            }
        };
        pending.add(&Footprint::of(stmt));
        if matches!(pass, GpuPass::Nothing) {
            continue;
        }
        let footprint = std::mem::take(&mut pending);
        let requires = joinable(pass);
        let small = JoinedLaunch::part_groups(pass, own_threads(pass)) < busy * JOIN_MAX_WAVES;
        let Some(requires) = requires.filter(|_| small) else {
            std::mem::take(&mut open).close(&mut out, schedules);
            continue;
        };
        let parameters = stmt.nodes().len() + stmt.index_symbols().len();
        let fits = open.statements.is_empty()
            || ((requires.is_none() || open.fixed.is_none() || open.fixed == requires)
                && !footprint.conflicts(&open.footprint)
                && open.parameters + parameters <= budget);
        if !fits {
            std::mem::take(&mut open).close(&mut out, schedules);
        }
        open.statements.push(i);
        open.fixed = open.fixed.or(requires);
        if requires.is_none() {
            open.widest = open.widest.max(own_threads(pass));
        }
        open.footprint.add(&footprint);
        open.parameters += parameters;
    }
    open.close(&mut out, schedules);
    out
}

//! Array contraction on a CPU: a local array that one top-level statement alone uses, which
//! that statement's loops fill and read slice by slice, keeps one slice instead of all of them.
//!
//! Fusion puts a row's passes in one loop (a softmax row: its maximum, its exponentials, their
//! sum, the quotients), but an intermediate read twice stays an array of every row: each
//! iteration writes its row and reads it back while it is in the L1 cache, and the row then
//! travels to memory and back for nothing (a write and the read of its line for ownership).
//! Here such an array becomes a node of one slice, private to each iteration of the loops that
//! pin it ([`Tnode::new_iteration_private`]); a backend that splits those iterations over
//! workers gives each worker a copy of its own.
//!
//! Rules, each checked on the code, so a node contracted is always one for which it is exact:
//! 1. The node is local (lives only in this routine), unpadded, and exactly one top-level
//!    statement uses it, reading and writing it.
//! 2. That statement overwrites it before reading it ([`LowLevel::overwrites_all`]): no read
//!    sees a value from before the statement, or the zeros it starts with.
//! 3. The loops dropped are the chain of loops from the statement's top that enclose every use
//!    (a loop's body, or the one item of a sequence that uses the node); a loop of the chain is
//!    dropped when every read and write of the node indexes one axis by exactly its iterator.
//!    Then every value read in one iteration of the chain was written in that same iteration
//!    (only that iteration touches its slice, and rule 2 says the value was written in the
//!    statement), and within one iteration the slice's elements map one-to-one onto the
//!    contracted node's, so the iterations may share one copy when they run in turn.
//! 4. The slice is small: at most the stack threshold, and a statement's slices together at
//!    most four times it (each worker holds them on its stack).

use std::collections::{HashMap, HashSet};

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::tnode::Tnode;

/// How many stack thresholds of contracted slices one statement may hold.
const SLICES_PER_STATEMENT: usize = 4;

/// Contracts the local arrays of each top-level statement of `code` that the rules of this
/// module allow; returns the code and the new nodes (local, iteration-private). Linear in the
/// code's size: one walk of a statement gathers every node's uses, and one rewrites them all.
pub(crate) fn contract_iteration_slices(
    code: LowLevel,
    stack_threshold_bytes: usize,
) -> (LowLevel, Vec<Tnode>) {
    let stmts = match code {
        LowLevel::Seq(items) => items,
        LowLevel::Noop => return (LowLevel::Noop, Vec::new()),
        s => vec![s],
    };
    // How many top-level statements use each eligible node (an excluded use counts as another).
    let mut users: HashMap<usize, usize> = HashMap::new();
    let walked: Vec<HashMap<usize, Uses>> = stmts.iter().map(walk).collect();
    for uses in &walked {
        for (&id, u) in uses {
            *users.entry(id).or_default() += if u.excluded { 2 } else { 1 };
        }
    }
    let mut made = Vec::new();
    let mut out = Vec::with_capacity(stmts.len());
    for (s, uses) in stmts.into_iter().zip(walked) {
        let mut budget = stack_threshold_bytes.saturating_mul(SLICES_PER_STATEMENT);
        let mut plan = Plan::new();
        // In order of first use, so that the budget goes to the same nodes every time.
        let mut candidates: Vec<&Uses> = uses.values().collect();
        candidates.sort_by_key(|u| u.order);
        for u in candidates {
            let tn = &u.tn;
            if users.get(&tn.id()) != Some(&1) || !u.reads || !u.writes {
                continue;
            }
            let Some(dropped) = droppable_axes(&s, u) else {
                continue;
            };
            let mut dims: Vec<usize> = tn
                .dims()
                .iter()
                .enumerate()
                .filter(|(d, _)| !dropped.contains(d))
                .map(|(_, &n)| n)
                .collect();
            if dims.is_empty() {
                dims.push(1);
            }
            let bytes = dims.iter().product::<usize>() * tn.prec().size_in_bytes();
            if bytes > stack_threshold_bytes || bytes > budget {
                continue;
            }
            let label = format!("{}_slice", tn.label().join("_"));
            let why = format!(
                "optimizer: the slice of {} {} that one iteration of the loops around its uses \
                 writes and then reads (array contraction: only that iteration touches it, so \
                 the iterations reuse {bytes} bytes instead of keeping all {} of the array; \
                 each worker gets its own copy)",
                tn.debug_name(),
                tn.dims_to_string(false),
                tn.size_in_bytes()
            );
            let Ok(slice) = Tnode::new_iteration_private(tn.prec(), &dims, &[&label], &why) else {
                continue;
            };
            budget -= bytes;
            made.push(slice.clone());
            plan.insert(tn.id(), (slice, dropped));
        }
        out.push(if plan.is_empty() {
            s
        } else {
            rewrite(s, &plan)
        });
    }
    (LowLevel::seq(out), made)
}

/// Rule 1's node: local, unpadded, not itself a contracted slice.
fn eligible(tn: &Tnode) -> bool {
    tn.modes().is_local() && tn.padding().is_none() && !tn.is_iteration_private()
}

/// One step down a statement: into a loop's body, or to an item of a sequence.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Loop(Symbol, i64, i64),
    Item(usize),
}

/// What one statement does with one node.
struct Uses {
    tn: Tnode,
    /// The position of the node's first use in the walk.
    order: usize,
    /// The indices of every read and write.
    accesses: Vec<Vec<AxisIndex>>,
    reads: bool,
    writes: bool,
    /// Read from the merge buffer, or zeroed as a whole: never contracted.
    excluded: bool,
    /// The steps from the statement's top to its first use, and to its last.
    first: Vec<Step>,
    last: Vec<Step>,
    /// How many steps every use shares (the common prefix of all their paths).
    shared: usize,
}

/// Every node statement `s` uses that rule 1 lets contract ([`eligible`]: a property of the
/// node, so the others' uses are never gathered), with its uses: one walk (local-scope bodies
/// count as part of the statement whose value holds them).
fn walk(s: &LowLevel) -> HashMap<usize, Uses> {
    struct Walk {
        uses: HashMap<usize, Uses>,
        /// Nodes seen that are not eligible.
        skipped: HashSet<usize>,
    }
    fn note(out: &mut Walk, path: &[Step], tn: &Tnode, idcs: Option<&[AxisIndex]>, write: bool) {
        if out.skipped.contains(&tn.id()) {
            return;
        }
        if !out.uses.contains_key(&tn.id()) && !eligible(tn) {
            out.skipped.insert(tn.id());
            return;
        }
        let order = out.uses.len();
        let u = out.uses.entry(tn.id()).or_insert_with(|| Uses {
            tn: tn.clone(),
            order,
            accesses: Vec::new(),
            reads: false,
            writes: false,
            excluded: false,
            first: path.to_vec(),
            last: Vec::new(),
            shared: path.len(),
        });
        match idcs {
            Some(i) => u.accesses.push(i.to_vec()),
            None => u.excluded = true,
        }
        u.reads |= !write;
        u.writes |= write;
        u.shared = u
            .first
            .iter()
            .zip(path)
            .take(u.shared)
            .take_while(|(a, b)| a == b)
            .count();
        u.last.clear();
        u.last.extend_from_slice(path);
    }
    fn go(s: &LowLevel, path: &mut Vec<Step>, out: &mut Walk) {
        match s {
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                path.push(Step::Loop(*index, *from, *to));
                go(body, path, out);
                path.pop();
            }
            LowLevel::Seq(items) => {
                for (k, item) in items.iter().enumerate() {
                    path.push(Step::Item(k));
                    go(item, path, out);
                    path.pop();
                }
            }
            LowLevel::ZeroOut(tn) => note(out, path, tn, None, true),
            LowLevel::Set { .. } | LowLevel::SetLocal(..) => {
                s.visit(&mut |st| match st {
                    LowLevel::Set { tn, idcs, .. } => note(out, path, tn, Some(idcs), true),
                    LowLevel::ZeroOut(tn) => note(out, path, tn, None, true),
                    _ => {}
                });
                s.visit_exprs(&mut |e| match e {
                    ScalarExpr::Get(t, i) => note(out, path, t, Some(i), false),
                    ScalarExpr::GetMerge(t, _) => note(out, path, t, None, false),
                    _ => {}
                });
            }
            _ => {}
        }
    }
    let mut out = Walk {
        uses: HashMap::new(),
        skipped: HashSet::new(),
    };
    go(s, &mut Vec::new(), &mut out);
    out.uses
}

/// The axes of the node the loops around its every use in statement `s` pin (rules 2 and 3),
/// or `None` when none can be dropped or the statement may read a value it did not write.
fn droppable_axes(s: &LowLevel, u: &Uses) -> Option<Vec<usize>> {
    if u.excluded {
        return None;
    }
    let rank = u.tn.dims().len();
    if u.accesses.iter().any(|a| a.len() != rank) {
        return None;
    }
    let prefix = &u.first[..u.shared];
    let loops: Vec<(Symbol, i64, i64)> = prefix
        .iter()
        .filter_map(|step| match *step {
            Step::Loop(sym, from, to) => Some((sym, from, to)),
            Step::Item(_) => None,
        })
        .collect();
    let mut dropped = Vec::new();
    for &(iter, _, _) in &loops {
        let pinned = (0..rank).find(|d| {
            !dropped.contains(d)
                && u.accesses
                    .iter()
                    .all(|a| a[*d] == AxisIndex::Iterator(iter))
        });
        if let Some(d) = pinned {
            dropped.push(d);
        }
    }
    if dropped.is_empty() {
        return None;
    }
    // Rule 2, checked where the uses are: the innermost statement holding all of them, or the
    // run of items of a sequence from the first use's to the last's (what lies outside them
    // does not touch the node), under the loops around it.
    let mut at = s;
    for step in prefix {
        at = match (step, at) {
            (Step::Loop(..), LowLevel::For { body, .. }) => body,
            (Step::Item(k), LowLevel::Seq(items)) => items.get(*k)?,
            _ => return None,
        };
    }
    let overwritten = match (at, u.first.get(u.shared), u.last.get(u.shared)) {
        (LowLevel::Seq(items), Some(Step::Item(a)), Some(Step::Item(b))) if a <= b => {
            LowLevel::items_overwrite_all(items.get(*a..=*b)?, &u.tn, &loops)
        }
        (_, None, None) => at.overwrites_all_under(&u.tn, &loops),
        _ => false,
    };
    overwritten.then_some(dropped)
}

/// The indices of an access of the array with the dropped axes left out (index 0 of a slice
/// of one element when every axis is dropped).
fn kept(idcs: Vec<AxisIndex>, dropped: &[usize]) -> Vec<AxisIndex> {
    let kept: Vec<AxisIndex> = idcs
        .into_iter()
        .enumerate()
        .filter(|(d, _)| !dropped.contains(d))
        .map(|(_, i)| i)
        .collect();
    if kept.is_empty() {
        vec![AxisIndex::Fixed(0)]
    } else {
        kept
    }
}

/// The nodes contracted in a statement: each one's slice and the axes dropped.
type Plan = HashMap<usize, (Tnode, Vec<usize>)>;

/// Statement `s` with every access of a planned node made an access of its slice.
fn rewrite(s: LowLevel, plan: &Plan) -> LowLevel {
    s.map_writes(&mut |target, value, _| {
        let target = target.map(|(tn, idcs)| match plan.get(&tn.id()) {
            Some((slice, dropped)) => (slice.clone(), kept(idcs, dropped)),
            None => (tn, idcs),
        });
        (target, rewrite_expr(value, plan))
    })
}

/// Expression `e` with every read of a planned node made a read of its slice (local-scope
/// bodies included).
fn rewrite_expr(e: ScalarExpr, plan: &Plan) -> ScalarExpr {
    e.map_bottom_up(&mut |e| match e {
        ScalarExpr::Get(t, idcs) => match plan.get(&t.id()) {
            Some((slice, dropped)) => ScalarExpr::Get(slice.clone(), kept(idcs, dropped)),
            None => ScalarExpr::Get(t, idcs),
        },
        ScalarExpr::LocalScope { id, body } => ScalarExpr::LocalScope {
            id,
            body: Box::new(rewrite(*body, plan)),
        },
        e => e,
    })
}

#[cfg(test)]
mod tests;

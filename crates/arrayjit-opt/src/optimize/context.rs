//! Optimize contexts: what the optimizer remembers between routines compiled for one context
//! tree (the reference's `optimize_ctx`, `empty_optimize_ctx`). Every routine optimized in a
//! context records the computations of the nodes it made virtual (inlined into their uses); a
//! routine compiled later in that context that reads such a node without computing it gets the
//! node's computation put in front of its own code, so the optimizer inlines the node there too,
//! where without the context the read would ask for an array the node does not have (a
//! memory-mode conflict).
//!
//! Computations are kept in the order they were recorded, so one that reads another virtual
//! node follows that node's computation; a recorded computation that needs static indices the
//! later routine does not bind adds them to its bindings (the routine then takes them).
//! Cloning a context is cheap and shares it: a context's children see what it learned, and
//! what they learn.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use arrayjit_ir::indexing::StaticSymbol;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::tnode::{Tnode, lock};

/// The statements computing one virtual node, where they came from, and what they need.
#[derive(Clone)]
struct Computation {
    node: Tnode,
    /// Top-level statements in recording order (sequence numbers across the context).
    stmts: Vec<(u64, LowLevel)>,
    /// The static indices the statements use.
    statics: Vec<StaticSymbol>,
    /// The routine that defined it.
    routine: String,
}

#[derive(Default)]
struct Computations {
    next: u64,
    by_node: HashMap<usize, Computation>,
}

/// What the optimizer remembers between the routines of a context tree: the computations of
/// their virtual nodes (see the module documentation). [`OptimizeCtx::default`] is empty.
#[derive(Clone, Default)]
pub struct OptimizeCtx(Arc<Mutex<Computations>>);

impl fmt::Debug for OptimizeCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = lock(&self.0);
        let mut names: Vec<String> = c.by_node.values().map(|c| c.node.debug_name()).collect();
        names.sort();
        write!(f, "OptimizeCtx({names:?})")
    }
}

impl OptimizeCtx {
    /// A context that remembers nothing yet.
    pub fn empty() -> OptimizeCtx {
        OptimizeCtx::default()
    }

    /// The virtual nodes whose computations the context holds, by id, with the routine that
    /// defined each.
    pub fn computed_nodes(&self) -> Vec<(Tnode, String)> {
        let c = lock(&self.0);
        let mut out: Vec<(Tnode, String)> = c
            .by_node
            .values()
            .map(|c| (c.node.clone(), c.routine.clone()))
            .collect();
        out.sort_by_key(|(t, _)| t.id());
        out
    }

    /// Puts in front of `stmts` the recorded computations of the virtual nodes they read and
    /// do not write (and of the virtual nodes those read), in recording order; adds the static
    /// indices they need to `bindings`. Returns the nodes whose computations were added.
    pub(crate) fn expand(
        &self,
        stmts: &mut Vec<LowLevel>,
        bindings: &mut Vec<StaticSymbol>,
    ) -> Vec<Tnode> {
        let c = lock(&self.0);
        if c.by_node.is_empty() {
            return vec![];
        }
        let written: HashSet<usize> = stmts
            .iter()
            .flat_map(|s| s.written_nodes())
            .map(|t| t.id())
            .collect();
        let wanted = |t: &Tnode| {
            !written.contains(&t.id())
                && t.modes().known_virtual()
                && c.by_node.contains_key(&t.id())
        };
        let mut queue: Vec<Tnode> = stmts.iter().flat_map(reads).filter(wanted).collect();
        let mut added: Vec<Tnode> = Vec::new();
        let mut seen: HashSet<usize> = HashSet::new();
        let mut chosen: BTreeMap<u64, LowLevel> = BTreeMap::new();
        while let Some(t) = queue.pop() {
            if !seen.insert(t.id()) {
                continue;
            }
            let comp = &c.by_node[&t.id()];
            for (seq, s) in &comp.stmts {
                queue.extend(reads(s).into_iter().filter(wanted));
                chosen.insert(*seq, s.clone());
            }
            for s in &comp.statics {
                if !bindings.iter().any(|b| b.symbol == s.symbol) {
                    bindings.push(s.clone());
                }
            }
            added.push(t);
        }
        let mut expanded: Vec<LowLevel> = chosen.into_values().collect();
        expanded.append(stmts);
        *stmts = expanded;
        added
    }

    /// The computations of `virtuals` (nodes a routine named `routine` made virtual) in the
    /// routine's top-level statements before inlining: the statements writing each, when every
    /// node they write is virtual (a statement that also writes an array could not be repeated
    /// elsewhere). [`OptimizeCtx::record`] keeps them once the routine is optimized.
    pub(crate) fn computations(
        &self,
        routine: &str,
        stmts: &[LowLevel],
        virtuals: &[Tnode],
        bindings: &[StaticSymbol],
    ) -> Learned {
        let mut learned = Learned {
            stmt_count: stmts.len() as u64,
            computations: vec![],
        };
        if virtuals.is_empty() {
            return learned;
        }
        let virtual_ids: HashSet<usize> = virtuals.iter().map(Tnode::id).collect();
        let writes: Vec<Vec<Tnode>> = stmts.iter().map(LowLevel::written_nodes).collect();
        // Which statements write each node: one pass, so long programs stay linear.
        let mut writers: HashMap<usize, Vec<usize>> = HashMap::new();
        for (k, ws) in writes.iter().enumerate() {
            for w in ws {
                writers.entry(w.id()).or_default().push(k);
            }
        }
        for tn in virtuals {
            let writing: &[usize] = writers.get(&tn.id()).map_or(&[], Vec::as_slice);
            let only_virtual = writing
                .iter()
                .all(|&k| writes[k].iter().all(|w| virtual_ids.contains(&w.id())));
            if writing.is_empty() || !only_virtual {
                continue;
            }
            let symbols: HashSet<_> = writing
                .iter()
                .flat_map(|&k| stmts[k].index_symbols())
                .collect();
            learned.computations.push(Computation {
                node: tn.clone(),
                stmts: writing
                    .iter()
                    .map(|&k| (k as u64, stmts[k].clone()))
                    .collect(),
                statics: bindings
                    .iter()
                    .filter(|b| symbols.contains(&b.symbol))
                    .cloned()
                    .collect(),
                routine: routine.to_string(),
            });
        }
        learned
    }

    /// Keeps what a routine's optimization learned (replacing earlier computations of the same
    /// nodes), after every computation recorded before.
    pub(crate) fn record(&self, learned: Learned) {
        let mut c = lock(&self.0);
        let base = c.next;
        c.next += learned.stmt_count;
        for mut comp in learned.computations {
            for (seq, _) in &mut comp.stmts {
                *seq += base;
            }
            c.by_node.insert(comp.node.id(), comp);
        }
    }
}

/// What one routine's optimization learned for its context.
pub(crate) struct Learned {
    /// The routine's top-level statements (sequence numbers it takes).
    stmt_count: u64,
    computations: Vec<Computation>,
}

/// The nodes a statement reads.
fn reads(s: &LowLevel) -> Vec<Tnode> {
    let mut out = Vec::new();
    s.visit_exprs(&mut |e| {
        if let ScalarExpr::Get(t, _) = e {
            out.push(t.clone());
        }
    });
    out
}

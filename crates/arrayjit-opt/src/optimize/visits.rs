//! Visit counting: how many times the most-read element of each node is read by a routine's
//! statements, with every loop cut to its first `max_dim` iterations (the optimizer's bounded
//! symbolic tracing). A node is inlined only if no element is read more often than
//! `virtualize_max_visits`, so the count decides fusion.
//!
//! Rules:
//! 1. A read is *uniform* when each axis's index depends on at most one enclosing loop, no loop
//!    feeds two axes, and no index can overflow over the traced range. It then maps the traced
//!    iterations of the loops it uses one-to-one onto elements, and every element it touches is
//!    read once per traced iteration of the loops it does not use.
//! 2. If all of a node's reads are uniform and touch one common element (the element of each
//!    read's first traced iteration), the most-read element is read the sum of their counts: no
//!    element can be read more, and that element is read by all of them. This is computed
//!    without tracing.
//! 3. Otherwise the statements reading the node are traced iteration by iteration and each
//!    element's reads are counted, as OCANNL's visit tracing does.
//! 4. An index that names a symbol bound by no enclosing loop reads it as 0; an index that
//!    overflows reads as 0.
//!
//! Rules 1 and 2 are checked against plain tracing by the property test at the end.

use rustc_hash::{FxHashMap, FxHashSet};

use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};

/// The most reads of one element of each node, for the nodes `counted` names per statement
/// (`(statement index, node ids)`; reads of other nodes are not counted), with loops cut to
/// `max_dim` iterations. Nodes whose counted reads are never reached are absent.
pub(super) fn max_visits(
    stmts: &[LowLevel],
    counted: &[(usize, FxHashSet<usize>)],
    max_dim: usize,
) -> FxHashMap<usize, usize> {
    let mut planner = TracePlanner::new(max_dim);
    planner.surveying = true;
    for (k, ids) in counted {
        planner.counted.clone_from(ids);
        planner.statement(&stmts[*k], &mut Vec::new());
    }
    planner.surveying = false;
    let summaries = std::mem::take(&mut planner.summaries);
    let traced: Vec<(usize, FxHashSet<usize>)> = counted
        .iter()
        .map(|(k, ids)| {
            let ids = ids
                .iter()
                .copied()
                .filter(|id| matches!(summaries.get(id), Some(ReadSummary::Traced)))
                .collect();
            (*k, ids)
        })
        .collect();
    let mut out = trace_statements(&mut planner, stmts, &traced);
    for (id, summary) in summaries {
        if let ReadSummary::Uniform { count, .. } = summary {
            out.insert(id, count);
        }
    }
    out
}

/// [`max_visits`] by tracing every counted read (rule 3 alone): the reference the property test
/// compares with.
#[cfg(test)]
fn traced_max_visits(
    stmts: &[LowLevel],
    counted: &[(usize, FxHashSet<usize>)],
    max_dim: usize,
) -> FxHashMap<usize, usize> {
    trace_statements(&mut TracePlanner::new(max_dim), stmts, counted)
}

/// Traces the counted reads of each statement (rule 3): the most reads of one element per node.
fn trace_statements(
    planner: &mut TracePlanner,
    stmts: &[LowLevel],
    counted: &[(usize, FxHashSet<usize>)],
) -> FxHashMap<usize, usize> {
    let mut counts = VisitCounts::default();
    for (k, ids) in counted.iter().filter(|(_, ids)| !ids.is_empty()) {
        planner.counted.clone_from(ids);
        let mut plan = Vec::new();
        planner.statement(&stmts[*k], &mut plan);
        trace_visits(&plan, &mut Vec::new(), &mut counts);
    }
    let mut out = FxHashMap::default();
    counts.max_per_node(&mut out);
    out
}

/// Reads per element, `(node id, index)` → count. An index of at most 4 axes, each in
/// `0..2^16`, is packed into one word (no allocation per read); other indices are kept as
/// vectors. A node's accesses all have its rank, so packing never merges two elements.
#[derive(Default)]
struct VisitCounts {
    packed: FxHashMap<(usize, u64), usize>,
    general: FxHashMap<(usize, Vec<i64>), usize>,
    index: Vec<i64>,
}

impl VisitCounts {
    /// Counts one read of element `index` of node `id` (the index in `self.index`).
    fn add(&mut self, id: usize) {
        let fits = self.index.len() <= 4 && self.index.iter().all(|&i| (0..1 << 16).contains(&i));
        if fits {
            let key = self
                .index
                .iter()
                .enumerate()
                .fold(0u64, |k, (axis, &i)| k | (i as u64) << (16 * axis));
            *self.packed.entry((id, key)).or_insert(0) += 1;
        } else {
            *self.general.entry((id, self.index.clone())).or_insert(0) += 1;
        }
    }

    /// The most reads of one element of each node read.
    fn max_per_node(self, out: &mut FxHashMap<usize, usize>) {
        let packed = self.packed.into_iter().map(|((id, _), n)| (id, n));
        for (id, n) in packed.chain(self.general.into_iter().map(|((id, _), n)| (id, n))) {
            let m = out.entry(id).or_insert(0);
            *m = (*m).max(n);
        }
    }
}

/// An index of a traced read: `offset + Σ coeff · env[slot]`, where a slot holds the value of
/// an enclosing traced loop. Symbols bound by no enclosing loop read as 0.
struct SlotIndex {
    offset: i64,
    terms: Vec<(i64, usize)>,
}

impl SlotIndex {
    fn new(i: &AxisIndex, scope: &[Symbol]) -> SlotIndex {
        let slot = |s: &Symbol| scope.iter().rposition(|x| x == s);
        match i {
            AxisIndex::Fixed(v) => SlotIndex {
                offset: *v,
                terms: vec![],
            },
            AxisIndex::Iterator(s) => SlotIndex {
                offset: 0,
                terms: slot(s).map(|k| (1, k)).into_iter().collect(),
            },
            AxisIndex::Affine { terms, offset } => SlotIndex {
                offset: *offset,
                terms: terms
                    .iter()
                    .filter_map(|(c, s)| slot(s).map(|k| (*c, k)))
                    .collect(),
            },
        }
    }

    /// The index at `env` (0 if it overflows).
    fn eval(&self, env: &[i64]) -> i64 {
        self.terms
            .iter()
            .try_fold(self.offset, |acc, &(c, k)| {
                c.checked_mul(env[k]).and_then(|t| acc.checked_add(t))
            })
            .unwrap_or(0)
    }
}

/// A statement prepared for tracing: its loops (cut to the tracing bound) and the counted reads
/// of its values, with indices over loop slots. Built once per statement, so tracing an
/// iteration neither hashes symbols nor walks expressions.
enum TracePlan {
    Loop {
        slot: usize,
        from: i64,
        end: i64,
        body: Vec<TracePlan>,
    },
    Read {
        id: usize,
        index: Vec<SlotIndex>,
    },
}

/// Plans the tracing of statements (see [`TracePlan`]).
struct TracePlanner {
    /// The nodes whose reads the statement being planned counts.
    counted: FxHashSet<usize>,
    /// Surveying (summarizing each counted read in `summaries`) rather than planning.
    surveying: bool,
    /// What the survey found about each counted node's reads.
    summaries: FxHashMap<usize, ReadSummary>,
    max_dim: usize,
    /// The enclosing traced loops, innermost last: symbol, first value, end.
    scope: Vec<(Symbol, i64, i64)>,
}

impl TracePlanner {
    /// A planner for loops cut to `max_dim` iterations, planning (not surveying).
    fn new(max_dim: usize) -> TracePlanner {
        TracePlanner {
            counted: FxHashSet::default(),
            surveying: false,
            summaries: FxHashMap::default(),
            max_dim,
            scope: Vec::new(),
        }
    }

    /// Plans statement `s`, appending to `out`.
    fn statement(&mut self, s: &LowLevel, out: &mut Vec<TracePlan>) {
        match s {
            LowLevel::Seq(items) => items.iter().for_each(|i| self.statement(i, out)),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                let end = (*to).min(from.saturating_add(self.max_dim as i64));
                if *from >= end {
                    return;
                }
                self.scope.push((*index, *from, end));
                let mut inner = Vec::new();
                self.statement(body, &mut inner);
                self.scope.pop();
                if !inner.is_empty() {
                    out.push(TracePlan::Loop {
                        slot: self.scope.len(),
                        from: *from,
                        end,
                        body: inner,
                    });
                }
            }
            LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => self.value(value, out),
            _ => {}
        }
    }

    /// The counted reads of one value, then the statements of its local scopes.
    fn value(&mut self, e: &ScalarExpr, out: &mut Vec<TracePlan>) {
        self.reads(e, out);
        let mut bodies = Vec::new();
        collect_scopes(e, &mut bodies);
        for body in bodies {
            self.statement(body, out);
        }
    }

    /// The counted reads of an expression, local-scope bodies left out.
    fn reads(&mut self, e: &ScalarExpr, out: &mut Vec<TracePlan>) {
        if let ScalarExpr::Get(tn, idcs) = e
            && self.counted.contains(&tn.id())
        {
            let id = tn.id();
            if self.surveying {
                let read = self.uniform_read(idcs);
                let summary = self
                    .summaries
                    .entry(id)
                    .or_insert_with(|| ReadSummary::Uniform {
                        count: 0,
                        first: idcs.iter().map(|_| 0).collect(),
                    });
                summary.add(read);
            } else {
                let symbols: Vec<Symbol> = self.scope.iter().map(|l| l.0).collect();
                out.push(TracePlan::Read {
                    id,
                    index: idcs.iter().map(|i| SlotIndex::new(i, &symbols)).collect(),
                })
            }
        }
        e.for_each_child(|c| self.reads(c, out));
    }

    /// How often tracing counts each element this read touches, and the element of its first
    /// traced iteration, if every element it touches is counted equally often: when each axis's
    /// index depends on at most one enclosing loop, no loop feeds two axes, and no index can
    /// overflow, the read maps the traced iterations of the loops it uses one-to-one onto
    /// elements, and each element is read once per iteration of the loops it does not use.
    fn uniform_read(&self, idcs: &[AxisIndex]) -> Option<(usize, Vec<i64>)> {
        let slot = |s: &Symbol| self.scope.iter().rposition(|l| l.0 == *s);
        let mut used = vec![false; self.scope.len()];
        let mut use_slot = |k: usize, coeff: i64, offset: i64| -> Option<i64> {
            let (_, from, end) = self.scope[k];
            // Both ends must evaluate without overflow (tracing reads an overflow as 0).
            let first = coeff.checked_mul(from)?.checked_add(offset)?;
            coeff.checked_mul(end - 1)?.checked_add(offset)?;
            (!std::mem::replace(&mut used[k], true)).then_some(first)
        };
        let mut first = Vec::with_capacity(idcs.len());
        for i in idcs {
            first.push(match i {
                AxisIndex::Fixed(v) => *v,
                AxisIndex::Iterator(s) => match slot(s) {
                    Some(k) => use_slot(k, 1, 0)?,
                    None => 0,
                },
                AxisIndex::Affine { terms, offset } => {
                    let mut in_scope = terms.iter().filter_map(|(c, s)| slot(s).map(|k| (k, *c)));
                    match in_scope.next() {
                        Some((k, c)) if in_scope.next().is_none() => use_slot(k, c, *offset)?,
                        Some(_) => return None,
                        None => *offset,
                    }
                }
            });
        }
        let count = self
            .scope
            .iter()
            .zip(&used)
            .filter(|(_, used)| !**used)
            .fold(1usize, |n, (&(_, from, end), _)| {
                n.saturating_mul((end - from) as usize)
            });
        Some((count, first))
    }
}

/// What the survey of a node's reads found: every read counts the elements it touches equally
/// often, and all of them touch one element (that of their first traced iteration), so the
/// most-read element is read the sum of their counts; or not, and the reads are traced.
enum ReadSummary {
    Uniform { count: usize, first: Vec<i64> },
    Traced,
}

impl ReadSummary {
    /// Adds one read (see [`TracePlanner::uniform_read`]).
    fn add(&mut self, read: Option<(usize, Vec<i64>)>) {
        *self = match (std::mem::replace(self, ReadSummary::Traced), read) {
            (ReadSummary::Uniform { count: 0, .. }, Some((n, first))) => {
                ReadSummary::Uniform { count: n, first }
            }
            (ReadSummary::Uniform { count, first }, Some((n, f))) if f == first => {
                ReadSummary::Uniform {
                    count: count.saturating_add(n),
                    first,
                }
            }
            _ => ReadSummary::Traced,
        }
    }
}

/// The bodies of the local scopes in an expression, outermost first.
fn collect_scopes<'a>(e: &'a ScalarExpr, out: &mut Vec<&'a LowLevel>) {
    if let ScalarExpr::LocalScope { body, .. } = e {
        out.push(body);
        return;
    }
    e.for_each_child(|c| collect_scopes(c, out));
}

/// Counts the reads of a planned statement at every traced iteration.
fn trace_visits(plan: &[TracePlan], env: &mut Vec<i64>, counts: &mut VisitCounts) {
    for p in plan {
        match p {
            TracePlan::Loop {
                slot,
                from,
                end,
                body,
            } => {
                if env.len() <= *slot {
                    env.resize(slot + 1, 0);
                }
                for v in *from..*end {
                    env[*slot] = v;
                    trace_visits(body, env, counts);
                }
            }
            TracePlan::Read { id, index } => {
                counts.index.clear();
                counts.index.extend(index.iter().map(|i| i.eval(env)));
                counts.add(*id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rustc_hash::FxHashSet;

    use arrayjit_ir::indexing::{AxisIndex, Symbol};
    use arrayjit_ir::low_level::{LowLevel, ScalarExpr, ScopeId};
    use arrayjit_ir::prec::Prec;
    use arrayjit_ir::tnode::Tnode;

    /// A generated statement: loops over one of four symbols (shadowing and unbound symbols
    /// included), reads of one of four nodes, and local scopes.
    #[derive(Clone, Debug)]
    enum Gen {
        Loop {
            symbol: usize,
            from: i64,
            len: i64,
            body: Vec<Gen>,
        },
        Read {
            node: usize,
            axes: Vec<(i64, Vec<(i64, usize)>)>,
        },
        Scope(Vec<Gen>),
    }

    fn arb_axis() -> impl Strategy<Value = (i64, Vec<(i64, usize)>)> {
        let coeff = prop_oneof![4 => -2i64..3, 1 => Just(i64::MAX / 2)];
        (
            -2i64..3,
            proptest::collection::vec((coeff, 0usize..4), 0..3),
        )
    }

    fn arb_gen() -> impl Strategy<Value = Gen> {
        let read = (0usize..4, proptest::collection::vec(arb_axis(), 3))
            .prop_map(|(node, axes)| Gen::Read { node, axes });
        read.prop_recursive(4, 24, 3, |inner| {
            prop_oneof![
                4 => (0usize..4, -2i64..2, 0i64..8, proptest::collection::vec(inner.clone(), 1..3))
                    .prop_map(|(symbol, from, len, body)| Gen::Loop { symbol, from, len, body }),
                1 => proptest::collection::vec(inner, 1..3).prop_map(Gen::Scope),
            ]
        })
    }

    struct World {
        nodes: Vec<Tnode>,
        symbols: Vec<Symbol>,
        out: Tnode,
    }

    /// The statement `g` describes; reads inside a scope set its local variable.
    fn build(g: &Gen, w: &World, local: Option<ScopeId>) -> LowLevel {
        match g {
            Gen::Loop {
                symbol,
                from,
                len,
                body,
            } => LowLevel::For {
                index: w.symbols[*symbol],
                from: *from,
                to: from + len,
                body: Box::new(LowLevel::Seq(
                    body.iter().map(|b| build(b, w, local)).collect(),
                )),
            },
            Gen::Read { node, axes } => {
                let rank = node % 3 + 1;
                let idcs = axes[..rank]
                    .iter()
                    .map(|(offset, terms)| {
                        AxisIndex::affine(terms.iter().map(|&(c, s)| (c, w.symbols[s])), *offset)
                    })
                    .collect();
                let value = ScalarExpr::Get(w.nodes[*node].clone(), idcs);
                match local {
                    Some(id) => LowLevel::SetLocal(id, value),
                    None => LowLevel::Set {
                        tn: w.out.clone(),
                        idcs: vec![AxisIndex::Fixed(0)],
                        value,
                    },
                }
            }
            Gen::Scope(body) => {
                let id = ScopeId::fresh(Prec::F32);
                let value = ScalarExpr::LocalScope {
                    id,
                    body: Box::new(LowLevel::Seq(
                        body.iter().map(|b| build(b, w, Some(id))).collect(),
                    )),
                };
                match local {
                    Some(outer) => LowLevel::SetLocal(outer, value),
                    None => LowLevel::Set {
                        tn: w.out.clone(),
                        idcs: vec![AxisIndex::Fixed(0)],
                        value,
                    },
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// The survey (rules 1 and 2) gives the counts that tracing every read gives.
        #[test]
        fn surveyed_counts_equal_traced_counts(
            stmts in proptest::collection::vec(arb_gen(), 1..5),
            max_dim in 1usize..6,
            skip in 0usize..5,
        ) {
            let world = World {
                nodes: (0..4)
                    .map(|k| Tnode::new(Prec::F32, &vec![8; k % 3 + 1], &[&format!("n{k}")]).unwrap())
                    .collect(),
                symbols: (0..4).map(|_| Symbol::fresh()).collect(),
                out: Tnode::new(Prec::F32, &[1], &["out"]).unwrap(),
            };
            let code: Vec<LowLevel> = stmts.iter().map(|g| build(g, &world, None)).collect();
            // Every statement counts every node but one (`skip`, which no statement counts when
            // it is 4).
            let ids: FxHashSet<usize> = world
                .nodes
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != skip)
                .map(|(_, t)| t.id())
                .collect();
            let counted: Vec<(usize, FxHashSet<usize>)> =
                (0..code.len()).map(|k| (k, ids.clone())).collect();
            let fast = super::max_visits(&code, &counted, max_dim);
            let traced = super::traced_max_visits(&code, &counted, max_dim);
            prop_assert_eq!(fast, traced);
        }
    }
}

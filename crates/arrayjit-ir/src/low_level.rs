//! The loop IR (`LowLevel` statements over `ScalarExpr` expressions) and its pretty-printer.
//!
//! Indices in `Set`/`Get` are logical: they range over the node's logical dims, and may reach
//! into a padded node's margins (from `-left` to `dim + right - 1`). Renderers and the
//! interpreter add the left padding when addressing storage.

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use crate::indexing::{AxisIndex, Symbol};
use crate::ops::{BinOp, TernOp, UnOp};
use crate::prec::Prec;
use crate::tnode::Tnode;

/// A scalar variable local to one statement: the result of an inlined (virtual) computation or a
/// common subexpression. Its precision is the compute type of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId {
    /// Unique id.
    pub id: usize,
    /// Precision of the variable.
    pub prec: Prec,
}

impl ScopeId {
    /// A fresh local variable of the given precision.
    pub fn fresh(prec: Prec) -> ScopeId {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        ScopeId {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            prec,
        }
    }
}

/// A statement of the loop IR.
#[derive(Clone, Debug, PartialEq)]
pub enum LowLevel {
    /// Does nothing.
    Noop,
    /// A comment carried into generated code.
    Comment(String),
    /// Statements in order.
    Seq(Vec<LowLevel>),
    /// `for index in from..to { body }`.
    For {
        /// The loop variable.
        index: Symbol,
        /// First value.
        from: i64,
        /// One past the last value.
        to: i64,
        /// The loop body.
        body: Box<LowLevel>,
    },
    /// Sets every stored element of the node (margins included) to zero.
    ZeroOut(Tnode),
    /// `tn[idcs] = value`, with `value` computed in the node's compute precision.
    Set {
        /// The node written.
        tn: Tnode,
        /// Logical index of each axis.
        idcs: Vec<AxisIndex>,
        /// The value, computed in `tn.prec().compute_prec()`.
        value: ScalarExpr,
    },
    /// Assigns a local variable (inside a [`ScalarExpr::LocalScope`] body).
    SetLocal(ScopeId, ScalarExpr),
}

/// A scalar expression of the loop IR. Every expression is evaluated in the compute precision of
/// the statement it belongs to; reads of nodes of other precisions are converted.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarExpr {
    /// Declares local `id` (holding zero), runs `body`, then yields the local's value. The local
    /// stays readable (with [`ScalarExpr::GetLocal`]) until the end of the enclosing statement.
    LocalScope {
        /// The local variable.
        id: ScopeId,
        /// Statements that compute it.
        body: Box<LowLevel>,
    },
    /// Reads a local variable.
    GetLocal(ScopeId),
    /// Reads a node.
    Get(Tnode, Vec<AxisIndex>),
    /// Reads the stream's merge buffer, which holds a copy of the node (from another device).
    GetMerge(Tnode, Vec<AxisIndex>),
    /// The value of an index expression.
    EmbedIndex(AxisIndex),
    /// A data-dependent read (a gather): binds `symbol` to the value of `index`, truncated
    /// toward zero, and evaluates `read`, whose indices use `symbol` as a loop iterator over
    /// `0..extent`. An index outside `0 <= index < extent` (NaN included) reads nothing: the
    /// interpreter reports [`crate::error::Error::IndexOutOfBounds`], and compiled code yields NaN
    /// (zero in integer precisions) without touching memory.
    Gather {
        /// The symbol bound to the index inside `read`.
        symbol: Symbol,
        /// The exclusive upper bound of valid index values.
        extent: usize,
        /// The index, computed in the statement's compute precision.
        index: Box<ScalarExpr>,
        /// The read performed with `symbol` bound.
        read: Box<ScalarExpr>,
    },
    /// A uniform random value in `[0, 1)`: [`crate::random::device_uniform`]`(seed, stream,
    /// index, step)`, with `step` evaluated in `u32` precision (whatever the statement's
    /// precision) and `index` as a 64-bit integer. Pure: the same inputs give the same value in
    /// the interpreter and every backend.
    Random {
        /// The Philox key.
        seed: u64,
        /// The stream (third counter word).
        stream: u32,
        /// The position (first two counter words).
        index: AxisIndex,
        /// The step (last counter word), read at run time.
        step: Box<ScalarExpr>,
    },
    /// A constant (converted to the compute precision).
    Constant(f64),
    /// A unary operation.
    Unop(UnOp, Box<ScalarExpr>),
    /// A binary operation.
    Binop(BinOp, Box<ScalarExpr>, Box<ScalarExpr>),
    /// A ternary operation.
    Ternop(TernOp, Box<ScalarExpr>, Box<ScalarExpr>, Box<ScalarExpr>),
}

impl ScalarExpr {
    /// `op(a)`.
    pub fn unop(op: UnOp, a: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Unop(op, Box::new(a))
    }
    /// `op(a, b)`.
    pub fn binop(op: BinOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Binop(op, Box::new(a), Box::new(b))
    }
    /// `op(a, b, c)`.
    pub fn ternop(op: TernOp, a: ScalarExpr, b: ScalarExpr, c: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Ternop(op, Box::new(a), Box::new(b), Box::new(c))
    }
    /// A gather (see [`ScalarExpr::Gather`]).
    pub fn gather(
        symbol: Symbol,
        extent: usize,
        index: ScalarExpr,
        read: ScalarExpr,
    ) -> ScalarExpr {
        ScalarExpr::Gather {
            symbol,
            extent,
            index: Box::new(index),
            read: Box::new(read),
        }
    }

    /// A random value (see [`ScalarExpr::Random`]).
    pub fn random(seed: u64, stream: u32, index: AxisIndex, step: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Random {
            seed,
            stream,
            index,
            step: Box::new(step),
        }
    }

    /// Calls `f` on every direct subexpression (not into local-scope bodies).
    pub fn for_each_child<'a>(&'a self, mut f: impl FnMut(&'a ScalarExpr)) {
        match self {
            ScalarExpr::Unop(_, a) => f(a),
            ScalarExpr::Binop(_, a, b) => {
                f(a);
                f(b)
            }
            ScalarExpr::Ternop(_, a, b, c) => {
                f(a);
                f(b);
                f(c)
            }
            ScalarExpr::Gather { index, read, .. } => {
                f(index);
                f(read)
            }
            ScalarExpr::Random { step, .. } => f(step),
            _ => {}
        }
    }

    /// Calls `f` on every node of the expression, pre-order, including the expressions of
    /// local-scope bodies.
    pub fn visit_all(&self, f: &mut impl FnMut(&ScalarExpr)) {
        f(self);
        if let ScalarExpr::LocalScope { body, .. } = self {
            body.visit_exprs(f);
        }
        self.for_each_child(|c| c.visit_all(f));
    }

    /// Whether the expression reads `tn` anywhere (local-scope bodies included).
    pub fn reads(&self, tn: &Tnode) -> bool {
        let mut found = false;
        self.visit_all(&mut |e| {
            if let ScalarExpr::Get(t, _) | ScalarExpr::GetMerge(t, _) = e {
                found |= t == tn;
            }
        });
        found
    }

    /// Rebuilds the expression bottom-up with `f` applied to every node (local-scope bodies are
    /// left as they are).
    pub fn map_bottom_up(self, f: &mut impl FnMut(ScalarExpr) -> ScalarExpr) -> ScalarExpr {
        let rebuilt = match self {
            ScalarExpr::Unop(op, a) => ScalarExpr::unop(op, a.map_bottom_up(f)),
            ScalarExpr::Binop(op, a, b) => {
                let a = a.map_bottom_up(f);
                ScalarExpr::binop(op, a, b.map_bottom_up(f))
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = a.map_bottom_up(f);
                let b = b.map_bottom_up(f);
                ScalarExpr::ternop(op, a, b, c.map_bottom_up(f))
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                let index = index.map_bottom_up(f);
                ScalarExpr::gather(symbol, extent, index, read.map_bottom_up(f))
            }
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => ScalarExpr::random(seed, stream, index, step.map_bottom_up(f)),
            e => e,
        };
        f(rebuilt)
    }
}

impl LowLevel {
    /// A sequence, flattening nested sequences and dropping no-ops.
    pub fn seq(items: impl IntoIterator<Item = LowLevel>) -> LowLevel {
        let mut out = Vec::new();
        for item in items {
            match item {
                LowLevel::Noop => {}
                LowLevel::Seq(inner) => out.extend(inner),
                s => out.push(s),
            }
        }
        match out.len() {
            0 => LowLevel::Noop,
            1 => out.pop().expect("one element"),
            _ => LowLevel::Seq(out),
        }
    }

    /// Rebuilds the statements with `f` applied to the value of every `Set` and `SetLocal`
    /// (given the precision the value is computed in); loops and sequences are kept.
    pub fn map_values(self, f: &mut impl FnMut(ScalarExpr, Prec) -> ScalarExpr) -> LowLevel {
        self.map_writes(&mut |target, value, prec| (target, f(value, prec)))
    }

    /// Replaces a symbol by an index everywhere in the code (statements, values, local scopes).
    pub fn substitute(self, symbol: Symbol, by: &AxisIndex) -> LowLevel {
        let subst: HashMap<Symbol, AxisIndex> = HashMap::from([(symbol, by.clone())]);
        self.substitute_all(&subst)
    }

    fn substitute_all(self, subst: &HashMap<Symbol, AxisIndex>) -> LowLevel {
        self.map_writes(&mut |target, value, _| {
            let target =
                target.map(|(tn, v)| (tn, v.into_iter().map(|i| i.substitute(subst)).collect()));
            (target, substitute_expr(value, subst))
        })
    }

    /// Rebuilds the statements with `f` applied to every write: the node and indices (`None`
    /// for a local) and the value of each `Set` and `SetLocal`, with the value's precision.
    pub fn map_writes(
        self,
        f: &mut impl FnMut(
            Option<(Tnode, Vec<AxisIndex>)>,
            ScalarExpr,
            Prec,
        ) -> (Option<(Tnode, Vec<AxisIndex>)>, ScalarExpr),
    ) -> LowLevel {
        match self {
            LowLevel::Seq(items) => {
                LowLevel::Seq(items.into_iter().map(|i| i.map_writes(f)).collect())
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => LowLevel::For {
                index,
                from,
                to,
                body: Box::new(body.map_writes(f)),
            },
            LowLevel::Set { tn, idcs, value } => {
                let prec = tn.prec();
                let (target, value) = f(Some((tn.clone(), idcs)), value, prec);
                let (tn, idcs) = target.unwrap_or((tn, Vec::new()));
                LowLevel::Set { tn, idcs, value }
            }
            LowLevel::SetLocal(id, value) => LowLevel::SetLocal(id, f(None, value, id.prec).1),
            s => s,
        }
    }

    /// Calls `f` on every statement, pre-order, including statements inside local scopes.
    pub fn visit(&self, f: &mut impl FnMut(&LowLevel)) {
        f(self);
        match self {
            LowLevel::Seq(items) => items.iter().for_each(|s| s.visit(f)),
            LowLevel::For { body, .. } => body.visit(f),
            LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) => {
                visit_expr_stmts(value, f)
            }
            _ => {}
        }
    }

    /// Calls `f` on every expression node of every statement (pre-order, into local scopes).
    pub fn visit_exprs(&self, f: &mut impl FnMut(&ScalarExpr)) {
        self.visit(&mut |s| {
            if let LowLevel::Set { value, .. } | LowLevel::SetLocal(_, value) = s {
                visit_expr_shallow(value, f);
            }
        });
    }

    /// This statement with sequences of one statement looked through (the statement itself
    /// otherwise).
    pub fn unwrapped(&self) -> &LowLevel {
        let mut s = self;
        while let LowLevel::Seq(items) = s
            && items.len() == 1
        {
            s = &items[0];
        }
        s
    }

    /// The most times any statement inside runs: the largest product of the extents of the
    /// loops around one statement (1 for a statement outside loops; saturating).
    pub fn most_iterations(&self) -> u64 {
        match self {
            LowLevel::For { from, to, body, .. } => u64::try_from(to - from)
                .unwrap_or(0)
                .saturating_mul(body.most_iterations()),
            LowLevel::Seq(items) => items
                .iter()
                .map(LowLevel::most_iterations)
                .max()
                .unwrap_or(1),
            _ => 1,
        }
    }

    /// The loops of a perfect nest, outermost first, as `(iterator, from, to)`, and the
    /// statement they enclose (sequences of one statement are looked through).
    pub fn perfect_nest(&self) -> (Vec<(Symbol, i64, i64)>, &LowLevel) {
        let mut loops = Vec::new();
        let mut s = self;
        loop {
            match s {
                LowLevel::For {
                    index,
                    from,
                    to,
                    body,
                } => {
                    loops.push((*index, *from, *to));
                    s = body;
                }
                LowLevel::Seq(items) if items.len() == 1 => s = &items[0],
                _ => return (loops, s),
            }
        }
    }

    /// Whether this statement writes every stored element of `tn` without reading it first:
    /// a `ZeroOut`, or a nest of loops from 0 whose single `Set` indexes each axis of an
    /// unpadded node by a loop covering it exactly (or by 0, an axis of one element), with a
    /// value that does not read the node.
    /// Inside a loop whose body is a sequence (fused loops), the first statement of the body
    /// that uses `tn` must be such a write, and every later use in the body must index the
    /// axes the enclosing loops cover by those loops' iterators, as that write does: each
    /// iteration then reads only the slice it has just written. Whatever the node held before
    /// such a statement is never observed.
    pub fn overwrites_all(&self, tn: &Tnode) -> bool {
        self.overwriting_set(tn, &mut Vec::new()).is_some()
    }

    /// [`LowLevel::overwrites_all`] for this statement inside the loops `loops` (iterator,
    /// first value, one past the last), outermost first: whether it overwrites every element of
    /// `tn` that those loops' iterations reach before reading any.
    pub fn overwrites_all_under(&self, tn: &Tnode, loops: &[(Symbol, i64, i64)]) -> bool {
        self.overwriting_set(tn, &mut loops.to_vec()).is_some()
    }

    /// [`LowLevel::overwrites_all_under`] for a sequence of `items`.
    pub fn items_overwrite_all(
        items: &[LowLevel],
        tn: &Tnode,
        loops: &[(Symbol, i64, i64)],
    ) -> bool {
        overwriting_set_in_items(items, tn, &mut loops.to_vec()).is_some()
    }

    /// The indices of the `Set` by which this statement, under the enclosing `loops`,
    /// overwrites every element of `tn` (see [`LowLevel::overwrites_all`]).
    fn overwriting_set(
        &self,
        tn: &Tnode,
        loops: &mut Vec<(Symbol, i64, i64)>,
    ) -> Option<Vec<AxisIndex>> {
        match self {
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                loops.push((*index, *from, *to));
                let found = body.overwriting_set(tn, loops);
                loops.pop();
                found
            }
            LowLevel::Seq(items) => overwriting_set_in_items(items, tn, loops),
            LowLevel::ZeroOut(t) => (t == tn && loops.is_empty()).then(Vec::new),
            LowLevel::Set { tn: t, idcs, value } => {
                if t != tn || tn.padding().is_some() || idcs.len() != tn.dims().len() {
                    return None;
                }
                let mut seen = Vec::new();
                for (i, &d) in idcs.iter().zip(tn.dims()) {
                    // An axis of one element is covered by its one index.
                    if d == 1 && *i == AxisIndex::Fixed(0) {
                        continue;
                    }
                    let AxisIndex::Iterator(sym) = i else {
                        return None;
                    };
                    if seen.contains(sym) || !loops.contains(&(*sym, 0, d as i64)) {
                        return None;
                    }
                    seen.push(*sym);
                }
                (!value.reads(tn)).then(|| idcs.clone())
            }
            _ => None,
        }
    }

    /// Every node the code writes (with `Set` or `ZeroOut`), each once, in order of first write.
    pub fn written_nodes(&self) -> Vec<Tnode> {
        let mut out: Vec<Tnode> = Vec::new();
        let mut seen: std::collections::HashSet<usize> = std::collections::HashSet::new();
        self.visit(&mut |s| match s {
            LowLevel::Set { tn, .. } | LowLevel::ZeroOut(tn) if seen.insert(tn.id()) => {
                out.push(tn.clone())
            }
            _ => {}
        });
        out
    }

    /// Every symbol used in an index (loop iterators and static symbols).
    pub fn index_symbols(&self) -> std::collections::BTreeSet<Symbol> {
        let mut out = std::collections::BTreeSet::new();
        self.visit(&mut |s| {
            if let LowLevel::Set { idcs, .. } = s {
                idcs.iter().for_each(|i| out.extend(i.symbols()));
            }
        });
        self.visit_exprs(&mut |e| match e {
            ScalarExpr::Get(_, idcs) | ScalarExpr::GetMerge(_, idcs) => {
                idcs.iter().for_each(|i| out.extend(i.symbols()))
            }
            ScalarExpr::EmbedIndex(i) | ScalarExpr::Random { index: i, .. } => {
                out.extend(i.symbols())
            }
            ScalarExpr::Gather { symbol, .. } => {
                out.insert(*symbol);
            }
            _ => {}
        });
        out
    }

    /// Every node the code reads or writes, each once, in order of first appearance.
    pub fn nodes(&self) -> Vec<Tnode> {
        let mut out = self.written_nodes();
        let mut seen: std::collections::HashSet<usize> = out.iter().map(Tnode::id).collect();
        self.visit_exprs(&mut |e| {
            if let ScalarExpr::Get(t, _) = e
                && seen.insert(t.id())
            {
                out.push(t.clone());
            }
        });
        out
    }

    /// Pretty-prints the code with symbols and locals renamed in order of appearance.
    pub fn to_pretty_string(&self) -> String {
        let mut p = Printer::default();
        p.stmt(self, 0);
        p.out
    }
}

fn substitute_expr(e: ScalarExpr, subst: &HashMap<Symbol, AxisIndex>) -> ScalarExpr {
    e.map_bottom_up(&mut |x| match x {
        ScalarExpr::Get(tn, i) => {
            ScalarExpr::Get(tn, i.into_iter().map(|i| i.substitute(subst)).collect())
        }
        ScalarExpr::GetMerge(tn, i) => {
            ScalarExpr::GetMerge(tn, i.into_iter().map(|i| i.substitute(subst)).collect())
        }
        ScalarExpr::EmbedIndex(i) => ScalarExpr::EmbedIndex(i.substitute(subst)),
        ScalarExpr::Random {
            seed,
            stream,
            index,
            step,
        } => ScalarExpr::random(seed, stream, index.substitute(subst), *step),
        ScalarExpr::LocalScope { id, body } => ScalarExpr::LocalScope {
            id,
            body: Box::new(body.substitute_all(subst)),
        },
        x => x,
    })
}

/// [`LowLevel::overwriting_set`] of a sequence of `items` under the enclosing `loops`.
fn overwriting_set_in_items(
    items: &[LowLevel],
    tn: &Tnode,
    loops: &mut Vec<(Symbol, i64, i64)>,
) -> Option<Vec<AxisIndex>> {
    let first = items.iter().position(|s| s.nodes().contains(tn))?;
    let idcs = items[first].overwriting_set(tn, loops)?;
    // Axes pinned by the enclosing loops: later uses must index them the same way.
    let pinned: Vec<(usize, &AxisIndex)> = idcs
        .iter()
        .enumerate()
        .filter(|(_, i)| matches!(i, AxisIndex::Iterator(s) if loops.iter().any(|l| l.0 == *s)))
        .collect();
    let same_slice = |i: &[AxisIndex]| pinned.iter().all(|&(d, p)| i.get(d) == Some(p));
    let mut ok = true;
    for later in &items[first + 1..] {
        later.visit(&mut |st| {
            if let LowLevel::Set { tn: t, idcs, .. } = st {
                ok &= t != tn || same_slice(idcs);
            }
            if let LowLevel::ZeroOut(t) = st {
                ok &= t != tn;
            }
        });
        later.visit_exprs(&mut |e| {
            if let ScalarExpr::Get(t, i) | ScalarExpr::GetMerge(t, i) = e {
                ok &= t != tn || same_slice(i);
            }
        });
    }
    ok.then_some(idcs)
}

fn visit_expr_stmts(e: &ScalarExpr, f: &mut impl FnMut(&LowLevel)) {
    if let ScalarExpr::LocalScope { body, .. } = e {
        body.visit(f);
    }
    e.for_each_child(|c| visit_expr_stmts(c, f));
}

/// Visits the expression tree pre-order, without entering local-scope bodies (their statements
/// are visited by [`LowLevel::visit`]).
fn visit_expr_shallow(e: &ScalarExpr, f: &mut impl FnMut(&ScalarExpr)) {
    f(e);
    e.for_each_child(|c| visit_expr_shallow(c, f));
}

#[derive(Default)]
struct Printer {
    out: String,
    symbols: HashMap<Symbol, usize>,
    locals: HashMap<usize, usize>,
}

impl Printer {
    fn sym(&mut self, s: Symbol) -> String {
        let n = self.symbols.len();
        format!("i{}", self.symbols.entry(s).or_insert(n))
    }

    fn local(&mut self, id: ScopeId) -> String {
        let n = self.locals.len();
        format!("v{}", self.locals.entry(id.id).or_insert(n))
    }

    fn idx(&mut self, i: &AxisIndex) -> String {
        let text = i.render_with(|s| Ok::<_, std::convert::Infallible>(self.sym(s)));
        text.unwrap_or_else(|never| match never {})
    }

    fn idcs(&mut self, idcs: &[AxisIndex]) -> String {
        let parts: Vec<String> = idcs.iter().map(|i| self.idx(i)).collect();
        format!("[{}]", parts.join(", "))
    }

    fn stmt(&mut self, s: &LowLevel, depth: usize) {
        let pad = "  ".repeat(depth);
        match s {
            LowLevel::Noop => {}
            LowLevel::Comment(c) => {
                let _ = writeln!(self.out, "{pad}/* {} */", c.replace("*/", "* /"));
            }
            LowLevel::Seq(items) => items.iter().for_each(|i| self.stmt(i, depth)),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                let i = self.sym(*index);
                let _ = writeln!(self.out, "{pad}for {i} = {from} to {} {{", to - 1);
                self.stmt(body, depth + 1);
                let _ = writeln!(self.out, "{pad}}}");
            }
            LowLevel::ZeroOut(t) => {
                let _ = writeln!(self.out, "{pad}zero_out {};", t.debug_name());
            }
            LowLevel::Set { tn, idcs, value } => {
                let i = self.idcs(idcs);
                let v = self.expr(value, depth);
                let _ = writeln!(self.out, "{pad}{}{i} := {v};", tn.debug_name());
            }
            LowLevel::SetLocal(id, value) => {
                let v = self.expr(value, depth);
                let l = self.local(*id);
                let _ = writeln!(self.out, "{pad}{l} := {v};");
            }
        }
    }

    fn expr(&mut self, e: &ScalarExpr, depth: usize) -> String {
        match e {
            ScalarExpr::LocalScope { id, body } => {
                let l = self.local(*id);
                let mut inner = Printer {
                    out: String::new(),
                    symbols: std::mem::take(&mut self.symbols),
                    locals: std::mem::take(&mut self.locals),
                };
                inner.stmt(body, depth + 2);
                self.symbols = inner.symbols;
                self.locals = inner.locals;
                let pad = "  ".repeat(depth + 1);
                format!("({l}: {} {{\n{}{pad}}})", id.prec, inner.out)
            }
            ScalarExpr::GetLocal(id) => self.local(*id),
            ScalarExpr::Get(t, idcs) => format!("{}{}", t.debug_name(), self.idcs(idcs)),
            ScalarExpr::GetMerge(t, idcs) => {
                format!("merge({}){}", t.debug_name(), self.idcs(idcs))
            }
            ScalarExpr::EmbedIndex(i) => format!("(index {})", self.idx(i)),
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => {
                let (index, step) = (self.idx(index), self.expr(step, depth));
                format!("uniform(seed {seed}, stream {stream}, at {index}, step {step})")
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                let s = self.sym(*symbol);
                let index = self.expr(index, depth);
                let read = self.expr(read, depth);
                format!("gather({s} := {index} in 0..{extent}: {read})")
            }
            ScalarExpr::Constant(c) => format!("{c}"),
            ScalarExpr::Unop(op, a) => format!("{op}({})", self.expr(a, depth)),
            ScalarExpr::Binop(op, a, b) => {
                let (a, b) = (self.expr(a, depth), self.expr(b, depth));
                if op.is_infix() {
                    format!("({a} {op} {b})")
                } else {
                    format!("{op}({a}, {b})")
                }
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let (a, b, c) = (
                    self.expr(a, depth),
                    self.expr(b, depth),
                    self.expr(c, depth),
                );
                format!("{op}({a}, {b}, {c})")
            }
        }
    }
}

impl fmt::Display for LowLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_pretty_string())
    }
}

/// Where each node is first used among a routine's top-level statements: which local nodes
/// must start zeroed. A local whose first statement (from the start of its memory's lifetime)
/// overwrites all of it ([`LowLevel::overwrites_all`]) never shows its initial contents; any
/// other may read its initial zeros (an accumulation into it, a partial write).
pub struct FirstUses<'a> {
    statements: Vec<&'a LowLevel>,
    first: HashMap<usize, usize>,
}

impl<'a> FirstUses<'a> {
    /// The first uses of every node in `statements` (a routine's top-level statements).
    pub fn of(statements: Vec<&'a LowLevel>) -> FirstUses<'a> {
        let mut first = HashMap::new();
        for (i, s) in statements.iter().enumerate() {
            for tn in s.nodes() {
                first.entry(tn.id()).or_insert(i);
            }
        }
        FirstUses { statements, first }
    }

    /// Whether `tn`, whose memory starts fresh at statement `from`, must be zeroed then: the
    /// first statement using it from there on does not overwrite all of it.
    pub fn needs_zeros(&self, tn: &Tnode, from: usize) -> bool {
        let first = self.first.get(&tn.id()).map_or(from, |&f| f.max(from));
        self.statements
            .get(first)
            .is_none_or(|s| !s.overwrites_all(tn))
    }
}

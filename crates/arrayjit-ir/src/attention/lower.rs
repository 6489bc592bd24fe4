//! The loops of a fused attention pass ([`AttentionOp::lower`]): the operation's meaning.

use crate::access::check_access;
use crate::error::Result;
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::{LowLevel, ScalarExpr, ScopeId};
use crate::ops::{BinOp, TernOp, UnOp};
use crate::tnode::Tnode;

use super::{AttentionDims, AttentionOp, AttentionSpec, ForwardState, OP};

impl AttentionOp {
    /// The loops that compute this pass (its meaning: the interpreter runs them, and every
    /// backend renders them). Checks every access stays inside its node.
    pub fn lower(&self) -> Result<LowLevel> {
        let spec = self.spec();
        let d = spec.dims();
        let l = Lowering {
            spec,
            d,
            b: Symbol::fresh(),
            h: Symbol::fresh(),
            t: Symbol::fresh(),
            s: Symbol::fresh(),
        };
        let body = match self {
            AttentionOp::Forward {
                out, lse, state, ..
            } => l.forward(out, lse, state),
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                grad_q,
                grad_k,
                grad_v,
                state,
                ..
            } => l.backward(lse, delta, grad_out, [grad_q, grad_k, grad_v], state),
        };
        l.check(&body)?;
        // Every array the loops accumulate into starts from zero in a statement of its own, so
        // the routine's analysis (statement by statement) sees it written before it is read:
        // none of them is an input of the routine.
        let zeroed = match self {
            AttentionOp::Forward { out, state, .. } => vec![
                state.acc.as_ref().unwrap_or(out),
                &state.max,
                &state.next_max,
                &state.sum,
                &state.score,
                &state.weight,
            ],
            AttentionOp::Backward {
                grad_q,
                grad_k,
                grad_v,
                state,
                ..
            } => vec![
                grad_q, grad_k, grad_v, &state[0], &state[1], &state[2], &state[3],
            ],
        };
        Ok(LowLevel::seq(
            std::iter::once(LowLevel::Comment(self.describe()))
                .chain(zeroed.into_iter().map(|t| LowLevel::ZeroOut(t.clone())))
                .chain([body]),
        ))
    }
}

/// The symbols and sizes of one lowering: `b`, `h` over batch and heads, `t` over queries,
/// `s` over keys.
struct Lowering<'a> {
    spec: &'a AttentionSpec,
    d: AttentionDims,
    b: Symbol,
    h: Symbol,
    t: Symbol,
    s: Symbol,
}

fn get(node: &Tnode, idcs: Vec<AxisIndex>) -> ScalarExpr {
    ScalarExpr::Get(node.clone(), idcs)
}

fn bin(op: BinOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
    ScalarExpr::binop(op, a, b)
}

fn konst(c: f64) -> ScalarExpr {
    ScalarExpr::Constant(c)
}

fn for_(index: Symbol, to: usize, body: LowLevel) -> LowLevel {
    LowLevel::For {
        index,
        from: 0,
        to: to as i64,
        body: Box::new(body),
    }
}

fn set(tn: &Tnode, idcs: Vec<AxisIndex>, value: ScalarExpr) -> LowLevel {
    LowLevel::Set {
        tn: tn.clone(),
        idcs,
        value,
    }
}

/// A finite stand-in for −∞ that every precision the statistics use holds: a masked score,
/// and the running maximum before the first key. `exp(NEG_LARGE − m)` is 0 for any score `m`
/// an attention can produce, and no `∞ − ∞` can arise.
const NEG_LARGE: f64 = -1e30;

impl Lowering<'_> {
    fn it(&self, s: Symbol) -> AxisIndex {
        AxisIndex::Iterator(s)
    }

    /// `[b, h, time]` of a per-row (or per-key) array.
    fn row(&self, time: Symbol) -> Vec<AxisIndex> {
        vec![self.it(self.b), self.it(self.h), self.it(time)]
    }

    fn row_get(&self, node: &Tnode, time: Symbol) -> ScalarExpr {
        get(node, self.row(time))
    }

    fn row_set(&self, node: &Tnode, time: Symbol, value: ScalarExpr) -> LowLevel {
        set(node, self.row(time), value)
    }

    /// An element of a `[batch, heads, time, features]` array (in the layout).
    fn at(&self, time: Symbol, f: Symbol) -> Vec<AxisIndex> {
        self.spec.layout.index(self.b, self.h, time, f)
    }

    /// `Σ_f a[time_a, f] · b[time_b, f]` over `extent` features, as a local.
    fn dot(&self, a: (&Tnode, Symbol), b: (&Tnode, Symbol), extent: usize) -> ScalarExpr {
        let f = Symbol::fresh();
        let id = ScopeId::fresh(self.spec.stats_prec());
        let term = bin(
            BinOp::Mul,
            get(a.0, self.at(a.1, f)),
            get(b.0, self.at(b.1, f)),
        );
        ScalarExpr::LocalScope {
            id,
            body: Box::new(for_(
                f,
                extent,
                LowLevel::SetLocal(id, bin(BinOp::Add, ScalarExpr::GetLocal(id), term)),
            )),
        }
    }

    /// `scale · q[t] · k[s]`, plus the key's bias `bias[b, s]` where there is one.
    fn score(&self) -> ScalarExpr {
        let scaled = bin(
            BinOp::Mul,
            self.dot(
                (&self.spec.q, self.t),
                (&self.spec.k, self.s),
                self.d.features,
            ),
            konst(self.spec.scale),
        );
        match &self.spec.key_bias {
            Some(bias) => bin(
                BinOp::Add,
                scaled,
                get(bias, vec![self.it(self.b), self.it(self.s)]),
            ),
            None => scaled,
        }
    }

    /// Nonzero where key `s` is hidden from query `t` (causal only): `s > t`, or `s > t +
    /// offset` with a causal offset (a static symbol, bound per run).
    fn hidden(&self) -> Option<ScalarExpr> {
        let offset = self.spec.causal_offset.iter().map(|o| (1, o.symbol));
        self.spec.causal.then(|| {
            bin(
                BinOp::Cmplt,
                ScalarExpr::EmbedIndex(AxisIndex::affine(
                    [(1, self.t), (-1, self.s)].into_iter().chain(offset),
                    0,
                )),
                konst(0.0),
            )
        })
    }

    /// `if hidden { masked } else { value }` (just `value` without a causal mask).
    fn unless_hidden(&self, masked: ScalarExpr, value: ScalarExpr) -> ScalarExpr {
        match self.hidden() {
            Some(h) => ScalarExpr::ternop(TernOp::Where, h, masked, value),
            None => value,
        }
    }

    /// The dropout factor of weight `(t, s)` (see [`AttentionSpec::keep_factor`]).
    fn keep_factor(&self) -> Option<ScalarExpr> {
        self.spec.keep_factor(self.b, self.h, self.t, self.s)
    }

    fn with_keep(&self, value: ScalarExpr) -> ScalarExpr {
        match self.keep_factor() {
            Some(k) => bin(BinOp::Mul, value, k),
            None => value,
        }
    }

    /// Loops over batch and heads around `body`.
    fn batch_heads(&self, body: LowLevel) -> LowLevel {
        for_(self.b, self.d.batch, for_(self.h, self.d.heads, body))
    }

    fn forward(&self, out: &Tnode, lse: &Tnode, st: &ForwardState) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let acc = st.acc.as_ref().unwrap_or(out);
        let f = Symbol::fresh();
        let f_end = Symbol::fresh();
        let ev = self.d.value_features;
        let max = || self.row_get(&st.max, t);
        let next = || self.row_get(&st.next_max, t);
        let weight = || self.row_get(&st.weight, t);
        // exp(max − next_max): how much the sums so far shrink as the maximum grows.
        let shrink = || ScalarExpr::unop(UnOp::Exp, bin(BinOp::Sub, max(), next()));
        let per_key = LowLevel::seq([
            self.row_set(
                &st.score,
                t,
                self.unless_hidden(konst(NEG_LARGE), self.score()),
            ),
            self.row_set(
                &st.next_max,
                t,
                bin(BinOp::Max, max(), self.row_get(&st.score, t)),
            ),
            self.row_set(
                &st.weight,
                t,
                ScalarExpr::unop(
                    UnOp::Exp,
                    bin(BinOp::Sub, self.row_get(&st.score, t), next()),
                ),
            ),
            self.row_set(
                &st.sum,
                t,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, self.row_get(&st.sum, t), shrink()),
                    weight(),
                ),
            ),
            for_(
                f,
                ev,
                set(
                    acc,
                    self.at(t, f),
                    bin(
                        BinOp::Add,
                        bin(BinOp::Mul, get(acc, self.at(t, f)), shrink()),
                        bin(
                            BinOp::Mul,
                            self.with_keep(weight()),
                            get(&self.spec.v, self.at(s, f)),
                        ),
                    ),
                ),
            ),
            self.row_set(&st.max, t, next()),
        ]);
        let row = LowLevel::seq([
            self.row_set(&st.max, t, konst(NEG_LARGE)),
            for_(s, self.d.keys, per_key),
            for_(
                f_end,
                ev,
                set(
                    out,
                    self.at(t, f_end),
                    bin(
                        BinOp::Div,
                        get(acc, self.at(t, f_end)),
                        self.row_get(&st.sum, t),
                    ),
                ),
            ),
            self.row_set(
                lse,
                t,
                bin(
                    BinOp::Add,
                    max(),
                    ScalarExpr::unop(UnOp::Log, self.row_get(&st.sum, t)),
                ),
            ),
        ]);
        self.batch_heads(for_(t, self.d.queries, row))
    }

    /// The weight `P[t, s] = exp(score − lse[t])` (0 where hidden).
    fn recomputed_weight(&self, lse: &Tnode) -> ScalarExpr {
        self.unless_hidden(
            konst(0.0),
            ScalarExpr::unop(
                UnOp::Exp,
                bin(BinOp::Sub, self.score(), self.row_get(lse, self.t)),
            ),
        )
    }

    /// `dS[t, s] = P ⊙ (dO[t]·v[s] ⊙ keep − delta[t])`, with `P` read from `weight`.
    fn score_grad(&self, weight: ScalarExpr, delta: &Tnode, grad_out: &Tnode) -> ScalarExpr {
        let dp = self.with_keep(self.dot(
            (grad_out, self.t),
            (&self.spec.v, self.s),
            self.d.value_features,
        ));
        bin(
            BinOp::Mul,
            weight,
            bin(BinOp::Sub, dp, self.row_get(delta, self.t)),
        )
    }

    /// Both gradient loops under one loop over batch and heads, so the pass is one nest.
    fn backward(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        [grad_q, grad_k, grad_v]: [&Tnode; 3],
        [w, sg, kw, ksg]: &[Tnode; 4],
    ) -> LowLevel {
        // The key loops use the query loop's symbols swapped: fresh ones keep every loop's
        // symbol its own.
        let keys = Lowering {
            t: Symbol::fresh(),
            s: Symbol::fresh(),
            ..*self
        };
        self.batch_heads(LowLevel::seq([
            self.grad_query(lse, delta, grad_out, grad_q, [w, sg]),
            keys.grad_key_value(lse, delta, grad_out, grad_k, grad_v, [kw, ksg]),
        ]))
    }

    /// The query gradient's loops for one batch element and head (`b`, `h`).
    fn grad_query(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        grad_q: &Tnode,
        [weight, sgrad]: [&Tnode; 2],
    ) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let scaled_grad = bin(BinOp::Mul, self.row_get(sgrad, t), konst(self.spec.scale));
        let per_key = LowLevel::seq([
            self.row_set(weight, t, self.recomputed_weight(lse)),
            self.row_set(
                sgrad,
                t,
                self.score_grad(self.row_get(weight, t), delta, grad_out),
            ),
            self.add_scaled((grad_q, t), self.d.features, scaled_grad, (&self.spec.k, s)),
        ]);
        for_(t, self.d.queries, for_(s, self.d.keys, per_key))
    }

    /// The key and value gradients' loops for one batch element and head.
    fn grad_key_value(
        &self,
        lse: &Tnode,
        delta: &Tnode,
        grad_out: &Tnode,
        grad_k: &Tnode,
        grad_v: &Tnode,
        [weight, sgrad]: [&Tnode; 2],
    ) -> LowLevel {
        let (t, s) = (self.t, self.s);
        let scaled_grad = bin(BinOp::Mul, self.row_get(sgrad, s), konst(self.spec.scale));
        let per_query = LowLevel::seq([
            self.row_set(weight, s, self.recomputed_weight(lse)),
            self.row_set(
                sgrad,
                s,
                self.score_grad(self.row_get(weight, s), delta, grad_out),
            ),
            self.add_scaled(
                (grad_v, s),
                self.d.value_features,
                self.with_keep(self.row_get(weight, s)),
                (grad_out, t),
            ),
            self.add_scaled((grad_k, s), self.d.features, scaled_grad, (&self.spec.q, t)),
        ]);
        for_(s, self.d.keys, for_(t, self.d.queries, per_query))
    }

    /// `target[time] += coeff · source[time']` over `extent` features.
    fn add_scaled(
        &self,
        (target, time): (&Tnode, Symbol),
        extent: usize,
        coeff: ScalarExpr,
        (source, source_time): (&Tnode, Symbol),
    ) -> LowLevel {
        let f = Symbol::fresh();
        for_(
            f,
            extent,
            set(
                target,
                self.at(time, f),
                bin(
                    BinOp::Add,
                    get(target, self.at(time, f)),
                    bin(BinOp::Mul, coeff, get(source, self.at(source_time, f))),
                ),
            ),
        )
    }

    /// Checks every access of `body` against its node, with each loop's extent.
    fn check(&self, body: &LowLevel) -> Result<()> {
        let mut extents = std::collections::HashMap::new();
        collect_extents(body, &mut extents);
        extents.extend(self.spec.causal_offset.iter().map(|o| (o.symbol, o.range)));
        let bounds = |s: Symbol| extents.get(&s).copied();
        let mut result = Ok(());
        let mut check = |tn: &Tnode, idcs: &[AxisIndex]| {
            if result.is_ok() {
                result = check_access(tn, idcs, &bounds, OP);
            }
        };
        body.visit(&mut |st| {
            if let LowLevel::Set { tn, idcs, .. } = st {
                check(tn, idcs);
            }
        });
        body.visit_exprs(&mut |e| {
            if let ScalarExpr::Get(tn, idcs) = e {
                check(tn, idcs);
            }
        });
        result
    }
}

fn collect_extents(body: &LowLevel, out: &mut std::collections::HashMap<Symbol, usize>) {
    // `visit` goes into the statements of local scopes too (the dot products' loops).
    body.visit(&mut |st| {
        if let LowLevel::For { index, to, .. } = st {
            out.insert(*index, *to as usize);
        }
    });
}

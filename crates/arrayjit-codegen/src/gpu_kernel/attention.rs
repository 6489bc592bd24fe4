//! The GPU pass of a fused attention ([`GpuAttention`]) as kernel trees, in the split
//! [`arrayjit_opt::schedule::gpu::attention`] decides and explains:
//!
//! - **Rows.** Group `g` takes batch element, head and block of rows from `g` (rows fastest);
//!   the `lanes` invocations `t` with `t / lanes = r` take row `block · rows + r`, lane
//!   `t % lanes` keeping every `lanes`-th feature of that row's vectors in registers (the
//!   query and the output's accumulator forward; the query, output gradient and query
//!   gradient; or the key, value and their gradients). A row's lanes add their dot products
//!   by a butterfly of subgroup shuffles, so each holds the same sums and the same softmax
//!   statistics. Invocations past the last row compute on zeros (every lane must reach the
//!   shuffles) and store nothing.
//! - **Staging.** Each step the group copies the next block of the other side's rows (keys
//!   and values, or queries, output gradients, log-sum-exps and deltas) into shared memory:
//!   invocation `t` copies elements `t`, `t + threads`, …, so consecutive invocations read
//!   consecutive features; rows past the end are zero. Every invocation then reads the same
//!   staged element at once (a broadcast).
//! - **Steps.** Forward: the block's scores into registers with their maximum, the
//!   accumulator and the running sum rescaled once, then each weight added; backward: each
//!   weight recomputed from the row's log-sum-exp, its gradient, and the gradients' sums.
//!   A causal step's hidden pairs weigh exactly 0 (the loops' masked score gives
//!   `exp(−10³⁰ − m) = 0` too); blocks wholly above the diagonal are not walked. A causal
//!   offset (a static index of the kernel, bound per run) shifts the test and the blocks
//!   walked; a key bias is loaded per key and added to its scores.
//! - **Results** are stored once per row, after the last block.

use arrayjit_ir::attention::{AttentionLayout, AttentionOp};
use arrayjit_ir::{AxisIndex, BinOp, Prec, Result, ScalarExpr, Symbol, Tnode, UnOp};
use arrayjit_opt::schedule::gpu::GpuAttention;

use super::build::{array, assign, group_index, let_, let_mut, range, thread_index, unrolled, var};
use super::{At, Barrier, Expr, KernelDialect, PassShape, PrintedPass, Stmt, Ty};

/// The loops' stand-in for −∞ (a masked score, the maximum before the first key).
const NEG_LARGE: f64 = -1e30;

/// Prints launch `k` of the pass (none past its launches).
pub(super) fn print_kernel<D: KernelDialect>(
    d: &mut D,
    a: &GpuAttention,
    k: usize,
) -> Result<Option<PrintedPass>> {
    if k >= a.launches() as usize {
        return Ok(None);
    }
    let b = Builder::new(a);
    let tree = match (&*a.op, k) {
        (AttentionOp::Forward { out, lse, .. }, _) => b.forward(out, lse),
        (
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                grad_q,
                ..
            },
            0,
        ) => b.query_grads(lse, delta, grad_out, grad_q),
        (
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                grad_k,
                grad_v,
                ..
            },
            _,
        ) => {
            let (keys, values) = a.key_grads_of(k);
            b.key_grads(
                lse,
                delta,
                grad_out,
                keys.then_some(grad_k),
                values.then_some(grad_v),
            )
        }
    };
    let mut body = String::new();
    super::print_stmts(d, &tree, 1, &mut body)?;
    Ok(Some(PrintedPass {
        shape: PassShape::Tiles(a.groups(k)),
        threads: a.threads(),
        body,
        dynamic_shared_bytes: 0,
    }))
}

/// What every kernel of the pass shares: sizes, the statistics' precision, the symbols the
/// dropout's draws are written with.
struct Builder<'a> {
    a: &'a GpuAttention,
    p: Prec,
    heads: usize,
    queries: usize,
    keys: usize,
    features: usize,
    value_features: usize,
    /// The symbols of batch, head, query and key the dropout's expression uses.
    syms: [Symbol; 4],
}

fn f(x: f64, p: Prec) -> Expr<'static> {
    Expr::Lit(p, x)
}

fn bin<'a>(op: BinOp, p: Prec, a: Expr<'a>, b: Expr<'a>) -> Expr<'a> {
    Expr::Combine(op, p, Box::new(a), Box::new(b))
}

fn un(op: UnOp, p: Prec, a: Expr<'_>) -> Expr<'_> {
    Expr::Unary(op, p, Box::new(a))
}

/// `acc + x · y` in `p`: fused in `f32`, else a product and a sum.
fn fma<'a>(p: Prec, acc: Expr<'a>, x: Expr<'a>, y: Expr<'a>) -> Expr<'a> {
    if p == Prec::F32 {
        Expr::MulAdd {
            fused: true,
            acc: Box::new(acc),
            x: Box::new(x),
            y: Box::new(y),
        }
    } else {
        bin(BinOp::Add, p, acc, bin(BinOp::Mul, p, x, y))
    }
}

fn item(name: &str, i: Expr<'static>) -> Expr<'static> {
    Expr::item(name, i)
}

fn select<'a>(c: Expr<'a>, a: Expr<'a>, b: Expr<'a>) -> Expr<'a> {
    Expr::Select(Box::new(c), Box::new(a), Box::new(b))
}

/// A variable bound to an IR iterator for the statements after it.
fn let_bound<'a>(name: &str, value: Expr<'a>, sym: Symbol) -> Stmt<'a> {
    Stmt::Let {
        name: name.into(),
        ty: Ty::Index,
        value,
        mutable: false,
        binds: Some(sym),
    }
}

impl<'a> Builder<'a> {
    fn new(a: &'a GpuAttention) -> Builder<'a> {
        let spec = a.spec();
        let d = spec.dims();
        Builder {
            a,
            p: spec.stats_prec(),
            heads: d.heads,
            queries: d.queries,
            keys: d.keys,
            features: d.features,
            value_features: d.value_features,
            syms: [
                Symbol::fresh(),
                Symbol::fresh(),
                Symbol::fresh(),
                Symbol::fresh(),
            ],
        }
    }

    fn rows(&self) -> usize {
        self.a.rows as usize
    }

    fn lanes(&self) -> usize {
        self.a.lanes as usize
    }

    /// Invocations per group.
    fn threads(&self) -> usize {
        self.a.threads() as usize
    }

    /// The feature the invocation's register `at_f` holds: every `lanes`-th from its lane.
    fn feature(&self) -> Expr<'static> {
        match self.lanes() {
            1 => var("at_f"),
            l => var("at_lane") + var("at_f") * l,
        }
    }

    /// `var` summed over the lanes of its row (a butterfly of shuffles: every lane ends with
    /// the same sum, as float addition commutes).
    fn over_lanes(&self, var_name: &str) -> Vec<Stmt<'a>> {
        let mut out = Vec::new();
        let mut m = 1;
        while m < self.lanes() {
            out.push(assign(
                var(var_name),
                bin(
                    BinOp::Add,
                    self.p,
                    var(var_name),
                    Expr::ShuffleXor(Box::new(var(var_name)), Box::new(Expr::from(m))),
                ),
            ));
            m *= 2;
        }
        out
    }

    /// The flat offset of the first feature of row `time` of a `[batch, heads, time,
    /// features]` array in the layout, whose time axis has `times` rows of `width`.
    fn row_offset(&self, time: Expr<'static>, times: usize, width: usize) -> Expr<'static> {
        let (b, h) = (var("at_b"), var("at_h"));
        match self.a.spec().layout {
            AttentionLayout::HeadsFirst => ((b * self.heads + h) * times + time) * width,
            AttentionLayout::TimeFirst => ((b * times + time) * self.heads + h) * width,
        }
    }

    /// The flat offset of element `time` of a `[batch, heads, time]` array.
    fn stat_offset(&self, time: Expr<'static>, times: usize) -> Expr<'static> {
        (var("at_b") * self.heads + var("at_h")) * times + time
    }

    /// The group's batch element, head and block of rows (`times` of them), and the
    /// invocation's row: `at_b`, `at_h`, `at_rb`, `at_row`.
    fn locate(&self, times: usize) -> Vec<Stmt<'static>> {
        let blocks = times.div_ceil(self.rows());
        vec![
            let_("at_rb", Ty::Index, group_index() % blocks),
            let_("at_bh", Ty::Index, group_index() / blocks),
            let_bound("at_b", var("at_bh") / self.heads, self.syms[0]),
            let_bound("at_h", var("at_bh") % self.heads, self.syms[1]),
            let_(
                "at_row",
                Ty::Index,
                var("at_rb") * self.rows() + thread_index() / self.lanes(),
            ),
            let_("at_lane", Ty::Int, thread_index() % self.lanes()),
        ]
    }

    /// Copies `width` features of `rows` consecutive rows of `node`, from row `first` on,
    /// into the shared array `name` (zeros past `times` rows).
    fn stage(
        &self,
        name: &str,
        node: &'a Tnode,
        first: Expr<'static>,
        times: usize,
        width: usize,
    ) -> Stmt<'a> {
        let rows = self.a.block;
        let time = first + var("at_i") / width;
        let load = Expr::Elem(
            node,
            At::Flat(Box::new(
                self.row_offset(time.clone(), times, width) + var("at_i") % width,
            )),
        );
        range(
            "at_i",
            Ty::Int,
            thread_index(),
            rows * width,
            self.threads() as i64,
            vec![
                let_mut("at_x", Ty::Compute(self.p), f(0.0, self.p)),
                Stmt::If(time.lt(times), vec![assign(var("at_x"), load)]),
                assign(item(name, var("at_i")), var("at_x")),
            ],
        )
    }

    /// Copies `rows` consecutive elements of a per-row statistic, as [`Builder::stage`].
    fn stage_stat(&self, name: &str, node: &'a Tnode, first: Expr<'static>) -> Stmt<'a> {
        let time = first + var("at_i");
        let load = Expr::Elem(
            node,
            At::Flat(Box::new(self.stat_offset(time.clone(), self.queries))),
        );
        range(
            "at_i",
            Ty::Int,
            thread_index(),
            self.a.block,
            self.threads() as i64,
            vec![
                let_mut("at_x", Ty::Compute(self.p), f(0.0, self.p)),
                Stmt::If(time.lt(self.queries), vec![assign(var("at_x"), load)]),
                assign(item(name, var("at_i")), var("at_x")),
            ],
        )
    }

    /// Reads the invocation's features (see [`Builder::feature`]) of its row of `node` into
    /// the registers `name`.
    fn load_row(&self, name: &str, node: &'a Tnode, times: usize, width: usize) -> Stmt<'a> {
        let at = self.row_offset(var("at_row"), times, width) + self.feature();
        unrolled(
            "at_f",
            width / self.lanes(),
            vec![assign(
                item(name, var("at_f")),
                Expr::Elem(node, At::Flat(Box::new(at))),
            )],
        )
    }

    /// Stores the registers `name` (each divided by `divisor`, if given) as the invocation's
    /// row of `node`.
    fn store_row(
        &self,
        name: &str,
        node: &'a Tnode,
        times: usize,
        width: usize,
        divisor: Option<Expr<'static>>,
    ) -> Stmt<'a> {
        let at = self.row_offset(var("at_row"), times, width) + self.feature();
        let value = match divisor {
            Some(d) => bin(BinOp::Div, self.p, item(name, var("at_f")), d),
            None => item(name, var("at_f")),
        };
        unrolled(
            "at_f",
            width / self.lanes(),
            vec![Stmt::Store(node, At::Flat(Box::new(at)), value)],
        )
    }

    /// `var = Σ_f a[f] · b[f]` over `width` features (`a`, `b`: the invocation's items at
    /// register `at_f`), summed over the row's lanes.
    fn dot(
        &self,
        var_name: &str,
        a: Expr<'static>,
        b: Expr<'static>,
        width: usize,
    ) -> Vec<Stmt<'a>> {
        let mut out = vec![
            let_mut(var_name, Ty::Compute(self.p), f(0.0, self.p)),
            unrolled(
                "at_f",
                width / self.lanes(),
                vec![assign(var(var_name), fma(self.p, var(var_name), a, b))],
            ),
        ];
        out.extend(self.over_lanes(var_name));
        out
    }

    /// The registers `name` of a row of `width` features, zeroed.
    fn zero_regs(&self, name: &str, width: usize) -> Stmt<'a> {
        unrolled(
            "at_f",
            width / self.lanes(),
            vec![assign(item(name, var("at_f")), f(0.0, self.p))],
        )
    }

    /// `at_keep`: the dropout factor of query `query` on key `key` (1 without dropout).
    fn keep(&self, query: Expr<'static>, key: Expr<'static>) -> Vec<Stmt<'a>> {
        let spec = self.a.spec();
        match spec.keep_factor(self.syms[0], self.syms[1], self.syms[2], self.syms[3]) {
            Some(e) => vec![
                let_bound("at_tq", query, self.syms[2]),
                let_bound("at_tk", key, self.syms[3]),
                let_(
                    "at_keep",
                    Ty::Compute(self.p),
                    Expr::Ir(Box::new(e), self.p),
                ),
            ],
            None => vec![let_("at_keep", Ty::Compute(self.p), f(1.0, self.p))],
        }
    }

    /// The causal mask's offset (the static index's value, bound per run), 0 without one.
    fn offset(&self) -> Expr<'static> {
        match &self.a.spec().causal_offset {
            Some(o) => Expr::Ir(
                Box::new(ScalarExpr::EmbedIndex(AxisIndex::Iterator(o.symbol))),
                Prec::I32,
            ),
            None => Expr::Int(0),
        }
    }

    /// Key `key` is visible to query `query`: it exists (and, causal, `key ≤ query +
    /// offset`).
    fn visible(
        &self,
        query: Expr<'static>,
        key: Expr<'static>,
        exists: Expr<'static>,
    ) -> Expr<'static> {
        if self.a.spec().causal {
            exists.and((query + self.offset()).ge(key))
        } else {
            exists
        }
    }

    /// `at_kbias`: the key bias of key `key` (0 past the last key), where the attention has
    /// one; its load is guarded, not selected (a select evaluates both sides).
    fn key_bias(&self, key: Expr<'static>) -> Vec<Stmt<'a>> {
        let Some(bias) = &self.a.spec().key_bias else {
            return Vec::new();
        };
        let at = var("at_b") * self.keys + key.clone();
        vec![
            let_mut("at_kbias", Ty::Compute(self.p), f(0.0, self.p)),
            Stmt::If(
                key.lt(self.keys),
                vec![assign(
                    var("at_kbias"),
                    Expr::Elem(bias, At::Flat(Box::new(at))),
                )],
            ),
        ]
    }

    /// `scale · at_dot`, plus the key's bias `at_kbias` where the attention has one.
    fn scaled_score(&self) -> Expr<'static> {
        let p = self.p;
        let scaled = bin(BinOp::Mul, p, var("at_dot"), f(self.a.spec().scale, p));
        match self.a.spec().key_bias {
            Some(_) => bin(BinOp::Add, p, scaled, var("at_kbias")),
            None => scaled,
        }
    }

    /// The end of the keys a group of query rows walks: all of them, or (causal) up to its
    /// last row's (plus the offset).
    fn key_end(&self) -> Expr<'static> {
        if self.a.spec().causal {
            let last = (var("at_rb") + 1i64) * self.rows() + self.offset();
            select(last.clone().lt(self.keys), last, Expr::from(self.keys))
        } else {
            Expr::from(self.keys)
        }
    }

    /// The loop over the blocks of keys a block of query rows sees: each step stages the
    /// block's keys and values, then runs `step` on every invocation.
    fn over_key_blocks(&self, step: Vec<Stmt<'a>>) -> Stmt<'a> {
        let spec = self.a.spec();
        let (bk, dq, dv) = (self.a.block, self.features, self.value_features);
        range(
            "at_kb",
            Ty::Index,
            0i64,
            self.key_end(),
            bk as i64,
            vec![
                Stmt::Barrier(Barrier::Shared),
                self.stage("at_ks", &spec.k, var("at_kb"), self.keys, dq),
                self.stage("at_vs", &spec.v, var("at_kb"), self.keys, dv),
                Stmt::Barrier(Barrier::Shared),
                // Every invocation computes (rows past the end on zeros): the lanes of a row
                // combine their sums by shuffles, which every lane of a subgroup must reach.
                Stmt::Block(step),
            ],
        )
    }

    fn forward(&self, out: &'a Tnode, lse: &'a Tnode) -> Vec<Stmt<'a>> {
        let (p, bk, dq, dv) = (self.p, self.a.block, self.features, self.value_features);
        let spec = self.a.spec();
        let live = || var("at_row").lt(self.queries);
        let key = || var("at_kb") + var("at_j");
        let score = self.dot(
            "at_dot",
            item("at_q", var("at_f")),
            item("at_ks", var("at_j") * dq + self.feature()),
            dq,
        );
        let mut scores = score;
        scores.extend(self.key_bias(key()));
        scores.extend([
            assign(
                item("at_s", var("at_j")),
                select(
                    self.visible(var("at_row"), key(), key().lt(self.keys)),
                    self.scaled_score(),
                    f(NEG_LARGE, p),
                ),
            ),
            assign(
                var("at_mb"),
                bin(BinOp::Max, p, var("at_mb"), item("at_s", var("at_j"))),
            ),
        ]);
        let mut add_weight = vec![
            let_(
                "at_w",
                Ty::Compute(p),
                un(
                    UnOp::Exp,
                    p,
                    bin(BinOp::Sub, p, item("at_s", var("at_j")), var("at_mb")),
                ),
            ),
            assign(var("at_l"), bin(BinOp::Add, p, var("at_l"), var("at_w"))),
        ];
        add_weight.extend(self.keep(var("at_row"), key()));
        add_weight.extend([
            let_(
                "at_wk",
                Ty::Compute(p),
                bin(BinOp::Mul, p, var("at_w"), var("at_keep")),
            ),
            unrolled(
                "at_f",
                dv / self.lanes(),
                vec![assign(
                    item("at_acc", var("at_f")),
                    fma(
                        p,
                        item("at_acc", var("at_f")),
                        var("at_wk"),
                        item("at_vs", var("at_j") * dv + self.feature()),
                    ),
                )],
            ),
        ]);
        let step = vec![
            let_mut("at_mb", Ty::Compute(p), var("at_m")),
            range("at_j", Ty::Int, 0i64, bk, 1, scores),
            let_(
                "at_shrink",
                Ty::Compute(p),
                un(UnOp::Exp, p, bin(BinOp::Sub, p, var("at_m"), var("at_mb"))),
            ),
            assign(
                var("at_l"),
                bin(BinOp::Mul, p, var("at_l"), var("at_shrink")),
            ),
            unrolled(
                "at_f",
                dv / self.lanes(),
                vec![assign(
                    item("at_acc", var("at_f")),
                    bin(BinOp::Mul, p, item("at_acc", var("at_f")), var("at_shrink")),
                )],
            ),
            range("at_j", Ty::Int, 0i64, bk, 1, add_weight),
            assign(var("at_m"), var("at_mb")),
        ];
        let mut tree = self.locate(self.queries);
        tree.extend([
            array("at_q", Ty::Compute(p), dq / self.lanes(), false),
            array("at_acc", Ty::Compute(p), dv / self.lanes(), false),
            array("at_s", Ty::Compute(p), bk, false),
            array("at_ks", Ty::Compute(p), bk * dq, true),
            array("at_vs", Ty::Compute(p), bk * dv, true),
            let_mut("at_m", Ty::Compute(p), f(NEG_LARGE, p)),
            let_mut("at_l", Ty::Compute(p), f(0.0, p)),
            unrolled(
                "at_f",
                dv / self.lanes(),
                vec![assign(item("at_acc", var("at_f")), f(0.0, p))],
            ),
            self.zero_regs("at_q", dq),
            Stmt::If(
                live(),
                vec![self.load_row("at_q", &spec.q, self.queries, dq)],
            ),
            self.over_key_blocks(step),
            Stmt::If(
                live(),
                vec![self.store_row("at_acc", out, self.queries, dv, Some(var("at_l")))],
            ),
            Stmt::If(
                live().and(var("at_lane").equals(0i64)),
                vec![Stmt::Store(
                    lse,
                    At::Flat(Box::new(self.stat_offset(var("at_row"), self.queries))),
                    bin(BinOp::Add, p, var("at_m"), un(UnOp::Log, p, var("at_l"))),
                )],
            ),
        ]);
        tree
    }

    /// The weight `at_w` of query `query` on key `key` recomputed from the score's dot
    /// product `at_dot` and the row's log-sum-exp (0 where hidden), its dropout factor
    /// `at_keep` and the kept weight `at_wk`.
    fn weight(
        &self,
        query: Expr<'static>,
        key: Expr<'static>,
        visible: Expr<'static>,
        lse: Expr<'static>,
    ) -> Vec<Stmt<'a>> {
        let p = self.p;
        let mut out = vec![let_(
            "at_w",
            Ty::Compute(p),
            select(
                visible,
                un(UnOp::Exp, p, bin(BinOp::Sub, p, self.scaled_score(), lse)),
                f(0.0, p),
            ),
        )];
        out.extend(self.keep(query, key));
        out.push(let_(
            "at_wk",
            Ty::Compute(p),
            bin(BinOp::Mul, p, var("at_w"), var("at_keep")),
        ));
        out
    }

    /// The score's gradient times the scale, `at_ds = at_w · (at_dp · at_keep − delta) ·
    /// scale`, from the dot product `at_dp` of the output gradient and the value.
    fn score_grad(&self, delta: Expr<'static>) -> Stmt<'a> {
        let p = self.p;
        let dp = bin(BinOp::Mul, p, var("at_dp"), var("at_keep"));
        let_(
            "at_ds",
            Ty::Compute(p),
            bin(
                BinOp::Mul,
                p,
                bin(BinOp::Mul, p, var("at_w"), bin(BinOp::Sub, p, dp, delta)),
                f(self.a.spec().scale, p),
            ),
        )
    }

    fn query_grads(
        &self,
        lse: &'a Tnode,
        delta: &'a Tnode,
        grad_out: &'a Tnode,
        grad_q: &'a Tnode,
    ) -> Vec<Stmt<'a>> {
        let (p, bk, dq, dv) = (self.p, self.a.block, self.features, self.value_features);
        let spec = self.a.spec();
        let live = || var("at_row").lt(self.queries);
        let key = || var("at_kb") + var("at_j");
        let mut per_key = self.dot(
            "at_dot",
            item("at_q", var("at_f")),
            item("at_ks", var("at_j") * dq + self.feature()),
            dq,
        );
        per_key.extend(self.dot(
            "at_dp",
            item("at_do", var("at_f")),
            item("at_vs", var("at_j") * dv + self.feature()),
            dv,
        ));
        per_key.extend(self.key_bias(key()));
        per_key.extend(self.weight(
            var("at_row"),
            key(),
            self.visible(var("at_row"), key(), key().lt(self.keys)),
            var("at_lse"),
        ));
        per_key.push(self.score_grad(var("at_delta")));
        per_key.push(unrolled(
            "at_f",
            dq / self.lanes(),
            vec![assign(
                item("at_dq", var("at_f")),
                fma(
                    p,
                    item("at_dq", var("at_f")),
                    var("at_ds"),
                    item("at_ks", var("at_j") * dq + self.feature()),
                ),
            )],
        ));
        let stat = |node: &'a Tnode| {
            Expr::Elem(
                node,
                At::Flat(Box::new(self.stat_offset(var("at_row"), self.queries))),
            )
        };
        let mut tree = self.locate(self.queries);
        tree.extend([
            array("at_q", Ty::Compute(p), dq / self.lanes(), false),
            array("at_do", Ty::Compute(p), dv / self.lanes(), false),
            array("at_dq", Ty::Compute(p), dq / self.lanes(), false),
            array("at_ks", Ty::Compute(p), bk * dq, true),
            array("at_vs", Ty::Compute(p), bk * dv, true),
            let_mut("at_lse", Ty::Compute(p), f(0.0, p)),
            let_mut("at_delta", Ty::Compute(p), f(0.0, p)),
            unrolled(
                "at_f",
                dq / self.lanes(),
                vec![assign(item("at_dq", var("at_f")), f(0.0, p))],
            ),
            self.zero_regs("at_q", dq),
            self.zero_regs("at_do", dv),
            Stmt::If(
                live(),
                vec![
                    self.load_row("at_q", &spec.q, self.queries, dq),
                    self.load_row("at_do", grad_out, self.queries, dv),
                    assign(var("at_lse"), stat(lse)),
                    assign(var("at_delta"), stat(delta)),
                ],
            ),
            self.over_key_blocks(vec![range("at_j", Ty::Int, 0i64, bk, 1, per_key)]),
            Stmt::If(
                live(),
                vec![self.store_row("at_dq", grad_q, self.queries, dq, None)],
            ),
        ]);
        tree
    }

    fn key_grads(
        &self,
        lse: &'a Tnode,
        delta: &'a Tnode,
        grad_out: &'a Tnode,
        grad_k: Option<&'a Tnode>,
        grad_v: Option<&'a Tnode>,
    ) -> Vec<Stmt<'a>> {
        let (p, bq, dq, dv) = (self.p, self.a.block, self.features, self.value_features);
        let spec = self.a.spec();
        let live = || var("at_row").lt(self.keys);
        let query = || var("at_qb") + var("at_j");
        let mut per_query = self.dot(
            "at_dot",
            item("at_qs", var("at_j") * dq + self.feature()),
            item("at_k", var("at_f")),
            dq,
        );
        per_query.extend(self.weight(
            query(),
            var("at_row"),
            self.visible(query(), var("at_row"), query().lt(self.queries)),
            item("at_ls", var("at_j")),
        ));
        let accumulate = |acc: &str, coeff: &str, staged: &str, width: usize| {
            unrolled(
                "at_f",
                width / self.lanes(),
                vec![assign(
                    item(acc, var("at_f")),
                    fma(
                        p,
                        item(acc, var("at_f")),
                        var(coeff),
                        item(staged, var("at_j") * width + self.feature()),
                    ),
                )],
            )
        };
        if grad_v.is_some() {
            per_query.push(accumulate("at_dv", "at_wk", "at_dos", dv));
        }
        if grad_k.is_some() {
            per_query.extend(self.dot(
                "at_dp",
                item("at_dos", var("at_j") * dv + self.feature()),
                item("at_v", var("at_f")),
                dv,
            ));
            per_query.push(self.score_grad(item("at_dl", var("at_j"))));
            per_query.push(accumulate("at_dk", "at_ds", "at_qs", dq));
        }
        // A causal group's keys are hidden from every query before its first key's (less
        // the offset).
        let first = if spec.causal {
            let from = var("at_rb") * self.rows() - self.offset();
            match spec.causal_offset {
                Some(_) => select(from.clone().lt(0i64), Expr::Int(0), from),
                None => from,
            }
        } else {
            Expr::Int(0)
        };
        let mut tree = self.locate(self.keys);
        // The invocation's key's bias, one for all its queries.
        tree.extend(self.key_bias(var("at_row")));
        let mut zeroed = vec![self.zero_regs("at_k", dq)];
        let mut loads = vec![self.load_row("at_k", &spec.k, self.keys, dq)];
        let mut staging = vec![
            Stmt::Barrier(Barrier::Shared),
            self.stage("at_qs", &spec.q, var("at_qb"), self.queries, dq),
            self.stage("at_dos", grad_out, var("at_qb"), self.queries, dv),
            self.stage_stat("at_ls", lse, var("at_qb")),
        ];
        let mut stores = Vec::new();
        tree.extend([
            array("at_k", Ty::Compute(p), dq / self.lanes(), false),
            array("at_qs", Ty::Compute(p), bq * dq, true),
            array("at_dos", Ty::Compute(p), bq * dv, true),
            array("at_ls", Ty::Compute(p), bq, true),
        ]);
        if let Some(grad_k) = grad_k {
            tree.extend([
                array("at_v", Ty::Compute(p), dv / self.lanes(), false),
                array("at_dk", Ty::Compute(p), dq / self.lanes(), false),
                array("at_dl", Ty::Compute(p), bq, true),
                unrolled(
                    "at_f",
                    dq / self.lanes(),
                    vec![assign(item("at_dk", var("at_f")), f(0.0, p))],
                ),
            ]);
            zeroed.push(self.zero_regs("at_v", dv));
            loads.push(self.load_row("at_v", &spec.v, self.keys, dv));
            staging.push(self.stage_stat("at_dl", delta, var("at_qb")));
            stores.push(self.store_row("at_dk", grad_k, self.keys, dq, None));
        }
        if let Some(grad_v) = grad_v {
            tree.extend([
                array("at_dv", Ty::Compute(p), dv / self.lanes(), false),
                unrolled(
                    "at_f",
                    dv / self.lanes(),
                    vec![assign(item("at_dv", var("at_f")), f(0.0, p))],
                ),
            ]);
            stores.push(self.store_row("at_dv", grad_v, self.keys, dv, None));
        }
        staging.extend([
            Stmt::Barrier(Barrier::Shared),
            // Every invocation computes (keys past the end on zeros), as in the forward.
            range("at_j", Ty::Int, 0i64, bq, 1, per_query),
        ]);
        tree.extend(zeroed);
        tree.extend([
            Stmt::If(live(), loads),
            range("at_qb", Ty::Index, first, self.queries, bq as i64, staging),
            Stmt::If(live(), stores),
        ]);
        tree
    }
}

//! Rendering of the schedules of `arrayjit_opt::schedule` to C: blocked contractions as calls
//! of the product helper (`crate::c::gemm`), nests split over the device's workers as chunk
//! functions, and reductions over several accumulators.

use crate::c::syntax::c_compute_type;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrayjit_ir::{AxisIndex, BinOp, LowLevel, Result, ScalarExpr, ScopeId, Symbol, Tnode};
use arrayjit_opt::schedule::{
    BATCH_SPLIT_MIN_PER_WORKER, BatchSplit, Gemm, ReductionPlan, Schedule, ScheduleKind,
};

use crate::c::kernel::{KernelRenderer, comment};
use crate::c::pairwise::{Cascade, PAIRWISE_BLOCK_STEPS};
use crate::c::syntax::{self as c_syntax, CSyntax};
use crate::c::{gemm, gemm_widened};

/// Where a statement function's outlined functions go: chunk functions run by the device's
/// workers and the statements of fused loops. Each takes the statement function's arrays and
/// static indices as parameters of its own (arrays `restrict`-qualified, as in the statement
/// function): compilers honour `restrict` on parameters, not on local pointers loaded from a
/// struct, so loops are vectorized without run-time alias checks and duplicated versions. A
/// chunk function, whose signature the worker pool fixes, unpacks the variables from the
/// `{symbol}_vars` struct inside its `{symbol}_chunk_t` and passes them to its body.
pub(crate) struct Outlining {
    /// The statement function's symbol, prefix of every outlined function and type.
    pub(crate) symbol: String,
    /// The statement function's parameters (C type, name), except the worker pool.
    pub(crate) params: Vec<(String, String)>,
    /// The same parameters as declared in a parameter list.
    pub(crate) declared: Vec<String>,
    /// The outlined functions so far (they precede the statement function).
    pub(crate) functions: String,
    /// The dialect's qualifiers of outlined functions.
    pub(crate) prefix: String,
    /// The dialect's qualifiers of a function meant to be inlined into its one caller.
    pub(crate) inline_prefix: String,
    /// Some outlined function reads the variables from a `{symbol}_chunk_t`.
    pub(crate) uses_chunk_type: bool,
    /// The parameters of iteration-private nodes (`Tnode::is_iteration_private`) with the C
    /// declaration of a copy (element type, count): each chunk function passes its body a
    /// copy on its own stack instead of the statement's array, so workers never share one.
    pub(crate) private: Vec<(String, String, usize)>,
}

impl Outlining {
    /// The outlining of a statement function `symbol` with parameters `params`.
    pub(crate) fn new(symbol: &str, params: Vec<(String, String)>, syntax: &CSyntax) -> Outlining {
        Outlining {
            symbol: symbol.to_string(),
            declared: declare_params(&params, syntax),
            params,
            functions: String::new(),
            prefix: syntax.outlined_prefix.clone(),
            inline_prefix: syntax.helper_prefix.clone(),
            uses_chunk_type: false,
            private: Vec::new(),
        }
    }

    fn chunk_type(&self) -> String {
        format!("{}_chunk_t", self.symbol)
    }

    /// `first`, then the declared parameters, comma-separated.
    fn parameter_list(&self, first: &[String]) -> String {
        first
            .iter()
            .chain(&self.declared)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Runs chunk function `chunk` over `count` units split evenly over the device's workers
    /// (on the calling thread when there is one chunk), with `extra` as the chunk type's
    /// `extra`; `declare` adds declarations before `w` (`"n = ..., "`).
    fn launch(&self, chunk: &str, declare: &str, count: &str, extra: &str, out: &mut String) {
        let chunk_t = self.chunk_type();
        let _ = writeln!(
            out,
            "    const int64_t {declare}w = par && par->workers > 1 ? par->workers : 1;"
        );
        let _ = writeln!(
            out,
            "    {chunk_t} ch = {{ &vars, ({count} + w - 1) / w, {extra} }};"
        );
        let _ = writeln!(
            out,
            "    const int64_t chunks = ({count} + ch.per - 1) / ch.per;"
        );
        let _ = writeln!(
            out,
            "    if (chunks > 1) par->run(par->pool, {chunk}, &ch, chunks); else {chunk}(&ch, 0);"
        );
    }

    /// The opening of the body of chunk function `name`: `{name}_body(ch, index, variables)`,
    /// closed by [`Outlining::close_chunk`].
    fn open_chunk(&mut self, name: &str) -> String {
        self.uses_chunk_type = true;
        let first = [
            format!("const {} *const ch", self.chunk_type()),
            "const int64_t index".to_string(),
        ];
        format!(
            "{} void {name}_body({}) {{\n",
            self.inline_prefix,
            self.parameter_list(&first)
        )
    }

    /// Adds the body `f` opened by [`Outlining::open_chunk`] (and closed) and the chunk
    /// function `name(ctx, index)` run by a worker with the `{symbol}_chunk_t` as `ctx`, which
    /// unpacks the variables and calls the body.
    /// An iteration-private node's array is a copy on the chunk function's stack.
    fn close_chunk(&mut self, name: &str, f: &str) {
        let chunk_t = self.chunk_type();
        let mut copies = String::new();
        let unpacked: Vec<String> = ["ch".to_string(), "index".to_string()]
            .into_iter()
            .chain(self.params.iter().map(|(_, p)| {
                match self.private.iter().find(|(q, _, _)| q == p) {
                    Some((_, elem, count)) => {
                        let _ = writeln!(
                            copies,
                            "  {elem} {p}_copy[{count}] __attribute__((aligned(64)));"
                        );
                        format!("{p}_copy")
                    }
                    None => format!("ch->vars->{p}"),
                }
            }))
            .collect();
        self.functions.push_str(f);
        let _ = writeln!(
            self.functions,
            "{} void {name}(void *ctx, int64_t index) {{\n  const {chunk_t} *const ch = (const {chunk_t} *)ctx;\n{copies}  {name}_body({});\n}}\n",
            self.prefix,
            unpacked.join(", ")
        );
    }

    /// The opening of the function `name(iter, variables)` of a statement of a fused loop,
    /// run for the loop's iteration `iter`.
    fn open_part(&self, name: &str, iter: &str) -> String {
        format!(
            "{} void {name}({}) {{\n",
            self.prefix,
            self.parameter_list(&[format!("const int64_t {iter}")])
        )
    }

    /// The call of part `name` (opened by [`Outlining::open_part`]) for iteration `iter`,
    /// from a function that has the variables in scope.
    fn call_part(&self, name: &str, iter: &str) -> String {
        let args: Vec<&str> = std::iter::once(iter)
            .chain(self.params.iter().map(|(_, p)| p.as_str()))
            .collect();
        format!("{name}({});", args.join(", "))
    }
}

impl KernelRenderer<'_> {
    /// A contraction statement as calls of the blocked product, one per batch element: in
    /// batch loops on the calling thread (each product may split itself over the workers), or,
    /// when the schedule splits the batch ([`BatchSplit`]: always, or where the workers divide
    /// it evenly, checked at run time), in a chunk function running a range of the batch
    /// elements per worker.
    pub(super) fn contraction(
        &mut self,
        g: &Gemm,
        position: usize,
        products: &mut BTreeMap<String, (String, String)>,
        outlining: &mut Outlining,
        out: &mut String,
    ) -> Result<()> {
        let paths =
            gemm::HelperPaths::of_product(g.m.extent, g.n.extent, g.guard.is_some(), &g.blocking);
        let helper = gemm::add_product_helper(products, g.prec, &g.blocking, paths);
        // A factor stored narrower (a bf16 weight): the widening unit, which calls the helper.
        let name = match g.widened_factor() {
            None => helper,
            Some((side, narrow)) => {
                let b = &g.blocking;
                products
                    .entry(gemm_widened::widened_unit(g.prec, narrow, b))
                    .or_insert_with(|| {
                        (
                            gemm_widened::widened_signatures(g.prec, narrow, b),
                            gemm_widened::widened_definition(g.prec, narrow, b),
                        )
                    });
                gemm_widened::widened_entry(g.prec, narrow, b, side)
            }
        };
        let [c, a, b] = [&g.out, &g.lhs, &g.rhs].map(|t| self.node(t).map(str::to_string));
        let (c, a, b) = (c?, a?, b?);
        let _ = writeln!(out, "  {}", comment(&g.to_string()));
        let mut offsets = [String::from("0"), String::from("0"), String::from("0")];
        let counter = self.loop_counter;
        self.loop_counter += 1;
        // The guard as a compound literal (C99), `0` for none; static indices in its offset are
        // read at run time.
        let guard = match g.guard {
            None => "0".to_string(),
            Some([gi, gj, gk, g0]) => {
                let offset = self.affine(&arrayjit_ir::AxisIndex::affine(
                    g.guard_statics.iter().copied(),
                    g0,
                ))?;
                format!("(const int64_t[4]){{{gi}, {gj}, {gk}, {offset}}}")
            }
        };
        let call = |offsets: &[String; 3], par: &str| {
            format!(
                "{name}({}, {}, {}, {a} + {}, {}, {}, {b} + {}, {}, {}, {c} + {}, {}, {}, {}, {guard}, {par});",
                g.m.extent,
                g.n.extent,
                g.k.extent,
                offsets[1],
                g.m.strides[1],
                g.k.strides[1],
                offsets[2],
                g.k.strides[2],
                g.n.strides[2],
                offsets[0],
                g.m.strides[0],
                g.n.strides[0],
                i32::from(g.overwrite),
            )
        };
        let add_offsets = |offsets: &mut [String; 3], it: &str, strides: &[usize; 3]| {
            for (t, offset) in offsets.iter_mut().enumerate() {
                if strides[t] != 0 {
                    offset.push_str(&format!(" + {it} * {}", strides[t]));
                }
            }
        };
        let by_batch = match g.batch_split {
            BatchSplit::ByProduct => None,
            BatchSplit::ByBatch => Some(None),
            BatchSplit::ByBatchWhenEven => Some(Some(BATCH_SPLIT_MIN_PER_WORKER)),
        };
        let mut indent = String::from("  ");
        if let Some(even_only) = by_batch {
            // One flat batch index per element, decomposed into the batch loops' indices
            // (outermost first); each worker runs a range of elements, each product serially.
            let chunk = format!("{}_chunk{position}", outlining.symbol);
            let total: usize = g.batch.iter().map(|d| d.extent).product();
            let mut f = outlining.open_chunk(&chunk);
            let _ = writeln!(
                f,
                "  const int64_t lo = index * ch->per, hi = lo + ch->per < {total} ? lo + ch->per : {total};"
            );
            let _ = writeln!(f, "  for (int64_t e = lo; e < hi; ++e) {{");
            let mut inner = 1;
            let mut chunk_offsets = offsets.clone();
            for (d, dim) in g.batch.iter().enumerate().rev() {
                let it = format!("b{counter}_{d}");
                let _ = writeln!(f, "    const int64_t {it} = e / {inner} % {};", dim.extent);
                add_offsets(&mut chunk_offsets, &it, &dim.strides);
                inner *= dim.extent;
            }
            let _ = writeln!(f, "    {}", call(&chunk_offsets, "0"));
            let _ = writeln!(f, "  }}\n}}\n");
            outlining.close_chunk(&chunk, &f);
            let Some(min_per_worker) = even_only else {
                let _ = writeln!(out, "  {{");
                outlining.launch(&chunk, &format!("n = {total}, "), "n", "0", out);
                let _ = writeln!(out, "  }}");
                return Ok(());
            };
            // By batch element only where the workers divide the batch evenly; otherwise the
            // batch loops below, each product splitting itself.
            let _ = writeln!(
                out,
                "  if (par && par->workers > 1 && {total} >= par->workers && ({total} % par->workers == 0 || {total} >= {min_per_worker} * par->workers)) {{"
            );
            outlining.launch(&chunk, &format!("n = {total}, "), "n", "0", out);
            let _ = writeln!(out, "  }} else {{");
            indent.push_str("  ");
        }
        for (d, dim) in g.batch.iter().enumerate() {
            let it = format!("b{counter}_{d}");
            let _ = writeln!(
                out,
                "{indent}for (int64_t {it} = 0; {it} < {}; ++{it}) {{",
                dim.extent
            );
            add_offsets(&mut offsets, &it, &dim.strides);
            indent.push_str("  ");
        }
        let _ = writeln!(out, "{indent}{}", call(&offsets, "par"));
        for _ in &g.batch {
            indent.truncate(indent.len() - 2);
            let _ = writeln!(out, "{indent}}}");
        }
        if by_batch.is_some() {
            let _ = writeln!(out, "  }}");
        }
        Ok(())
    }

    /// A statement whose outermost loop is split over the device's workers: the loop body
    /// goes into a chunk function (outlined before the kernel) that runs a range of the
    /// loop's iterations; the kernel runs the chunks through `par`.
    pub(super) fn parallel(
        &mut self,
        s: &LowLevel,
        sched: &Schedule,
        position: usize,
        outlining: &mut Outlining,
        out: &mut String,
    ) -> Result<()> {
        let LowLevel::For {
            index,
            from,
            to,
            body,
        } = s
        else {
            return self.stmt(s, 1, out);
        };
        let chunk = format!("{}_chunk{position}", outlining.symbol);
        let name = format!("i{}", self.loop_counter);
        self.loop_counter += 1;
        let mut f = outlining.open_chunk(&chunk);
        let _ = writeln!(
            f,
            "  const int64_t lo = {from} + index * ch->per, hi = lo + ch->per < {to} ? lo + ch->per : {to};"
        );
        let _ = writeln!(f, "  for (int64_t {name} = lo; {name} < hi; ++{name}) {{");
        self.symbols.insert(*index, name);
        self.loop_body(body, *index, sched, position, outlining, 2, &mut f)?;
        self.symbols.remove(index);
        let _ = writeln!(f, "  }}\n}}\n");
        outlining.close_chunk(&chunk, &f);
        let _ = writeln!(out, "  {{ {}", comment(&sched.to_string()));
        outlining.launch(&chunk, &format!("n = {to} - {from}, "), "n", "0", out);
        let _ = writeln!(out, "  }}");
        Ok(())
    }

    /// The body of a statement's outermost loop (over `index`), by the statement's schedule:
    /// a reduction below it, or the statements of a fused body, each by its own schedule and
    /// each loop among them in a function of its own (called once per iteration), or plain
    /// code.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loop_body(
        &mut self,
        body: &LowLevel,
        index: Symbol,
        sched: &Schedule,
        position: usize,
        outlining: &mut Outlining,
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let (ScheduleKind::Fused(parts), LowLevel::Seq(items)) = (&sched.kind, body) else {
            return match &sched.kind {
                ScheduleKind::Reduction(plan) => self.reduction(body, plan, depth, out),
                _ => self.stmt(body, depth, out),
            };
        };
        let pad = "  ".repeat(depth);
        let iter = self.symbols.get(&index).cloned().unwrap_or_default();
        for (k, (item, part)) in items.iter().zip(parts).enumerate() {
            // Loops go into functions of their own; single statements stay inline.
            let outline = matches!(item, LowLevel::For { .. });
            let inner_depth = if outline { 1 } else { depth };
            let mut code = String::new();
            match &part.kind {
                ScheduleKind::Reduction(plan) => {
                    self.reduction(item, plan, inner_depth, &mut code)?
                }
                _ => self.stmt(item, inner_depth, &mut code)?,
            }
            if !outline {
                out.push_str(&code);
                continue;
            }
            let name = format!("{}_part{position}_{k}", outlining.symbol);
            let mut f = outlining.open_part(&name, &iter);
            let _ = writeln!(f, "{code}}}\n");
            outlining.functions.push_str(&f);
            let _ = writeln!(out, "{pad}{}", outlining.call_part(&name, &iter));
        }
        Ok(())
    }

    /// A statement run on one worker, its outermost loop's body by its schedule.
    pub(super) fn serial(
        &mut self,
        s: &LowLevel,
        sched: &Schedule,
        position: usize,
        outlining: &mut Outlining,
        out: &mut String,
    ) -> Result<()> {
        match s {
            LowLevel::For {
                index,
                from,
                to,
                body,
            } if matches!(sched.kind, ScheduleKind::Fused(_)) => {
                let _ = writeln!(out, "  {{ {}", comment(&sched.to_string()));
                self.for_loop(*index, *from, *to, 2, out, |k, out| {
                    k.loop_body(body, *index, sched, position, outlining, 3, out)
                })?;
                let _ = writeln!(out, "  }}");
                Ok(())
            }
            _ => self.stmt(s, 1, out),
        }
    }

    /// Declares `acc[lanes]` and reduces `value` over `index` in `lo..hi` into it (element `r`
    /// into accumulator `(r - lo) mod lanes`, the tail into accumulator 0), then combines the
    /// accumulators in order into a new variable, whose name it returns. A sum of up to
    /// `longest` iterations that spans several pairwise blocks runs them first, in the
    /// pairwise order (see `pairwise`), and adds their cascade into the accumulators.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_range(
        &mut self,
        index: Symbol,
        (lo, hi, longest): (&str, &str, u64),
        (step, scope): (&ScalarExpr, ScopeId),
        plan: &ReductionPlan,
        depth: usize,
        out: &mut String,
    ) -> Result<String> {
        let pad = "  ".repeat(depth);
        let prec = scope.prec;
        let t = c_compute_type(prec);
        let n = self.loop_counter;
        self.loop_counter += 1;
        let (acc, base, lane) = (format!("acc{n}"), format!("r{n}"), format!("l{n}"));
        let lanes = plan.lanes;
        let identity = match plan.combine {
            BinOp::Max => c_syntax::literal(prec, f64::NEG_INFINITY),
            BinOp::Min => c_syntax::literal(prec, f64::INFINITY),
            _ => c_syntax::literal(prec, -0.0),
        };
        let _ = writeln!(
            out,
            "{pad}{t} {acc}[{lanes}]; for (int {lane} = 0; {lane} < {lanes}; ++{lane}) {acc}[{lane}] = {identity};"
        );
        let _ = writeln!(out, "{pad}int64_t {base} = {lo};");
        let block = lanes as u64 * PAIRWISE_BLOCK_STEPS;
        let cascade = (plan.combine == BinOp::Add && longest >= 2 * block).then(|| {
            let blk = format!("blk{n}");
            let cascade = Cascade::declare(
                n,
                (lanes, longest / block),
                (plan.combine, prec),
                &pad,
                out,
            );
            let _ = writeln!(out, "{pad}for (; {base} + {block} <= {hi};) {{");
            let _ = writeln!(
                out,
                "{pad}  {t} {blk}[{lanes}]; for (int {lane} = 0; {lane} < {lanes}; ++{lane}) {blk}[{lane}] = {identity};"
            );
            let _ = writeln!(
                out,
                "{pad}  for (const int64_t e{n} = {base} + {block}; {base} < e{n}; {base} += {lanes}) {{"
            );
            let _ = writeln!(
                out,
                "{pad}    {}\n{pad}    for (int64_t {lane} = 0; {lane} < {lanes}; ++{lane}) {{",
                unroll_lanes(plan)
            );
            (cascade, blk)
        });
        if let Some((cascade, blk)) = &cascade {
            self.symbols.insert(index, format!("({base} + {lane})"));
            self.locals.insert(scope.id, format!("{blk}[{lane}]"));
            let mut prelude = String::new();
            let v = self.expr(step, prec, depth + 3, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}      {blk}[{lane}] = {v};");
            let _ = writeln!(out, "{pad}    }}\n{pad}  }}");
            cascade.push(blk, self.helpers, &format!("{pad}  "), out);
            let _ = writeln!(out, "{pad}}}");
        }
        let _ = writeln!(
            out,
            "{pad}for (; {base} + {lanes} <= {hi}; {base} += {lanes}) {{"
        );
        let _ = writeln!(
            out,
            "{pad}  {}\n{pad}  for (int64_t {lane} = 0; {lane} < {lanes}; ++{lane}) {{",
            unroll_lanes(plan)
        );
        self.symbols.insert(index, format!("({base} + {lane})"));
        self.locals.insert(scope.id, format!("{acc}[{lane}]"));
        let mut prelude = String::new();
        let v = self.expr(step, prec, depth + 2, &mut prelude)?;
        out.push_str(&prelude);
        let _ = writeln!(out, "{pad}    {acc}[{lane}] = {v};");
        let _ = writeln!(out, "{pad}  }}\n{pad}}}");
        // The tail (fewer than `lanes` steps), unless the range is known to leave none.
        let no_tail = matches!(
            (lo.parse::<i64>(), hi.parse::<i64>()),
            (Ok(l), Ok(h)) if h >= l && (h - l) % lanes as i64 == 0
        );
        if !no_tail {
            let _ = writeln!(out, "{pad}for (; {base} < {hi}; ++{base}) {{");
            self.symbols.insert(index, base.clone());
            self.locals.insert(scope.id, format!("{acc}[0]"));
            let mut prelude = String::new();
            let v = self.expr(step, prec, depth + 1, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}  {acc}[0] = {v};\n{pad}}}");
        }
        self.symbols.remove(&index);
        self.locals.remove(&scope.id);
        if let Some((cascade, _)) = &cascade {
            cascade.finish(&acc, self.helpers, &pad, out);
        }
        // The lanes folded in halves: each fold adds the upper part onto the lower one, a
        // loop of known length that runs as vector operations — where a chain through every
        // lane waited on each step (63 dependent maxima after two steps of a 128-wide softmax
        // row).
        let mut width = lanes;
        while width > 1 {
            let half = width.div_ceil(2);
            let folded = c_syntax::render_binop(
                plan.combine,
                prec,
                &format!("{acc}[{lane}]"),
                &format!("{acc}[{lane} + {half}]"),
                self.helpers,
            );
            let _ = writeln!(
                out,
                "{pad}for (int {lane} = 0; {lane} < {}; ++{lane}) {acc}[{lane}] = {folded};",
                width - half
            );
            width = half;
        }
        let total = format!("total{n}");
        let _ = writeln!(out, "{pad}{t} {total} = {acc}[0];");
        Ok(total)
    }

    /// `tn[idcs] = tn[idcs] ⊕ total`, stored in the node's precision.
    #[allow(clippy::too_many_arguments)]
    fn combine_into_element(
        &mut self,
        tn: &Tnode,
        idcs: &[AxisIndex],
        total: &str,
        plan: &ReductionPlan,
        prec: arrayjit_ir::Prec,
        pad: &str,
        out: &mut String,
    ) -> Result<()> {
        let name = self.node(tn)?.to_string();
        let offset = self.offset(tn, idcs)?;
        let element = format!("{name}[{offset}]");
        let current = c_syntax::convert(&element, prec, prec, self.helpers);
        let combined = c_syntax::render_binop(plan.combine, prec, &current, total, self.helpers);
        let stored = c_syntax::store(&combined, prec, self.helpers);
        let _ = writeln!(out, "{pad}  {element} = {stored};");
        Ok(())
    }

    /// A full reduction split into fixed blocks of `plan.blocks` iterations: chunk functions
    /// reduce ranges of blocks over the device's workers into one partial per block, and the
    /// partials are combined pairwise. The blocks do not depend on the worker count, so
    /// neither do the results.
    pub(super) fn split_reduction(
        &mut self,
        s: &LowLevel,
        plan: &ReductionPlan,
        position: usize,
        outlining: &mut Outlining,
        out: &mut String,
    ) -> Result<()> {
        let (
            LowLevel::For {
                index,
                from,
                to,
                body,
            },
            Some(block),
        ) = (s.unwrapped(), plan.blocks)
        else {
            return self.reduction(s, plan, 1, out);
        };
        let LowLevel::Set { tn, idcs, value } = body.perfect_nest().1 else {
            return self.reduction(s, plan, 1, out);
        };
        let prec = tn.prec();
        let t = c_compute_type(prec);
        let chunk = format!("{}_chunk{position}", outlining.symbol);
        let blocks = ((to - from) as u64).div_ceil(block);
        let mut f = outlining.open_chunk(&chunk);
        let _ = writeln!(f, "  {t} *const partial = ({t} *)ch->extra;");
        let _ = writeln!(
            f,
            "  const int64_t first = index * ch->per, last = first + ch->per < {blocks} ? first + ch->per : {blocks};"
        );
        let _ = writeln!(f, "  for (int64_t b = first; b < last; ++b) {{");
        let _ = writeln!(
            f,
            "    const int64_t lo = {from} + b * {block}, hi = lo + {block} < {to} ? lo + {block} : {to};"
        );
        // The element's read inside the value becomes the accumulator.
        let scope = ScopeId::fresh(prec);
        let step = replace_read(value, tn, idcs, scope);
        let total =
            self.reduce_range(*index, ("lo", "hi", block), (&step, scope), plan, 2, &mut f)?;
        let _ = writeln!(f, "    partial[b] = {total};\n  }}\n}}\n");
        outlining.close_chunk(&chunk, &f);
        let n = self.loop_counter;
        self.loop_counter += 1;
        let _ = writeln!(
            out,
            "  {{ /* reduction split into {blocks} blocks of {block}, combined pairwise */"
        );
        let _ = writeln!(out, "    {t} partial{n}[{blocks}];");
        outlining.launch(&chunk, "", &blocks.to_string(), &format!("partial{n}"), out);
        // Pairwise: each round adds the partial `w` blocks on into each partial at a multiple
        // of `2w`, so `partial[0]` ends with the sum of all.
        let total = format!("sum{n}");
        let step = c_syntax::render_binop(
            plan.combine,
            prec,
            &format!("partial{n}[b]"),
            &format!("partial{n}[b + w]"),
            self.helpers,
        );
        let _ = writeln!(
            out,
            "    for (int64_t w = 1; w < {blocks}; w *= 2) for (int64_t b = 0; b + w < {blocks}; b += 2 * w) partial{n}[b] = {step};"
        );
        let _ = writeln!(out, "    {t} {total} = partial{n}[0];");
        self.combine_into_element(tn, idcs, &total, plan, prec, "  ", out)?;
        let _ = writeln!(out, "  }}");
        Ok(())
    }

    /// A statement whose innermost loop reduces into one element, with the loop run over
    /// `plan.lanes` accumulators (element `r` into accumulator `r mod lanes`, the tail into
    /// accumulator 0) that are then folded in halves: a fixed summation order that compilers
    /// vectorize, instead of one serial dependency chain.
    pub(super) fn reduction(
        &mut self,
        s: &LowLevel,
        plan: &ReductionPlan,
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let pad = "  ".repeat(depth);
        match s {
            LowLevel::Seq(items) if items.len() == 1 => self.reduction(&items[0], plan, depth, out),
            LowLevel::For {
                index,
                from,
                to,
                body,
            } if *index == plan.iter => {
                let LowLevel::Set { tn, idcs, value } = body.perfect_nest().1 else {
                    return self.stmt(s, depth, out);
                };
                let prec = tn.prec();
                let _ = writeln!(out, "{pad}{{");
                // The element's read inside the value becomes the accumulator.
                let scope = ScopeId::fresh(prec);
                let step = replace_read(value, tn, idcs, scope);
                let total = self.reduce_range(
                    *index,
                    (&from.to_string(), &to.to_string(), (to - from) as u64),
                    (&step, scope),
                    plan,
                    depth + 1,
                    out,
                )?;
                match self.outer_cascade.take() {
                    Some(cascade) => {
                        cascade.push(&total, self.helpers, &pad, out);
                        self.outer_cascade = Some(cascade);
                    }
                    None => self.combine_into_element(tn, idcs, &total, plan, prec, &pad, out)?,
                }
                let _ = writeln!(out, "{pad}}}");
                Ok(())
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } if self.outer_cascade.is_none() && sums_across(s, plan) => {
                // The outermost of the loops that do not index the element: their totals, one
                // per iteration, are summed pairwise, then into the element once.
                let LowLevel::Set { tn, idcs, .. } = s.perfect_nest().1 else {
                    return self.stmt(s, depth, out);
                };
                let prec = tn.prec();
                let n = self.loop_counter;
                self.loop_counter += 1;
                let _ = writeln!(out, "{pad}{{");
                let inner = format!("{pad}  ");
                let (loops, _) = s.perfect_nest();
                self.outer_cascade = Some(Cascade::over_outer_loops(
                    n,
                    &loops,
                    (plan.combine, prec),
                    &inner,
                    out,
                ));
                let looped = self.for_loop(*index, *from, *to, depth + 1, out, |k, out| {
                    k.reduction(body, plan, depth + 2, out)
                });
                let cascade = self.outer_cascade.take().expect("opened above");
                looped?;
                let total = format!("outer{n}");
                cascade.finish_as(&total, self.helpers, &inner, out);
                self.combine_into_element(tn, idcs, &total, plan, prec, &pad, out)?;
                let _ = writeln!(out, "{pad}}}");
                Ok(())
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => self.for_loop(*index, *from, *to, depth, out, |k, out| {
                k.reduction(body, plan, depth + 1, out)
            }),
            other => self.stmt(other, depth, out),
        }
    }
}

/// Whether `nest` (a loop) sums into one element across its iterations: a perfect nest down
/// to the reduced loop whose loops, this one included, do not index the element, with the
/// reduction adding (maxima and minima are exact in any order).
fn sums_across(nest: &LowLevel, plan: &ReductionPlan) -> bool {
    let (loops, stmt) = nest.perfect_nest();
    let LowLevel::Set { idcs, .. } = stmt else {
        return false;
    };
    plan.combine == BinOp::Add
        && loops.len() >= 2
        && loops.last().is_some_and(|l| l.0 == plan.iter)
        && loops
            .iter()
            .all(|(i, ..)| idcs.iter().all(|x| !x.symbols().contains(i)))
}

/// The declarations of a statement function's parameters (C type, name) in a parameter list:
/// arrays as `restrict`-qualified constant pointers, values as constants.
pub(super) fn declare_params(params: &[(String, String)], syntax: &CSyntax) -> Vec<String> {
    params
        .iter()
        .map(|(t, name)| match t.strip_suffix(" *") {
            Some(pointee) => format!("{pointee} *const {} {name}", syntax.restrict),
            None => format!("const {t} {name}"),
        })
        .collect()
}

/// `value` with its reads of `tn[idcs]` replaced by the local `scope`.
fn replace_read(value: &ScalarExpr, tn: &Tnode, idcs: &[AxisIndex], scope: ScopeId) -> ScalarExpr {
    value.clone().map_bottom_up(&mut |e| match e {
        ScalarExpr::Get(t, i) if &t == tn && i == idcs => ScalarExpr::GetLocal(scope),
        e => e,
    })
}

/// The pragma before a reduction's loop over its accumulators, which unrolls the loop by the
/// vector registers the accumulators fill (`lanes / vector_lanes`). The accumulators then stay
/// in registers: at `-O2` gcc vectorizes the loop over `lanes` accumulators into a loop of
/// `lanes / vector_lanes` steps and, left rolled, keeps the accumulators in memory, each step
/// a load, an add and a store to the stack, chained through store-to-load forwarding (a
/// 16M-element sum ran 1.45× slower, a softmax of 4096 rows of 1024 1.26× slower). Unrolling
/// by `lanes` instead would unroll the scalar loop before it vectorizes, and maxima, whose
/// helper keeps NaN, do not vectorize again (that softmax 5× slower). gcc and clang read the
/// pragma; more than 32 registers would not stay in registers anyway, so they get none.
fn unroll_lanes(plan: &ReductionPlan) -> String {
    let registers = plan.lanes.div_ceil(plan.vector_lanes.max(1));
    if registers <= 32 {
        format!("#pragma GCC unroll {registers}")
    } else {
        String::new()
    }
}

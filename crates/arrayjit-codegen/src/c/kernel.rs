//! What every C-family renderer shares (the C kernels and their outlined functions, and the
//! CUDA passes): the statement and expression renderer [`KernelRenderer`], names and comments
//! that depend only on the program, the GCC optimization pragmas, and the translation-unit
//! type a program is compiled in.
//!
//! `KernelRenderer`'s impl blocks are spread over the files of `c/` by what they render
//! (`outer_sums`, `pairwise`, `schedules`, `statements`, `attention`): those modules and this
//! one import each other, the one import circle the house allows (`module_layers.rs` names
//! it).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{AxisIndex, Error, LowLevel, Prec, Result, ScalarExpr, Symbol, Tnode};

use crate::c::syntax::{self as c_syntax, Helper, c_compute_type};

/// Compile the following functions with moderate optimization (GCC; other compilers ignore it):
/// `O1`, the backends' default level (see `arrayjit_backends::cc::DEFAULT_CC_FLAGS`), whatever
/// level `ARRAYJIT_CC_FLAGS` asks for the rest; the command line's explicit `-ftree-vectorize`
/// still applies.
pub(crate) const LIGHT_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O1\")\n#endif";
/// Compile the following functions, the blocked product's helper and its widened factors, at
/// `O1` with gcc's `-fexpensive-optimizations` (GCC; other compilers ignore it; the command
/// line's `-ftree-vectorize` still applies). Their micro-kernels are explicit vector code whose
/// 24 accumulators need that option's register allocation: without it the products ran 45%
/// slower; with it they run as at `O2` (the harness of `scripts/gemm-blocking.sh`, every shape
/// within 1.5% either way over four alternated rounds on one and two cores), and the unit
/// compiles in 0.64 instead of 0.81 s (gcc 12, AMD EPYC family 25 model 17).
pub(crate) const PRODUCT_HELPER_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O1\", \"expensive-optimizations\")\n#endif";
/// Compile the following functions, the attention helper's, at `O2` (GCC; other compilers
/// ignore it): its own loops (the block's softmax steps, the running statistics) took 19% more
/// samples at `O1` with `-fexpensive-optimizations` (`perf`, the forward and backward of
/// b4 h12 T1024 d64 on one core; 2% of the pass), for 0.12 s less compile time.
pub(crate) const ATTENTION_HELPER_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O2\")\n#endif";
/// Compile the following functions, which only call others, clear locals and compute
/// addresses, without optimization (GCC; other compilers ignore it): a kernel makes hundreds to
/// thousands of calls with as many pointers live, whose register allocation costs more compile
/// time than the calls' run time is worth. (Measured on the 12-layer, width-768 GPT step with
/// gcc 12 on the 2-core VM: its 1682 calls compile in 1.0 s at `O1`, 0.27 s at `O0`; the step
/// itself takes seconds, the calls microseconds.)
pub(crate) const DISPATCH_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O0\")\n#endif";
/// Ends [`LIGHT_BEGIN`], [`PRODUCT_HELPER_BEGIN`], [`ATTENTION_HELPER_BEGIN`] or
/// [`DISPATCH_BEGIN`].
pub(crate) const OPTIMIZE_END: &str =
    "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif";

/// A translation unit compiled on its own and linked with the kernels' unit into one library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CUnit {
    /// A short name for the unit (part of its file name).
    pub name: String,
    /// Its complete source.
    pub source: String,
}

/// Renders IR statements and expressions in C, with the names bound so far.
pub(crate) struct KernelRenderer<'a> {
    pub(crate) helpers: &'a mut BTreeSet<Helper>,
    pub(crate) nodes: HashMap<Tnode, String>,
    pub(crate) merge: Option<(Tnode, String)>,
    pub(crate) symbols: HashMap<Symbol, String>,
    pub(crate) loop_counter: usize,
    pub(crate) locals: HashMap<usize, String>,
    /// Local variables named so far (`v0`, `v1`, ...): a counter rather than the size of
    /// `locals`, which also holds accumulator lanes that come and go.
    pub(crate) local_counter: usize,
    pub(crate) routine: String,
    /// Nodes whose name points at the one element the kernel uses (every access is at the same
    /// constant indices): their offset is 0.
    pub(crate) element_views: std::collections::HashSet<usize>,
    /// The pairwise sum collecting one total per iteration of a reduction's outer loops, while
    /// they are rendered (see `pairwise`).
    pub(crate) outer_cascade: Option<crate::c::pairwise::Cascade>,
    /// Whether long sums into local variables and sums along outer axes run pairwise (the C
    /// backends' CPU code; a GPU invocation keeps its serial loops).
    pub(crate) pairwise_sums: bool,
}

/// A comment with user text made harmless.
pub(crate) fn comment(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _.,:=+-[]".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("/* {clean} */")
}

/// A C name for a node that depends only on its label and position in the kernel.
pub(crate) fn node_name(tn: &Tnode, pos: usize) -> String {
    let label = tn
        .chosen_code_name()
        .unwrap_or_else(|| sanitize_identifier(&tn.label().join("_")));
    if label.is_empty() {
        format!("a{pos}")
    } else if label.starts_with(|c: char| c.is_ascii_digit()) {
        format!("n{label}_{pos}")
    } else {
        format!("{label}_{pos}")
    }
}

pub(crate) trait StableName {
    fn debug_name_stable(&self) -> String;
}

impl StableName for Tnode {
    /// The label without the id (ids depend on what else the process created).
    fn debug_name_stable(&self) -> String {
        self.label().join(".")
    }
}

impl KernelRenderer<'_> {
    fn unbound(&self, what: String) -> Error {
        Error::Render {
            routine: self.routine.clone(),
            language: "C".into(),
            detail: what,
        }
    }

    pub(crate) fn node(&self, tn: &Tnode) -> Result<&str> {
        self.nodes.get(tn).map(String::as_str).ok_or_else(|| {
            self.unbound(format!(
                "{} is neither materialized nor local (memory mode: {:?})",
                tn.debug_name(),
                tn.memory_mode().map(|m| m.to_string())
            ))
        })
    }

    /// The flat storage offset of a logical index.
    pub(crate) fn offset(&self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<String> {
        if self.element_views.contains(&tn.id()) {
            return Ok("0".into());
        }
        self.affine(&tn.flat_index(idcs))
    }

    pub(crate) fn affine(&self, idx: &AxisIndex) -> Result<String> {
        idx.render_with(|sym| {
            self.symbols.get(&sym).cloned().ok_or_else(|| {
                self.unbound(format!(
                    "symbol {sym} is not bound by a loop or a static index"
                ))
            })
        })
    }

    pub(crate) fn local(&mut self, id: usize) -> String {
        if let Some(name) = self.locals.get(&id) {
            return name.clone();
        }
        let name = format!("v{}", self.local_counter);
        self.local_counter += 1;
        self.locals.insert(id, name.clone());
        name
    }

    /// `for (i = from; i < to; ++i) { body }` with a fresh name bound to `index` while the body
    /// renders.
    pub(crate) fn for_loop(
        &mut self,
        index: Symbol,
        from: i64,
        to: i64,
        depth: usize,
        out: &mut String,
        body: impl FnOnce(&mut Self, &mut String) -> Result<()>,
    ) -> Result<()> {
        let pad = "  ".repeat(depth);
        let name = format!("i{}", self.loop_counter);
        self.loop_counter += 1;
        self.symbols.insert(index, name.clone());
        let _ = writeln!(
            out,
            "{pad}for (int64_t {name} = {from}; {name} < {to}; ++{name}) {{"
        );
        body(self, out)?;
        let _ = writeln!(out, "{pad}}}");
        self.symbols.remove(&index);
        Ok(())
    }

    /// A loop over `from..to` split where its statements' shared guard starts or stops
    /// holding (see [`crate::c::guard_bounds`]): two loops over the two intervals, in order,
    /// each with its own body. The split point, `-rest` or `rest + 1`, is clamped to
    /// `from..=to`.
    fn split_loop(
        &mut self,
        index: Symbol,
        (from, to): (i64, i64),
        split: &crate::c::guard_bounds::GuardSplit,
        depth: usize,
        out: &mut String,
    ) -> Result<()> {
        let rest = self.affine(&split.rest)?;
        let pad = "  ".repeat(depth);
        let at = format!("aj_split{}", self.loop_counter);
        let point = if split.lower {
            format!("-({rest})")
        } else {
            format!("({rest}) + 1")
        };
        let _ = writeln!(
            out,
            "{pad}const int64_t {at} = {point} < {from} ? {from} : {point} > {to} ? {to} : {point};"
        );
        // In the loop's order: below the split point first.
        let (first, second) = if split.lower {
            (split.skipped.as_ref(), Some(&split.kept))
        } else {
            (Some(&split.kept), split.skipped.as_ref())
        };
        for (body, lo, hi) in [
            (first, from.to_string(), at.clone()),
            (second, at.clone(), to.to_string()),
        ] {
            let Some(body) = body else { continue };
            let name = format!("i{}", self.loop_counter);
            self.loop_counter += 1;
            self.symbols.insert(index, name.clone());
            let _ = writeln!(
                out,
                "{pad}for (int64_t {name} = {lo}; {name} < {hi}; ++{name}) {{"
            );
            self.stmt(body, depth + 1, out)?;
            let _ = writeln!(out, "{pad}}}");
            self.symbols.remove(&index);
        }
        Ok(())
    }

    pub(crate) fn stmt(&mut self, s: &LowLevel, depth: usize, out: &mut String) -> Result<()> {
        let pad = "  ".repeat(depth);
        match s {
            LowLevel::Noop => {}
            LowLevel::Comment(c) => {
                let _ = writeln!(out, "{pad}{}", comment(c));
            }
            LowLevel::Seq(items) => {
                for i in items {
                    self.stmt(i, depth, out)?;
                }
            }
            LowLevel::For {
                index,
                from,
                to,
                body,
            } => {
                let local = crate::c::pairwise::long_local_sum(s).filter(|_| self.pairwise_sums);
                let outer = crate::c::outer_sums::outer_sum(s).filter(|_| self.pairwise_sums);
                match (local, outer) {
                    (Some(sum), _) => self.local_sum(s, sum, depth, out)?,
                    (None, Some(sum)) => self.outer_sum(&sum, depth, out)?,
                    (None, None) => match crate::c::guard_bounds::guard_split(*index, body) {
                        Some(split) => self.split_loop(*index, (*from, *to), &split, depth, out)?,
                        None => self.for_loop(*index, *from, *to, depth, out, |k, out| {
                            k.stmt(body, depth + 1, out)
                        })?,
                    },
                }
            }
            LowLevel::ZeroOut(tn) => {
                let name = self.node(tn)?.to_string();
                let _ = writeln!(out, "{pad}memset({name}, 0, {});", tn.size_in_bytes());
            }
            LowLevel::Set { tn, idcs, value } => {
                let mut prelude = String::new();
                let v = self.expr(value, tn.prec(), depth, &mut prelude)?;
                let stored = c_syntax::store(&v, tn.prec(), self.helpers);
                let name = self.node(tn)?.to_string();
                let offset = self.offset(tn, idcs)?;
                out.push_str(&prelude);
                let _ = writeln!(out, "{pad}{name}[{offset}] = {stored};");
            }
            LowLevel::SetLocal(id, value) => {
                let mut prelude = String::new();
                let v = self.expr(value, id.prec, depth, &mut prelude)?;
                let name = self.local(id.id);
                out.push_str(&prelude);
                let _ = writeln!(out, "{pad}{name} = {v};");
            }
        }
        Ok(())
    }

    /// Renders an expression in compute precision `prec`; declarations and statements of local
    /// scopes go to `prelude` (at the statement's level, so locals live until its end).
    pub(crate) fn expr(
        &mut self,
        e: &ScalarExpr,
        prec: Prec,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String> {
        Ok(match e {
            ScalarExpr::LocalScope { id, body } => {
                let name = self.local(id.id);
                let pad = "  ".repeat(depth);
                let _ = writeln!(
                    prelude,
                    "{pad}{} {name} = {};",
                    c_compute_type(id.prec),
                    c_syntax::literal(id.prec, 0.0)
                );
                self.stmt(body, depth, prelude)?;
                c_syntax::convert(&name, id.prec, prec, self.helpers)
            }
            ScalarExpr::GetLocal(id) => {
                let name = self.local(id.id);
                c_syntax::convert(&name, id.prec, prec, self.helpers)
            }
            ScalarExpr::Get(tn, idcs) => {
                let x = format!("{}[{}]", self.node(tn)?, self.offset(tn, idcs)?);
                c_syntax::load(&x, tn.prec(), prec, self.helpers)
            }
            ScalarExpr::GetMerge(tn, idcs) => {
                let name = match &self.merge {
                    Some((m, name)) if m == tn => name.clone(),
                    _ => {
                        return Err(self.unbound(format!(
                            "the merge buffer does not hold {}",
                            tn.debug_name()
                        )));
                    }
                };
                let x = format!("{name}[{}]", self.offset(tn, idcs)?);
                c_syntax::load(&x, tn.prec(), prec, self.helpers)
            }
            ScalarExpr::EmbedIndex(i) => {
                let x = self.affine(i)?;
                c_syntax::convert(&format!("(int64_t)({x})"), Prec::I64, prec, self.helpers)
            }
            ScalarExpr::Random {
                seed,
                stream,
                index,
                step,
            } => {
                let index = self.affine(index)?;
                let step = self.expr(step, Prec::U32, depth, prelude)?;
                c_syntax::render_random(*seed, *stream, &index, &step, prec, self.helpers)
            }
            ScalarExpr::Gather {
                symbol,
                extent,
                index,
                read,
            } => {
                // The index is checked in the prelude; an invalid one reads element 0 of the
                // gathered axis (always in bounds: the verifier refuses empty axes) and the
                // value is replaced by the poison value, so no address depends on bad data.
                let ix = self.expr(index, prec, depth, prelude)?;
                let name = format!("aj_ix{}", self.loop_counter);
                self.loop_counter += 1;
                let pad = "  ".repeat(depth);
                let ct = c_compute_type(prec);
                let _ = writeln!(
                    prelude,
                    "{pad}const {ct} {name}_v = {ix};\n\
                     {pad}const int {name}_ok = {name}_v >= 0 && {name}_v < {extent};\n\
                     {pad}const int64_t {name} = {name}_ok ? (int64_t)({name}_v) : 0;"
                );
                self.symbols.insert(*symbol, name.clone());
                let read = self.expr(read, prec, depth, prelude);
                self.symbols.remove(symbol);
                let poison = c_syntax::literal(prec, f64::NAN);
                format!("({name}_ok ? {} : {poison})", read?)
            }
            ScalarExpr::Constant(c) => c_syntax::literal(prec, *c),
            ScalarExpr::Unop(op, a) => {
                let a = self.expr(a, prec, depth, prelude)?;
                c_syntax::render_unop(*op, prec, &a, self.helpers)
            }
            ScalarExpr::Binop(op, a, b) => {
                let a = self.expr(a, prec, depth, prelude)?;
                let b = self.expr(b, prec, depth, prelude)?;
                c_syntax::render_binop(*op, prec, &a, &b, self.helpers)
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                let a = self.expr(a, prec, depth, prelude)?;
                let b = self.expr(b, prec, depth, prelude)?;
                let c = self.expr(c, prec, depth, prelude)?;
                c_syntax::render_ternop(*op, prec, (&a, &b, &c), self.helpers)
            }
        })
    }
}

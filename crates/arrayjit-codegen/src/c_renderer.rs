//! Rendering optimized routines to C: one function per routine, with a uniform calling
//! convention `void f(void *const *args, const int64_t *statics, const aj_par *par)`, helpers defined once per
//! file, and names that depend only on the program (so the same program gives byte-identical
//! source).

use crate::c_syntax::{c_compute_type, c_storage_type};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::tnode::sanitize_identifier;
use arrayjit_ir::{
    AxisIndex, Error, LowLevel, Optimized, Prec, Result, ScalarExpr, StaticSymbol, Symbol, Tnode,
};

use arrayjit_ir::schedule::{Schedule, ScheduleKind};

use crate::c_statements::{KernelScope, StatementFunctions};
use crate::c_syntax::{self, CSyntax, Helper};

/// The C declaration of the worker-pool handle every kernel receives as its third argument
/// (layout of `arrayjit_backends::worker_pool::ParallelHandle`).
pub const PARALLEL_TYPEDEF: &str = "typedef struct aj_par {\n  const void *pool;\n  void (*run)(const void *pool, void (*chunk)(void *ctx, int64_t index), void *ctx, int64_t chunks);\n  int64_t workers;\n} aj_par;\n\n";

/// Compile the following functions with moderate optimization (GCC; other compilers ignore it).
pub(crate) const LIGHT_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O2\")\n#endif";
/// Compile the following functions, which only call others and compute addresses, with light
/// optimization (GCC; other compilers ignore it): a kernel makes hundreds of calls with
/// hundreds of pointers live, whose register allocation at `-O2` costs more compile time than
/// its run time is worth.
pub(crate) const DISPATCH_BEGIN: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n#pragma GCC optimize (\"O1\")\n#endif";
/// Ends [`LIGHT_BEGIN`] or [`DISPATCH_BEGIN`].
pub(crate) const OPTIMIZE_END: &str =
    "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif";

/// How to call one rendered kernel: the one statement of the calling convention, produced by
/// [`KernelInterface::of`] and read by the renderer, the runtime that gathers the buffers, and
/// the launch check. Buffers go in this order: the arrays (materialized nodes by id), then the
/// merge buffer if the kernel reads one, then the scratch buffer if it needs one; static
/// indices are passed as values in the order of `statics`.
#[derive(Clone, Debug)]
pub struct KernelInterface {
    /// The routine's name.
    pub name: String,
    /// The C symbol of the kernel.
    pub symbol: String,
    /// The arrays passed in `args`, in order (materialized nodes by id).
    pub args: Vec<Tnode>,
    /// If set, the merge buffer holding this node is passed after the arrays.
    pub merge: Option<Tnode>,
    /// The static symbols passed in `statics`, in order.
    pub statics: Vec<StaticSymbol>,
    /// If non-zero, a scratch buffer of at least this many bytes is passed last.
    pub scratch_bytes: usize,
}

impl KernelInterface {
    /// The interface of a routine's kernel, exported as `symbol`.
    pub fn of(r: &Optimized, symbol: String) -> KernelInterface {
        KernelInterface {
            name: r.name.clone(),
            symbol,
            args: r.materialized_nodes(),
            merge: r.merge_node.clone(),
            statics: r.bindings.clone(),
            scratch_bytes: r.scratch.total_bytes(),
        }
    }

    /// The least size in bytes of every buffer a launch passes, in order.
    pub fn buffer_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self
            .args
            .iter()
            .chain(self.merge.iter())
            .map(|t| t.size_in_bytes())
            .collect();
        if self.scratch_bytes > 0 {
            sizes.push(self.scratch_bytes);
        }
        sizes
    }
}

/// A translation unit compiled on its own and linked with the kernels' unit into one library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CUnit {
    /// A short name for the unit (part of its file name).
    pub name: String,
    /// Its complete source.
    pub source: String,
}

/// A rendered C program: the kernels' translation unit, with one kernel per routine, and the
/// units it calls into (the blocked product helpers), which are the same for every routine of a
/// machine and so are compiled in parallel with the kernels and cached on their own.
#[derive(Clone, Debug)]
pub struct CProgram {
    /// The kernels' unit.
    pub source: String,
    /// The other units to link with it.
    pub units: Vec<CUnit>,
    /// The kernels, in the order of the routines given.
    pub kernels: Vec<KernelInterface>,
}

/// Renders the routines into C: the kernels' unit, and, for a large program, units holding its
/// statement functions (see `crate::c_statements`) besides the product helpers' units.
pub fn render_program(syntax: &CSyntax, routines: &[&Optimized]) -> Result<CProgram> {
    let mut helpers = BTreeSet::new();
    // Product helpers by name: their prototype and their unit's definition.
    let mut products: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut functions = StatementFunctions::default();
    let mut bodies = String::new();
    let mut kernels = Vec::new();
    for (index, r) in routines.iter().enumerate() {
        // Unique by construction: the routine's position in the batch comes first, so equal or
        // colliding names (`x`, `x`, `x_1`) cannot clash with each other, and the digit after
        // `aj` keeps them apart from the helpers (`aj_relu_f32`, ...).
        let symbol = format!("aj{index}_{}", sanitize_identifier(&r.name));
        let (text, iface) = render_kernel(
            syntax,
            r,
            &symbol,
            &mut helpers,
            &mut products,
            &mut functions,
        )?;
        bodies.push_str(&text);
        kernels.push(iface);
    }
    let mut header = String::from("/* Generated by arrayjit. */\n");
    for inc in &syntax.includes {
        let _ = writeln!(header, "{inc}");
    }
    header.push('\n');
    // The third argument of every kernel: the device's worker pool (see
    // `arrayjit_backends::worker_pool`); kernels split their parallel loops with `par->run`.
    header.push_str(PARALLEL_TYPEDEF);
    let mut prototypes = String::new();
    let mut units = Vec::new();
    for (name, (signature, definition)) in products {
        let _ = writeln!(prototypes, "{signature};\n");
        units.push(CUnit {
            source: format!("{header}{definition}"),
            name,
        });
    }
    let mut source = header.clone();
    for h in &helpers {
        let _ = writeln!(source, "{}\n", c_syntax::helper_definition(*h, syntax));
    }
    source.push_str(&prototypes);
    let (statements, statement_units) =
        functions.into_units(&format!("{header}{prototypes}"), &helpers, syntax);
    source.push_str(&statements);
    units.extend(statement_units);
    source.push_str(&bodies);
    Ok(CProgram {
        source,
        units,
        kernels,
    })
}

impl CProgram {
    /// Every unit's source, the kernels' last, for display.
    pub fn full_source(&self) -> String {
        let mut text = String::new();
        for u in &self.units {
            let _ = writeln!(text, "/* ---- unit {} ---- */\n{}", u.name, u.source);
        }
        if !self.units.is_empty() {
            text.push_str("/* ---- kernels ---- */\n");
        }
        text.push_str(&self.source);
        text
    }
}

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

fn render_kernel(
    syntax: &CSyntax,
    r: &Optimized,
    symbol: &str,
    helpers: &mut BTreeSet<Helper>,
    products: &mut BTreeMap<String, (String, String)>,
    functions: &mut StatementFunctions,
) -> Result<(String, KernelInterface)> {
    crate::c_schedules::check_schedules(r)?;
    let interface = KernelInterface::of(r, symbol.to_string());
    let args = interface.args.clone();
    let locals = r.local_nodes();
    let mut k = KernelRenderer {
        helpers,
        nodes: HashMap::new(),
        merge: None,
        symbols: HashMap::new(),
        loop_counter: 0,
        locals: HashMap::new(),
        local_counter: 0,
        routine: r.name.clone(),
    };
    let mut out = String::new();
    let mut vars: Vec<(String, String)> = Vec::new();
    let _ = writeln!(out, "{}", comment(&format!("routine {}", r.name)));
    let prefix = if syntax.kernel_prefix.is_empty() {
        String::new()
    } else {
        format!("{} ", syntax.kernel_prefix)
    };
    if syntax.optimize_pragmas {
        // The kernel calls its statement functions (see `crate::c_statements`) and does no
        // loop work of its own.
        let _ = writeln!(out, "{DISPATCH_BEGIN}");
    }
    let _ = writeln!(
        out,
        "{prefix}void {symbol}(void *const *args, const int64_t *statics, const aj_par *par) {{"
    );
    let _ = writeln!(out, "  (void)args; (void)statics; (void)par;");
    for (pos, tn) in args.iter().enumerate() {
        let name = node_name(tn, pos);
        let t = c_storage_type(tn.prec());
        let _ = writeln!(
            out,
            "  {t} *const {} {name} = ({t} *)args[{pos}]; {}",
            syntax.restrict,
            comment(&format!(
                "{} {} {}",
                tn.debug_name_stable(),
                tn.prec(),
                tn.dims_to_string(false)
            ))
        );
        vars.push((format!("{t} *"), name.clone()));
        k.nodes.insert(tn.clone(), name);
    }
    if let Some(m) = &r.merge_node {
        let t = c_storage_type(m.prec());
        let name = format!("merge_{}", node_name(m, args.len()));
        let _ = writeln!(
            out,
            "  const {t} *const {} {name} = (const {t} *)args[{}]; /* merge buffer */",
            syntax.restrict,
            args.len()
        );
        vars.push((format!("const {t} *"), name.clone()));
        k.merge = Some((m.clone(), name));
    }
    let mut statics = Vec::new();
    for (pos, s) in r.bindings.iter().enumerate() {
        let name = format!("s{pos}");
        statics.push(name.clone());
        let _ = writeln!(
            out,
            "  const int64_t {name} = statics[{pos}]; {}",
            comment(&format!("static {} in 0..{}", s.name, s.range))
        );
        vars.push(("int64_t".into(), name.clone()));
        k.symbols.insert(s.symbol, name);
    }
    let scratch_index = args.len() + usize::from(r.merge_node.is_some());
    if r.scratch.total_bytes() > 0 {
        let _ = writeln!(
            out,
            "  unsigned char *const {} scratch = (unsigned char *)args[{scratch_index}]; {}",
            syntax.restrict,
            comment(&format!(
                "scratch pool of {} bytes",
                r.scratch.total_bytes()
            ))
        );
        let mut slots: Vec<_> = r.scratch.slots.iter().collect();
        slots.sort_by_key(|s| (s.offset, s.node.id()));
        for (pos, slot) in slots.into_iter().enumerate() {
            let tn = &slot.node;
            let name = format!("{}_s{pos}", node_name(tn, scratch_index));
            let t = c_storage_type(tn.prec());
            let _ = writeln!(
                out,
                "  {t} *const {name} = ({t} *)(scratch + {}); {}",
                slot.offset,
                comment(&format!("local {} in scratch", tn.debug_name_stable()))
            );
            vars.push((format!("{t} *"), name.clone()));
            k.nodes.insert(tn.clone(), name);
        }
    }
    let stmts: Vec<&LowLevel> = match &r.code {
        LowLevel::Seq(items) => items.iter().collect(),
        s => vec![s],
    };
    // A local's initial zeros are needed unless the first statement using it overwrites it
    // (for a scratch local, the first statement of its lifetime).
    let mut first_use: HashMap<usize, usize> = HashMap::new();
    for (i, s) in stmts.iter().enumerate() {
        for tn in s.nodes() {
            first_use.entry(tn.id()).or_insert(i);
        }
    }
    let needs_zeros = |tn: &Tnode, from: usize| {
        let first = first_use.get(&tn.id()).map_or(from, |&f| f.max(from));
        stmts.get(first).is_none_or(|s| !s.overwrites_all(tn))
    };
    for (pos, tn) in locals.iter().enumerate() {
        let name = node_name(tn, args.len() + 1 + pos);
        let t = c_storage_type(tn.prec());
        let zero = if needs_zeros(tn, 0) {
            format!(" memset({name}, 0, sizeof({name}));")
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {t} {name}[{}];{zero} {}",
            tn.num_elems(),
            comment(&format!("local {}", tn.debug_name_stable()))
        );
        vars.push((format!("{t} *"), name.clone()));
        k.nodes.insert(tn.clone(), name);
    }
    // Each statement runs as a function of its own (see `crate::c_statements`).
    let scope = KernelScope {
        statics: &statics,
        light: r.light_kernel && syntax.optimize_pragmas,
    };
    for (i, s) in stmts.iter().copied().enumerate() {
        // A scratch local starts zeroed when its lifetime begins (its memory may have held
        // another local before).
        for slot in r
            .scratch
            .slots
            .iter()
            .filter(|s| s.lifetime.map(|l| l.0) == Some(i))
        {
            if !needs_zeros(&slot.node, i) {
                continue;
            }
            let name = k.node(&slot.node)?.to_string();
            let _ = writeln!(out, "  memset({name}, 0, {});", slot.size);
        }
        let sched = r.schedules.get(i);
        if let Some(
            sched @ Schedule {
                kind: ScheduleKind::Absorbed,
                ..
            },
        ) = sched
        {
            let _ = writeln!(out, "  {}", comment(&sched.to_string()));
            continue;
        }
        let call = k.statement_function(s, sched, &scope, syntax, products, functions)?;
        match sched {
            Some(sched) => {
                let _ = writeln!(out, "  {} {call}", comment(&sched.to_string()));
            }
            None => {
                let _ = writeln!(out, "  {call}");
            }
        }
    }
    out.push_str("}\n");
    if syntax.optimize_pragmas {
        let _ = writeln!(out, "{OPTIMIZE_END}");
    }
    out.push('\n');
    Ok((out, interface))
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

trait StableName {
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
            } => self.for_loop(*index, *from, *to, depth, out, |k, out| {
                k.stmt(body, depth + 1, out)
            })?,
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
                c_syntax::render_ternop(*op, prec, &a, &b, &c)
            }
        })
    }
}

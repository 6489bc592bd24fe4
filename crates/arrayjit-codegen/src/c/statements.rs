//! Statement functions and compile units of the C renderer. Each top-level statement of a
//! routine is rendered as a function of its own whose parameters are the arrays it touches
//! (named by position, `p0, p1, ...`) and the static indices; the kernel calls them in order
//! with its arrays. So:
//! - statements that differ only in their arrays — the layers of a model, the forward pass
//!   that a training step, an evaluation and a sampling routine all contain — render to the
//!   same text and are defined once, named by a hash of that text;
//! - the compiler optimizes many small functions instead of one function of hundreds of loop
//!   nests (whose register allocation and data-flow passes grow faster than linearly);
//! - a large program's functions are spread over several translation units, compiled in
//!   parallel and linked into one library;
//! - a library exports its functions by name, and a program rendered later in the process may
//!   call those instead of defining equal ones again ([`SharedFunctions`]).
//!
//! The text of a statement function holds no labels (comments are left out; the kernel's call
//! says what the statement is and why it runs as it does), so equal work gives equal text.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use arrayjit_ir::{LowLevel, Result};
use arrayjit_opt::schedule::{Schedule, ScheduleKind};

use crate::c::kernel::{CUnit, KernelRenderer, LIGHT_BEGIN, OPTIMIZE_END};
use crate::c::schedules::Outlining;
use crate::c::syntax::{self as c_syntax, CSyntax, Helper, c_storage_type};

/// The placeholder name a statement function is rendered under, replaced by its hashed name.
const PLACEHOLDER: &str = "AJ_STMT_FN";

/// Source bytes of statement functions per compile unit: below it a program is one unit.
/// Units compile in parallel with the helpers' units, so a program uses the cores once its
/// jobs are about as long as the helpers'. On a 2-core AMD EPYC (Zen 4) the GPT demo step's
/// ~100 KiB of statement functions in one unit (96 KiB per unit before) took 0.73 s of gcc
/// beside helpers of 0.41 and 0.42 s and ended last; in two units (0.49 and 0.32 s, each with
/// its own copy of the helpers it calls) the parallel build took a median of 0.89 s against
/// 0.95 s (eight alternated rounds).
pub const UNIT_BYTES: usize = 48 << 10;

/// The most compile units a program's statement functions are spread over.
pub const MAX_UNITS: usize = 16;

/// The statement functions of a program, defined once each, in order of first use.
#[derive(Clone, Debug, Default)]
pub(crate) struct StatementFunctions {
    order: Vec<String>,
    texts: HashMap<String, String>,
}

impl StatementFunctions {
    /// Defines the function rendered as `text` (under [`PLACEHOLDER`]) unless an equal one is
    /// defined already; returns its name: the hash of its text (another name if two different
    /// texts ever hash alike).
    fn define(&mut self, text: &str) -> String {
        let hash = fnv1a(text);
        for attempt in 0u32.. {
            let name = match attempt {
                0 => format!("aj_st_{hash:016x}"),
                k => format!("aj_st_{hash:016x}_{k}"),
            };
            let named = text.replace(PLACEHOLDER, &name);
            match self.texts.get(&name) {
                Some(existing) if *existing == named => return name,
                Some(_) => continue,
                None => {
                    self.order.push(name.clone());
                    self.texts.insert(name.clone(), named);
                    return name;
                }
            }
        }
        unreachable!("a free name is always found")
    }

    /// Splits the functions into the kernels' unit and units of their own, leaving out those
    /// that `import(name, text)` says another library already has (see [`SharedFunctions`]).
    /// Returns the text that goes into the kernels' unit (definitions when the program is
    /// small, else prototypes; a pointer for each imported function), the other units
    /// (`header` and the helpers' definitions first), and which functions were imported and
    /// which defined.
    pub(crate) fn units(
        &self,
        header: &str,
        helpers: &BTreeSet<Helper>,
        syntax: &CSyntax,
        import: &dyn Fn(&str, &str) -> bool,
    ) -> (String, Vec<CUnit>, SharedFunctions) {
        let mut shared = SharedFunctions::default();
        let mut pointers = String::new();
        for name in &self.order {
            let text = self.texts.get(name).map_or("", String::as_str);
            if import(name, text) {
                let _ = writeln!(pointers, "{};", pointer_of(&signature_of(text, name), name));
                shared.imported.push(name.clone());
            } else {
                shared.defined.push((name.clone(), text.to_string()));
            }
        }
        let total: usize = shared.defined.iter().map(|(_, text)| text.len()).sum();
        let count = total.div_ceil(UNIT_BYTES).clamp(1, MAX_UNITS);
        if count == 1 {
            let mut inline = pointers;
            for (_, text) in &shared.defined {
                inline.push_str(text);
            }
            return (inline, Vec::new(), shared);
        }
        let mut helper_defs = String::new();
        for h in helpers {
            let _ = writeln!(helper_defs, "{}\n", c_syntax::helper_definition(*h, syntax));
        }
        // Consecutive functions (in order of use) fill the units to about equal sizes.
        let per_unit = total.div_ceil(count);
        let mut units: Vec<CUnit> = Vec::new();
        let mut prototypes = pointers;
        let mut current = String::new();
        for (name, text) in &shared.defined {
            let _ = writeln!(prototypes, "{};", signature_of(text, name));
            current.push_str(text);
            if current.len() >= per_unit {
                units.push(CUnit {
                    name: format!("stmts{}", units.len()),
                    source: format!("{header}{helper_defs}{current}"),
                });
                current.clear();
            }
        }
        if !current.is_empty() {
            units.push(CUnit {
                name: format!("stmts{}", units.len()),
                source: format!("{header}{helper_defs}{current}"),
            });
        }
        (prototypes, units, shared)
    }
}

/// Statement functions shared between the libraries of one process. A library exports
/// [`FIND_SYMBOL`]`(name)`, the address of each statement function it defines; a library
/// rendered later that contains an equal function (the same name and text: the forward pass
/// of a training step and of its evaluation) does not compile it again but calls it through a
/// pointer, which the loader sets with [`BIND_SYMBOL`]`(find, ctx)` from `find(ctx, name)`
/// before any kernel runs; it returns how many it could not find (then the library must not
/// run). The functions take everything they touch as arguments, so one compiled copy serves
/// every library that calls it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedFunctions {
    /// The statement functions this library defines (and exports through [`FIND_SYMBOL`]), by
    /// name, with their text.
    pub defined: Vec<(String, String)>,
    /// The statement functions it calls through pointers that [`BIND_SYMBOL`] sets.
    pub imported: Vec<String>,
}

/// `void *aj_statement_function(const char *name)`: the address of a statement function the
/// library defines, or null.
pub const FIND_SYMBOL: &str = "aj_statement_function";

/// `int64_t aj_bind_statement_functions(void *(*find)(void *ctx, const char *name), void
/// *ctx)`: sets every imported statement function's pointer from `find`; returns how many
/// were not found (0: the library may run).
pub const BIND_SYMBOL: &str = "aj_bind_statement_functions";

impl SharedFunctions {
    /// The exported lookup of the defined functions and, when some are imported, the binder
    /// of their pointers: C to append to the kernels' unit (after the functions' prototypes
    /// and pointers, which [`crate::CProgram::source`] holds).
    pub fn exports(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "__attribute__((visibility(\"default\"))) void *{FIND_SYMBOL}(const char *name) {{"
        );
        if !self.defined.is_empty() {
            let _ = writeln!(
                text,
                "  static const struct {{ const char *name; void (*fn)(void); }} table[] = {{"
            );
            for (name, _) in &self.defined {
                let _ = writeln!(text, "    {{ \"{name}\", (void (*)(void)){name} }},");
            }
            let _ = writeln!(
                text,
                "  }};\n  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)\n    if (strcmp(table[i].name, name) == 0) {{ void *f; memcpy(&f, &table[i].fn, sizeof f); return f; }}"
            );
        }
        let _ = writeln!(text, "  (void)name;\n  return 0;\n}}\n");
        if !self.imported.is_empty() {
            let _ = writeln!(
                text,
                "__attribute__((visibility(\"default\"))) int64_t {BIND_SYMBOL}(void *(*find)(void *ctx, const char *name), void *ctx) {{\n  int64_t missing = 0;"
            );
            for name in &self.imported {
                let _ = writeln!(
                    text,
                    "  {{ void *f = find(ctx, \"{name}\"); if (f) memcpy(&{name}, &f, sizeof f); else ++missing; }}"
                );
            }
            let _ = writeln!(text, "  return missing;\n}}\n");
        }
        text
    }
}

/// The declaration of a pointer named `name` to the function of definition line `signature`
/// (`... void name(params)`), private to its unit.
fn pointer_of(signature: &str, name: &str) -> String {
    let from = signature.find(&format!("void {name}(")).unwrap_or(0);
    let params = &signature[from + format!("void {name}").len()..];
    format!("static void (*{name}){params}")
}

/// The definition line of function `name` in `text` (up to its opening brace).
fn signature_of(text: &str, name: &str) -> String {
    let at = text
        .find(&format!(" void {name}("))
        .and_then(|i| text[..i].rfind('\n').map(|l| l + 1).or(Some(0)))
        .unwrap_or(0);
    let rest = &text[at..];
    rest[..rest.find(" {\n").unwrap_or(rest.len())].to_string()
}

/// 64-bit FNV-1a: names that depend only on the text, stable across runs and Rust versions.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `text` without its `/* ... */` comments (the renderer's comments never contain `*/`).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        match rest[start..].find("*/") {
            Some(end) => rest = &rest[start + end + 2..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// What a statement function needs from its kernel.
pub(crate) struct KernelScope<'a> {
    /// The kernel's static indices, by their C names (passed to every statement function).
    pub(crate) statics: &'a [String],
    /// The kernel is light: its functions are compiled with moderate optimization.
    pub(crate) light: bool,
}

impl KernelRenderer<'_> {
    /// Renders statement `s` (by its schedule) as a statement function, adds it to
    /// `functions` unless an equal one is there, and returns the call the kernel makes.
    pub(crate) fn statement_function(
        &mut self,
        s: &LowLevel,
        sched: Option<&Schedule>,
        scope: &KernelScope<'_>,
        syntax: &CSyntax,
        products: &mut BTreeMap<String, (String, String)>,
        functions: &mut StatementFunctions,
    ) -> Result<String> {
        // Parameters: the statement's arrays by position, the merge buffer, the statics.
        let kernel_nodes = std::mem::take(&mut self.nodes);
        let kernel_merge = self.merge.clone();
        // Loop indices and local variables are numbered from 0 in each function, so that
        // statements differing only in the numbering render alike.
        let kernel_counter = self.loop_counter;
        self.loop_counter = 0;
        let kernel_locals = std::mem::take(&mut self.locals);
        let kernel_local_counter = std::mem::replace(&mut self.local_counter, 0);
        let mut params: Vec<(String, String)> = Vec::new();
        let mut args: Vec<String> = Vec::new();
        let mut private = Vec::new();
        for tn in s.nodes() {
            if let Some(name) = kernel_nodes.get(&tn) {
                let p = format!("p{}", params.len());
                let elem = c_storage_type(tn.prec());
                params.push((format!("{elem} *"), p.clone()));
                args.push(name.clone());
                if tn.is_iteration_private() {
                    private.push((
                        p.clone(),
                        elem.to_string(),
                        tn.padded_dims().iter().product(),
                    ));
                }
                self.nodes.insert(tn, p);
            }
        }
        if let Some((m, name)) = &kernel_merge {
            let t = c_storage_type(m.prec());
            params.push((format!("const {t} *"), "pm".into()));
            args.push(name.clone());
            self.merge = Some((m.clone(), "pm".into()));
        }
        for name in scope.statics {
            params.push(("int64_t".into(), name.clone()));
            args.push(name.clone());
        }
        let mut outlining = Outlining::new(PLACEHOLDER, params, syntax);
        outlining.private = private;
        let mut body = String::new();
        let rendered = self.schedule_body(s, sched, products, &mut outlining, &mut body);
        self.nodes = kernel_nodes;
        self.merge = kernel_merge;
        self.loop_counter = kernel_counter;
        self.locals = kernel_locals;
        self.local_counter = kernel_local_counter;
        rendered?;
        let mut text = String::new();
        if scope.light {
            let _ = writeln!(text, "{LIGHT_BEGIN}");
        }
        // The variables travel to chunk functions in a struct; fused parts take them directly.
        let params = &outlining.params;
        if outlining.uses_chunk_type {
            let _ = writeln!(text, "struct {PLACEHOLDER}_vars {{");
            for (t, name) in params {
                let _ = writeln!(text, "  {t} {name};");
            }
            let _ = writeln!(
                text,
                "}};\ntypedef struct {{ const struct {PLACEHOLDER}_vars *vars; int64_t per; void *extra; }} {PLACEHOLDER}_chunk_t;"
            );
        }
        text.push_str(&outlining.functions);
        let declared: Vec<&str> = outlining
            .declared
            .iter()
            .map(String::as_str)
            .chain(std::iter::once("const aj_par *par"))
            .collect();
        let _ = writeln!(
            text,
            "__attribute__((visibility(\"hidden\"))) void {PLACEHOLDER}({}) {{\n  (void)par;",
            declared.join(", ")
        );
        if outlining.uses_chunk_type {
            let names: Vec<&str> = params.iter().map(|(_, n)| n.as_str()).collect();
            let _ = writeln!(
                text,
                "  const struct {PLACEHOLDER}_vars vars = {{ {} }};",
                if names.is_empty() {
                    "0".to_string()
                } else {
                    names.join(", ")
                }
            );
        }
        text.push_str(&body);
        text.push_str("}\n");
        if scope.light {
            let _ = writeln!(text, "{OPTIMIZE_END}");
        }
        text.push('\n');
        let text = strip_comments(&text);
        let name = functions.define(&text);
        args.push("par".into());
        Ok(format!("{name}({});", args.join(", ")))
    }

    /// The body of a statement by its schedule (the statement of a statement function).
    fn schedule_body(
        &mut self,
        s: &LowLevel,
        sched: Option<&Schedule>,
        products: &mut BTreeMap<String, (String, String)>,
        outlining: &mut Outlining,
        out: &mut String,
    ) -> Result<()> {
        match sched {
            Some(Schedule {
                kind: ScheduleKind::Contraction(g),
                ..
            }) => self.contraction(g, 0, products, outlining, out),
            Some(Schedule {
                kind: ScheduleKind::Attention(plan),
                ..
            }) => self.attention(plan, products, out),
            Some(
                sched @ Schedule {
                    parallel: Some(_), ..
                },
            ) => self.parallel(s, sched, 0, outlining, out),
            Some(Schedule {
                kind: ScheduleKind::Reduction(plan),
                ..
            }) if plan.blocks.is_some() => self.split_reduction(s, plan, 0, outlining, out),
            Some(Schedule {
                kind: ScheduleKind::Reduction(plan),
                ..
            }) => self.reduction(s, plan, 1, out),
            Some(sched) => self.serial(s, sched, 0, outlining, out),
            None => self.stmt(s, 1, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(body: &str) -> String {
        format!(
            "__attribute__((visibility(\"hidden\"))) void {PLACEHOLDER}(float *const restrict p0, const int64_t s0, const aj_par *par) {{\n  (void)par; {body}\n}}\n"
        )
    }

    #[test]
    fn imported_functions_become_bound_pointers_and_defined_ones_are_exported() {
        let mut functions = StatementFunctions::default();
        let kept = functions.define(&function("p0[s0] = 1.0f;"));
        let shared = functions.define(&function("p0[s0] = 2.0f;"));
        let syntax = CSyntax::c();
        let (kernel_text, units, split) =
            functions.units("", &BTreeSet::new(), &syntax, &|name, text| {
                name == shared && text.contains("2.0f")
            });
        assert!(units.is_empty(), "a small program is one unit");
        assert_eq!(split.imported, vec![shared.clone()]);
        assert_eq!(
            split.defined.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            vec![&kept]
        );
        // The imported function is a pointer of its signature, not a definition.
        assert!(kernel_text.contains(&format!(
            "static void (*{shared})(float *const restrict p0, const int64_t s0, const aj_par *par);"
        )));
        assert!(!kernel_text.contains("2.0f") && kernel_text.contains("1.0f"));
        let exports = split.exports();
        assert!(exports.contains(&format!("{{ \"{kept}\", (void (*)(void)){kept} }}")));
        assert!(!exports.contains(&format!("\"{shared}\", (void")));
        assert!(exports.contains(&format!("find(ctx, \"{shared}\")")));
        assert!(exports.contains(BIND_SYMBOL) && exports.contains(FIND_SYMBOL));
        // Nothing imported: no binder; nothing defined: a lookup that finds nothing.
        let none = SharedFunctions::default().exports();
        assert!(none.contains(FIND_SYMBOL) && !none.contains(BIND_SYMBOL));
        assert!(!none.contains("table"));
    }

    #[test]
    fn comments_are_stripped_and_names_hash_the_text() {
        assert_eq!(strip_comments("a /* x */ b /* y */"), "a  b ");
        assert_eq!(strip_comments("no comment"), "no comment");
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a("a"), fnv1a("b"));
        let text = "struct X { int a; };\nstatic void helper(void) {\n}\n__attribute__((visibility(\"hidden\"))) void aj_st_1(float *const restrict p0, const aj_par *par) {\n  (void)par;\n}\n";
        assert_eq!(
            signature_of(text, "aj_st_1"),
            "__attribute__((visibility(\"hidden\"))) void aj_st_1(float *const restrict p0, const aj_par *par)"
        );
    }
}

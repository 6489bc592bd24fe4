//! The modules of every crate form layers, at every depth: no module imports (through
//! `crate::`, `super::` or `self::` paths) a sibling module that imports it back, directly or
//! through others (an import counts for the siblings under the two modules' nearest common
//! parent: `cc/compile.rs` naming `crate::cc::stats` is an edge `compile -> stats` among
//! `cc`'s modules). A circle is reported with the modules on it and the imports that close it,
//! so it can be broken where it formed. One circle is allowed, named below with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level module a source file belongs to (`None` for the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's code: its test module and comment lines left out.
fn code_of(source: &str) -> String {
    source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The circles of a graph (its strongly connected components of more than one module).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Modules that reach each other both ways are on one circle.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if done.contains(m) || !reaches[m].contains(m) {
            continue;
        }
        let circle: Vec<String> = graph
            .keys()
            .filter(|o| reaches[m].contains(*o) && reaches[*o].contains(m))
            .cloned()
            .collect();
        done.extend(circle.iter().cloned());
        out.push(circle);
    }
    out
}

/// A source file's module path in its crate (`["cc", "compile"]`; empty for the crate root).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The module paths named by `crate::`, `super::` and `self::` paths in the code of a file at
/// `module` (comments and test modules aside), as written: each is resolved against the
/// crate's modules by the caller.
fn relative_imports(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = code_of(source);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut pos = 0;
    while pos < code.len() {
        let rest = &code[pos..];
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| rest.starts_with(h));
        let after_ident = pos > 0
            && (bytes[pos - 1].is_ascii_alphanumeric()
                || bytes[pos - 1] == b'_'
                || bytes[pos - 1] == b'$'
                || bytes[pos - 1] == b':');
        let Some(head) = head.filter(|_| !after_ident) else {
            pos += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let mut base: Vec<String> = match head {
            "crate::" => Vec::new(),
            "super::" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => module.to_vec(),
        };
        let mut tail = &rest[head.len()..];
        while let Some(more) = tail.strip_prefix("super::") {
            base.pop();
            tail = more;
        }
        // One path, or a braced list of paths: each item's leading segments.
        let items: Vec<&str> = match tail.strip_prefix('{') {
            Some(list) => list[..list.find('}').unwrap_or(list.len())]
                .split(',')
                .map(str::trim)
                .collect(),
            None => vec![tail],
        };
        for item in items {
            let mut segs = base.clone();
            let mut t = item;
            loop {
                let name = ident(t);
                if name.is_empty() {
                    break;
                }
                segs.push(name.clone());
                match t[name.len()..].strip_prefix("::") {
                    Some(next) => t = next,
                    None => break,
                }
            }
            out.push(segs);
        }
        pos += head.len();
    }
    out
}

/// Import edges between sibling modules, by their parent: for each import of a file at `from`
/// naming module `to`, the edge between the children of their nearest common parent that hold
/// them (none when one contains the other).
fn sibling_edges(
    imports: &[(Vec<String>, Vec<String>)],
) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let mut out: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, to) in imports {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        if common >= from.len() || common >= to.len() {
            continue;
        }
        out.entry(from[..common].to_vec())
            .or_default()
            .entry(from[common].clone())
            .or_default()
            .insert(to[common].clone());
    }
    out
}

/// The circle the house allows: `KernelRenderer`'s impl blocks spread over the files of the C
/// renderer (said in `c/kernel.rs`'s module doc).
const ALLOWED_CIRCLES: [(&str, &str, &[&str]); 1] = [(
    "arrayjit-codegen",
    "c",
    &["kernel", "outer_sums", "pairwise"],
)];

#[test]
fn no_crate_has_an_import_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report = Vec::new();
    let mut checked = 0;
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let name = krate.file_name().to_string_lossy().to_string();
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&src, f)).collect();
        checked += modules.len();
        let mut imports = Vec::new();
        for file in &files {
            let from = module_path(&src, file);
            let source = std::fs::read_to_string(file).unwrap();
            for path in relative_imports(&source, &from) {
                // The longest prefix of the path that is a module of the crate.
                let to = (1..=path.len())
                    .rev()
                    .map(|n| path[..n].to_vec())
                    .find(|p| modules.contains(p));
                if let Some(to) = to.filter(|t| *t != from) {
                    imports.push((from.clone(), to));
                }
            }
        }
        for (parent, graph) in sibling_edges(&imports) {
            let parent_name = parent.join("/");
            for circle in circles(&graph) {
                let allowed = ALLOWED_CIRCLES.iter().any(|(k, p, members)| {
                    *k == name && *p == parent_name && circle.iter().eq(members.iter())
                });
                if allowed {
                    continue;
                }
                let edges: Vec<String> = circle
                    .iter()
                    .flat_map(|m| {
                        graph[m]
                            .iter()
                            .filter(|d| circle.contains(d))
                            .map(move |d| format!("{m} -> {d}"))
                    })
                    .collect();
                report.push(format!(
                    "{name} {}: {}",
                    if parent_name.is_empty() {
                        "(top level)"
                    } else {
                        &parent_name
                    },
                    edges.join(", ")
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} modules found under {crates:?}"
    );
    assert!(report.is_empty(), "import circles:\n{}", report.join("\n"));
}

/// The scan of nested paths: `super::` from a file and from a folder's `mod.rs`, `self::`,
/// chains of `super::`, braced lists; and circles are found among siblings under their common
/// parent, not across levels.
#[test]
fn the_nested_scan_resolves_relative_paths_and_finds_sibling_circles() {
    let m = |s: &str| -> Vec<String> {
        s.split('/')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    let source = "use super::stats::X;\nuse self::inner::Y;\nuse super::super::top::Z;\n\
                  use crate::{cc::library::L, other};\n// super::commented::W\n";
    let found = relative_imports(source, &m("cc/compile"));
    assert_eq!(
        found,
        vec![
            m("cc/stats/X"),
            m("cc/compile/inner/Y"),
            m("top/Z"),
            m("cc/library/L"),
            m("other"),
        ]
    );
    let imports = vec![
        (m("cc/compile"), m("cc/stats")),
        (m("cc/stats"), m("cc/compile")),
        (m("cc/compile"), m("lowered")),
        (m("lowered"), m("cc")),
    ];
    let edges = sibling_edges(&imports);
    assert_eq!(circles(&edges[&m("cc")]), vec![vec!["compile", "stats"]]);
    assert_eq!(circles(&edges[&Vec::new()]), vec![vec!["cc", "lowered"]]);
}

#[test]
fn the_import_scan_sees_paths_and_lists_and_skips_comments() {
    let source =
        "use crate::a::X;\nuse crate::{b::Y, Z};\n// crate::c::W\nfn f() { crate::d::g(); }\n";
    let found: Vec<String> = relative_imports(source, &[])
        .into_iter()
        .map(|p| p[0].clone())
        .collect();
    assert_eq!(found, ["a", "b", "Z", "d"]);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, d)| (m.to_string(), d.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}

/// The names a source file reaches through `crate::` that are not modules of its crate:
/// items of the crate's front (`lib.rs`) imported back. Comments are skipped; `crate::{a::B}`
/// lists count each item's first segment.
fn front_imports(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    for (pos, _) in code.match_indices("crate::") {
        // `$crate::` in macros and `arrayjit_crate::` are other paths.
        if pos > 0
            && code[..pos]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[pos + "crate::".len()..];
        let names: Vec<String> = match rest.strip_prefix('{') {
            Some(list) => list[..list.find('}').unwrap_or(list.len())]
                .split(',')
                .map(|i| ident(i.trim()))
                .filter(|n| !n.is_empty() && n != "self")
                .collect(),
            None => vec![ident(rest)],
        };
        found.extend(names.into_iter().filter(|n| !modules.contains(n)));
    }
    found
}

/// No module of any crate imports its crate's front back: every `crate::` path names a module
/// (`crate::device_buffer::BufferHandle`), never an item `lib.rs` re-exports
/// (`crate::BufferHandle`), so the front stays only a front and a reader finds each item where
/// it is defined.
#[test]
fn no_module_imports_its_crate_front() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
        for file in &files {
            if module_of(&src, file).is_none() {
                continue;
            }
            let source = std::fs::read_to_string(file).unwrap();
            let back = front_imports(&source, &modules);
            if !back.is_empty() {
                report.push(format!("{}: crate::{back:?}", file.display()));
            }
        }
    }
    assert!(
        report.is_empty(),
        "imports of a crate's front:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_front_scan_sees_items_and_lists_but_not_modules() {
    let modules: BTreeSet<String> = ["buffer", "queue"].iter().map(|s| s.to_string()).collect();
    let source = "use crate::buffer::CpuBuffer;\nuse crate::{queue::Queue, Handle};\n\
                  // crate::Commented\nfn f() -> crate::Other { $crate::Macro }\n";
    let found: Vec<String> = front_imports(source, &modules).into_iter().collect();
    assert_eq!(found, vec!["Handle".to_string(), "Other".to_string()]);
}

/// The command-line tool goes through the seam: no `cfg(feature = ...)` (the backends crate's
/// `built.rs` is the one reader of the backend features) and no path into a backend's module
/// (`cc::`, `cuda_backend::`, `wgpu_backend::`).
#[test]
fn the_cli_names_no_backend_module_and_reads_no_feature() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../arrayjit-cli/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "{src:?}");
    let mut found = Vec::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for needle in ["cfg(feature", "::cc::", "cuda_backend::", "wgpu_backend::"] {
            if code.contains(needle) {
                found.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the CLI reaches past the seam:\n{}",
        found.join("\n")
    );
}

/// Calls of a rendering function (`render(`, `render_cuda(`, `render_given(`, …) in `code`,
/// leaving out their definitions (`fn render(`).
fn render_calls(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("render") {
        let before = &code[..at];
        if before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            || before.ends_with("fn ")
        {
            continue;
        }
        let name = ident(&code[at..]);
        if (name == "render" || name.starts_with("render_"))
            && code[at + name.len()..].starts_with('(')
        {
            out.push(name);
        }
    }
    out
}

/// Render, compile, link: no `Compiler` implementation renders. A compiler takes the
/// `RenderedProgram` its backend's renderer made; checked over each compiler's file (a
/// `compiler.rs`) or, elsewhere, its `impl Compiler for` block.
#[test]
fn no_compiler_calls_a_renderer() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        for part in ["src", "tests"] {
            let dir = krate.path().join(part);
            if dir.is_dir() {
                rust_files(&dir, &mut files);
            }
        }
    }
    let mut compilers = 0;
    let mut report = Vec::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let Some(start) = code.find("\nimpl Compiler for ") else {
            continue;
        };
        compilers += 1;
        let checked = if file.file_name().is_some_and(|n| n == "compiler.rs") {
            &code[..]
        } else {
            let block = &code[start..];
            &block[..block.find("\n}").unwrap_or(block.len())]
        };
        for call in render_calls(checked) {
            report.push(format!("{}: calls {call}(", file.display()));
        }
    }
    // cc, cuda, wgpu, the placeholder, the skeleton and the reference tests' recording one.
    assert!(compilers >= 5, "only {compilers} compilers found");
    assert!(
        report.is_empty(),
        "compilers that render:\n{}",
        report.join("\n")
    );
    assert_eq!(
        render_calls("fn render(&self) { x.render(a); render_wgsl(b); rendered.assemble(c) }"),
        vec!["render", "render_wgsl"]
    );
}

/// One way to compile: `Backend`'s public functions named `compile…` are the entry point
/// (`compile`, taking a `CompileRequest`) and its settings (`compile_options`,
/// `compile_settings`), not one function per shape of request.
#[test]
fn the_backend_has_one_compile_entry_point() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../arrayjit-runtime/src/backend.rs");
    let code = code_of(&std::fs::read_to_string(path).unwrap());
    let mut names: Vec<String> = code
        .match_indices("pub fn compile")
        .map(|(at, _)| ident(&code[at + "pub fn ".len()..]))
        .collect();
    names.sort();
    assert_eq!(names, ["compile", "compile_options", "compile_settings"]);
    assert!(code.contains("pub fn compile<Out>(&self, request: CompileRequest<'_, Out>)"));
}

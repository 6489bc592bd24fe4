//! The modules of every crate form layers: no module imports (through `crate::` paths) a
//! module that imports it back, directly or through others. A circle is reported with the
//! modules on it and the imports that close it, so it can be broken where it formed.

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

/// The top-level modules named by `crate::` paths in code (comments and test modules aside).
fn imports(source: &str) -> BTreeSet<String> {
    let code: String = source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (pos, _) in code.match_indices("crate::") {
        let rest = &code[pos + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // `crate::{a::X, b}`: the modules named inside the braces.
            let list = &list[..list.find('}').unwrap_or(list.len())];
            for item in list.split(',') {
                let item = item.trim();
                if item.contains("::") {
                    found.insert(ident(item));
                }
            }
        } else {
            let name = ident(rest);
            if rest[name.len()..].starts_with("::") {
                found.insert(name);
            }
        }
    }
    found
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
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let Some(module) = module_of(&src, file) else {
                continue;
            };
            let source = std::fs::read_to_string(file).unwrap();
            let deps = graph.entry(module.clone()).or_default();
            deps.extend(imports(&source).into_iter().filter(|d| *d != module));
        }
        checked += graph.len();
        for circle in circles(&graph) {
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
                "{}: {}",
                krate.file_name().to_string_lossy(),
                edges.join(", ")
            ));
        }
    }
    assert!(
        checked > 50,
        "only {checked} modules found under {crates:?}"
    );
    assert!(report.is_empty(), "import circles:\n{}", report.join("\n"));
}

#[test]
fn the_import_scan_sees_paths_and_lists_and_skips_comments() {
    let source =
        "use crate::a::X;\nuse crate::{b::Y, Z};\n// crate::c::W\nfn f() { crate::d::g(); }\n";
    let found: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(found, ["a", "b", "d"]);
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
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
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

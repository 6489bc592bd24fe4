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

//! The README's crate table against the manifests: every crate of the workspace has one row,
//! and its layer is one more than the highest layer of the arrayjit crates it depends on (1
//! for none), so "layers import only downward" stays true as the manifests change.

use std::collections::BTreeMap;
use std::path::Path;

/// The arrayjit crates a manifest's `[dependencies]` names (not dev or build dependencies).
fn arrayjit_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if !in_dependencies {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        // `name = ...`, `name = { ... }` or `name.workspace = true`.
        let rest = line[name.len()..].trim_start();
        if name.starts_with("arrayjit") && (rest.starts_with('=') || rest.starts_with('.')) {
            out.push(name);
        }
    }
    out
}

/// The crate table's rows: crate name and layer.
fn table(readme: &str) -> BTreeMap<String, u32> {
    let section = readme
        .split("## Crate layout")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a `## Crate layout` section");
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let layer = cells.get(2)?.parse().ok()?;
            Some((name.to_string(), layer))
        })
        .collect()
}

#[test]
fn the_readme_crate_table_follows_the_manifests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let rows = table(&readme);
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let Ok(manifest) = std::fs::read_to_string(entry.path().join("Cargo.toml")) else {
            continue;
        };
        let name = manifest
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("name = \"")
                    .and_then(|r| r.strip_suffix('"'))
            })
            .unwrap()
            .to_string();
        deps.insert(name, arrayjit_dependencies(&manifest));
    }
    assert!(deps.len() >= 10, "{deps:?}");
    let missing: Vec<&String> = deps.keys().filter(|c| !rows.contains_key(*c)).collect();
    let extra: Vec<&String> = rows.keys().filter(|c| !deps.contains_key(*c)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "crates without a row: {missing:?}; rows without a crate: {extra:?}"
    );
    let mut wrong = Vec::new();
    for (krate, uses) in &deps {
        let expected = 1 + uses.iter().map(|d| rows[d]).max().unwrap_or(0);
        if rows[krate] != expected {
            wrong.push(format!(
                "{krate}: layer {} in the README, {expected} by its dependencies {uses:?}",
                rows[krate]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every crate's manifest description opens with its layer as the README's table gives it
/// (`arrayjit layer N: ...`), so the two cannot disagree.
#[test]
fn every_manifest_description_names_the_readme_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rows = table(&std::fs::read_to_string(root.join("README.md")).unwrap());
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let Ok(manifest) = std::fs::read_to_string(entry.path().join("Cargo.toml")) else {
            continue;
        };
        let field = |key: &str| {
            manifest.lines().find_map(|l| {
                l.trim()
                    .strip_prefix(key)
                    .and_then(|r| r.strip_suffix('"'))
                    .map(str::to_string)
            })
        };
        let name = field("name = \"").unwrap();
        let description = field("description = \"").unwrap_or_default();
        let want = format!("arrayjit layer {}: ", rows[&name]);
        if !description.starts_with(&want) {
            wrong.push(format!(
                "{name}: \"{description}\" should open with \"{want}\""
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_manifest_scan_reads_only_the_dependencies_section() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\narrayjit-ir = { path = \"../ir\" }\n\
                    arrayjit-tensor.workspace = true\nthiserror = \"2\"\n[dev-dependencies]\n\
                    arrayjit-testing = { path = \"../t\" }\n";
    assert_eq!(
        arrayjit_dependencies(manifest),
        vec!["arrayjit-ir", "arrayjit-tensor"]
    );
}

/// The Rust sources of the house (`crates/*/src`, `tests`, `examples`, `benches`), with their
/// line counts.
fn source_lines() -> Vec<(std::path::PathBuf, usize)> {
    fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, usize)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).unwrap().lines().count();
                out.push((path, lines));
            }
        }
    }
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        for part in ["src", "tests", "examples", "benches"] {
            walk(&krate.path().join(part), &mut out);
        }
    }
    out
}

/// No source file grows past 900 lines: a longer one is split by concept (a test file into
/// modules under a folder of its name).
#[test]
fn no_source_file_is_over_900_lines() {
    let files = source_lines();
    assert!(files.len() > 300, "only {} files found", files.len());
    let long: Vec<String> = files
        .iter()
        .filter(|(_, n)| *n > 900)
        .map(|(p, n)| format!("{}: {n} lines", p.display()))
        .collect();
    assert!(
        long.is_empty(),
        "files over 900 lines:\n{}",
        long.join("\n")
    );
}

/// `arrayjit-ir` holds the data model and the interpreter, not the optimizer (`arrayjit-opt`):
/// at most 10.5k lines of source.
#[test]
fn the_data_model_crate_stays_small() {
    let ir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../arrayjit-ir/src");
    let lines: usize = source_lines()
        .iter()
        .filter(|(p, _)| p.starts_with(&ir))
        .map(|(_, n)| n)
        .sum();
    assert!(
        (5_000..=10_500).contains(&lines),
        "arrayjit-ir has {lines} lines of source (at most 10,500: does the new code belong to \
         the data model or the interpreter, or to the optimizer or a backend?)"
    );
}

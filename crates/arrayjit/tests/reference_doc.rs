//! `docs/reference.md` against the code: every item row cites at least one test that exists
//! (a test function, a test file, or a module's tests), and every reference test it names
//! (`<document>__<item>`) exists, so a renamed or deleted test cannot leave a row unbacked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every function name defined in the workspace's Rust files, and every file name.
fn known_names(root: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut fns = BTreeSet::new();
    let mut names = BTreeSet::new();
    for f in &files {
        if let Some(n) = f.file_name() {
            names.insert(n.to_string_lossy().to_string());
            // A module in a folder: `name/mod.rs`.
            if let Some(dir) = f.parent().and_then(Path::file_name) {
                names.insert(format!("{}/{}", dir.to_string_lossy(), n.to_string_lossy()));
            }
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (pos, _) in text.match_indices("fn ") {
            let name: String = text[pos + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                fns.insert(name);
            }
        }
    }
    (fns, names)
}

/// The backticked words of a table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn every_reference_row_cites_a_test_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/reference.md")).unwrap();
    let (fns, files) = known_names(&root);
    let items = doc
        .split("## Deliberate differences")
        .next()
        .expect("the page lists items before its differences");
    let mut rows = 0;
    let mut problems = Vec::new();
    // A cell saying `same` cites what the row before it cites.
    let mut previous: Vec<String> = Vec::new();
    let matches_fn = |w: &str| match w.split_once('*') {
        // `prefix*suffix`: some test of that shape.
        Some((pre, post)) => fns
            .iter()
            .any(|f| f.starts_with(pre) && f.ends_with(post) && f.len() > pre.len() + post.len()),
        None => fns.contains(w),
    };
    let exists = |w: &String| {
        let last = w.rsplit("::").next().unwrap_or(w);
        matches_fn(last)
            || files.contains(w.as_str())
            || w.strip_suffix("::tests").is_some_and(|m| {
                let leaf = m.rsplit("::").next().unwrap_or(m);
                files.contains(&format!("{leaf}.rs")) || files.contains(&format!("{leaf}/mod.rs"))
            })
    };
    for line in items.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | item | status | where | test / note |
        let (Some(status), Some(cites)) = (cells.get(2), cells.get(4)) else {
            continue;
        };
        rows += 1;
        let mut cited = quoted(cites);
        if cites.starts_with("same") {
            cited.extend(previous.iter().cloned());
        }
        for w in cited.iter().filter(|w| w.contains("__")) {
            let last = w.rsplit("::").next().unwrap_or(w);
            if !matches_fn(last) {
                problems.push(format!("{}: cites {w}, which no test defines", cells[1]));
            }
        }
        if *status != "difference" && !cited.iter().any(exists) {
            problems.push(format!("{}: cites no test that exists ({cites})", cells[1]));
        }
        previous = cited;
    }
    assert!(rows >= 100, "only {rows} item rows found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

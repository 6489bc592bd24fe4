//! The docs name files that exist: every file path in backticks in `docs/adding-a-backend.md`
//! and `docs/reference.md` (a path with folders from the repository's root, a crate's folder or
//! a crate's `src`/`tests`; a bare file name somewhere in the crates), and the guide for new
//! backends names files without line counts (which drift with every change).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file below `dir` (recursively), skipping build output and hidden folders.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The backticked file paths of a Markdown text.
fn named_paths(text: &str) -> Vec<String> {
    const ENDINGS: [&str; 7] = [".rs", ".md", ".toml", ".sh", ".py", ".txt", ".json"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            !t.contains(char::is_whitespace)
                && !t.contains("::")
                && ENDINGS.iter().any(|e| t.ends_with(e))
        })
        .map(str::to_string)
        .collect()
}

fn exists(path: &str, all: &[PathBuf]) -> bool {
    let root = root();
    if path.contains('/') {
        let mut bases = vec![root.clone(), root.join("crates")];
        for crate_dir in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
            let c = crate_dir.path();
            bases.extend([c.join("src"), c.join("tests"), c]);
        }
        bases.iter().any(|b| b.join(path).exists())
    } else {
        all.iter()
            .any(|f| f.file_name().is_some_and(|n| n.to_string_lossy() == path))
    }
}

#[test]
fn every_file_the_docs_name_exists() {
    let mut all = Vec::new();
    files(&root().join("crates"), &mut all);
    files(&root().join("scripts"), &mut all);
    files(&root().join("docs"), &mut all);
    let mut missing = Vec::new();
    for doc in ["docs/adding-a-backend.md", "docs/reference.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let paths = named_paths(&text);
        assert!(paths.len() >= 10, "{doc}: only {paths:?}");
        missing.extend(
            paths
                .into_iter()
                .filter(|p| !exists(p, &all))
                .map(|p| format!("{doc}: `{p}`")),
        );
    }
    assert!(
        missing.is_empty(),
        "files the docs name are missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_backend_guide_names_files_without_line_counts() {
    let text = std::fs::read_to_string(root().join("docs/adding-a-backend.md")).unwrap();
    let counted: Vec<&str> = text
        .split('`')
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0].ends_with(".rs"))
        .filter_map(|w| {
            let after = w[1].trim_start_matches([',', ' ', '(']);
            let digits = after.chars().take_while(char::is_ascii_digit).count();
            (w[1].starts_with(", ") && digits > 0).then_some(w[0])
        })
        .collect();
    assert!(counted.is_empty(), "line counts after {counted:?}");
}

/// `docs/reference.md`'s counts line says how many item rows its tables hold, by status.
#[test]
fn the_reference_counts_its_rows() {
    let text = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut by_status: std::collections::BTreeMap<String, usize> = Default::default();
    let mut in_items = false;
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("| item | status |") {
            in_items = true;
            continue;
        }
        if !line.starts_with('|') {
            in_items = false;
            continue;
        }
        if in_items && !line.starts_with("|---") && lines.get(i + 1).is_some() {
            let status = line.split('|').nth(2).unwrap_or("").trim().to_string();
            *by_status.entry(status).or_default() += 1;
        }
    }
    let total: usize = by_status.values().sum();
    let count = |s: &str| by_status.get(s).copied().unwrap_or(0);
    let want = format!(
        "Counts: {total} rows: {} covered, {} differences, {} partial, {} missing",
        count("covered"),
        count("difference"),
        count("partial"),
        count("missing")
    );
    assert_eq!(
        total,
        count("covered") + count("difference") + count("partial") + count("missing"),
        "{by_status:?}"
    );
    assert!(text.contains(&want), "the counts line should read: {want}");
}

//! One list of backend features: `arrayjit-backends` defines the GPU backends' cargo features
//! (and its `built` module is the only code that reads them); the facade and the Python module
//! forward each unchanged to it, the command-line tool forwards each to the facade, all three
//! build the same ones by default, and no other crate declares them.

use std::collections::BTreeMap;
use std::path::Path;

use arrayjit::backends::built::BACKEND_FEATURES;

/// A manifest's `[features]`: name to the list it enables (as written, quotes removed).
fn features(manifest: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[features]";
            continue;
        }
        if !inside || line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name, list)) = line.split_once('=') else {
            continue;
        };
        let items = list
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .filter(|s| !s.is_empty())
            .collect();
        out.insert(name.trim().to_string(), items);
    }
    out
}

fn manifest(krate: &str) -> BTreeMap<String, Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("crates")
        .join(krate)
        .join("Cargo.toml");
    features(&std::fs::read_to_string(&path).unwrap())
}

#[test]
fn backend_features_are_defined_once_and_forwarded_unchanged() {
    let defined = manifest("arrayjit-backends");
    let names: Vec<&str> = defined.keys().map(String::as_str).collect();
    let mut expected: Vec<&str> = BACKEND_FEATURES.to_vec();
    expected.sort_unstable();
    assert_eq!(
        names, expected,
        "arrayjit-backends' features are the backend features `built` reads"
    );
    let forwards = [
        ("arrayjit", "arrayjit-backends"),
        ("arrayjit-py", "arrayjit-backends"),
        ("arrayjit-cli", "arrayjit"),
    ];
    for (krate, target) in forwards {
        let f = manifest(krate);
        for feature in BACKEND_FEATURES {
            assert_eq!(
                f.get(*feature),
                Some(&vec![format!("{target}/{feature}")]),
                "{krate} forwards `{feature}` to {target}/{feature} and nothing else"
            );
        }
        let mut defaults = f.get("default").cloned().unwrap_or_default();
        defaults.sort();
        assert_eq!(
            defaults, expected,
            "{krate} builds every GPU backend by default"
        );
    }
    // No other crate declares a backend feature.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates");
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let krate = entry.file_name().to_string_lossy().to_string();
        if [
            "arrayjit-backends",
            "arrayjit",
            "arrayjit-py",
            "arrayjit-cli",
        ]
        .contains(&krate.as_str())
        {
            continue;
        }
        let f = manifest(&krate);
        for feature in BACKEND_FEATURES {
            assert!(
                !f.contains_key(*feature),
                "{krate} declares backend feature `{feature}`; forward it from the facade instead"
            );
        }
    }
}

#[test]
fn the_registry_reports_what_this_build_has() {
    use arrayjit::backends::built;
    let cuda = arrayjit::backend("cuda").unwrap();
    let wgpu = arrayjit::backend("wgpu").unwrap();
    // A backend this build lacks is the placeholder that says which feature enables it.
    for (built, backend, feature) in [(built::CUDA, cuda, "cuda"), (built::WGPU, wgpu, "wgpu")] {
        if !built {
            let e = backend.lowered().check_available().unwrap_err();
            assert!(
                matches!(e, arrayjit::Error::BackendUnavailable { .. })
                    && e.to_string().contains(&format!("feature `{feature}`")),
                "{e}"
            );
        }
    }
    assert_eq!(built::CUDA, cfg!(feature = "cuda"));
    assert_eq!(built::WGPU, cfg!(feature = "wgpu"));
}

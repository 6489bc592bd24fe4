//! What the `arrayjit` command shows of a run: `ARRAYJIT_DEBUG` listings, and timelines from
//! `ARRAYJIT_TRACE` and `--trace`.

mod common;
use common::arrayjit_with_env as arrayjit_command;

/// `ARRAYJIT_DEBUG=2` lists every compiled routine of the user's program (cache hit or
/// compile time, kernels, arrays) and every run with its time and slowest statements; `=3` adds the loop IR, the
/// source and the memory modes with their reasons; a value out of range is an error.
#[test]
fn arrayjit_debug_lists_kernels_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("m.png");
    let (ok, out, err) = arrayjit_command(
        &[
            "--epochs",
            "2",
            "--samples",
            "100",
            "--output",
            png.to_str().unwrap(),
        ],
        &[("ARRAYJIT_DEBUG", "2")],
    );
    assert!(ok, "{err}");
    assert!(out.contains("held-out accuracy"), "{out}");
    let compiled: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("arrayjit: compiled "))
        .collect();
    assert!(
        compiled
            .iter()
            .any(|l| l.contains("compiled train_step on sync_cc")
                && (l.contains("cache hit in") || l.contains("compiled in"))
                && l.contains("kernel(s)")
                && l.contains("array(s) of")),
        "{err}"
    );
    let runs = err
        .lines()
        .filter(|l| l.starts_with("arrayjit: ran train_step on "))
        .count();
    assert!(runs >= 2, "{err}");
    // Each run on a C backend is followed by its slowest statements.
    let lines: Vec<&str> = err.lines().collect();
    let profiled = lines
        .windows(2)
        .filter(|w| {
            w[0].starts_with("arrayjit: ran train_step on ")
                && w[1].starts_with("arrayjit:   train_step: ")
                && w[1].contains(" statements, ")
                && w[1].contains("slowest #")
        })
        .count();
    assert_eq!(profiled, runs, "{err}");

    let (ok, _, err) = arrayjit_command(&["lowering"], &[("ARRAYJIT_DEBUG", "3")]);
    assert!(ok, "{err}");
    for part in [
        "arrayjit: loop IR of",
        "arrayjit: memory modes of",
        "arrayjit: generated source:",
        "because",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    let (ok, _, err) = arrayjit_command(&["lowering"], &[("ARRAYJIT_DEBUG", "7")]);
    assert!(!ok);
    assert!(
        err.contains("ARRAYJIT_DEBUG") && err.contains("0 to 3"),
        "{err}"
    );
}

/// `--trace FILE` and `ARRAYJIT_TRACE=FILE` write a Chrome trace of the run; a trace that
/// cannot be written is refused before the run.
#[test]
fn the_command_writes_traces() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let png = dir.path().join("m.png");
    let (ok, _, err) = arrayjit_command(
        &[
            "--epochs",
            "2",
            "--samples",
            "100",
            "--output",
            png.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(err.contains("ui.perfetto.dev"), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["cat"] == "kernel" && e["name"] == "train_step")
    );
    assert!(events.iter().any(|e| e["cat"] == "copy"));

    let from_env = dir.path().join("env.json");
    let (ok, _, err) = arrayjit_command(
        &["lowering"],
        &[("ARRAYJIT_TRACE", from_env.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&from_env).unwrap()).unwrap();
    assert!(json["traceEvents"].as_array().unwrap().len() > 3);

    let (ok, out, err) = arrayjit_command(&["--trace", "/nonexistent-folder/t.json", "info"], &[]);
    assert!(!ok && out.is_empty());
    assert!(
        err.contains("cannot write the trace /nonexistent-folder/t.json"),
        "{err}"
    );
}

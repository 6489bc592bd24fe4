//! The `arrayjit` command: the README's demo, backend selection by `ARRAYJIT_BACKEND`, and the
//! error messages a user sees.

mod common;

use common::arrayjit_with_env as arrayjit_env;
use std::process::Command;

fn arrayjit(args: &[&str], backend: Option<&str>) -> (bool, String, String) {
    match backend {
        Some(b) => arrayjit_env(args, &[("ARRAYJIT_BACKEND", b)]),
        None => arrayjit_env(args, &[]),
    }
}

#[test]
fn the_demo_runs_on_the_default_backend_and_agrees_with_the_interpreter() {
    let (ok, out, err) = arrayjit(&["lowering"], None);
    assert!(ok, "{err}");
    assert!(out.contains("interpreter agrees: yes"), "{out}");
    assert!(out.contains("virtual (because: optimizer"), "{out}");
    assert!(out.contains("void aj0_demo("), "{out}");
    // relu(W·x + b) for the demo's inputs, computed by hand.
    assert!(out.contains("[0.875, 0.0, 0.625, 0.0]"), "{out}");
}

#[test]
fn the_default_command_trains_moons_and_writes_a_picture() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("moons.png");
    let (ok, out, err) = arrayjit(
        &["moons", "--epochs", "40", "--output", png.to_str().unwrap()],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("held-out accuracy"), "{out}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}

#[test]
fn unknown_backend_from_the_environment_lists_the_available_ones() {
    let (ok, _, err) = arrayjit(&["lowering"], Some("tpu"));
    assert!(!ok);
    assert!(
        err.contains("unknown backend \"tpu\"") && err.contains("sync_cc"),
        "{err}"
    );
}

#[test]
fn missing_backend_from_the_environment_says_how_to_enable_it() {
    let (ok, _, err) = arrayjit(&["lowering"], Some("cuda"));
    assert!(!ok);
    assert!(
        err.contains("backend cuda is unavailable") && err.contains("to enable it"),
        "{err}"
    );
}

#[test]
fn info_lists_backends() {
    let (ok, out, err) = arrayjit(&["info"], None);
    assert!(ok, "{err}");
    assert!(out.contains("sync_cc: available, 1 device(s)"), "{out}");
    // wgpu is listed either way: available (the feature and a Vulkan driver) or why not.
    assert!(
        out.contains("wgpu: backend wgpu is unavailable") || out.contains("wgpu: available"),
        "{out}"
    );
}

#[test]
fn invalid_settings_from_the_environment_are_reported_not_aborts() {
    for value in ["1000000000000", "18446744073709551615", "0", "lots"] {
        let out = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
            .arg("lowering")
            .env("ARRAYJIT_CPU_DEVICES", value)
            .env_remove("ARRAYJIT_BACKEND")
            .output()
            .expect("the arrayjit binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(
            err.contains("ARRAYJIT_CPU_DEVICES")
                && err.contains(value)
                && err.contains("1 to 1024"),
            "{err}"
        );
    }
}

/// An unusable `ARRAYJIT_CACHE_DIR` does not stop the program; the user sees one warning
/// naming the folder and why.
#[test]
fn an_unusable_cache_folder_is_a_visible_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let cache = file.join("cache");
    let (ok, out, err) = arrayjit_env(
        &["lowering"],
        &[("ARRAYJIT_CACHE_DIR", cache.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert!(out.contains("interpreter agrees: yes"), "{out}");
    assert!(
        err.contains("compiling without the compile cache")
            && err.contains(cache.to_str().unwrap())
            && err.to_lowercase().contains("not a directory"),
        "{err}"
    );
    assert_eq!(
        err.matches("compiling without the compile cache").count(),
        1,
        "{err}"
    );
}

/// `CC` may be a command with arguments or a wrapper, as make and the `cc` crate accept.
#[test]
fn cc_may_hold_a_wrapper_and_arguments() {
    let cache = tempfile::tempdir().unwrap();
    for cc in ["env cc -std=gnu11", "cc -O1"] {
        let (ok, out, err) = arrayjit_env(
            &["lowering"],
            &[
                ("CC", cc),
                ("ARRAYJIT_CACHE_DIR", cache.path().to_str().unwrap()),
            ],
        );
        assert!(ok, "CC={cc}: {err}");
        assert!(out.contains("interpreter agrees: yes"), "CC={cc}: {out}");
    }
    let (ok, _, err) = arrayjit_env(&["lowering"], &[("CC", "no-such-compiler -O2")]);
    assert!(!ok);
    assert!(
        err.contains("no-such-compiler -O2") && err.contains("point CC at one"),
        "{err}"
    );
}

/// The picture's path is checked before training (known extension, existing folder, writable,
/// not a folder), and the error names it in plain words; nothing trains.
#[test]
fn a_bad_picture_path_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-folder").join("m.png");
    let cases = [
        (
            missing.to_str().unwrap().to_string(),
            "a folder that exists",
        ),
        (
            dir.path().join("m.txt").to_str().unwrap().to_string(),
            "ending in .png or .bmp",
        ),
        (
            dir.path().to_str().unwrap().to_string(),
            "ending in .png or .bmp",
        ),
    ];
    for (path, why) in &cases {
        let (ok, out, err) = arrayjit_env(&["--output", path], &[]);
        assert!(!ok, "{path}");
        assert!(!out.contains("held-out"), "{path}: trained anyway: {out}");
        assert!(
            err.contains(&format!("picture path = {path} is not valid")) && err.contains(why),
            "{err}"
        );
    }
    let folder_png = dir.path().join("folder.png");
    std::fs::create_dir(&folder_png).unwrap();
    let (ok, _, err) = arrayjit_env(&["--output", folder_png.to_str().unwrap()], &[]);
    assert!(!ok && err.contains("not a folder"), "{err}");
}

/// `--epochs 0`, `--shards 0` and too few samples are refused with the real limits.
#[test]
fn flags_out_of_range_are_refused_with_their_limits() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("m.png");
    let png = png.to_str().unwrap();
    let (ok, _, err) = arrayjit_env(&["--epochs", "0", "--output", png], &[]);
    assert!(!ok && err.contains("--epochs must be at least 1"), "{err}");
    let (ok, _, err) = arrayjit_env(&["--shards", "0", "--output", png], &[]);
    assert!(!ok && err.contains("--shards must be at least 1"), "{err}");
    let (ok, _, err) = arrayjit_env(&["--samples", "20", "--output", png], &[]);
    assert!(
        !ok && err.contains("--samples = 20 is not valid: 26 or more"),
        "{err}"
    );
    let (ok, _, err) = arrayjit_env(&["--samples", "60", "--shards", "3", "--output", png], &[]);
    assert!(!ok && err.contains("3 shard(s) need at least 60"), "{err}");
    // The smallest accepted run trains.
    let (ok, out, err) = arrayjit_env(&["--samples", "26", "--epochs", "1", "--output", png], &[]);
    assert!(ok, "{err}");
    assert!(out.contains("held-out accuracy"), "{out}");
    // The demo's flags are refused before another command, which would ignore them.
    let (ok, _, err) = arrayjit_env(&["--epochs", "3", "info"], &[]);
    assert!(
        !ok && err.contains("--epochs is a flag of the moons demo"),
        "{err}"
    );
}

/// The default command takes the demo's flags without naming it, prints its results before
/// the picture is written, and the picture is a PNG with text (the bundled font).
#[test]
fn the_default_command_takes_flags_and_prints_before_drawing() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("out.png");
    let (ok, out, err) = arrayjit_env(&["--epochs", "3", "--output", png.to_str().unwrap()], &[]);
    assert!(ok, "{err}");
    let results = out.find("held-out accuracy").expect("results printed");
    let picture = out.find("picture:").expect("picture reported");
    assert!(results < picture, "{out}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}

#[test]
fn plan_lists_the_gpt_routines_gpu_passes_without_a_gpu() {
    let (ok, out, err) = arrayjit(&["plan", "--device", "sm_90", "--only", "step"], None);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("GPU plan of gpt_train_step on NVIDIA H100 SXM (sm_90)"),
        "{out}"
    );
    for column in ["shape", "groups", "threads", "independent", "µs"] {
        assert!(out.contains(column), "{out}");
    }
    assert!(
        out.contains("grid reduction") && out.contains(" rows "),
        "{out}"
    );
    let (ok, out, err) = arrayjit(&["plan", "--summary", "--device", "a100"], None);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let (ok, _, err) = arrayjit(&["plan", "--device", "tpu"], None);
    assert!(!ok);
    assert!(
        err.contains("device model = tpu is not valid") && err.contains("h100"),
        "{err}"
    );
}

/// `arrayjit generate` on the tiny GPT-2 fixture, with a tokenizer cut to its 512 ids (GPT-2's
/// 256 byte symbols and its first 256 merges, which make ids 256 to 511): the prompt and the
/// continuation on stdout, the timings on stderr; a generation longer than the model's
/// positions and a missing model folder are refused with what is wrong.
#[test]
fn generate_continues_a_prompt_and_refuses_what_does_not_fit() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fixture = root.join("crates/arrayjit/tests/fixtures/gpt2-tiny");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), dir.path().join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("data/gpt2/vocab.json")).unwrap())
            .unwrap();
    let small: serde_json::Map<String, serde_json::Value> = vocab
        .into_iter()
        .filter(|(_, id)| id.as_u64().unwrap() < 512)
        .collect();
    assert_eq!(small.len(), 512);
    std::fs::write(
        dir.path().join("vocab.json"),
        serde_json::Value::Object(small).to_string(),
    )
    .unwrap();
    let merges = std::fs::read_to_string(root.join("data/gpt2/merges.txt")).unwrap();
    let first: Vec<&str> = merges.lines().take(257).collect();
    std::fs::write(dir.path().join("merges.txt"), first.join("\n") + "\n").unwrap();
    let model = dir.path().to_str().unwrap();
    let args = [
        "generate",
        "--model",
        model,
        "--prompt",
        "Hello there",
        "--tokens",
        "6",
    ];
    let (ok, out, err) = arrayjit(&[&args[..], &["--temperature", "0"]].concat(), None);
    assert!(ok, "{err}");
    assert!(out.starts_with("Hello there"), "{out}");
    assert!(err.contains("tokens/s") && err.contains("prefill"), "{err}");
    // The same seed gives the same sampled text.
    let sampled = [&args[..], &["--temperature", "0.9", "--seed", "4"]].concat();
    assert_eq!(arrayjit(&sampled, None).1, arrayjit(&sampled, None).1);
    // 128 positions: a prompt plus 200 tokens does not fit.
    let (ok, _, err) = arrayjit(
        &[
            "generate", "--model", model, "--prompt", "Hello", "--tokens", "200",
        ],
        None,
    );
    assert!(!ok && err.contains("128"), "{err}");
    let (ok, _, err) = arrayjit(&["generate", "--model", "/nonexistent/gpt2"], None);
    assert!(!ok && err.contains("/nonexistent/gpt2"), "{err}");
}

//! The `arrayjit` command: the README's demo, backend selection by `ARRAYJIT_BACKEND`, and the
//! error messages a user sees.

use std::process::Command;

fn arrayjit(args: &[&str], backend: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_arrayjit"));
    cmd.args(args);
    match backend {
        Some(b) => cmd.env("ARRAYJIT_BACKEND", b),
        None => cmd.env_remove("ARRAYJIT_BACKEND"),
    };
    let out = cmd.output().expect("the arrayjit binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

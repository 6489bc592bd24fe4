//! Running the `arrayjit` binary in tests.

use std::process::Command;

/// Runs the `arrayjit` binary with `args` and extra environment variables (without
/// `ARRAYJIT_BACKEND` unless given): whether it succeeded, its stdout and its stderr.
pub fn arrayjit_with_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_arrayjit"));
    cmd.args(args).env_remove("ARRAYJIT_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the arrayjit binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

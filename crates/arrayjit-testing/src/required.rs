//! Which backends a test run must not skip: `ARRAYJIT_REQUIRE_BACKENDS`, a comma list of
//! backend names. A shared test that finds a listed backend unavailable fails instead of saying
//! it skipped, so a broken install (no Vulkan driver, no C++ compiler) cannot turn the GPU-path
//! tests green. CI sets it to every backend it installs.

use arrayjit_ir::{Error, Result};
use arrayjit_runtime::{Backend, KNOWN_BACKENDS};

/// The environment variable naming the backends a test run requires.
pub const REQUIRE_BACKENDS_VAR: &str = "ARRAYJIT_REQUIRE_BACKENDS";

/// The backends `ARRAYJIT_REQUIRE_BACKENDS` lists (none when unset or empty). A name that is
/// not a known backend is an [`Error::InvalidSetting`]: a typo must not make the check pass.
pub fn required_backends() -> Result<Vec<&'static str>> {
    let Ok(list) = std::env::var(REQUIRE_BACKENDS_VAR) else {
        return Ok(Vec::new());
    };
    parse_required(&list)
}

/// Parses a comma list of backend names (see [`required_backends`]).
pub fn parse_required(list: &str) -> Result<Vec<&'static str>> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let known =
            KNOWN_BACKENDS
                .iter()
                .find(|k| **k == name)
                .ok_or_else(|| Error::InvalidSetting {
                    setting: REQUIRE_BACKENDS_VAR.into(),
                    value: list.into(),
                    expected: format!(
                        "a comma list of backend names among {}; {name:?} is not one",
                        KNOWN_BACKENDS.join(", ")
                    ),
                })?;
        if !out.contains(known) {
            out.push(*known);
        }
    }
    Ok(out)
}

/// Says that a test skips backend `name` because `why`; an error instead when
/// `ARRAYJIT_REQUIRE_BACKENDS` lists it.
pub fn skip_backend(name: &str, why: &str) -> Result<()> {
    skip_unless_in(&required_backends()?, name, why)
}

fn skip_unless_in(required: &[&str], name: &str, why: &str) -> Result<()> {
    if required.contains(&name) {
        return Err(Error::BackendUnavailable {
            backend: name.to_string(),
            reason: format!("a test needs it and {REQUIRE_BACKENDS_VAR} requires it, but {why}"),
            how_to_enable: "install what `arrayjit info` says it lacks, or take it out of \
                            ARRAYJIT_REQUIRE_BACKENDS"
                .into(),
        });
    }
    eprintln!("skipped {name}: {why}");
    Ok(())
}

/// The backends among `candidates` that can run here, in that order; each unavailable one is
/// skipped with its reason (see [`skip_backend`]), or is an error when required.
pub fn backends_under_test(candidates: &[&str]) -> Result<Vec<Backend>> {
    select(candidates, &required_backends()?)
}

/// Backend `name` where it can run here; `None` (skipped with its reason) where it cannot and
/// is not required, an error where it is (see [`backends_under_test`]).
pub fn backend_under_test(name: &str) -> Result<Option<Backend>> {
    Ok(backends_under_test(&[name])?.pop())
}

fn select(candidates: &[&str], required: &[&str]) -> Result<Vec<Backend>> {
    let mut out = Vec::new();
    for name in candidates {
        let backend = arrayjit_runtime::backend(name)?;
        match backend.check_available() {
            Ok(()) => out.push(backend),
            Err(e) => skip_unless_in(required, name, &e.to_string())?,
        }
    }
    Ok(out)
}

/// Every known backend that can run here (see [`backends_under_test`]).
pub fn all_backends_under_test() -> Result<Vec<Backend>> {
    backends_under_test(KNOWN_BACKENDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_refuses_unknown_names() {
        assert_eq!(
            parse_required(" sync_cc, wgpu,,sync_cc ").unwrap(),
            vec!["sync_cc", "wgpu"]
        );
        assert!(parse_required("").unwrap().is_empty());
        let err = parse_required("sync_cc,wgpuu").unwrap_err();
        assert!(matches!(err, Error::InvalidSetting { .. }), "{err}");
        assert!(err.to_string().contains("wgpuu"), "{err}");
    }

    #[test]
    fn a_required_backend_that_cannot_run_fails_instead_of_skipping() {
        // metal is never built here: skipped when not required, an error when required.
        let picked = select(&["sync_cc", "metal"], &[]).unwrap();
        assert_eq!(
            picked.iter().map(|b| b.name()).collect::<Vec<_>>(),
            ["sync_cc"]
        );
        let err = select(&["sync_cc", "metal"], &["metal"]).unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
        assert!(err.to_string().contains(REQUIRE_BACKENDS_VAR), "{err}");
        // A required backend that is available is simply used.
        assert_eq!(select(&["sync_cc"], &["sync_cc"]).unwrap().len(), 1);
    }
}

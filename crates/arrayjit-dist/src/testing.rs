//! Running a test on several ranks: a test function starts itself again under
//! `mpirun -np N` on loopback (OpenMPI settings that keep traffic on the machine and allow
//! root), and each rank runs its body. Used by arrayjit's own tests; usable by yours.

use std::process::Command;

/// The variable marking the processes started by [`on_ranks`].
pub const RANK_TEST_VARIABLE: &str = "ARRAYJIT_MPI_RANK_TEST";

/// Where [`on_ranks`] left the calling test.
#[derive(Debug)]
pub enum RankRun {
    /// This process is one of the ranks: run the test's body.
    Rank,
    /// This process started the ranks, which all passed; their stdout and stderr.
    Started(String),
    /// `mpirun` is not here: the test cannot run (the reason).
    Skipped(String),
}

/// Seconds an `mpirun` started by [`on_ranks`] may run before mpirun kills the job (so a
/// hanging test fails instead of blocking).
pub const JOB_TIMEOUT_SECS: u64 = 120;

/// Runs the test named `test` (of the current test binary) on `ranks` processes under
/// `mpirun`, or, inside one of them, says so. Panics with the ranks' output when `mpirun`
/// fails (a rank failed, or the job ran past [`JOB_TIMEOUT_SECS`]).
pub fn on_ranks(test: &str, ranks: usize) -> RankRun {
    launch(test, ranks, true)
}

/// [`on_ranks`] for a test whose job must fail (a rank that dies on purpose): panics when
/// the job succeeds; returns the output of the failed job.
pub fn on_ranks_expecting_failure(test: &str, ranks: usize) -> RankRun {
    launch(test, ranks, false)
}

fn launch(test: &str, ranks: usize, expect_success: bool) -> RankRun {
    if std::env::var_os(RANK_TEST_VARIABLE).is_some() {
        return RankRun::Rank;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        return RankRun::Skipped(
            "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)".into(),
        );
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new("mpirun")
        .args(["-np", &ranks.to_string(), "--oversubscribe"])
        .args(["--timeout", &JOB_TIMEOUT_SECS.to_string()])
        .args(["--mca", "btl", "self,vader"])
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(RANK_TEST_VARIABLE, "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .output()
        .expect("mpirun starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.success(),
        expect_success,
        "mpirun -np {ranks} {test} ended with {}:\n{text}",
        out.status
    );
    RankRun::Started(text)
}

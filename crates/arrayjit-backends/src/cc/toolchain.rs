//! The C compiler as a command (its identity, runs under a timeout) and the CPU's identity
//! for `-march=native` code.

use std::collections::HashMap;
use std::fs;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use arrayjit_ir::{Error, Result};

pub(super) fn unavailable(compiler: &str, reason: String) -> Error {
    Error::BackendUnavailable {
        backend: "cc".into(),
        reason,
        how_to_enable: format!(
            "install a C compiler (e.g. `apt-get install gcc`) or point CC at one (CC is `{compiler}`)"
        ),
    }
}

/// The compiler as a command: `CC` may hold a wrapper or arguments (`ccache gcc`,
/// `gcc -std=gnu11`), split on whitespace as make and the `cc` crate do.
pub(super) fn compiler_command(compiler: &str) -> Command {
    let mut parts = compiler.split_whitespace();
    let mut cmd = Command::new(parts.next().unwrap_or("cc"));
    cmd.args(parts);
    cmd
}

/// The first line of `compiler --version`, cached per compiler; an error if it cannot run.
pub(super) fn compiler_identity(compiler: &str, timeout: Duration) -> Result<String> {
    static IDS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let ids = IDS.get_or_init(Default::default);
    if let Some(id) = ids.lock().unwrap_or_else(|e| e.into_inner()).get(compiler) {
        return Ok(id.clone());
    }
    let mut cmd = compiler_command(compiler);
    cmd.arg("--version");
    let out = run_with_timeout(cmd, timeout).map_err(|e| {
        unavailable(
            compiler,
            format!("the C compiler `{compiler} --version` could not be run: {e}"),
        )
    })?;
    if !out.status.success() {
        return Err(unavailable(
            compiler,
            format!("`{compiler} --version` failed with {}", out.status),
        ));
    }
    let id = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    ids.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(compiler.to_string(), id.clone());
    Ok(id)
}

/// What identifies this CPU for `-march=native` code: model and feature flags.
pub(super) fn cpu_identity() -> &'static str {
    static CPU: OnceLock<String> = OnceLock::new();
    CPU.get_or_init(|| {
        let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        format!(
            "{} | {} | {}",
            std::env::consts::ARCH,
            field("model name"),
            field("flags")
        )
    })
}

/// Runs `cmd` with its output captured; kills it and returns a `TimedOut` error if it runs
/// longer than `timeout`.
pub(super) fn run_with_timeout(mut cmd: Command, timeout: Duration) -> std::io::Result<Output> {
    use std::io::Read as _;
    use std::os::unix::process::CommandExt as _;
    // A process group of its own, so that a timeout kills the compiler's children too (they
    // would otherwise keep its pipes open).
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A compiler (or wrapper script) written just now can be briefly "busy" (ETXTBSY) while
    // another thread of the process forks with the file's write descriptor still inherited
    // (it closes at that child's exec): retry for a moment instead of failing.
    let mut attempts = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other?,
        }
    };
    // Drain both pipes on threads, so a chatty compiler cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= timeout {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill has no memory-safety preconditions; the group is the child's own.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "killed after {:.0} s (the timeout; set ARRAYJIT_CC_TIMEOUT_SECS to change it)",
                    timeout.as_secs_f64()
                ),
            ));
        }
        std::thread::sleep(
            Duration::from_millis(2)
                .max(started.elapsed() / 50)
                .min(Duration::from_millis(50)),
        );
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

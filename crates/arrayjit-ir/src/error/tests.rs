//! The error type's messages, chains and diagnostics.

use super::*;

fn not_found() -> Result<()> {
    Err(Error::NotHosted {
        node: "w".into(),
        detail: "reading it".into(),
    })
}

#[test]
fn context_chains_keep_the_error_and_say_what_was_done() {
    let e = not_found()
        .context(|| "loading the step")
        .context(|| format!("training epoch {}", 3))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "training epoch 3: loading the step: tensor node w has no host array: reading it"
    );
    assert!(matches!(e.root_cause(), Error::NotHosted { .. }));
    assert_eq!(e.contexts(), vec!["training epoch 3", "loading the step"]);
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.starts_with("loading the step: "), "{source}");
    // Under a task failure too.
    let task = Error::TaskFailed {
        stream: "cc:0/stream 1".into(),
        task: "#2 (routine step)".into(),
        source: std::sync::Arc::new(e),
    };
    assert!(matches!(task.root_cause(), Error::NotHosted { .. }));
    assert_eq!(
        task.contexts(),
        vec![
            "task #2 (routine step) on cc:0/stream 1",
            "training epoch 3",
            "loading the step"
        ]
    );
    // Success passes through without calling the context.
    let ok: Result<u8> = Ok(1);
    assert_eq!(ok.context(|| -> String { unreachable!() }).unwrap(), 1);
}

#[test]
fn compiler_diagnostics_are_parsed_from_gcc_and_clang_output() {
    let failure = CompileFailure {
        routine: "r".into(),
        command: "cc".into(),
        status: "1".into(),
        source_path: "/tmp/k.c".into(),
        stderr: "/tmp/k.c: In function 'aj0_r':\n\
                 /tmp/k.c:12:5: error: 'x' undeclared (first use in this function)\n   \
                 12 |     x = 1;\n      |     ^\n\
                 /tmp/k.c:3: warning: unused variable\n\
                 <command-line>: fatal error: missing.h: No such file or directory\n\
                 cc1: note: some note"
            .into(),
    };
    let d = failure.diagnostics();
    assert_eq!(d.len(), 4, "{d:?}");
    assert_eq!(
        d[0],
        Diagnostic {
            file: "/tmp/k.c".into(),
            line: Some(12),
            column: Some(5),
            severity: "error".into(),
            message: "'x' undeclared (first use in this function)".into(),
        }
    );
    assert_eq!((d[1].line, d[1].column), (Some(3), None));
    assert_eq!(d[1].severity, "warning");
    assert_eq!(d[2].file, "<command-line>");
    assert_eq!(d[2].severity, "fatal error");
    assert_eq!(d[2].line, None);
    assert_eq!(d[3].severity, "note");
}

#[test]
fn limit_errors_carry_the_limit_as_data() {
    let e = Error::limit_exceeded(
        "wgpu:0 (llvmpipe)",
        "kernel k",
        DeviceLimit::BlockExtent(2),
        128,
        64,
        "launch smaller blocks",
    );
    assert_eq!(
        e.to_string(),
        "kernel k needs 128 threads along axis 2 of a block, but wgpu:0 (llvmpipe) allows \
         at most 64; launch smaller blocks"
    );
    assert!(matches!(
        e,
        Error::LimitExceeded {
            limit: DeviceLimit::BlockExtent(2),
            needed: 128,
            allowed: 64,
            ..
        }
    ));
}

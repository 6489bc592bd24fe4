//! The product helper's benchmark harnesses (`benches/gemm/shapes.c`, `attention.c`, which
//! `scripts/gemm-blocking.sh` runs) still compile and link against the helper this crate
//! generates: they declare `gemm_entry` themselves, so a change of the helper's signature or of
//! `aj_par` would otherwise only show when someone next measures.

use std::path::{Path, PathBuf};
use std::process::Command;

use arrayjit_codegen::c::gemm::standalone_unit;
use arrayjit_ir::Prec;
use arrayjit_opt::schedule::{Blocking, StreamFetch};

fn compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn harnesses_link_with_the_generated_helper() {
    let benches: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/gemm");
    let dir = std::env::temp_dir().join(format!("aj-gemm-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let helper = dir.join("helper.c");
    let blocking = Blocking {
        mr: 4,
        nr: 8,
        mc: 64,
        kc: 32,
        nc: 64,
        stream_fetch: StreamFetch::L2,
    };
    std::fs::write(&helper, standalone_unit(Prec::F32, &blocking)).unwrap();
    let object = dir.join("helper.o");
    // The backends' flags without -march=native: the unit must build wherever the tests run.
    run(Command::new(compiler())
        .args(["-O1", "-fno-math-errno", "-ffp-contract=off", "-c"])
        .arg(&helper)
        .arg("-o")
        .arg(&object));
    for harness in ["shapes.c", "attention.c"] {
        run(Command::new(compiler())
            .args(["-O1", "-Wall", "-Werror"])
            .arg(benches.join(harness))
            .arg(&object)
            .arg("-o")
            .arg(dir.join(harness.trim_end_matches(".c")))
            .arg("-lpthread"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

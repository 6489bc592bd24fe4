//! Regression tests for the compile cache and the compiler driver (reliability issue, items
//! 12–19): damaged, planted or replaced libraries are never loaded, concurrent trimming cannot
//! break loading, a hanging compiler times out, unusable folders fall back, kernel symbols are
//! unique, and errors say what happened. Item 20: a translation unit shared by libraries (the
//! product helper) is compiled once, and damaged or planted cached objects are never linked.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrayjit::Error;
use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::prelude::*;

fn cc_backend(config: CcConfig) -> Backend {
    Backend::from_lowered("sync_cc", Arc::new(cc::backend(config).unwrap()))
}

fn config_in(dir: &Path) -> CcConfig {
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(dir.join("cache"));
    config.build_files_dir = None;
    config
}

/// Compiles and runs `y = op(x)` for x = [0, 1, 2, 3]; returns y.
fn run_unop(b: &Backend, name: &str, op: UnOp) -> Result<Vec<f64>, Error> {
    let x = Tnode::new(Prec::F32, &[4], &["x"])?;
    x.host().set_values(&[0.0, 1.0, 2.0, 3.0])?;
    let y = Tnode::new(Prec::F32, &[4], &["y"])?;
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")?;
    let code = b.compile(CompileRequest::routine(
        name,
        &Assignments::pointwise_unop(&y, op, &x),
    ))?;
    let stream = b.get_device(0)?.new_stream()?;
    let r = Context::new(&stream).link(&code)?;
    r.run()?;
    y.host().get_values()
}

fn libraries(cache: &Path) -> Vec<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .collect();
    libs.sort();
    libs
}

/// A library whose constructor creates `marker`: what an attacker would plant.
fn hostile_library(dir: &Path, marker: &Path) -> PathBuf {
    hostile_build(dir, marker, "evil.so", "-shared")
}

/// Compiles code whose constructor creates `marker` into `dir/name`, a library (`kind`
/// `-shared`) or an object (`-c`) that a library linked with it would run.
fn hostile_build(dir: &Path, marker: &Path, name: &str, kind: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {{ \
             FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n\
             void aj0_victim(void **a, const long *s) {{ (void)a; (void)s; }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let out = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = std::process::Command::new(cc)
        .args([kind, "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
    out
}

#[test]
fn item12_a_truncated_cached_library_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let b = cc_backend(config_in(dir.path()));
    assert_eq!(
        run_unop(&b, "trunc", UnOp::Neg).unwrap(),
        [0.0, -1.0, -2.0, -3.0]
    );
    let libs = libraries(&dir.path().join("cache"));
    assert_eq!(libs.len(), 1);
    let full = std::fs::metadata(&libs[0]).unwrap().len();
    for size in [0, 1000, 4000, full - 1] {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&libs[0])
            .unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let b = cc_backend(config_in(dir.path()));
        assert_eq!(
            run_unop(&b, "trunc", UnOp::Neg).unwrap(),
            [0.0, -1.0, -2.0, -3.0]
        );
        // The damaged entry was replaced by a good one.
        assert_eq!(std::fs::metadata(&libs[0]).unwrap().len(), full);
    }
}

#[test]
fn item13_a_planted_symlink_in_the_cache_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("constructor-ran");
    let evil = hostile_library(dir.path(), &marker);
    let b = cc_backend(config_in(dir.path()));
    run_unop(&b, "victim", UnOp::Abs).unwrap();
    let libs = libraries(&dir.path().join("cache"));
    std::fs::remove_file(&libs[0]).unwrap();
    std::os::unix::fs::symlink(&evil, &libs[0]).unwrap();
    let b = cc_backend(config_in(dir.path()));
    assert_eq!(
        run_unop(&b, "victim", UnOp::Abs).unwrap(),
        [0.0, 1.0, 2.0, 3.0]
    );
    assert!(!marker.exists(), "the planted library's constructor ran");
    // The link was replaced by a real library.
    assert!(!std::fs::symlink_metadata(&libs[0]).unwrap().is_symlink());
}

#[test]
fn item14_a_replaced_library_is_recompiled_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("constructor-ran");
    let evil = hostile_library(dir.path(), &marker);
    let b = cc_backend(config_in(dir.path()));
    run_unop(&b, "victim", UnOp::Exp).unwrap();
    run_unop(&b, "other", UnOp::Neg).unwrap();
    let libs = libraries(&dir.path().join("cache"));
    assert_eq!(libs.len(), 2);
    // A genuine cache entry of another key under the second one ...
    std::fs::write(&libs[1], std::fs::read(&libs[0]).unwrap()).unwrap();
    // ... and another valid library under the first (a copy, this user's, private mode).
    std::fs::copy(&evil, &libs[0]).unwrap();
    std::fs::set_permissions(&libs[0], std::fs::Permissions::from_mode(0o600)).unwrap();
    let b = cc_backend(config_in(dir.path()));
    let want_exp: Vec<f64> = (0..4).map(|i| (i as f32).exp() as f64).collect();
    assert_eq!(run_unop(&b, "victim", UnOp::Exp).unwrap(), want_exp);
    assert_eq!(
        run_unop(&b, "other", UnOp::Neg).unwrap(),
        [0.0, -1.0, -2.0, -3.0]
    );
    assert!(!marker.exists(), "a replaced library was loaded");
}

#[test]
fn item15_concurrent_trimming_cannot_break_loading() {
    let dir = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mut config = config_in(dir.path());
            config.cache_max_bytes = 0; // every new library trims all the others
            std::thread::spawn(move || {
                let b = cc_backend(config);
                for (i, op) in [UnOp::Neg, UnOp::Exp, UnOp::Sqrt, UnOp::Abs, UnOp::Relu]
                    .into_iter()
                    .enumerate()
                {
                    run_unop(&b, &format!("trim_t{t}_{i}"), op).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[test]
fn item16_a_hanging_compiler_times_out() {
    let dir = tempfile::tempdir().unwrap();
    // Hangs even on --version: the backend reports itself unavailable, naming the command.
    let mut config = config_in(dir.path());
    config.compiler = script(dir.path(), "hang-always", "sleep 60");
    config.compile_timeout = Duration::from_millis(500);
    let started = std::time::Instant::now();
    let err = cc_backend(config).check_available().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("hang-always"), "{err}");
    assert!(
        err.to_string().contains("ARRAYJIT_CC_TIMEOUT_SECS"),
        "{err}"
    );
    // Answers --version, hangs compiling (with a child holding its pipes).
    let mut config = config_in(dir.path());
    config.compiler = script(
        dir.path(),
        "hang-compiling",
        "if [ \"$1\" = --version ]; then echo fake-cc 1.0; exit 0; fi\nsleep 60 & sleep 60",
    );
    config.compile_timeout = Duration::from_millis(500);
    let started = std::time::Instant::now();
    let err = run_unop(&cc_backend(config), "hang", UnOp::Neg).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let Error::CompileFailed(f) = &err else {
        panic!("expected CompileFailed, got {err}")
    };
    assert!(f.status.contains("killed after"), "{err}");
    assert!(f.command.contains("hang-compiling"), "{err}");
}

#[test]
fn item17_unusable_folders_fall_back_and_failed_builds_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // An invalid build-files folder does not fail compiles.
    let mut config = config_in(dir.path());
    config.build_files_dir = Some(file.join("build"));
    assert_eq!(
        run_unop(&cc_backend(config), "fallback", UnOp::Neg).unwrap(),
        [0.0, -1.0, -2.0, -3.0]
    );
    // A failed build leaves no build folder behind; its source is kept in the cache's
    // private `failed` folder.
    let mut config = config_in(dir.path());
    config.flags.push("-DARRAYJIT_TEST_FAILURE=(".into());
    config.flags.push("-include".into());
    config.flags.push("/nonexistent/missing.h".into());
    let err = run_unop(&cc_backend(config), "doomed", UnOp::Neg).unwrap_err();
    let Error::CompileFailed(f) = &err else {
        panic!("expected CompileFailed, got {err}")
    };
    assert!(f.source_path.contains("failed"), "{}", f.source_path);
    assert!(
        std::fs::read_to_string(&f.source_path)
            .unwrap()
            .contains("aj0_doomed")
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("arrayjit-build-")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn item18_kernel_symbols_are_unique_by_construction() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let x = Tnode::new(Prec::F32, &[2], &["x"]).unwrap();
    x.host().set_values(&[1.0, -2.0]).unwrap();
    let outs: Vec<Tnode> = (0..4)
        .map(|i| {
            let y = Tnode::new(Prec::F32, &[2], &[&format!("y{i}")]).unwrap();
            y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                .unwrap();
            y
        })
        .collect();
    let ops = [UnOp::Neg, UnOp::Abs, UnOp::Relu, UnOp::Identity];
    let progs: Vec<Assignments> = outs
        .iter()
        .zip(ops)
        .map(|(y, op)| Assignments::pointwise_unop(y, op, &x))
        .collect();
    let names = ["x", "x", "x_1", "relu_f32"];
    let batch: Vec<(&str, &Assignments)> = names.iter().copied().zip(progs.iter()).collect();
    let codes = b.compile(CompileRequest::batch(&batch)).unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let mut ctx = Context::new(&stream);
    for code in &codes {
        let r = ctx.link(code).unwrap();
        r.run().unwrap();
        ctx = r.context().clone();
    }
    let want = [[-1.0, 2.0], [1.0, 2.0], [1.0, 0.0], [1.0, -2.0]];
    for (y, w) in outs.iter().zip(want) {
        assert_eq!(y.host().get_values().unwrap(), w);
    }
}

#[test]
fn item19_errors_carry_the_loader_and_compiler_text() {
    let dir = tempfile::tempdir().unwrap();
    // A "library" that is an object file: the loader's own message reaches the error.
    let mut config = config_in(dir.path());
    config.flags = vec!["-O1".into(), "-fPIC".into(), "-c".into()];
    let err = run_unop(&cc_backend(config), "object", UnOp::Neg).unwrap_err();
    assert!(matches!(err, Error::LoadFailed { .. }), "{err}");
    assert!(err.to_string().contains("ET_DYN"), "{err}");
    // A compiler that succeeds without writing anything.
    let mut config = config_in(dir.path());
    config.compiler = script(dir.path(), "lazy-cc", "exit 0");
    let err = run_unop(&cc_backend(config), "lazy", UnOp::Neg).unwrap_err();
    assert!(err.to_string().contains("wrote no library"), "{err}");
    // 4 MB of compiler output: the error keeps the head and tail and says where the rest is.
    let mut config = config_in(dir.path());
    config.compiler = script(
        dir.path(),
        "chatty-cc",
        "if [ \"$1\" = --version ]; then echo chatty 1; exit 0; fi\n\
         head -c 4000000 /dev/zero | tr '\\0' 'e' >&2; echo END-OF-OUTPUT >&2; exit 1",
    );
    let err = run_unop(&cc_backend(config), "chatty", UnOp::Neg).unwrap_err();
    let Error::CompileFailed(f) = &err else {
        panic!("expected CompileFailed, got {err}")
    };
    assert!(f.stderr.len() < 40_000, "{} bytes", f.stderr.len());
    assert!(f.stderr.contains("END-OF-OUTPUT"), "the tail is kept");
    let rest = f.stderr.split("all of it is in ").nth(1).unwrap();
    let rest = rest.split(" ...").next().unwrap();
    assert!(std::fs::metadata(rest).unwrap().len() > 4_000_000);
}

/// Files of the cache folder with the extension `ext`, sorted.
fn cached_files(cache: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

#[test]
fn item20_a_unit_shared_by_libraries_is_compiled_once_and_damaged_objects_are_not_linked() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let n = 64;
    // `c = a · b` compiled under `name` (a library of its own: the name is in its kernel's
    // symbol) and run; the product runs in the CPU's product helper, a unit of its own.
    let product = |name: &str| -> Vec<f64> {
        let b = cc_backend(config_in(dir.path()));
        let (case, _, _, c) = arrayjit_testing::matmul(n).unwrap();
        let code = b
            .compile(CompileRequest::routine(name, &case.program))
            .unwrap();
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let r = Context::new(&stream).link(&code).unwrap();
        r.run().unwrap();
        r.context().to_host(&c).unwrap();
        c.host().get_values().unwrap()
    };
    // The same entries as `arrayjit_testing::matmul` makes, multiplied by hand.
    let a = |i: usize, k: usize| ((i + k) % 7) as f64 - 3.0;
    let b = |k: usize, j: usize| ((k * j) % 5) as f64 - 2.0;
    let want: Vec<f64> = (0..n * n)
        .map(|p| (0..n).map(|k| a(p / n, k) * b(k, p % n)).sum())
        .collect();
    assert_eq!(product("shared_first"), want);
    let objects = cached_files(&cache, "o");
    assert!(
        objects.len() >= 2,
        "the kernels' unit and the helper's: {objects:?}"
    );
    // The helper's object: it defines the product helper and no routine's kernel.
    let helper: Vec<&PathBuf> = objects
        .iter()
        .filter(|o| {
            let text = String::from_utf8_lossy(&std::fs::read(o).unwrap()).into_owned();
            text.contains("aj_gemm") && !text.contains("aj0_")
        })
        .collect();
    let [helper] = helper[..] else {
        panic!("one product helper object expected: {objects:?}")
    };
    let size = std::fs::metadata(helper).unwrap().len();

    // Another library with the same helper: its object comes from the cache.
    let before = cc::compile_stats();
    assert_eq!(product("shared_second"), want);
    let after = cc::compile_stats();
    assert!(
        after.object_hits > before.object_hits,
        "{before:?} -> {after:?}"
    );
    assert_eq!(cached_files(&cache, "so").len(), 2);

    // The cached helper damaged (truncated), then replaced by a link to a hostile object
    // whose constructor would run when a library linked with it is loaded: neither is
    // linked, the helper is compiled anew and the entry replaced by a sound one.
    let marker = dir.path().join("constructor-ran");
    let evil = hostile_build(dir.path(), &marker, "evil_object.o", "-c");
    let damages: [(&str, &dyn Fn()); 2] = [
        ("shared_truncated", &|| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(helper)
                .unwrap();
            f.set_len(size / 2).unwrap();
        }),
        ("shared_planted", &|| {
            std::fs::remove_file(helper).unwrap();
            std::os::unix::fs::symlink(&evil, helper).unwrap();
        }),
    ];
    for (name, damage) in damages {
        damage();
        let before = cc::compile_stats();
        assert_eq!(product(name), want, "{name}");
        let after = cc::compile_stats();
        assert_eq!(
            after.object_hits, before.object_hits,
            "{name}: a damaged object was linked"
        );
        assert!(
            !marker.exists(),
            "{name}: the planted object's constructor ran"
        );
        // Replaced by the new object (whose file name, kept in it, may differ in length).
        let meta = std::fs::symlink_metadata(helper).unwrap();
        assert!(!meta.is_symlink(), "{name}");
        assert!(
            meta.len() > size / 2 + 64,
            "{name}: the entry was not replaced"
        );
    }
    // The replaced entry is sound: the next library links it.
    let before = cc::compile_stats();
    assert_eq!(product("shared_repaired"), want);
    assert!(cc::compile_stats().object_hits > before.object_hits);
}

/// The C backends' counters reach users through the seam (`LoweredBackend::compile_stats`):
/// every cc backend answers with the process's counters, which a build moves; a backend whose
/// compiler does not count answers `None`.
#[test]
fn compile_counters_are_asked_through_the_seam() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let before = backend.lowered().compile_stats().unwrap();
    assert_eq!(
        run_unop(&backend, "counted", UnOp::Neg).unwrap(),
        [0.0, -1.0, -2.0, -3.0]
    );
    let after = backend.lowered().compile_stats().unwrap();
    assert!(after.compiled + after.cache_hits > before.compiled + before.cache_hits);
    let missing = arrayjit::backends::missing::backend("nowhere", "not here", "nothing to do");
    assert_eq!(missing.compile_stats(), None);
}

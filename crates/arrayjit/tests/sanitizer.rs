//! The AddressSanitizer mode of CI (reliability issue): generated kernels built with
//! `-fsanitize=address` and pools with poisoned guards between arrays. This test proves the mode
//! works: a kernel that writes one element past its array — code the bounds verifier would
//! refuse, built here by hand below the optimizer — must be stopped by the sanitizer inside
//! the pool, where arrays share one allocation. Outside that mode it says it skipped, unless
//! `ARRAYJIT_EXPECT_ASAN` demands the mode (as CI's sanitizer step does).

use std::process::Command;
use std::sync::Arc;

use arrayjit::backends::LaunchRequest;
use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::ir::{AxisIndex, LowLevel, ScalarExpr, Symbol};
use arrayjit::opt::Optimized;
use arrayjit::opt::optimize::{MemoryPlan, NodeRole, PlanItem};
use arrayjit::prelude::*;

const CHILD: &str = "ARRAYJIT_SANITIZER_CHILD";

/// In the child process: a pool of two guarded `[4]` f32 arrays, and a kernel writing `a[0..5]`.
fn write_past_an_array() {
    let backend = cc::backend(CcConfig::from_env().unwrap()).unwrap();
    assert!(
        backend.runtime().pool_guard_bytes() > 0,
        "run with ARRAYJIT_POOL_GUARD_BYTES"
    );
    let a = Tnode::new(Prec::F32, &[4], &["a"]).unwrap();
    let b = Tnode::new(Prec::F32, &[4], &["b"]).unwrap();
    let items: Vec<PlanItem> = [&a, &b]
        .iter()
        .map(|tn| PlanItem {
            node: (*tn).clone(),
            size: 16,
            lifetime: None,
        })
        .collect();
    let plan = MemoryPlan::pack_guarded(&items, 16, 1 << 20, backend.runtime().pool_guard_bytes())
        .unwrap();
    backend
        .runtime()
        .alloc_pool(0, 0, plan.pool_sizes[0], 16)
        .unwrap();
    assert!(
        backend
            .runtime()
            .guard_pool(0, 0, &plan.unused_ranges(0))
            .unwrap()
    );
    let slot = plan.slot(&a).unwrap();
    let view = backend
        .runtime()
        .pool_view(0, 0, slot.offset, slot.size)
        .unwrap();
    let i = Symbol::fresh();
    let code = LowLevel::For {
        index: i,
        from: 0,
        to: 5,
        body: Box::new(LowLevel::Set {
            tn: a.clone(),
            idcs: vec![AxisIndex::Iterator(i)],
            value: ScalarExpr::Constant(1.0),
        }),
    };
    let optimized = Optimized {
        name: "past_the_end".into(),
        code,
        bindings: vec![],
        nodes: vec![NodeRole {
            tn: a.clone(),
            input: false,
            written: true,
            used: true,
        }],
        merge_node: None,
        scratch: MemoryPlan::default(),
        schedules: vec![],
        joined: vec![],
        light_kernel: false,
        profile_statements: false,
    };
    a.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
        .unwrap();
    let program = backend.render(&[&optimized]).unwrap();
    let batch = backend.compile(program).unwrap();
    // SAFETY: the test's own buffers, one call at a time.
    let _ = unsafe { batch.launch(LaunchRequest::new(0, &[Arc::clone(&view)], &[])) };
    println!("the write past the array was not caught");
}

#[test]
fn an_out_of_bounds_write_in_generated_code_is_caught_in_sanitizer_mode() {
    if std::env::var_os(CHILD).is_some() {
        write_past_an_array();
        return;
    }
    if !arrayjit::backends::cpu::sanitizer::asan_loaded() {
        assert!(
            std::env::var_os("ARRAYJIT_EXPECT_ASAN").is_none(),
            "ARRAYJIT_EXPECT_ASAN is set but the AddressSanitizer runtime is not loaded"
        );
        eprintln!("skipped: the AddressSanitizer runtime is not loaded (see .ci/run)");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_out_of_bounds_write_in_generated_code_is_caught_in_sanitizer_mode",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the child succeeded:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("AddressSanitizer") && stderr.contains("use-after-poison"),
        "{stderr}"
    );
    assert!(
        stderr.contains("past_the_end"),
        "the report names the kernel: {stderr}"
    );
}

//! A routine compiled to time its statements reports each top-level statement's time, calls
//! and work, resets its counters when read, and computes what it computed before.

mod common;

use arrayjit::prelude::*;
use arrayjit::runtime::StatementProfile;

/// `c = a · b` (a blocked product) then `d = relu(c)` (loops), with the expected `d`.
fn program(m: usize, k: usize, n: usize) -> (Assignments, Tnode, Vec<f64>) {
    let c = Tnode::new(Prec::F32, &[m, n], &["c"]).unwrap();
    c.update_memory_mode(MemoryMode::OnDevice(Sharing::Unset), "test: kept")
        .unwrap();
    let d = common::hosted_output(&[m, n], "d");
    let (product, c_values) = common::product_into(&c, m, k, n);
    let relu = Assignments::einsum(
        "ij->ij",
        BinOp::Add,
        &d,
        AccumRhs::Unop(UnOp::Relu, Operand::Node(c)),
        true,
    )
    .unwrap();
    let expected = c_values.into_iter().map(|v| v.max(0.0)).collect();
    (product.then(relu), d, expected)
}

/// Compiles and links the program on `sync_cc`, statements timed or not.
fn linked(profile: bool) -> (Stream, Routine, Tnode, Vec<f64>) {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let mut settings = backend.optimize_settings();
    settings.profile_statements = profile;
    backend.set_optimize_settings(settings);
    let (program, d, expected) = program(40, 96, 72);
    let code = backend
        .compile(CompileRequest::routine("profiled", &program))
        .unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    (stream, routine, d, expected)
}

#[test]
fn each_statement_reports_its_time_calls_and_work() {
    let (stream, routine, d, expected) = linked(true);
    for _ in 0..3 {
        routine.run().unwrap();
    }
    stream.await_work().unwrap();
    assert_eq!(d.host().get_values().unwrap(), expected);
    let profile: StatementProfile = routine.statement_profile().expect("a timed kernel");
    let text = profile.to_string();
    assert_eq!(profile.routine, "profiled", "{text}");
    let product = profile
        .statements
        .iter()
        .find(|s| s.kind.starts_with("product"))
        .unwrap_or_else(|| panic!("no product in {profile:?}"));
    assert_eq!(product.flops, 2 * 40 * 96 * 72);
    assert_eq!(product.bytes, 4 * (40 * 96 + 96 * 72 + 40 * 72));
    assert!(product.writes.contains('c'), "{profile:?}");
    for s in &profile.statements {
        assert_eq!(s.calls, 3, "{profile:?}");
        assert!(s.nanos > 0, "{profile:?}");
        assert!(s.fraction_of_limit(1e9, 1e9) > 0.0);
    }
    assert!(profile.total_nanos() >= product.nanos);
    assert!(text.contains("slowest #"), "{text}");
    let table = profile.table(10, Some((1e11, 1e10)));
    assert_eq!(
        table.lines().count(),
        2 + profile.statements.len(),
        "{table}"
    );
    // Reading reset the counters: nothing ran since.
    let again = routine.statement_profile().unwrap();
    assert!(
        again
            .statements
            .iter()
            .all(|s| s.calls == 0 && s.nanos == 0)
    );
    assert!(again.to_string().contains("none ran"));
    routine.run().unwrap();
    stream.await_work().unwrap();
    let once = routine.statement_profile().unwrap();
    assert!(once.statements.iter().all(|s| s.calls == 1));
}

#[test]
fn an_untimed_routine_has_no_profile() {
    let (stream, routine, d, expected) = linked(false);
    routine.run().unwrap();
    stream.await_work().unwrap();
    assert_eq!(d.host().get_values().unwrap(), expected);
    assert!(routine.statement_profile().is_none());
}

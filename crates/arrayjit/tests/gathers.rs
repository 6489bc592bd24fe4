//! Gathers with ids computed in code, out of range: the interpreter reports the id as an
//! error, and every compiled backend reads NaN for it (never memory outside the table) while
//! the valid ids around it read their rows.

use arrayjit::ir::{Assignments, Error, FetchOp, InterpEnv, MemoryMode, MemoryType, Prec, Tnode};
use arrayjit::runtime::{CompileRequest, Context};

/// `out = take(table, ids)` where `ids = raw + 0` is computed in the routine (so no entry
/// check sees it): ids -1, 4 (one past the end), NaN (0/0), a huge value, then the valid 1.
fn program() -> (Assignments, Tnode) {
    let table = Tnode::new(Prec::F32, &[4, 2], &["table"]).unwrap();
    table
        .host()
        .set_values(&[10.0, 11.0, 20.0, 21.0, 30.0, 31.0, 40.0, 41.0])
        .unwrap();
    let raw = Tnode::new(Prec::F32, &[5], &["raw"]).unwrap();
    raw.host()
        .set_values(&[-1.0, 4.0, f64::NAN, 3e9, 1.0])
        .unwrap();
    let zero = Tnode::new(Prec::F32, &[5], &["zero"]).unwrap();
    zero.host().set_values(&[0.0; 5]).unwrap();
    let ids = Tnode::new(Prec::F32, &[5], &["ids"]).unwrap();
    let out = Tnode::new(Prec::F32, &[5, 2], &["out"]).unwrap();
    out.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
        .unwrap();
    let program = Assignments::pointwise_binop(&ids, arrayjit::ir::BinOp::Add, &raw, &zero).then(
        Assignments::Fetch {
            array: out.clone(),
            op: FetchOp::Gather {
                table,
                ids,
                axis: 0,
            },
        },
    );
    (program, out)
}

#[test]
fn the_interpreter_reports_an_out_of_range_id() {
    let (program, _) = program();
    let code = program.lower(&[]).unwrap();
    let mut env = InterpEnv::from_host_arrays(&code);
    let err = env.run(&code, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfBounds {
                problem: arrayjit::ir::OutOfBounds::Id { table: 4, .. },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn compiled_backends_read_nan_for_out_of_range_ids() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let (program, out) = program();
        let code = backend
            .compile(CompileRequest::routine("bad_ids", &program))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host(&out).unwrap();
        let got = out.host().get_values().unwrap();
        let name = backend.name();
        assert!(
            got[..8].iter().all(|v| v.is_nan()),
            "{name}: out-of-range ids must read NaN, got {got:?}"
        );
        assert_eq!(
            &got[8..],
            &[20.0, 21.0],
            "{name}: the valid id reads its row"
        );
    }
}

#[test]
fn a_gather_of_a_mismatched_shape_is_a_shape_error() {
    let table = Tnode::new(Prec::F32, &[4, 2], &["table"]).unwrap();
    let ids = Tnode::new(Prec::I32, &[3], &["ids"]).unwrap();
    let out = Tnode::new(Prec::F32, &[2, 2], &["out"]).unwrap();
    let program = Assignments::Fetch {
        array: out,
        op: FetchOp::Gather {
            table,
            ids,
            axis: 0,
        },
    };
    let err = program.lower(&[]).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("[3, 2]"), "{err}");
}

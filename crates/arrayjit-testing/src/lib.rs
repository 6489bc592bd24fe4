//! arrayjit-testing: the shared differential test corpus. Programs run on a backend and are
//! compared with the reference interpreter (exact for integers, a relative tolerance for
//! floats). Every backend runs the same corpus; a new backend is correct when it agrees here.
//! [`all_backends_under_test`] says which backends a test run covers
//! (`ARRAYJIT_REQUIRE_BACKENDS` names the ones that must not be skipped).

#![warn(missing_docs)]
// `Tnode` hashes and orders by its id, which never changes; its interior mutability (memory
// mode, host array) does not affect map keys.
#![allow(clippy::mutable_key_type)]

mod attention;
mod case;
mod cases;
mod contractions;
mod fusion;
mod gathers;
mod gpu_shapes;
mod guarded;
mod matrix_products;
mod random;
mod required;
mod simt_products;
mod widened;

use arrayjit_ir::{Error, InterpEnv, Prec, Result};
use arrayjit_runtime::{Backend, CompileRequest, Context};

pub use attention::{attention_cases, attention_head_case};
pub use case::Case;
pub use cases::{matmul, scratch_locals};
pub use contractions::contraction_cases;
pub use fusion::fusion_cases;
pub use gpu_shapes::{gpu_shape_cases, long_product, long_product_in};
pub use guarded::guarded_cases;
pub use matrix_products::matrix_product_cases;
pub use required::{
    REQUIRE_BACKENDS_VAR, all_backends_under_test, backend_under_test, backends_under_test,
    parse_required, required_backends, skip_backend,
};
pub use simt_products::simt_product_cases;
pub use widened::widened_cases;

/// Every case of the corpus, freshly built (cases consume their initial host values).
pub fn all_cases() -> Result<Vec<Case>> {
    Ok(cases::basic_cases()?
        .into_iter()
        .chain(contractions::contraction_cases()?)
        .chain(fusion::fusion_cases()?)
        .chain(gathers::gather_cases()?)
        .chain(gpu_shapes::gpu_shape_cases()?)
        .chain(guarded::guarded_cases()?)
        .chain(matrix_products::matrix_product_cases()?)
        .chain(simt_products::simt_product_cases()?)
        .chain(random::random_cases()?)
        .chain(attention::attention_cases()?)
        .chain(widened::widened_cases()?)
        .collect())
}

/// Relative tolerance for comparing float results of a precision.
pub fn tolerance(prec: Prec) -> f64 {
    match prec {
        Prec::F64 => 1e-12,
        Prec::F32 => 2e-5,
        Prec::F16 => 2e-3,
        Prec::Bf16 => 1e-2,
        _ => 0.0,
    }
}

fn mismatch(case: &str, backend: &str, detail: String) -> Error {
    Error::Runtime {
        stream: backend.to_string(),
        detail: format!("conformance case {case}: {detail}"),
    }
}

/// Runs a case on the interpreter (unoptimized code) and on `backend`, and compares every
/// result. Consumes the case's initial host values: build a fresh case per backend.
pub fn check_case(case: &Case, backend: &Backend) -> Result<()> {
    // Reference first: the backend run writes results back to the host arrays.
    let (env, runs) = reference_runs(case)?;
    let code = backend
        .compile(CompileRequest::routine(&case.name, &case.program).bindings(&case.bindings))?;
    check_compiled(case, backend, &code, &env, &runs)
}

/// [`check_case`] for code of the case's program compiled another way (optimized with other
/// settings, or with its schedules changed): against the interpreter.
pub fn check_case_code(
    case: &Case,
    backend: &Backend,
    code: &arrayjit_runtime::Code,
) -> Result<()> {
    let (env, runs) = reference_runs(case)?;
    check_compiled(case, backend, code, &env, &runs)
}

/// The interpreter's run of every run of the case (one with no values if it lists none), and
/// those runs' static values.
fn reference_runs(case: &Case) -> Result<(InterpEnv, Vec<Vec<i64>>)> {
    let runs = if case.runs.is_empty() {
        vec![vec![]]
    } else {
        case.runs.clone()
    };
    let reference_code = case.program.lower(&case.bindings)?;
    let mut env = InterpEnv::from_host_arrays(&reference_code);
    for values in &runs {
        let statics: Vec<_> = case
            .bindings
            .iter()
            .map(|b| b.symbol)
            .zip(values.iter().copied())
            .collect();
        env.run(&reference_code, &statics)?;
    }
    Ok((env, runs))
}

fn check_compiled(
    case: &Case,
    backend: &Backend,
    code: &arrayjit_runtime::Code,
    env: &InterpEnv,
    runs: &[Vec<i64>],
) -> Result<()> {
    let stream = backend.get_device(0)?.new_stream()?;
    let routine = Context::new(&stream).link(code)?;
    for values in runs {
        for (b, &v) in case.bindings.iter().zip(values) {
            routine.set_static(b, v)?;
        }
        routine.run()?;
    }
    for tn in &case.results {
        routine.context().to_host(tn)?;
        let want = env.array(tn).ok_or_else(|| {
            mismatch(
                &case.name,
                backend.name(),
                format!("{} was never computed", tn),
            )
        })?;
        let got = tn.host().array()?;
        if tn.prec().is_integer() {
            if want.as_bytes() != got.as_bytes() {
                return Err(mismatch(
                    &case.name,
                    backend.name(),
                    format!("{tn}: expected {want}\ngot {got}"),
                ));
            }
            continue;
        }
        let tol = tolerance(tn.prec());
        for (i, (w, g)) in want.to_vec_f64()?.iter().zip(got.to_vec_f64()?).enumerate() {
            let same =
                (w.is_nan() && g.is_nan()) || w == &g || (w - g).abs() <= tol * (1.0 + w.abs());
            if !same {
                return Err(mismatch(
                    &case.name,
                    backend.name(),
                    format!(
                        "{tn} element {i}: expected {w}, got {g}\nC source:\n{}",
                        code.source()
                    ),
                ));
            }
        }
    }
    Ok(())
}

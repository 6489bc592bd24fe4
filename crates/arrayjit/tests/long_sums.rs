//! Long floating-point sums stay accurate (issue 40): 2^24 values of 0.1 in `f32`, summed whole
//! and along each axis on every backend, against the exact sum of the stored values. The C
//! backends and the GPU kernels sum long runs pairwise (`arrayjit_codegen`'s `c::pairwise` and
//! `gpu_kernel::pairwise` state the orders). A running `f32` sum of these values is off by 15%
//! (what the C backends computed for the inlined sum); the GPU kernels' strided shares were off
//! by 2.6e-4.

use arrayjit::ir::{MemoryMode, MemoryType, Prec};
use arrayjit::runtime::{CompileRequest, Context};
use arrayjit::tensor::{Tensor, forward_program};

fn worst_relative_error(got: &[f64], exact: f64) -> f64 {
    got.iter()
        .map(|g| (g - exact).abs() / exact)
        .fold(0.0, f64::max)
}

#[test]
fn long_f32_sums_are_accurate_on_every_backend() {
    let (rows, cols) = (4096usize, 4096usize);
    // The stored value: 0.1 rounded to f32; sums of it in f64 are exact here.
    let v = f64::from(0.1f32);
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let x = Tensor::full(Prec::F32, &[rows, cols], 0.1).unwrap();
        let y = x.scale(1.0).unwrap();
        let total = y.sum_all().unwrap();
        let columns = y.sum(&[0]).unwrap();
        let row_sums = y.sum(&[1]).unwrap();
        // A sum read by one statement only: the optimizer inlines it there as a local sum.
        let inlined = x.scale(2.0).unwrap().sum_all().unwrap().scale(0.5).unwrap();
        for t in [&total, &columns, &row_sums, &inlined] {
            t.node()
                .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                .unwrap();
        }
        let code = backend
            .compile(CompileRequest::routine(
                "long_sums",
                &forward_program(&[&total, &columns, &row_sums, &inlined]),
            ))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        let total = worst_relative_error(&total.values().unwrap(), v * (rows * cols) as f64);
        let inlined = worst_relative_error(&inlined.values().unwrap(), v * (rows * cols) as f64);
        let row_sums = worst_relative_error(&row_sums.values().unwrap(), v * cols as f64);
        let columns = worst_relative_error(&columns.values().unwrap(), v * rows as f64);
        eprintln!(
            "{name}: relative errors: total {total:e}, inlined {inlined:e}, rows {row_sums:e}, \
             columns {columns:e}"
        );
        // Pairwise: a few roundings of the result's size (f32's is 6e-8).
        assert!(total <= 2e-6, "{name}: total off by {total:e}");
        assert!(inlined <= 2e-6, "{name}: inlined total off by {inlined:e}");
        assert!(row_sums <= 2e-6, "{name}: row sums off by {row_sums:e}");
        // Along the outer axis too (the C backends add blocks of rows pairwise: `c::outer_sums`).
        let column_bound = 2e-6;
        assert!(
            columns <= column_bound,
            "{name}: column sums off by {columns:e}"
        );
    }
}

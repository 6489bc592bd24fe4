//! Long floating-point sums stay accurate (issue 40): a sum of 2^24 values of 0.1 in `f32`,
//! whole and along each axis, on every backend, against the exact sum of the stored values.

use arrayjit::ir::{MemoryMode, MemoryType, Prec};
use arrayjit::runtime::Context;
use arrayjit::tensor::{Tensor, forward_program};

#[test]
fn long_f32_sums_are_accurate_on_every_backend() {
    let (rows, cols) = (4096usize, 4096usize);
    // The stored value: 0.1 rounded to f32.
    let v = f64::from(0.1f32);
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let x = Tensor::full(Prec::F32, &[rows, cols], 0.1).unwrap();
        let y = x.scale(1.0).unwrap();
        let total = y.sum_all().unwrap();
        let columns = y.sum(&[0]).unwrap();
        let row_sums = y.sum(&[1]).unwrap();
        for t in [&total, &columns, &row_sums] {
            t.node()
                .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                .unwrap();
        }
        let code = backend
            .compile(
                "long_sums",
                &forward_program(&[&total, &columns, &row_sums]),
                &[],
            )
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        let exact = v * (rows * cols) as f64;
        let got = total.values().unwrap()[0];
        eprintln!(
            "{name}: total {got} exact {exact} rel {:e}",
            (got - exact).abs() / exact
        );
        let c = columns.values().unwrap();
        let worst_c = c
            .iter()
            .map(|g| (g - v * rows as f64).abs() / (v * rows as f64))
            .fold(0.0, f64::max);
        let r = row_sums.values().unwrap();
        let worst_r = r
            .iter()
            .map(|g| (g - v * cols as f64).abs() / (v * cols as f64))
            .fold(0.0, f64::max);
        eprintln!("{name}: columns rel {worst_c:e} rows rel {worst_r:e}");
    }
}

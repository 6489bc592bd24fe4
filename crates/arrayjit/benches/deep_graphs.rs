//! Deep graphs: optimizing a chain of `n` scalar additions (as the front end builds it: one
//! constant and one sum per step) must take time linear in `n`; the reliability issue's goal is a
//! 10,000-step chain in under a second. Run with `cargo bench -p arrayjit --bench deep_graphs`.

use std::hint::black_box;
use std::time::Duration;

use arrayjit::opt::optimize::optimize;
use arrayjit::prelude::*;
use arrayjit::tensor::{Tensor, forward_program};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn add_chain(n: usize) -> Tensor {
    let mut t = Tensor::input(Prec::F32, &[4], "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    for _ in 0..n {
        t = t.add_scalar(1.0).unwrap();
    }
    t
}

fn optimize_chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("optimize an add_scalar chain");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for n in [100usize, 1_000, 10_000] {
        let t = add_chain(n);
        let program = forward_program(&[&t]);
        group.bench_with_input(BenchmarkId::from_parameter(n), &program, |b, program| {
            b.iter(|| black_box(optimize("deep", &[], program, &Default::default()).unwrap()))
        });
    }
    group.finish();
}

fn drop_chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("drop a detach chain");
    group.sample_size(10);
    let n = 1_000_000;
    group.bench_function(BenchmarkId::from_parameter(n), |b| {
        b.iter_batched(
            || {
                let mut t = Tensor::input(Prec::F32, &[1], "x", &[1.0]).unwrap();
                for _ in 0..n {
                    t = t.detach();
                }
                t
            },
            drop,
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, optimize_chains, drop_chains);
criterion_main!(benches);

//! Step time of the benchmark suite's MLP (784-256-256-10, batch 256, f32, SGD) trained across
//! the processes of an MPI job, next to the same model on one process (`mpirun -np 1`): every
//! rank computes the gradients of its own batch, they are all-reduced (1.08 MB), and one update
//! follows. Prints the median step time and its parts on rank 0.
//!
//! Run: `cargo build --release --features mpi --example distributed_step` then
//! `mpirun -np 1 target/release/examples/distributed_step` and `mpirun -np 2 ...`
//! (`ARRAYJIT_BACKEND=multicore_cc` runs the all-reduces concurrently with backprop).

use std::time::Instant;

use arrayjit::dist::ProcessGroup;
use arrayjit::train::{Classifier, Mlp};

fn main() -> arrayjit::Result<()> {
    let group = ProcessGroup::mpi()?;
    let backend = arrayjit::default_backend()?; // ARRAYJIT_BACKEND, else sync_cc
    // Every rank holds the same data (the benchmark table's): 16 batches per rank.
    let data = arrayjit::train::mlp_workload::dataset(16 * 256 * group.size())?;
    let config = arrayjit::train::mlp_workload::config();
    let model = Mlp::new(&[784, 256, 256, 10], 1)?;
    let params: usize = model
        .params()
        .iter()
        .map(|p| p.dims().iter().product::<usize>())
        .sum();
    let classifier = if group.size() == 1 {
        Classifier::new(&backend, model, &data, &config)?
    } else {
        // ARRAYJIT_BUCKET_BYTES chooses the buckets (default: PyTorch's 25 MiB, one bucket here).
        let bucket_bytes = std::env::var("ARRAYJIT_BUCKET_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(arrayjit::buckets::DEFAULT_BUCKET_BYTES);
        Classifier::new_distributed(&backend, model, &data, &config, &group, bucket_bytes)?
    };
    classifier.epoch(0)?; // warm-up
    let mut times = Vec::new();
    for e in 1..8 {
        group.barrier()?;
        let t = Instant::now();
        classifier.epoch(e)?;
        times.push(t.elapsed().as_secs_f64() / 16.0);
    }
    times.sort_by(f64::total_cmp);
    classifier.check_parameters_identical()?;
    if group.rank() == 0 {
        println!(
            "MLP 784-256-256-10 b256 on {} rank(s) ({}, {}): {:.3} ms per step (global batch {}, {} parameters = {:.2} MB of gradients all-reduced per step)",
            group.size(),
            group.engine_name(),
            backend.name(),
            times[times.len() / 2] * 1e3,
            256 * group.size(),
            params,
            params as f64 * 4.0 / 1e6
        );
    }
    Ok(())
}

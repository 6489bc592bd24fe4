//! Training throughput: one epoch (20 steps of forward + backward + SGD update) of the moons
//! MLP, on `sync_cc` and `multicore_cc`. Compare with `benches/peers/numpy_moons.py` (the same
//! model and loop in NumPy) run on the same machine.
//! Run with `cargo bench -p arrayjit --bench training`.

use arrayjit::tensor::Optimizer;
use arrayjit::tensor::datasets::moons;
use arrayjit::train::{Classifier, LossKind, Mlp, TrainConfig};
use criterion::{Criterion, criterion_group, criterion_main};

fn training(c: &mut Criterion) {
    let (train, _) = moons(500, 0.1, 1).unwrap().split(0.8, 1).unwrap();
    for name in ["sync_cc", "multicore_cc"] {
        let backend = arrayjit::backend(name).unwrap();
        let cfg = TrainConfig {
            epochs: 1,
            batch_size: 20,
            optimizer: Optimizer::Sgd {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 1e-4,
            },
            loss: LossKind::Hinge,
            shards: 1,
        };
        let classifier = Classifier::new(
            &backend,
            Mlp::new(&[2, 16, 16, 1], 1).unwrap(),
            &train,
            &cfg,
        )
        .unwrap();
        let mut epoch = 0;
        c.bench_function(&format!("{name}: one moons epoch (20 steps)"), |b| {
            b.iter(|| {
                classifier.epoch(epoch).unwrap();
                epoch += 1;
            })
        });
    }
}

criterion_group!(benches, training);
criterion_main!(benches);

//! Training across processes (cargo feature `mpi`): two ranks under `mpirun -np 2` train the
//! same parameters, bit for bit, as each other, and the same (within float rounding) as one
//! process training with two shards on the same batches. Skipped, saying why, where `mpirun`
//! is missing.

#![cfg(feature = "mpi")]

use arrayjit::dist::ProcessGroup;
use arrayjit::dist::testing::{RankRun, on_ranks};
use arrayjit::tensor::Optimizer;
use arrayjit::tensor::datasets::moons;
use arrayjit::train::{Classifier, LossKind, Mlp, TrainConfig};

fn train(group: Option<&ProcessGroup>) -> (Vec<f64>, Vec<Vec<f64>>) {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let (train, _) = moons(200, 0.1, 3).unwrap().split(0.8, 3).unwrap();
    let config = TrainConfig {
        epochs: 10,
        batch_size: 20,
        optimizer: Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        loss: LossKind::Hinge,
        shards: if group.is_some() { 1 } else { 2 },
    };
    let model = Mlp::new(&[2, 16, 16, 1], 3).unwrap();
    let c = match group {
        Some(g) => Classifier::new_distributed(&backend, model, &train, &config, g).unwrap(),
        None => Classifier::new(&backend, model, &train, &config).unwrap(),
    };
    let losses = (0..config.epochs)
        .map(|e| c.epoch(e).unwrap().loss)
        .collect();
    c.check_parameters_identical().unwrap();
    let params = c
        .model()
        .params()
        .iter()
        .map(|p| p.values().unwrap())
        .collect();
    (losses, params)
}

#[test]
fn two_ranks_train_like_one_process_with_two_shards() {
    match on_ranks("two_ranks_train_like_one_process_with_two_shards", 2) {
        RankRun::Skipped(why) => eprintln!("skipped: {why}"),
        RankRun::Started(out) => {
            assert_eq!(
                out.matches("trained like two shards on rank").count(),
                2,
                "{out}"
            );
            for line in out.lines().filter(|l| l.starts_with("trained like")) {
                eprintln!("{line}");
            }
        }
        RankRun::Rank => {
            let group = ProcessGroup::from_env().unwrap();
            assert_eq!(group.size(), 2);
            let (losses, params) = train(Some(&group));
            let (local_losses, local_params) = train(None);
            let mut worst = 0.0f64;
            for (a, b) in params.iter().flatten().zip(local_params.iter().flatten()) {
                worst = worst.max((a - b).abs() / b.abs().max(1.0));
            }
            assert!(worst < 1e-4, "parameters differ by {worst}");
            for (a, b) in losses.iter().zip(&local_losses) {
                assert!(
                    (a - b).abs() < 1e-4 * b.abs().max(1.0),
                    "{losses:?} vs {local_losses:?}"
                );
            }
            assert!(losses.last() < losses.first(), "{losses:?}");
            println!(
                "trained like two shards on rank {} (largest relative difference {worst:.1e})",
                group.rank()
            );
        }
    }
}

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

fn train(backend: &str, group: Option<&ProcessGroup>) -> (Vec<f64>, Vec<Vec<f64>>) {
    let backend = arrayjit::backend(backend).unwrap();
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
        // Small buckets: backprop runs in several routines, each bucket reduced after it.
        Some(g) => Classifier::new_distributed(&backend, model, &train, &config, g, 1024).unwrap(),
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
            // multicore_cc: the all-reduces run on their own stream, concurrently with the
            // next bucket's backprop.
            let (losses, params) = train("multicore_cc", Some(&group));
            let (local_losses, local_params) = train("sync_cc", None);
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
            // Traced: each step's 7 all-reduces (the step loss and 6 gradients) run on the
            // communication stream's track, and every update starts after its step's
            // reductions have ended.
            arrayjit::runtime::start_trace(Default::default());
            let _ = train("multicore_cc", Some(&group));
            let trace = arrayjit::runtime::stop_trace().unwrap();
            let slices = |name: &str| {
                let mut v: Vec<(f64, f64, arrayjit::ir::trace::Track)> = trace
                    .events()
                    .iter()
                    .filter(|e| e.name() == name && e.flow().is_none())
                    .map(|e| (e.start_us(), e.start_us() + e.duration_us(), e.track()))
                    .collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                v
            };
            let (reduces, updates) = (slices("all-reduce"), slices("update"));
            assert_eq!(updates.len(), 10 * 4, "10 epochs of 4 steps");
            assert_eq!(reduces.len(), 7 * updates.len());
            assert!(
                reduces.iter().all(|r| r.2 != updates[0].2),
                "reductions on their own stream"
            );
            for (i, u) in updates.iter().enumerate() {
                let done = reduces.iter().filter(|r| r.1 <= u.0 + 0.01).count();
                assert!(
                    done >= 7 * (i + 1),
                    "update {i} started after only {done} reductions"
                );
            }
        }
    }
}

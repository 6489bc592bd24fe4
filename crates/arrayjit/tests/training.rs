//! Training end to end: moons reaches ≥ 95% held-out accuracy for seeds 1, 2, 3 on both CPU
//! backends and on the GPU renderers' backends where they are available (wgpu, cuda, cuda_emu:
//! with the CPU's losses up to rounding), the same
//! seed gives the same losses on both CPU backends, Adam and softmax cross-entropy train
//! too, and parameters round-trip through safetensors.

// The demos live in the binary and the examples; their code is tested here as it is.
#[path = "../examples/bigram.rs"]
#[allow(dead_code)]
mod bigram;
#[path = "../examples/micrograd.rs"]
#[allow(dead_code)]
mod micrograd;
#[path = "../../arrayjit-cli/src/moons.rs"]
#[allow(dead_code)]
mod moons;

use arrayjit::tensor::datasets::{bars_and_crosses, spirals};
use arrayjit::tensor::{Optimizer, checkpoint};
use arrayjit::train::{Classifier, LossKind, Mlp, TrainConfig};
use moons::{MoonsConfig, run};

fn config(backend: &str, seed: u64) -> MoonsConfig {
    MoonsConfig {
        backend: Some(backend.into()),
        epochs: 60,
        seed,
        samples: 500,
        output: None,
        shards: 1,
        group: None,
    }
}

#[test]
fn moons_reaches_95_percent_for_seeds_1_2_3_on_both_cpu_backends() {
    for backend in ["sync_cc", "multicore_cc"] {
        for seed in [1, 2, 3] {
            let r = run(&config(backend, seed), |_| {}).unwrap();
            assert!(r.test_accuracy >= 0.95, "{backend} seed {seed}: {r:?}");
            assert!(r.losses.last().unwrap() < &r.losses[0], "{r:?}");
        }
    }
}

/// The GPU renderers' backends (wgpu, cuda, and cuda_emu, which runs the CUDA kernels on the
/// CPU) train as the CPU does.
#[test]
fn moons_reaches_95_percent_on_gpu_renderers_and_follows_the_cpu_losses() {
    for backend in arrayjit_testing::backends_under_test(&["wgpu", "cuda", "cuda_emu"]).unwrap() {
        let name = backend.name();
        for seed in [1, 2, 3] {
            let gpu = run(&config(name, seed), |_| {}).unwrap();
            assert!(gpu.test_accuracy >= 0.95, "{name} seed {seed}: {gpu:?}");
            // Same program, same data: the losses differ only by float rounding (the device's
            // exp, fused multiply-adds and reduction order).
            let cpu = run(&config("sync_cc", seed), |_| {}).unwrap();
            for (epoch, (g, c)) in gpu.losses.iter().zip(&cpu.losses).enumerate() {
                assert!(
                    (g - c).abs() <= 1e-3 * (1.0 + c.abs()),
                    "seed {seed} epoch {epoch}: {name} {g} vs sync_cc {c}"
                );
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_losses_on_both_cpu_backends() {
    let a = run(&config("sync_cc", 7), |_| {}).unwrap();
    let b = run(&config("multicore_cc", 7), |_| {}).unwrap();
    assert_eq!(a.losses, b.losses);
    let c = run(&config("sync_cc", 8), |_| {}).unwrap();
    assert_ne!(a.losses, c.losses);
}

#[test]
fn adam_and_softmax_cross_entropy_learn_spirals_and_images() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let data = spirals(100, 3, 0.02, 5).unwrap();
    let (train, test) = data.split(0.8, 5).unwrap();
    let model = Mlp::new(&[2, 32, 32, 3], 5).unwrap();
    let cfg = TrainConfig {
        epochs: 150,
        batch_size: 16,
        optimizer: Optimizer::adam(0.01),
        loss: LossKind::SoftmaxCrossEntropy,
        shards: 1,
    };
    let c = Classifier::new(&b, model, &train, &cfg).unwrap();
    let first = c.epoch(0).unwrap().loss;
    let mut last = first;
    for e in 1..cfg.epochs {
        last = c.epoch(e).unwrap().loss;
    }
    assert!(last < first * 0.5, "{first} -> {last}");
    assert!(
        c.accuracy(&test).unwrap() >= 0.8,
        "{}",
        c.accuracy(&test).unwrap()
    );

    let images = bars_and_crosses(400, 6, 0.2, 3).unwrap();
    let (train, test) = images.split(0.75, 3).unwrap();
    let model = Mlp::new(&[36, 24, 4], 3).unwrap();
    let cfg = TrainConfig {
        epochs: 30,
        batch_size: 20,
        optimizer: Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
        },
        loss: LossKind::SoftmaxCrossEntropy,
        shards: 1,
    };
    let c = Classifier::new(&b, model, &train, &cfg).unwrap();
    for e in 0..cfg.epochs {
        c.epoch(e).unwrap();
    }
    assert!(
        c.accuracy(&test).unwrap() >= 0.9,
        "{}",
        c.accuracy(&test).unwrap()
    );
}

#[test]
fn parameters_round_trip_through_safetensors() {
    let b = arrayjit::backend("multicore_cc").unwrap();
    let data = arrayjit::tensor::datasets::moons(200, 0.1, 4).unwrap();
    let (train, test) = data.split(0.8, 4).unwrap();
    let model = Mlp::new(&[2, 8, 1], 4).unwrap();
    let cfg = TrainConfig {
        epochs: 40,
        batch_size: 16,
        optimizer: Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.0,
        },
        loss: LossKind::Hinge,
        shards: 1,
    };
    let c = Classifier::new(&b, model, &train, &cfg).unwrap();
    for e in 0..cfg.epochs {
        c.epoch(e).unwrap();
    }
    let trained_accuracy = c.accuracy(&test).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moons.safetensors");
    let params = c.model().params();
    checkpoint::save(&params, &path).unwrap();
    let saved: Vec<Vec<f64>> = params.iter().map(|p| p.values().unwrap()).collect();
    // Scramble, then load: values and predictions come back.
    for p in &params {
        let n = p.dims().iter().product();
        p.node().host().set_values(&vec![0.0; n]).unwrap();
    }
    assert!(c.accuracy(&test).unwrap() < trained_accuracy || trained_accuracy <= 0.5);
    checkpoint::load(&params, &path).unwrap();
    let loaded: Vec<Vec<f64>> = params.iter().map(|p| p.values().unwrap()).collect();
    assert_eq!(saved, loaded);
    assert_eq!(c.accuracy(&test).unwrap(), trained_accuracy);
    // A file lacking a parameter, or of another shape, is an error.
    let other = Mlp::new(&[2, 5, 1], 4).unwrap();
    assert!(checkpoint::load(&other.params(), &path).is_err());
    assert!(checkpoint::load(&params, &dir.path().join("missing.safetensors")).is_err());
}

#[test]
fn micrograd_expression_matches_hand_computed_gradients() {
    for backend in [None, Some("sync_cc"), Some("multicore_cc")] {
        let (g, da, db) = micrograd::run(backend).unwrap();
        assert!((g - 24.7041).abs() < 1e-4, "{backend:?}: {g}");
        assert!((da - 138.8338).abs() < 1e-4, "{backend:?}: {da}");
        assert!((db - 645.5773).abs() < 1e-4, "{backend:?}: {db}");
    }
}

#[test]
fn bigram_model_approaches_the_best_possible_loss() {
    let text = bigram::corpus(200, 2);
    let model = bigram::Bigram::train(&text, "sync_cc", 15, 2).unwrap();
    let last = *model.losses.last().unwrap();
    assert!(
        last < (model.vocab.len() as f64).ln(),
        "better than uniform: {last}"
    );
    assert!(
        last - model.optimal_loss < 0.1,
        "{last} vs {}",
        model.optimal_loss
    );
    let sample = model.sample('t', 50, 1).unwrap();
    assert_eq!(sample.chars().count(), 50);
    assert!(sample.chars().all(|c| model.vocab.contains(&c)));
}

#[test]
fn moons_trains_data_parallel_over_shards_and_devices() {
    let backend = arrayjit::runtime::backend_with_config(
        "multicore_cc",
        &arrayjit::runtime::RuntimeConfig {
            num_devices: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let data = arrayjit::tensor::datasets::moons(500, 0.1, 2).unwrap();
    let (train, test) = data.split(0.8, 2).unwrap();
    let model = Mlp::new(&[2, 16, 16, 1], 2).unwrap();
    let cfg = TrainConfig {
        epochs: 60,
        batch_size: 20,
        optimizer: Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        loss: LossKind::Hinge,
        shards: 4,
    };
    let c = Classifier::new(&backend, model, &train, &cfg).unwrap();
    let first = c.epoch(0).unwrap().loss;
    let mut last = first;
    for e in 1..cfg.epochs {
        last = c.epoch(e).unwrap().loss;
    }
    assert!(last < first, "{first} -> {last}");
    assert!(
        c.accuracy(&test).unwrap() >= 0.95,
        "{}",
        c.accuracy(&test).unwrap()
    );
}

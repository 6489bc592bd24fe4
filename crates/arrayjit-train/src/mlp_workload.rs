//! The MLP workload of the benchmark table and of the distributed example: a 784-256-256-10
//! classifier's data (random pixels and labels, the same for every run) and training settings,
//! in one place so that every measurement of it trains the same thing.

use arrayjit_ir::Result;
use arrayjit_tensor::Optimizer;
use arrayjit_tensor::datasets::Dataset;

use crate::classifier::{LossKind, TrainConfig};

/// The data of the table's MLP: `rows` random inputs of 784 features and labels of 10
/// classes (Philox, seed 3).
pub fn dataset(rows: usize) -> Result<Dataset> {
    let rng = arrayjit_tensor::rng::Philox::new(3, 9);
    Ok(Dataset {
        x: rng.uniform_vec(rows * 784, 0.0, 1.0)?,
        labels: (0..rows)
            .map(|i| (rng.uniform(1 << 40 | i as u64) * 10.0) as usize % 10)
            .collect(),
        features: 784,
        classes: 10,
    })
}

/// The training settings of the table's MLP: batch 256, softmax cross-entropy, plain SGD.
pub fn config() -> TrainConfig {
    TrainConfig::new(
        1,
        256,
        Optimizer::Sgd {
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        LossKind::SoftmaxCrossEntropy,
    )
}

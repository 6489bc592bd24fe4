use arrayjit::tensor::Optimizer;
use arrayjit::tensor::datasets::moons;
use arrayjit::train::*;
use std::time::Instant;
fn main() -> arrayjit::Result<()> {
    for seed in [1u64, 2, 3] {
        let data = moons(500, 0.1, seed);
        let (train, test) = data.split(0.8, seed)?;
        let b = arrayjit::backend("sync_cc")?;
        let model = Mlp::new(&[2, 16, 16, 1], seed)?;
        let cfg = TrainConfig {
            epochs: 60,
            batch_size: 20,
            optimizer: Optimizer::Sgd {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 1e-4,
            },
            loss: LossKind::Hinge,
        };
        let t = Instant::now();
        let c = Classifier::new(&b, model, &train, &cfg)?;
        let build = t.elapsed();
        let mut last = 0.0;
        for e in 0..cfg.epochs {
            last = c.epoch(e)?.loss;
        }
        println!(
            "seed {seed}: loss {last:.4} test acc {:.3} train acc {:.3} build {:?} total {:?}",
            c.accuracy(&test)?,
            c.accuracy(&train)?,
            build,
            t.elapsed()
        );
    }
    Ok(())
}

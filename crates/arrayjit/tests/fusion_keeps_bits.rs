//! Loop fusion is a schedule, not a change of arithmetic: a small GPT (exact GELU, so `erf`,
//! `exp` and the softmax, layer norms and products all run) trained a few steps on each CPU
//! backend gives the same loss bits with the optimizer's loop fusion on (the default: sibling
//! loops fused at every level of a statement) and off.
//!
//! This holds because the C backends compile with `-ffp-contract=off`: the compiler fuses no
//! multiply-add the loop IR does not have. With gcc's default contraction, a product stored by
//! one fused loop and summed by the next became one fused multiply-add, and the losses moved in
//! their last bits (and a 300-step `bf16` curve by 0.06).

use arrayjit::gpt::{CharVocab, GptTrainer, SONNETS, TrainerConfig, batch};
use arrayjit::runtime::{RuntimeConfig, backend_with_config};
use arrayjit::tensor::Precision;
use arrayjit::tensor::nn::{Gelu, GptConfig};

const STEPS: u64 = 4;

/// The losses of `STEPS` steps on a fresh instance of backend `name`, with loop fusion as
/// given; `None` where the backend does not run here (and is not required).
fn losses(name: &str, fuse_loops: bool) -> Option<Vec<f64>> {
    arrayjit_testing::backend_under_test(name).unwrap()?;
    let backend = backend_with_config(name, &RuntimeConfig::default()).unwrap();
    backend.set_optimize_settings(arrayjit::opt::OptimizeSettings {
        enable_loop_fusion: fuse_loops,
        ..backend.optimize_settings()
    });
    let vocab = CharVocab::from_text(SONNETS);
    let data = vocab.encode(SONNETS).unwrap();
    let mut c = TrainerConfig::small(vocab.len());
    c.model = GptConfig {
        vocabulary: vocab.len(),
        context: 16,
        width: 32,
        heads: 2,
        layers: 2,
        hidden: 64,
        gelu: Gelu::Exact,
        precision: Precision::F32,
        attention: arrayjit::tensor::nn::AttentionKind::Fused,
    };
    c.batch = 4;
    let mut trainer = GptTrainer::new(&backend, &c).unwrap();
    Some(
        (0..STEPS)
            .map(|step| {
                let (ids, targets) = batch(&data, c.batch, c.model.context, step, 3).unwrap();
                trainer.train_step(&ids, &targets).unwrap()
            })
            .collect(),
    )
}

fn same_bits_with_and_without_fusion(name: &str) {
    let (Some(fused), Some(apart)) = (losses(name, true), losses(name, false)) else {
        return;
    };
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&fused),
        bits(&apart),
        "{name}: losses with loop fusion {fused:?}, without {apart:?}"
    );
    // The steps learn something (the comparison is not of constants).
    assert!(fused[STEPS as usize - 1] < fused[0], "{name}: {fused:?}");
}

#[test]
fn loop_fusion_keeps_the_bits_on_sync_cc() {
    same_bits_with_and_without_fusion("sync_cc");
}

#[test]
fn loop_fusion_keeps_the_bits_on_multicore_cc() {
    same_bits_with_and_without_fusion("multicore_cc");
}

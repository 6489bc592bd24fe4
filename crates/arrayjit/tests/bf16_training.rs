//! Training in `bf16` products ([`Precision::Bf16Products`]) follows the `f32` loss curve: a
//! small GPT trained 300 steps on the sonnets, on every CPU backend and on `cuda_emu` (whose
//! `bf16` products run on the emulated matrix units), stays within the stated tolerance of the
//! same model trained in `f32` on the same backend, and learns as much.
//!
//! **Tolerance.** The two runs see the same batches; `bf16` operands carry relative errors up
//! to 2^-9, and over 300 AdamW steps the trajectories drift apart by that rounding, by an
//! amount that depends on the realization: measured on `sync_cc` (2026-11-27) with parameter
//! seeds 1 to 8, the largest step difference ranged 0.010–0.219, the largest difference of
//! 25-step means 0.001–0.130, and of the last 50 steps' means 0.0002–0.030. The tolerances
//! hold that spread with a margin: at every step `|loss_bf16 − loss_f32| ≤ 0.3`, the means
//! over each 25 steps within 0.15, and the means of the last 50 steps within 0.04. (An earlier
//! statement of 0.25 / 0.06 / 0.03 was fitted to one seed's 0.095 / 0.036 / 0.007.)

use arrayjit::gpt::{CharVocab, GptTrainer, SONNETS, TrainerConfig, batch};
use arrayjit::tensor::Precision;
use arrayjit::tensor::nn::{Gelu, GptConfig};

/// Per-step tolerance between the two curves.
const STEP_TOLERANCE: f64 = 0.3;
/// Steps of a window whose means are compared ...
const WINDOW: usize = 25;
/// ... within this tolerance.
const WINDOW_TOLERANCE: f64 = 0.15;
/// Tolerance between the means of the last 50 steps.
const LATE_TOLERANCE: f64 = 0.04;
const STEPS: u64 = 300;

fn config(vocabulary: usize, precision: Precision) -> TrainerConfig {
    let mut c = TrainerConfig::small(vocabulary);
    c.model = GptConfig {
        vocabulary,
        context: 16,
        width: 32,
        heads: 2,
        layers: 1,
        hidden: 64,
        gelu: Gelu::Tanh,
        precision,
        attention: arrayjit::tensor::nn::AttentionKind::Unfused,
    };
    c.batch = 8;
    c
}

fn curve(backend: &arrayjit::runtime::Backend, c: &TrainerConfig, data: &[usize]) -> Vec<f64> {
    let mut trainer = GptTrainer::new(backend, c).unwrap();
    (0..STEPS)
        .map(|step| {
            let (ids, targets) = batch(data, c.batch, c.model.context, step, 5).unwrap();
            trainer.train_step(&ids, &targets).unwrap()
        })
        .collect()
}

fn late_mean(losses: &[f64]) -> f64 {
    losses[losses.len() - 50..].iter().sum::<f64>() / 50.0
}

/// The largest difference between the means of the two curves over windows of 25 steps.
fn window_difference(a: &[f64], b: &[f64]) -> f64 {
    a.chunks(WINDOW)
        .zip(b.chunks(WINDOW))
        .map(|(x, y)| (x.iter().sum::<f64>() - y.iter().sum::<f64>()).abs() / x.len() as f64)
        .fold(0.0, f64::max)
}

/// The curves on backend `name` (one test per backend, so the harness runs them side by side),
/// where it runs here; `false` where it does not (and is not required).
fn follows_f32_curve_on(name: &str) -> bool {
    let vocab = CharVocab::from_text(SONNETS);
    let data = vocab.encode(SONNETS).unwrap();
    let Some(backend) = arrayjit_testing::backend_under_test(name).unwrap() else {
        return false;
    };
    // Both trainings at once (each on its own streams of the backend's device).
    let (f32_curve, bf16_curve) = std::thread::scope(|s| {
        let f32_run = s.spawn(|| curve(&backend, &config(vocab.len(), Precision::F32), &data));
        let bf16_curve = curve(
            &backend,
            &config(vocab.len(), Precision::Bf16Products),
            &data,
        );
        (f32_run.join().unwrap(), bf16_curve)
    });
    let step_difference = f32_curve
        .iter()
        .zip(&bf16_curve)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let windows = window_difference(&f32_curve, &bf16_curve);
    let (late32, late16) = (late_mean(&f32_curve), late_mean(&bf16_curve));
    eprintln!(
        "{name}: first loss f32 {:.4} bf16 {:.4}; last 50 steps f32 {late32:.4} bf16 \
         {late16:.4}; largest difference of a step {step_difference:.4}, of a \
         {WINDOW}-step mean {windows:.4}",
        f32_curve[0], bf16_curve[0],
    );
    assert!(
        step_difference <= STEP_TOLERANCE,
        "{name}: steps differ by up to {step_difference}:\nf32 {f32_curve:?}\nbf16 {bf16_curve:?}"
    );
    assert!(
        windows <= WINDOW_TOLERANCE,
        "{name}: {WINDOW}-step means differ by up to {windows}"
    );
    assert!(
        (late32 - late16).abs() <= LATE_TOLERANCE,
        "{name}: last 50 steps f32 {late32} vs bf16 {late16}"
    );
    // Both learn: well below the uniform prediction's ln(V).
    assert!(
        late16 < (vocab.len() as f64).ln() - 1.0,
        "{name}: bf16 did not learn: {late16}"
    );
    true
}

#[test]
fn bf16_products_follow_the_f32_loss_curve_over_300_steps_on_sync_cc() {
    assert!(follows_f32_curve_on("sync_cc"), "sync_cc must run here");
}

#[test]
fn bf16_products_follow_the_f32_loss_curve_over_300_steps_on_multicore_cc() {
    follows_f32_curve_on("multicore_cc");
}

/// `bf16` products on the emulated matrix units.
#[test]
fn bf16_products_follow_the_f32_loss_curve_over_300_steps_on_cuda_emu() {
    follows_f32_curve_on("cuda_emu");
}

/// On a GPU where there is one (wgpu has no `bf16` in WGSL).
#[test]
fn bf16_products_follow_the_f32_loss_curve_over_300_steps_on_cuda() {
    follows_f32_curve_on("cuda");
}

//! The GPT demo's trainer on every backend: a tiny model's first loss is `ln(vocabulary)`
//! (near-uniform predictions from small initial weights) and agrees across backends, training
//! lowers it, and a checkpoint resumes training exactly where it stopped; with dropout too, whose
//! masks are the same on every backend.

use arrayjit::gpt::{CharVocab, GptTrainer, TrainerConfig, batch};
use arrayjit::tensor::nn::{Gelu, GptConfig};

const TEXT: &str = "to be or not to be, that is the question; whether tis nobler in the mind";

fn config(vocabulary: usize) -> TrainerConfig {
    let mut c = TrainerConfig::small(vocabulary);
    c.model = GptConfig {
        vocabulary,
        context: 8,
        width: 16,
        heads: 2,
        layers: 1,
        hidden: 32,
        gelu: Gelu::Tanh,
        precision: arrayjit::tensor::Precision::F32,
        attention: arrayjit::tensor::nn::AttentionKind::Fused,
    };
    c.batch = 4;
    c
}

/// Trains `c` for 40 steps on every backend; returns the first three losses of the first.
fn learns_and_agrees_on_every_backend(c: &TrainerConfig) -> Vec<f64> {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = *c;
    let mut first_losses = Vec::new();
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let mut trainer = GptTrainer::new(&backend, &c).unwrap();
        let mut losses = Vec::new();
        for step in 0..40 {
            let (ids, targets) = batch(&data, c.batch, c.model.context, step, 3).unwrap();
            losses.push(trainer.train_step(&ids, &targets).unwrap());
        }
        let uniform = (vocab.len() as f64).ln();
        assert!(
            (losses[0] - uniform).abs() < 0.05 + c.dropout,
            "{name}: first loss {} vs ln(V) = {uniform}",
            losses[0]
        );
        let late: f64 = losses[30..].iter().sum::<f64>() / 10.0;
        assert!(
            late < losses[0] - 0.5,
            "{name}: training did not lower the loss: {losses:?}"
        );
        first_losses.push((name, losses[..3].to_vec()));
    }
    let (reference, want) = &first_losses[0];
    for (name, got) in &first_losses[1..] {
        for (w, g) in want.iter().zip(got) {
            assert!(
                (w - g).abs() <= 1e-4 * w.abs(),
                "{name} vs {reference}: losses {got:?} vs {want:?}"
            );
        }
    }
    first_losses.swap_remove(0).1
}

#[test]
fn a_tiny_gpt_learns_and_agrees_on_every_backend() {
    let c = config(CharVocab::from_text(TEXT).len());
    learns_and_agrees_on_every_backend(&c);
}

#[test]
fn with_dropout_the_masks_agree_on_every_backend_and_training_still_learns() {
    let mut c = config(CharVocab::from_text(TEXT).len());
    let plain = learns_and_agrees_on_every_backend(&c);
    c.dropout = 0.2;
    let dropped = learns_and_agrees_on_every_backend(&c);
    assert_ne!(plain[0], dropped[0], "dropout changes the first loss");
    a_checkpoint_resumes_training_exactly_with(&c);
}

#[test]
fn a_checkpoint_resumes_training_exactly() {
    a_checkpoint_resumes_training_exactly_with(&config(CharVocab::from_text(TEXT).len()));
}

fn a_checkpoint_resumes_training_exactly_with(c: &TrainerConfig) {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = *c;
    let backend = arrayjit::default_backend().unwrap();
    let dir = std::env::temp_dir().join(format!(
        "arrayjit-gpt-test-{}-{}",
        std::process::id(),
        c.dropout
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt.safetensors");
    let step = |t: &mut GptTrainer, s: u64| {
        let (ids, targets) = batch(&data, c.batch, c.model.context, s, 5).unwrap();
        t.train_step(&ids, &targets).unwrap()
    };
    let mut a = GptTrainer::new(&backend, &c).unwrap();
    for s in 0..5 {
        step(&mut a, s);
    }
    a.save(&path).unwrap();
    let continued: Vec<f64> = (5..8).map(|s| step(&mut a, s)).collect();
    let mut b = GptTrainer::new(&backend, &c).unwrap();
    assert_eq!(b.load(&path).unwrap(), 5, "the step count comes back");
    let resumed: Vec<f64> = (5..8).map(|s| step(&mut b, s)).collect();
    assert_eq!(continued, resumed);
    // Sampling is deterministic for a seed and stays inside the vocabulary.
    let prompt = vocab.encode("to be").unwrap();
    let s1 = b.generate(&prompt, 12, 0.8, 9).unwrap();
    assert_eq!(s1, b.generate(&prompt, 12, 0.8, 9).unwrap());
    assert!(s1.iter().all(|&i| i < vocab.len()));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_inputs_are_errors() {
    let vocab = CharVocab::from_text(TEXT);
    assert!(vocab.encode("Zebra").is_err(), "Z is not in the text");
    let data = vocab.encode(TEXT).unwrap();
    assert!(batch(&data[..5], 2, 8, 0, 1).is_err(), "no window fits");
    let c = config(vocab.len());
    let backend = arrayjit::default_backend().unwrap();
    let mut t = GptTrainer::new(&backend, &c).unwrap();
    assert!(t.train_step(&[0; 3], &[0; 3]).is_err(), "wrong length");
    let n = c.batch * c.model.context;
    let mut ids = vec![0; n];
    ids[7] = vocab.len();
    let err = t.train_step(&ids, &vec![0; n]).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
}

/// A trainer on a backend that cannot run here fails with the backend's own error, chained under
/// what was being built.
#[test]
fn a_trainer_on_an_unavailable_backend_says_what_it_was_building() {
    let vocab = CharVocab::from_text(TEXT);
    let metal = arrayjit::backend("metal").unwrap();
    let err = GptTrainer::new(&metal, &config(vocab.len())).err().unwrap();
    assert!(
        matches!(err.root_cause(), arrayjit::Error::BackendUnavailable { .. }),
        "{err}"
    );
    assert_eq!(
        err.contexts(),
        vec!["building the GPT training step on metal".to_string()]
    );
    let message = err.to_string();
    assert!(
        message
            .starts_with("building the GPT training step on metal: backend metal is unavailable"),
        "{message}"
    );
}

/// The held-out-loss and sampling routines compile on their first use, into the step's context:
/// before training, the held-out loss of a batch is the loss the first step reports for it.
#[test]
fn evaluation_routines_compile_on_first_use_and_agree_with_the_step() {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = config(vocab.len());
    let backend = arrayjit::default_backend().unwrap();
    let mut t = GptTrainer::new(&backend, &c).unwrap();
    assert_eq!(t.lazy_compile_time(), std::time::Duration::ZERO);
    let (ids, targets) = batch(&data, c.batch, c.model.context, 0, 11).unwrap();
    let held_out = t.eval_loss(&ids, &targets).unwrap();
    let compiled = t.lazy_compile_time();
    assert!(compiled > std::time::Duration::ZERO);
    assert_eq!(t.eval_loss(&ids, &targets).unwrap(), held_out);
    assert_eq!(t.lazy_compile_time(), compiled, "compiled once");
    let trained = t.train_step(&ids, &targets).unwrap();
    assert!(
        (trained - held_out).abs() <= 1e-5 * held_out,
        "{trained} vs {held_out}"
    );
    assert!(
        t.eval_loss(&ids, &targets).unwrap() < held_out,
        "the step lowered it"
    );
}

#[test]
fn a_trainer_too_large_for_its_device_fails_before_training_with_the_figures() {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = config(vocab.len());
    let backend = arrayjit::backend("sync_cc").unwrap();
    let used = backend.get_device(0).unwrap().used_memory();
    // Room for far less than the model's parameters, gradients and optimizer state.
    backend.set_memory_limit(Some(used + 1024));
    let err = GptTrainer::new(&backend, &c)
        .err()
        .expect("the trainer cannot fit");
    assert!(err.is_out_of_memory(), "{err}");
    match err.root_cause() {
        arrayjit::Error::DeviceOutOfMemory {
            needed, available, ..
        } => assert!(needed > available, "{err}"),
        other => panic!("expected DeviceOutOfMemory, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("batch size"), "{message}");
    // With the limit lifted, the same backend builds and trains it.
    backend.set_memory_limit(None);
    let mut trainer = GptTrainer::new(&backend, &c).unwrap();
    let (ids, targets) = batch(&data, c.batch, c.model.context, 0, 3).unwrap();
    assert!(trainer.train_step(&ids, &targets).unwrap().is_finite());
}

/// A trainer draws its parameters while it compiles the step: after `new` they hold the
/// values `Gpt::new` draws from the same seed (not the zeros they start as) when linking
/// copies them to the device.
#[test]
fn a_new_trainer_holds_the_parameters_drawn_from_its_seed() {
    let c = config(11);
    let reference = arrayjit::tensor::nn::Gpt::new(c.model, c.seed).unwrap();
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let trainer = GptTrainer::new(&backend, &c).unwrap();
        let params = trainer.model().params();
        assert_eq!(params.len(), reference.params().len());
        for (want, got) in reference.params().iter().zip(params) {
            let want = want.node().host().get_values().unwrap();
            let got = got.node().host().get_values().unwrap();
            assert_eq!(got, want, "{}: {}", backend.name(), got.len());
        }
        let token_embedding = params[0].node().host().get_values().unwrap();
        assert!(token_embedding.iter().any(|&x| x != 0.0));
    }
}

/// The step's arrays made beside its compile (on the draws' thread) or after it: the same
/// trainer, bit for bit — the arrays hold the drawn parameters, not the zeros they start as.
#[test]
fn a_trainer_linked_beside_its_compile_equals_one_linked_after() {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = config(vocab.len());
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let mut losses = Vec::new();
        for beside in [true, false] {
            let mut trainer = GptTrainer::new_linking(&backend, &c, beside).unwrap();
            let mut run = Vec::new();
            for step in 0..3 {
                let (ids, targets) = batch(&data, c.batch, c.model.context, step, 3).unwrap();
                run.push(trainer.train_step(&ids, &targets).unwrap());
            }
            losses.push(run);
        }
        assert_eq!(losses[0], losses[1], "{name}");
        // A model of zeros would predict the uniform distribution (to rounding).
        let uniform = (vocab.len() as f64).ln();
        assert!(
            (losses[0][0] - uniform).abs() > 1e-5,
            "{name}: the parameters were not drawn ({} vs ln V = {uniform})",
            losses[0][0]
        );
    }
}

/// Routines compiled ahead on a thread of their own serve as those compiled on first use:
/// the same held-out losses and the same generated text, bit for bit, on every backend; a
/// second request starts nothing, and a trainer dropped while its routines compile waits for
/// them (no thread outlives it).
#[test]
fn routines_compiled_ahead_equal_those_compiled_on_first_use() {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = config(vocab.len());
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let mut results = Vec::new();
        for ahead in [true, false] {
            let mut t = GptTrainer::new(&backend, &c).unwrap();
            if ahead {
                assert!(t.compile_ahead(), "{name}");
                assert!(!t.compile_ahead(), "{name}: a second thread");
            }
            let mut losses = Vec::new();
            for step in 0..2 {
                let (ids, targets) = batch(&data, c.batch, c.model.context, step, 5).unwrap();
                losses.push(t.train_step(&ids, &targets).unwrap());
                losses.push(t.eval_loss(&ids, &targets).unwrap());
            }
            let text = t.generate(&[1, 2, 3], 12, 0.8, 7).unwrap();
            assert!(!t.compile_ahead(), "{name}: nothing left to compile");
            results.push((losses, text));
        }
        assert_eq!(results[0], results[1], "{name}");
        // Dropped at once: the drop waits for the compiling thread.
        let t = GptTrainer::new(&backend, &c).unwrap();
        assert!(t.compile_ahead());
        drop(t);
    }
}

/// Sampling with the key/value cache (while the sequence fits the context of 8) and with the
/// whole window (past it) gives the greedy ids of the logits of each whole window, after
/// training changed the parameters on the device: the cached routines read them there.
#[test]
fn cached_sampling_agrees_with_whole_windows_across_the_context() {
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let c = config(vocab.len());
    let backend = arrayjit::backend("sync_cc").unwrap();
    let mut trainer = GptTrainer::new(&backend, &c).unwrap();
    for step in 0..20 {
        let (ids, targets) = batch(&data, c.batch, c.model.context, step, 3).unwrap();
        trainer.train_step(&ids, &targets).unwrap();
    }
    let prompt = vocab.encode("to b").unwrap();
    // 4 prompt ids + 12 new: the cache serves ids 5 to 8, whole windows the rest.
    let cached = trainer.generate(&prompt, 12, 0.0, 0).unwrap();
    let mut ids = prompt.clone();
    for _ in 0..12 {
        let logits = trainer.next_logits(&ids).unwrap();
        let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        ids.push(best);
    }
    assert_eq!(cached, ids[prompt.len()..]);
    // Training on, then sampling again: the cache routines see the new parameters.
    for step in 20..30 {
        let (ids, targets) = batch(&data, c.batch, c.model.context, step, 3).unwrap();
        trainer.train_step(&ids, &targets).unwrap();
    }
    let again = trainer.generate(&prompt, 4, 0.0, 0).unwrap();
    let mut ids = prompt.clone();
    for _ in 0..4 {
        let logits = trainer.next_logits(&ids).unwrap();
        let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        ids.push(best);
    }
    assert_eq!(again, ids[prompt.len()..]);
    assert!(trainer.generate(&[], 3, 0.0, 0).is_err());
    assert!(trainer.generate(&[vocab.len()], 3, 0.0, 0).is_err());
}

//! A character-level bigram model: a `[vocab, vocab]` table of logits trained with softmax
//! cross-entropy on a small text made in code, then sampled.
//! Run: `cargo run --release --example bigram`.

use arrayjit_ir::fallible::try_vec_filled;
use arrayjit_ir::{Error, Result};
use arrayjit_tensor::Optimizer;
use arrayjit_tensor::datasets::Dataset;
use arrayjit_tensor::rng::Philox;

use arrayjit::train::{Classifier, LossKind, Mlp, TrainConfig};

/// A small text with regular structure, generated from word lists (no external data).
pub fn corpus(sentences: usize, seed: u64) -> String {
    let subjects = [
        "the cat",
        "a dog",
        "the bird",
        "my friend",
        "the old man",
        "a child",
    ];
    let verbs = ["sees", "likes", "follows", "finds", "draws", "hears"];
    let objects = [
        "the moon",
        "a red ball",
        "the river",
        "an apple",
        "the garden",
        "a song",
    ];
    let rng = Philox::new(seed, 9);
    let pick = |list: &[&'static str], i: u64| {
        list[(rng.uniform(i) * list.len() as f64) as usize % list.len()]
    };
    (0..sentences as u64)
        .map(|s| {
            format!(
                "{} {} {}. ",
                pick(&subjects, 3 * s),
                pick(&verbs, 3 * s + 1),
                pick(&objects, 3 * s + 2)
            )
        })
        .collect()
}

/// A trained bigram model.
pub struct Bigram {
    /// The characters, in index order.
    pub vocab: Vec<char>,
    classifier: Classifier,
    /// Mean loss of each epoch.
    pub losses: Vec<f64>,
    /// The loss of the best possible bigram model (the conditional entropy of the text).
    pub optimal_loss: f64,
}

impl Bigram {
    /// Trains on `text` for `epochs` on the named backend.
    pub fn train(text: &str, backend: &str, epochs: usize, seed: u64) -> Result<Bigram> {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let v = vocab.len();
        if v < 2 || text.chars().count() < 3 {
            return Err(Error::invalid(
                "the text needs at least two distinct characters",
            ));
        }
        let index = |c: char| vocab.binary_search(&c).unwrap_or(0);
        let chars: Vec<usize> = text.chars().map(index).collect();
        let pairs = chars.len() - 1;
        let mut x = try_vec_filled(one_hot_size(pairs, v)?, 0.0, || {
            format!("one-hot inputs of {pairs} character pairs over {v} characters")
        })?;
        for (i, w) in chars.windows(2).enumerate() {
            x[i * v + w[0]] = 1.0;
        }
        let data = Dataset {
            x,
            labels: chars[1..].to_vec(),
            features: v,
            classes: v,
        };
        // The best bigram model's loss, from counts.
        let mut counts = try_vec_filled(one_hot_size(v, v)?, 0usize, || {
            format!("bigram counts over {v} characters")
        })?;
        for w in chars.windows(2) {
            counts[w[0] * v + w[1]] += 1;
        }
        let counts: Vec<&[usize]> = counts.chunks(v).collect();
        let optimal_loss = counts
            .iter()
            .map(|row| {
                let total: usize = row.iter().sum();
                row.iter()
                    .filter(|&&n| n > 0)
                    .map(|&n| -(n as f64) * (n as f64 / total as f64).ln())
                    .sum::<f64>()
            })
            .sum::<f64>()
            / pairs as f64;
        let b = arrayjit_runtime::backend(backend)?;
        // One linear layer: logits = one_hot(previous) · W + bias.
        let model = Mlp::new(&[v, v], seed)?;
        let cfg = TrainConfig {
            epochs,
            batch_size: 32,
            optimizer: Optimizer::adam(0.05),
            loss: LossKind::SoftmaxCrossEntropy,
            shards: 1,
        };
        let classifier = Classifier::new(&b, model, &data, &cfg)?;
        let losses = (0..epochs)
            .map(|e| classifier.epoch(e).map(|s| s.loss))
            .collect::<Result<Vec<_>>>()?;
        Ok(Bigram {
            vocab,
            classifier,
            losses,
            optimal_loss,
        })
    }

    /// `n` characters sampled after `start`, reproducibly from `seed`.
    pub fn sample(&self, start: char, n: usize, seed: u64) -> Result<String> {
        let v = self.vocab.len();
        let mut table = try_vec_filled(one_hot_size(v, v)?, 0.0, || {
            format!("one-hot rows of {v} characters")
        })?;
        for i in 0..v {
            table[i * v + i] = 1.0;
        }
        let logits = self.classifier.predict_scores(&table, v)?;
        let rng = Philox::new(seed, 11);
        let mut out = String::new();
        let mut cur = self.vocab.binary_search(&start).unwrap_or(0);
        for step in 0..n {
            let row = &logits[cur * v..(cur + 1) * v];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = row.iter().map(|l| (l - m).exp()).collect();
            let total: f64 = p.iter().sum();
            let mut u = rng.uniform(step as u64) * total;
            cur = p
                .iter()
                .position(|&w| {
                    u -= w;
                    u <= 0.0
                })
                .unwrap_or(v - 1);
            out.push(self.vocab[cur]);
        }
        Ok(out)
    }
}

/// `rows × columns` values of a one-hot table, or an error when the product overflows.
fn one_hot_size(rows: usize, columns: usize) -> Result<usize> {
    rows.checked_mul(columns).ok_or_else(|| Error::OutOfMemory {
        what: format!(
            "a one-hot table of {rows} × {columns} values (use a text with fewer distinct \
                 characters)"
        ),
        bytes: usize::MAX,
    })
}

fn main() -> arrayjit::Result<()> {
    arrayjit::install_logging();
    let text = corpus(400, 1);
    let backend = arrayjit::default_backend()?;
    let model = Bigram::train(&text, backend.name(), 30, 1)?;
    println!(
        "{} characters, vocabulary of {}; loss {:.3} -> {:.3} (best possible bigram loss {:.3})",
        text.chars().count(),
        model.vocab.len(),
        model.losses[0],
        model.losses.last().copied().unwrap_or(f64::NAN),
        model.optimal_loss
    );
    println!("sample: {}", model.sample('t', 200, 7)?);
    Ok(())
}

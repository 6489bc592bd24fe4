//! A character-level bigram model trained on a small generated text, then sampled.
//! Run: `cargo run --release --example bigram`.

fn main() -> arrayjit::Result<()> {
    let text = arrayjit::bigram::corpus(400, 1);
    let backend = arrayjit::default_backend()?;
    let model = arrayjit::bigram::Bigram::train(&text, backend.name(), 30, 1)?;
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

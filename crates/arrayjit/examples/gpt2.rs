//! Continue a prompt with GPT-2's real weights (or any GPT-2 checkpoint in Hugging Face's
//! layout), generating with a key/value cache on the default backend.
//!
//! ```text
//! huggingface-cli download gpt2 --local-dir gpt2      # or transformers' save_pretrained
//! cargo run --release --example gpt2 -- --model gpt2 --prompt "The meaning of life is"
//! ```
//!
//! Flags: `--model DIR` (required), `--prompt TEXT`, `--tokens N` (default 40),
//! `--temperature T` (default 0: greedy), `--top-k K`, `--top-p P`, `--seed S`.

use std::path::PathBuf;
use std::time::Instant;

use arrayjit::gpt2::{Gpt2, Gpt2Tokenizer, Sampling};

fn value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or(format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: cannot read {v:?}"))
}

struct Args {
    model: PathBuf,
    prompt: String,
    tokens: usize,
    sampling: Sampling,
}

fn parse() -> Result<Args, String> {
    let mut model = None;
    let mut prompt = "The meaning of life is".to_string();
    let mut tokens = 40;
    let mut sampling = Sampling::greedy();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value::<String>(&flag, args.next())?)),
            "--prompt" => prompt = value(&flag, args.next())?,
            "--tokens" => tokens = value(&flag, args.next())?,
            "--temperature" => sampling.temperature = value(&flag, args.next())?,
            "--top-k" => sampling.top_k = Some(value(&flag, args.next())?),
            "--top-p" => sampling.top_p = Some(value(&flag, args.next())?),
            "--seed" => sampling.seed = value(&flag, args.next())?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let model = model.ok_or("--model DIR is required (a GPT-2 checkpoint directory)")?;
    Ok(Args {
        model,
        prompt,
        tokens,
        sampling,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let backend = arrayjit::initialize(None)?;
    let started = Instant::now();
    let tokenizer = Gpt2Tokenizer::from_pretrained(&args.model)?;
    let model = Gpt2::from_pretrained(&args.model, &backend)?;
    eprintln!(
        "loaded {} ({:.0}M parameters) in {:.1} s",
        args.model.display(),
        model.config().parameter_count() as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    let prompt = tokenizer.encode(&args.prompt)?;
    let stop: Vec<usize> = model.config().end_of_text.into_iter().collect();
    let tokens = model.generate(&prompt, args.tokens, &args.sampling, &stop)?;
    println!("{}{}", args.prompt, tokenizer.decode(&tokens)?);
    if let Some(t) = model.last_timing() {
        eprintln!(
            "compile {:.2} s, prompt of {} tokens {:.0} ms, then {:.1} tokens/s",
            model.compile_time().as_secs_f64(),
            t.prompt_tokens,
            t.prefill.as_secs_f64() * 1e3,
            t.decode_steps_per_second()
        );
    }
    Ok(())
}

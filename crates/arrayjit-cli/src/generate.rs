//! `arrayjit generate`: text from a GPT-2 checkpoint in Hugging Face's layout, with the
//! key/value cache; the text on stdout, timings (load, compile, prefill, tokens/s) on stderr.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use arrayjit::gpt2::{Gpt2, Gpt2Tokenizer, Sampling};
use clap::Args;

/// The flags of `arrayjit generate`.
#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// A directory with `config.json`, `model.safetensors` and the tokenizer (`tokenizer.json`,
    /// or `vocab.json` + `merges.txt`), e.g. from `huggingface-cli download gpt2`.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to continue.
    #[arg(long, default_value = "Hello, I'm a language model,")]
    pub prompt: String,
    /// New tokens to generate.
    #[arg(long, default_value_t = 50)]
    pub tokens: usize,
    /// Sampling temperature (0: the most likely token every time).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample among the k most likely tokens only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the fewest most likely tokens whose probabilities add up to p.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Generate this many continuations of the prompt at once (one batch).
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Do not stop at the end-of-text token.
    #[arg(long)]
    pub ignore_end: bool,
    /// Prompt tokens the short prefill routine takes per run (a long prompt runs in chunks of
    /// 512 first).
    #[arg(long, default_value_t = arrayjit::gpt2::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Time the prefill and decode routines statement by statement, and print where their
    /// time went.
    #[arg(long)]
    pub statements: bool,
    /// How the model multiplies: `f32`; `bf16-weights` (weights stored in bf16, half the
    /// memory, decoding about twice as fast on a CPU); or `bf16` (products of bf16 operands,
    /// for a GPU's matrix units).
    #[arg(long, default_value = "f32")]
    pub precision: arrayjit::tensor::Precision,
}

/// Runs `arrayjit generate` on `backend` (the default backend when `None`).
pub fn run(backend: Option<String>, args: &GenerateArgs) -> arrayjit::Result<()> {
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    sampling.check()?;
    if args.samples == 0 {
        return Err(arrayjit::Error::BadValue {
            what: "--samples".into(),
            value: "0".into(),
            expected: "at least 1".into(),
        });
    }
    let backend = arrayjit::runtime::initialize(backend.as_deref())?;
    if args.statements {
        let mut settings = backend.optimize_settings();
        settings.profile_statements = true;
        backend.set_optimize_settings(settings);
    }
    let started = Instant::now();
    let tokenizer = Gpt2Tokenizer::from_pretrained(&args.model)?;
    let mut model = Gpt2::from_pretrained_with(&args.model, &backend, args.precision)?;
    model.set_prefill_chunk(args.prefill_chunk)?;
    let loaded = started.elapsed();
    let prompt = tokenizer.encode(&args.prompt)?;
    let stop: Vec<usize> = match model.config().end_of_text {
        Some(end) if !args.ignore_end => vec![end],
        _ => Vec::new(),
    };
    let prompts = vec![prompt.clone(); args.samples];
    let started = Instant::now();
    let rows = model.generate_batch(&prompts, args.tokens, &sampling, &stop)?;
    let total = started.elapsed();
    let mut out = std::io::stdout().lock();
    for (k, row) in rows.iter().enumerate() {
        if args.samples > 1 {
            writeln!(out, "--- sample {k}").ok();
        }
        writeln!(out, "{}{}", args.prompt, tokenizer.decode(row)?).ok();
    }
    let c = model.config();
    eprintln!(
        "{} ({} layers, width {}, {:.0}M parameters, precision {}) on {}: loaded in {:.2} s",
        args.model.display(),
        c.layers,
        c.width,
        c.parameter_count() as f64 / 1e6,
        args.precision,
        backend.name(),
        loaded.as_secs_f64()
    );
    if let Some(t) = model.last_timing() {
        let compile = model.compile_time();
        eprintln!(
            "compile {:.2} s; prefill of {} tokens {:.1} ms; {} decoding steps at {:.1} tokens/s \
             per row ({} rows); {:.2} s in all",
            compile.as_secs_f64(),
            t.prompt_tokens,
            t.prefill.as_secs_f64() * 1e3,
            t.decode_steps,
            t.decode_steps_per_second(),
            args.samples,
            total.as_secs_f64()
        );
    }
    let [prefill, long_prefill, decode] = model.statement_profiles(args.samples);
    for (name, profile) in [
        ("prefill", prefill),
        ("long prefill", long_prefill),
        ("decode", decode),
    ] {
        if let Some(profile) = profile {
            eprintln!("the {name} routine's slowest statements (all its runs):");
            eprintln!("{}", profile.table(15, None));
        }
    }
    Ok(())
}

//! The benchmark's generation row (issue 65): GPT-2 small (124M parameters, random weights)
//! decoding with its key/value cache at batch 1, and a 512-token prompt's prefill, beside
//! Hugging Face `transformers` (`generate` with its cache, and the model's forward) at the same
//! threads, and the machine's limit: the parameters' bytes read per token over the measured
//! read bandwidth. Twice per thread count: weights in f32 (`transformers` in float32), and in
//! bf16 (arrayjit's [`Precision::Bf16Weights`], `transformers` loaded in bfloat16). Runs only
//! when `--only` names it (`generation`): it writes a 500 MB checkpoint (for `transformers` to
//! load the same weights) and takes about two minutes.

use std::fmt::Write as _;

use arrayjit::gpt2::{Gpt2, Gpt2Config, Sampling};
use arrayjit::tensor::Precision;
use arrayjit_backends::device_info::CpuInfo;
use arrayjit_ir::{Error, Result};

use super::limits::Limits;
use super::{BenchConfig, json_field};

/// The row's name, which `--only` matches.
pub const ROW: &str = "GPT-2 small generation b1";

/// New tokens per timed generation (after a warm-up that compiles).
const TOKENS: usize = 64;

/// The prompt whose forward is timed.
const PROMPT: usize = 512;

/// One thread count's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Figures {
    /// Decoding steps per second.
    decode: Option<f64>,
    /// Milliseconds of the prompt's forward.
    prefill_ms: Option<f64>,
}

/// The two ways the row runs the model: arrayjit's precision and `transformers`' dtype.
const PRECISIONS: [(Precision, &str); 2] = [
    (Precision::F32, "float32"),
    (Precision::Bf16Weights, "bfloat16"),
];

/// arrayjit's figures on `backend` for the checkpoint in `dir` in `precision`, and the bytes of
/// its parameters (what a decoding step reads).
fn ours(dir: &std::path::Path, backend: &str, precision: Precision) -> Result<(Figures, f64)> {
    let backend = arrayjit::backend(backend)?;
    let model = Gpt2::from_pretrained_with(dir, &backend, precision)?;
    let bytes: usize = model
        .params()
        .iter()
        .map(|p| p.dims().iter().product::<usize>() * p.prec().size_in_bytes())
        .sum();
    let prompt = [15496, 11, 314, 1101, 257, 3303, 2746, 11];
    // The first generation compiles; the timed one compiles nothing.
    model.generate(&prompt, 4, &Sampling::greedy(), &[])?;
    let compiled = model.routine_counts().1;
    model.generate(&prompt, TOKENS, &Sampling::greedy(), &[])?;
    if model.routine_counts().1 != compiled {
        return Err(Error::invalid("the timed generation compiled routines"));
    }
    let decode = model.last_timing().map(|t| t.decode_steps_per_second());
    // The prompt's time to its first new token: the prefill routine over it in chunks.
    let ids: Vec<usize> = (0..PROMPT).map(|k| (k * 7919) % 50257).collect();
    let mut times = Vec::new();
    for _ in 0..3 {
        model.generate(&ids, 1, &Sampling::greedy(), &[])?;
        let t = model.last_timing().map(|t| t.prefill.as_secs_f64() * 1e3);
        times.push(t.unwrap_or(f64::NAN));
    }
    times.sort_by(f64::total_cmp);
    let figures = Figures {
        decode,
        prefill_ms: Some(times[1]),
    };
    Ok((figures, bytes as f64))
}

/// `transformers`' figures at `threads` with the weights in `dtype`, from
/// `gpt2_generate_torch.py`.
fn peer(
    config: &BenchConfig,
    dir: &std::path::Path,
    (threads, dtype): (usize, &str),
    notes: &mut Vec<String>,
) -> Figures {
    let out = std::process::Command::new(super::python(config))
        .arg(super::peer_script("gpt2_generate_torch.py"))
        .args(["--model", &dir.display().to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--tokens", &TOKENS.to_string()])
        .args(["--prefill", &PROMPT.to_string()])
        .args(["--dtype", dtype])
        .output();
    let line = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .map(String::from),
        Ok(o) => {
            notes.push(format!(
                "transformers {threads} thread(s) {dtype} failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
            None
        }
        Err(e) => {
            notes.push(format!("transformers could not start: {e}"));
            None
        }
    };
    let Some(line) = line else {
        return Figures::default();
    };
    let number = |key: &str| json_field(&line, key).and_then(|v| v.parse().ok());
    Figures {
        decode: number("decode_tokens_per_s"),
        prefill_ms: number("prefill_ms"),
    }
}

/// Measures the row when `config.only` names it; its table (markdown), or `None`.
pub fn run(config: &BenchConfig, cpu: &CpuInfo, limits: &Limits) -> Result<Option<String>> {
    if config.only.is_empty() || !ROW.contains(&config.only) {
        return Ok(None);
    }
    let dir =
        tempfile::tempdir().map_err(|e| Error::io("making a folder for the checkpoint", e))?;
    let config2 = Gpt2Config::small();
    eprintln!("writing a random GPT-2 small checkpoint for both sides ...");
    let cpu_backend = arrayjit::backend("sync_cc")?;
    Gpt2::random(config2, 1, &cpu_backend)?.save_pretrained(dir.path())?;
    let mut notes = Vec::new();
    let mut lines = Vec::new();
    for (k, (backend, threads)) in [("sync_cc", 1), ("multicore_cc", cpu.cores.max(1))]
        .into_iter()
        .enumerate()
    {
        if k == 1 && threads == 1 {
            continue;
        }
        for (precision, dtype) in PRECISIONS {
            eprintln!("arrayjit {backend} {precision}: {ROW} ...");
            let (ours, bytes) = ours(dir.path(), backend, precision)?;
            let theirs = if config.no_peers {
                Figures::default()
            } else {
                eprintln!("transformers {threads} thread(s) {dtype}: {ROW} ...");
                peer(config, dir.path(), (threads, dtype), &mut notes)
            };
            let limit = limits.read_gbs[k.min(1)] * 1e9 / bytes;
            lines.push(Line {
                threads,
                precision,
                ours,
                theirs,
                limit,
            });
        }
    }
    Ok(Some(table(&lines, &notes)))
}

/// One line of the table.
struct Line {
    threads: usize,
    precision: Precision,
    ours: Figures,
    theirs: Figures,
    /// Tokens per second the read bandwidth allows.
    limit: f64,
}

fn table(lines: &[Line], notes: &[String]) -> String {
    let f = |v: Option<f64>, digits: usize| v.map_or("–".into(), |v| format!("{v:.digits$}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| model | threads | weights | arrayjit decode (tokens/s) | transformers generate | vs transformers | bandwidth limit (tokens/s) | of limit | arrayjit prompt of {PROMPT} tokens | transformers forward | vs transformers |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for l in lines {
        let (ours, theirs, limit) = (&l.ours, &l.theirs, l.limit);
        let weights = match l.precision {
            Precision::Bf16Weights => "bf16",
            _ => "f32",
        };
        let _ = writeln!(
            out,
            "| {ROW} | {} | {weights} | {} | {} | {} | {limit:.1} | {} | {} ms | {} ms | {} |",
            l.threads,
            f(ours.decode, 1),
            f(theirs.decode, 1),
            ratio(ours.decode, theirs.decode),
            ours.decode
                .map_or("–".into(), |d| format!("{:.0}%", 100.0 * d / limit)),
            f(ours.prefill_ms, 0),
            f(theirs.prefill_ms, 0),
            ratio(theirs.prefill_ms, ours.prefill_ms),
        );
    }
    super::legend_and_notes(
        &mut out,
        &format!(
            "Generation row: GPT-2 small (124M parameters, random weights), greedy, batch 1, an \
         8-token prompt then {TOKENS} tokens with the key/value cache (the rate counts the steps \
         after the first token); the bandwidth limit is the parameters' bytes read per token over \
         the C reference's read bandwidth; a {PROMPT}-token prompt's time to its first token \
         (arrayjit: the prefill routines, a chunk of 512 while at least three quarters of one \
         is prompt, then chunks of 64, attention fused over the cache, the output head for the \
         last token only; transformers: one forward, every position's logits), the median of 3. Weights \
         bf16: arrayjit stores the matrix weights and embeddings in bf16 and multiplies f32 \
         activations by them (`--precision bf16-weights`); transformers loads the model in \
         bfloat16 and computes in it."
        ),
        notes,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_the_ratios_and_the_limit() {
        let ours = Figures {
            decode: Some(30.0),
            prefill_ms: Some(500.0),
        };
        let theirs = Figures {
            decode: Some(20.0),
            prefill_ms: Some(600.0),
        };
        let line = Line {
            threads: 1,
            precision: Precision::Bf16Weights,
            ours,
            theirs,
            limit: 40.0,
        };
        let text = table(&[line], &[]);
        assert!(
            text.contains(&format!(
                "| {ROW} | 1 | bf16 | 30.0 | 20.0 | 1.50× | 40.0 | 75% | 500 ms | 600 ms | 1.20× |"
            )),
            "{text}"
        );
    }
}

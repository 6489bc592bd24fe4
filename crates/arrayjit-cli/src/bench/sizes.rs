//! The benchmark's size axis: GPTs from the demo's size to GPT-2 small's width and depth,
//! each trained next to PyTorch eager (`benches/peers/gpt_torch.py --size`) on one thread and on
//! all. Every measurement runs in a process of its own (this binary's hidden `bench-gpt-size`
//! command, the peer script), so that a cold compile starts from an empty cache and the peak
//! resident memory is that model's alone.
//!
//! Per size: arrayjit's build (parameters, optimize, compile, link) from an empty compile cache
//! and from a filled one, its step on `sync_cc` (one thread) and `multicore_cc` (all), PyTorch's
//! build and step at the same thread counts, and both processes' peak resident memory at all
//! threads.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use arrayjit::gpt::{self, CharVocab, GptTrainer, SONNETS, TrainerConfig};
use arrayjit_backends::device_info::CpuInfo;
use arrayjit_ir::{Error, Result};

use super::limits::Limits;
use super::{BenchConfig, json_field};

/// One model of the size axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptSize {
    /// Context (tokens per window).
    pub context: usize,
    /// Model width (the MLP is 4 × width).
    pub width: usize,
    /// Attention heads.
    pub heads: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Windows per step.
    pub batch: usize,
}

/// The four sizes of the table: the demo's, two between, and GPT-2 small's width and depth at a
/// shorter context (batch lowered as the model grows, as people do to fit a step in memory).
pub const SIZES: [GptSize; 4] = [
    GptSize::new(64, 128, 4, 2, 16),
    GptSize::new(128, 256, 4, 4, 16),
    GptSize::new(256, 384, 6, 6, 8),
    GptSize::new(256, 768, 12, 12, 4),
];

/// Timed steps per size after the first (fewer for the larger, slower ones).
const STEPS: [usize; 4] = [20, 8, 4, 3];

impl GptSize {
    /// A size from its five numbers.
    pub const fn new(
        context: usize,
        width: usize,
        heads: usize,
        layers: usize,
        batch: usize,
    ) -> Self {
        GptSize {
            context,
            width,
            heads,
            layers,
            batch,
        }
    }

    /// The row's name, which `--only` matches (`GPT size` selects every row).
    pub fn name(&self) -> String {
        format!(
            "GPT size T{} d{} h{} L{} b{}",
            self.context, self.width, self.heads, self.layers, self.batch
        )
    }

    /// The five numbers as the child command and the peer script take them: `T,D,H,L,B`.
    pub fn spec(&self) -> String {
        format!(
            "{},{},{},{},{}",
            self.context, self.width, self.heads, self.layers, self.batch
        )
    }

    /// A size from [`GptSize::spec`]'s form; a typed error naming what was wrong.
    pub fn parse(spec: &str) -> Result<GptSize> {
        let bad = || Error::BadValue {
            what: "GPT size".into(),
            value: spec.into(),
            expected: "five positive whole numbers: context,width,heads,layers,batch".into(),
        };
        let n: Vec<usize> = spec
            .split(',')
            .map(|v| v.trim().parse().ok().filter(|&v| v > 0))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        match n[..] {
            [context, width, heads, layers, batch] => {
                Ok(GptSize::new(context, width, heads, layers, batch))
            }
            _ => Err(bad()),
        }
    }

    /// `arrayjit gpt`'s trainer (AdamW, clipping, exact GELU, the sonnets' vocabulary) at this
    /// size, MLP 4 × width.
    pub fn config(&self) -> TrainerConfig {
        let mut config = TrainerConfig::small(CharVocab::from_text(SONNETS).len());
        config.model.context = self.context;
        config.model.width = self.width;
        config.model.heads = self.heads;
        config.model.layers = self.layers;
        config.model.hidden = 4 * self.width;
        config.batch = self.batch;
        config
    }
}

/// What a size's model is besides its five numbers (the hidden command's flags): the
/// vocabulary (the sonnets' characters by default; GPT-2's 50257 draws ids from its range),
/// the attention and the GELU.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelChoice {
    /// Token ids; `None`: the sonnets' characters.
    pub vocabulary: Option<usize>,
    /// Fused or unfused attention.
    pub attention: arrayjit::tensor::nn::AttentionKind,
    /// GELU's tanh form instead of the exact one.
    pub gelu_tanh: bool,
}

/// What one process measured (seconds; bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Measured {
    /// The build (parameters; arrayjit: also optimize, compile, link).
    pub build: f64,
    /// The first step (`torch.compile`'s holds its compile), where reported.
    pub first: Option<f64>,
    /// The median of the timed steps, if any ran.
    pub step: Option<f64>,
    /// The process's peak resident memory.
    pub peak_rss: Option<u64>,
}

/// The hidden `bench-gpt-size` command: builds the GPT of `spec` on `backend`, takes one step,
/// then `steps` timed ones; returns one JSON line (build, first step, median step, peak
/// resident memory in bytes).
pub fn child(spec: &str, backend: &str, steps: usize, model: &ModelChoice) -> Result<String> {
    let size = GptSize::parse(spec)?;
    let mut config = size.config();
    config.model.attention = model.attention;
    if model.gelu_tanh {
        config.model.gelu = arrayjit::tensor::nn::Gelu::Tanh;
    }
    let backend = arrayjit_runtime::backend(backend)?;
    let mut data = CharVocab::from_text(SONNETS).encode(SONNETS)?;
    if let Some(v) = model.vocabulary {
        config.model.vocabulary = v;
        // Ids spread over the whole vocabulary (the sonnets' characters, scattered).
        for (i, id) in data.iter_mut().enumerate() {
            *id = (*id * 7919 + i * 104_729) % v;
        }
    }
    let (ids, targets) = gpt::batch(&data, config.batch, config.model.context, 0, 1)?;
    let started = Instant::now();
    let mut trainer = GptTrainer::new(&backend, &config)?;
    let build = started.elapsed();
    let first = Instant::now();
    trainer.train_step(&ids, &targets)?;
    let first = first.elapsed();
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        trainer.train_step(&ids, &targets)?;
        times.push(t.elapsed());
    }
    times.sort();
    let step = times.get(times.len() / 2).map(Duration::as_secs_f64);
    let mut line = format!(
        "{{\"lib\": \"arrayjit\", \"build_s\": {}, \"first_step_s\": {}",
        build.as_secs_f64(),
        first.as_secs_f64()
    );
    if let Some(s) = step {
        let _ = write!(line, ", \"step_s\": {s}");
    }
    if let Some(p) = arrayjit_ir::host_memory::peak_resident_bytes() {
        let _ = write!(line, ", \"peak_rss_bytes\": {p}");
    }
    line.push('}');
    Ok(line)
}

/// Reads a child's or the peer's JSON line.
fn parse_measured(out: &str) -> Option<Measured> {
    let line = out.lines().rev().find(|l| l.starts_with('{'))?;
    Some(Measured {
        build: json_field(line, "build_s")?.parse().ok()?,
        first: json_field(line, "first_step_s").and_then(|s| s.parse().ok()),
        step: json_field(line, "step_s").and_then(|s| s.parse().ok()),
        peak_rss: json_field(line, "peak_rss_bytes").and_then(|s| s.parse().ok()),
    })
}

/// The programs that measure in processes of their own: this one (its hidden
/// `bench-gpt-size` command), and the peers' Python with `gpt_torch.py`.
pub(super) fn measuring_programs(
    config: &BenchConfig,
) -> Result<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    let exe = std::env::current_exe().map_err(|e| Error::BadValue {
        what: "this program's path (to measure in processes of its own)".into(),
        value: e.to_string(),
        expected: "a readable executable path".into(),
    })?;
    Ok((
        exe,
        super::python(config),
        super::peer_script("gpt_torch.py"),
    ))
}

/// The hidden `bench-gpt-size` command training the GPT of `size` on `backend`, `steps` timed
/// steps after the first.
pub(super) fn ours_command(
    exe: &std::path::Path,
    size: &GptSize,
    backend: &str,
    steps: usize,
) -> Command {
    let mut cmd = Command::new(exe);
    // The child builds from a cache of its own (to time a cold build): it blocks its products
    // as this process does, `arrayjit tune`'s stored choice included.
    if std::env::var_os("ARRAYJIT_CPU_SHARES").is_none()
        && let Some(shares) = super::user_cpu_shares()
    {
        cmd.env("ARRAYJIT_CPU_SHARES", shares.to_string());
    }
    cmd.args([
        "bench-gpt-size",
        "--size",
        &size.spec(),
        "--backend",
        backend,
    ])
    .args(["--steps", &steps.to_string()]);
    cmd
}

/// `gpt_torch.py --size` training the same GPT on `threads` threads, `steps` timed steps.
pub(super) fn torch_command(
    python: &std::path::Path,
    script: &std::path::Path,
    size: &GptSize,
    threads: usize,
    steps: usize,
) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .args(["--size", &size.spec(), "--threads", &threads.to_string()])
        .args(["--steps", &steps.to_string()]);
    // With `--compile`, its first step compiles from an empty inductor cache, as arrayjit's cold
    // build starts from an empty compile cache (`measure` removes the folder afterwards).
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cmd.env(
        INDUCTOR_CACHE,
        std::env::temp_dir().join(format!(
            "arrayjit-bench-inductor-{}-{run}",
            std::process::id()
        )),
    );
    cmd
}

/// The variable that points PyTorch's inductor at its cache folder.
const INDUCTOR_CACHE: &str = "TORCHINDUCTOR_CACHE_DIR";

/// Runs one measuring process; a failure is a note, not an error of the whole table.
pub(super) fn measure(mut cmd: Command, what: &str, notes: &mut Vec<String>) -> Option<Measured> {
    eprintln!("{what} ...");
    let output = cmd.output();
    // A fresh inductor cache given to the command (see `torch_command`) is not kept.
    if let Some((_, Some(dir))) = cmd.get_envs().find(|(k, _)| *k == INDUCTOR_CACHE) {
        let _ = std::fs::remove_dir_all(dir);
    }
    match output {
        Ok(out) if out.status.success() => {
            let m = parse_measured(&String::from_utf8_lossy(&out.stdout));
            if m.is_none() {
                notes.push(format!("{what}: no measurement in its output"));
            }
            m
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            notes.push(format!(
                "{what} failed: {}",
                err.lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no message")
            ));
            None
        }
        Err(e) => {
            notes.push(format!("{what} not run: {e}"));
            None
        }
    }
}

/// One size's measurements.
#[derive(Default)]
struct Row {
    cold: Option<Measured>,
    cached: Option<Measured>,
    one: Option<Measured>,
    torch_one: Option<Measured>,
    torch_all: Option<Measured>,
    /// `torch.compile` of the same model, one thread and all.
    compiled_one: Option<Measured>,
    compiled_all: Option<Measured>,
}

/// Measures the sizes whose names contain `config.only` (`--quick`: the two smaller) and
/// returns their table (markdown), or `None` when no size was selected.
pub fn run(config: &BenchConfig, cpu: &CpuInfo, limits: &Limits) -> Result<Option<String>> {
    let count = if config.quick { 2 } else { SIZES.len() };
    let chosen: Vec<(GptSize, usize)> = SIZES
        .iter()
        .zip(STEPS)
        .take(count)
        .filter(|(s, _)| s.name().contains(&config.only))
        .map(|(&s, n)| (s, n))
        .collect();
    if chosen.is_empty() {
        return Ok(None);
    }
    let (exe, python, script) = measuring_programs(config)?;
    let mut notes = Vec::new();
    let mut rows = Vec::new();
    for (size, steps) in &chosen {
        let cache = std::env::temp_dir().join(format!(
            "arrayjit-bench-sizes-{}-{}",
            std::process::id(),
            size.layers
        ));
        let _ = std::fs::remove_dir_all(&cache);
        let ours = |backend: &str, steps: usize| {
            let mut cmd = ours_command(&exe, size, backend, steps);
            cmd.env("ARRAYJIT_CACHE_DIR", &cache);
            cmd
        };
        let name = size.name();
        let mut row = Row {
            cold: measure(
                ours("multicore_cc", *steps),
                &format!("arrayjit multicore_cc: {name}, cold cache"),
                &mut notes,
            ),
            cached: measure(
                ours("multicore_cc", 0),
                &format!("arrayjit multicore_cc: {name}, cached build"),
                &mut notes,
            ),
            one: measure(
                ours("sync_cc", *steps),
                &format!("arrayjit sync_cc: {name}"),
                &mut notes,
            ),
            ..Row::default()
        };
        let _ = std::fs::remove_dir_all(&cache);
        if !config.no_peers {
            let torch = |threads: usize| torch_command(&python, &script, size, threads, *steps);
            row.torch_one = measure(torch(1), &format!("torch 1 thread: {name}"), &mut notes);
            row.torch_all = measure(
                torch(cpu.cores),
                &format!("torch {} threads: {name}", cpu.cores),
                &mut notes,
            );
            let compiled = |threads: usize| {
                let mut cmd = torch(threads);
                cmd.arg("--compile");
                cmd
            };
            row.compiled_one = measure(
                compiled(1),
                &format!("torch.compile 1 thread: {name}"),
                &mut notes,
            );
            row.compiled_all = measure(
                compiled(cpu.cores),
                &format!("torch.compile {} threads: {name}", cpu.cores),
                &mut notes,
            );
        }
        rows.push((*size, row));
    }
    Ok(Some(table(cpu.cores, limits.fma_gflops[1], &rows, &notes)))
}

/// A time of a measurement in milliseconds, `–` where absent.
pub(super) fn ms(m: Option<Measured>, f: impl Fn(Measured) -> Option<f64>) -> String {
    m.and_then(f)
        .map_or("–".into(), |s| format!("{:.0} ms", s * 1e3))
}

/// `peer / ours` (> 1: arrayjit is faster), `–` where either is absent.
pub(super) fn ratio(peer: Option<f64>, ours: Option<f64>) -> String {
    match (peer, ours) {
        (Some(p), Some(a)) if a > 0.0 => format!("{:.2}×", p / a),
        _ => "–".into(),
    }
}

/// A measurement's peak memory in MiB, `–` where absent.
pub(super) fn mib(m: Option<Measured>) -> String {
    m.and_then(|m| m.peak_rss).map_or("–".into(), |b| {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    })
}

/// The size table (markdown): steps and their ratios at one thread and at all (> 1: arrayjit is
/// faster), arrayjit's rate at all threads against the FMA limit (`fma_gflops`, all cores),
/// each library's speed-up from one thread to all, builds, peak memory.
fn table(cores: usize, fma_gflops: f64, rows: &[(GptSize, Row)], notes: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| model | arrayjit step 1T | torch step 1T | torch / arrayjit 1T | arrayjit step {cores}T | torch step {cores}T | torch / arrayjit {cores}T | arrayjit {cores}T GFLOP/s (of FMA limit) | 1→{cores}T arrayjit / torch | arrayjit build cold / cached | torch build | peak memory arrayjit / torch | torch.compile step 1T / {cores}T (first steps) | torch.compile / arrayjit 1T / {cores}T |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let step = |m: Option<Measured>| m.and_then(|m| m.step);
    for (size, r) in rows {
        let rate = step(r.cold).filter(|&s| s > 0.0).map_or("–".into(), |s| {
            let gflops = size.config().step_flops() / s / 1e9;
            format!("{gflops:.0} ({:.0}%)", 100.0 * gflops / fma_gflops)
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {rate} | {} / {} | {} / {} | {} | {} / {} |",
            size.name(),
            ms(r.one, |m| m.step),
            ms(r.torch_one, |m| m.step),
            ratio(step(r.torch_one), step(r.one)),
            ms(r.cold, |m| m.step),
            ms(r.torch_all, |m| m.step),
            ratio(step(r.torch_all), step(r.cold)),
            ratio(step(r.one), step(r.cold)),
            ratio(step(r.torch_one), step(r.torch_all)),
            ms(r.cold, |m| Some(m.build)),
            ms(r.cached, |m| Some(m.build)),
            ms(r.torch_all, |m| Some(m.build)),
            mib(r.cold),
            mib(r.torch_all),
        );
        // torch.compile's columns, appended to the line just written.
        out.pop();
        let _ = writeln!(
            out,
            " {} / {} ({} / {}) | {} / {} |",
            ms(r.compiled_one, |m| m.step),
            ms(r.compiled_all, |m| m.step),
            ms(r.compiled_one, |m| m.first),
            ms(r.compiled_all, |m| m.first),
            ratio(step(r.compiled_one), step(r.one)),
            ratio(step(r.compiled_all), step(r.cold)),
        );
    }
    super::legend_and_notes(
        &mut out,
        &format!(
            "Size rows: each cell from a process of its own; steps are the median after one untimed step \
         (one fixed batch); builds include parameter initialization (arrayjit: also optimize, \
         compile and link, from an empty compile cache and from a filled one); peak memory is the \
         process's peak resident set at {cores} threads (PyTorch's includes its libraries, about \
         half a GiB); torch.compile's first step holds its compile, from an empty inductor cache."
        ),
        notes,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_back_and_bad_ones_are_typed_errors() {
        for s in SIZES {
            assert_eq!(GptSize::parse(&s.spec()).unwrap(), s);
            assert!(s.name().contains("GPT size"));
            assert_eq!(s.config().model.hidden, 4 * s.width);
        }
        for bad in ["", "1,2,3,4", "1,2,3,4,5,6", "1,2,x,4,5", "0,2,3,4,5"] {
            assert!(
                matches!(GptSize::parse(bad), Err(Error::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn measurements_parse_and_the_table_has_ratios() {
        let line = r#"{"lib": "torch", "threads": 2, "build_s": 1.5, "first_step_s": 0.2, "step_s": 0.1, "peak_rss_bytes": 1048576}"#;
        let m = parse_measured(&format!("a warning\n{line}\n")).unwrap();
        assert_eq!(
            m,
            Measured {
                build: 1.5,
                first: Some(0.2),
                step: Some(0.1),
                peak_rss: Some(1 << 20)
            }
        );
        assert_eq!(parse_measured("no json here"), None);
        let ours = |step: f64| {
            Some(Measured {
                build: 0.5,
                first: None,
                step: Some(step),
                peak_rss: Some(3 << 20),
            })
        };
        let row = Row {
            cold: ours(0.05),
            cached: Some(Measured {
                build: 0.02,
                first: None,
                step: None,
                peak_rss: None,
            }),
            one: ours(0.08),
            torch_one: Some(m),
            torch_all: Some(Measured {
                build: 1.0,
                first: None,
                step: Some(0.1),
                peak_rss: Some(4 << 20),
            }),
            compiled_one: Some(Measured {
                build: 1.0,
                first: Some(9.0),
                step: Some(0.16),
                peak_rss: None,
            }),
            compiled_all: None,
        };
        let text = table(2, 100.0, &[(SIZES[0], row)], &["a note".into()]);
        // 1T: torch 100 ms against arrayjit 80 ms = 1.25×; 2T: 100 against 50 = 2.00×;
        // arrayjit's 1→2T 80 / 50 = 1.60×, torch's 1.00×. The rate is the step's FLOP
        // (`step_flops`, about 2.7 G for the demo) over 50 ms, against a 100 GFLOP/s limit.
        let flops = SIZES[0].config().step_flops();
        let rate = flops / 0.05 / 1e9;
        assert!(
            text.contains(&format!("| GPT size T64 d128 h4 L2 b16 | 80 ms | 100 ms | 1.25× | 50 ms | 100 ms | 2.00× | {rate:.0} ({rate:.0}%) | 1.60× / 1.00× | 500 ms / 20 ms | 1000 ms | 3 MiB / 4 MiB | 160 ms / – (9000 ms / –) | 2.00× / – |")),
            "{text}"
        );
        assert!(text.contains("note: a note"), "{text}");
    }
}

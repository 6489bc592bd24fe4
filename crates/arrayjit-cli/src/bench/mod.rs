//! `arrayjit bench`: one table of arrayjit on each CPU backend next to NumPy (and PyTorch when
//! installed) at one thread and at all, and next to the machine's limits measured by a C
//! reference, all in the same invocation, with ratios. Peers run from `.bench-venv` (made by
//! `scripts/setup-bench.sh`) or the `python3` on the path; a missing peer is a note in the
//! table, never a failure. A second table, the GPT size axis (`sizes`), trains GPTs from the
//! demo's size to GPT-2 small's width and depth next to PyTorch eager.

pub mod device;
pub mod generation;
pub mod gpt2;
pub mod limits;
pub mod sizes;
pub mod statements;
pub mod workloads;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use arrayjit_backends::device_info::CpuInfo;
use arrayjit_ir::Result;
use arrayjit_runtime::RuntimeConfig;

use limits::Limits;
use workloads::{GPT, MLP, Rate, Workload};

/// What to run.
#[derive(Clone, Debug, Default)]
pub struct BenchConfig {
    /// Leave out the largest sizes.
    pub quick: bool,
    /// The Python interpreter of the peers (default: `.bench-venv/bin/python`, else `python3`).
    pub python: Option<PathBuf>,
    /// Skip the peers.
    pub no_peers: bool,
    /// Run only the workloads whose name contains this text (`compile` selects the compile-latency
    /// line); all when empty.
    pub only: String,
    /// Search the schedules of each workload first and run the winners.
    pub search: bool,
    /// A GPU backend to run the device table on (`wgpu`, `cuda`) instead of the CPU table.
    pub device_backend: Option<String>,
    /// Instead of the table: where the GPT training step's time goes, statement by statement
    /// (see [`statements`]).
    pub statements: bool,
}

/// Times per workload and column (seconds), and notes.
#[derive(Default)]
struct Results {
    times: HashMap<(String, String), f64>,
    notes: Vec<String>,
}

const BACKENDS: [&str; 2] = ["sync_cc", "multicore_cc"];

/// Runs the suite, printing progress to stderr; returns the table (markdown).
pub fn run(config: &BenchConfig) -> Result<String> {
    if let Some(name) = &config.device_backend {
        return device::run(name, config);
    }
    let cpu = CpuInfo::detect();
    eprintln!("machine: {cpu}");
    if config.statements {
        eprintln!("measuring the machine's limits (C reference) ...");
        let limits = limits::measure(&cpu)?;
        return statements::run(&cpu, &limits);
    }
    let list: Vec<Workload> = workloads::workloads(config.quick)
        .into_iter()
        .filter(|w| w.name.contains(&config.only))
        .collect();
    let compile_line = "compile".contains(config.only.as_str());
    eprintln!("measuring the machine's limits (C reference) ...");
    let limits = limits::measure(&cpu)?;
    let mut out = if list.is_empty() && !compile_line {
        // Only size (or GPT-2) rows selected.
        header(&cpu, &limits)
    } else {
        workload_table(config, &cpu, &limits, &list, compile_line)?
    };
    if let Some(sizes) = sizes::run(config, &cpu, &limits)? {
        out.push_str(&sizes);
    }
    if let Some(rows) = gpt2::run(config, &cpu)? {
        out.push_str(&rows);
    }
    if let Some(rows) = generation::run(config, &cpu, &limits)? {
        out.push_str(&rows);
    }
    Ok(out)
}

/// The workload table: `list` on each CPU backend, the compile-latency lines (`compile_line`:
/// the MLP step's; the GPT step's when its row is listed), the peers, the machine's limits.
fn workload_table(
    config: &BenchConfig,
    cpu: &CpuInfo,
    limits: &Limits,
    list: &[Workload],
    compile_line: bool,
) -> Result<String> {
    let mut results = Results::default();
    for name in BACKENDS {
        let backend = arrayjit_runtime::backend(name)?;
        backend.set_schedule_search(Some(config.search));
        for w in list {
            eprintln!("arrayjit {name}: {} ...", w.name);
            if config.search {
                eprintln!("{}", workloads::search_workload(&backend, &w.name)?);
            }
            let t = workloads::time_workload(&backend, &w.name)?;
            results
                .times
                .insert((w.name.clone(), name.to_string()), t.as_secs_f64());
        }
    }
    let mut compile = Vec::new();
    if compile_line {
        compile.push(compile_latency(MLP)?);
    }
    if list.iter().any(|w| w.name == GPT) {
        compile.push(compile_latency(GPT)?);
    }
    if !config.no_peers && !list.is_empty() {
        run_peers(config, cpu, &mut results);
    }
    Ok(table(cpu, limits, list, &results, compile))
}

/// The cache shares the user's own compile cache gives the CPU's products (`arrayjit tune`'s
/// choice, else the table's), looked up once: measuring processes and builds that start from a
/// fresh cache block their products the same way. `None` when `sync_cc` cannot run here.
pub(super) fn user_cpu_shares() -> Option<arrayjit::opt::schedule::CacheShares> {
    static SHARES: std::sync::OnceLock<Option<arrayjit::opt::schedule::CacheShares>> =
        std::sync::OnceLock::new();
    *SHARES.get_or_init(|| {
        let b = arrayjit::backend("sync_cc").ok()?;
        b.check_available().ok()?;
        Some(b.lowered().cpu_shares().shares)
    })
}

/// Cold (empty cache) and cached optimize + compile + link of a training step (`MLP` or
/// `GPT`) on `sync_cc`: its name, and the two times.
fn compile_latency(step: &str) -> Result<(String, Duration, Duration)> {
    let dir = std::env::temp_dir().join(format!("arrayjit-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let backend = arrayjit_runtime::backend_with_config(
        "sync_cc",
        &RuntimeConfig {
            cache_dir: Some(dir.clone()),
            ..RuntimeConfig::default()
        },
    )?;
    // Blocked products as the user's own cache says (`arrayjit tune`), in the fresh cache.
    if let Some(shares) = user_cpu_shares() {
        let mut settings = backend.optimize_settings();
        settings.schedule.cache_shares = shares;
        backend.set_optimize_settings(settings);
    }
    let time = || -> Result<Duration> {
        Ok(if step == GPT {
            workloads::gpt_trainer(&backend)?.0.compile_and_link
        } else {
            workloads::mlp_classifier(&backend)?.0.compile_and_link
        })
    };
    eprintln!("arrayjit: {step} compile, cold and cached ...");
    let stats = || backend.lowered().compile_stats().unwrap_or_default();
    let before = stats();
    let cold = time()?;
    let after = stats();
    eprintln!(
        "cold compile: {} libraries built, {:.0} ms in the C compiler and linker",
        after.compiled - before.compiled,
        (after.compile_micros - before.compile_micros) as f64 / 1e3
    );
    let cached = time()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((step.to_string(), cold, cached))
}

/// A peer script of `benches/peers/`: in the source tree this binary was built from where that
/// still exists, else under the working directory (a copy of the repository the binary was
/// carried to, e.g. a GPU machine).
/// Ends a table of processes' measurements: its legend, then a line per note (what failed
/// to run, and why).
fn legend_and_notes(out: &mut String, legend: &str, notes: &[String]) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "{legend}");
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
}

fn peer_script(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../benches/peers")
        .join(name);
    if built.exists() {
        built
    } else {
        Path::new("benches/peers").join(name)
    }
}

fn python(config: &BenchConfig) -> PathBuf {
    if let Some(p) = &config.python {
        return p.clone();
    }
    let venv = Path::new(".bench-venv/bin/python");
    if venv.exists() {
        venv.to_path_buf()
    } else {
        PathBuf::from("python3")
    }
}

/// Runs the peers script at one thread and at all, recording `numpy 1T` etc. columns.
fn run_peers(config: &BenchConfig, cpu: &CpuInfo, results: &mut Results) {
    let script = peer_script("bench_peers.py");
    let python = python(config);
    let mut counts = vec![1];
    if cpu.cores > 1 {
        counts.push(cpu.cores);
    }
    for threads in counts {
        eprintln!("peers at {threads} thread(s) ({}) ...", python.display());
        let mut cmd = Command::new(&python);
        cmd.arg(&script).args(["--threads", &threads.to_string()]);
        if config.quick {
            cmd.arg("--quick");
        }
        cmd.args(["--only", &config.only]);
        for var in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            cmd.env(var, threads.to_string());
        }
        // torch.compile's first step from an empty inductor cache, as arrayjit's cold compile
        // starts from an empty compile cache.
        let inductor = std::env::temp_dir().join(format!(
            "arrayjit-bench-inductor-{}-{threads}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&inductor);
        cmd.env("TORCHINDUCTOR_CACHE_DIR", &inductor);
        let output = cmd.output();
        let _ = std::fs::remove_dir_all(&inductor);
        let out = match output {
            Ok(out) => out,
            Err(e) => {
                results
                    .notes
                    .push(format!("peers not run: {} ({e})", python.display()));
                return;
            }
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match parse_peer_line(line) {
                Some(PeerLine::Error(err)) => {
                    results.notes.push(err);
                    return;
                }
                Some(PeerLine::Time {
                    lib,
                    workload,
                    seconds,
                }) => {
                    let tag = if threads == 1 {
                        "1T".to_string()
                    } else {
                        format!("{threads}T")
                    };
                    results
                        .times
                        .insert((workload, format!("{lib} {tag}")), seconds);
                }
                None => {}
            }
        }
        if !out.status.success() {
            results.notes.push(format!(
                "the peers script failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
    }
}

/// The value of `key` in a flat JSON object on one line, as the peer scripts and the size
/// command write them (strings without escapes, numbers): its text, unquoted.
fn json_field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
    let rest = &line[at..];
    Some(if let Some(s) = rest.strip_prefix('"') {
        s[..s.find('"')?].to_string()
    } else {
        rest[..rest.find(['}', ','])?].trim().to_string()
    })
}

/// One line of the peers script.
#[derive(Debug, PartialEq)]
enum PeerLine {
    Time {
        lib: String,
        workload: String,
        seconds: f64,
    },
    Error(String),
}

/// Reads `{"lib": "numpy", "workload": "sum 16M", "seconds": 0.01}` or `{"error": "..."}` (the
/// script writes exactly these flat objects, without escapes).
fn parse_peer_line(line: &str) -> Option<PeerLine> {
    let field = |k: &str| json_field(line, k);
    if let Some(err) = field("error") {
        return Some(PeerLine::Error(err));
    }
    Some(PeerLine::Time {
        lib: field("lib")?,
        workload: field("workload")?,
        seconds: field("seconds")?.parse().ok()?,
    })
}

/// The machine and its limits, the first lines of every table.
fn header(cpu: &CpuInfo, limits: &Limits) -> String {
    format!(
        "machine: {cpu}\nlimits (C reference, 1 core / all {}): FMA {:.0} / {:.0} GFLOP/s, triad {:.1} / {:.1} GB/s, read {:.1} / {:.1} GB/s\n",
        cpu.cores,
        limits.fma_gflops[0],
        limits.fma_gflops[1],
        limits.triad_gbs[0],
        limits.triad_gbs[1],
        limits.read_gbs[0],
        limits.read_gbs[1]
    )
}

fn table(
    cpu: &CpuInfo,
    limits: &Limits,
    list: &[Workload],
    results: &Results,
    compile: Vec<(String, Duration, Duration)>,
) -> String {
    let mut peer_columns: Vec<String> = results
        .times
        .keys()
        .map(|(_, c)| c.clone())
        .filter(|c| !BACKENDS.contains(&c.as_str()))
        .collect();
    peer_columns.sort();
    peer_columns.dedup();
    let mut out = header(cpu, limits);
    let _ = writeln!(out);
    let mut header = String::from("| workload | rate |");
    let mut rule = String::from("|---|---|");
    for c in BACKENDS
        .iter()
        .map(|s| s.to_string())
        .chain(peer_columns.iter().cloned())
    {
        let _ = write!(header, " {c} |");
        rule.push_str("---|");
    }
    // Ratio columns against each peer library measured (NumPy always, PyTorch eager and
    // torch.compile when PyTorch is installed), at one thread and at the machine's thread count.
    let tag_all = if cpu.cores > 1 {
        format!("{}T", cpu.cores)
    } else {
        "1T".to_string()
    };
    let mut ratio_peers: Vec<&str> = vec!["numpy"];
    if peer_columns.iter().any(|c| c.starts_with("torch ")) {
        ratio_peers.push("torch");
    }
    if peer_columns
        .iter()
        .any(|c| c.starts_with("torch.compile ") && !c.contains("first"))
    {
        ratio_peers.push("torch.compile");
    }
    for lib in &ratio_peers {
        let _ = write!(
            header,
            " sync_cc / {lib} 1T | multicore_cc / {lib} {tag_all} |"
        );
        rule.push_str("---|---|");
    }
    let _ = write!(
        header,
        " sync_cc / limit (1 core) | multicore_cc / limit (all) |"
    );
    rule.push_str("---|---|");
    let _ = writeln!(out, "{header}\n{rule}");
    for w in list {
        let cell = |col: &str| {
            results
                .times
                .get(&(w.name.clone(), col.to_string()))
                .copied()
        };
        let rate = |secs: f64| w.work / secs / 1e9;
        let unit = match w.rate {
            Rate::Flops => "GFLOP/s",
            Rate::Bytes => "GB/s",
        };
        let mut line = format!("| {} | {unit} |", w.name);
        for c in BACKENDS
            .iter()
            .map(|s| s.to_string())
            .chain(peer_columns.iter().cloned())
        {
            match cell(&c) {
                // A first step that holds a compile: its time alone (a rate would mislead).
                Some(s) if c.contains("first step") => {
                    let _ = write!(line, " {:.0} ms |", s * 1e3);
                }
                Some(s) => {
                    let _ = write!(line, " {:.2} ms ({:.1}) |", s * 1e3, rate(s));
                }
                None => line.push_str(" – |"),
            }
        }
        // Same thread count: sync_cc runs one worker, multicore_cc all of the device's.
        for lib in &ratio_peers {
            let (one, all) = (format!("{lib} 1T"), format!("{lib} {tag_all}"));
            for (ours, peer) in [("sync_cc", &one), ("multicore_cc", &all)] {
                match (cell(ours), cell(peer)) {
                    (Some(a), Some(p)) => {
                        let _ = write!(line, " {:.2}× |", p / a);
                    }
                    _ => line.push_str(" – |"),
                }
            }
        }
        let limit = |k: usize| match (w.rate, w.name.as_str()) {
            (Rate::Flops, _) => limits.fma_gflops[k],
            (Rate::Bytes, n) if n.starts_with("chain") => limits.triad_gbs[k],
            (Rate::Bytes, _) => limits.read_gbs[k],
        };
        for (k, ours) in ["sync_cc", "multicore_cc"].iter().enumerate() {
            match cell(ours) {
                Some(t) if w.name != MLP && w.name != GPT => {
                    let _ = write!(line, " {:.0}% |", 100.0 * rate(t) / limit(k));
                }
                _ => line.push_str(" – |"),
            }
        }
        let _ = writeln!(out, "{line}");
    }
    for (step, cold, cached) in &compile {
        let _ = writeln!(
            out,
            "\n{step} optimize + compile + link (sync_cc): cold {:.0} ms, from the cache {:.1} ms",
            cold.as_secs_f64() * 1e3,
            cached.as_secs_f64() * 1e3
        );
    }
    let _ = writeln!(
        out,
        "Cells: median time of one run (rate in parentheses). Ratios > 1 mean arrayjit is faster."
    );
    let _ = writeln!(
        out,
        "Limit columns: the bandwidth limits stream arrays of at least 128 MiB and twice the last-level cache, from memory; a workload whose arrays partly stay in that cache (the 64 MiB rows where it holds 32 MiB or more) can read above 100%."
    );
    for n in &results.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_lines_parse_and_the_table_has_ratios() {
        assert_eq!(
            parse_peer_line(r#"{"lib": "numpy", "workload": "sum 16M", "seconds": 0.5}"#),
            Some(PeerLine::Time {
                lib: "numpy".into(),
                workload: "sum 16M".into(),
                seconds: 0.5
            })
        );
        assert_eq!(
            parse_peer_line(r#"{"error": "numpy is not installed"}"#),
            Some(PeerLine::Error("numpy is not installed".into()))
        );
        assert_eq!(parse_peer_line("garbage"), None);
        let list = vec![Workload {
            name: "sum 16M".into(),
            work: 4e9,
            rate: Rate::Bytes,
        }];
        let mut results = Results::default();
        results
            .times
            .insert(("sum 16M".into(), "sync_cc".into()), 1.0);
        results
            .times
            .insert(("sum 16M".into(), "numpy 1T".into()), 0.5);
        let limits = Limits {
            fma_gflops: [100.0, 200.0],
            triad_gbs: [10.0, 20.0],
            read_gbs: [8.0, 16.0],
        };
        let text = table(
            &CpuInfo::detect(),
            &limits,
            &list,
            &results,
            vec![(
                MLP.to_string(),
                Duration::from_millis(300),
                Duration::from_millis(4),
            )],
        );
        // 4 GB in 1 s = 4 GB/s = 50% of the 8 GB/s read limit; NumPy is twice as fast.
        assert!(
            text.contains(
                "| sum 16M | GB/s | 1000.00 ms (4.0) | – | 500.00 ms (8.0) | 0.50× | – | 50% | – |"
            ),
            "{text}"
        );
        assert!(
            text.contains("cold 300 ms, from the cache 4.0 ms"),
            "{text}"
        );
        // With PyTorch measured, its ratios follow NumPy's: 0.25 s against our 1 s.
        results
            .times
            .insert(("sum 16M".into(), "torch 1T".into()), 0.25);
        let text = table(&CpuInfo::detect(), &limits, &list, &results, vec![]);
        assert!(text.contains("| sync_cc / torch 1T |"), "{text}");
        assert!(
            text.contains("| 0.50× | – | 0.25× | – | 50% | – |"),
            "{text}"
        );
        // torch.compile: its steps get ratio columns, its first step (the compile) a time alone.
        results
            .times
            .insert(("sum 16M".into(), "torch.compile 1T".into()), 2.0);
        results.times.insert(
            ("sum 16M".into(), "torch.compile first step 1T".into()),
            12.5,
        );
        let text = table(&CpuInfo::detect(), &limits, &list, &results, vec![]);
        assert!(text.contains("| sync_cc / torch.compile 1T |"), "{text}");
        assert!(!text.contains("/ torch.compile first step"), "{text}");
        assert!(text.contains("| 12500 ms |"), "{text}");
        assert!(
            text.contains("| 0.50× | – | 0.25× | – | 2.00× | – | 50% | – |"),
            "{text}"
        );
    }
}

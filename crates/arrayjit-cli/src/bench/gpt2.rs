//! The benchmark's GPT-2 rows (issue 64): GPT-2 small's shape (vocabulary 50257, width 768, 12
//! heads, 12 layers, MLP 3072, GELU's tanh form) at its context of 1024, batch 1 and 4, one
//! AdamW step at a time, arrayjit (fused attention) beside PyTorch eager with its attention
//! written out (unfused) and with `F.scaled_dot_product_attention`, and `torch.compile` of the
//! SDPA model (its first step, which holds the compile, reported beside its steps); at one
//! thread and at all, with each process's peak memory at all threads.
//!
//! A row takes minutes (a step of GPT-2 at T = 1024 takes seconds on a CPU, `torch.compile`
//! tens of seconds to compile), so the rows run only when `--only` names them (`GPT-2`), never
//! in a full run. Each measurement runs in a process of its own, as the size axis's do.

use std::fmt::Write as _;

use arrayjit_backends::device_info::CpuInfo;
use arrayjit_ir::Result;

use super::BenchConfig;
use super::sizes::{
    GptSize, Measured, measure, measuring_programs, mib, ms, ours_command, ratio, torch_command,
};

/// GPT-2 small at its context, batch 1 and 4.
pub const GPT2_ROWS: [GptSize; 2] = [
    GptSize::new(1024, 768, 12, 12, 1),
    GptSize::new(1024, 768, 12, 12, 4),
];

/// GPT-2's vocabulary.
pub const GPT2_VOCABULARY: usize = 50257;

/// Timed steps after the first, per process.
const STEPS: usize = 2;

/// A row's name, which `--only` matches.
pub fn row_name(size: &GptSize) -> String {
    format!("GPT-2 small T{} b{}", size.context, size.batch)
}

/// How PyTorch runs a row's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TorchMode {
    /// Eager, attention written out (scores as a `[B, H, T, T]` tensor).
    EagerUnfused,
    /// Eager, `F.scaled_dot_product_attention`.
    EagerSdpa,
    /// `torch.compile` of the SDPA model.
    CompiledSdpa,
}

impl TorchMode {
    const ALL: [TorchMode; 3] = [
        TorchMode::EagerUnfused,
        TorchMode::EagerSdpa,
        TorchMode::CompiledSdpa,
    ];

    fn flags(self) -> &'static [&'static str] {
        match self {
            TorchMode::EagerUnfused => &[],
            TorchMode::EagerSdpa => &["--sdpa"],
            TorchMode::CompiledSdpa => &["--sdpa", "--compile"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            TorchMode::EagerUnfused => "torch eager (unfused)",
            TorchMode::EagerSdpa => "torch eager (SDPA)",
            TorchMode::CompiledSdpa => "torch.compile (SDPA)",
        }
    }
}

/// One row at one thread count: arrayjit's measurement and each PyTorch mode's.
#[derive(Default)]
struct Line {
    ours: Option<Measured>,
    torch: [Option<Measured>; 3],
}

/// Measures the rows whose names contain `config.only` (none when it is empty) and returns
/// their table (markdown), or `None` when no row was selected.
pub fn run(config: &BenchConfig, cpu: &CpuInfo) -> Result<Option<String>> {
    if config.only.is_empty() {
        return Ok(None);
    }
    let chosen: Vec<GptSize> = GPT2_ROWS
        .into_iter()
        .filter(|s| row_name(s).contains(&config.only))
        .collect();
    if chosen.is_empty() {
        return Ok(None);
    }
    let (exe, python, script) = measuring_programs(config)?;
    let mut notes = Vec::new();
    let mut lines = Vec::new();
    let threads = [1, cpu.cores.max(1)];
    for size in &chosen {
        let name = row_name(size);
        for (i, &t) in threads.iter().enumerate() {
            if i == 1 && t == 1 {
                continue;
            }
            let backend = if t == 1 { "sync_cc" } else { "multicore_cc" };
            let mut cmd = ours_command(&exe, size, backend, STEPS);
            cmd.args(["--vocabulary", &GPT2_VOCABULARY.to_string()])
                .args(["--attention", "fused", "--gelu-tanh"]);
            let mut line = Line {
                ours: measure(cmd, &format!("arrayjit {backend}: {name}"), &mut notes),
                ..Line::default()
            };
            if !config.no_peers {
                for (m, mode) in TorchMode::ALL.into_iter().enumerate() {
                    let mut cmd = torch_command(&python, &script, size, t, STEPS);
                    cmd.args(["--vocabulary", &GPT2_VOCABULARY.to_string(), "--gelu-tanh"])
                        .args(mode.flags());
                    line.torch[m] = measure(
                        cmd,
                        &format!("{} {t} thread(s): {name}", mode.name()),
                        &mut notes,
                    );
                }
            }
            lines.push((name.clone(), t, line));
        }
    }
    Ok(Some(table(&lines, &notes)))
}

/// The GPT-2 table (markdown): one line per row and thread count; ratios > 1: arrayjit is
/// faster.
fn table(lines: &[(String, usize, Line)], notes: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| model | threads | arrayjit step (fused) | torch eager (unfused) | torch eager (SDPA) | torch.compile (SDPA), first step | vs eager unfused | vs eager SDPA | vs compile | peak memory arrayjit / eager SDPA / eager unfused |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    let step = |m: Option<Measured>| m.and_then(|m| m.step);
    for (name, threads, l) in lines {
        let compiled = match l.torch[2] {
            Some(m) => format!("{}, {}", ms(Some(m), |m| m.step), ms(Some(m), |m| m.first)),
            None => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {name} | {threads} | {} | {} | {} | {compiled} | {} | {} | {} | {} / {} / {} |",
            ms(l.ours, |m| m.step),
            ms(l.torch[0], |m| m.step),
            ms(l.torch[1], |m| m.step),
            ratio(step(l.torch[0]), step(l.ours)),
            ratio(step(l.torch[1]), step(l.ours)),
            ratio(step(l.torch[2]), step(l.ours)),
            mib(l.ours),
            mib(l.torch[1]),
            mib(l.torch[0]),
        );
    }
    super::legend_and_notes(
        &mut out,
        &format!(
            "GPT-2 rows: vocabulary {GPT2_VOCABULARY}, width 768, 12 heads, 12 layers, MLP 3072, GELU \
         tanh, AdamW with clipping, one fixed batch; each cell from a process of its own, the \
         median of {STEPS} steps after one untimed step (torch.compile's first step holds its \
         compile); peak memory is the process's peak resident set (PyTorch's includes its \
         libraries, about half a GiB)."
        ),
        notes,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_gpt2_small_and_run_only_when_named() {
        for s in GPT2_ROWS {
            assert_eq!(GptSize::parse(&s.spec()).unwrap(), s);
            assert_eq!((s.context, s.width, s.heads, s.layers), (1024, 768, 12, 12));
            // Not selected by the size axis's name, nor by a full run.
            assert!(!row_name(&s).contains("GPT size"));
        }
        let config = BenchConfig {
            quick: false,
            python: None,
            no_peers: true,
            only: String::new(),
            search: false,
            device_backend: None,
            statements: false,
        };
        let cpu = CpuInfo::detect();
        assert!(run(&config, &cpu).unwrap().is_none());
        let config = BenchConfig {
            only: "no such row".into(),
            ..config
        };
        assert!(run(&config, &cpu).unwrap().is_none());
    }

    #[test]
    fn the_table_has_each_peer_and_the_ratios() {
        let m = |step: f64, first: Option<f64>, peak: u64| {
            Some(Measured {
                build: 1.0,
                first,
                step: Some(step),
                peak_rss: Some(peak << 20),
            })
        };
        let line = Line {
            ours: m(5.0, None, 3000),
            torch: [
                m(10.0, None, 5000),
                m(7.5, None, 3500),
                m(6.0, Some(40.0), 3600),
            ],
        };
        let text = table(
            &[("GPT-2 small T1024 b1".into(), 2, line)],
            &["a note".into()],
        );
        // 10 / 5 = 2.00×, 7.5 / 5 = 1.50×, 6 / 5 = 1.20×.
        assert!(
            text.contains(
                "| GPT-2 small T1024 b1 | 2 | 5000 ms | 10000 ms | 7500 ms | 6000 ms, 40000 ms | \
                 2.00× | 1.50× | 1.20× | 3000 MiB / 3500 MiB / 5000 MiB |"
            ),
            "{text}"
        );
        assert!(text.contains("note: a note"));
    }
}

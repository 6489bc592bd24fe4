//! `arrayjit bench --statements`: where the table's GPT training step spends its time,
//! statement by statement, on each CPU backend: each statement's time per step, share, rates
//! and the fraction of the machine's limit (FMA rate or bandwidth, whichever bounds it) it
//! reaches, then the same summed by kind of statement (products, attention, loops,
//! reductions).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use arrayjit::backends::device_info::CpuInfo;
use arrayjit::runtime::StatementProfile;
use arrayjit::{Error, Result};

use super::limits::Limits;
use super::workloads::{self, GPT};

/// Timed steps after the warm-up.
const STEPS: usize = 10;
/// Statements listed per backend (the slowest).
const ROWS: usize = 25;

/// The breakdown on `sync_cc` (one core's limits) and `multicore_cc` (all cores').
pub fn run(cpu: &CpuInfo, limits: &Limits) -> Result<String> {
    let mut out = super::header(cpu, limits);
    for (name, all_cores) in [("sync_cc", false), ("multicore_cc", true)] {
        let backend = arrayjit::backend(name)?;
        if backend.check_available().is_err() {
            continue;
        }
        let mut settings = backend.optimize_settings();
        settings.profile_statements = true;
        backend.set_optimize_settings(settings);
        eprintln!("arrayjit: {GPT} on {name}, statement by statement ...");
        let (mut trainer, ids, targets) = workloads::gpt_trainer(&backend)?;
        for _ in 0..2 {
            trainer.train_step(&ids, &targets)?;
        }
        // Counted from here: the warm-up's times are read and dropped.
        let _ = trainer.step_routine().statement_profile();
        let started = Instant::now();
        for _ in 0..STEPS {
            trainer.train_step(&ids, &targets)?;
        }
        let step_s = started.elapsed().as_secs_f64() / STEPS as f64;
        let profile = trainer
            .step_routine()
            .statement_profile()
            .ok_or_else(|| Error::Runtime {
                stream: name.into(),
                detail: "the step was compiled to time its statements but its kernel reports \
                         no times (a defect of arrayjit)"
                    .into(),
            })?;
        let core = usize::from(all_cores);
        let fma = limits.fma_gflops[core] * 1e9;
        let bandwidth = limits.triad_gbs[core] * 1e9;
        let _ = writeln!(
            out,
            "\n{GPT} on {name} ({}): {:.2} ms per step, {:.2} ms of it in {} statements; \
             limits {:.0} GFLOP/s FMA, {:.1} GB/s (triad)\n",
            if all_cores {
                format!("{} cores", cpu.cores)
            } else {
                "1 core".into()
            },
            step_s * 1e3,
            profile.total_nanos() as f64 * 1e-6 / STEPS as f64,
            profile.statements.len(),
            fma * 1e-9,
            bandwidth * 1e-9
        );
        out.push_str(&profile.table(ROWS, Some((fma, bandwidth))));
        out.push('\n');
        out.push_str(&by_kind(&profile, fma, bandwidth));
    }
    out.push_str(
        "\nGFLOP/s counts 2 per multiply-add of a product and every arithmetic operation and \
         assignment of other statements; GB/s the arrays a statement touches, each once (a lower \
         bound of its traffic). \"of limit\": the time the FMA rate or the bandwidth alone would \
         take, whichever is longer, over the statement's time; above 100%, the statement's arrays \
         stayed in cache (the bandwidth limit is memory's).\n",
    );
    Ok(out)
}

/// The statements' time, share and fraction of the limit summed by kind.
fn by_kind(profile: &StatementProfile, fma: f64, bandwidth: f64) -> String {
    // kind → (statements, nanos, bound seconds per call summed)
    let mut kinds: BTreeMap<String, (usize, u64, f64)> = BTreeMap::new();
    for s in &profile.statements {
        let kind = s.kind.trim_end_matches(", parallel").to_string();
        let e = kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += s.nanos;
        e.2 += s.fraction_of_limit(fma, bandwidth) * s.seconds_per_call();
    }
    let total = profile.total_nanos().max(1) as f64;
    let calls = profile
        .statements
        .iter()
        .map(|s| s.calls)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut s = String::from(
        "| kind | statements | ms per step | share | of limit |\n|---|---|---|---|---|\n",
    );
    let mut rows: Vec<_> = kinds.into_iter().collect();
    rows.sort_by_key(|b| std::cmp::Reverse(b.1.1));
    for (kind, (n, nanos, bound)) in rows {
        let per_step = nanos as f64 * 1e-9 / calls;
        let _ = writeln!(
            s,
            "| {kind} | {n} | {:.3} | {:.1}% | {:.0}% |",
            per_step * 1e3,
            100.0 * nanos as f64 / total,
            if per_step > 0.0 {
                100.0 * bound / per_step
            } else {
                0.0
            }
        );
    }
    s
}

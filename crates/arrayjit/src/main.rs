//! The `arrayjit` command: trains an MLP on half-moons (the default), shows the lowering of a
//! small program, lists backends and devices.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

/// arrayjit: an array JIT compiler runtime.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Backend to use (default: $ARRAYJIT_BACKEND, else sync_cc).
    #[arg(long, global = true)]
    backend: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train an MLP on half-moons; print held-out accuracy; draw the decision boundary (default).
    Moons {
        /// Training epochs.
        #[arg(long, default_value_t = 60)]
        epochs: usize,
        /// Seed of the data, split and parameters.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Number of points (80% train, 20% held out).
        #[arg(long, default_value_t = 500)]
        samples: usize,
        /// Where to write the PNG.
        #[arg(long, default_value = "moons.png")]
        output: PathBuf,
        /// Data-parallel shards: streams that each take a batch per step (use with
        /// --backend multicore_cc; ARRAYJIT_CPU_DEVICES spreads them over devices).
        #[arg(long, default_value_t = 1)]
        shards: usize,
    },
    /// Build y = relu(W·x + b) and a reduction; print results, memory modes and the generated C.
    Lowering,
    /// List the known backends, whether they can run here, and their devices.
    Info,
    /// Benchmark table: arrayjit on each CPU backend next to NumPy / PyTorch and the machine's
    /// limits, measured in this run (set up the peers with scripts/setup-bench.sh).
    Bench {
        /// Leave out the largest sizes.
        #[arg(long)]
        quick: bool,
        /// Python interpreter with NumPy (default: .bench-venv/bin/python, else python3).
        #[arg(long)]
        python: Option<PathBuf>,
        /// Do not run NumPy / PyTorch.
        #[arg(long)]
        no_peers: bool,
        /// Run only the workloads whose name contains this text (e.g. `matmul`, `softmax`,
        /// `compile`).
        #[arg(long, default_value = "")]
        only: String,
        /// Search each workload's schedules first (times variants of the heuristics' schedule,
        /// stores the fastest next to the compile cache) and run the winners.
        #[arg(long)]
        search: bool,
    },
}

fn moons(
    backend: Option<String>,
    epochs: usize,
    seed: u64,
    samples: usize,
    output: PathBuf,
    shards: usize,
) -> arrayjit::Result<()> {
    let config = arrayjit::moons::MoonsConfig {
        backend,
        epochs,
        seed,
        samples,
        output: Some(output.clone()),
        shards,
    };
    let bar = ProgressBar::new(epochs as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} epochs  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix("training");
    let report = arrayjit::moons::run(&config, |s| {
        bar.set_message(format!("loss {:.4}", s.loss));
        bar.inc(1);
    });
    bar.finish();
    let report = report?;
    println!(
        "half-moons on {}: train accuracy {:.1}%, held-out accuracy {:.1}%",
        report.backend,
        100.0 * report.train_accuracy,
        100.0 * report.test_accuracy
    );
    println!(
        "final loss {:.4}; build + compile {:.0} ms, {} epochs in {:.0} ms",
        report.losses.last().copied().unwrap_or(f64::NAN),
        report.build_time.as_secs_f64() * 1e3,
        report.losses.len(),
        report.train_time.as_secs_f64() * 1e3
    );
    println!("picture: {}", output.display());
    Ok(())
}

fn info() -> arrayjit::Result<()> {
    for entry in &arrayjit::runtime::registry::REGISTRY {
        let name = entry.name;
        let b = arrayjit::backend(name)?;
        match b.check_available() {
            Ok(()) => {
                println!(
                    "{name}: available, {} device(s): {}",
                    b.num_devices(),
                    entry.summary
                );
                println!("  {}", b.debug_info());
                for d in 0..b.num_devices() {
                    println!("  device {d}: {}", b.get_device(d)?.info()?);
                }
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Moons {
        epochs: 60,
        seed: 1,
        samples: 500,
        output: PathBuf::from("moons.png"),
        shards: 1,
    });
    let result = match command {
        Command::Moons {
            epochs,
            seed,
            samples,
            output,
            shards,
        } => moons(cli.backend, epochs, seed, samples, output, shards),
        Command::Lowering => {
            arrayjit::demo::run(cli.backend.as_deref()).map(|r| print!("{}", r.text))
        }
        Command::Info => info(),
        Command::Bench {
            quick,
            python,
            no_peers,
            only,
            search,
        } => arrayjit::bench::run(&arrayjit::bench::BenchConfig {
            quick,
            python,
            no_peers,
            only,
            search,
            // The CPU table compares both CPU backends; naming another runs the device table.
            device_backend: cli
                .backend
                .filter(|b| !arrayjit::runtime::registry::is_cpu_backend(b)),
        })
        .map(|table| print!("{table}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

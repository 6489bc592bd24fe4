//! The `arrayjit` command: runs the demo (default), lists backends and devices.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Build y = relu(W·x + b) and a reduction, run them, print results, memory modes and C.
    Demo,
    /// List the known backends, whether they can run here, and their devices.
    Info,
}

fn info() -> arrayjit::Result<()> {
    for name in arrayjit::runtime::KNOWN_BACKENDS {
        let b = arrayjit::backend(name)?;
        match b.check_available() {
            Ok(()) => {
                println!("{name}: available, {} device(s)", b.num_devices());
                println!("  {}", b.debug_info());
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Demo) {
        Command::Demo => arrayjit::demo::run(cli.backend.as_deref()).map(|r| print!("{}", r.text)),
        Command::Info => info(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

//! The `arrayjit` command: trains an MLP on half-moons (the default), shows the lowering of a
//! small program, lists backends and devices, and runs the benchmark table. `--trace FILE`
//! records a timeline of any of them for Perfetto.

// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

// The demos. Their files are also compiled into the tests (`#[path]`), which use the parts
// of their API this command does not.
#[allow(dead_code)]
mod demo;
mod generate;
// The benchmark table (`arrayjit bench`).
mod bench;
#[allow(dead_code)]
mod moons;

use clap::parser::ValueSource;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

/// arrayjit: an array JIT compiler runtime.
///
/// Without a command, trains on half-moons (the `moons` flags work without naming it:
/// `arrayjit --epochs 100`).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Backend to use (default: $ARRAYJIT_BACKEND, else sync_cc).
    #[arg(long, global = true)]
    backend: Option<String>,
    /// Record a timeline of the run into this file (Chrome trace format: open it in
    /// ui.perfetto.dev or chrome://tracing). ARRAYJIT_TRACE=FILE does the same for any program.
    #[arg(long, global = true, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    moons: MoonsArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// The flags of the half-moons demo.
#[derive(Args, Clone)]
struct MoonsArgs {
    /// Training epochs (at least 1).
    #[arg(long, default_value_t = 60)]
    epochs: usize,
    /// Seed of the data, split and parameters.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of points (80% train, 20% held out; at least 25 per shard, plus held-out points).
    #[arg(long, default_value_t = 500)]
    samples: usize,
    /// Where to write the picture (.png or .bmp).
    #[arg(long, default_value = "moons.png")]
    output: PathBuf,
    /// Data-parallel shards: streams that each take a batch per step (use with
    /// --backend multicore_cc; ARRAYJIT_CPU_DEVICES spreads them over devices).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Train across the processes of an MPI job (`mpirun -np N arrayjit --distributed`; a build
    /// with `--features mpi`): every rank takes its own batch per step, gradients are summed
    /// across ranks; only rank 0 prints and draws.
    #[arg(long)]
    distributed: bool,
}

/// The flags of `arrayjit plan`.
#[derive(Args, Clone)]
struct PlanArgs {
    /// The device model: h100, h200, a100, sm_90 (an H100) or sm_80 (an A100).
    #[arg(long, default_value = "h100")]
    device: String,
    /// Windows per training step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Only the routines whose name contains this text (gpt_train_step, gpt_eval_loss,
    /// gpt_logits).
    #[arg(long, default_value = "")]
    only: String,
    /// Print only each routine's summary line, not its passes.
    #[arg(long)]
    summary: bool,
    /// Also compile the routines to CUBIN for the device's architecture with NVRTC (no GPU
    /// needed), cold (an empty cache) and then cached, and print how long each took.
    #[arg(long)]
    compile: bool,
    /// With --compile: compile into this compile cache folder (kept; what the `cuda` backend
    /// reads with `ARRAYJIT_CACHE_DIR` set to it, on a device whose limits are the model's)
    /// instead of a temporary one.
    #[arg(long)]
    cache_dir: Option<std::path::PathBuf>,
    /// Precision of the model's matrix products: `f32`, or `bf16` (on the matrix units).
    #[arg(long, default_value = "f32")]
    precision: arrayjit::tensor::Precision,
    /// Let f32 matrix products run on the matrix units as TF32.
    #[arg(long)]
    allow_tf32: bool,
}

/// The flags of the GPT demo.
#[derive(Args, Clone)]
struct GptArgs {
    /// Training steps to take in this run.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Windows per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Learning rate (AdamW).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the parameters and batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Dropout probability while training (after the embeddings, on attention weights and on
    /// each block's outputs); 0 trains without dropout.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Precision of the matrix products: `f32`, or `bf16` (operands rounded to bf16,
    /// accumulating in f32, everything else f32; on a GPU they run on its matrix units).
    #[arg(long, default_value = "f32")]
    precision: arrayjit::tensor::Precision,
    /// How attention computes its weights: `fused` (an online softmax, no `T × T` scores) or
    /// `unfused` (the scores and weights as arrays, their products on the product helper).
    #[arg(long, default_value = "fused", value_parser = parse_attention)]
    attention: arrayjit::tensor::nn::AttentionKind,
    /// Steps between held-out evaluations.
    #[arg(long, default_value_t = 100)]
    eval_every: u64,
    /// Characters to generate at the end.
    #[arg(long, default_value_t = 300)]
    sample: usize,
    /// Sampling temperature (0: always the most likely character).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Where to save the checkpoint after training.
    #[arg(long, default_value = "gpt.safetensors")]
    checkpoint: PathBuf,
    /// Continue from the checkpoint (parameters, optimizer state, step count).
    #[arg(long)]
    resume: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Train an MLP on half-moons; print held-out accuracy; draw the decision boundary (default).
    Moons(MoonsArgs),
    /// Build y = relu(W·x + b) and a reduction; print results, memory modes and the generated C.
    Lowering,
    /// List the known backends, whether they can run here, and their devices.
    Info,
    /// Train a character-level GPT on Shakespeare's sonnets (shipped with arrayjit): progress,
    /// train and held-out loss, a generated sample, and a checkpoint that --resume continues.
    Gpt(GptArgs),
    /// Continue a prompt with a GPT-2 checkpoint in Hugging Face's layout (`--model DIR`),
    /// using a key/value cache: the text on stdout, load / compile / prefill times and
    /// tokens/s on stderr.
    Generate(generate::GenerateArgs),
    /// The GPU plan of the GPT trainer's routines for a named device, without the device:
    /// every pass's shape, groups × threads, work and estimated time.
    Plan(PlanArgs),
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
        /// `compile`; `GPT size` for the GPT size axis, `d768` for one of its rows).
        #[arg(long, default_value = "")]
        only: String,
        /// Search each workload's schedules first (times variants of the heuristics' schedule,
        /// stores the fastest next to the compile cache) and run the winners.
        #[arg(long)]
        search: bool,
        /// Instead of the table: where the table's GPT training step spends its time,
        /// statement by statement (time, share, rates and fraction of the machine's limit),
        /// on each CPU backend.
        #[arg(long)]
        statements: bool,
    },
    /// Measure which shares of the CPU's caches blocked matrix products should fill on this
    /// CPU, and which cache they fetch streamed operands into (at most about a minute on 2
    /// cores), and store the fastest in the compile cache: later runs on this machine use it.
    /// Prints every candidate's time.
    Tune {
        /// Stop starting candidates after this many seconds.
        #[arg(long, default_value_t = 45)]
        budget: u64,
    },
    /// One measurement of `bench`'s GPT size axis, in a process of its own: builds the GPT of
    /// `--size` on `--backend`, steps it, prints a JSON line (used by `bench`).
    #[command(hide = true)]
    BenchGptSize {
        /// context,width,heads,layers,batch
        #[arg(long)]
        size: String,
        /// Timed steps after the first.
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Token ids (the sonnets' characters when absent; GPT-2's is 50257).
        #[arg(long)]
        vocabulary: Option<usize>,
        /// `fused` or `unfused` attention.
        #[arg(long, default_value = "fused", value_parser = parse_attention)]
        attention: arrayjit::tensor::nn::AttentionKind,
        /// GELU's tanh form (GPT-2's) instead of the exact one.
        #[arg(long)]
        gelu_tanh: bool,
    },
}

fn moons(backend: Option<String>, args: MoonsArgs) -> arrayjit::Result<()> {
    let group = if args.distributed {
        Some(arrayjit::dist::ProcessGroup::from_env()?)
    } else {
        None
    };
    // Only rank 0 prints and draws.
    let leader = group.as_ref().is_none_or(|g| g.rank() == 0);
    let config = moons::MoonsConfig {
        backend,
        epochs: args.epochs,
        seed: args.seed,
        samples: args.samples,
        output: Some(args.output.clone()),
        shards: args.shards,
        group: group.clone(),
    };
    // Everything that can be checked before training is: a bad flag or an unwritable
    // picture must not cost the user the run.
    moons::check_config(&config)?;
    if leader {
        moons::check_picture_path(&args.output)?;
    }
    let bar = if leader {
        ProgressBar::new(args.epochs as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} epochs  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix("training");
    let trained = moons::train(&config, |s| {
        bar.set_message(format!("loss {:.4}", s.loss));
        bar.inc(1);
    });
    bar.finish();
    let trained = trained?;
    if !leader {
        return Ok(());
    }
    let report = &trained.report;
    if let Some(g) = &group {
        println!(
            "trained across {} processes ({}); parameters identical on every rank",
            g.size(),
            g.engine_name()
        );
    }
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
    trained.draw(&args.output)?;
    println!("picture: {}", args.output.display());
    Ok(())
}

/// `--attention`'s value.
fn parse_attention(name: &str) -> Result<arrayjit::tensor::nn::AttentionKind, String> {
    arrayjit::tensor::nn::AttentionKind::parse(name).map_err(|e| e.to_string())
}

fn gpt(backend: Option<String>, args: GptArgs) -> arrayjit::Result<()> {
    use arrayjit::gpt::{CharVocab, GptTrainer, SONNETS, TrainerConfig, batch};
    let backend = arrayjit::initialize(backend.as_deref())?;
    let vocab = CharVocab::from_text(SONNETS);
    let data = vocab.encode(SONNETS)?;
    // The last tenth is held out.
    let split = data.len() * 9 / 10;
    let (train, held_out) = data.split_at(split);
    let mut config = TrainerConfig::small(vocab.len());
    config.batch = args.batch;
    config.seed = args.seed;
    config.dropout = args.dropout;
    config.model.precision = args.precision;
    config.model.attention = args.attention;
    if let arrayjit::tensor::Optimizer::Adam { lr, .. } = &mut config.optimizer {
        *lr = args.lr;
    }
    let t = config.model.context;
    let mut trainer = GptTrainer::new(&backend, &config)?;
    println!(
        "GPT on {}: {} parameters (context {t}, width {}, {} heads, {} layers, MLP {}, {} \
         products), vocabulary {} characters; build + compile of the step {:.0} ms",
        backend.name(),
        trainer.model().parameter_count(),
        config.model.width,
        config.model.heads,
        config.model.layers,
        config.model.hidden,
        config.model.precision,
        vocab.len(),
        trainer.compile_and_link.as_secs_f64() * 1e3
    );
    if args.resume {
        let step = trainer.load(&args.checkpoint)?;
        println!("resumed {} at step {step}", args.checkpoint.display());
    }
    // Where the steps leave a core idle (a device of fewer workers than the machine has
    // threads, or a GPU), the held-out-loss and sampling routines compile there meanwhile.
    let info = backend.lowered().device_info(0)?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let ahead = (info.kind == arrayjit::backends::DeviceKind::Gpu || info.compute_units < threads)
        && trainer.compile_ahead();
    let held_out_loss = |trainer: &GptTrainer| -> arrayjit::Result<f64> {
        let mut total = 0.0;
        for k in 0..4 {
            let (ids, targets) = batch(held_out, config.batch, t, k, 0xe7a1)?;
            total += trainer.eval_loss(&ids, &targets)?;
        }
        Ok(total / 4.0)
    };
    let bar = ProgressBar::new(args.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let lazy_before = trainer.lazy_compile_time();
    let imported_before = imported_functions(&backend);
    let first = trainer.steps;
    let mut recent = Vec::new();
    for _ in 0..args.steps {
        let step = trainer.steps;
        let (ids, targets) = batch(train, config.batch, t, step, args.seed)?;
        let loss = trainer.train_step(&ids, &targets)?;
        recent.push(loss);
        if recent.len() > 20 {
            recent.remove(0);
        }
        let mean = recent.iter().sum::<f64>() / recent.len() as f64;
        bar.set_message(format!("train loss {mean:.3}"));
        bar.inc(1);
        if args.eval_every > 0 && trainer.steps % args.eval_every == 0 {
            let held_out = held_out_loss(&trainer)?;
            // Printed through the bar, which is hidden (and would drop the line) off a terminal.
            bar.suspend(|| {
                println!(
                    "step {}: train loss {mean:.3}, held-out loss {held_out:.3}",
                    trainer.steps
                )
            });
        }
    }
    bar.finish_and_clear();
    // The held-out-loss routine compiles at its first use, inside the loop: not a step's time.
    let elapsed = (started.elapsed() - (trainer.lazy_compile_time() - lazy_before)).as_secs_f64();
    let taken = trainer.steps - first;
    println!(
        "{taken} steps in {elapsed:.1} s ({:.1} ms/step); step {}: train loss {:.3}, held-out loss {:.3}",
        1e3 * elapsed / taken.max(1) as f64,
        trainer.steps,
        recent.iter().sum::<f64>() / recent.len().max(1) as f64,
        held_out_loss(&trainer)?
    );
    trainer.save(&args.checkpoint)?;
    println!("checkpoint: {}", args.checkpoint.display());
    let prompt = vocab.encode("Shall I compare thee")?;
    let generated = trainer.generate(&prompt, args.sample, args.temperature, args.seed)?;
    println!(
        "sample:\n{}{}",
        vocab.decode(&prompt),
        vocab.decode(&generated)
    );
    // On the C backends they call the step's compiled functions where they share them.
    let imported = imported_functions(&backend) - imported_before;
    println!(
        "(the held-out-loss and sampling routines {}: {:.0} ms{})",
        if ahead {
            "compiled on a spare core during training; their first uses waited and linked"
        } else {
            "compiled on first use"
        },
        trainer.lazy_compile_time().as_secs_f64() * 1e3,
        if imported > 0 {
            format!(", calling {imported} statement functions of the step's library")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn plan(args: &PlanArgs) -> arrayjit::Result<()> {
    use arrayjit::gpt::{CharVocab, GptPrograms, SONNETS, TrainerConfig};
    let PlanArgs {
        device,
        batch,
        only,
        summary,
        compile,
        cache_dir,
        precision,
        allow_tf32,
    } = args.clone();
    use arrayjit::opt::optimize::{OptimizeCtx, OptimizeSettings, optimize_in};
    use arrayjit::opt::schedule::gpu::DeviceModel;
    let model = DeviceModel::named(&device).ok_or_else(|| arrayjit::Error::BadValue {
        what: "device model".into(),
        value: device.clone(),
        expected: format!("one of {}", DeviceModel::NAMES.join(", ")),
    })?;
    if batch == 0 {
        return Err(arrayjit::Error::invalid("--batch must be at least 1"));
    }
    let mut config = TrainerConfig::small(CharVocab::from_text(SONNETS).len());
    config.batch = batch;
    config.model.precision = precision;
    let programs = GptPrograms::new(&config)?;
    let mut settings = OptimizeSettings::for_gpu(model.limits);
    settings.schedule.allow_tf32 = allow_tf32;
    let ctx = OptimizeCtx::empty();
    let mut chosen = Vec::new();
    for (name, program) in programs.routines() {
        // Every routine is optimized, in order, as a trainer does (later ones reuse what the
        // earlier ones computed); only the chosen ones are printed.
        let started = std::time::Instant::now();
        let optimized = optimize_in(&ctx, name, &[], program, &settings)?;
        let optimize = started.elapsed();
        let plan = optimized.gpu_plan(&model);
        if !name.contains(only.as_str()) {
            continue;
        }
        let mut text = plan.to_string();
        if !summary {
            let scratch = optimized.gpu_scratch();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "  scratch: {} bytes of {} locals, {} bytes zeroed before each run (the locals \
                 that may read their initial zeros)",
                scratch.bytes,
                scratch.locals.len(),
                scratch.zeroed_bytes()
            ));
        }
        let shown = if summary {
            text.lines().next().unwrap_or_default()
        } else {
            text.as_str()
        };
        // A closed pipe (`| head`) ends the listing quietly.
        if writeln!(std::io::stdout(), "{shown}").is_err() {
            return Ok(());
        }
        chosen.push((optimized, optimize));
    }
    if compile {
        let arch = model.arch.clone().unwrap_or_else(|| "sm_90".to_string());
        compile_ahead_of_time(&chosen, &arch, cache_dir.as_deref())?;
    }
    Ok(())
}

/// Statement functions the backend's libraries imported from earlier ones so far (0 where its
/// compiler does not count them).
fn imported_functions(backend: &arrayjit::runtime::Backend) -> usize {
    backend
        .lowered()
        .compile_stats()
        .map_or(0, |s| s.imported_functions)
}

/// Compiles routines to CUBIN for `arch` twice: into an empty cache (cold), then through a new
/// cache over the same folder (what a later process finds), printing both; into `into` (kept)
/// where given, else a temporary folder.
fn compile_ahead_of_time(
    chosen: &[(arrayjit::opt::Optimized, std::time::Duration)],
    arch: &str,
    into: Option<&std::path::Path>,
) -> arrayjit::Result<()> {
    use arrayjit::backends::built::cuda_compile_ahead_of_time;
    let temporary = tempfile::tempdir().map_err(|e| {
        arrayjit::Error::io("making a temporary folder for a cold compile cache", e)
    })?;
    let dir = into.unwrap_or(temporary.path());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    for (run, what) in [(0, "cold"), (1, "cached")] {
        for (optimized, optimize) in chosen {
            let p = cuda_compile_ahead_of_time(&[optimized], arch, dir)?;
            let optimize_ms = if run == 0 {
                format!("optimize {:.0} ms, ", optimize.as_secs_f64() * 1e3)
            } else {
                String::new()
            };
            println!(
                "{} for {arch} ({what}): {optimize_ms}render {:.0} ms, NVRTC {:.0} ms on {threads} \
                 thread(s): {} unit(s), {} compiled now, {} KiB of CUBIN, {} kernel(s), {} KiB \
                 of CUDA C",
                optimized.name,
                p.render.as_secs_f64() * 1e3,
                p.compile.as_secs_f64() * 1e3,
                p.units,
                p.compiled_units,
                p.cubin_bytes / 1024,
                p.kernels,
                p.source_bytes / 1024
            );
        }
    }
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

/// `arrayjit tune`: the CPU backend's products timed over the candidate cache shares and fetch
/// levels.
fn tune(backend: Option<String>, budget: u64) -> arrayjit::Result<()> {
    let name = backend.unwrap_or_else(|| "sync_cc".into());
    let b = arrayjit::backend(&name)?;
    eprintln!(
        "tuning the products of {name} on {} (at most {budget} s) ...",
        arrayjit::backends::device_info::CpuInfo::host()
    );
    let report = b.tune_cpu_products(&arrayjit::runtime::TuneSettings {
        time_budget: std::time::Duration::from_secs(budget),
        ..Default::default()
    })?;
    println!("{report}");
    Ok(())
}

fn run(cli: Cli) -> arrayjit::Result<()> {
    match cli.command.unwrap_or(Command::Moons(cli.moons)) {
        Command::Moons(args) => moons(cli.backend, args),
        Command::Lowering => demo::run(cli.backend.as_deref()).map(|r| print!("{}", r.text)),
        Command::Info => info(),
        Command::Tune { budget } => tune(cli.backend, budget),
        Command::Plan(args) => plan(&args),
        Command::Gpt(args) => gpt(cli.backend, args),
        Command::Generate(args) => generate::run(cli.backend, &args),
        Command::BenchGptSize {
            size,
            steps,
            vocabulary,
            attention,
            gelu_tanh,
        } => {
            let backend = cli.backend.as_deref().unwrap_or("sync_cc");
            let model = bench::sizes::ModelChoice {
                vocabulary,
                attention,
                gelu_tanh,
            };
            bench::sizes::child(&size, backend, steps, &model).map(|line| println!("{line}"))
        }
        Command::Bench {
            quick,
            python,
            no_peers,
            only,
            search,
            statements,
        } => bench::run(&bench::BenchConfig {
            quick,
            python,
            no_peers,
            only,
            search,
            statements,
            // The CPU table compares both CPU backends; naming another runs the device table.
            device_backend: cli
                .backend
                .filter(|b| !arrayjit::runtime::registry::is_cpu_backend(b)),
        })
        .map(|table| print!("{table}")),
    }
}

/// The command line, with the demo's flags refused before another command (they would be
/// ignored there).
fn parse() -> Cli {
    let matches = Cli::command().get_matches();
    if let Some((name, _)) = matches.subcommand()
        && name != "moons"
    {
        for flag in [
            "epochs",
            "seed",
            "samples",
            "output",
            "shards",
            "distributed",
        ] {
            if matches.value_source(flag) == Some(ValueSource::CommandLine) {
                Cli::command()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("--{flag} is a flag of the moons demo, not of `{name}`"),
                    )
                    .exit();
            }
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    arrayjit::install_logging();
    let cli = parse();
    let trace = cli.trace.clone();
    if let Some(path) = &trace {
        // Checked now: the run is not wasted on a trace that cannot be written.
        if let Err(e) = std::fs::File::create(path) {
            eprintln!("error: cannot write the trace {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        arrayjit::runtime::start_trace(Default::default());
    }
    let result = run(cli);
    if let Some(path) = &trace
        && let Some(recorded) = arrayjit::runtime::stop_trace()
    {
        match recorded.write(path) {
            Ok(()) => eprintln!(
                "trace: {} ({} events{}); open it in ui.perfetto.dev",
                path.display(),
                recorded.events().len(),
                match recorded.dropped() {
                    0 => String::new(),
                    n => format!(", {n} dropped"),
                }
            ),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

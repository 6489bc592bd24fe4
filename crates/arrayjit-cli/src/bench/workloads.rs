//! The benchmark workloads on arrayjit: each builds tensors with the front end, compiles them
//! into one routine, links it on a fresh stream, runs it once (uploads, warm caches), then
//! reports the median of timed runs (run + await).

use std::time::{Duration, Instant};

use arrayjit_ir::{Prec, Result};
use arrayjit_runtime::{Backend, CompileRequest, Context, Routine, Stream};
use arrayjit_tensor::losses::softmax;
use arrayjit_tensor::{Init, Precision, Tensor, forward_program};

use arrayjit::gpt::{self, CharVocab, GptTrainer, SONNETS, TrainerConfig};
use arrayjit::train::{Classifier, Mlp, mlp_workload};

/// What a workload's rate is measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// Floating-point operations (the work is in FLOP).
    Flops,
    /// Memory traffic (the work is in bytes read and written once each).
    Bytes,
}

/// One row of the benchmark table.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Its name, shared with the peers script.
    pub name: String,
    /// The work per run, in FLOP or bytes.
    pub work: f64,
    /// What the work counts.
    pub rate: Rate,
}

fn input(label: &str, dims: &[usize], stream: u32) -> Result<Tensor> {
    Tensor::param(label, dims, Init::Uniform { lo: -1.0, hi: 1.0 }, 7, stream)
}

/// The workloads (`quick` leaves out the 2048 matmul).
pub fn workloads(quick: bool) -> Vec<Workload> {
    let mut out = Vec::new();
    let sizes: &[usize] = if quick {
        &[512, 1024]
    } else {
        &[512, 1024, 2048]
    };
    for &n in sizes {
        out.push(Workload {
            name: format!("matmul {n}"),
            work: 2.0 * (n * n * n) as f64,
            rate: Rate::Flops,
        });
    }
    let n = (1usize << 24) as f64;
    out.push(Workload {
        name: chain_name(16),
        work: 5.0 * 4.0 * n,
        rate: Rate::Bytes,
    });
    out.push(Workload {
        name: "sum 16M".into(),
        work: 4.0 * n,
        rate: Rate::Bytes,
    });
    out.push(Workload {
        name: "softmax 4096x1024".into(),
        work: 2.0 * 4.0 * 4096.0 * 1024.0,
        rate: Rate::Bytes,
    });
    out.push(Workload {
        name: "conv-like nhc,oc->nho".into(),
        work: 2.0 * 32.0 * 1024.0 * 64.0 * 64.0,
        rate: Rate::Flops,
    });
    out.push(Workload {
        name: MLP.into(),
        work: 3.0 * 2.0 * 256.0 * (784.0 * 256.0 + 256.0 * 256.0 + 256.0 * 10.0),
        rate: Rate::Flops,
    });
    out.push(Workload {
        name: GPT.into(),
        work: gpt_config().step_flops(),
        rate: Rate::Flops,
    });
    out
}

/// The name of the chain `relu(a*b+c)*d` over `m` million (2^20) floats.
pub fn chain_name(m: usize) -> String {
    format!("chain relu(a*b+c)*d {m}M")
}

/// The MLP training step's row name.
pub const MLP: &str = "MLP step 784-256-256-10 b256";

/// The GPT training step's row name: `arrayjit gpt`'s model and optimizer (width 128, 2
/// layers, batch 16 windows of 64 characters, AdamW with clipping), the peer
/// `benches/peers/gpt_torch.py`.
pub const GPT: &str = "GPT step d128 L2 b16";

/// The settings of the table's GPT step: `arrayjit gpt`'s defaults on the sonnets' vocabulary.
pub fn gpt_config() -> TrainerConfig {
    TrainerConfig::small(CharVocab::from_text(SONNETS).len())
}

/// The name of the GPT step's row at `batch` windows (the CPU table's [`GPT`] at 16).
pub fn gpt_name(batch: usize) -> String {
    format!("GPT step d128 L2 b{batch}")
}

/// The batch of a GPT step's row name, if `name` is one (`... b16`, or `... b16 bf16` for
/// the step in bf16 products).
pub fn gpt_batch(name: &str) -> Option<usize> {
    gpt_row(name).map(|(batch, _)| batch)
}

/// The batch and precision of a GPT step's row name, if `name` is one.
pub fn gpt_row(name: &str) -> Option<(usize, Precision)> {
    let rest = name.strip_prefix("GPT step d128 L2 b")?;
    let (batch, precision) = match rest.split_once(' ') {
        Some((batch, precision)) => (batch, precision.parse().ok()?),
        None => (rest, Precision::F32),
    };
    Some((batch.parse().ok()?, precision))
}

/// The name of the GPT step's row at `batch` windows in bf16 products.
pub fn gpt_bf16_name(batch: usize) -> String {
    format!("{} bf16", gpt_name(batch))
}

/// The table's GPT, built, compiled and linked on `backend`, and one batch of the sonnets.
pub fn gpt_trainer(backend: &Backend) -> Result<(GptTrainer, Vec<usize>, Vec<usize>)> {
    gpt_trainer_with(backend, gpt_config().batch, Precision::F32)
}

/// [`gpt_trainer`] at `batch` windows a step, its products in `precision`.
pub fn gpt_trainer_with(
    backend: &Backend,
    batch: usize,
    precision: Precision,
) -> Result<(GptTrainer, Vec<usize>, Vec<usize>)> {
    let mut config = gpt_config();
    config.batch = batch;
    config.model.precision = precision;
    let data = CharVocab::from_text(SONNETS).encode(SONNETS)?;
    let (ids, targets) = gpt::batch(&data, config.batch, config.model.context, 0, 1)?;
    Ok((GptTrainer::new(backend, &config)?, ids, targets))
}

/// The tensors a workload computes (all but the MLP step, which trains a classifier).
fn build(name: &str) -> Result<Vec<Tensor>> {
    if let Some(rest) = name.strip_prefix("matmul ") {
        // `matmul N`, `matmul tf32 N` (f32 factors, TF32 allowed where linked),
        // `matmul bf16 N` (bf16 factors and result) or `matmul bf16 tma N` (the same, staged
        // by the tensor memory accelerator where linked).
        let prec = if rest.starts_with("bf16 ") {
            Prec::Bf16
        } else {
            Prec::F32
        };
        let n = rest.rsplit(' ').next().unwrap_or(rest);
        let n: usize = n.parse().unwrap_or(512);
        let factor = |label: &str, stream: u32| {
            Tensor::param_with_prec(
                label,
                prec,
                &[n, n],
                Init::Uniform { lo: -1.0, hi: 1.0 },
                7,
                stream,
            )
        };
        return Ok(vec![factor("a", 1)?.matmul(&factor("b", 2)?)?]);
    }
    if let Some(m) = name
        .strip_prefix("chain relu(a*b+c)*d ")
        .and_then(|m| m.strip_suffix('M'))
    {
        let n = m.parse::<usize>().unwrap_or(16) << 20;
        let [a, b, c, d] = [1, 2, 3, 4].map(|s| input("x", &[n], s));
        return Ok(vec![a?.mul(&b?)?.add(&c?)?.relu()?.mul(&d?)?]);
    }
    let n = 1 << 24;
    match name {
        "sum 16M" => Ok(vec![input("a", &[n], 1)?.sum_all()?]),
        "softmax 4096x1024" => Ok(vec![softmax(&input("x", &[4096, 1024], 1)?)?]),
        _ => {
            let x = input("x", &[32, 1024, 64], 1)?;
            let w = input("w", &[64, 64], 2)?;
            Ok(vec![Tensor::einsum("nhc,oc->nho", &[&x, &w])?])
        }
    }
}

/// Median of timed calls of `f` after one warm-up: at least 3, up to `budget` of time or 20.
pub fn median_time(mut f: impl FnMut() -> Result<()>, budget: Duration) -> Result<Duration> {
    f()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed() < budget && times.len() < 20) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// The kind of a product row whose bf16 factors sm_90's tensor memory accelerator stages
/// (`matmul bf16 tma N`; [`arrayjit_opt::schedule::ScheduleTuning::gpu_tensor_copies`]).
pub const TENSOR_COPIES_KIND: &str = "bf16 tma ";

/// The median time of one run of the workload on `backend`.
pub fn time_workload(backend: &Backend, name: &str) -> Result<Duration> {
    if name == MLP {
        let (classifier, batches) = mlp_classifier(backend)?;
        let mut epoch = 0;
        let per_epoch = median_time(
            || {
                classifier.epoch(epoch)?;
                epoch += 1;
                Ok(())
            },
            Duration::from_secs(1),
        )?;
        return Ok(per_epoch / batches as u32);
    }
    if let Some((batch, precision)) = gpt_row(name) {
        let (mut trainer, ids, targets) = gpt_trainer_with(backend, batch, precision)?;
        return median_time(
            || trainer.train_step(&ids, &targets).map(|_| ()),
            Duration::from_secs(2),
        );
    }
    let (stream, routine) = linked(backend, name)?;
    median_time(
        || {
            routine.run()?;
            stream.await_work()
        },
        Duration::from_secs(1),
    )
}

/// Workload `name` (one forward routine) compiled on `backend` and linked on a new stream of its
/// device 0.
fn linked(backend: &Backend, name: &str) -> Result<(Stream, Routine)> {
    let outputs = build(name)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    // TF32 rows compile with TF32 allowed; the backend then follows ARRAYJIT_ALLOW_TF32 again.
    let tf32 = name.starts_with("matmul tf32 ");
    if tf32 {
        backend.set_allow_tf32(Some(true));
    }
    // Tensor-copy rows compile with the tuning asking for the accelerator, then as before.
    let settings = backend.optimize_settings();
    if name.contains(TENSOR_COPIES_KIND) {
        let mut tma = settings.clone();
        tma.schedule.tuning.gpu_tensor_copies = true;
        backend.set_optimize_settings(tma);
    }
    let code = backend.compile(CompileRequest::routine("bench", &forward_program(&refs)));
    if tf32 {
        backend.set_allow_tf32(None);
    }
    if name.contains(TENSOR_COPIES_KIND) {
        backend.set_optimize_settings(settings);
    }
    let code = code?;
    let stream = backend.get_device(0)?.new_stream()?;
    let routine = Context::new(&stream).link(&code)?;
    Ok((stream, routine))
}

/// The mean time of one run of workload `name` on the device itself, where the backend times
/// its device (GPU timestamps; see `RunStats::device_timed_runs`): `None` for the training
/// steps (several routines) and on backends whose runs are timed by the host.
pub fn device_time_workload(backend: &Backend, name: &str) -> Result<Option<Duration>> {
    if name == MLP || gpt_batch(name).is_some() {
        return Ok(None);
    }
    let (stream, routine) = linked(backend, name)?;
    // Warm up untimed, then time ten runs.
    routine.run()?;
    stream.await_work()?;
    arrayjit_runtime::set_run_timing(true);
    let timed = (|| {
        for _ in 0..10 {
            routine.run()?;
        }
        stream.await_work()
    })();
    arrayjit_runtime::set_run_timing(false);
    timed?;
    // The device reports its times when the host waits for it.
    backend.lowered().runtime().synchronize(0)?;
    let stats = routine.stats();
    Ok((stats.device_timed_runs > 0).then(|| stats.total / stats.device_timed_runs as u32))
}

/// Searches the schedules of a workload's routines (the MLP step: its training routine) and
/// reports the candidates.
pub fn search_workload(backend: &Backend, name: &str) -> Result<String> {
    if name == MLP {
        // The classifier compiles its routines with the search on, which searches them.
        let t = Instant::now();
        mlp_classifier(backend)?;
        return Ok(format!(
            "schedules of the MLP step's routines searched or loaded in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
    }
    if name == GPT {
        let t = Instant::now();
        gpt_trainer(backend)?;
        return Ok(format!(
            "schedules of the GPT step's routines searched or loaded in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
    }
    let outputs = build(name)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    Ok(backend
        .search_schedule("bench", &forward_program(&refs), &[])?
        .to_string())
}

/// The MLP of the table (784-256-256-10, softmax cross-entropy, SGD) on 4 batches of 256 random
/// rows, built, compiled and linked; and its number of batches.
pub fn mlp_classifier(backend: &Backend) -> Result<(Classifier, usize)> {
    let model = Mlp::new(&[784, 256, 256, 10], 1)?;
    Ok((
        Classifier::new(
            backend,
            model,
            &mlp_workload::dataset(4 * 256)?,
            &mlp_workload::config(),
        )?,
        4,
    ))
}

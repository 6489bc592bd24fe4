//! `arrayjit bench --backend <gpu backend>`: matrix products (f32, TF32 allowed, bf16), the
//! elementwise chain `relu(a*b+c)*d` and the GPT demo's training step (batch 16 and 128, in
//! f32 and in bf16 products) on the backend's device 0, next to the device's own copy
//! bandwidth (a device-to-device copy through the same backend: the memory limit the chain can
//! reach) and, when installed, PyTorch on CUDA (cuBLAS for the products: TF32 off for f32, on
//! for TF32, bf16 tensors for bf16; the same GPT and optimizer, eager and `torch.compile`, and
//! eager under bf16 autocast), all in one run; and the GPT step's build time (compile and
//! link) the first time in the process and again (cached).

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use arrayjit_ir::Result;
use arrayjit_runtime::Backend;

use super::workloads::{self, Rate, Workload, median_time};
use super::{BenchConfig, PeerLine, parse_peer_line, peer_script, python};

/// The workloads: products of 1024 to 8192 (2048 when quick) in f32, as TF32 and in bf16 (from
/// 2048 also with the tensor memory accelerator staging the factors), the
/// chain over `chain_m` million floats, and the GPT step in f32 and in bf16 products.
fn device_workloads(quick: bool, chain_m: usize) -> Vec<Workload> {
    let sizes: &[usize] = if quick {
        &[1024, 2048]
    } else {
        &[1024, 2048, 4096, 8192]
    };
    let mut out: Vec<Workload> = Vec::new();
    for kind in ["", "tf32 ", "bf16 "] {
        out.extend(sizes.iter().map(|&n| Workload {
            name: format!("matmul {kind}{n}"),
            work: 2.0 * (n * n * n) as f64,
            rate: Rate::Flops,
        }));
    }
    // The bf16 products of 2048 and up again with their factors staged by sm_90's tensor
    // memory accelerator (a schedule the tuning must ask for; the same as `bf16` elsewhere).
    out.extend(sizes.iter().filter(|&&n| n >= 2048).map(|&n| Workload {
        name: format!("matmul {}{n}", workloads::TENSOR_COPIES_KIND),
        work: 2.0 * (n * n * n) as f64,
        rate: Rate::Flops,
    }));
    let n = (chain_m << 20) as f64;
    out.push(Workload {
        name: workloads::chain_name(chain_m),
        work: 5.0 * 4.0 * n,
        rate: Rate::Bytes,
    });
    for batch in GPT_BATCHES {
        let mut config = workloads::gpt_config();
        config.batch = batch;
        for name in [workloads::gpt_name(batch), workloads::gpt_bf16_name(batch)] {
            out.push(Workload {
                name,
                work: config.step_flops(),
                rate: Rate::Flops,
            });
        }
    }
    out
}

/// The GPT step's batches in the device table.
const GPT_BATCHES: [usize; 2] = [16, 128];

/// The GPT step's build (optimize, compile, link) on `backend` the first time in this process
/// (from source unless the disk cache holds it) and again (cached), for the notes.
fn gpt_build_times(backend: &Backend) -> Result<String> {
    let first = workloads::gpt_trainer(backend)?.0.compile_and_link;
    let again = workloads::gpt_trainer(backend)?.0.compile_and_link;
    Ok(format!(
        "GPT step b16 built (optimize, compile, link) in {:.2} s the first time in this process \
         (compiled from source unless the disk cache held it), {:.0} ms again (cached)",
        first.as_secs_f64(),
        again.as_secs_f64() * 1e3
    ))
}

/// The copy bandwidth of device 0 through the backend: read plus written bytes per second of
/// a device-to-device copy of `bytes`, on a queue of the device's own where it has them.
fn copy_bandwidth(backend: &Backend, bytes: usize) -> Result<f64> {
    let lowered = backend.lowered();
    let (src, dst) = (
        lowered.runtime().alloc_zeroed(0, bytes)?,
        lowered.runtime().alloc_zeroed(0, bytes)?,
    );
    let queue = lowered.runtime().new_queue(0)?;
    let t = median_time(
        || {
            // SAFETY: both buffers are this function's own; each copy is waited for before
            // the next.
            unsafe {
                lowered
                    .runtime()
                    .copy_buffer(&dst, &src, queue.as_deref())?
            };
            match &queue {
                Some(q) => q.synchronize(),
                None => lowered.runtime().synchronize(0),
            }
        },
        Duration::from_secs(1),
    )?;
    Ok(2.0 * bytes as f64 / t.as_secs_f64() / 1e9)
}

/// PyTorch on CUDA for the same workloads: `(workload, seconds)` and notes.
fn torch_peer(
    config: &BenchConfig,
    list: &[Workload],
    chain_m: usize,
) -> (Vec<(String, f64)>, Vec<String>) {
    let script = peer_script("bench_device_peers.py");
    // Each size and batch once; the kinds of product and the bf16 steps as the rows ask.
    let mut sizes: Vec<String> = Vec::new();
    for rest in list.iter().filter_map(|w| w.name.strip_prefix("matmul ")) {
        let size = rest.rsplit(' ').next().unwrap_or(rest).to_string();
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    let mut kinds = Vec::new();
    for w in list.iter().filter_map(|w| w.name.strip_prefix("matmul ")) {
        let kind = w.split_once(' ').map_or("f32", |(k, _)| k);
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let mut batches: Vec<String> = Vec::new();
    for batch in list.iter().filter_map(|w| workloads::gpt_batch(&w.name)) {
        if !batches.contains(&batch.to_string()) {
            batches.push(batch.to_string());
        }
    }
    let gpt_bf16 = list.iter().any(|w| {
        workloads::gpt_row(&w.name).is_some_and(|(_, p)| p != arrayjit_tensor::Precision::F32)
    });
    let python = python(config);
    let out = Command::new(&python)
        .arg(&script)
        .args([
            "--sizes",
            &sizes.join(","),
            "--chain-m",
            &chain_m.to_string(),
            "--gpt-batches",
            &batches.join(","),
            "--kinds",
            &kinds.join(","),
        ])
        .args(gpt_bf16.then_some("--gpt-bf16"))
        .output();
    let mut times = Vec::new();
    let mut notes = Vec::new();
    match out {
        Err(e) => notes.push(format!("PyTorch not run: {} ({e})", python.display())),
        Ok(out) => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                match parse_peer_line(line) {
                    Some(PeerLine::Time {
                        workload, seconds, ..
                    }) => times.push((workload, seconds)),
                    Some(PeerLine::Error(e)) => notes.push(e),
                    None => {}
                }
            }
            if !out.status.success() {
                notes.push(format!(
                    "the PyTorch script failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ));
            }
        }
    }
    (times, notes)
}

/// Runs the device table on `backend_name`; returns it (markdown).
pub fn run(backend_name: &str, config: &BenchConfig) -> Result<String> {
    let backend = arrayjit_runtime::backend(backend_name)?;
    backend.set_schedule_search(Some(config.search));
    let info = backend.get_device(0)?.info()?;
    eprintln!("device: {info}");
    // Five arrays of the chain in at most a quarter of the device's memory (when the driver
    // says how much it has; wgpu does not).
    let mut chain_m = if config.quick { 64 } else { 256 };
    while chain_m > 16
        && info.memory_bytes > 0
        && (5 * 4 * (chain_m << 20)) as u64 > info.memory_bytes / 4
    {
        chain_m /= 2;
    }
    let list: Vec<Workload> = device_workloads(config.quick, chain_m)
        .into_iter()
        .filter(|w| w.name.contains(&config.only))
        .collect();
    let copy_bytes = (chain_m << 20) * 4;
    eprintln!(
        "copy bandwidth ({} MiB device to device) ...",
        copy_bytes >> 20
    );
    let bandwidth = copy_bandwidth(&backend, copy_bytes)?;
    // First, so that its first build is the process's first (where the step cannot be built
    // here, its rows are left out below, and the note says why).
    let build = list
        .iter()
        .any(|w| workloads::gpt_batch(&w.name).is_some())
        .then(|| {
            gpt_build_times(&backend)
                .unwrap_or_else(|e| format!("GPT step build time not measured: {e}"))
        });
    let mut ours = Vec::new();
    let mut refused = Vec::new();
    for w in &list {
        eprintln!("arrayjit {backend_name}: {} ...", w.name);
        if config.search {
            // The schedules' variants timed on the device (the products' tiles, buffers and
            // group sizes), the fastest kept and run below.
            match workloads::search_workload(&backend, &w.name) {
                Ok(report) => eprintln!("{report}"),
                Err(e) => eprintln!("  schedule search failed: {e}"),
            }
        }
        let t = Instant::now();
        let time = match workloads::time_workload(&backend, &w.name) {
            Ok(time) => time,
            // A workload past a limit of this device (e.g. a binding smaller than the chain's
            // arrays on a software Vulkan) or in a precision it lacks (bf16 on wgpu) is left
            // out of the table with the reason.
            Err(e)
                if matches!(
                    e.root_cause(),
                    arrayjit_ir::Error::LimitExceeded { .. }
                        | arrayjit_ir::Error::UnsupportedPrecision { .. }
                ) =>
            {
                eprintln!("  left out: {e}");
                refused.push(format!("{} left out: {e}", w.name));
                ours.push(None);
                continue;
            }
            Err(e) => return Err(e),
        };
        eprintln!(
            "  {:.3} ms ({:.1} s with setup)",
            time.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64()
        );
        let on_device = workloads::device_time_workload(&backend, &w.name)?;
        ours.push(Some((
            time.as_secs_f64(),
            on_device.map(|d| d.as_secs_f64()),
        )));
    }
    let (peer, mut notes) = if config.no_peers {
        (Vec::new(), vec!["PyTorch not run (--no-peers)".to_string()])
    } else {
        eprintln!("PyTorch on CUDA ...");
        torch_peer(config, &list, chain_m)
    };
    let mut out = String::new();
    let _ = writeln!(out, "device: {info}");
    let _ = writeln!(
        out,
        "copy bandwidth through {backend_name} ({} MiB device to device, read + written): {bandwidth:.0} GB/s\n",
        copy_bytes >> 20
    );
    let _ = writeln!(
        out,
        "| workload | arrayjit {backend_name} | on the device | PyTorch CUDA | arrayjit / PyTorch | of copy bandwidth |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for (w, &(secs, device_secs)) in list
        .iter()
        .zip(&ours)
        .filter_map(|(w, t)| t.as_ref().map(|t| (w, t)))
    {
        let rate = w.work / secs / 1e9;
        let unit = match w.rate {
            Rate::Flops => "GFLOP/s",
            Rate::Bytes => "GB/s",
        };
        // A staging variant's peer is its product's.
        let peer_name = w.name.replace(workloads::TENSOR_COPIES_KIND, "bf16 ");
        let p = peer.iter().find(|(n, _)| *n == peer_name).map(|(_, s)| *s);
        let peer_cell = p.map_or("–".to_string(), |s| {
            format!("{:.3} ms ({:.0} {unit})", s * 1e3, w.work / s / 1e9)
        });
        let ratio = p.map_or("–".to_string(), |s| format!("{:.2}×", s / secs));
        let of_limit = match w.rate {
            Rate::Bytes => format!("{:.0}%", 100.0 * rate / bandwidth),
            Rate::Flops => "–".to_string(),
        };
        let device_cell = device_secs.map_or("–".to_string(), |d| {
            format!("{:.3} ms ({:.0} {unit})", d * 1e3, w.work / d / 1e9)
        });
        let _ = writeln!(
            out,
            "| {} | {:.3} ms ({rate:.0} {unit}) | {device_cell} | {peer_cell} | {ratio} | {of_limit} |",
            w.name,
            secs * 1e3
        );
    }
    let _ = writeln!(
        out,
        "\nCells: median time of one run (run + wait for the device); on the device: the mean \
         kernel time from the device's own timestamps (where the backend reads them). Ratios > 1 \
         mean arrayjit is faster."
    );
    // torch.compile's GPT steps, beside the eager ones in the table.
    for (w, (secs, _)) in list
        .iter()
        .zip(&ours)
        .filter_map(|(w, t)| t.as_ref().map(|t| (w, t)))
        .filter(|(w, _)| workloads::gpt_batch(&w.name).is_some())
    {
        let compiled = format!("{} torch.compile", w.name);
        if let Some((_, s)) = peer.iter().find(|(n, _)| *n == compiled) {
            notes.push(format!(
                "{compiled}: {:.3} ms; arrayjit / torch.compile = {:.2}×",
                s * 1e3,
                s / secs
            ));
        }
    }
    for n in refused.into_iter().chain(build).chain(notes.drain(..)) {
        let _ = writeln!(out, "note: {n}");
    }
    Ok(out)
}

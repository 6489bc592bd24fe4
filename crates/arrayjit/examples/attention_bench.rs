//! Times fused attention alone, forward + backward, f32, causal, on `[batch, time, heads,
//! head_dim]` inputs (the projections' layout), as `benches/peers/attention_torch.py` times
//! PyTorch's `F.scaled_dot_product_attention` on the same shapes; `unfused` times the
//! attention written out (guarded products, masked softmax) instead. Prints one JSON line:
//! the median of the timed runs and the rate counted as FlashAttention-2 counts a causal pass.
//!
//! Run: `cargo run --release --example attention_bench -- 4 12 1024 64 [fused|unfused] [runs]`
//! (`ARRAYJIT_BACKEND=multicore_cc` for every core).

use std::time::Instant;

use arrayjit::runtime::{CompileRequest, Context};
use arrayjit_ir::{AttentionLayout, EinsumGuard, Error, MemoryMode, MemoryType, Prec, Result};
use arrayjit_tensor::{AttentionOptions, Init, Tensor, grad_program};

fn arg(args: &[String], i: usize, what: &str, default: Option<usize>) -> Result<usize> {
    match args.get(i) {
        Some(v) => v
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::BadValue {
                what: what.into(),
                value: v.clone(),
                expected: "a positive whole number".into(),
            }),
        None => default.ok_or_else(|| Error::BadValue {
            what: what.into(),
            value: "nothing".into(),
            expected: "usage: attention_bench BATCH HEADS TIME HEAD_DIM [fused|unfused] [RUNS]"
                .into(),
        }),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (b, h, t, e) = (
        arg(&args, 0, "batch", None)?,
        arg(&args, 1, "heads", None)?,
        arg(&args, 2, "time", None)?,
        arg(&args, 3, "head_dim", None)?,
    );
    let kind = args.get(4).map_or("fused", String::as_str);
    let runs = arg(&args, 5, "runs", Some(5))?;
    let backend = arrayjit::initialize(None)?;
    let dims = [b, t, h, e];
    let normal = Init::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let q = Tensor::param_with_prec("q", Prec::F32, &dims, normal, 1, 0)?;
    let k = Tensor::param_with_prec("k", Prec::F32, &dims, normal, 2, 0)?;
    let v = Tensor::param_with_prec("v", Prec::F32, &dims, normal, 3, 0)?;
    let out = match kind {
        "fused" => {
            let options = AttentionOptions {
                causal: true,
                ..AttentionOptions::default()
            };
            Tensor::attention(AttentionLayout::TimeFirst, &q, &k, &v, &options)?
        }
        "unfused" => {
            let causal = [EinsumGuard::at_most('s', 't', 0)];
            let scores = Tensor::guarded_product("bthe,bshe->bhts", &q, &k, &causal)?
                .scale(1.0 / (e as f64).sqrt())?;
            let hidden = Tensor::full(Prec::F32, &[], -1e9)?;
            let w = Tensor::where_(&Tensor::causal_mask(Prec::F32, t)?, &hidden, &scores)?
                .softmax(3)?;
            Tensor::guarded_product("bhts,bshe->bthe", &w, &v, &causal)?
        }
        other => {
            return Err(Error::BadValue {
                what: "attention".into(),
                value: other.into(),
                expected: "fused or unfused".into(),
            });
        }
    };
    let loss = out.sum_all()?;
    loss.node().update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "attention_bench: read after each run",
    )?;
    let program = grad_program(&loss)?.program;
    let started = Instant::now();
    let code = backend.compile(CompileRequest::routine("attention", &program))?;
    let stream = backend.get_device(0)?.new_stream()?;
    let routine = Context::new(&stream).link(&code)?;
    let build = started.elapsed().as_secs_f64();
    routine.run()?;
    loss.node().host().get_values()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        routine.run()?;
        loss.node().host().get_values()?;
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let s = times[times.len() / 2];
    let flops = 3.5 * 4.0 * (b * h * t * t * e) as f64 / 2.0;
    println!(
        "{{\"lib\": \"arrayjit {kind}\", \"backend\": \"{}\", \"shape\": \"{b},{h},{t},{e}\", \"build_s\": {build}, \"s\": {s}, \"gflops\": {}}}",
        backend.name(),
        flops / s / 1e9
    );
    Ok(())
}

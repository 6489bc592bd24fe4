//! Prints the blocked matrix product's C helper for one blocking as a standalone translation
//! unit that defines `gemm_entry` (the helper's signature), so that blockings can be timed
//! against each other outside the runtime: `scripts/gemm-blocking.sh` compiles it with the CPU
//! backend's flags and links it with `benches/gemm/shapes.c` (or `attention.c`).
//!
//! ```text
//! cargo run --release -p arrayjit-codegen --example gemm_helper -- 12 32 768 512 512 [f32|f64] [l2|l1]
//! ```
//! (register rows `mr`, columns `nr`, cache blocks `mc`, `kc`, `nc`; the precision; the cache
//! streamed operands are fetched into, L2 unless given).

use arrayjit_codegen::c::gemm::standalone_unit;
use arrayjit_ir::Prec;
use arrayjit_opt::schedule::{Blocking, StreamFetch};
use std::process::ExitCode;

const USAGE: &str = "usage: gemm_helper MR NR MC KC NC [f32|f64] [l2|l1] (MR 1 to 32, NR even and \
                     2 to 256, MC a multiple of MR, NC a multiple of NR, KC at least 1; l2 or l1: \
                     the cache streamed operands are fetched into)";

fn parse(args: &[String]) -> Result<(Blocking, Prec), String> {
    let numbers: Vec<usize> = args
        .iter()
        .take(5)
        .map(|a| {
            a.parse()
                .map_err(|_| format!("`{a}` is not a size\n{USAGE}"))
        })
        .collect::<Result<_, _>>()?;
    let [mr, nr, mc, kc, nc] = numbers[..] else {
        return Err(USAGE.to_string());
    };
    let stream_fetch = match args.get(6).map(String::as_str) {
        None | Some("l2") => StreamFetch::L2,
        Some("l1") => StreamFetch::L1,
        Some(other) => return Err(format!("unknown fetch level `{other}`\n{USAGE}")),
    };
    let b = Blocking {
        mr,
        nr,
        mc,
        kc,
        nc,
        stream_fetch,
    };
    if !b.is_usable() {
        return Err(format!("unusable blocking {b:?}\n{USAGE}"));
    }
    let prec = match args.get(5).map(String::as_str) {
        None | Some("f32") => Prec::F32,
        Some("f64") => Prec::F64,
        Some(other) => return Err(format!("unknown precision `{other}`\n{USAGE}")),
    };
    Ok((b, prec))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (b, prec) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", standalone_unit(prec, &b));
    ExitCode::SUCCESS
}

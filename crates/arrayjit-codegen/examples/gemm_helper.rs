//! Prints the blocked matrix product's C helper for one blocking as a standalone translation
//! unit that defines `gemm_entry` (the helper's signature), so that blockings can be timed
//! against each other outside the runtime: `scripts/gemm-blocking.sh` compiles it with the CPU
//! backend's flags and links it with `benches/gemm/shapes.c`.
//!
//! ```text
//! cargo run --release -p arrayjit-codegen --example gemm_helper -- 12 32 768 512 512 [f32|f64]
//! ```
//! (register rows `mr`, columns `nr`, cache blocks `mc`, `kc`, `nc`).

use arrayjit_codegen::c::gemm::{gemm_definition, gemm_name};
use arrayjit_ir::Prec;
use arrayjit_ir::schedule::Blocking;
use std::process::ExitCode;

const USAGE: &str = "usage: gemm_helper MR NR MC KC NC [f32|f64] (MR 1 to 32, NR even and 2 to \
                     256, MC a multiple of MR, NC a multiple of NR, KC at least 1)";

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
    let b = Blocking { mr, nr, mc, kc, nc };
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
    let t = if prec == Prec::F64 { "double" } else { "float" };
    println!(
        "#include <stdint.h>\n#include <string.h>\n#include <math.h>\n\
         typedef struct aj_par {{ const void *pool; void (*run)(const void *pool, void (*chunk)(void *ctx, int64_t index), void *ctx, int64_t chunks); int64_t workers; }} aj_par;"
    );
    println!(
        "{}",
        gemm_definition(prec, &b).replace("__attribute__((visibility(\"hidden\"))) ", "")
    );
    println!(
        "void gemm_entry(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par) {{ {}(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw, guard, par); }}",
        gemm_name(prec, &b)
    );
    ExitCode::SUCCESS
}

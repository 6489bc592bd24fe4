//! The machine's limits, measured by a small C program (`limits.c`) built with the system
//! compiler in the same run as the benchmarks: peak f32 FMA throughput, triad and read
//! bandwidth, on one core and on all.

use std::collections::HashMap;
use std::process::Command;

use arrayjit_backends::device_info::CpuInfo;
use arrayjit_ir::{Error, Result};

const SOURCE: &str = include_str!("limits.c");

/// Limits measured on this machine (GFLOP/s and GB/s).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    /// Peak f32 FMA GFLOP/s on one core and on all.
    pub fma_gflops: [f64; 2],
    /// Triad (`a = b + s·c`) GB/s on one core and on all.
    pub triad_gbs: [f64; 2],
    /// Read (a sum) GB/s on one core and on all.
    pub read_gbs: [f64; 2],
}

/// Builds and runs the limits program with `cc` (or `$CC`) on `cpu.cores` threads.
pub fn measure(cpu: &CpuInfo) -> Result<Limits> {
    let dir = tempfile_dir()?;
    let src = dir.join("limits.c");
    let exe = dir.join("limits");
    let io = |source: std::io::Error| Error::Io {
        context: format!(
            "building and running the limits program in {}",
            dir.display()
        ),
        source,
    };
    std::fs::write(&src, SOURCE).map_err(io)?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut parts = cc.split_whitespace();
    let program = parts.next().unwrap_or("cc");
    let status = Command::new(program)
        .args(parts)
        .args(["-O3", "-march=native", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(io)?;
    if !status.success() {
        return Err(Error::invalid(format!(
            "the C compiler `{cc}` could not build the limits program ({status})"
        )));
    }
    let out = Command::new(&exe)
        .arg(cpu.cores.to_string())
        .arg(cpu.last_level_cache().to_string())
        .output()
        .map_err(io)?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        return Err(Error::invalid(format!(
            "the limits program failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let values: HashMap<String, f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect();
    let get = |k: &str| values.get(k).copied().unwrap_or(f64::NAN);
    let pair = |k: &str| {
        let one = get(&format!("{k}_1"));
        let all = get(&format!("{k}_all"));
        [one, if all > 0.0 { all } else { one }]
    };
    Ok(Limits {
        fma_gflops: pair("fma_gflops"),
        triad_gbs: pair("triad_gbs"),
        read_gbs: pair("read_gbs"),
    })
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("arrayjit-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        context: format!("creating {} for the limits program", dir.display()),
        source,
    })?;
    Ok(dir)
}

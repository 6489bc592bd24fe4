//! What a CPU device can do, read from the machine (never assumed): cores, SIMD width and
//! features, cache sizes. Schedules are chosen from it, and the benchmark table prints it.

use std::fmt;

/// A description of the host CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// The model name, as the OS reports it.
    pub model: String,
    /// Cores (hardware threads) this process may run on.
    pub cores: usize,
    /// Widest SIMD vector in bytes the compiled code may use: 64 (AVX-512), 32 (AVX/AVX2), 16
    /// (SSE/NEON) or 8 when no vector unit is known.
    pub simd_bytes: usize,
    /// Whether fused multiply-add instructions exist.
    pub fma: bool,
    /// Vector registers per core the compiler can allocate (32 with AVX-512, else 16).
    pub vector_registers: usize,
    /// Data cache sizes in bytes by level (L1d, L2, L3), 0 where unknown.
    pub cache_bytes: [usize; 3],
}

impl CpuInfo {
    /// The host CPU, detected now.
    pub fn detect() -> CpuInfo {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (simd_bytes, fma, vector_registers) = simd();
        CpuInfo {
            model: model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            cores,
            simd_bytes,
            fma,
            vector_registers,
            cache_bytes: caches(),
        }
    }

    /// `f32` lanes of the widest vector.
    pub fn f32_lanes(&self) -> usize {
        self.simd_bytes / 4
    }

    /// The last-level cache in bytes (0 if unknown).
    pub fn last_level_cache(&self) -> usize {
        self.cache_bytes
            .iter()
            .rev()
            .copied()
            .find(|&c| c > 0)
            .unwrap_or(0)
    }

    /// The SIMD extension in words: "AVX-512", "AVX2", ...
    pub fn simd_name(&self) -> &'static str {
        match (self.simd_bytes, self.fma) {
            (64, _) => "AVX-512",
            (32, true) => "AVX2+FMA",
            (32, false) => "AVX",
            (16, _) => "128-bit SIMD",
            _ => "no SIMD",
        }
    }
}

impl fmt::Display for CpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kib = |b: usize| {
            if b == 0 {
                "?".to_string()
            } else {
                format!("{} KiB", b / 1024)
            }
        };
        write!(
            f,
            "{}, {} core(s), {} ({} f32 lanes), caches L1d {} / L2 {} / L3 {}",
            self.model,
            self.cores,
            self.simd_name(),
            self.f32_lanes(),
            kib(self.cache_bytes[0]),
            kib(self.cache_bytes[1]),
            kib(self.cache_bytes[2])
        )
    }
}

#[cfg(target_arch = "x86_64")]
fn simd() -> (usize, bool, usize) {
    let fma = std::arch::is_x86_feature_detected!("fma");
    if std::arch::is_x86_feature_detected!("avx512f") {
        (64, fma, 32)
    } else if std::arch::is_x86_feature_detected!("avx") {
        (32, fma, 16)
    } else {
        (16, fma, 16)
    }
}

#[cfg(target_arch = "aarch64")]
fn simd() -> (usize, bool, usize) {
    (16, true, 32)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd() -> (usize, bool, usize) {
    (8, false, 16)
}

fn model_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Model"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Data and unified cache sizes of cpu0 by level, from sysfs.
fn caches() -> [usize; 3] {
    let mut out = [0; 3];
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let Ok(level) = level.trim().parse::<usize>() else {
            continue;
        };
        if (1..=3).contains(&level) {
            out[level - 1] = parse_size(size.trim()).unwrap_or(0);
        }
    }
    out
}

/// `48K`, `2048K`, `260M` → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "KB" | "KiB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_detection_is_consistent() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("260M"), Some(260 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("lots"), None);
        let cpu = CpuInfo::detect();
        assert!(cpu.cores >= 1);
        assert!([8, 16, 32, 64].contains(&cpu.simd_bytes));
        assert_eq!(cpu.f32_lanes() * 4, cpu.simd_bytes);
        assert!(cpu.to_string().contains("core(s)"));
    }
}

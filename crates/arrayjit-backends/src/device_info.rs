//! What a device can do, read from the machine or the driver (never assumed). [`DeviceInfo`]
//! is the one description every backend gives of its devices — compute units, the largest
//! local (workgroup) size, shared memory, subgroup width, precisions, vector width, caches and
//! memory — and schedules are chosen from it. A CPU fills it from [`CpuInfo`] (cores, SIMD
//! width and features, cache sizes), which the benchmark table also prints.

use std::fmt;

use arrayjit_ir::{Error, Prec, Result, Tnode};
use arrayjit_opt::schedule::{GpuLimits, ScheduleSettings};

/// What kind of processor a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// CPU cores: a launch's grid is split over worker threads; one "invocation" per worker.
    Cpu,
    /// A GPU: a launch is a grid of workgroups (blocks) of invocations (threads).
    Gpu,
}

/// A device's description, as its backend reads it from the machine or the driver.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// A readable name (the CPU model, the adapter's name).
    pub name: String,
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// Units that run in parallel: the CPU worker threads of the device, a GPU's SMs or
    /// compute units (0 when the driver does not say).
    pub compute_units: usize,
    /// Largest local (workgroup / block) size per dimension (`[1, 1, 1]` on a CPU).
    pub max_local_size: [u32; 3],
    /// Largest number of invocations in one local group (1 on a CPU).
    pub max_local_invocations: u32,
    /// Shared (workgroup) memory per local group, in bytes (0 on a CPU: a worker's stack and
    /// caches play that role).
    pub max_shared_bytes: usize,
    /// Shared memory per local group where a kernel opts in to more (see
    /// [`GpuLimits::max_opt_in_shared_bytes`]); `max_shared_bytes` where there is no opt-in.
    pub max_opt_in_shared_bytes: usize,
    /// Shared memory of one compute unit (0 when unknown or on a CPU).
    pub shared_bytes_per_unit: usize,
    /// Invocations that run in lock step: a GPU's subgroup or warp, a CPU's `f32` SIMD lanes.
    pub subgroup_size: usize,
    /// Widest vector load or register in bytes (CPU SIMD width; 16 on GPUs: `vec4<f32>`).
    pub vector_bytes: usize,
    /// Vector registers a compiler may allocate per thread (0 when not meaningful).
    pub vector_registers: usize,
    /// Data cache sizes by level (L1d, L2, L3) in bytes, 0 where unknown.
    pub cache_bytes: [usize; 3],
    /// Device memory in bytes (host memory for a CPU), 0 when unknown.
    pub memory_bytes: u64,
    /// Precisions kernels on the device may compute in.
    pub precisions: Vec<Prec>,
    /// The device multiplies warp-level matrix fragments (NVIDIA tensor cores through
    /// `mma.sync`, compute capability 8.0 or later; the CUDA emulation): see
    /// [`GpuLimits::matrix_units`].
    pub matrix_units: bool,
    /// The device multiplies warpgroup-wide fragments from shared memory (`wgmma`, sm_90; the
    /// CUDA emulation): see [`GpuLimits::warpgroup_mma`].
    pub warpgroup_mma: bool,
    /// The most parameters (buffers and static indices) one launch of passes run together may
    /// take (see [`GpuLimits::joined_launch_parameters`]); 0: every pass launches alone.
    pub joined_launch_parameters: usize,
}

impl DeviceInfo {
    /// A CPU device of `workers` worker threads.
    pub fn cpu(cpu: &CpuInfo, workers: usize) -> DeviceInfo {
        DeviceInfo {
            name: cpu.model.clone(),
            kind: DeviceKind::Cpu,
            compute_units: workers.max(1),
            max_local_size: [1, 1, 1],
            max_local_invocations: 1,
            max_shared_bytes: 0,
            max_opt_in_shared_bytes: 0,
            shared_bytes_per_unit: 0,
            subgroup_size: cpu.f32_lanes().max(1),
            vector_bytes: cpu.simd_bytes,
            vector_registers: cpu.vector_registers,
            cache_bytes: cpu.cache_bytes,
            memory_bytes: host_memory_bytes(),
            precisions: Prec::ALL.to_vec(),
            matrix_units: false,
            warpgroup_mma: false,
            joined_launch_parameters: 0,
        }
    }

    /// Whether kernels on the device may compute in `prec`.
    pub fn supports(&self, prec: Prec) -> bool {
        self.precisions.contains(&prec)
    }

    /// `Ok` if the device supports every node's precision; otherwise
    /// [`Error::UnsupportedPrecision`] naming the first node that it cannot run, the device
    /// (`device` is its user-facing name, e.g. `wgpu:0`) and what it supports.
    pub fn check_precisions<'a>(
        &self,
        device: &str,
        nodes: impl IntoIterator<Item = &'a Tnode>,
    ) -> Result<()> {
        for tn in nodes {
            if !self.supports(tn.prec()) {
                return Err(Error::UnsupportedPrecision {
                    device: format!("{device} ({})", self.name),
                    prec: tn.prec(),
                    node: tn.debug_name(),
                    supported: self.precisions.clone(),
                });
            }
        }
        Ok(())
    }

    /// What schedules on this device may assume: its vector width, registers and caches (the
    /// other settings keep their defaults); for a device that runs groups of invocations (a
    /// GPU, or the CUDA emulation: more than one invocation per group), its group limits, so
    /// that every statement gets a GPU pass chosen from them.
    pub fn schedule_settings(&self) -> ScheduleSettings {
        let defaults = ScheduleSettings::default();
        let gpu = (self.max_local_invocations > 1).then(|| GpuLimits {
            max_group_invocations: self.max_local_invocations.min(self.max_local_size[0]),
            max_shared_bytes: self.max_shared_bytes,
            max_opt_in_shared_bytes: self.max_opt_in_shared_bytes.max(self.max_shared_bytes),
            shared_bytes_per_unit: self.shared_bytes_per_unit,
            subgroup_size: u32::try_from(self.subgroup_size).unwrap_or(0),
            compute_units: self.compute_units,
            matrix_units: self.matrix_units,
            warpgroup_mma: self.warpgroup_mma,
            joined_launch_parameters: self.joined_launch_parameters,
        });
        ScheduleSettings {
            gpu,
            f32_lanes: (self.vector_bytes / 4).max(1),
            vector_registers: if self.vector_registers > 0 {
                self.vector_registers
            } else {
                defaults.vector_registers
            },
            cache_bytes: self.cache_bytes,
            ..defaults
        }
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [x, y, z] = self.max_local_size;
        write!(
            f,
            "{} ({:?}): {} compute unit(s), local size up to {x}×{y}×{z} ({} invocations), {} B \
             shared, subgroup {}, {}-byte vectors, {} MiB memory",
            self.name,
            self.kind,
            self.compute_units,
            self.max_local_invocations,
            self.max_shared_bytes,
            self.subgroup_size,
            self.vector_bytes,
            self.memory_bytes >> 20
        )
    }
}

/// Host memory from `/proc/meminfo` (0 when unknown), read once per process.
fn host_memory_bytes() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(read_host_memory_bytes)
}

fn read_host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(0)
}

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
    /// The vendor as the processor names itself (`GenuineIntel`, `AuthenticAMD`; empty
    /// where the OS does not say).
    pub vendor: String,
    /// The processor's family number (x86 `cpu family`; 0 where unknown).
    pub family: u32,
    /// The processor's model number within its family (x86 `model`; 0 where unknown).
    pub model_number: u32,
}

impl CpuInfo {
    /// The host CPU, detected now.
    pub fn detect() -> CpuInfo {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (simd_bytes, fma, vector_registers) = simd();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| cpuinfo_field(&cpuinfo, name);
        CpuInfo {
            model: field("model name")
                .or_else(|| field("Model"))
                .unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            cores,
            simd_bytes,
            fma,
            vector_registers,
            cache_bytes: caches(),
            vendor: field("vendor_id").unwrap_or_default(),
            family: field("cpu family")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            model_number: field("model").and_then(|v| v.parse().ok()).unwrap_or(0),
        }
    }

    /// The host CPU, detected once per process.
    pub fn host() -> &'static CpuInfo {
        static HOST: std::sync::OnceLock<CpuInfo> = std::sync::OnceLock::new();
        HOST.get_or_init(CpuInfo::detect)
    }

    /// What tuning measured on this CPU applies to: vendor, family, model, vector width and
    /// cache sizes (`GenuineIntel family 6 model 207, AVX-512, caches 48/2048/266240 KiB`).
    pub fn identity(&self) -> String {
        let vendor = if self.vendor.is_empty() {
            std::env::consts::ARCH
        } else {
            &self.vendor
        };
        format!(
            "{vendor} family {} model {}, {}, caches {}/{}/{} KiB",
            self.family,
            self.model_number,
            self.simd_name(),
            self.cache_bytes[0] >> 10,
            self.cache_bytes[1] >> 10,
            self.cache_bytes[2] >> 10
        )
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

/// The value of the first line of `/proc/cpuinfo`'s text whose key is exactly `name`.
fn cpuinfo_field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(key, _)| key.trim() == name)
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
        assert!(cpu.identity().contains(cpu.simd_name()));
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor\n";
        assert_eq!(cpuinfo_field(text, "model").as_deref(), Some("207"));
        assert_eq!(
            cpuinfo_field(text, "model name").as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(cpuinfo_field(text, "cpu family").as_deref(), Some("6"));
        assert_eq!(cpuinfo_field(text, "stepping"), None);
    }

    #[test]
    fn a_cpu_device_runs_every_precision_and_names_what_another_lacks() {
        let cpu = CpuInfo::detect();
        let info = DeviceInfo::cpu(&cpu, 3);
        assert_eq!(info.compute_units, 3);
        assert_eq!(info.subgroup_size, cpu.f32_lanes());
        assert!(Prec::ALL.iter().all(|&p| info.supports(p)));
        assert_eq!(info.schedule_settings().f32_lanes, cpu.f32_lanes());
        assert_eq!(info.schedule_settings().cache_bytes, cpu.cache_bytes);
        // A device without f64 (as WGSL without the extension) refuses an f64 node by name.
        let gpu = DeviceInfo {
            name: "test adapter".into(),
            kind: DeviceKind::Gpu,
            precisions: vec![Prec::F32, Prec::I32, Prec::U32],
            ..info
        };
        let x = Tnode::new(Prec::F32, &[2], &["x"]).unwrap();
        let y = Tnode::new(Prec::F64, &[2], &["wide"]).unwrap();
        assert!(gpu.check_precisions("wgpu:0", [&x]).is_ok());
        let e = gpu
            .check_precisions("wgpu:0", [&x, &y])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("wgpu:0 (test adapter)") && e.contains("f64") && e.contains("wide"),
            "{e}"
        );
        assert!(e.contains("f32, i32, u32"), "{e}");
    }
}

//! What each compiled kernel needs of an SM — registers per thread, spilled bytes, static
//! shared memory — read from ptxas's report (NVRTC with `--ptxas-options=-v`, compiling
//! machine code for a real architecture), and the occupancy that follows: how many blocks of
//! the kernel one SM holds at once. Needs only NVRTC, no GPU, so a plan's occupancy is checked
//! on any machine.
//!
//! **Occupancy** of a kernel of `t` threads per block is the least of: the register file
//! (65,536 registers per SM; each warp's registers allocated in units of 256), shared memory
//! (the architecture's per-SM capacity, with 1 KiB reserved per block), 2,048 threads per SM
//! (1,536 on sm_86 and sm_89), and 32 blocks per SM.

use arrayjit_ir::{Error, Result};

use super::ptx::{Output, default_nvrtc_flags, nvrtc_with_log};

/// What one kernel needs of an SM, and how many of its blocks fit on one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's symbol.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_bytes: u32,
    /// Static shared memory per block in bytes.
    pub shared_bytes: u32,
    /// ptxas's notes of a potential performance loss in it (e.g. warpgroup products it
    /// serialized, waiting for each before the next), as reported.
    pub performance_notes: Vec<String>,
}

impl KernelResources {
    /// Blocks of `threads` threads of this kernel one SM of `arch` holds at once (see the
    /// module documentation); 0 when a block does not fit at all.
    pub fn blocks_per_sm(&self, arch: &str, threads: u32) -> u32 {
        self.blocks_per_sm_with(arch, threads, 0)
    }

    /// [`KernelResources::blocks_per_sm`] where each block also takes `dynamic_shared` bytes
    /// of dynamic shared memory at launch (ptxas reports only the static ones).
    pub fn blocks_per_sm_with(&self, arch: &str, threads: u32, dynamic_shared: u32) -> u32 {
        let threads = threads.max(1);
        let warps = threads.div_ceil(32);
        let per_warp = (self.registers.max(1) * 32).div_ceil(256) * 256;
        let by_registers = 65_536 / (per_warp * warps);
        let (shared_per_sm, threads_per_sm) = sm_capacity(arch);
        let shared = self.shared_bytes + dynamic_shared;
        let by_shared = if shared == 0 {
            u32::MAX
        } else {
            shared_per_sm / (shared + 1024)
        };
        by_registers
            .min(by_shared)
            .min(threads_per_sm / threads)
            .min(32)
    }
}

/// Shared memory per SM (bytes) and threads per SM of a real architecture `sm_XY`.
fn sm_capacity(arch: &str) -> (u32, u32) {
    match arch.trim_start_matches("sm_").trim_end_matches('a') {
        "90" | "100" | "120" => (228 << 10, 2048),
        "80" => (164 << 10, 2048),
        "86" | "89" => (100 << 10, 1536),
        "87" => (164 << 10, 2048),
        _ => (64 << 10, 2048),
    }
}

/// The resources of every kernel of `source` compiled for the real architecture `arch`
/// (`sm_80`, `sm_90`) with the default NVRTC flags, in the order ptxas reports them. A compile
/// error is an [`Error::Render`] with NVRTC's log; no NVRTC an [`Error::BackendUnavailable`].
pub fn kernel_resources(source: &str, arch: &str) -> Result<Vec<KernelResources>> {
    // SAFETY: this only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::BackendUnavailable {
            backend: super::NAME.into(),
            reason: "NVRTC (libnvrtc.so) was not found".into(),
            how_to_enable: super::HOW_TO_ENABLE.into(),
        });
    }
    if !arch.starts_with("sm_") {
        return Err(Error::BadValue {
            what: "architecture for kernel resources".into(),
            value: arch.into(),
            expected: "a real architecture such as sm_80 or sm_90".into(),
        });
    }
    let mut flags = default_nvrtc_flags();
    flags.push("--ptxas-options=-v".into());
    let (_, log) = nvrtc_with_log(Output::Cubin, source, arch, &flags)?;
    Ok(parse_ptxas_report(&log))
}

/// The kernels of a ptxas report: a `Compiling entry function 'name'` line, then the
/// `bytes spill stores` and `Used N registers ... M bytes smem` lines that follow it.
fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    // The number just before `word` on a line.
    let before = |line: &str, word: &str| -> Option<u32> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.push(KernelResources {
                name,
                registers: 0,
                spill_bytes: 0,
                shared_bytes: 0,
                performance_notes: Vec::new(),
            });
            continue;
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        if let Some(spill) = before(line, "bytes spill stores") {
            k.spill_bytes = spill;
        }
        if line.contains("Used") {
            k.registers = line
                .split("Used")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            k.shared_bytes = before(line, "bytes smem").unwrap_or(0);
        }
    }
    // Notes of waits ptxas added or products it serialized come before their kernel's
    // report, naming it.
    for line in log.lines() {
        if !(line.contains("Performance Loss") || line.contains("is injected")) {
            continue;
        }
        let named = line
            .rsplit("function '")
            .next()
            .and_then(|rest| rest.split('\'').next());
        if let Some(k) = kernels.iter_mut().find(|k| Some(k.name.as_str()) == named) {
            k.performance_notes.push(line.trim().to_string());
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ptxas_report_gives_each_kernels_resources_and_occupancy() {
        let log = "ptxas info    : 0 bytes gmem\n\
             ptxas info    : Compiling entry function 'aj0_mm_p0' for 'sm_90'\n\
             ptxas info    : Function properties for aj0_mm_p0\n    \
             0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
             ptxas info    : Used 168 registers, used 1 barriers, 40960 bytes smem, 400 bytes cmem[0]\n\
             ptxas info    : Compiling entry function 'aj0_mm_p1' for 'sm_90'\n\
             ptxas info    : Function properties for aj0_mm_p1\n    \
             0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
             ptxas info    : Used 12 registers, 360 bytes cmem[0]\n";
        let k = parse_ptxas_report(log);
        assert_eq!(k.len(), 2);
        assert_eq!(
            (
                k[0].name.as_str(),
                k[0].registers,
                k[0].spill_bytes,
                k[0].shared_bytes
            ),
            ("aj0_mm_p0", 168, 8, 40960)
        );
        assert_eq!((k[1].registers, k[1].shared_bytes), (12, 0));
        // 168 registers × 256 threads: 43,008 of 65,536 registers: one block per SM.
        assert_eq!(k[0].blocks_per_sm("sm_90", 256), 1);
        // 128 registers: two.
        let two = KernelResources {
            registers: 128,
            ..k[0].clone()
        };
        assert_eq!(two.blocks_per_sm("sm_90", 256), 2);
        // 12 registers, 256 threads: the 2,048 threads per SM bound it (8 blocks).
        assert_eq!(k[1].blocks_per_sm("sm_90", 256), 8);
        // Shared memory bounds 40 KiB blocks (41 KiB with the reserve) to 4 on sm_80's 164 KiB
        // and 5 on sm_90's 228 KiB.
        let light = KernelResources {
            registers: 32,
            ..k[0].clone()
        };
        assert_eq!(light.blocks_per_sm("sm_80", 128), 4);
        assert_eq!(light.blocks_per_sm("sm_90", 128), 5);
        // With 96 KiB of dynamic shared memory besides its 40 KiB: one on sm_90's 228 KiB;
        // 96 KiB alone (97 with the reserve): two.
        assert_eq!(light.blocks_per_sm_with("sm_90", 128, 96 << 10), 1);
        assert_eq!(k[1].blocks_per_sm_with("sm_90", 128, 96 << 10), 2);
        assert!(k.iter().all(|k| k.performance_notes.is_empty()));
        let serialized = parse_ptxas_report(
            "ptxas info    : (C7517) warpgroup.wait is injected in around line 762 by compiler \
             to allow use of registers defined by GMMA in function 'aj0_mm_p0'\n\
             ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions \
             are serialized due to insufficient register resources for the wgmma pipeline in \
             the function 'aj0_mm_p0'\n\
             ptxas info    : Compiling entry function 'aj0_mm_p0' for 'sm_90a'\n\
             ptxas info    : Used 119 registers, used 1 barriers\n\
             ptxas info    : Compiling entry function 'aj0_mm_p1' for 'sm_90a'\n",
        );
        assert_eq!(serialized[0].performance_notes.len(), 2);
        assert!(serialized[1].performance_notes.is_empty());
    }
}

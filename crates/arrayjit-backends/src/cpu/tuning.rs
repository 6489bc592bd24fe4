//! How much of each cache the CPU backends' blocked products fill on this CPU, and which
//! cache they fetch streamed operands into ([`CacheShares`]), and where that choice comes
//! from. CPUs of the same vector width and cache sizes differ in how fast their L2 and L3 feed
//! one core (AMD Zen's L3 keeps up with its FMA units, Intel Xeon's mesh L3 does not) and in
//! how many fetches each level keeps in flight, so the choice is measured, not derived from
//! sizes.
//!
//! Rules:
//! - `ARRAYJIT_CPU_SHARES` (`sliver_of_l1=2/8 block_of_l2=4/8`) overrides everything, for
//!   experiments and for processes whose compile cache is not the user's (the benchmark's
//!   cold-cache builds); a value that does not parse is ignored with a warning naming it.
//! - A choice `arrayjit tune` measured on this CPU and stored in the compile cache (keyed by
//!   [`CpuInfo::identity`]: vendor, family, model, vector width, cache sizes) comes first.
//! - Else the table of CPUs the project measured ([`MEASURED`]), by vendor, family and model.
//! - Else a default by vendor: Intel's Xeon choice for Intel, the Zen choice otherwise; the
//!   first backend made in the process says once that `arrayjit tune` can measure this CPU.
//! - Any choice is valid for any product: it changes the blocking, hence speed and the order
//!   of float sums, never which products are computed. A stored choice that does not parse
//!   is ignored with a warning.

use arrayjit_opt::schedule::CacheShares;

use crate::device_info::CpuInfo;

/// A CPU whose products' cache shares the project measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeasuredCpu {
    /// Vendor as the CPU names itself (`GenuineIntel`, `AuthenticAMD`).
    pub vendor: &'static str,
    /// Family number.
    pub family: u32,
    /// Model numbers within the family (empty: every model of the family).
    pub models: &'static [u32],
    /// The measured choice.
    pub shares: CacheShares,
    /// Where and how it was measured.
    pub measured_on: &'static str,
}

/// The CPUs measured so far (`scripts/gemm-blocking.sh`, one core, f32; see [`CacheShares`]).
/// Every entry fetches streamed operands into L2: measured on the Zen 4 (`arrayjit tune`, one
/// row by 72 MiB of matrices: 24.2 GB/s against 14.9 into L1; GPT-2 small decoded 43.5 against
/// 31.2 tokens/s), not yet on the Xeon or the Zen 5, where `arrayjit tune` measures it.
pub const MEASURED: &[MeasuredCpu] = &[
    MeasuredCpu {
        vendor: "GenuineIntel",
        family: 6,
        models: &[207],
        shares: CacheShares::L2_RESIDENT,
        measured_on: "Intel Xeon family 6 model 207 (48 KiB L1, 2 MiB L2), 2 cores, AVX-512, 2026-12-06",
    },
    MeasuredCpu {
        vendor: "AuthenticAMD",
        family: 25,
        models: &[],
        shares: CacheShares::WIDE,
        measured_on: "AMD EPYC Zen 4 (family 25; 32 KiB L1, 1 MiB L2), 2 cores, AVX-512",
    },
    MeasuredCpu {
        vendor: "AuthenticAMD",
        family: 26,
        models: &[],
        shares: CacheShares::WIDE,
        measured_on: "AMD EPYC Zen 5 (family 26; 48 KiB L1, 1 MiB L2), 2 cores, AVX-512",
    },
];

/// Where a CPU's cache shares come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharesSource {
    /// Given by `ARRAYJIT_CPU_SHARES`.
    Environment,
    /// Measured on this machine by `arrayjit tune` and stored in the compile cache.
    Stored,
    /// The project's table: measured on a CPU of the same vendor, family and model.
    Measured(&'static str),
    /// No measurement of this CPU: the default for its vendor.
    VendorDefault,
}

/// The cache shares products use on a CPU, and where they come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuShares {
    /// The shares.
    pub shares: CacheShares,
    /// Their source.
    pub source: SharesSource,
}

impl std::fmt::Display for CpuShares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            SharesSource::Environment => write!(f, "{} (from ARRAYJIT_CPU_SHARES)", self.shares),
            SharesSource::Stored => write!(f, "{} (measured here by `arrayjit tune`)", self.shares),
            SharesSource::Measured(on) => write!(f, "{} (measured on {on})", self.shares),
            SharesSource::VendorDefault => write!(
                f,
                "{} (this CPU's vendor's default; `arrayjit tune` measures this CPU)",
                self.shares
            ),
        }
    }
}

/// The shares for `cpu` from the project's table, else its vendor's default.
pub fn table_shares(cpu: &CpuInfo) -> CpuShares {
    let found = MEASURED.iter().find(|m| {
        m.vendor == cpu.vendor
            && m.family == cpu.family
            && (m.models.is_empty() || m.models.contains(&cpu.model_number))
    });
    match found {
        Some(m) => CpuShares {
            shares: m.shares,
            source: SharesSource::Measured(m.measured_on),
        },
        None => CpuShares {
            shares: if cpu.vendor == "GenuineIntel" {
                CacheShares::L2_RESIDENT
            } else {
                CacheShares::WIDE
            },
            source: SharesSource::VendorDefault,
        },
    }
}

/// The shares `ARRAYJIT_CPU_SHARES` gives, if it is set (one that does not parse is ignored
/// with a warning naming the value and the form expected).
pub fn from_environment() -> Option<CpuShares> {
    parse_environment(
        crate::settings::text(&crate::settings::process_env, ENV).map_err(|e| e.to_string()),
    )
}

/// The variable that overrides the shares.
const ENV: &str = "ARRAYJIT_CPU_SHARES";

fn parse_environment(value: std::result::Result<Option<String>, String>) -> Option<CpuShares> {
    match value.and_then(|v| v.map(|t| CacheShares::parse(t.trim())).transpose()) {
        Ok(Some(shares)) => Some(CpuShares {
            shares,
            source: SharesSource::Environment,
        }),
        Ok(None) => None,
        Err(why) => {
            crate::notice::warn_user(&format!(
                "ignoring {ENV}: {why} (expected e.g. `{}`)",
                CacheShares::L2_RESIDENT
            ));
            None
        }
    }
}

/// The key a measured choice for `cpu` is stored under in the compile cache's schedule store
/// (a hash of [`CpuInfo::identity`]).
pub fn stored_key(cpu: &CpuInfo) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"arrayjit cpu cache shares v1\0");
    h.update(cpu.identity().as_bytes());
    h.finalize().to_hex().to_string()
}

/// The shares for `cpu`: `stored` (the text the schedule store holds under
/// [`stored_key`], if any) when it parses, else [`table_shares`]. A stored text that does not
/// parse is ignored with a warning; a vendor default is announced once per process.
pub fn resolve(cpu: &CpuInfo, stored: std::result::Result<Option<String>, String>) -> CpuShares {
    match stored.and_then(|text| text.map(|t| CacheShares::parse(t.trim())).transpose()) {
        Ok(Some(shares)) => {
            return CpuShares {
                shares,
                source: SharesSource::Stored,
            };
        }
        Ok(None) => {}
        Err(why) => {
            crate::notice::warn_user(&format!(
                "ignoring the stored product tuning of this CPU ({}): {why}; run `arrayjit tune` to measure it again",
                cpu.identity()
            ));
        }
    }
    let chosen = table_shares(cpu);
    if chosen.source == SharesSource::VendorDefault {
        crate::notice::warn_user(&format!(
            "no measured product tuning for this CPU ({}): blocked products use {}; `arrayjit tune` measures this CPU in under a minute and stores the choice for later runs",
            cpu.identity(),
            chosen.shares
        ));
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(vendor: &str, family: u32, model_number: u32) -> CpuInfo {
        CpuInfo {
            model: "test".into(),
            cores: 2,
            simd_bytes: 64,
            fma: true,
            vector_registers: 32,
            cache_bytes: [48 << 10, 2 << 20, 260 << 20],
            vendor: vendor.into(),
            family,
            model_number,
        }
    }

    #[test]
    fn the_table_names_where_each_choice_was_measured() {
        let xeon = table_shares(&cpu("GenuineIntel", 6, 207));
        assert_eq!(xeon.shares, CacheShares::L2_RESIDENT);
        assert!(matches!(xeon.source, SharesSource::Measured(on) if on.contains("model 207")));
        let zen5 = table_shares(&cpu("AuthenticAMD", 26, 2));
        assert_eq!(zen5.shares, CacheShares::WIDE);
        assert!(matches!(zen5.source, SharesSource::Measured(_)));
        // Unmeasured CPUs take their vendor's default.
        let other_intel = table_shares(&cpu("GenuineIntel", 6, 143));
        assert_eq!(other_intel.shares, CacheShares::L2_RESIDENT);
        assert_eq!(other_intel.source, SharesSource::VendorDefault);
        assert!(other_intel.to_string().contains("arrayjit tune"));
        let arm = table_shares(&cpu("", 0, 0));
        assert_eq!(arm.shares, CacheShares::WIDE);
    }

    #[test]
    fn a_stored_choice_wins_and_a_damaged_one_is_ignored() {
        let xeon = cpu("GenuineIntel", 6, 207);
        let stored = resolve(&xeon, Ok(Some("sliver_of_l1=4/8 block_of_l2=8/8\n".into())));
        assert_eq!(
            (
                stored.shares.sliver_of_l1,
                stored.shares.block_of_l2,
                stored.source
            ),
            (4, 8, SharesSource::Stored)
        );
        let damaged = resolve(&xeon, Ok(Some("sliver_of_l1=99/8".into())));
        assert_eq!(damaged, table_shares(&xeon));
        let unreadable = resolve(&xeon, Err("not a private file".into()));
        assert_eq!(unreadable, table_shares(&xeon));
        assert_eq!(resolve(&xeon, Ok(None)), table_shares(&xeon));
    }

    #[test]
    fn the_environment_gives_shares_or_is_ignored_when_it_does_not_parse() {
        let given = parse_environment(Ok(Some(" sliver_of_l1=4/8 block_of_l2=2/8 ".into())));
        assert_eq!(
            given.map(|g| (g.shares.sliver_of_l1, g.shares.block_of_l2, g.source)),
            Some((4, 2, SharesSource::Environment))
        );
        assert_eq!(parse_environment(Ok(None)), None);
        assert_eq!(parse_environment(Ok(Some("lots".into()))), None);
        assert_eq!(parse_environment(Err("not UTF-8".into())), None);
    }

    #[test]
    fn keys_follow_the_cpu_identity() {
        let a = stored_key(&cpu("GenuineIntel", 6, 207));
        assert_eq!(a, stored_key(&cpu("GenuineIntel", 6, 207)));
        assert_ne!(a, stored_key(&cpu("GenuineIntel", 6, 143)));
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}

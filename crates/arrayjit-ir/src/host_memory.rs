//! How much memory the host can still give, so that a request it cannot hold is refused before
//! anything is allocated: Linux hands out large allocations as untouched pages and only fails
//! when they are written, by killing the process. The figure is the kernel's estimate of
//! memory available without swapping (`MemAvailable`), lowered to what a control group's
//! limit leaves (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`, less the group's
//! current use). Elsewhere, or when the files cannot be read, it is unknown and nothing is
//! refused on its account.

use crate::error::{Error, Result};

/// Host allocations from this size up are compared with the available memory first (smaller
/// ones cannot matter, and reading the figure costs a few microseconds).
pub const CHECKED_FROM: usize = 16 << 20;

/// The bytes the host can still give without swapping, if known.
pub fn available_host_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available = mem_available(&meminfo)?;
    Some(match cgroup_headroom() {
        Some(room) => available.min(room),
        None => available,
    })
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
fn mem_available(meminfo: &str) -> Option<usize> {
    kib_field(meminfo, "MemAvailable:")
}

/// The value of a `Key:   123 kB` line of a `/proc` file's text, in bytes.
fn kib_field(text: &str, key: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: usize = line[key.len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// This process's peak resident memory so far, in bytes (Linux: `VmHWM` of
/// `/proc/self/status`), if the system tells.
pub fn peak_resident_bytes() -> Option<usize> {
    kib_field(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmHWM:",
    )
}

/// What the control group's memory limit leaves, if the process is under one.
fn cgroup_headroom() -> Option<usize> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    // cgroup v2 (the group's files at the unified hierarchy's root, as a container sees it).
    if let (Some(max), Some(current)) = (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        return headroom(&max, &current);
    }
    headroom(
        &read("/sys/fs/cgroup/memory/memory.limit_in_bytes")?,
        &read("/sys/fs/cgroup/memory/memory.usage_in_bytes")?,
    )
}

/// A limit less the use, from their files' texts; `None` for no limit (`max`, or v1's "no
/// limit" figure near 2^63).
fn headroom(limit: &str, used: &str) -> Option<usize> {
    let limit: u64 = limit.trim().parse().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let used: u64 = used.trim().parse().ok()?;
    usize::try_from(limit.saturating_sub(used)).ok()
}

/// The host's available bytes when `bytes` (from [`CHECKED_FROM`] up) are more than that: the
/// request cannot be met, and [`host_out_of_memory`] is its error. `None` when it fits, is
/// small, or the figure is unknown.
pub fn exceeds_available(bytes: usize) -> Option<usize> {
    if bytes < CHECKED_FROM {
        return None;
    }
    available_host_memory().filter(|&available| bytes > available)
}

/// The [`Error::DeviceOutOfMemory`] of a host request for `needed` bytes (`what`) when
/// `available` are available.
pub fn host_out_of_memory(what: String, needed: usize, available: usize) -> Error {
    Error::DeviceOutOfMemory {
        device: "the host".into(),
        what,
        needed,
        available,
        bound: "the memory the system has available".into(),
    }
}

/// `Ok` unless `bytes` are more than the host has available ([`exceeds_available`]): then an
/// [`Error::DeviceOutOfMemory`] for `what`, before anything is allocated.
pub fn check_host_allocation(bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
    match exceeds_available(bytes) {
        Some(available) => Err(host_out_of_memory(what(), bytes, available)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_available_figure_is_read_from_the_system_files() {
        let meminfo = "MemTotal:       24554796 kB\nMemFree:        13000000 kB\nMemAvailable:   21000000 kB\n";
        assert_eq!(mem_available(meminfo), Some(21_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(kib_field("VmHWM:\t  2048 kB\n", "VmHWM:"), Some(2 << 20));
        #[cfg(target_os = "linux")]
        assert!(peak_resident_bytes().is_some_and(|p| p > 0));
        assert_eq!(headroom("max\n", "100\n"), None);
        assert_eq!(headroom("9223372036854771712\n", "100\n"), None);
        assert_eq!(headroom("1000\n", "300\n"), Some(700));
        assert_eq!(headroom("1000\n", "3000\n"), Some(0));
        #[cfg(target_os = "linux")]
        assert!(available_host_memory().is_some_and(|a| a > 0));
    }

    #[test]
    fn requests_beyond_the_host_are_refused_with_the_figures() {
        assert!(check_host_allocation(CHECKED_FROM - 1, || unreachable!()).is_ok());
        let Some(available) = available_host_memory() else {
            return;
        };
        let needed = available.saturating_mul(2).max(CHECKED_FROM);
        match check_host_allocation(needed, || "a test array".into()) {
            Err(Error::DeviceOutOfMemory {
                device,
                what,
                needed: n,
                available: a,
                ..
            }) => {
                assert_eq!(
                    (device.as_str(), what.as_str(), n),
                    ("the host", "a test array", needed)
                );
                assert!(a < n);
            }
            other => panic!("expected DeviceOutOfMemory, got {other:?}"),
        }
    }
}

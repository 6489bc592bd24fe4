//! The settings a backend is made with ([`RuntimeConfig`]) and its parallelism
//! [`Strategy`], each field checked against its documented range.

use arrayjit_ir::Result;

/// How a backend spreads work, steering [`crate::device::Device::suggested_num_streams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Devices run in parallel; one stream per device.
    #[default]
    OnlyDevicesParallel,
    /// Two streams per device, so copies can overlap computation.
    ForParallelCopying,
    /// As many streams as the device has cores to run them.
    MostParallelStreams,
}

/// Settings for [`crate::backend::backend_with_config`]. A field outside its documented range is an
/// [`arrayjit_ir::Error::InvalidSetting`] when the backend is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The parallelism strategy.
    pub strategy: Strategy,
    /// Number of CPU devices, in `arrayjit_backends::cc::CPU_DEVICES_RANGE` (default:
    /// `ARRAYJIT_CPU_DEVICES`, else 1).
    pub num_devices: Option<usize>,
    /// Tasks a `multicore` stream queues before `schedule` blocks, in [`QUEUE_CAPACITY_RANGE`]
    /// (default 1024). The queue's slots are allocated when the stream starts.
    pub queue_capacity: usize,
    /// Largest pool the link-time planner groups arrays into, in [`MAX_POOL_BYTES_RANGE`]
    /// (`None`: `ARRAYJIT_MAX_POOL_MB` mebibytes when set, else [`DEFAULT_MAX_POOL_BYTES`]).
    /// An array larger than this gets a pool of its own: only the device's memory bounds it.
    pub max_pool_bytes: Option<usize>,
    /// Worker threads per CPU device, which split a routine's parallel loops (default:
    /// `ARRAYJIT_CPU_WORKERS`, else 1 for `sync_cc` and the device's share of the cores for
    /// `multicore_cc`). Results do not depend on it.
    pub workers_per_device: Option<usize>,
    /// The most bytes each device's arrays may take (`None`: `ARRAYJIT_MEMORY_LIMIT_MB`
    /// mebibytes when set, else only the device's free memory bounds them). A link that would
    /// pass it (with what the device holds already) is an
    /// [`arrayjit_ir::Error::DeviceOutOfMemory`] before anything is allocated. At least one
    /// byte.
    pub memory_limit: Option<usize>,
    /// The compile cache folder of the C backends (`None`: `ARRAYJIT_CACHE_DIR` when set, else
    /// the default). A folder of its own gives a cold cache (what a first build costs).
    pub cache_dir: Option<std::path::PathBuf>,
}

/// Accepted [`RuntimeConfig::queue_capacity`] values.
pub const QUEUE_CAPACITY_RANGE: std::ops::RangeInclusive<u64> = 1..=65_536;
/// Accepted [`RuntimeConfig::max_pool_bytes`] values: at least one byte, at most what one
/// allocation may be.
pub const MAX_POOL_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1..=(isize::MAX as u64);

/// The environment variable of [`RuntimeConfig::memory_limit`], in mebibytes.
pub const MEMORY_LIMIT_ENV: &str = "ARRAYJIT_MEMORY_LIMIT_MB";

/// The environment variable of [`RuntimeConfig::max_pool_bytes`], in mebibytes.
pub const MAX_POOL_ENV: &str = "ARRAYJIT_MAX_POOL_MB";

/// The pool size limit where neither [`RuntimeConfig::max_pool_bytes`] nor
/// `ARRAYJIT_MAX_POOL_MB` says otherwise: 1 GiB.
pub const DEFAULT_MAX_POOL_BYTES: usize = 1 << 30;

impl RuntimeConfig {
    /// [`RuntimeConfig::memory_limit`], or else `ARRAYJIT_MEMORY_LIMIT_MB` (mebibytes) from
    /// the environment; an unreadable value is an [`arrayjit_ir::Error::InvalidSetting`].
    pub fn memory_limit_or_env(&self) -> Result<Option<usize>> {
        if self.memory_limit.is_some() {
            return Ok(self.memory_limit);
        }
        let lookup = arrayjit_backends::settings::process_env;
        let mib =
            arrayjit_backends::settings::integer(&lookup, MEMORY_LIMIT_ENV, 1..=(1 << 40), 0)?;
        Ok((mib > 0).then(|| usize::try_from(mib << 20).unwrap_or(usize::MAX)))
    }

    /// [`RuntimeConfig::max_pool_bytes`], or else `ARRAYJIT_MAX_POOL_MB` (mebibytes) from the
    /// environment, or else [`DEFAULT_MAX_POOL_BYTES`]; an unreadable value is an
    /// [`arrayjit_ir::Error::InvalidSetting`].
    pub fn max_pool_bytes_or_env(&self) -> Result<usize> {
        if let Some(bytes) = self.max_pool_bytes {
            return Ok(bytes);
        }
        let lookup = arrayjit_backends::settings::process_env;
        let mib = arrayjit_backends::settings::integer(
            &lookup,
            MAX_POOL_ENV,
            1..=(1 << 40),
            (DEFAULT_MAX_POOL_BYTES >> 20) as u64,
        )?;
        Ok(usize::try_from(mib << 20).unwrap_or(usize::MAX))
    }

    /// Checks every field against its documented range.
    pub fn validate(&self) -> Result<()> {
        use arrayjit_backends::settings::check_range;
        if let Some(n) = self.num_devices {
            check_range(
                "RuntimeConfig::num_devices",
                n as u64,
                arrayjit_backends::cc::CPU_DEVICES_RANGE,
            )?;
        }
        check_range(
            "RuntimeConfig::queue_capacity",
            self.queue_capacity as u64,
            QUEUE_CAPACITY_RANGE,
        )?;
        if let Some(w) = self.workers_per_device {
            check_range(
                "RuntimeConfig::workers_per_device",
                w as u64,
                arrayjit_backends::cc::CPU_WORKERS_RANGE,
            )?;
        }
        if let Some(limit) = self.memory_limit {
            check_range(
                "RuntimeConfig::memory_limit",
                limit as u64,
                MAX_POOL_BYTES_RANGE,
            )?;
        }
        if let Some(bytes) = self.max_pool_bytes {
            check_range(
                "RuntimeConfig::max_pool_bytes",
                bytes as u64,
                MAX_POOL_BYTES_RANGE,
            )?;
        }
        Ok(())
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            strategy: Strategy::default(),
            num_devices: None,
            queue_capacity: 1024,
            max_pool_bytes: None,
            workers_per_device: None,
            memory_limit: None,
            cache_dir: None,
        }
    }
}

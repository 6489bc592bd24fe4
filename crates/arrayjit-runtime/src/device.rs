//! Devices: one device of a backend, what it is and holds; [`Backend::get_device`] makes them.

use arrayjit_backends::DeviceInfo;
use arrayjit_ir::{Error, Result};

use crate::array_entry::SharedArrays;
use crate::backend::Backend;
use crate::config::Strategy;
use crate::scheduler::SchedulerKind;

impl Backend {
    /// Device `ordinal`.
    pub fn get_device(&self, ordinal: usize) -> Result<Device> {
        self.check_available()?;
        let n = self.num_devices();
        if ordinal >= n {
            return Err(Error::NoSuchDevice {
                backend: self.name().to_string(),
                ordinal,
                num_devices: n,
            });
        }
        Ok(Device {
            backend: self.clone(),
            ordinal,
        })
    }
}

/// A device of a backend.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) backend: Backend,
    pub(crate) ordinal: usize,
}

impl Device {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The backend it belongs to.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// What the device is and can do (compute units, local sizes, shared memory, subgroup
    /// width, precisions, vector width, caches, memory), as its backend reads it.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.backend.inner.lowered.device_info(self.ordinal)
    }

    /// How many streams to use on this device to follow the backend's [`Strategy`] (always 1
    /// for the `Sync` scheduler, whose streams do not run in parallel).
    pub fn suggested_num_streams(&self) -> usize {
        if self.backend.scheduler() == SchedulerKind::Sync {
            return 1;
        }
        match self.backend.strategy() {
            Strategy::OnlyDevicesParallel => 1,
            Strategy::ForParallelCopying => 2,
            Strategy::MostParallelStreams => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (cores / self.backend.num_devices().max(1)).max(1)
            }
        }
    }

    /// A unique id of this device among all devices of all backends in the process.
    pub fn uid(&self) -> usize {
        self.backend.inner.device_uid_base + self.ordinal
    }

    pub(crate) fn shared_arrays(&self) -> &SharedArrays {
        &self.backend.inner.shared_arrays[self.ordinal]
    }

    /// Number of arrays this device holds on behalf of nodes rather than contexts: hosted
    /// constants and nodes shared across streams. Each is freed when its node is.
    pub fn shared_array_count(&self) -> usize {
        self.shared_arrays().live()
    }

    /// Bytes currently allocated for arrays on this device.
    pub fn used_memory(&self) -> usize {
        self.backend
            .inner
            .lowered
            .runtime()
            .used_memory(self.ordinal)
    }

    /// The bytes this device may still allocate: its free memory where the backend can tell,
    /// lowered to what the backend's memory limit leaves ([`Backend::set_memory_limit`]), with
    /// what bounds the figure; `None` when neither is known.
    pub fn available_memory(&self) -> Option<(usize, String)> {
        let runtime = self.backend.inner.lowered.runtime();
        let free = runtime
            .available_memory(self.ordinal)
            .map(|a| (a, "the device's free memory".to_string()));
        let Some(limit) = self.backend.memory_limit() else {
            return free;
        };
        let used = self.used_memory();
        let room = limit.saturating_sub(used);
        match free {
            Some((a, why)) if a <= room => Some((a, why)),
            _ => Some((
                room,
                format!(
                    "the memory limit of {} less the {} its arrays hold",
                    arrayjit_ir::error::human_bytes(limit),
                    arrayjit_ir::error::human_bytes(used)
                ),
            )),
        }
    }

    /// `Ok` unless `needed` more bytes are more than the device may still allocate
    /// ([`Device::available_memory`]): then an [`Error::DeviceOutOfMemory`] for `what`, which
    /// callers return before allocating anything.
    pub fn check_memory(&self, needed: usize, what: impl FnOnce() -> String) -> Result<()> {
        match self.available_memory() {
            Some((available, bound)) if needed > available => Err(Error::DeviceOutOfMemory {
                device: format!("device {} of {}", self.ordinal, self.backend.name()),
                what: what(),
                needed,
                available,
                bound,
            }),
            _ => Ok(()),
        }
    }

    /// A readable name, e.g. `"sync_cc:0"`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.backend.name(), self.ordinal)
    }
}

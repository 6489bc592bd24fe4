//! The device-info part of a backend ([`Devices`], the reference's `Device_info`): whether the
//! backend can run here, and what each of its devices is and can do ([`DeviceInfo`]), from
//! which the optimizer's schedules are chosen.

use std::fmt::Debug;

use arrayjit_ir::Result;
use arrayjit_opt::schedule::ScheduleSettings;

use crate::device_info::DeviceInfo;

/// What a backend's devices are. One of the four parts a
/// [`LoweredBackend`](crate::lowered_backend::LoweredBackend) is composed of.
pub trait Devices: Send + Sync + Debug {
    /// `Ok` if the backend can run here, or why not (typically
    /// [`Error::BackendUnavailable`](arrayjit_ir::Error::BackendUnavailable) with what to
    /// install).
    fn check_available(&self) -> Result<()>;
    /// What device `device` is and can do; an error for a device that does not exist (or a
    /// backend that cannot run here).
    fn device_info(&self, device: usize) -> Result<DeviceInfo>;
    /// What the optimizer's schedules may assume of the devices (vector width, registers,
    /// caches): from device 0's [`DeviceInfo`], or the portable defaults of
    /// [`ScheduleSettings`] when there is none.
    fn schedule_settings(&self) -> ScheduleSettings {
        self.device_info(0)
            .map(|d| d.schedule_settings())
            .unwrap_or_default()
    }
    /// What the run time of a schedule on this backend depends on (device model, compiler and
    /// its flags, worker count): the schedule search keys the choices it stores with it.
    /// Default: [`Devices::debug_info`].
    fn machine_identity(&self) -> String {
        self.debug_info()
    }
    /// One line on the backend's devices and settings, for logs and `arrayjit backends`.
    fn debug_info(&self) -> String;
}

//! The seam between a node's host array (IR data) and the device copies the runtime keeps of
//! it ([`DeviceCopies`]). The IR knows only when the host reads or writes the array; which
//! copies are current, pending refreshes, write guards and the runtime's notes live behind
//! this trait, in the runtime (`arrayjit_runtime::node_sync`), whose module doc states the
//! rules.

use std::any::Any;

use crate::error::Result;

/// What the layer holding device copies of a node is told of the node's host array, and says
/// of its copies. Installed once per node ([`super::Tnode::device_copies_or_install`]) by
/// the first runtime that makes a copy; a node without one has no device copies.
pub trait DeviceCopies: Any + Send + Sync {
    /// Brings the host array up to date before the host reads or writes it (a pending
    /// refresh from a device that changed the node); an error leaves the refresh pending.
    fn before_host_access(&self) -> Result<()>;
    /// Waits, before a host write, for device work that reads the host array in place.
    fn before_host_write(&self) -> Result<()>;
    /// Whether some device copy holds the node's values (then a hosted constant's host values
    /// may no longer change).
    fn hold_values(&self) -> bool;
    /// The host changed the stored elements `[start, end)`, or all of them (`None`).
    fn host_changed(&self, elems: Option<(usize, usize)>);
    /// Whether a device copy holds the host array itself, handed over by the runtime (taken
    /// out of its slot with [`super::HostValues::with_host_slot`]) and not made again since:
    /// the host array then exists, but its values are with that copy. Read under the host
    /// lock.
    fn holds_host_array(&self) -> bool;
    /// The host made its array again (a handed-over one coming back with its values, under
    /// the host lock): no device copy holds it any longer.
    fn host_array_made(&self);
    /// What is known of the copies, one item per line, for [`super::Tnode::debug_info`].
    fn describe(&self) -> Vec<String>;
    /// For downcasting to the runtime's type.
    fn as_any(&self) -> &dyn Any;
}

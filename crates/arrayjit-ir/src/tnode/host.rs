//! A node's host array and the values in it: reading and writing them from the host
//! (`set_values`, `get_values`, single elements, points for plots), the host lock that backends
//! reading the array in place hold, and the checks every host write passes (a hosted constant
//! already on a device refuses; device copies are told what changed). All of it is reached
//! through [`Tnode::host`], which returns the node's [`HostValues`].
//!
//! Handing the host array itself to a device copy, and pinning it where it is, are the
//! runtime's (`arrayjit_runtime::node_sync`): it takes the array out of its slot under the
//! host lock ([`HostValues::with_host_slot`]) and says through the node's [`DeviceCopies`]
//! whether a copy holds it ([`DeviceCopies::holds_host_array`]); here, a host access finds
//! the slot empty and brings the values back.
//!
//! [`DeviceCopies`]: super::DeviceCopies
//! [`DeviceCopies::holds_host_array`]: super::DeviceCopies::holds_host_array

use std::sync::RwLockReadGuard;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Tnode;
use crate::error::{Error, OutOfBounds, RangeUnit, Result};
use crate::memory::{MemoryMode, MemoryType};
use crate::ndarray::Ndarray;

/// The node's host lock, held (see [`HostValues::lock`]).
pub struct HostLock<'a>(#[allow(dead_code)] RwLockReadGuard<'a, Option<Ndarray>>);

/// A node's host array, for changes in place only: it is never moved or replaced (but for
/// being handed whole to a device copy, [`HostValues::with_host_slot`]), so a device array may
/// alias it (see [`HostValues::with`]). Reads go through `Deref` to the [`Ndarray`];
/// every change records that the array may no longer hold only the zeros it was made with
/// ([`HostValues::holds_initial_zeros`]).
pub struct HostArrayMut<'a> {
    array: &'a mut Ndarray,
    written: &'a AtomicBool,
}

impl std::ops::Deref for HostArrayMut<'_> {
    type Target = Ndarray;
    fn deref(&self) -> &Ndarray {
        self.array
    }
}

impl HostArrayMut<'_> {
    /// The array, for a change: recorded first.
    fn changed(&mut self) -> &mut Ndarray {
        self.written.store(true, Ordering::Relaxed);
        self.array
    }

    /// Sets every logical value from `fill(start, out)` (see [`Ndarray::fill_with`]).
    pub fn fill_with(&mut self, fill: impl Fn(usize, &mut [f64]) + Sync) {
        self.changed().fill_with(fill)
    }

    /// The bytes of the storage, padding margins included (see [`Ndarray::as_bytes_mut`]).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.changed().as_bytes_mut()
    }

    /// Sets every logical value (see [`Ndarray::set_all_f64`]).
    pub fn set_all_f64(&mut self, values: &[f64]) -> Result<()> {
        self.changed().set_all_f64(values)
    }

    /// Sets logical element `k` to `value(k)` for every `k` (see [`Ndarray::set_all_with`]).
    pub fn set_all_with(&mut self, value: impl FnMut(usize) -> f64) {
        self.changed().set_all_with(value)
    }

    /// Sets one logical element (see [`Ndarray::set`]).
    pub fn set(&mut self, idx: &[usize], x: f64) -> Result<()> {
        self.changed().set(idx, x)
    }
}

/// The host side of a node ([`Tnode::host`]): its host array, the values in it, and the host
/// lock. Every user-facing read first runs the pending device-to-host refresh
/// ([`HostValues::prepare_read`]); every write first checks the node may change
/// ([`HostValues::check_writable`]) and then tells the device copies what lags.
#[derive(Clone, Copy)]
pub struct HostValues<'a> {
    node: &'a Tnode,
}

impl Tnode {
    /// The node's host array and values (see [`HostValues`]).
    pub fn host(&self) -> HostValues<'_> {
        HostValues { node: self }
    }
}

impl<'a> HostValues<'a> {
    /// Runs the pending host synchronisation, if any: after this the host array holds the
    /// latest values. Called by every user-facing read and write of host values.
    pub fn prepare_read(&self) -> Result<()> {
        match self.node.device_copies() {
            Some(copies) => copies.before_host_access(),
            None => Ok(()),
        }
    }

    /// Runs `f` on the host array, creating it (zero-filled, margins at the pad value) first if
    /// needed; does not synchronise with devices (the user-facing setters do). Creating it
    /// requests a hosted memory mode; a node decided to be virtual, local or device-only gets a
    /// [`Error::MemoryModeConflict`]. A host array handed to a device comes back with its
    /// values first (its pending refresh runs), so `f` never sees it without them.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut HostArrayMut<'_>) -> Result<R>) -> Result<R> {
        self.write_host(false, f)
    }

    /// Like [`HostValues::with_mut`], for the copy from a device that brings a handed-over
    /// host array its values (the runtime's refresh, an explicit copy to the host): a host
    /// array handed to a device is made again zero-filled, without waiting for its values,
    /// since `f` is what writes them. A partial copy leaves the rest to the pending refresh.
    pub fn refill<R>(&self, f: impl FnOnce(&mut HostArrayMut<'_>) -> Result<R>) -> Result<R> {
        self.write_host(true, f)
    }

    /// [`HostValues::with_mut`] (`refill` false: a handed-over array comes back with its
    /// values) or [`HostValues::refill`].
    fn write_host<R>(
        &self,
        refill: bool,
        f: impl FnOnce(&mut HostArrayMut<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut rounds = 0;
        let mut host = loop {
            // Device work that reads the host array in place finishes first (outside the host
            // lock, which that work takes while it runs).
            if let Some(copies) = self.node.device_copies() {
                copies.before_host_write()?;
            }
            let host = self.node.0.host.write().unwrap_or_else(|e| e.into_inner());
            if refill || host.is_some() || !self.handed_over() {
                break host;
            }
            // Handed to a device (perhaps by another thread since the caller's refresh):
            // bring it back with its values, then look again.
            drop(host);
            self.wait_for_values(&mut rounds)?;
        };
        if host.is_none() {
            // Allocate first: if that fails, the memory mode stays as it was.
            let nd = match &self.node.0.padding {
                Some(p) => Ndarray::zeros_padded(self.node.prec(), self.node.dims(), p.clone())?,
                None => Ndarray::zeros(self.node.prec(), self.node.dims())?,
            };
            // A host array handed to a device is made again (for the copy bringing its values
            // back); the node is hosted already.
            if !self.handed_over() {
                self.node.update_memory_mode(
                    MemoryMode::Hosted(MemoryType::Unset),
                    "user: values were set or read on the host",
                )?;
            }
            let margins_nonzero = self.node.0.padding.as_ref().is_some_and(|p| p.value != 0.0);
            self.node
                .0
                .host_written
                .store(margins_nonzero, Ordering::Relaxed);
            if let Some(copies) = self.node.device_copies() {
                copies.host_array_made();
            }
            *host = Some(nd);
        }
        f(&mut HostArrayMut {
            array: host.as_mut().expect("host array was just created"),
            written: &self.node.0.host_written,
        })
    }

    /// The pending refresh, run (which brings a handed-over host array back; where another
    /// thread is running it, the runtime waits for it). `rounds` counts the calls of one
    /// access: from inside a task of a stream, which that other thread's refresh may be
    /// waiting for, the runtime cannot wait, and after a while the access gives up with
    /// [`Error::NotHosted`] rather than wait forever.
    fn wait_for_values(&self, rounds: &mut u32) -> Result<()> {
        *rounds += 1;
        if *rounds > 10_000 {
            return Err(Error::NotHosted {
                node: self.node.debug_name(),
                detail: "its host array is with a device while another thread brings its values \
                         back, and that thread may be waiting for the task this access runs in: \
                         read or write the node after the task"
                    .into(),
            });
        }
        self.prepare_read()?;
        std::thread::yield_now();
        Ok(())
    }

    /// Runs `f` on the host array holding the latest values: after the pending refresh from a
    /// device ([`HostValues::prepare_read`]), and never on a host array handed to a device
    /// (another thread may hand it over between the refresh and the read: it is brought back
    /// again). `None` when there is no host array.
    pub fn with_latest<R>(&self, f: impl FnOnce(&Ndarray) -> R) -> Result<Option<R>> {
        self.prepare_read()?;
        let mut rounds = 0;
        loop {
            let host = self.read_guard();
            if let Some(nd) = host.as_ref() {
                return Ok(Some(f(nd)));
            }
            if !self.handed_over() {
                return Ok(None);
            }
            drop(host);
            self.wait_for_values(&mut rounds)?;
        }
    }

    fn read_guard(&self) -> RwLockReadGuard<'a, Option<Ndarray>> {
        self.node.0.host.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the node's host lock for reading until the guard is dropped: the host array is
    /// not written meanwhile (other readers may overlap). A backend reading the host array in place (`use_host_memory`)
    /// holds it while a kernel or copy reads the array.
    pub fn lock(&self) -> HostLock<'a> {
        HostLock(self.read_guard())
    }

    /// Runs `f` on the host array if it exists and holds values (not while it is handed to a
    /// device copy), without synchronising with devices (see [`HostValues::prepare_read`],
    /// which brings a handed-over array back). The host array, once made, is never moved or
    /// replaced (every change is in place; only a node that devices change is ever handed to
    /// one, and no device array aliases those), so a device array may alias it; `f` runs under
    /// the node's host lock, which kernels reading such an alias hold while they run.
    pub fn with<R>(&self, f: impl FnOnce(&Ndarray) -> R) -> Option<R> {
        self.read_guard().as_ref().map(f)
    }

    /// Whether the host array exists and still holds only the zeros it was made with: nothing
    /// was written to it since (a padded array with a non-zero pad value never does). A new
    /// zero-filled device array then already holds its values, and nothing need be copied.
    pub fn holds_initial_zeros(&self) -> bool {
        let host = self.read_guard();
        host.is_some() && !self.node.0.host_written.load(Ordering::Relaxed)
    }

    /// Whether the host array exists (also while it is handed to a device copy, see
    /// [`HostValues::with_host_slot`]).
    pub fn exists(&self) -> bool {
        let host = self.read_guard();
        host.is_some() || self.handed_over()
    }

    /// Whether the host array was handed to a device copy (by the runtime, through
    /// [`HostValues::with_host_slot`]) and not made again since: its values live in that copy
    /// until the host next reads or writes them.
    pub fn is_on_device(&self) -> bool {
        let _host = self.read_guard();
        self.handed_over()
    }

    /// [`HostValues::is_on_device`], for a caller holding the host lock: what the node's
    /// device copies say ([`super::DeviceCopies::holds_host_array`]).
    fn handed_over(&self) -> bool {
        self.node
            .device_copies()
            .is_some_and(|copies| copies.holds_host_array())
    }

    /// Runs `f` on the slot of the host array under the host lock, written: for the runtime,
    /// which hands the array itself to a device copy where a device's memory is the host's (it
    /// takes the array out of the slot) and then says so through the node's
    /// [`DeviceCopies`](super::DeviceCopies) (`holds_host_array`). Device work that reads the
    /// host array in place finishes first, as for a write. An `f` that fails, or declines,
    /// must leave the array in the slot.
    ///
    /// A host array taken out still [`exists`](HostValues::exists) while a device copy holds
    /// it, but holds nothing: [`HostValues::with`] sees no array until it is made again, which
    /// the runtime's pending refresh does from the device copy before the host next reads or
    /// writes (installed by `f`, under the host lock, so that no host access comes between).
    pub fn with_host_slot<R>(
        &self,
        f: impl FnOnce(&mut Option<Ndarray>) -> Result<R>,
    ) -> Result<R> {
        if let Some(copies) = self.node.device_copies() {
            copies.before_host_write()?;
        }
        let mut host = self.node.0.host.write().unwrap_or_else(|e| e.into_inner());
        f(&mut host)
    }

    /// A copy of the host array, or [`Error::NotHosted`].
    pub fn array(&self) -> Result<Ndarray> {
        self.with_latest(Clone::clone)?
            .ok_or_else(|| self.not_hosted("reading the host array"))
    }

    fn not_hosted(&self, what: &str) -> Error {
        Error::NotHosted {
            node: self.node.debug_name(),
            detail: format!(
                "{what} needs one; set the node's values first or make it hosted and copy it with to_host"
            ),
        }
    }

    /// Sets all logical values (row-major) on the host.
    pub fn set_values(&self, values: &[f64]) -> Result<()> {
        // Checked before the host array is allocated, so a wrong count allocates nothing.
        let logical = self
            .node
            .dims()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        if logical != Some(values.len()) {
            return Err(Error::SizeMismatch {
                op: format!("set_values of {}", self.node.debug_name()),
                expected: logical.unwrap_or(usize::MAX),
                given: values.len(),
                unit: RangeUnit::Elements,
            });
        }
        self.write_all("set_values", |nd| nd.set_all_f64(values))
    }

    /// Sets logical element `k` (row-major) to `value(k)` on the host for every `k`, without
    /// a vector of all values. An array too large for the machine is an
    /// [`Error::OutOfMemory`], and nothing changes.
    pub fn set_values_with(&self, value: impl FnMut(usize) -> f64) -> Result<()> {
        self.write_all("set_values_with", |nd| {
            nd.set_all_with(value);
            Ok(())
        })
    }

    /// Sets every logical element (row-major) on the host from `fill(start, out)`, which writes
    /// the values of positions `start..start + out.len()` (see [`Ndarray::fill_with`]): a
    /// parameter's initializer fills a large host array chunk by chunk on several threads.
    /// An array too large for the machine is an [`Error::OutOfMemory`], and nothing changes.
    pub fn fill(&self, fill: impl Fn(usize, &mut [f64]) + Sync) -> Result<()> {
        self.write_all("fill", |nd| {
            nd.fill_with(fill);
            Ok(())
        })
    }

    /// A write of every value (`op` names it in errors): refused for a constant a device
    /// holds, after the pending refresh from a device, into the host array (made if needed),
    /// then every device copy lags.
    fn write_all(
        &self,
        op: &str,
        write: impl FnOnce(&mut HostArrayMut<'_>) -> Result<()>,
    ) -> Result<()> {
        self.check_writable(op)?;
        self.prepare_read()?;
        self.with_mut(write)?;
        self.mark_changed();
        Ok(())
    }

    /// Records that the host changed the node's values (all of them): every device copy lags.
    /// The setters call it; a caller writing the host array itself (through
    /// [`HostValues::with_mut`]) calls it after.
    pub fn mark_changed(&self) {
        if let Some(copies) = self.node.device_copies() {
            copies.host_changed(None);
        }
    }

    /// `Ok` unless the node is a hosted constant that a device copy already holds
    /// ([`Error::ConstantChanged`], naming `op`): a constant's host values may be set until its
    /// first device copy is made from them (its initialization), never after.
    pub fn check_writable(&self, op: &str) -> Result<()> {
        match self.node.memory_mode() {
            Some(m)
                if m.mode == MemoryMode::Hosted(MemoryType::Constant)
                    && self.node.device_copies().is_some_and(|c| c.hold_values()) =>
            {
                Err(Error::ConstantChanged {
                    node: self.node.debug_name(),
                    provenance: m.provenance,
                    op: op.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    /// All logical values (row-major) from the host array.
    pub fn get_values(&self) -> Result<Vec<f64>> {
        self.with_latest(Ndarray::to_vec_f64)?
            .ok_or_else(|| self.not_hosted("get_values"))?
    }

    fn storage_index(&self, idx: &[usize]) -> Result<Vec<usize>> {
        if let Some(problem) = OutOfBounds::check_index(idx, self.node.dims()) {
            return Err(Error::out_of_bounds(self.node.debug_name(), problem));
        }
        Ok(idx
            .iter()
            .zip(self.node.left_padding())
            .map(|(i, &l)| i + l)
            .collect())
    }

    /// Sets one logical element on the host.
    pub fn set_value(&self, idx: &[usize], x: f64) -> Result<()> {
        let at = self.storage_index(idx)?;
        self.check_writable("set_value")?;
        self.prepare_read()?;
        self.with_mut(|nd| nd.set(&at, x))?;
        // Row-major position in the stored array: copies lag in this element only.
        let pos = at
            .iter()
            .zip(self.node.padded_dims())
            .fold(0usize, |acc, (&i, &d)| acc * d + i);
        if let Some(copies) = self.node.device_copies() {
            copies.host_changed(Some((pos, pos + 1)));
        }
        Ok(())
    }

    /// One logical element from the host array.
    pub fn get_value(&self, idx: &[usize]) -> Result<f64> {
        let at = self.storage_index(idx)?;
        self.with_latest(|nd| nd.get(&at))?
            .ok_or_else(|| self.not_hosted("get_value"))?
    }

    /// Treats axis `coord_axis` (default: the last) as coordinates and every other index as a
    /// point; returns coordinate `xdim` of every point, in row-major order.
    pub fn points_1d(&self, coord_axis: Option<usize>, xdim: usize) -> Result<Vec<f64>> {
        Ok(self
            .points(coord_axis, &[xdim])?
            .into_iter()
            .map(|p| p[0])
            .collect())
    }

    /// Like [`HostValues::points_1d`] with two coordinates per point.
    pub fn points_2d(
        &self,
        coord_axis: Option<usize>,
        xdim: usize,
        ydim: usize,
    ) -> Result<Vec<(f64, f64)>> {
        Ok(self
            .points(coord_axis, &[xdim, ydim])?
            .into_iter()
            .map(|p| (p[0], p[1]))
            .collect())
    }

    fn points(&self, coord_axis: Option<usize>, coords: &[usize]) -> Result<Vec<Vec<f64>>> {
        let dims = self.node.dims().to_vec();
        // A scalar has no coordinate axis: axis 0 of a node of 0 axes.
        let axis = coord_axis.unwrap_or(dims.len().saturating_sub(1));
        if axis >= dims.len() {
            return Err(Error::BadAxis {
                what: self.node.debug_name(),
                axis: i64::try_from(axis).unwrap_or(i64::MAX),
                rank: dims.len(),
            });
        }
        if let Some(&c) = coords.iter().find(|&&c| c >= dims[axis]) {
            return Err(Error::out_of_bounds(
                self.node.debug_name(),
                OutOfBounds::Axis {
                    axis,
                    lo: c as i64,
                    hi: c as i64,
                    min: 0,
                    max: dims[axis] as i64 - 1,
                },
            ));
        }
        let values = self.get_values()?;
        let inner: usize = dims[axis + 1..].iter().product();
        let outer: usize = dims[..axis].iter().product();
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                out.push(
                    coords
                        .iter()
                        .map(|&c| values[(o * dims[axis] + c) * inner + i])
                        .collect(),
                );
            }
        }
        Ok(out)
    }
}

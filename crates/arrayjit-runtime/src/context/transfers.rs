//! A context's transfers: host to device and back (whole arrays and element ranges), and
//! tasks scheduled on a context's array by other layers (collectives across processes), all
//! ordered by the arrays' events like routine runs. Device-to-device transfers are
//! `crate::device_transfer`'s.

use std::sync::Arc;

use arrayjit_backends::{BufferHandle, DeviceBuffer as _, LoweredBackend};
use arrayjit_ir::{Error, OutOfBounds, RangeUnit, Result, Tnode};

use super::Context;
use crate::array_entry::{Access, ArrayEntry};
use crate::host_sync::{refresh_host_from, schedule_upload};
use crate::node_sync::node_sync;
use crate::scheduler::TaskLabel;
use crate::stream::Stream;

/// How a task scheduled with [`Context::schedule_on_array`] uses the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayAccess {
    /// It only reads the array.
    Read,
    /// It overwrites the array without reading it.
    Write,
    /// It reads and writes the array (a collective reducing into it).
    ReadWrite,
}

/// A context's array as a task of [`Context::schedule_on_array`] sees it: the task holds the
/// access it asked for (ordered by the array's events), so reading and writing the array's
/// bytes here is safe. On a CPU backend the bytes are the array itself; elsewhere they are a
/// host copy (read after the stream's earlier device work, written back on its queue).
pub struct ScheduledArray<'a> {
    buffer: &'a BufferHandle,
    lowered: &'a Arc<LoweredBackend>,
    access: ArrayAccess,
    queue: Option<&'a dyn arrayjit_backends::DeviceQueue>,
}

impl ScheduledArray<'_> {
    /// The array's buffer (its size, device and precision; a backend-specific collective may
    /// downcast it, under the lowered layer's contract: see
    /// [`arrayjit_backends::DATA_PLANE_CONTRACT`]).
    pub fn buffer(&self) -> &BufferHandle {
        self.buffer
    }

    /// The access the task was scheduled with.
    pub fn access(&self) -> ArrayAccess {
        self.access
    }

    /// The array's own memory when the host can reach it (a CPU buffer): its address and
    /// length, valid while `self.buffer` is alive.
    fn host_memory(&self) -> Option<(*mut u8, usize)> {
        let cpu = self
            .buffer
            .as_any()
            .downcast_ref::<arrayjit_backends::CpuBuffer>()?;
        Some((cpu.as_ptr(), cpu.size_in_bytes()))
    }

    /// Calls `f` with the array's bytes.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        if let Some((ptr, len)) = self.host_memory() {
            // SAFETY: the task holds at least read access (no writer runs until it ends); the
            // buffer is alive and its `len` bytes from `ptr` are its own.
            let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
            return Ok(f(bytes));
        }
        let mut bytes = vec![0u8; self.buffer.size_in_bytes()];
        // SAFETY: as above, nothing writes the array while the task runs.
        unsafe {
            self.lowered
                .runtime()
                .copy_to_host(self.buffer, &mut bytes, self.queue)?
        };
        Ok(f(&bytes))
    }

    /// Calls `f` with the array's bytes to change them in place (a host copy written back on
    /// backends whose arrays the host cannot reach). An error for a task scheduled with
    /// [`ArrayAccess::Read`]; when `f` fails, a host copy is not written back.
    pub fn update(&self, f: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
        if self.access == ArrayAccess::Read {
            return Err(Error::invalid(
                "a task scheduled with ArrayAccess::Read changed its array; schedule it with \
                 Write or ReadWrite",
            ));
        }
        if let Some((ptr, len)) = self.host_memory() {
            // SAFETY: the task holds write access: it runs after the array's last writer and
            // readers, and later accesses wait for it, so nothing else touches these bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            return f(bytes);
        }
        let mut bytes = vec![0u8; self.buffer.size_in_bytes()];
        // SAFETY: the task holds write access, as above.
        unsafe {
            self.lowered
                .runtime()
                .copy_to_host(self.buffer, &mut bytes, self.queue)?
        };
        f(&mut bytes)?;
        // SAFETY: as for the copy to the host.
        unsafe {
            self.lowered
                .runtime()
                .copy_from_host(self.buffer, &bytes, self.queue)
        }
    }
}

/// An error unless `elems` is a range of the node's stored elements.
fn check_elems(tn: &Tnode, elems: &std::ops::Range<usize>) -> Result<()> {
    if elems.start > elems.end || elems.end > tn.num_elems() {
        return Err(Error::out_of_bounds(
            tn.debug_name(),
            OutOfBounds::Range {
                start: elems.start,
                end: elems.end,
                size: tn.num_elems(),
                unit: RangeUnit::Elements,
            },
        ));
    }
    Ok(())
}

impl Context {
    /// Schedules `task` on stream `on` with `access` to the node's array in this context,
    /// ordered like any other work on the array: after its last writer (and, for a write, its
    /// readers), before later work on it. A write makes a hosted node's host copy refresh from
    /// this array when next read. `on` may be another stream of the context's device (a
    /// communication stream, say); `label` names the task in errors and traces. The task gets
    /// the array as a [`ScheduledArray`], through which it reads or changes the bytes safely
    /// while it holds its access. Writing an array that is its node's host array used in place
    /// is an error (such nodes change only on the host).
    pub fn schedule_on_array(
        &self,
        tn: &Tnode,
        on: &Stream,
        access: ArrayAccess,
        label: &'static str,
        task: impl FnOnce(&ScheduledArray<'_>) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let entry = self.entry(tn)?.clone();
        let here = self.inner.stream.device();
        if !Arc::ptr_eq(here.backend().lowered(), on.device().backend().lowered())
            || here.ordinal() != on.device().ordinal()
        {
            return Err(Error::WrongStream {
                what: format!("{label} of {}", tn.debug_name()),
                stream: on.name(),
                expected: format!("on the device of {}", self.describe()),
            });
        }
        let writes = access != ArrayAccess::Read;
        if writes && entry.is_host_in_place() {
            return Err(Error::HostArrayInPlace {
                node: tn.debug_name(),
                action: format!("{label} on {} would write", self.describe()),
            });
        }
        let ordered = match access {
            ArrayAccess::Read => Access::Read,
            ArrayAccess::Write => Access::Write,
            ArrayAccess::ReadWrite => Access::ReadWrite,
        };
        let (buffer, lowered, queue) = (entry.buffer.clone(), self.lowered(), on.queue());
        entry.schedule_access(
            on,
            ordered,
            TaskLabel::Named("collective", Arc::from(label)),
            move || {
                task(&ScheduledArray {
                    buffer: &buffer,
                    lowered: &lowered,
                    access,
                    queue: queue.as_deref(),
                })
            },
        )?;
        if writes && tn.modes().is_hosted() {
            crate::host_sync::device_changed_hosted(on, &entry)?;
        }
        Ok(())
    }

    /// A child context that also holds an array for `tn`, initialized from its host array (which
    /// must exist).
    pub fn init_from_host(&self, tn: &Tnode) -> Result<Context> {
        if !tn.host().exists() {
            return Err(Error::NotHosted {
                node: tn.debug_name(),
                detail: "init_from_host copies the host array to the device; set the node's values first"
                    .into(),
            });
        }
        let mut arrays = self.inner.arrays.clone();
        if let Some(e) = arrays.get(tn).cloned() {
            self.upload(tn, &e)?;
        } else {
            let e = self.new_array(tn, None)?;
            arrays.insert(tn.clone(), e);
        }
        Ok(self.child(
            arrays,
            self.inner.merge_node.clone(),
            vec![],
            None,
            self.inner.optimize_ctx.clone(),
        ))
    }

    fn upload(&self, tn: &Tnode, entry: &Arc<ArrayEntry>) -> Result<()> {
        if entry.is_host_in_place() {
            // The array is the host array: it already holds the host's values.
            node_sync(tn)?.mark_copy_up_to_date(entry.uid);
            return Ok(());
        }
        let bytes = tn
            .host()
            .with_latest(|nd| nd.as_bytes().to_vec())?
            .ok_or_else(|| Error::NotHosted {
                node: tn.debug_name(),
                detail:
                    "from_host copies the host array to the device; set the node's values first"
                        .into(),
            })?;
        schedule_upload(&self.inner.stream, entry, bytes)?;
        node_sync(tn)?.mark_copy_up_to_date(entry.uid);
        Ok(())
    }

    /// Schedules copying the node's host array into this context's array (after the work
    /// already scheduled on the stream).
    pub fn from_host(&self, tn: &Tnode) -> Result<()> {
        let entry = self.entry(tn)?.clone();
        self.upload(tn, &entry)
    }

    /// Copies this context's array of the node into its host array (created if needed, which
    /// requires the node's memory mode to allow hosting), waiting for the array's writer; the
    /// host then holds this copy's values, even if another copy changed the node later (a
    /// pending refresh from it is dropped). Returns the writer's failure, or an error a task of
    /// the stream left, if any.
    pub fn to_host(&self, tn: &Tnode) -> Result<()> {
        let entry = self.entry(tn)?.clone();
        refresh_host_from(&self.inner.stream, &entry)
    }

    /// Copies elements `elems` (positions in the stored, row-major array, padding margins
    /// included) of the node's host array into this context's array, after the work already
    /// scheduled: part of [`Context::from_host`]. A copy that lagged the host only in elements
    /// it now received (the host changed them with `set_value`) holds the latest values again,
    /// so the next run uploads nothing; a copy lagging elsewhere still reloads the whole array
    /// before its next use. A range outside the array is an [`Error::IndexOutOfBounds`]; a node
    /// without a host array is [`Error::NotHosted`].
    pub fn from_host_range(&self, tn: &Tnode, elems: std::ops::Range<usize>) -> Result<()> {
        let entry = self.entry(tn)?.clone();
        check_elems(tn, &elems)?;
        let size = tn.prec().size_in_bytes();
        let (start, end) = (elems.start * size, elems.end * size);
        let bytes = tn
            .host()
            .with_latest(|nd| nd.as_bytes()[start..end].to_vec())?
            .ok_or_else(|| Error::NotHosted {
                node: tn.debug_name(),
                detail:
                    "from_host_range copies part of the host array; set the node's values first"
                        .into(),
            })?;
        if !entry.is_host_in_place() {
            let stream = &self.inner.stream;
            let lowered = self.lowered();
            let (buffer, queue) = (entry.buffer.clone(), stream.queue());
            entry.schedule_access(
                stream,
                Access::Write,
                TaskLabel::Copy("copy part from host", end - start),
                // SAFETY: run by `schedule_access` as the array's writer (host_sync rule 3).
                move || unsafe {
                    lowered
                        .runtime()
                        .copy_from_host_range(&buffer, start, &bytes, queue.as_deref())
                },
            )?;
        }
        node_sync(tn)?.mark_range_up_to_date(entry.uid, elems.start, elems.end);
        Ok(())
    }

    /// Copies elements `elems` (positions in the stored, row-major array, padding margins
    /// included) of this context's array of the node into its host array, waiting for the
    /// array's writer: part of [`Context::to_host`], for reading a slice of a large result.
    /// The copy must hold the node's latest values (else the host would get stale ones: an
    /// error); which copies hold them does not change, and a pending refresh of the whole host
    /// array stays pending. A range outside the array is an [`Error::IndexOutOfBounds`].
    pub fn to_host_range(&self, tn: &Tnode, elems: std::ops::Range<usize>) -> Result<()> {
        let entry = self.entry(tn)?.clone();
        check_elems(tn, &elems)?;
        if !node_sync(tn)?.copy_not_lagging(entry.uid) {
            return Err(Error::StaleCopy {
                node: tn.debug_name(),
                context: self.describe(),
            });
        }
        if entry.is_host_in_place() {
            return Ok(());
        }
        let size = tn.prec().size_in_bytes();
        let (start, end) = (elems.start * size, elems.end * size);
        let stream = &self.inner.stream;
        let lowered = self.lowered();
        let (buffer, queue, node) = (entry.buffer.clone(), stream.queue(), tn.clone());
        entry.schedule_access(
            stream,
            Access::Read,
            TaskLabel::Copy("copy part to host", end - start),
            move || {
                node.host().refill(|nd| {
                    let dst = &mut nd.as_bytes_mut()[start..end];
                    // SAFETY: run by `schedule_access` as a reader (host_sync rule 2).
                    unsafe {
                        lowered
                            .runtime()
                            .copy_to_host_range(&buffer, start, dst, queue.as_deref())
                    }
                })
            },
        )?;
        stream.await_work()
    }

    /// Makes this context's stream wait for `event` before running anything scheduled later.
    pub fn will_wait_for(&self, event: &crate::scheduler::Event) -> Result<()> {
        self.inner.stream.will_wait_for(event)
    }
}

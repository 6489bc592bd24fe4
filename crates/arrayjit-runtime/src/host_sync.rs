//! Host and device synchronisation: the one rule set for device copies (arrays) of nodes,
//! their writers and readers, and refreshes of host arrays. The records these rules keep per
//! node (which copies are current, the pending refresh, the host write guards) are
//! [`crate::node_sync::NodeSync`], which the node reaches only through its `DeviceCopies`
//! seam: the IR says when the host reads or writes, the runtime decides what that means.
//!
//! Rules:
//! 1. Every array records the event of its **last writer** and the events of its **pending
//!    readers** since that write (at most one per stream: a later read of a stream covers its
//!    earlier ones).
//! 2. Work on a stream that **reads** an array first waits for its last writer; if that write
//!    failed, the read fails too (`Error::UpstreamFailed`), so nothing computes on stale data.
//!    The read is then recorded as a pending reader.
//! 3. Work that **writes** an array first waits for its last writer and every pending reader
//!    (order only: it does not use their values), then becomes the last writer and clears the
//!    readers. This is what keeps a writer on one stream from tearing a read on another.
//! 4. A hosted node's host array: device copies that hold its latest values are "not lagging
//!    the host"; a routine reading a lagging copy first uploads the host values. When a device
//!    writes its copy, that copy alone holds the latest values and the host gets a pending
//!    refresh from it, run when the host next reads or writes the node (waiting for the writer
//!    and failing with its failure, if any, until the node is recomputed). Host accesses on
//!    other threads meanwhile wait for that refresh to end, since they need its values (a
//!    stream's task does not: the refresh may be waiting for it).
//! 5. An explicit `to_host` from a copy makes the host hold that copy's values: the copy is the
//!    only one not lagging, and any pending refresh (from another copy) is dropped — the user
//!    asked for this copy's values.
//! 6. Where a device's memory is the host's (the CPU backends, `adopts_host_arrays`), the
//!    first array of a node that devices change is made of its host array itself, handed
//!    over rather than copied: that copy holds the host's values (it does not lag, unless a
//!    refresh from another copy was pending, which then stays), and the host gets a pending
//!    refresh from it, as after a device write (rule 4). The refresh makes the host array
//!    again, so the host sees the same values as with a copy, and one array holds them until
//!    the host next reads or writes the node.

use std::sync::{Arc, Weak};

use arrayjit_backends::LoweredBackend;
use arrayjit_ir::{Error, Result, Tnode};

use crate::array_entry::{Access, ArrayEntry};
use crate::node_sync::{hand_host_array_to_device, node_sync};
use crate::scheduler::TaskLabel;
use crate::stream::{Stream, StreamInner};

impl ArrayEntry {
    /// Rules 2 and 3: makes `stream` wait for what an access of this array must follow. Call
    /// before scheduling the access; then [`ArrayEntry::record`] after it.
    pub fn order(&self, stream: &Stream, access: Access) -> Result<()> {
        let (writer, readers) = self.accesses_to_follow(access);
        if let Some(w) = writer {
            stream.wait_for(&w, access.reads())?;
        }
        for r in readers {
            stream.wait_for(&r, false)?;
        }
        Ok(())
    }

    /// Orders, schedules and records one task accessing this array on `stream`.
    pub fn schedule_access(
        &self,
        stream: &Stream,
        access: Access,
        label: TaskLabel,
        task: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.order(stream, access)?;
        stream.schedule(Box::new(task), label)?;
        self.record(stream.all_work(), access);
        Ok(())
    }
}

/// Rule 6: `tn`'s new array on `stream`'s device made of its host array itself, where the
/// backend's runtime does that; `None` where it does not, or when there is no host array to
/// hand over (the caller then makes an array of the device's own). Only for a node that
/// devices change (`Hosted(ChangedOnDevices)`): no device array aliases its host array.
pub(crate) fn adopt_host_array(stream: &Stream, tn: &Tnode) -> Result<Option<Arc<ArrayEntry>>> {
    let lowered = stream.device().backend().lowered().clone();
    if !lowered.runtime().adopts_host_arrays() {
        return Ok(None);
    }
    // The host array holds the latest values once a pending refresh has run.
    tn.host().prepare_read()?;
    let sync = node_sync(tn)?;
    let (device, prec, size) = (stream.device().ordinal(), tn.prec(), tn.size_in_bytes());
    let handed = hand_host_array_to_device(tn, |slot| {
        // A refresh pending or running (on another thread) is not over until it has run to
        // its end: the array stays the host's (the caller copies it instead).
        if sync.refresh_pending_or_running() {
            return Ok(None);
        }
        if let Some(nd) = slot
            .as_ref()
            .filter(|nd| nd.prec() != prec || nd.size_in_bytes() != size)
        {
            return Err(Error::ShapeMismatch {
                op: format!("handing the host array of {} to a device", tn.debug_name()),
                shapes: vec![],
                detail: format!(
                    "its host array holds {} bytes of {} values; the node stores {size} bytes \
                     of {} values",
                    nd.size_in_bytes(),
                    nd.prec().name(),
                    prec.name()
                ),
            });
        }
        let buffer = lowered.runtime().adopt_host_array(device, slot)?;
        let entry = ArrayEntry::new(tn.clone(), buffer, false);
        // Installed under the host lock the handing over holds: no host access comes between
        // the handing over and the refresh that undoes it.
        sync.host_handed_to(
            entry.uid,
            host_refresh_hook(stream.downgrade(), entry.clone(), lowered.clone()),
        );
        Ok(Some(entry))
    })?;
    Ok(handed.flatten())
}

/// Schedules copying host bytes into an array (a write).
pub(crate) fn schedule_upload(
    stream: &Stream,
    entry: &Arc<ArrayEntry>,
    bytes: Vec<u8>,
) -> Result<()> {
    let lowered = stream.device().backend().lowered().clone();
    let (buffer, queue) = (entry.buffer.clone(), stream.queue());
    entry.schedule_access(
        stream,
        Access::Write,
        TaskLabel::Copy("copy from host", bytes.len()),
        // SAFETY: `schedule_access` runs this as the array's writer, after its last writer
        // and pending readers and before later accesses (rules 2 and 3).
        move || unsafe {
            lowered
                .runtime()
                .copy_from_host(&buffer, &bytes, queue.as_deref())
        },
    )
}

/// Fills a new array (one no work has accessed yet) with `bytes`, given by `with_bytes`: at
/// once on the calling thread where the runtime allows it
/// ([`arrayjit_backends::DeviceRuntime::copies_into_new_buffers_at_once`]: nothing can be
/// reading or writing the array, so there is nothing to order the write after, rules 2 and 3),
/// else as a copy scheduled on `stream` from a snapshot of the bytes. Returns whether
/// `with_bytes` gave any (`None`: nothing to copy).
pub(crate) fn fill_new_array(
    stream: &Stream,
    entry: &Arc<ArrayEntry>,
    with_bytes: impl FnOnce(&mut dyn FnMut(&[u8]) -> Result<()>) -> Option<Result<()>>,
) -> Result<bool> {
    let lowered = stream.device().backend().lowered().clone();
    let filled = if lowered.runtime().copies_into_new_buffers_at_once() {
        with_bytes(&mut |bytes| {
            // SAFETY: the array is new: no work has been scheduled on it, and none can be
            // until the caller hands it out, so nothing accesses it during the copy.
            unsafe { lowered.runtime().copy_from_host(&entry.buffer, bytes, None) }
        })
    } else {
        with_bytes(&mut |bytes| schedule_upload(stream, entry, bytes.to_vec()))
    };
    filled.transpose().map(|f| f.is_some())
}

/// Schedules copying an array into its node's host array on `stream` (a read).
pub(crate) fn schedule_download(stream: &Stream, entry: &Arc<ArrayEntry>) -> Result<()> {
    let lowered = stream.device().backend().lowered().clone();
    let Some(tn) = entry.node() else {
        return Ok(());
    };
    let (buffer, queue) = (entry.buffer.clone(), stream.queue());
    entry.schedule_access(
        stream,
        Access::Read,
        TaskLabel::Copy("copy to host", entry.buffer.size_in_bytes()),
        move || {
            tn.host().refill(|nd| {
                // SAFETY: `schedule_access` runs this as a reader of the array, after its last
                // writer and before any later writer (rules 2 and 3).
                unsafe {
                    lowered
                        .runtime()
                        .copy_to_host(&buffer, nd.as_bytes_mut(), queue.as_deref())
                }
            })
        },
    )
}

/// Rule 5: brings the host array to this copy's values now (`to_host`). A host array used in
/// place already is the copy.
pub(crate) fn refresh_host_from(stream: &Stream, entry: &Arc<ArrayEntry>) -> Result<()> {
    if entry.is_host_in_place() {
        return Ok(());
    }
    schedule_download(stream, entry)?;
    stream.await_work()?;
    if let Some(tn) = entry.node() {
        node_sync(&tn)?.host_refreshed_from(entry.uid);
    }
    Ok(())
}

/// Rule 4: after scheduling a write of a hosted node's copy on `stream`, the copy alone holds
/// the latest values and the host gets a pending refresh from it.
pub(crate) fn device_changed_hosted(stream: &Stream, entry: &Arc<ArrayEntry>) -> Result<()> {
    let Some(tn) = entry.node() else {
        return Ok(());
    };
    let sync = node_sync(&tn)?;
    sync.mark_changed_in_copy(entry.uid);
    let lowered = stream.device().backend().lowered().clone();
    sync.set_prepare_read(host_refresh_hook(
        stream.downgrade(),
        entry.clone(),
        lowered,
    ));
    Ok(())
}

/// The pending refresh of rule 4: wait for the copy's writer (failing with its failure), then
/// copy to the host — through the writer's stream if it still exists, else directly (a dropped
/// stream has finished its work).
fn host_refresh_hook(
    stream: Weak<StreamInner>,
    entry: Arc<ArrayEntry>,
    lowered: Arc<LoweredBackend>,
) -> crate::node_sync::HostHook {
    Box::new(move || {
        // The hook runs on the node's behalf, so the node is alive.
        let Some(tn) = entry.node() else {
            return Ok(());
        };
        // Each call below runs when the copy's writer has finished (waited
        // for below, or inside the writer's own stream after it), and a later writer of the
        // array waits for this refresh: the node's prepare-read hook runs before the host
        // reads, and nothing else writes a hosted node's array meanwhile.
        let direct = || {
            // SAFETY: ordered as the comment above says.
            tn.host().refill(|nd| unsafe {
                lowered
                    .runtime()
                    .copy_to_host(&entry.buffer, nd.as_bytes_mut(), None)
            })
        };
        match stream.upgrade() {
            // Inside a task of the writer's own stream every earlier task has finished.
            Some(inner) if inner.runner.inside_task() => {
                if let Some(e) = entry.writer_event().failure() {
                    return Err(e);
                }
                direct()?;
            }
            Some(inner) => {
                let stream = Stream { inner };
                schedule_download(&stream, &entry)?;
                stream.await_work()?;
            }
            None => {
                entry.writer_event().sync()?;
                direct()?;
            }
        }
        node_sync(&tn)?.mark_copy_up_to_date(entry.uid);
        Ok(())
    })
}

//! Host and device synchronisation: the one rule set for device copies (arrays) of nodes,
//! their writers and readers, and refreshes of host arrays.
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
//!    and failing with its failure, if any, until the node is recomputed).
//! 5. An explicit `to_host` from a copy makes the host hold that copy's values: the copy is the
//!    only one not lagging, and any pending refresh (from another copy) is dropped — the user
//!    asked for this copy's values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arrayjit_backends::{BufferHandle, LoweredBackend};
use arrayjit_ir::tnode::WeakTnode;
use arrayjit_ir::{Result, Tnode};

use crate::scheduler::{Event, TaskLabel};
use crate::stream::{Stream, StreamInner};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One array of a context: the buffer, its last writer and pending readers, and, for arrays
/// shared across a device's streams, the one stream allowed to write it.
pub(crate) struct ArrayEntry {
    /// Unique id of this device copy of the node (see `Tnode::copies_not_lagging_host`).
    pub uid: usize,
    /// The node, held weakly: a copy shared across streams is attached to its node and must
    /// not keep it alive (contexts and routines hold the node itself).
    node: WeakTnode,
    pub buffer: BufferHandle,
    /// Whether the array serves all the device's streams (set once, when the array is made
    /// shared by its memory mode or by sharing inference).
    pub shared: std::sync::atomic::AtomicBool,
    pub writing_stream: Mutex<Option<usize>>,
    accesses: Mutex<Accesses>,
    /// For an array that is its node's host array used in place: the guard the node runs
    /// before host writes (waiting for the work reading this array). Devices never write such
    /// arrays, and the host never needs copying into or out of them.
    host_guard: Option<arrayjit_ir::tnode::HostWriteGuard>,
}

#[derive(Default)]
struct Accesses {
    writer: Option<Event>,
    readers: Vec<Event>,
}

/// How scheduled work uses an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    /// The access of a routine argument.
    pub fn of(input: bool, output: bool) -> Access {
        match (input, output) {
            (true, true) => Access::ReadWrite,
            (false, true) => Access::Write,
            _ => Access::Read,
        }
    }

    fn reads(self) -> bool {
        self != Access::Write
    }

    fn writes(self) -> bool {
        self != Access::Read
    }
}

/// A unique id for a new device copy of a node.
fn next_copy_uid() -> usize {
    static NEXT_COPY: AtomicUsize = AtomicUsize::new(0);
    NEXT_COPY.fetch_add(1, Ordering::Relaxed)
}

impl ArrayEntry {
    pub fn new(node: Tnode, buffer: BufferHandle, shared: bool) -> Arc<ArrayEntry> {
        Arc::new(ArrayEntry {
            uid: next_copy_uid(),
            node: node.downgrade(),
            buffer,
            shared: std::sync::atomic::AtomicBool::new(shared),
            writing_stream: Mutex::new(None),
            accesses: Mutex::new(Accesses::default()),
            host_guard: None,
        })
    }

    /// An array that is the node's host array used in place (`buffer`, from the backend's
    /// `host_memory_buffer`): it holds the host's values by construction, and host writes
    /// wait for the work scheduled to read it.
    pub fn host_in_place(node: Tnode, buffer: BufferHandle) -> Arc<ArrayEntry> {
        let uid = next_copy_uid();
        Arc::new_cyclic(|weak: &Weak<ArrayEntry>| {
            let weak = weak.clone();
            let guard: arrayjit_ir::tnode::HostWriteGuard = Arc::new(move || {
                if let Some(e) = weak.upgrade() {
                    e.wait_for_accesses();
                }
                Ok(())
            });
            node.add_host_write_guard(&guard);
            node.mark_copy_up_to_date(uid);
            ArrayEntry {
                uid,
                node: node.downgrade(),
                buffer,
                shared: std::sync::atomic::AtomicBool::new(false),
                writing_stream: Mutex::new(None),
                accesses: Mutex::new(Accesses::default()),
                host_guard: Some(guard),
            }
        })
    }

    /// Whether this array is its node's host array used in place.
    pub fn is_host_in_place(&self) -> bool {
        self.host_guard.is_some()
    }

    /// Waits until the last writer and every pending reader of this array have finished
    /// (their failures are theirs to report).
    fn wait_for_accesses(&self) {
        let (writer, readers) = {
            let a = lock(&self.accesses);
            (a.writer.clone(), a.readers.clone())
        };
        for e in writer.iter().chain(&readers) {
            e.wait_unless_inside_its_stream();
        }
    }

    /// The node, unless every handle to it is gone (then nobody can read this copy's values).
    pub fn node(&self) -> Option<Tnode> {
        self.node.upgrade()
    }

    /// The event of the last scheduled write (done if none).
    pub fn writer_event(&self) -> Event {
        lock(&self.accesses)
            .writer
            .clone()
            .unwrap_or_else(Event::done)
    }

    /// Whether the last write of this array failed or was skipped.
    pub fn writer_failed(&self) -> bool {
        self.writer_event().failure().is_some()
    }

    /// Rules 2 and 3: makes `stream` wait for what an access of this array must follow. Call
    /// before scheduling the access; then [`ArrayEntry::record`] after it.
    pub fn order(&self, stream: &Stream, access: Access) -> Result<()> {
        let (writer, readers) = {
            let a = lock(&self.accesses);
            let readers = if access.writes() {
                a.readers.clone()
            } else {
                vec![]
            };
            (a.writer.clone(), readers)
        };
        if let Some(w) = writer {
            stream.wait_for(&w, access.reads())?;
        }
        for r in readers {
            stream.wait_for(&r, false)?;
        }
        Ok(())
    }

    /// Records a scheduled access whose completion is `event`.
    pub fn record(&self, event: Event, access: Access) {
        let mut a = lock(&self.accesses);
        if access.writes() {
            a.writer = Some(event);
            a.readers.clear();
        } else {
            a.readers.retain(|r| !r.is_done() && !r.same_stream(&event));
            a.readers.push(event);
        }
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
        move || unsafe { lowered.copy_from_host(&buffer, &bytes, queue.as_deref()) },
    )
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
            tn.with_host_mut(|nd| {
                // SAFETY: `schedule_access` runs this as a reader of the array, after its last
                // writer and before any later writer (rules 2 and 3).
                unsafe { lowered.copy_to_host(&buffer, nd.as_bytes_mut(), queue.as_deref()) }
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
        tn.host_refreshed_from(entry.uid);
    }
    Ok(())
}

/// Rule 4: after scheduling a write of a hosted node's copy on `stream`, the copy alone holds
/// the latest values and the host gets a pending refresh from it.
pub(crate) fn device_changed_hosted(stream: &Stream, entry: &Arc<ArrayEntry>) {
    let Some(tn) = entry.node() else {
        return;
    };
    tn.mark_changed_in_copy(entry.uid);
    let lowered = stream.device().backend().lowered().clone();
    tn.set_prepare_read(host_refresh_hook(
        stream.downgrade(),
        entry.clone(),
        lowered,
    ));
}

/// The pending refresh of rule 4: wait for the copy's writer (failing with its failure), then
/// copy to the host — through the writer's stream if it still exists, else directly (a dropped
/// stream has finished its work).
fn host_refresh_hook(
    stream: Weak<StreamInner>,
    entry: Arc<ArrayEntry>,
    lowered: Arc<dyn LoweredBackend>,
) -> arrayjit_ir::tnode::HostHook {
    Box::new(move || {
        // The hook runs on the node's behalf, so the node is alive.
        let Some(tn) = entry.node() else {
            return Ok(());
        };
        // SAFETY (for each call below): it runs when the copy's writer has finished (waited
        // for below, or inside the writer's own stream after it), and a later writer of the
        // array waits for this refresh: the node's prepare-read hook runs before the host
        // reads, and nothing else writes a hosted node's array meanwhile.
        let direct = || {
            tn.with_host_mut(|nd| unsafe {
                lowered.copy_to_host(&entry.buffer, nd.as_bytes_mut(), None)
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
        tn.mark_copy_up_to_date(entry.uid);
        Ok(())
    })
}

/// The arrays of one device shared by all its streams (constants, and nodes shared across
/// streams), by node id. A shared array belongs to its node, not to a context: the node holds
/// it (`Tnode::attach`) and this index holds it weakly, so it lives while the node does —
/// keeping its values between contexts — and is freed with the node.
#[derive(Default)]
pub(crate) struct SharedArrays {
    by_node: Mutex<HashMap<usize, Weak<ArrayEntry>>>,
    /// Arrays of hosted nodes whose sharing is undecided that one stream's routine reads and
    /// none writes: shared when a routine of another stream reads the node too.
    candidates: Mutex<HashMap<usize, SharingCandidate>>,
    /// Index size after the last sweep of freed entries; the next sweep comes when it doubles.
    swept_at: AtomicUsize,
}

impl SharedArrays {
    /// The device's shared array of `tn`, if there is one.
    pub fn get(&self, tn: &Tnode) -> Option<Arc<ArrayEntry>> {
        lock(&self.by_node).get(&tn.id()).and_then(Weak::upgrade)
    }

    /// Makes `entry` the device's shared array of its node, owned by the node.
    pub fn insert(&self, tn: &Tnode, entry: &Arc<ArrayEntry>) {
        tn.attach(entry.clone());
        let mut by_node = lock(&self.by_node);
        by_node.insert(tn.id(), Arc::downgrade(entry));
        // Entries of dropped nodes are swept when the index has doubled since the last sweep,
        // so the index stays proportional to the live shared arrays at O(1) amortized cost.
        if by_node.len() > 2 * self.swept_at.load(Ordering::Relaxed).max(16) {
            by_node.retain(|_, e| e.strong_count() > 0);
            self.swept_at.store(by_node.len(), Ordering::Relaxed);
        }
    }

    /// Size of the index, freed entries included (for tests of the sweep).
    #[cfg(test)]
    pub fn by_node_len(&self) -> usize {
        lock(&self.by_node).len()
    }

    /// Offers a stream's array of a node read and not written there as the array other
    /// streams may share (see `Context::link`); replaces an offer of the same node.
    pub fn offer(&self, tn: &Tnode, candidate: SharingCandidate) {
        let mut c = lock(&self.candidates);
        c.insert(tn.id(), candidate);
        if c.len() > 64 {
            c.retain(|_, k| k.entry.strong_count() > 0);
        }
    }

    /// The live offer for a node, if any.
    pub fn candidate(&self, tn: &Tnode) -> Option<(Arc<ArrayEntry>, SharingCandidate)> {
        let c = lock(&self.candidates);
        let k = c.get(&tn.id())?;
        Some((k.entry.upgrade()?, k.clone()))
    }

    /// Withdraws the offer for a node (it is written, or now shared).
    pub fn withdraw(&self, tn: &Tnode) {
        lock(&self.candidates).remove(&tn.id());
    }

    /// Number of live shared arrays.
    pub fn live(&self) -> usize {
        lock(&self.by_node)
            .values()
            .filter(|e| e.strong_count() > 0)
            .count()
    }
}

/// A stream's array of a node offered for sharing across the device's streams.
#[derive(Clone)]
pub(crate) struct SharingCandidate {
    pub entry: Weak<ArrayEntry>,
    /// The stream (id) whose routine reads it, and its name.
    pub stream: usize,
    pub stream_name: String,
    /// The routine that reads it there.
    pub routine: String,
}

//! The arrays of a device's contexts as the synchronisation rules see them (see
//! `host_sync`): each [`ArrayEntry`] with its last writer and pending readers, and the
//! device's [`SharedArrays`] index of arrays shared by all its streams. Scheduling accesses on
//! a stream is `host_sync`'s; this module knows no streams.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arrayjit_backends::BufferHandle;
use arrayjit_ir::Result;
use arrayjit_ir::Tnode;
use arrayjit_ir::tnode::WeakTnode;

use crate::node_sync::node_sync;
use crate::scheduler::Event;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    host_guard: Option<crate::node_sync::HostWriteGuard>,
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

    pub(crate) fn reads(self) -> bool {
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
    /// Whether the array is its node's host array used in place (no memory of its own).
    pub(crate) fn uses_host_memory(&self) -> bool {
        self.host_guard.is_some()
    }

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
    pub fn host_in_place(node: Tnode, buffer: BufferHandle) -> Result<Arc<ArrayEntry>> {
        let uid = next_copy_uid();
        let sync = node_sync(&node)?;
        Ok(Arc::new_cyclic(|weak: &Weak<ArrayEntry>| {
            let weak = weak.clone();
            let guard: crate::node_sync::HostWriteGuard = Arc::new(move || {
                if let Some(e) = weak.upgrade() {
                    e.wait_for_accesses();
                }
                Ok(())
            });
            sync.add_host_write_guard(&guard);
            sync.mark_copy_up_to_date(uid);
            ArrayEntry {
                uid,
                node: node.downgrade(),
                buffer,
                shared: std::sync::atomic::AtomicBool::new(false),
                writing_stream: Mutex::new(None),
                accesses: Mutex::new(Accesses::default()),
                host_guard: Some(guard),
            }
        }))
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

    /// What an access must follow (rules 2 and 3 of `host_sync`): the last writer, and the
    /// pending readers when the access writes.
    pub fn accesses_to_follow(&self, access: Access) -> (Option<Event>, Vec<Event>) {
        let a = lock(&self.accesses);
        let readers = if access.writes() {
            a.readers.clone()
        } else {
            vec![]
        };
        (a.writer.clone(), readers)
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
    pub fn insert(&self, tn: &Tnode, entry: &Arc<ArrayEntry>) -> Result<()> {
        node_sync(tn)?.attach(entry.clone());
        let mut by_node = lock(&self.by_node);
        by_node.insert(tn.id(), Arc::downgrade(entry));
        // Entries of dropped nodes are swept when the index has doubled since the last sweep,
        // so the index stays proportional to the live shared arrays at O(1) amortized cost.
        if by_node.len() > 2 * self.swept_at.load(Ordering::Relaxed).max(16) {
            by_node.retain(|_, e| e.strong_count() > 0);
            self.swept_at.store(by_node.len(), Ordering::Relaxed);
        }
        Ok(())
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

//! The runtime's side of a node's host array ([`NodeSync`], the node's
//! [`DeviceCopies`]): which device copies hold the latest values, the pending host refresh,
//! the guards run before host writes, the runtime's note on the node, and device arrays that
//! live exactly as long as the node. `host_sync` states the rules these records follow; this
//! module keeps them.
//!
//! Records:
//! 1. **Current copies**: a set of device copies (arrays, by their runtime uid) holding the
//!    latest values, each with the stored-element ranges `[start, end)` the host changed since
//!    (`set_value`): a copy with ranges lags in those elements only, one outside the set lags
//!    wholly. A host write of every value empties the set; a device write leaves only the
//!    writing copy in it; an upload from the host makes its copy current (or clears the
//!    uploaded range).
//! 2. **Pending refresh**: at most one hook bringing the host array up to date from a device
//!    copy, run (and dropped) before the host next reads or writes the node; a failed one
//!    stays pending unless a newer one replaced it meanwhile. While one thread runs it, the
//!    others' host accesses wait for it to end (they need its values), except from inside a
//!    stream's task, which the refresh may itself be waiting for.
//! 3. **Write guards**: run before every host write, held weakly (the device array that uses
//!    the host array in place owns its guard).
//! 4. **The host array handed over** (`host_sync` rule 6): where a device's memory is the
//!    host's, the host array itself may become a device copy ([`hand_host_array_to_device`]):
//!    taken out of its slot under the host lock, while no [`HostPin`] holds it there. From then
//!    until the host makes the array again (the pending refresh brings its values back) the
//!    node's host array exists but is with that copy ([`DeviceCopies::holds_host_array`]). A
//!    pin is taken under the host lock too, so a handing over either saw it or came before it.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use arrayjit_ir::tnode::DeviceCopies;
use arrayjit_ir::{Error, Ndarray, Result, Tnode};

/// A deferred host-side synchronisation, e.g. "wait for the device that computed this node and
/// copy it to the host" (record 2).
pub type HostHook = Box<dyn Fn() -> Result<()> + Send>;

/// Runs before host writes of a node whose host array a device array uses in place (record 3).
pub type HostWriteGuard = Arc<dyn Fn() -> Result<()> + Send + Sync>;

#[derive(Default)]
struct Records {
    copies_not_lagging_host: BTreeSet<usize>,
    dirty: BTreeMap<usize, Vec<(usize, usize)>>,
    prepare_read: Option<HostHook>,
    /// Refreshes taken from `prepare_read` and running now.
    refreshing: usize,
    write_guards: Vec<Weak<dyn Fn() -> Result<()> + Send + Sync>>,
    note: String,
}

/// The device copies of one node, as the runtime records them (see the module doc).
#[derive(Default)]
pub struct NodeSync {
    records: Mutex<Records>,
    /// Resources that live exactly as long as the node ([`NodeSync::attach`]).
    attachments: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
    /// Signalled when a running refresh ends.
    refreshed: Condvar,
    /// Record 4: a device copy holds the host array itself. Changed under the host lock.
    host_handed_over: AtomicBool,
    /// Record 4: how many [`HostPin`]s keep the host array where it is.
    host_pins: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime's records of `tn`'s device copies, made on first use. An error only when
/// something other than this runtime installed the node's [`DeviceCopies`].
pub fn node_sync(tn: &Tnode) -> Result<&NodeSync> {
    tn.device_copies_or_install(|| Arc::new(NodeSync::default()))
        .as_any()
        .downcast_ref::<NodeSync>()
        .ok_or_else(|| Error::Unsupported {
            backend: "arrayjit_runtime".into(),
            what: format!("tensor node {} whose device copies another layer keeps", tn),
            instead: "let the runtime keep the device copies of nodes it runs".into(),
        })
}

impl NodeSync {
    /// Ids of the device copies (arrays) that hold the latest values.
    pub fn copies_not_lagging_host(&self) -> Vec<usize> {
        let r = lock(&self.records);
        r.copies_not_lagging_host
            .iter()
            .copied()
            .filter(|c| r.dirty.get(c).is_none_or(Vec::is_empty))
            .collect()
    }

    /// Whether device copy `copy` holds the latest values.
    pub fn copy_not_lagging(&self, copy: usize) -> bool {
        let r = lock(&self.records);
        r.copies_not_lagging_host.contains(&copy) && r.dirty.get(&copy).is_none_or(Vec::is_empty)
    }

    /// The ranges of stored elements `[start, end)` in which copy `copy` lags the host, if it
    /// lags only there (`Some(vec![])`: up to date); `None` when it lags wholly.
    pub fn copy_lagging_ranges(&self, copy: usize) -> Option<Vec<(usize, usize)>> {
        let r = lock(&self.records);
        r.copies_not_lagging_host
            .contains(&copy)
            .then(|| r.dirty.get(&copy).cloned().unwrap_or_default())
    }

    /// Records that device copy `copy` now holds the latest values (it read the host's, or
    /// received another up-to-date copy).
    pub fn mark_copy_up_to_date(&self, copy: usize) {
        let mut r = lock(&self.records);
        r.copies_not_lagging_host.insert(copy);
        r.dirty.remove(&copy);
    }

    /// Records that device copy `copy` changed the node: the host and every other copy lag.
    pub fn mark_changed_in_copy(&self, copy: usize) {
        let mut r = lock(&self.records);
        r.copies_not_lagging_host.clear();
        r.dirty.clear();
        r.copies_not_lagging_host.insert(copy);
    }

    /// Records that device copy `copy` was made of the host array itself (handed over, rule 6
    /// of `host_sync`): it holds the latest values, and `refresh` (which makes the host array
    /// again from it) is the pending refresh. When a refresh from another copy is pending or
    /// running, the host array did not hold the latest values: `copy` lags, and that refresh
    /// stays (a running one makes the host array again, with the latest values).
    pub fn host_handed_to(&self, copy: usize, refresh: HostHook) {
        let mut r = lock(&self.records);
        if r.prepare_read.is_none() && r.refreshing == 0 {
            r.copies_not_lagging_host.insert(copy);
            r.dirty.remove(&copy);
            r.prepare_read = Some(refresh);
        }
    }

    /// Records that the host array now holds device copy `copy`'s values (an explicit copy to
    /// the host): that copy alone does not lag, and a pending refresh from another copy is
    /// dropped.
    pub fn host_refreshed_from(&self, copy: usize) {
        let mut r = lock(&self.records);
        r.copies_not_lagging_host.clear();
        r.dirty.clear();
        r.copies_not_lagging_host.insert(copy);
        r.prepare_read = None;
    }

    /// Records that stored elements `start..end` of copy `copy` were copied from the host: a
    /// copy lagging only in some ranges no longer lags in these (a wholly lagging copy still
    /// does).
    pub fn mark_range_up_to_date(&self, copy: usize, start: usize, end: usize) {
        let mut r = lock(&self.records);
        if let Some(ranges) = r.dirty.get_mut(&copy) {
            *ranges = ranges
                .iter()
                .flat_map(|&(a, b)| {
                    let left = (a, b.min(start));
                    let right = (a.max(end), b);
                    [left, right].into_iter().filter(|(x, y)| x < y)
                })
                .collect();
        }
    }

    /// Installs the hook that brings the host array up to date before the host reads or writes
    /// it (replacing an earlier one), when a device changes the node.
    pub fn set_prepare_read(&self, hook: HostHook) {
        lock(&self.records).prepare_read = Some(hook);
    }

    /// Whether a host refresh is pending, or running on some thread.
    pub fn refresh_pending_or_running(&self) -> bool {
        let r = lock(&self.records);
        r.prepare_read.is_some() || r.refreshing > 0
    }

    /// Whether a host refresh is pending (installed, not yet run).
    pub fn prepare_read_pending(&self) -> bool {
        lock(&self.records).prepare_read.is_some()
    }

    /// Installs a guard run before every later write of the host array. Held weakly: it runs
    /// as long as its owner (the device array) keeps it.
    pub fn add_host_write_guard(&self, guard: &HostWriteGuard) {
        let mut r = lock(&self.records);
        r.write_guards.retain(|g| g.strong_count() > 0);
        r.write_guards.push(Arc::downgrade(guard));
    }

    /// Keeps `resource` alive exactly as long as the node (the device copies that belong to
    /// the node rather than to a context, such as a constant shared by a device's streams). A
    /// resource must not hold the node strongly, or neither is ever freed.
    pub fn attach(&self, resource: Arc<dyn Any + Send + Sync>) {
        lock(&self.attachments).push(resource);
    }

    /// What the runtime noted about the node (where its last linked array lives), empty if
    /// nothing: the reference's `backend_info`.
    pub fn note(&self) -> String {
        lock(&self.records).note.clone()
    }

    /// Replaces the runtime's note on the node.
    pub fn set_note(&self, note: impl Into<String>) {
        lock(&self.records).note = note.into();
    }
}

impl DeviceCopies for NodeSync {
    /// Runs the pending refresh; a failed one stays pending unless a newer one was installed.
    /// Where another thread is running one, waits for it to end first (record 2).
    fn before_host_access(&self) -> Result<()> {
        let mut r = lock(&self.records);
        loop {
            if let Some(h) = r.prepare_read.take() {
                r.refreshing += 1;
                drop(r);
                let result = h();
                let mut r = lock(&self.records);
                r.refreshing -= 1;
                if result.is_err() && r.prepare_read.is_none() {
                    r.prepare_read = Some(h);
                }
                drop(r);
                self.refreshed.notify_all();
                return result;
            }
            if r.refreshing == 0 || crate::scheduler::inside_any_task() {
                return Ok(());
            }
            r = self.refreshed.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs the live write guards, outside the records' lock (the work they wait for may take
    /// it).
    fn before_host_write(&self) -> Result<()> {
        let guards: Vec<HostWriteGuard> = {
            let mut r = lock(&self.records);
            r.write_guards.retain(|g| g.strong_count() > 0);
            r.write_guards.iter().filter_map(Weak::upgrade).collect()
        };
        for g in guards {
            g()?;
        }
        Ok(())
    }

    fn holds_host_array(&self) -> bool {
        self.host_handed_over.load(Ordering::Relaxed)
    }

    fn host_array_made(&self) {
        self.host_handed_over.store(false, Ordering::Relaxed);
    }

    fn hold_values(&self) -> bool {
        !self.copies_not_lagging_host().is_empty()
    }

    fn host_changed(&self, elems: Option<(usize, usize)>) {
        let mut r = lock(&self.records);
        match elems {
            None => {
                r.copies_not_lagging_host.clear();
                r.dirty.clear();
            }
            Some((start, end)) => {
                let copies: Vec<usize> = r.copies_not_lagging_host.iter().copied().collect();
                for c in copies {
                    let ranges = r.dirty.entry(c).or_default();
                    ranges.push((start, end));
                    merge(ranges);
                }
            }
        }
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "device copies holding the latest values: {:?}",
            self.copies_not_lagging_host()
        )];
        if self.prepare_read_pending() {
            lines.push(
                "a host refresh is pending: it runs before the host next reads or writes".into(),
            );
        }
        let note = self.note();
        if !note.is_empty() {
            lines.push(format!("backend: {note}"));
        }
        lines
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Keeps a node's host array where it is while it lives ([`pin_host_array`]): the array is
/// never handed to a device meanwhile, so memory borrowed from it (a NumPy view) stays valid
/// and shows every later change, which happens in place.
pub struct HostPin(Tnode);

impl Drop for HostPin {
    fn drop(&mut self) {
        if let Ok(sync) = node_sync(&self.0) {
            sync.host_pins.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for HostPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostPin({})", self.0.debug_name())
    }
}

/// Pins `tn`'s host array (record 4): while the [`HostPin`] lives it is never handed to a
/// device, so after the pending refresh ([`arrayjit_ir::tnode::HostValues::prepare_read`]) the
/// array exists and stays. An error only where [`node_sync`] has one.
pub fn pin_host_array(tn: &Tnode) -> Result<HostPin> {
    let sync = node_sync(tn)?;
    // Under the host lock: a handing over either saw the pin or came before it.
    let _host = tn.host().lock();
    sync.host_pins.fetch_add(1, Ordering::SeqCst);
    Ok(HostPin(tn.clone()))
}

/// Hands `tn`'s host array itself to a device copy (record 4), where a device's memory is the
/// host's (the CPU backends): `adopt` takes the array out of the slot it is given and makes the
/// device copy of it, so that no bytes are copied and only one array holds the values.
/// Returns what `adopt` made, or `None` when there is no host array to hand over (none yet,
/// or handed over already) or it is pinned ([`pin_host_array`]). An `adopt` that fails, or
/// declines, must leave the array in the slot: the host array then stays as it was. `adopt`
/// installs the refresh that brings the values back, under the host lock, so that no host
/// access comes between.
pub fn hand_host_array_to_device<R>(
    tn: &Tnode,
    adopt: impl FnOnce(&mut Option<Ndarray>) -> Result<R>,
) -> Result<Option<R>> {
    let sync = node_sync(tn)?;
    tn.host().with_host_slot(|slot| {
        if slot.is_none() || sync.host_pins.load(Ordering::SeqCst) > 0 {
            return Ok(None);
        }
        let made = adopt(slot)?;
        if slot.is_none() {
            sync.host_handed_over.store(true, Ordering::Relaxed);
        }
        Ok(Some(made))
    })
}

/// Sorts ranges and joins the overlapping or touching ones.
fn merge(ranges: &mut Vec<(usize, usize)>) {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for &(a, b) in ranges.iter() {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::Prec;

    #[test]
    fn ranges_merge_when_they_overlap_or_touch() {
        let mut r = vec![(5, 6), (1, 2), (2, 4), (8, 9), (5, 7)];
        merge(&mut r);
        assert_eq!(r, vec![(1, 4), (5, 7), (8, 9)]);
    }

    #[test]
    fn host_writes_make_copies_lag_wholly_or_in_ranges() {
        let tn = Tnode::new(Prec::F32, &[10], &["x"]).unwrap();
        tn.host().set_values(&[0.0; 10]).unwrap();
        let sync = node_sync(&tn).unwrap();
        sync.mark_copy_up_to_date(1);
        sync.mark_copy_up_to_date(2);
        assert_eq!(sync.copies_not_lagging_host(), vec![1, 2]);
        assert!(tn.debug_info().contains("latest values: [1, 2]"));
        // One element on the host: both copies lag there only.
        tn.host().set_value(&[3], 1.0).unwrap();
        assert_eq!(sync.copy_lagging_ranges(1), Some(vec![(3, 4)]));
        assert!(!sync.copy_not_lagging(2));
        sync.mark_range_up_to_date(1, 3, 4);
        assert!(sync.copy_not_lagging(1));
        // Every value: every copy lags wholly.
        tn.host().set_values(&[2.0; 10]).unwrap();
        assert_eq!(sync.copy_lagging_ranges(1), None);
        // A device write: that copy alone is current.
        sync.mark_changed_in_copy(2);
        assert_eq!(sync.copies_not_lagging_host(), vec![2]);
    }

    #[test]
    fn a_failed_refresh_stays_pending_and_guards_run_before_host_writes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tn = Tnode::new(Prec::F32, &[2], &["y"]).unwrap();
        tn.host().set_values(&[1.0, 2.0]).unwrap();
        let sync = node_sync(&tn).unwrap();
        let tries = Arc::new(AtomicUsize::new(0));
        let t = tries.clone();
        sync.set_prepare_read(Box::new(move || {
            if t.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(Error::invalid("the device failed"))
            } else {
                Ok(())
            }
        }));
        assert!(tn.host().get_values().is_err());
        assert!(sync.prepare_read_pending(), "kept for a retry");
        assert_eq!(tn.host().get_values().unwrap(), vec![1.0, 2.0]);
        assert!(!sync.prepare_read_pending());
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let guard: HostWriteGuard = Arc::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        sync.add_host_write_guard(&guard);
        tn.host().set_value(&[0], 5.0).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        drop(guard);
        tn.host().set_value(&[0], 6.0).unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "a dropped guard no longer runs"
        );
    }

    #[test]
    fn a_host_array_handed_to_a_device_exists_and_is_made_again_on_use() {
        let t = Tnode::new(Prec::F32, &[3], &["h"]).unwrap();
        let take = |slot: &mut Option<Ndarray>| Ok(slot.take());
        assert!(
            hand_host_array_to_device(&t, take).unwrap().is_none(),
            "none yet"
        );
        t.host().set_values(&[1.0, 2.0, 3.0]).unwrap();
        // A failed handing over leaves the array as it was.
        let err =
            hand_host_array_to_device(&t, |_| Err::<(), _>(Error::invalid("the device refused")))
                .unwrap_err();
        assert!(err.to_string().contains("refused"));
        assert!(!t.host().is_on_device());
        assert_eq!(t.host().get_values().unwrap(), vec![1.0, 2.0, 3.0]);
        // Handed over: the array goes with its values, and the node is still hosted.
        let taken = hand_host_array_to_device(&t, take).unwrap().flatten();
        assert_eq!(taken.unwrap().to_vec_f64().unwrap(), vec![1.0, 2.0, 3.0]);
        assert!(t.host().exists() && t.host().is_on_device());
        assert!(node_sync(&t).unwrap().holds_host_array());
        assert!(t.host().with(|_| ()).is_none(), "no values on the host");
        assert!(!t.host().holds_initial_zeros());
        assert!(t.debug_info().contains("handed to a device copy"));
        assert_eq!(
            hand_host_array_to_device(&t, |_| Ok(())).unwrap(),
            None,
            "handed once"
        );
        // With no refresh to bring the values back, a host access gives up with a typed
        // error rather than read or write an array without them.
        assert!(matches!(
            t.host().get_values(),
            Err(Error::NotHosted { .. })
        ));
        assert!(t.host().with_mut(|_| Ok(())).is_err());
        assert!(t.host().is_on_device());
        // Made again (zero-filled) by the refresh's own write, which brings the values.
        let mode = t.memory_mode();
        t.host().refill(|_| Ok(())).unwrap();
        assert!(!t.host().is_on_device());
        assert!(!node_sync(&t).unwrap().holds_host_array());
        assert_eq!(
            t.host().with(Ndarray::to_vec_f64).unwrap().unwrap(),
            vec![0.0; 3]
        );
        assert_eq!(t.memory_mode(), mode, "the memory mode stays");
        // A pinned host array stays where it is; the pin's end frees it again.
        let pin = pin_host_array(&t).unwrap();
        assert!(
            hand_host_array_to_device(&t, take).unwrap().is_none(),
            "pinned"
        );
        assert!(!t.host().is_on_device());
        drop(pin);
        assert!(hand_host_array_to_device(&t, take).unwrap().is_some());
        assert!(t.host().is_on_device());
    }
}

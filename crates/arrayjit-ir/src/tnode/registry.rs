//! The registry of live nodes: every node is entered by id when it is made and leaves when its
//! last handle drops (entries are weak, so the registry keeps nothing alive). A node is found
//! by id, and the headers of the live nodes are listed, printed, written or logged.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, Weak};

use super::info::log_at;
use super::{Tnode, TnodeInner, lock};

/// The registry of live nodes by id; entries hold weak references, so they do not keep nodes
/// alive.
pub(super) fn registry() -> MutexGuard<'static, HashMap<usize, Weak<TnodeInner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Weak<TnodeInner>>>> = OnceLock::new();
    lock(REGISTRY.get_or_init(Default::default))
}

/// Finds a live node by id.
pub fn find(id: usize) -> Option<Tnode> {
    registry().get(&id).and_then(Weak::upgrade).map(Tnode)
}

/// Number of live nodes in the registry.
pub fn num_registered() -> usize {
    registry().values().filter(|w| w.strong_count() > 0).count()
}

/// The headers of every live node that `pred` accepts, by id.
pub fn accessible_headers(pred: impl Fn(&Tnode) -> bool) -> Vec<String> {
    let mut nodes: Vec<Tnode> = registry()
        .values()
        .filter_map(|w| w.upgrade().map(Tnode))
        .collect();
    nodes.sort_by_key(Tnode::id);
    nodes
        .iter()
        .filter(|t| pred(t))
        .map(Tnode::header)
        .collect()
}

/// Prints [`accessible_headers`] of every live node `pred` accepts, one per line,
/// on standard output.
pub fn print_accessible_headers(pred: impl Fn(&Tnode) -> bool) {
    let _ = write_accessible_headers(&mut std::io::stdout().lock(), pred);
}

/// Writes [`accessible_headers`] of every live node `pred` accepts to `out`, one per
/// line (what [`print_accessible_headers`] prints).
pub fn write_accessible_headers(
    out: &mut impl std::io::Write,
    pred: impl Fn(&Tnode) -> bool,
) -> std::io::Result<()> {
    for h in accessible_headers(pred) {
        writeln!(out, "{h}")?;
    }
    Ok(())
}

/// Logs [`accessible_headers`] of every live node `pred` accepts at `level`, one
/// event per node (target `arrayjit::tnode`).
pub fn log_accessible_headers(pred: impl Fn(&Tnode) -> bool, level: tracing::Level) {
    for h in accessible_headers(pred) {
        log_at(level, || h);
    }
}

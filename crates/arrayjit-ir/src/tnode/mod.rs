//! Tensor nodes (`Tnode`): identity, label, precision, dims, padding, memory mode with
//! provenance, the host array, a C-safe code name, and the global registry. Nodes over existing
//! host arrays and precisions decided later are in `creation`; what a node says of itself
//! (debug logs, the registry's headers) in `info`; the reference's named questions about
//! memory modes in `modes`. Which device copies hold the latest values is the runtime's
//! business, behind the one seam of `device_copies` ([`DeviceCopies`]): the node only tells
//! it when the host reads or writes.

mod creation;
mod device_copies;
mod host;
mod info;
mod modes;
mod registry;

pub use creation::DelayedPrec;
pub use device_copies::DeviceCopies;
pub use host::{HostArrayMut, HostLock, HostValues};
pub use modes::Modes;
pub use registry::{
    accessible_headers, find, log_accessible_headers, num_registered, print_accessible_headers,
    write_accessible_headers,
};

use registry::registry;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};

use crate::error::{Error, ModeConflict, Result};
use crate::memory::{MemoryMode, ModeWithProvenance};
use crate::ndarray::{Ndarray, Padding};
use crate::prec::Prec;

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// `Ok` unless `dims` has an axis of size zero ([`Error::EmptyDims`], naming the node by its
/// label).
pub(crate) fn check_dims(label: &[&str], dims: &[usize]) -> Result<()> {
    match dims.iter().position(|&d| d == 0) {
        Some(axis) => Err(Error::EmptyDims {
            node: label.join("."),
            dims: dims.to_vec(),
            axis,
        }),
        None => Ok(()),
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the data here is
/// always left consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct TnodeInner {
    id: usize,
    label: Vec<String>,
    /// Fixed at the first use of the precision (see [`DelayedPrec`]).
    prec: OnceLock<Prec>,
    /// The precision the node gets when it is first used, and who asked for it.
    delayed_prec: Mutex<(Prec, String)>,
    dims: Vec<usize>,
    padding: Option<Padding>,
    padded_dims: Vec<usize>,
    left_padding: Vec<usize>,
    /// The name the user chose for generated code ([`Tnode::update_code_name`]), sanitized.
    chosen_code_name: Mutex<Option<String>>,
    memory_mode: Mutex<Option<ModeWithProvenance>>,
    /// The host array: read-locked by host reads and by kernels reading it in place (which
    /// may overlap), write-locked by host writes.
    host: RwLock<Option<Ndarray>>,
    /// Whether any value of the host array may differ from the zeros it was made with: set by
    /// every write through [`host::HostArrayMut`] (the only way to change it), and for a host
    /// array given ready-made or with a non-zero pad value. Changed and read under `host`'s lock.
    host_written: AtomicBool,
    /// The device copies the runtime keeps of the node, once it makes one (see
    /// [`DeviceCopies`]).
    device_copies: OnceLock<Arc<dyn DeviceCopies>>,
    /// Whether the node is one slice of an array, private to each iteration of the loops
    /// around its uses ([`Tnode::new_iteration_private`]). Set only when the node is made.
    iteration_private: AtomicBool,
}

impl Drop for TnodeInner {
    fn drop(&mut self) {
        registry().remove(&self.id);
    }
}

/// A handle to a node that does not keep it alive ([`Tnode::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakTnode(Weak<TnodeInner>);

impl WeakTnode {
    /// The node, if some handle still keeps it alive.
    pub fn upgrade(&self) -> Option<Tnode> {
        self.0.upgrade().map(Tnode)
    }
}

/// A tensor node: one array of the computation. Cloning is cheap and yields the same node.
#[derive(Clone)]
pub struct Tnode(Arc<TnodeInner>);

/// Turns user text into a C identifier fragment: ASCII letters, digits and single underscores,
/// at most 40 characters. The result can never inject anything into generated code.
pub fn sanitize_identifier(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        if c == '_' && (out.is_empty() || out.ends_with('_')) {
            continue;
        }
        out.push(c);
        if out.len() >= 40 {
            break;
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

impl Tnode {
    /// A new node with logical `dims` (every dim positive) and no padding.
    pub fn new(prec: Prec, dims: &[usize], label: &[&str]) -> Result<Tnode> {
        Tnode::build(prec, dims, None, label)
    }

    /// A new node whose stored array surrounds the logical `dims` with `padding`; reads in the
    /// margins see the pad value. Padded nodes are never virtual.
    pub fn new_padded(
        prec: Prec,
        dims: &[usize],
        padding: Padding,
        label: &[&str],
    ) -> Result<Tnode> {
        if padding.axes.len() != dims.len() {
            return Err(Error::ShapeMismatch {
                op: "Tnode::new_padded".into(),
                shapes: vec![],
                detail: format!(
                    "padding has {} axes but dims {dims:?} have {}",
                    padding.axes.len(),
                    dims.len()
                ),
            });
        }
        Tnode::build(prec, dims, Some(padding), label)
    }

    fn build(
        prec: Prec,
        dims: &[usize],
        padding: Option<Padding>,
        label: &[&str],
    ) -> Result<Tnode> {
        Tnode::build_with(DelayedPrec::Specified(prec), dims, padding, label, None)
    }

    /// A node of precision `prec` (fixed now, or on first use), with a host array already
    /// (`host`, whose storage dims must be the padded dims).
    fn build_with(
        prec: DelayedPrec,
        dims: &[usize],
        padding: Option<Padding>,
        label: &[&str],
        host: Option<Ndarray>,
    ) -> Result<Tnode> {
        let (fixed, initial, why) = match prec {
            DelayedPrec::Specified(p) => (Some(p), p, "given when the node was made"),
            DelayedPrec::Default(p) => (None, p, "the node's default, fixed by its first use"),
        };
        check_dims(label, dims)?;
        let padded: Vec<usize> = match &padding {
            Some(p) => p.padded_dims(dims)?,
            None => dims.to_vec(),
        };
        let elems = padded
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(fixed.unwrap_or(Prec::F64).size_in_bytes()))
            .filter(|&b| b <= isize::MAX as usize);
        if elems.is_none() {
            return Err(Error::OutOfMemory {
                what: format!("tensor node {label:?} of dims {dims:?}"),
                bytes: usize::MAX,
            });
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prec = OnceLock::new();
        if let Some(p) = fixed {
            let _ = prec.set(p);
        }
        let inner = Arc::new(TnodeInner {
            id,
            label: label.iter().map(|s| s.to_string()).collect(),
            prec,
            delayed_prec: Mutex::new((initial, why.into())),
            dims: dims.to_vec(),
            left_padding: match &padding {
                Some(p) => p.axes.iter().map(|a| a.left).collect(),
                None => vec![0; dims.len()],
            },
            padding,
            padded_dims: padded,
            chosen_code_name: Mutex::new(None),
            memory_mode: Mutex::new(None),
            host_written: AtomicBool::new(host.is_some()),
            host: RwLock::new(host),
            device_copies: OnceLock::new(),
            iteration_private: AtomicBool::new(false),
        });
        registry().insert(id, Arc::downgrade(&inner));
        Ok(Tnode(inner))
    }

    /// A new local node that holds the slice one iteration of a loop nest works on (the
    /// optimizer's array contraction, `arrayjit_opt::optimize::contract`): every iteration writes all of it
    /// before reading it, so iterations split over workers each need a copy of their own,
    /// which the backends give every worker's share of the iterations
    /// ([`Tnode::is_iteration_private`]). A node made here is never a parameter, hosted or
    /// shared between routines.
    pub fn new_iteration_private(
        prec: Prec,
        dims: &[usize],
        label: &[&str],
        why: &str,
    ) -> Result<Tnode> {
        let tn = Tnode::build(prec, dims, None, label)?;
        tn.0.iteration_private.store(true, Ordering::Relaxed);
        tn.update_memory_mode(MemoryMode::Local, why)?;
        Ok(tn)
    }

    /// Whether the node is private to each iteration of the loops around its uses (made by
    /// [`Tnode::new_iteration_private`]): iterations that run at once on different workers
    /// need a copy each; iterations run in turn may share one.
    pub fn is_iteration_private(&self) -> bool {
        self.0.iteration_private.load(Ordering::Relaxed)
    }

    /// A handle that does not keep the node alive.
    pub fn downgrade(&self) -> WeakTnode {
        WeakTnode(Arc::downgrade(&self.0))
    }

    /// The device copies the runtime keeps of the node, if it made any.
    pub fn device_copies(&self) -> Option<&Arc<dyn DeviceCopies>> {
        self.0.device_copies.get()
    }

    /// The node's device copies, installing `make()`'s when there are none yet (the runtime
    /// does, when it makes the first copy). What is installed lives exactly as long as the
    /// node, so it must not hold the node strongly (use [`Tnode::downgrade`]).
    pub fn device_copies_or_install(
        &self,
        make: impl FnOnce() -> Arc<dyn DeviceCopies>,
    ) -> &Arc<dyn DeviceCopies> {
        self.0.device_copies.get_or_init(make)
    }

    /// The unique id.
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// The label, most general part first.
    pub fn label(&self) -> &[String] {
        &self.0.label
    }

    /// The element precision. For a node whose precision was left to be decided
    /// ([`Tnode::new_delayed_prec`]), this fixes it: [`Tnode::update_prec`] can no longer
    /// change it.
    pub fn prec(&self) -> Prec {
        *self.0.prec.get_or_init(|| lock(&self.0.delayed_prec).0)
    }

    /// The logical dims (without padding).
    pub fn dims(&self) -> &[usize] {
        &self.0.dims
    }

    /// The padding, if the node is padded.
    pub fn padding(&self) -> Option<&Padding> {
        self.0.padding.as_ref()
    }

    /// The dims of the stored array: logical dims plus padding.
    pub fn padded_dims(&self) -> &[usize] {
        &self.0.padded_dims
    }

    /// Left padding per axis (zeros when unpadded).
    pub fn left_padding(&self) -> &[usize] {
        &self.0.left_padding
    }

    /// The position in the stored (padded, row-major) array of the element at logical index
    /// `idcs` (one index per axis), as an affine index over the symbols they use.
    pub fn flat_index(&self, idcs: &[crate::indexing::AxisIndex]) -> crate::indexing::AxisIndex {
        let (dims, left) = (self.padded_dims(), self.left_padding());
        let (mut stride, mut offset) = (1i64, 0i64);
        let mut terms = Vec::new();
        for a in (0..dims.len().min(idcs.len())).rev() {
            let (t, o) = idcs[a].terms();
            terms.extend(t.into_iter().map(|(c, s)| (c * stride, s)));
            offset += (o + left[a] as i64) * stride;
            stride *= dims[a] as i64;
        }
        crate::indexing::AxisIndex::affine(terms, offset)
    }

    /// Number of stored elements (margins included).
    pub fn num_elems(&self) -> usize {
        self.padded_dims().iter().product()
    }

    /// Size of the stored array in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.num_elems() * self.prec().size_in_bytes()
    }

    /// A C identifier for this node: `n<id>_<sanitized label>` (or of the name given to
    /// [`Tnode::update_code_name`]); unique and free of user syntax.
    pub fn code_name(&self) -> String {
        let chosen = lock(&self.0.chosen_code_name).clone();
        let name = chosen.unwrap_or_else(|| sanitize_identifier(&self.0.label.join("_")));
        if name.is_empty() {
            format!("n{}", self.0.id)
        } else {
            format!("n{}_{name}", self.0.id)
        }
    }

    /// A short human name: the label joined by dots, then `#id`.
    pub fn debug_name(&self) -> String {
        if self.0.label.is_empty() {
            format!("#{}", self.0.id)
        } else {
            format!("{}#{}", self.0.label.join("."), self.0.id)
        }
    }

    /// Dims as text, e.g. `"3x4"`, or `"0:3 x 1:4"` with axis numbers; padding is shown as
    /// `+left+right`.
    pub fn dims_to_string(&self, with_axis_numbers: bool) -> String {
        if self.0.dims.is_empty() {
            return "scalar".into();
        }
        let pads = self.padding();
        let parts: Vec<String> = self
            .0
            .dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let pad = pads
                    .map(|p| {
                        let a = p.axes[i];
                        if a.left + a.right > 0 {
                            format!("+{}+{}", a.left, a.right)
                        } else {
                            String::new()
                        }
                    })
                    .unwrap_or_default();
                if with_axis_numbers {
                    format!("{i}:{d}{pad}")
                } else {
                    format!("{d}{pad}")
                }
            })
            .collect();
        parts.join(if with_axis_numbers { " x " } else { "x" })
    }

    /// One line describing the node: name, precision, dims and memory mode with its provenance.
    pub fn header(&self) -> String {
        let mode = match self.memory_mode() {
            Some(m) => m.to_string(),
            None => "memory mode not decided".into(),
        };
        format!(
            "{} {} {}: {}",
            self.debug_name(),
            self.prec(),
            self.dims_to_string(false),
            mode
        )
    }

    /// The memory mode and its provenance, if decided.
    pub fn memory_mode(&self) -> Option<ModeWithProvenance> {
        lock(&self.0.memory_mode).clone()
    }

    /// Requests a memory mode. A refinement of the current mode replaces it, a more abstract
    /// request is already satisfied, two compatible abstract modes meet; a contradiction is a
    /// [`Error::MemoryModeConflict`] naming both modes and why each was asked for. Nothing changes
    /// on error.
    pub fn update_memory_mode(
        &self,
        mode: MemoryMode,
        provenance: impl Into<String>,
    ) -> Result<()> {
        let provenance = provenance.into();
        let mut current = lock(&self.0.memory_mode);
        match current.as_ref() {
            None => {
                *current = Some(ModeWithProvenance { mode, provenance });
                Ok(())
            }
            Some(old) => match old.mode.meet(mode) {
                Some(m) if m == old.mode => Ok(()),
                Some(m) if m == mode => {
                    *current = Some(ModeWithProvenance { mode, provenance });
                    Ok(())
                }
                Some(m) => {
                    let provenance = format!("{}; and {provenance}", old.provenance);
                    *current = Some(ModeWithProvenance {
                        mode: m,
                        provenance,
                    });
                    Ok(())
                }
                None => Err(Error::MemoryModeConflict(Box::new(ModeConflict {
                    node: self.debug_name(),
                    old: old.mode.to_string(),
                    old_provenance: old.provenance.clone(),
                    new: mode.to_string(),
                    new_provenance: provenance,
                }))),
            },
        }
    }

    /// Puts back a memory mode saved with [`Tnode::memory_mode`] (used to undo the decisions
    /// of a failed optimization, so that a failed call changes nothing).
    pub fn restore_memory_mode(&self, saved: Option<ModeWithProvenance>) {
        *lock(&self.0.memory_mode) = saved;
    }
}

impl PartialEq for Tnode {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}
impl Eq for Tnode {}
impl Hash for Tnode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.id.hash(state)
    }
}
impl PartialOrd for Tnode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Tnode {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

impl fmt::Debug for Tnode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.debug_name())
    }
}

impl fmt::Display for Tnode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.debug_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Sharing;

    #[test]
    fn labels_are_sanitized_into_code_names() {
        let t = Tnode::new(Prec::F32, &[2], &["x); system(\"rm -rf /\"); //", "*/"]).unwrap();
        assert!(
            t.code_name()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        );
        assert!(t.code_name().starts_with(&format!("n{}_", t.id())));
        let empty = Tnode::new(Prec::F32, &[2], &["#!?"]).unwrap();
        assert_eq!(empty.code_name(), format!("n{}", empty.id()));
    }

    #[test]
    fn registry_finds_live_nodes_only() {
        let t = Tnode::new(Prec::F32, &[1], &["reg"]).unwrap();
        let id = t.id();
        assert_eq!(find(id).unwrap(), t);
        drop(t);
        assert!(find(id).is_none());
    }

    #[test]
    fn memory_mode_refines_and_reports_conflicts() {
        let t = Tnode::new(Prec::F32, &[1], &["m"]).unwrap();
        t.update_memory_mode(MemoryMode::NeverVirtual, "test: must exist")
            .unwrap();
        t.update_memory_mode(MemoryMode::Materialized, "test: persisted")
            .unwrap();
        t.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: device")
            .unwrap();
        assert_eq!(
            t.memory_mode().unwrap().mode,
            MemoryMode::OnDevice(Sharing::PerStream)
        );
        // More abstract requests are already satisfied.
        t.update_memory_mode(MemoryMode::NeverVirtual, "again")
            .unwrap();
        let err = t
            .update_memory_mode(MemoryMode::Virtual, "test: inline it")
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("test: device") && msg.contains("test: inline it"),
            "{msg}"
        );
        assert_eq!(
            t.memory_mode().unwrap().mode,
            MemoryMode::OnDevice(Sharing::PerStream)
        );
    }

    #[test]
    fn host_values_with_padding_and_points() {
        use crate::ndarray::AxisPadding;
        let pad = Padding {
            axes: vec![AxisPadding { left: 1, right: 0 }, AxisPadding::default()],
            value: 9.0,
        };
        let t = Tnode::new_padded(Prec::F64, &[3, 2], pad, &["pts"]).unwrap();
        t.host()
            .set_values(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .unwrap();
        assert!(t.modes().is_hosted());
        assert_eq!(t.host().get_value(&[0, 1]).unwrap(), 2.0);
        assert_eq!(t.host().array().unwrap().get(&[0, 0]).unwrap(), 9.0);
        assert_eq!(
            t.host().points_2d(None, 0, 1).unwrap(),
            vec![(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
        );
        assert_eq!(t.host().points_1d(Some(0), 2).unwrap(), vec![5.0, 6.0]);
        assert!(t.host().get_value(&[3, 0]).is_err());
        assert_eq!(t.dims_to_string(true), "0:3+1+0 x 1:2");
    }

    #[test]
    fn host_access_on_virtual_node_is_a_conflict() {
        let t = Tnode::new(Prec::F32, &[2], &["v"]).unwrap();
        t.update_memory_mode(MemoryMode::Virtual, "test").unwrap();
        assert!(matches!(
            t.host().set_values(&[1.0, 2.0]),
            Err(Error::MemoryModeConflict(_))
        ));
        assert!(!t.host().exists());
        assert!(Tnode::new(Prec::F32, &[2, 0], &["z"]).is_err());
    }

    #[test]
    fn a_host_array_holds_its_initial_zeros_until_written() {
        use crate::ndarray::AxisPadding;
        let t = Tnode::new(Prec::F32, &[4], &["z"]).unwrap();
        assert!(!t.host().holds_initial_zeros(), "no host array yet");
        t.host().with_mut(|_| Ok(())).unwrap();
        assert!(t.host().holds_initial_zeros(), "made, not written");
        t.host().set_value(&[2], 0.0).unwrap();
        assert!(!t.host().holds_initial_zeros(), "written, even with a zero");
        // Every way of writing counts: whole arrays, fills, bytes.
        type Write = fn(&Tnode);
        let writes: [Write; 4] = [
            |t| t.host().set_values(&[1.0; 4]).unwrap(),
            |t| t.host().fill(|_, out| out.fill(0.0)).unwrap(),
            |t| t.host().set_values_with(|_| 0.0).unwrap(),
            |t| {
                t.host()
                    .with_mut(|nd| {
                        nd.as_bytes_mut()[0] = 1;
                        Ok(())
                    })
                    .unwrap()
            },
        ];
        for write in writes {
            let t = Tnode::new(Prec::F32, &[4], &["w"]).unwrap();
            t.host().with_mut(|_| Ok(())).unwrap();
            write(&t);
            assert!(!t.host().holds_initial_zeros());
        }
        // Margins at a non-zero pad value are not zeros; at zero they are.
        let pad = |value| Padding {
            axes: vec![AxisPadding { left: 1, right: 1 }],
            value,
        };
        let padded = Tnode::new_padded(Prec::F32, &[2], pad(5.0), &["p"]).unwrap();
        padded.host().with_mut(|_| Ok(())).unwrap();
        assert!(!padded.host().holds_initial_zeros());
        let padded = Tnode::new_padded(Prec::F32, &[2], pad(0.0), &["p0"]).unwrap();
        padded.host().with_mut(|_| Ok(())).unwrap();
        assert!(padded.host().holds_initial_zeros());
        // A node made over a given array holds whatever it was given.
        let given = Tnode::from_padded_host_array(
            Ndarray::zeros(Prec::F32, &[3]).unwrap(),
            None,
            &["given"],
        )
        .unwrap();
        assert!(!given.host().holds_initial_zeros());
    }
}

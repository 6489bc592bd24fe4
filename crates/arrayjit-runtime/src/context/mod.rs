//! Contexts: the arrays of a stream, organized as a tree (linking code returns a child context
//! holding whatever the code needs), with host transfers, device-to-device copies through merge
//! buffers, and the bookkeeping that orders them: every array remembers the event of its last
//! writer, and hosted nodes remember which devices hold their latest values.
//!
//! Sharing across the streams of a device is decided at link time when a node's mode leaves
//! it open: a hosted node that a routine only reads is offered to the device's other streams,
//! and when a routine on another stream only reads it too, both use the one array (the mode
//! becomes `Hosted(ChangedOnDevices(SharedCrossStreams))`, with both routines in its
//! provenance); a node a routine writes becomes per stream. Shared arrays follow the same
//! ordering rules as any other (`host_sync`), and may be written from one stream only.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrayjit_backends::array_buffer::typed;
use arrayjit_backends::{BufferHandle, LoweredBackend};
use arrayjit_ir::{Error, MemoryMode, MemoryType, Result, Sharing, Tnode};
use arrayjit_opt::OptimizeCtx;
use arrayjit_opt::optimize::MemoryPlan;

use crate::array_entry::ArrayEntry;
use crate::compile_request::CompileRequest;
use crate::host_sync::fill_new_array;
use crate::node_sync::node_sync;
use crate::scheduler::Event;
use crate::stream::Stream;

mod transfers;

pub use transfers::{ArrayAccess, ScheduledArray};

pub(crate) struct ContextInner {
    id: usize,
    pub(crate) stream: Stream,
    parent: Option<Context>,
    pub(crate) arrays: BTreeMap<Tnode, Arc<ArrayEntry>>,
    pub(crate) merge_node: Option<Tnode>,
    /// The pools this context allocated for its new arrays (ids), and their plan.
    pools: Mutex<Vec<usize>>,
    plan: Option<MemoryPlan>,
    /// What the optimizer learned from the routines compiled for this context tree.
    pub(crate) optimize_ctx: OptimizeCtx,
}

impl Drop for ContextInner {
    /// Frees the context's pools; arrays still used by child contexts or pending work stay
    /// alive until those are done with them.
    fn drop(&mut self) {
        let device = self.stream.device();
        for id in self
            .pools
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = device
                .backend()
                .lowered()
                .runtime()
                .free_pool(device.ordinal(), id);
        }
    }
}

/// The arrays of a stream that code runs on. Cloning is cheap and refers to the same context;
/// arrays are freed when the last context (or pending task) holding them is dropped.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

fn next_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Nodes whose one array per device serves all the device's streams: those shared across
/// streams by their memory mode, and hosted constants (deduplicated per device).
pub(crate) fn is_shared_across_streams(tn: &Tnode) -> bool {
    is_device_constant(tn)
        || matches!(
            tn.memory_mode().map(|m| m.mode),
            Some(MemoryMode::OnDevice(Sharing::SharedCrossStreams))
                | Some(MemoryMode::Hosted(MemoryType::ChangedOnDevices(
                    Sharing::SharedCrossStreams
                )))
        )
}

/// For a hosted node that devices never write (constant, or volatile: changed only from the
/// host), its mode and why it has it.
pub(crate) fn changed_only_from_host(tn: &Tnode) -> Option<String> {
    let m = tn.memory_mode()?;
    match m.mode {
        MemoryMode::Hosted(MemoryType::Constant) => Some(format!(
            "hosted constant (because: {}): constants are shared by all streams of a device and \
             never written there",
            m.provenance
        )),
        MemoryMode::Hosted(MemoryType::Volatile) => Some(format!(
            "hosted volatile (because: {}): volatile nodes change only on the host, reaching \
             devices by from_host",
            m.provenance
        )),
        _ => None,
    }
}

fn is_device_constant(tn: &Tnode) -> bool {
    tn.memory_mode().map(|m| m.mode) == Some(MemoryMode::Hosted(MemoryType::Constant))
}

/// Which node a child context's code reads from its stream's merge buffer
/// ([`Context::make_child`]; the reference's `?merge_buffer_node`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChildMergeNode {
    /// The parent's (none where the parent has none).
    #[default]
    Inherit,
    /// This node, whatever the parent reads.
    Node(Tnode),
    /// None: the child's code reads no merge buffer until a routine linked into it does.
    Nothing,
}

impl Context {
    /// A root context (no arrays) on `stream`, with an empty optimize context.
    pub fn new(stream: &Stream) -> Context {
        Context::with_optimize_ctx(stream, OptimizeCtx::empty())
    }

    /// A root context (no arrays) on `stream` whose routines are compiled in `optimize_ctx`
    /// (the reference's `make_context ?optimize_ctx`): e.g. another context's, so that code
    /// compiled here can inline the virtual nodes routines there computed.
    pub fn with_optimize_ctx(stream: &Stream, optimize_ctx: OptimizeCtx) -> Context {
        Context::root(stream, BTreeMap::new(), optimize_ctx)
    }

    /// A root context on `stream` holding `arrays`.
    fn root(
        stream: &Stream,
        arrays: BTreeMap<Tnode, Arc<ArrayEntry>>,
        optimize_ctx: OptimizeCtx,
    ) -> Context {
        Context {
            inner: Arc::new(ContextInner {
                id: next_id(),
                stream: stream.clone(),
                parent: None,
                arrays,
                merge_node: None,
                pools: Mutex::new(vec![]),
                plan: None,
                optimize_ctx,
            }),
        }
    }

    /// A root context on `stream` holding the given device arrays (the reference's
    /// `make_context ?ctx_arrays`): buffers of the stream's device, one per node, of exactly
    /// the node's size, whose bytes are the node's values. Only nodes without a host array
    /// may come this way (a hosted node's device copy is kept in step with the host by
    /// `from_host`/`to_host`), and not nodes shared across streams. Anything else is an error
    /// and makes no context.
    pub fn with_arrays(
        stream: &Stream,
        arrays: Vec<(Tnode, BufferHandle)>,
        optimize_ctx: OptimizeCtx,
    ) -> Result<Context> {
        let entries = explicit_entries(stream, arrays)?;
        Ok(Context::root(stream, entries, optimize_ctx))
    }

    /// The node's host array as its array on this stream's device, if it is used in place (a
    /// hosted constant or volatile node with a host array, on a backend that does that).
    pub(crate) fn host_in_place_buffer(&self, tn: &Tnode) -> Result<Option<BufferHandle>> {
        if changed_only_from_host(tn).is_none() || !tn.host().exists() {
            return Ok(None);
        }
        self.lowered()
            .runtime()
            .host_memory_buffer(self.inner.stream.device().ordinal(), tn)
    }

    /// The optimize context routines compiled for this context use (shared with its parent and
    /// children unless given otherwise).
    pub fn optimize_ctx(&self) -> &OptimizeCtx {
        &self.inner.optimize_ctx
    }

    /// Compiles on this context's backend ([`crate::backend::Backend::compile`]) in this
    /// context's optimize context, unless the request names another: its routines may read
    /// virtual nodes that routines compiled here before computed.
    pub fn compile<Out>(&self, request: CompileRequest<'_, Out>) -> Result<Out> {
        let request = match request.ctx {
            Some(_) => request,
            None => request.in_context(&self.inner.optimize_ctx),
        };
        self.inner.stream.device().backend().compile(request)
    }

    /// A child context of this one holding the same arrays (the reference's `make_child`),
    /// with another optimize context where given and the merge-buffer node `merge_node` says:
    /// this context's, another, or none. A child reading another node than its parent is safe:
    /// every run checks that the stream's merge buffer holds the node its routine reads
    /// ([`Error::MergeBuffer`] otherwise), and copies into the merge buffer check the
    /// context's node.
    pub fn make_child(
        &self,
        optimize_ctx: Option<OptimizeCtx>,
        merge_node: ChildMergeNode,
    ) -> Result<Context> {
        self.child_with(self.inner.arrays.clone(), optimize_ctx, merge_node)
    }

    /// A child context of this one holding exactly the given device arrays instead of this
    /// context's (the reference's `make_child ?ctx_arrays`), with another optimize context and
    /// merge-buffer node as in [`Context::make_child`]. The arrays are checked as
    /// [`Context::with_arrays`] checks them (the stream's device, the node's size and
    /// precision, no hosted or cross-stream nodes, one per node). On any error no context is
    /// made.
    pub fn make_child_with_arrays(
        &self,
        arrays: Vec<(Tnode, BufferHandle)>,
        optimize_ctx: Option<OptimizeCtx>,
        merge_node: ChildMergeNode,
    ) -> Result<Context> {
        let entries = explicit_entries(&self.inner.stream, arrays)?;
        self.child_with(entries, optimize_ctx, merge_node)
    }

    fn child_with(
        &self,
        arrays: BTreeMap<Tnode, Arc<ArrayEntry>>,
        optimize_ctx: Option<OptimizeCtx>,
        merge_node: ChildMergeNode,
    ) -> Result<Context> {
        let merge = match merge_node {
            ChildMergeNode::Inherit => self.inner.merge_node.clone(),
            ChildMergeNode::Node(tn) => Some(tn),
            ChildMergeNode::Nothing => None,
        };
        let optimize_ctx = optimize_ctx.unwrap_or_else(|| self.inner.optimize_ctx.clone());
        Ok(self.child(arrays, merge, vec![], None, optimize_ctx))
    }

    /// The stream this context's code runs on.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
    }

    /// The context this one was linked from.
    pub fn parent(&self) -> Option<&Context> {
        self.inner.parent.as_ref()
    }

    /// Whether the context holds an array for the node.
    pub fn has(&self, tn: &Tnode) -> bool {
        self.inner.arrays.contains_key(tn)
    }

    /// The nodes the context holds arrays for, by id.
    pub fn nodes(&self) -> Vec<Tnode> {
        self.inner.arrays.keys().cloned().collect()
    }

    /// The node the code of this context reads from the stream's merge buffer, if any.
    pub fn merge_node(&self) -> Option<&Tnode> {
        self.inner.merge_node.as_ref()
    }

    /// A readable description.
    pub fn describe(&self) -> String {
        format!(
            "ctx{} on {} ({} arrays)",
            self.inner.id,
            self.inner.stream.name(),
            self.inner.arrays.len()
        )
    }

    /// The unique id of this context's copy of the node (see
    /// [`crate::NodeSync::copies_not_lagging_host`]).
    pub fn copy_id(&self, tn: &Tnode) -> Result<usize> {
        Ok(self.entry(tn)?.uid)
    }

    /// The device array holding the node in this context (the reference's `ctx_arrays`): it
    /// knows its precision ([`arrayjit_backends::DeviceBuffer::prec`]) and size. For tools that
    /// drive kernels themselves ([`LoweredBackend::compile_source`]): work on it outside this
    /// context is not ordered by its events, so synchronize the stream first
    /// ([`Stream::await_work`]).
    pub fn array(&self, tn: &Tnode) -> Result<BufferHandle> {
        Ok(self.entry(tn)?.buffer.clone())
    }

    /// The event of the last scheduled write of the node in this context.
    pub fn writer_event(&self, tn: &Tnode) -> Result<Event> {
        Ok(self.entry(tn)?.writer_event())
    }

    pub(crate) fn entry(&self, tn: &Tnode) -> Result<&Arc<ArrayEntry>> {
        self.inner
            .arrays
            .get(tn)
            .ok_or_else(|| Error::NodeNotInContext {
                node: tn.debug_name(),
                context: self.describe(),
                routine: "this operation".into(),
            })
    }

    pub(crate) fn lowered(&self) -> Arc<LoweredBackend> {
        self.inner.stream.device().backend().lowered().clone()
    }

    pub(crate) fn child(
        &self,
        arrays: BTreeMap<Tnode, Arc<ArrayEntry>>,
        merge_node: Option<Tnode>,
        pools: Vec<usize>,
        plan: Option<MemoryPlan>,
        optimize_ctx: OptimizeCtx,
    ) -> Context {
        Context {
            inner: Arc::new(ContextInner {
                id: next_id(),
                stream: self.inner.stream.clone(),
                parent: Some(self.clone()),
                arrays,
                merge_node,
                pools: Mutex::new(pools),
                plan,
                optimize_ctx,
            }),
        }
    }

    /// Where the arrays this context allocated live in its pools (printable), if it allocated
    /// any.
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.inner.plan.as_ref()
    }

    /// Frees this context's pools now rather than when it is dropped. Arrays still used by
    /// child contexts or by pending work stay valid until those release them; the memory is
    /// returned when the last of them does.
    pub fn finalize(&self) -> Result<()> {
        let device = self.inner.stream.device();
        let ids: Vec<usize> = self
            .inner
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for id in ids {
            device
                .backend()
                .lowered()
                .runtime()
                .free_pool(device.ordinal(), id)?;
        }
        Ok(())
    }

    /// A new array for the node: shared across the device's streams when its memory mode says
    /// so, initialized from the host when it has a host array, else zeroed (margins of padded
    /// nodes hold the pad value).
    pub(crate) fn new_array(
        &self,
        tn: &Tnode,
        buffer: Option<BufferHandle>,
    ) -> Result<Arc<ArrayEntry>> {
        let device = self.inner.stream.device();
        if let Some(b) = self.host_in_place_buffer(tn)? {
            // `use_host_memory`: a constant or volatile node's host array serves as its array.
            node_sync(tn)?.set_note(format!(
                "{}: its host array, used in place on {}",
                device.backend().name(),
                self.inner.stream.name()
            ));
            let b = typed(
                b,
                tn.prec(),
                &format!("the host array of {}", tn.debug_name()),
            )?;
            return ArrayEntry::host_in_place(tn.clone(), b);
        }
        let shared = is_shared_across_streams(tn);
        if shared && let Some(e) = device.shared_arrays().get(tn) {
            return Ok(e);
        }
        let buffer = match buffer {
            Some(b) => typed(b, tn.prec(), &format!("the array of {}", tn.debug_name()))?,
            None => self.lowered().runtime().alloc_array(
                device.ordinal(),
                tn.prec(),
                tn.size_in_bytes() / tn.prec().size_in_bytes(),
            )?,
        };
        let entry = ArrayEntry::new(tn.clone(), buffer, shared);
        let stream = &self.inner.stream;
        if tn.host().exists() {
            tn.host().prepare_read()?;
            if tn.host().holds_initial_zeros() {
                // The new array is zero-filled too (e.g. an optimizer's moments): it holds the
                // host's values already.
                node_sync(tn)?.mark_copy_up_to_date(entry.uid);
            } else if fill_new_array(stream, &entry, |copy| {
                // The latest values, even if another thread hands the host array over
                // meanwhile.
                match tn.host().with_latest(|nd| copy(nd.as_bytes())) {
                    Ok(copied) => copied,
                    Err(e) => Some(Err(e)),
                }
            })? {
                node_sync(tn)?.mark_copy_up_to_date(entry.uid);
            }
        } else if let Some(p) = tn.padding().filter(|p| p.value != 0.0) {
            let nd = arrayjit_ir::Ndarray::zeros_padded(tn.prec(), tn.dims(), p.clone())?;
            fill_new_array(stream, &entry, |copy| Some(copy(nd.as_bytes())))?;
        }
        if shared {
            device.shared_arrays().insert(tn, &entry)?;
        }
        Ok(entry)
    }
}

/// The entries of explicit arrays given for nodes (see [`Context::with_arrays`]): each checked
/// against its node (not hosted, not shared across streams, the node's size, the stream's
/// device, one array per node) and typed with the node's precision.
fn explicit_entries(
    stream: &Stream,
    arrays: Vec<(Tnode, BufferHandle)>,
) -> Result<BTreeMap<Tnode, Arc<ArrayEntry>>> {
    let device = stream.device().ordinal();
    let mut entries = BTreeMap::new();
    for (tn, buffer) in arrays {
        if tn.host().exists() || tn.modes().is_hosted() || is_shared_across_streams(&tn) {
            return Err(Error::BadValue {
                what: "node given an explicit array".into(),
                value: tn.debug_name(),
                expected: "a node neither hosted nor shared across streams (give those values \
                           with set_values and from_host)"
                    .into(),
            });
        }
        if buffer.device() != device || buffer.size_in_bytes() != tn.size_in_bytes() {
            return Err(Error::ShapeMismatch {
                op: format!("an explicit array of {}", tn.debug_name()),
                shapes: vec![],
                detail: format!(
                    "the node needs {} bytes on device {device}; the buffer has {} bytes on \
                         device {}",
                    tn.size_in_bytes(),
                    buffer.size_in_bytes(),
                    buffer.device()
                ),
            });
        }
        if entries.contains_key(&tn) {
            return Err(Error::BadValue {
                what: "node given an explicit array".into(),
                value: tn.debug_name(),
                expected: "each node at most once".into(),
            });
        }
        let buffer = typed(
            buffer,
            tn.prec(),
            &format!("an explicit array of {}", tn.debug_name()),
        )?;
        entries.insert(tn.clone(), ArrayEntry::new(tn, buffer, false));
    }
    Ok(entries)
}

//! Linking compiled code into a context (the reference's `link` and `link_batch`), in two
//! steps:
//!
//! 1. **Plan** ([`LinkPlan`]): everything a link can refuse is checked — the merge buffer,
//!    writes of nodes that change only on the host, inputs the context lacks, writes of arrays
//!    another stream writes, memory the device cannot give (its free memory and the backend's
//!    memory limit, `Device::check_memory`) — and every array the routine needs is decided:
//!    kept from the context, a device constant or host array used in place, taken from
//!    another stream that only reads it too (sharing inference), or new: made of the node's
//!    host array itself where the device's memory is the host's and devices change the node
//!    (rule 6 of `host_sync`: no copy, no new memory), else packed into pools. Planning
//!    allocates nothing and changes nothing.
//! 2. **Apply**, in two halves:
//!    - *make*: the plan's pools are allocated under a [`PoolGuard`] that frees them if
//!      anything later fails or the link is abandoned, and the new arrays are made (filled
//!      from their host arrays, or made of them under a [`HandedOver`] guard that gives
//!      them back to the host if the link fails or is abandoned);
//!    - *commit*, which needs the compiled code: the backend and the stream's scratch are
//!      checked, the writes of shared arrays are claimed for this stream, and only then, when
//!      nothing else can fail, the sharing decisions are recorded in the nodes' memory modes
//!      (read on two streams and written by neither: shared across streams; written here: per
//!      stream). A failed link leaves nothing behind.
//!
//! Planning and making need only the optimized routine, not its compiled code:
//! [`Context::prepare_link`] does them (e.g. on another thread while the routine compiles, so
//! that filling a large model's parameters overlaps the compiler), and [`PreparedLink::finish`]
//! commits with the code. [`Context::link`] is both at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use arrayjit_backends::LoweredBackend;
use arrayjit_ir::{Error, MemoryMode, MemoryType, Result, Sharing, Tnode};
use arrayjit_opt::Optimized;
use arrayjit_opt::optimize::{MemoryPlan, PlanItem};

use crate::array_entry::{ArrayEntry, SharingCandidate};
use crate::code::Code;
use crate::context::{Context, changed_only_from_host, is_shared_across_streams};
use crate::node_sync::node_sync;
use crate::routine::Routine;

fn shared_written_elsewhere(routine: &str, tn: &Tnode) -> Error {
    let why = tn
        .memory_mode()
        .map_or_else(String::new, |m| format!(" (because: {})", m.provenance));
    Error::WriteRefused {
        routine: routine.into(),
        node: tn.debug_name(),
        reason: format!(
            "which is shared across streams{why} and already written from another stream; shared \
             nodes may be written from one stream only (request per-stream sharing, \
             `update_memory_sharing(Sharing::PerStream, ..)`, before linking to write it from \
             several)"
        ),
    }
}

/// Whether the node's memory mode leaves open whether its device arrays are shared across
/// streams (and it has device arrays).
fn sharing_undecided(tn: &Tnode) -> bool {
    matches!(
        tn.memory_mode().map(|m| m.mode),
        Some(
            MemoryMode::OnDevice(Sharing::Unset)
                | MemoryMode::Hosted(
                    MemoryType::Unset
                        | MemoryType::Nonconstant
                        | MemoryType::ChangedOnDevices(Sharing::Unset)
                )
        )
    )
}

/// Whether a routine with these inputs and outputs only reads the node, a hosted node whose
/// sharing is undecided: its array may be offered to, or taken from, another stream.
fn read_only_shareable(tn: &Tnode, inputs: &[Tnode], outputs: &[Tnode]) -> bool {
    inputs.contains(tn) && !outputs.contains(tn) && tn.host().exists() && sharing_undecided(tn)
}

/// A context's arrays by node.
type ContextArrays = BTreeMap<Tnode, Arc<ArrayEntry>>;

/// The new arrays a link offers to the device's other streams (sharing inference).
type Offers = Vec<(Tnode, Weak<ArrayEntry>)>;

/// What linking one code into one context will do, decided before anything is allocated.
struct LinkPlan {
    /// The merge buffer's node of the child context.
    merge_node: Option<Tnode>,
    inputs: Vec<Tnode>,
    outputs: Vec<Tnode>,
    /// Arrays taken from another stream that only reads them too, with its offer.
    promoted: BTreeMap<Tnode, (Arc<ArrayEntry>, SharingCandidate)>,
    /// New arrays to make of their nodes' host arrays, handed over (rule 6 of `host_sync`):
    /// in no pool, and no new memory.
    adopted: BTreeSet<Tnode>,
    /// Where the other new arrays go: their pools and places in them.
    memory: MemoryPlan,
    /// Each pool's memory mode, where all its arrays share one.
    pool_modes: Vec<Option<MemoryMode>>,
    alignment: usize,
}

/// Pools allocated by a link in progress: freed when dropped, unless the link completes and
/// hands them to its context ([`PoolGuard::keep`]).
struct PoolGuard {
    lowered: Arc<LoweredBackend>,
    device: usize,
    ids: Vec<usize>,
}

impl PoolGuard {
    /// The pools, now owned by the caller.
    fn keep(mut self) -> Vec<usize> {
        std::mem::take(&mut self.ids)
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        for &id in &self.ids {
            let _ = self.lowered.runtime().free_pool(self.device, id);
        }
    }
}

/// The nodes whose host arrays a link in progress handed to its new arrays: given back when
/// dropped (each host array made again from its array, by the pending refresh that the
/// handing over installed), unless the link completes ([`HandedOver::keep`]). A refresh that
/// fails stays pending, so the values stay in the array until the host reads them.
#[derive(Default)]
struct HandedOver(Vec<Tnode>);

impl HandedOver {
    /// The arrays stay the host's values' home.
    fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for HandedOver {
    fn drop(&mut self) {
        for tn in &self.0 {
            let _ = tn.host().prepare_read();
        }
    }
}

/// The arrays of one routine made ahead of its link ([`Context::prepare_link`]): the pools
/// and new arrays a link of the routine into the context needs, filled from their host
/// arrays. [`PreparedLink::finish`] links the routine's compiled code with them; dropping it
/// instead frees them and leaves the context and every memory mode as they were.
///
/// The arrays start with what the host arrays held when they were made; a host array
/// written after [`Context::prepare_link`] reaches the routine as after any link: its array
/// then lags the host, and the routine uploads the host's values before reading them (rule 4
/// of `host_sync`).
pub struct PreparedLink {
    context: Context,
    optimized: Arc<Optimized>,
    plan: LinkPlan,
    arrays: ContextArrays,
    offers: Offers,
    pools: PoolGuard,
    handed_over: HandedOver,
}

impl std::fmt::Debug for PreparedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PreparedLink({} into {}: {} new pools)",
            self.optimized.name,
            self.context.describe(),
            self.pools.ids.len()
        )
    }
}

impl PreparedLink {
    /// The routine the arrays were made for.
    pub fn routine_name(&self) -> &str {
        &self.optimized.name
    }

    /// Bytes of the pools made for the routine's new arrays.
    pub fn new_pool_bytes(&self) -> usize {
        self.plan
            .memory
            .pool_sizes
            .iter()
            .fold(0usize, |a, &b| a.saturating_add(b))
    }

    /// Links `code` into a child of the context the arrays were made in, with those arrays
    /// (the second half of [`Context::link`], with the same checks and errors). `code` must be
    /// the compiled form of the very routine given to [`Context::prepare_link`] (the same
    /// [`Optimized`], compiled by [`crate::Backend::compile`] of a
    /// [`crate::CompileRequest::optimized`]), else
    /// [`Error::PreparedLinkMismatch`]. A failed finish frees the arrays and changes no memory
    /// mode.
    pub fn finish(self, code: &Code) -> Result<Routine> {
        if !Arc::ptr_eq(&self.optimized, &code.optimized) {
            return Err(Error::PreparedLinkMismatch {
                prepared: self.optimized.name.clone(),
                given: code.optimized.name.clone(),
            });
        }
        let new_pool_bytes = self.new_pool_bytes();
        let PreparedLink {
            context,
            optimized,
            plan,
            arrays,
            offers,
            pools,
            handed_over,
        } = self;
        context.commit_link(code, &optimized, &plan, &arrays, offers)?;
        let memory = (!plan.memory.slots.is_empty()).then_some(plan.memory);
        let routine = Routine::new(
            context.child(
                arrays,
                plan.merge_node,
                pools.keep(),
                memory,
                context.inner.optimize_ctx.clone(),
            ),
            code.clone(),
            new_pool_bytes,
        )?;
        handed_over.keep();
        Ok(routine)
    }
}

impl Context {
    /// Links compiled code into a child of this context, allocating every array the code needs
    /// that this context lacks (see [`Context::init_from_host`] for how they start). An array the
    /// code reads before writing that is neither here nor hosted is [`Error::NodeNotInContext`];
    /// code reading a merge buffer of another node than this context's is an error; a routine
    /// of a second stream writing an array shared across streams is an error. A failed link
    /// allocates nothing and changes no memory mode (see the module's steps).
    pub fn link(&self, code: &Code) -> Result<Routine> {
        // Another backend's code is refused before anything is made for it.
        self.check_backend(code)?;
        self.prepare_link(&code.optimized)?.finish(code)
    }

    /// [`Error::WrongBackend`] unless `code` was compiled for this context's backend.
    fn check_backend(&self, code: &Code) -> Result<()> {
        let backend = self.inner.stream.device().backend();
        if code.backend_name != backend.name() {
            return Err(Error::WrongBackend {
                code_backend: code.backend_name.clone(),
                context_backend: backend.name().into(),
            });
        }
        Ok(())
    }

    /// The first half of [`Context::link`], which needs only the optimized routine
    /// ([`crate::Backend::optimize_in`]): every check that does not need the compiled code,
    /// then the pools and new arrays of the link, filled from their host arrays. Run it while
    /// the routine compiles ([`crate::Backend::compile`] of a
    /// [`crate::CompileRequest::optimized`], e.g. on another thread)
    /// and [`PreparedLink::finish`] with the code: the arrays' allocation and filling (for a
    /// large model on a CPU device, mostly the system's first touch of the memory) then
    /// overlaps the compiler. Errors as [`Context::link`]'s; on error nothing is left behind.
    pub fn prepare_link(&self, optimized: &Arc<Optimized>) -> Result<PreparedLink> {
        let plan = self.plan_link(optimized)?;
        let (arrays, offers, pools, handed_over) = self.make_link_arrays(optimized, &plan)?;
        Ok(PreparedLink {
            context: self.clone(),
            optimized: optimized.clone(),
            plan,
            arrays,
            offers,
            pools,
            handed_over,
        })
    }

    /// Links a batch of codes (the reference's `link_batch`): each into a child of the context
    /// the one before was linked into, so later routines find the arrays earlier ones made;
    /// empty slots stay empty. Returns the last context and the routines. A failed link leaves
    /// nothing behind: the routines linked before it are dropped, with their pools.
    pub fn link_batch(&self, codes: &[Option<Code>]) -> Result<(Context, Vec<Option<Routine>>)> {
        let mut ctx = self.clone();
        let mut routines = Vec::with_capacity(codes.len());
        for code in codes {
            match code {
                Some(code) => {
                    let r = ctx.link(code)?;
                    ctx = r.context().clone();
                    routines.push(Some(r));
                }
                None => routines.push(None),
            }
        }
        Ok((ctx, routines))
    }

    /// Step 1: the checks and decisions of a link, without allocating or changing anything.
    fn plan_link(&self, opt: &Optimized) -> Result<LinkPlan> {
        let stream = &self.inner.stream;
        let merge_node = match (&self.inner.merge_node, &opt.merge_node) {
            (Some(have), Some(want)) if have != want => {
                return Err(Error::MergeBuffer {
                    detail: format!(
                        "routine {} reads the merge buffer as {}, but {} uses it for {}; link it \
                         into another context",
                        opt.name,
                        want.debug_name(),
                        self.describe(),
                        have.debug_name()
                    ),
                });
            }
            (have, want) => want.clone().or_else(|| have.clone()),
        };
        let inputs = opt.inputs();
        let outputs = opt.outputs();
        let device = stream.device();
        let backend = device.backend();
        // Whether or not this context holds them already.
        for tn in &outputs {
            if let Some(why) = changed_only_from_host(tn) {
                return Err(Error::WriteRefused {
                    routine: opt.name.clone(),
                    node: tn.debug_name(),
                    reason: format!(
                        "whose memory mode is {why}; write it on the host and copy it with \
                         from_host, or make it hosted nonconstant to compute it on devices"
                    ),
                });
            }
        }
        let my_stream = stream.inner.id;
        let mut fresh = Vec::new();
        let mut promoted = BTreeMap::new();
        for tn in opt.materialized_nodes() {
            if self.inner.arrays.contains_key(&tn) {
                continue;
            }
            if inputs.contains(&tn) && !tn.host().exists() && !is_shared_across_streams(&tn) {
                return Err(Error::NodeNotInContext {
                    node: tn.debug_name(),
                    context: self.describe(),
                    routine: format!("routine {}", opt.name),
                });
            }
            if is_shared_across_streams(&tn) || self.host_in_place_buffer(&tn)?.is_some() {
                continue;
            }
            let offered = (read_only_shareable(&tn, &inputs, &outputs))
                .then(|| device.shared_arrays().candidate(&tn))
                .flatten()
                .filter(|(_, c)| c.stream != my_stream);
            match offered {
                Some(found) => {
                    promoted.insert(tn, found);
                }
                None => fresh.push(tn),
            }
        }
        for tn in outputs.iter().filter(|tn| is_shared_across_streams(tn)) {
            let existing = self
                .inner
                .arrays
                .get(tn)
                .cloned()
                .or_else(|| device.shared_arrays().get(tn));
            let writer =
                existing.and_then(|e| *e.writing_stream.lock().unwrap_or_else(|e| e.into_inner()));
            if writer.is_some_and(|w| w != my_stream) {
                return Err(shared_written_elsewhere(&opt.name, tn));
            }
        }
        // Arrays made of their host arrays (rule 6 of `host_sync`) need no new memory.
        let (adopted, fresh): (Vec<Tnode>, Vec<Tnode>) =
            fresh.into_iter().partition(|tn| self.adopts_host_array(tn));
        let adopted: BTreeSet<Tnode> = adopted.into_iter().collect();
        // What the link will allocate, checked against what the device may still give before
        // anything is allocated or packed (the pools add only alignment and guards to it; the
        // stream's scratch, which the compiled code says, is checked when the link commits).
        let needed = fresh
            .iter()
            .fold(0usize, |sum, tn| sum.saturating_add(tn.size_in_bytes()));
        if needed > 0 {
            device.check_memory(needed, || linking_what(&opt.name, &fresh))?;
        }
        let alignment = backend.optimize_settings().pool_alignment;
        let items: Vec<PlanItem> = fresh
            .iter()
            .map(|tn| PlanItem {
                node: tn.clone(),
                size: tn.size_in_bytes(),
                lifetime: None,
            })
            .collect();
        let memory = MemoryPlan::pack_guarded(
            &items,
            alignment,
            backend
                .max_pool_bytes()
                .min(backend.lowered().runtime().max_allocation_bytes()),
            backend.lowered().runtime().pool_guard_bytes(),
        )?;
        let mut pool_modes: Vec<Option<Option<MemoryMode>>> = vec![None; memory.pool_sizes.len()];
        for tn in &fresh {
            if let Some(slot) = memory.slot(tn) {
                let mode = tn.memory_mode().map(|m| m.mode);
                let common = &mut pool_modes[slot.pool];
                *common = match *common {
                    None => Some(mode),
                    Some(m) if m == mode => Some(m),
                    Some(_) => Some(None),
                };
            }
        }
        Ok(LinkPlan {
            merge_node,
            inputs,
            outputs,
            promoted,
            adopted,
            memory,
            pool_modes: pool_modes.into_iter().map(Option::flatten).collect(),
            alignment,
        })
    }

    /// Whether the node's new array here is to be made of its host array (rule 6 of
    /// `host_sync`): the runtime does that, the node is one that devices change, and its host
    /// array exists and is not handed over already.
    fn adopts_host_array(&self, tn: &Tnode) -> bool {
        self.lowered().runtime().adopts_host_arrays()
            && matches!(
                tn.memory_mode().map(|m| m.mode),
                Some(MemoryMode::Hosted(MemoryType::ChangedOnDevices(_)))
            )
            && tn.host().exists()
            && !tn.host().is_on_device()
    }

    /// Step 2, first half: allocates and makes what the plan decided; returns the child's
    /// arrays, the arrays to offer to other streams, the pools (freed when the guard is
    /// dropped) and the host arrays handed over (given back when that guard is dropped).
    /// Every error frees the pools allocated so far and gives the host arrays back; nothing
    /// here changes a memory mode or what other streams see.
    fn make_link_arrays(
        &self,
        opt: &Optimized,
        plan: &LinkPlan,
    ) -> Result<(ContextArrays, Offers, PoolGuard, HandedOver)> {
        let stream = &self.inner.stream;
        let device = stream.device();
        let backend = device.backend();
        let lowered = self.lowered();
        let mut pools = PoolGuard {
            lowered: lowered.clone(),
            device: device.ordinal(),
            ids: Vec::new(),
        };
        for (k, &size) in plan.memory.pool_sizes.iter().enumerate() {
            let id = backend.new_pool_id();
            lowered.runtime().alloc_pool_for(
                device.ordinal(),
                id,
                size,
                plan.alignment,
                plan.pool_modes.get(k).copied().flatten(),
            )?;
            pools.ids.push(id);
            if plan.memory.guard_bytes > 0 {
                lowered.runtime().guard_pool(
                    device.ordinal(),
                    id,
                    &plan.memory.unused_ranges(k),
                )?;
            }
        }
        let mut arrays = self.inner.arrays.clone();
        let mut offers = Vec::new();
        let mut handed_over = HandedOver::default();
        for tn in opt.materialized_nodes() {
            if arrays.contains_key(&tn) {
                continue;
            }
            let entry = match plan.promoted.get(&tn) {
                Some((shared, _)) => shared.clone(),
                None => {
                    let view = match plan.memory.slot(&tn) {
                        Some(slot) => {
                            let pool = pools.ids[slot.pool];
                            node_sync(&tn)?.set_note(format!(
                                "{}: linked by routine {} on {}: bytes {}..{} of pool {pool}",
                                backend.name(),
                                opt.name,
                                stream.name(),
                                slot.offset,
                                slot.offset + slot.size,
                            ));
                            Some(lowered.runtime().pool_view(
                                device.ordinal(),
                                pool,
                                slot.offset,
                                slot.size,
                            )?)
                        }
                        None => None,
                    };
                    let e = if plan.adopted.contains(&tn) {
                        self.adopted_array(&tn, opt, &mut handed_over)?
                    } else {
                        self.new_array(&tn, view)?
                    };
                    if read_only_shareable(&tn, &plan.inputs, &plan.outputs) {
                        offers.push((tn.clone(), Arc::downgrade(&e)));
                    }
                    e
                }
            };
            arrays.insert(tn, entry);
        }
        Ok((arrays, offers, pools, handed_over))
    }

    /// The node's new array made of its host array (rule 6 of `host_sync`), recorded in
    /// `handed_over`; where the host array cannot be handed over after all (another thread
    /// took it meanwhile), an array of the device's own, filled from the host.
    fn adopted_array(
        &self,
        tn: &Tnode,
        opt: &Optimized,
        handed_over: &mut HandedOver,
    ) -> Result<Arc<ArrayEntry>> {
        let stream = &self.inner.stream;
        match crate::host_sync::adopt_host_array(stream, tn)? {
            Some(entry) => {
                handed_over.0.push(tn.clone());
                node_sync(tn)?.set_note(format!(
                    "{}: its host array, handed to {} by routine {} (no copy; the host array is                      made again at the host's next read)",
                    stream.device().backend().name(),
                    stream.name(),
                    opt.name,
                ));
                Ok(entry)
            }
            None => {
                stream.device().check_memory(tn.size_in_bytes(), || {
                    format!("linking routine {}", opt.name)
                })?;
                self.new_array(tn, None)
            }
        }
    }

    /// Step 2, second half: with the compiled code, checks its backend and makes the stream's
    /// scratch, then claims the writes of shared arrays for this stream and records the
    /// link's sharing decisions (the last steps, once nothing else can fail).
    fn commit_link(
        &self,
        code: &Code,
        opt: &Optimized,
        plan: &LinkPlan,
        arrays: &ContextArrays,
        offers: Offers,
    ) -> Result<()> {
        let stream = &self.inner.stream;
        let device = stream.device();
        let my_stream = stream.inner.id;
        self.check_backend(code)?;
        // The scratch the kernel's interface asks for (a backend may hold more locals there
        // than the CPU's plan: the CUDA kernels keep every local node in it).
        let scratch_bytes = code.interface()?.scratch_bytes;
        let growth = stream.scratch_growth(scratch_bytes);
        if growth > 0 {
            device.check_memory(growth, || {
                let scratch: Vec<Tnode> =
                    opt.scratch.slots.iter().map(|s| s.node.clone()).collect();
                linking_what(&opt.name, &scratch).replacen(
                    "its largest new arrays",
                    "its scratch, whose largest arrays are",
                    1,
                )
            })?;
        }
        stream.ensure_scratch(scratch_bytes, plan.alignment)?;
        // The device state the batch keeps of its own (wgpu's locals), made once.
        code.batch.link()?;
        // The writes of shared arrays: checked for every array, then claimed for this stream.
        let shared_written: Vec<(&Tnode, &Arc<ArrayEntry>)> = arrays
            .iter()
            .filter(|(tn, e)| e.shared.load(Ordering::Relaxed) && plan.outputs.contains(tn))
            .collect();
        for (tn, entry) in &shared_written {
            let writer = *entry
                .writing_stream
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if writer.is_some_and(|s| s != my_stream) {
                return Err(shared_written_elsewhere(&opt.name, tn));
            }
        }
        for (_, entry) in &shared_written {
            *entry
                .writing_stream
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(my_stream);
        }
        // The sharing decisions this link makes, once nothing else can fail.
        for (tn, entry) in offers {
            device.shared_arrays().offer(
                &tn,
                SharingCandidate {
                    entry,
                    stream: my_stream,
                    stream_name: stream.name(),
                    routine: opt.name.clone(),
                },
            );
        }
        for (tn, (entry, offer)) in &plan.promoted {
            tn.modes().update_sharing(
                Sharing::SharedCrossStreams,
                &format!(
                    "runtime: read by routine {} on {} and by routine {} on {}, written by \
                     neither",
                    offer.routine,
                    offer.stream_name,
                    opt.name,
                    stream.name()
                ),
            )?;
            entry.shared.store(true, Ordering::Relaxed);
            device.shared_arrays().insert(tn, entry)?;
            device.shared_arrays().withdraw(tn);
        }
        for tn in plan.outputs.iter().filter(|tn| sharing_undecided(tn)) {
            tn.modes().update_sharing(
                Sharing::PerStream,
                &format!(
                    "runtime: routine {} writes it on {}",
                    opt.name,
                    stream.name()
                ),
            )?;
            device.shared_arrays().withdraw(tn);
        }
        Ok(())
    }
}

/// What a link that needs memory for `fresh` arrays is doing, for an out-of-memory error: the
/// routine, and its three largest new arrays with their sizes (where the memory goes: an
/// attention's `[batch, heads, T, T]` scores, a vocabulary-wide logits array).
fn linking_what(routine: &str, fresh: &[Tnode]) -> String {
    let mut largest: Vec<&Tnode> = fresh.iter().collect();
    largest.sort_by_key(|t| std::cmp::Reverse(t.size_in_bytes()));
    let named: Vec<String> = largest
        .iter()
        .take(3)
        .map(|t| {
            format!(
                "{} {:?} ({})",
                t.debug_name(),
                t.dims(),
                arrayjit_ir::error::human_bytes(t.size_in_bytes())
            )
        })
        .collect();
    if named.is_empty() {
        format!("linking routine {routine}")
    } else {
        format!(
            "linking routine {routine} (its largest new arrays: {})",
            named.join(", ")
        )
    }
}

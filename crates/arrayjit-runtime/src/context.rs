//! Contexts: the arrays of a stream, organized as a tree (linking code returns a child context
//! holding whatever the code needs), with host transfers and device-to-device copies.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrayjit_backends::BufferHandle;
use arrayjit_ir::{Error, Result, Tnode};

use crate::routine::{Code, Routine};
use crate::stream::Stream;

struct ContextInner {
    id: usize,
    stream: Stream,
    parent: Option<Context>,
    arrays: BTreeMap<Tnode, BufferHandle>,
}

/// The arrays of a stream that code runs on. Cloning is cheap and refers to the same context.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Where [`Context::device_to_device`] puts the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeBufferUse {
    /// Into the destination context's own array of the node.
    No,
    /// Into the destination stream's merge buffer, for code that reads `node.merge`.
    Copy,
}

fn next_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Context {
    /// A root context (no arrays) on `stream`.
    pub fn new(stream: &Stream) -> Context {
        Context {
            inner: Arc::new(ContextInner {
                id: next_id(),
                stream: stream.clone(),
                parent: None,
                arrays: BTreeMap::new(),
            }),
        }
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

    /// A readable description.
    pub fn describe(&self) -> String {
        format!(
            "ctx{} on {} ({} arrays)",
            self.inner.id,
            self.inner.stream.name(),
            self.inner.arrays.len()
        )
    }

    pub(crate) fn buffer(&self, tn: &Tnode) -> Result<&BufferHandle> {
        self.inner
            .arrays
            .get(tn)
            .ok_or_else(|| Error::NodeNotInContext {
                node: tn.debug_name(),
                context: self.describe(),
                routine: "this operation".into(),
            })
    }

    fn lowered(&self) -> &Arc<dyn arrayjit_backends::LoweredBackend> {
        self.inner.stream.device().backend().lowered()
    }

    /// Links compiled code into a child of this context, allocating every array the code needs
    /// that this context lacks. Hosted arrays are initialized from the host; other arrays the
    /// code writes start zeroed (margins of padded nodes hold the pad value). An array the code
    /// reads before writing that is neither here nor hosted is [`Error::NodeNotInContext`].
    pub fn link(&self, code: &Code) -> Result<Routine> {
        if code.backend_name != self.inner.stream.device().backend().name() {
            return Err(Error::invalid(format!(
                "code compiled for backend {} cannot be linked into a context of {}",
                code.backend_name,
                self.inner.stream.device().backend().name()
            )));
        }
        let opt = code.optimized();
        let inputs = opt.inputs();
        let mut arrays = self.inner.arrays.clone();
        let device = self.inner.stream.device().ordinal();
        for tn in opt.materialized_nodes() {
            if arrays.contains_key(&tn) {
                continue;
            }
            let host = tn.with_host(|nd| nd.as_bytes().to_vec());
            if inputs.contains(&tn) && host.is_none() {
                return Err(Error::NodeNotInContext {
                    node: tn.debug_name(),
                    context: self.describe(),
                    routine: format!("routine {}", opt.name),
                });
            }
            let buffer = self.lowered().alloc_zeroed(device, tn.size_in_bytes())?;
            match host {
                Some(bytes) => self.lowered().copy_from_host(&buffer, &bytes)?,
                None => {
                    if let Some(p) = tn.padding().filter(|p| p.value != 0.0) {
                        let nd =
                            arrayjit_ir::Ndarray::zeros_padded(tn.prec(), tn.dims(), p.clone())?;
                        self.lowered().copy_from_host(&buffer, nd.as_bytes())?;
                    }
                }
            }
            arrays.insert(tn, buffer);
        }
        let child = Context {
            inner: Arc::new(ContextInner {
                id: next_id(),
                stream: self.inner.stream.clone(),
                parent: Some(self.clone()),
                arrays,
            }),
        };
        Ok(Routine::new(child, code.clone()))
    }

    /// Copies the node's host array into this context's array.
    pub fn from_host(&self, tn: &Tnode) -> Result<()> {
        let buffer = self.buffer(tn)?;
        let bytes = tn
            .with_host(|nd| nd.as_bytes().to_vec())
            .ok_or_else(|| Error::NotHosted {
                node: tn.debug_name(),
                detail:
                    "from_host copies the host array to the device; set the node's values first"
                        .into(),
            })?;
        let _guard = self.inner.stream.lock_exec();
        self.lowered().copy_from_host(buffer, &bytes)
    }

    /// Copies this context's array of the node into its host array (created if needed, which
    /// requires the node's memory mode to allow hosting).
    pub fn to_host(&self, tn: &Tnode) -> Result<()> {
        let buffer = self.buffer(tn)?;
        let _guard = self.inner.stream.lock_exec();
        tn.with_host_mut(|nd| self.lowered().copy_to_host(buffer, nd.as_bytes_mut()))
    }

    /// Copies the node's array from context `src` into this context: into this context's own
    /// array ([`MergeBufferUse::No`]) or into this stream's merge buffer
    /// ([`MergeBufferUse::Copy`]), which code reading `node.merge` then sees.
    pub fn device_to_device(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse,
        src: &Context,
    ) -> Result<()> {
        let src_buffer = src.buffer(tn)?.clone();
        let lowered = self.lowered();
        match into_merge_buffer {
            MergeBufferUse::No => {
                let dst = self.buffer(tn)?;
                let _guards = self.stream().lock_exec_pair(src.stream());
                lowered.copy_buffer(dst, &src_buffer)
            }
            MergeBufferUse::Copy => {
                let device = self.inner.stream.device().ordinal();
                // Lock order everywhere: stream execution locks, then the merge buffer.
                let _guards = self.stream().lock_exec_pair(src.stream());
                let mut merge = self
                    .inner
                    .stream
                    .inner
                    .merge
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let reuse = merge
                    .as_ref()
                    .filter(|(_, b)| b.size_in_bytes() == tn.size_in_bytes())
                    .map(|(_, b)| b.clone());
                let dst = match reuse {
                    Some(b) => b,
                    None => lowered.alloc_zeroed(device, tn.size_in_bytes())?,
                };
                lowered.copy_buffer(&dst, &src_buffer)?;
                *merge = Some((tn.clone(), dst));
                Ok(())
            }
        }
    }
}

//! Device-to-device transfers between contexts ([`Context::device_to_device`]): into the
//! destination's array, into its stream's merge buffer, or streamed to a routine that reads
//! the source's array as its merge buffer — ordered by the arrays' events like routine runs
//! (see `host_sync`).

use std::sync::Arc;

use arrayjit_ir::{Error, Result, Tnode};

use crate::array_entry::Access;
use crate::context::Context;
use crate::node_sync::node_sync;
use crate::routine::Routine;
use crate::scheduler::TaskLabel;
use crate::stream::MergeContents;

/// Where [`Context::device_to_device`] puts the node's values.
#[derive(Clone, Copy, Debug)]
pub enum MergeBufferUse<'a> {
    /// Into the destination context's own array of the node.
    No,
    /// Into the destination stream's merge buffer (grown as needed), for code reading
    /// `node.merge`.
    Copy,
    /// No copy: the given routine (linked on the destination's stream) reads the source's
    /// array directly as its merge buffer; it is scheduled right away, and the source's stream
    /// does not overwrite the array until it has run.
    StreamingFor(&'a Routine),
}

impl Context {
    /// Moves the node's values from context `src` (another stream or device) to this context,
    /// after `src`'s last write of the node: into this context's array, into this stream's
    /// merge buffer, or streamed to a routine (see [`MergeBufferUse`]). The source's stream will
    /// not overwrite the node until the transfer has happened.
    pub fn device_to_device(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse<'_>,
        src: &Context,
    ) -> Result<()> {
        let src_entry = src.entry(tn)?.clone();
        let stream = &self.inner.stream;
        let lowered = self.lowered();
        match into_merge_buffer {
            MergeBufferUse::No => {
                let dst = self.entry(tn)?.clone();
                if Arc::ptr_eq(&dst, &src_entry)
                    || (dst.is_host_in_place() && src_entry.is_host_in_place())
                {
                    // One array, or the node's host array used in place by both: nothing to copy.
                    return Ok(());
                }
                if dst.is_host_in_place() {
                    return Err(Error::HostArrayInPlace {
                        node: tn.debug_name(),
                        action: format!("copying into {}'s array of", self.describe()),
                    });
                }
                src_entry.order(stream, Access::Read)?;
                dst.order(stream, Access::Write)?;
                let (d, s, q) = (dst.buffer.clone(), src_entry.buffer.clone(), stream.queue());
                stream.schedule(
                    // SAFETY: ordered above as a read of the source and a write of the
                    // destination, and recorded as such below (host_sync rules 2 and 3).
                    Box::new(move || unsafe {
                        lowered.runtime().copy_buffer(&d, &s, q.as_deref())
                    }),
                    TaskLabel::Copy("device-to-device copy", tn.size_in_bytes()),
                )?;
                src_entry.record(stream.all_work(), Access::Read);
                dst.record(stream.all_work(), Access::Write);
                // A copy of a hosted node's latest values is itself up to date.
                let sync = node_sync(tn)?;
                if sync.copy_not_lagging(src_entry.uid) {
                    sync.mark_copy_up_to_date(dst.uid);
                }
            }
            MergeBufferUse::Copy => {
                if let Some(m) = &self.inner.merge_node
                    && m != tn
                {
                    return Err(Error::MergeBuffer {
                        detail: format!(
                            "{} reads the merge buffer as {}, not {}; copy into a context whose code reads {}",
                            self.describe(),
                            m.debug_name(),
                            tn.debug_name(),
                            tn.debug_name()
                        ),
                    });
                }
                src_entry.order(stream, Access::Read)?;
                let mut merge = stream.merge_lock();
                // Copies land only in the stream's own buffer, never in a streamed source array.
                let dst = stream.own_merge_buffer(&mut merge, tn)?;
                let (d, s, q) = (dst.clone(), src_entry.buffer.clone(), stream.queue());
                stream.schedule(
                    // SAFETY: ordered above as a read of the source, recorded below; the
                    // destination is the stream's own merge buffer (never another context's
                    // array, see `MergeSlot`), used only by this stream's work in order.
                    Box::new(move || unsafe {
                        lowered.runtime().copy_buffer(&d, &s, q.as_deref())
                    }),
                    TaskLabel::Copy("copy into the merge buffer", tn.size_in_bytes()),
                )?;
                src_entry.record(stream.all_work(), Access::Read);
                merge.current = Some(MergeContents {
                    node: tn.clone(),
                    buffer: dst,
                    streamed_from: None,
                });
            }
            MergeBufferUse::StreamingFor(routine) => {
                if !routine.context().stream().same_as(stream) {
                    return Err(Error::WrongStream {
                        what: format!("routine {}", routine.name()),
                        stream: routine.context().stream().name(),
                        expected: format!(
                            "the stream of {}, which streams its merge buffer",
                            self.describe()
                        ),
                    });
                }
                // The run orders itself after the source's writer and records its read (see
                // `MergeSlot`).
                stream.merge_lock().current = Some(MergeContents {
                    node: tn.clone(),
                    buffer: src_entry.buffer.clone(),
                    streamed_from: Some(src_entry.clone()),
                });
                routine.run()?;
            }
        }
        // The source's stream will not overwrite the node before this read: a writer waits for
        // pending readers (see `host_sync`).
        Ok(())
    }
}

//! Data parallelism: a batch split across N streams (on one or several devices). Each shard
//! runs the gradient routine on its part of the batch; gradients are summed by a tree reduction
//! through merge buffers (log₂ N rounds of device-to-device copies, each round in parallel);
//! the update runs once, on shard 0; the new parameters are broadcast back to every shard.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, Error, Operand, Projections, Result, ResultExt, Tnode, UnOp,
};

use crate::backend::Backend;
use crate::code::Code;
use crate::compile_request::CompileRequest;
use crate::context::Context;
use crate::device_transfer::MergeBufferUse;
use crate::routine::Routine;
use crate::stream::Stream;

/// One shard: its gradient routine and, per gradient node, the routine adding the merge buffer
/// into it.
struct Shard {
    grad: Routine,
    merges: Vec<Routine>,
}

/// Runs one training step over N shards; see the module documentation.
pub struct DataParallel {
    shards: Vec<Shard>,
    update: Routine,
    grads: Vec<Tnode>,
    params: Vec<Tnode>,
}

impl DataParallel {
    /// Links `grad_code` into a context on each stream (one shard per stream), the merge
    /// routines for `grads`, and `update_code` after shard 0's gradients. `grads` are the
    /// nodes the gradient routine writes and the update reads; `params` the nodes the update
    /// writes and the gradient routine reads.
    pub fn new(
        backend: &Backend,
        streams: &[Stream],
        grad_code: &Code,
        update_code: &Code,
        grads: &[Tnode],
        params: &[Tnode],
    ) -> Result<DataParallel> {
        if streams.is_empty() {
            return Err(Error::invalid("data parallelism needs at least one stream"));
        }
        let written = grad_code.optimized().outputs();
        if let Some(g) = grads.iter().find(|g| !written.contains(g)) {
            return Err(Error::NoGradient {
                node: g.debug_name(),
                detail: format!(
                    "it is listed as a gradient but routine {} does not compute it on the device",
                    grad_code.name()
                ),
            });
        }
        let merge_programs: Vec<Assignments> = grads
            .iter()
            .map(|g| Assignments::Accum {
                initialize_neutral: false,
                accum: BinOp::Add,
                lhs: g.clone(),
                rhs: AccumRhs::Unop(UnOp::Identity, Operand::Merge(g.clone())),
                projections: Projections::pointwise(g.dims(), 1),
            })
            .collect();
        let names: Vec<String> = grads
            .iter()
            .map(|g| format!("merge_{}", g.debug_name()))
            .collect();
        let batch: Vec<(&str, &Assignments)> = names
            .iter()
            .map(String::as_str)
            .zip(merge_programs.iter())
            .collect();
        let merge_codes = if batch.is_empty() {
            vec![]
        } else {
            backend.compile(CompileRequest::batch(&batch))?
        };
        let mut shards = Vec::with_capacity(streams.len());
        for (i, stream) in streams.iter().enumerate() {
            let shard_context = || {
                format!(
                    "linking shard {i} of {} on {}",
                    streams.len(),
                    stream.name()
                )
            };
            let grad = Context::new(stream)
                .link(grad_code)
                .context(shard_context)?;
            let merges = merge_codes
                .iter()
                .map(|c| grad.context().link(c))
                .collect::<Result<Vec<_>>>()
                .context(shard_context)?;
            shards.push(Shard { grad, merges });
        }
        let update = shards[0]
            .grad
            .context()
            .link(update_code)
            .context(|| format!("linking the update {} after shard 0", update_code.name()))?;
        Ok(DataParallel {
            shards,
            update,
            grads: grads.to_vec(),
            params: params.to_vec(),
        })
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// The gradient routine of shard `i` (e.g. to bind its batch index).
    pub fn grad_routine(&self, i: usize) -> Option<&Routine> {
        self.shards.get(i).map(|s| &s.grad)
    }

    /// The update routine (on shard 0).
    pub fn update_routine(&self) -> &Routine {
        &self.update
    }

    /// One step: gradients on every shard, tree reduction into shard 0, update, broadcast.
    /// Work is scheduled on the shards' streams; events order it, nothing here blocks except
    /// on full queues.
    pub fn step(&self) -> Result<()> {
        for s in &self.shards {
            s.grad.run()?;
        }
        let n = self.shards.len();
        let mut stride = 1;
        while stride < n {
            for i in (0..n).step_by(2 * stride) {
                let j = i + stride;
                if j >= n {
                    continue;
                }
                for (k, g) in self.grads.iter().enumerate() {
                    let dst = &self.shards[i].merges[k];
                    dst.context().device_to_device(
                        g,
                        MergeBufferUse::Copy,
                        self.shards[j].grad.context(),
                    )?;
                    dst.run()?;
                }
            }
            stride *= 2;
        }
        self.update.run()?;
        let src = self.update.context();
        for s in &self.shards[1..] {
            for p in &self.params {
                s.grad
                    .context()
                    .device_to_device(p, MergeBufferUse::No, src)?;
            }
        }
        Ok(())
    }

    /// Waits for every shard's stream; returns the first error.
    pub fn await_all(&self) -> Result<()> {
        for s in &self.shards {
            s.grad.context().stream().await_work()?;
        }
        Ok(())
    }
}

//! Routines: code linked into a context, with static-index bindings.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrayjit_backends::{BufferHandle, LaunchRequest};
use arrayjit_ir::{Error, Result, StaticSymbol, Tnode};

use crate::array_entry::{Access, ArrayEntry};
use crate::code::Code;
use crate::context::Context;
use crate::host_sync::device_changed_hosted;
use crate::node_sync::node_sync;
use crate::observe::{self, RoutineMemory, RoutineStats, RunStats};
use crate::scheduler::TaskLabel;
use crate::statement_profile::StatementProfile;

/// Code linked into a context: run it with [`Routine::run`] after binding its static indices.
pub struct Routine {
    context: Context,
    code: Code,
    statics: Mutex<Vec<Option<i64>>>,
    /// The kernel's array arguments, resolved once at link time.
    args: Vec<Arg>,
    /// The routine's name, shared by the labels of its runs.
    label: Arc<str>,
    /// Its runs so far.
    stats: Arc<RoutineStats>,
    /// The memory it holds while it runs.
    memory: RoutineMemory,
}

/// One array argument of the kernel and how the routine uses it.
struct Arg {
    node: Tnode,
    entry: Arc<ArrayEntry>,
    input: bool,
    output: bool,
}

impl fmt::Debug for Routine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Routine({} in {:?})", self.code.name(), self.context)
    }
}

/// The `ARRAYJIT_DEBUG >= 2` line of one run: its routine, stream and time (`how`: where it was
/// timed, or that it failed).
fn list_run(label: &str, stream: &str, took: std::time::Duration, how: &str) {
    eprintln!(
        "arrayjit: ran {label} on {stream}: {:.3} ms{how}",
        took.as_secs_f64() * 1e3
    );
}

impl Routine {
    /// The routine of `code` linked into `context`, whose link allocated pools of
    /// `new_pool_bytes` in all.
    pub(crate) fn new(context: Context, code: Code, new_pool_bytes: usize) -> Result<Routine> {
        let n = code.optimized.bindings.len();
        let (inputs, outputs) = (code.optimized.inputs(), code.optimized.outputs());
        // The arrays in the kernel's own argument order.
        let args = code
            .interface()?
            .args
            .iter()
            .cloned()
            .map(|tn| {
                Ok(Arg {
                    entry: context.entry(&tn)?.clone(),
                    input: inputs.contains(&tn),
                    output: outputs.contains(&tn),
                    node: tn,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut memory = RoutineMemory {
            new_pools: new_pool_bytes,
            scratch: code.interface()?.scratch_bytes,
            ..RoutineMemory::default()
        };
        for arg in &args {
            memory.arrays = memory
                .arrays
                .saturating_add(arg.entry.buffer.size_in_bytes());
            // A hosted node has (or gets, at its first read on the host) a host array of its
            // stored size, unless its device array is that host array.
            let hosted = arg.node.host().exists() || arg.node.modes().is_hosted();
            if hosted && !arg.entry.uses_host_memory() {
                memory.host = memory.host.saturating_add(arg.node.size_in_bytes());
            }
        }
        observe::list_linked(code.name(), || context.stream().name(), &memory);
        Ok(Routine {
            label: Arc::from(code.name()),
            memory,
            context,
            code,
            statics: Mutex::new(vec![None; n]),
            args,
            stats: Arc::default(),
        })
    }

    /// How many times the routine was scheduled to run, and how long its timed runs took (runs
    /// are timed while [`crate::observe::set_run_timing`] is on, a trace is recorded, or
    /// `ARRAYJIT_DEBUG` is 2 or more; on backends with device queues, the time to enqueue).
    pub fn stats(&self) -> RunStats {
        RunStats {
            memory: self.memory,
            ..self.stats.snapshot()
        }
    }

    /// The routine's name.
    pub fn name(&self) -> &str {
        self.code.name()
    }

    /// The context the routine was linked into (a child of the one `link` was called on).
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The compiled code.
    pub fn code(&self) -> &Code {
        &self.code
    }

    /// Where the routine's runs since this was last asked spent their time, statement by
    /// statement, with each statement's work (see [`crate::statement_profile`]); the counters
    /// start again from zero. Await the stream first so that the runs have finished. `None`
    /// unless the routine was compiled to time its statements
    /// (`OptimizeSettings::profile_statements`, or `ARRAYJIT_DEBUG` 2 or more) on a backend
    /// that can (the C backends).
    pub fn statement_profile(&self) -> Option<StatementProfile> {
        let counters = self.code.batch.statement_times(self.code.index)?;
        Some(StatementProfile::of(&self.code.optimized, &counters))
    }

    /// The static symbols this routine is run with.
    pub fn bindings(&self) -> &[StaticSymbol] {
        &self.code.optimized.bindings
    }

    /// Materialized nodes the routine reads before writing.
    pub fn inputs(&self) -> Vec<Tnode> {
        self.code.optimized.inputs()
    }

    /// Materialized nodes the routine writes.
    pub fn outputs(&self) -> Vec<Tnode> {
        self.code.optimized.outputs()
    }

    /// Binds a static index for the next runs; the value must be in `0..range`.
    pub fn set_static(&self, symbol: &StaticSymbol, value: i64) -> Result<()> {
        let pos = self
            .bindings()
            .iter()
            .position(|s| s.symbol == symbol.symbol)
            .ok_or_else(|| Error::StaticIndex {
                symbol: symbol.name.clone(),
                detail: format!("routine {} does not use this static index", self.name()),
            })?;
        if value < 0 || value >= symbol.range as i64 {
            return Err(Error::StaticIndex {
                symbol: symbol.name.clone(),
                detail: format!("value {value} is outside 0..{}", symbol.range),
            });
        }
        self.statics.lock().unwrap_or_else(|e| e.into_inner())[pos] = Some(value);
        Ok(())
    }

    /// Schedules one run on the context's stream (with the `Sync` scheduler it runs now).
    ///
    /// Before the run, hosted inputs whose host values changed since this device last saw
    /// them are copied to the device, and arrays last written by another stream are waited
    /// for. After it, every array the routine writes records the run as its writer, and hosted
    /// outputs are brought to the host automatically when the host next reads them.
    pub fn run(&self) -> Result<()> {
        let statics = self.static_values()?;
        let stream = self.context.stream();
        let mut args: Vec<BufferHandle> = Vec::with_capacity(self.args.len() + 2);
        for arg in &self.args {
            let tn = &arg.node;
            // A copy lagging the host, or whose last write failed (e.g. a skipped upload), is
            // refreshed from the host (which fails in turn if the host awaits that copy).
            let stale =
                !node_sync(tn)?.copy_not_lagging(arg.entry.uid) || arg.entry.writer_failed();
            if arg.input && tn.host().exists() && stale {
                self.refresh_from_host(tn, &arg.entry)?;
            }
            arg.entry.order(stream, Access::of(arg.input, arg.output))?;
            args.push(arg.entry.buffer.clone());
        }
        let interface = self.code.interface()?;
        let mut streamed_from = None;
        if let Some(m) = &interface.merge {
            let merge = stream.merge_lock();
            match merge.current.as_ref() {
                Some(held) if &held.node == m => {
                    if let Some(src) = &held.streamed_from {
                        // Reading a source's array directly: ordered like any read of it.
                        src.order(stream, Access::Read)?;
                        streamed_from = Some(src.clone());
                    }
                    args.push(held.buffer.clone());
                }
                other => {
                    return Err(Error::MergeBuffer {
                        detail: format!(
                            "routine {} reads the merge buffer as {}, but it holds {}; copy the node \
                             with device_to_device(.., MergeBufferUse::Copy, ..) first",
                            self.name(),
                            m.debug_name(),
                            other.map_or("nothing".into(), |h| h.node.debug_name())
                        ),
                    });
                }
            }
        }
        if interface.scratch_bytes > 0 {
            let scratch = stream.scratch().ok_or_else(|| Error::Runtime {
                stream: stream.name(),
                detail: "the routine needs a scratch pool but the stream has none (a defect of \
                         arrayjit: linking gives every stream that runs such a routine one)"
                    .into(),
            })?;
            args.push(scratch);
        }
        let (batch, index, queue) = (self.code.batch.clone(), self.code.index, stream.queue());
        // Both launches below are sound: every argument was ordered above (`order`: after the
        // array's last writer and, for a write, its pending readers) and is recorded below as
        // read or written by this run, so later accesses wait for it (host_sync rules 2 and
        // 3); a streamed merge buffer is ordered as a read of its source; the stream's own
        // merge buffer and scratch pool are used only by this stream's work, in its order.
        self.stats.scheduled();
        let task: crate::scheduler::Task = if observe::run_timing() {
            let (stats, label) = (self.stats.clone(), self.label.clone());
            let listing = observe::lists_runs().then(|| stream.name());
            let optimized = self.code.optimized.clone();
            Box::new(move || {
                let started = Instant::now();
                // The device's own time, where the backend reads it (a GPU's timestamps).
                let sink: arrayjit_backends::DeviceTimeSink = {
                    let (stats, label, listing) = (stats.clone(), label.clone(), listing.clone());
                    Box::new(move |took: std::time::Duration| {
                        stats.record_on_device(took);
                        if let Some(stream) = listing {
                            list_run(&label, &stream, took, " on the device");
                        }
                    })
                };
                let request = LaunchRequest::new(index, &args, &statics)
                    .on(queue.as_deref())
                    .timed(sink);
                // SAFETY: the arguments are ordered as the comment above says.
                let result = unsafe { batch.launch(request) };
                if result.as_ref().is_ok_and(|&on_device| on_device) {
                    return Ok(());
                }
                let took = started.elapsed();
                stats.record(took, result.is_ok());
                if let Some(stream) = listing {
                    let how = if result.is_ok() { "" } else { " (failed)" };
                    list_run(&label, &stream, took, how);
                    // A kernel that times its statements: the slowest of this run.
                    if let Some(counters) = batch.statement_times(index) {
                        eprintln!(
                            "arrayjit:   {}",
                            StatementProfile::of(&optimized, &counters)
                        );
                    }
                }
                result.map(|_| ())
            })
        } else {
            // Untimed: no clock reads.
            Box::new(move || {
                let request = LaunchRequest::new(index, &args, &statics).on(queue.as_deref());
                // SAFETY: the arguments are ordered as the comment above says.
                unsafe { batch.launch(request) }.map(|_| ())
            })
        };
        stream.schedule(task, TaskLabel::Named("routine", self.label.clone()))?;
        let done = stream.all_work();
        if let Some(src) = streamed_from {
            src.record(done.clone(), Access::Read);
        }
        for arg in &self.args {
            arg.entry
                .record(done.clone(), Access::of(arg.input, arg.output));
            if arg.output && arg.node.modes().is_hosted() {
                device_changed_hosted(stream, &arg.entry)?;
            }
        }
        Ok(())
    }

    /// Brings a copy lagging the host up to date before a run: only the elements the host
    /// changed (`HostValues::set_value`) when they are at most half of the array and the copy's last
    /// write did not fail, else the whole array.
    fn refresh_from_host(&self, tn: &Tnode, entry: &ArrayEntry) -> Result<()> {
        if !entry.writer_failed()
            && let Some(ranges) = node_sync(tn)?.copy_lagging_ranges(entry.uid)
        {
            let lagging: usize = ranges.iter().map(|(s, e)| e - s).sum();
            if !ranges.is_empty() && lagging <= tn.num_elems() / 2 {
                for (start, end) in ranges {
                    self.context.from_host_range(tn, start..end)?;
                }
                return Ok(());
            }
        }
        self.context.from_host(tn)
    }

    fn static_values(&self) -> Result<Vec<i64>> {
        let values = self.statics.lock().unwrap_or_else(|e| e.into_inner());
        values
            .iter()
            .zip(self.bindings())
            .map(|(v, s)| {
                v.ok_or_else(|| Error::StaticIndex {
                    symbol: s.name.clone(),
                    detail: format!(
                        "routine {} needs a value for it; call set_static first",
                        self.name()
                    ),
                })
            })
            .collect()
    }
}

//! [`ProcessGroup`]: rank, world size and the collectives, on host bytes of any precision and
//! on a context's arrays as stream work.

use std::sync::Arc;

use arrayjit_ir::{Error, Prec, Result, Tnode};
use arrayjit_runtime::{ArrayAccess, Context, Stream};

use crate::engine::{Engine, Single};

/// How an all-reduce combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The sum divided by the world size (integer types: truncated toward zero).
    Mean,
}

/// How this process was started, from the launcher's environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchKind {
    /// Not by an MPI launcher: a job of one process.
    Alone,
    /// By an MPI launcher, as one of `size` processes.
    Launched {
        /// The world size the launcher announced.
        size: usize,
        /// Which variable said so (`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `PMIX_SIZE`).
        variable: &'static str,
    },
}

impl LaunchKind {
    /// Reads the variables OpenMPI (`OMPI_COMM_WORLD_SIZE`), MPICH/Hydra and Slurm
    /// (`PMI_SIZE`) and PMIx (`PMIX_SIZE`) launchers set.
    pub fn detect() -> LaunchKind {
        LaunchKind::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`LaunchKind::detect`] over variables from `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> LaunchKind {
        for variable in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"] {
            if let Some(size) = lookup(variable).and_then(|v| v.trim().parse().ok()) {
                return LaunchKind::Launched { size, variable };
            }
        }
        LaunchKind::Alone
    }
}

/// What to install and build for MPI.
#[cfg_attr(feature = "mpi", allow(dead_code))]
const HOW_TO_ENABLE: &str = "build with `--features mpi` (needs an MPI library and libclang: \
                             `apt-get install libopenmpi-dev openmpi-bin libclang-dev`) and start \
                             the processes with `mpirun -np N`";

/// This process's place among the processes of a job, and the collectives between them (see
/// the crate documentation). Cheap to clone; every clone is the same group.
#[derive(Clone)]
pub struct ProcessGroup {
    engine: Arc<dyn Engine>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup({}, rank {} of {})",
            self.engine.name(),
            self.rank(),
            self.size()
        )
    }
}

impl ProcessGroup {
    /// A job of one process (rank 0 of 1): every collective leaves values as they are.
    pub fn single() -> ProcessGroup {
        ProcessGroup {
            engine: Arc::new(Single),
        }
    }

    /// MPI's world, initialized once per process: an error saying how to enable it in a build
    /// without the `mpi` feature.
    pub fn mpi() -> Result<ProcessGroup> {
        #[cfg(feature = "mpi")]
        {
            Ok(ProcessGroup {
                engine: Arc::new(crate::engine::mpi_engine::Mpi::init()?),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            Err(Error::BackendUnavailable {
                backend: "mpi".into(),
                reason: "this build of arrayjit has no MPI support".into(),
                how_to_enable: HOW_TO_ENABLE.into(),
            })
        }
    }

    /// The group this process was started in: MPI's world when an MPI launcher started it
    /// ([`LaunchKind::detect`]), else a job of one process. Started by a launcher in a build
    /// without MPI, an error saying how to enable it (never a silent single-process run).
    pub fn from_env() -> Result<ProcessGroup> {
        ProcessGroup::from_launch(LaunchKind::detect())
    }

    /// [`ProcessGroup::from_env`] for a given launch.
    pub fn from_launch(launch: LaunchKind) -> Result<ProcessGroup> {
        match launch {
            LaunchKind::Alone => Ok(ProcessGroup::single()),
            LaunchKind::Launched { size, variable } => ProcessGroup::mpi().map_err(|e| match e {
                Error::BackendUnavailable { how_to_enable, .. } => Error::BackendUnavailable {
                    backend: "mpi".into(),
                    reason: format!(
                        "an MPI launcher started this process as one of {size} ({variable}), \
                             but this build has no MPI support"
                    ),
                    how_to_enable,
                },
                other => other,
            }),
        }
    }

    /// This process's rank, from 0.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.engine.size()
    }

    /// The engine: `mpi` or `single process`.
    pub fn engine_name(&self) -> &str {
        self.engine.name()
    }

    /// `Ok` when `root` is a rank of the group.
    fn check_root(&self, root: usize) -> Result<()> {
        if root < self.size() {
            Ok(())
        } else {
            Err(self.error(
                "broadcast",
                format!("root {root} is not a rank (0..{})", self.size()),
            ))
        }
    }

    /// An error of this rank's collective.
    fn error(&self, what: &str, detail: String) -> Error {
        Error::invalid(format!(
            "{what} on rank {} of {}: {detail}",
            self.rank(),
            self.size()
        ))
    }

    /// Combines `bytes` (elements of `prec`, native-endian) over every rank by `op`, in place;
    /// every rank gets the same bits. f16 and bf16 are widened to f32, reduced, and rounded
    /// back once. Every rank must call it with the same precision and length.
    pub fn all_reduce(&self, bytes: &mut [u8], prec: Prec, op: ReduceOp) -> Result<()> {
        if !bytes.len().is_multiple_of(prec.size_in_bytes()) {
            return Err(self.error(
                "all-reduce",
                format!(
                    "{} bytes are not whole {} elements",
                    bytes.len(),
                    prec.name()
                ),
            ));
        }
        let n = self.size();
        match prec {
            Prec::F16 | Prec::Bf16 => {
                let mut wide: Vec<f32> = bytes
                    .chunks_exact(2)
                    .map(|c| {
                        let b = [c[0], c[1]];
                        match prec {
                            Prec::F16 => half::f16::from_ne_bytes(b).to_f32(),
                            _ => half::bf16::from_ne_bytes(b).to_f32(),
                        }
                    })
                    .collect();
                self.engine
                    .all_reduce_sum(bytemuck::cast_slice_mut(&mut wide), Prec::F32)?;
                for (c, v) in bytes.chunks_exact_mut(2).zip(wide) {
                    let v = if op == ReduceOp::Mean {
                        v / n as f32
                    } else {
                        v
                    };
                    let b = match prec {
                        Prec::F16 => half::f16::from_f32(v).to_ne_bytes(),
                        _ => half::bf16::from_f32(v).to_ne_bytes(),
                    };
                    c.copy_from_slice(&b);
                }
                Ok(())
            }
            _ => {
                self.engine.all_reduce_sum(bytes, prec)?;
                if op == ReduceOp::Mean && n > 1 {
                    divide(bytes, prec, n);
                }
                Ok(())
            }
        }
    }

    /// [`ProcessGroup::all_reduce`] of f32 values.
    pub fn all_reduce_f32(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        self.all_reduce(bytemuck::cast_slice_mut(values), Prec::F32, op)
    }

    /// [`ProcessGroup::all_reduce`] of f64 values.
    pub fn all_reduce_f64(&self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        self.all_reduce(bytemuck::cast_slice_mut(values), Prec::F64, op)
    }

    /// Replaces `bytes` on every rank with rank `root`'s. Every rank must call it with the
    /// same length.
    pub fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        self.check_root(root)?;
        self.engine.broadcast(bytes, root)
    }

    /// Waits until every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.engine.barrier()
    }

    /// Sets how long a collective may wait for the other ranks (default 300 s, or
    /// `ARRAYJIT_DIST_TIMEOUT_SECS`). Past it, the rank says on stderr which collective did
    /// not complete and aborts the job (MPI_Abort): a rank that died, failed or stopped
    /// calling collectives never leaves the others hanging. A blocked MPI call cannot be
    /// cancelled, so the surviving ranks end with that message rather than return an error.
    pub fn set_timeout(&self, timeout: std::time::Duration) {
        self.engine.set_timeout(timeout);
    }

    /// Schedules an all-reduce of the node's array in `ctx` on stream `on` (a communication
    /// stream of the same device, or the context's own): it starts after the array's last
    /// writer, later work on the array waits for it, and a hosted node's host copy refreshes
    /// from the result when next read. On CPU backends the array's own bytes are reduced (no
    /// copy to the host); elsewhere through a host copy. Returns once scheduled; errors of the
    /// collective come back from the stream (`await_work`, or the next work that waits for it).
    pub fn all_reduce_array(
        &self,
        ctx: &Context,
        tn: &Tnode,
        on: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        let (group, prec) = (self.clone(), tn.prec());
        ctx.schedule_on_array(tn, on, ArrayAccess::ReadWrite, "all-reduce", move |array| {
            array.update(|bytes| group.all_reduce(bytes, prec, op))
        })
    }

    /// Schedules replacing the node's array in `ctx` with rank `root`'s, on stream `on` (see
    /// [`ProcessGroup::all_reduce_array`]).
    pub fn broadcast_array(
        &self,
        ctx: &Context,
        tn: &Tnode,
        on: &Stream,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let group = self.clone();
        ctx.schedule_on_array(tn, on, ArrayAccess::ReadWrite, "broadcast", move |array| {
            array.update(|bytes| group.broadcast(bytes, root))
        })
    }

    /// A debug check that every rank holds the same values of `nodes` (their host arrays,
    /// brought up to date): a hash of them is compared across ranks; an error names the ranks
    /// that differ from rank 0.
    pub fn check_identical(&self, nodes: &[Tnode]) -> Result<()> {
        let mut hasher = blake3::Hasher::new();
        for tn in nodes {
            let hashed = tn.host().with_latest(|nd| {
                hasher.update(nd.as_bytes());
            })?;
            if hashed.is_none() {
                return Err(self.error(
                    "checking parameters",
                    format!("{} has no host array", tn.debug_name()),
                ));
            }
        }
        let mine = *hasher.finalize().as_bytes();
        let mut root = mine;
        self.broadcast(&mut root, 0)?;
        // Count the ranks that differ, so every rank learns whether any does.
        let mut differ = [u32::from(root != mine)];
        self.all_reduce(
            bytemuck::cast_slice_mut(&mut differ),
            Prec::U32,
            ReduceOp::Sum,
        )?;
        if differ[0] > 0 {
            return Err(self.error(
                "checking parameters",
                format!(
                    "{} rank(s) hold other values than rank 0{}",
                    differ[0],
                    if root != mine {
                        ", this one among them"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(())
    }
}

/// Divides summed elements by `n` in place (integers truncate toward zero).
fn divide(bytes: &mut [u8], prec: Prec, n: usize) {
    macro_rules! each {
        ($t:ty) => {
            for c in bytes.chunks_exact_mut(std::mem::size_of::<$t>()) {
                let v = <$t>::from_ne_bytes(c.try_into().expect("element size"));
                c.copy_from_slice(&(v / n as $t).to_ne_bytes());
            }
        };
    }
    match prec {
        Prec::U8 => each!(u8),
        Prec::U16 => each!(u16),
        Prec::I32 => each!(i32),
        Prec::U32 => each!(u32),
        Prec::I64 => each!(i64),
        Prec::U64 => each!(u64),
        Prec::F32 => each!(f32),
        _ => each!(f64),
    }
}

//! All-reduce bandwidth of arrayjit's collectives next to raw MPI on the same buffers, in the
//! same run: `MPI_Allreduce` from a send buffer into a receive buffer (rsmpi), arrayjit's
//! `ProcessGroup::all_reduce` (in place on host bytes), and `all_reduce_array` (a collective on
//! a context's array, scheduled as stream work and awaited).
//!
//! Run: `cargo build --release --features mpi --example allreduce_bandwidth` then
//! `mpirun -np 2 target/release/examples/allreduce_bandwidth`.

use std::time::Instant;

use arrayjit_dist::{ProcessGroup, ReduceOp};
use arrayjit_ir::{Prec, Tnode};
use arrayjit_opt::OptimizeCtx;
use mpi::collective::SystemOperation;
use mpi::traits::*;

/// The median of `reps` timings of `f` (seconds), each started after a barrier.
fn median(group: &ProcessGroup, reps: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            group.barrier().unwrap();
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() -> arrayjit_ir::Result<()> {
    let group = ProcessGroup::mpi()?;
    let n = group.size() as f64;
    let backend = arrayjit_runtime::backend("sync_cc")?;
    let stream = backend.get_device(0)?.new_stream()?;
    if group.rank() == 0 {
        println!(
            "all-reduce (sum) of f32 on {} ranks; GB/s = bytes / time; bus GB/s = 2(N-1)/N × that",
            group.size()
        );
        println!(
            "| size | raw MPI | ProcessGroup::all_reduce | all_reduce_array | ratio (array / raw) |"
        );
        println!("|---|---|---|---|---|");
    }
    for &elems in &[1usize << 10, 1 << 16, 1 << 20, 1 << 24] {
        let bytes = elems * 4;
        let reps = if bytes >= 16 << 20 { 7 } else { 31 };
        let send = vec![1.0f32; elems];
        let mut recv = vec![0.0f32; elems];
        let world = mpi::topology::SimpleCommunicator::world();
        let raw = median(&group, reps, || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
        });
        let mut values = vec![1.0f32; elems];
        let in_place = median(&group, reps, || {
            group.all_reduce_f32(&mut values, ReduceOp::Sum).unwrap();
        });
        let tn = Tnode::new(Prec::F32, &[elems], &["g"])?;
        let array = backend
            .lowered()
            .runtime()
            .alloc_array(0, Prec::F32, elems)?;
        let ctx = arrayjit_runtime::Context::with_arrays(
            &stream,
            vec![(tn.clone(), array)],
            OptimizeCtx::empty(),
        )?;
        let as_work = median(&group, reps, || {
            group
                .all_reduce_array(&ctx, &tn, &stream, ReduceOp::Sum)
                .unwrap();
            stream.await_work().unwrap();
        });
        if group.rank() == 0 {
            let gbs = |t: f64| bytes as f64 / t / 1e9;
            let bus = 2.0 * (n - 1.0) / n;
            println!(
                "| {} KiB | {:.2} GB/s (bus {:.2}) | {:.2} GB/s | {:.2} GB/s | {:.2} |",
                bytes / 1024,
                gbs(raw),
                bus * gbs(raw),
                gbs(in_place),
                gbs(as_work),
                raw / as_work
            );
        }
    }
    Ok(())
}

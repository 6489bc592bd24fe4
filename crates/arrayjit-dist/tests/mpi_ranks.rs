//! Collectives across two processes over MPI, on loopback: each test runs itself again under
//! `mpirun -np 2` (`arrayjit_dist::testing::on_ranks`) and checks what both ranks report.
//! Where `mpirun` is missing, the test says it skipped and why.

#![cfg(feature = "mpi")]

use arrayjit_dist::testing::{RankRun, on_ranks, on_ranks_expecting_failure};
use arrayjit_dist::{ProcessGroup, ReduceOp};
use arrayjit_ir::{Prec, Tnode};
use arrayjit_runtime::CompileRequest;

/// Runs `test` on 2 ranks: `None` in the starting process (skipped, or the ranks' output
/// checked by `check`), `Some(())` in a rank.
fn on_two_ranks(test: &str, check: impl FnOnce(&str)) -> Option<()> {
    match on_ranks(test, 2) {
        RankRun::Rank => Some(()),
        RankRun::Started(out) => {
            check(&out);
            None
        }
        RankRun::Skipped(why) => {
            eprintln!("skipped {test}: {why}");
            None
        }
    }
}

/// Every precision: sum and mean of values known on each rank, against hand-computed ones;
/// broadcast from rank 1; the parameter hash check.
#[test]
fn collectives_in_every_precision() {
    let ranks = on_two_ranks("collectives_in_every_precision", |out| {
        assert_eq!(out.matches("collectives ok on rank").count(), 2, "{out}");
    });
    if ranks.is_none() {
        return;
    }
    let g = ProcessGroup::from_env().unwrap();
    assert_eq!((g.size(), g.engine_name()), (2, "mpi"));
    let r = g.rank() as f64;
    for prec in Prec::ALL {
        // Element i holds (i + 1)·(rank + 1): sums (i + 1)·3, means (i + 1)·1.5.
        let values: Vec<f64> = (0..37).map(|i| (i as f64 + 1.0) * (r + 1.0)).collect();
        let nd = arrayjit_ir::Ndarray::from_f64(prec, &[37], &values).unwrap();
        for (op, factor) in [(ReduceOp::Sum, 3.0), (ReduceOp::Mean, 1.5)] {
            let mut bytes = nd.as_bytes().to_vec();
            g.all_reduce(&mut bytes, prec, op).unwrap();
            let got = arrayjit_ir::Ndarray::from_f64(prec, &[37], &vec![0.0; 37]).unwrap();
            let mut got = got;
            got.as_bytes_mut().copy_from_slice(&bytes);
            for (i, v) in got.to_vec_f64().unwrap().into_iter().enumerate() {
                let exact = (i as f64 + 1.0) * factor;
                // Integers truncate the mean; f16/bf16 round once.
                let expected = if prec.is_float() {
                    exact
                } else {
                    exact.trunc()
                };
                let tolerance = match prec {
                    Prec::F16 => exact * 1e-3,
                    Prec::Bf16 => exact * 8e-3,
                    _ => 0.0,
                };
                assert!(
                    (v - expected).abs() <= tolerance,
                    "{} {op:?} element {i}: {v} (expected {expected})",
                    prec.name()
                );
            }
        }
    }
    let mut b = [g.rank() as u8 + 10; 5];
    g.broadcast(&mut b, 1).unwrap();
    assert_eq!(b, [11; 5]);
    g.barrier().unwrap();
    // Same values on both ranks: the check passes; different ones: both ranks are told.
    let same = Tnode::new(Prec::F32, &[3], &["same"]).unwrap();
    same.host().set_values(&[1.0, 2.0, 3.0]).unwrap();
    g.check_identical(std::slice::from_ref(&same)).unwrap();
    let mine = Tnode::new(Prec::F32, &[3], &["mine"]).unwrap();
    mine.host().set_values(&[r, 2.0, 3.0]).unwrap();
    let e = g.check_identical(&[same, mine]).unwrap_err();
    assert!(
        e.to_string()
            .contains("1 rank(s) hold other values than rank 0"),
        "{e}"
    );
    println!("collectives ok on rank {}", g.rank());
}

/// A collective as stream work: a routine on the compute stream writes a gradient, the
/// all-reduce runs on a communication stream after it, and a later routine on the compute
/// stream reads the reduced values (ordered by events, on `multicore_cc` where streams run
/// concurrently). The host copy refreshes from the reduced array.
#[test]
fn an_all_reduce_is_stream_work_ordered_by_events() {
    use arrayjit_ir::{Assignments, BinOp, MemoryMode, MemoryType, UnOp};
    let ranks = on_two_ranks("an_all_reduce_is_stream_work_ordered_by_events", |out| {
        assert_eq!(out.matches("stream work ok on rank").count(), 2, "{out}");
    });
    if ranks.is_none() {
        return;
    }
    let g = ProcessGroup::from_env().unwrap();
    let r = g.rank() as f64;
    let n = 1000;
    let x = Tnode::new(Prec::F32, &[n], &["x"]).unwrap();
    x.host().set_values_with(|k| k as f64 * (r + 1.0)).unwrap();
    let grad = Tnode::new(Prec::F32, &[n], &["grad"]).unwrap();
    let y = Tnode::new(Prec::F32, &[n], &["y"]).unwrap();
    for t in [&grad, &y] {
        t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: read")
            .unwrap();
    }
    let backend = arrayjit_runtime::backend("multicore_cc").unwrap();
    let compute = backend
        .compile(CompileRequest::routine(
            "gradient",
            &Assignments::pointwise_unop(&grad, UnOp::Identity, &x),
        ))
        .unwrap();
    let after = backend
        .compile(CompileRequest::routine(
            "double",
            &Assignments::pointwise_binop(&y, BinOp::Add, &grad, &grad),
        ))
        .unwrap();
    let device = backend.get_device(0).unwrap();
    let (s_compute, s_comm) = (device.new_stream().unwrap(), device.new_stream().unwrap());
    let r1 = arrayjit_runtime::Context::new(&s_compute)
        .link(&compute)
        .unwrap();
    let r2 = r1.context().link(&after).unwrap();
    for _ in 0..3 {
        r1.run().unwrap();
        g.all_reduce_array(r1.context(), &grad, &s_comm, ReduceOp::Sum)
            .unwrap();
        r2.run().unwrap();
    }
    s_compute.await_work().unwrap();
    s_comm.await_work().unwrap();
    // x·1 + x·2 = 3k on both ranks; y = 2·grad.
    let grad_values = grad.host().get_values().unwrap();
    let y_values = y.host().get_values().unwrap();
    for k in [0, 1, 499, 999] {
        assert_eq!(grad_values[k], 3.0 * k as f64, "grad[{k}]");
        assert_eq!(y_values[k], 6.0 * k as f64, "y[{k}]");
    }
    println!("stream work ok on rank {}", g.rank());
}

/// A rank that dies (without finalizing MPI, as a crash does) ends the whole job: the rank
/// blocked in its all-reduce does not hang, and the job fails well within its timeout.
/// (Returning a typed error on the surviving ranks is left to a watchdog: see the issue.)
#[test]
fn a_dead_rank_ends_the_job_instead_of_hanging() {
    let started = std::time::Instant::now();
    match on_ranks_expecting_failure("a_dead_rank_ends_the_job_instead_of_hanging", 2) {
        RankRun::Skipped(why) => eprintln!("skipped: {why}"),
        RankRun::Started(out) => {
            let took = started.elapsed();
            assert!(took.as_secs() < 60, "the job took {took:?}:\n{out}");
            eprintln!("the job ended {took:?} after start:\n{out}");
        }
        RankRun::Rank => {
            let g = ProcessGroup::from_env().unwrap();
            if g.rank() == 1 {
                // SAFETY: `_exit` ends the process at once, as a crash would.
                unsafe { libc_exit(3) };
            }
            let mut v = vec![1.0f32; 16];
            let _ = g.all_reduce_f32(&mut v, ReduceOp::Sum);
            // Reached only if the collective returned: stay until mpirun ends the job.
            std::thread::sleep(std::time::Duration::from_secs(300));
        }
    }
}

unsafe extern "C" {
    #[link_name = "_exit"]
    fn libc_exit(code: i32) -> !;
}

/// A rank that stops calling collectives (stuck, or failed and waiting) does not leave the
/// others hanging: past the timeout, the blocked rank names the collective on stderr and
/// aborts the job.
#[test]
fn a_collective_past_its_timeout_aborts_the_job() {
    let started = std::time::Instant::now();
    match on_ranks_expecting_failure("a_collective_past_its_timeout_aborts_the_job", 2) {
        RankRun::Skipped(why) => eprintln!("skipped: {why}"),
        RankRun::Started(out) => {
            let took = started.elapsed();
            assert!(took.as_secs() < 60, "the job took {took:?}:\n{out}");
            assert!(
                out.contains("rank 0 of 2: an all-reduce did not complete within 2 s"),
                "{out}"
            );
        }
        RankRun::Rank => {
            let g = ProcessGroup::from_env().unwrap();
            g.set_timeout(std::time::Duration::from_secs(2));
            if g.rank() == 1 {
                // Stuck: never joins the all-reduce.
                std::thread::sleep(std::time::Duration::from_secs(300));
            }
            let mut v = vec![1.0f32; 16];
            let _ = g.all_reduce_f32(&mut v, ReduceOp::Sum);
            std::thread::sleep(std::time::Duration::from_secs(300));
        }
    }
}

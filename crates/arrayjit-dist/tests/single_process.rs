//! Process groups without MPI: a job of one process, and the error a build without MPI gives
//! when an MPI launcher started it.

use arrayjit_dist::{LaunchKind, ProcessGroup, ReduceOp};
use arrayjit_ir::Prec;

#[test]
fn a_single_process_is_rank_0_of_1_and_collectives_keep_values() {
    let g = ProcessGroup::single();
    assert_eq!(
        (g.rank(), g.size(), g.engine_name()),
        (0, 1, "single process")
    );
    let mut v = vec![1.5f32, -2.0, 3.25];
    g.all_reduce_f32(&mut v, ReduceOp::Sum).unwrap();
    g.all_reduce_f32(&mut v, ReduceOp::Mean).unwrap();
    assert_eq!(v, vec![1.5, -2.0, 3.25]);
    let mut b = [7u8; 4];
    g.broadcast(&mut b, 0).unwrap();
    assert!(
        g.broadcast(&mut b, 1)
            .unwrap_err()
            .to_string()
            .contains("root 1 is not a rank")
    );
    g.barrier().unwrap();
    // A byte count that is not whole elements is refused, naming the rank.
    let e = g
        .all_reduce(&mut [0u8; 6], Prec::F32, ReduceOp::Sum)
        .unwrap_err();
    assert!(e.to_string().contains("rank 0 of 1"), "{e}");
}

#[test]
fn the_launcher_is_detected_from_its_variables() {
    let none = LaunchKind::from_lookup(|_| None);
    assert_eq!(none, LaunchKind::Alone);
    let ompi = LaunchKind::from_lookup(|n| (n == "OMPI_COMM_WORLD_SIZE").then(|| "4".into()));
    assert_eq!(
        ompi,
        LaunchKind::Launched {
            size: 4,
            variable: "OMPI_COMM_WORLD_SIZE"
        }
    );
    let hydra = LaunchKind::from_lookup(|n| (n == "PMI_SIZE").then(|| " 2 ".into()));
    assert!(matches!(hydra, LaunchKind::Launched { size: 2, .. }));
    // Alone, any build is a job of one process.
    assert_eq!(
        ProcessGroup::from_launch(LaunchKind::Alone).unwrap().size(),
        1
    );
}

/// Started by `mpirun` in a build without MPI: an error saying how to enable it, never a
/// silent single-process run that would train on part of the data.
#[cfg(not(feature = "mpi"))]
#[test]
fn launched_by_mpirun_without_mpi_support_says_how_to_enable_it() {
    let launched = LaunchKind::Launched {
        size: 2,
        variable: "OMPI_COMM_WORLD_SIZE",
    };
    let e = ProcessGroup::from_launch(launched).unwrap_err();
    assert!(
        matches!(e, arrayjit_ir::Error::BackendUnavailable { .. }),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("one of 2") && text.contains("--features mpi"),
        "{text}"
    );
    assert!(matches!(
        ProcessGroup::mpi(),
        Err(arrayjit_ir::Error::BackendUnavailable { .. })
    ));
}

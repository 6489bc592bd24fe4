//! The order of the optimizer's update program: the step count's update first, then one
//! parameter after another, its state's updates next to its own update, so that one pass over a
//! parameter's elements updates its state and it (its moments are read from memory once).

use arrayjit_ir::{Assignments, Prec, Tnode};
use arrayjit_tensor::{Init, Optimizer, Tensor, grad_program, update_program_clipped};

/// The nodes `a` writes, in order.
fn written(a: &Assignments, out: &mut Vec<Tnode>) {
    match a {
        Assignments::Seq(items) => items.iter().for_each(|i| written(i, out)),
        Assignments::BlockComment(_, inner) => written(inner, out),
        Assignments::Accum { lhs, .. } => out.push(lhs.clone()),
        Assignments::Fetch { array, .. } => out.push(array.clone()),
        Assignments::Noop => {}
    }
}

#[test]
fn each_parameters_state_and_update_are_neighbours() {
    let x = Tensor::input(Prec::F32, &[2, 3], "x", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let w = Tensor::param(
        "w",
        &[3, 4],
        Init::Normal {
            mean: 0.0,
            std: 0.1,
        },
        7,
        0,
    )
    .unwrap();
    let b = Tensor::param("b", &[4], Init::Zeros, 7, 1).unwrap();
    let y = Tensor::einsum("ij,jk->ik", &[&x, &w])
        .unwrap()
        .add(&b)
        .unwrap();
    let loss = y.mul(&y).unwrap().sum_all().unwrap();
    let grads = grad_program(&loss).unwrap();
    for opt in [
        Optimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        Optimizer::Sgd {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 0.1,
        },
    ] {
        let update = update_program_clipped(&opt, &grads.params, Some(1.0)).unwrap();
        let mut order = Vec::new();
        written(&update.program, &mut order);
        // Which parameter each write belongs to: the parameter itself or its state, by label.
        let owner = |n: &Tnode| {
            let name = n.label().last().cloned().unwrap_or_default();
            grads.params.iter().position(|p| {
                n.id() == p.node().id()
                    || ["adam_m_", "adam_v_", "velocity_"]
                        .iter()
                        .any(|prefix| name == format!("{prefix}{}", p.label()))
            })
        };
        let owners: Vec<usize> = order.iter().filter_map(owner).collect();
        let mut groups = owners.clone();
        groups.dedup();
        assert_eq!(groups.len(), grads.params.len(), "{opt:?}: {owners:?}");
        // Every parameter is written (and, with momentum or moments, its state before it).
        for (i, p) in grads.params.iter().enumerate() {
            let writes: Vec<&Tnode> = order.iter().filter(|n| owner(n) == Some(i)).collect();
            assert_eq!(
                writes.last().map(|n| n.id()),
                Some(p.node().id()),
                "{opt:?}"
            );
            assert!(writes.len() >= 3, "{opt:?}: {writes:?}");
        }
        // Adam's step count is updated before any parameter's state.
        let is_step = |n: &Tnode| n.label().last().is_some_and(|l| l == "adam_step");
        if let Some(t) = order.iter().position(is_step) {
            let first_owned = order.iter().position(|n| owner(n).is_some()).unwrap();
            assert!(t < first_owned);
        }
    }
}

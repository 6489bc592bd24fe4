//! Helpers shared by the integration tests: hosted input and output nodes.

use arrayjit::prelude::*;

/// An f32 node with host values `values`.
pub fn hosted_input(dims: &[usize], label: &str, values: &[f64]) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.host().set_values(values).unwrap();
    t
}

/// An f32 node whose values are `0, 1, 2, ...`.
#[allow(dead_code)]
pub fn hosted_iota(dims: &[usize], label: &str) -> Tnode {
    let n: usize = dims.iter().product();
    hosted_input(dims, label, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

/// An f32 node that routines write and the host reads.
pub fn hosted_output(dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

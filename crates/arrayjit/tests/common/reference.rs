//! Helpers of the reference-item tests (`reference_items*.rs`).

use arrayjit::prelude::*;

/// The CPU backends every reference item runs on.
pub const CPU_BACKENDS: [&str; 2] = ["sync_cc", "multicore_cc"];

pub fn input(label: &str, values: &[f64]) -> Tnode {
    let t = Tnode::new(Prec::F32, &[values.len()], &[label]).unwrap();
    t.host().set_values(values).unwrap();
    t
}

/// An f32 node of `n` elements that routines write and the host reads.
pub fn result(label: &str, n: usize) -> Tnode {
    let t = Tnode::new(Prec::F32, &[n], &[label]).unwrap();
    t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    t
}

/// The backend named `name` and a new stream on its device 0.
pub fn backend_and_stream(name: &str) -> (Backend, Stream) {
    let backend = arrayjit::backend(name).unwrap();
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    (backend, stream)
}

pub fn mode(tn: &Tnode) -> MemoryMode {
    tn.memory_mode().unwrap().mode
}

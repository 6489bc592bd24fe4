//! Deep graphs (reliability issue, item 4): long chains compile in time linear in their length,
//! without recursion deep enough to overflow a thread's stack, run correctly, and a million
//! tensors drop without recursion.

use arrayjit::opt::optimize::optimize;
use arrayjit::prelude::*;
use arrayjit::tensor::{Tensor, forward_program};

/// `x + 1 + 1 + ...` (`n` additions of a scalar constant), as the front end builds it.
fn add_chain(n: usize) -> (Tensor, Tensor) {
    let x = Tensor::input(Prec::F32, &[4], "x", &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let mut t = x.clone();
    for _ in 0..n {
        t = t.add_scalar(1.0).unwrap();
    }
    (x, t)
}

/// Runs `f` on a thread with a small, explicit stack: recursion proportional to the graph's
/// depth would overflow it.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn item04_deep_chain_compiles_and_runs_correctly() {
    for name in ["sync_cc", "multicore_cc"] {
        let backend = arrayjit::backend(name).unwrap();
        let (_x, t) = add_chain(3000);
        t.node()
            .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
        let code = backend
            .compile(CompileRequest::routine("deep", &forward_program(&[&t])))
            .unwrap();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        stream.await_work().unwrap();
        assert_eq!(
            t.values().unwrap(),
            vec![3001.0, 3002.0, 3003.0, 3004.0],
            "{name}"
        );
    }
}

#[test]
fn item04_hundred_thousand_node_chain_optimizes_on_a_small_stack() {
    let nodes = on_small_stack(|| {
        let (_x, t) = add_chain(100_000);
        let program = forward_program(&[&t]);
        let optimized = optimize("deep", &[], &program, &Default::default()).unwrap();
        // Besides, the sums materialized every few hundred steps (the inlining budget) are
        // contracted to one element per iteration of the fused loop: nodes of their own.
        optimized
            .nodes
            .iter()
            .filter(|r| !r.tn.is_iteration_private())
            .count()
    });
    // The input, and per step a constant and a sum.
    assert_eq!(nodes, 1 + 2 * 100_000);
}

#[test]
fn item04_million_tensor_chain_drops_without_recursion() {
    on_small_stack(|| {
        let x = Tensor::input(Prec::F32, &[1], "x", &[1.0]).unwrap();
        let mut t = x.clone();
        for _ in 0..1_000_000 {
            t = t.detach();
        }
        drop(x);
        drop(t);
    });
}

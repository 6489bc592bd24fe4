//! Helpers shared by the integration tests: hosted input and output nodes, and a routine
//! updating a hosted parameter.

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

/// `w += x; y = w + w` over `[4]`, with `w` a hosted parameter the routine changes (host values
/// `10, 20, 30, 40`) and `x` = `1, 2, 3, 4`: returns the program, `x`, `w` and `y`.
#[allow(dead_code)]
pub fn update_program() -> (Assignments, Tnode, Tnode, Tnode) {
    let x = hosted_input(&[4], "x", &[1.0, 2.0, 3.0, 4.0]);
    let w = hosted_input(&[4], "w", &[10.0, 20.0, 30.0, 40.0]);
    w.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "test: a parameter",
    )
    .unwrap();
    let y = hosted_output(&[4], "y");
    let prog = Assignments::pointwise_binop(&w, BinOp::Add, &w, &x)
        .then(Assignments::pointwise_binop(&y, BinOp::Add, &w, &w));
    (prog, x, w, y)
}

/// `c = a · b` for hosted `a[m, k]` and `b[k, n]` with small integer entries (exact in f32) and
/// the `[m, n]` node `c` the caller made: the program and `c`'s expected values, row-major.
#[allow(dead_code)]
pub fn product_into(c: &Tnode, m: usize, k: usize, n: usize) -> (Assignments, Vec<f64>) {
    let av: Vec<f64> = (0..m * k).map(|p| (p % 5) as f64 - 2.0).collect();
    let bv: Vec<f64> = (0..k * n).map(|p| (p % 3) as f64 - 1.0).collect();
    let a = hosted_input(&[m, k], "a", &av);
    let b = hosted_input(&[k, n], "b", &bv);
    let mut expected = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            expected[i * n + j] = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
        }
    }
    let program = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    (program, expected)
}

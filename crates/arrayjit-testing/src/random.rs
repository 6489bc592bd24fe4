//! Random draws in the conformance corpus: uniform values from the IR's random op in three
//! precisions (a seed with high bits set and the largest step included), a draw read by two statements (a dropout
//! mask and its second use, candidates for inlining), and a step advanced by the program
//! between draws and across runs, so every backend must reproduce the interpreter's Philox
//! values bit for bit.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, FetchOp, Operand, Prec, Projections, Result, TernOp, Tnode, UnOp,
};

use super::case::{Case, case, output};

fn random(array: &Tnode, seed: u64, stream: u32, step: &Tnode) -> Assignments {
    Assignments::Fetch {
        array: array.clone(),
        op: FetchOp::Random {
            seed,
            stream,
            step: step.clone(),
        },
    }
}

fn constant(dims: &[usize], label: &str, value: f64) -> Result<(Tnode, Assignments)> {
    let t = Tnode::new(Prec::F32, dims, &[label])?;
    let fill = Assignments::Fetch {
        array: t.clone(),
        op: FetchOp::Constant(value),
    };
    Ok((t, fill))
}

/// Draws before and after the program advances its step, over two runs.
fn random_draws() -> Result<Case> {
    let dims = [4, 300];
    let n: usize = dims.iter().product();
    let step = output(Prec::U32, &[], "step")?;
    step.host().set_values(&[5.0])?;
    let x = Tnode::new(Prec::F32, &dims, &["x"])?;
    x.host()
        .set_values(&(0..n).map(|i| (i % 17) as f64 - 8.0).collect::<Vec<_>>())?;
    let uniform_f32 = output(Prec::F32, &dims, "uniform_f32")?;
    let uniform_f16 = output(Prec::F16, &[9], "uniform_f16")?;
    let after = output(Prec::F32, &[2, 3], "uniform_after_advance")?;
    let mask = Tnode::new(Prec::F32, &dims, &["mask"])?;
    let dropped_flag = Tnode::new(Prec::F32, &dims, &["dropped_flag"])?;
    let dropped = output(Prec::F32, &dims, "dropped")?;
    let mask_plus_x = output(Prec::F32, &dims, "mask_plus_x")?;
    let (p, fill_p) = constant(&dims, "p", 0.25)?;
    let (zero, fill_zero) = constant(&dims, "zero", 0.0)?;
    let one = Tnode::new(Prec::U32, &[], &["one"])?;
    let accum = |lhs: &Tnode, accum: BinOp, rhs: AccumRhs, operands: usize| Assignments::Accum {
        initialize_neutral: false,
        accum,
        lhs: lhs.clone(),
        rhs,
        projections: Projections::pointwise(lhs.dims(), operands),
    };
    let node = |t: &Tnode| Operand::Node(t.clone());
    let program = random(&uniform_f32, 42, 1, &step)
        .then(random(&uniform_f16, 3, 3, &step))
        .then(random(&mask, 42, 4, &step))
        .then(fill_p)
        .then(fill_zero)
        .then(Assignments::pointwise_binop(
            &dropped_flag,
            BinOp::Cmplt,
            &mask,
            &p,
        ))
        .then(accum(
            &dropped,
            BinOp::Arg2,
            AccumRhs::Ternop(TernOp::Where, node(&dropped_flag), node(&zero), node(&x)),
            3,
        ))
        .then(Assignments::pointwise_binop(
            &mask_plus_x,
            BinOp::Add,
            &mask,
            &x,
        ))
        .then(Assignments::Fetch {
            array: one.clone(),
            op: FetchOp::Constant(1.0),
        })
        .then(accum(
            &step,
            BinOp::Add,
            AccumRhs::Unop(UnOp::Identity, node(&one)),
            1,
        ))
        .then(random(&after, 42, 1, &step));
    Ok(Case {
        name: "random_draws".into(),
        program,
        bindings: vec![],
        runs: vec![vec![], vec![]],
        results: vec![step, uniform_f32, uniform_f16, dropped, mask_plus_x, after],
    })
}

/// Double-precision draws with a seed whose high word is set (a case of its own: not every
/// backend has `f64`).
fn random_f64() -> Result<Case> {
    let step = Tnode::new(Prec::U32, &[], &["step"])?;
    step.host().set_values(&[u32::MAX as f64])?;
    let uniform = output(Prec::F64, &[7, 3], "uniform_f64")?;
    Ok(case(
        "random_f64",
        random(&uniform, u64::MAX - 3, 2, &step),
        vec![uniform],
    ))
}

/// The random cases.
pub fn random_cases() -> Result<Vec<Case>> {
    Ok(vec![random_draws()?, random_f64()?])
}

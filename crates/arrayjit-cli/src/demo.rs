//! The main demo: `y = relu(W·x + b)` and a reduction `s = Σ y²`, run on a backend and checked
//! against the interpreter, with every node's memory mode (and why) and the generated C.

use std::fmt::Write as _;
use std::time::Instant;

use arrayjit::runtime::CompileRequest;
use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, InterpEnv, MemoryMode, MemoryType, Operand, Prec, Result, Tnode,
    UnOp,
};

/// What the demo computed.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The backend it ran on.
    pub backend: String,
    /// `relu(W·x + b)`.
    pub y: Vec<f64>,
    /// `Σ y²`.
    pub sum_of_squares: f64,
    /// The same two results from the interpreter.
    pub interpreter: (Vec<f64>, f64),
    /// Time to optimize, render, compile (or load from the cache) and link, in milliseconds.
    pub compile_ms: f64,
    /// The printed report.
    pub text: String,
}

/// Runs the demo on the named backend (or the default one).
pub fn run(backend_name: Option<&str>) -> Result<DemoReport> {
    let backend = match backend_name {
        Some(n) => arrayjit_runtime::backend(n)?,
        None => arrayjit_runtime::default_backend()?,
    };
    let (rows, cols) = (4, 3);
    let w = Tnode::new(Prec::F32, &[rows, cols], &["w"])?;
    let x = Tnode::new(Prec::F32, &[cols], &["x"])?;
    let b = Tnode::new(Prec::F32, &[rows], &["b"])?;
    w.host().set_values(
        &(0..rows * cols)
            .map(|i| (i as f64 - 5.0) * 0.25)
            .collect::<Vec<_>>(),
    )?;
    x.host().set_values(&[1.0, -2.0, 0.5])?;
    b.host().set_values(&[0.5, -0.25, 1.0, 0.0])?;
    let wx = Tnode::new(Prec::F32, &[rows], &["w", "x"])?;
    let pre = Tnode::new(Prec::F32, &[rows], &["pre_activation"])?;
    let y = Tnode::new(Prec::F32, &[rows], &["y"])?;
    let y2 = Tnode::new(Prec::F32, &[rows], &["y_squared"])?;
    let s = Tnode::new(Prec::F32, &[], &["sum_of_squares"])?;
    for out in [&y, &s] {
        out.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "demo: printed result",
        )?;
    }
    let layer = Assignments::BlockComment(
        "y = relu(w * x + b)".into(),
        Box::new(
            Assignments::einsum(
                "ij,j->i",
                BinOp::Add,
                &wx,
                AccumRhs::Binop(
                    BinOp::Mul,
                    Operand::Node(w.clone()),
                    Operand::Node(x.clone()),
                ),
                true,
            )?
            .then(Assignments::pointwise_binop(&pre, BinOp::Add, &wx, &b))
            .then(Assignments::pointwise_unop(&y, UnOp::Relu, &pre)),
        ),
    );
    let reduction = Assignments::BlockComment(
        "sum_of_squares = sum_i y_i^2".into(),
        Box::new(
            Assignments::pointwise_binop(&y2, BinOp::Mul, &y, &y).then(Assignments::einsum(
                "i->",
                BinOp::Add,
                &s,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(y2.clone())),
                true,
            )?),
        ),
    );
    let program = layer.then(reduction);

    // The interpreter's answer, from the unoptimized loop code.
    let reference_code = program.lower(&[])?;
    let mut env = InterpEnv::from_host_arrays(&reference_code);
    env.run(&reference_code, &[])?;
    let interpreter = (env.values(&y)?, env.values(&s)?[0]);

    let started = Instant::now();
    let code = backend.compile(CompileRequest::routine("demo", &program))?;
    let stream = backend.get_device(0)?.new_stream()?;
    let routine = arrayjit_runtime::Context::new(&stream).link(&code)?;
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    routine.run()?;
    routine.context().to_host(&y)?;
    routine.context().to_host(&s)?;
    let yv = y.host().get_values()?;
    let sv = s.host().get_values()?[0];

    let mut text = String::new();
    let _ = writeln!(
        text,
        "arrayjit demo on backend {} ({})",
        backend.name(),
        stream.name()
    );
    for (name, t) in [("w", &w), ("x", &x), ("b", &b)] {
        let _ = writeln!(text, "\ninput {name} = {}", t.host().array()?);
    }
    let _ = writeln!(text, "\ny = relu(w . x + b) = {}", y.host().array()?);
    let _ = writeln!(text, "sum_of_squares = {sv}");
    let agrees = yv
        .iter()
        .zip(&interpreter.0)
        .all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs()))
        && (sv - interpreter.1).abs() <= 1e-5 * (1.0 + interpreter.1.abs());
    let _ = writeln!(
        text,
        "interpreter agrees: {} (y = {:?}, sum = {})",
        if agrees { "yes" } else { "NO" },
        interpreter.0,
        interpreter.1
    );
    let _ = writeln!(text, "\nmemory modes (and why):");
    for t in [&w, &x, &b, &wx, &pre, &y, &y2, &s] {
        let _ = writeln!(text, "  {}", t.header());
    }
    let _ = writeln!(text, "\noptimized loop code:\n{}", code.optimized().code);
    let _ = writeln!(text, "generated C:\n{}", code.source());
    let _ = writeln!(
        text,
        "optimize + compile + link: {compile_ms:.1} ms ({:?})",
        backend.lowered().compile_stats().unwrap_or_default()
    );
    Ok(DemoReport {
        backend: backend.name().to_string(),
        y: yv,
        sum_of_squares: sv,
        interpreter,
        compile_ms,
        text,
    })
}

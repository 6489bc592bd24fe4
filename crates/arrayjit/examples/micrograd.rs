//! micrograd's example expression with the tensor front end: prints g, dg/da and dg/db,
//! computed by the interpreter and by the default backend; micrograd's README gives 24.7041,
//! 138.8338 and 645.5773, which can be checked by hand.
//! Run: `cargo run --release --example micrograd`.

use arrayjit::runtime::CompileRequest;
use arrayjit_ir::{InterpEnv, Prec, Result};
use arrayjit_tensor::{Init, Tensor, grad_program};

/// `(g, dg/da, dg/db)` for micrograd's expression at `a = -4`, `b = 2`, computed by the
/// interpreter (`backend = None`) or compiled on a backend.
pub fn run(backend: Option<&str>) -> Result<(f64, f64, f64)> {
    let scalar = |label: &str, v: f64| -> Result<Tensor> {
        let t = Tensor::param_with_prec(label, Prec::F64, &[], Init::Constant(v), 0, 0)?;
        Ok(t)
    };
    let k = |v: f64| Tensor::full(Prec::F64, &[], v);
    let a = scalar("a", -4.0)?;
    let b = scalar("b", 2.0)?;
    let c = a.add(&b)?;
    let d = a.mul(&b)?.add(&b.pow(&k(3.0)?)?)?;
    let c = c.add(&c.add(&k(1.0)?)?)?;
    let c = c.add(&k(1.0)?.add(&c)?.add(&a.neg()?)?)?;
    let d = d.add(&d.mul(&k(2.0)?)?.add(&b.add(&a)?.relu()?)?)?;
    let d = d.add(&k(3.0)?.mul(&d)?.add(&b.sub(&a)?.relu()?)?)?;
    let e = c.sub(&d)?;
    let f = e.pow(&k(2.0)?)?;
    let g = f.div(&k(2.0)?)?;
    let g = g.add(&k(10.0)?.div(&f)?)?;
    let program = grad_program(&g)?;
    let (ga, gb) = (
        a.grad().cloned().expect("a has a gradient"),
        b.grad().cloned().expect("b has a gradient"),
    );
    match backend {
        None => {
            let code = program.program.lower(&[])?;
            let mut env = InterpEnv::from_host_arrays(&code);
            env.run(&code, &[])?;
            Ok((
                env.values(g.node())?[0],
                env.values(&ga)?[0],
                env.values(&gb)?[0],
            ))
        }
        Some(name) => {
            use arrayjit_ir::{MemoryMode, MemoryType};
            for t in [g.node(), &ga, &gb] {
                t.update_memory_mode(
                    MemoryMode::Hosted(MemoryType::Nonconstant),
                    "micrograd: printed",
                )?;
            }
            let backend = arrayjit_runtime::backend(name)?;
            let code = backend.compile(CompileRequest::routine("micrograd", &program.program))?;
            let stream = backend.get_device(0)?.new_stream()?;
            let routine = arrayjit_runtime::Context::new(&stream).link(&code)?;
            routine.run()?;
            Ok((
                g.values()?[0],
                ga.host().get_values()?[0],
                gb.host().get_values()?[0],
            ))
        }
    }
}

fn main() -> arrayjit::Result<()> {
    arrayjit::install_logging();
    let (g, da, db) = run(None)?;
    println!("interpreter: g = {g:.4}, dg/da = {da:.4}, dg/db = {db:.4}");
    let backend = arrayjit::default_backend()?;
    let (g, da, db) = run(Some(backend.name()))?;
    println!(
        "{}: g = {g:.4}, dg/da = {da:.4}, dg/db = {db:.4}",
        backend.name()
    );
    Ok(())
}

//! micrograd's example expression: prints g, dg/da and dg/db, computed by the interpreter and by
//! the default backend; micrograd's README gives 24.7041, 138.8338 and 645.5773.
//! Run: `cargo run --release --example micrograd`.

fn main() -> arrayjit::Result<()> {
    let (g, da, db) = arrayjit::micrograd::run(None)?;
    println!("interpreter: g = {g:.4}, dg/da = {da:.4}, dg/db = {db:.4}");
    let backend = arrayjit::default_backend()?;
    let (g, da, db) = arrayjit::micrograd::run(Some(backend.name()))?;
    println!(
        "{}: g = {g:.4}, dg/da = {da:.4}, dg/db = {db:.4}",
        backend.name()
    );
    Ok(())
}

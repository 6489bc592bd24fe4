//! arrayjit-py: the Python package's native module (`arrayjit._arrayjit`), built as an abi3
//! wheel by maturin. The Python package (`python/arrayjit/`) wraps it with NumPy conversions
//! and re-exports it; `python/arrayjit/__init__.pyi` types it. Layers: [`errors`] (a Python
//! exception per kind of error), [`tensor`] (tensors and operations), [`routine`] (backends,
//! compiled routines, training, checkpoints), [`host`] (NumPy views of host arrays and
//! copies into them), [`nn`] (the blocks), [`observe`] (listing, timing and trace switches), [`gpt`] (the GPT demo's trainer), [`gpt2`] (GPT-2
//! checkpoints, generation and tokenizer).

#![warn(missing_docs)]
// Production code documents every unsafe block and never unwraps (tests may).
#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod errors;
pub mod gpt;
pub mod gpt2;
pub mod host;
pub mod nn;
pub mod observe;
pub mod routine;
pub mod tensor;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _arrayjit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    nn::register(m)?;
    observe::register(m)?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<routine::PyBackend>()?;
    m.add_class::<routine::PyRoutine>()?;
    m.add_class::<routine::PyOptimizer>()?;
    m.add_class::<routine::PyTrainer>()?;
    m.add_class::<gpt::PyGptTrainer>()?;
    m.add_class::<gpt::PyCharVocab>()?;
    m.add_class::<gpt2::PyGpt2>()?;
    m.add_class::<gpt2::PyGpt2Tokenizer>()?;
    for f in [
        wrap_pyfunction!(tensor::tensor, m)?,
        wrap_pyfunction!(tensor::ids, m)?,
        wrap_pyfunction!(tensor::set_ids, m)?,
        wrap_pyfunction!(tensor::param, m)?,
        wrap_pyfunction!(tensor::full, m)?,
        wrap_pyfunction!(tensor::einsum, m)?,
        wrap_pyfunction!(tensor::guarded_product, m)?,
        wrap_pyfunction!(tensor::where_, m)?,
        wrap_pyfunction!(tensor::scaled_dot_product_attention, m)?,
        wrap_pyfunction!(tensor::mse, m)?,
        wrap_pyfunction!(tensor::cross_entropy, m)?,
        wrap_pyfunction!(tensor::softmax_cross_entropy, m)?,
        wrap_pyfunction!(routine::backends, m)?,
        wrap_pyfunction!(routine::backend, m)?,
        wrap_pyfunction!(routine::compile, m)?,
        wrap_pyfunction!(routine::backward, m)?,
        wrap_pyfunction!(routine::sgd, m)?,
        wrap_pyfunction!(routine::adam, m)?,
        wrap_pyfunction!(routine::save, m)?,
        wrap_pyfunction!(routine::load, m)?,
        wrap_pyfunction!(gpt::moons, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

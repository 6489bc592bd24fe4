//! The `nn` blocks from Python (`arrayjit.nn`): `Linear`, `LayerNorm`, `Mlp`,
//! `CausalSelfAttention`, `DecoderBlock` and `Gpt`, each callable on tensors and listing its
//! parameters. Each block draws its parameters from the counter-based RNG with its own seed: the
//! one given, or the next of a process-wide counter, so that two blocks made one after the other
//! differ and a program that makes its blocks in the same order gets the same parameters.

use std::sync::atomic::{AtomicU64, Ordering};

use arrayjit_ir::Error;
use arrayjit_tensor::Tensor;
use arrayjit_tensor::nn::{
    AttentionKind, CausalSelfAttention, DecoderBlock, Gelu, Gpt, GptConfig, LayerNorm, Linear, Mlp,
    ParamFactory,
};
use pyo3::prelude::*;

use crate::errors::{IntoPy, to_py};
use crate::tensor::PyTensor;

/// Seeds handed to blocks made without one.
static NEXT_SEED: AtomicU64 = AtomicU64::new(0x5eed_0000);

fn factory(seed: Option<u64>) -> ParamFactory {
    ParamFactory::new(seed.unwrap_or_else(|| NEXT_SEED.fetch_add(1, Ordering::Relaxed)))
}

fn tensors(ts: &[Tensor]) -> Vec<PyTensor> {
    ts.iter().cloned().map(PyTensor::from).collect()
}

fn gelu(name: &str) -> PyResult<Gelu> {
    match name {
        "none" | "exact" => Ok(Gelu::Exact),
        "tanh" => Ok(Gelu::Tanh),
        other => Err(to_py(Error::BadValue {
            what: "gelu".into(),
            value: other.into(),
            expected: "\"exact\" (or \"none\") or \"tanh\"".into(),
        })),
    }
}

/// `x @ weight + bias` over the last axis (Python: `arrayjit.nn.Linear`).
#[pyclass(name = "Linear", module = "arrayjit.nn", frozen)]
pub struct PyLinear {
    inner: Linear,
    params: Vec<Tensor>,
}

#[pymethods]
impl PyLinear {
    /// Weights normal with standard deviation `std` (default `1/sqrt(inputs)`), bias zero.
    #[new]
    #[pyo3(signature = (inputs, outputs, bias = true, std = None, seed = None, label = "linear"))]
    fn new(
        inputs: usize,
        outputs: usize,
        bias: bool,
        std: Option<f64>,
        seed: Option<u64>,
        label: &str,
    ) -> PyResult<PyLinear> {
        let mut f = factory(seed);
        let std = std.unwrap_or(1.0 / (inputs.max(1) as f64).sqrt());
        let inner = Linear::new(&mut f, label, inputs, outputs, std, bias).py()?;
        Ok(PyLinear {
            inner,
            params: f.params().to_vec(),
        })
    }
    fn __call__(&self, x: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&x.inner).py().map(PyTensor::from)
    }
    /// `[inputs, outputs]`.
    #[getter]
    fn weight(&self) -> PyTensor {
        self.inner.weight.clone().into()
    }
    /// `[outputs]`, or None.
    #[getter]
    fn bias(&self) -> Option<PyTensor> {
        self.inner.bias.clone().map(PyTensor::from)
    }
    /// Its parameters.
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(&self.params)
    }
}

/// Layer norm over the last axis with a learned gain and bias (Python: `arrayjit.nn.LayerNorm`).
#[pyclass(name = "LayerNorm", module = "arrayjit.nn", frozen)]
pub struct PyLayerNorm {
    inner: LayerNorm,
    params: Vec<Tensor>,
}

#[pymethods]
impl PyLayerNorm {
    /// Gain 1, bias 0.
    #[new]
    #[pyo3(signature = (width, eps = 1e-5, label = "norm"))]
    fn new(width: usize, eps: f64, label: &str) -> PyResult<PyLayerNorm> {
        let mut f = factory(None);
        let mut inner = LayerNorm::new(&mut f, label, width).py()?;
        inner.eps = eps;
        Ok(PyLayerNorm {
            inner,
            params: f.params().to_vec(),
        })
    }
    fn __call__(&self, x: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&x.inner).py().map(PyTensor::from)
    }
    /// Its parameters (gain, bias).
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(&self.params)
    }
}

/// Two linear layers with GELU between (Python: `arrayjit.nn.Mlp`).
#[pyclass(name = "Mlp", module = "arrayjit.nn", frozen)]
pub struct PyMlp {
    inner: Mlp,
    params: Vec<Tensor>,
}

#[pymethods]
impl PyMlp {
    /// `width → hidden → width`, weights normal with standard deviation `std`.
    #[new]
    #[pyo3(signature = (width, hidden, gelu = "tanh", std = 0.02, seed = None, label = "mlp"))]
    fn new(
        width: usize,
        hidden: usize,
        gelu: &str,
        std: f64,
        seed: Option<u64>,
        label: &str,
    ) -> PyResult<PyMlp> {
        let mut f = factory(seed);
        let inner = Mlp::new(&mut f, label, width, hidden, std, 1.0, self::gelu(gelu)?).py()?;
        Ok(PyMlp {
            inner,
            params: f.params().to_vec(),
        })
    }
    fn __call__(&self, x: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&x.inner).py().map(PyTensor::from)
    }
    /// Its parameters.
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(&self.params)
    }
}

/// Multi-head causal self-attention on `[batch, time, width]` (Python:
/// `arrayjit.nn.CausalSelfAttention`).
#[pyclass(name = "CausalSelfAttention", module = "arrayjit.nn", frozen)]
pub struct PyAttention {
    inner: CausalSelfAttention,
    params: Vec<Tensor>,
}

#[pymethods]
impl PyAttention {
    /// `heads` heads splitting `width`; projections normal with standard deviation `std`.
    #[new]
    #[pyo3(signature = (width, heads, std = 0.02, seed = None, label = "attention", kind = "fused"))]
    fn new(
        width: usize,
        heads: usize,
        std: f64,
        seed: Option<u64>,
        label: &str,
        kind: &str,
    ) -> PyResult<PyAttention> {
        let mut f = factory(seed);
        let mut inner = CausalSelfAttention::new(&mut f, label, width, heads, std, 1.0).py()?;
        inner.kind = AttentionKind::parse(kind).py()?;
        Ok(PyAttention {
            inner,
            params: f.params().to_vec(),
        })
    }
    fn __call__(&self, x: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&x.inner).py().map(PyTensor::from)
    }
    /// Its parameters (query, key, value, output projections and their biases).
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(&self.params)
    }
}

/// A pre-norm decoder block: `x + attention(norm(x))`, then `x + mlp(norm(x))` (Python:
/// `arrayjit.nn.DecoderBlock`).
#[pyclass(name = "DecoderBlock", module = "arrayjit.nn", frozen)]
pub struct PyDecoderBlock {
    inner: DecoderBlock,
    params: Vec<Tensor>,
}

#[pymethods]
impl PyDecoderBlock {
    /// A block of `width` with `heads` heads and an MLP of `hidden`.
    #[new]
    #[pyo3(signature = (width, heads, hidden, gelu = "tanh", seed = None, label = "block"))]
    fn new(
        width: usize,
        heads: usize,
        hidden: usize,
        gelu: &str,
        seed: Option<u64>,
        label: &str,
    ) -> PyResult<PyDecoderBlock> {
        let mut f = factory(seed);
        let std = 0.02;
        let inner = DecoderBlock {
            norm1: LayerNorm::new(&mut f, &format!("{label}.norm1"), width).py()?,
            attention: CausalSelfAttention::new(
                &mut f,
                &format!("{label}.attention"),
                width,
                heads,
                std,
                1.0,
            )
            .py()?,
            norm2: LayerNorm::new(&mut f, &format!("{label}.norm2"), width).py()?,
            mlp: Mlp::new(
                &mut f,
                &format!("{label}.mlp"),
                width,
                hidden,
                std,
                1.0,
                self::gelu(gelu)?,
            )
            .py()?,
        };
        Ok(PyDecoderBlock {
            inner,
            params: f.params().to_vec(),
        })
    }
    fn __call__(&self, x: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&x.inner).py().map(PyTensor::from)
    }
    /// Its parameters.
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(&self.params)
    }
}

/// A GPT: token and position embeddings, decoder blocks, a final norm, tied logits (Python:
/// `arrayjit.nn.Gpt`).
#[pyclass(name = "Gpt", module = "arrayjit.nn", frozen)]
pub struct PyGpt {
    inner: Gpt,
}

#[pymethods]
impl PyGpt {
    /// GPT-2's initialization, drawn from `seed`; matrix products in `precision` (`"f32"`,
    /// or `"bf16"` operands accumulating in `f32`).
    #[new]
    #[pyo3(signature = (vocabulary, context = 64, width = 128, heads = 4, layers = 2, hidden = 512,
                        gelu = "tanh", seed = 1, precision = "f32", attention = "fused"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        vocabulary: usize,
        context: usize,
        width: usize,
        heads: usize,
        layers: usize,
        hidden: usize,
        gelu: &str,
        seed: u64,
        precision: &str,
        attention: &str,
    ) -> PyResult<PyGpt> {
        let config = GptConfig {
            vocabulary,
            context,
            width,
            heads,
            layers,
            hidden,
            gelu: self::gelu(gelu)?,
            precision: precision
                .parse::<arrayjit_tensor::Precision>()
                .map_err(to_py)?,
            attention: AttentionKind::parse(attention).py()?,
        };
        Ok(PyGpt {
            inner: Gpt::new(config, seed).py()?,
        })
    }
    /// Logits `[batch, time, vocabulary]` of an `ids` tensor `[batch, time]`.
    fn __call__(&self, ids: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner.forward(&ids.inner).py().map(PyTensor::from)
    }
    /// The mean cross-entropy of the next-id predictions against `targets`.
    fn loss(&self, ids: PyRef<'_, PyTensor>, targets: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.inner
            .loss(&ids.inner, &targets.inner)
            .py()
            .map(PyTensor::from)
    }
    /// Its parameters.
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        tensors(self.inner.params())
    }
    /// Number of trainable values.
    #[getter]
    fn parameter_count(&self) -> usize {
        self.inner.parameter_count()
    }
}

/// Adds the blocks to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLinear>()?;
    m.add_class::<PyLayerNorm>()?;
    m.add_class::<PyMlp>()?;
    m.add_class::<PyAttention>()?;
    m.add_class::<PyDecoderBlock>()?;
    m.add_class::<PyGpt>()?;
    Ok(())
}

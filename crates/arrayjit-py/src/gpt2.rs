//! GPT-2 checkpoints from Python: `arrayjit.Gpt2` (load Hugging Face's layout, logits,
//! generation with a key/value cache, save back) and `arrayjit.Gpt2Tokenizer` (GPT-2's
//! byte-level BPE).

use std::path::PathBuf;

use arrayjit_ir::Error;
use arrayjit_tensor::Precision;
use arrayjit_train::gpt2::{Gpt2, Gpt2Tokenizer, Sampling};
use numpy::{PyArray2, ToPyArray};
use pyo3::prelude::*;

use crate::errors::{IntoPy, to_py};
use crate::routine::PyBackend;

/// The sampling settings of a `generate` call's keyword arguments.
fn sampling(temperature: f64, top_k: Option<usize>, top_p: Option<f64>, seed: u64) -> Sampling {
    Sampling {
        temperature,
        top_k,
        top_p,
        seed,
    }
}

/// A GPT-2 on a backend (Python: `arrayjit.Gpt2`).
#[pyclass(name = "Gpt2", module = "arrayjit", frozen)]
pub struct PyGpt2 {
    inner: Gpt2,
}

#[pymethods]
impl PyGpt2 {
    /// Loads `dir/config.json` and `dir/model.safetensors` (Hugging Face's GPT-2 layout; f32,
    /// f16 or bf16 weights) onto `backend` (the default backend when None) in `precision`:
    /// `"f32"` (weights kept as f32); `"bf16-weights"` (the matrix weights and embeddings kept
    /// in bf16, activations f32: half the memory, and decoding about twice as fast on a CPU);
    /// or `"bf16"` (f32 weights, products of operands rounded to bf16, as on a GPU's matrix
    /// units).
    #[staticmethod]
    #[pyo3(signature = (dir, backend = None, precision = "f32"))]
    fn from_pretrained(
        py: Python<'_>,
        dir: PathBuf,
        backend: Option<PyRef<'_, PyBackend>>,
        precision: &str,
    ) -> PyResult<PyGpt2> {
        let precision: Precision = precision.parse().py()?;
        let backend = match backend {
            Some(b) => b.inner.clone(),
            None => arrayjit_runtime::default_backend().py()?,
        };
        let inner = py
            .detach(|| Gpt2::from_pretrained_with(&dir, &backend, precision))
            .py()?;
        Ok(PyGpt2 { inner })
    }

    /// The logits at every position of one sequence: a float32 array `[len(ids), vocabulary]`.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<usize>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let rows = py.detach(|| self.inner.logits(&ids)).py()?;
        let vocabulary = self.inner.config().vocabulary;
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        numpy::ndarray::Array2::from_shape_vec((flat.len() / vocabulary.max(1), vocabulary), flat)
            .map(|a| a.to_pyarray(py))
            .map_err(|e| to_py(Error::invalid(e.to_string())))
    }

    /// `count` token ids generated after `ids` with the key/value cache: temperature 0 takes
    /// the most likely token; `top_k` / `top_p` narrow the draw; `stop` ids end the generation
    /// (the stop id is the last one returned).
    #[pyo3(signature = (ids, count, temperature = 1.0, top_k = None, top_p = None, seed = 0, stop = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        ids: Vec<usize>,
        count: usize,
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
        stop: Option<Vec<usize>>,
    ) -> PyResult<Vec<usize>> {
        let sampling = sampling(temperature, top_k, top_p, seed);
        let stop = stop.unwrap_or_default();
        py.detach(|| self.inner.generate(&ids, count, &sampling, &stop))
            .py()
    }

    /// [`generate`] for several prompts of any lengths at once (left-padded; each row gets
    /// what it would alone); a list of token lists.
    #[pyo3(signature = (prompts, count, temperature = 1.0, top_k = None, top_p = None, seed = 0, stop = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate_batch(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<usize>>,
        count: usize,
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
        stop: Option<Vec<usize>>,
    ) -> PyResult<Vec<Vec<usize>>> {
        let sampling = sampling(temperature, top_k, top_p, seed);
        let stop = stop.unwrap_or_default();
        py.detach(|| self.inner.generate_batch(&prompts, count, &sampling, &stop))
            .py()
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` in Hugging Face's layout (what
    /// `transformers`' `GPT2LMHeadModel.from_pretrained(dir)` loads).
    fn save_pretrained(&self, py: Python<'_>, dir: PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.save_pretrained(&dir)).py()
    }

    /// Token ids are `0..vocabulary`.
    #[getter]
    fn vocabulary(&self) -> usize {
        self.inner.config().vocabulary
    }

    /// The longest sequence (prompt plus generated tokens).
    #[getter]
    fn positions(&self) -> usize {
        self.inner.config().positions
    }

    /// The end-of-text id of the config, if any.
    #[getter]
    fn end_of_text(&self) -> Option<usize> {
        self.inner.config().end_of_text
    }

    /// Parameters (the tied head counted once).
    #[getter]
    fn parameter_count(&self) -> usize {
        self.inner.config().parameter_count()
    }
}

/// GPT-2's tokenizer (Python: `arrayjit.Gpt2Tokenizer`).
#[pyclass(name = "Gpt2Tokenizer", module = "arrayjit", frozen)]
pub struct PyGpt2Tokenizer {
    inner: Gpt2Tokenizer,
}

#[pymethods]
impl PyGpt2Tokenizer {
    /// The tokenizer in a model directory: `tokenizer.json`, else `vocab.json` and
    /// `merges.txt`.
    #[staticmethod]
    fn from_pretrained(dir: PathBuf) -> PyResult<PyGpt2Tokenizer> {
        Ok(PyGpt2Tokenizer {
            inner: Gpt2Tokenizer::from_pretrained(&dir).py()?,
        })
    }

    /// The tokenizer of a `vocab.json` and a `merges.txt`.
    #[staticmethod]
    fn from_files(vocab: PathBuf, merges: PathBuf) -> PyResult<PyGpt2Tokenizer> {
        Ok(PyGpt2Tokenizer {
            inner: Gpt2Tokenizer::from_files(&vocab, &merges).py()?,
        })
    }

    /// The token ids of `text`.
    fn encode(&self, text: &str) -> PyResult<Vec<usize>> {
        self.inner.encode(text).py()
    }

    /// The text of `ids` (bytes that do not form UTF-8 become U+FFFD).
    fn decode(&self, ids: Vec<usize>) -> PyResult<String> {
        self.inner.decode(&ids).py()
    }

    /// Number of ids.
    #[getter]
    fn vocabulary(&self) -> usize {
        self.inner.vocabulary()
    }
}

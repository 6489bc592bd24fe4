//! The GPT demo's trainer and the demo datasets from Python: `arrayjit.CharVocab`,
//! `arrayjit.GptTrainer` (a character-level GPT trained with AdamW, as `arrayjit gpt` does)
//! and `arrayjit.moons`.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use arrayjit_ir::Error;
use arrayjit_tensor::nn::{AttentionKind, Gelu, GptConfig};
use arrayjit_tensor::{Optimizer, Precision};
use arrayjit_train::gpt::{CharVocab, GptTrainer, TrainerConfig};
use numpy::{PyArray1, PyArray2, ToPyArray};
use pyo3::prelude::*;

use crate::errors::{IntoPy, to_py};
use crate::routine::PyBackend;

/// `(ids, targets)` of a batch, each `[batch, context]`.
type IdPair<'py> = (Bound<'py, PyArray2<u64>>, Bound<'py, PyArray2<u64>>);

/// `(x, labels)` of a dataset.
type Points<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<u64>>);

/// A character vocabulary (Python: `arrayjit.CharVocab`).
#[pyclass(name = "CharVocab", module = "arrayjit", frozen)]
pub struct PyCharVocab {
    inner: CharVocab,
}

#[pymethods]
impl PyCharVocab {
    /// The characters of `text`, sorted.
    #[new]
    fn new(text: &str) -> PyCharVocab {
        PyCharVocab {
            inner: CharVocab::from_text(text),
        }
    }

    /// The ids of `text` (a character outside the vocabulary is an error).
    fn encode(&self, text: &str) -> PyResult<Vec<usize>> {
        self.inner.encode(text).py()
    }

    /// The text of `ids`.
    fn decode(&self, ids: Vec<usize>) -> String {
        self.inner.decode(&ids)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// The GPT demo's trainer (Python: `arrayjit.GptTrainer`).
#[pyclass(name = "GptTrainer", module = "arrayjit", frozen)]
pub struct PyGptTrainer {
    inner: Mutex<GptTrainer>,
    batch: usize,
    context: usize,
}

impl PyGptTrainer {
    fn lock(&self) -> MutexGuard<'_, GptTrainer> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl PyGptTrainer {
    /// A GPT over `vocabulary` ids, its training step compiled on `backend`; `precision` is
    /// `"f32"` or `"bf16"` (matrix products of `bf16` operands accumulating in `f32`, the
    /// rest `f32`: on a GPU they run on its matrix units).
    #[new]
    #[pyo3(signature = (vocabulary, backend = None, context = 64, width = 128, heads = 4, layers = 2,
                        hidden = 512, batch = 16, lr = 3e-3, weight_decay = 0.01, clip_norm = Some(1.0),
                        dropout = 0.0, seed = 1, precision = "f32", attention = "fused"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        vocabulary: usize,
        backend: Option<PyRef<'_, PyBackend>>,
        context: usize,
        width: usize,
        heads: usize,
        layers: usize,
        hidden: usize,
        batch: usize,
        lr: f64,
        weight_decay: f64,
        clip_norm: Option<f64>,
        dropout: f64,
        seed: u64,
        precision: &str,
        attention: &str,
    ) -> PyResult<PyGptTrainer> {
        let precision: Precision = precision.parse().py()?;
        let backend = match backend {
            Some(b) => b.inner.clone(),
            None => arrayjit_runtime::default_backend().py()?,
        };
        let config = TrainerConfig {
            model: GptConfig {
                vocabulary,
                context,
                width,
                heads,
                layers,
                hidden,
                gelu: Gelu::Tanh,
                precision,
                attention: AttentionKind::parse(attention).py()?,
            },
            batch,
            optimizer: Optimizer::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay,
            },
            clip_norm,
            dropout,
            seed,
        };
        let trainer = py.detach(|| GptTrainer::new(&backend, &config)).py()?;
        Ok(PyGptTrainer {
            inner: Mutex::new(trainer),
            batch,
            context,
        })
    }

    /// `(ids, targets)` for step `step`: `batch` windows drawn from `data` with the
    /// counter-based RNG of `seed`, each `[batch, context]`.
    fn batch<'py>(
        &self,
        py: Python<'py>,
        data: Vec<usize>,
        step: u64,
        seed: u64,
    ) -> PyResult<IdPair<'py>> {
        let (ids, targets) =
            arrayjit_train::gpt::batch(&data, self.batch, self.context, step, seed).py()?;
        let shape = (self.batch, self.context);
        let as_array = |v: Vec<usize>| -> PyResult<Bound<'py, PyArray2<u64>>> {
            let v: Vec<u64> = v.into_iter().map(|x| x as u64).collect();
            numpy::ndarray::Array2::from_shape_vec(shape, v)
                .map(|a| a.to_pyarray(py))
                .map_err(|e| to_py(Error::invalid(e.to_string())))
        };
        Ok((as_array(ids)?, as_array(targets)?))
    }

    /// One training step on `ids` and `targets` (`batch · context` ids each); returns the loss.
    fn train_step(&self, py: Python<'_>, ids: Vec<usize>, targets: Vec<usize>) -> PyResult<f64> {
        let r = py.detach(|| self.lock().train_step(&ids, &targets)).py();
        py.check_signals()?;
        r
    }

    /// The held-out loss of `ids` and `targets` (no update).
    fn eval_loss(&self, py: Python<'_>, ids: Vec<usize>, targets: Vec<usize>) -> PyResult<f64> {
        py.detach(|| self.lock().eval_loss(&ids, &targets)).py()
    }

    /// Starts compiling the held-out-loss and sampling routines on a thread of their own, so
    /// that their first use does not wait for the compiler (worth it where training leaves a
    /// core idle); returns whether a thread was started (False when they are built or being
    /// compiled already).
    fn compile_ahead(&self) -> bool {
        self.lock().compile_ahead()
    }

    /// `count` ids sampled after `prompt` at `temperature` (0: the most likely id).
    #[pyo3(signature = (prompt, count, temperature = 1.0, seed = 0))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Vec<usize>,
        count: usize,
        temperature: f64,
        seed: u64,
    ) -> PyResult<Vec<usize>> {
        py.detach(|| self.lock().generate(&prompt, count, temperature, seed))
            .py()
    }

    /// Saves the parameters and the optimizer's state (safetensors).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.lock().save(&path)).py()
    }

    /// Loads what `save` wrote (nothing changes on an error); returns the step count reached.
    fn load(&self, py: Python<'_>, path: PathBuf) -> PyResult<u64> {
        py.detach(|| self.lock().load(&path)).py()
    }
}

/// The two-moons dataset: `(x, labels)`, `x` of shape `[n, 2]` (float64), labels 0 or 1.
#[pyfunction]
#[pyo3(signature = (n, noise = 0.1, seed = 0))]
pub fn moons<'py>(py: Python<'py>, n: usize, noise: f64, seed: u64) -> PyResult<Points<'py>> {
    let d = arrayjit_tensor::datasets::moons(n, noise, seed).py()?;
    let x = numpy::ndarray::Array2::from_shape_vec((d.len(), d.features), d.x)
        .map_err(|e| to_py(Error::invalid(e.to_string())))?;
    let labels: Vec<u64> = d.labels.iter().map(|&l| l as u64).collect();
    Ok((x.to_pyarray(py), labels.to_pyarray(py)))
}

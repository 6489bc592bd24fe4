//! Backends, compiled routines and training from Python: `arrayjit.backends()`,
//! `arrayjit.backend(name)`, `arrayjit.compile(outputs)` (a forward routine),
//! `arrayjit.backward(loss)` (forward and gradients, read on the host), `arrayjit.Trainer`
//! (forward, gradients and the optimizer's update as one compiled step) and checkpoints.
//! Routines run with the GIL released; loops of steps check for Ctrl-C between steps.

use std::path::PathBuf;

use arrayjit_ir::{Error, Tnode};
use arrayjit_runtime::{Backend, CompileRequest, Context, Routine};
use arrayjit_tensor::{Optimizer, Tensor, checkpoint, forward_program, grad_program};
use pyo3::prelude::*;

use crate::errors::{IntoPy, to_py};
use crate::tensor::{PyTensor, hosted, hosted_node};

/// A backend (Python: `arrayjit.Backend`).
#[pyclass(name = "Backend", module = "arrayjit", frozen)]
#[derive(Clone)]
pub struct PyBackend {
    pub(crate) inner: Backend,
}

#[pymethods]
impl PyBackend {
    /// Its name (`sync_cc`, `multicore_cc`, `cuda_emu`, `wgpu`, `cuda`).
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// How many devices it has.
    #[getter]
    fn num_devices(&self) -> usize {
        self.inner.num_devices()
    }

    /// Each device's description.
    fn devices(&self) -> PyResult<Vec<String>> {
        (0..self.inner.num_devices())
            .map(|i| self.inner.get_device(i).map(|d| d.name()))
            .collect::<arrayjit_ir::Result<_>>()
            .py()
    }

    /// Allows (`True`) or forbids (`False`) f32 matrix products on a GPU's matrix units as
    /// TF32 for later compiles; `None` follows `ARRAYJIT_ALLOW_TF32` (off when unset), as
    /// PyTorch's `torch.backends.cuda.matmul.allow_tf32`.
    #[pyo3(signature = (allow = None))]
    fn set_allow_tf32(&self, allow: Option<bool>) {
        self.inner.set_allow_tf32(allow);
    }

    /// Bounds the bytes each device's arrays may take (`None`: only the devices' free memory
    /// bounds them, or `ARRAYJIT_MEMORY_LIMIT_MB` when set at the backend's creation). A
    /// compile or trainer that would pass it raises `OutOfMemoryError` saying how much it
    /// needs and has, before allocating anything.
    #[pyo3(signature = (bytes = None))]
    fn set_memory_limit(&self, bytes: Option<usize>) {
        self.inner.set_memory_limit(bytes);
    }

    /// The bound set by `set_memory_limit`, if any, in bytes.
    #[getter]
    fn memory_limit(&self) -> Option<usize> {
        self.inner.memory_limit()
    }

    /// Sets the largest pool (one allocation) the link-time planner groups small arrays into,
    /// in bytes (at least 1; the default is `ARRAYJIT_MAX_POOL_MB` when set at the backend's
    /// creation, else 1 GiB). An array larger than it gets a pool of its own: only the
    /// device's memory bounds an array.
    fn set_max_pool_bytes(&self, bytes: usize) {
        self.inner.set_max_pool_bytes(bytes);
    }

    /// The pool size limit in bytes (see `set_max_pool_bytes`).
    #[getter]
    fn max_pool_bytes(&self) -> usize {
        self.inner.max_pool_bytes()
    }

    /// Unused bytes the planner leaves around every array of a pool (`ARRAYJIT_POOL_GUARD_BYTES`
    /// at the backend's creation; CPU backends only, else 0).
    #[getter]
    fn pool_guard_bytes(&self) -> usize {
        self.inner.lowered().runtime().pool_guard_bytes()
    }

    /// The bytes device `device` may still allocate (its free memory where the backend can
    /// tell, lowered to what the memory limit leaves), or `None` when unknown.
    #[pyo3(signature = (device = 0))]
    fn available_memory(&self, device: usize) -> PyResult<Option<usize>> {
        Ok(self
            .inner
            .get_device(device)
            .py()?
            .available_memory()
            .map(|(bytes, _)| bytes))
    }

    fn __repr__(&self) -> String {
        format!(
            "Backend({}, {} device(s))",
            self.inner.name(),
            self.inner.num_devices()
        )
    }
}

/// The names of the backends that can run here.
#[pyfunction]
pub fn backends() -> Vec<&'static str> {
    arrayjit_runtime::available_backends()
}

/// The backend named `name` (`None`: the default, or `ARRAYJIT_BACKEND`).
#[pyfunction]
#[pyo3(signature = (name = None))]
pub fn backend(name: Option<&str>) -> PyResult<PyBackend> {
    let inner = match name {
        Some(n) => arrayjit_runtime::backend(n),
        None => arrayjit_runtime::default_backend(),
    }
    .py()?;
    Ok(PyBackend { inner })
}

fn resolve(b: Option<PyRef<'_, PyBackend>>) -> PyResult<Backend> {
    match b {
        Some(b) => Ok(b.inner.clone()),
        None => arrayjit_runtime::default_backend().py(),
    }
}

/// Compiles `program` on `backend` and links it into a new context on a new stream of
/// `device`.
fn compile_and_link(
    py: Python<'_>,
    backend: &Backend,
    device: usize,
    name: &str,
    program: &arrayjit_ir::Assignments,
) -> PyResult<Routine> {
    py.detach(|| {
        let stream = backend.get_device(device)?.new_stream()?;
        let code = backend.compile(CompileRequest::routine(name, program))?;
        Context::new(&stream).link(&code)
    })
    .py()
}

/// How long runs go on with the GIL released between two checks for Ctrl-C.
const SIGNAL_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs `routine` `steps` times with the GIL released, checking for Ctrl-C between runs at
/// least every [`SIGNAL_CHECK_EVERY`] (a `KeyboardInterrupt` leaves the routine usable: the run
/// in progress finishes first). The GIL is taken back only for those checks, not after every
/// run: the process's other Python threads get it meanwhile without competing with a loop that
/// drops and retakes it every few microseconds.
fn run_steps(
    py: Python<'_>,
    routine: &Routine,
    steps: usize,
    after: Option<&Tnode>,
) -> PyResult<()> {
    let mut done = 0;
    while done < steps {
        let ran = py.detach(|| -> arrayjit_ir::Result<usize> {
            let started = std::time::Instant::now();
            let mut ran = 0;
            while done + ran < steps {
                routine.run()?;
                ran += 1;
                if started.elapsed() >= SIGNAL_CHECK_EVERY {
                    break;
                }
            }
            Ok(ran)
        });
        done += ran.py()?;
        py.check_signals()?;
    }
    if let Some(tn) = after {
        // Waits for the work (with the GIL released) so that errors surface here.
        py.detach(|| tn.host().get_values().map(|_| ())).py()?;
    }
    Ok(())
}

/// A compiled routine (Python: `arrayjit.Routine`): `run()` computes its outputs, which are
/// then read with `Tensor.numpy()`.
#[pyclass(name = "Routine", module = "arrayjit", frozen)]
pub struct PyRoutine {
    routine: Routine,
    outputs: Vec<Tensor>,
}

#[pymethods]
impl PyRoutine {
    /// Runs it `steps` times (default once), waiting for the results.
    #[pyo3(signature = (steps = 1))]
    fn run(&self, py: Python<'_>, steps: usize) -> PyResult<()> {
        run_steps(
            py,
            &self.routine,
            steps,
            self.outputs.first().map(|t| t.node()),
        )
    }

    /// Its name.
    #[getter]
    fn name(&self) -> String {
        self.routine.name().to_string()
    }

    /// Its runs so far: `runs` scheduled, `timed_runs` timed (see `set_run_timing`), `failed`,
    /// `device_timed_runs` (timed by the device itself: a GPU's timestamps), and their
    /// `total_seconds` and `mean_seconds`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = self.routine.stats();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("runs", s.runs)?;
        d.set_item("timed_runs", s.timed_runs)?;
        d.set_item("failed", s.failed)?;
        d.set_item("device_timed_runs", s.device_timed_runs)?;
        d.set_item("total_seconds", s.total.as_secs_f64())?;
        d.set_item("mean_seconds", s.mean.as_secs_f64())?;
        d.set_item("peak_memory_bytes", s.memory.peak())?;
        d.set_item("array_bytes", s.memory.arrays)?;
        d.set_item("new_pool_bytes", s.memory.new_pools)?;
        d.set_item("scratch_bytes", s.memory.scratch)?;
        d.set_item("host_bytes", s.memory.host)?;
        Ok(d)
    }
}

/// Compiles the computation of `outputs` on `backend` (default: the default backend) for
/// `device`; the outputs stay readable on the host after each run.
#[pyfunction]
#[pyo3(signature = (outputs, backend = None, name = "forward", device = 0))]
pub fn compile(
    py: Python<'_>,
    outputs: Vec<PyTensor>,
    backend: Option<PyRef<'_, PyBackend>>,
    name: &str,
    device: usize,
) -> PyResult<PyRoutine> {
    let backend = resolve(backend)?;
    let outputs: Vec<Tensor> = outputs.into_iter().map(|t| t.inner).collect();
    for t in &outputs {
        hosted(t)?;
    }
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let routine = compile_and_link(py, &backend, device, name, &forward_program(&refs))?;
    Ok(PyRoutine { routine, outputs })
}

/// Compiles the loss and the gradients of every parameter it reaches, all readable on the host
/// after a run (`Tensor.grad()`); no update.
#[pyfunction]
#[pyo3(signature = (loss, backend = None, device = 0))]
pub fn backward(
    py: Python<'_>,
    loss: PyRef<'_, PyTensor>,
    backend: Option<PyRef<'_, PyBackend>>,
    device: usize,
) -> PyResult<PyRoutine> {
    let backend = resolve(backend)?;
    let grads = grad_program(&loss.inner).py()?;
    hosted(&loss.inner)?;
    for p in &grads.params {
        if let Some(g) = p.grad() {
            hosted_node(g, "python: a gradient read on the host")?;
        }
    }
    let routine = compile_and_link(py, &backend, device, "backward", &grads.program)?;
    Ok(PyRoutine {
        routine,
        outputs: vec![loss.inner.clone()],
    })
}

/// An optimizer (Python: `arrayjit.SGD(...)` or `arrayjit.Adam(...)`).
#[pyclass(name = "Optimizer", module = "arrayjit", frozen)]
#[derive(Clone)]
pub struct PyOptimizer {
    inner: Optimizer,
}

#[pymethods]
impl PyOptimizer {
    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

fn check_rate(lr: f64) -> PyResult<()> {
    if lr.is_finite() && lr > 0.0 {
        Ok(())
    } else {
        Err(to_py(Error::BadValue {
            what: "learning rate".into(),
            value: lr.to_string(),
            expected: "a finite positive number".into(),
        }))
    }
}

/// SGD with momentum and weight decay.
#[pyfunction]
#[pyo3(name = "SGD", signature = (lr, momentum = 0.0, weight_decay = 0.0))]
pub fn sgd(lr: f64, momentum: f64, weight_decay: f64) -> PyResult<PyOptimizer> {
    check_rate(lr)?;
    Ok(PyOptimizer {
        inner: Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
        },
    })
}

/// Adam (AdamW when `weight_decay` > 0: decoupled).
#[pyfunction]
#[pyo3(name = "Adam", signature = (lr = 1e-3, betas = (0.9, 0.999), eps = 1e-8, weight_decay = 0.0))]
pub fn adam(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> PyResult<PyOptimizer> {
    check_rate(lr)?;
    Ok(PyOptimizer {
        inner: Optimizer::Adam {
            lr,
            beta1: betas.0,
            beta2: betas.1,
            eps,
            weight_decay,
        },
    })
}

/// A training step (Python: `arrayjit.Trainer`): forward, gradients and the optimizer's update
/// of every parameter the loss reaches, compiled as one routine.
#[pyclass(name = "Trainer", module = "arrayjit", frozen)]
pub struct PyTrainer {
    routine: Routine,
    loss: Tensor,
    params: Vec<Tensor>,
    state: Vec<Tensor>,
    lr: Tnode,
}

#[pymethods]
impl PyTrainer {
    #[new]
    #[pyo3(signature = (loss, optimizer, backend = None, clip_norm = None, device = 0))]
    fn new(
        py: Python<'_>,
        loss: PyRef<'_, PyTensor>,
        optimizer: PyRef<'_, PyOptimizer>,
        backend: Option<PyRef<'_, PyBackend>>,
        clip_norm: Option<f64>,
        device: usize,
    ) -> PyResult<PyTrainer> {
        let backend = resolve(backend)?;
        if !loss.inner.dims().iter().all(|&d| d == 1) {
            return Err(to_py(Error::shape_mismatch(
                "Trainer",
                &[loss.inner.dims()],
                format!(
                    "the loss must be a scalar but has shape {:?}; reduce it (e.g. .mean())",
                    loss.inner.dims()
                ),
            )));
        }
        // A loss that reaches no parameter is an error here (nothing to train).
        let grads = grad_program(&loss.inner).py()?;
        let update =
            arrayjit_tensor::update_program_clipped(&optimizer.inner, &grads.params, clip_norm)
                .py()?;
        hosted(&loss.inner)?;
        let step = grads.program.then(update.program.clone());
        let routine = compile_and_link(py, &backend, device, "train_step", &step)?;
        Ok(PyTrainer {
            routine,
            loss: loss.inner.clone(),
            params: grads.params,
            state: update.state,
            lr: update.lr,
        })
    }

    /// One step; returns the loss (before the update).
    fn step(&self, py: Python<'_>) -> PyResult<f64> {
        self.run(py, 1)
    }

    /// `steps` steps (Ctrl-C stops between two); returns the last loss.
    fn run(&self, py: Python<'_>, steps: usize) -> PyResult<f64> {
        run_steps(py, &self.routine, steps, None)?;
        let v = py.detach(|| self.loss.values()).py()?;
        Ok(v[0])
    }

    /// The parameters it trains.
    #[getter]
    fn params(&self) -> Vec<PyTensor> {
        self.params.iter().cloned().map(PyTensor::from).collect()
    }

    /// The learning rate (settable between steps).
    #[getter]
    fn get_lr(&self) -> PyResult<f64> {
        Ok(self.lr.host().get_values().py()?[0])
    }

    #[setter]
    fn set_lr(&self, lr: f64) -> PyResult<()> {
        check_rate(lr)?;
        self.lr.host().set_values(&[lr]).py()
    }

    /// Saves the parameters and the optimizer's state to a `.safetensors` file.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let all = self.saved();
        py.detach(|| checkpoint::save(&all, &path)).py()
    }

    /// Loads what `save` wrote (all or nothing: on an error nothing changes).
    fn load(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let all = self.saved();
        py.detach(|| checkpoint::load(&all, &path)).py()
    }
}

impl PyTrainer {
    fn saved(&self) -> Vec<Tensor> {
        let mut all = self.params.clone();
        all.extend(self.state.iter().cloned());
        all
    }
}

/// Saves tensors (parameters, hosted) to a `.safetensors` file, each in its own precision.
#[pyfunction]
pub fn save(py: Python<'_>, tensors: Vec<PyTensor>, path: PathBuf) -> PyResult<()> {
    let all: Vec<Tensor> = tensors.into_iter().map(|t| t.inner).collect();
    py.detach(|| checkpoint::save(&all, &path)).py()
}

/// Loads a `.safetensors` file into tensors of the same labels and shapes (all or nothing).
#[pyfunction]
pub fn load(py: Python<'_>, tensors: Vec<PyTensor>, path: PathBuf) -> PyResult<()> {
    let all: Vec<Tensor> = tensors.into_iter().map(|t| t.inner).collect();
    py.detach(|| checkpoint::load(&all, &path)).py()
}

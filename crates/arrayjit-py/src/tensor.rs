//! `arrayjit.Tensor`: a node of the tensor front end's graph, with NumPy in and out, the
//! operations (Python operators included, with NumPy broadcasting and Python numbers as
//! constants), reductions, views, activations and losses. Building a tensor computes nothing;
//! a compiled routine ([`crate::routine`]) runs the graph, and `numpy()` reads a hosted
//! tensor's values.

use arrayjit_ir::{EinsumGuard, Error, MemoryMode, MemoryType, Prec};
use arrayjit_tensor::{Init, Kind, Tensor, losses};
use numpy::{PyArrayDyn, PyReadonlyArrayDyn, ToPyArray};
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// A tensor of the graph (Python: `arrayjit.Tensor`).
#[pyclass(name = "Tensor", module = "arrayjit", frozen, from_py_object)]
#[derive(Clone)]
pub struct PyTensor {
    pub(crate) inner: Tensor,
}

impl From<Tensor> for PyTensor {
    fn from(inner: Tensor) -> PyTensor {
        PyTensor { inner }
    }
}

/// A tensor or a Python number, as the right operand of an operation.
#[derive(FromPyObject)]
pub enum Operand {
    /// A tensor.
    Tensor(PyTensor),
    /// A number: a constant of the other operand's precision.
    Number(f64),
}

impl Operand {
    fn tensor(self, like: &Tensor) -> arrayjit_ir::Result<Tensor> {
        match self {
            Operand::Tensor(t) => Ok(t.inner),
            Operand::Number(v) => Tensor::full(like.prec(), &[], v),
        }
    }
}

/// A precision from its name (`f32`, `float32`, `bf16`, ...).
pub fn parse_prec(name: &str) -> PyResult<Prec> {
    let short = match name {
        "float16" | "half" => "f16",
        "bfloat16" => "bf16",
        "float32" | "float" => "f32",
        "float64" | "double" => "f64",
        "int32" => "i32",
        "int64" => "i64",
        "uint8" => "u8",
        "uint16" => "u16",
        "uint32" => "u32",
        "uint64" => "u64",
        other => other,
    };
    Prec::parse(short).map_err(|e| crate::errors::to_py(Error::from(e)))
}

/// Reads a float64 NumPy array: its dims and values, row-major.
pub fn read_array(values: &PyReadonlyArrayDyn<'_, f64>) -> (Vec<usize>, Vec<f64>) {
    let view = values.as_array();
    let dims = view.shape().to_vec();
    let flat = match view.as_slice() {
        Some(s) => s.to_vec(),
        None => view.iter().copied().collect(),
    };
    (dims, flat)
}

/// Anything NumPy takes as an array (an ndarray, a list, a number), as a NumPy array: the
/// array, its dims, and the precision matching its dtype (`None` for a dtype arrayjit lacks,
/// e.g. bool).
pub fn as_numpy<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, Vec<usize>, Option<Prec>)> {
    let np = obj.py().import("numpy")?;
    let arr = np.call_method1("asarray", (obj,))?;
    let dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    let dims: Vec<usize> = arr.getattr("shape")?.extract()?;
    let prec = match dtype.as_str() {
        "float16" => Some(Prec::F16),
        "float32" => Some(Prec::F32),
        "float64" => Some(Prec::F64),
        "int32" => Some(Prec::I32),
        "int64" => Some(Prec::I64),
        "uint8" => Some(Prec::U8),
        "uint16" => Some(Prec::U16),
        "uint32" => Some(Prec::U32),
        "uint64" => Some(Prec::U64),
        _ => None,
    };
    Ok((arr, dims, prec))
}

/// A NumPy array's values as f64, row-major.
pub fn f64_values(arr: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let np = arr.py().import("numpy")?;
    let f64s = np.call_method1("ascontiguousarray", (arr, "float64"))?;
    let values: PyReadonlyArrayDyn<'_, f64> = f64s.extract()?;
    Ok(read_array(&values).1)
}

/// The NumPy dtype name a precision reads back as (bf16, which NumPy lacks, as float32).
fn numpy_dtype(prec: Prec) -> &'static str {
    match prec {
        Prec::U8 => "uint8",
        Prec::U16 => "uint16",
        Prec::I32 => "int32",
        Prec::U32 => "uint32",
        Prec::I64 => "int64",
        Prec::U64 => "uint64",
        Prec::F16 => "float16",
        Prec::Bf16 | Prec::F32 => "float32",
        _ => "float64",
    }
}

/// A float64 array of `dims` as a NumPy array of `prec`'s dtype.
fn to_numpy_as<'py>(
    py: Python<'py>,
    dims: &[usize],
    values: Vec<f64>,
    prec: Prec,
) -> PyResult<Bound<'py, PyAny>> {
    let arr = to_numpy(py, dims, values)?;
    arr.call_method1("astype", (numpy_dtype(prec),))
}

fn to_numpy<'py>(
    py: Python<'py>,
    dims: &[usize],
    values: Vec<f64>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let flat = numpy::ndarray::ArrayD::from_shape_vec(numpy::ndarray::IxDyn(dims), values)
        .map_err(|e| {
            crate::errors::to_py(Error::shape_mismatch(
                "reading values",
                &[dims],
                e.to_string(),
            ))
        })?;
    Ok(flat.to_pyarray(py))
}

fn unary(
    t: &PyTensor,
    f: impl FnOnce(&Tensor) -> arrayjit_ir::Result<Tensor>,
) -> PyResult<PyTensor> {
    f(&t.inner).py().map(PyTensor::from)
}

fn binary(
    t: &PyTensor,
    other: Operand,
    f: impl FnOnce(&Tensor, &Tensor) -> arrayjit_ir::Result<Tensor>,
) -> PyResult<PyTensor> {
    let other = other.tensor(&t.inner).py()?;
    f(&t.inner, &other).py().map(PyTensor::from)
}

/// `(left, right)` for a reflected operator (`2 - t`).
fn reflected(
    t: &PyTensor,
    other: Operand,
    f: impl FnOnce(&Tensor, &Tensor) -> arrayjit_ir::Result<Tensor>,
) -> PyResult<PyTensor> {
    let other = other.tensor(&t.inner).py()?;
    f(&other, &t.inner).py().map(PyTensor::from)
}

/// Axes from Python: `None` (all), one int, or a sequence; negative ones count from the end.
fn axes(t: &Tensor, axis: Option<Vec<isize>>) -> PyResult<Vec<usize>> {
    let rank = t.dims().len();
    match axis {
        None => Ok((0..rank).collect()),
        Some(list) => list.into_iter().map(|a| axis_of(rank, a)).collect(),
    }
}

fn axis_of(rank: usize, a: isize) -> PyResult<usize> {
    let r = rank as isize;
    if a < -r || a >= r {
        return Err(crate::errors::to_py(Error::BadAxis {
            what: "the tensor".into(),
            axis: a as i64,
            rank,
        }));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// `axis` as a list: Python passes an int or a sequence of ints.
#[derive(FromPyObject)]
pub enum Axes {
    /// One axis.
    One(isize),
    /// Several.
    Many(Vec<isize>),
}

impl Axes {
    fn list(axes: Option<Axes>) -> Option<Vec<isize>> {
        axes.map(|a| match a {
            Axes::One(a) => vec![a],
            Axes::Many(v) => v,
        })
    }
}

#[pymethods]
impl PyTensor {
    /// The dims, as a tuple.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.dims().to_vec()
    }

    /// The precision's name (`f32`, `bf16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.prec().name()
    }

    /// The label.
    #[getter]
    fn label(&self) -> String {
        self.inner.label()
    }

    /// `input`, `parameter` or `computed`.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.kind() {
            Kind::Input => "input",
            Kind::Parameter => "parameter",
            _ => "computed",
        }
    }

    /// Whether gradients flow to it.
    #[getter]
    fn requires_grad(&self) -> bool {
        self.inner.requires_grad()
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.dims().len()
    }

    /// The size of the first axis (a 0-d tensor has no length, as in NumPy).
    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .dims()
            .first()
            .copied()
            .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self) -> String {
        format!(
            "Tensor({}, shape={:?}, dtype={}, {})",
            self.inner.label(),
            self.inner.dims(),
            self.inner.prec().name(),
            self.kind()
        )
    }

    /// The values on the host as a NumPy array of the tensor's shape and dtype, after the
    /// routine that wrote them (waited for with the GIL released). By default a read-only view
    /// of the host array itself, no copy (later refreshes show through it; bf16, which NumPy
    /// lacks, reads as a float32 copy); `copy=True`: a writable snapshot. The tensor must be
    /// hosted: an input, a parameter, or an output of a compiled routine.
    #[pyo3(signature = (copy = false))]
    fn numpy<'py>(&self, py: Python<'py>, copy: bool) -> PyResult<Bound<'py, PyAny>> {
        if !copy && let Some(v) = crate::host::view(py, self.inner.node())? {
            return Ok(v);
        }
        let t = self.inner.clone();
        let values = py.detach(move || t.values()).py()?;
        to_numpy_as(py, self.inner.dims(), values, self.inner.prec())
    }

    /// NumPy's array protocol (`np.asarray(t)`): the values as `numpy()` gives them, converted
    /// to `dtype` when given; `copy=True` a snapshot.
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let values = self.numpy(py, copy.unwrap_or(false))?;
        match dtype {
            Some(d) => values.call_method1("astype", (d,)),
            None => Ok(values),
        }
    }

    /// The value of a one-element tensor as a Python float.
    fn item(&self, py: Python<'_>) -> PyResult<f64> {
        let t = self.inner.clone();
        let values = py.detach(move || t.values()).py()?;
        match values.as_slice() {
            [v] => Ok(*v),
            _ => Err(crate::errors::to_py(Error::shape_mismatch(
                "item",
                &[self.inner.dims()],
                format!(
                    "item() needs one element but {} has shape {:?}",
                    self.inner.label(),
                    self.inner.dims()
                ),
            ))),
        }
    }

    /// Sets the host values of an input or a parameter from an array of its shape (any NumPy
    /// dtype; converted to the tensor's precision); the next routine that reads it uploads
    /// them.
    fn assign(&self, values: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.inner.kind() == Kind::Computed {
            return Err(crate::errors::to_py(Error::invalid(format!(
                "{} is computed by the graph; assign values to inputs and parameters only",
                self.inner.label()
            ))));
        }
        if crate::host::copy_in(self.inner.node(), values)? {
            return Ok(());
        }
        let (arr, dims, _) = as_numpy(values)?;
        if dims != self.inner.dims() {
            return Err(crate::errors::to_py(Error::shape_mismatch(
                "assign",
                &[self.inner.dims(), &dims],
                format!(
                    "{} has shape {:?} but the values have {:?}",
                    self.inner.label(),
                    self.inner.dims(),
                    dims
                ),
            )));
        }
        let flat = f64_values(&arr)?;
        self.inner.node().host().set_values(&flat).py()
    }

    /// The gradient's values as a NumPy array, after a routine from `arrayjit.backward` ran;
    /// `None` if the tensor has no gradient.
    fn grad<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(g) = self.inner.grad().cloned() else {
            return Ok(None);
        };
        if !g.modes().is_hosted() {
            return Err(crate::errors::to_py(Error::NotHosted {
                node: g.debug_name(),
                detail: "the gradient was not computed by arrayjit.backward (a training \
                         step keeps gradients on the device)"
                    .into(),
            }));
        }
        let values = py.detach(move || g.host().get_values()).py()?;
        Ok(Some(to_numpy_as(
            py,
            self.inner.dims(),
            values,
            self.inner.prec(),
        )?))
    }

    /// Keeps the tensor's values on the host after routines run (outputs are hosted by
    /// `compile`; call this for other tensors to read).
    fn keep(&self) -> PyResult<()> {
        hosted(&self.inner)
    }

    fn __add__(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::add)
    }
    fn __radd__(&self, o: Operand) -> PyResult<PyTensor> {
        reflected(self, o, Tensor::add)
    }
    fn __sub__(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::sub)
    }
    fn __rsub__(&self, o: Operand) -> PyResult<PyTensor> {
        reflected(self, o, Tensor::sub)
    }
    fn __mul__(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::mul)
    }
    fn __rmul__(&self, o: Operand) -> PyResult<PyTensor> {
        reflected(self, o, Tensor::mul)
    }
    fn __truediv__(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::div)
    }
    fn __rtruediv__(&self, o: Operand) -> PyResult<PyTensor> {
        reflected(self, o, Tensor::div)
    }
    fn __pow__(&self, o: Operand, _modulo: Option<Py<PyAny>>) -> PyResult<PyTensor> {
        binary(self, o, Tensor::pow)
    }
    fn __matmul__(&self, o: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        unary(self, |t| t.matmul(&o.inner))
    }
    fn __rmatmul__(&self, o: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        o.inner.matmul(&self.inner).py().map(PyTensor::from)
    }
    fn __neg__(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::neg)
    }
    fn __lt__(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::cmplt)
    }
    fn __gt__(&self, o: Operand) -> PyResult<PyTensor> {
        reflected(self, o, Tensor::cmplt)
    }

    /// Elementwise equality (1 where equal, else 0).
    fn eq(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::cmpeq)
    }
    /// Elementwise maximum.
    fn maximum(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::maximum)
    }
    /// Elementwise minimum.
    fn minimum(&self, o: Operand) -> PyResult<PyTensor> {
        binary(self, o, Tensor::minimum)
    }
    /// Matrix product (batched over leading axes).
    fn matmul(&self, o: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        unary(self, |t| t.matmul(&o.inner))
    }
    /// max(x, 0).
    fn relu(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::relu)
    }
    /// e^x.
    fn exp(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::exp)
    }
    /// Natural logarithm.
    fn log(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::log)
    }
    /// Square root.
    fn sqrt(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::sqrt)
    }
    /// Hyperbolic tangent.
    fn tanh(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::tanh)
    }
    /// Logistic sigmoid.
    fn sigmoid(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::sigmoid)
    }
    /// GELU (`approximate="tanh"` for the tanh form).
    #[pyo3(signature = (approximate = "none"))]
    fn gelu(&self, approximate: &str) -> PyResult<PyTensor> {
        match approximate {
            "none" => unary(self, Tensor::gelu),
            "tanh" => unary(self, Tensor::gelu_tanh),
            other => Err(crate::errors::to_py(Error::BadValue {
                what: "gelu approximate".into(),
                value: other.into(),
                expected: "\"none\" or \"tanh\"".into(),
            })),
        }
    }
    /// x · sigmoid(x).
    fn silu(&self) -> PyResult<PyTensor> {
        unary(self, Tensor::silu)
    }
    /// Sum over `axis` (None: every axis); `keepdims` keeps them as size 1.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn sum(&self, axis: Option<Axes>, keepdims: bool) -> PyResult<PyTensor> {
        reduce(self, axis, keepdims, Tensor::sum, Tensor::sum_keepdim)
    }
    /// Mean over `axis` (None: every axis).
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn mean(&self, axis: Option<Axes>, keepdims: bool) -> PyResult<PyTensor> {
        reduce(self, axis, keepdims, Tensor::mean, Tensor::mean_keepdim)
    }
    /// Maximum over `axis` (None: every axis).
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn max(&self, axis: Option<Axes>, keepdims: bool) -> PyResult<PyTensor> {
        reduce(self, axis, keepdims, Tensor::max, Tensor::max_keepdim)
    }
    /// Softmax along `axis`.
    #[pyo3(signature = (axis = -1))]
    fn softmax(&self, axis: isize) -> PyResult<PyTensor> {
        let a = axis_of(self.inner.dims().len(), axis)?;
        unary(self, |t| t.softmax(a))
    }
    /// Log-softmax along `axis`.
    #[pyo3(signature = (axis = -1))]
    fn log_softmax(&self, axis: isize) -> PyResult<PyTensor> {
        let a = axis_of(self.inner.dims().len(), axis)?;
        unary(self, |t| t.log_softmax(a))
    }
    /// Layer normalization over the last axis, with `gain` and `bias` of that size.
    #[pyo3(signature = (gain, bias, eps = 1e-5))]
    fn layer_norm(
        &self,
        gain: PyRef<'_, PyTensor>,
        bias: PyRef<'_, PyTensor>,
        eps: f64,
    ) -> PyResult<PyTensor> {
        unary(self, |t| t.layer_norm(&gain.inner, &bias.inner, eps))
    }
    /// The axes permuted (`None`: reversed), read in place.
    #[pyo3(signature = (*perm))]
    fn transpose(&self, perm: Vec<isize>) -> PyResult<PyTensor> {
        let rank = self.inner.dims().len();
        let perm: Vec<usize> = if perm.is_empty() {
            (0..rank).rev().collect()
        } else {
            perm.into_iter()
                .map(|a| axis_of(rank, a))
                .collect::<PyResult<_>>()?
        };
        unary(self, |t| t.transpose(&perm))
    }
    /// The same values in another shape (one `-1` is inferred).
    #[pyo3(signature = (*shape))]
    fn reshape(&self, shape: Vec<isize>) -> PyResult<PyTensor> {
        let dims = infer_shape(self.inner.dims(), &shape)?;
        unary(self, |t| t.reshape(&dims))
    }
    /// `length` elements from `start` along `axis`.
    fn narrow(&self, axis: isize, start: usize, length: usize) -> PyResult<PyTensor> {
        let a = axis_of(self.inner.dims().len(), axis)?;
        unary(self, |t| t.narrow(a, start, length))
    }
    /// Rows of this table picked by the integer ids of `ids` (an embedding lookup).
    fn embedding(&self, ids: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        unary(self, |t| t.embedding(&ids.inner))
    }
    /// Multiplies by a number.
    fn scale(&self, k: f64) -> PyResult<PyTensor> {
        unary(self, |t| t.scale(k))
    }
    /// The same values without gradient flow.
    fn detach(&self) -> PyTensor {
        self.inner.detach().into()
    }
}

/// A reduction over `axis` (None: every axis): `plain` drops the axes, `keep` keeps them as
/// size 1.
fn reduce(
    t: &PyTensor,
    axis: Option<Axes>,
    keepdims: bool,
    plain: fn(&Tensor, &[usize]) -> arrayjit_ir::Result<Tensor>,
    keep: fn(&Tensor, &[usize]) -> arrayjit_ir::Result<Tensor>,
) -> PyResult<PyTensor> {
    let a = axes(&t.inner, Axes::list(axis))?;
    let f = if keepdims { keep } else { plain };
    f(&t.inner, &a).py().map(PyTensor::from)
}

/// The dims of a reshape, with one `-1` inferred from the element count.
fn infer_shape(dims: &[usize], shape: &[isize]) -> PyResult<Vec<usize>> {
    let total: usize = dims.iter().product();
    let known = shape
        .iter()
        .filter(|&&d| d >= 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .ok_or_else(|| {
            crate::errors::to_py(Error::shape_mismatch(
                "reshape",
                &[dims],
                format!("the shape {shape:?} has more elements than a machine can hold"),
            ))
        })?;
    let unknown = shape.iter().filter(|&&d| d < 0).count();
    if unknown > 1 || shape.iter().any(|&d| d < -1) {
        return Err(crate::errors::to_py(Error::BadValue {
            what: "reshape shape".into(),
            value: format!("{shape:?}"),
            expected: "sizes of at least 1, and at most one -1 (inferred)".into(),
        }));
    }
    shape
        .iter()
        .map(|&d| {
            if d >= 0 {
                Ok(d as usize)
            } else if known > 0 && total.is_multiple_of(known) {
                Ok(total / known)
            } else {
                Err(crate::errors::to_py(Error::shape_mismatch(
                    "reshape",
                    &[dims],
                    format!("{total} elements cannot take the shape {shape:?}"),
                )))
            }
        })
        .collect()
}

/// Marks a tensor's node hosted, so its values can be read after a routine runs.
pub fn hosted(t: &Tensor) -> PyResult<()> {
    hosted_node(t.node(), "python: read on the host")
}

/// Marks a node hosted, saying why.
pub fn hosted_node(tn: &arrayjit_ir::Tnode, why: &str) -> PyResult<()> {
    tn.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), why)
        .py()
}

/// Data on the host: a tensor (no gradient) holding `values` (anything NumPy takes as an
/// array), in `dtype` (default: the array's own dtype where arrayjit has it, else f32).
#[pyfunction]
#[pyo3(signature = (values, label = "input", dtype = None))]
pub fn tensor(values: &Bound<'_, PyAny>, label: &str, dtype: Option<&str>) -> PyResult<PyTensor> {
    let (arr, dims, own) = as_numpy(values)?;
    let prec = match dtype {
        Some(d) => parse_prec(d)?,
        None => own.unwrap_or(Prec::F32),
    };
    if own == Some(prec) {
        // The array's own dtype: one copy of its bytes into the new host array.
        let t = Tensor::zeros_input(prec, &dims, label).py()?;
        if crate::host::copy_in(t.node(), &arr)? {
            return Ok(t.into());
        }
    }
    let flat = f64_values(&arr)?;
    Tensor::input(prec, &dims, label, &flat)
        .py()
        .map(PyTensor::from)
}

/// Integer ids (e.g. tokens) below `upper`, as a tensor of `shape` for `embedding` and losses.
#[pyfunction]
pub fn ids(values: Vec<usize>, shape: Vec<usize>, upper: usize, label: &str) -> PyResult<PyTensor> {
    Tensor::ids(&shape, label, &values, upper)
        .py()
        .map(PyTensor::from)
}

/// Sets new ids into an `ids` tensor (same count, each below `upper`).
#[pyfunction]
pub fn set_ids(t: PyRef<'_, PyTensor>, values: Vec<usize>, upper: usize) -> PyResult<()> {
    t.inner.set_ids(&values, upper).py()
}

/// A trainable parameter of `shape`, filled on the host by `init`: `zeros`, `kaiming_uniform`,
/// `kaiming_normal`, `("constant", v)`, `("uniform", lo, hi)` or `("normal", mean, std)`, drawn
/// from the counter-based RNG with `seed` (`stream` separates parameters of one seed).
#[pyfunction]
#[pyo3(signature = (label, shape, init = InitSpec::Name("kaiming_uniform".into()), seed = 0, stream = 0, dtype = "f32"))]
pub fn param(
    label: &str,
    shape: Vec<usize>,
    init: InitSpec,
    seed: u64,
    stream: u32,
    dtype: &str,
) -> PyResult<PyTensor> {
    let prec = parse_prec(dtype)?;
    let init = init.to_init()?;
    Tensor::param_with_prec(label, prec, &shape, init, seed, stream)
        .py()
        .map(PyTensor::from)
}

/// An initializer from Python: a name, or a tuple of a name and numbers.
#[derive(FromPyObject)]
pub enum InitSpec {
    /// `zeros`, `kaiming_uniform`, `kaiming_normal`.
    Name(String),
    /// `(name, a)`.
    WithOne(String, f64),
    /// `(name, a, b)`.
    WithTwo(String, f64, f64),
}

impl InitSpec {
    fn to_init(&self) -> PyResult<Init> {
        let bad = |what: &str| {
            crate::errors::to_py(Error::BadValue {
                what: "init".into(),
                value: what.into(),
                expected: "\"zeros\", \"kaiming_uniform\", \"kaiming_normal\", (\"constant\", v), \
                           (\"uniform\", lo, hi) or (\"normal\", mean, std)"
                    .into(),
            })
        };
        Ok(match self {
            InitSpec::Name(n) => match n.as_str() {
                "zeros" => Init::Zeros,
                "kaiming_uniform" => Init::KaimingUniform,
                "kaiming_normal" => Init::KaimingNormal,
                other => return Err(bad(other)),
            },
            InitSpec::WithOne(n, a) => match n.as_str() {
                "constant" => Init::Constant(*a),
                other => return Err(bad(other)),
            },
            InitSpec::WithTwo(n, a, b) => match n.as_str() {
                "uniform" => Init::Uniform { lo: *a, hi: *b },
                "normal" => Init::Normal { mean: *a, std: *b },
                other => return Err(bad(other)),
            },
        })
    }
}

/// A tensor of `shape` filled with `value` (computed in code).
#[pyfunction]
#[pyo3(signature = (shape, value, dtype = "f32"))]
pub fn full(shape: Vec<usize>, value: f64, dtype: &str) -> PyResult<PyTensor> {
    let prec = parse_prec(dtype)?;
    Tensor::full(prec, &shape, value).py().map(PyTensor::from)
}

/// An einsum contraction, e.g. `einsum("ik,kj->ij", a, b)`.
#[pyfunction]
#[pyo3(signature = (spec, *operands))]
pub fn einsum(spec: &str, operands: Vec<PyTensor>) -> PyResult<PyTensor> {
    let refs: Vec<&Tensor> = operands.iter().map(|t| &t.inner).collect();
    Tensor::einsum(spec, &refs).py().map(PyTensor::from)
}

/// The product `einsum(spec, a, b)` summing only the terms where, for each
/// `(earlier, later, offset)` of `at_most`, letter `earlier` is at most letter `later` plus
/// `offset`: `guarded_product("bthe,bshe->bhts", q, k, [("s", "t", 0)])` is causal
/// attention's scores, the terms past the diagonal never computed. Gradients are guarded too.
#[pyfunction]
#[pyo3(signature = (spec, a, b, at_most))]
pub fn guarded_product(
    spec: &str,
    a: PyRef<'_, PyTensor>,
    b: PyRef<'_, PyTensor>,
    at_most: Vec<(String, String, i64)>,
) -> PyResult<PyTensor> {
    let letter = |s: &str| -> PyResult<char> {
        let mut chars = s.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => Ok(c),
            _ => Err(Error::BadValue {
                what: format!("guarded_product {spec:?}: a letter of at_most"),
                value: format!("{s:?}"),
                expected: "one letter of the spec".into(),
            })
            .py(),
        }
    };
    let guards = at_most
        .iter()
        .map(|(earlier, later, offset)| {
            Ok(EinsumGuard::at_most(
                letter(earlier)?,
                letter(later)?,
                *offset,
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    Tensor::guarded_product(spec, &a.inner, &b.inner, &guards)
        .py()
        .map(PyTensor::from)
}

/// `softmax(scale · q·kᵀ) · v` over `[batch, heads, time, features]` tensors (PyTorch's
/// `scaled_dot_product_attention`), fused: an online softmax over the keys, forward and
/// backward, never holding the scores. `is_causal` hides key `s` from query `t` where `s > t`;
/// `scale` defaults to `1 / √features`.
#[pyfunction]
#[pyo3(signature = (q, k, v, is_causal = false, scale = None))]
pub fn scaled_dot_product_attention(
    q: PyRef<'_, PyTensor>,
    k: PyRef<'_, PyTensor>,
    v: PyRef<'_, PyTensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> PyResult<PyTensor> {
    let options = arrayjit_tensor::AttentionOptions {
        causal: is_causal,
        scale,
        dropout: None,
        ..arrayjit_tensor::AttentionOptions::default()
    };
    Tensor::scaled_dot_product_attention(&q.inner, &k.inner, &v.inner, &options)
        .py()
        .map(PyTensor::from)
}

/// `a` where `cond` is non-zero, else `b`.
#[pyfunction]
#[pyo3(name = "where")]
pub fn where_(
    cond: PyRef<'_, PyTensor>,
    a: PyRef<'_, PyTensor>,
    b: PyRef<'_, PyTensor>,
) -> PyResult<PyTensor> {
    Tensor::where_(&cond.inner, &a.inner, &b.inner)
        .py()
        .map(PyTensor::from)
}

/// Mean squared error.
#[pyfunction]
pub fn mse(pred: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    losses::mse(&pred.inner, &target.inner)
        .py()
        .map(PyTensor::from)
}

/// Mean cross-entropy of `logits` (`[..., classes]`) against integer `targets` (an `ids`
/// tensor of the leading shape).
#[pyfunction]
pub fn cross_entropy(
    logits: PyRef<'_, PyTensor>,
    targets: PyRef<'_, PyTensor>,
) -> PyResult<PyTensor> {
    losses::cross_entropy(&logits.inner, &targets.inner)
        .py()
        .map(PyTensor::from)
}

/// Mean cross-entropy of `logits` against one-hot (or soft) `targets` of the same shape.
#[pyfunction]
pub fn softmax_cross_entropy(
    logits: PyRef<'_, PyTensor>,
    targets: PyRef<'_, PyTensor>,
) -> PyResult<PyTensor> {
    losses::softmax_cross_entropy(&logits.inner, &targets.inner)
        .py()
        .map(PyTensor::from)
}

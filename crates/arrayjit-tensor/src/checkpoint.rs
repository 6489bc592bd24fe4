//! Saving and loading parameters with `safetensors`: one tensor per parameter, named by its
//! label (labels must be unique within a checkpoint), in the parameter's own precision (F16,
//! BF16, F32, F64 and the integer types).
//!
//! Loading reads files written by arrayjit, PyTorch (`safetensors.torch.save_file`) or NumPy
//! (`safetensors.numpy.save_file`): shapes must match exactly; a tensor stored in another
//! numeric dtype than its parameter is converted to the parameter's precision (as PyTorch's
//! `load_state_dict` copies into a parameter's dtype), rounding to nearest.

use std::collections::HashMap;
use std::path::Path;

use arrayjit_ir::fallible::try_vec_filled;
use arrayjit_ir::{Error, Prec, Result};
use safetensors::tensor::{Dtype, TensorView};

use crate::tensor::Tensor;

fn names(params: &[Tensor]) -> Result<Vec<String>> {
    let names: Vec<String> = params.iter().map(|p| p.node().label().join(".")).collect();
    let mut sorted = names.clone();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::BadValue {
            what: "parameter label".into(),
            value: w[0].to_string(),
            expected: "labels unique among the checkpoint's parameters".into(),
        });
    }
    Ok(names)
}

/// The safetensors dtype of a precision.
fn dtype_of(prec: Prec) -> Dtype {
    match prec {
        Prec::U8 => Dtype::U8,
        Prec::U16 => Dtype::U16,
        Prec::I32 => Dtype::I32,
        Prec::U32 => Dtype::U32,
        Prec::I64 => Dtype::I64,
        Prec::U64 => Dtype::U64,
        Prec::F16 => Dtype::F16,
        Prec::Bf16 => Dtype::BF16,
        Prec::F32 => Dtype::F32,
        Prec::F64 => Dtype::F64,
    }
}

/// Decodes one little-endian element of a stored dtype.
type Decode = fn(&[u8]) -> f64;

/// The element size of a stored dtype this module reads (by its header name), with a decoder
/// of one little-endian element into f64; `None` for dtypes it does not read (bool, 8-bit
/// floats, complex).
fn decoder(dtype: &str) -> Option<(usize, Decode)> {
    fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        a
    }
    Some(match dtype {
        "U8" => (1, |b| b[0] as f64),
        "I8" => (1, |b| b[0] as i8 as f64),
        "U16" => (2, |b| u16::from_le_bytes(arr(b)) as f64),
        "I16" => (2, |b| i16::from_le_bytes(arr(b)) as f64),
        "U32" => (4, |b| u32::from_le_bytes(arr(b)) as f64),
        "I32" => (4, |b| i32::from_le_bytes(arr(b)) as f64),
        "U64" => (8, |b| u64::from_le_bytes(arr(b)) as f64),
        "I64" => (8, |b| i64::from_le_bytes(arr(b)) as f64),
        "F16" => (2, |b| half::f16::from_le_bytes(arr(b)).to_f64()),
        "BF16" => (2, |b| half::bf16::from_le_bytes(arr(b)).to_f64()),
        "F32" => (4, |b| f32::from_le_bytes(arr(b)) as f64),
        "F64" => (8, |b| f64::from_le_bytes(arr(b))),
        _ => return None,
    })
}

/// The parameter's values in its own precision, as little-endian bytes (logical elements
/// only: padding margins are not saved).
fn le_bytes(p: &Tensor) -> Result<Vec<u8>> {
    let prec = p.prec();
    let nd = arrayjit_ir::Ndarray::from_f64(prec, p.dims(), &p.values()?)?;
    let mut bytes = nd.as_bytes().to_vec();
    if cfg!(target_endian = "big") {
        for element in bytes.chunks_exact_mut(prec.size_in_bytes()) {
            element.reverse();
        }
    }
    Ok(bytes)
}

/// Writes the parameters' current values (brought to the host first) to a `.safetensors` file,
/// each in its own precision.
pub fn save(params: &[Tensor], path: &Path) -> Result<()> {
    let names = names(params)?;
    let mut data: Vec<(String, Dtype, Vec<u8>, Vec<usize>)> = Vec::new();
    for (p, name) in params.iter().zip(names) {
        data.push((name, dtype_of(p.prec()), le_bytes(p)?, p.dims().to_vec()));
    }
    let views = data
        .iter()
        .map(|(name, dtype, bytes, dims)| {
            TensorView::new(*dtype, dims.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Checkpoint {
                    path: path.display().to_string(),
                    detail: format!("parameter {name}: {e}"),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path).map_err(|e| {
        Error::Checkpoint {
            path: path.display().to_string(),
            detail: format!("writing it: {e}"),
        }
    })
}

/// Largest header accepted (the safetensors format's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor listed in a safetensors header, checked to hold numbers inside the file.
#[derive(Clone, Debug)]
pub struct StoredTensor {
    /// The dtype's name in the header (`F32`, `BF16`, ...).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Bytes from the start of the data section.
    start: u64,
    elem: usize,
    decode: Decode,
}

/// A safetensors file opened for reading: its header parsed and every entry checked (a numeric
/// dtype this module reads, data offsets that match the shape and lie inside the file) before
/// any data is read, so a bad or truncated file costs no more than its header.
pub struct SafetensorsFile {
    path: std::path::PathBuf,
    file: std::fs::File,
    data_start: u64,
    tensors: HashMap<String, StoredTensor>,
    /// Entries that hold no numbers this module reads (bool, 8-bit floats): named in errors.
    unreadable: HashMap<String, String>,
}

impl SafetensorsFile {
    /// Opens `path` and checks its header.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        use std::io::Read as _;
        let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        let bad = |detail: String| Error::Checkpoint {
            path: path.display().to_string(),
            detail,
        };
        let mut file = std::fs::File::open(path).map_err(|e| io("opening", e))?;
        let file_len = file.metadata().map_err(|e| io("inspecting", e))?.len();
        let mut len_bytes = [0u8; 8];
        file.read_exact(&mut len_bytes)
            .map_err(|_| bad("it is shorter than a safetensors header".into()))?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_BYTES || header_len > file_len - 8 {
            return Err(bad(format!(
                "its header claims {header_len} bytes (the file has {file_len}, the limit is {MAX_HEADER_BYTES})"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)
            .map_err(|e| io("reading the header of", e))?;
        let header: serde_json::Value = serde_json::from_slice(&header)
            .map_err(|e| bad(format!("its header is not JSON: {e}")))?;
        let entries = header
            .as_object()
            .ok_or_else(|| bad("its header is not a JSON object".into()))?;
        let data_start = 8 + header_len;
        let data_len = file_len - data_start;
        let mut tensors = HashMap::new();
        let mut unreadable = HashMap::new();
        for (name, entry) in entries {
            if name == "__metadata__" {
                continue;
            }
            let dtype = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("?");
            let shape: Option<Vec<usize>> = entry.get("shape").and_then(|s| {
                s.as_array()?
                    .iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            });
            let Some(shape) = shape else {
                return Err(bad(format!(
                    "tensor {name} has no valid shape in the header"
                )));
            };
            let Some((elem, decode)) = decoder(dtype) else {
                unreadable.insert(name.clone(), dtype.to_string());
                continue;
            };
            let offsets: Option<(u64, u64)> = entry.get("data_offsets").and_then(|o| {
                let o = o.as_array()?;
                Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?))
            });
            let want = shape
                .iter()
                .try_fold(elem as u64, |n, &d| n.checked_mul(d as u64));
            match (offsets, want) {
                (Some((start, end)), Some(want))
                    if end >= start && end - start == want && end <= data_len =>
                {
                    tensors.insert(
                        name.clone(),
                        StoredTensor {
                            dtype: dtype.to_string(),
                            shape,
                            start,
                            elem,
                            decode,
                        },
                    );
                }
                (other, want) => {
                    return Err(bad(format!(
                        "tensor {name} has data offsets {other:?}, but needs {} bytes within the \
                         {data_len} bytes of data (a truncated or damaged file?)",
                        want.map_or("more than 2^64".into(), |w| w.to_string())
                    )));
                }
            }
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            file,
            data_start,
            tensors,
            unreadable,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of the tensors whose numbers this module reads.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor `name`, if the file holds it with a numeric dtype.
    pub fn get(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.get(name)
    }

    /// The tensor `name`, or an error saying it is missing (or not numeric) and that nothing
    /// was loaded.
    pub fn expect(&self, name: &str) -> Result<&StoredTensor> {
        self.expect_named(name, "tensor")
    }

    /// [`SafetensorsFile::expect`], calling the tensor a `noun` in the error.
    fn expect_named(&self, name: &str, noun: &str) -> Result<&StoredTensor> {
        self.tensors.get(name).ok_or_else(|| {
            let detail = match self.unreadable.get(name) {
                Some(dtype) => format!(
                    "{noun} {name} is stored as {dtype}, which holds no numbers a parameter can \
                     take; nothing was loaded"
                ),
                None => format!("it has no {noun} {name}; nothing was loaded"),
            };
            Error::Checkpoint {
                path: self.path.display().to_string(),
                detail,
            }
        })
    }

    /// The tensor `name`, checked to have shape `dims`.
    pub fn expect_shape(&self, name: &str, dims: &[usize]) -> Result<&StoredTensor> {
        let t = self.expect(name)?;
        if t.shape != dims {
            return Err(Error::ShapeMismatch {
                op: format!("loading {name} from {}", self.path.display()),
                shapes: vec![t.shape.clone(), dims.to_vec()],
                detail: format!(
                    "the file holds {} {:?}, expected {dims:?}; nothing was loaded",
                    t.dtype, t.shape
                ),
            });
        }
        Ok(t)
    }

    /// The values of tensor `name`, row-major, converted to f64.
    pub fn read(&mut self, name: &str) -> Result<Vec<f64>> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let t = self.expect(name)?.clone();
        let n = t.shape.iter().product::<usize>().saturating_mul(t.elem);
        let path = self.path.clone();
        let mut bytes =
            try_vec_filled(n, 0u8, || format!("reading {name} from {}", path.display()))?;
        self.file
            .seek(SeekFrom::Start(self.data_start + t.start))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Ok(bytes.chunks_exact(t.elem).map(t.decode).collect())
    }
}

/// Reads parameters saved by [`save`] into the given tensors (matched by label; shapes must
/// agree). Devices reload the new values before their next use.
///
/// All or nothing: the header is read alone first and every parameter is checked against it
/// (present, a numeric dtype, same shape, data inside the file), then only the parameters'
/// bytes are read;
/// values change only once everything has been read. On any error no parameter changes, and a
/// file with a bad header costs no more than reading its header.
pub fn load(params: &[Tensor], path: &Path) -> Result<()> {
    let mut file = SafetensorsFile::open(path)?;
    let names = names(params)?;
    // Check every parameter before reading any data.
    for (p, name) in params.iter().zip(&names) {
        let t = file.expect_named(name, "parameter")?;
        if t.shape != p.dims() {
            return Err(Error::ShapeMismatch {
                op: format!("loading {name}"),
                shapes: vec![t.shape.clone(), p.dims().to_vec()],
                detail: format!(
                    "the file holds {} {:?}, the parameter is {} {:?}; nothing was loaded",
                    t.dtype,
                    t.shape,
                    p.prec().name(),
                    p.dims()
                ),
            });
        }
    }
    // Read every parameter's values, then change them all.
    let mut values = Vec::with_capacity(params.len());
    for name in &names {
        values.push(file.read(name)?);
    }
    set_all(params, values)
}

/// Sets every parameter's host values (devices reload them before their next use), after
/// bringing every host array up to date, so that the writes cannot fail halfway.
pub fn set_all(params: &[Tensor], values: Vec<Vec<f64>>) -> Result<()> {
    for p in params {
        p.node().host().prepare_read()?;
    }
    for (p, v) in params.iter().zip(values) {
        p.node().host().set_values(&v)?;
    }
    Ok(())
}

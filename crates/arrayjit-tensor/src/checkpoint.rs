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

/// Reads parameters saved by [`save`] into the given tensors (matched by label; shapes must
/// agree). Devices reload the new values before their next use.
///
/// All or nothing: the header is read alone first and every parameter is checked against it
/// (present, a numeric dtype, same shape, data inside the file), then only the parameters'
/// bytes are read;
/// values change only once everything has been read. On any error no parameter changes, and a
/// file with a bad header costs no more than reading its header.
pub fn load(params: &[Tensor], path: &Path) -> Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
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
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("its header is not JSON: {e}")))?;
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    // Check every parameter before reading any data.
    let mut plan = Vec::with_capacity(params.len());
    for (p, name) in params.iter().zip(names(params)?) {
        let entry = header
            .get(&name)
            .ok_or_else(|| bad(format!("it has no parameter {name}; nothing was loaded")))?;
        let dtype = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("?");
        let shape: Option<Vec<usize>> = entry.get("shape").and_then(|s| {
            s.as_array()?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect()
        });
        let Some((elem, decode)) = decoder(dtype) else {
            return Err(bad(format!(
                "parameter {name} is stored as {dtype}, which holds no numbers a parameter can \
                 take; nothing was loaded"
            )));
        };
        if shape.as_deref() != Some(p.dims()) {
            return Err(Error::ShapeMismatch {
                op: format!("loading {name}"),
                shapes: shape.iter().cloned().chain([p.dims().to_vec()]).collect(),
                detail: format!(
                    "the file holds {dtype} {shape:?}, the parameter is {} {:?}; nothing was loaded",
                    p.prec().name(),
                    p.dims()
                ),
            });
        }
        let offsets: Option<(u64, u64)> = entry.get("data_offsets").and_then(|o| {
            let o = o.as_array()?;
            Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?))
        });
        let want = p.dims().iter().product::<usize>() as u64 * elem as u64;
        match offsets {
            Some((start, end)) if end >= start && end - start == want && end <= data_len => {
                plan.push((p, start, elem, decode));
            }
            other => {
                return Err(bad(format!(
                    "parameter {name} has data offsets {other:?}, but needs {want} bytes within the \
                     {data_len} bytes of data"
                )));
            }
        }
    }
    // Read every parameter's values, then change them all.
    let mut values = Vec::with_capacity(plan.len());
    for (p, start, elem, decode) in &plan {
        let n = p.dims().iter().product::<usize>().saturating_mul(*elem);
        let mut bytes = try_vec_filled(n, 0u8, || {
            format!("reading {} from {}", p.label(), path.display())
        })?;
        file.seek(SeekFrom::Start(data_start + start))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| io("reading", e))?;
        values.push(bytes.chunks_exact(*elem).map(decode).collect::<Vec<f64>>());
    }
    // Bring every host array up to date first, so that the writes below cannot fail halfway.
    for (p, ..) in &plan {
        p.node().host().prepare_read()?;
    }
    for ((p, ..), v) in plan.iter().zip(values) {
        p.node().host().set_values(&v)?;
    }
    Ok(())
}

//! Saving and loading parameters with `safetensors`: one f32 tensor per parameter, named by its
//! label (labels must be unique within a checkpoint).

use std::collections::HashMap;
use std::path::Path;

use arrayjit_ir::fallible::try_vec_filled;
use arrayjit_ir::{Error, Result};
use safetensors::tensor::{Dtype, TensorView};

use crate::tensor::Tensor;

fn names(params: &[Tensor]) -> Result<Vec<String>> {
    let names: Vec<String> = params.iter().map(|p| p.node().label().join(".")).collect();
    let mut sorted = names.clone();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(format!(
            "two parameters are labelled {:?}; checkpoints need unique labels",
            w[0]
        )));
    }
    Ok(names)
}

/// Writes the parameters' current values (brought to the host first) to a `.safetensors` file.
pub fn save(params: &[Tensor], path: &Path) -> Result<()> {
    let names = names(params)?;
    let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
    for (p, name) in params.iter().zip(names) {
        let bytes: Vec<u8> = p
            .values()?
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        data.push((name, bytes, p.dims().to_vec()));
    }
    let views = data
        .iter()
        .map(|(name, bytes, dims)| {
            TensorView::new(Dtype::F32, dims.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::invalid(format!("parameter {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path)
        .map_err(|e| Error::invalid(format!("writing {}: {e}", path.display())))
}

/// Largest header accepted (the safetensors format's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Reads parameters saved by [`save`] into the given tensors (matched by label; shapes must
/// agree). Devices reload the new values before their next use.
///
/// All or nothing: the header is read alone first and every parameter is checked against it
/// (present, f32, same shape, data inside the file), then only the parameters' bytes are read;
/// values change only once everything has been read. On any error no parameter changes, and a
/// file with a bad header costs no more than reading its header.
pub fn load(params: &[Tensor], path: &Path) -> Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
    let bad = |detail: String| {
        Error::invalid(format!(
            "{} is not a valid checkpoint: {detail}",
            path.display()
        ))
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
            .ok_or_else(|| Error::invalid(format!("{} has no parameter {name}", path.display())))?;
        let dtype = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("?");
        let shape: Option<Vec<usize>> = entry.get("shape").and_then(|s| {
            s.as_array()?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect()
        });
        if dtype != "F32" || shape.as_deref() != Some(p.dims()) {
            return Err(Error::ShapeMismatch {
                op: format!("loading {name}"),
                detail: format!(
                    "the file holds {dtype} {shape:?}, the parameter is f32 {:?}; nothing was loaded",
                    p.dims()
                ),
            });
        }
        let offsets: Option<(u64, u64)> = entry.get("data_offsets").and_then(|o| {
            let o = o.as_array()?;
            Some((o.first()?.as_u64()?, o.get(1)?.as_u64()?))
        });
        let want = p.dims().iter().product::<usize>() as u64 * 4;
        match offsets {
            Some((start, end)) if end >= start && end - start == want && end <= data_len => {
                plan.push((p, start));
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
    for (p, start) in &plan {
        let n = p.dims().iter().product::<usize>().saturating_mul(4);
        let mut bytes = try_vec_filled(n, 0u8, || {
            format!("reading {} from {}", p.label(), path.display())
        })?;
        file.seek(SeekFrom::Start(data_start + start))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| io("reading", e))?;
        values.push(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect::<Vec<f64>>(),
        );
    }
    // Bring every host array up to date first, so that the writes below cannot fail halfway.
    for (p, _) in &plan {
        p.node().prepare_read()?;
    }
    for ((p, _), v) in plan.iter().zip(values) {
        p.node().set_values(&v)?;
    }
    Ok(())
}

//! Saving and loading parameters with `safetensors`: one f32 tensor per parameter, named by its
//! label (labels must be unique within a checkpoint).

use std::collections::HashMap;
use std::path::Path;

use arrayjit_ir::{Error, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

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

/// Reads parameters saved by [`save`] into the given tensors (matched by label; shapes must
/// agree). Devices reload the new values before their next use.
pub fn load(params: &[Tensor], path: &Path) -> Result<()> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        Error::invalid(format!("{} is not a safetensors file: {e}", path.display()))
    })?;
    for (p, name) in params.iter().zip(names(params)?) {
        let view = file.tensor(&name).map_err(|e| {
            Error::invalid(format!("{} has no parameter {name}: {e}", path.display()))
        })?;
        if view.dtype() != Dtype::F32 || view.shape() != p.dims() {
            return Err(Error::ShapeMismatch {
                op: format!("loading {name}"),
                detail: format!(
                    "the file holds {:?} {:?}, the parameter is f32 {:?}",
                    view.dtype(),
                    view.shape(),
                    p.dims()
                ),
            });
        }
        let values: Vec<f64> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect();
        p.node().set_values(&values)?;
    }
    Ok(())
}

//! Row operations over any axis: reductions that keep their axes, softmax and log-softmax,
//! layer norm and RMS norm, each with its gradient.
//!
//! Each is computed from its inputs without gradient tracking and given one backward rule of
//! its own (e.g. softmax's `y ⊙ (g - Σ g ⊙ y)`), so a transformer's graph holds one gradient
//! step per operation rather than one per elementwise piece.

use std::sync::Arc;

use arrayjit_ir::{Assignments, BinOp, Error, Result};

use crate::tensor::{BackwardFn, Rhs, Tensor, einsum_letters};

/// The letters of a tensor of rank `rank`, and those left after removing `axis`.
fn row_letters(op: &str, dims: &[usize], axis: usize) -> Result<(String, String)> {
    if axis >= dims.len() {
        return Err(Error::BadAxis {
            what: op.into(),
            axis: i64::try_from(axis).unwrap_or(i64::MAX),
            rank: dims.len(),
        });
    }
    let all = einsum_letters(0, dims.len(), op)?;
    let kept = all
        .chars()
        .enumerate()
        .filter(|(i, _)| *i != axis)
        .map(|(_, c)| c)
        .collect();
    Ok((all, kept))
}

/// `x[all] op r[kept]`, the reduced `r` stretched back over the removed axis (no gradient).
fn with_reduced(x: &Tensor, r: &Tensor, op: BinOp, all: &str, kept: &str) -> Result<Tensor> {
    Tensor::einsum_op(
        &format!("{all},{kept}->{all}"),
        Rhs::Bin(op),
        &[x, r],
        BinOp::Arg2,
        false,
        "row_op",
        None,
    )
}

/// A tensor with the values of `value` (computed from detached inputs) whose gradient flows to
/// `inputs` by `backward` (called with the tensor, whose last parent is `value`, and its
/// gradient; it returns one contribution per input).
pub(crate) fn function(value: Tensor, inputs: &[&Tensor], backward: BackwardFn) -> Tensor {
    let mut parents: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    parents.push(value.clone());
    let n = inputs.len();
    Tensor::custom(
        value.node().clone(),
        Assignments::Noop,
        parents,
        Some(Arc::new(move |out, g| {
            let mut grads = backward(out, g)?;
            grads.resize(n, None);
            grads.push(None);
            Ok(grads)
        })),
    )
}

/// The last parent of a tensor made by [`function`]: its value, without gradient.
fn value_of(out: &Tensor) -> Tensor {
    out.parents()
        .last()
        .expect("a function has its value")
        .clone()
}

impl Tensor {
    /// Sum over `axes`, keeping them as axes of size 1 (so the result broadcasts against
    /// `self`).
    pub fn sum_keepdim(&self, axes: &[usize]) -> Result<Tensor> {
        self.sum(axes)?.reshape(&keepdim_dims(self.dims(), axes))
    }

    /// Mean over `axes`, keeping them as axes of size 1.
    pub fn mean_keepdim(&self, axes: &[usize]) -> Result<Tensor> {
        self.mean(axes)?.reshape(&keepdim_dims(self.dims(), axes))
    }

    /// Maximum over `axes`, keeping them as axes of size 1.
    pub fn max_keepdim(&self, axes: &[usize]) -> Result<Tensor> {
        self.max(axes)?.reshape(&keepdim_dims(self.dims(), axes))
    }

    /// Softmax over `axis`: `exp(x - max) / Σ exp(x - max)` (the maximum is subtracted for
    /// stability and does not change the result). Gradient: `y ⊙ (g - Σ_axis g ⊙ y)`.
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        let (all, kept) = row_letters("softmax", self.dims(), axis)?;
        let x = self.detach();
        let max = x.max(&[axis])?;
        let e = with_reduced(&x, &max, BinOp::Sub, &all, &kept)?.exp()?;
        let total = e.sum(&[axis])?;
        let y = with_reduced(&e, &total, BinOp::Div, &all, &kept)?;
        Ok(function(
            y,
            &[self],
            Arc::new(move |out, g| {
                let y = value_of(out);
                let dot = g.mul(&y)?.sum(&[axis])?;
                let centered = with_reduced(g, &dot, BinOp::Sub, &all, &kept)?;
                Ok(vec![Some(centered.mul(&y)?)])
            }),
        ))
    }

    /// Log-softmax over `axis`: `x - max - log Σ exp(x - max)`. Gradient:
    /// `g - softmax(x) ⊙ Σ_axis g`.
    pub fn log_softmax(&self, axis: usize) -> Result<Tensor> {
        let (all, kept) = row_letters("log_softmax", self.dims(), axis)?;
        let x = self.detach();
        let max = x.max(&[axis])?;
        let shifted = with_reduced(&x, &max, BinOp::Sub, &all, &kept)?;
        let log_total = shifted.exp()?.sum(&[axis])?.log()?;
        let y = with_reduced(&shifted, &log_total, BinOp::Sub, &all, &kept)?;
        Ok(function(
            y,
            &[self],
            Arc::new(move |out, g| {
                let p = value_of(out).exp()?;
                let total = g.sum(&[axis])?;
                let spread = with_reduced(&p, &total, BinOp::Mul, &all, &kept)?;
                Ok(vec![Some(g.sub(&spread)?)])
            }),
        ))
    }

    /// Layer norm over the last axis: `(x - mean) / sqrt(var + eps) ⊙ gain + bias`, with the
    /// biased variance; `gain` and `bias` have the last axis's size.
    pub fn layer_norm(&self, gain: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        let normalized = self.normalize_rows("layer_norm", gain, eps, true)?;
        normalized.mul(gain)?.add(bias)
    }

    /// RMS norm over the last axis: `x / sqrt(mean(x²) + eps) ⊙ gain`.
    pub fn rms_norm(&self, gain: &Tensor, eps: f64) -> Result<Tensor> {
        let normalized = self.normalize_rows("rms_norm", gain, eps, false)?;
        normalized.mul(gain)
    }

    /// `x̂ = (x - c) · r` over the last axis, with `c` the row mean when `center` (else 0) and
    /// `r = 1 / sqrt(mean((x - c)²) + eps)`, as one function with its gradient
    /// `r · (g - mean(g) - x̂ · mean(g ⊙ x̂))` (without the `mean(g)` term when not centering).
    fn normalize_rows(&self, op: &str, gain: &Tensor, eps: f64, center: bool) -> Result<Tensor> {
        let dims = self.dims();
        let Some(&width) = dims.last() else {
            return Err(Error::ShapeMismatch {
                op: op.into(),
                shapes: vec![],
                detail: "a scalar has no row to normalize".into(),
            });
        };
        if gain.dims() != [width] {
            return Err(Error::ShapeMismatch {
                op: op.into(),
                shapes: vec![vec![width], gain.dims().to_vec()],
                detail: format!(
                    "the gain must have the last axis's size [{width}], got {:?}",
                    gain.dims()
                ),
            });
        }
        let axis = dims.len() - 1;
        let (all, kept) = row_letters(op, dims, axis)?;
        let x = self.detach();
        let centered = if center {
            let mean = x.mean(&[axis])?;
            with_reduced(&x, &mean, BinOp::Sub, &all, &kept)?
        } else {
            x
        };
        let rstd = centered
            .mul(&centered)?
            .mean(&[axis])?
            .add_scalar(eps)?
            .sqrt()?
            .recip()?;
        let normalized = with_reduced(&centered, &rstd, BinOp::Mul, &all, &kept)?;
        Ok(function(
            normalized,
            &[self],
            Arc::new(move |out, g| {
                let xhat = value_of(out);
                let proj = g.mul(&xhat)?.mean(&[axis])?;
                let along = with_reduced(&xhat, &proj, BinOp::Mul, &all, &kept)?;
                let mut d = g.sub(&along)?;
                if center {
                    let mean_g = g.mean(&[axis])?;
                    d = with_reduced(&d, &mean_g, BinOp::Sub, &all, &kept)?;
                }
                Ok(vec![Some(with_reduced(
                    &d,
                    &rstd,
                    BinOp::Mul,
                    &all,
                    &kept,
                )?)])
            }),
        ))
    }
}

/// `dims` with each of `axes` set to 1.
fn keepdim_dims(dims: &[usize], axes: &[usize]) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect()
}

//! Activation functions of transformers, with their gradients: `erf`, GELU in its exact form
//! (`erf`) and its tanh approximation (GPT-2's), and SiLU. `erf` is one IR operation (every
//! backend computes it; WGSL through a polynomial). GELU and SiLU are each one function with
//! one backward rule (see `normalize::function`): the forward pass keeps only its input and
//! result (its intermediates stay inside one fused loop), and the backward pass recomputes the
//! slope from the input, instead of saving every intermediate of a chain of elementwise
//! operations (measured on the GPT step: the chain wrote four arrays per MLP where two do).

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};
use std::sync::Arc;

use arrayjit_ir::{Result, UnOp};

use crate::normalize::function;
use crate::tensor::{Tensor, bw};

/// `1/√(2π)`: the standard normal density at 0.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// `Φ(x) = ½(1 + erf(x/√2))`, the standard normal distribution function (no gradient).
fn normal_cdf(x: &Tensor) -> Result<Tensor> {
    x.scale(FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?.scale(0.5)
}

/// `½(1 + tanh(√(2/π)(x + 0.044715 x³)))` and its inner argument's derivative factor.
fn tanh_gate(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let c = (2.0 / PI).sqrt();
    let x2 = x.mul(x)?;
    let inner = x.add(&x2.mul(x)?.scale(0.044715)?)?.scale(c)?;
    let t = inner.tanh()?;
    // d inner / dx = √(2/π)(1 + 3 · 0.044715 x²)
    let dinner = x2.scale(3.0 * 0.044715)?.add_scalar(1.0)?.scale(c)?;
    Ok((t, dinner))
}

impl Tensor {
    /// The error function `erf(x) = 2/√π ∫₀ˣ e^(−t²) dt`, elementwise. Its gradient is
    /// `2/√π · e^(−x²)`.
    pub fn erf(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Erf,
            "erf",
            bw(|out, g| {
                let x = out.parents()[0].detach();
                let slope = x.mul(&x)?.neg()?.exp()?.scale(FRAC_2_SQRT_PI)?;
                Ok(vec![Some(g.mul(&slope)?)])
            }),
        )
    }

    /// GELU, exact: `x · Φ(x) = ½ · x · (1 + erf(x / √2))` (PyTorch's
    /// `gelu(approximate="none")`). Gradient: `Φ(x) + x · φ(x)` with `φ(x) = e^(−x²/2)/√(2π)`.
    pub fn gelu(&self) -> Result<Tensor> {
        let x = self.detach();
        let y = x.mul(&normal_cdf(&x)?)?;
        Ok(function(
            y,
            &[self],
            Arc::new(|out, g| {
                let x = out.parents()[0].detach();
                let density = x.mul(&x)?.scale(-0.5)?.exp()?.scale(FRAC_1_SQRT_2PI)?;
                let slope = normal_cdf(&x)?.add(&x.mul(&density)?)?;
                Ok(vec![Some(g.mul(&slope)?)])
            }),
        ))
    }

    /// GELU, tanh approximation: `½ · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))` (GPT-2's,
    /// PyTorch's `gelu(approximate="tanh")`). Gradient, with `t` the tanh:
    /// `½(1 + t) + ½ x (1 − t²) √(2/π)(1 + 3 · 0.044715 x²)`.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        let x = self.detach();
        let (t, _) = tanh_gate(&x)?;
        let y = x.mul(&t.add_scalar(1.0)?.scale(0.5)?)?;
        Ok(function(
            y,
            &[self],
            Arc::new(|out, g| {
                let x = out.parents()[0].detach();
                let (t, dinner) = tanh_gate(&x)?;
                let gate = t.add_scalar(1.0)?.scale(0.5)?;
                let sech2 = t.mul(&t)?.neg()?.add_scalar(1.0)?;
                let slope = gate.add(&x.mul(&sech2)?.mul(&dinner)?.scale(0.5)?)?;
                Ok(vec![Some(g.mul(&slope)?)])
            }),
        ))
    }

    /// SiLU (swish): `x · sigmoid(x)`. Gradient: `σ(x)(1 + x(1 − σ(x)))`.
    pub fn silu(&self) -> Result<Tensor> {
        let x = self.detach();
        let y = x.mul(&x.sigmoid()?)?;
        Ok(function(
            y,
            &[self],
            Arc::new(|out, g| {
                let x = out.parents()[0].detach();
                let s = x.sigmoid()?;
                let slope = s.mul(&x.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)?;
                Ok(vec![Some(g.mul(&slope)?)])
            }),
        ))
    }
}

//! Activation functions of transformers, with their gradients: `erf`, GELU in its exact form
//! (`erf`) and its tanh approximation (GPT-2's), and SiLU. `erf` is one IR operation (every
//! backend computes it; WGSL through a polynomial); the others are built from elementwise
//! operations, so their gradients come from those.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};

use arrayjit_ir::{Result, UnOp};

use crate::tensor::{Tensor, bw};

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
    /// `gelu(approximate="none")`).
    pub fn gelu(&self) -> Result<Tensor> {
        let cdf = self
            .scale(FRAC_1_SQRT_2)?
            .erf()?
            .add_scalar(1.0)?
            .scale(0.5)?;
        self.mul(&cdf)
    }

    /// GELU, tanh approximation: `½ · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))` (GPT-2's,
    /// PyTorch's `gelu(approximate="tanh")`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        let cube = self.mul(self)?.mul(self)?;
        let inner = self.add(&cube.scale(0.044715)?)?.scale((2.0 / PI).sqrt())?;
        let half = inner.tanh()?.add_scalar(1.0)?.scale(0.5)?;
        self.mul(&half)
    }

    /// SiLU (swish): `x · sigmoid(x)`.
    pub fn silu(&self) -> Result<Tensor> {
        self.mul(&self.sigmoid()?)
    }
}

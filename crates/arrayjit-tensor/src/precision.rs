//! Precision policies: in which precision a model's matrix products multiply.
//!
//! - [`Precision::F32`]: everything in `f32`.
//! - [`Precision::Bf16Products`] (as PyTorch's autocast to `bf16`): parameters, activations,
//!   normalizations, softmax, losses and the optimizer's state stay `f32`; each matrix product
//!   (the linear layers, the attention's projections, scores and mixing, the output head)
//!   casts its two operands to `bf16` (rounded to nearest) and accumulates in `f32`, the
//!   result in `f32`. Backward, the incoming gradient is cast to `bf16` and the gradient
//!   products are `bf16` products too, giving `bf16` gradients of the casts, which the casts
//!   pass back to the `f32` values as `f32`. On a GPU with matrix units every one of these
//!   products runs on them; elsewhere they are loops over `bf16` values.
//!
//! **Accuracy.** `bf16` keeps 8 significant bits: each product's operands carry a relative
//! rounding error up to 2^-9. Training the demo GPT in `bf16` products follows the `f32`
//! loss curve within a few hundredths (checked over 300 steps in the tests).

use std::fmt;
use std::str::FromStr;

use arrayjit_ir::{EinsumGuard, Error, MemoryMode, Prec, Result};

use crate::tensor::Tensor;

/// In which precision a model's matrix products multiply (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Everything in `f32`.
    #[default]
    F32,
    /// Matrix products of `bf16` operands accumulating in `f32`; everything else `f32`.
    Bf16Products,
    /// Matrix weights stored in `bf16`, multiplied with `f32` activations accumulating in
    /// `f32`; everything else `f32` (inference).
    Bf16Weights,
}

impl Precision {
    /// The names [`Precision::from_str`] accepts.
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "bf16-weights"];

    /// The product of `a` and `b` by the einsum `spec` (two operands) under this policy.
    pub fn product(self, spec: &str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match self {
            Precision::F32 | Precision::Bf16Weights => Tensor::einsum(spec, &[a, b]),
            Precision::Bf16Products => {
                let result = Prec::promote(a.prec(), b.prec());
                Tensor::product_in(spec, &operand(a)?, &operand(b)?, Some(result))
            }
        }
    }

    /// [`Precision::product`] summing only the terms where `guards` hold (see
    /// [`Tensor::guarded_product`]).
    pub fn guarded_product(
        self,
        spec: &str,
        a: &Tensor,
        b: &Tensor,
        guards: &[EinsumGuard],
    ) -> Result<Tensor> {
        match self {
            Precision::F32 | Precision::Bf16Weights => Tensor::guarded_product(spec, a, b, guards),
            Precision::Bf16Products => {
                let result = Prec::promote(a.prec(), b.prec());
                Tensor::guarded_product_in(spec, &operand(a)?, &operand(b)?, guards, Some(result))
            }
        }
    }

    /// `x` as an operand of this policy's products: itself in `f32` and with `bf16` weights;
    /// cast to `bf16` (and kept as an array) for `bf16` products. A tensor several products
    /// read is cast once this way: a product of an operand already in `bf16` does not cast it
    /// again.
    pub fn operand(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Precision::F32 | Precision::Bf16Weights => Ok(x.clone()),
            Precision::Bf16Products => operand(x),
        }
    }

    /// The precision matrix weights are stored in: `bf16` for [`Precision::Bf16Weights`],
    /// `f32` otherwise (products in `bf16` cast `f32` weights).
    pub fn weight_prec(self) -> Prec {
        match self {
            Precision::Bf16Weights => Prec::Bf16,
            Precision::F32 | Precision::Bf16Products => Prec::F32,
        }
    }

    /// Whether a model in this policy can be trained: not with `bf16` weights, whose updates
    /// smaller than a weight's last bit would be lost.
    pub fn trainable(self) -> bool {
        self != Precision::Bf16Weights
    }

    /// Its name: `f32`, `bf16` or `bf16-weights`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16Products => "bf16",
            Precision::Bf16Weights => "bf16-weights",
        }
    }
}

/// `x` as a `bf16` operand of a matrix product: cast, and kept as an array (never inlined
/// into the product), so the product reads 16-bit factors and runs on matrix units where the
/// device has them.
fn operand(x: &Tensor) -> Result<Tensor> {
    let cast = x.cast(Prec::Bf16)?;
    if cast.prec() != x.prec() {
        cast.node().update_memory_mode(
            MemoryMode::NeverVirtual,
            "precision policy: a bf16 operand of a matrix product, kept as an array so the \
             product multiplies 16-bit factors (on matrix units where the device has them)",
        )?;
    }
    Ok(cast)
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// `f32`, `bf16` (matrix products in `bf16`) or `bf16-weights` (weights stored in `bf16`);
    /// any case.
    fn from_str(s: &str) -> Result<Precision> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16Products),
            "bf16-weights" | "bfloat16-weights" => Ok(Precision::Bf16Weights),
            _ => Err(Error::InvalidSetting {
                setting: "precision".into(),
                value: s.to_string(),
                expected: format!("one of {}", Precision::NAMES.join(", ")),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::grad_program;
    use arrayjit_ir::InterpEnv;

    #[test]
    fn names_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(
            "BF16".parse::<Precision>().unwrap(),
            Precision::Bf16Products
        );
        assert_eq!("f32".parse::<Precision>().unwrap(), Precision::F32);
        assert_eq!(
            "BF16_weights".parse::<Precision>().unwrap(),
            Precision::Bf16Weights
        );
        for p in [
            Precision::F32,
            Precision::Bf16Products,
            Precision::Bf16Weights,
        ] {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        }
        let e = "f8".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("f32, bf16, bf16-weights"), "{e}");
    }

    /// A `bf16` product of `f32` values is the product of the rounded values, accumulated in
    /// `f32`; its gradients are the `bf16` products of the rounded gradient and operands.
    #[test]
    fn bf16_products_round_operands_and_keep_f32_results_and_gradients() {
        // 1 + 2^-9 rounds to 1 in bf16 (ties to even); 3 is exact.
        let x = Tensor::param_with_prec(
            "x",
            Prec::F32,
            &[1, 2],
            crate::init::Init::Constant(1.0 + 2f64.powi(-9)),
            0,
            0,
        )
        .unwrap();
        let w = Tensor::param_with_prec(
            "w",
            Prec::F32,
            &[2, 1],
            crate::init::Init::Constant(3.0),
            0,
            1,
        )
        .unwrap();
        let y = Precision::Bf16Products
            .product("ik,kj->ij", &x, &w)
            .unwrap();
        assert_eq!(y.prec(), Prec::F32);
        let loss = y.sum_all().unwrap();
        let g = grad_program(&loss).unwrap();
        let code = g.program.lower(&[]).unwrap();
        let mut env = InterpEnv::from_host_arrays(&code);
        env.run(&code, &[]).unwrap();
        let value = env.array(y.node()).unwrap().to_vec_f64().unwrap();
        assert_eq!(value, vec![6.0]);
        // d loss / d x = w (exact in bf16): 3 each; d loss / d w = x rounded: 1 each.
        let gx = env.array(x.grad().unwrap()).unwrap().to_vec_f64().unwrap();
        let gw = env.array(w.grad().unwrap()).unwrap().to_vec_f64().unwrap();
        assert_eq!(gx, vec![3.0, 3.0]);
        assert_eq!(gw, vec![1.0, 1.0]);
        assert_eq!(x.grad().unwrap().prec(), Prec::F32);
        // F32 keeps the exact values.
        let y32 = Precision::F32.product("ik,kj->ij", &x, &w).unwrap();
        let code = crate::autodiff::forward_program(&[&y32])
            .lower(&[])
            .unwrap();
        let mut env = InterpEnv::from_host_arrays(&code);
        env.run(&code, &[]).unwrap();
        let v = env.array(y32.node()).unwrap().to_vec_f64().unwrap()[0];
        assert_eq!(v, 6.0 * (1.0 + 2f64.powi(-9)));
    }
}

//! Parameter initializers, drawn from the counter-based RNG so that a seed gives the same
//! parameters everywhere.

use arrayjit_ir::fallible::try_collect;
use arrayjit_ir::{Error, Result};

use arrayjit_ir::random::Philox;

/// How to fill a parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// Every element the same value.
    Constant(f64),
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f64,
        /// Upper bound (excluded).
        hi: f64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// He/Kaiming uniform for ReLU layers: bound `sqrt(6 / fan_in)`, where the fan-in is the
    /// first axis (a weight matrix is `[inputs, outputs]`).
    KaimingUniform,
    /// He/Kaiming normal: standard deviation `sqrt(2 / fan_in)`.
    KaimingNormal,
}

impl Init {
    /// The value of element `i` (row-major) of a parameter of shape `dims`: a pure function of
    /// the position, so an initializer fills an array in place, in any order.
    pub fn value_at(&self, dims: &[usize], seed: u64, stream: u32, i: usize) -> f64 {
        let fan_in = dims.first().copied().unwrap_or(1).max(1) as f64;
        let rng = Philox::new(seed, stream);
        let i = i as u64;
        match *self {
            Init::Zeros => 0.0,
            Init::Constant(c) => c,
            Init::Uniform { lo, hi } => lo + (hi - lo) * rng.uniform(i),
            Init::Normal { mean, std } => mean + std * rng.normal(i),
            Init::KaimingUniform => {
                let b = (6.0 / fan_in).sqrt();
                -b + 2.0 * b * rng.uniform(i)
            }
            Init::KaimingNormal => (2.0 / fan_in).sqrt() * rng.normal(i),
        }
    }

    /// The values for a parameter of shape `dims`; an [`Error::OutOfMemory`] (or a shape error
    /// when the element count overflows) instead of an abort for shapes too large to hold.
    pub fn values(&self, dims: &[usize], seed: u64, stream: u32) -> Result<Vec<f64>> {
        let n = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::OutOfMemory {
                what: format!("initial values of dims {dims:?}"),
                bytes: usize::MAX,
            })?;
        try_collect(
            n,
            (0..n).map(|i| self.value_at(dims, seed, stream, i)),
            || format!("initial values of shape {dims:?}"),
        )
    }
}

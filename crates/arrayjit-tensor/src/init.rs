//! Parameter initializers, drawn from the counter-based RNG so that a seed gives the same
//! parameters everywhere.

use crate::rng::Philox;

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
    /// The values for a parameter of shape `dims`.
    pub fn values(&self, dims: &[usize], seed: u64, stream: u32) -> Vec<f64> {
        let n: usize = dims.iter().product();
        let fan_in = dims.first().copied().unwrap_or(1).max(1) as f64;
        let rng = Philox::new(seed, stream);
        match *self {
            Init::Zeros => vec![0.0; n],
            Init::Constant(c) => vec![c; n],
            Init::Uniform { lo, hi } => rng.uniform_vec(n, lo, hi),
            Init::Normal { mean, std } => rng.normal_vec(n, mean, std),
            Init::KaimingUniform => {
                let b = (6.0 / fan_in).sqrt();
                rng.uniform_vec(n, -b, b)
            }
            Init::KaimingNormal => rng.normal_vec(n, 0.0, (2.0 / fan_in).sqrt()),
        }
    }
}

//! The counter-based random number generator every layer shares (Philox4x32-10, Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3"): a value depends only on its key (the seed)
//! and its counter, so the same seed gives the same numbers on every backend, in any order of
//! generation, and a value can be recomputed instead of stored.
//!
//! Two uses, with disjoint counters:
//! - host-side draws ([`Philox::block`], [`Philox::uniform`], [`Philox::normal`]): parameter
//!   initialization and data, counter `(position, stream, HOST_WORD)`;
//! - the IR's random op ([`crate::low_level::ScalarExpr::Random`], [`device_uniform`]): uniform values
//!   computed inside routines (dropout masks), counter `(position, stream, step)`, where the
//!   step is read from a node at run time so each training step draws fresh values.
//!
//! [`device_uniform`] is the definition every renderer's generated code reproduces bit for bit.

use crate::error::Result;
use crate::fallible::try_collect;

mod batch;
mod box_muller;

/// Philox4x32 with 10 rounds, keyed by a seed and a stream id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Philox {
    key: [u32; 2],
    stream: u32,
}

/// The last counter word of host-side draws (device draws put the step there).
pub const HOST_WORD: u32 = 0x4172_7261;

/// The value of the IR's random op ([`crate::low_level::ScalarExpr::Random`]): a uniform value in `[0, 1)`
/// with 24 random bits (exact in every float precision from `f32` up), from the first word of
/// Philox4x32-10 keyed by `seed` at counter `(index, stream, step)`.
pub fn device_uniform(seed: u64, stream: u32, index: u64, step: u32) -> f64 {
    let w = Philox::new(seed, stream).block_with(index, step)[0];
    (w >> 8) as f64 * (1.0 / (1u32 << 24) as f64)
}

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = (a as u64) * (b as u64);
    ((p >> 32) as u32, p as u32)
}

impl Philox {
    /// A generator for `seed`; `stream` separates independent sequences (e.g. one per tensor).
    pub fn new(seed: u64, stream: u32) -> Philox {
        Philox {
            key: [seed as u32, (seed >> 32) as u32],
            stream,
        }
    }

    /// Four random words for counter `n` (host-side draws).
    pub fn block(&self, n: u64) -> [u32; 4] {
        self.block_with(n, HOST_WORD)
    }

    /// Four random words for the counter `(n, stream, word)`: Philox4x32 with 10 rounds.
    pub fn block_with(&self, n: u64, word: u32) -> [u32; 4] {
        let mut c = [n as u32, (n >> 32) as u32, self.stream, word];
        let mut k = self.key;
        for _ in 0..10 {
            let (hi0, lo0) = mulhilo(M0, c[0]);
            let (hi1, lo1) = mulhilo(M1, c[2]);
            c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c
    }

    /// A uniform value in `[0, 1)` at position `i`.
    pub fn uniform(&self, i: u64) -> f64 {
        let b = self.block(i);
        let bits = ((b[0] as u64) << 21) ^ (b[1] as u64 >> 11);
        (bits & ((1u64 << 53) - 1)) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal value at position `i` (Box–Muller on two uniform words).
    pub fn normal(&self, i: u64) -> f64 {
        let b = self.block(i);
        let u1 = ((b[0] as f64) + 1.0) / 4_294_967_297.0;
        let u2 = (b[1] as f64) / 4_294_967_296.0;
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Four standard normal values from the four words of block `n`: two Box–Muller pairs,
    /// the cosine and the sine of each (one logarithm and one sine-and-cosine per two values,
    /// in plain arithmetic: the same bits on every machine, see `box_muller`). Lane
    /// `k` is the value at position `4n + k` of [`Philox::normal_at`].
    pub fn normals4(&self, n: u64) -> [f64; 4] {
        let b = self.block(n);
        let pair = |w0: u32, w1: u32| {
            let u1 = (w0 as f64 + 1.0) / 4_294_967_297.0;
            let u2 = w1 as f64 / 4_294_967_296.0;
            let r = (-2.0 * box_muller::ln_unit(u1)).sqrt();
            let (sin, cos) = box_muller::sin_cos_turns(u2);
            (r * cos, r * sin)
        };
        let (a, b1) = pair(b[0], b[1]);
        let (c, d) = pair(b[2], b[3]);
        [a, b1, c, d]
    }

    /// A standard normal value at position `i`, four to a block ([`Philox::normals4`]): the
    /// draws of parameter initializers, which fill arrays block by block.
    pub fn normal_at(&self, i: u64) -> f64 {
        self.normals4(i / 4)[(i % 4) as usize]
    }

    /// `n` uniform values in `[lo, hi)` (an [`crate::error::Error::OutOfMemory`] if `n` cannot be held).
    pub fn uniform_vec(&self, n: usize, lo: f64, hi: f64) -> Result<Vec<f64>> {
        try_collect(
            n,
            (0..n as u64).map(|i| lo + (hi - lo) * self.uniform(i)),
            || format!("{n} uniform random values"),
        )
    }

    /// `n` normal values with the given mean and standard deviation (an
    /// [`crate::error::Error::OutOfMemory`] if `n` cannot be held).
    pub fn normal_vec(&self, n: usize, mean: f64, std: f64) -> Result<Vec<f64>> {
        try_collect(
            n,
            (0..n as u64).map(|i| mean + std * self.normal(i)),
            || format!("{n} normal random values"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_four_to_a_block_are_standard_normal() {
        let rng = Philox::new(11, 3);
        let n = 200_000u64;
        let values: Vec<f64> = (0..n).map(|i| rng.normal_at(i)).collect();
        assert_eq!(rng.normals4(5)[2], rng.normal_at(22));
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
        // The cosine and sine halves of a pair are uncorrelated.
        let corr = (0..n / 4)
            .map(|b| {
                let v = rng.normals4(b);
                v[0] * v[1]
            })
            .sum::<f64>()
            / (n / 4) as f64;
        assert!(corr.abs() < 0.02, "correlation {corr}");
        // About 4.55% beyond two standard deviations, as for a normal distribution.
        let tail = values.iter().filter(|v| v.abs() > 2.0).count() as f64 / n as f64;
        assert!((tail - 0.0455).abs() < 0.003, "tail {tail}");
    }

    #[test]
    fn same_seed_same_values_different_streams_differ() {
        let a = Philox::new(7, 0);
        assert_eq!(a.block(3), Philox::new(7, 0).block(3));
        assert_ne!(a.block(3), Philox::new(7, 1).block(3));
        assert_ne!(a.block(3), Philox::new(8, 0).block(3));
        assert_ne!(a.block(3), a.block(4));
    }

    #[test]
    fn known_answer_of_the_reference_paper() {
        // Random123's known-answer test for philox4x32-10: counter and key all ones.
        let p = Philox {
            key: [u32::MAX, u32::MAX],
            stream: u32::MAX,
        };
        assert_eq!(
            p.block_with(u64::MAX, u32::MAX),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        let zero = Philox::new(0, 0);
        assert_eq!(
            zero.block_with(0, 0),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
    }

    #[test]
    fn device_uniform_is_in_the_unit_interval_and_varies_with_every_input() {
        let u = device_uniform(5, 1, 2, 3);
        assert!((0.0..1.0).contains(&u));
        assert_eq!(u, device_uniform(5, 1, 2, 3));
        for other in [
            device_uniform(6, 1, 2, 3),
            device_uniform(5, 2, 2, 3),
            device_uniform(5, 1, 3, 3),
            device_uniform(5, 1, 2, 4),
        ] {
            assert_ne!(u, other);
        }
        assert_eq!((u * (1 << 24) as f64).fract(), 0.0);
    }

    #[test]
    fn uniform_and_normal_have_the_right_moments() {
        let r = Philox::new(42, 0);
        let n = 20_000;
        let u = r.uniform_vec(n, 0.0, 1.0).unwrap();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean: f64 = u.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let z = r.normal_vec(n, 0.0, 1.0).unwrap();
        let m: f64 = z.iter().sum::<f64>() / n as f64;
        let v: f64 = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.03 && (v - 1.0).abs() < 0.05, "{m} {v}");
    }
}

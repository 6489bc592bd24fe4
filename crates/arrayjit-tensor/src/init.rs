//! Parameter initializers, drawn from the counter-based RNG so that a seed gives the same
//! parameters everywhere.

use arrayjit_ir::fallible::try_collect;
use arrayjit_ir::{Error, Result, Tnode};

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
            Init::Normal { mean, std } => mean + std * rng.normal_at(i),
            Init::KaimingUniform => {
                let b = (6.0 / fan_in).sqrt();
                -b + 2.0 * b * rng.uniform(i)
            }
            Init::KaimingNormal => (2.0 / fan_in).sqrt() * rng.normal_at(i),
        }
    }

    /// Elements `start..start + out.len()` (row-major) of a parameter of shape `dims` into
    /// `out`: the values of [`Init::value_at`], with normal draws taken four to a random block.
    pub fn fill(&self, dims: &[usize], seed: u64, stream: u32, start: usize, out: &mut [f64]) {
        let fan_in = dims.first().copied().unwrap_or(1).max(1) as f64;
        let (mean, std) = match *self {
            Init::Normal { mean, std } => (mean, std),
            Init::KaimingNormal => (0.0, (2.0 / fan_in).sqrt()),
            _ => {
                for (k, o) in out.iter_mut().enumerate() {
                    *o = self.value_at(dims, seed, stream, start + k);
                }
                return;
            }
        };
        let rng = Philox::new(seed, stream);
        let at = |k: usize| mean + std * rng.normal_at((start + k) as u64);
        // The positions before the first whole block, the whole blocks (many at a time), the
        // positions after the last.
        let head = (start.next_multiple_of(4) - start).min(out.len());
        let whole = (out.len() - head) / 4 * 4;
        for (k, o) in out[..head].iter_mut().enumerate() {
            *o = at(k);
        }
        let (middle, tail) = out[head..].split_at_mut(whole);
        rng.normals_into(((start + head) / 4) as u64, middle);
        for o in middle.iter_mut() {
            *o = mean + std * *o;
        }
        for (k, o) in tail.iter_mut().enumerate() {
            *o = at(head + whole + k);
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

/// One parameter's initial values, not drawn yet: the node, its shape and its initializer
/// with the seed and stream it draws from.
#[derive(Clone, Debug)]
struct PendingDraw {
    node: Tnode,
    dims: Vec<usize>,
    init: Init,
    seed: u64,
    stream: u32,
}

/// Parameters made by a deferring [`ParamFactory`](crate::nn::ParamFactory) whose initial
/// values are still to be drawn into their host arrays (which hold zeros until then).
///
/// Drawing a large model's parameters takes a noticeable share of its build (85 M normal draws
/// and the first touch of their memory for GPT-2 small's shape), and nothing but the values
/// depends on it: graphs can be built, optimized and compiled meanwhile. A trainer draws them
/// on one thread while it compiles on another, and links (copies the values to a device) only
/// after [`PendingDraws::draw`] returned. The values are the same as drawn at once: each is a
/// pure function of its position, seed and stream.
///
/// Dropping it without drawing leaves those parameters at zero; a caller that hands the
/// parameters on must draw first.
#[derive(Clone, Debug, Default)]
#[must_use = "the parameters hold zeros until their values are drawn"]
pub struct PendingDraws {
    draws: Vec<PendingDraw>,
}

impl PendingDraws {
    /// Records that `node` (of shape `dims`) is to be filled by `init` from `seed` and
    /// `stream`.
    pub(crate) fn push(&mut self, node: Tnode, dims: &[usize], init: Init, seed: u64, stream: u32) {
        self.draws.push(PendingDraw {
            node,
            dims: dims.to_vec(),
            init,
            seed,
            stream,
        });
    }

    /// How many parameters wait for their values.
    pub fn len(&self) -> usize {
        self.draws.len()
    }

    /// Whether no parameter waits for its values.
    pub fn is_empty(&self) -> bool {
        self.draws.is_empty()
    }

    /// Draws every pending parameter's values into its host array, in creation order (large
    /// arrays on several threads, as [`Tensor::param`](crate::Tensor::param) does). A host
    /// array that cannot be written (see `HostValues::fill`) is an error naming it; the
    /// parameters before it hold their values, those after it still hold zeros.
    pub fn draw(self) -> Result<()> {
        for d in self.draws {
            let PendingDraw {
                node,
                dims,
                init,
                seed,
                stream,
            } = d;
            node.host()
                .fill(|start, out| init.fill(&dims, seed, stream, start, out))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_ir::{Ndarray, Prec};

    const KINDS: [Init; 6] = [
        Init::Zeros,
        Init::Constant(0.5),
        Init::Uniform { lo: -2.0, hi: 3.0 },
        Init::Normal {
            mean: 1.0,
            std: 0.02,
        },
        Init::KaimingUniform,
        Init::KaimingNormal,
    ];

    #[test]
    fn deferred_draws_hold_zeros_until_drawn_then_the_values_drawn_at_once() {
        use crate::nn::{Gpt, GptConfig};
        let config = GptConfig::small(11);
        let at_once = Gpt::new(config, 5).unwrap();
        let (later, pending) = Gpt::with_pending_draws(config, 5).unwrap();
        assert_eq!(pending.len(), at_once.params().len());
        for p in later.params() {
            assert!(
                p.node().host().holds_initial_zeros(),
                "{}",
                p.node().debug_name()
            );
            let values = p.node().host().get_values().unwrap();
            assert!(values.iter().all(|&x| x == 0.0));
        }
        // Drawn on another thread, as a trainer does while it compiles.
        std::thread::spawn(move || pending.draw())
            .join()
            .unwrap()
            .unwrap();
        for (a, b) in at_once.params().iter().zip(later.params()) {
            let (va, vb) = (a.node().host().get_values(), b.node().host().get_values());
            assert_eq!(va.unwrap(), vb.unwrap(), "{}", a.node().debug_name());
            assert!(!b.node().host().holds_initial_zeros());
        }
        // A factory that draws at once has nothing pending.
        let mut f = crate::nn::ParamFactory::new(5);
        f.param("w", &[3, 4], Init::KaimingNormal).unwrap();
        assert!(f.take_pending().is_empty());
        // A deferring one hands its draws over once; later parameters start a new list.
        let mut f = crate::nn::ParamFactory::deferring(5);
        f.param("w", &[3, 4], Init::KaimingNormal).unwrap();
        assert_eq!(f.take_pending().len(), 1);
        assert!(f.take_pending().is_empty());
        f.param("b", &[4], Init::Zeros).unwrap();
        assert_eq!(f.take_pending().len(), 1);
    }

    #[test]
    fn a_fill_from_any_start_gives_the_values_at_each_position() {
        let dims = [7, 5];
        for init in KINDS {
            for start in [0, 1, 3, 4, 5] {
                let mut out = [0.0; 23];
                init.fill(&dims, 9, 2, start, &mut out);
                for (k, &x) in out.iter().enumerate() {
                    assert_eq!(x, init.value_at(&dims, 9, 2, start + k), "{init:?} {start}");
                }
            }
        }
    }

    #[test]
    fn a_parallel_fill_of_a_large_array_equals_the_values_one_by_one() {
        // Large enough for several threads and many chunks; f64 keeps every bit.
        let dims = [613, 1001];
        for init in [KINDS[2], KINDS[3], KINDS[5]] {
            let mut nd = Ndarray::zeros(Prec::F64, &dims).unwrap();
            nd.fill_with(|start, out| init.fill(&dims, 4, 1, start, out));
            let got = nd.to_vec_f64().unwrap();
            for (k, &x) in got.iter().enumerate() {
                assert_eq!(x, init.value_at(&dims, 4, 1, k), "{init:?} at {k}");
            }
            // In f32, each value is the f64 one rounded.
            let mut nd32 = Ndarray::zeros(Prec::F32, &dims).unwrap();
            nd32.fill_with(|start, out| init.fill(&dims, 4, 1, start, out));
            let got32 = nd32.to_vec_f64().unwrap();
            assert!(
                got32.iter().zip(&got).all(|(&a, &b)| a == b as f32 as f64),
                "{init:?}"
            );
        }
    }
}

//! Host-side normal draws many blocks at a time: the Philox rounds of a batch of counters
//! lane by lane, then the Box–Muller transform over arrays, so that both compile to vector
//! code (two lanes of the baseline x86-64 target, four or eight where the CPU has AVX2 or
//! AVX-512, detected at run time). Every operation is an exact integer one or a correctly
//! rounded IEEE one with no contraction, so the values are the same bits as
//! [`Philox::normals4`]'s, block by block, whatever the vector width.

use super::{HOST_WORD, M0, M1, Philox, W0, W1, box_muller};

/// Random blocks per batch (four values each).
const BATCH: usize = 64;

impl Philox {
    /// The standard normal values of blocks `first_block..` into `out` (four values a block,
    /// `out.len()` a multiple of four): the same values as [`Philox::normals4`] of each block,
    /// computed many at a time.
    ///
    /// # Panics
    /// If `out.len()` is not a multiple of four (a caller's bug, not a user's input).
    pub fn normals_into(&self, first_block: u64, out: &mut [f64]) {
        assert!(
            out.len().is_multiple_of(4),
            "normals_into fills whole blocks of four values, not {}",
            out.len()
        );
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F, checked just above.
                unsafe { normals_avx512(self, first_block, out) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                unsafe { normals_avx2(self, first_block, out) };
                return;
            }
        }
        normals_batches(self, first_block, out);
    }
}

/// [`normals_batches`] compiled for AVX-512 (the same operations on wider vectors).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn normals_avx512(rng: &Philox, first_block: u64, out: &mut [f64]) {
    normals_batches(rng, first_block, out);
}

/// [`normals_batches`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn normals_avx2(rng: &Philox, first_block: u64, out: &mut [f64]) {
    normals_batches(rng, first_block, out);
}

/// The normal values of whole blocks, [`BATCH`] blocks at a time.
#[inline(always)]
fn normals_batches(rng: &Philox, first_block: u64, out: &mut [f64]) {
    let mut words = [[0u32; BATCH]; 4];
    let mut pair = [[0f64; BATCH]; 3];
    for (b, chunk) in out.chunks_mut(4 * BATCH).enumerate() {
        let blocks = chunk.len() / 4;
        philox_lanes(
            rng,
            first_block.wrapping_add((b * BATCH) as u64),
            &mut words,
        );
        // Words 0 and 1 make the first pair of each block (values 0 and 1), words 2 and 3 the
        // second (values 2 and 3).
        for half in 0..2 {
            box_muller_lanes(&words[2 * half], &words[2 * half + 1], &mut pair);
            let [r, sin, cos] = &pair;
            for (j, value) in chunk.chunks_exact_mut(4).enumerate().take(blocks) {
                value[2 * half] = r[j] * cos[j];
                value[2 * half + 1] = r[j] * sin[j];
            }
        }
    }
}

/// Philox4x32-10 of the counters `(first + j, stream, HOST_WORD)` for the lanes `j`, word `w`
/// of lane `j` into `words[w][j]` (as [`Philox::block_with`], lane by lane).
#[inline(always)]
fn philox_lanes(rng: &Philox, first: u64, words: &mut [[u32; BATCH]; 4]) {
    let [c0, c1, c2, c3] = words;
    for j in 0..BATCH {
        let n = first.wrapping_add(j as u64);
        c0[j] = n as u32;
        c1[j] = (n >> 32) as u32;
        c2[j] = rng.stream;
        c3[j] = HOST_WORD;
    }
    let mut k = rng.key;
    for _ in 0..10 {
        for j in 0..BATCH {
            let p0 = u64::from(M0) * u64::from(c0[j]);
            let p1 = u64::from(M1) * u64::from(c2[j]);
            let next0 = (p1 >> 32) as u32 ^ c1[j] ^ k[0];
            let next2 = (p0 >> 32) as u32 ^ c3[j] ^ k[1];
            c0[j] = next0;
            c1[j] = p1 as u32;
            c2[j] = next2;
            c3[j] = p0 as u32;
        }
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
}

/// A word as a double, exactly (2^52 plus it, less 2^52: no unsigned conversion, which the
/// baseline vector instructions lack).
#[inline(always)]
fn word_f64(w: u32) -> f64 {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    f64::from_bits(TWO_52.to_bits() | u64::from(w)) - TWO_52
}

/// The Box–Muller pairs of words `(w0[j], w1[j])`: radius, sine and cosine of lane `j` into
/// `out[0][j]`, `out[1][j]`, `out[2][j]` (the arithmetic of [`Philox::normals4`]).
#[inline(always)]
fn box_muller_lanes(w0: &[u32; BATCH], w1: &[u32; BATCH], out: &mut [[f64; BATCH]; 3]) {
    let [r, sin, cos] = out;
    for j in 0..BATCH {
        let u1 = (word_f64(w0[j]) + 1.0) / 4_294_967_297.0;
        let u2 = word_f64(w1[j]) / 4_294_967_296.0;
        r[j] = (-2.0 * box_muller::ln_unit(u1)).sqrt();
        (sin[j], cos[j]) = box_muller::sin_cos_turns(u2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_give_the_values_of_each_block_bit_for_bit() {
        for (seed, stream, first) in [
            (3, 0, 0u64),
            (11, 7, 1 << 32),
            (u64::MAX, u32::MAX, u64::MAX - 300),
        ] {
            let rng = Philox::new(seed, stream);
            // Several batches and a partial one.
            let blocks = 3 * BATCH + 17;
            let mut out = vec![0.0; 4 * blocks];
            rng.normals_into(first, &mut out);
            let mut portable = vec![0.0; 4 * blocks];
            normals_batches(&rng, first, &mut portable);
            for b in 0..blocks {
                let want = rng.normals4(first.wrapping_add(b as u64));
                assert_eq!(
                    want.map(f64::to_bits),
                    [0, 1, 2, 3].map(|k| out[4 * b + k].to_bits()),
                    "block {b} of seed {seed}"
                );
                assert_eq!(out[4 * b..4 * b + 4], portable[4 * b..4 * b + 4]);
            }
        }
    }

    #[test]
    fn words_convert_exactly() {
        for w in [0, 1, 2, 0x8000_0000, u32::MAX - 1, u32::MAX] {
            assert_eq!(word_f64(w), w as f64);
        }
    }
}

//! The Box–Muller transform of host-side normal draws in plain `f64` arithmetic: a logarithm of
//! `(0, 1]` and the sine and cosine of a fraction of a turn, as short polynomials with no calls
//! and no branches. So the draws are the same bits on every machine (no dependence on the C
//! library's `log` and `sincos`), and a loop over many of them compiles to vector code.
//!
//! Both stay within 2 units in the last place of the exact values over their domains (tested
//! against the standard library's functions).

/// `ln 2`'s leading bits (its low 32 mantissa bits zero), so that `e · LN2_HI` is exact for
/// the exponents of `(0, 1]`'s doubles.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// The rest of `ln 2`.
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// `1 / (2k + 1)` for `k = 0..=9`: the series `ln m = 2s · Σ s^(2k) / (2k + 1)` with
/// `s = (m − 1) / (m + 1)`, `|s| ≤ 0.1716` for `m` in `[√½, √2)`; the first term left out,
/// `s^20 / 21`, is below `2^-56` of the sum.
const LN_SERIES: [f64; 10] = [
    1.0,
    1.0 / 3.0,
    1.0 / 5.0,
    1.0 / 7.0,
    1.0 / 9.0,
    1.0 / 11.0,
    1.0 / 13.0,
    1.0 / 15.0,
    1.0 / 17.0,
    1.0 / 19.0,
];

/// `2^52`, whose doubles' unit in the last place is 1: adding it rounds to an integer, and an
/// integer below `2^52` sits in the low mantissa bits of `2^52` plus it.
const TWO_52: f64 = 4_503_599_627_370_496.0;

/// The natural logarithm of `x` in `(0, 1]` (a normal double: the uniform draws are at least
/// `2^-32`). Selects, not branches, and no integer-to-float conversions, so that a loop over
/// many values compiles to vector code.
#[inline(always)]
pub(crate) fn ln_unit(x: f64) -> f64 {
    let bits = x.to_bits();
    // The biased exponent field as a double, exactly (2^52 plus it, less 2^52).
    let biased = f64::from_bits(TWO_52.to_bits() | (bits >> 52)) - TWO_52;
    // The mantissa as a number in [1, 2), then in [√½, √2) with the exponent adjusted.
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    let big = m > std::f64::consts::SQRT_2;
    let m = if big { m * 0.5 } else { m };
    let e = biased - if big { 1022.0 } else { 1023.0 };
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = LN_SERIES[9];
    for &c in LN_SERIES[..9].iter().rev() {
        p = p * s2 + c;
    }
    e * LN2_HI + (e * LN2_LO + 2.0 * s * p)
}

/// `1 / k!` for the sine's odd terms `k = 1, 3, ..., 17`.
const SIN_SERIES: [f64; 9] = [
    1.0,
    -1.0 / 6.0,
    1.0 / 120.0,
    -1.0 / 5040.0,
    1.0 / 362_880.0,
    -1.0 / 39_916_800.0,
    1.0 / 6_227_020_800.0,
    -1.0 / 1_307_674_368_000.0,
    1.0 / 355_687_428_096_000.0,
];

/// `1 / k!` for the cosine's even terms `k = 0, 2, ..., 18`.
const COS_SERIES: [f64; 10] = [
    1.0,
    -1.0 / 2.0,
    1.0 / 24.0,
    -1.0 / 720.0,
    1.0 / 40_320.0,
    -1.0 / 3_628_800.0,
    1.0 / 479_001_600.0,
    -1.0 / 87_178_291_200.0,
    1.0 / 20_922_789_888_000.0,
    -1.0 / 6_402_373_705_728_000.0,
];

/// `(sin 2πu, cos 2πu)` for `u` in `[0, 1)`: the turn is split into a quarter-turn count `k`
/// and a remainder within an eighth of a turn (both exact), whose sine and cosine are Taylor
/// series, then turned by `k` quarters. Branch-free like [`ln_unit`].
#[inline(always)]
pub(crate) fn sin_cos_turns(u: f64) -> (f64, f64) {
    let t = 4.0 * u;
    // k = ⌊t + ½⌋ (t + ½ is in [½, 4½)): rounded to the nearest integer by way of 2^52, one
    // less where that rounded up.
    let half_up = t + 0.5;
    let nearest = (half_up + TWO_52) - TWO_52;
    let k = if nearest > half_up {
        nearest - 1.0
    } else {
        nearest
    };
    let (s, c) = sin_cos_small((t - k) * std::f64::consts::FRAC_PI_2);
    // k's bits, and turning by k quarters: (sin, cos) becomes (cos, -sin), (-sin, -cos),
    // (-cos, sin); a negation is the sign bit flipped.
    let quarters = (k + TWO_52).to_bits();
    let odd = quarters & 1 == 1;
    let (x, y) = if odd { (c, s) } else { (s, c) };
    let sin = f64::from_bits(x.to_bits() ^ ((quarters & 2) << 62));
    let cos = f64::from_bits(y.to_bits() ^ (((quarters + 1) & 2) << 62));
    (sin, cos)
}

/// `(sin a, cos a)` for `|a| ≤ π/4`, by their Taylor series (the first terms left out are
/// below `2^-56` of the results).
#[inline(always)]
fn sin_cos_small(a: f64) -> (f64, f64) {
    let a2 = a * a;
    let mut s = SIN_SERIES[8];
    for &c in SIN_SERIES[..8].iter().rev() {
        s = s * a2 + c;
    }
    let mut c = COS_SERIES[9];
    for &k in COS_SERIES[..9].iter().rev() {
        c = c * a2 + k;
    }
    (s * a, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `a` and the exact `b`, scaled to `b`'s magnitude (at
    /// least 2^-60, so values near zero compare absolutely).
    fn ulps(a: f64, b: f64) -> f64 {
        (a - b).abs() / (b.abs().max(2f64.powi(-60)) * f64::EPSILON)
    }

    #[test]
    fn the_logarithm_is_within_two_ulps_of_the_standard_one() {
        let mut worst = 0f64;
        let mut x = 2f64.powi(-32);
        while x <= 1.0 {
            for step in 0..2000 {
                let v = (x * (1.0 + step as f64 / 2000.0)).min(1.0);
                worst = worst.max(ulps(ln_unit(v), v.ln()));
            }
            x *= 2.0;
        }
        assert_eq!(ln_unit(1.0), 0.0);
        assert!(worst <= 2.0, "worst {worst} ulps");
    }

    #[test]
    fn sine_and_cosine_of_an_eighth_turn_are_within_two_ulps_of_the_standard_ones() {
        let mut worst = 0f64;
        for i in 0..=200_000u64 {
            let a = (i as f64 / 100_000.0 - 1.0) * std::f64::consts::FRAC_PI_4;
            let (s, c) = sin_cos_small(a);
            worst = worst.max(ulps(s, a.sin())).max(ulps(c, a.cos()));
        }
        assert!(worst <= 2.0, "worst {worst} ulps");
    }

    #[test]
    fn sine_and_cosine_of_turns_agree_with_the_standard_ones_in_every_quarter() {
        // The standard functions take 2πu rounded (up to 2π · 2^-54 off), so they are compared
        // absolutely, within that.
        let mut worst = 0f64;
        for i in 0..200_000u64 {
            let u = (i as f64 + 0.37) / 200_000.0;
            let (s, c) = sin_cos_turns(u);
            let (rs, rc) = (std::f64::consts::TAU * u).sin_cos();
            worst = worst.max((s - rs).abs()).max((c - rc).abs());
        }
        assert!(worst <= 1e-15, "worst {worst}");
        assert_eq!(sin_cos_turns(0.0), (0.0, 1.0));
        assert_eq!(sin_cos_turns(0.25), (1.0, 0.0));
        assert_eq!(sin_cos_turns(0.5), (0.0, -1.0));
        assert_eq!(sin_cos_turns(0.75), (-1.0, 0.0));
    }

    /// The straightforward forms of the two functions (an integer exponent, a truncated
    /// quarter count, branches): the branch-free ones must give the same bits.
    fn ln_unit_branching(x: f64) -> f64 {
        let bits = x.to_bits();
        let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
        let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
        if m > std::f64::consts::SQRT_2 {
            m *= 0.5;
            e += 1;
        }
        let s = (m - 1.0) / (m + 1.0);
        let s2 = s * s;
        let mut p = LN_SERIES[9];
        for &c in LN_SERIES[..9].iter().rev() {
            p = p * s2 + c;
        }
        let e = e as f64;
        e * LN2_HI + (e * LN2_LO + 2.0 * s * p)
    }

    fn sin_cos_turns_branching(u: f64) -> (f64, f64) {
        let t = 4.0 * u;
        let k = (t + 0.5) as i64;
        let (s, c) = sin_cos_small((t - k as f64) * std::f64::consts::FRAC_PI_2);
        let (x, y) = if k & 1 == 1 { (c, s) } else { (s, c) };
        let sin = if k & 2 == 2 { -x } else { x };
        let cos = if (k + 1) & 2 == 2 { -y } else { y };
        (sin, cos)
    }

    #[test]
    fn the_branch_free_forms_give_the_bits_of_the_branching_ones() {
        // Every draw's u2 is a word over 2^32: the quarter boundaries and the ties of the
        // rounding (t + ½ an integer) are words that are multiples of 2^29, and their
        // neighbours; the logarithm's mantissa switch is at √2, and its exponents run to 2^-32.
        let mut words: Vec<u64> = (0..8u64)
            .flat_map(|q| [q << 29, (q << 29) + 1, (q << 29).wrapping_sub(1)])
            .collect();
        words.extend((0..100_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32));
        for w in words.into_iter().filter(|&w| w < 1 << 32) {
            let u = w as f64 / 4_294_967_296.0;
            let (s, c) = sin_cos_turns(u);
            let (rs, rc) = sin_cos_turns_branching(u);
            assert_eq!(
                (s.to_bits(), c.to_bits()),
                (rs.to_bits(), rc.to_bits()),
                "word {w}"
            );
            let x = (w as f64 + 1.0) / 4_294_967_297.0;
            assert_eq!(
                ln_unit(x).to_bits(),
                ln_unit_branching(x).to_bits(),
                "word {w}"
            );
        }
        for x in [
            1.0,
            2f64.powi(-32),
            std::f64::consts::FRAC_1_SQRT_2,
            0.5 * std::f64::consts::SQRT_2.next_up(),
        ] {
            assert_eq!(ln_unit(x).to_bits(), ln_unit_branching(x).to_bits(), "{x}");
        }
    }
}

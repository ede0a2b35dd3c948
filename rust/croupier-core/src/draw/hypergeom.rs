//! Exact hypergeometric sampling, bit-identical on every platform.
//!
//! `hypergeometric(rng, n, s, a)` is the number of marked items among `a` items drawn without
//! replacement from `n` items of which `s` are marked. The splitting engine draws millions of
//! these, from `Hyp(2, 1, 1)` to `Hyp(10**10, 5*10**9, 5*10**9)`, so there are two methods:
//!
//! - **Small** (`min(s, a, n-s, n-a) <= SMALL`): draw the items one by one with exact integer
//!   draws. No floating point at all.
//! - **Large**: H2RUA/HRUA, Stadlober's ratio-of-uniforms rejection method ("The ratio of
//!   uniforms approach for generating discrete random variates", J. Comput. Appl. Math. 31,
//!   1990), the method numpy uses. It is exact: the hat covers the whole support (unlike
//!   numpy, croupier does not cut the tail at 16 standard deviations), and rejection makes the
//!   accepted values follow the distribution, up to the rounding of the acceptance test.
//!
//! Bit reproducibility: the large method needs logarithms of factorials. Platform `libm`s
//! differ in the last bit of `ln`, which could flip an acceptance and change the order on
//! another machine, so `ln` here is written with `+ - * /` only, which IEEE 754 rounds
//! identically everywhere (Rust never contracts them into fused multiply-adds on its own).

use crate::draw::cell_rng::CellRng;
use std::sync::OnceLock;

/// Up to this many sequential draws, the small method is used.
pub(crate) const SMALL: u64 = 12;

// ln 2 split as in fdlibm: the high part has trailing zero bits, so e * LN2_HI is exact.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// Natural logarithm of a positive, finite, normal `x`, computed with basic arithmetic only.
///
/// `x = 2**e * m` with `m` in `[sqrt(1/2), sqrt(2))`, and `ln(m) = 2 atanh(z)` with
/// `z = (m-1)/(m+1)`, `|z| <= 0.1716`, summed as the odd series `2 (z + z**3/3 + …)` to 12
/// terms (the next term is below 2**-60 of the sum).
pub(crate) fn ln(x: f64) -> f64 {
    debug_assert!(x > 0.0 && x.is_finite() && x.is_normal());
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let ef = e as f64;
    ef * LN2_HI + (ef * LN2_LO + two_atanh((m - 1.0) / (m + 1.0), 25.0))
}

/// `2 atanh(z) = 2 (z + z**3/3 + z**5/5 + …)` summed by Horner's rule up to the term
/// `z**last / last` (`last` odd).
fn two_atanh(z: f64, last: f64) -> f64 {
    let z2 = z * z;
    let mut poly = 1.0 / last;
    let mut k = last - 2.0;
    while k >= 1.0 {
        poly = poly * z2 + 1.0 / k;
        k -= 2.0;
    }
    2.0 * z * poly
}

/// `ln(k!)` is tabulated below this (512 KiB, built once per process in about a millisecond).
const TABLE: usize = 1 << 16;

fn ln_factorial_table() -> &'static [f64] {
    static T: OnceLock<Vec<f64>> = OnceLock::new();
    T.get_or_init(|| {
        // Summed logarithms up to 255; from 256 on Stirling's series, which (unlike a running
        // sum) does not accumulate rounding errors.
        let mut t = vec![0.0; TABLE];
        for i in 2..TABLE {
            t[i] = if i < 256 {
                t[i - 1] + ln(i as f64)
            } else {
                stirling(i as u64)
            };
        }
        t
    })
}

/// `ln(k!)` by Stirling's series with three correction terms, for `k >= 256` (truncation
/// error below 1e-19).
fn stirling(k: u64) -> f64 {
    let x = k as f64;
    // 0.5 * ln(2 pi)
    const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;
    (x + 0.5) * ln(x) - x + HALF_LN_2PI + stirling_correction(x)
}

/// `ln(k!)`: tabulated below 2**16 (summed logarithms below 256, Stirling's series above),
/// Stirling's series beyond.
pub(crate) fn ln_factorial(k: u64) -> f64 {
    if k < TABLE as u64 {
        return ln_factorial_table()[k as usize];
    }
    stirling(k)
}

/// `ln(a/b)` for positive `a, b`, accurate when they are close: `2 atanh(z)` with
/// `z = (a-b)/(a+b)` (the difference taken exactly in integers) when `|z| <= 1/3`, summed to 20
/// terms; `ln a - ln b` otherwise (the ratio is then far from 1 and nothing cancels).
fn ln_ratio(a: u64, b: u64) -> f64 {
    let z = signed_difference(a, b) / (a as f64 + b as f64);
    if z.abs() > 1.0 / 3.0 {
        return ln(a as f64) - ln(b as f64);
    }
    two_atanh(z, 41.0)
}

/// `a - b` as a double, the difference taken exactly in integers first.
#[inline(always)]
fn signed_difference(a: u64, b: u64) -> f64 {
    if a >= b {
        (a - b) as f64
    } else {
        -((b - a) as f64)
    }
}

/// Stirling's correction series `ln(x!) - ((x+1/2) ln x - x + ln(2 pi)/2)` for `x >= 256`.
fn stirling_correction(x: f64) -> f64 {
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0)))
}

/// `ln(a!) - ln(b!)` without the cancellation of subtracting two huge logarithms: at a
/// population of 2**40 each `ln(k!)` is about 3e13 and its last bit is worth 0.004, enough to
/// bend an acceptance test; the difference written as
/// `(a+1/2) ln(a/b) + (a-b) ln b - (a-b) + corr(a) - corr(b)` keeps every term small.
pub(crate) fn ln_factorial_ratio(a: u64, b: u64) -> f64 {
    if a < TABLE as u64 || b < TABLE as u64 {
        return ln_factorial(a) - ln_factorial(b);
    }
    let (af, bf) = (a as f64, b as f64);
    let d = signed_difference(a, b);
    (af + 0.5) * ln_ratio(a, b) + d * ln(bf) - d
        + (stirling_correction(af) - stirling_correction(bf))
}

/// The number of marked items among `a` drawn without replacement from `n` items of which `s`
/// are marked. Requires `s <= n` and `a <= n`.
pub(crate) fn hypergeometric(rng: &mut CellRng, n: u64, s: u64, a: u64) -> u64 {
    debug_assert!(s <= n && a <= n);
    if s == 0 || a == 0 {
        return 0;
    }
    if s == n {
        return a;
    }
    if a == n {
        return s;
    }
    // Reduce to s, a <= n/2: marked <-> unmarked and drawn <-> left behind are symmetries.
    let (s2, flip_s) = if s > n - s { (n - s, true) } else { (s, false) };
    let (a2, flip_a) = if a > n - a { (n - a, true) } else { (a, false) };
    let x = reduced(rng, n, s2, a2);
    // x counts s2-type items among the a2 draws.
    let y = if flip_s { a2 - x } else { x };
    if flip_a {
        s - y
    } else {
        y
    }
}

/// `Hyp(n, s, a)` with `1 <= s, a <= n/2`.
fn reduced(rng: &mut CellRng, n: u64, s: u64, a: u64) -> u64 {
    // Hyp(n, s, a) and Hyp(n, a, s) are the same law: draw the smaller number of items.
    let (k, m) = if s <= a { (s, a) } else { (a, s) };
    if k <= SMALL {
        let mut x = 0;
        for i in 0..k {
            if rng.below(n - i) < m - x {
                x += 1;
            }
        }
        return x;
    }
    hrua(rng, n, m, k)
}

/// Stadlober's HRUA for `Hyp(n, good, sample)` with `sample <= good <= n/2`.
fn hrua(rng: &mut CellRng, n: u64, good: u64, sample: u64) -> u64 {
    // 2 sqrt(2/e) and 3 - 2 sqrt(3/e): the table-mountain hat constants.
    const D1: f64 = 1.715_527_769_921_413_5;
    const D2: f64 = 0.898_916_162_058_898_8;
    let bad = n - good;
    let nf = n as f64;
    let (gf, bf, kf) = (good as f64, bad as f64, sample as f64);
    let p = gf / nf;
    let q = bf / nf;
    let mean = kf * p;
    let centre = mean + 0.5;
    let var = (nf - kf) * kf * p * q / (nf - 1.0);
    let c = (var + 0.5).sqrt();
    let h = D1 * c + D2;
    // The mode, in exact integer arithmetic.
    let mode = ((u128::from(sample) + 1) * (u128::from(good) + 1) / (u128::from(n) + 2)) as u64;
    // ln f(k) - ln f(mode) for the pmf f (at most 0), as four factorial ratios: f(k) is
    // proportional to 1 / (k! (good-k)! (sample-k)! (bad-sample+k)!).
    let log_ratio = |k: u64| {
        ln_factorial_ratio(mode, k)
            + ln_factorial_ratio(good - mode, good - k)
            + ln_factorial_ratio(sample - mode, sample - k)
            + ln_factorial_ratio(bad - sample + mode, bad - sample + k)
    };
    // The support is [0, min(sample, good)] = [0, sample].
    let upper = (sample + 1) as f64;
    loop {
        let u = rng.unit_open0();
        let v = rng.unit_open0();
        let x = centre + h * (v - 0.5) / u;
        if !(0.0..upper).contains(&x) {
            continue;
        }
        let k = x as u64; // floor, x >= 0
        let t = log_ratio(k);
        if u * (4.0 - u) - 3.0 <= t {
            return k;
        }
        if u * (u - t) >= 1.0 {
            continue;
        }
        if 2.0 * ln(u) <= t {
            return k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_the_platform_to_the_last_bits() {
        let mut x = 1e-300;
        while x < 1e300 {
            let (mine, libm) = (ln(x), x.ln());
            assert!(
                (mine - libm).abs() <= 4.0 * f64::EPSILON * libm.abs().max(1.0),
                "{x}"
            );
            x *= 1.37;
        }
        for k in 1..5000u64 {
            let x = k as f64;
            assert!((ln(x) - x.ln()).abs() <= 2.0 * f64::EPSILON * x.ln().abs().max(1.0));
        }
    }

    #[test]
    fn ln_value_pins() {
        // Bit patterns, so a change of the formula (or of the platform's rounding) is caught.
        assert_eq!(ln(10.0).to_bits(), 0x40026bb1bbb55516);
        assert_eq!(ln(0.3).to_bits(), 0xbff34378fcbda721);
        assert_eq!(ln(123456789.0).to_bits(), 0x4032a1a38bd0540a);
    }

    #[test]
    fn factorial_ratios_are_exact_where_direct_subtraction_is_not() {
        // ln(a!/b!) = sum of ln(i) for i in (b, a]: compare with that sum, at 2**40.
        let b = 1u64 << 40;
        for d in [1u64, 2, 17, 1000] {
            let direct: f64 = (b + 1..=b + d).map(|i| (i as f64).ln()).sum();
            let got = ln_factorial_ratio(b + d, b);
            assert!(
                (got - direct).abs() < 1e-9 * direct,
                "d={d}: {got} vs {direct}"
            );
            assert!((ln_factorial_ratio(b, b + d) + direct).abs() < 1e-9 * direct);
        }
        assert_eq!(ln_factorial_ratio(12345, 12345), 0.0);
        assert!(
            (ln_factorial_ratio(300, 10) - (ln_factorial(300) - ln_factorial(10))).abs() < 1e-9
        );
    }

    #[test]
    fn ln_factorial_is_consistent_across_the_table_boundary() {
        let mut exact = ln_factorial(65_000);
        for k in 65_001..70_000u64 {
            exact += (k as f64).ln();
            assert!((ln_factorial(k) - exact).abs() < 1e-9 * exact, "{k}");
        }
    }

    fn pmf(n: u64, s: u64, a: u64, x: u64) -> f64 {
        let lc = |n: u64, k: u64| ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k);
        (lc(s, x) + lc(n - s, a - x) - lc(n, a)).exp()
    }

    /// Chi-square of `draws` samples against the exact pmf, cells with expectation < 5 pooled.
    fn chi_square(n: u64, s: u64, a: u64, draws: u64) -> (f64, usize) {
        let lo = (a + s).saturating_sub(n);
        let hi = a.min(s);
        let mut counts = vec![0u64; (hi - lo + 1) as usize];
        for i in 0..draws {
            let x = hypergeometric(&mut CellRng::for_cell(17, n, s, a, i), n, s, a);
            assert!((lo..=hi).contains(&x), "Hyp({n},{s},{a}) gave {x}");
            counts[(x - lo) as usize] += 1;
        }
        let (mut chi, mut cells, mut pool_o, mut pool_e) = (0.0, 0, 0.0, 0.0);
        for (i, &c) in counts.iter().enumerate() {
            let e = pmf(n, s, a, lo + i as u64) * draws as f64;
            pool_o += c as f64;
            pool_e += e;
            if pool_e >= 5.0 {
                chi += (pool_o - pool_e).powi(2) / pool_e;
                cells += 1;
                pool_o = 0.0;
                pool_e = 0.0;
            }
        }
        if pool_e > 0.0 {
            chi += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
            cells += 1;
        }
        (chi, cells)
    }

    #[test]
    fn both_methods_follow_the_exact_law() {
        // (n, s, a) covering small and large methods and all four symmetry flips.
        for &(n, s, a) in &[
            (10, 3, 4),
            (10, 7, 4),
            (10, 3, 8),
            (50, 40, 45),
            (100, 30, 40),
            (1000, 500, 500),
            (1000, 100, 900),
            (1000, 900, 30),
            (100_000, 50_000, 20_000),
            (1 << 40, 1 << 39, 1000),
        ] {
            let (chi, cells) = chi_square(n, s, a, 40_000);
            // 99.9% quantile of chi-square with k-1 dof is below k + 3.1 sqrt(2k) + 10.
            let bound = cells as f64 + 3.1 * (2.0 * cells as f64).sqrt() + 10.0;
            assert!(
                chi < bound,
                "Hyp({n},{s},{a}): chi2 {chi:.1} over {cells} cells"
            );
        }
    }

    #[test]
    fn large_method_mean_and_variance_up_to_2_62() {
        // Where ln(k!) alone loses whole units, the factorial ratios keep the law right.
        for &(n, s, a) in &[
            (10_000_000_000u64, 5_000_000_000u64, 1_250_000_000u64),
            (1 << 50, 1 << 49, 1 << 48),
            (1 << 62, 3 << 59, 1 << 60),
        ] {
            let draws = 4000;
            let xs: Vec<f64> = (0..draws)
                .map(|i| hypergeometric(&mut CellRng::for_cell(5, i, n, 0, 0), n, s, a) as f64)
                .collect();
            let mean = xs.iter().sum::<f64>() / draws as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
            let (nf, sf, af) = (n as f64, s as f64, a as f64);
            let mu = af * sf / nf;
            let sigma2 = af * sf / nf * (1.0 - sf / nf) * (nf - af) / (nf - 1.0);
            assert!(
                (mean - mu).abs() < 4.0 * (sigma2 / draws as f64).sqrt(),
                "n={n}"
            );
            assert!((var / sigma2 - 1.0).abs() < 0.1, "n={n}: {var} vs {sigma2}");
        }
    }

    #[test]
    fn degenerate_arguments() {
        let mut r = CellRng::new(1);
        assert_eq!(hypergeometric(&mut r, 0, 0, 0), 0);
        assert_eq!(hypergeometric(&mut r, 5, 0, 3), 0);
        assert_eq!(hypergeometric(&mut r, 5, 5, 3), 3);
        assert_eq!(hypergeometric(&mut r, 5, 2, 5), 2);
        assert_eq!(hypergeometric(&mut r, 5, 2, 0), 0);
        // Forced by the margins: 9 of 10 marked, 9 drawn -> at least 8.
        for i in 0..100 {
            let x = hypergeometric(&mut CellRng::new(i), 10, 9, 9);
            assert!(x == 8 || x == 9);
        }
    }

    #[test]
    fn value_stability_pins() {
        let got: Vec<u64> = [
            (10u64, 3u64, 4u64),
            (1000, 500, 500),
            (1 << 40, 1 << 39, 1 << 38),
            (99, 98, 50),
        ]
        .iter()
        .map(|&(n, s, a)| hypergeometric(&mut CellRng::new(42), n, s, a))
        .collect();
        assert_eq!(got, PINS);
    }
    const PINS: [u64; 4] = [2, 243, 137438774859, 49];
}

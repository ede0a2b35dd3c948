//! How many samples of each dataset a mixture phase holds: temperature-scaled probabilities
//! and their largest-remainder rounding.
//!
//! `p_i = w_i^(1/T) / Σ_j w_j^(1/T)` (a zero weight stays zero at every temperature), and
//! phase of length `L` holds dataset `i` exactly `c_i` times where `c_i` is `⌊p_i L⌋` plus one
//! for the `L - Σ⌊p_j L⌋` datasets with the largest remainders `p_i L - ⌊p_i L⌋` (ties to the
//! lower index): Hamilton's method, so `|c_i - p_i L| < 1` and `Σ c_i = L`.
//!
//! Whole-number weights at temperature 1 are rounded on exact integers ([`phase_counts`]);
//! otherwise everything is IEEE-754 `f64` arithmetic in a fixed order, and the power is the `libm`
//! crate's (a port of musl's, the same bits on every platform), so the counts, which decide
//! the order, never depend on the platform's maths library.

use crate::error::{Error, Result};

/// The normalised probabilities of `weights` at `temperature`.
///
/// Refuses an empty list, a negative, NaN or infinite weight, all weights zero, and a
/// temperature that is not finite and positive, naming `what` (the argument) in the message.
///
/// # Examples
///
/// ```
/// use croupier_core::mix::probabilities;
///
/// let p = probabilities(&[1.0, 3.0], 1.0, "weights").unwrap();
/// assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12); // normalised
/// let flatter = probabilities(&[1.0, 3.0], 2.0, "weights").unwrap();
/// assert!(flatter[0] > p[0]); // a higher temperature evens the datasets out
/// let err = probabilities(&[1.0, -1.0], 1.0, "weights").unwrap_err().to_string();
/// assert!(err.starts_with("weights must be finite and >= 0"), "{err}");
/// ```
pub fn probabilities(weights: &[f64], temperature: f64, what: &'static str) -> Result<Vec<f64>> {
    if weights.is_empty() {
        return Err(Error::out_of_range(
            what,
            "a non-empty list (one weight per dataset)",
            "[]",
        ));
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::out_of_range(
            "temperature",
            "a finite number > 0",
            temperature,
        ));
    }
    for (i, &w) in weights.iter().enumerate() {
        if !(w.is_finite() && w >= 0.0) {
            return Err(Error::out_of_range(
                what,
                format!("finite and >= 0 (entry {i})"),
                w,
            ));
        }
    }
    let scaled: Vec<f64> = if temperature == 1.0 {
        weights.to_vec()
    } else {
        // Divide by the largest weight first so that w^(1/T) cannot overflow or vanish for
        // every weight at once; the ratio is what matters.
        let top = weights.iter().copied().fold(0.0, f64::max);
        if top == 0.0 {
            weights.to_vec()
        } else {
            let e = 1.0 / temperature;
            weights
                .iter()
                .map(|&w| if w == 0.0 { 0.0 } else { libm::pow(w / top, e) })
                .collect()
        }
    };
    let mut total: f64 = scaled.iter().sum();
    let scaled = if total.is_infinite() {
        // Finite weights whose sum overflows (two of 1e308): the same ratios over the largest
        // weight. Only here, so the probabilities of every sum that fits stay as they were.
        let top = scaled.iter().copied().fold(0.0, f64::max);
        let over: Vec<f64> = scaled.iter().map(|&s| s / top).collect();
        total = over.iter().sum();
        over
    } else {
        scaled
    };
    if !(total > 0.0 && total.is_finite()) {
        return Err(Error::out_of_range(
            what,
            "not all zero (at least one dataset must have a weight > 0)",
            format!("{} zero weights", weights.len()),
        ));
    }
    Ok(scaled.into_iter().map(|s| s / total).collect())
}

/// Hamilton's largest-remainder rounding of `p_i * length` (see the module docs). A dataset
/// with `p_i == 0` always gets 0.
///
/// # Examples
///
/// ```
/// use croupier_core::mix::largest_remainder;
///
/// let counts = largest_remainder(&[0.5, 0.3, 0.2, 0.0], 7);
/// assert_eq!(counts.iter().sum::<u64>(), 7); // exactly the length
/// assert_eq!(counts[3], 0); // a zero weight gets nothing
/// ```
pub fn largest_remainder(probs: &[f64], length: u64) -> Vec<u64> {
    let len_f = length as f64;
    let mut counts = Vec::with_capacity(probs.len());
    let mut rems = Vec::with_capacity(probs.len());
    let mut floor_sum: u128 = 0;
    for &p in probs {
        let x = p * len_f;
        let f = (x.floor() as u64).min(length);
        counts.push(f);
        rems.push(x - f as f64);
        floor_sum += u128::from(f);
    }
    // By the arithmetic the deficit lies in [0, #datasets); rounding of p_i * L can move it by
    // a little, in either direction, and both directions are handled.
    let mut order: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] > 0.0).collect();
    order.sort_by(|&a, &b| rems[b].total_cmp(&rems[a]).then(a.cmp(&b)));
    if floor_sum <= u128::from(length) {
        let mut deficit = (u128::from(length) - floor_sum) as u64;
        while deficit > 0 {
            for &i in &order {
                if deficit == 0 {
                    break;
                }
                counts[i] += 1;
                deficit -= 1;
            }
        }
    } else {
        let mut excess = (floor_sum - u128::from(length)) as u64;
        while excess > 0 {
            for &i in order.iter().rev() {
                if excess == 0 {
                    break;
                }
                if counts[i] > 0 {
                    counts[i] -= 1;
                    excess -= 1;
                }
            }
        }
    }
    counts
}

/// The counts of a phase of `length` positions: [`largest_remainder`] of the
/// [`probabilities`], computed on exact integers when every weight is a whole number below
/// `2**53` and `temperature == 1` (so ties between equal remainders, common with small integer
/// weights, go to the lower index as in exact arithmetic, not to rounding noise).
///
/// # Examples
///
/// ```
/// use croupier_core::mix::phase_counts;
///
/// let counts = phase_counts(&[1.0, 1.0, 1.0], 1.0, 10, "weights").unwrap();
/// assert_eq!(counts.iter().sum::<u64>(), 10); // exactly the phase's length
/// assert!(counts.iter().all(|&c| c == 3 || c == 4)); // each within 1 of 10 / 3
/// assert!(phase_counts(&[0.0, 0.0], 1.0, 10, "weights").is_err()); // all zero
/// ```
pub fn phase_counts(
    weights: &[f64],
    temperature: f64,
    length: u64,
    what: &'static str,
) -> Result<Vec<u64>> {
    let probs = probabilities(weights, temperature, what)?;
    let integral = weights
        .iter()
        .all(|&w| w.fract() == 0.0 && w < (1u64 << 53) as f64);
    if temperature != 1.0 || !integral {
        return Ok(largest_remainder(&probs, length));
    }
    let w: Vec<u128> = weights.iter().map(|&x| x as u128).collect();
    let total: u128 = w.iter().sum();
    let mut counts: Vec<u64> = Vec::with_capacity(w.len());
    let mut rems: Vec<u128> = Vec::with_capacity(w.len());
    for &wi in &w {
        // wi < 2**53 and length < 2**64: the product fits in 128 bits.
        let q = wi * u128::from(length);
        counts.push((q / total) as u64);
        rems.push(q % total);
    }
    let deficit = length - counts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..w.len()).filter(|&i| w[i] > 0).collect();
    order.sort_by(|&a, &b| rems[b].cmp(&rems[a]).then(a.cmp(&b)));
    // The deficit is below the number of positive weights (each remainder is below 1).
    for &i in order.iter().take(deficit as usize) {
        counts[i] += 1;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_stay_within_one() {
        let probs = probabilities(&[1.0, 2.0, 3.0, 0.0, 0.5], 1.0, "weights").unwrap();
        for length in [0u64, 1, 2, 7, 13, 100, 12_345, 1 << 40] {
            let c = largest_remainder(&probs, length);
            assert_eq!(c.iter().sum::<u64>(), length);
            assert_eq!(c[3], 0);
            for (ci, p) in c.iter().zip(&probs) {
                assert!((*ci as f64 - p * length as f64).abs() < 1.0);
            }
        }
    }

    #[test]
    fn hamilton_on_a_worked_example() {
        // 10 * (0.25, 0.35, 0.4) = (2.5, 3.5, 4.0): one seat left, the tie of remainders 0.5
        // goes to the lower index.
        let c = largest_remainder(&[0.25, 0.35, 0.4], 10);
        assert_eq!(c, vec![3, 3, 4]);
    }

    #[test]
    fn integer_weights_round_exactly() {
        // 3 * (2, 2, 5) / 9 = (0.667, 0.667, 1.667): in f64 the last remainder comes out a hair
        // larger; exactly, the three tie and the lower indices win.
        assert_eq!(
            phase_counts(&[0.0, 2.0, 2.0, 5.0], 1.0, 3, "weights").unwrap(),
            vec![0, 1, 1, 1]
        );
        assert_eq!(
            largest_remainder(&probabilities(&[0.0, 2.0, 2.0, 5.0], 1.0, "w").unwrap(), 3),
            vec![0, 1, 0, 2]
        );
        let c = phase_counts(&[1.0, 3.0, 7.0], 1.0, 1 << 40, "weights").unwrap();
        assert_eq!(c.iter().sum::<u64>(), 1 << 40);
    }

    #[test]
    fn temperature_flattens() {
        let p1 = probabilities(&[1.0, 9.0], 1.0, "weights").unwrap();
        let p2 = probabilities(&[1.0, 9.0], 2.0, "weights").unwrap();
        let p_half = probabilities(&[1.0, 9.0], 0.5, "weights").unwrap();
        assert!((p1[0] - 0.1).abs() < 1e-15);
        assert!((p2[0] - 0.25).abs() < 1e-15); // 1 : 3
        assert!((p_half[0] - 1.0 / 82.0).abs() < 1e-15); // 1 : 81
        let p = probabilities(&[0.0, 1.0, 1e-300], 1000.0, "weights").unwrap();
        assert_eq!(p[0], 0.0);
    }

    #[test]
    fn bad_weights_are_refused() {
        let err = |w: &[f64], t: f64| probabilities(w, t, "weights").unwrap_err().to_string();
        assert!(err(&[], 1.0).contains("non-empty"));
        assert!(err(&[1.0, -1.0], 1.0).contains("entry 1"));
        assert!(err(&[f64::NAN], 1.0).contains(">= 0"));
        assert!(err(&[f64::INFINITY], 1.0).contains("finite"));
        assert!(err(&[0.0, 0.0], 1.0).contains("not all zero"));
        // Finite weights whose sum overflows are ratios like any other, at every temperature.
        for t in [1.0, 0.5, 2.0] {
            assert_eq!(
                probabilities(&[f64::MAX, f64::MAX], t, "weights").unwrap(),
                [0.5, 0.5]
            );
            let p = probabilities(&[1e308, 1e308, 1.7e308], t, "weights").unwrap();
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{p:?}");
            assert!(p[0] == p[1] && p[2] > p[0]);
        }
        assert!(err(&[1.0], 0.0).starts_with("temperature"));
        assert!(err(&[1.0], f64::NAN).starts_with("temperature"));
        assert!(err(&[1.0], f64::INFINITY).starts_with("temperature"));
    }
}

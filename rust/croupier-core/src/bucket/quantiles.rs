//! Bucket boundaries from length quantiles.
//!
//! For `k` buckets over `N` lengths, boundary `j` (`1 <= j < k`) is the length at rank
//! `⌊j N / k⌋` of the lengths in increasing order; repeated boundaries, and boundaries not above
//! the smallest length, are dropped (so heavily repeated lengths give fewer buckets). A bucket
//! is `[b_j, b_{j+1})`, the first starting at 0 and the last open. Lengths below `2**24` are
//! counted in a histogram (`O(N + max)`); longer ones are sorted (a copy, in parallel).

use rayon::prelude::*;

const HISTOGRAM_MAX: u64 = 1 << 24;

/// The boundaries of `k >= 1` quantile buckets of `lengths` (not empty).
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::quantile_boundaries;
///
/// let lengths: Vec<u32> = (1..=1000).collect();
/// let b = quantile_boundaries(&lengths, 4);
/// assert!(b.len() <= 3 && b.windows(2).all(|w| w[0] < w[1])); // k - 1 increasing cuts
/// ```
pub fn quantile_boundaries<L: Copy + Into<u64> + Send + Sync>(lengths: &[L], k: u64) -> Vec<u64> {
    let n = lengths.len() as u64;
    let ranks: Vec<u64> = (1..k)
        .map(|j| (u128::from(j) * u128::from(n) / u128::from(k)) as u64)
        .collect();
    let max = crate::cancel::par_max(lengths);
    let min = crate::cancel::par_min(lengths);
    let values: Vec<u64> = if max < HISTOGRAM_MAX {
        let hist = lengths
            .par_chunks(1 << 16)
            .fold(
                || vec![0u64; (max + 1) as usize],
                |mut h, chunk| {
                    if crate::cancel::cancelled() {
                        return h; // the caller discards the histogram
                    }
                    for &x in chunk {
                        h[x.into() as usize] += 1;
                    }
                    h
                },
            )
            .reduce(
                || vec![0u64; (max + 1) as usize],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        // The value at rank q is the first v whose cumulative count exceeds q.
        let mut out = Vec::with_capacity(ranks.len());
        let (mut v, mut below) = (0usize, 0u64);
        for &q in &ranks {
            if crate::cancel::cancelled() {
                break; // the caller discards the boundaries
            }
            while below + hist[v] <= q {
                below += hist[v];
                v += 1;
            }
            out.push(v as u64);
        }
        out
    } else {
        let mut sorted: Vec<u64> = lengths.par_iter().map(|&l| l.into()).collect();
        crate::cancel::sort_values(&mut sorted);
        if crate::cancel::cancelled() {
            return Vec::new(); // the caller discards the boundaries
        }
        ranks.iter().map(|&q| sorted[q as usize]).collect()
    };
    let mut bounds: Vec<u64> = Vec::with_capacity(values.len());
    for v in values {
        if v > min && bounds.last().is_none_or(|&b| v > b) {
            bounds.push(v);
        }
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_list() {
        let lengths: Vec<u64> = (0..100).rev().collect();
        assert_eq!(quantile_boundaries(&lengths, 4), vec![25, 50, 75]);
        assert_eq!(quantile_boundaries(&lengths, 1), Vec::<u64>::new());
        // a repeated length gives fewer buckets
        let mut lots = vec![7u64; 90];
        lots.extend(0..10);
        assert_eq!(quantile_boundaries(&lots, 4), vec![7]);
        let big: Vec<u64> = (0..1000).map(|i| (i * 7919 % 1000) << 30).collect();
        assert_eq!(quantile_boundaries(&big, 2), vec![500 << 30]);
    }
}

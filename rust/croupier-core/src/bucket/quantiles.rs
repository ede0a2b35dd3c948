//! Bucket boundaries from length quantiles.
//!
//! For `k` buckets over `N` lengths, boundary `j` (`1 <= j < k`) is the length at rank
//! `⌊j N / k⌋` of the lengths in increasing order; repeated boundaries, and boundaries not above
//! the smallest length, are dropped (so heavily repeated lengths give fewer buckets). A bucket
//! is `[b_j, b_{j+1})`, the first starting at 0 and the last open. Lengths below `2**24` are
//! counted in a histogram (`O(N + max)`); longer ones are sorted (a copy, in parallel).

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
    let min = crate::cancel::par_min(lengths);
    let (levels, counts) = super::histogram::length_counts(lengths, |_| true);
    // The value at rank q is the first whose cumulative count exceeds q.
    let mut values = Vec::with_capacity(ranks.len());
    let (mut v, mut below) = (0usize, 0u64);
    for &q in &ranks {
        if crate::cancel::cancelled() {
            return Vec::new(); // the caller discards the boundaries
        }
        while below + counts[v] <= q {
            below += counts[v];
            v += 1;
        }
        values.push(levels[v]);
    }
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

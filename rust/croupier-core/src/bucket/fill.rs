//! Batches filled to the budget with their running longest sample (the global order's rule).
//!
//! A bucket's samples, in the epoch's order, are cut greedily: a batch takes the next sample
//! while `count * g(longest so far) <= max_tokens` and `count <= batch_size`, where a sample of
//! length `L` costs `g(L) = L` padded tokens, or `L + L**2 / q` with a quadratic term (lhotse's
//! `quadratic_duration`: attention's cost grows with the square of the length). Unlike
//! lhotse, which closes a batch only once it is over and so may exceed the budget by one
//! sample, every batch keeps the budget. A batch cut by the budget holds a multiple of
//! `multiple` samples when at least one multiple fits (the rest start the next batch); a
//! bucket's last batch may be short.
//!
//! Each batch's cost is at least the sum of its samples' costs, so a bucket of total cost `S`
//! needs at least `ceil(S / max_tokens)` batches (and `ceil(n / batch_size)`) in any order:
//! `Budget::lower_bound`, which the epoch plan uses to place most of a bucket's batches
//! before its order is known.

use super::plan::Limits;

/// A batch's limits in integer arithmetic: costs are scaled by `q` with a quadratic term.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// `max_tokens * q` (or `max_tokens`); `None` without a token budget.
    tokens: Option<u128>,
    quadratic: Option<u64>,
    batch_size: u64,
    multiple: u64,
}

impl Budget {
    pub(crate) fn new(limits: &Limits) -> Self {
        Budget {
            tokens: limits
                .max_tokens
                .map(|t| u128::from(t) * u128::from(limits.quadratic.unwrap_or(1))),
            quadratic: limits.quadratic,
            batch_size: limits.batch_size.unwrap_or(u64::MAX),
            multiple: limits.multiple.max(1),
        }
    }

    /// The cost of one sample of length `len` (scaled like the budget).
    #[inline(always)]
    pub(crate) fn unit(&self, len: u64) -> u128 {
        let l = u128::from(len.max(1));
        match self.quadratic {
            None => l,
            Some(q) => l * u128::from(q) + l * l,
        }
    }

    /// Where each batch of `lens` (a bucket's lengths in the epoch's order) starts, and the
    /// end: `batches + 1` offsets from 0 to `lens.len()`.
    pub(crate) fn cuts(&self, lens: &[u64]) -> Vec<u64> {
        let n = lens.len();
        let mut cuts = Vec::with_capacity(n / 8 + 2);
        cuts.push(0u64);
        let mut start = 0usize;
        let limit = self.tokens.unwrap_or(u128::MAX);
        let size = self.batch_size.min(n as u64) as usize;
        while start < n {
            let mut longest = 0u128;
            let mut c = 0usize;
            while start + c < n && c < size {
                let u = self.unit(lens[start + c]).max(longest);
                if (c as u128 + 1) * u > limit {
                    break;
                }
                longest = u;
                c += 1;
            }
            let c = if c == 0 {
                1 // a sample over the budget alone (never in a regular bucket)
            } else if start + c < n && c as u64 >= self.multiple {
                c - c % self.multiple as usize
            } else {
                c
            };
            start += c;
            cuts.push(start as u64);
        }
        cuts
    }

    /// The fewest batches any order of a bucket of `n` samples whose costs add up to
    /// `total_cost` can be cut into.
    pub(crate) fn lower_bound(&self, n: u64, total_cost: u128) -> u64 {
        let by_size = n.div_ceil(self.batch_size);
        let by_tokens = match self.tokens {
            None => 0,
            Some(t) => total_cost.div_ceil(t).min(u128::from(u64::MAX)) as u64,
        };
        by_size.max(by_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(max_tokens: u64, batch_size: Option<u64>, quadratic: Option<u64>) -> Budget {
        Budget::new(&Limits {
            batch_size,
            max_tokens: Some(max_tokens),
            quadratic,
            ..Limits::default()
        })
    }

    /// Padded cost of a batch under `b`, scaled.
    fn cost(b: &Budget, lens: &[u64]) -> u128 {
        lens.len() as u128 * lens.iter().map(|&l| b.unit(l)).max().unwrap_or(0)
    }

    #[test]
    fn greedy_batches_keep_the_budget_and_cannot_take_the_next_sample() {
        let mut h = 1u64;
        for case in 0..200u64 {
            h = crate::stream::fold(h, case);
            let n = 1 + (h % 300) as usize;
            let lens: Vec<u64> = (0..n as u64)
                .map(|i| 1 + crate::stream::fold(h, i) % 500)
                .collect();
            let quad = (case % 3 == 0).then_some(700);
            let size = (case % 4 == 1).then_some(7);
            let b = budget(4000, size, quad);
            let cuts = b.cuts(&lens);
            assert_eq!((cuts[0], *cuts.last().unwrap()), (0, n as u64));
            for w in cuts.windows(2) {
                let batch = &lens[w[0] as usize..w[1] as usize];
                assert!(!batch.is_empty());
                assert!(cost(&b, batch) <= b.tokens.unwrap(), "case {case}");
                assert!(size.is_none_or(|s| batch.len() as u64 <= s));
                if (w[1] as usize) < n {
                    let more = &lens[w[0] as usize..=w[1] as usize];
                    let full = size.is_some_and(|s| batch.len() as u64 == s);
                    assert!(
                        full || cost(&b, more) > b.tokens.unwrap(),
                        "case {case}: not full"
                    );
                }
            }
            let total: u128 = lens.iter().map(|&l| b.unit(l)).sum();
            assert!(b.lower_bound(n as u64, total) < cuts.len() as u64);
        }
    }

    #[test]
    fn multiples_round_cut_batches_down_and_leave_the_last_alone() {
        let b = Budget::new(&Limits {
            batch_size: None,
            max_tokens: Some(100),
            multiple: 4,
            ..Limits::default()
        });
        // 10 samples of 10 tokens fit; rounded to 8; the last batch holds what is left.
        let cuts = b.cuts(&[10; 21]);
        assert_eq!(cuts, vec![0, 8, 16, 21]);
    }

    #[test]
    fn the_quadratic_term_shrinks_batches_of_long_samples() {
        let plain = budget(10_000, None, None);
        let quad = budget(10_000, None, Some(1000));
        assert_eq!(plain.cuts(&[1000; 10]), vec![0, 10]);
        // 1000 + 1000**2 / 1000 = 2000 tokens each: 5 per batch.
        assert_eq!(quad.cuts(&[1000; 10]), vec![0, 5, 10]);
        assert_eq!(quad.cuts(&[10; 20]), vec![0, 20]); // short ones barely notice
    }
}

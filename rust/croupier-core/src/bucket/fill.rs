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
//! Every epoch of a bucket has the same number of batches, its target (`Budget::target`,
//! set once from a reference order), so that `len` is the same every epoch (trainers fix their
//! steps per epoch from the first) and the epoch's plan is known before any bucket is cut:
//! `Budget::exact_cuts` reaches the target from the greedy cut by halving batches (most
//! epochs) or, when the greedy cut makes more, by sorting the order within windows first.

use super::plan::Limits;
use crate::cancel::{cancelled, CHECK_EVERY};

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
            // Saturates: a cost past 2**128 is past any budget.
            Some(q) => (l * u128::from(q)).saturating_add(l * l),
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
        let mut look = CHECK_EVERY;
        while start < n {
            if start >= look {
                if cancelled() {
                    // The caller discards the cuts: one last batch to the end keeps them whole.
                    cuts.push(n as u64);
                    break;
                }
                look = start + CHECK_EVERY;
            }
            let mut longest = 0u128;
            let mut c = 0usize;
            while start + c < n && c < size {
                let u = self.unit(lens[start + c]).max(longest);
                if (c as u128 + 1).saturating_mul(u) > limit {
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

    /// A bucket's batch count for every epoch: the greedy count of a reference order of its
    /// lengths `reference` plus a margin of two standard deviations of the count (estimated
    /// from the spread of the reference's batch sizes: `sqrt(b) * sd / mean`) and one, at
    /// least the fewest batches any order allows (the greedy cut of the lengths from the
    /// longest down: a batch whose longest is `L` holds at most what fits beside `L`, and
    /// taking the longest samples first fills every batch to that), at most one per sample.
    pub(crate) fn target(&self, reference: &[u64]) -> u64 {
        let n = reference.len() as u64;
        if n == 0 {
            return 0;
        }
        let cuts = self.cuts(reference);
        let b = cuts.len() as u64 - 1;
        let sizes: Vec<f64> = cuts.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let full = &sizes[..sizes.len().saturating_sub(1).max(1)];
        let mean = full.iter().sum::<f64>() / full.len() as f64;
        let var = full.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / full.len() as f64;
        let margin = (2.0 * (b as f64).sqrt() * var.sqrt() / mean).ceil() as u64 + 1;
        if cancelled() {
            return b; // the caller discards the target
        }
        let fewest = self.cuts(&longest_first(reference)).len() as u64 - 1;
        (b + margin).max(fewest).min(n)
    }

    /// A bucket's batches of an epoch, exactly `target` of them (at least the fewest its
    /// lengths allow, see [`Budget::target`]): the greedy cut of its order's lengths `lens`;
    /// if that makes more, the order is sorted from the longest down within windows of twice
    /// the mean batch, then of ever larger windows, until the cut makes at most `target`; then
    /// batches are halved from the last one back (a half holding a multiple of `multiple` when
    /// one fits) until there are `target`. Returns the cuts, and the new order (as indices into
    /// the given one) when it sorted.
    pub(crate) fn exact_cuts(&self, lens: &[u64], target: u64) -> (Vec<u64>, Option<Vec<u64>>) {
        let n = lens.len();
        let mut cuts = self.cuts(lens);
        let mut reorder = None;
        if cuts.len() as u64 - 1 > target {
            let mut window = 2 * n.div_ceil(target.max(1) as usize).max(1);
            loop {
                let mut order: Vec<u64> = (0..n as u64).collect();
                for chunk in order.chunks_mut(window) {
                    if cancelled() {
                        break; // the caller discards the order
                    }
                    // Stable: ties keep their order.
                    crate::cancel::sort_by_key(chunk, |&k| std::cmp::Reverse(lens[k as usize]));
                }
                let sorted: Vec<u64> = order.iter().map(|&k| lens[k as usize]).collect();
                cuts = self.cuts(&sorted);
                if cuts.len() as u64 - 1 <= target || window >= n || cancelled() {
                    reorder = Some(order);
                    break;
                }
                window *= 2;
            }
        }
        let mut need = target.saturating_sub(cuts.len() as u64 - 1);
        while need > 0 && !cancelled() {
            let before = need;
            let mut halves: Vec<u64> = Vec::with_capacity(cuts.len() + need as usize);
            halves.push(*cuts.last().expect("an end"));
            for w in cuts.windows(2).rev() {
                let (a, b) = (w[0], w[1]);
                let len = b - a;
                if need > 0 && len >= 2 {
                    let half = if len >= 2 * self.multiple && self.multiple > 1 {
                        len / 2 / self.multiple * self.multiple
                    } else {
                        len.div_ceil(2)
                    };
                    halves.push(a + half);
                    need -= 1;
                }
                halves.push(a);
            }
            halves.reverse();
            cuts = halves;
            if need == before {
                break; // nothing left to halve (target above the samples: never, by target)
            }
        }
        (cuts, reorder)
    }
}

/// `lens` from the longest down: counted when their range is small (a bucket's usually is),
/// else sorted.
fn longest_first(lens: &[u64]) -> Vec<u64> {
    let (lo, hi) = lens
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &l| (lo.min(l), hi.max(l)));
    if hi - lo < 1 << 20 {
        let mut counts = vec![0u32; (hi - lo + 1) as usize];
        for piece in lens.chunks(CHECK_EVERY) {
            if cancelled() {
                break; // the caller discards the order
            }
            for &l in piece {
                counts[(l - lo) as usize] += 1;
            }
        }
        let mut out = Vec::with_capacity(lens.len());
        for (v, &c) in counts.iter().enumerate().rev() {
            out.extend(std::iter::repeat_n(lo + v as u64, c as usize));
        }
        return out;
    }
    let mut sorted = lens.to_vec();
    crate::cancel::sort_by_key(&mut sorted, |&l| std::cmp::Reverse(l));
    sorted
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
            // Exactly the target, whatever the order: every batch still within the budget.
            let target = b.target(&lens);
            assert!(target >= cuts.len() as u64 - 1 || target == n as u64);
            for t in [
                target,
                target.saturating_sub(5).max(1),
                (target + 7).min(n as u64),
            ] {
                let fewest = {
                    let mut s = lens.clone();
                    s.sort_unstable_by(|x, y| y.cmp(x));
                    b.cuts(&s).len() as u64 - 1
                };
                if t < fewest {
                    continue;
                }
                let (exact, reorder) = b.exact_cuts(&lens, t);
                let pos: Vec<u64> = reorder.unwrap_or_else(|| (0..n as u64).collect());
                assert_eq!(exact.len() as u64 - 1, t, "case {case}");
                let mut sorted_pos = pos.clone();
                sorted_pos.sort_unstable();
                assert_eq!(sorted_pos, (0..n as u64).collect::<Vec<_>>());
                for w in exact.windows(2) {
                    let batch: Vec<u64> = pos[w[0] as usize..w[1] as usize]
                        .iter()
                        .map(|&p| lens[p as usize])
                        .collect();
                    assert!(!batch.is_empty());
                    assert!(cost(&b, &batch) <= b.tokens.unwrap());
                    assert!(size.is_none_or(|s| batch.len() as u64 <= s));
                }
            }
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

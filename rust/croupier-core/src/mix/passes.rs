//! One dataset's stream in a mixture: pass after pass, each pass a fresh uniform permutation
//! of the dataset dealt to the ranks with torch's arithmetic, of which a rank reads its share.
//!
//! Pass `k` of dataset `d` in epoch `e` is laid out like a `DistributedSampler` epoch over the
//! dataset's `n` samples ([`Layout`]: `drop_last` cuts to `⌊n/W⌋` per rank, otherwise the
//! head pads to `⌈n/W⌉`), so the ranks never overlap inside a pass. As in
//! [`crate::deal::fast_share`], the uniform permutation is drawn as a uniform partition of
//! `[0, n)` into the ranks' value sets ([`crate::deal::class_split`], keyed by
//! `(seed, epoch, MixPass, id)` with `id = fold(fold(0, d), k)`) and a uniform order inside each.
//! Here a rank's share is cut into blocks of a fixed [`PASS_BLOCK`] positions, each ordered by
//! Fisher–Yates with the stream `(seed, epoch, MixPassOrder, fold(id, class))`: a mixture
//! reads every dataset a little at a time, and fixed blocks make any position range cost at
//! most one block more than its length, wherever it lies.
//!
//! The padding position of `drop_last=False` repeats the first index of another rank's share
//! of the same pass (torch's head padding), so a rank never sees a value twice in one pass.

use crate::deal::class_split::{class_offsets, class_values_into, Classes, Run};
use crate::deal::layout::Layout;
use crate::error::{Error, Result};
use crate::index::{try_with_capacity, Index};
use crate::shuffle::fisher_yates::fisher_yates;
use crate::stream::{fold, Purpose, Stream};
use rayon::prelude::*;

/// Positions per block of a rank's pass share.
pub(crate) const PASS_BLOCK: u64 = 1 << 12;

/// The classes of one pass: every rank's blocks, rank-major, then the values `drop_last`
/// cuts (if any).
#[derive(Debug, Clone)]
struct PassClasses {
    w: u64,
    q: u64,
    rem: u64,
    kept: u64,
    cut: u64,
    blocks: u64,
}

impl PassClasses {
    fn new(layout: &Layout) -> Result<Self> {
        let (n, w) = (layout.n(), layout.num_replicas());
        let kept = n.min(layout.total_size());
        let (q, rem) = (kept / w, kept % w);
        let largest = q + u64::from(rem > 0);
        let blocks = largest.div_ceil(PASS_BLOCK).max(1);
        if w.checked_mul(blocks)
            .and_then(|x| x.checked_add(1))
            .is_none()
        {
            return Err(Error::out_of_range(
                "num_replicas",
                format!(
                    "at most {} for a dataset of this length",
                    u64::MAX / blocks - 1
                ),
                w,
            ));
        }
        Ok(PassClasses {
            w,
            q,
            rem,
            kept,
            cut: n - kept,
            blocks,
        })
    }

    fn share(&self, r: u64) -> u64 {
        self.q + u64::from(r < self.rem)
    }

    fn class(&self, r: u64, j: u64) -> u64 {
        r * self.blocks + j
    }
}

impl Classes for PassClasses {
    fn count(&self) -> u64 {
        self.w * self.blocks + u64::from(self.cut > 0)
    }

    fn prefix(&self, x: u64) -> u64 {
        let ranks = self.w * self.blocks;
        if x > ranks {
            return self.kept + self.cut;
        }
        if x == ranks {
            return self.kept;
        }
        let (r, j) = (x / self.blocks, x % self.blocks);
        r * self.q + r.min(self.rem) + self.share(r).min(j * PASS_BLOCK)
    }

    /// Ranks in halves (a rank is one subtree), the cut values apart from the ranks.
    fn split(&self, a: u64, b: u64) -> u64 {
        let ranks = self.w * self.blocks;
        if b > ranks {
            return ranks;
        }
        let (first, last) = (a / self.blocks, (b - 1) / self.blocks);
        if first != last {
            return (first + (last + 1 - first) / 2) * self.blocks;
        }
        a + (b - a) / 2
    }

    fn leaf(&self) -> u64 {
        // As for a rank's share (`deal::fast_share`): big value leaves while each rank holds a
        // large fraction of every range.
        if self.w < 64 {
            1024
        } else {
            64
        }
    }
}

/// The passes of one dataset, as rank `rank` sees them.
#[derive(Debug, Clone)]
pub(crate) struct Passes {
    layout: Layout,
    classes: PassClasses,
    rank: u64,
    shuffle: bool,
}

impl Passes {
    /// The passes of a dataset of `n >= 1` samples over `w` ranks.
    pub(crate) fn new(n: u64, w: u64, rank: u64, drop_last: bool, shuffle: bool) -> Result<Self> {
        let layout = Layout::new(n, w, drop_last)?;
        layout.check_rank(rank)?;
        let classes = PassClasses::new(&layout)?;
        Ok(Passes {
            layout,
            classes,
            rank,
            shuffle,
        })
    }

    /// Positions of one pass on one rank: the rank's share.
    pub(crate) fn per_pass(&self) -> u64 {
        self.layout.num_samples()
    }

    /// Positions `[start, stop)` of the rank's share of pass `pass`, plus `offset`, into `out`
    /// (`stop - start` long, `stop <= per_pass()`).
    pub(crate) fn read<T: Index>(
        &self,
        (seed, epoch, dataset, pass): (u64, u64, u64, u64),
        (start, stop): (u64, u64),
        offset: u64,
        out: &mut [T],
    ) -> Result<()> {
        debug_assert!(start <= stop && stop <= self.per_pass());
        debug_assert_eq!(out.len() as u64, stop - start);
        let (n, w, rank) = (self.layout.n(), self.layout.num_replicas(), self.rank);
        if !self.shuffle {
            for (o, k) in out.iter_mut().zip(start..stop) {
                *o = T::from_u64(offset + (rank + w * k) % n);
            }
            return Ok(());
        }
        let id = fold(fold(0, dataset), pass);
        let c = self.classes.share(rank);
        let own_stop = stop.min(c);
        if start < own_stop {
            let j0 = start / PASS_BLOCK;
            let j1 = own_stop.div_ceil(PASS_BLOCK);
            let blocks = self.blocks::<T>((seed, epoch, id), rank, (j0, j1))?;
            let from = (start - j0 * PASS_BLOCK) as usize;
            let len = (own_stop - start) as usize;
            out[..len]
                .par_iter_mut()
                .with_min_len(1 << 14)
                .zip(&blocks[from..from + len])
                .for_each(|(o, v)| *o = T::from_u64(offset + v.to_u64()));
        }
        if stop > c && start <= c {
            // torch's head padding: global position rank + c*W repeats π[s], s < W, which is
            // position 0 of rank s's share.
            let s = (rank + c * w - n) % n;
            let head = self.blocks::<T>((seed, epoch, id), s % w, (0, 1))?;
            out[(c - start) as usize] = T::from_u64(offset + head[0].to_u64());
        }
        Ok(())
    }

    /// Rank `r`'s blocks `[j0, j1)` of the pass keyed `id`, each shuffled.
    fn blocks<T: Index>(
        &self,
        (seed, epoch, id): (u64, u64, u64),
        r: u64,
        (j0, j1): (u64, u64),
    ) -> Result<Vec<T>> {
        let classes = &self.classes;
        let (c0, c1) = (classes.class(r, j0), classes.class(r, j1));
        let offsets = class_offsets(classes, c0, c1);
        let total = *offsets.last().expect("at least one class");
        let mut values = try_with_capacity::<T>("a mixture pass's indices", total)?;
        values.resize(total as usize, T::from_u64(0));
        let mut runs = Vec::with_capacity(offsets.len() - 1);
        let mut rest: &mut [T] = &mut values;
        for o in offsets.windows(2) {
            let (seg, tail) = std::mem::take(&mut rest).split_at_mut((o[1] - o[0]) as usize);
            runs.push(Run::new(seg));
            rest = tail;
        }
        let base = fold(
            Stream::new(seed, epoch, Purpose::MixPass, id).next_u64(),
            fold(
                fold(self.layout.n(), self.layout.num_replicas()),
                u64::from(self.layout.drop_last()),
            ),
        );
        class_values_into(self.layout.n(), classes, c0, c1, base, runs);
        values
            .par_chunks_mut(PASS_BLOCK as usize)
            .enumerate()
            .for_each(|(i, block)| {
                let class = c0 + i as u64;
                fisher_yates(
                    block,
                    &mut Stream::new(seed, epoch, Purpose::MixPassOrder, fold(id, class)),
                );
            });
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn pass(n: u64, w: u64, r: u64, drop_last: bool, k: u64) -> Vec<u64> {
        let p = Passes::new(n, w, r, drop_last, true).unwrap();
        let mut out = vec![0u64; p.per_pass() as usize];
        p.read((5, 1, 3, k), (0, p.per_pass()), 0, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn ranks_partition_each_pass() {
        for (n, w) in [(10_000u64, 3u64), (9_000, 8), (5, 8), (1, 1), (20_000, 1)] {
            for drop_last in [true, false] {
                let shares: Vec<Vec<u64>> = (0..w).map(|r| pass(n, w, r, drop_last, 2)).collect();
                let layout = Layout::new(n, w, drop_last).unwrap();
                let mut all: Vec<u64> = shares.iter().flatten().copied().collect();
                assert!(shares
                    .iter()
                    .all(|s| s.len() as u64 == layout.num_samples()));
                let distinct: HashSet<u64> = all.iter().copied().collect();
                assert!(all.iter().all(|&v| v < n));
                if drop_last {
                    assert_eq!(distinct.len(), all.len());
                } else {
                    assert_eq!(distinct.len() as u64, n);
                }
                all.sort_unstable();
                all.dedup();
                assert_eq!(all.len(), distinct.len());
            }
        }
    }

    #[test]
    fn passes_differ_and_ranges_agree_with_the_whole() {
        let whole = pass(50_000, 4, 1, false, 0);
        assert_ne!(whole, pass(50_000, 4, 1, false, 1));
        let p = Passes::new(50_000, 4, 1, false, true).unwrap();
        for (a, b) in [
            (0u64, 1u64),
            (4095, 4097),
            (100, 9_000),
            (12_499, 12_500),
            (0, 12_500),
        ] {
            let mut out = vec![0u64; (b - a) as usize];
            p.read((5, 1, 3, 0), (a, b), 7, &mut out).unwrap();
            let want: Vec<u64> = whole[a as usize..b as usize]
                .iter()
                .map(|v| v + 7)
                .collect();
            assert_eq!(out, want, "range {a}..{b}");
        }
    }

    #[test]
    fn sequential_passes_follow_torch_striding() {
        let p = Passes::new(10, 4, 3, false, false).unwrap();
        let mut out = vec![0u32; 3];
        p.read((0, 0, 0, 0), (0, 3), 100, &mut out).unwrap();
        assert_eq!(out, vec![103, 107, 101]);
    }
}

//! One dataset's stream in a mixture: pass after pass, each pass a fresh uniform permutation
//! of the dataset dealt to the ranks with torch's arithmetic, of which a rank reads its share.
//!
//! Pass `k` of dataset `d` in epoch `e` is laid out like a `DistributedSampler` epoch over the
//! dataset's `n` samples ([`Layout`]: `drop_last` cuts to `⌊n/W⌋` per rank, otherwise the
//! head pads to `⌈n/W⌉`), so the ranks never overlap inside a pass, and shuffled as
//! `order="per_rank"` shuffles an epoch ([`crate::deal::fast_share`]: a rank's share computed
//! alone, readable from any position), under the seed
//! `Stream(seed, e, MixPass, fold(fold(0, d), k)).next_u64()` and epoch 0, with one
//! difference: a rank's share is cut into two blocks ([`Blocks::PASSES`]: its first 1024
//! positions and the rest), not doubling ones. Passes are read whole or from a position to
//! their end, rarely from a block boundary, and two blocks cut the partition walk's class
//! levels: reading a whole pass costs about half what a `DistributedSampler` epoch of `n`
//! costs. A read of part of a pass walks the whole partition (slower than doubling blocks
//! only when less than about 1% of the pass is used, and never slower than the whole pass)
//! but deals only the buckets of the long block's shuffle that it meets; a short read at any
//! position is a random access.
//!
//! Without shuffling every pass is the rank's strided `rank, rank + W, …` (mod `n`).

use crate::deal::fast_share::{fast_share_range_into, Blocks};
use crate::deal::layout::Layout;
use crate::error::Result;
use crate::index::Index;
use crate::stream::{fold, Purpose, Stream};
use rayon::prelude::*;

/// The passes of one dataset, as rank `rank` sees them.
#[derive(Debug, Clone)]
pub(crate) struct Passes {
    layout: Layout,
    rank: u64,
    shuffle: bool,
}

impl Passes {
    /// The passes of a dataset of `n >= 1` samples over `w` ranks.
    pub(crate) fn new(n: u64, w: u64, rank: u64, drop_last: bool, shuffle: bool) -> Result<Self> {
        let layout = Layout::new(n, w, drop_last)?;
        layout.check_rank(rank)?;
        Ok(Passes {
            layout,
            rank,
            shuffle,
        })
    }

    /// The same passes as rank `rank` of the same ranks sees them.
    pub(crate) fn for_rank(&self, rank: u64) -> Result<Self> {
        self.layout.check_rank(rank)?;
        Ok(Passes {
            rank,
            ..self.clone()
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
        let pass_seed =
            Stream::new(seed, epoch, Purpose::MixPass, fold(fold(0, dataset), pass)).next_u64();
        fast_share_range_into(
            &self.layout,
            Blocks::PASSES,
            rank,
            (pass_seed, 0),
            (start, stop),
            out,
        )?;
        if offset > 0 {
            out.par_iter_mut()
                .with_min_len(1 << 15)
                .for_each(|o| *o = T::from_u64(offset + o.to_u64()));
        }
        Ok(())
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
        // 100_003 over 3: a long, bucketed second block (33,334 positions).
        for (n, w) in [
            (10_000u64, 3u64),
            (9_000, 8),
            (5, 8),
            (1, 1),
            (20_000, 1),
            (100_003, 3),
        ] {
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

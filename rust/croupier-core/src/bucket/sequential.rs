//! NeMo Automodel's `SequentialBucketSampler` order: buckets one after another, each shuffled,
//! padded to a multiple of the ranks and dealt, then cut into batches of its own size.
//!
//! # The order (NeMo's, for `order="torch"`)
//!
//! One `torch.Generator` seeded with `seed + epoch` draws, in this order, the bucket order
//! (`randperm(K)`, when buckets are shuffled) and then, bucket by bucket in that order, the
//! bucket's shuffle (`randperm(n_j)`, when samples are shuffled). A bucket's shuffled list of
//! `n_j` members is padded to `⌈n_j / W⌉ W` by cycling from its start; rank `r` takes positions
//! `r, r + W, …` of it (so `⌈n_j / W⌉` positions) and cuts them into batches of the bucket's
//! size, dropping a short last batch with `drop_last`. The rank yields the buckets' batches in
//! the bucket order.
//!
//! `order="fast"` keeps all of that and draws the two shuffles from croupier's own streams
//! instead: the bucket order is an `order="fast"` permutation of `K` under
//! `Stream(seed, epoch, BucketOrder, 0)`, bucket `j`'s shuffle (`j` its position in the
//! dataset's sorted keys) one of `n_j` under `Stream(seed, epoch, BucketShuffle, j)`, so a
//! bucket's shuffle does not depend on the ones before it.
//!
//! # Cost
//!
//! Batch counts are arithmetic. A range of batches computes the shuffle of each bucket it
//! touches (and, in torch's order, advances the generator over the buckets before: their
//! draws, without their swaps), so a resume costs one bucket's shuffle, not the epoch.

use crate::deal::check_world;
use crate::deal::layout::Layout;
use crate::deal::rank::{rank_range, Order};
use crate::error::{Error, Result};
use crate::index::{try_with_capacity, Index, Indices, U32_MAX_LEN};
use crate::shuffle::torch_randperm::{TorchGenerator, TorchRandperm};
use crate::stream::{Purpose, Stream};

/// Where the shuffles come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqOrder {
    /// croupier's own streams.
    Fast,
    /// One torch generator seeded with `seed + epoch`, as NeMo draws them.
    Torch(TorchRandperm),
}

/// A dataset's buckets in NeMo's sorted key order, with their batch sizes, on one rank.
#[derive(Debug, Clone)]
pub struct SequentialBuckets {
    members: Vec<u64>,
    starts: Vec<u64>,
    sizes: Vec<u64>,
    w: u64,
    rank: u64,
    drop_last: bool,
    shuffle_buckets: bool,
    shuffle_within: bool,
    order: SeqOrder,
}

impl SequentialBuckets {
    /// `buckets[j]` lists bucket `j`'s sample indices (in the dataset's order), `sizes[j]` its
    /// batch size (`>= 1`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        buckets: &[Vec<u64>],
        sizes: &[u64],
        w: u64,
        rank: u64,
        drop_last: bool,
        (shuffle_buckets, shuffle_within): (bool, bool),
        order: SeqOrder,
    ) -> Result<Self> {
        if buckets.len() != sizes.len() {
            return Err(Error::out_of_range(
                "sizes",
                format!("one batch size per bucket ({})", buckets.len()),
                sizes.len(),
            ));
        }
        if let Some(j) = sizes.iter().position(|&s| s == 0) {
            return Err(Error::out_of_range(
                "batch size",
                format!(">= 1 (bucket {j})"),
                0,
            ));
        }
        check_world(w, rank)?;
        let mut members = Vec::new();
        let mut starts = vec![0u64];
        for b in buckets {
            members.extend_from_slice(b);
            starts.push(members.len() as u64);
        }
        Ok(SequentialBuckets {
            members,
            starts,
            sizes: sizes.to_vec(),
            w,
            rank,
            drop_last,
            shuffle_buckets,
            shuffle_within,
            order,
        })
    }

    fn n(&self, j: usize) -> u64 {
        self.starts[j + 1] - self.starts[j]
    }

    /// Batches of bucket `j` on every rank.
    pub fn bucket_batches(&self, j: usize) -> u64 {
        let per = self.n(j).div_ceil(self.w);
        if self.drop_last {
            per / self.sizes[j]
        } else {
            per.div_ceil(self.sizes[j])
        }
    }

    /// Batches per rank and epoch.
    pub fn len(&self) -> u64 {
        (0..self.sizes.len()).map(|j| self.bucket_batches(j)).sum()
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes a read of this rank's batches holds at most: every sample of every bucket as
    /// `u64` (a rank's share is smaller). An estimate, to refuse what cannot fit before any
    /// work.
    pub fn range_bytes(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0).saturating_mul(8)
    }

    fn bucket_order(
        &self,
        seed: u64,
        epoch: u64,
        gen: &mut Option<TorchGenerator>,
    ) -> Result<Vec<usize>> {
        let k = self.sizes.len() as u64;
        if !self.shuffle_buckets {
            return Ok((0..k as usize).collect());
        }
        let perm = match (self.order, gen.as_mut()) {
            (SeqOrder::Torch(_), Some(g)) => g.randperm(k)?,
            _ => {
                let key = Stream::new(seed, epoch, Purpose::BucketOrder, 0).next_u64();
                rank_range(
                    &Layout::new(k, 1, false)?,
                    0,
                    true,
                    Order::Fast,
                    key,
                    0,
                    0,
                    k,
                )?
            }
        };
        Ok(match perm {
            Indices::U32(v) => v.into_iter().map(|x| x as usize).collect(),
            Indices::U64(v) => v.into_iter().map(|x| x as usize).collect(),
        })
    }

    /// Bucket `j`'s shuffled members (the generator, in torch's order, at its draw).
    fn shuffled(
        &self,
        j: usize,
        seed: u64,
        epoch: u64,
        gen: &mut Option<TorchGenerator>,
    ) -> Result<Vec<u64>> {
        let (base, n) = (self.starts[j] as usize, self.n(j));
        let members = &self.members[base..base + n as usize];
        if !self.shuffle_within {
            return Ok(members.to_vec());
        }
        let perm = match gen.as_mut() {
            Some(g) => g.randperm(n)?,
            None => {
                let key = Stream::new(seed, epoch, Purpose::BucketShuffle, j as u64).next_u64();
                rank_range(
                    &Layout::new(n, 1, false)?,
                    0,
                    true,
                    Order::Fast,
                    key,
                    0,
                    0,
                    n,
                )?
            }
        };
        Ok(match perm {
            Indices::U32(v) => v.into_iter().map(|p| members[p as usize]).collect(),
            Indices::U64(v) => v.into_iter().map(|p| members[p as usize]).collect(),
        })
    }

    /// This rank's batches `[start, stop)` of `epoch`: the indices and the batch offsets.
    pub fn range(
        &self,
        seed: u64,
        epoch: u64,
        start: u64,
        stop: u64,
    ) -> Result<(Indices, Vec<u64>)> {
        let total = self.len();
        if start > stop || stop > total {
            return Err(Error::out_of_range(
                "start, stop",
                format!("0 <= start <= stop <= {total}"),
                format!("{start}, {stop}"),
            ));
        }
        let max = self.members.iter().copied().max().unwrap_or(0);
        Ok(if max < U32_MAX_LEN {
            let (f, o) = self.range_as::<u32>(seed, epoch, start, stop)?;
            (Indices::U32(f), o)
        } else {
            let (f, o) = self.range_as::<u64>(seed, epoch, start, stop)?;
            (Indices::U64(f), o)
        })
    }

    fn range_as<T: Index>(
        &self,
        seed: u64,
        epoch: u64,
        start: u64,
        stop: u64,
    ) -> Result<(Vec<T>, Vec<u64>)> {
        let mut gen = match self.order {
            SeqOrder::Torch(variant) => {
                let s = crate::shuffle::torch_randperm::sampler_seed(seed, epoch)?;
                Some(TorchGenerator::new(s, variant))
            }
            SeqOrder::Fast => None,
        };
        let order = self.bucket_order(seed, epoch, &mut gen)?;
        let mut flat = try_with_capacity::<T>("a rank's batches", 0)?;
        let mut offsets = vec![0u64];
        let mut at = 0u64; // the rank's batch number where the current bucket starts
        for j in order {
            if at >= stop {
                break;
            }
            let nb = self.bucket_batches(j);
            let (lo, hi) = (start.max(at), stop.min(at + nb));
            if lo >= hi {
                // Not needed: in torch's order the generator still makes its draws.
                if let Some(g) = gen.as_mut() {
                    if self.shuffle_within {
                        g.skip_randperm(self.n(j));
                    }
                }
                at += nb;
                continue;
            }
            let list = self.shuffled(j, seed, epoch, &mut gen)?;
            let n = list.len() as u64;
            let per = n.div_ceil(self.w);
            let bs = self.sizes[j];
            for b in (lo - at)..(hi - at) {
                let (p0, p1) = (b * bs, ((b + 1) * bs).min(per));
                for p in p0..p1 {
                    let g = self.rank + p * self.w;
                    flat.push(T::from_u64(list[(g % n) as usize]));
                }
                offsets.push(flat.len() as u64);
            }
            at += nb;
            if at >= stop {
                break;
            }
        }
        Ok((flat, offsets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nemo(
        buckets: &[Vec<u64>],
        sizes: &[u64],
        w: u64,
        r: u64,
        drop_last: bool,
        seed: u64,
    ) -> Vec<Vec<u64>> {
        let s = SequentialBuckets::new(
            buckets,
            sizes,
            w,
            r,
            drop_last,
            (true, true),
            SeqOrder::Torch(TorchRandperm::InsideOutForLargeN),
        )
        .unwrap();
        let (flat, offsets) = s.range(seed, 0, 0, s.len()).unwrap();
        let flat = flat.to_u64_vec();
        offsets
            .windows(2)
            .map(|o| flat[o[0] as usize..o[1] as usize].to_vec())
            .collect()
    }

    #[test]
    fn ranges_equal_the_whole_in_both_orders() {
        let buckets: Vec<Vec<u64>> = vec![
            (0..37).collect(),
            (100..110).collect(),
            vec![],
            (200..203).collect(),
        ];
        let sizes = [4u64, 3, 2, 5];
        for order in [
            SeqOrder::Fast,
            SeqOrder::Torch(TorchRandperm::InsideOutForLargeN),
        ] {
            for drop_last in [true, false] {
                let s =
                    SequentialBuckets::new(&buckets, &sizes, 3, 1, drop_last, (true, true), order)
                        .unwrap();
                let (flat, offsets) = s.range(7, 2, 0, s.len()).unwrap();
                let (flat, whole) = (flat.to_u64_vec(), offsets);
                for a in 0..s.len() {
                    for b in a..=s.len() {
                        let (f, o) = s.range(7, 2, a, b).unwrap();
                        let want = &flat[whole[a as usize] as usize..whole[b as usize] as usize];
                        assert_eq!(f.to_u64_vec(), want, "{order:?} {a}..{b}");
                        assert_eq!(o.len() as u64, b - a + 1);
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_get_equal_counts_and_cover_each_bucket() {
        let buckets: Vec<Vec<u64>> = vec![(0..37).collect(), (100..110).collect()];
        let all: Vec<Vec<Vec<u64>>> = (0..4)
            .map(|r| nemo(&buckets, &[4, 3], 4, r, false, 1))
            .collect();
        assert!(all.iter().all(|b| b.len() == all[0].len()));
        let mut seen: Vec<u64> = all.iter().flatten().flatten().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 47);
    }
}

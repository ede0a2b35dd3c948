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

use crate::deal::layout::{Deal, Layout};
use crate::deal::rank::{rank_range, Draw};
use crate::error::{Error, Result};
use crate::index::{try_with_capacity, Index, Indices, U32_MAX_LEN};
use crate::shuffle::torch_randperm::{TorchGenerator, TorchRandperm};
use crate::stream::{Purpose, Stream};

/// Where the shuffles come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqOrder {
    /// croupier's own streams.
    Own,
    /// One torch generator seeded with `seed + epoch`, as NeMo draws them.
    Torch(TorchRandperm),
}

/// How [`SequentialBuckets`] deals its buckets: the rank and its world, the shuffles, and where
/// they come from.
///
/// The default is `SequentialBucketSampler`'s: one rank, `drop_last`, both shuffles, croupier's
/// own streams.
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::{SeqOrder, SequentialConfig};
/// use croupier_core::Deal;
///
/// let config = SequentialConfig {
///     deal: Deal { num_replicas: 2, rank: 1, drop_last: true },
///     shuffle_buckets: false,
///     ..SequentialConfig::default()
/// };
/// assert!(config.shuffle_within && config.order == SeqOrder::Own);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequentialConfig {
    /// The rank, its world, and whether a short last batch of a bucket is dropped.
    pub deal: Deal,
    /// Shuffle the order of the buckets.
    pub shuffle_buckets: bool,
    /// Shuffle the samples within each bucket.
    pub shuffle_within: bool,
    /// Where the shuffles come from.
    pub order: SeqOrder,
}

impl Default for SequentialConfig {
    fn default() -> Self {
        SequentialConfig {
            deal: Deal {
                drop_last: true,
                ..Deal::default()
            },
            shuffle_buckets: true,
            shuffle_within: true,
            order: SeqOrder::Own,
        }
    }
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
    /// batch size (`>= 1`), dealt as `config` says.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    ///
    /// let buckets: Vec<Vec<u64>> = vec![(0..10).collect(), (10..16).collect()];
    /// let config = SequentialConfig::default(); // one rank, drop_last
    /// let s = SequentialBuckets::new(&buckets, &[4, 3], &config).unwrap();
    /// assert_eq!(s.len(), 10 / 4 + 6 / 3); // whole batches of each bucket
    /// assert!(SequentialBuckets::new(&buckets, &[4], &config).is_err()); // one size per bucket
    /// ```
    pub fn new(buckets: &[Vec<u64>], sizes: &[u64], config: &SequentialConfig) -> Result<Self> {
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
        config.deal.check()?;
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
            w: config.deal.num_replicas,
            rank: config.deal.rank,
            drop_last: config.deal.drop_last,
            shuffle_buckets: config.shuffle_buckets,
            shuffle_within: config.shuffle_within,
            order: config.order,
        })
    }

    fn n(&self, j: usize) -> u64 {
        self.starts[j + 1] - self.starts[j]
    }

    /// Batches of bucket `j` on every rank.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    /// use croupier_core::Deal;
    ///
    /// let buckets: Vec<Vec<u64>> = vec![(0..10).collect(), (10..16).collect()];
    /// let deal = Deal { num_replicas: 2, rank: 0, drop_last: false };
    /// let config = SequentialConfig { deal, ..SequentialConfig::default() };
    /// let s = SequentialBuckets::new(&buckets, &[4, 3], &config).unwrap();
    /// // A bucket's samples are dealt to the ranks, then cut into batches of its size.
    /// assert_eq!(s.bucket_batches(0), 10_u64.div_ceil(2).div_ceil(4));
    /// assert_eq!(s.bucket_batches(1), 6_u64.div_ceil(2).div_ceil(3));
    /// ```
    pub fn bucket_batches(&self, j: usize) -> u64 {
        let per = self.n(j).div_ceil(self.w);
        if self.drop_last {
            per / self.sizes[j]
        } else {
            per.div_ceil(self.sizes[j])
        }
    }

    /// Batches per rank and epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    ///
    /// let buckets: Vec<Vec<u64>> = vec![(0..10).collect(), (10..16).collect()];
    /// let s = SequentialBuckets::new(&buckets, &[4, 3], &SequentialConfig::default()).unwrap();
    /// assert_eq!(s.len(), s.bucket_batches(0) + s.bucket_batches(1));
    /// ```
    pub fn len(&self) -> u64 {
        (0..self.sizes.len()).map(|j| self.bucket_batches(j)).sum()
    }

    /// Whether an epoch has no batches.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    ///
    /// let config = SequentialConfig::default(); // drop_last: a short batch is dropped
    /// let short = SequentialBuckets::new(&[vec![1, 2]], &[4], &config).unwrap();
    /// assert!(short.is_empty() && short.len() == 0);
    /// assert!(!SequentialBuckets::new(&[vec![1, 2]], &[2], &config).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes a read of this rank's batches holds at most: every sample of every bucket as
    /// `u64` (a rank's share is smaller). An estimate, to refuse what cannot fit before any
    /// work.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    ///
    /// let buckets: Vec<Vec<u64>> = vec![(0..10).collect(), (10..16).collect()];
    /// let s = SequentialBuckets::new(&buckets, &[4, 3], &SequentialConfig::default()).unwrap();
    /// let (flat, _) = s.range(0, 0, 0, s.len()).unwrap();
    /// assert!(flat.len() as u64 * 8 <= s.range_bytes()); // a bound of the indices
    /// ```
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
                rank_range(&Layout::new(k, 1, false)?, 0, Draw::keyed(key), 0..k)?
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
                rank_range(&Layout::new(n, 1, false)?, 0, Draw::keyed(key), 0..n)?
            }
        };
        Ok(match perm {
            Indices::U32(v) => v.into_iter().map(|p| members[p as usize]).collect(),
            Indices::U64(v) => v.into_iter().map(|p| members[p as usize]).collect(),
        })
    }

    /// This rank's batches `[start, stop)` of `epoch`: the indices and the batch offsets.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{SequentialBuckets, SequentialConfig};
    /// use croupier_core::Indices;
    ///
    /// let buckets: Vec<Vec<u64>> = vec![(0..10).collect(), (10..16).collect()];
    /// let s = SequentialBuckets::new(&buckets, &[4, 3], &SequentialConfig::default()).unwrap();
    /// let (flat, offsets) = s.range(7, 0, 0, s.len()).unwrap();
    /// let Indices::U32(flat) = flat else { unreachable!() };
    /// for b in offsets.windows(2) {
    ///     // One bucket per batch, as many samples as its batch size.
    ///     let batch = &flat[b[0] as usize..b[1] as usize];
    ///     let (bucket, size) = if batch[0] < 10 { (0..10, 4) } else { (10..16, 3) };
    ///     assert!(batch.len() == size && batch.iter().all(|i| bucket.contains(i)));
    /// }
    /// assert!(s.range(7, 0, 0, s.len() + 1).is_err());
    /// ```
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
            SeqOrder::Own => None,
        };
        let order = self.bucket_order(seed, epoch, &mut gen)?;
        if crate::cancel::cancelled() {
            return Err(crate::cancel::cancelled_error());
        }
        let mut flat = try_with_capacity::<T>("a rank's batches", 0)?;
        let mut offsets = vec![0u64];
        let mut at = 0u64; // the rank's batch number where the current bucket starts
        for j in order {
            if at >= stop {
                break;
            }
            if crate::cancel::cancelled() {
                return Err(crate::cancel::cancelled_error());
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
        let config = SequentialConfig {
            deal: Deal {
                num_replicas: w,
                rank: r,
                drop_last,
            },
            order: SeqOrder::Torch(TorchRandperm::InsideOutForLargeN),
            ..SequentialConfig::default()
        };
        let s = SequentialBuckets::new(buckets, sizes, &config).unwrap();
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
            SeqOrder::Own,
            SeqOrder::Torch(TorchRandperm::InsideOutForLargeN),
        ] {
            for drop_last in [true, false] {
                let config = SequentialConfig {
                    deal: Deal {
                        num_replicas: 3,
                        rank: 1,
                        drop_last,
                    },
                    order,
                    ..SequentialConfig::default()
                };
                let s = SequentialBuckets::new(&buckets, &sizes, &config).unwrap();
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

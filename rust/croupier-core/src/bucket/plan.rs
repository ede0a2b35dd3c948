//! A rank's batches of an epoch: samples grouped into length buckets, shuffled inside their
//! bucket, cut into batches, the batches ordered and dealt to the ranks.
//!
//! # The order
//!
//! - **Buckets** (fixed at construction): sample `i` is in bucket `j` when
//!   `b_j <= lengths[i] < b_{j+1}` for the boundaries `b` (`b_0 = 0`, the last bucket open);
//!   with a token budget, samples longer than the budget form one more bucket of their own
//!   (each served alone). A bucket's members are kept in index order (but for carried tails,
//!   below).
//! - **Carried tails** (the global order, [`Limits::carry`]): a bucket's last batch would be
//!   short; instead its tail goes to the next bucket, where it fills batches. Bucket `j` holds
//!   the samples carried to it and its own, `m_j` of them; it keeps the shortest
//!   `m_j - (m_j mod s_j)` (by length, then index) and carries the other `m_j mod s_j` (its
//!   longest) on, when they fit one batch of the next non-empty bucket (`<= s_next`; more
//!   would fill that bucket's batches with short samples only, cheap batches and more of
//!   them); else it keeps them all, as a short last batch. The last non-empty bucket keeps
//!   all it holds; an empty bucket keeps nothing and passes on what it was carried. A carried
//!   sample is shorter than the bucket's own, so the bucket's batch size (from its own
//!   longest sample, below) keeps every batch within the budget. In the order of
//!   `(length, index)` every bucket is then a contiguous range: the samples carried to it
//!   first (in that order), then its own (in index order).
//! - **Batch sizes** (fixed at construction): without a budget every batch of a bucket holds
//!   `batch_size`; with `max_tokens` bucket `j` holds `max_tokens / L_j` (rounded down, `L_j`
//!   its longest sample), at most `batch_size`, rounded down to a multiple of `multiple` when
//!   that leaves at least one multiple. So `len(batch) * max(lengths) <= max_tokens` for every
//!   batch, whatever the shuffle. A bucket of `n_j` members has `⌈n_j / s_j⌉` batches, its last
//!   one possibly short; with [`Limits::full_batches`], `⌊n_j / s_j⌋`, all full (the short
//!   one's samples, different ones each shuffled epoch, are left out).
//! - **Shuffle** (per epoch): bucket `j`'s members are permuted by the `order="per_rank"`
//!   permutation of `n_j` (one rank) under the seed `Stream(seed, epoch, BucketShuffle, j)`;
//!   batch `i` of the bucket is positions `[i s_j, (i + 1) s_j)` of it. Without shuffling the
//!   members stay in index order.
//! - **Batch order**: the `B` batches are numbered bucket by bucket; the epoch's order of them
//!   is a `DistributedSampler` epoch over `B` "samples" (`order="per_rank"`, seed
//!   `Stream(seed, epoch, BucketOrder, 0)`), or `0..B` in bucket order: rank `r` takes
//!   positions `r, r + W, …`, `drop_last` cuts `B` to a multiple of `W` and otherwise the
//!   first batches are repeated, so every rank has the same number of batches.
//!
//! Batch sizes and counts are arithmetic, so any batch is found in `O(log K)` and read by
//! random access into its bucket's permutation: a resume costs a few milliseconds at any
//! position. A whole epoch computes the permutation of every bucket holding one of its
//! batches, one bucket at a time.

use crate::cancel::{cancelled, cancelled_error, par_map, par_max, CHECK_EVERY};
use crate::deal::elastic::Elastic;
use crate::deal::layout::{Deal, Layout};
use crate::deal::rank::{rank_range, Draw};
use crate::error::{Error, Result};
use crate::index::{try_with_capacity, Index, Indices, U32_MAX_LEN};
use crate::stream::{fold, Purpose, Stream};
use rayon::prelude::*;
use std::ops::Range;

/// Lengths below this are bucketed through a table.
const TABLE_MAX: u64 = 1 << 24;
/// Batches read one at a time by random access (a resume's first batches) up to this many.
const RANDOM_ACCESS_BATCHES: u64 = 4;
/// Positions per random-access read of a bucket's permutation.
const READ: u64 = 64;

/// How batches are filled. The default has no size limit yet (give `batch_size` or
/// `max_tokens`), rounds to no multiple, serves oversized samples alone and keeps short batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// At most this many samples per batch.
    pub batch_size: Option<u64>,
    /// At most this many padded tokens (`len(batch) * max(lengths)`) per batch.
    pub max_tokens: Option<u64>,
    /// Batch sizes are rounded down to a multiple of this (when at least one multiple fits).
    pub multiple: u64,
    /// With `max_tokens`: a sample of length `L` costs `L + L**2 / quadratic` tokens
    /// (lhotse's `quadratic_duration`), so batches of long samples stay small.
    pub quadratic: Option<u64>,
    /// Samples longer than `max_tokens`: served alone (`true`) or refused (`false`).
    pub oversized_alone: bool,
    /// Only full batches: a bucket's last batch, when shorter than the bucket's batch size,
    /// is dropped (its samples wait for another epoch's shuffle), so every batch of a bucket
    /// holds exactly its size (static shapes with a fixed `batch_size`).
    pub full_batches: bool,
    /// Carry a regular bucket's tail to the next bucket where it fits one of its batches, so
    /// that short batches are rare (the global order's buckets, see the module documentation).
    pub carry: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            batch_size: None,
            max_tokens: None,
            multiple: 1,
            quadratic: None,
            oversized_alone: true,
            full_batches: false,
            carry: false,
        }
    }
}

impl Limits {
    /// Whether a sample of length `len` fits a batch on its own (else it is oversized).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::Limits;
    ///
    /// let limits = Limits { max_tokens: Some(100), quadratic: Some(100), ..Limits::default() };
    /// assert!(limits.fits(50) && !limits.fits(70)); // 70 + 70**2 / 100 = 119 tokens
    /// ```
    pub fn fits(&self, len: u64) -> bool {
        self.fitting(len) != Some(0)
    }

    /// How many samples of length `len` fit `max_tokens` (`None`: no token budget).
    fn fitting(&self, len: u64) -> Option<u64> {
        let t = u128::from(self.max_tokens?);
        let len = u128::from(len.max(1));
        let fit = match self.quadratic {
            None => t / len,
            Some(q) => t * u128::from(q) / (len * u128::from(q)).saturating_add(len * len),
        };
        Some(fit.min(u128::from(u64::MAX)) as u64)
    }
}

/// How an epoch's batches are drawn: the seed and epoch keying its shuffles, and which
/// shuffles apply.
///
/// The default is `BucketBatchSampler`'s: both shuffles, seed 0, epoch 0.
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::BatchDraw;
///
/// let draw = BatchDraw { epoch: 2, shuffle_batches: false, ..BatchDraw::default() };
/// assert!(draw.shuffle && !draw.shuffle_batches);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchDraw {
    /// The seed of the shuffles.
    pub seed: u64,
    /// The epoch: each epoch of a seed has its own shuffles.
    pub epoch: u64,
    /// Shuffle the samples within each bucket; without, nothing is shuffled.
    pub shuffle: bool,
    /// Shuffle the order of the batches too (together with `shuffle` only); without, the
    /// batches come bucket after bucket (`bucket_order="sorted"`).
    pub shuffle_batches: bool,
}

impl Default for BatchDraw {
    fn default() -> Self {
        BatchDraw {
            seed: 0,
            epoch: 0,
            shuffle: true,
            shuffle_batches: true,
        }
    }
}

impl BatchDraw {
    /// The keys of the shuffles within buckets: `(seed, epoch, shuffle)`.
    fn keys(&self) -> (u64, u64, bool) {
        (self.seed, self.epoch, self.shuffle)
    }

    /// The draw of the batch order, an `order="per_rank"` epoch over the batch ids.
    fn batch_order(&self) -> Draw {
        let key = Stream::new(self.seed, self.epoch, Purpose::BucketOrder, 0).next_u64();
        Draw {
            shuffle: self.shuffle && self.shuffle_batches,
            ..Draw::keyed(key)
        }
    }
}

/// The grouping of a dataset's samples into buckets and batch sizes.
#[derive(Debug, Clone)]
pub struct BucketPlan {
    n: u64,
    /// Members of every bucket, bucket after bucket, each in index order (with carried tails,
    /// the samples carried to it first).
    members: Indices,
    /// Where each bucket's members start in `members` (`buckets + 1` entries).
    starts: Vec<u64>,
    /// Batch size of each bucket.
    sizes: Vec<u64>,
    /// Batches before each bucket (`buckets + 1` entries).
    batch_starts: Vec<u64>,
    /// Longest sample of each bucket's own (its batch size's basis; with carried tails, the
    /// bucket may have passed it on).
    longest: Vec<u64>,
    limits: Limits,
    digest: u64,
}

impl BucketPlan {
    /// Buckets `lengths` by `boundaries` (strictly increasing) and sizes their batches.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// let lengths: Vec<u32> = (0..1000).map(|i| 1 + i % 100).collect();
    /// let limits = Limits {
    ///     batch_size: None,
    ///     max_tokens: Some(512),
    ///     ..Limits::default()
    /// };
    /// let plan = BucketPlan::new(&lengths, &[25, 50, 75], limits).unwrap();
    /// // Every batch keeps the budget: its size times its bucket's longest sample.
    /// assert!(plan.buckets().iter().all(|&(_, size, _, longest)| size * longest <= 512));
    /// assert!(BucketPlan::new(&lengths, &[50, 25], limits).is_err()); // not increasing
    /// ```
    pub fn new<L: Copy + Into<u64> + Send + Sync>(
        lengths: &[L],
        boundaries: &[u64],
        limits: Limits,
    ) -> Result<Self> {
        check_arguments(lengths.len(), boundaries, &limits)?;
        let regular = boundaries.len() + 1;
        let ids = bucket_ids(lengths, boundaries, &limits)?;
        let (counts, longest) = counts_and_longest(&ids, lengths, regular);
        if counts[regular] > 0 && !limits.oversized_alone {
            return Err(oversized_error(lengths, &limits, counts[regular]));
        }
        let starts = running_starts(&counts, |&c| c);
        if cancelled() {
            return Err(cancelled_error());
        }
        let at: Vec<u64> = starts[..regular + 1].to_vec();
        let members = if lengths.len() as u64 <= U32_MAX_LEN {
            Indices::U32(scatter::<u32>(&ids, at)?)
        } else {
            Indices::U64(scatter::<u64>(&ids, at)?)
        };
        drop(ids);
        if cancelled() {
            return Err(cancelled_error());
        }
        let sizes = batch_sizes(&limits, &longest);
        let (members, starts) = if limits.carry {
            match members {
                Indices::U32(mut m) => {
                    let starts = carry_tails(lengths, &mut m, &starts, &sizes)?;
                    (Indices::U32(m), starts)
                }
                Indices::U64(mut m) => {
                    let starts = carry_tails(lengths, &mut m, &starts, &sizes)?;
                    (Indices::U64(m), starts)
                }
            }
        } else {
            (members, starts)
        };
        let per_bucket: Vec<u64> = (0..=regular)
            .map(|j| {
                let held = starts[j + 1] - starts[j];
                if limits.full_batches && j < regular {
                    held / sizes[j]
                } else {
                    held.div_ceil(sizes[j])
                }
            })
            .collect();
        let batch_starts = running_starts(&per_bucket, |&b| b);
        Ok(BucketPlan {
            digest: digest(lengths),
            n: lengths.len() as u64,
            members,
            starts,
            sizes,
            batch_starts,
            longest,
            limits,
        })
    }

    /// Bucket `j`'s batches in every epoch.
    pub(crate) fn target(&self, j: usize) -> u64 {
        self.batch_starts[j + 1] - self.batch_starts[j]
    }

    /// Per bucket, its batches in every epoch (the oversized bucket last).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// let lengths: Vec<u32> = (0..10_000).map(|i| 10 + (i * 7919) % 90).collect();
    /// let carry = Limits { max_tokens: Some(1000), carry: true, ..Limits::default() };
    /// let plan = BucketPlan::new(&lengths, &[50], carry).unwrap();
    /// assert_eq!(plan.bucket_batches().iter().sum::<u64>(), plan.batches());
    /// // With carried tails, only the last bucket may have a short batch.
    /// let (first, last) = (plan.buckets()[0], plan.buckets()[1]);
    /// assert_eq!(first.0, first.1 * first.2);
    /// assert_eq!(last.2, last.0.div_ceil(last.1));
    /// ```
    pub fn bucket_batches(&self) -> Vec<u64> {
        self.batch_starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// A 64-bit fingerprint of the lengths (in order), the same on every platform.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(2), ..Limits::default() };
    /// let a = BucketPlan::new(&[3u32, 1, 2], &[], limits).unwrap();
    /// let b = BucketPlan::new(&[3u32, 1, 2], &[2], limits).unwrap();
    /// let c = BucketPlan::new(&[1u32, 2, 3], &[], limits).unwrap();
    /// assert_eq!(a.digest(), b.digest()); // the lengths' fingerprint, whatever the buckets
    /// assert_ne!(a.digest(), c.digest()); // their order counts
    /// ```
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Number of samples.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let plan = BucketPlan::new(&lengths, &[51], limits).unwrap();
    /// assert_eq!(plan.len(), 100);
    /// let members: u64 = plan.buckets().iter().map(|b| b.0).sum();
    /// assert_eq!(members, plan.len()); // every sample in one bucket
    /// ```
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether there are no samples (never: construction refuses it).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// assert!(!BucketPlan::new(&[7u32], &[], limits).unwrap().is_empty());
    /// assert!(BucketPlan::new(&[] as &[u32], &[], limits).is_err()); // no empty plan is built
    /// ```
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Batches in an epoch, over all ranks, before padding or cutting.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// let lengths: Vec<u32> = (0..1000).map(|i| 1 + i % 97).collect();
    /// let plan = BucketPlan::new(&lengths, &[10, 40], limits).unwrap();
    /// // Every bucket's members cut into batches of its size, the last one possibly short.
    /// let per_bucket: u64 = plan.buckets().iter().map(|&(n, size, _, _)| n.div_ceil(size)).sum();
    /// assert_eq!(plan.batches(), per_bucket);
    /// ```
    pub fn batches(&self) -> u64 {
        *self.batch_starts.last().expect("at least one bucket")
    }

    /// Bytes a read of batches `[start, stop)` holds at its peak: their samples (the mean
    /// batch, rounded up, at the index width), twice (pieces, then joined), a few words a
    /// batch, and the buckets cut at once. An estimate, to refuse what cannot fit before any
    /// work (`tests/test_memory_estimates.py` measures it against the peak).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let limits = Limits {
    ///     batch_size: Some(10),
    ///     max_tokens: None,
    ///     ..Limits::default()
    /// };
    /// let plan = BucketPlan::new(&lengths, &[51], limits).unwrap(); // two buckets of 50
    /// assert_eq!(plan.batches(), 10);
    /// // At least the output: 10 batches of 11 samples (the mean, rounded up) as u32.
    /// assert!(plan.range_bytes(0, 10) >= 10 * 11 * 4);
    /// ```
    pub fn range_bytes(&self, start: u64, stop: u64) -> u64 {
        let batches = stop.saturating_sub(start);
        let width = if self.n <= U32_MAX_LEN { 4 } else { 8 };
        let per_batch = self.n / self.batches().max(1) + 1;
        let output = per_batch.saturating_mul(batches).saturating_mul(width);
        // Beside the output: its pieces before they are joined (the global order gathers
        // each bucket's batches, then copies them into place), a few words of bookkeeping per
        // batch, and the buckets cut at once (one per thread), each its order, its members'
        // lengths and its cuts (at most 32 bytes a member, with a reordering copy).
        let at_once = (rayon::current_num_threads() as u64).min(batches);
        output
            .saturating_mul(2)
            .saturating_add(batches.saturating_mul(48))
            .saturating_add(self.cut_scratch_bytes(at_once))
    }

    /// Bytes of the scratch of cutting `at_once` buckets at the same time (the largest ones):
    /// each its order.
    pub(crate) fn cut_scratch_bytes(&self, at_once: u64) -> u64 {
        let width = if self.n <= U32_MAX_LEN { 4 } else { 8 };
        let mut per_bucket: Vec<u64> = (0..self.sizes.len())
            .map(|j| self.members_of(j).saturating_mul(width))
            .collect();
        per_bucket.sort_unstable_by(|a, b| b.cmp(a));
        per_bucket
            .iter()
            .take(at_once as usize)
            .fold(0u64, |acc, &b| acc.saturating_add(b))
    }

    /// Per bucket: `(members, batch size, batches, longest sample)`; the last bucket holds the
    /// samples longer than `max_tokens`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let buckets = BucketPlan::new(&lengths, &[51], limits).unwrap().buckets();
    /// assert_eq!(buckets.len(), 3); // [0, 51), [51, ∞) and the (empty) oversized one
    /// assert_eq!(buckets[0].3, 50); // its longest sample
    /// assert!(buckets.iter().all(|&(n, size, batches, _)| batches == n.div_ceil(size)));
    /// ```
    pub fn buckets(&self) -> Vec<(u64, u64, u64, u64)> {
        (0..self.sizes.len())
            .map(|j| {
                (
                    self.starts[j + 1] - self.starts[j],
                    self.sizes[j],
                    self.batch_starts[j + 1] - self.batch_starts[j],
                    self.longest[j],
                )
            })
            .collect()
    }

    fn member(&self, at: u64) -> u64 {
        match &self.members {
            Indices::U32(v) => u64::from(v[at as usize]),
            Indices::U64(v) => v[at as usize],
        }
    }

    fn locate(&self, batch: u64) -> (usize, u64) {
        let j = self.batch_starts.partition_point(|&s| s <= batch) - 1;
        (j, batch - self.batch_starts[j])
    }

    /// Positions `[a, b)` of bucket `j`'s order in `epoch`, as sample indices.
    fn bucket_range<T: Index>(
        &self,
        j: usize,
        (seed, epoch, shuffle): (u64, u64, bool),
        (a, b): (u64, u64),
        out: &mut Vec<T>,
    ) -> Result<()> {
        let base = self.starts[j];
        if !shuffle {
            out.extend((a..b).map(|p| T::from_u64(self.member(base + p))));
            return Ok(());
        }
        let n = self.starts[j + 1] - base;
        let layout = Layout::new(n, 1, false)?;
        let key = Stream::new(seed, epoch, Purpose::BucketShuffle, j as u64).next_u64();
        let member = |p: u64| T::from_u64(self.member(base + p));
        match rank_range(&layout, 0, Draw::keyed(key), a..b)? {
            Indices::U32(v) => out.extend(v.into_iter().map(|p| member(u64::from(p)))),
            Indices::U64(v) => out.extend(v.into_iter().map(member)),
        }
        Ok(())
    }

    /// Batches per rank with `w` ranks.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BucketPlan, Limits};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let plan = BucketPlan::new(&lengths, &[51], limits).unwrap(); // 10 batches
    /// assert_eq!(plan.rank_batches(3, false).unwrap(), plan.batches().div_ceil(3)); // padded
    /// assert_eq!(plan.rank_batches(3, true).unwrap(), plan.batches() / 3); // cut
    /// assert!(plan.rank_batches(0, false).is_err());
    /// ```
    pub fn rank_batches(&self, w: u64, drop_last: bool) -> Result<u64> {
        Ok(Layout::new(self.batches(), w, drop_last)?.num_samples())
    }

    /// Rank `deal.rank`'s batches `range` (`start..stop`) of the epoch `draw` describes: the
    /// indices, batch after batch, and where each batch starts in them (`stop - start + 1`
    /// offsets).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BatchDraw, BucketPlan, Limits};
    /// use croupier_core::{Deal, Indices};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let plan = BucketPlan::new(&lengths, &[51], limits).unwrap(); // 10 batches of 10
    /// let mut seen = Vec::new();
    /// for rank in 0..2 {
    ///     let deal = Deal { num_replicas: 2, rank, drop_last: false };
    ///     let draw = BatchDraw::default();
    ///     let (flat, offsets) = plan.rank_batches_range(deal, draw, 0..5).unwrap();
    ///     assert_eq!(offsets.len(), 6); // 5 batches
    ///     let Indices::U32(flat) = flat else { unreachable!() };
    ///     seen.extend(flat);
    /// }
    /// seen.sort_unstable();
    /// assert_eq!(seen, (0..100).collect::<Vec<u32>>()); // every sample once
    /// ```
    pub fn rank_batches_range(
        &self,
        deal: Deal,
        draw: BatchDraw,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let layout = deal.layout(self.batches())?;
        let ids = to_ids(rank_range(&layout, deal.rank, draw.batch_order(), range)?);
        self.batches_of(&ids, draw.keys())
    }

    /// An epoch continued on another number of ranks: batch order as `rank_batches_range`
    /// deals it over `elastic`'s original ranks, the rest from its offset dealt to its new
    /// ranks ([`Elastic`]; built over [`BucketPlan::batches`] batches). New rank `rank`'s
    /// batches `range` of that rest, as `rank_batches_range` returns them.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::{BatchDraw, BucketPlan, Limits};
    /// use croupier_core::{Deal, Elastic, Indices};
    ///
    /// # let limits = Limits { batch_size: Some(10), ..Limits::default() };
    /// # let u32s = |(flat, _): (Indices, Vec<u64>)| match flat { Indices::U32(v) => v, _ => unreachable!() };
    /// let lengths: Vec<u32> = (1..=100).collect();
    /// let plan = BucketPlan::new(&lengths, &[51], limits).unwrap();
    /// let draw = BatchDraw::default();
    /// // 2 ranks consumed 2 batches each (global batch positions 0..4), then 3 ranks go on.
    /// let mut seen = Vec::new();
    /// for rank in 0..2 {
    ///     let deal = Deal { num_replicas: 2, rank, drop_last: false };
    ///     seen.extend(u32s(plan.rank_batches_range(deal, draw, 0..2).unwrap()));
    /// }
    /// let el = Elastic::new(plan.batches(), 2, false, 4, 3).unwrap();
    /// for rank in 0..3 {
    ///     seen.extend(u32s(plan.elastic_batches_range(&el, rank, draw, 0..2).unwrap()));
    /// }
    /// seen.sort_unstable();
    /// assert_eq!(seen, (0..100).collect::<Vec<u32>>()); // consumed, then the rest: each once
    /// ```
    pub fn elastic_batches_range(
        &self,
        elastic: &Elastic,
        rank: u64,
        draw: BatchDraw,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let ids = to_ids(elastic.range(rank, draw.batch_order(), range)?);
        self.batches_of(&ids, draw.keys())
    }

    /// The batches `ids`: their indices one after another, and where each starts.
    fn batches_of(
        &self,
        ids: &[u64],
        (seed, epoch, shuffle): (u64, u64, bool),
    ) -> Result<(Indices, Vec<u64>)> {
        Ok(if self.n <= U32_MAX_LEN {
            let (flat, offsets) = self.fill::<u32>(ids, (seed, epoch, shuffle))?;
            (Indices::U32(flat), offsets)
        } else {
            let (flat, offsets) = self.fill::<u64>(ids, (seed, epoch, shuffle))?;
            (Indices::U64(flat), offsets)
        })
    }

    fn batch_len(&self, j: usize, i: u64) -> u64 {
        let n = self.starts[j + 1] - self.starts[j];
        self.sizes[j].min(n - i * self.sizes[j])
    }

    fn fill<T: Index>(&self, ids: &[u64], keys: (u64, u64, bool)) -> Result<(Vec<T>, Vec<u64>)> {
        let located: Vec<(usize, u64, u64)> = ids
            .iter()
            .map(|&b| {
                let (j, i) = self.locate(b);
                let a = i * self.sizes[j];
                (j, a, a + self.batch_len(j, i))
            })
            .collect();
        self.fill_located(&located, keys)
    }

    /// The batches `located` (each a bucket and positions `[a, b)` of its order in the epoch
    /// `keys` names): their indices one after another, and where each starts.
    pub(crate) fn fill_located<T: Index>(
        &self,
        located: &[(usize, u64, u64)],
        keys: (u64, u64, bool),
    ) -> Result<(Vec<T>, Vec<u64>)> {
        let mut offsets = Vec::with_capacity(located.len() + 1);
        let mut total = 0u64;
        offsets.push(0);
        for &(_, a, b) in located {
            total += b - a;
            offsets.push(total);
        }
        let mut flat = try_with_capacity::<T>("a rank's batches", total)?;
        flat.resize(total as usize, T::from_u64(0));
        let mut by_bucket: Vec<Vec<usize>> = vec![Vec::new(); self.sizes.len()];
        for (pos, &(j, _, _)) in located.iter().enumerate() {
            by_bucket[j].push(pos);
        }
        let mut part: Vec<T> = Vec::new();
        for (j, positions) in by_bucket.iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            if cancelled() {
                break; // the caller discards the batches
            }
            let n = self.starts[j + 1] - self.starts[j];
            // A bucket with more than a few wanted batches is computed whole, once; a few
            // batches are read by random access.
            if keys.2 && positions.len() as u64 > RANDOM_ACCESS_BATCHES {
                part.clear();
                self.bucket_range(j, keys, (0, n), &mut part)?;
                if cancelled() {
                    return Err(cancelled_error()); // the order stopped short
                }
                for &pos in positions {
                    let (_, a, b) = located[pos];
                    let dst = &mut flat[offsets[pos] as usize..offsets[pos + 1] as usize];
                    dst.copy_from_slice(&part[a as usize..b as usize]);
                }
                continue;
            }
            for &pos in positions {
                let (_, a, b) = located[pos];
                part.clear();
                let mut p = a;
                while p < b {
                    let q = (p + READ).min(b);
                    self.bucket_range(j, keys, (p, q), &mut part)?;
                    p = q;
                }
                flat[offsets[pos] as usize..offsets[pos + 1] as usize].copy_from_slice(&part);
            }
        }
        Ok((flat, offsets))
    }

    /// Buckets, the oversized one last.
    pub(crate) fn bucket_count(&self) -> usize {
        self.sizes.len()
    }

    /// Members of bucket `j`.
    pub(crate) fn members_of(&self, j: usize) -> u64 {
        self.starts[j + 1] - self.starts[j]
    }

    /// The limits the plan was built with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bucket `j`'s batch size by the fixed rule (1 for the oversized bucket).
    pub(crate) fn fixed_size(&self, j: usize) -> u64 {
        self.sizes[j]
    }

    /// Positions `range` of bucket `j`'s order in the epoch `keys` names, as the members'
    /// offsets in the bucket.
    pub(crate) fn bucket_positions(
        &self,
        j: usize,
        keys: (u64, u64, bool),
        range: Range<u64>,
    ) -> Result<Indices> {
        let n = self.members_of(j);
        if !keys.2 {
            return Ok(if n <= U32_MAX_LEN {
                Indices::U32(range.map(|p| p as u32).collect())
            } else {
                Indices::U64(range.collect())
            });
        }
        let layout = Layout::new(n, 1, false)?;
        let key = Stream::new(keys.0, keys.1, Purpose::BucketShuffle, j as u64).next_u64();
        rank_range(&layout, 0, Draw::keyed(key), range)
    }

    /// Bucket `j`'s members at `positions` of its order, as sample indices.
    pub(crate) fn gather_members(&self, j: usize, positions: &Indices) -> Indices {
        let base = self.starts[j] as usize;
        fn gather<P: Copy + Into<u64>, M: Copy>(at: &[P], members: &[M], base: usize) -> Vec<M> {
            let mut out = Vec::with_capacity(at.len());
            for piece in at.chunks(CHECK_EVERY) {
                if cancelled() {
                    break; // the caller discards the samples
                }
                out.extend(piece.iter().map(|&p| members[base + p.into() as usize]));
            }
            out
        }
        match (positions, &self.members) {
            (Indices::U32(p), Indices::U32(m)) => Indices::U32(gather(p, m, base)),
            (Indices::U64(p), Indices::U32(m)) => Indices::U32(gather(p, m, base)),
            (Indices::U32(p), Indices::U64(m)) => Indices::U64(gather(p, m, base)),
            (Indices::U64(p), Indices::U64(m)) => Indices::U64(gather(p, m, base)),
        }
    }
}

/// Batch ids as `u64`.
fn to_ids(ids: Indices) -> Vec<u64> {
    match ids {
        Indices::U32(v) => v.into_iter().map(u64::from).collect(),
        Indices::U64(v) => v,
    }
}

/// The stable counting sort's scatter: sample `i` to the next slot of its bucket.
fn scatter<T: Index>(ids: &[u32], mut at: Vec<u64>) -> Result<Vec<T>> {
    let mut members = try_with_capacity::<T>("the buckets' members", ids.len() as u64)?;
    members.resize(ids.len(), T::from_u64(0));
    for (c, piece) in ids.chunks(CHECK_EVERY).enumerate() {
        if cancelled() {
            break; // the caller discards the members
        }
        for (i, &j) in piece.iter().enumerate() {
            let j = j as usize;
            members[at[j] as usize] = T::from_u64((c * CHECK_EVERY + i) as u64);
            at[j] += 1;
        }
    }
    Ok(members)
}

/// The global order's buckets with carried tails (see the module documentation): rewrites
/// `members` (bucket after bucket, each in index order; `starts` its `regular + 2` starts, the
/// oversized bucket last) in place and returns the buckets' new starts.
///
/// The counts follow from arithmetic alone. Then, in parallel, each bucket picks the tail it
/// carries (its longest by `(length, index)`, fewer than a batch of its own) and closes up the
/// rest at the front of its range; the carried samples, a few per bucket, are written last
/// into the room the tails left, where the bucket they join now starts.
fn carry_tails<L, T>(
    lengths: &[L],
    members: &mut [T],
    starts: &[u64],
    sizes: &[u64],
) -> Result<Vec<u64>>
where
    L: Copy + Into<u64> + Send + Sync,
    T: Index,
{
    let regular = sizes.len() - 1;
    let own: Vec<u64> = (0..regular).map(|j| starts[j + 1] - starts[j]).collect();
    let Some(last) = own.iter().rposition(|&n| n > 0) else {
        return Ok(starts.to_vec()); // every sample oversized
    };
    // What each bucket keeps, and how many of its own samples it carries on. A tail goes on
    // only when it fits one batch of the next non-empty bucket: more would fill that bucket's
    // batches with short samples (a padded cost far below the budget, and more batches than a
    // short one here).
    let mut next_size = vec![0u64; regular];
    let mut size_after = 0u64;
    for j in (0..regular).rev() {
        next_size[j] = size_after;
        if own[j] > 0 {
            size_after = sizes[j];
        }
    }
    let mut keep = vec![0u64; regular];
    let mut out = vec![0u64; regular];
    let mut carried = 0u64;
    for j in 0..regular {
        let m = own[j] + carried;
        keep[j] = if own[j] == 0 {
            0
        } else if j == last || m % sizes[j] > next_size[j] {
            m
        } else {
            m - m % sizes[j]
        };
        out[j] = own[j].min(m - keep[j]);
        carried = m - keep[j];
    }
    let key = |i: u64| (lengths[i as usize].into(), i);
    // Each bucket's tail, by (length, index), and its other members closed up in index order.
    let mut pieces: Vec<&mut [T]> = Vec::with_capacity(regular);
    let mut rest = &mut members[..starts[regular] as usize];
    for &n in &own {
        let (piece, tail) = rest.split_at_mut(n as usize);
        pieces.push(piece);
        rest = tail;
    }
    let tails: Vec<Vec<(u64, u64)>> = pieces
        .into_par_iter()
        .zip(out.par_iter())
        .map(|(piece, &t)| {
            if t == 0 || cancelled() {
                return Vec::new();
            }
            // The t largest keys: a min-heap of the largest seen so far.
            let mut heap = std::collections::BinaryHeap::with_capacity(t as usize + 1);
            for (k, &m) in piece.iter().enumerate() {
                if k % CHECK_EVERY == 0 && cancelled() {
                    return Vec::new(); // the caller sees the flag and discards the members
                }
                let k = key(m.to_u64());
                if (heap.len() as u64) < t {
                    heap.push(std::cmp::Reverse(k));
                } else if k > heap.peek().expect("t >= 1 keys").0 {
                    heap.pop();
                    heap.push(std::cmp::Reverse(k));
                }
            }
            let least = heap.peek().expect("t >= 1 keys").0;
            let mut at = 0usize;
            for i in 0..piece.len() {
                let m = piece[i];
                if key(m.to_u64()) < least {
                    piece[at] = m;
                    at += 1;
                }
            }
            let mut tail: Vec<(u64, u64)> = heap.into_iter().map(|r| r.0).collect();
            tail.sort_unstable();
            tail
        })
        .collect();
    if cancelled() {
        return Err(cancelled_error());
    }
    // The carried samples, bucket by bucket: bucket j takes the shortest of those carried to
    // it, up to what it keeps, at the front of its new range.
    let mut new_starts = Vec::with_capacity(regular + 2);
    let mut at = 0u64;
    let mut carry: Vec<(u64, u64)> = Vec::new();
    for j in 0..regular {
        new_starts.push(at);
        let taken = (carry.len() as u64).min(keep[j]) as usize;
        for (k, &(_, i)) in carry[..taken].iter().enumerate() {
            members[at as usize + k] = T::from_u64(i);
        }
        at += keep[j];
        carry.drain(..taken);
        carry.extend_from_slice(&tails[j]);
    }
    debug_assert!(carry.is_empty() && at == starts[regular]);
    new_starts.extend_from_slice(&starts[regular..]);
    Ok(new_starts)
}

/// Refuses what [`BucketPlan::new`] cannot build: no lengths, boundaries not increasing, no
/// size limit, `quadratic` without `max_tokens`, a zero limit.
fn check_arguments(n: usize, boundaries: &[u64], limits: &Limits) -> Result<()> {
    if n == 0 {
        return Err(Error::out_of_range(
            "lengths",
            "a non-empty array",
            "an empty one",
        ));
    }
    if boundaries.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::out_of_range(
            "buckets",
            "strictly increasing boundaries",
            format!("{boundaries:?}"),
        ));
    }
    if limits.batch_size.is_none() && limits.max_tokens.is_none() {
        return Err(Error::out_of_range(
            "batch_size, max_tokens",
            "at least one of them given",
            "neither",
        ));
    }
    if limits.quadratic.is_some() && limits.max_tokens.is_none() {
        return Err(Error::out_of_range(
            "quadratic",
            "with max_tokens",
            "without",
        ));
    }
    if limits.batch_size == Some(0)
        || limits.max_tokens == Some(0)
        || limits.multiple == 0
        || limits.quadratic == Some(0)
    {
        return Err(Error::out_of_range(
            "batch_size, max_tokens, batch_size_multiple, quadratic",
            ">= 1",
            0,
        ));
    }
    Ok(())
}

/// Every sample's bucket (the last, `boundaries.len() + 1`, holds the oversized ones), in
/// parallel: a table for lengths below 2**24 (one load a sample), a binary search over the
/// boundaries above.
fn bucket_ids<L: Copy + Into<u64> + Send + Sync>(
    lengths: &[L],
    boundaries: &[u64],
    limits: &Limits,
) -> Result<Vec<u32>> {
    let regular = boundaries.len() + 1;
    let bucket_of = |len: u64| -> u32 {
        match limits.fitting(len) {
            Some(0) => regular as u32,
            _ => boundaries.partition_point(|&b| b <= len) as u32,
        }
    };
    let max = par_max(lengths);
    if max >= TABLE_MAX {
        return Ok(par_map(lengths, CHECK_EVERY, |l| bucket_of(l.into())));
    }
    let mut table: Vec<u32> = Vec::with_capacity(max as usize + 1);
    let mut v = 0u64;
    while v <= max && !cancelled() {
        let hi = max.min(v + CHECK_EVERY as u64);
        table.extend((v..=hi).map(bucket_of));
        v = hi + 1;
    }
    if cancelled() {
        return Err(cancelled_error()); // the caller discards it
    }
    Ok(par_map(lengths, CHECK_EVERY, |l| table[l.into() as usize]))
}

/// Per bucket (`regular` of them, then the oversized one): its members and its longest.
fn counts_and_longest<L: Copy + Into<u64> + Send + Sync>(
    ids: &[u32],
    lengths: &[L],
    regular: usize,
) -> (Vec<u64>, Vec<u64>) {
    ids.par_chunks(1 << 16)
        .zip(lengths.par_chunks(1 << 16))
        .fold(
            || (vec![0u64; regular + 1], vec![0u64; regular + 1]),
            |(mut c, mut m), (ids, lens)| {
                if cancelled() {
                    return (c, m); // the caller discards the counts
                }
                for (&j, &len) in ids.iter().zip(lens) {
                    c[j as usize] += 1;
                    m[j as usize] = m[j as usize].max(len.into());
                }
                (c, m)
            },
        )
        .reduce(
            || (vec![0u64; regular + 1], vec![0u64; regular + 1]),
            |(mut c, mut m), (c2, m2)| {
                c.iter_mut().zip(&c2).for_each(|(a, b)| *a += b);
                m.iter_mut().zip(&m2).for_each(|(a, b)| *a = (*a).max(*b));
                (c, m)
            },
        )
}

/// The refusal of `oversized` samples costing more than `max_tokens` (`oversized='error'`),
/// naming the first.
fn oversized_error<L: Copy + Into<u64>>(lengths: &[L], limits: &Limits, oversized: u64) -> Error {
    let first = lengths
        .iter()
        .position(|&l| limits.fitting(l.into()) == Some(0))
        .unwrap_or(0);
    Error::out_of_range(
        "lengths",
        format!(
            "costing at most max_tokens = {} with oversized='error'",
            limits.max_tokens.unwrap_or(0)
        ),
        format!(
            "{oversized} longer samples, the first at index {first} ({})",
            lengths[first].into()
        ),
    )
}

/// Where each of `items` starts when they are laid end to end (`size` of each), then the end.
fn running_starts<T>(items: &[T], size: impl Fn(&T) -> u64) -> Vec<u64> {
    let mut starts = Vec::with_capacity(items.len() + 1);
    let mut acc = 0u64;
    for item in items {
        starts.push(acc);
        acc += size(item);
    }
    starts.push(acc);
    starts
}

/// Each bucket's batch size: at most `batch_size`, at most what fits `max_tokens` at its
/// longest sample, rounded down to a `multiple` (when one fits), at least 1; the oversized
/// bucket (the last) serves samples alone.
fn batch_sizes(limits: &Limits, longest: &[u64]) -> Vec<u64> {
    let regular = longest.len() - 1;
    longest
        .iter()
        .enumerate()
        .map(|(j, &long)| {
            if j == regular {
                return 1;
            }
            let mut s = limits.batch_size.unwrap_or(u64::MAX);
            if let Some(fit) = limits.fitting(long) {
                s = s.min(fit);
            }
            if s >= limits.multiple {
                s -= s % limits.multiple;
            }
            s.max(1)
        })
        .collect()
}

/// A fingerprint of the lengths, for checkpoints: chunk hashes folded in order.
fn digest<L: Copy + Into<u64> + Send + Sync>(lengths: &[L]) -> u64 {
    lengths
        .par_chunks(1 << 16)
        .map(|c| {
            if cancelled() {
                return 0; // the caller discards the digest
            }
            c.iter()
                .fold(0x6c65_6e67_7468_7300u64, |h, &x| fold(h, x.into()))
        })
        .collect::<Vec<u64>>()
        .into_iter()
        .fold(lengths.len() as u64, fold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn limits(batch_size: Option<u64>, max_tokens: Option<u64>) -> Limits {
        Limits {
            batch_size,
            max_tokens,
            ..Limits::default()
        }
    }

    fn all(plan: &BucketPlan, w: u64, r: u64, drop_last: bool, seed: u64) -> Vec<Vec<u64>> {
        let nb = plan.rank_batches(w, drop_last).unwrap();
        let deal = Deal {
            num_replicas: w,
            rank: r,
            drop_last,
        };
        let draw = BatchDraw {
            seed,
            epoch: 1,
            ..BatchDraw::default()
        };
        let (flat, offsets) = plan.rank_batches_range(deal, draw, 0..nb).unwrap();
        let flat = flat.to_u64_vec();
        offsets
            .windows(2)
            .map(|o| flat[o[0] as usize..o[1] as usize].to_vec())
            .collect()
    }

    #[test]
    fn every_sample_once_within_budget_and_bucket() {
        let lengths: Vec<u64> = (0..5000u64).map(|i| 1 + (i * 7919) % 300).collect();
        let bounds = [50u64, 100, 200];
        let plan = BucketPlan::new(&lengths, &bounds, limits(Some(64), Some(4096))).unwrap();
        let w = 3;
        let mut seen: HashMap<u64, u32> = HashMap::new();
        let mut counts = Vec::new();
        for r in 0..w {
            let batches = all(&plan, w, r, true, 5);
            counts.push(batches.len());
            for b in &batches {
                let lens: Vec<u64> = b.iter().map(|&i| lengths[i as usize]).collect();
                let max = *lens.iter().max().unwrap();
                assert!(b.len() as u64 * max <= 4096 && b.len() <= 64);
                let bucket = |l: u64| bounds.partition_point(|&x| x <= l);
                assert!(
                    lens.iter().all(|&l| bucket(l) == bucket(max)),
                    "one bucket per batch"
                );
                for &i in b {
                    *seen.entry(i).or_default() += 1;
                }
            }
        }
        assert!(counts.iter().all(|&c| c == counts[0]));
        assert!(seen.values().all(|&c| c == 1));
        // drop_last cut at most W - 1 batches
        let dropped = 5000 - seen.len();
        assert!(dropped <= 2 * 64);
    }

    /// With `full_batches`, every batch holds exactly its bucket's size; per bucket, the
    /// samples left out are fewer than a batch and vary with the epoch's shuffle; the ranks'
    /// counts are equal.
    #[test]
    fn full_batches_only_leave_out_each_buckets_short_tail() {
        let lengths: Vec<u64> = (0..3001u64).map(|i| 1 + (i * 7919) % 300).collect();
        let bounds = [50u64, 100, 200];
        let bucket = |l: u64| bounds.partition_point(|&x| x <= l);
        let mut sizes = [0u64; 4];
        lengths.iter().for_each(|&l| sizes[bucket(l)] += 1);
        let full = Limits {
            full_batches: true,
            ..limits(Some(16), None)
        };
        let plan = BucketPlan::new(&lengths, &bounds, full).unwrap();
        assert_eq!(plan.batches(), sizes.iter().map(|n| n / 16).sum::<u64>());
        let mut left_out = Vec::new();
        for epoch_seed in [5, 6] {
            let mut seen = vec![0u32; lengths.len()];
            for r in 0..3 {
                let batches = all(&plan, 3, r, true, epoch_seed);
                assert_eq!(batches.len() as u64, plan.batches() / 3);
                for b in &batches {
                    assert_eq!(b.len(), 16);
                    assert!(b
                        .iter()
                        .all(|&i| bucket(lengths[i as usize]) == bucket(lengths[b[0] as usize])));
                    b.iter().for_each(|&i| seen[i as usize] += 1);
                }
            }
            assert!(seen.iter().all(|&c| c <= 1));
            // Per bucket: the short tail, and (drop_last) the batches cut to a multiple of W.
            let missing: Vec<usize> = (0..lengths.len()).filter(|&i| seen[i] == 0).collect();
            let cut = (plan.batches() % 3) as usize * 16;
            let tails: u64 = sizes.iter().map(|n| n % 16).sum();
            assert_eq!(missing.len(), tails as usize + cut);
            left_out.push(missing);
        }
        assert_ne!(left_out[0], left_out[1], "the tails differ between epochs");
        // Without it, the same plan has each bucket's short batch.
        let plan = BucketPlan::new(&lengths, &bounds, limits(Some(16), None)).unwrap();
        assert_eq!(
            plan.batches(),
            sizes.iter().map(|n| n.div_ceil(16)).sum::<u64>()
        );
    }

    #[test]
    fn ranges_agree_with_the_whole_and_random_access() {
        let lengths: Vec<u64> = (0..20_000u64).map(|i| 1 + (i * 104_729) % 1000).collect();
        let plan = BucketPlan::new(
            &lengths,
            &quantile_bounds(&lengths),
            limits(None, Some(20_000)),
        )
        .unwrap();
        let whole = all(&plan, 2, 1, false, 3);
        for (a, b) in [
            (0u64, 1u64),
            (3, 7),
            (10, 40),
            (whole.len() as u64 - 1, whole.len() as u64),
        ] {
            let deal = Deal {
                num_replicas: 2,
                rank: 1,
                drop_last: false,
            };
            let draw = BatchDraw {
                seed: 3,
                epoch: 1,
                ..BatchDraw::default()
            };
            let (flat, offsets) = plan.rank_batches_range(deal, draw, a..b).unwrap();
            let flat = flat.to_u64_vec();
            let got: Vec<Vec<u64>> = offsets
                .windows(2)
                .map(|o| flat[o[0] as usize..o[1] as usize].to_vec())
                .collect();
            assert_eq!(
                got,
                whole[a as usize..b as usize].to_vec(),
                "batches {a}..{b}"
            );
        }
    }

    fn quantile_bounds(lengths: &[u64]) -> Vec<u64> {
        crate::bucket::quantiles::quantile_boundaries(lengths, 8)
    }

    #[test]
    fn oversized_samples_alone_or_refused() {
        let lengths = [10u64, 20, 5000, 30];
        let plan = BucketPlan::new(&lengths, &[], limits(None, Some(100))).unwrap();
        let b = all(&plan, 1, 0, false, 0);
        assert!(b.contains(&vec![2]));
        let strict = Limits {
            oversized_alone: false,
            full_batches: false,
            ..limits(None, Some(100))
        };
        let err = BucketPlan::new(&lengths, &[], strict)
            .unwrap_err()
            .to_string();
        assert!(err.contains("index 2"), "{err}");
    }

    /// The carried tails against a model written from the module documentation: in the
    /// order of `(length, index)`, each bucket keeps a whole number of its batches of what it
    /// holds and carries the rest on when it fits a batch of the next non-empty bucket (else
    /// keeps it as a short batch; the last non-empty bucket keeps all, an empty one nothing),
    /// and lists the samples carried to it (in that order) before its own (in index order).
    /// Sizes, batch counts and the oversized bucket are as without carrying.
    #[test]
    fn carried_tails_keep_whole_batches_in_length_order() {
        let mut rng = crate::testkit::Lcg::new(11);
        for case in 0..60 {
            let n = 1 + rng.below(3000);
            let spread = 2 + rng.below(600);
            let lengths: Vec<u64> = (0..n).map(|_| 1 + rng.below(spread)).collect();
            let mut bounds: Vec<u64> = (0..rng.below(6)).map(|_| 1 + rng.below(spread)).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let limits = Limits {
                batch_size: [None, Some(1 + rng.below(40))][case % 2],
                max_tokens: [Some(200 + rng.below(4000)), None][(case / 2) % 3 / 2],
                multiple: 1 + rng.below(3) * (case as u64 % 2),
                full_batches: case % 5 == 0,
                carry: true,
                ..Limits::default()
            };
            let limits = if limits.batch_size.is_none() && limits.max_tokens.is_none() {
                Limits {
                    batch_size: Some(7),
                    ..limits
                }
            } else {
                limits
            };
            let plan = BucketPlan::new(&lengths, &bounds, limits).unwrap();
            let plain = BucketPlan::new(
                &lengths,
                &bounds,
                Limits {
                    carry: false,
                    ..limits
                },
            )
            .unwrap();
            let regular = bounds.len() + 1;
            let fits = |l: u64| limits.fits(l);
            let own_bucket = |l: u64| bounds.partition_point(|&b| b <= l);
            let sizes: Vec<u64> = plain.buckets().iter().map(|b| b.1).collect();
            let mut sorted: Vec<u64> = (0..n).filter(|&i| fits(lengths[i as usize])).collect();
            sorted.sort_by_key(|&i| (lengths[i as usize], i));
            let own: Vec<u64> = (0..regular)
                .map(|j| {
                    sorted
                        .iter()
                        .filter(|&&i| own_bucket(lengths[i as usize]) == j)
                        .count() as u64
                })
                .collect();
            let last = own.iter().rposition(|&c| c > 0);
            let next_size = |j: usize| (j + 1..regular).find(|&k| own[k] > 0).map(|k| sizes[k]);
            let (mut at, mut carried) = (0usize, 0u64);
            let got = plan.buckets();
            let mut shorts = 0;
            for j in 0..regular {
                let m = own[j] + carried;
                let keep = if own[j] == 0 {
                    0
                } else if Some(j) == last || Some(m % sizes[j]) > next_size(j) {
                    shorts += u32::from(!m.is_multiple_of(sizes[j]));
                    m
                } else {
                    m - m % sizes[j]
                };
                carried = m - keep;
                let region = &sorted[at..at + keep as usize];
                at += keep as usize;
                // Carried first, in (length, index) order; then its own, in index order.
                let mut want: Vec<u64> = region
                    .iter()
                    .copied()
                    .filter(|&i| own_bucket(lengths[i as usize]) < j)
                    .collect();
                let mut mine: Vec<u64> = region
                    .iter()
                    .copied()
                    .filter(|&i| own_bucket(lengths[i as usize]) == j)
                    .collect();
                mine.sort_unstable();
                want.extend(mine);
                let positions = plan.bucket_positions(j, (0, 0, false), 0..keep).unwrap();
                let members = plan.gather_members(j, &positions).to_u64_vec();
                assert_eq!(members, want, "case {case}, bucket {j}");
                assert_eq!(got[j].0, keep);
                assert_eq!(got[j].1, sizes[j]);
                let batches = if limits.full_batches {
                    keep / sizes[j]
                } else {
                    keep.div_ceil(sizes[j])
                };
                assert_eq!(got[j].2, batches, "case {case}, bucket {j}");
            }
            // Every bucket's batches are full, but where a tail stayed as a short batch.
            let short_batches = (0..regular)
                .filter(|&j| !got[j].0.is_multiple_of(got[j].1))
                .count();
            assert_eq!(short_batches, shorts as usize, "case {case}");
            assert_eq!(at, sorted.len());
            assert_eq!(got[regular], plain.buckets()[regular]); // the oversized, unchanged
        }
    }

    #[test]
    fn multiples_round_batch_sizes_down() {
        let lengths = vec![10u64; 1000];
        let l = Limits {
            batch_size: None,
            max_tokens: Some(1000),
            multiple: 8,
            ..Limits::default()
        };
        let plan = BucketPlan::new(&lengths, &[], l).unwrap();
        assert_eq!(plan.buckets()[0].1, 96); // 100 rounded down to a multiple of 8
    }

    #[test]
    fn an_elastic_rest_deals_the_old_batch_order_from_its_offset() {
        let lengths: Vec<u64> = (0..7001u64).map(|i| 1 + (i * 7919) % 300).collect();
        let bounds = [50u64, 100, 200];
        let plan = BucketPlan::new(&lengths, &bounds, limits(Some(16), Some(2048))).unwrap();
        for (w0, w) in [(4u64, 3u64), (3, 5), (1, 2), (6, 1)] {
            for drop_last in [false, true] {
                let olds: Vec<Vec<Vec<u64>>> =
                    (0..w0).map(|r| all(&plan, w0, r, drop_last, 5)).collect();
                let layout = Layout::new(plan.batches(), w0, drop_last).unwrap();
                let end = plan.batches().min(layout.total_size());
                for offset in [0, 1, end / 2, end - 1, end] {
                    let el = Elastic::new(plan.batches(), w0, drop_last, offset, w).unwrap();
                    let ns = el.num_samples();
                    let mut got_all: Vec<Vec<u64>> = Vec::new();
                    for r in 0..w {
                        let draw = BatchDraw {
                            seed: 5,
                            epoch: 1,
                            ..BatchDraw::default()
                        };
                        let (flat, offs) = plan.elastic_batches_range(&el, r, draw, 0..ns).unwrap();
                        let flat = flat.to_u64_vec();
                        let got: Vec<Vec<u64>> = offs
                            .windows(2)
                            .map(|o| flat[o[0] as usize..o[1] as usize].to_vec())
                            .collect();
                        let rest = end - offset;
                        let want: Vec<Vec<u64>> = (0..ns)
                            .map(|k| {
                                let h = r + k * w;
                                let g = offset + if h < rest { h } else { h % rest };
                                olds[(g % w0) as usize][(g / w0) as usize].clone()
                            })
                            .collect();
                        assert_eq!(got, want, "{w0}->{w} offset {offset} rank {r}");
                        got_all.extend(got);
                    }
                    // Equal batch counts, and every batch not consumed comes once (padding
                    // repeats fewer than W of them).
                    assert_eq!(got_all.len() as u64, w * ns);
                    let distinct: std::collections::HashSet<&Vec<u64>> = got_all.iter().collect();
                    let dropped = if drop_last { (end - offset) % w } else { 0 };
                    assert_eq!(distinct.len() as u64 + dropped, end - offset);
                }
            }
        }
    }
}

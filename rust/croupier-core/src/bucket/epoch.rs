//! One epoch's batch plan for every world size (`BucketBatchSampler(order="global")`).
//!
//! # The plan
//!
//! - **Batches.** The plan's buckets have carried tails ([`Limits::carry`](super::Limits)):
//!   every batch of a bucket holds the bucket's batch size but a bucket's last one where the
//!   bucket kept its tail (the last non-empty bucket, or one whose tail fits no batch of the
//!   next). Bucket `j`'s members are shuffled as in the per-rank order (that
//!   order's permutation of one rank under `Stream(seed, epoch, BucketShuffle, j)`) and cut
//!   into its batches. Nothing here depends on the number of ranks, and every epoch has the
//!   same batches per bucket.
//! - **Runs.** The epoch's batches form one global sequence of units of `sync` (`C`, a power
//!   of two) consecutive batches, so that the `W` batches of a global step (positions
//!   `[kW, (k+1)W)`, one per rank) come from one unit whenever `W` divides `C`. A unit is
//!   either a run of `C` batches of one bucket (each bucket has `⌊b_j / C⌋` of them) or `C`
//!   consecutive batches of the *remainder stream*: every bucket's last `b_j mod C` batches,
//!   bucket after bucket, shortest first, so a step there mixes buckets next to each other.
//!   Inside such a chunk the batches come in the order of a keyed tree flip (`flipped`:
//!   every aligned block of every size stays together, in a random order), so that a small
//!   epoch, all of it in the remainder stream, is not laid out by length. The units come in a
//!   keyed random order (`Stream(seed, epoch, BucketRuns, 0)`; the flips class 1). The
//!   stream's `R mod C` batches left over (its *tail*) are a keyed slot of the stream between
//!   two chunks, not always its longest batches, and end the epoch as aligned blocks of the
//!   binary digits of `R mod C`, largest first, each holding a keyed piece of the slot and
//!   flipped. Batches are full but for the few buckets that keep their tail, so
//!   the padded cost of the ranks' batches at a step differs little.
//! - **Deal.** Rank `r` takes global positions `r, r + W, …` with torch's padding (the first
//!   batches again) or dropping (the last `B % W`), like `DistributedSampler`; an elastic
//!   resume deals the rest of the same sequence ([`Elastic`]).
//!
//! Without shuffling the batch order (`shuffle_batches = false`, or `shuffle = false`), the
//! sequence is the buckets' batches bucket after bucket, shortest first.
//!
//! The units follow from the buckets' batch counts, fixed at construction, so any batch is
//! found without cutting any bucket: reading a few batches cuts only their buckets
//! ([`EpochBatches::lazy`], a resume's first batches), a whole epoch cuts every bucket once
//! ([`EpochBatches::new`] keeps every bucket's order up to [`KEEP_ORDERS`] samples).

use super::plan::BucketPlan;
use crate::cancel::{cancelled, cancelled_error, CHECK_EVERY};
use crate::deal::elastic::Elastic;
use crate::deal::layout::{Deal, Layout};
use crate::deal::rank::{rank_range, Draw};
use crate::draw::random_access::RandomAccessPermutation;
use crate::error::{Error, Result};
use crate::index::{try_with_capacity, Index, Indices, U32_MAX_LEN};
use crate::stream::{fold, Purpose, Stream};
use rayon::prelude::*;
use std::ops::Range;

/// Samples up to which [`EpochBatches::new`] keeps every bucket's order (4 bytes each).
pub const KEEP_ORDERS: u64 = 1 << 26;

/// How an epoch's global batch plan is drawn.
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::EpochDraw;
///
/// let draw = EpochDraw { epoch: 3, ..EpochDraw::default() };
/// assert_eq!((draw.sync, draw.shuffle), (64, true));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochDraw {
    /// The seed of the shuffles.
    pub seed: u64,
    /// The epoch: each epoch of a seed has its own shuffles.
    pub epoch: u64,
    /// Shuffle the samples within each bucket; without, nothing is shuffled.
    pub shuffle: bool,
    /// Shuffle the order of the units too (with `shuffle` only); without, bucket after bucket.
    pub shuffle_batches: bool,
    /// Consecutive batches per unit (a power of two; 1: every batch on its own).
    pub sync: u64,
}

impl Default for EpochDraw {
    fn default() -> Self {
        EpochDraw {
            seed: 0,
            epoch: 0,
            shuffle: true,
            shuffle_batches: true,
            sync: 64,
        }
    }
}

impl EpochDraw {
    /// Checks a run length: `sync` a power of two, at least 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::bucket::EpochDraw;
    ///
    /// assert!(EpochDraw::check_sync(64).is_ok());
    /// assert!(EpochDraw::check_sync(48).is_err());
    /// ```
    pub fn check_sync(sync: u64) -> Result<()> {
        if sync == 0 || !sync.is_power_of_two() {
            return Err(Error::out_of_range("sync", "a power of two >= 1", sync));
        }
        Ok(())
    }

    fn keys(&self) -> (u64, u64, bool) {
        (self.seed, self.epoch, self.shuffle)
    }
}

/// Consecutive global positions of the sequence.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// Batches `first, first + 1, …` of one bucket.
    Run { start: u64, bucket: u32, first: u64 },
    /// `2**bits` consecutive batches of the remainder stream from its position `from`, in the
    /// order of a keyed tree flip ([`flipped`]).
    Chunk {
        start: u64,
        from: u64,
        bits: u32,
        key: u64,
    },
}

impl Unit {
    fn start(&self) -> u64 {
        match *self {
            Unit::Run { start, .. } | Unit::Chunk { start, .. } => start,
        }
    }
}

/// A bucket's epoch: its order as samples, and where each batch starts in it (then its end).
#[derive(Debug, Clone)]
struct Cut {
    samples: Indices,
    cuts: Vec<u64>,
}

/// One epoch's global batch plan: its runs, and every bucket's batches when kept (see the
/// module documentation).
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::{BucketPlan, EpochBatches, EpochDraw, Limits};
/// use croupier_core::{Deal, Indices};
///
/// let lengths: Vec<u32> = (0..5000).map(|i| 10 + (i * 7919) % 500).collect();
/// let limits = Limits { max_tokens: Some(4096), carry: true, ..Limits::default() };
/// let plan = BucketPlan::new(&lengths, &[100, 200, 300], limits).unwrap();
/// let epoch = EpochBatches::new(&plan, EpochDraw { sync: 4, ..EpochDraw::default() }).unwrap();
/// # let u32s = |i: Indices| match i { Indices::U32(v) => v, _ => unreachable!() };
/// // The same global sequence whatever the world: rank 1 of 2 takes positions 1, 3, 5, ...
/// let one = Deal { num_replicas: 1, rank: 0, drop_last: false };
/// let (alone, offsets) = epoch.range(&plan, one, 0..4).unwrap();
/// let second = Deal { num_replicas: 2, rank: 1, drop_last: false };
/// let (two, _) = epoch.range(&plan, second, 0..2).unwrap();
/// let (alone, two) = (u32s(alone), u32s(two));
/// let global_1 = &alone[offsets[1] as usize..offsets[2] as usize];
/// assert_eq!(&two[..global_1.len()], global_1);
/// // Every epoch has the same number of batches.
/// assert_eq!(epoch.batches(), plan.batches());
/// ```
#[derive(Debug, Clone)]
pub struct EpochBatches {
    runs: Runs,
    draw: EpochDraw,
    /// Every bucket's epoch, when kept.
    kept: Option<Vec<Cut>>,
}

impl EpochBatches {
    /// The plan of the epoch `draw` names over `plan`'s buckets; up to [`KEEP_ORDERS`]
    /// samples, every bucket is cut now (in parallel) and kept, so that reading batches
    /// copies them out.
    pub fn new(plan: &BucketPlan, draw: EpochDraw) -> Result<Self> {
        let mut epoch = Self::lazy(plan, draw)?;
        if plan.len() <= KEEP_ORDERS {
            let all: Vec<usize> = (0..plan.bucket_count()).collect();
            epoch.kept = Some(cut_buckets(plan, draw, &all)?);
        }
        Ok(epoch)
    }

    /// Bytes [`EpochBatches::new`] holds at its peak (an estimate, to refuse what cannot fit
    /// before any work): up to [`KEEP_ORDERS`] samples every bucket's kept order and cuts,
    /// and the buckets being cut at once (one per thread, as [`BucketPlan::range_bytes`]
    /// counts them); above, only the units of `sync` batches (one per `sync` batches, plus a
    /// few per bucket and the tail's blocks).
    pub fn new_bytes(plan: &BucketPlan, sync: u64) -> u64 {
        let units = (plan.batches() / sync.max(1))
            .saturating_add(2 * plan.bucket_count() as u64)
            .saturating_add(64);
        let runs = units
            .saturating_mul(std::mem::size_of::<Unit>() as u64)
            .saturating_add((plan.bucket_count() as u64).saturating_mul(24));
        if plan.len() > KEEP_ORDERS {
            return runs;
        }
        let width = if plan.len() <= crate::index::U32_MAX_LEN {
            4
        } else {
            8
        };
        let kept = plan
            .len()
            .saturating_mul(width)
            .saturating_add(plan.batches().saturating_add(plan.bucket_count() as u64) * 8);
        // A sixteenth more as headroom: at 30e6 lengths and 1024 buckets the measured peak
        // (with the rank's batches) came within 11 KB of the estimate without it, over on one
        // run (tests/test_memory_estimates.py, "buckets, many buckets"); what the estimate
        // misses there is not pinned down yet.
        let kept = kept.saturating_add(kept / 16);
        let at_once = rayon::current_num_threads() as u64;
        runs.saturating_add(kept)
            .saturating_add(plan.cut_scratch_bytes(at_once))
    }

    /// The plan of the epoch without cutting any bucket: each read cuts the buckets its
    /// batches come from (a few batches read one or two buckets).
    pub fn lazy(plan: &BucketPlan, draw: EpochDraw) -> Result<Self> {
        EpochDraw::check_sync(draw.sync)?;
        let counts = plan.bucket_batches();
        let runs = Runs::new(&counts, draw);
        if cancelled() {
            return Err(cancelled_error());
        }
        Ok(EpochBatches {
            runs,
            draw,
            kept: None,
        })
    }

    /// Batches in the epoch over all ranks, before padding or cutting.
    pub fn batches(&self) -> u64 {
        self.runs.total
    }

    /// Batches per rank with `w` ranks.
    pub fn rank_batches(&self, w: u64, drop_last: bool) -> Result<u64> {
        Ok(Layout::new(self.runs.total, w, drop_last)?.num_samples())
    }

    /// Global position `p`'s batch: its bucket and its index among the bucket's batches.
    ///
    /// # Panics
    ///
    /// If `p >= self.batches()`.
    pub fn locate(&self, p: u64) -> (usize, u64) {
        self.runs.locate(p)
    }

    /// Rank `deal.rank`'s batches `range` of the epoch: the indices, batch after batch, and
    /// where each batch starts in them (`range.len() + 1` offsets).
    pub fn range(
        &self,
        plan: &BucketPlan,
        deal: Deal,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let layout = deal.layout(self.runs.total)?;
        let positions = rank_range(&layout, deal.rank, in_order(), range)?;
        self.batches_at(plan, &positions.to_u64_vec())
    }

    /// New rank `rank`'s batches `range` of the rest of the epoch `elastic` describes (built
    /// over [`EpochBatches::batches`]), as [`EpochBatches::range`] returns them.
    pub fn elastic_range(
        &self,
        plan: &BucketPlan,
        elastic: &Elastic,
        rank: u64,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let positions = elastic.range(rank, in_order(), range)?;
        self.batches_at(plan, &positions.to_u64_vec())
    }

    fn batches_at(&self, plan: &BucketPlan, positions: &[u64]) -> Result<(Indices, Vec<u64>)> {
        let located: Vec<(usize, u64)> = positions.iter().map(|&p| self.runs.locate(p)).collect();
        Ok(if plan.len() <= U32_MAX_LEN {
            let (flat, offsets) = self.assemble::<u32>(plan, &located)?;
            (Indices::U32(flat), offsets)
        } else {
            let (flat, offsets) = self.assemble::<u64>(plan, &located)?;
            (Indices::U64(flat), offsets)
        })
    }

    /// The batches `located` (bucket, batch) one after another, and where each starts: copied
    /// from the kept buckets, or each needed bucket cut (in parallel) and its batches taken
    /// out at once, so that only this rank's batches outlive the call.
    fn assemble<T: Index>(
        &self,
        plan: &BucketPlan,
        located: &[(usize, u64)],
    ) -> Result<(Vec<T>, Vec<u64>)> {
        let mut by_bucket: Vec<Vec<usize>> = vec![Vec::new(); plan.bucket_count()];
        for (k, &(j, _)) in located.iter().enumerate() {
            by_bucket[j].push(k);
        }
        let take = |cut: &Cut, wanted: &[usize]| -> (Vec<T>, Vec<u64>) {
            let mut out = Vec::new();
            let mut sizes = Vec::with_capacity(wanted.len());
            for &k in wanted {
                let i = located[k].1 as usize;
                let (a, b) = (cut.cuts[i] as usize, cut.cuts[i + 1] as usize);
                match &cut.samples {
                    Indices::U32(v) => out.extend(v[a..b].iter().map(|&x| T::from_u64(x.into()))),
                    Indices::U64(v) => out.extend(v[a..b].iter().map(|&x| T::from_u64(x))),
                }
                sizes.push((b - a) as u64);
            }
            (out, sizes)
        };
        let pieces: Vec<(usize, Vec<T>, Vec<u64>)> = by_bucket
            .par_iter()
            .enumerate()
            .filter(|(_, wanted)| !wanted.is_empty())
            .map(|(j, wanted)| {
                let (out, sizes) = match &self.kept {
                    Some(kept) => take(&kept[j], wanted),
                    None => take(&cut_bucket(plan, j, self.draw)?, wanted),
                };
                Ok((j, out, sizes))
            })
            .collect::<Result<_>>()?;
        if cancelled() {
            return Err(cancelled_error());
        }
        let mut size = vec![0u64; located.len()];
        for (j, _, sizes) in &pieces {
            for (&k, &s) in by_bucket[*j].iter().zip(sizes) {
                size[k] = s;
            }
        }
        let mut offsets = Vec::with_capacity(located.len() + 1);
        offsets.push(0u64);
        let mut total = 0u64;
        for s in &size {
            total += s;
            offsets.push(total);
        }
        let mut flat = try_with_capacity::<T>("a rank's batches", total)?;
        flat.resize(total as usize, T::from_u64(0));
        for (j, out, _) in &pieces {
            let mut at = 0usize;
            for &k in &by_bucket[*j] {
                let (a, b) = (offsets[k] as usize, offsets[k + 1] as usize);
                flat[a..b].copy_from_slice(&out[at..at + (b - a)]);
                at += b - a;
            }
        }
        Ok((flat, offsets))
    }
}

/// The global positions in order (the identity draw).
fn in_order() -> Draw {
    Draw {
        shuffle: false,
        ..Draw::default()
    }
}

/// The epochs of `buckets`, cut in parallel.
fn cut_buckets(plan: &BucketPlan, draw: EpochDraw, buckets: &[usize]) -> Result<Vec<Cut>> {
    buckets
        .par_iter()
        .map(|&j| cut_bucket(plan, j, draw))
        .collect()
}

/// Bucket `j`'s epoch: its order, cut into its batches.
fn cut_bucket(plan: &BucketPlan, j: usize, draw: EpochDraw) -> Result<Cut> {
    let n = plan.members_of(j);
    // Each stage looks at the flag first: a stage stopped early leaves its output meaningless.
    let stage = || {
        if cancelled() {
            Err(cancelled_error())
        } else {
            Ok(())
        }
    };
    stage()?;
    let positions = plan.bucket_positions(j, draw.keys(), 0..n)?;
    stage()?;
    let size = plan.fixed_size(j);
    let cuts = (0..=plan.target(j)).map(|i| (i * size).min(n)).collect();
    let samples = plan.gather_members(j, &positions);
    stage()?;
    Ok(Cut { samples, cuts })
}

/// The units of an epoch's global sequence, its length, and where each bucket's batches sit
/// in the remainder stream.
#[derive(Debug, Clone)]
struct Runs {
    units: Vec<Unit>,
    total: u64,
    /// Per bucket, the end of its batches in the remainder stream.
    rest_ends: Vec<u64>,
    /// Per bucket, its first batch in the remainder stream (past its whole runs).
    rest_first: Vec<u64>,
    /// Per bucket, its batches in the remainder stream.
    rest_len: Vec<u64>,
}

impl Runs {
    /// The units of the epoch `draw` names whose buckets have `counts` batches.
    fn new(counts: &[u64], draw: EpochDraw) -> Self {
        let total = counts.iter().sum();
        if draw.shuffle && draw.shuffle_batches {
            return shuffled_runs(counts, draw);
        }
        let mut units = Vec::with_capacity(counts.len());
        let mut start = 0;
        for (j, &c) in counts.iter().enumerate() {
            if c > 0 {
                units.push(Unit::Run {
                    start,
                    bucket: j as u32,
                    first: 0,
                });
                start += c;
            }
        }
        Runs {
            units,
            total,
            rest_ends: Vec::new(),
            rest_first: Vec::new(),
            rest_len: Vec::new(),
        }
    }

    /// Global position `p`'s bucket and batch of that bucket.
    ///
    /// # Panics
    ///
    /// If `p` is not below the epoch's batches.
    fn locate(&self, p: u64) -> (usize, u64) {
        assert!(p < self.total, "global batch {p} of {}", self.total);
        match self.units[self.units.partition_point(|u| u.start() <= p) - 1] {
            Unit::Run {
                start,
                bucket,
                first,
            } => (bucket as usize, first + p - start),
            Unit::Chunk {
                start,
                from,
                bits,
                key,
            } => {
                let q = from + flipped(key, p - start, bits);
                let j = self.rest_ends.partition_point(|&e| e <= q);
                let offset = q - (self.rest_ends[j] - self.rest_len[j]);
                (j, self.rest_first[j] + offset)
            }
        }
    }
}

/// Position `o` of a block of `2**bits` under a keyed tree flip: the block's binary tree with
/// each node's two halves swapped or not by a keyed bit. Every aligned sub-block of any size
/// `2**l` goes to an aligned sub-block of the same size (its bits above `l` decide where, its
/// bits below `l` only where inside), so the batches a step of `W | 2**bits` ranks sees are
/// the same consecutive ones of the remainder stream whatever the flips, in a random order.
fn flipped(key: u64, o: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    for level in (0..bits).rev() {
        let node = (o >> level >> 1) | (1u64 << (bits - level - 1)); // heap numbering
        let flip = fold(key, node) & 1;
        out |= (((o >> level) & 1) ^ flip) << level;
    }
    out
}

/// The units of a shuffled epoch: bucket `j` has `counts[j]` batches (see the module
/// documentation).
fn shuffled_runs(counts: &[u64], draw: EpochDraw) -> Runs {
    let c = draw.sync;
    let total = counts.iter().sum();
    let whole: Vec<u64> = counts.iter().map(|&b| b / c).collect();
    let mut whole_ends = Vec::with_capacity(counts.len());
    let mut acc = 0u64;
    for &w in &whole {
        acc += w;
        whole_ends.push(acc);
    }
    let whole_total = acc;
    // The remainder stream: bucket j's batches from `whole[j] * c` on, bucket after bucket.
    let rest_len: Vec<u64> = counts.iter().map(|&b| b % c).collect();
    let mut rest_ends = Vec::with_capacity(counts.len());
    let mut acc = 0u64;
    for &r in &rest_len {
        acc += r;
        rest_ends.push(acc);
    }
    let rest_total = acc;
    let chunks = rest_total / c;
    let tail = rest_total - chunks * c;
    let count = whole_total + chunks;
    let bits = c.trailing_zeros();
    let flips = Stream::new(draw.seed, draw.epoch, Purpose::BucketRuns, 1).next_u64();
    // The tail (fewer than a unit) is a keyed slot of the stream, between two chunks, not
    // always its longest batches; the chunks are the stream's other runs of `c`.
    let tail_from = fold(flips, u64::MAX) % (chunks + 1) * c;
    let chunk_from = |i: u64| {
        if i * c < tail_from {
            i * c
        } else {
            i * c + tail
        }
    };
    let mut units = Vec::with_capacity(count as usize + 64);
    let order = RandomAccessPermutation::from_stream(
        count,
        Stream::new(draw.seed, draw.epoch, Purpose::BucketRuns, 0),
    );
    let mut start = 0u64;
    for s in 0..count {
        if s % CHECK_EVERY as u64 == 0 && cancelled() {
            break; // the caller discards the units
        }
        let id = order.at(s);
        if id < whole_total {
            let j = whole_ends.partition_point(|&e| e <= id);
            let k = id - (whole_ends[j] - whole[j]);
            units.push(Unit::Run {
                start,
                bucket: j as u32,
                first: k * c,
            });
        } else {
            let from = chunk_from(id - whole_total);
            units.push(Unit::Chunk {
                start,
                from,
                bits,
                key: fold(flips, from),
            });
        }
        start += c;
    }
    // The tail ends the epoch in aligned blocks of its binary digits, largest first; which
    // piece of the tail's slot each block holds is keyed too (the pieces cut in a keyed order
    // of the sizes), so a small epoch does not run from short to long.
    let mut sizes: Vec<u64> = (0..bits)
        .rev()
        .map(|b| 1u64 << b)
        .filter(|&z| tail & z != 0)
        .collect();
    let placed = sizes.clone();
    sizes.sort_by_key(|&z| fold(flips ^ 0x7461_696c, z)); // the pieces' order in the slot
    for z in placed {
        let before: u64 = sizes.iter().take_while(|&&y| y != z).sum();
        let from = tail_from + before;
        units.push(Unit::Chunk {
            start,
            from,
            bits: z.trailing_zeros(),
            key: fold(flips, from),
        });
        start += z;
    }
    Runs {
        units,
        total,
        rest_ends,
        rest_first: whole.iter().map(|&w| w * c).collect(),
        rest_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Limits;

    fn plan(n: u64, limits: Limits) -> (Vec<u64>, BucketPlan) {
        let lengths: Vec<u64> = (0..n)
            .map(|i| 20 + crate::stream::fold(9, i) % 700)
            .collect();
        let p = BucketPlan::new(&lengths, &[100, 200, 350, 500], limits).unwrap();
        (lengths, p)
    }

    fn budget_limits() -> Limits {
        Limits {
            max_tokens: Some(6000),
            carry: true,
            ..Limits::default()
        }
    }

    fn batches(e: &EpochBatches, p: &BucketPlan, deal: Deal) -> Vec<Vec<u64>> {
        let n = e.rank_batches(deal.num_replicas, deal.drop_last).unwrap();
        let (flat, offs) = e.range(p, deal, 0..n).unwrap();
        let flat = flat.to_u64_vec();
        offs.windows(2)
            .map(|o| flat[o[0] as usize..o[1] as usize].to_vec())
            .collect()
    }

    /// The epoch of the default draw with `sync` batches a unit.
    fn with_sync(p: &BucketPlan, sync: u64) -> EpochBatches {
        let draw = EpochDraw {
            sync,
            ..EpochDraw::default()
        };
        EpochBatches::new(p, draw).unwrap()
    }

    /// Every batch of the epoch in its global order: one rank's, alone.
    fn alone(e: &EpochBatches, p: &BucketPlan) -> Vec<Vec<u64>> {
        let deal = Deal {
            num_replicas: 1,
            rank: 0,
            drop_last: false,
        };
        batches(e, p, deal)
    }

    #[test]
    fn one_global_sequence_for_every_world_size() {
        let (_, p) = plan(20_000, budget_limits());
        for sync in [1u64, 4, 64] {
            let e = with_sync(&p, sync);
            let one = alone(&e, &p);
            assert_eq!(one.len() as u64, e.batches());
            for w in [2u64, 3, 4, 8, 16] {
                for drop_last in [false, true] {
                    let ranks: Vec<Vec<Vec<u64>>> = (0..w)
                        .map(|r| {
                            batches(
                                &e,
                                &p,
                                Deal {
                                    num_replicas: w,
                                    rank: r,
                                    drop_last,
                                },
                            )
                        })
                        .collect();
                    let per = ranks[0].len();
                    assert!(ranks.iter().all(|b| b.len() == per));
                    for k in 0..per * w as usize {
                        let got = &ranks[k % w as usize][k / w as usize];
                        assert_eq!(got, &one[k % one.len()], "sync {sync} W {w} position {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_sample_once_full_batches_within_budget_and_steps_within_one_unit() {
        let (lengths, p) = plan(30_000, budget_limits());
        for (sync, epoch) in [(8u64, 2u64), (64, 0), (1, 1)] {
            let draw = EpochDraw {
                sync,
                epoch,
                ..EpochDraw::default()
            };
            let e = EpochBatches::new(&p, draw).unwrap();
            let all = alone(&e, &p);
            let buckets = p.buckets();
            let mut shorts = 0usize;
            let mut seen = vec![0u32; lengths.len()];
            for (q, b) in all.iter().enumerate() {
                let longest = b.iter().map(|&i| lengths[i as usize]).max().unwrap();
                assert!(b.len() as u64 * longest <= 6000);
                // Every batch holds its bucket's size, but a bucket's short last one.
                let (j, i) = e.locate(q as u64);
                let (members, size, count, _) = buckets[j];
                if i + 1 < count {
                    assert_eq!(b.len() as u64, size, "batch {i} of bucket {j}");
                } else {
                    assert_eq!(b.len() as u64, members - size * (count - 1));
                }
                shorts += usize::from((b.len() as u64) < size);
                b.iter().for_each(|&i| seen[i as usize] += 1);
            }
            assert!(seen.iter().all(|&c| c == 1));
            assert_eq!(shorts, buckets.iter().filter(|b| b.0 % b.1 != 0).count());
            // The remainder stream: every bucket's batches past its whole runs, in order.
            let stream: Vec<(usize, u64)> = buckets
                .iter()
                .enumerate()
                .flat_map(|(j, b)| (b.2 / sync * sync..b.2).map(move |i| (j, i)))
                .collect();
            let located: Vec<(usize, u64)> = (0..e.batches()).map(|q| e.locate(q)).collect();
            // Every step of W | sync ranks is inside one unit: a whole run of one bucket, or
            // W consecutive batches of the remainder stream, in some order.
            for w in [1u64, 2, 4, 8].into_iter().filter(|w| sync % w == 0) {
                for step in located.chunks(w as usize) {
                    let (j, i) = step[0];
                    let in_run = i < buckets[j].2 / sync * sync
                        && step.iter().enumerate().all(|(k, &(b, x))| {
                            b == j && x == i + k as u64 && x / sync == i / sync
                        });
                    let mut sorted = step.to_vec();
                    sorted.sort_unstable();
                    let in_stream = stream.windows(step.len()).any(|block| block == sorted);
                    assert!(in_run || in_stream, "sync {sync} W {w}: step {step:?}");
                }
            }
            // The stream's tail (shorter than a unit) ends the epoch: a slot of the stream
            // between two of its chunks.
            let tail = stream.len() % sync as usize;
            let mut end = located[located.len() - tail..].to_vec();
            end.sort_unstable();
            assert!(
                (0..=stream.len() - tail)
                    .step_by(sync as usize)
                    .any(|a| end == stream[a..a + tail]),
                "sync {sync}: the tail is no slot of the stream"
            );
        }
    }

    /// The tree flip permutes every block, keeps every aligned sub-block of every size
    /// together, depends on its key, and reaches every order of a small block.
    #[test]
    fn a_tree_flip_keeps_aligned_blocks_and_changes_with_its_key() {
        for bits in 0..8u32 {
            let n = 1u64 << bits;
            for key in 0..20u64 {
                let f: Vec<u64> = (0..n).map(|o| flipped(key, o, bits)).collect();
                let mut sorted = f.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<u64>>());
                for l in 0..bits {
                    for block in f.chunks(1 << l) {
                        assert!(
                            block.iter().all(|&x| x >> l == block[0] >> l),
                            "bits {bits}"
                        );
                    }
                }
            }
        }
        let orders: std::collections::HashSet<Vec<u64>> = (0..400u64)
            .map(|key| (0..4).map(|o| flipped(key, o, 2)).collect())
            .collect();
        assert_eq!(orders.len(), 8); // 2**3 flips of a block of 4
        let a: Vec<u64> = (0..64).map(|o| flipped(1, o, 6)).collect();
        let b: Vec<u64> = (0..64).map(|o| flipped(2, o, 6)).collect();
        assert_ne!(a, b);
    }

    /// A small epoch (every batch in the remainder stream) is not laid out by length, and is
    /// ordered anew every epoch.
    #[test]
    fn a_small_epoch_is_ordered_anew_every_epoch() {
        let (_, p) = plan(1_500, budget_limits());
        let orders: Vec<Vec<usize>> = (0..3)
            .map(|epoch| {
                let draw = EpochDraw {
                    epoch,
                    ..EpochDraw::default()
                };
                let e = EpochBatches::new(&p, draw).unwrap();
                assert!(p.bucket_batches().iter().all(|&b| b < draw.sync));
                (0..e.batches()).map(|q| e.locate(q).0).collect()
            })
            .collect();
        for o in &orders {
            assert!(o.windows(2).any(|w| w[0] > w[1]), "sorted by bucket: {o:?}");
        }
        assert!(orders[0] != orders[1] && orders[1] != orders[2] && orders[0] != orders[2]);
        // Over epochs, the longest bucket's batches do not always come last.
        let longest = *orders[0].iter().max().unwrap();
        let ends: Vec<bool> = (0..12)
            .map(|epoch| {
                let draw = EpochDraw {
                    epoch,
                    ..EpochDraw::default()
                };
                let e = EpochBatches::new(&p, draw).unwrap();
                e.locate(e.batches() - 1).0 == longest
            })
            .collect();
        assert!(
            ends.iter().any(|&x| !x),
            "the longest bucket always ends the epoch"
        );
    }

    /// The memory estimate counts the epoch's units: one per batch with `sync = 1`.
    #[test]
    fn the_estimate_counts_every_unit() {
        let (_, p) = plan(20_000, budget_limits());
        let e = with_sync(&p, 1);
        let unit = std::mem::size_of::<Unit>() as u64;
        assert!(e.runs.units.len() as u64 >= p.batches());
        assert!(EpochBatches::new_bytes(&p, 1) >= p.batches() * unit);
        assert!(EpochBatches::new_bytes(&p, 64) < EpochBatches::new_bytes(&p, 1));
    }

    #[test]
    fn fixed_sizes_without_a_budget_and_unshuffled_orders() {
        let l = Limits {
            batch_size: Some(32),
            full_batches: true,
            ..Limits::default()
        };
        let (lengths, p) = plan(10_001, l);
        let e = with_sync(&p, 16);
        let all = alone(&e, &p);
        assert!(all.iter().all(|b| b.len() == 32));
        let counts: Vec<u64> = p.buckets().iter().map(|b| b.0 / 32).collect();
        assert_eq!(p.bucket_batches(), counts);
        let plain = EpochBatches::new(
            &p,
            EpochDraw {
                shuffle: false,
                ..EpochDraw::default()
            },
        )
        .unwrap();
        let all = alone(&plain, &p);
        let flat: Vec<u64> = all.concat();
        let mut sorted = flat.clone();
        sorted.sort_by_key(|&i| (lengths[i as usize] >= 100, lengths[i as usize] >= 200));
        assert!(flat.windows(2).all(|w| {
            let b = |i: u64| [100u64, 200, 350, 500].partition_point(|&x| x <= lengths[i as usize]);
            b(w[0]) < b(w[1]) || (b(w[0]) == b(w[1]) && w[0] < w[1])
        }));
        assert!(EpochBatches::new(
            &p,
            EpochDraw {
                sync: 3,
                ..EpochDraw::default()
            }
        )
        .is_err());
    }

    #[test]
    fn a_lazy_epoch_reads_what_the_whole_one_reads_and_every_epoch_has_the_targets() {
        for (limits, sync) in [
            (budget_limits(), 8u64),
            (budget_limits(), 1),
            (
                Limits {
                    batch_size: Some(16),
                    ..Limits::default()
                },
                4,
            ),
        ] {
            let (_, p) = plan(9_000, limits);
            for epoch in 0..4 {
                let draw = EpochDraw {
                    sync,
                    epoch,
                    ..EpochDraw::default()
                };
                let e = EpochBatches::new(&p, draw).unwrap();
                let lazy = EpochBatches::lazy(&p, draw).unwrap();
                assert_eq!(e.batches(), p.batches());
                let total = e.batches();
                for w in [1u64, 3, 8] {
                    let deal = Deal {
                        num_replicas: w,
                        rank: w - 1,
                        drop_last: false,
                    };
                    let n = e.rank_batches(w, false).unwrap();
                    for k in [0, 1, n / 2, n - 1] {
                        let stop = (k + 3).min(n);
                        assert_eq!(
                            lazy.range(&p, deal, k..stop).unwrap(),
                            e.range(&p, deal, k..stop).unwrap(),
                            "W {w} batch {k}"
                        );
                    }
                }
                let el = Elastic::new(total, 2, false, total / 2, 3).unwrap();
                assert_eq!(
                    lazy.elastic_range(&p, &el, 1, 0..2).unwrap(),
                    e.elastic_range(&p, &el, 1, 0..2).unwrap()
                );
            }
        }
    }

    #[test]
    fn an_elastic_rest_continues_the_sequence() {
        let (_, p) = plan(8_000, budget_limits());
        let e = EpochBatches::new(&p, EpochDraw::default()).unwrap();
        let one = alone(&e, &p);
        let el = Elastic::new(e.batches(), 4, false, 12, 3).unwrap();
        for r in 0..3 {
            let (flat, offs) = e.elastic_range(&p, &el, r, 0..el.num_samples()).unwrap();
            let flat = flat.to_u64_vec();
            for (k, o) in offs.windows(2).enumerate() {
                let g = (12 + r + 3 * k as u64) as usize;
                let want = &one[if g < one.len() {
                    g
                } else {
                    12 + (g - 12) % (one.len() - 12)
                }];
                assert_eq!(
                    &flat[o[0] as usize..o[1] as usize],
                    &want[..],
                    "rank {r} batch {k}"
                );
            }
        }
    }
}

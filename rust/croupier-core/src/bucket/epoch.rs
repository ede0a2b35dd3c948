//! One epoch's batch plan for every world size (`BucketBatchSampler(order="global")`).
//!
//! # The plan
//!
//! - **Batches.** Bucket `j`'s members are shuffled as in the fast order (the `order="fast"`
//!   permutation of one rank under `Stream(seed, epoch, BucketShuffle, j)`), and cut into
//!   batches: filled to the budget with their running longest sample ([`super::fill`]) when
//!   the plan has [`Limits::fill_to_budget`](super::Limits) and a token budget, else of the
//!   bucket's fixed size. Nothing here depends on the number of ranks.
//! - **Runs.** The epoch's batches form one global sequence, cut into runs of `sync` (`C`, a
//!   power of two) consecutive batches of one bucket, so that the `W` batches of a global
//!   step (positions `[kW, (k+1)W)`, one per rank) come from one bucket whenever `W` divides
//!   `C`: ranks finish a step together. First the runs whose batches every order of the
//!   bucket has (the bucket's lower bound, see [`super::fill`]: `⌊LB_j / C⌋`
//!   runs each), in a keyed random order (`Stream(seed, epoch, BucketRuns, 0)`); then the
//!   rest of every bucket, by run size: runs of `C`, then each bucket's remainder in runs of
//!   `C/2, C/4, …, 1` (its binary digits), each size in its own keyed order. Every run starts
//!   at a multiple of its size, so steps of `W | C` ranks stay within one bucket up to the
//!   runs shorter than `W`: fewer than `W` batches per bucket, at the end of the epoch.
//!   Within a bucket, batches are used in their order of the bucket (its first runs first).
//! - **Deal.** Rank `r` takes global positions `r, r + W, …` with torch's padding (the first
//!   batches again) or dropping (the last `B % W`), like `DistributedSampler`; an elastic
//!   resume deals the rest of the same sequence ([`Elastic`]).
//!
//! Without shuffling the batch order (`shuffle_batches = false`, or `shuffle = false`), the
//! sequence is the buckets' batches bucket after bucket, shortest first.
//!
//! The plan of an epoch is computed once (every bucket's order, in parallel) and read by
//! random access: a batch at any global position is found in `O(log R)` over the runs.

use super::fill::Budget;
use super::plan::BucketPlan;
use crate::deal::elastic::Elastic;
use crate::deal::layout::{Deal, Layout};
use crate::deal::rank::{rank_range, Draw};
use crate::draw::random_access::RandomAccessPermutation;
use crate::error::{Error, Result};
use crate::index::{Indices, U32_MAX_LEN};
use crate::stream::{Purpose, Stream};
use rayon::prelude::*;
use std::ops::Range;

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
    /// Shuffle the order of the runs too (with `shuffle` only); without, bucket after bucket.
    pub shuffle_batches: bool,
    /// Consecutive batches of one bucket per run (a power of two; 1: every batch on its own).
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
    fn keys(&self) -> (u64, u64, bool) {
        (self.seed, self.epoch, self.shuffle)
    }
}

/// Consecutive batches of one bucket in the global sequence.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Its first global position.
    start: u64,
    bucket: u32,
    /// Its first batch, counted in its bucket.
    first: u64,
}

/// One epoch's global batch plan: every bucket's batches and their places in the global
/// sequence (see the module documentation).
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::{BucketPlan, EpochBatches, EpochDraw, Limits};
/// use croupier_core::{Deal, Indices};
///
/// let lengths: Vec<u32> = (0..5000).map(|i| 10 + (i * 7919) % 500).collect();
/// let limits = Limits { max_tokens: Some(4096), fill_to_budget: true, ..Limits::default() };
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
/// ```
#[derive(Debug, Clone)]
pub struct EpochBatches {
    /// Per bucket: where each of its batches starts in its order of the epoch, then its end.
    cuts: Vec<Vec<u64>>,
    runs: Runs,
    draw: EpochDraw,
    /// Every bucket's order of the epoch as samples, kept from the cut when the plan fills
    /// batches to the budget and has at most [`KEEP_ORDERS`] samples: a rank's batches are
    /// then copied out instead of computed a second time.
    orders: Option<Vec<Indices>>,
}

/// Samples up to which an epoch plan keeps its buckets' orders (4 bytes each).
pub const KEEP_ORDERS: u64 = 1 << 26;

impl EpochBatches {
    /// The plan of the epoch `draw` names over `plan`'s buckets: every bucket's order is
    /// computed (in parallel) and cut into batches.
    pub fn new(plan: &BucketPlan, draw: EpochDraw) -> Result<Self> {
        if draw.sync == 0 || !draw.sync.is_power_of_two() {
            return Err(Error::out_of_range(
                "sync",
                "a power of two >= 1",
                draw.sync,
            ));
        }
        let budget = Budget::new(plan.limits());
        let k = plan.bucket_count();
        let keep = plan.filled_to_budget(0) && plan.len() <= KEEP_ORDERS;
        let (cuts, orders): (Vec<Vec<u64>>, Vec<Option<Indices>>) = (0..k)
            .into_par_iter()
            .map(|j| bucket_cuts(plan, &budget, j, draw, keep))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let orders = keep.then(|| orders.into_iter().map(|o| o.expect("kept")).collect());
        let counts: Vec<u64> = cuts.iter().map(|c| c.len() as u64 - 1).collect();
        let runs = Runs::new(plan, &counts, draw);
        Ok(EpochBatches {
            cuts,
            runs,
            draw,
            orders,
        })
    }

    /// Batches in the epoch over all ranks, before padding or cutting.
    pub fn batches(&self) -> u64 {
        self.runs.total
    }

    /// Per bucket, its batches this epoch (the oversized bucket last).
    pub fn bucket_batches(&self) -> Vec<u64> {
        self.cuts.iter().map(|c| c.len() as u64 - 1).collect()
    }

    /// Batches per rank with `w` ranks.
    pub fn rank_batches(&self, w: u64, drop_last: bool) -> Result<u64> {
        Ok(Layout::new(self.runs.total, w, drop_last)?.num_samples())
    }

    /// Global position `p`'s batch: its bucket and positions `[a, b)` of the bucket's order.
    ///
    /// # Panics
    ///
    /// If `p >= self.batches()`.
    pub fn locate(&self, p: u64) -> (usize, u64, u64) {
        let (j, i) = self.runs.locate(p);
        (j, self.cuts[j][i as usize], self.cuts[j][i as usize + 1])
    }

    /// Where every bucket stands at global position `g` (clamped to the epoch's batches): the
    /// [`Cursors`] a checkpoint keeps so that a resume needs no whole plan.
    pub fn cursors_at(&self, g: u64) -> Cursors {
        let g = g.min(self.runs.total);
        let next = self.runs.consumed(g, vec![0; self.cuts.len()]);
        let offsets = next
            .iter()
            .zip(&self.cuts)
            .map(|(&i, c)| c[i as usize])
            .collect();
        Cursors {
            position: g,
            batches: self.bucket_batches(),
            next,
            offsets,
        }
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
        self.batches_at(plan, positions)
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
        self.batches_at(plan, positions)
    }

    fn batches_at(&self, plan: &BucketPlan, positions: Indices) -> Result<(Indices, Vec<u64>)> {
        let located: Vec<(usize, u64, u64)> =
            positions.to_u64_vec().into_iter().map(|p| self.locate(p)).collect();
        if let Some(orders) = &self.orders {
            return Ok(copied(orders, &located));
        }
        filled(plan, &located, self.draw.keys())
    }
}

/// The batches `located` read from their buckets' orders, with their offsets.
fn filled(
    plan: &BucketPlan,
    located: &[(usize, u64, u64)],
    keys: (u64, u64, bool),
) -> Result<(Indices, Vec<u64>)> {
    Ok(if plan.len() <= U32_MAX_LEN {
        let (flat, offsets) = plan.fill_located::<u32>(located, keys)?;
        (Indices::U32(flat), offsets)
    } else {
        let (flat, offsets) = plan.fill_located::<u64>(located, keys)?;
        (Indices::U64(flat), offsets)
    })
}

/// Where an epoch's buckets stand at a global position of its plan: every bucket's batches
/// this epoch, how many of them come before the position, and where the next one starts in
/// the bucket's order. A checkpoint keeps it (`O(buckets)` integers) so that a resume reads
/// its next batches without the whole plan ([`Cursors::batches_at`]).
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::{BucketPlan, EpochBatches, EpochDraw, Limits};
/// use croupier_core::Deal;
///
/// let lengths: Vec<u32> = (0..5000).map(|i| 10 + (i * 7919) % 500).collect();
/// let limits = Limits { max_tokens: Some(4096), fill_to_budget: true, ..Limits::default() };
/// let plan = BucketPlan::new(&lengths, &[100, 200, 300], limits).unwrap();
/// let draw = EpochDraw { epoch: 1, ..EpochDraw::default() };
/// let epoch = EpochBatches::new(&plan, draw).unwrap();
/// let at = epoch.cursors_at(40);
/// // Rank 1 of 4 resumes at its batch 10 (global position 41) from the cursors alone.
/// let deal = Deal { num_replicas: 4, rank: 1, drop_last: false };
/// let whole = epoch.range(&plan, deal, 10..12).unwrap();
/// assert_eq!(at.range(&plan, draw, deal, 10..12).unwrap(), whole);
/// assert_eq!(at.advance(&plan, draw, 77).unwrap(), epoch.cursors_at(77));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursors {
    /// The global position (at most the epoch's batches).
    pub position: u64,
    /// Every bucket's batches this epoch (the oversized bucket last).
    pub batches: Vec<u64>,
    /// Per bucket: its batches at global positions before `position`.
    pub next: Vec<u64>,
    /// Per bucket: where its batch `next[j]` starts in its order of the epoch.
    pub offsets: Vec<u64>,
}

impl Cursors {
    /// Refuses cursors that cannot belong to `plan`: the wrong number of buckets, counts or
    /// offsets out of range, or a position that disagrees with them.
    fn check(&self, plan: &BucketPlan) -> Result<()> {
        let k = plan.bucket_count();
        let bad = |why: String| Err(Error::out_of_range("cursors", "a plan's own", why));
        if self.batches.len() != k || self.next.len() != k || self.offsets.len() != k {
            return bad(format!("lists of {k} buckets expected"));
        }
        for j in 0..k {
            let n = plan.members_of(j);
            if self.next[j] > self.batches[j] || self.offsets[j] > n || self.batches[j] > n {
                return bad(format!("bucket {j} out of range"));
            }
        }
        if self.next.iter().sum::<u64>() != self.position {
            return bad(format!("position {} is not its buckets' sum", self.position));
        }
        Ok(())
    }

    /// The batches at global positions `positions` (each at or after `self.position`), as
    /// [`EpochBatches::range`] returns them, scanning only the buckets' orders from their
    /// cursors to the batches asked for.
    fn read(
        &self,
        plan: &BucketPlan,
        draw: EpochDraw,
        positions: &[u64],
    ) -> Result<(Indices, Vec<u64>)> {
        self.check(plan)?;
        let runs = Runs::new(plan, &self.batches, draw);
        let budget = Budget::new(plan.limits());
        let at: Vec<(usize, u64)> = positions.iter().map(|&p| runs.locate(p)).collect();
        let mut need = vec![0u64; self.next.len()];
        for &(j, i) in &at {
            if i < self.next[j] {
                return Err(Error::out_of_range(
                    "positions",
                    format!("at or after the cursors' position {}", self.position),
                    "an earlier one",
                ));
            }
            need[j] = need[j].max(i - self.next[j] + 1);
        }
        let cuts: Vec<Vec<u64>> = (0..need.len())
            .map(|j| cuts_from(plan, &budget, j, draw, self.offsets[j], need[j]))
            .collect::<Result<_>>()?;
        let located: Vec<(usize, u64, u64)> = at
            .iter()
            .map(|&(j, i)| {
                let t = (i - self.next[j]) as usize;
                (j, cuts[j][t], cuts[j][t + 1])
            })
            .collect();
        filled(plan, &located, draw.keys())
    }

    /// Rank `deal.rank`'s batches `range` of the epoch, as [`EpochBatches::range`] returns
    /// them, from these cursors (the batches must lie at or after their position).
    pub fn range(
        &self,
        plan: &BucketPlan,
        draw: EpochDraw,
        deal: Deal,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let total = self.batches.iter().sum();
        let positions = rank_range(&deal.layout(total)?, deal.rank, in_order(), range)?;
        self.read(plan, draw, &positions.to_u64_vec())
    }

    /// New rank `rank`'s batches `range` of the elastic rest `elastic`, as
    /// [`EpochBatches::elastic_range`] returns them, from these cursors.
    pub fn elastic_range(
        &self,
        plan: &BucketPlan,
        draw: EpochDraw,
        elastic: &Elastic,
        rank: u64,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let positions = elastic.range(rank, in_order(), range)?;
        self.read(plan, draw, &positions.to_u64_vec())
    }

    /// The cursors at global position `g` (at or after these; clamped to the epoch's
    /// batches), scanning only the batches in between.
    pub fn advance(&self, plan: &BucketPlan, draw: EpochDraw, g: u64) -> Result<Cursors> {
        self.check(plan)?;
        let runs = Runs::new(plan, &self.batches, draw);
        let g = g.min(runs.total);
        if g < self.position {
            return Err(Error::out_of_range(
                "position",
                format!("at or after the cursors' position {}", self.position),
                g,
            ));
        }
        let next = runs.consumed(g, self.next.clone());
        let budget = Budget::new(plan.limits());
        let offsets = (0..next.len())
            .map(|j| {
                let ahead = next[j] - self.next[j];
                let cuts = cuts_from(plan, &budget, j, draw, self.offsets[j], ahead)?;
                Ok(cuts[ahead as usize])
            })
            .collect::<Result<_>>()?;
        Ok(Cursors {
            position: g,
            batches: self.batches.clone(),
            next,
            offsets,
        })
    }
}

/// Where the next `count` batches of bucket `j` start in its order of the epoch, from the
/// batch starting at `offset`, then where the last of them ends (`count + 1` offsets): the
/// bucket's order read from `offset` in growing pieces until `count` batches are whole.
fn cuts_from(
    plan: &BucketPlan,
    budget: &Budget,
    j: usize,
    draw: EpochDraw,
    offset: u64,
    count: u64,
) -> Result<Vec<u64>> {
    let n = plan.members_of(j);
    if !plan.filled_to_budget(j) {
        let size = if j + 1 == plan.bucket_count() {
            1
        } else {
            plan.fixed_size(j)
        };
        return Ok((0..=count).map(|t| (offset + t * size).min(n)).collect());
    }
    let mut lens: Vec<u64> = Vec::new();
    let mut end = offset;
    let mut piece = 1024u64;
    loop {
        if count == 0 {
            return Ok(vec![offset]);
        }
        let stop = (end + piece).min(n);
        let positions = plan.bucket_positions(j, draw.keys(), end..stop)?;
        lens.extend(plan.gather_lengths(j, &positions));
        end = stop;
        let cuts = budget.cuts(&lens);
        // The last batch is whole only at the end of the bucket: it may take more samples.
        let whole = cuts.len() as u64 - if end == n { 1 } else { 2 };
        if whole >= count {
            return Ok(cuts[..=count as usize].iter().map(|&c| offset + c).collect());
        }
        if end == n {
            return Err(Error::out_of_range(
                "cursors",
                "a plan's own",
                format!("bucket {j} has fewer batches than they say"),
            ));
        }
        piece *= 2;
    }
}

/// The runs of an epoch's global sequence and its length.
#[derive(Debug, Clone)]
struct Runs {
    runs: Vec<Run>,
    total: u64,
}

impl Runs {
    /// The runs of the epoch `draw` names whose buckets have `counts` batches.
    fn new(plan: &BucketPlan, counts: &[u64], draw: EpochDraw) -> Self {
        let total = counts.iter().sum();
        let runs = if draw.shuffle && draw.shuffle_batches {
            let budget = Budget::new(plan.limits());
            let sure: Vec<u64> = (0..counts.len())
                .map(|j| {
                    if plan.filled_to_budget(j) {
                        budget
                            .lower_bound(plan.members_of(j), plan.bucket_cost(j))
                            .min(counts[j])
                    } else {
                        counts[j]
                    }
                })
                .collect();
            shuffled_runs(counts, &sure, draw)
        } else {
            let mut runs = Vec::with_capacity(counts.len());
            let mut start = 0;
            for (j, &c) in counts.iter().enumerate() {
                if c > 0 {
                    runs.push(Run {
                        start,
                        bucket: j as u32,
                        first: 0,
                    });
                    start += c;
                }
            }
            runs
        };
        Runs { runs, total }
    }

    /// Global position `p`'s bucket and batch of that bucket.
    ///
    /// # Panics
    ///
    /// If `p` is not below the epoch's batches.
    fn locate(&self, p: u64) -> (usize, u64) {
        assert!(p < self.total, "global batch {p} of {}", self.total);
        let r = self.runs[self.runs.partition_point(|r| r.start <= p) - 1];
        (r.bucket as usize, r.first + p - r.start)
    }

    /// Per bucket, its batches before global position `g`, given `next` (its batches before
    /// some earlier position; at least what the runs before it say).
    fn consumed(&self, g: u64, mut next: Vec<u64>) -> Vec<u64> {
        let end = self.runs.partition_point(|r| r.start < g);
        for (k, r) in self.runs[..end].iter().enumerate() {
            let stop = self.runs.get(k + 1).map_or(self.total, |n| n.start).min(g);
            let j = r.bucket as usize;
            next[j] = next[j].max(r.first + stop - r.start);
        }
        next
    }
}

/// The global positions in order (the identity draw).
fn in_order() -> Draw {
    Draw {
        shuffle: false,
        ..Draw::default()
    }
}

/// The batches `located` copied out of the buckets' kept orders, with their offsets.
fn copied(orders: &[Indices], located: &[(usize, u64, u64)]) -> (Indices, Vec<u64>) {
    let mut offsets = Vec::with_capacity(located.len() + 1);
    offsets.push(0u64);
    let mut total = 0u64;
    for &(_, a, b) in located {
        total += b - a;
        offsets.push(total);
    }
    let flat = match orders.first() {
        Some(Indices::U64(_)) => Indices::U64(
            located
                .iter()
                .flat_map(|&(j, a, b)| match &orders[j] {
                    Indices::U64(v) => v[a as usize..b as usize].iter().copied(),
                    Indices::U32(_) => unreachable!("one index type per plan"),
                })
                .collect(),
        ),
        _ => Indices::U32(
            located
                .iter()
                .flat_map(|&(j, a, b)| match &orders[j] {
                    Indices::U32(v) => v[a as usize..b as usize].iter().copied(),
                    Indices::U64(_) => unreachable!("one index type per plan"),
                })
                .collect(),
        ),
    };
    (flat, offsets)
}

/// Bucket `j`'s batch starts in its order of the epoch, then its end; and its order as
/// samples when `keep`.
fn bucket_cuts(
    plan: &BucketPlan,
    budget: &Budget,
    j: usize,
    draw: EpochDraw,
    keep: bool,
) -> Result<(Vec<u64>, Option<Indices>)> {
    let n = plan.members_of(j);
    if plan.filled_to_budget(j) || keep {
        let positions = plan.bucket_positions(j, draw.keys(), 0..n)?;
        let cuts = if plan.filled_to_budget(j) {
            budget.cuts(&plan.gather_lengths(j, &positions))
        } else {
            (0..=n).collect() // the oversized bucket: each sample alone
        };
        return Ok((cuts, keep.then(|| plan.gather_members(j, &positions))));
    }
    let size = plan.fixed_size(j);
    let full = plan.limits().full_batches && j + 1 < plan.bucket_count();
    let batches = if full { n / size } else { n.div_ceil(size) };
    Ok(((0..=batches).map(|i| (i * size).min(n)).collect(), None))
}

/// The runs of a shuffled epoch: bucket `j` has `counts[j]` batches, `sure[j] <= counts[j]`
/// of them whatever its order (see the module documentation).
fn shuffled_runs(counts: &[u64], sure: &[u64], draw: EpochDraw) -> Vec<Run> {
    let c = draw.sync;
    let mut next = vec![0u64; counts.len()];
    let mut runs = Vec::new();
    let mut start = 0u64;
    // Place `per[j]` runs of `size` batches of each bucket `j`, in the keyed order `class`.
    let mut place = |per: &[u64], size: u64, class: u64, next: &mut [u64]| {
        let mut ends = Vec::with_capacity(per.len());
        let mut acc = 0u64;
        for &m in per {
            acc += m;
            ends.push(acc);
        }
        let order = RandomAccessPermutation::from_stream(
            acc,
            Stream::new(draw.seed, draw.epoch, Purpose::BucketRuns, class),
        );
        for s in 0..acc {
            let id = order.at(s);
            let j = ends.partition_point(|&e| e <= id);
            runs.push(Run {
                start,
                bucket: j as u32,
                first: next[j],
            });
            next[j] += size;
            start += size;
        }
    };
    let main: Vec<u64> = sure.iter().map(|&s| s / c).collect();
    place(&main, c, 0, &mut next);
    let rest: Vec<u64> = counts.iter().zip(&next).map(|(&b, &u)| b - u).collect();
    place(
        &rest.iter().map(|&r| r / c).collect::<Vec<_>>(),
        c,
        1,
        &mut next,
    );
    let mut size = c / 2;
    let mut class = 2;
    while size >= 1 {
        let per: Vec<u64> = rest
            .iter()
            .map(|&r| u64::from((r % c) & size != 0))
            .collect();
        place(&per, size, class, &mut next);
        size /= 2;
        class += 1;
    }
    debug_assert_eq!(next, counts);
    runs
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
            fill_to_budget: true,
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

    #[test]
    fn one_global_sequence_for_every_world_size() {
        let (_, p) = plan(20_000, budget_limits());
        for sync in [1u64, 4, 64] {
            let e = EpochBatches::new(
                &p,
                EpochDraw {
                    sync,
                    ..EpochDraw::default()
                },
            )
            .unwrap();
            let one = batches(
                &e,
                &p,
                Deal {
                    num_replicas: 1,
                    rank: 0,
                    drop_last: false,
                },
            );
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
    fn every_sample_once_within_budget_and_runs_in_one_bucket() {
        let (lengths, p) = plan(30_000, budget_limits());
        let bounds = [100u64, 200, 350, 500];
        let bucket = |i: u64| bounds.partition_point(|&b| b <= lengths[i as usize]);
        let draw = EpochDraw {
            sync: 8,
            epoch: 2,
            ..EpochDraw::default()
        };
        let e = EpochBatches::new(&p, draw).unwrap();
        let all = batches(
            &e,
            &p,
            Deal {
                num_replicas: 1,
                rank: 0,
                drop_last: false,
            },
        );
        let mut seen = vec![0u32; lengths.len()];
        for b in &all {
            let longest = b.iter().map(|&i| lengths[i as usize]).max().unwrap();
            assert!(b.len() as u64 * longest <= 6000);
            assert!(b.iter().all(|&i| bucket(i) == bucket(b[0])));
            b.iter().for_each(|&i| seen[i as usize] += 1);
        }
        assert!(seen.iter().all(|&c| c == 1));
        // Steps of 8 ranks (and of 2 and 4) are within one bucket, but for the short runs
        // at the end: fewer than W batches per bucket.
        for w in [2usize, 4, 8] {
            let mixed = all
                .chunks(w)
                .filter(|s| s.iter().any(|b| bucket(b[0]) != bucket(s[0][0])))
                .count();
            let k = bounds.len() + 1;
            assert!(mixed * w <= k * (w - 1), "W {w}: {mixed} mixed steps");
        }
        // Each bucket's batches are used in their order of the bucket.
        for j in 0..5 {
            let firsts: Vec<u64> = (0..e.batches())
                .map(|q| e.locate(q))
                .filter(|l| l.0 == j)
                .map(|l| l.1)
                .collect();
            assert!(firsts.windows(2).all(|w| w[0] < w[1]), "bucket {j}");
        }
    }

    #[test]
    fn fixed_sizes_without_a_budget_and_unshuffled_orders() {
        let l = Limits {
            batch_size: Some(32),
            full_batches: true,
            ..Limits::default()
        };
        let (lengths, p) = plan(10_001, l);
        let e = EpochBatches::new(
            &p,
            EpochDraw {
                sync: 16,
                ..EpochDraw::default()
            },
        )
        .unwrap();
        let all = batches(
            &e,
            &p,
            Deal {
                num_replicas: 1,
                rank: 0,
                drop_last: false,
            },
        );
        assert!(all.iter().all(|b| b.len() == 32));
        let counts: Vec<u64> = p.buckets().iter().map(|b| b.0 / 32).collect();
        assert_eq!(e.bucket_batches(), counts);
        let plain = EpochBatches::new(
            &p,
            EpochDraw {
                shuffle: false,
                ..EpochDraw::default()
            },
        )
        .unwrap();
        let all = batches(
            &plain,
            &p,
            Deal {
                num_replicas: 1,
                rank: 0,
                drop_last: false,
            },
        );
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
    fn cursors_read_what_the_whole_plan_reads_from_any_position() {
        for (limits, sync) in [
            (budget_limits(), 8u64),
            (budget_limits(), 1),
            (Limits { batch_size: Some(16), ..Limits::default() }, 4),
        ] {
            let (_, p) = plan(9_000, limits);
            let draw = EpochDraw { sync, epoch: 4, ..EpochDraw::default() };
            let e = EpochBatches::new(&p, draw).unwrap();
            let total = e.batches();
            let start = e.cursors_at(0);
            for g in [0, 1, 7, total / 3, total - 1, total] {
                let at = e.cursors_at(g);
                assert_eq!(start.advance(&p, draw, g).unwrap(), at, "advance to {g}");
                for w in [1u64, 3, 8] {
                    let k = g.div_ceil(w);
                    let deal = Deal { num_replicas: w, rank: w - 1, drop_last: true };
                    let n = e.rank_batches(w, true).unwrap();
                    if k >= n {
                        continue;
                    }
                    let stop = (k + 5).min(n);
                    assert_eq!(
                        at.range(&p, draw, deal, k..stop).unwrap(),
                        e.range(&p, deal, k..stop).unwrap(),
                        "g {g} W {w}"
                    );
                }
                if g < total {
                    let el = Elastic::new(total, 2, false, g, 3).unwrap();
                    let n = el.num_samples().min(3);
                    assert_eq!(
                        at.elastic_range(&p, draw, &el, 1, 0..n).unwrap(),
                        e.elastic_range(&p, &el, 1, 0..n).unwrap()
                    );
                }
            }
            // Positions before the cursors, and cursors of another plan, are refused.
            let mid = e.cursors_at(total / 2);
            let deal = Deal { num_replicas: 1, rank: 0, drop_last: false };
            assert!(mid.range(&p, draw, deal, 0..1).is_err());
            assert!(mid.advance(&p, draw, 0).is_err());
            let mut bad = mid.clone();
            bad.next[0] += 1;
            assert!(bad.range(&p, draw, deal, total - 1..total).is_err());
            let mut bad = mid.clone();
            bad.batches.pop();
            assert!(bad.advance(&p, draw, total).is_err());
        }
    }

    #[test]
    fn an_elastic_rest_continues_the_sequence() {
        let (_, p) = plan(8_000, budget_limits());
        let e = EpochBatches::new(&p, EpochDraw::default()).unwrap();
        let one = batches(
            &e,
            &p,
            Deal {
                num_replicas: 1,
                rank: 0,
                drop_last: false,
            },
        );
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

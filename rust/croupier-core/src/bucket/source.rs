//! A bucket batch sampler's batches of every epoch, in the order it was built with: the
//! order's buckets and algorithm chosen once, and the global order's epoch plans kept for the
//! reads that follow.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    padding_boundaries, quantile_boundaries, BatchDraw, BucketPlan, EpochBatches, EpochDraw, Limits,
};
use crate::error::Result;
use crate::{Deal, Elastic, Indices};

/// Epoch plans kept: the current epoch's, and the next one's computed ahead.
const EPOCH_PLANS: usize = 2;

/// Reads of at most this many batches of an epoch whose plan is not kept (an iteration's or
/// a resume's first batches) cut only their own buckets instead of the whole epoch.
const FEW: u64 = 4;

/// Where a read of the global order finds its epoch's batch plan.
enum EpochPlan {
    /// Kept from an earlier read.
    Kept(Arc<EpochBatches>),
    /// Not kept, and the read is of a few batches: a plan that cuts only the buckets read.
    Lazy,
    /// Not kept: the whole plan, computed and kept.
    Whole,
}

/// How the batches of an epoch are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOrder {
    /// One batch sequence per epoch for every number of ranks: padding-optimal buckets when
    /// none are given, bucket tails carried to the next bucket where they fit a batch there
    /// (batches full but a few), and units of `sync` consecutive batches (a power of two) in
    /// a shuffled order ([`EpochBatches`]).
    Global {
        /// Consecutive batches per unit (a run of one bucket, or a block of the remainder
        /// stream).
        sync: u64,
    },
    /// croupier's earlier order: quantile buckets when none are given, one fixed batch size
    /// per bucket, and the batch order dealt per rank ([`BucketPlan::rank_batches_range`]).
    PerRank,
}

/// How samples are grouped, batched and shuffled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketConfig {
    /// Bucket boundaries (a bucket is `[b_j, b_{j+1})`), or `None` for `num_buckets` buckets
    /// found from the lengths (the order's own way).
    pub boundaries: Option<Vec<u64>>,
    /// Buckets to find when `boundaries` is `None`.
    pub num_buckets: u64,
    /// The limits of a batch. Its `carry` is the order's: set for
    /// [`BucketOrder::Global`], cleared for [`BucketOrder::PerRank`].
    pub limits: Limits,
    /// The order of every epoch's batches.
    pub order: BucketOrder,
    /// The seed of the shuffles.
    pub seed: u64,
    /// Shuffle the samples within each bucket; without, nothing is shuffled.
    pub shuffle: bool,
    /// Shuffle the order of the batches (or runs) too, with `shuffle` only.
    pub shuffle_batches: bool,
}

/// The batches of every epoch of one configuration, any rank's, in any world.
///
/// # Examples
///
/// ```
/// use croupier_core::bucket::{BucketConfig, BucketOrder, BucketSource, Limits};
/// use croupier_core::{Deal, Indices};
///
/// let lengths: Vec<u32> = (0..1000).map(|i| 10 + (i * 7919) % 500).collect();
/// let config = BucketConfig {
///     boundaries: None,
///     num_buckets: 4,
///     limits: Limits { max_tokens: Some(4096), ..Limits::default() },
///     order: BucketOrder::Global { sync: 4 },
///     seed: 7,
///     shuffle: true,
///     shuffle_batches: true,
/// };
/// let source = BucketSource::new(&lengths, config).unwrap();
/// let mut seen = Vec::new();
/// for rank in 0..2 {
///     let deal = Deal { num_replicas: 2, rank, drop_last: false };
///     let per_rank = source.elastic(2, 0, 2, false).unwrap().num_samples();
///     let (flat, _) = source.range(3, deal, None, 0..per_rank).unwrap();
///     let Indices::U32(flat) = flat else { unreachable!() };
///     seen.extend(flat);
/// }
/// seen.sort_unstable();
/// seen.dedup();
/// assert_eq!(seen, (0..1000).collect::<Vec<u32>>()); // every sample in epoch 3
/// ```
#[derive(Debug)]
pub struct BucketSource {
    plan: Arc<BucketPlan>,
    boundaries: Vec<u64>,
    order: BucketOrder,
    seed: u64,
    shuffle: bool,
    shuffle_batches: bool,
    /// The global order's kept epoch plans, oldest first.
    epochs: Mutex<Vec<(u64, Arc<EpochBatches>)>>,
}

impl BucketSource {
    /// Groups `lengths` as `config` says: the boundaries found (unless given), the buckets and
    /// their batch sizes. Errors as [`BucketPlan::new`] and [`EpochDraw`]'s `sync` do.
    pub fn new<L: Copy + Into<u64> + Send + Sync>(
        lengths: &[L],
        config: BucketConfig,
    ) -> Result<Self> {
        let mut limits = config.limits;
        limits.carry = matches!(config.order, BucketOrder::Global { .. });
        if let BucketOrder::Global { sync } = config.order {
            EpochDraw::check_sync(sync)?;
        }
        let boundaries = match config.boundaries {
            Some(b) => b,
            None if limits.carry => padding_boundaries(
                lengths,
                config.num_buckets.max(1),
                limits.quadratic.filter(|_| limits.max_tokens.is_some()),
                |l| limits.fits(l),
            ),
            None => quantile_boundaries(lengths, config.num_buckets.max(1)),
        };
        let plan = BucketPlan::new(lengths, &boundaries, limits)?;
        Ok(BucketSource {
            plan: Arc::new(plan),
            boundaries,
            order: config.order,
            seed: config.seed,
            shuffle: config.shuffle,
            shuffle_batches: config.shuffle_batches,
            epochs: Mutex::new(Vec::new()),
        })
    }

    /// The bucket boundaries in use.
    pub fn boundaries(&self) -> &[u64] {
        &self.boundaries
    }

    /// The buckets and their batch sizes.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// The order of every epoch's batches.
    pub fn order(&self) -> BucketOrder {
        self.order
    }

    /// Batches of every epoch over all ranks, before padding or cutting.
    pub fn batches(&self) -> u64 {
        self.plan.batches()
    }

    /// Per bucket: `(members, batch size, batches per epoch, longest sample)`; the last
    /// entry holds the samples longer than `max_tokens`. In the global order the members
    /// include the samples carried to the bucket and leave out those it carried on, and the
    /// longest sample is of the bucket's own (its batch size's basis).
    pub fn buckets(&self) -> Vec<(u64, u64, u64, u64)> {
        self.plan.buckets()
    }

    /// The rest of an epoch first dealt over `origin` ranks, continued on `num_replicas`
    /// ranks from global batch position `offset` (an elastic resume; `origin` ranks from
    /// position 0 is a fresh epoch on `origin` ranks).
    pub fn elastic(
        &self,
        origin: u64,
        offset: u64,
        num_replicas: u64,
        drop_last: bool,
    ) -> Result<Elastic> {
        Elastic::new(self.batches(), origin, drop_last, offset, num_replicas)
    }

    /// Bytes [`BucketSource::range`] holds at its peak for those arguments (an estimate, to
    /// refuse what cannot fit before any work): the batches, and an epoch plan it would keep.
    pub fn range_bytes(&self, epoch: u64, range: &Range<u64>) -> u64 {
        let batches = self.plan.range_bytes(range.start, range.end);
        // A kept plan another thread drops before the read is computed then unchecked: the
        // estimate is of this instant (two plans are kept, so only a third epoch's read in
        // between drops one).
        match self.order {
            BucketOrder::Global { sync }
                if matches!(self.lookup(epoch, range), EpochPlan::Whole) =>
            {
                batches.saturating_add(EpochBatches::new_bytes(&self.plan, sync))
            }
            _ => batches,
        }
    }

    /// The epochs whose global batch plans are kept, oldest first.
    pub fn kept_epochs(&self) -> Vec<u64> {
        let kept = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter().map(|(e, _)| *e).collect()
    }

    /// Samples in the plan.
    pub fn len(&self) -> u64 {
        self.plan.len()
    }

    /// Whether the plan holds no sample.
    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// Rank `deal.rank`'s batches `range` of `epoch` (of its elastic rest when `elastic`
    /// is `(origin, offset)`, see [`BucketSource::elastic`]): the indices, batch after batch,
    /// and where each batch starts in them (`range.len() + 1` offsets).
    pub fn range(
        &self,
        epoch: u64,
        deal: Deal,
        elastic: Option<(u64, u64)>,
        range: Range<u64>,
    ) -> Result<(Indices, Vec<u64>)> {
        let elastic = elastic
            .map(|(origin, offset)| self.elastic(origin, offset, deal.num_replicas, deal.drop_last))
            .transpose()?;
        match self.order {
            BucketOrder::PerRank => {
                let draw = BatchDraw {
                    seed: self.seed,
                    epoch,
                    shuffle: self.shuffle,
                    shuffle_batches: self.shuffle_batches,
                };
                match elastic {
                    None => self.plan.rank_batches_range(deal, draw, range),
                    Some(el) => self.plan.elastic_batches_range(&el, deal.rank, draw, range),
                }
            }
            BucketOrder::Global { sync } => {
                let batches = self.epoch_plan(epoch, sync, &range)?;
                match elastic {
                    None => batches.range(&self.plan, deal, range),
                    Some(el) => batches.elastic_range(&self.plan, &el, deal.rank, range),
                }
            }
        }
    }

    /// What a read of `range` of `epoch` would use as the epoch's global batch plan.
    fn lookup(&self, epoch: u64, range: &Range<u64>) -> EpochPlan {
        let kept = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.iter().find(|(e, _)| *e == epoch) {
            Some((_, plan)) => EpochPlan::Kept(Arc::clone(plan)),
            None if range.end.saturating_sub(range.start) <= FEW => EpochPlan::Lazy,
            None => EpochPlan::Whole,
        }
    }

    /// `epoch`'s global batch plan: the kept one; for a few batches one that cuts only the
    /// buckets read; else computed whole and kept (the oldest of [`EPOCH_PLANS`] dropped).
    fn epoch_plan(&self, epoch: u64, sync: u64, range: &Range<u64>) -> Result<Arc<EpochBatches>> {
        let draw = EpochDraw {
            seed: self.seed,
            epoch,
            shuffle: self.shuffle,
            shuffle_batches: self.shuffle_batches,
            sync,
        };
        match self.lookup(epoch, range) {
            EpochPlan::Kept(plan) => Ok(plan),
            EpochPlan::Lazy => Ok(Arc::new(EpochBatches::lazy(&self.plan, draw)?)),
            EpochPlan::Whole => {
                // Computed unlocked (reads of other epochs go on meanwhile); a plan of the
                // same epoch computed by another thread in between is kept once.
                let plan = Arc::new(EpochBatches::new(&self.plan, draw)?);
                let mut kept = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
                if !kept.iter().any(|(e, _)| *e == epoch) {
                    if kept.len() >= EPOCH_PLANS {
                        kept.remove(0);
                    }
                    kept.push((epoch, Arc::clone(&plan)));
                }
                Ok(plan)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths() -> Vec<u32> {
        (0..3000u32).map(|i| 5 + (i * 7919) % 700).collect()
    }

    fn config(order: BucketOrder) -> BucketConfig {
        BucketConfig {
            boundaries: None,
            num_buckets: 8,
            limits: Limits {
                max_tokens: Some(5000),
                ..Limits::default()
            },
            order,
            seed: 11,
            shuffle: true,
            shuffle_batches: true,
        }
    }

    const DEAL: Deal = Deal {
        num_replicas: 3,
        rank: 1,
        drop_last: false,
    };

    #[test]
    fn each_order_reads_what_its_algorithm_computes() {
        let lengths = lengths();
        let per_rank = BucketSource::new(&lengths, config(BucketOrder::PerRank)).unwrap();
        let limits = config(BucketOrder::PerRank).limits;
        let bounds = quantile_boundaries(&lengths, 8);
        let plan = BucketPlan::new(&lengths, &bounds, limits).unwrap();
        let draw = BatchDraw {
            seed: 11,
            epoch: 2,
            ..BatchDraw::default()
        };
        assert_eq!(per_rank.boundaries(), &bounds[..]);
        assert_eq!(per_rank.batches(), plan.batches());
        assert_eq!(
            per_rank.range(2, DEAL, None, 0..5).unwrap(),
            plan.rank_batches_range(DEAL, draw, 0..5).unwrap()
        );

        let global = BucketSource::new(&lengths, config(BucketOrder::Global { sync: 4 })).unwrap();
        let limits = Limits {
            carry: true,
            ..limits
        };
        let bounds = padding_boundaries(&lengths, 8, None, |l| limits.fits(l));
        let plan = BucketPlan::new(&lengths, &bounds, limits).unwrap();
        let epoch = EpochBatches::new(
            &plan,
            EpochDraw {
                seed: 11,
                epoch: 2,
                sync: 4,
                ..EpochDraw::default()
            },
        )
        .unwrap();
        assert_eq!(global.batches(), plan.batches());
        let whole = global.elastic(3, 0, 3, false).unwrap().num_samples();
        for range in [0..2, 0..whole, 3..whole] {
            assert_eq!(
                global.range(2, DEAL, None, range.clone()).unwrap(),
                epoch.range(&plan, DEAL, range).unwrap()
            );
        }
    }

    #[test]
    fn the_global_order_keeps_two_epoch_plans_and_none_for_a_few_batches() {
        let global =
            BucketSource::new(&lengths(), config(BucketOrder::Global { sync: 8 })).unwrap();
        global.range(0, DEAL, None, 0..FEW).unwrap();
        assert!(global.kept_epochs().is_empty()); // a few batches: their buckets cut alone
        assert!(global.range_bytes(0, &(0..FEW + 1)) > global.range_bytes(0, &(0..FEW)));
        for epoch in [0, 1, 0, 2] {
            global.range(epoch, DEAL, None, 0..FEW + 1).unwrap();
        }
        assert_eq!(global.kept_epochs(), vec![1, 2]); // oldest dropped; a kept one reused
                                                      // A kept plan is read, not computed again: no epoch plan in the estimate.
        assert_eq!(
            global.range_bytes(2, &(0..FEW + 1)),
            global.plan().range_bytes(0, FEW + 1)
        );
    }

    #[test]
    fn the_order_sets_the_carried_tails_and_refuses_a_bad_run_length() {
        let lengths = lengths();
        let per_rank = BucketSource::new(&lengths, config(BucketOrder::PerRank)).unwrap();
        let global = BucketSource::new(&lengths, config(BucketOrder::Global { sync: 1 })).unwrap();
        assert!(!per_rank.plan().limits().carry);
        assert!(global.plan().limits().carry);
        let err = BucketSource::new(&lengths, config(BucketOrder::Global { sync: 6 })).unwrap_err();
        assert!(
            err.to_string().contains("sync must be a power of two"),
            "{err}"
        );
    }
}

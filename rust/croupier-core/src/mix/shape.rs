//! How many positions a mixture's epoch has on a number of ranks, in each order, and where
//! the positions of a resume fall: the arithmetic that a mixture sampler's length, its weight
//! schedules and its elastic resumes share.

use crate::deal::{check_num_replicas, Layout, Order};
use crate::error::{Error, Result};
use crate::mix::pass_shares;

/// Positions a global-order mixture reads per piece while iterating: it reads any range by
/// random access, so a share is streamed in windows of this many positions. Each read walks
/// the phase's tree from its root, so windows are long (4-8 MiB of indices).
pub const GLOBAL_WINDOW: u64 = 1 << 20;

/// The positions of a mixture's epochs: datasets of `sizes`, an epoch of `num_samples`
/// positions per rank or the order's default length, in the global or the per-rank order.
///
/// # Examples
///
/// ```
/// use croupier_core::mix::EpochShape;
/// use croupier_core::Order;
///
/// let global = EpochShape::new(vec![100, 50], None, Order::Global, false).unwrap();
/// assert_eq!(global.positions(4).unwrap(), 150); // one global sequence: every sample once
/// assert_eq!(global.rank_length(4).unwrap(), 38); // dealt as torch deals 150 over 4 ranks
/// let per_rank = EpochShape::new(vec![100, 50], None, Order::PerRank, false).unwrap();
/// assert_eq!(per_rank.positions(4).unwrap(), 25 + 13); // each rank: its share of each pass
/// assert_eq!(per_rank.rank_length(4).unwrap(), 38);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochShape {
    sizes: Vec<u64>,
    num_samples: Option<u64>,
    global: bool,
    drop_last: bool,
}

impl EpochShape {
    /// The shape of a mixture of datasets of `sizes` in `order` ([`Order::Global`] or
    /// [`Order::PerRank`], the per-rank order): `num_samples` positions per rank, or `None` for
    /// the order's default (every dataset once in the global order; each rank's share of one
    /// pass of every dataset in the per-rank one).
    pub fn new(
        sizes: Vec<u64>,
        num_samples: Option<u64>,
        order: Order,
        drop_last: bool,
    ) -> Result<Self> {
        let global = match order {
            Order::Global => true,
            Order::PerRank => false,
            Order::Torch(_) => {
                return Err(Error::out_of_range(
                    "order",
                    "the global or the per-rank order (a mixture has no torch order)",
                    "torch",
                ))
            }
        };
        Ok(EpochShape {
            sizes,
            num_samples,
            global,
            drop_last,
        })
    }

    /// The positions of an epoch on `num_replicas` ranks that phases and schedules count: in
    /// the global order the global sequence's (`sum(sizes)`, or `num_samples` per rank), in
    /// the per-rank order each rank's (one pass of every dataset's share, or `num_samples`).
    pub fn positions(&self, num_replicas: u64) -> Result<u64> {
        check_num_replicas(num_replicas)?;
        match (self.global, self.num_samples) {
            (true, None) => self.total(),
            (true, Some(per_rank)) => per_rank
                .checked_mul(num_replicas)
                .ok_or_else(|| too_long(per_rank, num_replicas)),
            (false, Some(per_rank)) => Ok(per_rank),
            (false, None) => pass_shares(&self.sizes, num_replicas, self.drop_last)?
                .into_iter()
                .try_fold(0u64, u64::checked_add)
                .ok_or_else(|| too_long(u64::MAX, 1)),
        }
    }

    /// Positions per rank in an epoch on `num_replicas` ranks (the sampler's `len`).
    pub fn rank_length(&self, num_replicas: u64) -> Result<u64> {
        let positions = self.positions(num_replicas)?;
        if self.global {
            Ok(Layout::new(positions, num_replicas, self.drop_last)?.num_samples())
        } else {
            Ok(positions)
        }
    }

    /// The schedule position at which every one of `num_replicas` ranks resumes at its own
    /// position `at`: `at` itself in the per-rank order; `at * num_replicas` in the global
    /// one, the first global position no rank has consumed.
    pub fn schedule_position(&self, at: u64, num_replicas: u64) -> Result<u64> {
        if !self.global {
            return Ok(at);
        }
        at.checked_mul(num_replicas)
            .ok_or_else(|| too_long(at, num_replicas))
    }

    /// Global positions of an epoch first dealt over `origin` ranks: in the global order the
    /// global sequence (or what `drop_last` keeps of it there); in the per-rank order every
    /// rank's sequence, rank after rank.
    pub fn global_end(&self, origin: u64) -> Result<u64> {
        if self.global {
            let positions = self.positions(origin)?;
            return Ok(Layout::new(positions, origin, self.drop_last)?.epoch_end());
        }
        self.rank_length(origin)?
            .checked_mul(origin)
            .ok_or_else(|| too_long(self.rank_length(origin).unwrap_or(0), origin))
    }

    /// Positions worth computing at a time while iterating ([`GLOBAL_WINDOW`] in the global
    /// order; `None` in the per-rank order, which computes a rank's epoch whole).
    pub fn window(&self) -> Option<u64> {
        self.global.then_some(GLOBAL_WINDOW)
    }

    fn total(&self) -> Result<u64> {
        self.sizes
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .ok_or_else(|| too_long(u64::MAX, 1))
    }
}

fn too_long(per_rank: u64, num_replicas: u64) -> Error {
    Error::out_of_range(
        "the epoch",
        "at most 2**64 - 1 positions",
        format!("{per_rank} x {num_replicas}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orders_count_positions_as_the_sampler_documents() {
        let sizes = vec![10, 7, 3];
        let global = EpochShape::new(sizes.clone(), None, Order::Global, false).unwrap();
        let per_rank = EpochShape::new(sizes.clone(), None, Order::PerRank, true).unwrap();
        let fixed = EpochShape::new(sizes, Some(6), Order::Global, true).unwrap();
        assert_eq!(global.positions(3).unwrap(), 20);
        assert_eq!(global.rank_length(3).unwrap(), 7); // ceil(20 / 3)
        assert_eq!(global.global_end(3).unwrap(), 20); // padding is no position
        assert_eq!(per_rank.positions(3).unwrap(), 3 + 2 + 1); // floor shares, drop_last
        assert_eq!(per_rank.global_end(3).unwrap(), 18);
        assert_eq!(per_rank.schedule_position(4, 3).unwrap(), 4);
        assert_eq!(fixed.positions(3).unwrap(), 18);
        assert_eq!(fixed.schedule_position(4, 3).unwrap(), 12);
        assert_eq!(
            (global.window(), per_rank.window()),
            (Some(GLOBAL_WINDOW), None)
        );
    }

    #[test]
    fn overflow_and_the_torch_order_are_refused() {
        let huge = EpochShape::new(vec![1], Some(u64::MAX / 2), Order::Global, false).unwrap();
        assert!(huge.positions(3).is_err());
        assert!(huge.schedule_position(u64::MAX / 2, 3).is_err());
        assert!(EpochShape::new(vec![1], None, Order::Global, false)
            .unwrap()
            .positions(0)
            .is_err());
        let torch = Order::Torch(crate::TorchRandperm::Forward);
        assert!(EpochShape::new(vec![1], None, torch, false).is_err());
    }
}

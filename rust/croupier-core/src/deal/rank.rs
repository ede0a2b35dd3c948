//! A rank's positions in an epoch: the entry points that choose between the orders.
//!
//! Without shuffling the global order is `0, 1, …, n-1`; with it, the epoch's [`Order`]:
//! croupier's own (`Order::PerRank`, a rank's share computed alone by [`crate::deal::fast_share`]) or
//! torch's (`Order::Torch`, the whole `randperm` of [`crate::shuffle::torch_randperm()`], then
//! the rank's positions taken from it). Padding, `drop_last` and striding are torch's in every
//! case ([`crate::deal::layout`]).

use crate::cancel::cancelled;
use crate::deal::fast_share;
use crate::deal::layout::{sequential_share, take_rank_share, Layout};
use crate::draw::random_access::RandomAccessPermutation;
use crate::error::Result;
use crate::index::{index_bytes, keep_range, Index, Indices, U32_MAX_LEN};

/// The first piece of a call in the world-size-invariant order.
const GLOBAL_FIRST: u64 = 1 << 10;
use crate::shuffle::torch_randperm;
use std::ops::Range;

/// Which global order an epoch follows when shuffling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// croupier's own order (`deal::fast_share`): uniform like torch's, but each rank computes
    /// only its own share.
    PerRank,
    /// torch's order: `torch.randperm(n)` seeded with `seed + epoch`
    /// ([`crate::shuffle::torch_randperm()`]), as the given torch releases compute it.
    Torch(torch_randperm::TorchRandperm),
    /// The world-size-invariant order: one keyed permutation of `[0, n)` per epoch
    /// ([`RandomAccessPermutation`]), the same whatever the number of ranks, of which each
    /// rank computes only its own positions, by random access.
    Global,
}

fn torch_share<T: Index>(
    layout: &Layout,
    rank: u64,
    variant: torch_randperm::TorchRandperm,
    seed: u64,
    epoch: u64,
) -> Result<Vec<T>> {
    let order = torch_randperm::sampler_order::<T>(layout.n(), variant, seed, epoch)?;
    if cancelled() {
        return Ok(Vec::new()); // stopped early: the caller discards the result
    }
    Ok(take_rank_share(order, layout, rank))
}

/// How an epoch's global order is drawn: shuffled or not, in which [`Order`], and the seed and
/// epoch that key the shuffle. Without `shuffle` the order is `0, 1, …, n-1` and the other
/// fields are not read.
///
/// The default is `croupier.DistributedSampler`'s: shuffled in the world-size-invariant order
/// ([`Order::Global`]), seed 0, epoch 0.
///
/// # Examples
///
/// ```
/// use croupier_core::{Draw, Order};
///
/// let draw = Draw { seed: 7, epoch: 3, ..Draw::default() };
/// assert!(draw.shuffle && draw.order == Order::Global);
/// assert_eq!((draw.seed, draw.epoch), (7, 3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// Whether the global order is shuffled (else it is `0, 1, …, n-1`).
    pub shuffle: bool,
    /// The shuffled order: croupier's or torch's.
    pub order: Order,
    /// The seed of the shuffle.
    pub seed: u64,
    /// The epoch: each epoch of a seed is its own shuffle.
    pub epoch: u64,
}

impl Default for Draw {
    fn default() -> Self {
        Draw {
            shuffle: true,
            order: Order::Global,
            seed: 0,
            epoch: 0,
        }
    }
}

impl Draw {
    /// The per-rank order keyed by `key` alone (epoch 0): the permutations the buckets draw, keyed
    /// by a stream of their own.
    pub(crate) fn keyed(key: u64) -> Self {
        Draw {
            shuffle: true,
            order: Order::PerRank,
            seed: key,
            epoch: 0,
        }
    }
}

fn share_range<T: Index>(
    layout: &Layout,
    rank: u64,
    draw: Draw,
    (start, stop): (u64, u64),
) -> Result<Vec<T>> {
    if !draw.shuffle {
        return sequential_share(layout, rank, start, stop);
    }
    let (seed, epoch) = (draw.seed, draw.epoch);
    match draw.order {
        Order::PerRank => fast_share::fast_share(layout, rank, seed, epoch, start, stop),
        Order::Global => RandomAccessPermutation::new(layout.n(), seed, epoch).rank_positions(
            (0, layout.n()),
            (rank, layout.num_replicas()),
            (start, stop),
        ),
        Order::Torch(variant) => {
            let mut v = torch_share::<T>(layout, rank, variant, seed, epoch)?;
            keep_range(&mut v, start as usize, (stop - start) as usize);
            v.shrink_to_fit();
            Ok(v)
        }
    }
}

/// Positions `range` (`start..stop`, with `0 <= start <= stop <= num_samples`) of the sequence
/// rank `rank` receives in the epoch `draw` describes.
///
/// With `draw.shuffle`, the global order is the epoch's `draw.order`; without, it is
/// `0, 1, …, n-1` (in both orders, as in torch). Padding, `drop_last` and striding follow
/// torch (see [`Layout`]). `order="per_rank"` computes only the blocks holding the positions asked
/// for; the other modes compute the whole share and cut it.
///
/// # Examples
///
/// ```
/// use croupier_core::{rank_range, Draw, Indices, Layout};
///
/// // 10 samples on 4 ranks: 3 each, the first two repeated as torch pads.
/// let layout = Layout::new(10, 4, false).unwrap();
/// let draw = Draw { seed: 5, ..Draw::default() };
/// let mut seen = Vec::new();
/// for rank in 0..4 {
///     let Indices::U32(v) = rank_range(&layout, rank, draw, 0..3).unwrap() else {
///         unreachable!()
///     };
///     assert_eq!(v.len(), 3);
///     seen.extend(v);
/// }
/// seen.sort_unstable();
/// seen.dedup();
/// assert_eq!(seen, (0..10).collect::<Vec<u32>>()); // every sample dealt
/// // Unshuffled, rank 1 takes positions 1, 5, 9 as torch deals them.
/// let plain = Draw { shuffle: false, ..draw };
/// let Indices::U32(v) = rank_range(&layout, 1, plain, 0..3).unwrap() else {
///     unreachable!()
/// };
/// assert_eq!(v, [1, 5, 9]);
/// assert!(rank_range(&layout, 4, draw, 0..3).is_err()); // no rank 4 of 4
/// ```
pub fn rank_range(layout: &Layout, rank: u64, draw: Draw, range: Range<u64>) -> Result<Indices> {
    let Range { start, end: stop } = range;
    layout.check_rank(rank)?;
    layout.check_range(start, stop)?;
    Ok(if layout.n() <= U32_MAX_LEN {
        Indices::U32(share_range(layout, rank, draw, (start, stop))?)
    } else {
        Indices::U64(share_range(layout, rank, draw, (start, stop))?)
    })
}

/// Whether a [`rank_range`] call with these arguments runs on the calling thread alone,
/// touching no thread pool (rayon's global one included): ranges of at most 16,384
/// positions unshuffled or in the global order (a first window, a resume's first index).
/// A caller may then run it inline, without waking (or, in a fresh process, starting) a pool;
/// `tests/no_pool_when_inline.rs` checks that such calls leave rayon's global pool unbuilt.
///
/// # Examples
///
/// ```
/// use croupier_core::{rank_range_is_inline, Draw, Order};
///
/// let global = Draw { order: Order::Global, ..Draw::default() };
/// assert!(rank_range_is_inline(global, 0..1024));
/// assert!(!rank_range_is_inline(global, 0..1 << 16));
/// let per_rank = Draw { order: Order::PerRank, ..Draw::default() };
/// assert!(!rank_range_is_inline(per_rank, 0..64));
/// ```
pub fn rank_range_is_inline(draw: Draw, range: Range<u64>) -> bool {
    let short = range.end.saturating_sub(range.start) <= INLINE_POSITIONS;
    short && (!draw.shuffle || draw.order == Order::Global)
}

/// The longest [`rank_range_is_inline`] range: one task of the random-access fill, which
/// runs on the calling thread up to this length (and a sequential deal, which always does).
const INLINE_POSITIONS: u64 = crate::draw::random_access::TASK as u64;

/// Bytes a [`rank_range`] call with these arguments holds at its peak: the positions asked
/// for, and whatever is computed whole to reach them (the blocks holding them in
/// `order="per_rank"`, the whole permutation of `n` in torch's order). An estimate, so that a call
/// that cannot fit is refused before any work.
///
/// # Examples
///
/// ```
/// use croupier_core::{rank_range_bytes, Draw, Layout, Order, TorchRandperm};
///
/// let layout = Layout::new(1000, 4, false).unwrap();
/// let plain = Draw { shuffle: false, ..Draw::default() };
/// assert_eq!(rank_range_bytes(&layout, 0, plain, 0..250), 1000); // 250 u32
/// // torch's order builds the whole permutation, whatever the range.
/// let torch = Draw { order: Order::Torch(TorchRandperm::Forward), ..Draw::default() };
/// assert_eq!(rank_range_bytes(&layout, 0, torch, 0..1), 4000);
/// ```
pub fn rank_range_bytes(layout: &Layout, rank: u64, draw: Draw, range: Range<u64>) -> u64 {
    let elem = index_bytes(layout.n());
    let (start, stop) = (range.start, range.end.max(range.start));
    match (draw.shuffle, draw.order) {
        (false, _) => (stop - start).saturating_mul(elem),
        (true, Order::PerRank) => fast_share::fast_share_bytes(layout, rank, start, stop),
        (true, Order::Torch(_)) => layout.n().saturating_mul(elem),
        (true, Order::Global) => (stop - start).saturating_mul(elem),
    }
}

/// The indices rank `rank` receives in the epoch `draw` describes, in the order it receives
/// them: all of [`rank_range`].
#[cfg(test)]
pub(crate) fn rank_indices(layout: &Layout, rank: u64, draw: Draw) -> Result<Indices> {
    rank_range(layout, rank, draw, 0..layout.num_samples())
}

/// Where a call that starts at `start` should stop to hand out its first index soonest: in
/// `order="per_rank"` with shuffling the end of the block holding `start`, or at most
/// `RANDOM_ACCESS_MAX` (64) positions on inside a long block (read by random
/// access); `num_samples` otherwise.
///
/// # Examples
///
/// ```
/// use croupier_core::{first_stop, Layout, Order};
///
/// let layout = Layout::new(1_000_000, 8, false).unwrap();
/// let stop = first_stop(&layout, 3, true, Order::PerRank, 0).unwrap();
/// assert!(0 < stop && stop <= layout.num_samples()); // a short first piece
/// assert_eq!(first_stop(&layout, 3, false, Order::PerRank, 0).unwrap(), 125_000);
/// ```
pub fn first_stop(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    start: u64,
) -> Result<u64> {
    layout.check_rank(rank)?;
    if shuffle && order == Order::PerRank {
        fast_share::first_stop(layout, rank, start.min(layout.num_samples()))
    } else if shuffle && order == Order::Global {
        // Any range costs its length: a short first piece.
        Ok(start.saturating_add(GLOBAL_FIRST).min(layout.num_samples()))
    } else {
        Ok(layout.num_samples())
    }
}

//! A rank's positions in an epoch: the entry points that choose between the orders.
//!
//! Without shuffling the global order is `0, 1, …, n-1`; with it, the epoch's [`Order`]:
//! croupier's own (`Order::Fast`, a rank's share computed alone by [`crate::deal::fast_share`]) or
//! torch's (`Order::Torch`, the whole `randperm` of [`crate::shuffle::torch_randperm()`], then
//! the rank's positions taken from it). Padding, `drop_last` and striding are torch's in every
//! case ([`crate::deal::layout`]).

use crate::cancel::cancelled;
use crate::deal::fast_share;
use crate::deal::layout::{sequential_share, take_rank_share, Layout};
use crate::error::Result;
use crate::index::{index_bytes, keep_range, Index, Indices, U32_MAX_LEN};
use crate::shuffle::torch_randperm;

/// Which global order an epoch follows when shuffling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// croupier's own order (`deal::fast_share`): uniform like torch's, but each rank computes
    /// only its own share.
    Fast,
    /// torch's order: `torch.randperm(n)` seeded with `seed + epoch`
    /// ([`crate::shuffle::torch_randperm()`]), as the given torch releases compute it.
    Torch(torch_randperm::TorchRandperm),
}

fn torch_share<T: Index>(
    layout: &Layout,
    rank: u64,
    variant: torch_randperm::TorchRandperm,
    seed: u64,
    epoch: u64,
) -> Result<Vec<T>> {
    let order = torch_randperm::sampler_order(layout.n(), variant, seed, epoch)?;
    if cancelled() {
        return Ok(Vec::new()); // stopped early: the caller discards the result
    }
    // The element type follows n in both places, so this conversion never copies in practice.
    let order: Vec<T> = match order {
        Indices::U32(v) => v.into_iter().map(|x| T::from_u64(x.into())).collect(),
        Indices::U64(v) => v.into_iter().map(T::from_u64).collect(),
    };
    Ok(take_rank_share(order, layout, rank))
}

fn share_range<T: Index>(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    (seed, epoch): (u64, u64),
    (start, stop): (u64, u64),
) -> Result<Vec<T>> {
    if !shuffle {
        return sequential_share(layout, rank, start, stop);
    }
    match order {
        Order::Fast => fast_share::fast_share(layout, rank, seed, epoch, start, stop),
        Order::Torch(variant) => {
            let mut v = torch_share::<T>(layout, rank, variant, seed, epoch)?;
            keep_range(&mut v, start as usize, (stop - start) as usize);
            v.shrink_to_fit();
            Ok(v)
        }
    }
}

/// Positions `[start, stop)` of the sequence rank `rank` receives in epoch `epoch`, with
/// `0 <= start <= stop <= num_samples`.
///
/// With `shuffle`, the global order is the epoch's `order`; without, it is `0, 1, …, n-1` (in
/// both orders, as in torch). Padding, `drop_last` and striding follow torch (see [`Layout`]).
/// `order="fast"` computes only the blocks holding the positions asked for; the other modes
/// compute the whole share and cut it.
///
/// ```
/// use croupier_core::{rank_range, Indices, Layout, Order};
///
/// // 10 samples on 4 ranks: 3 each, the first two repeated as torch pads.
/// let layout = Layout::new(10, 4, false).unwrap();
/// let mut seen = Vec::new();
/// for rank in 0..4 {
///     let share = rank_range(&layout, rank, true, Order::Fast, 0, 5, 0, 3).unwrap();
///     let Indices::U32(v) = share else { unreachable!() };
///     assert_eq!(v.len(), 3);
///     seen.extend(v);
/// }
/// seen.sort_unstable();
/// seen.dedup();
/// assert_eq!(seen, (0..10).collect::<Vec<u32>>()); // every sample dealt
/// // Unshuffled, rank 1 takes positions 1, 5, 9 as torch deals them.
/// let Indices::U32(v) = rank_range(&layout, 1, false, Order::Fast, 0, 0, 0, 3).unwrap() else {
///     unreachable!()
/// };
/// assert_eq!(v, [1, 5, 9]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn rank_range(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    seed: u64,
    epoch: u64,
    start: u64,
    stop: u64,
) -> Result<Indices> {
    layout.check_rank(rank)?;
    layout.check_range(start, stop)?;
    let range = ((seed, epoch), (start, stop));
    Ok(if layout.n() <= U32_MAX_LEN {
        Indices::U32(share_range(layout, rank, shuffle, order, range.0, range.1)?)
    } else {
        Indices::U64(share_range(layout, rank, shuffle, order, range.0, range.1)?)
    })
}

/// Bytes a [`rank_range`] call with these arguments holds at its peak: the positions asked
/// for, and whatever is computed whole to reach them (the blocks holding them in
/// `order="fast"`, the whole permutation of `n` in torch's order). An estimate, so that a call
/// that cannot fit is refused before any work.
///
/// ```
/// use croupier_core::{rank_range_bytes, Layout, Order};
///
/// let layout = Layout::new(1000, 4, false).unwrap();
/// assert_eq!(rank_range_bytes(&layout, 0, false, Order::Fast, 0, 250), 1000); // 250 u32
/// ```
pub fn rank_range_bytes(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    start: u64,
    stop: u64,
) -> u64 {
    let elem = index_bytes(layout.n());
    let stop = stop.max(start);
    match (shuffle, order) {
        (false, _) => (stop - start).saturating_mul(elem),
        (true, Order::Fast) => fast_share::fast_share_bytes(layout, rank, start, stop),
        (true, Order::Torch(_)) => layout.n().saturating_mul(elem),
    }
}

/// The indices rank `rank` receives in epoch `epoch`, in the order it receives them: all of
/// [`rank_range`].
#[cfg(test)]
pub(crate) fn rank_indices(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    seed: u64,
    epoch: u64,
) -> Result<Indices> {
    rank_range(
        layout,
        rank,
        shuffle,
        order,
        seed,
        epoch,
        0,
        layout.num_samples(),
    )
}

/// Where a call that starts at `start` should stop to hand out its first index soonest: in
/// `order="fast"` with shuffling the end of the block holding `start`, or at most
/// `RANDOM_ACCESS_MAX` (64) positions on inside a long block (read by random
/// access); `num_samples` otherwise.
///
/// ```
/// use croupier_core::{first_stop, Layout, Order};
///
/// let layout = Layout::new(1_000_000, 8, false).unwrap();
/// let stop = first_stop(&layout, 3, true, Order::Fast, 0).unwrap();
/// assert!(0 < stop && stop <= layout.num_samples()); // a short first piece
/// assert_eq!(first_stop(&layout, 3, false, Order::Fast, 0).unwrap(), 125_000);
/// ```
pub fn first_stop(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    start: u64,
) -> Result<u64> {
    layout.check_rank(rank)?;
    if shuffle && order == Order::Fast {
        fast_share::first_stop(layout, rank, start.min(layout.num_samples()))
    } else {
        Ok(layout.num_samples())
    }
}

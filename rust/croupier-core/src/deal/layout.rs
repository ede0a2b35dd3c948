//! Dealing an epoch to data-parallel ranks with torch's `DistributedSampler` arithmetic.
//!
//! An epoch has a global order `order` of `[0, n)`. Its global sequence has `total_size`
//! positions and position `p` holds `order[p mod n]`: with `drop_last=False` the order is padded
//! by repeating its head (cyclically, when the padding is longer than `n`), with
//! `drop_last=True` it is cut to a multiple of the number of ranks. Rank `r` of `W` takes
//! positions `r, r+W, r+2W, …`, so every rank gets `num_samples` indices.
//!
//! These are exactly the rules of `torch.utils.data.DistributedSampler`:
//! `num_samples = ceil((n - W) / W)` when dropping an uneven tail (which is `floor(n / W)`, and
//! 0 when `n < W`), `ceil(n / W)` otherwise, and `total_size = num_samples * W`. torch computes
//! these with float division, which is inexact beyond 2**53 samples; croupier uses exact integer
//! arithmetic, so the two agree wherever torch's own arithmetic is exact.

use crate::deal::share;
use crate::error::{Error, Result};
use crate::index::{
    check_len, keep_range, try_with_capacity, Index, Indices, MAX_LEN, U32_MAX_LEN,
};
use crate::shuffle::torch_randperm;

/// How one epoch of `n` samples is dealt to `num_replicas` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    n: u64,
    num_replicas: u64,
    drop_last: bool,
}

impl Layout {
    /// A layout; `n` in `[0, 2**63 - 1]`, `num_replicas` in `[1, 2**63 - 1]`.
    pub fn new(n: u64, num_replicas: u64, drop_last: bool) -> Result<Self> {
        check_len("dataset length", n)?;
        if num_replicas == 0 || num_replicas > MAX_LEN {
            return Err(Error::out_of_range(
                "num_replicas",
                "in [1, 2**63 - 1]",
                num_replicas,
            ));
        }
        Ok(Layout {
            n,
            num_replicas,
            drop_last,
        })
    }

    /// Number of samples in the dataset.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// Whether the uneven tail is cut instead of padded.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Number of ranks.
    pub fn num_replicas(&self) -> u64 {
        self.num_replicas
    }

    /// Indices each rank receives per epoch (torch's `num_samples`, its `__len__`).
    pub fn num_samples(&self) -> u64 {
        let (q, rem) = (self.n / self.num_replicas, self.n % self.num_replicas);
        if self.drop_last || rem == 0 {
            q
        } else {
            q + 1
        }
    }

    /// Length of the padded or cut global sequence (torch's `total_size`).
    pub fn total_size(&self) -> u64 {
        // num_samples * W <= n + W - 1 < 2**64 by the bounds in `new`.
        self.num_samples() * self.num_replicas
    }

    /// Checks `rank` against `[0, num_replicas)`.
    pub fn check_rank(&self, rank: u64) -> Result<()> {
        if rank >= self.num_replicas {
            return Err(Error::out_of_range(
                "rank",
                format!("in [0, num_replicas) = [0, {})", self.num_replicas),
                rank,
            ));
        }
        Ok(())
    }

    /// Checks a range of positions of a rank's sequence: `start <= stop <= num_samples`.
    pub fn check_range(&self, start: u64, stop: u64) -> Result<()> {
        let ns = self.num_samples();
        if start > stop || stop > ns {
            return Err(Error::out_of_range(
                "start, stop",
                format!("0 <= start <= stop <= num_samples = {ns}"),
                format!("{start}, {stop}"),
            ));
        }
        Ok(())
    }

    /// How many of `rank`'s positions hold a first occurrence (position `< n`), the rest being
    /// padding.
    fn first_occurrences(&self, rank: u64) -> u64 {
        if rank >= self.n {
            return 0;
        }
        ((self.n - rank - 1) / self.num_replicas + 1).min(self.num_samples())
    }
}

/// Replaces the epoch's `order` by `rank`'s share of it, in place: no second buffer of size `n`.
fn take_rank_share<T: Index>(mut order: Vec<T>, layout: &Layout, rank: u64) -> Vec<T> {
    let (n, w) = (layout.n, layout.num_replicas);
    let real = layout.first_occurrences(rank);
    // Padding positions read from the head of `order`, which the compaction below overwrites,
    // so read them first. A rank has at most one padding position (padding < W when n >= W;
    // num_samples == 1 when n < W).
    let pads: Vec<T> = (real..layout.num_samples())
        .map(|k| order[((rank + w * k) % n) as usize])
        .collect();
    // Forward compaction is safe: the source rank + w*k is never behind the destination k.
    for k in 0..real as usize {
        order[k] = order[rank as usize + w as usize * k];
    }
    order.truncate(real as usize);
    order.extend(pads);
    order.shrink_to_fit();
    order
}

/// Positions `[start, stop)` of `rank`'s share without shuffling: position `p` holds
/// `(rank + p W) mod n`.
fn sequential_share<T: Index>(layout: &Layout, rank: u64, start: u64, stop: u64) -> Result<Vec<T>> {
    let mut v = try_with_capacity::<T>("a rank's indices", stop - start)?;
    let (n, w) = (layout.n, layout.num_replicas);
    v.extend((start..stop).map(|k| T::from_u64((rank + w * k) % n)));
    Ok(v)
}

/// Which global order an epoch follows when shuffling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// croupier's own order (`deal::share`): uniform like torch's, but each rank computes
    /// only its own share.
    Fast,
    /// torch's order: `torch.randperm(n)` seeded with `seed + epoch` ([`crate::shuffle::torch_randperm()`]), as the
    /// given torch releases compute it.
    Torch(torch_randperm::TorchRandperm),
}

fn torch_share<T: Index>(
    layout: &Layout,
    rank: u64,
    variant: torch_randperm::TorchRandperm,
    seed: u64,
    epoch: u64,
) -> Result<Vec<T>> {
    let order = torch_randperm::randperm(
        layout.n,
        torch_randperm::sampler_seed(seed, epoch)?,
        variant,
    )?;
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
        Order::Fast => share::fast_share(layout, rank, seed, epoch, start, stop),
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
/// both orders, as in torch). Padding, `drop_last` and striding follow torch (see the module
/// docs). `order="fast"` computes only the blocks holding the positions asked for; the other
/// modes compute the whole share and cut it.
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
    Ok(if layout.n <= U32_MAX_LEN {
        Indices::U32(share_range(layout, rank, shuffle, order, range.0, range.1)?)
    } else {
        Indices::U64(share_range(layout, rank, shuffle, order, range.0, range.1)?)
    })
}

/// Bytes a [`rank_range`] call with these arguments holds at its peak: the positions asked
/// for, and whatever is computed whole to reach them (the blocks holding them in
/// `order="fast"`, the whole permutation of `n` in torch's order). An estimate, so that a call
/// that cannot fit is refused before any work.
pub fn rank_range_bytes(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    start: u64,
    stop: u64,
) -> u64 {
    let elem = crate::index::index_bytes(layout.n);
    let stop = stop.max(start);
    match (shuffle, order) {
        (false, _) => (stop - start).saturating_mul(elem),
        (true, Order::Fast) => share::fast_share_bytes(layout, rank, start, stop),
        (true, Order::Torch(_)) => layout.n.saturating_mul(elem),
    }
}

/// The indices rank `rank` receives in epoch `epoch`, in the order it receives them: all of
/// [`rank_range`].
pub fn rank_indices(
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
pub fn first_stop(
    layout: &Layout,
    rank: u64,
    shuffle: bool,
    order: Order,
    start: u64,
) -> Result<u64> {
    layout.check_rank(rank)?;
    if shuffle && order == Order::Fast {
        share::first_stop(layout, rank, start.min(layout.num_samples()))
    } else {
        Ok(layout.num_samples())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TORCH: Order = Order::Torch(torch_randperm::TorchRandperm::InsideOutForLargeN);

    /// torch's DistributedSampler.__iter__, transcribed as list operations (independent of the
    /// in-place code above).
    fn torch_reference(order: &[u64], w: usize, r: usize, drop_last: bool) -> Vec<u64> {
        let n = order.len();
        let num_samples = if drop_last && n % w != 0 {
            // math.ceil((n - w) / w) on exact rationals
            let num = n as i64 - w as i64;
            num.div_euclid(w as i64) + i64::from(num.rem_euclid(w as i64) != 0)
        } else {
            (n as i64 + w as i64 - 1) / w as i64
        } as usize;
        let total = num_samples * w;
        let mut idx = order.to_vec();
        if !drop_last {
            let pad = total - n;
            if pad <= n {
                idx.extend_from_slice(&order[..pad]);
            } else {
                let reps = pad.div_ceil(n);
                let rep: Vec<u64> = (0..reps).flat_map(|_| order.iter().copied()).collect();
                idx.extend_from_slice(&rep[..pad]);
            }
        } else {
            idx.truncate(total);
        }
        assert_eq!(idx.len(), total);
        idx.iter().skip(r).step_by(w).copied().collect()
    }

    #[test]
    fn matches_torch_arithmetic_over_a_sweep() {
        for n in (1..70u64).chain([97, 128, 1009]) {
            for w in 1..=17u64 {
                for drop_last in [false, true] {
                    let layout = Layout::new(n, w, drop_last).unwrap();
                    for (shuffle, order) in [(false, Order::Fast), (true, TORCH)] {
                        let global = if shuffle {
                            torch_randperm::randperm(
                                n,
                                14,
                                torch_randperm::TorchRandperm::InsideOutForLargeN,
                            )
                            .unwrap()
                            .to_u64_vec()
                        } else {
                            (0..n).collect()
                        };
                        for r in 0..w {
                            let got = rank_indices(&layout, r, shuffle, order, 11, 3)
                                .unwrap()
                                .to_u64_vec();
                            let want = torch_reference(&global, w as usize, r as usize, drop_last);
                            assert_eq!(got, want, "n={n} w={w} r={r} drop_last={drop_last}");
                            assert_eq!(got.len() as u64, layout.num_samples());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn padding_longer_than_the_dataset_repeats_cyclically() {
        let layout = Layout::new(3, 10, false).unwrap();
        assert_eq!(layout.num_samples(), 1);
        assert_eq!(layout.total_size(), 10);
        let got: Vec<u64> = (0..10)
            .flat_map(|r| {
                rank_indices(&layout, r, false, Order::Fast, 0, 0)
                    .unwrap()
                    .to_u64_vec()
            })
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        let dropped = Layout::new(3, 10, true).unwrap();
        assert_eq!(dropped.num_samples(), 0);
        assert!(rank_indices(&dropped, 9, true, Order::Fast, 0, 0)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn empty_dataset() {
        for drop_last in [false, true] {
            let layout = Layout::new(0, 4, drop_last).unwrap();
            assert_eq!(layout.num_samples(), 0);
            assert!(rank_indices(&layout, 3, true, TORCH, 0, 0)
                .unwrap()
                .is_empty());
        }
    }

    #[test]
    fn bad_arguments_are_refused_with_their_names() {
        let e = Layout::new(10, 0, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "num_replicas must be in [1, 2**63 - 1], got 0"
        );
        let layout = Layout::new(10, 4, false).unwrap();
        let e = rank_indices(&layout, 4, true, Order::Fast, 0, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rank must be in [0, num_replicas) = [0, 4), got 4"
        );
        assert!(Layout::new(MAX_LEN + 1, 1, false).is_err());
    }

    #[test]
    fn beyond_u32_uses_u64_and_strides_exactly() {
        // n > 2**32 without shuffling: the values are computable, so check them exactly.
        let n = (1u64 << 32) + 5;
        let w = 1u64 << 20;
        let layout = Layout::new(n, w, false).unwrap();
        let r = w - 1;
        let got = rank_indices(&layout, r, false, Order::Fast, 0, 0).unwrap();
        assert!(matches!(got, Indices::U64(_)));
        let got = got.to_u64_vec();
        assert_eq!(got.len() as u64, layout.num_samples());
        assert_eq!(got[0], r);
        assert_eq!(got[1], r + w);
        // The last position is padding: total_size - 1 wraps to the head.
        assert_eq!(*got.last().unwrap(), (layout.total_size() - 1) % n);
    }
}

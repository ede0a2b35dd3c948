//! torch's `DistributedSampler` arithmetic: how an epoch's global order is padded or cut and
//! strided over data-parallel ranks, and a rank's share taken from a whole global order.
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

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::error::{Error, Result};
use crate::index::{check_len, try_with_capacity, Index, MAX_LEN};

/// How one epoch of `n` samples is dealt to `num_replicas` ranks, by torch's
/// `DistributedSampler` arithmetic: the global order is padded by repeating its head (or, with
/// `drop_last`, cut) to [`Layout::total_size`] positions, and rank `r` of `W` takes positions
/// `r, r + W, r + 2W, …`, [`Layout::num_samples`] of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    n: u64,
    num_replicas: u64,
    drop_last: bool,
}

/// Checks a number of ranks: `num_replicas` in `[1, 2**63 - 1]`. Every core function that
/// takes ranks checks them here or in [`check_world`], in the same words.
///
/// # Examples
///
/// ```
/// use croupier_core::deal::check_num_replicas;
///
/// assert!(check_num_replicas(1).is_ok());
/// let err = check_num_replicas(0).unwrap_err().to_string();
/// assert!(err.contains("num_replicas must be in [1, 2**63 - 1]"), "{err}");
/// ```
pub fn check_num_replicas(num_replicas: u64) -> Result<()> {
    if num_replicas == 0 || num_replicas > MAX_LEN {
        return Err(Error::out_of_range(
            "num_replicas",
            "in [1, 2**63 - 1]",
            num_replicas,
        ));
    }
    Ok(())
}

/// Checks a world and a rank in it: `num_replicas` in `[1, 2**63 - 1]`, `rank` in
/// `[0, num_replicas)`.
///
/// # Examples
///
/// ```
/// use croupier_core::deal::check_world;
///
/// assert!(check_world(8, 7).is_ok());
/// let err = check_world(8, 8).unwrap_err().to_string();
/// assert!(err.contains("rank must be in [0, num_replicas) = [0, 8)"), "{err}");
/// assert!(check_world(0, 0).is_err());
/// ```
pub fn check_world(num_replicas: u64, rank: u64) -> Result<()> {
    check_num_replicas(num_replicas)?;
    if rank >= num_replicas {
        return Err(Error::out_of_range(
            "rank",
            format!("in [0, num_replicas) = [0, {num_replicas})"),
            rank,
        ));
    }
    Ok(())
}

/// One rank's place in a world, as torch's `DistributedSampler` takes it: how many ranks share
/// each epoch, which of them this is, and whether an uneven tail is cut or padded. A sampler's
/// [`Layout`] is this with the number of items dealt ([`Deal::layout`]).
///
/// The default is a single process with torch's `drop_last=False`.
///
/// # Examples
///
/// ```
/// use croupier_core::Deal;
///
/// let deal = Deal { num_replicas: 4, rank: 3, ..Deal::default() };
/// assert!(deal.check().is_ok());
/// assert!(Deal { rank: 4, ..deal }.check().is_err()); // rank outside [0, 4)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deal {
    /// Number of ranks, in `[1, 2**63 - 1]`.
    pub num_replicas: u64,
    /// This rank, in `[0, num_replicas)`.
    pub rank: u64,
    /// Cut the uneven tail to a multiple of `num_replicas` instead of padding it by repeating
    /// the head.
    pub drop_last: bool,
}

impl Default for Deal {
    fn default() -> Self {
        Deal {
            num_replicas: 1,
            rank: 0,
            drop_last: false,
        }
    }
}

impl Deal {
    /// Checks the world and the rank in it ([`check_world`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Deal;
    ///
    /// assert!(Deal { num_replicas: 2, rank: 1, drop_last: true }.check().is_ok());
    /// assert!(Deal { num_replicas: 0, rank: 0, drop_last: true }.check().is_err());
    /// ```
    pub fn check(&self) -> Result<()> {
        check_world(self.num_replicas, self.rank)
    }

    /// The layout of an epoch of `n` items dealt to these ranks (the rank is not checked;
    /// [`Layout::check_rank`] does).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Deal;
    ///
    /// let deal = Deal { num_replicas: 4, rank: 0, drop_last: true };
    /// let layout = deal.layout(10).unwrap();
    /// assert_eq!(layout.num_samples() * 4, layout.total_size());
    /// assert!(layout.total_size() <= 10); // cut, not padded
    /// ```
    pub fn layout(&self, n: u64) -> Result<Layout> {
        Layout::new(n, self.num_replicas, self.drop_last)
    }
}

impl Layout {
    /// A layout; `n` in `[0, 2**63 - 1]`, `num_replicas` in `[1, 2**63 - 1]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Layout, MAX_LEN};
    ///
    /// let layout = Layout::new(10, 4, false).unwrap();
    /// assert_eq!(layout.num_samples() * 4, layout.total_size());
    /// assert!(Layout::new(10, 0, false).is_err()); // no ranks
    /// assert!(Layout::new(MAX_LEN + 1, 1, false).is_err()); // indices past int64
    /// ```
    pub fn new(n: u64, num_replicas: u64, drop_last: bool) -> Result<Self> {
        check_len("dataset length", n)?;
        check_num_replicas(num_replicas)?;
        Ok(Layout {
            n,
            num_replicas,
            drop_last,
        })
    }

    /// Number of samples in the dataset.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// let layout = Layout::new(10, 4, true).unwrap();
    /// assert_eq!(layout.n(), 10); // the dataset, before cutting
    /// assert_eq!(layout.total_size(), 8);
    /// ```
    pub fn n(&self) -> u64 {
        self.n
    }

    /// Whether the uneven tail is cut instead of padded.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// let cut = Layout::new(10, 4, true).unwrap();
    /// assert!(cut.drop_last() && cut.total_size() <= cut.n()); // cut to a multiple of 4
    /// let padded = Layout::new(10, 4, false).unwrap();
    /// assert!(!padded.drop_last() && padded.total_size() >= padded.n()); // padded to one
    /// ```
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Number of ranks.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// let layout = Layout::new(10, 4, false).unwrap();
    /// assert_eq!(layout.num_replicas(), 4);
    /// assert_eq!(layout.total_size(), layout.num_samples() * layout.num_replicas());
    /// ```
    pub fn num_replicas(&self) -> u64 {
        self.num_replicas
    }

    /// Indices each rank receives per epoch (torch's `num_samples`, its `__len__`).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// for n in 0..50 {
    ///     for w in 1..8 {
    ///         // torch's len(sampler): ceil(n / W) padded, floor(n / W) cut.
    ///         assert_eq!(Layout::new(n, w, false).unwrap().num_samples(), n.div_ceil(w));
    ///         assert_eq!(Layout::new(n, w, true).unwrap().num_samples(), n / w);
    ///     }
    /// }
    /// ```
    pub fn num_samples(&self) -> u64 {
        let (q, rem) = (self.n / self.num_replicas, self.n % self.num_replicas);
        if self.drop_last || rem == 0 {
            q
        } else {
            q + 1
        }
    }

    /// Length of the padded or cut global sequence (torch's `total_size`).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// for drop_last in [false, true] {
    ///     let layout = Layout::new(10, 4, drop_last).unwrap();
    ///     assert_eq!(layout.total_size() % 4, 0); // every rank the same number
    ///     assert!(layout.total_size().abs_diff(10) < 4); // less than one per rank padded or cut
    /// }
    /// ```
    pub fn total_size(&self) -> u64 {
        // num_samples * W <= n + W - 1 < 2**64 by the bounds in `new`.
        self.num_samples() * self.num_replicas
    }

    /// The epoch's end in this world: its `n` positions, or with `drop_last` the ones it keeps
    /// (`min(n, total_size)`). An elastic rest continues an epoch up to here.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// assert_eq!(Layout::new(10, 4, false).unwrap().epoch_end(), 10); // padding is not the epoch's
    /// assert_eq!(Layout::new(10, 4, true).unwrap().epoch_end(), 8); // the 2 cut are not either
    /// ```
    pub fn epoch_end(&self) -> u64 {
        self.n.min(self.total_size())
    }

    /// Checks `rank` against `[0, num_replicas)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Layout;
    ///
    /// let layout = Layout::new(10, 4, false).unwrap();
    /// assert!((0..4).all(|r| layout.check_rank(r).is_ok()));
    /// assert!(layout.check_rank(4).is_err());
    /// ```
    pub fn check_rank(&self, rank: u64) -> Result<()> {
        check_world(self.num_replicas, rank)
    }

    /// Checks a range of positions of a rank's sequence: `start <= stop <= num_samples`.
    pub(crate) fn check_range(&self, start: u64, stop: u64) -> Result<()> {
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
pub(super) fn take_rank_share<T: Index>(mut order: Vec<T>, layout: &Layout, rank: u64) -> Vec<T> {
    let (n, w) = (layout.n, layout.num_replicas);
    let real = layout.first_occurrences(rank);
    // Padding positions read from the head of `order`, which the compaction below overwrites,
    // so read them first. A rank has at most one padding position (padding < W when n >= W;
    // num_samples == 1 when n < W).
    let pads: Vec<T> = (real..layout.num_samples())
        .map(|k| order[((rank + w * k) % n) as usize])
        .collect();
    // Forward compaction is safe: the source rank + w*k is never behind the destination k.
    // In pieces, each looking at the cancellation flag first: at 1e9 the strided reads take
    // a noticeable part of a second (a cancelled call's result is discarded).
    let (rank, w) = (rank as usize, w as usize);
    for piece in (0..real as usize).step_by(CHECK_EVERY) {
        if cancelled() {
            return Vec::new();
        }
        for k in piece..(piece + CHECK_EVERY).min(real as usize) {
            order[k] = order[rank + w * k];
        }
    }
    order.truncate(real as usize);
    order.extend(pads);
    order.shrink_to_fit();
    order
}

/// Positions `[start, stop)` of `rank`'s share without shuffling: position `p` holds
/// `(rank + p W) mod n`.
pub(super) fn sequential_share<T: Index>(
    layout: &Layout,
    rank: u64,
    start: u64,
    stop: u64,
) -> Result<Vec<T>> {
    let mut v = try_with_capacity::<T>("a rank's indices", stop - start)?;
    let (n, w) = (layout.n, layout.num_replicas);
    v.extend((start..stop).map(|k| T::from_u64((rank + w * k) % n)));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deal::rank::{rank_indices, Draw, Order};
    use crate::index::Indices;
    use crate::shuffle::torch_randperm;

    const TORCH: Order = Order::Torch(torch_randperm::TorchRandperm::InsideOutForLargeN);
    const UNSHUFFLED: Draw = Draw {
        shuffle: false,
        order: Order::PerRank,
        seed: 0,
        epoch: 0,
    };

    /// torch's DistributedSampler.__iter__, transcribed as list operations (independent of the
    /// in-place code above).
    fn torch_reference(order: &[u64], w: usize, r: usize, drop_last: bool) -> Vec<u64> {
        let n = order.len();
        let num_samples = if drop_last && !n.is_multiple_of(w) {
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
                    for (shuffle, order) in [(false, Order::PerRank), (true, TORCH)] {
                        let draw = Draw {
                            shuffle,
                            order,
                            seed: 11,
                            epoch: 3,
                        };
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
                            let got = rank_indices(&layout, r, draw).unwrap().to_u64_vec();
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
    fn a_share_taken_in_several_pieces_is_torchs() {
        // The compaction goes in pieces of CHECK_EVERY positions (each looking at the
        // cancellation flag): shares of three pieces and a part, every rank, both ends.
        let w = 8u64;
        let n = 3 * CHECK_EVERY as u64 * w + 5;
        let global = torch_randperm::randperm(n, 14, torch_randperm::TorchRandperm::Forward)
            .unwrap()
            .to_u64_vec();
        let order = Order::Torch(torch_randperm::TorchRandperm::Forward);
        let draw = Draw {
            shuffle: true,
            order,
            seed: 11,
            epoch: 3,
        };
        for drop_last in [false, true] {
            let layout = Layout::new(n, w, drop_last).unwrap();
            for r in 0..w {
                let got = rank_indices(&layout, r, draw).unwrap().to_u64_vec();
                let want = torch_reference(&global, w as usize, r as usize, drop_last);
                assert_eq!(got, want, "r={r} drop_last={drop_last}");
            }
        }
    }

    #[test]
    fn padding_longer_than_the_dataset_repeats_cyclically() {
        let layout = Layout::new(3, 10, false).unwrap();
        assert_eq!(layout.num_samples(), 1);
        assert_eq!(layout.total_size(), 10);
        let got: Vec<u64> = (0..10)
            .flat_map(|r| rank_indices(&layout, r, UNSHUFFLED).unwrap().to_u64_vec())
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        let dropped = Layout::new(3, 10, true).unwrap();
        assert_eq!(dropped.num_samples(), 0);
        assert!(rank_indices(&dropped, 9, Draw::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn empty_dataset() {
        for drop_last in [false, true] {
            let layout = Layout::new(0, 4, drop_last).unwrap();
            assert_eq!(layout.num_samples(), 0);
            let torch = Draw {
                order: TORCH,
                ..Draw::default()
            };
            assert!(rank_indices(&layout, 3, torch).unwrap().is_empty());
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
        let e = rank_indices(&layout, 4, Draw::default()).unwrap_err();
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
        let got = rank_indices(&layout, r, UNSHUFFLED).unwrap();
        assert!(matches!(got, Indices::U64(_)));
        let got = got.to_u64_vec();
        assert_eq!(got.len() as u64, layout.num_samples());
        assert_eq!(got[0], r);
        assert_eq!(got[1], r + w);
        // The last position is padding: total_size - 1 wraps to the head.
        assert_eq!(*got.last().unwrap(), (layout.total_size() - 1) % n);
    }
}

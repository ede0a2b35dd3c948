//! An epoch continued on a different number of ranks (an elastic resume).
//!
//! Every rank of a `DistributedSampler` takes positions `r, r + W, …` of one global order, and
//! ranks advance in lockstep, so what `W` ranks consumed after `p` positions each is the
//! global order's prefix of `p W` positions. An elastic epoch keeps the epoch's global order
//! `π` (as drawn for the world size the epoch started with, `W₀`) and deals its positions
//! `[O, E)` to the `W` new ranks with torch's arithmetic: rank `r` takes `O + r + k W`; with
//! `drop_last` each rank takes `⌊(E - O) / W⌋`, otherwise `⌈(E - O) / W⌉` and the positions
//! past `E` repeat the remainder's head, `O + (h mod (E - O))`, as torch pads. `E` is the
//! epoch's end in the original world: `n`, or `W₀ ⌊n / W₀⌋` with `drop_last` (the values that
//! world cut are not part of the epoch). A second change of world size continues the same
//! `π` from a larger `O`, so a state needs only `(W₀, O)`.
//!
//! Reading `π` at a position: without shuffling it is the position itself; in torch's order
//! the epoch's whole `randperm`; in the per-rank order position `g` is position `g div W₀` of old
//! rank `g mod W₀`'s share. A new rank reads the old shares one at a time, only the range its
//! positions fall in (`fast_share_range_into`), and picks every position it takes from it:
//! O(N) time over all the old shares it meets, memory for its own share plus one old range.

use crate::deal::fast_share::{fast_share_range_into, Blocks};
use crate::deal::layout::Layout;
use crate::deal::rank::{Draw, Order};
use crate::draw::random_access::RandomAccessPermutation;
use crate::error::{Error, Result};
use crate::index::{index_bytes, try_with_capacity_huge, zeros_par, Index, Indices, U32_MAX_LEN};
use crate::shuffle::torch_randperm;
use std::ops::Range;

/// Positions in the first piece of an elastic rest in the fast shuffled order: a few positions
/// of each old share they meet, so the first index comes before the rest of the epoch is
/// computed.
pub const ELASTIC_FIRST_STOP: u64 = 64;

/// An epoch of `n` samples drawn for `origin` ranks, continued from global position `offset`
/// on a layout of `num_replicas` ranks.
#[derive(Debug, Clone)]
pub struct Elastic {
    origin: Layout,
    offset: u64,
    end: u64,
    rest: Layout,
}

impl Elastic {
    /// The continuation of an epoch of `n` samples, first dealt over `origin` ranks, from
    /// global position `offset` (at most the epoch's end), over `num_replicas` ranks.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Elastic;
    ///
    /// // 100 samples on 4 ranks, which consumed 10 positions each (global positions 0..40);
    /// // the rest goes to 3 ranks.
    /// let el = Elastic::new(100, 4, false, 40, 3).unwrap();
    /// assert_eq!(el.num_samples(), 20); // the 60 left, over 3 ranks
    /// assert!(Elastic::new(100, 4, false, 101, 3).is_err()); // past the epoch's end
    /// ```
    pub fn new(
        n: u64,
        origin: u64,
        drop_last: bool,
        offset: u64,
        num_replicas: u64,
    ) -> Result<Self> {
        let origin = Layout::new(n, origin, drop_last)?;
        let end = origin.epoch_end();
        if offset > end {
            return Err(Error::out_of_range(
                "offset",
                format!("in [0, {end}] (the epoch's end)"),
                offset,
            ));
        }
        let rest = Layout::new(end - offset, num_replicas, drop_last)?;
        Ok(Elastic {
            origin,
            offset,
            end,
            rest,
        })
    }

    /// The number of ranks the rest is dealt to.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Elastic;
    ///
    /// let el = Elastic::new(100, 4, false, 40, 3).unwrap();
    /// assert_eq!(el.num_replicas(), 3); // the new world, not the original one
    /// ```
    pub fn num_replicas(&self) -> u64 {
        self.rest.num_replicas()
    }

    /// The continuation of an epoch in which each of `origin` ranks has a sequence of
    /// `per_rank` items (a mixture's or a batch sampler's epoch): its global order is
    /// position `t` of every old rank's sequence, rank after rank, then position `t + 1`, so
    /// that what the old ranks consumed, `p` items each, is its first `p * origin` positions.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Elastic;
    ///
    /// // 4 ranks with 25 positions each consumed 10 each: 40 of the 100 global positions.
    /// let el = Elastic::over_sequences(4, 25, false, 40, 3).unwrap();
    /// assert_eq!(el.num_samples() * 3, 100 - 40); // the rest, each position once
    /// assert!(Elastic::over_sequences(u64::MAX, 2, false, 0, 1).is_err()); // past 2**63 - 1
    /// ```
    pub fn over_sequences(
        origin: u64,
        per_rank: u64,
        drop_last: bool,
        offset: u64,
        num_replicas: u64,
    ) -> Result<Self> {
        let n = origin
            .checked_mul(per_rank)
            .filter(|&n| n <= crate::index::MAX_LEN)
            .ok_or_else(|| {
                Error::out_of_range("num_replicas * num_samples", "at most 2**63 - 1", "more")
            })?;
        Self::new(n, origin, drop_last, offset, num_replicas)
    }

    /// Positions per new rank for the rest of the epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Elastic;
    ///
    /// for drop_last in [false, true] {
    ///     let el = Elastic::new(100, 4, drop_last, 41, 3).unwrap();
    ///     // torch's arithmetic on the 59 positions left: padded up or cut down.
    ///     let want = if drop_last { 59 / 3 } else { 59_u64.div_ceil(3) };
    ///     assert_eq!(el.num_samples(), want);
    /// }
    /// ```
    pub fn num_samples(&self) -> u64 {
        self.rest.num_samples()
    }

    /// Checks new rank `rank` and its positions `start..stop`.
    pub(crate) fn check_range(&self, rank: u64, start: u64, stop: u64) -> Result<()> {
        self.rest.check_rank(rank)?;
        self.rest.check_range(start, stop)
    }

    /// The global positions the rest deals, `[offset, offset + len)`, as `(offset, len)`.
    pub(crate) fn rest_span(&self) -> (u64, u64) {
        (self.offset, self.end - self.offset)
    }

    /// The global position new rank `rank` takes at its position `k`.
    fn global(&self, rank: u64, k: u64) -> u64 {
        let r = self.end - self.offset;
        let h = rank + k * self.rest.num_replicas();
        self.offset + if h < r { h } else { h % r }
    }

    /// Positions `range` (`start..stop`, with `start <= stop <=` [`Elastic::num_samples`]) of
    /// new rank `rank`'s sequence, the epoch's global order drawn as `draw` says.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{rank_range, Draw, Elastic, Layout};
    ///
    /// // 10 samples on 2 ranks, 4 positions each consumed (global positions 0..8), then 3 ranks.
    /// let draw = Draw { seed: 1, ..Draw::default() };
    /// let el = Elastic::new(10, 2, false, 8, 3).unwrap();
    /// assert_eq!(el.num_samples(), 1); // 2 left for 3 ranks: rank 2 repeats the first
    /// let rest: Vec<usize> = (0..3).map(|r| el.range(r, draw, 0..1).unwrap().len()).collect();
    /// assert_eq!(rest, [1, 1, 1]);
    /// // What was not consumed is what the old ranks had left: their last positions.
    /// let old = Layout::new(10, 2, false).unwrap();
    /// for r in 0..2 {
    ///     assert_eq!(el.range(r, draw, 0..1).unwrap(), rank_range(&old, r, draw, 4..5).unwrap());
    /// }
    /// assert!(el.range(3, draw, 0..1).is_err()); // no rank 3 of 3
    /// ```
    pub fn range(&self, rank: u64, draw: Draw, range: Range<u64>) -> Result<Indices> {
        let Range { start, end: stop } = range;
        self.rest.check_rank(rank)?;
        self.rest.check_range(start, stop)?;
        Ok(if self.origin.n() <= U32_MAX_LEN {
            Indices::U32(self.range_as(rank, draw, (start, stop))?)
        } else {
            Indices::U64(self.range_as(rank, draw, (start, stop))?)
        })
    }

    /// Bytes a [`Elastic::range`] with these arguments holds at its peak (an estimate, to
    /// refuse what cannot fit).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Draw, Elastic, Order};
    ///
    /// let el = Elastic::new(1000, 4, false, 500, 2).unwrap();
    /// let plain = Draw { shuffle: false, ..Draw::default() };
    /// assert_eq!(el.range_bytes(plain, 0..250), 250 * 4); // the output, u32
    /// // The global order reads its positions by random access: the output only.
    /// assert_eq!(el.range_bytes(Draw::default(), 0..250), 250 * 4);
    /// // The per-rank order reads an old rank's share too.
    /// let fast = Draw { order: Order::PerRank, ..Draw::default() };
    /// assert!(el.range_bytes(fast, 0..250) > 250 * 4);
    /// ```
    pub fn range_bytes(&self, draw: Draw, range: Range<u64>) -> u64 {
        let elem = index_bytes(self.origin.n());
        let out = range.end.saturating_sub(range.start).saturating_mul(elem);
        match (draw.shuffle, draw.order) {
            (false, _) => out,
            (true, Order::Torch(_)) => out.saturating_add(self.origin.n().saturating_mul(elem)),
            (true, Order::Global) => out,
            // One old piece (at most about half an old share) with its stripe tables and cut
            // buckets, bounded by a whole old share.
            (true, Order::PerRank) => {
                let old_share = self.end.div_ceil(self.origin.num_replicas());
                out.saturating_add(old_share.saturating_mul(elem))
            }
        }
    }

    fn range_as<T: Index>(
        &self,
        rank: u64,
        draw: Draw,
        (start, stop): (u64, u64),
    ) -> Result<Vec<T>> {
        if !draw.shuffle || start == stop {
            return collect_checked(start, stop, |k| T::from_u64(self.global(rank, k)));
        }
        let (seed, epoch) = (draw.seed, draw.epoch);
        match draw.order {
            Order::Torch(variant) => {
                // In the indices' own type: they are the epoch's, below n.
                let perm =
                    torch_randperm::sampler_order::<T>(self.origin.n(), variant, seed, epoch)?;
                collect_checked(start, stop, |k| perm[self.global(rank, k) as usize])
            }
            Order::PerRank => self.fast_range(rank, (seed, epoch), (start, stop)),
            // The rest is the same permutation's positions [offset, end): arithmetic.
            Order::Global => RandomAccessPermutation::new(self.origin.n(), seed, epoch)
                .rank_positions(
                    (self.offset, self.end - self.offset),
                    (rank, self.rest.num_replicas()),
                    (start, stop),
                ),
        }
    }

    fn fast_range<T: Index>(
        &self,
        rank: u64,
        (seed, epoch): (u64, u64),
        (start, stop): (u64, u64),
    ) -> Result<Vec<T>> {
        let w0 = self.origin.num_replicas();
        // Old rank s holds ceil((E - s) / W0) distinct values. It is read in at most two
        // pieces of at most about half its share, straight into the piece's buffer, so the
        // peak is this rank's output plus one piece; a short read (the first index) is read by
        // random access.
        let end = self.end;
        let share = move |s: u64| (end - s).div_ceil(w0);
        let blocks = Blocks::DOUBLING;
        // A read is one walk of the partition, whose upper levels cost the same for a small
        // block as for a large one: the blocks before an old share's last one (together about
        // as long as it, blocks doubling) are read in one walk, the last one in another.
        let piece_end = move |s: u64, j: u64| {
            let c = share(s);
            let last = blocks.start(c, blocks.of(c.saturating_sub(1)));
            if j < last {
                last
            } else {
                c
            }
        };
        self.gather(
            rank,
            (start, stop),
            piece_end,
            |s, (a, b), buf: &mut Vec<T>| {
                // A fresh buffer per read: the previous one is gone before this one's work.
                // (Zeroed on all threads, looking at the cancellation flag: a piece is up to
                // half an old share, a quarter of a second of page faults on one thread.)
                *buf = Vec::new();
                *buf = zeros_par::<T>("an old rank's piece", b - a)?;
                if crate::cancel::cancelled() {
                    return Ok(a); // the caller stops at its next look
                }
                fast_share_range_into(&self.origin, blocks, s, (seed, epoch), (a, b), buf)?;
                Ok(a)
            },
        )
    }

    /// Positions `[start, stop)` of new rank `rank`'s sequence, read from the old ranks'
    /// sequences: `read(s, (a, b), buf)` makes `buf` old rank `s`'s positions `[f, t)` for
    /// some `f <= a`, `t >= b` (a reader's unit of work may reach beyond the range: it keeps
    /// all of it) and returns `f`;
    /// `piece_end(s, a)` says where a read starting at `a` should end at the latest (the old
    /// rank's unit of work, so that nothing is computed twice). Old ranks are read one at a
    /// time, each a piece at a time: the peak is the output plus one piece.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Elastic, Result};
    ///
    /// // Two old ranks of 5 positions; old rank s holds 10 s + j at its position j. They consumed
    /// // 2 each (global positions 0..4); the other 6 go to 3 new ranks.
    /// let el = Elastic::over_sequences(2, 5, false, 4, 3).unwrap();
    /// let read = |s: u64, (a, b): (u64, u64), buf: &mut Vec<u64>| -> Result<u64> {
    ///     *buf = (a..b).map(|j| 10 * s + j).collect();
    ///     Ok(a)
    /// };
    /// let whole = |_, _| u64::MAX;
    /// let mut got: Vec<u64> = (0..3)
    ///     .flat_map(|r| el.gather(r, (0, el.num_samples()), whole, read).unwrap())
    ///     .collect();
    /// got.sort_unstable();
    /// assert_eq!(got, [2, 3, 4, 12, 13, 14]); // what the old ranks had left, each once
    /// ```
    pub fn gather<T: Index>(
        &self,
        rank: u64,
        (start, stop): (u64, u64),
        piece_end: impl Fn(u64, u64) -> u64,
        mut read: impl FnMut(u64, (u64, u64), &mut Vec<T>) -> Result<u64>,
    ) -> Result<Vec<T>> {
        self.rest.check_rank(rank)?;
        self.rest.check_range(start, stop)?;
        let mut out = zeros_par::<T>("a rank's indices", stop - start)?;
        let (w0, w) = (self.origin.num_replicas(), self.rest.num_replicas());
        let r = self.end - self.offset;
        // Positions [start, plain) of the new rank read the remainder in order; from `plain`
        // on they are padding (at most one per rank, read one by one).
        let plain = stop.min(if rank < r { (r - rank).div_ceil(w) } else { 0 }.max(start));
        let mut buf: Vec<T> = Vec::new();
        // The positions of one old rank recur every `w0 / gcd(w, w0)` new positions, and
        // their old positions increase with them.
        let step = w0 / gcd(w, w0);
        for k0 in start..plain.min(start + step) {
            let s = self.global(rank, k0) % w0;
            let mut k = k0;
            while k < plain {
                if crate::cancel::cancelled() {
                    return Ok(out); // the caller discards the buffer
                }
                let a = self.global(rank, k) / w0;
                // The last old position this rank takes from s, and the piece holding `a`.
                let last = {
                    let k_last = k + (plain - 1 - k) / step * step;
                    self.global(rank, k_last) / w0
                };
                let b = piece_end(s, a).clamp(a + 1, last + 1);
                let from = read(s, (a, b), &mut buf)?;
                if crate::cancel::cancelled() {
                    return Ok(out); // the caller discards the buffer
                }
                debug_assert!(from <= a && buf.len() as u64 >= b - from);
                let mut steps = 0usize;
                while k < plain {
                    let j = self.global(rank, k) / w0;
                    if j >= b {
                        break;
                    }
                    out[(k - start) as usize] = buf[(j - from) as usize];
                    k += step;
                    steps += 1;
                    // A piece's strided copy is tens of millions of writes.
                    if steps.is_multiple_of(crate::cancel::CHECK_EVERY)
                        && crate::cancel::cancelled()
                    {
                        return Ok(out);
                    }
                }
            }
        }
        drop(buf);
        let mut one = Vec::new();
        for k in plain..stop {
            let g = self.global(rank, k);
            let (s, j) = (g % w0, g / w0);
            let from = read(s, (j, j + 1), &mut one)?;
            out[(k - start) as usize] = one[(j - from) as usize];
        }
        Ok(out)
    }
}

/// `f(k)` for every `k` of `[start, stop)`, in a new buffer, looking at the cancellation flag
/// between runs of [`CHECK_EVERY`](crate::cancel::CHECK_EVERY) values: a rank's rest is up
/// to hundreds of millions of random reads. A cancelled call gets a short buffer, which its
/// caller discards.
fn collect_checked<T: Index>(start: u64, stop: u64, f: impl Fn(u64) -> T) -> Result<Vec<T>> {
    let mut v = try_with_capacity_huge::<T>("a rank's indices", stop - start)?;
    let mut k = start;
    while k < stop && !crate::cancel::cancelled() {
        let hi = stop.min(k + crate::cancel::CHECK_EVERY as u64);
        v.extend((k..hi).map(&f));
        k = hi;
    }
    Ok(v)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deal::rank::rank_range;
    use crate::shuffle::torch_randperm::TorchRandperm;
    use std::collections::HashMap;

    /// The epoch's global order as the original world deals it, read back from its shares.
    fn global_order(n: u64, w0: u64, drop_last: bool, shuffle: bool, order: Order) -> Vec<u64> {
        let layout = Layout::new(n, w0, drop_last).unwrap();
        let draw = Draw {
            shuffle,
            order,
            seed: 5,
            epoch: 2,
        };
        let shares: Vec<Vec<u64>> = (0..w0)
            .map(|s| {
                rank_range(&layout, s, draw, 0..layout.num_samples())
                    .unwrap()
                    .to_u64_vec()
            })
            .collect();
        let end = n.min(layout.total_size());
        (0..end)
            .map(|g| shares[(g % w0) as usize][(g / w0) as usize])
            .collect()
    }

    #[test]
    fn the_rest_is_dealt_once_with_torch_padding() {
        let orders = [
            Order::PerRank,
            Order::Torch(TorchRandperm::InsideOutForLargeN),
        ];
        for (n, w0, w) in [
            (1u64, 1u64, 3u64),
            (7, 3, 2),
            (5, 8, 3),
            (10_007, 8, 6),
            (10_007, 6, 8),
            (70_001, 4, 3),
            (70_001, 1, 5),
            (70_001, 5, 1),
            (200_003, 2, 3),
        ] {
            for drop_last in [false, true] {
                for (shuffle, order) in [
                    (false, Order::PerRank),
                    (true, orders[0]),
                    (true, orders[1]),
                ] {
                    let pi = global_order(n, w0, drop_last, shuffle, order);
                    let end = pi.len() as u64;
                    for offset in [0, 1, end / 2, end.saturating_sub(1), end]
                        .into_iter()
                        .filter(|&o| o <= end)
                    {
                        let el = Elastic::new(n, w0, drop_last, offset, w).unwrap();
                        let ns = el.num_samples();
                        let mut seen: HashMap<u64, u64> = HashMap::new();
                        let draw = Draw {
                            shuffle,
                            order,
                            seed: 5,
                            epoch: 2,
                        };
                        for r in 0..w {
                            let got = el.range(r, draw, 0..ns).unwrap().to_u64_vec();
                            assert_eq!(got.len() as u64, ns);
                            // The global positions torch's arithmetic gives, read from π.
                            let want: Vec<u64> =
                                (0..ns).map(|k| pi[el.global(r, k) as usize]).collect();
                            assert_eq!(got, want, "n={n} {w0}->{w} O={offset} r={r}");
                            // A part read alone equals the cut of the whole.
                            if ns > 2 {
                                let part = el.range(r, draw, 1..ns - 1).unwrap();
                                assert_eq!(part.to_u64_vec(), got[1..ns as usize - 1]);
                            }
                            for v in got {
                                *seen.entry(v).or_default() += 1;
                            }
                        }
                        // Every value of the remainder once (padding repeats at most W - 1).
                        let rest = &pi[offset as usize..];
                        let dropped = if drop_last { rest.len() as u64 % w } else { 0 };
                        let extra: u64 = seen.values().map(|c| c - 1).sum();
                        assert_eq!(seen.len() as u64 + dropped, rest.len() as u64);
                        assert!(extra < w);
                        let rest: std::collections::HashSet<u64> = rest.iter().copied().collect();
                        assert!(seen.keys().all(|v| rest.contains(v)));
                    }
                }
            }
        }
    }

    #[test]
    fn offsets_past_the_end_are_refused() {
        assert!(Elastic::new(10, 3, true, 9, 2).is_ok());
        assert!(Elastic::new(10, 3, true, 10, 2).is_err());
        assert!(Elastic::new(10, 3, false, 11, 2).is_err());
        let el = Elastic::new(10, 3, false, 4, 2).unwrap();
        assert!(el.range(2, Draw::default(), 0..1).is_err());
        assert!(el.range(0, Draw::default(), 0..4).is_err());
    }
}

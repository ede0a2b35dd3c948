//! A keyed permutation of `[0, n)`, for any `n` up to `2**63`, read at any position: the
//! world-size-invariant order (`order="global"`), where each rank computes only its own
//! positions of one global permutation, a block at a time, in O(block) memory.
//!
//! **Construction.** An alternating Feistel network on `k = bits(n - 1)` bits (so the domain
//! `2**k` is less than `2n`) split into halves of `a = k / 2` and `b = k - a` bits, with
//! [`ROUNDS`] rounds that add (modulo the half's size) a keyed function of the other half:
//! round `i` updates the high half when `i` is even (`hi += F_i(lo) mod 2**a`) and the low half
//! when odd (`lo += F_i(hi) mod 2**b`). This is the FFX/FF1 family of format-preserving
//! ciphers (Bellare, Rogaway and Spies, "The FFX mode of operation for format-preserving
//! encryption", 2010): unlike a xor-Feistel on `2h` bits, it needs no even bit count (the
//! domain stays below `2n`, not `4n`) and reaches odd and even permutations alike (each round
//! rotates a half, and a rotation of `2**a` elements by an odd amount is odd). Positions that
//! land outside `[0, n)` are encrypted again until they fall inside ("cycle walking", Black
//! and Rogaway, CT-RSA 2002), which keeps it a permutation of `[0, n)`; with the domain below
//! `2n` a position needs fewer than two encryptions on average.
//!
//! The round function is SplitMix64's finaliser of the half xor the round key (64-bit
//! multiply-xorshift, a bijection with full avalanche), cut to the other half's width. Round
//! keys come from the ChaCha8 stream `(seed, epoch, Purpose::GlobalOrder)`, so every rank and
//! platform derives the same ones. Integer arithmetic only: the same permutation everywhere.
//!
//! **Small domains.** At most [`TABLE_MAX`] positions are a table shuffled by Fisher–Yates
//! from the same keyed stream (exact uniformity, which a cipher on a few bits cannot have).
//!
//! Quality is checked against numpy's permutation by the battery in
//! `tests/test_global_order_quality.py` (fixed points, cycles, descents, inversions, parity,
//! position-by-value, adjacent pairs, every order for `n <= 6`); `docs/design.md` has its
//! results.

use rayon::prelude::*;

use crate::cancel::cancelled;
use crate::draw::cell_rng::CellRng;
use crate::stream::{Purpose, Stream};

/// Feistel rounds (see the quality battery in `docs/design.md`).
pub const ROUNDS: usize = 8;
/// Domains up to this size are a shuffled table.
pub const TABLE_MAX: u64 = 1 << 10;
/// Positions evaluated per parallel task.
const TASK: usize = 1 << 14;

/// The permutation of `[0, n)` keyed by `(seed, epoch)`: [`RandomAccessPermutation::at`] reads
/// one position, [`RandomAccessPermutation::fill_strided`] a rank's strided positions in bulk.
///
/// # Examples
///
/// ```
/// use croupier_core::RandomAccessPermutation;
///
/// let p = RandomAccessPermutation::new(10_000, 7, 0);
/// let mut seen: Vec<u64> = (0..10_000).map(|i| p.at(i)).collect();
/// seen.sort_unstable();
/// assert_eq!(seen, (0..10_000).collect::<Vec<u64>>()); // a permutation
/// assert_ne!(p.at(0), RandomAccessPermutation::new(10_000, 7, 1).at(0)); // epochs differ
/// ```
#[derive(Debug, Clone)]
pub struct RandomAccessPermutation {
    n: u64,
    lo_bits: u32,
    lo_mask: u64,
    hi_mask: u64,
    keys: [u64; ROUNDS],
    table: Vec<u32>,
}

impl RandomAccessPermutation {
    /// The permutation of `[0, n)` of epoch `epoch` under `seed` (`n = 0` is empty).
    pub fn new(n: u64, seed: u64, epoch: u64) -> Self {
        let mut stream = Stream::new(seed, epoch, Purpose::GlobalOrder, 0);
        let mut keys = [0u64; ROUNDS];
        for key in &mut keys {
            *key = stream.next_u64();
        }
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let hi_bits = bits / 2;
        let lo_bits = bits - hi_bits;
        let mut table = Vec::new();
        if n <= TABLE_MAX {
            table = (0..n as u32).collect();
            let mut rng = CellRng::new(stream.next_u64());
            for i in (1..table.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                table.swap(i, j);
            }
        }
        RandomAccessPermutation {
            n,
            lo_bits,
            lo_mask: (1u64 << lo_bits) - 1,
            hi_mask: (1u64 << hi_bits) - 1,
            keys,
            table,
        }
    }

    /// The Feistel network alone, without the table of small domains: for the quality
    /// battery, which checks the network where the product uses the table.
    #[doc(hidden)]
    pub fn feistel_only(n: u64, seed: u64, epoch: u64) -> Self {
        let mut p = Self::new(n.max(TABLE_MAX + 1), seed, epoch);
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let hi_bits = bits / 2;
        p.n = n;
        p.lo_bits = bits - hi_bits;
        p.lo_mask = (1u64 << p.lo_bits) - 1;
        p.hi_mask = (1u64 << hi_bits) - 1;
        p.table = Vec::new();
        p
    }

    /// The number of positions.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the permutation is of no positions.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// One encryption of `x < 2**k`.
    #[inline(always)]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut hi, mut lo) = (x >> self.lo_bits, x & self.lo_mask);
        for (i, &k) in self.keys.iter().enumerate() {
            if i % 2 == 0 {
                hi = hi.wrapping_add(mix(lo ^ k)) & self.hi_mask;
            } else {
                lo = lo.wrapping_add(mix(hi ^ k)) & self.lo_mask;
            }
        }
        (hi << self.lo_bits) | lo
    }

    /// The value at position `i < n`.
    #[inline(always)]
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        if !self.table.is_empty() {
            return u64::from(self.table[i as usize]);
        }
        let mut x = self.encrypt(i);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }

    /// Fills `out[j]` with the value at position `offset + (first + j * step) % len` for each
    /// `j`: a rank's positions `first, first + step, ...` of the sequence `[offset,
    /// offset + len)`, wrapping to its start as torch's padding does. Parallel over blocks of
    /// `out`; stops early (leaving the rest unwritten) when `cancel` is raised.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::RandomAccessPermutation;
    ///
    /// // Rank 1 of 4 over 10 positions, padded to 12: positions 1, 5, 9, then 13 % 10 = 3.
    /// let p = RandomAccessPermutation::new(10, 3, 0);
    /// let mut out = [0u64; 3];
    /// p.fill_strided(&mut out, 0, 10, 1, 4);
    /// assert_eq!(out, [p.at(1), p.at(5), p.at(9)]);
    /// ```
    pub fn fill_strided<T: crate::Index>(
        &self,
        out: &mut [T],
        offset: u64,
        len: u64,
        first: u64,
        step: u64,
    ) {
        debug_assert!(len >= 1 && offset + len <= self.n);
        let task = |(t, block): (usize, &mut [T])| {
            if cancelled() {
                return;
            }
            // Positions advance by `step` modulo `len`, without a division per position.
            let j0 = (t * TASK) as u128;
            let mut p = ((u128::from(first) + j0 * u128::from(step)) % u128::from(len)) as u64;
            let s = step % len;
            for slot in block.iter_mut() {
                *slot = T::from_u64(self.at(offset + p));
                p += s;
                if p >= len {
                    p -= len;
                }
            }
        };
        if out.len() <= TASK {
            task((0, out));
        } else {
            out.par_chunks_mut(TASK).enumerate().for_each(task);
        }
    }
}

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
#[inline(always)]
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_permutation(p: &RandomAccessPermutation) -> bool {
        let mut seen = vec![false; p.len() as usize];
        (0..p.len()).all(|i| !std::mem::replace(&mut seen[p.at(i) as usize], true))
    }

    #[test]
    fn every_size_is_a_permutation() {
        for n in (0..300).chain([1023, 1024, 1025, 4096, 65_536, 65_537, 100_003]) {
            for seed in 0..3 {
                assert!(
                    is_permutation(&RandomAccessPermutation::new(n, seed, 1)),
                    "n={n}"
                );
            }
        }
    }

    #[test]
    fn huge_domains_stay_in_range_and_distinct() {
        for n in [1u64 << 62, (1u64 << 63) - 1, 1u64 << 63, 3_000_000_007] {
            let p = RandomAccessPermutation::new(n, 5, 2);
            let mut v: Vec<u64> = (0..2000).map(|i| p.at(n - 1 - i)).collect();
            assert!(v.iter().all(|&x| x < n));
            v.sort_unstable();
            v.dedup();
            assert_eq!(v.len(), 2000);
        }
    }

    #[test]
    fn strided_fill_reads_the_wrapped_positions() {
        let p = RandomAccessPermutation::new(50_000, 1, 0);
        for (offset, len, first, step, count) in [
            (0u64, 50_000u64, 3u64, 8u64, 6_251usize),
            (17, 49_983, 0, 1, 49_983),
            (1000, 7, 2, 5, 40_000),
        ] {
            let mut out = vec![0u64; count];
            p.fill_strided(&mut out, offset, len, first, step);
            for (j, &v) in out.iter().enumerate() {
                let pos = offset + (first + j as u64 * step) % len;
                assert_eq!(v, p.at(pos));
            }
        }
    }
}

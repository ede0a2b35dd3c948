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
//! The round function is murmur3's 32-bit finaliser (two multiply-xorshift steps, a bijection
//! of 32 bits with full avalanche) of the half xor the round's 32-bit key, cut to the other
//! half's width: halves have at most 32 bits (`n <= 2**63`), so every operation is a 32-bit
//! one, and 16 positions are encrypted side by side, which the compiler turns into AVX2 code
//! where the CPU has it (`vpmulld`, 8 lanes; the same integer results everywhere). Round keys
//! come from the ChaCha8 stream `(seed, epoch, Purpose::GlobalOrder)`, so every rank and
//! platform derives the same ones. Integer arithmetic only: the same permutation everywhere.
//! Bulk fills of domains below 2**32 keep every step in 32-bit vector lanes (`kernels`).
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
use crate::simd::Simd;
use crate::stream::{Purpose, Stream};

mod kernels;

/// Feistel rounds (see the quality battery in `docs/design.md`).
pub const ROUNDS: usize = 8;
/// Domains up to this size are a shuffled table.
pub const TABLE_MAX: u64 = 1 << 10;
/// Positions evaluated per parallel task.
pub(crate) const TASK: usize = 1 << 14;
/// Positions encrypted together, their multiply chains overlapping (two AVX2 registers of
/// 32-bit halves).
const LANES: usize = 16;
/// Positions [`RandomAccessPermutation::fill_strided`] encrypts together above
/// [`kernels::MAX_N`] (`u64` positions): four vectors of eight 32-bit lanes a half with AVX2,
/// four independent chains of rounds. Blocks of fewer than half of it go position by position
/// at every size (a vector group costs more there).
const WIDE: usize = 32;

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
    lo_mask: u32,
    hi_mask: u32,
    keys: [u32; ROUNDS],
    table: Vec<u32>,
}

impl RandomAccessPermutation {
    /// The permutation of `[0, n)` of epoch `epoch` under `seed` (`n = 0` is empty).
    pub fn new(n: u64, seed: u64, epoch: u64) -> Self {
        Self::from_stream(n, Stream::new(seed, epoch, Purpose::GlobalOrder, 0))
    }

    /// The permutation of `[0, n)` whose round keys (and small-domain table) come from
    /// `stream`: the permutations a mixture's global order draws per leaf and per pass.
    pub(crate) fn from_stream(n: u64, mut stream: Stream) -> Self {
        let mut keys = [0u32; ROUNDS];
        for pair in keys.chunks_mut(2) {
            let word = stream.next_u64();
            pair[0] = word as u32;
            if let Some(k) = pair.get_mut(1) {
                *k = (word >> 32) as u32;
            }
        }
        let mut table = Vec::new();
        if n <= TABLE_MAX {
            table = (0..n as u32).collect();
            let mut rng = CellRng::new(stream.next_u64());
            for i in (1..table.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                table.swap(i, j);
            }
        }
        let mut p = RandomAccessPermutation {
            n,
            lo_bits: 0,
            lo_mask: 0,
            hi_mask: 0,
            keys,
            table,
        };
        p.set_domain(n);
        p
    }

    /// Halves for `n`: `k = bits(n - 1) <= 63` bits, the low half `ceil(k / 2) <= 32` of
    /// them, the high half the rest.
    fn set_domain(&mut self, n: u64) {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let hi_bits = bits / 2;
        self.lo_bits = bits - hi_bits;
        self.lo_mask = ((1u64 << self.lo_bits) - 1) as u32;
        self.hi_mask = ((1u64 << hi_bits) - 1) as u32;
    }

    /// The Feistel network alone, without the table of small domains: for the quality
    /// battery, which checks the network where the product uses the table.
    #[doc(hidden)]
    pub fn feistel_only(n: u64, seed: u64, epoch: u64) -> Self {
        let mut p = Self::new(n.max(TABLE_MAX + 1), seed, epoch);
        p.n = n;
        p.set_domain(n);
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
        let mut x1 = [x];
        self.encrypt_lanes(&mut x1);
        x1[0]
    }

    /// One encryption of each of the values of `x`, round by round (the lanes' independent
    /// multiply chains overlap, and vectorise where the CPU has AVX2).
    #[inline(always)]
    fn encrypt_lanes<const L: usize>(&self, x: &mut [u64; L]) {
        let mut hi = x.map(|v| (v >> self.lo_bits) as u32);
        let mut lo = x.map(|v| v as u32 & self.lo_mask);
        for (i, &k) in self.keys.iter().enumerate() {
            if i % 2 == 0 {
                for l in 0..L {
                    hi[l] = hi[l].wrapping_add(round(lo[l], k)) & self.hi_mask;
                }
            } else {
                for l in 0..L {
                    lo[l] = lo[l].wrapping_add(round(hi[l], k)) & self.lo_mask;
                }
            }
        }
        for l in 0..L {
            x[l] = (u64::from(hi[l]) << self.lo_bits) | u64::from(lo[l]);
        }
    }

    /// One decryption of `x < 2**k`: the rounds of [`Self::encrypt`] undone, last first.
    fn decrypt(&self, x: u64) -> u64 {
        let mut hi = (x >> self.lo_bits) as u32;
        let mut lo = x as u32 & self.lo_mask;
        for (i, &k) in self.keys.iter().enumerate().rev() {
            if i % 2 == 0 {
                hi = hi.wrapping_sub(round(lo, k)) & self.hi_mask;
            } else {
                lo = lo.wrapping_sub(round(hi, k)) & self.lo_mask;
            }
        }
        (u64::from(hi) << self.lo_bits) | u64::from(lo)
    }

    /// The positions holding the values `values` (each below `n`): the inverse permutation,
    /// by decrypting with cycle walking (the inverse of encrypting with it), [`LANES`] values
    /// side by side; or through the table's inverse for a small domain.
    pub(crate) fn positions_of(&self, values: &[u64]) -> Vec<u64> {
        if !self.table.is_empty() {
            let mut inverse = vec![0u64; self.table.len()];
            for (i, &v) in self.table.iter().enumerate() {
                inverse[v as usize] = i as u64;
            }
            return values.iter().map(|&v| inverse[v as usize]).collect();
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.positions_avx2(values) };
        }
        self.positions(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn positions_avx2(&self, values: &[u64]) -> Vec<u64> {
        self.positions(values)
    }

    #[inline(always)]
    fn positions(&self, values: &[u64]) -> Vec<u64> {
        let mut out = Vec::with_capacity(values.len());
        let mut groups = values.chunks_exact(LANES);
        for group in &mut groups {
            let mut x: [u64; LANES] = group.try_into().expect("LANES values");
            self.decrypt_lanes(&mut x);
            out.extend(x.iter().map(|&v| {
                let mut v = v;
                while v >= self.n {
                    v = self.decrypt(v);
                }
                v
            }));
        }
        out.extend(groups.remainder().iter().map(|&v| {
            let mut x = self.decrypt(v);
            while x >= self.n {
                x = self.decrypt(x);
            }
            x
        }));
        out
    }

    /// [`Self::decrypt`] of each value of `x`, round by round, side by side.
    #[inline(always)]
    fn decrypt_lanes<const L: usize>(&self, x: &mut [u64; L]) {
        let mut hi = x.map(|v| (v >> self.lo_bits) as u32);
        let mut lo = x.map(|v| v as u32 & self.lo_mask);
        for (i, &k) in self.keys.iter().enumerate().rev() {
            if i % 2 == 0 {
                for l in 0..L {
                    hi[l] = hi[l].wrapping_sub(round(lo[l], k)) & self.hi_mask;
                }
            } else {
                for l in 0..L {
                    lo[l] = lo[l].wrapping_sub(round(hi[l], k)) & self.lo_mask;
                }
            }
        }
        for l in 0..L {
            x[l] = (u64::from(hi[l]) << self.lo_bits) | u64::from(lo[l]);
        }
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
    /// `out`; stops early (leaving the rest unwritten) when the call is cancelled
    /// ([`crate::Cancel`]).
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
            let p = ((u128::from(first) + j0 * u128::from(step)) % u128::from(len)) as u64;
            let walk = Walk {
                offset,
                len,
                p,
                step: step % len,
            };
            // Domains below 2**32 in 32-bit vector lanes throughout; a few positions one by
            // one in `fill_block`.
            if self.table.is_empty() && self.n <= kernels::MAX_N && block.len() >= WIDE / 2 {
                // SAFETY: `Simd::best` is a level this CPU runs.
                unsafe { kernels::fill(self, block, walk, Simd::best()) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { self.fill_block_avx2(block, walk) };
                return;
            }
            self.fill_block(block, walk);
        };
        if out.len() <= TASK {
            task((0, out));
        } else {
            out.par_chunks_mut(TASK).enumerate().for_each(task);
        }
    }

    /// Rank `rank`'s positions `[start, stop)` when the permutation's positions `[offset,
    /// offset + len)` are dealt to `w` ranks with torch's striding and wrap-around padding:
    /// rank position `j` reads position `offset + (j * w + rank) % len`. A fresh epoch is
    /// `offset = 0, len = n`; the rest of an elastic epoch starts at the consumed offset. An
    /// empty buffer when the call is cancelled (the caller discards it).
    pub(crate) fn rank_positions<T: crate::Index>(
        &self,
        (offset, len): (u64, u64),
        (rank, w): (u64, u64),
        (start, stop): (u64, u64),
    ) -> crate::Result<Vec<T>> {
        let what = "a rank's indices";
        let count = stop - start;
        // A short range (a first window, a resume's first index) stays on this thread: the
        // pool's wake-up would cost more than the range.
        let mut out = if count <= TASK as u64 {
            let mut v = crate::index::try_with_capacity_huge::<T>(what, count)?;
            v.resize(count as usize, T::from_u64(0));
            v
        } else {
            crate::index::zeros_par::<T>(what, count)?
        };
        if start < stop && !cancelled() {
            let first = (u128::from(start) * u128::from(w) + u128::from(rank)) % u128::from(len);
            self.fill_strided(&mut out, offset, len, first as u64, w);
        }
        Ok(out)
    }

    /// [`Self::fill_block`] with the rounds in explicit AVX2 vectors (the same integer
    /// arithmetic, so the same values: only faster; LLVM had vectorised `encrypt_lanes` 4
    /// lanes wide).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_block_avx2<T: crate::Index>(&self, block: &mut [T], mut walk: Walk) {
        if !self.table.is_empty() || block.len() < WIDE / 2 {
            return self.fill_block(block, walk);
        }
        // SAFETY (the closure's): AVX2 is on (this function's feature).
        self.encrypt_block(block, || walk.next(), |p, x| unsafe { avx2::encrypt(p, x) });
    }

    /// One task's block of [`Self::fill_strided`]: a table's lookups, a few positions one by
    /// one (a group costs about 16 of `at`'s walks), else [`Self::encrypt_block`].
    #[inline(always)]
    fn fill_block<T: crate::Index>(&self, block: &mut [T], mut walk: Walk) {
        if !self.table.is_empty() || block.len() < WIDE / 2 {
            block
                .iter_mut()
                .for_each(|slot| *slot = T::from_u64(self.at(walk.next())));
            return;
        }
        self.encrypt_block(block, || walk.next(), |p, x| p.encrypt_lanes(x));
    }

    /// `block[j]` = the value at the `j`-th position `next` gives: one encryption of every
    /// position, [`WIDE`] at a time by `encrypt` (one encryption of each lane, as
    /// [`Self::encrypt_lanes`]), then the few values outside `[0, n)`, set aside with their
    /// slot, encrypted again together (cycle walking) until inside, so a group never waits for
    /// its slowest lane. The last few positions are a group of their own (padded lanes encrypt
    /// position 0, and are dropped). Not for a table.
    #[inline(always)]
    fn encrypt_block<T: crate::Index>(
        &self,
        block: &mut [T],
        mut next: impl FnMut() -> u64,
        encrypt: impl Fn(&Self, &mut [u64; WIDE]),
    ) {
        let mut outside: Vec<(usize, u64)> = Vec::new();
        for (g, group) in block.chunks_mut(WIDE).enumerate() {
            let mut x = [0u64; WIDE];
            x.iter_mut().take(group.len()).for_each(|v| *v = next());
            encrypt(self, &mut x);
            for (j, (slot, v)) in group.iter_mut().zip(x).enumerate() {
                if v < self.n {
                    *slot = T::from_u64(v);
                } else {
                    outside.push((g * WIDE + j, v));
                }
            }
        }
        while !outside.is_empty() {
            let mut still = Vec::new();
            for part in outside.chunks(WIDE) {
                let mut x = [0u64; WIDE];
                x.iter_mut().zip(part).for_each(|(v, &(_, w))| *v = w);
                encrypt(self, &mut x);
                for (&(at, _), v) in part.iter().zip(x) {
                    if v < self.n {
                        block[at] = T::from_u64(v);
                    } else {
                        still.push((at, v));
                    }
                }
            }
            outside = still;
        }
    }
}

/// Lanes of [`at_many_keyed`]: positions read together, each under its own permutation.
pub(crate) const MANY: usize = 16;

/// Positions of one permutation in an [`AtMany`] call from which they are read by its own
/// vector kernel ([`kernels::fill_at`]) rather than in the keyed lanes: below it a group's
/// unfilled lanes cost more than the keyed lanes' bookkeeping.
const GROUP_FROM: usize = 8;

/// `out[i] = perms[which[i]].at(pos[i])` for every `i`: positions under different
/// permutations (a mixture's passes), with scratch kept from call to call (a fresh buffer
/// of a few hundred kilobytes costs its page faults at every call).
///
/// The positions are grouped by permutation (a counting sort of `which`, each position
/// written to its group's place, so nothing is read back at random); a table is looked up,
/// and a group of at least [`GROUP_FROM`] positions of a permutation of at most `2**32 - 1`
/// positions is read by that permutation's own 32-bit vector kernel ([`kernels::fill_at`])
/// into its place, from which each value is written to its own. Smaller groups, and the groups
/// of larger domains, go through [`at_many_keyed`] together. The same values as
/// [`RandomAccessPermutation::at`].
#[derive(Default)]
pub(crate) struct AtMany {
    starts: Vec<u32>,
    grouped: Vec<u32>,
    back: Vec<u32>,
    vals: Vec<u64>,
    /// The draws left to the keyed lanes (their indices in `which`), and their
    /// permutations, positions and values.
    rest: Vec<u32>,
    rest_which: Vec<u32>,
    rest_pos: Vec<u64>,
    rest_got: Vec<u64>,
}

impl AtMany {
    pub(crate) fn read(
        &mut self,
        perms: &[RandomAccessPermutation],
        which: &[u32],
        pos: &[u64],
        out: &mut [u64],
    ) {
        debug_assert!(which.len() == pos.len() && pos.len() == out.len());
        if which.len() < GROUP_FROM {
            return at_many_keyed(perms, which, pos, out);
        }
        // Each permutation's places: `[starts[a], starts[a + 1])` once placed.
        let starts = &mut self.starts;
        starts.clear();
        starts.resize(perms.len() + 1, 0);
        for &a in which {
            starts[a as usize + 1] += 1;
        }
        for a in 0..perms.len() {
            starts[a + 1] += starts[a];
        }
        let n = which.len();
        let (grouped, back, vals) = (&mut self.grouped, &mut self.back, &mut self.vals);
        grouped.resize(n, 0);
        back.resize(n, 0);
        vals.resize(n, 0);
        // Each position to the next place of its group (`starts[a]` moves to the group's end);
        // a position of a domain above 2**32 is cut short here and read from `pos` instead.
        for (i, (&a, &p)) in which.iter().zip(pos).enumerate() {
            let at = &mut starts[a as usize];
            grouped[*at as usize] = p as u32;
            back[*at as usize] = i as u32;
            *at += 1;
        }
        let simd = crate::simd::Simd::best();
        self.rest.clear();
        let mut from = 0usize;
        for (a, p) in perms.iter().enumerate() {
            let to = starts[a] as usize;
            let (at, got) = (&grouped[from..to], &mut vals[from..to]);
            if !p.table.is_empty() {
                for (v, &x) in got.iter_mut().zip(at) {
                    *v = u64::from(p.table[x as usize]);
                }
            } else if at.len() >= GROUP_FROM && p.n <= kernels::MAX_N {
                // SAFETY: `Simd::best` is a level this CPU runs; `n <= MAX_N` (checked
                // here) and the positions are below `n` (the caller's promise, as `at`'s).
                unsafe { kernels::fill_at(p, at, got, simd) };
            } else {
                self.rest.extend_from_slice(&back[from..to]);
            }
            from = to;
        }
        for (&i, &v) in back[..n].iter().zip(&vals[..n]) {
            out[i as usize] = v;
        }
        if !self.rest.is_empty() {
            // The rest, in the keyed lanes (their places' values overwritten above).
            let (rw, rp, rg) = (&mut self.rest_which, &mut self.rest_pos, &mut self.rest_got);
            rw.clear();
            rp.clear();
            for &i in &self.rest {
                let i = i as usize;
                rw.push(which[i]);
                rp.push(pos[i]);
            }
            rg.clear();
            rg.resize(rw.len(), 0);
            at_many_keyed(perms, rw, rp, rg);
            for (&i, &v) in self.rest.iter().zip(rg.iter()) {
                out[i as usize] = v;
            }
        }
    }
}

/// [`AtMany::read`] with fresh scratch.
#[cfg(test)]
pub(crate) fn at_many(
    perms: &[RandomAccessPermutation],
    which: &[u32],
    pos: &[u64],
    out: &mut [u64],
) {
    AtMany::default().read(perms, which, pos, out);
}

/// [`AtMany::read`] in [`MANY`] lanes, each lane with its own permutation's keys, their
/// rounds side by side (in explicit AVX2 vectors where the CPU has it): for positions spread
/// over many permutations, a few each, or domains above 2**32. A lane whose value lands in its domain
/// hands it out and takes the next position at once; one still outside encrypts again with
/// the others, so each position costs the encryptions it needs (1.6 on average over a domain
/// of 10,000, whose walk rate is 39%), where a group that waited for its slowest lane cost
/// about five.
fn at_many_keyed(perms: &[RandomAccessPermutation], which: &[u32], pos: &[u64], out: &mut [u64]) {
    debug_assert!(which.len() == pos.len() && pos.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { at_many_avx2(perms, which, pos, out) };
        return;
    }
    at_many_with(perms, which, pos, out, KeyedLanes::rounds);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn at_many_avx2(
    perms: &[RandomAccessPermutation],
    which: &[u32],
    pos: &[u64],
    out: &mut [u64],
) {
    // SAFETY (the closure's): AVX2 is on (this function's feature).
    at_many_with(perms, which, pos, out, |lanes| unsafe {
        avx2::rounds(lanes)
    });
}

/// [`at_many_keyed`] with `rounds` encrypting every lane once.
#[inline(always)]
fn at_many_with(
    perms: &[RandomAccessPermutation],
    which: &[u32],
    pos: &[u64],
    out: &mut [u64],
    mut rounds: impl FnMut(&mut KeyedLanes),
) {
    let mut lanes = KeyedLanes::default();
    let mut next = 0usize;
    // The next position that needs the cipher into lane `l` (a table's answered on the way);
    // false when none is left.
    let mut take = |lanes: &mut KeyedLanes, l: usize, out: &mut [u64]| -> bool {
        while next < pos.len() {
            let (i, p) = (next, &perms[which[next] as usize]);
            next += 1;
            if p.table.is_empty() {
                lanes.load(l, p, pos[i], i);
                return true;
            }
            out[i] = u64::from(p.table[pos[i] as usize]);
        }
        lanes.slot[l] = usize::MAX;
        false
    };
    let mut active = 0;
    for l in 0..MANY {
        active += usize::from(take(&mut lanes, l, out));
    }
    while active > 0 {
        rounds(&mut lanes);
        // The lanes whose value is in their domain, found without a branch per lane (which
        // way a lane goes is a coin toss at a walk rate near 40%), then only those visited.
        let mut done = 0u32;
        for l in 0..MANY {
            let inside = (lanes.value(l) < lanes.n[l]) & (lanes.slot[l] != usize::MAX);
            done |= u32::from(inside) << l;
        }
        while done != 0 {
            let l = done.trailing_zeros() as usize;
            done &= done - 1;
            out[lanes.slot[l]] = lanes.value(l);
            active -= usize::from(!take(&mut lanes, l, out));
        }
    }
}

/// [`MANY`] lanes, each encrypting under its own permutation ([`at_many_keyed`]).
#[derive(Default)]
struct KeyedLanes {
    keys: [[u32; MANY]; ROUNDS],
    hi_mask: [u32; MANY],
    lo_mask: [u32; MANY],
    lo_bits: [u32; MANY],
    hi: [u32; MANY],
    lo: [u32; MANY],
    /// Each lane's domain size.
    n: [u64; MANY],
    /// Where each lane's value goes (`usize::MAX`: idle).
    slot: [usize; MANY],
}

impl KeyedLanes {
    /// Lane `l` starts position `x` of `p` for slot `slot`.
    #[inline(always)]
    fn load(&mut self, l: usize, p: &RandomAccessPermutation, x: u64, slot: usize) {
        for (r, k) in p.keys.iter().enumerate() {
            self.keys[r][l] = *k;
        }
        (self.hi_mask[l], self.lo_mask[l], self.lo_bits[l]) = (p.hi_mask, p.lo_mask, p.lo_bits);
        self.n[l] = p.n;
        self.hi[l] = (x >> p.lo_bits) as u32;
        self.lo[l] = x as u32 & p.lo_mask;
        self.slot[l] = slot;
    }

    /// Lane `l`'s value.
    #[inline(always)]
    fn value(&self, l: usize) -> u64 {
        (u64::from(self.hi[l]) << self.lo_bits[l]) | u64::from(self.lo[l])
    }

    /// One encryption of every lane (idle ones too, harmlessly), lane by lane.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // lane l of several arrays at once
    fn rounds(&mut self) {
        for (i, keys) in self.keys.iter().enumerate() {
            for l in 0..MANY {
                if i % 2 == 0 {
                    self.hi[l] =
                        self.hi[l].wrapping_add(round(self.lo[l], keys[l])) & self.hi_mask[l];
                } else {
                    self.lo[l] =
                        self.lo[l].wrapping_add(round(self.hi[l], keys[l])) & self.lo_mask[l];
                }
            }
        }
    }
}

/// Positions `offset + p`, `p` advancing by `step` modulo `len`.
#[derive(Clone, Copy)]
struct Walk {
    offset: u64,
    len: u64,
    p: u64,
    step: u64,
}

impl Walk {
    #[inline(always)]
    fn next(&mut self) -> u64 {
        let at = self.offset + self.p;
        self.p += self.step;
        if self.p >= self.len {
            self.p -= self.len;
        }
        at
    }
}

/// [`RandomAccessPermutation::encrypt_lanes`] in explicit AVX2 vectors.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::RandomAccessPermutation;

    use super::WIDE;

    /// Vectors of 8 lanes a half encrypted side by side: 4 independent chains of rounds.
    const V: usize = WIDE / 8;

    /// The round function of 8 lanes: `super::round`, lane by lane.
    #[inline(always)]
    pub(super) unsafe fn round8(x: __m256i, key: __m256i) -> __m256i {
        let c1 = _mm256_set1_epi32(super::MIX1 as i32);
        let c2 = _mm256_set1_epi32(super::MIX2 as i32);
        let mut z = _mm256_mullo_epi32(_mm256_xor_si256(x, key), c1);
        z = _mm256_xor_si256(z, _mm256_srli_epi32::<13>(z));
        z = _mm256_mullo_epi32(z, c2);
        _mm256_xor_si256(z, _mm256_srli_epi32::<16>(z))
    }

    /// [`super::KeyedLanes::rounds`] in vectors: the lanes' keys and masks loaded as vectors.
    #[inline(always)]
    pub(super) unsafe fn rounds(lanes: &mut super::KeyedLanes) {
        const { assert!(super::MANY == 16) };
        let load =
            |a: &[u32; super::MANY], j: usize| _mm256_loadu_si256(a.as_ptr().add(8 * j).cast());
        let mut h = [load(&lanes.hi, 0), load(&lanes.hi, 1)];
        let mut l = [load(&lanes.lo, 0), load(&lanes.lo, 1)];
        let hm = [load(&lanes.hi_mask, 0), load(&lanes.hi_mask, 1)];
        let lm = [load(&lanes.lo_mask, 0), load(&lanes.lo_mask, 1)];
        for (i, keys) in lanes.keys.iter().enumerate() {
            for j in 0..2 {
                let key = load(keys, j);
                if i % 2 == 0 {
                    h[j] = _mm256_and_si256(_mm256_add_epi32(h[j], round8(l[j], key)), hm[j]);
                } else {
                    l[j] = _mm256_and_si256(_mm256_add_epi32(l[j], round8(h[j], key)), lm[j]);
                }
            }
        }
        for j in 0..2 {
            _mm256_storeu_si256(lanes.hi.as_mut_ptr().add(8 * j).cast(), h[j]);
            _mm256_storeu_si256(lanes.lo.as_mut_ptr().add(8 * j).cast(), l[j]);
        }
    }

    /// One encryption of each of the values of `x` (each below `2**k`): what
    /// `p.encrypt_lanes(x)` computes.
    #[inline(always)]
    pub(super) unsafe fn encrypt(p: &RandomAccessPermutation, x: &mut [u64; WIDE]) {
        let hi_half: [u32; WIDE] = x.map(|v| (v >> p.lo_bits) as u32);
        let lo_half: [u32; WIDE] = x.map(|v| v as u32 & p.lo_mask);
        let mut h = [_mm256_setzero_si256(); V];
        let mut l = [_mm256_setzero_si256(); V];
        for j in 0..V {
            h[j] = _mm256_loadu_si256(hi_half.as_ptr().add(8 * j).cast());
            l[j] = _mm256_loadu_si256(lo_half.as_ptr().add(8 * j).cast());
        }
        let hi_mask = _mm256_set1_epi32(p.hi_mask as i32);
        let lo_mask = _mm256_set1_epi32(p.lo_mask as i32);
        for (i, &k) in p.keys.iter().enumerate() {
            let key = _mm256_set1_epi32(k as i32);
            for j in 0..V {
                if i % 2 == 0 {
                    h[j] = _mm256_and_si256(_mm256_add_epi32(h[j], round8(l[j], key)), hi_mask);
                } else {
                    l[j] = _mm256_and_si256(_mm256_add_epi32(l[j], round8(h[j], key)), lo_mask);
                }
            }
        }
        let (mut hi, mut lo) = ([0u32; WIDE], [0u32; WIDE]);
        for j in 0..V {
            _mm256_storeu_si256(hi.as_mut_ptr().add(8 * j).cast(), h[j]);
            _mm256_storeu_si256(lo.as_mut_ptr().add(8 * j).cast(), l[j]);
        }
        for j in 0..WIDE {
            x[j] = (u64::from(hi[j]) << p.lo_bits) | u64::from(lo[j]);
        }
    }
}

/// The multipliers of murmur3's 32-bit finaliser (the round function's, in every kernel).
const MIX1: u32 = 0x85eb_ca6b;
const MIX2: u32 = 0xc2b2_ae35;

/// The round function: murmur3's 32-bit finaliser of the half xor the round key, a bijection
/// of 32 bits whose low bits depend on every input bit.
#[inline(always)]
fn round(x: u32, key: u32) -> u32 {
    let mut z = (x ^ key).wrapping_mul(MIX1);
    z ^= z >> 13;
    z = z.wrapping_mul(MIX2);
    z ^ (z >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_permutation(p: &RandomAccessPermutation) -> bool {
        let mut seen = vec![false; p.len() as usize];
        (0..p.len()).all(|i| !std::mem::replace(&mut seen[p.at(i) as usize], true))
    }

    #[test]
    fn positions_of_inverts_at() {
        for n in [1u64, 7, 1024, 1025, 65_536, 1_000_003] {
            let p = RandomAccessPermutation::new(n, 4, n);
            let probe: Vec<u64> = (0..n).step_by((n / 500).max(1) as usize).collect();
            let values: Vec<u64> = probe.iter().map(|&i| p.at(i)).collect();
            assert_eq!(p.positions_of(&values), probe, "n = {n}");
        }
    }

    #[test]
    fn many_keys_at_once_read_what_each_reads_alone() {
        // Domains with and without cycle walking, and tables, mixed in one batch.
        let sizes = [
            5u64,
            1000,
            1025,
            70_000,
            1 << 20,
            3_000_001,
            (1 << 40) + 3,
            (1 << 62) + 5,
        ];
        let perms: Vec<RandomAccessPermutation> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| RandomAccessPermutation::new(n, 9, i as u64))
            .collect();
        let which: Vec<u32> = (0..2_003u32).map(|i| (i * 7 + i / 5) % 8).collect();
        let pos: Vec<u64> = which
            .iter()
            .zip(0u64..)
            .map(|(&w, i)| (i * 104_729) % perms[w as usize].len())
            .collect();
        // Every length up to a few groups, and the whole batch (lanes refilled many times).
        for len in (0..40).chain([which.len()]) {
            let mut out = vec![0u64; len];
            at_many(&perms, &which[..len], &pos[..len], &mut out);
            for ((&w, &p), &o) in which.iter().zip(&pos).zip(&out) {
                assert_eq!(o, perms[w as usize].at(p));
            }
        }
    }

    /// Grouped reads beside the groups of domains above 2**32, with positions above 2**32
    /// there (a copy of them cut to `u32` on the way to the keyed lanes reads other
    /// positions), a scratch reused by larger and smaller calls.
    #[test]
    fn grouped_reads_beside_domains_above_2_32() {
        let sizes = [
            5u64,
            1000,
            1025,
            3_000_001,
            u32::MAX as u64,
            1 << 32,
            (1 << 40) + 3,
            (1 << 62) + 5,
        ];
        let perms: Vec<RandomAccessPermutation> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| RandomAccessPermutation::new(n, 11, i as u64))
            .collect();
        let mut lcg = crate::testkit::Lcg::new(7);
        let mut reads = AtMany::default();
        for len in [0usize, 7, 8, 40, 3_000, 200, 9, 1_000] {
            let which: Vec<u32> = (0..len)
                .map(|_| lcg.below(sizes.len() as u64) as u32)
                .collect();
            let pos: Vec<u64> = which
                .iter()
                .map(|&w| {
                    let n = perms[w as usize].len();
                    if n > 1 << 33 {
                        (1 << 32) + lcg.next_u64() % (n - (1 << 32))
                    } else {
                        lcg.next_u64() % n
                    }
                })
                .collect();
            let mut out = vec![u64::MAX; len];
            reads.read(&perms, &which, &pos, &mut out);
            for (i, ((&w, &p), &o)) in which.iter().zip(&pos).zip(&out).enumerate() {
                assert_eq!(o, perms[w as usize].at(p), "len {len}, read {i}, perm {w}");
            }
        }
    }

    /// The grouped reads (every domain at most 2**32): tables, groups read by their own
    /// kernel and groups too small for it (left to the keyed lanes) in one call, positions of
    /// different permutations interleaved, a scratch reused by calls of other sizes.
    #[test]
    fn grouped_reads_read_what_each_position_reads() {
        let sizes = [5u64, 1024, 1025, 10_000, 3_000_001, u32::MAX as u64];
        let perms: Vec<RandomAccessPermutation> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| RandomAccessPermutation::new(n, 4, i as u64))
            .collect();
        let mut lcg = crate::testkit::Lcg::new(3);
        let mut reads = AtMany::default();
        for len in [0usize, 1, 7, 8, 9, 50, 300, 5_000, 17] {
            // Permutations 0 and 5 rarely (groups below GROUP_FROM up to a few hundred
            // reads, read by the kernel at 5,000), the others often.
            let which: Vec<u32> = (0..len)
                .map(|_| match lcg.below(40) {
                    0 => 0,
                    1 => 5,
                    x => 1 + (x % 4) as u32,
                })
                .collect();
            let pos: Vec<u64> = which
                .iter()
                .map(|&w| lcg.below(perms[w as usize].len()))
                .collect();
            let mut out = vec![u64::MAX; len];
            reads.read(&perms, &which, &pos, &mut out);
            for (i, ((&w, &p), &o)) in which.iter().zip(&pos).zip(&out).enumerate() {
                assert_eq!(
                    o,
                    perms[w as usize].at(p),
                    "len {len}, read {i} of perm {w}"
                );
            }
        }
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

    /// Deliberate value-stability pins of the world-size-invariant order (also pinned through
    /// `DistributedSampler(order="global")` in `tests/test_global_order.py`): a change here
    /// changes every user's data order.
    #[test]
    fn value_stability_pins() {
        let small = RandomAccessPermutation::new(10, 0, 0);
        let got: Vec<u64> = (0..10).map(|i| small.at(i)).collect();
        assert_eq!(got, [4, 0, 1, 6, 5, 3, 2, 7, 9, 8]); // the table
        let mid = RandomAccessPermutation::new(1_000_000, 1234, 7);
        let got: Vec<u64> = (0..6).map(|i| mid.at(i)).collect();
        assert_eq!(got, [526_994, 209_571, 14_857, 304_834, 703_898, 625_863]); // the network
        let huge = RandomAccessPermutation::new((1 << 63) - 1, 3, 0);
        let got: Vec<u64> = (0..3).map(|j| huge.at(77 + j * (1 << 20))).collect();
        assert_eq!(
            got,
            [
                1_502_655_139_969_935_940,
                8_756_787_202_600_632_177,
                8_007_215_036_409_286_529
            ]
        );
    }

    #[test]
    fn the_vector_fill_reads_what_each_position_reads_at_every_width() {
        // Domains from a few cycle walks to half the positions walking, and halves of 1 to
        // 32 bits; every position checked against the scalar `at`, in u32 and u64 output.
        let sizes = [
            1025u64,
            4097,
            (1 << 20) + 1,
            3 << 20,
            1_000_000,
            (1 << 32) - 1,
            (1 << 32) + 7,
            (1 << 40) + 3,
            (1 << 62) + 5,
            (1 << 63) - 1,
        ];
        for (k, &n) in sizes.iter().enumerate() {
            let p = RandomAccessPermutation::new(n, 7 + k as u64, 3);
            let count = 20_000usize.min(n as usize);
            let (first, step) = (n / 3, 1 + (n / 5_000).max(1) * (k as u64 % 3));
            let mut wide = vec![0u64; count];
            p.fill_strided(&mut wide, 0, n, first, step);
            for (j, &v) in wide.iter().enumerate() {
                let pos =
                    ((u128::from(first) + j as u128 * u128::from(step)) % u128::from(n)) as u64;
                assert_eq!(v, p.at(pos), "n = {n}, j = {j}");
            }
            if n <= 1 << 32 {
                let mut narrow = vec![0u32; count];
                p.fill_strided(&mut narrow, 0, n, first, step);
                assert!(
                    narrow.iter().zip(&wide).all(|(&a, &b)| u64::from(a) == b),
                    "n = {n}"
                );
            }
        }
    }

    #[test]
    fn the_portable_kernels_read_what_each_position_reads() {
        // The paths a CPU without AVX2 takes from 2**32 on and for blocks under 16 positions
        // (this machine's calls take the vector ones; `kernels` tests its portable level).
        for (k, n) in [(1u64 << 20) + 1, 3_000_001, 10_000, (1 << 40) + 3]
            .into_iter()
            .enumerate()
        {
            let p = RandomAccessPermutation::new(n, 3, k as u64);
            let mut out = vec![0u64; 5_003];
            let walk = Walk {
                offset: 0,
                len: n,
                p: n / 2,
                step: 7,
            };
            p.fill_block(&mut out, walk);
            for (j, &v) in out.iter().enumerate() {
                assert_eq!(v, p.at((n / 2 + 7 * j as u64) % n), "n = {n}, j = {j}");
            }
        }
        let perms: Vec<RandomAccessPermutation> = [5u64, 10_000, 1025, (1 << 62) + 5]
            .iter()
            .map(|&n| RandomAccessPermutation::new(n, 1, 2))
            .collect();
        let which: Vec<u32> = (0..999u32).map(|i| (i * 5 + i / 3) % 4).collect();
        let pos: Vec<u64> = which
            .iter()
            .zip(0u64..)
            .map(|(&w, i)| (i * 7_919) % perms[w as usize].len())
            .collect();
        let mut out = vec![0u64; which.len()];
        at_many_with(&perms, &which, &pos, &mut out, KeyedLanes::rounds);
        for ((&w, &p), &o) in which.iter().zip(&pos).zip(&out) {
            assert_eq!(o, perms[w as usize].at(p));
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

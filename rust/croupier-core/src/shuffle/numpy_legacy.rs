//! numpy's legacy `RandomState.shuffle`, reproduced exactly, for Megatron-Core's dataset
//! indices (its document and shuffle indices are shuffled so) and for any caller that needs
//! the same order.
//!
//! numpy's legacy generator is the 32-bit Mersenne Twister (mt19937) whose whole state is the
//! pair `(key, pos)` of `RandomState.get_state()`: 624 words and the next word's position. An
//! output is `key[pos]` tempered, after refilling all 624 words when `pos` is 624; a 64-bit
//! output is two 32-bit ones, the first in the high half. `shuffle` of a 1-D array (or of the
//! rows of a C-contiguous one) walks `i` from `n - 1` down to 1 and swaps element `i` with
//! element `j = random_interval(i)`: the smallest all-ones mask covering `i`, then outputs
//! masked until one is at most `i` (32-bit outputs while `i < 2**32`, 64-bit ones above).
//! Read from numpy's `mtrand.pyx` and `distributions.c`; checked against numpy by the tests.
//!
//! The state is kept here as numpy keeps it, so a caller hands `get_state()`'s words in and
//! gets the state `set_state()` needs back ([`Mt19937::key`], [`Mt19937::pos`]). `rand_mt`
//! (used for torch's generator) has the same algorithm but no access to the raw words and
//! position, so this module carries its own 60-line twister.
//!
//! The swaps are the cost at scale (one random access each, into a buffer of gigabytes): the
//! draws are made a block at a time ahead of the swaps and their targets prefetched, in
//! numpy's draw order, on a second thread from
//! [`DRAWS_APART_FROM`](crate::shuffle::drawn_steps::DRAWS_APART_FROM) elements on
//! (`shuffle::drawn_steps`).

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::shuffle::drawn_steps::drawn_steps;

/// Words of the Mersenne Twister's state.
pub const MT_WORDS: usize = 624;
const SHIFT: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;

/// The twister's output function of a state word.
#[inline(always)]
fn temper(mut y: u32) -> u32 {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c_5680;
    y ^= (y << 15) & 0xefc6_0000;
    y ^ (y >> 18)
}

/// The 32-bit Mersenne Twister with numpy's state layout: `key` and `pos` are
/// `RandomState.get_state()[1]` and `[2]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Mt19937 {
    /// The state words.
    pub key: [u32; MT_WORDS],
    /// The next word's position; [`MT_WORDS`] means the words are refilled first.
    pub pos: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mt19937 {{ pos: {}, key[0]: {:#x}, .. }}",
            self.pos, self.key[0]
        )
    }
}

impl Mt19937 {
    /// The state `init_genrand(seed)` makes (the reference implementation's seeding; numpy's
    /// `RandomState(seed)` seeds otherwise, through `init_by_array`).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::shuffle::Mt19937;
    ///
    /// // The reference implementation's first output for its default seed.
    /// assert_eq!(Mt19937::from_genrand_seed(5489).next_u32(), 3_499_211_612);
    /// ```
    pub fn from_genrand_seed(seed: u32) -> Self {
        let mut key = [0u32; MT_WORDS];
        key[0] = seed;
        for i in 1..MT_WORDS {
            let prev = key[i - 1];
            key[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { key, pos: MT_WORDS }
    }

    /// Refills the 624 words (numpy's `mt19937_gen`).
    fn refill(&mut self) {
        let k = &mut self.key;
        let mix = |a: u32, b: u32, c: u32| {
            let y = (a & UPPER) | (b & LOWER);
            c ^ (y >> 1) ^ (0u32.wrapping_sub(y & 1) & MATRIX_A)
        };
        for i in 0..MT_WORDS - SHIFT {
            k[i] = mix(k[i], k[i + 1], k[i + SHIFT]);
        }
        for i in MT_WORDS - SHIFT..MT_WORDS - 1 {
            k[i] = mix(k[i], k[i + 1], k[i + SHIFT - MT_WORDS]);
        }
        k[MT_WORDS - 1] = mix(k[MT_WORDS - 1], k[0], k[SHIFT - 1]);
        self.pos = 0;
    }

    /// The next 32-bit output.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        if self.pos >= MT_WORDS {
            self.refill();
        }
        let y = self.key[self.pos];
        self.pos += 1;
        temper(y)
    }

    /// The next 64-bit output: two 32-bit ones, the first in the high half.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// `out[k] = self.random_interval(top - k)` for every `k` in order (`top` at least
    /// `out.len() - 1`): the same values and the same state afterwards as that loop, which is
    /// what a Fisher–Yates shuffle draws. Within one refill of the words and one power of two
    /// of the bound, each word is tempered and masked apart from the others, and only the
    /// count of accepted draws is carried from word to word (no branch on a rejection).
    pub fn intervals_down(&mut self, top: u64, out: &mut [u64]) {
        assert!(
            out.len() as u64 <= top.saturating_add(1),
            "bounds down from top stay at least 0"
        );
        let mut k = 0;
        while k < out.len() {
            let max = top - k as u64;
            if max == 0 {
                out[k] = 0; // random_interval(0) reads no word
                k += 1;
                continue;
            }
            if self.pos >= MT_WORDS {
                self.refill();
            }
            let avail = MT_WORDS - self.pos;
            // The fast run reads at most `avail` words, so its bound falls at most that far;
            // it needs one mask (one power of two) and a bound of at least 1 throughout
            // (a bound of 0 draws no word).
            let mask = u64::MAX >> max.leading_zeros();
            let lowest = max.saturating_sub(avail as u64);
            if max > u64::from(u32::MAX) || lowest == 0 || mask >> 1 >= lowest {
                out[k] = self.random_interval(max);
                k += 1;
                continue;
            }
            let (read, accepted) =
                accept_run(&self.key[self.pos..], mask as u32, max, &mut out[k..]);
            self.pos += read;
            k += accepted;
        }
    }

    /// numpy's `random_interval(max)`: uniform in `[0, max]` by masked rejection.
    #[inline]
    pub fn random_interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        if max <= u64::from(u32::MAX) {
            let mask = mask as u32;
            loop {
                let v = self.next_u32() & mask;
                if u64::from(v) <= max {
                    return u64::from(v);
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }
}

/// Words tempered and tested at once by [`accept_run`].
const GROUP: usize = 8;

/// The masked rejection over a run of state `words` (one mask, bounds `max`, `max - 1`, ...
/// all at least 1): the word read for draw `a` is accepted when, tempered and masked, it is at
/// most `max - a`. Fills `out` from its start and returns how many words it read and how many
/// draws it made (it stops at the words' end or when `out` is full).
///
/// Words go a group at a time: a word at most the group's lowest bound is accepted and one
/// above its highest rejected whatever the group's earlier words did, so the group needs no
/// word-to-word test unless a word falls in the `GROUP - 1` values between (a group does with
/// a chance of about `GROUP * (GROUP - 1)` in `mask + 1`), which it then takes one word at a
/// time.
#[inline]
fn accept_run(words: &[u32], mask: u32, max: u64, out: &mut [u64]) -> (usize, usize) {
    let room = out.len();
    // The word-by-word step: draw `a` takes `v`, accepted when at most its bound `max - a`.
    let exact = |out: &mut [u64], a: usize, v: u64| {
        out[a] = v;
        a + usize::from(v <= max - a as u64)
    };
    let mut accepted = 0usize;
    let mut read = 0usize;
    while read + GROUP <= words.len() && accepted + GROUP <= room {
        let high = max - accepted as u64; // the bound of the group's first draw
        let low = high - (GROUP as u64 - 1); // its last one's, at the lowest
        let mut v = [0u64; GROUP];
        let mut between = false;
        for (v, &w) in v.iter_mut().zip(&words[read..read + GROUP]) {
            *v = u64::from(temper(w) & mask);
            between |= *v > low && *v <= high;
        }
        if between {
            for v in v {
                accepted = exact(out, accepted, v);
            }
        } else {
            for v in v {
                out[accepted] = v;
                accepted += usize::from(v <= low);
            }
        }
        read += GROUP;
    }
    for &w in &words[read..] {
        if accepted == room {
            break;
        }
        accepted = exact(out, accepted, u64::from(temper(w) & mask));
        read += 1;
    }
    (read, accepted)
}

/// `RandomState.shuffle` over `buf`'s elements, in place, advancing `mt` as numpy does. Stops
/// early when the call is cancelled (Ctrl-C), the buffer then partly shuffled.
///
/// # Examples
///
/// ```
/// use croupier_core::shuffle::{legacy_shuffle, Mt19937};
///
/// let mut mt = Mt19937::from_genrand_seed(7);
/// let mut v: Vec<u32> = (0..10).collect();
/// legacy_shuffle(&mut v, &mut mt);
/// let mut sorted = v.clone();
/// sorted.sort_unstable();
/// assert_eq!(sorted, (0..10).collect::<Vec<u32>>()); // the same elements, reordered
/// ```
pub fn legacy_shuffle<T: Send>(buf: &mut [T], mt: &mut Mt19937) {
    // Swap number s exchanges element n-1-s with random_interval(n-1-s), s = 0 .. n-2,
    // drawn a block at a time (on a second thread from DRAWS_APART_FROM elements).
    let n = buf.len();
    drawn_steps(
        buf,
        n.saturating_sub(1),
        |s, block| mt.intervals_down((n - 1 - s) as u64, block),
        |buf, s, j| buf.swap(n - 1 - s, j),
    );
}

/// [`legacy_shuffle`] over the rows of `bytes`, `row` bytes each (numpy's shuffle of a
/// C-contiguous array along its first axis): the same draws, whole rows swapped.
pub fn legacy_shuffle_rows(bytes: &mut [u8], row: usize, mt: &mut Mt19937) {
    assert!(row > 0 && bytes.len().is_multiple_of(row), "whole rows");
    let n = bytes.len() / row;
    for s in 0..n.saturating_sub(1) {
        if s % CHECK_EVERY == 0 && cancelled() {
            return;
        }
        let i = n - 1 - s;
        let j = mt.random_interval(i as u64) as usize;
        if i != j {
            let (head, tail) = bytes.split_at_mut(i * row);
            head[j * row..(j + 1) * row].swap_with_slice(&mut tail[..row]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shuffle::drawn_steps::DRAWS_APART_FROM;
    use crate::testkit::Lcg;

    #[test]
    fn bulk_draws_are_the_one_at_a_time_ones_and_leave_the_same_state() {
        let mut lcg = Lcg::new(11);
        let mut next = |bound: u64| lcg.below(bound);
        // Tops at and around powers of two (a mask change inside a run), near 2**32 (the
        // 64-bit draws above it), small ones that reach a bound of 1, random ones; lengths
        // from 1 to past two refills; starting at every kind of word position.
        let mut tops: Vec<u64> = vec![1, 2, 3, 600, 624, 625, 1024, 1025, 1 << 20];
        for b in [10u32, 16, 31, 32, 33] {
            tops.extend([(1u64 << b) - 1, 1 << b, (1 << b) + 1, (1 << b) + 700]);
        }
        tops.extend((0..40).map(|_| 1 + next(1 << 40)));
        tops.extend([1 << 63, u64::MAX - 1, u64::MAX]);
        for (case, &top) in tops.iter().enumerate() {
            let seed = case as u32;
            let mut bulk = Mt19937::from_genrand_seed(seed);
            for _ in 0..next(700) {
                bulk.next_u32(); // any position in the words
            }
            let mut one = bulk.clone();
            let len = (1 + next(1500)).min(top.saturating_add(1)) as usize;
            let mut got = vec![u64::MAX; len];
            bulk.intervals_down(top, &mut got);
            let want: Vec<u64> = (0..len as u64)
                .map(|k| one.random_interval(top - k))
                .collect();
            assert_eq!(got, want, "top {top}, len {len}");
            assert_eq!(bulk, one, "state after top {top}, len {len}");
            assert_eq!(bulk.next_u32(), one.next_u32());
        }
        // Nothing drawn, at the end of the words too: nothing moves.
        let mut spent = Mt19937::from_genrand_seed(3);
        for _ in 0..MT_WORDS {
            spent.next_u32();
        }
        let before = spent.clone();
        spent.intervals_down(1 << 20, &mut []);
        assert_eq!(spent, before);
    }

    #[test]
    fn a_run_accepts_group_by_group_as_word_by_word() {
        // Small masks put many words between a group's lowest and highest bound, the case
        // decided word by word; large ones almost none. Every length of words and of room.
        let mut lcg = Lcg::new(5);
        let mut next = |bound: u64| lcg.below(bound);
        for case in 0..3000u64 {
            let len = next(60) as usize;
            let mask = [15u32, 31, 63, 255, (1 << 20) - 1][case as usize % 5];
            let max = (len as u64 + 7 + next(u64::from(mask))).min(u64::from(mask));
            let max = max.max(len as u64 + 7); // bounds stay at least 7 (the run's contract)
            let words: Vec<u32> = (0..len).map(|_| next(1 << 32) as u32).collect();
            let room = next(len as u64 + 2) as usize;
            let mut got = vec![u64::MAX; room];
            let (read, accepted) = accept_run(&words, mask, max, &mut got);
            let (mut want, mut want_read) = (vec![u64::MAX; room], 0);
            let mut a = 0;
            for &w in &words {
                if a == room {
                    break;
                }
                let v = u64::from(temper(w) & mask);
                want[a] = v;
                a += usize::from(v <= max - a as u64);
                want_read += 1;
            }
            assert_eq!((read, accepted), (want_read, a), "case {case}");
            assert_eq!(got[..accepted], want[..a], "case {case}");
        }
    }

    #[test]
    fn the_twister_is_the_reference_one() {
        // rand_mt is the reference mt19937 with init_genrand seeding: the same outputs, across
        // refills, 32- and 64-bit.
        let mut ours = Mt19937::from_genrand_seed(12_345);
        let mut theirs = rand_mt::Mt::new(12_345);
        for _ in 0..3 * MT_WORDS {
            assert_eq!(ours.next_u32(), theirs.next_u32());
        }
        for _ in 0..MT_WORDS {
            assert_eq!(ours.next_u64(), theirs.next_u64());
        }
    }

    /// The textbook loop the prefetching one must equal.
    fn plain(n: usize, mt: &mut Mt19937) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = mt.random_interval(i as u64) as usize;
            v.swap(i, j);
        }
        v
    }

    #[test]
    fn the_drawing_thread_makes_numpys_swaps_and_leaves_its_state() {
        // From DRAWS_APART_FROM swaps on a second thread draws; its last block is partial.
        for n in [DRAWS_APART_FROM + 1, DRAWS_APART_FROM + 3 * 8192 + 78] {
            let start = Mt19937::from_genrand_seed(n as u32 ^ 0x5eed);
            let (mut a, mut b) = (start.clone(), start.clone());
            let mut threaded: Vec<u64> = (0..n as u64).collect();
            legacy_shuffle(&mut threaded, &mut a);
            let want: Vec<u64> = plain(n, &mut b).into_iter().map(u64::from).collect();
            assert_eq!(threaded, want, "n = {n}");
            assert_eq!(a, b, "n = {n}: the state after");
        }
    }

    #[test]
    fn a_cancelled_shuffle_stops_on_one_thread_and_on_two() {
        let cancel = crate::Cancel::new();
        cancel.attach();
        cancel.raise();
        for n in [5000, DRAWS_APART_FROM + 1] {
            let mut mt = Mt19937::from_genrand_seed(3);
            let mut v: Vec<u32> = (0..n as u32).collect();
            legacy_shuffle(&mut v, &mut mt); // returns at once: no block drawn, none swapped
            assert!(
                v.iter().enumerate().all(|(i, &x)| x as usize == i),
                "n = {n}"
            );
        }
        crate::Cancel::detach();
    }

    #[test]
    fn the_lookahead_makes_numpys_swaps_and_leaves_its_state() {
        for n in [0usize, 1, 2, 3, 31, 32, 33, 511, 513, 5000] {
            let start = Mt19937::from_genrand_seed(n as u32);
            let (mut a, mut b) = (start.clone(), start.clone());
            let mut fast: Vec<u32> = (0..n as u32).collect();
            legacy_shuffle(&mut fast, &mut a);
            assert_eq!(fast, plain(n, &mut b), "n = {n}");
            assert_eq!(a, b, "n = {n}: the state after");
            // Rows of 3 bytes: the same order.
            let mut rows: Vec<u8> = (0..n).flat_map(|i| [i as u8, (i >> 8) as u8, 7]).collect();
            let mut c = start.clone();
            legacy_shuffle_rows(&mut rows, 3, &mut c);
            let order: Vec<u32> = rows
                .chunks(3)
                .map(|r| u32::from(r[0]) | u32::from(r[1]) << 8)
                .collect();
            assert_eq!(order, fast, "n = {n}: rows");
            assert_eq!(c, a);
        }
    }

    #[test]
    fn random_interval_draws_by_masked_rejection() {
        // max 5: mask 7, so outputs & 7 above 5 are rejected; 64-bit draws above 2**32 - 1.
        let mut mt = Mt19937::from_genrand_seed(3);
        let mut twin = mt.clone();
        for _ in 0..1000 {
            let got = mt.random_interval(5);
            let want = loop {
                let v = twin.next_u32() & 7;
                if v <= 5 {
                    break u64::from(v);
                }
            };
            assert_eq!(got, want);
        }
        let big = (1u64 << 33) + 5;
        let got = mt.random_interval(big);
        let want = loop {
            let v = twin.next_u64() & ((1 << 34) - 1);
            if v <= big {
                break v;
            }
        };
        assert_eq!(got, want);
        assert_eq!(mt.random_interval(0), 0);
        assert_eq!(mt, twin); // max 0 draws nothing
    }
}

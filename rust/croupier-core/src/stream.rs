//! Random streams, key folding and unbiased bounded draws.
//!
//! # How streams are derived
//!
//! Every random decision in croupier draws from a [`Stream`] named by four 64-bit words:
//! `(seed, epoch, purpose, id)`. The stream is ChaCha8 (Bernstein's ChaCha with 8 rounds, as
//! implemented and tested against reference vectors by the `rand_chacha` crate) whose 256-bit
//! key is those four words in little-endian byte order, in that order, with stream (nonce) 0
//! and block counter 0:
//!
//! ```text
//! key = le64(seed) || le64(epoch) || le64(purpose) || le64(id)
//! ```
//!
//! Why this and not `seed + epoch`: distinct tuples are distinct keys, so two streams can never
//! be the same stream or a shifted copy of one another (as `seed + epoch` or a shared LCG can),
//! and ChaCha is a pseudorandom function of its key, so streams with related keys are as good as
//! independent. Each stream has 2**64 blocks of 64 bytes, far more than any shuffle consumes.
//! ChaCha is integer-only, so the bits are the same on every platform; the SIMD paths of
//! `rand_chacha` produce the same words as the scalar one.
//!
//! # Derived keys
//!
//! Generators that are not ChaCha streams (the per-cell SplitMix64 generators of `deal`, the
//! xoshiro256++ generators of `shuffle`) are keyed by words folded one at a time into a base
//! drawn from a stream, by [`fold`].
//!
//! # Bounded draws
//!
//! [`Stream::below_u32`] and [`Stream::below_u64`] return a uniform integer in `[0, s)` by
//! Lemire's multiply-shift with rejection ("Fast Random Integer Generation in an Interval",
//! ACM TOMACS 2019): exact (no modulo bias) and almost always one multiplication.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use rand_xoshiro::SplitMix64;

/// What a stream is used for; the third word of the key. The values are part of the
/// reproducibility contract: never change or reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
pub(crate) enum Purpose {
    /// The global order of an epoch: a Fisher–Yates permutation of `[0, N)`.
    Permutation = u64::from_le_bytes(*b"permute\0"),
    /// The partition of an epoch into rank shares (`deal::fast_share`); only its first word is
    /// used, as the base of the per-cell keys.
    Share = u64::from_le_bytes(*b"shares\0\0"),
    /// The order inside one block of a rank's share of at most 2**15 values (Fisher–Yates,
    /// `deal::fast_share`).
    ShareOrder = u64::from_le_bytes(*b"inshare\0"),
    /// The bucket shuffle inside one long block of a rank's share (`deal::fast_share`).
    ShareBuckets = u64::from_le_bytes(*b"shbucket"),
    /// The seed of one pass of one dataset of a mixture (`mix::passes`); only its first word
    /// is used.
    MixPass = u64::from_le_bytes(*b"mixpass\0"),
    /// The interleave of a mixture phase: the base of its node keys (`mix::interleave`).
    MixInterleave = u64::from_le_bytes(*b"mixleave"),
    /// The seed of the order of an epoch's batches across buckets (`bucket`); only its first
    /// word is used.
    BucketOrder = u64::from_le_bytes(*b"bkorder\0"),
    /// The seed of one bucket's shuffle in an epoch (`bucket`); only its first word is used.
    BucketShuffle = u64::from_le_bytes(*b"bkshuffl"),
    /// The keys of the order of an epoch's units of batches in the global bucket order
    /// (`class` 0).
    BucketRuns = u64::from_le_bytes(*b"bkruns\0\0"),
    /// The key of the permutation of an epoch's full chunks (`chunk`); only its first word is
    /// used.
    ChunkOrder = u64::from_le_bytes(*b"chkorder"),
    /// The in-memory order of one load request of a rank (`chunk`).
    ChunkSplits = u64::from_le_bytes(*b"chksplit"),
    /// The round keys and small-domain table of an epoch's world-size-invariant order
    /// (`draw::random_access`).
    GlobalOrder = u64::from_le_bytes(*b"globperm"),
    /// The base of the node keys of a mixture phase's world-size-invariant interleave
    /// (`mix::global`).
    GlobalMixInterleave = u64::from_le_bytes(*b"gmixtree"),
    /// The permutation of one leaf of a mixture phase's world-size-invariant interleave
    /// (`mix::global`).
    GlobalMixLeaf = u64::from_le_bytes(*b"gmixleaf"),
    /// The permutation of one pass of one dataset in a mixture's world-size-invariant order
    /// (`mix::global`).
    GlobalMixPass = u64::from_le_bytes(*b"gmixpass"),
}

/// A deterministic random stream; see the module documentation for its derivation.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    rng: ChaCha8Rng,
}

impl Stream {
    /// The stream named by `(seed, epoch, purpose, id)`.
    pub(crate) fn new(seed: u64, epoch: u64, purpose: Purpose, id: u64) -> Self {
        let mut key = [0u8; 32];
        for (chunk, word) in key
            .chunks_exact_mut(8)
            .zip([seed, epoch, purpose as u64, id])
        {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Stream {
            rng: ChaCha8Rng::from_seed(key),
        }
    }

    /// The next 32 random bits.
    #[inline(always)]
    pub(crate) fn next_u32(&mut self) -> u32 {
        self.rng.next_u32()
    }

    /// The next 64 random bits.
    #[inline(always)]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Fills `dst` with the stream's next bytes (ChaCha's output order, so the same on every
    /// platform).
    #[inline(always)]
    pub(crate) fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.rng.fill_bytes(dst);
    }

    /// A uniform integer in `[0, s)`; `s` must be at least 1. Consumes 32-bit words.
    #[inline(always)]
    pub(crate) fn below_u32(&mut self, s: u32) -> u32 {
        let first = self.next_u32();
        lemire_u32(first, s, || self.next_u32())
    }

    /// A uniform integer in `[0, s)`; `s` must be at least 1. Consumes 64-bit words.
    #[inline(always)]
    pub(crate) fn below_u64(&mut self, s: u64) -> u64 {
        lemire_u64(s, || self.next_u64())
    }

    /// A uniform integer in `[0, s)` for any `s >= 1`: a 32-bit draw when `s < 2**32`, a 64-bit
    /// draw otherwise. Which one is used depends on `s` alone, so the sequence is fixed.
    #[inline(always)]
    pub(crate) fn below(&mut self, s: u64) -> u64 {
        if s <= u64::from(u32::MAX) {
            u64::from(self.below_u32(s as u32))
        } else {
            self.below_u64(s)
        }
    }
}

/// Lemire's multiply-shift with rejection on 32-bit words: a uniform integer in `[0, s)`
/// (`s >= 1`) from the word `first`, drawing more words from `next` only in the rare biased
/// zone.
#[inline(always)]
pub(crate) fn lemire_u32(first: u32, s: u32, mut next: impl FnMut() -> u32) -> u32 {
    debug_assert!(s > 0);
    let mut m = u64::from(first) * u64::from(s);
    if (m as u32) < s {
        // Only here can the low half fall in the biased zone; t = 2**32 mod s.
        let t = s.wrapping_neg() % s;
        while (m as u32) < t {
            m = u64::from(next()) * u64::from(s);
        }
    }
    (m >> 32) as u32
}

/// Lemire's method on 64-bit words from `next`: a uniform integer in `[0, s)`, `s >= 1`.
#[inline(always)]
pub(crate) fn lemire_u64(s: u64, mut next: impl FnMut() -> u64) -> u64 {
    debug_assert!(s > 0);
    let mut m = u128::from(next()) * u128::from(s);
    if (m as u64) < s {
        let t = s.wrapping_neg() % s;
        while (m as u64) < t {
            m = u128::from(next()) * u128::from(s);
        }
    }
    (m >> 64) as u64
}

/// Folds one word into a running 64-bit hash: `h = splitmix64(h ^ word)`, where
/// `splitmix64(x)` is the first output of a SplitMix64 generator whose state is `x`. Keys
/// derived from several words (a cell's coordinates, a bucket-tree path, a layout) are folded
/// one word at a time from a base drawn from a [`Stream`].
#[inline(always)]
pub(crate) fn fold(h: u64, word: u64) -> u64 {
    SplitMix64::from_seed((h ^ word).to_le_bytes()).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout_is_the_documented_one() {
        // The stream must equal ChaCha8 keyed by the four little-endian words.
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&7u64.to_le_bytes());
        key[8..16].copy_from_slice(&3u64.to_le_bytes());
        key[16..24].copy_from_slice(b"permute\0");
        key[24..].copy_from_slice(&9u64.to_le_bytes());
        let mut reference = ChaCha8Rng::from_seed(key);
        let mut s = Stream::new(7, 3, Purpose::Permutation, 9);
        for _ in 0..100 {
            assert_eq!(s.next_u64(), reference.next_u64());
        }
    }

    #[test]
    fn every_word_of_the_name_changes_the_stream() {
        let base = Stream::new(1, 2, Purpose::Permutation, 3).next_u64();
        assert_ne!(base, Stream::new(0, 2, Purpose::Permutation, 3).next_u64());
        assert_ne!(base, Stream::new(1, 0, Purpose::Permutation, 3).next_u64());
        assert_ne!(base, Stream::new(1, 2, Purpose::Permutation, 0).next_u64());
        // seed + epoch collisions of naive schemes do not collide here.
        assert_ne!(
            Stream::new(1, 2, Purpose::Permutation, 0).next_u64(),
            Stream::new(2, 1, Purpose::Permutation, 0).next_u64()
        );
    }

    #[test]
    fn value_stability_pins() {
        // Deliberate pins: if these change, every order croupier produces changes.
        let mut s = Stream::new(0, 0, Purpose::Permutation, 0);
        let words: Vec<u64> = (0..3).map(|_| s.next_u64()).collect();
        assert_eq!(words, PINNED_WORDS);
        let mut s = Stream::new(42, 1, Purpose::Permutation, 0);
        let draws: Vec<u64> = (0..8).map(|_| s.below(10)).collect();
        assert_eq!(draws, PINNED_BELOW_10);
    }
    #[test]
    fn value_stability_pins_of_64_bit_draws() {
        // Fisher-Yates above 2**32 mixes 64-bit draws (large bounds) with 32-bit ones.
        let mut s = Stream::new(9, 9, Purpose::Permutation, 9);
        let bounds = [(1u64 << 40) + 3; 8].into_iter().chain([10; 8]);
        let draws: Vec<u64> = bounds.map(|b| s.below(b)).collect();
        assert_eq!(draws, PINNED_MIXED);
    }
    const PINNED_MIXED: [u64; 16] = [
        1002180059143,
        157194893221,
        395152959690,
        536152183662,
        544225188860,
        330522415174,
        94260915862,
        1072273077596,
        9,
        4,
        6,
        3,
        2,
        0,
        4,
        3,
    ];
    const PINNED_WORDS: [u64; 3] = [
        17947797500973523001,
        5021877485143777366,
        994403889596663309,
    ];
    const PINNED_BELOW_10: [u64; 8] = [7, 5, 8, 8, 5, 1, 2, 9];

    #[test]
    fn below_covers_the_range_without_bias() {
        // Chi-square over 7 cells (a bound that does not divide 2**32), 70_000 draws.
        let mut s = Stream::new(5, 0, Purpose::Permutation, 0);
        let mut counts = [0u64; 7];
        for _ in 0..70_000 {
            counts[s.below_u32(7) as usize] += 1;
        }
        let expected = 10_000.0;
        let chi2 = crate::testkit::chi2_flat(&counts, expected);
        // 6 degrees of freedom: P(chi2 > 22.46) = 0.001.
        assert!(chi2 < 22.46, "chi2 = {chi2}, counts = {counts:?}");
    }

    #[test]
    fn below_stays_in_range_at_the_extremes() {
        let mut s = Stream::new(1, 1, Purpose::Permutation, 1);
        for bound in [
            1u64,
            2,
            3,
            u32::MAX as u64,
            1 << 32,
            (1 << 32) + 1,
            u64::MAX,
        ] {
            for _ in 0..1000 {
                assert!(s.below(bound) < bound);
            }
        }
        assert_eq!(s.below(1), 0);
    }

    #[test]
    fn below_u64_rejects_in_the_biased_zone() {
        // With s = 2**63 + 1 almost half of all products land in the rejected zone; the result
        // must still be in range and both halves of the range must be hit.
        let s_bound = (1u64 << 63) + 1;
        let mut s = Stream::new(3, 0, Purpose::Permutation, 0);
        let (mut low, mut high) = (0, 0);
        for _ in 0..2000 {
            let x = s.below_u64(s_bound);
            assert!(x < s_bound);
            if x < s_bound / 2 {
                low += 1
            } else {
                high += 1
            }
        }
        assert!(low > 800 && high > 800, "low {low} high {high}");
    }
}

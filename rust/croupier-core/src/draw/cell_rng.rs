//! Per-cell random sources for the recursive splitting in [`crate::deal::class_split`] and the
//! bucket counts of [`crate::deal::seekable`].
//!
//! The splitting engine makes one random decision per *cell* (a value range crossed with a
//! class range), and every rank that needs a cell must make the same decision without talking
//! to the others, whatever else it computed before. So each cell gets its own generator, keyed
//! by the cell's coordinates, instead of a position in a shared stream.
//!
//! A cell's key is a 64-bit hash of `(base, lo, hi, a, b)`: starting from `base` (64 bits drawn
//! from the ChaCha8 [`crate::stream::Stream`] of the epoch, so seeds map to keys through
//! ChaCha), each word is folded in by [`crate::stream::fold`] as `h = splitmix64(h ^ word)`,
//! where `splitmix64(x)` is the first output of a SplitMix64 generator whose state is `x`. The
//! cell's random words are then the outputs of a SplitMix64 generator (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", OOPSLA 2014; the `rand_xoshiro`
//! implementation) seeded with that key.
//!
//! Why not a ChaCha stream per cell: a rank visits millions of cells and most use one or two
//! words, while keying a ChaCha8 stream generates a 256-byte block first, against one
//! multiply-xorshift round per word for SplitMix64 (measured costs: `docs/performance.md`).
//! SplitMix64 passes BigCrush, its outputs are a bijective mix of a counter, and integer-only
//! arithmetic makes them identical on every platform.

use rand_core::{Rng, SeedableRng};
use rand_xoshiro::SplitMix64;

use crate::stream::{fold, lemire_u32, lemire_u64};

/// The generator of one cell.
#[derive(Debug, Clone)]
pub(crate) struct CellRng {
    rng: SplitMix64,
}

impl CellRng {
    /// The generator keyed by `key` (already folded from the cell's coordinates).
    #[inline(always)]
    pub(crate) fn new(key: u64) -> Self {
        CellRng {
            rng: SplitMix64::from_seed(key.to_le_bytes()),
        }
    }

    /// The generator of cell `(lo, hi) x (a, b)` under `base`.
    #[inline(always)]
    pub(crate) fn for_cell(base: u64, lo: u64, hi: u64, a: u64, b: u64) -> Self {
        CellRng::new(fold(fold(fold(fold(base, lo), hi), a), b))
    }

    /// The next 64 random bits.
    #[inline(always)]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A uniform integer in `[0, s)`, `s >= 1`, by Lemire's multiply-shift with rejection
    /// (exact, no modulo bias).
    #[inline(always)]
    pub(crate) fn below(&mut self, s: u64) -> u64 {
        lemire_u64(s, || self.next_u64())
    }

    /// Two uniform integers in `[0, s1)` and `[0, s2)` (`1 <= s <= 2**32`) from one 64-bit
    /// word (its low and high halves, Lemire's method on each; a rejected half draws a fresh
    /// word of its own).
    #[inline(always)]
    pub(crate) fn below_pair(&mut self, s1: u32, s2: u32) -> (u32, u32) {
        let x = self.next_u64();
        let a = lemire_u32(x as u32, s1, || self.next_u64() as u32);
        let b = lemire_u32((x >> 32) as u32, s2, || self.next_u64() as u32);
        (a, b)
    }

    /// A uniform double in `(0, 1]` with 53 random bits (never 0, so its logarithm is finite).
    #[inline(always)]
    pub(crate) fn unit_open0(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // SplitMix64 from state 0 (Vigna's reference implementation, splitmix64.c).
        let mut r = CellRng::new(0);
        assert_eq!(r.next_u64(), 0xe220a8397b1dcdaf);
        assert_eq!(r.next_u64(), 0x6e789e6aa1b965f4);
        assert_eq!(r.next_u64(), 0x06c45d188009454f);
    }

    #[test]
    fn every_coordinate_changes_the_cell() {
        let base = CellRng::for_cell(1, 2, 3, 4, 5).next_u64();
        for (i, c) in [
            CellRng::for_cell(0, 2, 3, 4, 5),
            CellRng::for_cell(1, 0, 3, 4, 5),
            CellRng::for_cell(1, 2, 0, 4, 5),
            CellRng::for_cell(1, 2, 3, 0, 5),
            CellRng::for_cell(1, 2, 3, 4, 0),
            CellRng::for_cell(1, 3, 2, 4, 5),
            CellRng::for_cell(1, 2, 3, 5, 4),
        ]
        .into_iter()
        .enumerate()
        {
            assert_ne!(c.clone().next_u64(), base, "coordinate change {i}");
        }
    }

    #[test]
    fn unit_is_in_the_half_open_interval() {
        let mut r = CellRng::new(3);
        for _ in 0..10_000 {
            let u = r.unit_open0();
            assert!(u > 0.0 && u <= 1.0);
        }
    }
}

//! Seeded Fisher–Yates permutations.
//!
//! The shuffle is Durstenfeld's in-place Fisher–Yates, walking from the last position down:
//! for `i = n-1, …, 1` swap `buf[i]` with `buf[j]`, `j` uniform in `[0, i]` from
//! [`Stream::below`]. With an exact bounded draw every one of the `n!` orders is equally likely
//! (given an ideal stream).

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::error::Result;
use crate::index::{try_with_capacity_huge, Index};
use crate::stream::Stream;

/// How many swaps ahead the swap target is drawn and prefetched, for buffers past the
/// last-level cache where every swap is a cache miss: drawing targets this far ahead lets those
/// misses overlap. The draws are made in exactly the same order as without lookahead, so the
/// result is unchanged. (The leaves of the parallel permutation, which fit the last-level
/// cache, have a loop and a distance of their own: [`crate::shuffle::parallel`].)
pub(crate) const LOOKAHEAD: usize = 32;

#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Makes `swaps` swaps on `buf`: swap number `s` exchanges `buf[at(s)]` with `buf[draw(s)]`.
/// The draws are made in order `s = 0, 1, …` as the plain loop would make them, but each one
/// `AHEAD` swaps before it is used (usually [`LOOKAHEAD`]), so its target can be prefetched.
pub(crate) fn swaps_with_lookahead<T, const AHEAD: usize>(
    buf: &mut [T],
    swaps: usize,
    at: impl Fn(usize) -> usize,
    mut draw: impl FnMut(usize) -> usize,
) {
    let mut ring = [0usize; AHEAD];
    for (s, slot) in ring.iter_mut().enumerate().take(swaps) {
        *slot = draw(s);
        prefetch(buf.as_ptr().wrapping_add(*slot));
    }
    for s in 0..swaps {
        if s % CHECK_EVERY == 0 && cancelled() {
            return; // the caller discards the buffer
        }
        let slot = s % AHEAD;
        let target = ring[slot];
        if s + AHEAD < swaps {
            ring[slot] = draw(s + AHEAD);
            prefetch(buf.as_ptr().wrapping_add(ring[slot]));
        }
        buf.swap(at(s), target);
    }
}

/// Shuffles `buf` in place with the draws of `stream`.
pub(crate) fn fisher_yates<T: Index>(buf: &mut [T], stream: &mut Stream) {
    let n = buf.len();
    // Swap number s exchanges position n-1-s with a uniform position in [0, n-1-s].
    let swaps = n.saturating_sub(1);
    swaps_with_lookahead::<_, LOOKAHEAD>(
        buf,
        swaps,
        |s| n - 1 - s,
        |s| stream.below((n - s) as u64) as usize,
    );
}

/// `[0, n)` in order, in a freshly allocated buffer (huge pages: a shuffle reads it at
/// random, see `try_with_capacity_huge`); from [`IDENTITY_PAR_FROM`] values written by every
/// core, so that its first touch (page faults, up to 2 s a GB on a fresh VM) is spread.
pub(crate) fn identity<T: Index>(n: u64) -> Result<Vec<T>> {
    if n >= IDENTITY_PAR_FROM {
        return crate::index::range_par(n);
    }
    let mut v = try_with_capacity_huge::<T>("an index buffer", n)?;
    v.extend((0..n).map(T::from_u64));
    Ok(v)
}

/// Values from which [`identity`] writes on every core (below, a pool's wake-up costs more
/// than the writes).
const IDENTITY_PAR_FROM: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shuffle::parallel::{fill, permutation};
    use crate::stream::Purpose;

    fn perm(n: u64, seed: u64, epoch: u64) -> Vec<u64> {
        permutation(n, seed, epoch).unwrap().to_u64_vec()
    }

    #[test]
    fn is_a_permutation_for_every_small_n() {
        for n in 0..200u64 {
            let mut p = perm(n, n, 1);
            assert_eq!(p.len() as u64, n);
            p.sort_unstable();
            assert!(p.iter().copied().eq(0..n), "n = {n}");
        }
    }

    #[test]
    fn deterministic_and_seed_and_epoch_sensitive() {
        assert_eq!(perm(1000, 3, 4), perm(1000, 3, 4));
        assert_ne!(perm(1000, 3, 4), perm(1000, 3, 5));
        assert_ne!(perm(1000, 3, 4), perm(1000, 4, 4));
    }

    #[test]
    fn all_orders_of_four_equally_likely() {
        // 24 orders, 48_000 seeds: chi-square with 23 degrees of freedom.
        let (orders, chi2) = crate::testkit::orders_chi2(24, 48_000, |seed| perm(4, seed, 0));
        assert_eq!(orders, 24);
        // P(chi2 > 49.73 | 23 dof) = 0.001.
        assert!(chi2 < 49.73, "chi2 = {chi2}");
    }

    #[test]
    fn lookahead_draws_in_the_textbook_order() {
        // The prefetching loop must make the same swaps as Durstenfeld's plain loop.
        for n in [
            0usize,
            1,
            2,
            3,
            LOOKAHEAD - 1,
            LOOKAHEAD,
            LOOKAHEAD + 1,
            1000,
        ] {
            let mut fast: Vec<u32> = (0..n as u32).collect();
            fisher_yates(&mut fast, &mut Stream::new(4, 2, Purpose::Permutation, 0));
            let mut plain: Vec<u32> = (0..n as u32).collect();
            let mut stream = Stream::new(4, 2, Purpose::Permutation, 0);
            for i in (1..n).rev() {
                let j = stream.below(i as u64 + 1) as usize;
                plain.swap(i, j);
            }
            assert_eq!(fast, plain, "n = {n}");
        }
    }

    #[test]
    fn u32_and_u64_buffers_share_one_algorithm() {
        // The buffer type is chosen by n; the shuffle of a u64 buffer must equal the u32 one.
        let (mut a, mut b) = (vec![0u32; 5000], vec![0u64; 5000]);
        fill(&mut a, 9, 2);
        fill(&mut b, 9, 2);
        assert!(a.iter().map(|&x| x as u64).eq(b.iter().copied()));
    }

    #[test]
    fn value_stability_pins() {
        // Deliberate pins of the per-rank order: a change here is a breaking change.
        assert_eq!(perm(10, 0, 0), PIN_10_0_0);
        assert_eq!(perm(10, 1234, 7), PIN_10_1234_7);
    }
    const PIN_10_0_0: [u64; 10] = [5, 2, 6, 9, 0, 4, 7, 1, 8, 3];
    const PIN_10_1234_7: [u64; 10] = [1, 2, 8, 5, 6, 0, 7, 9, 3, 4];

    #[test]
    fn too_long_is_refused() {
        assert!(permutation(crate::index::MAX_LEN + 1, 0, 0).is_err());
    }
}

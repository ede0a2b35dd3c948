//! The bulk of [`RandomAccessPermutation::fill_strided`] for domains of at most [`MAX_N`]
//! positions: every step in 32-bit vector lanes (the positions' walk, the split into halves,
//! the rounds, the join and the range check), where the general path moves each position
//! through scalar code around its vector rounds (3.7 ns a position on one thread at 1e6). The
//! same integer arithmetic as [`RandomAccessPermutation::encrypt_lanes`], so the same values;
//! the values outside `[0, n)` are encrypted again in whole vectors too (cycle walking).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{round, RandomAccessPermutation, Walk, MIX1, MIX2, ROUNDS};
use crate::simd::Simd;
use crate::Index;

/// Domains up to this size take these kernels: every position, value and walk length fits a
/// 32-bit lane (every index of a `u32` index buffer).
pub(super) const MAX_N: u64 = u32::MAX as u64;

/// Most lanes a group encrypts at once (`C` vectors of [`Lanes::WIDTH`] in [`fill_with`]).
const MOST: usize = 64;
/// AVX-512 vectors encrypted side by side (four: 1.5 against 2.0 ns a position for two);
/// fewer for blocks shorter than their lanes (a group of 64 cost more than the scalar walks of
/// a block of 16 to 40 positions).
#[cfg(target_arch = "x86_64")]
const CH512: usize = 4;

/// A vector of 32-bit lanes and the operations the cipher needs.
trait Lanes: Copy {
    /// Lanes in a vector.
    const WIDTH: usize;
    unsafe fn splat(x: u32) -> Self;
    /// The first [`Self::WIDTH`] values of `a`.
    unsafe fn load(a: &[u32]) -> Self;
    /// Into the first [`Self::WIDTH`] values of `a`.
    unsafe fn store(self, a: &mut [u32]);
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn and(self, o: Self) -> Self;
    unsafe fn or(self, o: Self) -> Self;
    /// `self + step` where `self` is below `back`, else `self - back` (unsigned): a walk's
    /// step modulo its length (`back` = length - step).
    unsafe fn wrap_add(self, step: Self, back: Self) -> Self;
    unsafe fn shr(self, bits: u32) -> Self;
    unsafe fn shl(self, bits: u32) -> Self;
    /// [`super::round`] of each lane under `key`.
    unsafe fn round(self, key: Self) -> Self;
    /// Bit `j` set where lane `j` exceeds `o`'s (unsigned).
    unsafe fn above(self, o: Self) -> u64;
}

/// Eight lanes in plain Rust, for CPUs without AVX2 (and to test the kernels' logic anywhere).
#[derive(Clone, Copy)]
struct Portable([u32; 8]);

impl Portable {
    #[inline(always)]
    fn map2(self, o: Self, f: impl Fn(u32, u32) -> u32) -> Self {
        Portable(std::array::from_fn(|j| f(self.0[j], o.0[j])))
    }
}

impl Lanes for Portable {
    const WIDTH: usize = 8;
    unsafe fn splat(x: u32) -> Self {
        Portable([x; 8])
    }
    unsafe fn load(a: &[u32]) -> Self {
        Portable(a[..8].try_into().expect("8 lanes"))
    }
    unsafe fn store(self, a: &mut [u32]) {
        a[..8].copy_from_slice(&self.0);
    }
    unsafe fn add(self, o: Self) -> Self {
        self.map2(o, u32::wrapping_add)
    }
    unsafe fn and(self, o: Self) -> Self {
        self.map2(o, |a, b| a & b)
    }
    unsafe fn or(self, o: Self) -> Self {
        self.map2(o, |a, b| a | b)
    }
    unsafe fn wrap_add(self, step: Self, back: Self) -> Self {
        Portable(std::array::from_fn(|j| {
            let a = self.0[j];
            if a < back.0[j] {
                a + step.0[j]
            } else {
                a - back.0[j]
            }
        }))
    }
    unsafe fn shr(self, bits: u32) -> Self {
        Portable(self.0.map(|a| a >> bits))
    }
    unsafe fn shl(self, bits: u32) -> Self {
        Portable(self.0.map(|a| a << bits))
    }
    unsafe fn round(self, key: Self) -> Self {
        self.map2(key, round)
    }
    unsafe fn above(self, o: Self) -> u64 {
        (0..8).fold(0, |bits, j| bits | u64::from(self.0[j] > o.0[j]) << j)
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m256i {
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn splat(x: u32) -> Self {
        _mm256_set1_epi32(x as i32)
    }
    #[inline(always)]
    unsafe fn load(a: &[u32]) -> Self {
        assert!(a.len() >= 8);
        _mm256_loadu_si256(a.as_ptr().cast())
    }
    #[inline(always)]
    unsafe fn store(self, a: &mut [u32]) {
        assert!(a.len() >= 8);
        _mm256_storeu_si256(a.as_mut_ptr().cast(), self)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        _mm256_add_epi32(self, o)
    }
    #[inline(always)]
    unsafe fn and(self, o: Self) -> Self {
        _mm256_and_si256(self, o)
    }
    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        _mm256_or_si256(self, o)
    }
    #[inline(always)]
    unsafe fn wrap_add(self, step: Self, back: Self) -> Self {
        let wraps = _mm256_cmpeq_epi32(_mm256_max_epu32(self, back), self); // self >= back
        _mm256_blendv_epi8(
            _mm256_add_epi32(self, step),
            _mm256_sub_epi32(self, back),
            wraps,
        )
    }
    #[inline(always)]
    unsafe fn shr(self, bits: u32) -> Self {
        _mm256_srl_epi32(self, _mm_cvtsi32_si128(bits as i32))
    }
    #[inline(always)]
    unsafe fn shl(self, bits: u32) -> Self {
        _mm256_sll_epi32(self, _mm_cvtsi32_si128(bits as i32))
    }
    #[inline(always)]
    unsafe fn round(self, key: Self) -> Self {
        super::avx2::round8(self, key)
    }
    #[inline(always)]
    unsafe fn above(self, o: Self) -> u64 {
        // Unsigned through the signed compare: both with the sign bit flipped.
        let flip = _mm256_set1_epi32(i32::MIN);
        let gt = _mm256_cmpgt_epi32(_mm256_xor_si256(self, flip), _mm256_xor_si256(o, flip));
        _mm256_movemask_ps(_mm256_castsi256_ps(gt)) as u32 as u64
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for __m512i {
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn splat(x: u32) -> Self {
        _mm512_set1_epi32(x as i32)
    }
    #[inline(always)]
    unsafe fn load(a: &[u32]) -> Self {
        assert!(a.len() >= 16);
        _mm512_loadu_si512(a.as_ptr().cast())
    }
    #[inline(always)]
    unsafe fn store(self, a: &mut [u32]) {
        assert!(a.len() >= 16);
        _mm512_storeu_si512(a.as_mut_ptr().cast(), self)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        _mm512_add_epi32(self, o)
    }
    #[inline(always)]
    unsafe fn and(self, o: Self) -> Self {
        _mm512_and_si512(self, o)
    }
    #[inline(always)]
    unsafe fn or(self, o: Self) -> Self {
        _mm512_or_si512(self, o)
    }
    #[inline(always)]
    unsafe fn wrap_add(self, step: Self, back: Self) -> Self {
        let wraps = _mm512_cmpge_epu32_mask(self, back);
        _mm512_mask_sub_epi32(_mm512_add_epi32(self, step), wraps, self, back)
    }
    #[inline(always)]
    unsafe fn shr(self, bits: u32) -> Self {
        _mm512_srl_epi32(self, _mm_cvtsi32_si128(bits as i32))
    }
    #[inline(always)]
    unsafe fn shl(self, bits: u32) -> Self {
        _mm512_sll_epi32(self, _mm_cvtsi32_si128(bits as i32))
    }
    #[inline(always)]
    unsafe fn round(self, key: Self) -> Self {
        let mut z = _mm512_mullo_epi32(_mm512_xor_si512(self, key), _mm512_set1_epi32(MIX1 as i32));
        z = _mm512_xor_si512(z, _mm512_srli_epi32::<13>(z));
        z = _mm512_mullo_epi32(z, _mm512_set1_epi32(MIX2 as i32));
        _mm512_xor_si512(z, _mm512_srli_epi32::<16>(z))
    }
    #[inline(always)]
    unsafe fn above(self, o: Self) -> u64 {
        u64::from(_mm512_cmpgt_epu32_mask(self, o))
    }
}

/// `block[j]` = the value at the `j`-th position of `walk`, for a permutation of at most
/// [`MAX_N`] positions and no table, with the kernels of `simd`.
///
/// # Safety
///
/// `simd` is a level this CPU runs ([`Simd::best`] or one below it).
pub(super) unsafe fn fill<T: Index>(
    p: &RandomAccessPermutation,
    block: &mut [T],
    walk: Walk,
    simd: Simd,
) {
    debug_assert!(p.table.is_empty() && p.n <= MAX_N && walk.offset + walk.len <= p.n);
    debug_assert!(simd <= Simd::best());
    debug_assert!(block.len() <= u32::MAX as usize);
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd` is a level this CPU runs (the caller's promise).
        Simd::Avx512 => unsafe { fill_avx512(p, block, walk) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Simd::Avx2 => unsafe { fill_avx2(p, block, walk) },
        // SAFETY: `Portable`'s operations are plain Rust.
        _ => unsafe { fill_with::<Portable, T, 4>(p, block, walk) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2<T: Index>(p: &RandomAccessPermutation, block: &mut [T], walk: Walk) {
    fill_with::<__m256i, T, 4>(p, block, walk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_avx512<T: Index>(p: &RandomAccessPermutation, block: &mut [T], walk: Walk) {
    match block.len() {
        0..32 => fill_with::<__m512i, T, 1>(p, block, walk),
        32..64 => fill_with::<__m512i, T, 2>(p, block, walk),
        _ => fill_with::<__m512i, T, CH512>(p, block, walk),
    }
}

/// A permutation's constants in vectors, and one encryption of `C` vectors side by side
/// (independent chains of rounds, whose multiplies overlap).
struct Cipher<V> {
    lo_bits: u32,
    hi_mask: V,
    lo_mask: V,
    /// `n - 1`: a value above it is outside the domain.
    last: V,
    keys: [V; ROUNDS],
}

impl<V: Lanes> Cipher<V> {
    #[inline(always)]
    unsafe fn new(p: &RandomAccessPermutation) -> Self {
        let mut keys = [V::splat(0); ROUNDS];
        for (k, &key) in keys.iter_mut().zip(&p.keys) {
            *k = V::splat(key);
        }
        Cipher {
            lo_bits: p.lo_bits,
            hi_mask: V::splat(p.hi_mask),
            lo_mask: V::splat(p.lo_mask),
            last: V::splat((p.n - 1) as u32),
            keys,
        }
    }

    /// One encryption of each lane of `x` (each below `2**k`) into `out`, its lanes in order;
    /// bit `j` of the result set where lane `j`'s value is outside `[0, n)`.
    #[inline(always)]
    unsafe fn encrypt<const C: usize>(&self, x: [V; C], out: &mut [u32]) -> u64 {
        let (mut h, mut l) = ([V::splat(0); C], [V::splat(0); C]);
        for c in 0..C {
            h[c] = x[c].shr(self.lo_bits);
            l[c] = x[c].and(self.lo_mask);
        }
        for (i, &key) in self.keys.iter().enumerate() {
            for c in 0..C {
                if i % 2 == 0 {
                    h[c] = h[c].add(l[c].round(key)).and(self.hi_mask);
                } else {
                    l[c] = l[c].add(h[c].round(key)).and(self.lo_mask);
                }
            }
        }
        let mut outside = 0u64;
        for c in 0..C {
            let v = h[c].shl(self.lo_bits).or(l[c]);
            v.store(&mut out[c * V::WIDTH..]);
            outside |= v.above(self.last) << (c * V::WIDTH);
        }
        outside
    }
}

/// [`fill`] with `C` vectors of `V` at a time: one encryption of every position into `block`
/// (a short last group computes a whole group and keeps its first values), then the values
/// outside `[0, n)` encrypted again, packed into whole groups, until inside (cycle walking).
///
/// # Safety
///
/// The CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn fill_with<V: Lanes, T: Index, const C: usize>(
    p: &RandomAccessPermutation,
    block: &mut [T],
    mut walk: Walk,
) {
    let w = V::WIDTH;
    let group = w * C;
    // A group fits `buf`, and its out-of-range lanes the bits of a `u64`.
    const { assert!(V::WIDTH * C <= MOST) };
    let cipher = Cipher::<V>::new(p);
    // Each lane's position in `[0, len)`, before the walk's offset: the group's first
    // positions, each lane then advancing by a group's steps modulo `len`.
    let mut buf = [0u32; MOST];
    for v in &mut buf[..group] {
        *v = (walk.next() - walk.offset) as u32;
    }
    let mut at = [V::splat(0); C];
    for (c, a) in at.iter_mut().enumerate() {
        *a = V::load(&buf[c * w..]);
    }
    let advance = (group as u64 * walk.step) % walk.len;
    let (advance, back) = (
        V::splat(advance as u32),
        V::splat((walk.len - advance) as u32),
    );
    let offset = V::splat(walk.offset as u32);
    let mut outside = Outside::new();
    for first in (0..block.len()).step_by(group) {
        let mut x = [V::splat(0); C];
        for c in 0..C {
            x[c] = at[c].add(offset);
            at[c] = at[c].wrap_add(advance, back);
        }
        let bits = cipher.encrypt(x, &mut buf);
        let len = group.min(block.len() - first);
        outside.keep::<V, T, C>(&cipher, block, (&buf, bits), (first, len));
    }
    outside.finish::<V, T, C>(&cipher, block);
}

/// `block[j]` = the value at position `positions[j]`, for a permutation of at most [`MAX_N`]
/// positions and no table, with the kernels of `simd`: [`fill`] for positions in any order
/// (a mixture's draws of one pass, gathered from among the other passes').
///
/// # Safety
///
/// `simd` is a level this CPU runs, and every position is below the permutation's `n`.
pub(super) unsafe fn fill_at<T: Index>(
    p: &RandomAccessPermutation,
    positions: &[u32],
    block: &mut [T],
    simd: Simd,
) {
    debug_assert!(p.table.is_empty() && p.n <= MAX_N && positions.len() == block.len());
    debug_assert!(positions.iter().all(|&x| u64::from(x) < p.n));
    debug_assert!(simd <= Simd::best());
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `simd` is a level this CPU runs (the caller's promise).
        Simd::Avx512 => unsafe { fill_at_avx512(p, positions, block) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Simd::Avx2 => unsafe { fill_at_avx2(p, positions, block) },
        // SAFETY: `Portable`'s operations are plain Rust.
        _ => unsafe { fill_at_with::<Portable, T, 4>(p, positions, block) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_at_avx2<T: Index>(p: &RandomAccessPermutation, positions: &[u32], block: &mut [T]) {
    // Fewer chains for few positions: a group's lanes past them are encrypted for nothing.
    match block.len() {
        0..16 => fill_at_with::<__m256i, T, 1>(p, positions, block),
        16..32 => fill_at_with::<__m256i, T, 2>(p, positions, block),
        _ => fill_at_with::<__m256i, T, 4>(p, positions, block),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_at_avx512<T: Index>(
    p: &RandomAccessPermutation,
    positions: &[u32],
    block: &mut [T],
) {
    match block.len() {
        0..32 => fill_at_with::<__m512i, T, 1>(p, positions, block),
        32..64 => fill_at_with::<__m512i, T, 2>(p, positions, block),
        _ => fill_at_with::<__m512i, T, CH512>(p, positions, block),
    }
}

/// [`fill_at`] with `C` vectors of `V` at a time, as [`fill_with`] encrypts a walk's.
///
/// # Safety
///
/// The CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn fill_at_with<V: Lanes, T: Index, const C: usize>(
    p: &RandomAccessPermutation,
    positions: &[u32],
    block: &mut [T],
) {
    let w = V::WIDTH;
    let group = w * C;
    const { assert!(V::WIDTH * C <= MOST) };
    let cipher = Cipher::<V>::new(p);
    let mut buf = [0u32; MOST];
    let mut outside = Outside::new();
    for (first, at) in (0..).step_by(group).zip(positions.chunks(group)) {
        let mut x = [V::splat(0); C];
        if at.len() == group {
            for (c, x) in x.iter_mut().enumerate() {
                *x = V::load(&at[c * w..]);
            }
        } else {
            // A short last group: its lanes past the positions encrypt position 0, dropped.
            buf[..at.len()].copy_from_slice(at);
            buf[at.len()..group].fill(0);
            for (c, x) in x.iter_mut().enumerate() {
                *x = V::load(&buf[c * w..]);
            }
        }
        let bits = cipher.encrypt(x, &mut buf);
        outside.keep::<V, T, C>(&cipher, block, (&buf, bits), (first, at.len()));
    }
    outside.finish::<V, T, C>(&cipher, block);
}

/// The values of a fill still outside `[0, n)` after an encryption, and their places in the
/// block: encrypted again a whole group at a time as soon as a group's worth is waiting, and
/// the last few at the end, until inside (cycle walking). On the stack: a fill of a thousand
/// positions allocates nothing.
struct Outside {
    values: [u32; 2 * MOST],
    places: [u32; 2 * MOST],
    len: usize,
}

impl Outside {
    fn new() -> Self {
        Outside {
            values: [0; 2 * MOST],
            places: [0; 2 * MOST],
            len: 0,
        }
    }

    /// A group's values `buf` (its first `chunk.len()` lanes) into `chunk`, at `first` in the
    /// block; those whose bit is set in `bits` set aside, and a group's worth of them
    /// encrypted again at once.
    ///
    /// # Safety
    ///
    /// The CPU runs `V`'s instructions.
    #[inline(always)]
    unsafe fn keep<V: Lanes, T: Index, const C: usize>(
        &mut self,
        cipher: &Cipher<V>,
        block: &mut [T],
        (buf, mut bits): (&[u32; MOST], u64),
        (first, len): (usize, usize),
    ) {
        for (slot, &v) in block[first..first + len].iter_mut().zip(buf) {
            *slot = T::from_u64(u64::from(v));
        }
        if len < 64 {
            bits &= (1u64 << len) - 1;
        }
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            self.values[self.len] = buf[j];
            self.places[self.len] = (first + j) as u32;
            self.len += 1;
            bits &= bits - 1;
        }
        // Fewer than a group's worth left waiting, so the next group's fit.
        while self.len >= V::WIDTH * C {
            // SAFETY: the caller's.
            unsafe { self.again::<V, T, C>(cipher, block) };
        }
    }

    /// Encrypts the first group of the values set aside (at most a group's worth; its lanes
    /// past them encrypt 0, dropped), writes each to its place, and keeps those still
    /// outside.
    ///
    /// # Safety
    ///
    /// The CPU runs `V`'s instructions.
    #[inline(always)]
    unsafe fn again<V: Lanes, T: Index, const C: usize>(
        &mut self,
        cipher: &Cipher<V>,
        block: &mut [T],
    ) {
        let (w, group) = (V::WIDTH, V::WIDTH * C);
        let take = self.len.min(group);
        let mut buf = [0u32; MOST];
        buf[..take].copy_from_slice(&self.values[..take]);
        let mut x = [V::splat(0); C];
        for (c, x) in x.iter_mut().enumerate() {
            *x = V::load(&buf[c * w..]);
        }
        let outside = cipher.encrypt(x, &mut buf);
        // Each value to its place, the ones still outside kept at the front without a
        // branch per value (a value outside is overwritten once its walk ends).
        let mut kept = 0;
        for (j, &v) in buf[..take].iter().enumerate() {
            let at = self.places[j];
            block[at as usize] = T::from_u64(u64::from(v));
            self.values[kept] = v;
            self.places[kept] = at;
            kept += (outside >> j & 1) as usize;
        }
        // Then the values waiting behind the group.
        self.values.copy_within(take..self.len, kept);
        self.places.copy_within(take..self.len, kept);
        self.len = kept + self.len - take;
    }

    /// Encrypts the values set aside until each is inside.
    ///
    /// # Safety
    ///
    /// The CPU runs `V`'s instructions.
    #[inline(always)]
    unsafe fn finish<V: Lanes, T: Index, const C: usize>(
        mut self,
        cipher: &Cipher<V>,
        block: &mut [T],
    ) {
        while self.len > 0 {
            // SAFETY: the caller's.
            unsafe { self.again::<V, T, C>(cipher, block) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level this CPU runs reads, at positions in any order (repeats included), what
    /// each position reads alone: domains with high and low walk rates, up to [`MAX_N`],
    /// `u32` and `u64` outputs, and every length from none to a few groups (short last groups,
    /// the fewer chains of short fills, values set aside and encrypted again mid-fill).
    #[test]
    fn reads_at_any_positions_are_each_positions() {
        let mut lcg = crate::testkit::Lcg::new(23);
        for (k, &n) in [1025, 1 << 11, 10_000, 1_000_003, (1 << 31) + 1, MAX_N]
            .iter()
            .enumerate()
        {
            let p = RandomAccessPermutation::new(n, 9, k as u64);
            for len in (0..70).chain([127, 128, 129, 1000]) {
                let positions: Vec<u32> = (0..len).map(|_| lcg.below(n) as u32).collect();
                let expected: Vec<u64> = positions.iter().map(|&x| p.at(u64::from(x))).collect();
                for simd in Simd::available() {
                    let mut wide = vec![0u64; len];
                    // SAFETY: `simd` is a level this CPU runs; the positions are below `n`.
                    unsafe { fill_at(&p, &positions, &mut wide, simd) };
                    assert_eq!(wide, expected, "{simd:?} n={n} len={len}");
                    let mut narrow = vec![0u32; len];
                    // SAFETY: as above.
                    unsafe { fill_at(&p, &positions, &mut narrow, simd) };
                    let narrow: Vec<u64> = narrow.into_iter().map(u64::from).collect();
                    assert_eq!(narrow, expected, "{simd:?} n={n} len={len}, u32");
                }
            }
        }
    }

    /// Long fills over domains that walk about half their values (`2**k + 1` positions): many
    /// values wait to be encrypted again at once, group after group, in the strided and the
    /// any-order fills of every level.
    #[test]
    fn long_fills_of_domains_that_walk_half_their_values() {
        let mut lcg = crate::testkit::Lcg::new(5);
        for (k, &n) in [(1u64 << 12) + 1, (1 << 20) + 1].iter().enumerate() {
            let p = RandomAccessPermutation::new(n, 2, k as u64);
            let count = 100_000usize;
            let walk = Walk {
                offset: 0,
                len: n,
                p: 0,
                step: 1,
            };
            let expected: Vec<u64> = (0..count as u64).map(|i| p.at(i % n)).collect();
            let positions: Vec<u32> = (0..count).map(|_| lcg.below(n) as u32).collect();
            let at: Vec<u64> = positions.iter().map(|&x| p.at(u64::from(x))).collect();
            for simd in Simd::available() {
                let mut out = vec![0u64; count];
                // SAFETY: `simd` is a level this CPU runs.
                unsafe { fill(&p, &mut out, walk, simd) };
                assert_eq!(out, expected, "{simd:?} n={n}, strided");
                // SAFETY: as above; the positions are below `n`.
                unsafe { fill_at(&p, &positions, &mut out, simd) };
                assert_eq!(out, at, "{simd:?} n={n}, any order");
            }
        }
    }

    /// Every level this CPU runs fills what each position reads alone, over domains with and
    /// without cycle walking (up to [`MAX_N`], where the lanes' walk and values fill 32
    /// bits), contiguous and strided walks with wrap-around, offsets, `u32` and `u64`
    /// outputs, and lengths that leave a short last group.
    #[test]
    fn every_level_reads_what_each_position_reads() {
        let mut lcg = crate::testkit::Lcg::new(11);
        let domains = [
            1025,
            1 << 11,
            10_000,
            (1 << 20) + 1,
            1_000_000,
            (1 << 30) + 7,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
            3_000_000_019,
            MAX_N - 1,
            MAX_N,
        ];
        for (k, &n) in domains.iter().enumerate() {
            let p = RandomAccessPermutation::new(n, 5, k as u64);
            for case in 0..15u64 {
                // Whole domains, walks shorter than a group (each lane wraps many times) and
                // any length.
                let len = match case % 3 {
                    0 => n,
                    1 => 1 + lcg.below(70.min(n)),
                    _ => 1 + lcg.below(n),
                };
                let offset = lcg.below(n - len + 1);
                let step = match case % 5 {
                    0 => 1,
                    1 => 1 + lcg.below(9),
                    2 => len - 1 + u64::from(len == 1),
                    3 => len * (1 + lcg.below(3)), // a multiple of the length: one position
                    _ => 1 + lcg.below(len),
                };
                let first = lcg.below(len);
                let count = [1, 16, 63, 64, 65, 200, 1000][case as usize % 7];
                let walk = Walk {
                    offset,
                    len,
                    p: first,
                    step: step % len,
                };
                let expected: Vec<u64> = {
                    let mut walk = walk;
                    (0..count).map(|_| p.at(walk.next())).collect()
                };
                for simd in Simd::available() {
                    let mut wide = vec![0u64; count];
                    // SAFETY: `simd` is a level this CPU runs.
                    unsafe { fill(&p, &mut wide, walk, simd) };
                    let at = format!("{simd:?} n={n} {offset}+{len} from {first} by {step}");
                    assert_eq!(wide, expected, "{at}");
                    let mut narrow = vec![0u32; count];
                    // SAFETY: as above.
                    unsafe { fill(&p, &mut narrow, walk, simd) };
                    let narrow: Vec<u64> = narrow.into_iter().map(u64::from).collect();
                    assert_eq!(narrow, expected, "{at}, u32");
                }
            }
        }
    }
}

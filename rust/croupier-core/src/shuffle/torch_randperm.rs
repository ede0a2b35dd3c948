//! torch's CPU `randperm`, reproduced exactly, for `order="torch"`.
//!
//! `torch.utils.data.DistributedSampler` draws its epoch order as
//! `torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))`. On the CPU that
//! is (ATen `randperm_cpu`, `CPUGeneratorImpl`, read from torch's source; checked against torch
//! 2.15 by the tests):
//!
//! - The generator is the standard 32-bit Mersenne Twister (mt19937, `init_genrand` seeding)
//!   seeded with the low 32 bits of the 64-bit seed. `random()` is one output;
//!   `random64()` is `(first << 32) | second` of two outputs.
//! - Forward swaps: the buffer starts as `0..n` and for `i = 0 .. n-2` position `i` is swapped
//!   with `i + random() % (n - i)`. torch up to 2.5 does this for every `n`; torch 2.6 and later
//!   for `n < u32::MAX / 20 = 214_748_364` only.
//! - Inside-out, torch 2.6 and later for `n >= 214_748_364` (pytorch PR 143682): no
//!   initialisation; for `i = 0 .. n-1`, `z = random64() % (i + 1)`, then `r[i] = r[z]` and
//!   `r[z] = i`.
//!
//! Checked against torch 2.1.2 and 2.5.1 (forward for every n) and 2.6.0 and 2.15.0 (inside-out
//! above the threshold) by running each on the same n and seed.
//!
//! The modulo draws are slightly biased, as torch's are: exactness of the sequence is the point.

use rand_mt::Mt;

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::error::{Error, Result};
use crate::index::{check_len, zeros_par, Index, Indices, U32_MAX_LEN};
use crate::shuffle::drawn_steps::{drawn_steps, DRAWS_APART_FROM};
use crate::shuffle::fisher_yates::{identity, swaps_with_lookahead, LOOKAHEAD};

/// From this length on, torch 2.6 and later use the inside-out variant with 64-bit draws.
pub const LARGE_N_THRESHOLD: u64 = u32::MAX as u64 / 20;

/// Which torch releases' `randperm` to reproduce; they differ only for `n >= LARGE_N_THRESHOLD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchRandperm {
    /// torch up to 2.5: forward swaps with 32-bit draws for every `n`.
    Forward,
    /// torch 2.6 and later: forward swaps below the threshold, inside-out with 64-bit draws
    /// from it.
    InsideOutForLargeN,
}

/// The Mersenne Twister torch's `manual_seed(seed)` creates.
fn generator(seed: u64) -> Mt {
    Mt::new(seed as u32)
}

fn random64(mt: &mut Mt) -> u64 {
    let hi = u64::from(mt.next_u32());
    (hi << 32) | u64::from(mt.next_u32())
}

/// torch's forward swaps over `buf` (which holds `0..n`).
fn forward_swaps<T: Index>(buf: &mut [T], mt: &mut Mt) {
    let n = buf.len();
    // The same draws either way; a 32-bit remainder is cheaper where the range allows it.
    if n <= u32::MAX as usize {
        forward_swaps_with(buf, mt, |x, m| (x % m as u32) as usize);
    } else {
        forward_swaps_with(buf, mt, |x, m| (u64::from(x) % m as u64) as usize);
    }
}

/// Swap number i exchanges i with i + (random() mod (n - i)), in torch's draw order (from
/// `DRAWS_APART_FROM` swaps drawn a block ahead on a second thread: `shuffle::drawn_steps`).
fn forward_swaps_with<T: Index>(
    buf: &mut [T],
    mt: &mut Mt,
    rem: impl Fn(u32, usize) -> usize + Send + Sync,
) {
    let n = buf.len();
    let swaps = n.saturating_sub(1);
    if swaps < DRAWS_APART_FROM {
        // Each draw made LOOKAHEAD swaps ahead, between the swaps: the division of one draw
        // overlaps the swaps around it (drawing blocks first measured 25% slower at 1e5-1e6).
        swaps_with_lookahead::<_, LOOKAHEAD>(buf, swaps, |i| i, |i| i + rem(mt.next_u32(), n - i));
        return;
    }
    drawn_steps(
        buf,
        swaps,
        |s, block| {
            for (k, t) in block.iter_mut().enumerate() {
                *t = (s + k + rem(mt.next_u32(), n - s - k)) as u64;
            }
        },
        |buf, i, j| buf.swap(i, j),
    );
}

/// torch's inside-out variant for large `n`: step `i` sets `r[i] = r[z]` and `r[z] = i` for
/// `z = random64() mod (i + 1)`, into a fresh buffer (its zeros written by every core first,
/// so the page faults are spread; a step writes `r[i]` before anything reads it).
fn inside_out<T: Index>(n: u64, mt: &mut Mt) -> Result<Vec<T>> {
    // Huge pages: every step reads a random earlier position, and at 1e9 a buffer of 4 KiB
    // pages misses the TLB at nearly every one (and frees a million pages when dropped).
    let mut buf = zeros_par::<T>("an index buffer", n)?;
    if cancelled() {
        return Ok(buf); // the caller discards it
    }
    drawn_steps(
        &mut buf,
        n as usize,
        |s, block| {
            for (k, t) in block.iter_mut().enumerate() {
                *t = random64(mt) % (s + k + 1) as u64;
            }
        },
        |buf, i, z| {
            buf[i] = buf[z];
            buf[z] = T::from_u64(i as u64);
        },
    );
    Ok(buf)
}

fn randperm_in<T: Index>(n: u64, mt: &mut Mt, variant: TorchRandperm) -> Result<Vec<T>> {
    if variant == TorchRandperm::InsideOutForLargeN && n >= LARGE_N_THRESHOLD {
        return inside_out(n, mt);
    }
    let mut buf = identity::<T>(n)?;
    forward_swaps(&mut buf, mt);
    Ok(buf)
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, as the torch
/// releases named by `variant` compute it: a `u32` buffer when `n <= 2**32`, `u64` above.
///
/// # Examples
///
/// ```
/// use croupier_core::{torch_randperm, Indices, TorchRandperm};
///
/// let p = torch_randperm(100, 42, TorchRandperm::Forward).unwrap();
/// let Indices::U32(mut sorted) = p.clone() else { unreachable!() };
/// sorted.sort_unstable();
/// assert_eq!(sorted, (0..100).collect::<Vec<u32>>()); // a permutation
/// // The releases' variants differ only from LARGE_N_THRESHOLD on.
/// assert_eq!(torch_randperm(100, 42, TorchRandperm::InsideOutForLargeN).unwrap(), p);
/// ```
pub fn randperm(n: u64, seed: u64, variant: TorchRandperm) -> Result<Indices> {
    check_len("n", n)?;
    let mut mt = generator(seed);
    Ok(if n <= U32_MAX_LEN {
        Indices::U32(randperm_in(n, &mut mt, variant)?)
    } else {
        Indices::U64(randperm_in(n, &mut mt, variant)?)
    })
}

/// A `torch.Generator` after `manual_seed(seed)`, kept across calls: successive
/// [`TorchGenerator::randperm`] calls give what successive `torch.randperm(n, generator=g)`
/// calls give (NeMo's bucket sampler draws its bucket order and then every bucket's shuffle
/// from one generator).
#[derive(Debug, Clone)]
pub struct TorchGenerator {
    mt: Mt,
    variant: TorchRandperm,
}

impl TorchGenerator {
    /// The generator `torch.Generator().manual_seed(seed)` of the torch releases `variant`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::shuffle::TorchGenerator;
    /// use croupier_core::{torch_randperm, TorchRandperm};
    ///
    /// let mut g = TorchGenerator::new(42, TorchRandperm::Forward);
    /// // A fresh generator's first randperm is torch_randperm under the same seed.
    /// let once = torch_randperm(100, 42, TorchRandperm::Forward).unwrap();
    /// assert_eq!(g.randperm(100).unwrap(), once);
    /// ```
    pub fn new(seed: u64, variant: TorchRandperm) -> Self {
        TorchGenerator {
            mt: generator(seed),
            variant,
        }
    }

    /// The next `torch.randperm(n, generator=g)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::shuffle::TorchGenerator;
    /// use croupier_core::TorchRandperm;
    ///
    /// let mut g = TorchGenerator::new(7, TorchRandperm::Forward);
    /// let (first, second) = (g.randperm(50).unwrap(), g.randperm(50).unwrap());
    /// assert_ne!(first, second); // the generator moves on, as torch's does
    /// assert_eq!(first.len(), second.len());
    /// ```
    pub fn randperm(&mut self, n: u64) -> Result<Indices> {
        check_len("n", n)?;
        Ok(if n <= U32_MAX_LEN {
            Indices::U32(randperm_in(n, &mut self.mt, self.variant)?)
        } else {
            Indices::U64(randperm_in(n, &mut self.mt, self.variant)?)
        })
    }

    /// Advances the generator past a `randperm(n)` without computing it: the same draws.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::shuffle::TorchGenerator;
    /// use croupier_core::TorchRandperm;
    ///
    /// let mut drawn = TorchGenerator::new(7, TorchRandperm::InsideOutForLargeN);
    /// let mut skipped = drawn.clone();
    /// drawn.randperm(1000).unwrap();
    /// skipped.skip_randperm(1000);
    /// assert_eq!(drawn.randperm(10).unwrap(), skipped.randperm(10).unwrap()); // the same state
    /// ```
    pub fn skip_randperm(&mut self, n: u64) {
        let draws = if self.variant == TorchRandperm::InsideOutForLargeN && n >= LARGE_N_THRESHOLD {
            2 * n
        } else {
            n.saturating_sub(1)
        };
        for i in 0..draws {
            if i % CHECK_EVERY as u64 == 0 && cancelled() {
                return;
            }
            self.mt.next_u32();
        }
    }
}

/// The seed `torch.utils.data.DistributedSampler` gives its generator: `seed + epoch` (torch's
/// Mersenne Twister then keeps its low 32 bits). torch refuses a sum of 2**64 or more
/// (`manual_seed` overflows), and so does this.
pub(crate) fn sampler_seed(seed: u64, epoch: u64) -> Result<u64> {
    seed.checked_add(epoch).ok_or_else(|| {
        Error::out_of_range(
            "seed + epoch",
            "at most 2**64 - 1 for torch's order (torch.manual_seed refuses more)",
            u128::from(seed) + u128::from(epoch),
        )
    })
}

/// The global order of `torch.utils.data.DistributedSampler`'s `epoch`: `randperm(n)` under
/// [`sampler_seed`]`(seed, epoch)`.
pub(crate) fn sampler_order<T: Index>(
    n: u64,
    variant: TorchRandperm,
    seed: u64,
    epoch: u64,
) -> Result<Vec<T>> {
    check_len("n", n)?;
    randperm_in(n, &mut generator(sampler_seed(seed, epoch)?), variant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mersenne_twister_reference_values() {
        // The C++ standard pins mt19937 with the default seed 5489: first output 3499211612,
        // 10000th output 4123659995.
        let mut mt = generator(5489);
        assert_eq!(mt.next_u32(), 3_499_211_612);
        let mut mt = generator(5489);
        let last = (0..10_000).map(|_| mt.next_u32()).last().unwrap();
        assert_eq!(last, 4_123_659_995);
        // torch keeps the low 32 bits of the seed.
        assert_eq!(generator((1 << 32) + 5).next_u32(), generator(5).next_u32());
    }

    #[test]
    fn matches_torch_randperm_outputs() {
        // Values printed by torch 2.15: torch.randperm(n, generator=Generator().manual_seed(s)).
        let cases: [(u64, u64, &[u64]); 3] = [
            (5, 7, &[0, 1, 3, 2, 4]),
            (10, 0, &[4, 1, 7, 5, 3, 9, 0, 8, 6, 2]),
            (10, 42, &[2, 6, 1, 8, 4, 5, 0, 9, 3, 7]),
        ];
        for (n, seed, want) in cases {
            for variant in [TorchRandperm::Forward, TorchRandperm::InsideOutForLargeN] {
                let got = randperm(n, seed, variant).unwrap().to_u64_vec();
                assert_eq!(got, want, "n={n} seed={seed}");
            }
        }
    }

    fn textbook_forward(n: usize, seed: u64) -> Vec<u32> {
        let mut mt = generator(seed);
        let mut r: Vec<u32> = (0..n as u32).collect();
        for i in 0..n.saturating_sub(1) {
            let z = mt.next_u32() as usize % (n - i);
            r.swap(i, i + z);
        }
        r
    }

    #[test]
    fn lookahead_keeps_torchs_draw_order() {
        // Past DRAWS_APART_FROM the draws come from a second thread.
        for n in [0usize, 1, 2, 31, 32, 33, 511, 513, 5000, (1 << 21) + 2] {
            let mut buf: Vec<u32> = (0..n as u32).collect();
            forward_swaps(&mut buf, &mut generator(11));
            assert_eq!(buf, textbook_forward(n, 11), "n = {n}");
        }
    }

    #[test]
    fn wide_remainders_make_the_same_swaps() {
        // Above 2**32 samples the remainder is taken in 64 bits; it must equal the 32-bit one.
        let mut narrow: Vec<u64> = (0..5000).collect();
        forward_swaps_with(&mut narrow, &mut generator(3), |x, m| {
            (x % m as u32) as usize
        });
        let mut wide: Vec<u64> = (0..5000).collect();
        forward_swaps_with(&mut wide, &mut generator(3), |x, m| {
            (u64::from(x) % m as u64) as usize
        });
        assert_eq!(narrow, wide);
    }

    #[test]
    fn variants_agree_below_the_threshold_and_their_large_n_algorithms_differ() {
        let (f, i) = (TorchRandperm::Forward, TorchRandperm::InsideOutForLargeN);
        assert_eq!(randperm(1000, 5, f).unwrap(), randperm(1000, 5, i).unwrap());
        let mut mt = generator(5);
        let head: Vec<u32> = inside_out(64, &mut mt).unwrap();
        let mut forward: Vec<u32> = (0..64).collect();
        forward_swaps(&mut forward, &mut generator(5));
        assert_ne!(head, forward, "the two algorithms differ on the same draws");
    }

    #[test]
    fn inside_out_is_torchs_large_variant_written_plainly() {
        // The large-n variant cannot be compared with torch at small n (torch would take the
        // other branch), so compare with the loop as torch writes it.
        // Past DRAWS_APART_FROM the draws come from a second thread.
        for n in [0u64, 1, 2, 3, 100, 4097, (1 << 21) + 3] {
            let mut mt = generator(99);
            let mut r = vec![0u64; n as usize];
            for i in 0..n as usize {
                let z = (random64(&mut mt) % (i as u64 + 1)) as usize;
                r[i] = r[z];
                r[z] = i as u64;
            }
            let mut ours = generator(99);
            let got: Vec<u64> = inside_out(n, &mut ours).unwrap();
            assert_eq!(got, r, "n = {n}");
            assert_eq!(
                ours.next_u32(),
                mt.next_u32(),
                "n = {n}: the generator after"
            );
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert!(sorted.into_iter().eq(0..n));
        }
    }

    #[test]
    fn seed_plus_epoch_past_u64_is_refused_like_torch() {
        assert_eq!(sampler_seed(u64::MAX - 1, 1), Ok(u64::MAX));
        let e = sampler_seed(u64::MAX, 1).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("seed + epoch must be at most 2**64 - 1"),
            "{e}"
        );
    }

    /// `torch.randperm(5, g)` then `torch.randperm(7, g)` from one generator seeded 42, as
    /// torch 2.15 printed them.
    const TORCH_5_THEN: [u64; 12] = [2, 4, 3, 0, 1, 4, 6, 2, 3, 5, 1, 0];

    #[test]
    fn a_kept_generator_continues_torchs_stream() {
        // torch.Generator().manual_seed(42); randperm(5, g); randperm(7, g), torch 2.15.
        let mut g = TorchGenerator::new(42, TorchRandperm::InsideOutForLargeN);
        assert_eq!(
            g.randperm(5).unwrap().to_u64_vec(),
            TORCH_5_THEN[..5].to_vec()
        );
        assert_eq!(
            g.randperm(7).unwrap().to_u64_vec(),
            TORCH_5_THEN[5..].to_vec()
        );
        let mut h = TorchGenerator::new(42, TorchRandperm::InsideOutForLargeN);
        h.skip_randperm(5);
        assert_eq!(
            h.randperm(7).unwrap().to_u64_vec(),
            TORCH_5_THEN[5..].to_vec()
        );
    }

    #[test]
    fn threshold_is_torchs() {
        assert_eq!(LARGE_N_THRESHOLD, 214_748_364);
    }
}

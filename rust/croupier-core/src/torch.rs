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
//! - For `n < 2**32 / 20` (integer division of `u32::MAX`, i.e. `n < 214_748_364`): the buffer
//!   starts as `0..n` and for `i = 0 .. n-2` swaps position `i` with `i + random() % (n - i)`.
//! - Otherwise the "inside-out" variant with no initialisation: for `i = 0 .. n-1`,
//!   `z = random64() % (i + 1)`, then `r[i] = r[z]` and `r[z] = i`.
//!
//! The modulo draws are slightly biased, as torch's are: exactness of the sequence is the point.

use rand_mt::Mt;

use crate::error::Result;
use crate::index::{check_len, try_with_capacity, Index, Indices, U32_MAX_LEN};
use crate::permute::identity;

/// Below this length torch uses the forward swap with 32-bit draws; from it on, the
/// inside-out variant with 64-bit draws.
pub const LARGE_N_THRESHOLD: u64 = u32::MAX as u64 / 20;

/// How many swaps ahead the small-n variant prefetches its targets (same draws, same order).
const LOOKAHEAD: usize = 32;

/// The Mersenne Twister torch's `manual_seed(seed)` creates.
fn generator(seed: u64) -> Mt {
    Mt::new(seed as u32)
}

fn random64(mt: &mut Mt) -> u64 {
    let hi = u64::from(mt.next_u32());
    (hi << 32) | u64::from(mt.next_u32())
}

/// torch's forward variant for `n < LARGE_N_THRESHOLD` (so `n` fits `u32`).
fn forward_swaps(buf: &mut [u32], mt: &mut Mt) {
    let n = buf.len();
    if n < 2 {
        return;
    }
    // Swap number i exchanges i with i + z_i; z_i is drawn LOOKAHEAD swaps early so the
    // target's cache line can be prefetched (draws stay in torch's order).
    let swaps = n - 1;
    let mut ring = [0usize; LOOKAHEAD];
    let draw = |mt: &mut Mt, i: usize| i + (mt.next_u32() % (n - i) as u32) as usize;
    for (i, slot) in ring.iter_mut().enumerate().take(swaps) {
        *slot = draw(mt, i);
        crate::permute::prefetch(buf.as_ptr().wrapping_add(*slot));
    }
    for i in 0..swaps {
        let slot = i % LOOKAHEAD;
        let target = ring[slot];
        let ahead = i + LOOKAHEAD;
        if ahead < swaps {
            ring[slot] = draw(mt, ahead);
            crate::permute::prefetch(buf.as_ptr().wrapping_add(ring[slot]));
        }
        buf.swap(i, target);
    }
}

/// torch's inside-out variant for large `n`, written straight into a fresh buffer.
fn inside_out<T: Index>(n: u64, mt: &mut Mt) -> Result<Vec<T>> {
    let mut buf = try_with_capacity::<T>("an index buffer", n)?;
    for i in 0..n {
        let z = (random64(mt) % (i + 1)) as usize;
        // r[i] = r[z]; r[z] = i, with r[i] not yet written: push i, then swap.
        buf.push(T::from_u64(i));
        let last = buf.len() - 1;
        buf.swap(last, z);
    }
    Ok(buf)
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, as a `u32`
/// buffer when `n <= 2**32` and `u64` above.
pub fn randperm(n: u64, seed: u64) -> Result<Indices> {
    check_len("n", n)?;
    let mut mt = generator(seed);
    if n < LARGE_N_THRESHOLD {
        let mut buf = identity::<u32>(n)?;
        forward_swaps(&mut buf, &mut mt);
        return Ok(Indices::U32(buf));
    }
    Ok(if n <= U32_MAX_LEN {
        Indices::U32(inside_out(n, &mut mt)?)
    } else {
        Indices::U64(inside_out(n, &mut mt)?)
    })
}

/// The seed `torch.utils.data.DistributedSampler` gives its generator: `seed + epoch`, of which
/// torch's Mersenne Twister keeps the low 32 bits (so the sum may wrap harmlessly).
pub fn sampler_seed(seed: u64, epoch: u64) -> u64 {
    seed.wrapping_add(epoch)
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
            assert_eq!(
                randperm(n, seed).unwrap().to_u64_vec(),
                want,
                "n={n} seed={seed}"
            );
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
        for n in [0usize, 1, 2, LOOKAHEAD - 1, LOOKAHEAD, LOOKAHEAD + 1, 5000] {
            let mut buf: Vec<u32> = (0..n as u32).collect();
            forward_swaps(&mut buf, &mut generator(11));
            assert_eq!(buf, textbook_forward(n, 11), "n = {n}");
        }
    }

    #[test]
    fn inside_out_is_torchs_large_variant_written_plainly() {
        // The large-n variant cannot be compared with torch at small n (torch would take the
        // other branch), so compare with the loop as torch writes it.
        for n in [0u64, 1, 2, 3, 100, 4097] {
            let mut mt = generator(99);
            let mut r = vec![0u64; n as usize];
            for i in 0..n as usize {
                let z = (random64(&mut mt) % (i as u64 + 1)) as usize;
                r[i] = r[z];
                r[z] = i as u64;
            }
            let got: Vec<u64> = inside_out(n, &mut generator(99)).unwrap();
            assert_eq!(got, r, "n = {n}");
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert!(sorted.into_iter().eq(0..n));
        }
    }

    #[test]
    fn threshold_is_torchs() {
        assert_eq!(LARGE_N_THRESHOLD, 214_748_364);
    }
}

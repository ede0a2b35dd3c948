//! Full permutations of `[0, n)` on every core: an exact parallel shuffle.
//!
//! # Algorithm
//!
//! Rao–Sandelius, as Sanders describes it for parallel machines ("Random permutations on
//! distributed, external and hierarchical memory", IPL 67, 1998): give every value a uniform
//! random bucket label, lay the buckets out one after another, and shuffle each bucket on its
//! own. A bucket's content is a uniform random subset and its order a uniform random order,
//! so the whole is a uniform random permutation, exactly.
//!
//! - `n <= SMALL`: Fisher–Yates of the identity with the stream `(seed, epoch, Permutation,
//!   0)` (the permutation croupier has always produced for these sizes).
//! - Above: `B` buckets, a power of two (labels are `log2 B` bits, so no rejection), about
//!   `n / SMALL` of them (at most 1024) up to `n = 2**25` and 64 above. Values are labelled
//!   in stripes of `STRIPE`; stripe `i` draws its labels from the stream
//!   `(seed, epoch, Permutation, 1 << 60 | i)`. One
//!   pass counts the labels of every stripe, a second writes each value to its slot (bucket by
//!   bucket, stripe by stripe inside a bucket, increasing inside a stripe).
//! - Each bucket is then shuffled the same way, recursively: a node of the bucket tree at
//!   `depth` with path `p` (its level-1 bucket, then 6 bits a level) that holds more than
//!   `SMALL` values is scattered into at most 64 sub-buckets (labels from the stream
//!   `(…, 2 << 60 | depth << 56 | p)`) through a scratch buffer; a smaller one is shuffled by
//!   Fisher–Yates (`(…, 3 << 60 | depth << 56 | p)`), in cache.
//!
//! Every stream is named by stripe and bucket numbers that depend on `n` alone, so the result
//! is the same for every number of threads. Stripes and buckets are spread over threads with
//! rayon; the first writes to the output happen on all threads at once, so the page faults of
//! a large fresh buffer are shared too, and that buffer asks for transparent huge pages.

use crate::error::Result;
use crate::index::{check_len, try_with_capacity_huge, Index, Indices, U32_MAX_LEN};
use crate::permute::fisher_yates;
use crate::stream::{Purpose, Stream};
use rayon::prelude::*;

/// Up to this length the permutation is one Fisher–Yates in cache.
pub const SMALL: u64 = 1 << 15;
const STRIPE: u64 = 1 << 16;
/// Buckets per scatter: few enough write streams to stay within cache and TLB reach (on the
/// 2-core VM of the README, scattering to 64 streams took 3.6 ns an index, to 4096 streams 14).
const FANOUT: u64 = 64;
const BITS: u32 = FANOUT.trailing_zeros();

/// The first scatter writes straight from the labels; while the whole output spans at most
/// 2**25 indices (128 MiB of `u32`), up to 1024 buckets there (one scatter, then Fisher–Yates)
/// measured faster than two scatters (10M: 0.12 s against 0.155 s), beyond it 64 buckets do
/// (100M: 1.0 s against 1.25 s). A function of `n` alone, so the order never depends on the
/// machine.
fn level1_max(n: u64) -> u64 {
    if n <= 1 << 25 {
        1 << 10
    } else {
        FANOUT
    }
}
// Stream ids, injective by construction: the kind in the top four bits; for stripes the stripe
// number (< 2**47); for bucket-tree nodes the depth (< 16) in bits 56..60 and the path below
// (the level-1 bucket, at most 10 bits, then 6 bits a level; at most 9 levels below the first
// for n < 2**63, so < 2**56).
const LEVEL1: u64 = 1 << 60;
const SPLIT: u64 = 2 << 60;
const LEAF: u64 = 3 << 60;

/// A raw pointer that threads may share because they write disjoint positions.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: every user writes positions no other thread touches (disjoint slots computed from
// exact counts), and the buffer outlives the parallel section.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

/// Bucket labels: the stream's bytes read as little-endian 16-bit words, each masked to
/// `log2 B` bits (`B <= 2**16` is a power of two, so every label is exactly uniform).
struct Labels {
    stream: Stream,
    buf: [u8; LABEL_BYTES],
    at: usize,
    mask: u16,
}

const LABEL_BYTES: usize = 2048;

impl Labels {
    fn new(stream: Stream, bits: u32) -> Self {
        debug_assert!(bits <= 16);
        Labels {
            stream,
            buf: [0; LABEL_BYTES],
            at: LABEL_BYTES,
            mask: ((1u32 << bits) - 1) as u16,
        }
    }

    #[inline(always)]
    fn next(&mut self) -> usize {
        if self.at == LABEL_BYTES {
            self.stream.fill_bytes(&mut self.buf);
            self.at = 0;
        }
        let word = u16::from_le_bytes([self.buf[self.at], self.buf[self.at + 1]]);
        self.at += 2;
        usize::from(word & self.mask)
    }
}

fn buckets_for(n: u64, target: u64, max: u64) -> u64 {
    (n / target).clamp(2, max).next_power_of_two().min(max)
}

/// Fills `out` with the permutation of `[0, out.len())` for `(seed, epoch)`, reusing the
/// buffer.
pub fn fill<T: Index>(out: &mut [T], seed: u64, epoch: u64) {
    let n = out.len() as u64;
    if n <= SMALL {
        for (i, x) in out.iter_mut().enumerate() {
            *x = T::from_u64(i as u64);
        }
        fisher_yates(out, &mut Stream::new(seed, epoch, Purpose::Permutation, 0));
        return;
    }
    // SAFETY: `out` is valid for n writes.
    let bounds = unsafe { level1(Shared(out.as_mut_ptr()), n, seed, epoch) };
    level2(out, &bounds, seed, epoch);
}

fn fresh<T: Index>(n: u64, seed: u64, epoch: u64) -> Result<Vec<T>> {
    let mut v = try_with_capacity_huge::<T>("a permutation", n)?;
    if n <= SMALL {
        v.resize(n as usize, T::from_u64(0));
        fill(&mut v, seed, epoch);
        return Ok(v);
    }
    // SAFETY: the capacity is n, level1 writes all n positions before set_len, and T is a
    // plain integer (no drop, every bit pattern valid). Writing first on all threads spreads
    // the page faults of the fresh buffer over the cores.
    let bounds = unsafe {
        let bounds = level1(Shared(v.as_mut_ptr()), n, seed, epoch);
        v.set_len(n as usize);
        bounds
    };
    level2(&mut v, &bounds, seed, epoch);
    Ok(v)
}

fn stripe_labels(seed: u64, epoch: u64, stripe: u64, bits: u32) -> Labels {
    let stream = Stream::new(seed, epoch, Purpose::Permutation, LEVEL1 | stripe);
    Labels::new(stream, bits)
}

/// Writes every value of `[0, n)` to its level-1 slot; returns the bucket bounds.
///
/// # Safety
/// `out` must be valid for writes of `n` elements.
unsafe fn level1<T: Index>(out: Shared<T>, n: u64, seed: u64, epoch: u64) -> Vec<usize> {
    let b = buckets_for(n, SMALL, level1_max(n)) as usize;
    let bits = b.trailing_zeros();
    let stripes = n.div_ceil(STRIPE);
    let counts: Vec<Vec<usize>> = (0..stripes)
        .into_par_iter()
        .map(|i| {
            let len = STRIPE.min(n - i * STRIPE);
            let mut labels = stripe_labels(seed, epoch, i, bits);
            let mut c = vec![0usize; b];
            for _ in 0..len {
                c[labels.next()] += 1;
            }
            c
        })
        .collect();
    // Stripe i's values of bucket k go after the bucket's earlier stripes.
    let mut starts = vec![vec![0usize; b]; counts.len()];
    let mut bounds = vec![0usize; b + 1];
    let mut at = 0usize;
    for k in 0..b {
        for (i, c) in counts.iter().enumerate() {
            starts[i][k] = at;
            at += c[k];
        }
        bounds[k + 1] = at;
    }
    debug_assert_eq!(at as u64, n);
    starts
        .into_par_iter()
        .enumerate()
        .for_each(|(i, mut slot)| {
            let out = &out;
            let lo = i as u64 * STRIPE;
            let len = STRIPE.min(n - lo);
            let mut labels = stripe_labels(seed, epoch, i as u64, bits);
            for v in lo..lo + len {
                let k = labels.next();
                // SAFETY: slot[k] walks this stripe's own range of bucket k; the ranges are
                // disjoint and inside [0, n) because they come from exact counts.
                unsafe { out.0.add(slot[k]).write(T::from_u64(v)) };
                slot[k] += 1;
            }
        });
    bounds
}

/// Shuffles every level-1 bucket (in parallel) with [`shuffle_node`].
fn level2<T: Index>(out: &mut [T], bounds: &[usize], seed: u64, epoch: u64) {
    let mut parts = Vec::with_capacity(bounds.len() - 1);
    let mut rest: &mut [T] = out;
    for w in bounds.windows(2) {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(w[1] - w[0]);
        parts.push(part);
        rest = tail;
    }
    let init = || (Vec::<T>::new(), Vec::<u8>::new());
    parts
        .into_par_iter()
        .enumerate()
        .for_each_init(init, |(scratch, tags), (bucket, part)| {
            scratch.clear();
            scratch.resize(part.len(), T::from_u64(0));
            shuffle_node(part, scratch, tags, (seed, epoch), 1, bucket as u64);
        });
}

/// Shuffles `part` (node `path` at `depth` of the bucket tree): Fisher–Yates when it fits in
/// cache, else a scatter into at most [`FANOUT`] sub-buckets (in `scratch`), each shuffled the
/// same way, and the result copied back.
fn shuffle_node<T: Index>(
    part: &mut [T],
    scratch: &mut [T],
    tags: &mut Vec<u8>,
    (seed, epoch): (u64, u64),
    depth: u64,
    path: u64,
) {
    let stream =
        |tag: u64| Stream::new(seed, epoch, Purpose::Permutation, tag | depth << 56 | path);
    let len = part.len() as u64;
    if len <= SMALL {
        fisher_yates(part, &mut stream(LEAF));
        return;
    }
    let sub = buckets_for(len, SMALL, FANOUT) as usize;
    let mut labels = Labels::new(stream(SPLIT), sub.trailing_zeros());
    tags.clear();
    tags.extend((0..len).map(|_| labels.next() as u8));
    let mut bounds = vec![0usize; sub + 1];
    for &t in tags.iter() {
        bounds[t as usize + 1] += 1;
    }
    for i in 1..bounds.len() {
        bounds[i] += bounds[i - 1];
    }
    let mut at = bounds.clone();
    for (&x, &t) in part.iter().zip(tags.iter()) {
        scratch[at[t as usize]] = x;
        at[t as usize] += 1;
    }
    for s in 0..sub {
        let (lo, hi) = (bounds[s], bounds[s + 1]);
        let child = path << BITS | s as u64;
        let ctx = (seed, epoch);
        shuffle_node(
            &mut scratch[lo..hi],
            &mut part[lo..hi],
            tags,
            ctx,
            depth + 1,
            child,
        );
    }
    part.copy_from_slice(scratch);
}

/// The epoch's permutation of `[0, n)` (see the module documentation). A `u32` buffer when
/// `n <= 2**32`, `u64` above.
pub fn permutation(n: u64, seed: u64, epoch: u64) -> Result<Indices> {
    check_len("n", n)?;
    Ok(if n <= U32_MAX_LEN {
        Indices::U32(fresh(n, seed, epoch)?)
    } else {
        Indices::U64(fresh(n, seed, epoch)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(n: u64, seed: u64) -> Vec<u64> {
        permutation(n, seed, 1).unwrap().to_u64_vec()
    }

    #[test]
    fn is_a_permutation_on_both_levels() {
        // Around the single-Fisher-Yates bound, level 1 only, level 1 + 2 with sub-buckets.
        for n in [
            SMALL - 1,
            SMALL,
            SMALL + 1,
            3 * STRIPE + 7,
            100_000,
            5_000_011,
        ] {
            let mut p = perm(n, n);
            assert_eq!(p.len() as u64, n);
            p.sort_unstable();
            assert!(p.iter().copied().eq(0..n), "n = {n}");
        }
    }

    #[test]
    fn deep_bucket_trees_still_permute() {
        // A node of 64 * SMALL + 5 values needs two more levels below it.
        let len = (FANOUT * SMALL + 5) as usize;
        let mut part: Vec<u32> = (0..len as u32).collect();
        let mut scratch = vec![0u32; len];
        shuffle_node(&mut part, &mut scratch, &mut Vec::new(), (1, 2), 1, 7);
        assert_ne!(part[..10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        part.sort_unstable();
        assert!(part.iter().copied().eq(0..len as u32));
    }

    #[test]
    fn reusing_a_buffer_gives_the_same_permutation() {
        for n in [10u64, 100_000, 2_100_000] {
            let mut buf = vec![7u32; n as usize];
            fill(&mut buf, 3, 4);
            let want = permutation(n, 3, 4).unwrap().to_u64_vec();
            assert!(buf.iter().map(|&x| u64::from(x)).eq(want.iter().copied()));
            let mut wide = vec![0u64; n as usize];
            fill(&mut wide, 3, 4);
            assert_eq!(wide, want);
        }
    }

    #[test]
    fn same_for_any_thread_count() {
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| permutation(3_000_017, 5, 6).unwrap())
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
    }

    #[test]
    fn positions_are_uniform_through_both_levels() {
        // n = 100_000: two buckets of ~50_000, each split into sub-buckets. Where do values
        // 0, 50_000 and 99_999 land, by tenth of the output? 3 x 10 cells, 27 dof.
        let (n, trials) = (100_000u64, 3000u64);
        let mut table = [[0u64; 10]; 3];
        for seed in 0..trials {
            let p = perm(n, seed);
            for (row, v) in [0u64, 50_000, 99_999].iter().enumerate() {
                let pos = p.iter().position(|x| x == v).unwrap() as u64;
                table[row][(pos * 10 / n) as usize] += 1;
            }
        }
        let e = trials as f64 / 10.0;
        let chi: f64 = table
            .iter()
            .flatten()
            .map(|&c| (c as f64 - e).powi(2) / e)
            .sum();
        assert!(chi < 55.5, "chi2 {chi}"); // p = 0.001 for 27 dof
    }

    #[test]
    fn value_stability_pins() {
        // Deliberate pins: small n keeps the single Fisher-Yates of earlier releases.
        assert_eq!(perm(10, 0)[..], [1, 4, 0, 6, 7, 9, 3, 2, 5, 8]);
        assert_eq!(
            permutation(100_000, 0, 0).unwrap().to_u64_vec()[..4],
            PIN_100K
        );
    }
    const PIN_100K: [u64; 4] = [67071, 46725, 97070, 30536];
}

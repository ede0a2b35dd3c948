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
//! - `n <= SMALL`: Fisher–Yates of the identity with the ChaCha stream
//!   `(seed, epoch, Permutation, 0)` (the permutation croupier has always produced for these
//!   sizes).
//! - Above: 64 buckets (labels are 6 bits, so no rejection). Values are labelled in stripes
//!   of `STRIPE` (2**16); stripe `i` draws its labels from the generator `(…, 1 << 60 | i)`.
//!   One pass counts the labels of every stripe, a second draws them again and writes each
//!   value to its slot (bucket by bucket, stripe by stripe inside a bucket, increasing inside
//!   a stripe), staged in cache lines ([`crate::shuffle::write_combine`]).
//! - Each bucket is then shuffled the same way, recursively: a node of the bucket tree at
//!   `depth` with path `p` (6 bits a level) that holds more than `LEAF` values is scattered
//!   into 64 sub-buckets (labels from `(…, 2 << 60 | depth << 56 | p)`) through a scratch
//!   buffer; a smaller one is shuffled by Fisher–Yates (`(…, 3 << 60 | depth << 56 | p)`):
//!   in place for a level-1 bucket, and for a sub-bucket by the inside-out variant from the
//!   scratch buffer back into place, which saves copying it back.
//!
//! A rank's long blocks in `order="per_rank"` use a different bucket shuffle, one with buckets of
//! fixed sizes that can be read at any position (`seekable`); this one, with random
//! bucket sizes, needs no hypergeometric draws and is the faster in bulk.
//!
//! Every generator is named by stripe and bucket numbers that depend on `n` alone, so the
//! result is the same for every number of threads. Stripes and buckets are spread over threads
//! with rayon; the first writes to the output happen on all threads at once, so the page faults
//! of a large fresh buffer are shared too, and that buffer asks for transparent huge pages.
//!
//! # Generators
//!
//! Above `SMALL` the bulk draws come from xoshiro256++ (Blackman and Vigna, via `rand_xoshiro`)
//! whose 256-bit state is the first 32 bytes of the ChaCha8 stream `(seed, epoch, Permutation,
//! id)` (`keyed_xoshiro`), not from ChaCha itself: a xoshiro256++ word is a few adds, shifts
//! and rotations (and gives two 32-bit draws) where ChaCha8 runs 8 rounds over a 64-byte block,
//! and these draws are most of the work (`docs/performance.md`). ChaCha keying keeps the
//! generators of different ids as good as independent, and xoshiro256++ is integer-only, so
//! the output is the same on every platform.

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::draw::keyed::keyed_xoshiro;
use crate::error::Result;
use crate::index::{check_len, try_with_capacity_huge, Index, Indices, U32_MAX_LEN};
use crate::shuffle::fisher_yates::{fisher_yates, prefetch as prefetch_line};
use crate::shuffle::write_combine::Combiner;
use crate::stream::{fold, lemire_u32, Purpose, Stream};
use rand_core::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

/// Up to this length the permutation is one Fisher–Yates in cache.
pub(crate) const SMALL: u64 = 1 << 15;
const STRIPE: u64 = 1 << 16;
/// Buckets per scatter: few enough write streams for the hardware to combine, and 6-bit labels
/// need no rejection (other fan-outs: `docs/performance.md`).
const FANOUT: usize = 64;
const BITS: u32 = FANOUT.trailing_zeros();
/// A bucket of at most this many values is shuffled by Fisher–Yates in place (8 MiB of `u32`,
/// sized for the last-level cache, where a prefetching Fisher–Yates replaces one more scatter:
/// `docs/performance.md`). Counted in values, not bytes, so it is a function of `n` alone and
/// the order never depends on the machine (`u64` buffers, `n > 2**32`, simply have twice the
/// bytes per leaf).
pub(crate) const LEAF: usize = 1 << 21;
// Generator ids: the kind in the top four bits; for stripes the stripe number (< 2**47); for
// bucket-tree nodes the depth in bits 56..60 and the path below, 6 bits a level (see
// `child_path`), which is injective down to depth 9. A node at depth 8 is expected to hold
// n / 64**8 < 2**15 values for any n < 2**63, so a node at depth 9 or more (a depth-8 node 64
// times its expected size) does not happen in practice; should one, its path is hashed into
// 56 bits and its depth capped at 15, which keeps the kinds apart and streams distinct with
// probability 1 - 2**-56.
const LEVEL1: u64 = 1 << 60;
const SPLIT: u64 = 2 << 60;
const NODE_LEAF: u64 = 3 << 60;
pub(crate) const PATH_BITS: u32 = 56;

/// The path of child `s` of the node at `depth` with `path` (see the generator ids above).
pub(crate) fn child_path(depth: u64, path: u64, s: u64) -> u64 {
    if u64::from(BITS) * (depth + 1) <= u64::from(PATH_BITS) {
        path << BITS | s
    } else {
        fold(path, s) >> (64 - PATH_BITS)
    }
}

/// A raw pointer that threads may share because they write disjoint positions.
#[derive(Clone, Copy)]
pub(crate) struct Shared<T>(pub(crate) *mut T);
// SAFETY: every user writes positions no other thread touches (disjoint slots computed from
// exact counts) of a buffer borrowed for as long as the writers live (`level1` holds `out`
// through its parallel section, `seekable::Dealer` carries the borrow's lifetime).
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

/// Names the generators of [`permutation`]`(n, seed, epoch)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Namer {
    seed: u64,
    epoch: u64,
}

impl Namer {
    /// The generators of [`permutation`]`(n, seed, epoch)`.
    pub(crate) fn permutation(seed: u64, epoch: u64) -> Self {
        Namer { seed, epoch }
    }

    fn generator(&self, id: u64) -> Xoshiro256PlusPlus {
        keyed_xoshiro(self.seed, self.epoch, Purpose::Permutation, id)
    }

    fn stripe_labels(&self, stripe: u64) -> Labels {
        Labels::new(self.generator(LEVEL1 | stripe))
    }
}

/// Bucket labels: each 64-bit word gives ten 6-bit labels, lowest bits first (the top four
/// bits are dropped; 64 is a power of two, so every label is exactly uniform).
struct Labels {
    rng: Xoshiro256PlusPlus,
    word: u64,
    left: u32,
}

const PER_WORD: u32 = 64 / BITS;
/// Labels scattered between two looks at the cancellation flag in a large node (a whole
/// number of words, so the runs draw the same labels as one pass).
const CANCEL_LABELS: usize = PER_WORD as usize * (1 << 16);
/// From this many labels on, [`Labels::count`] counts them in pairs.
const PAIRS_FROM: usize = 1 << 14;
/// Words counted between folds of the pair table: a word adds at most 5 to one entry, so
/// no `u32` entry overflows.
const FOLD_WORDS: usize = (u32::MAX / (PER_WORD / 2)) as usize;

impl Labels {
    /// How many of the next `len` labels fall in each bucket (the labels [`Labels::next`]
    /// would return).
    ///
    /// From [`PAIRS_FROM`] labels on, the labels are counted two at a time: the five 12-bit
    /// fields of a word index a table of label pairs, which is folded into the bucket counts
    /// at the end. That halves the increments at the cost of clearing and folding a 16 KiB
    /// table, which pays from [`PAIRS_FROM`] labels on. Shorter runs count label by
    /// label into four tables, so that repeated labels do not wait on each other's increments.
    fn count(self, len: usize) -> [usize; FANOUT] {
        self.count_folding_every(len, FOLD_WORDS)
    }

    /// [`Labels::count`], folding the pair table every `fold` words at most (tests pass
    /// small ones to reach the folds).
    fn count_folding_every(mut self, len: usize, fold: usize) -> [usize; FANOUT] {
        debug_assert_eq!(self.left, 0);
        assert!(fold > 0 && fold <= FOLD_WORDS, "fold in [1, FOLD_WORDS]");
        let mut c = [0usize; FANOUT];
        let mut words = len / PER_WORD as usize;
        if len >= PAIRS_FROM {
            let mut pairs = [0u32; FANOUT * FANOUT];
            while words > 0 {
                let round = words.min(fold);
                for _ in 0..round {
                    let mut word = self.rng.next_u64();
                    for _ in 0..PER_WORD / 2 {
                        pairs[(word & (FANOUT * FANOUT - 1) as u64) as usize] += 1;
                        word >>= 2 * BITS;
                    }
                }
                for (p, x) in pairs.iter_mut().enumerate() {
                    c[p & (FANOUT - 1)] += *x as usize;
                    c[p >> BITS] += *x as usize;
                    *x = 0;
                }
                words -= round;
            }
        } else {
            let mut tables = [[0u32; FANOUT]; 4];
            for _ in 0..words {
                let mut word = self.rng.next_u64();
                for i in 0..PER_WORD as usize {
                    tables[i & 3][(word & (FANOUT as u64 - 1)) as usize] += 1;
                    word >>= BITS;
                }
            }
            for (k, total) in c.iter_mut().enumerate() {
                *total += tables.iter().map(|t| t[k] as usize).sum::<usize>();
            }
        }
        for _ in 0..len % PER_WORD as usize {
            c[self.next()] += 1;
        }
        c
    }

    /// Calls `f` with each of the next `len` labels in turn (the labels [`Labels::next`] would
    /// return), a word at a time.
    #[inline(always)]
    fn each(mut self, len: usize, f: impl FnMut(usize)) {
        self.each_mut(len, f);
    }

    /// [`Labels::each`] in runs of [`CANCEL_LABELS`] labels (whole words: the stream is the
    /// same), stopping at the first run after the call is cancelled. Returns whether every
    /// label was passed to `f`.
    fn each_cancellable(mut self, len: usize, mut f: impl FnMut(usize)) -> bool {
        let mut left = len;
        while left > CANCEL_LABELS {
            if cancelled() {
                return false;
            }
            self.each_mut(CANCEL_LABELS, &mut f);
            left -= CANCEL_LABELS;
        }
        self.each_mut(left, f);
        true
    }

    #[inline(always)]
    fn each_mut(&mut self, len: usize, mut f: impl FnMut(usize)) {
        debug_assert_eq!(self.left, 0);
        let mut left = len;
        while left >= PER_WORD as usize {
            let mut word = self.rng.next_u64();
            for _ in 0..PER_WORD {
                f((word & (FANOUT as u64 - 1)) as usize);
                word >>= BITS;
            }
            left -= PER_WORD as usize;
        }
        for _ in 0..left {
            f(self.next());
        }
    }

    fn new(rng: Xoshiro256PlusPlus) -> Self {
        Labels {
            rng,
            word: 0,
            left: 0,
        }
    }

    #[inline(always)]
    fn next(&mut self) -> usize {
        if self.left == 0 {
            self.word = self.rng.next_u64();
            self.left = PER_WORD;
        }
        let label = (self.word & (FANOUT as u64 - 1)) as usize;
        self.word >>= BITS;
        self.left -= 1;
        label
    }
}

/// The bounded draw of the leaf shuffles: Lemire's method on `half`, one 32-bit half of a
/// generator word, with a rejection drawing a fresh word's high half (`next_u32`); a uniform
/// integer in `[0, s)`, `s >= 1`. The shuffles take two draws from each word, low half first,
/// then high half (even when the low half's draw was rejected and drew fresh words in
/// between); a word's unused high half at the very end is dropped. Both draws of a word are
/// taken in one loop step rather than carrying the pending half from call to call
/// (`docs/performance.md`).
#[inline(always)]
fn below(half: u32, s: u32, rng: &mut Xoshiro256PlusPlus) -> usize {
    lemire_u32(half, s, || rng.next_u32()) as usize
}

/// Durstenfeld's Fisher–Yates on `buf` (`len < 2**32`): swap number `s` exchanges position
/// `len-1-s` with a uniform position in `[0, len-1-s]`, drawn by [`below`], two swaps a
/// word. Past [`PREFETCH_FROM`] values the targets are drawn [`LEAF_LOOKAHEAD`] swaps ahead
/// and prefetched (same draws, same swaps): that pays once `buf` outgrows L2, and costs inside
/// it.
pub(crate) fn fisher_yates_fast<T: Index>(
    buf: &mut [T],
    rng: &mut Xoshiro256PlusPlus,
    prefetch: bool,
) {
    let n = buf.len();
    debug_assert!(n as u64 <= u64::from(u32::MAX));
    let swaps = n.saturating_sub(1);
    let bound = |s: usize| (n - s) as u32;
    if !prefetch {
        let mut s = 0;
        while s + 1 < swaps {
            let word = rng.next_u64();
            let j = below(word as u32, bound(s), rng);
            buf.swap(n - 1 - s, j);
            let j = below((word >> 32) as u32, bound(s + 1), rng);
            buf.swap(n - 2 - s, j);
            s += 2;
        }
        if s < swaps {
            let j = below(rng.next_u64() as u32, bound(s), rng);
            buf.swap(n - 1 - s, j);
        }
        return;
    }
    // The targets of swaps s .. s + LEAF_LOOKAHEAD wait in a ring, each prefetched when
    // drawn; a step makes two swaps and draws the two targets of one word (a loop drawing one
    // target at a time, carrying the word's other half, was slower: `docs/performance.md`).
    const A: usize = LEAF_LOOKAHEAD;
    const { assert!(A.is_multiple_of(2) && CHECK_EVERY.is_multiple_of(2)) };
    let mut ring = [0u32; A];
    let first = A.min(swaps);
    let mut s = 0;
    while s < first {
        let word = rng.next_u64();
        ring[s] = below(word as u32, bound(s), rng) as u32;
        prefetch_line(buf.as_ptr().wrapping_add(ring[s] as usize));
        if s + 1 < first {
            ring[s + 1] = below((word >> 32) as u32, bound(s + 1), rng) as u32;
            prefetch_line(buf.as_ptr().wrapping_add(ring[s + 1] as usize));
        } // else: the last swap's word, its high half dropped
        s += 2;
    }
    // s even: swap s's target sits at slot s % A, and the draws for s + A and s + A + 1 take
    // the low and high halves of one word, as in the loop without prefetching.
    s = 0;
    while s + A + 1 < swaps {
        if s.is_multiple_of(CHECK_EVERY) && cancelled() {
            return; // the caller discards the buffer
        }
        let slot = s % A;
        let (t0, t1) = (ring[slot] as usize, ring[slot + 1] as usize);
        let word = rng.next_u64();
        let d0 = below(word as u32, bound(s + A), rng) as u32;
        let d1 = below((word >> 32) as u32, bound(s + A + 1), rng) as u32;
        ring[slot] = d0;
        ring[slot + 1] = d1;
        prefetch_line(buf.as_ptr().wrapping_add(d0 as usize));
        prefetch_line(buf.as_ptr().wrapping_add(d1 as usize));
        buf.swap(n - 1 - s, t0);
        buf.swap(n - 2 - s, t1);
        s += 2;
    }
    // At most A + 1 swaps left, their targets in the ring but for one when A + 1 are left
    // (an even draw: a fresh word's low half, the high half dropped).
    let extra = (s + A < swaps).then(|| below(rng.next_u64() as u32, bound(s + A), rng));
    for k in s..swaps {
        let target = if k < s + A {
            ring[k % A] as usize
        } else {
            extra.expect("drawn above")
        };
        buf.swap(n - 1 - k, target);
    }
}

/// The inside-out Fisher–Yates from `src` into `dst` (equal lengths, below 2**32): for
/// `i = 1, 2, …` with `j` uniform in `[0, i]`, `dst[i] = dst[j]` and `dst[j] = src[i]`
/// (`dst[0] = src[0]` first), with `j` drawn by [`below`], two steps a word. Every order of
/// `src` is equally likely, and the values move once, so a leaf scattered into a scratch
/// buffer needs no copy back.
pub(crate) fn inside_out_fast<T: Index>(src: &[T], dst: &mut [T], rng: &mut Xoshiro256PlusPlus) {
    let n = src.len();
    assert_eq!(n, dst.len());
    debug_assert!(n as u64 <= u64::from(u32::MAX));
    if n == 0 {
        return;
    }
    dst[0] = src[0];
    let mut step = |i: usize, half: u32, rng: &mut Xoshiro256PlusPlus| {
        let j = below(half, (i + 1) as u32, rng);
        debug_assert!(j <= i && i < n);
        // SAFETY: i < n = dst.len() = src.len(), and j <= i: Lemire's draw is below its bound
        // i + 1, which fits in u32 because n <= 2**32 (the callers' leaves are far smaller).
        unsafe {
            *dst.get_unchecked_mut(i) = *dst.get_unchecked(j);
            *dst.get_unchecked_mut(j) = *src.get_unchecked(i);
        }
    };
    let mut i = 1;
    while i + 1 < n {
        let word = rng.next_u64();
        step(i, word as u32, rng);
        step(i + 1, (word >> 32) as u32, rng);
        i += 2;
    }
    if i < n {
        step(i, rng.next_u64() as u32, rng);
    }
}

/// Leaves longer than this (1 MiB of `u32`) are shuffled with prefetching.
pub(crate) const PREFETCH_FROM: usize = 1 << 18;
/// How far ahead leaf targets are prefetched (chosen by measurement: `docs/performance.md`).
const LEAF_LOOKAHEAD: usize = 64;

/// Fills `out` with the permutation of `[0, out.len())` for `(seed, epoch)`, reusing the
/// buffer.
///
/// # Examples
///
/// ```
/// use croupier_core::shuffle::{fill, permutation};
/// use croupier_core::Indices;
///
/// let mut buf = vec![0u32; 500];
/// fill(&mut buf, 3, 2);
/// let Indices::U32(p) = permutation(500, 3, 2).unwrap() else { unreachable!() };
/// assert_eq!(buf, p); // the same permutation, into your buffer
/// ```
pub fn fill<T: Index>(out: &mut [T], seed: u64, epoch: u64) {
    fill_with_leaf(out, seed, epoch, LEAF);
}

/// [`fill`] with bucket-tree leaves of at most `leaf` values (tests use small ones to reach
/// the deeper levels at small `n`).
fn fill_with_leaf<T: Index>(out: &mut [T], seed: u64, epoch: u64, leaf: usize) {
    let n = out.len() as u64;
    if n <= SMALL {
        for (i, x) in out.iter_mut().enumerate() {
            *x = T::from_u64(i as u64);
        }
        fisher_yates(out, &mut Stream::new(seed, epoch, Purpose::Permutation, 0));
        return;
    }
    let namer = Namer::permutation(seed, epoch);
    // SAFETY: `out` is valid for n writes.
    let bounds = unsafe { level1(Shared(out.as_mut_ptr()), n, &namer, T::from_u64) };
    level2(out, &bounds, &namer, leaf);
}

fn fresh<T: Index>(n: u64, seed: u64, epoch: u64) -> Result<Vec<T>> {
    let mut v = try_with_capacity_huge::<T>("a permutation", n)?;
    if n <= SMALL {
        v.resize(n as usize, T::from_u64(0));
        fill(&mut v, seed, epoch);
        return Ok(v);
    }
    let namer = Namer::permutation(seed, epoch);
    // SAFETY: the capacity is n, level1 writes all n positions before set_len, and T is a
    // plain integer (no drop, every bit pattern valid). Writing first on all threads spreads
    // the page faults of the fresh buffer over the cores.
    let bounds = unsafe { level1(Shared(v.as_mut_ptr()), n, &namer, T::from_u64) };
    if cancelled() {
        // level1 stopped early: the buffer holds unwritten slots, and the call is discarded.
        return Ok(Vec::new());
    }
    // SAFETY: (see above) level1 wrote all n positions.
    unsafe { v.set_len(n as usize) };
    level2(&mut v, &bounds, &namer, LEAF);
    Ok(v)
}

/// Per stripe of `[0, n)`, how many of its level-1 labels fall in each bucket (a stripe holds
/// at most 2**16 values, so `u32` counts).
pub(crate) fn stripe_counts(n: u64, namer: &Namer) -> Vec<[u32; FANOUT]> {
    (0..n.div_ceil(STRIPE))
        .into_par_iter()
        .map(|i| {
            // Counting draws every label once: at 1e9 values the first second of the call.
            // Cancelled, the counts are meaningless and the caller stops after level 1.
            if cancelled() {
                return [0; FANOUT];
            }
            let c = namer
                .stripe_labels(i)
                .count(STRIPE.min(n - i * STRIPE) as usize);
            c.map(|x| x as u32)
        })
        .collect()
}

/// Per stripe, where its values of each bucket start: `u32` offsets when the shuffle holds at
/// most 2**32 values (half the memory, 1/64 of a `u32` output), `u64` beyond.
enum Starts {
    Narrow(Vec<[u32; FANOUT]>),
    Wide(Vec<[u64; FANOUT]>),
}

impl Starts {
    fn len(&self) -> usize {
        match self {
            Starts::Narrow(v) => v.len(),
            Starts::Wide(v) => v.len(),
        }
    }

    fn get(&self, s: usize) -> [usize; FANOUT] {
        match self {
            Starts::Narrow(v) => v[s].map(|x| x as usize),
            Starts::Wide(v) => v[s].map(|x| x as usize),
        }
    }
}

/// The level-1 layout of a bucket shuffle of `n` values: where each stripe's values of each
/// bucket go (bucket by bucket, stripe by stripe inside a bucket), and the bucket bounds.
struct Plan {
    starts: Starts,
    bounds: Vec<usize>,
}

impl Plan {
    /// Counts the labels of every stripe (in parallel) and lays the buckets out.
    fn new(namer: &Namer, n: u64) -> Self {
        let mut counts = stripe_counts(n, namer);
        let mut bounds = vec![0usize; FANOUT + 1];
        let starts = if n <= u64::from(u32::MAX) {
            // Counts become starts in place: no second table.
            let mut at = 0u32;
            for k in 0..FANOUT {
                for c in counts.iter_mut() {
                    let count = c[k];
                    c[k] = at;
                    at += count;
                }
                bounds[k + 1] = at as usize;
            }
            Starts::Narrow(counts)
        } else {
            let mut starts = vec![[0u64; FANOUT]; counts.len()];
            let mut at = 0u64;
            for k in 0..FANOUT {
                for (i, c) in counts.iter().enumerate() {
                    starts[i][k] = at;
                    at += u64::from(c[k]);
                }
                bounds[k + 1] = at as usize;
            }
            Starts::Wide(starts)
        };
        debug_assert!(cancelled() || bounds[FANOUT] as u64 == n);
        Plan { starts, bounds }
    }
}

/// Writes `src(i)` for every `i` of `[0, n)` to its level-1 slot; returns the bucket bounds.
///
/// # Safety
/// `out` must be valid for writes of `n` elements.
unsafe fn level1<T: Index>(
    out: Shared<T>,
    n: u64,
    namer: &Namer,
    src: impl Fn(u64) -> T + Sync,
) -> Vec<usize> {
    let plan = Plan::new(namer, n);
    (0..plan.starts.len()).into_par_iter().for_each(|i| {
        // Cancelled: write nothing more. The buckets' shuffles that follow start only after
        // every stripe, and skip their work too, so nothing reads what was not written.
        if cancelled() {
            return;
        }
        let out = &out;
        let lo = i as u64 * STRIPE;
        let len = STRIPE.min(n - lo);
        // SAFETY: run k is this stripe's own range of bucket k, starting at its slot; the
        // ranges are disjoint and inside [0, n) because they come from exact counts.
        let mut combiner = unsafe { Combiner::<T, FANOUT>::new(out.0, plan.starts.get(i)) };
        let mut v = lo;
        namer.stripe_labels(i as u64).each(len as usize, |k| {
            combiner.push(k, src(v));
            v += 1;
        });
        combiner.finish();
    });
    plan.bounds
}

/// Shuffles every level-1 bucket (in parallel) with [`shuffle_node`].
fn level2<T: Index>(out: &mut [T], bounds: &[usize], namer: &Namer, leaf: usize) {
    let mut parts = Vec::with_capacity(bounds.len() - 1);
    let mut rest: &mut [T] = out;
    for w in bounds.windows(2) {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(w[1] - w[0]);
        parts.push(part);
        rest = tail;
    }
    parts
        .into_par_iter()
        .enumerate()
        .for_each_init(Vec::<T>::new, |scratch, (bucket, part)| {
            if cancelled() {
                return; // the caller discards the buffer
            }
            let len = part.len();
            let scratch: &mut [T] = if len > leaf {
                if scratch.len() < len {
                    scratch.resize(len, T::from_u64(0));
                }
                &mut scratch[..len]
            } else {
                &mut []
            };
            shuffle_node(part, scratch, namer, leaf, 1, bucket as u64);
        });
}

/// Shuffles `part` (node `path` at `depth` of the bucket tree): Fisher–Yates when it holds at
/// most `leaf` values ([`LEAF`]; tests pass smaller ones), else a scatter into [`FANOUT`]
/// sub-buckets in `scratch` (as long as `part`), each shuffled the same way (with `part` as
/// its scratch) and copied back.
fn shuffle_node<T: Index>(
    part: &mut [T],
    scratch: &mut [T],
    namer: &Namer,
    leaf: usize,
    depth: u64,
    path: u64,
) {
    let id = depth.min(15) << PATH_BITS | path;
    if part.len() <= leaf {
        let mut rng = namer.generator(NODE_LEAF | id);
        fisher_yates_fast(part, &mut rng, part.len() > PREFETCH_FROM);
        return;
    }
    debug_assert_eq!(scratch.len(), part.len());
    // Count the labels, then draw them again to scatter: cheaper than storing them.
    let counts = Labels::new(namer.generator(SPLIT | id)).count(part.len());
    if cancelled() {
        return; // a large node's scatter takes a tenth of a second; the caller discards it
    }
    let mut bounds = [0usize; FANOUT + 1];
    for (k, c) in counts.iter().enumerate() {
        bounds[k + 1] = bounds[k] + c;
    }
    let from: [usize; FANOUT] = std::array::from_fn(|k| bounds[k]);
    // SAFETY: run k fills scratch[bounds[k]..bounds[k+1]] exactly (the counts are exact),
    // and `scratch` is borrowed exclusively here.
    let mut combiner = unsafe { Combiner::<T, FANOUT>::new(scratch.as_mut_ptr(), from) };
    let mut values = part.iter();
    let whole = Labels::new(namer.generator(SPLIT | id)).each_cancellable(part.len(), |k| {
        combiner.push(k, *values.next().expect("one label per value"));
    });
    combiner.finish();
    if !whole {
        return; // cancelled mid-scatter
    }
    for s in 0..FANOUT {
        if cancelled() {
            return; // a child takes a few ms; the caller discards the buffer
        }
        let (lo, hi) = (bounds[s], bounds[s + 1]);
        let child = child_path(depth, path, s as u64);
        if hi - lo <= leaf {
            // A leaf child goes back by an inside-out shuffle: no copy afterwards.
            let id = (depth + 1).min(15) << PATH_BITS | child;
            let mut rng = namer.generator(NODE_LEAF | id);
            inside_out_fast(&scratch[lo..hi], &mut part[lo..hi], &mut rng);
            continue;
        }
        shuffle_node(
            &mut scratch[lo..hi],
            &mut part[lo..hi],
            namer,
            leaf,
            depth + 1,
            child,
        );
        part[lo..hi].copy_from_slice(&scratch[lo..hi]);
    }
}

/// Bytes [`permutation`] holds at its peak: the output, and above `64 * LEAF` values one
/// level-1 bucket of scratch per thread. An estimate, so that a call that cannot fit is
/// refused before any work.
///
/// # Examples
///
/// ```
/// use croupier_core::shuffle::permutation_bytes;
///
/// assert_eq!(permutation_bytes(1000), 4000); // u32 output, no scratch at this size
/// assert!(permutation_bytes(1 << 40) >= 8 << 40); // u64 above 2**32
/// ```
pub fn permutation_bytes(n: u64) -> u64 {
    let elem = crate::index::index_bytes(n);
    let scratch = if n / FANOUT as u64 > LEAF as u64 {
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        threads as u64 * n.div_ceil(FANOUT as u64)
    } else {
        0
    };
    n.saturating_add(scratch).saturating_mul(elem)
}

/// The epoch's permutation of `[0, n)` (see the module documentation). A `u32` buffer when
/// `n <= 2**32`, `u64` above.
///
/// # Examples
///
/// ```
/// use croupier_core::shuffle::permutation;
/// use croupier_core::Indices;
///
/// let Indices::U32(p) = permutation(1000, 7, 0).unwrap() else { unreachable!() };
/// let mut sorted = p.clone();
/// sorted.sort_unstable();
/// assert_eq!(sorted, (0..1000).collect::<Vec<u32>>()); // every index once
/// let Indices::U32(again) = permutation(1000, 7, 0).unwrap() else { unreachable!() };
/// assert_eq!(p, again); // the same arguments, the same order, on any machine
/// let Indices::U32(next) = permutation(1000, 7, 1).unwrap() else { unreachable!() };
/// assert_ne!(p, next); // another epoch, another order
/// ```
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
    use crate::testkit::{orders_chi2, tenths_chi2};

    fn perm(n: u64, seed: u64) -> Vec<u64> {
        permutation(n, seed, 1).unwrap().to_u64_vec()
    }

    /// The permutation of `n` with leaves of at most `leaf` values, under `threads` threads.
    fn perm_leaf(n: u64, seed: u64, leaf: usize, threads: usize) -> Vec<u32> {
        let mut out = vec![0u32; n as usize];
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| fill_with_leaf(&mut out, seed, 1, leaf));
        out
    }

    #[test]
    fn is_a_permutation_on_every_level() {
        // Around the single-Fisher-Yates bound, then 64 leaf buckets (real LEAF), then leaves
        // of 100 and 1000 values, so that level-1 buckets are scattered once or twice more.
        for n in [SMALL - 1, SMALL, SMALL + 1, 3 * STRIPE + 7, 5_000_011] {
            let mut p = perm(n, n);
            assert_eq!(p.len() as u64, n);
            p.sort_unstable();
            assert!(p.iter().copied().eq(0..n), "n = {n}");
        }
        for (n, leaf) in [(SMALL + 1, 100), (400_003, 100), (3 * STRIPE + 7, 1000)] {
            let mut p = perm_leaf(n, 7, leaf, 2);
            p.sort_unstable();
            assert!(p.iter().map(|&x| u64::from(x)).eq(0..n), "n = {n}");
        }
    }

    #[test]
    fn deep_paths_stay_distinct() {
        // Exact paths while they fit in 56 bits; hashed (still below 2**56) beyond.
        assert_eq!(child_path(1, 5, 3), 5 << BITS | 3);
        assert_eq!(child_path(8, 1 << 47, 63), (1 << 53) | 63);
        let deep: std::collections::HashSet<u64> =
            (0..64).map(|s| child_path(9, (1 << 53) | 17, s)).collect();
        assert_eq!(deep.len(), 64);
        assert!(deep.iter().all(|&p| p < 1 << PATH_BITS));
    }

    #[test]
    fn deep_bucket_trees_still_permute() {
        // With leaves of 100 values, a node of 64 * 100 + 5 values needs two more levels below
        // it (some of its 64 children hold more than 100).
        let len = FANOUT * 100 + 5;
        let mut part: Vec<u32> = (0..len as u32).collect();
        let mut scratch = vec![0u32; len];
        shuffle_node(
            &mut part,
            &mut scratch,
            &Namer::permutation(1, 2),
            100,
            1,
            7,
        );
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
        // With leaves of 1000, every level-1 bucket (~47k) is scattered again through a
        // per-thread scratch buffer that is reused across buckets.
        let deep = perm_leaf(3_000_017, 5, 1000, 1);
        assert_eq!(deep, perm_leaf(3_000_017, 5, 1000, 2));
        assert_eq!(deep, perm_leaf(3_000_017, 5, 1000, 5));
    }

    #[test]
    fn positions_are_uniform_through_both_levels() {
        // n = 100_000: 64 buckets of ~1_560; with leaves of 100 each is scattered into 64
        // sub-buckets, some of them once more. Where do values 0, 50_000 and 99_999 land, by
        // tenth of the output? 3 x 10 cells, 27 dof.
        let (n, trials) = (100_000u64, 3000u64);
        let chi = tenths_chi2(n, trials, |seed| {
            perm_leaf(n, seed, 100, 2)
                .into_iter()
                .map(u64::from)
                .collect()
        });
        assert!(chi < 55.5, "chi2 {chi}"); // p = 0.001 for 27 dof
    }

    #[test]
    fn every_order_equally_likely_through_split_nodes() {
        // Leaves of 2 values: a node of 5 is scattered into 64 sub-buckets, and any child of
        // more than 2 is scattered again. All 120 orders over 36_000 seeds: 119 dof.
        let (orders, chi) = orders_chi2(120, 36_000, |seed| {
            let mut part: Vec<u32> = (0..5).collect();
            let mut scratch = vec![0u32; 5];
            let namer = Namer::permutation(seed, 9);
            shuffle_node(&mut part, &mut scratch, &namer, 2, 1, 0);
            part
        });
        assert_eq!(orders, 120);
        assert!(chi < 173.6, "chi2 {chi}"); // p = 0.001 for 119 dof
    }

    #[test]
    fn fast_fisher_yates_orders_equally_likely() {
        // The leaf shuffle on its own (pairs of 32-bit draws): all 24 orders of 4.
        let (orders, chi) = orders_chi2(24, 24_000, |seed| {
            let mut v: Vec<u32> = (0..4).collect();
            let mut rng = Namer::permutation(seed, 0).generator(NODE_LEAF);
            fisher_yates_fast(&mut v, &mut rng, seed % 2 == 0);
            v
        });
        assert_eq!(orders, 24);
        assert!(chi < 49.73, "chi2 {chi}"); // p = 0.001 for 23 dof
    }

    #[test]
    fn inside_out_orders_equally_likely() {
        // The sub-bucket leaf shuffle on its own: all 24 orders of 4.
        let src: Vec<u32> = (0..4).collect();
        let (orders, chi) = orders_chi2(24, 24_000, |seed| {
            let mut v = vec![9u32; 4];
            let mut rng = Namer::permutation(seed, 0).generator(NODE_LEAF);
            inside_out_fast(&src, &mut v, &mut rng);
            v
        });
        assert_eq!(orders, 24);
        assert!(chi < 49.73, "chi2 {chi}"); // p = 0.001 for 23 dof
    }

    #[test]
    fn counts_are_the_labels_counted_one_by_one() {
        // Both ways of counting (label by label below PAIRS_FROM, in pairs from it), with
        // every tail length of a word on both sides of PAIRS_FROM.
        let lens = (0..=20)
            .chain(PAIRS_FROM - 10..=PAIRS_FROM + 10)
            .chain([1000, 100_003]);
        for len in lens {
            let labels = || Namer::permutation(3, 4).stripe_labels(len as u64);
            let mut expected = [0usize; FANOUT];
            let mut one_by_one = labels();
            for _ in 0..len {
                expected[one_by_one.next()] += 1;
            }
            assert_eq!(labels().count(len), expected, "len = {len}");
            // Folding the pair table often (and at every word) changes nothing.
            for fold in [1, 7] {
                let folded = labels().count_folding_every(len, fold);
                assert_eq!(folded, expected, "len = {len}, fold = {fold}");
            }
        }
    }

    /// Draws as the leaf shuffles' documentation states them, one at a time, carrying the
    /// pending high half: Lemire on the low half of a fresh word, then on its high half,
    /// rejections drawing fresh words' high halves. Counts the rejections.
    struct OneAtATime {
        rng: Xoshiro256PlusPlus,
        pending: Option<u32>,
        rejections: usize,
    }

    impl OneAtATime {
        fn below(&mut self, s: u32) -> usize {
            let half = self.pending.take().unwrap_or_else(|| {
                let word = self.rng.next_u64();
                self.pending = Some((word >> 32) as u32);
                word as u32
            });
            let rng = &mut self.rng;
            let rejections = &mut self.rejections;
            lemire_u32(half, s, || {
                *rejections += 1;
                rng.next_u32()
            }) as usize
        }
    }

    #[test]
    fn leaf_shuffles_draw_one_half_word_at_a_time_through_rejections() {
        // Near 1e6 values a shuffle meets about a hundred rejections, so the pairing of the
        // halves around them is exercised (both parities of n; small n for the ends).
        let mut rejections = 0;
        for n in [0usize, 1, 2, 3, 4, 1_000_003, 1_000_004] {
            let generator = || Namer::permutation(8, 9).generator(NODE_LEAF | n as u64);
            let src: Vec<u32> = (0..n as u32).map(|x| x ^ 0x5555).collect();
            let mut draws = OneAtATime {
                rng: generator(),
                pending: None,
                rejections: 0,
            };
            let mut expected = src.clone();
            for s in 0..n.saturating_sub(1) {
                let j = draws.below((n - s) as u32);
                expected.swap(n - 1 - s, j);
            }
            for prefetch in [false, true] {
                let mut v = src.clone();
                fisher_yates_fast(&mut v, &mut generator(), prefetch);
                assert_eq!(v, expected, "Fisher-Yates, n = {n}, prefetch = {prefetch}");
            }
            rejections += draws.rejections;
            let mut draws = OneAtATime {
                rng: generator(),
                pending: None,
                rejections: 0,
            };
            let mut expected = vec![0u32; n];
            for i in 0..n {
                let j = if i == 0 {
                    0
                } else {
                    draws.below((i + 1) as u32)
                };
                expected[i] = expected[j];
                expected[j] = src[i];
            }
            let mut v = vec![7u32; n];
            inside_out_fast(&src, &mut v, &mut generator());
            assert_eq!(v, expected, "inside-out, n = {n}");
            rejections += draws.rejections;
        }
        assert!(rejections > 50, "only {rejections} rejections met");
    }

    #[test]
    fn prefetching_makes_the_same_swaps_and_draws() {
        // Every length through three rings, under 8 generators each (the last swaps' draws
        // have bounds of 2 and 3: one generator alone would let a wrong half pass by luck),
        // and the generator's next word after the shuffle: the same words drawn, none more;
        // then longer lengths of both parities.
        for n in (0..=3 * LEAF_LOOKAHEAD + 5).chain([1000, 100_001, 100_002]) {
            for epoch in 0..8u64 {
                let run = |prefetch| {
                    let mut v: Vec<u32> = (0..n as u32).collect();
                    let mut rng = Namer::permutation(6, epoch).generator(NODE_LEAF | n as u64);
                    fisher_yates_fast(&mut v, &mut rng, prefetch);
                    (v, rng.next_u64())
                };
                assert_eq!(run(true), run(false), "n = {n}, epoch = {epoch}");
            }
        }
    }

    #[test]
    fn a_raised_flag_stops_a_prefetching_leaf_before_its_first_swap() {
        let cancel = crate::Cancel::new();
        cancel.attach();
        cancel.raise();
        let n = 2 * LEAF_LOOKAHEAD + 2; // long enough for the loop that looks at the flag
        let mut v: Vec<u32> = (0..n as u32).collect();
        fisher_yates_fast(
            &mut v,
            &mut Namer::permutation(1, 2).generator(NODE_LEAF),
            true,
        );
        crate::Cancel::detach();
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
    }

    #[test]
    fn value_stability_pins() {
        // Deliberate pins: small n keeps the single Fisher-Yates of earlier releases.
        assert_eq!(perm(10, 0)[..], [1, 4, 0, 6, 7, 9, 3, 2, 5, 8]);
        assert_eq!(
            permutation(100_000, 0, 0).unwrap().to_u64_vec()[..4],
            PIN_100K
        );
        // Through scattered sub-buckets and their inside-out leaves (the path of n > 64 * LEAF),
        // reached at small n with leaves of 1000.
        assert_eq!(perm_leaf(100_000, 0, 1000, 2)[..4], PIN_100K_LEAF_1000);
    }
    const PIN_100K_LEAF_1000: [u32; 4] = [75260, 78976, 20033, 93039];
    const PIN_100K: [u64; 4] = [68397, 27417, 46556, 98100];
}

//! Software write-combining for the bucket scatters of [`crate::shuffle::parallel`].
//!
//! A scatter writes its values to 64 runs at once, each run moving forward. Written one value
//! at a time, every store to a cache line not yet in cache first reads that line from memory
//! (a read for ownership), and the 64 write streams contend for the hardware's combining
//! buffers. [`Combiner`] stages each run's values in a cache-line buffer in L1 and writes a
//! line out whole, with non-temporal stores on x86-64 (no read for ownership, no cache
//! pollution), once it is full. Only lines lying wholly inside the writer's own run are written
//! whole, so writers of neighbouring runs never overwrite each other; the partial lines at the
//! ends of a run are written value by value.
//!
//! This changes how values travel, not where they go: the output is the same byte for byte.
//! One cost: the lines written with non-temporal stores leave the cache, so a scatter whose
//! output is read again right away (the second level of the bucket tree) reads it from memory.
//! The net effect on a whole permutation is a measurement: `docs/performance.md`.

use crate::index::Index;

/// Bytes in a cache line (the unit the combiner writes whole).
const LINE_BYTES: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE_BYTES]);

/// Stages the values of `K` forward-moving runs of an output buffer (`K` a power of two) in
/// cache-line buffers (see the module documentation). Build it with [`Combiner::new`],
/// [`Combiner::push`] each value to its run, then [`Combiner::finish`]. The tables are arrays
/// of `K` so that a run number masked to `K` needs no bounds check in the hot loop.
///
/// A push is one load of the run's fill offset, the store of the value into the staging lines
/// at that offset, and the store of the offset moved on; a line is full when the offset reaches
/// the next line. (Tracking the output position per run and deriving the slot from it takes
/// five more instructions a value: `docs/performance.md`.)
pub(crate) struct Combiner<T, const K: usize> {
    out: *mut T,
    /// Per run, the first position this writer owns.
    from: [usize; K],
    /// Per run, the output position of slot 0 of its staging line: a line boundary of the
    /// output, at or before `from[k]` (possibly before the buffer) while the first line is
    /// partial.
    line_at: [isize; K],
    /// Per run, the byte offset in `lines` of the next slot to fill: inside line `k`, or at
    /// the start of line `k + 1` just before a flush.
    fill: [usize; K],
    lines: [Line; K],
}

impl<T: Index, const K: usize> Combiner<T, K> {
    /// Values per line. `Index` is not sealed, so the element type is checked here, at compile
    /// time: a power-of-two size of at most a line, aligned to its size (u32 and u64 are).
    const PER_LINE: usize = {
        let size = std::mem::size_of::<T>();
        assert!(
            size.is_power_of_two() && size <= LINE_BYTES && std::mem::align_of::<T>() == size,
            "the combiner needs elements of a power-of-two size up to 64 bytes, aligned to it"
        );
        LINE_BYTES / size
    };
    const SIZE: usize = LINE_BYTES / Self::PER_LINE;

    /// A combiner writing run `k` at positions `from[k], from[k] + 1, …` of `out`.
    ///
    /// # Safety
    /// `out` must be aligned to `T` (the element type itself is checked at compile time, see
    /// `PER_LINE`). Until [`Combiner::finish`] returns, `out` must be valid for writes at every
    /// position the pushes reach, and no one else may read or write the positions of any run
    /// from its start to its last push (other writers may own the positions just before and
    /// after, even in the same cache line: those lines are written value by value).
    pub(crate) unsafe fn new(out: *mut T, from: [usize; K]) -> Self {
        const { assert!(K.is_power_of_two(), "a power-of-two number of runs") };
        debug_assert!(
            (out as usize).is_multiple_of(Self::SIZE),
            "out is aligned to its elements"
        );
        let skew = (out as usize % LINE_BYTES) / Self::SIZE;
        let line_at = from.map(|f| ((f + skew) & !(Self::PER_LINE - 1)) as isize - skew as isize);
        let fill = std::array::from_fn(|k| {
            k * LINE_BYTES + (from[k] as isize - line_at[k]) as usize * Self::SIZE
        });
        Combiner {
            out,
            from,
            line_at,
            fill,
            lines: [Line([0; LINE_BYTES]); K],
        }
    }

    /// Writes `v` at the next position of run `k` (`k < K`).
    #[inline(always)]
    pub(crate) fn push(&mut self, k: usize, v: T) {
        debug_assert!(k < K, "run {k} of {K}");
        let k = k & (K - 1);
        let off = self.fill[k];
        debug_assert!(off >= k * LINE_BYTES && off < (k + 1) * LINE_BYTES);
        // SAFETY: `off` is a slot of line k (between flushes it stays inside line k), so the
        // write stays inside `lines` and is aligned to `T` (lines are 64-byte aligned, slots a
        // multiple of the element size).
        unsafe {
            self.lines
                .as_mut_ptr()
                .cast::<u8>()
                .add(off)
                .cast::<T>()
                .write(v)
        };
        let off = off + Self::SIZE;
        self.fill[k] = off;
        if off.is_multiple_of(LINE_BYTES) {
            self.flush(k);
        }
    }

    /// Writes out the full line of run `k` and starts the next one.
    #[inline(always)]
    fn flush(&mut self, k: usize) {
        let at = self.line_at[k];
        if at >= self.from[k] as isize {
            // SAFETY: positions [at, at + PER_LINE) belong to this run (they start at or after
            // its first position, and the line was filled by pushes), and `at` is a line
            // boundary of the output, so the destination is 64-byte aligned.
            unsafe { store_line(self.out.add(at as usize).cast(), &self.lines[k]) };
        } else {
            self.write_values(k, Self::PER_LINE);
        }
        self.line_at[k] = at + Self::PER_LINE as isize;
        self.fill[k] = k * LINE_BYTES;
    }

    /// Writes the owned positions of run `k`'s line from its first `slots` slots, one value
    /// at a time.
    #[cold]
    fn write_values(&mut self, k: usize, slots: usize) {
        let at = self.line_at[k];
        let line = self.lines[k].0.as_ptr().cast::<T>();
        let first = (self.from[k] as isize - at).max(0) as usize;
        for slot in first..slots {
            // SAFETY: the run owns position at + slot (at or after its first position, and
            // filled by a push, see `new`), and slot < PER_LINE.
            unsafe {
                self.out
                    .add((at + slot as isize) as usize)
                    .write(line.add(slot).read())
            };
        }
    }

    /// Writes the values still in the line buffers and orders the whole-line stores before
    /// anything that follows (so another thread may read the output afterwards).
    pub(crate) fn finish(mut self) {
        for k in 0..K {
            let slots = (self.fill[k] - k * LINE_BYTES) / Self::SIZE;
            self.write_values(k, slots);
        }
        fence();
    }
}

/// Writes one cache line to `dst`, 64-byte aligned.
///
/// # Safety
/// `dst` must be valid for a 64-byte write and 64-byte aligned.
#[inline(always)]
unsafe fn store_line(dst: *mut u8, line: &Line) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; both pointers are 64-byte aligned and valid for 64 bytes.
    unsafe {
        use core::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        let src = line.0.as_ptr().cast::<__m128i>();
        let dst = dst.cast::<__m128i>();
        for i in 0..4 {
            _mm_stream_si128(dst.add(i), _mm_load_si128(src.add(i)));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller promises; the buffer is a distinct local.
    unsafe {
        std::ptr::copy_nonoverlapping(line.0.as_ptr(), dst, LINE_BYTES);
    }
}

/// Orders the non-temporal stores before the stores that follow.
#[inline(always)]
fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shuffle::fisher_yates::fisher_yates;
    use crate::stream::{Purpose, Stream};

    /// Values 1000, 1001, … scattered to runs starting at `from[k]` of `out` in the order of
    /// `labels` by `writers` combiners, each taking a contiguous part of the labels (so the
    /// writers share the lines at their runs' ends) and finished in reverse order or in order
    /// (so that each writer's partial lines are written both before and after its
    /// neighbours' whole lines); the result must equal plain writes, and every position
    /// outside the runs must keep its sentinel.
    fn check<T: Index + PartialEq, const K: usize>(
        out: &mut [T],
        from: &[usize],
        labels: &[usize],
        writers: usize,
        reverse: bool,
    ) {
        let mut expected = out.to_vec();
        let mut at: [usize; K] = from.try_into().unwrap();
        let mut starts = vec![at];
        let part = labels.len().div_ceil(writers.max(1)).max(1);
        for (i, &k) in labels.iter().enumerate() {
            if i > 0 && i % part == 0 {
                starts.push(at);
            }
            expected[at[k]] = T::from_u64(i as u64 + 1000);
            at[k] += 1;
        }
        let ptr = out.as_mut_ptr();
        let combiners: Vec<(usize, Combiner<T, K>)> = starts
            .iter()
            .enumerate()
            .map(|(w, start)| {
                // SAFETY: writer w owns, in each run, the positions of its own labels, which
                // follow the previous writer's in that run; all lie inside `out`.
                (w * part, unsafe { Combiner::new(ptr, *start) })
            })
            .collect();
        let mut finished = Vec::new();
        for (first, mut c) in combiners {
            for (i, &k) in labels.iter().enumerate().skip(first).take(part) {
                c.push(k, T::from_u64(i as u64 + 1000));
            }
            finished.push(c);
        }
        if !reverse {
            finished.reverse();
        }
        while let Some(c) = finished.pop() {
            c.finish();
        }
        assert_eq!(out, &expected[..]);
    }

    /// Runs of random lengths (0 to 3 lines and a bit, some empty), laid out in a random order
    /// with gaps, in a buffer sliced at every offset from a line boundary (so every skew of
    /// the output pointer occurs), by one to three writers.
    fn sweep<T: Index + PartialEq, const K: usize>(seed: u64) {
        let runs = K;
        let per_line = LINE_BYTES / std::mem::size_of::<T>();
        let mut rng = Stream::new(seed, 0, Purpose::Permutation, runs as u64);
        for offset in 0..per_line {
            for writers in 1..=3 {
                let lens: Vec<usize> = (0..runs)
                    .map(|_| rng.below(3 * per_line as u64 + 5) as usize)
                    .collect();
                let mut order: Vec<u64> = (0..runs as u64).collect();
                fisher_yates(&mut order, &mut rng);
                let mut from = vec![0usize; runs];
                let mut at = rng.below(per_line as u64) as usize;
                for &k in &order {
                    from[k as usize] = at;
                    at += lens[k as usize] + rng.below(3) as usize;
                }
                let mut labels: Vec<u64> = (0..runs)
                    .flat_map(|k| std::iter::repeat_n(k as u64, lens[k]))
                    .collect();
                fisher_yates(&mut labels, &mut rng);
                let labels: Vec<usize> = labels.iter().map(|&k| k as usize).collect();
                for reverse in [true, false] {
                    // A line-aligned buffer (a slice of `Line`s), sliced at `offset` elements.
                    let lines = (offset + at + 2 * per_line).div_ceil(per_line);
                    let mut backing = vec![Line([0x5a; LINE_BYTES]); lines];
                    // SAFETY: the `Line`s are plain bytes, 64-byte aligned, and every bit pattern
                    // is a valid u32 or u64.
                    let all = unsafe {
                        std::slice::from_raw_parts_mut(
                            backing.as_mut_ptr().cast::<T>(),
                            lines * per_line,
                        )
                    };
                    check::<T, K>(&mut all[offset..], &from, &labels, writers, reverse);
                }
            }
        }
    }

    #[test]
    fn same_as_plain_writes_for_any_alignment_layout_and_writers() {
        for seed in 0..20 {
            sweep::<u32, 1>(seed);
            sweep::<u64, 1>(seed);
            sweep::<u32, 4>(seed);
            sweep::<u64, 4>(seed);
            sweep::<u32, 64>(seed);
            sweep::<u64, 64>(seed);
        }
    }
}

//! Software write-combining for the bucket scatters of [`crate::parshuffle`].
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

use crate::index::Index;

/// Bytes in a cache line (the unit the combiner writes whole).
const LINE_BYTES: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE_BYTES]);

/// Stages the values of `k` forward-moving runs of an output buffer in cache-line buffers (see
/// the module documentation). Build it with [`Combiner::new`], [`Combiner::push`] each value to
/// its run, then [`Combiner::finish`].
pub(crate) struct Combiner<T> {
    out: *mut T,
    /// How many elements `out` lies past the cache-line boundary before it.
    skew: usize,
    /// Per run, the first position this writer owns.
    from: Box<[usize]>,
    /// Per run, the next position to write.
    at: Box<[usize]>,
    lines: Box<[Line]>,
}

impl<T: Index> Combiner<T> {
    const PER_LINE: usize = LINE_BYTES / std::mem::size_of::<T>();

    /// A combiner writing run `k` at positions `from[k], from[k] + 1, …` of `out`.
    ///
    /// # Safety
    /// Until [`Combiner::finish`] returns, `out` must be valid for writes at every position the
    /// pushes reach, and no one else may read or write the positions of any run from its start
    /// to its last push (other writers may own the positions just before and after).
    pub(crate) unsafe fn new(out: *mut T, from: &[usize]) -> Self {
        let size = std::mem::size_of::<T>();
        debug_assert!(LINE_BYTES % size == 0 && (out as usize) % size == 0);
        Combiner {
            out,
            skew: (out as usize % LINE_BYTES) / size,
            from: from.into(),
            at: from.into(),
            lines: vec![Line([0; LINE_BYTES]); from.len()].into_boxed_slice(),
        }
    }

    /// Writes `v` at the next position of run `k` (`k` below the number of runs).
    #[inline(always)]
    pub(crate) fn push(&mut self, k: usize, v: T) {
        let p = self.at[k];
        let slot = (p + self.skew) & (Self::PER_LINE - 1);
        // SAFETY: slot < PER_LINE, so the write stays inside line k (which exists: `at[k]`
        // above was checked).
        unsafe {
            self.lines
                .get_unchecked_mut(k)
                .0
                .as_mut_ptr()
                .cast::<T>()
                .add(slot)
                .write(v)
        };
        self.at[k] = p + 1;
        if slot == Self::PER_LINE - 1 {
            self.flush(k, p + 1);
        }
    }

    /// Writes out the full line of run `k` that ends before position `end`.
    #[inline(always)]
    fn flush(&mut self, k: usize, end: usize) {
        if end >= self.from[k] + Self::PER_LINE {
            // SAFETY: positions [end - PER_LINE, end) belong to this run (they start at or
            // after its first position, and the line was filled by pushes), and they start on
            // a line boundary of the output, so the destination is 64-byte aligned.
            unsafe { store_line(self.out.add(end - Self::PER_LINE).cast(), &self.lines[k]) };
        } else {
            self.write_values(k, self.from[k], end);
        }
    }

    /// Writes positions `[lo, hi)` of run `k` from its line buffer, one value at a time.
    #[cold]
    fn write_values(&mut self, k: usize, lo: usize, hi: usize) {
        let line = self.lines[k].0.as_ptr().cast::<T>();
        for p in lo..hi {
            let slot = (p + self.skew) & (Self::PER_LINE - 1);
            // SAFETY: the run owns [lo, hi) (see `new`), and slot < PER_LINE.
            unsafe { self.out.add(p).write(line.add(slot).read()) };
        }
    }

    /// Writes the values still in the line buffers and orders the whole-line stores before
    /// anything that follows (so another thread may read the output afterwards).
    pub(crate) fn finish(mut self) {
        for k in 0..self.at.len() {
            let line_start = ((self.at[k] + self.skew) & !(Self::PER_LINE - 1))
                .saturating_sub(self.skew)
                .max(self.from[k]);
            if self.at[k] > line_start {
                self.write_values(k, line_start, self.at[k]);
            }
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

    /// Scatters `labels` (run per label) with the combiner into `out`, starting run `k` at
    /// `from[k]`, and checks it against plain writes.
    fn check<T: Index + PartialEq>(out: &mut [T], from: &[usize], labels: &[usize]) {
        let mut expected = out.to_vec();
        let mut at = from.to_vec();
        for (i, &k) in labels.iter().enumerate() {
            expected[at[k]] = T::from_u64(i as u64 + 1000);
            at[k] += 1;
        }
        // SAFETY: the runs are disjoint and inside `out` (the callers lay them out so).
        let mut c = unsafe { Combiner::<T>::new(out.as_mut_ptr(), from) };
        for (i, &k) in labels.iter().enumerate() {
            c.push(k, T::from_u64(i as u64 + 1000));
        }
        c.finish();
        assert_eq!(out, &expected[..]);
    }

    #[test]
    fn same_as_plain_writes_for_any_alignment_and_run_lengths() {
        // Runs of lengths 0..40 at every skew of the buffer, with a sentinel value between
        // runs that the combiner must leave alone.
        let mut rng = crate::stream::Stream::new(1, 2, crate::stream::Purpose::Permutation, 3);
        for skew in 0..16 {
            for trial in 0..50u64 {
                let lens: [usize; 4] = std::array::from_fn(|_| rng.below(40) as usize);
                let mut from = [0usize; 4];
                let mut at = skew;
                for k in 0..4 {
                    from[k] = at;
                    at += lens[k] + (trial % 3) as usize;
                }
                let mut labels: Vec<u64> = (0..4u64)
                    .flat_map(|k| std::iter::repeat_n(k, lens[k as usize]))
                    .collect();
                crate::permute::fisher_yates(&mut labels, &mut rng);
                let labels: Vec<usize> = labels.iter().map(|&k| k as usize).collect();
                let mut out32 = vec![7u32; at + 20];
                check::<u32>(&mut out32, &from, &labels);
                let mut out64 = vec![7u64; at + 20];
                check::<u64>(&mut out64, &from, &labels);
            }
        }
    }
}

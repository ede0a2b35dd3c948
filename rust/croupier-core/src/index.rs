//! Index element types and the owned buffers handed to callers.
//!
//! Buffers hold `u32` when every index fits (N <= 2**32), halving memory and bandwidth for the
//! common case, and `u64` above. The element type is a function of N alone, so it never changes
//! the order.

use crate::error::{Error, Result};

/// An unsigned integer type that can hold sample indices.
pub trait Index: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Converts from `u64`; the caller guarantees the value fits.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Index;
    ///
    /// let x = <u32 as Index>::from_u64(u64::from(u32::MAX));
    /// assert_eq!(x, u32::MAX);
    /// assert_eq!(<u64 as Index>::from_u64(1 << 40).to_u64(), 1 << 40); // a round trip
    /// ```
    fn from_u64(v: u64) -> Self;
    /// Widens to `u64`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Index;
    ///
    /// for v in [0u64, 1, u64::from(u32::MAX)] {
    ///     assert_eq!(<u32 as Index>::from_u64(v).to_u64(), v); // a round trip
    /// }
    /// ```
    fn to_u64(self) -> u64;
}

impl Index for u32 {
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        debug_assert!(v <= u32::MAX as u64);
        v as u32
    }
    #[inline(always)]
    fn to_u64(self) -> u64 {
        self as u64
    }
}

impl Index for u64 {
    #[inline(always)]
    fn from_u64(v: u64) -> Self {
        v
    }
    #[inline(always)]
    fn to_u64(self) -> u64 {
        self
    }
}

/// The largest number of samples whose indices fit a `u32` buffer.
pub const U32_MAX_LEN: u64 = 1 << 32;

/// The largest dataset length croupier accepts: indices must fit a signed 64-bit integer
/// (numpy `int64`, torch `long`).
pub const MAX_LEN: u64 = (1 << 63) - 1;

/// Bytes per index in the buffers for a dataset of `n` samples: 4 (`u32`) up to
/// [`U32_MAX_LEN`], 8 (`u64`) above.
///
/// # Examples
///
/// ```
/// use croupier_core::{index_bytes, permutation, Indices, U32_MAX_LEN};
///
/// assert_eq!(index_bytes(U32_MAX_LEN), 4); // every index of 2**32 samples fits a u32
/// assert_eq!(index_bytes(U32_MAX_LEN + 1), 8);
/// // The buffers follow it.
/// assert!(matches!(permutation(10, 0, 0).unwrap(), Indices::U32(_)));
/// ```
pub fn index_bytes(n: u64) -> u64 {
    if n <= U32_MAX_LEN {
        4
    } else {
        8
    }
}

/// An owned index buffer: `u32` when the dataset length is at most 2**32, `u64` above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Indices {
    /// Indices of a dataset with at most 2**32 samples.
    U32(Vec<u32>),
    /// Indices of a larger dataset.
    U64(Vec<u64>),
}

impl Indices {
    /// Number of indices held.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{permutation, Indices};
    ///
    /// assert_eq!(permutation(100, 0, 0).unwrap().len(), 100);
    /// assert_eq!(Indices::U64(vec![5, 6]).len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        match self {
            Indices::U32(v) => v.len(),
            Indices::U64(v) => v.len(),
        }
    }

    /// Whether the buffer is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::permutation;
    ///
    /// assert!(permutation(0, 0, 0).unwrap().is_empty());
    /// assert!(!permutation(1, 0, 0).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices widened to `u64` (a copy).
    pub(crate) fn to_u64_vec(&self) -> Vec<u64> {
        match self {
            Indices::U32(v) => v.iter().map(|&x| x as u64).collect(),
            Indices::U64(v) => v.clone(),
        }
    }
}

/// Checks a dataset length against [`MAX_LEN`].
pub(crate) fn check_len(name: &'static str, n: u64) -> Result<u64> {
    if n > MAX_LEN {
        return Err(Error::out_of_range(name, "in [0, 2**63 - 1]", n));
    }
    Ok(n)
}

/// Converts a length to `usize`, failing cleanly on 32-bit targets.
pub(crate) fn to_usize(what: &'static str, n: u64, elem_bytes: usize) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::Alloc {
        what,
        bytes: n as u128 * elem_bytes as u128,
    })
}

/// An empty vector with room for exactly `n` elements, or [`Error::Alloc`] instead of an abort.
pub(crate) fn try_with_capacity<T>(what: &'static str, n: u64) -> Result<Vec<T>> {
    let elem = std::mem::size_of::<T>();
    let len = to_usize(what, n, elem)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::Alloc {
        what,
        bytes: n as u128 * elem as u128,
    })?;
    Ok(v)
}

/// Keeps `v[from..from + len]` in place (moved to the front, the rest dropped; the capacity is
/// kept for the caller to release): cutting a computed share to the positions asked for
/// without a second buffer.
pub(crate) fn keep_range<T: Copy>(v: &mut Vec<T>, from: usize, len: usize) {
    v.copy_within(from..from + len, 0);
    v.truncate(len);
}

/// Buffers from this size on ask the kernel for transparent huge pages.
pub(crate) const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An empty vector with room for exactly `n` elements (an [`Error::Alloc`] naming `what`
/// instead of an abort), and on Linux the kernel advised to back a large buffer with
/// transparent huge pages before it is first touched (`madvise(MADV_HUGEPAGE)`): a 4 GB
/// buffer then needs about 2,000 page faults instead of a million, and far fewer TLB misses.
/// The advice changes speed only, never contents; where it is refused nothing changes.
///
/// # Errors
///
/// [`Error::Alloc`] when `n` elements do not fit in memory.
///
/// # Examples
///
/// ```
/// let v = croupier_core::try_with_capacity_huge::<u64>("a buffer", 1 << 20).unwrap();
/// assert!(v.is_empty() && v.capacity() == 1 << 20);
/// ```
pub fn try_with_capacity_huge<T>(what: &'static str, n: u64) -> Result<Vec<T>> {
    let v = try_with_capacity::<T>(what, n)?;
    advise_huge_range(v.as_ptr() as usize, v.capacity() * std::mem::size_of::<T>());
    Ok(v)
}

/// Advises the kernel to back `buffer` with transparent huge pages where it is not yet
/// touched (Linux, `madvise(MADV_HUGEPAGE)` on its whole 2 MiB blocks): for a fresh, zeroed
/// buffer from a large `vec![0; n]`, which the allocator takes from the kernel untouched. A
/// hint that lasts as long as the mapping; it changes speed only, never contents, and where it
/// is refused nothing changes.
///
/// # Examples
///
/// ```
/// let v = vec![0u32; 1 << 22];
/// croupier_core::advise_huge(&v);
/// assert!(v.iter().all(|&x| x == 0));
/// ```
pub fn advise_huge<T>(buffer: &[T]) {
    advise_huge_range(buffer.as_ptr() as usize, std::mem::size_of_val(buffer));
}

/// [`advise_huge`] over `[start, start + bytes)`.
fn advise_huge_range(start: usize, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_BYTES {
        let aligned = start.next_multiple_of(HUGE_PAGE_BYTES);
        let end = (start + bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        if end > aligned {
            // SAFETY: [aligned, end) lies inside the caller's allocation; madvise only sets a
            // hint.
            unsafe {
                libc::madvise(
                    aligned as *mut libc::c_void,
                    end - aligned,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}

/// `[0, n)` in order in a fresh buffer (advised onto huge pages: a shuffle reads it at
/// random), written by all threads, so that the page faults of first touch are
/// spread over the cores (numpy's `arange` pays them on one).
///
/// # Errors
///
/// [`Error::Cancelled`] when cancelled, an allocation error when `n`
/// values do not fit in memory.
///
/// # Examples
///
/// ```
/// assert_eq!(croupier_core::range_par::<u32>(5).unwrap(), [0, 1, 2, 3, 4]);
/// ```
pub fn range_par<T: Index>(n: u64) -> Result<Vec<T>> {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 18;
    let mut v = try_with_capacity_huge::<T>("an index range", n)?;
    v.spare_capacity_mut()[..n as usize]
        .par_chunks_mut(PIECE)
        .enumerate()
        .for_each(|(p, c)| {
            if !crate::cancel::cancelled() {
                let first = (p * PIECE) as u64;
                for (k, x) in c.iter_mut().enumerate() {
                    x.write(T::from_u64(first + k as u64));
                }
            }
        });
    if crate::cancel::cancelled() {
        return Err(Error::Cancelled);
    }
    // SAFETY: the first n elements were all written just above (the call was not cancelled).
    unsafe { v.set_len(n as usize) };
    Ok(v)
}

/// `values` repeated `times` times in a fresh buffer (advised onto huge pages: a shuffle reads
/// it at random), written by all threads: numpy's `tile` copies on one thread, through an
/// intermediate array, and pays the first touch there (a 245 MB document index: 0.53-0.87 s
/// with `np.tile` against 0.24-0.26 s written so, on the 2-core VM).
///
/// # Errors
///
/// [`Error::Cancelled`] when cancelled, an allocation error when the values do not fit in
/// memory.
///
/// # Examples
///
/// ```
/// assert_eq!(croupier_core::tile_par(&[7u32, 9], 3).unwrap(), [7, 9, 7, 9, 7, 9]);
/// ```
pub fn tile_par<T: Copy + Send + Sync>(values: &[T], times: u64) -> Result<Vec<T>> {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 18;
    let n = (values.len() as u64)
        .checked_mul(times)
        .ok_or(Error::Alloc {
            what: "a tiled index",
            bytes: values.len() as u128 * times as u128 * std::mem::size_of::<T>() as u128,
        })?;
    let mut v = try_with_capacity_huge::<T>("a tiled index", n)?;
    if n > 0 {
        v.spare_capacity_mut()[..n as usize]
            .par_chunks_mut(PIECE)
            .enumerate()
            .for_each(|(p, piece)| {
                if crate::cancel::cancelled() {
                    return;
                }
                // The piece starts inside a repeat; it copies what is left of that one, then
                // whole repeats, then the start of the last.
                let mut from = (p * PIECE) % values.len();
                let mut rest = piece;
                while !rest.is_empty() {
                    let take = (values.len() - from).min(rest.len());
                    let (head, tail) = rest.split_at_mut(take);
                    for (x, &value) in head.iter_mut().zip(&values[from..from + take]) {
                        x.write(value);
                    }
                    rest = tail;
                    from = 0;
                }
            });
    }
    if crate::cancel::cancelled() {
        return Err(Error::Cancelled);
    }
    // SAFETY: the first n elements were all written just above (the call was not cancelled).
    unsafe { v.set_len(n as usize) };
    Ok(v)
}

/// `n` zeros in a fresh buffer (huge pages as [`try_with_capacity_huge`]), written by all
/// threads, so that the page faults of first touch are spread over the cores instead of
/// paid on one.
pub(crate) fn zeros_par<T: Index>(what: &'static str, n: u64) -> Result<Vec<T>> {
    use rayon::prelude::*;
    let mut v = try_with_capacity_huge::<T>(what, n)?;
    v.spare_capacity_mut()[..n as usize]
        .par_chunks_mut(1 << 18)
        .for_each(|c| {
            if !crate::cancel::cancelled() {
                c.iter_mut().for_each(|x| _ = x.write(T::from_u64(0)));
            }
        });
    if crate::cancel::cancelled() {
        // Touching gigabytes takes seconds: a cancelled call stops here (its caller discards
        // whatever it returns, so an empty buffer does).
        return Ok(Vec::new());
    }
    // SAFETY: the first n elements were all written just above (the call was not cancelled).
    unsafe { v.set_len(n as usize) };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::tile_par;

    #[test]
    fn tile_par_repeats_the_values_across_pieces() {
        // Lengths that put piece starts (every 2**18 values) in the middle of a repeat, at a
        // repeat's start, and a single repeat longer than a piece.
        for (len, times) in [
            (1usize, 5u64),
            (3, 200_000),
            (1 << 18, 3),
            (300_001, 4),
            (7, 0),
        ] {
            let values: Vec<u32> = (0..len as u32).map(|v| v * 3 + 1).collect();
            let tiled = tile_par(&values, times).unwrap();
            assert_eq!(tiled.len() as u64, len as u64 * times);
            for (k, &x) in tiled.iter().enumerate() {
                assert_eq!(x, values[k % len], "len {len}, times {times}, position {k}");
            }
        }
        assert!(tile_par::<u32>(&[], 9).unwrap().is_empty());
    }
}

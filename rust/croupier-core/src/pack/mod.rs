//! Packing documents into fixed-length samples: Megatron-Core's sample index.
//!
//! The documents of a (shuffled) document index are read as one stream of tokens; sample `k`
//! starts at token `k * seq_length` of it. megatron-core's `build_sample_idx` records, for each
//! sample start, the document (its place in the document index) and the offset in it, walking
//! the documents one by one on one thread. The same rows follow from prefix sums of the
//! documents' lengths: sample `k` lies in the first document whose stream end reaches
//! `k * seq_length + extra` (`extra`: the one token a sample reads past its end, when it does),
//! so the index is built in windows of the document index: each window's lengths gathered once
//! (in parallel, into a buffer that stays in cache), then its pieces, each knowing from its
//! first prefix sum which samples start inside it, write their rows in parallel.

use rayon::prelude::*;

use crate::cancel::cancelled;
use crate::error::{Error, Result};
use crate::prefault::{writing_ahead, Stream};

/// The shape of a sample index: its arguments as megatron-core's `build_sample_idx` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleIndexSpec {
    /// Tokens in a sample (at least 1).
    pub seq_length: i32,
    /// Epochs the document index holds (at least 1).
    pub num_epochs: i32,
    /// Tokens in one epoch (at least 1).
    pub tokens_per_epoch: i64,
    /// Whether the last, partial sample is left out.
    pub drop_last_partial_sequence: bool,
    /// Tokens a sample reads past its end (0 or 1).
    pub add_extra_token: i32,
}

impl SampleIndexSpec {
    /// Samples in the index (its rows less one), computed as megatron-core does: by integer
    /// division when the partial sample is dropped, else as the ceiling of a single-precision
    /// (`f32`) division.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::SampleIndexSpec;
    ///
    /// let spec = SampleIndexSpec {
    ///     seq_length: 4,
    ///     num_epochs: 2,
    ///     tokens_per_epoch: 11,
    ///     drop_last_partial_sequence: true,
    ///     add_extra_token: 1,
    /// };
    /// assert_eq!(spec.num_samples().unwrap(), 5); // (2 * 11 - 1) / 4
    /// ```
    pub fn num_samples(&self) -> Result<u64> {
        if self.seq_length < 1 {
            return Err(Error::out_of_range(
                "seq_length",
                "at least 1",
                self.seq_length.to_string(),
            ));
        }
        if self.num_epochs < 1 {
            return Err(Error::out_of_range(
                "num_epochs",
                "at least 1",
                self.num_epochs.to_string(),
            ));
        }
        if self.tokens_per_epoch < 1 {
            return Err(Error::out_of_range(
                "tokens_per_epoch",
                "at least 1",
                self.tokens_per_epoch.to_string(),
            ));
        }
        if !(0..=1).contains(&self.add_extra_token) {
            return Err(Error::out_of_range(
                "add_extra_token_to_sequence",
                "0 or 1",
                self.add_extra_token.to_string(),
            ));
        }
        let tokens = (self.num_epochs as i64)
            .checked_mul(self.tokens_per_epoch)
            .ok_or_else(|| {
                Error::out_of_range("num_epochs * tokens_per_epoch", "below 2**63", "more")
            })?
            - self.add_extra_token as i64;
        let samples = if self.drop_last_partial_sequence {
            tokens / self.seq_length as i64
        } else {
            // megatron-core: ceil(float(tokens) / seq_length), in single precision.
            ((tokens as f32) / (self.seq_length as f32)).ceil() as i64
        };
        Ok(samples.max(0) as u64)
    }
}

/// Element types of a sample index (`int32` or `int64`, as megatron-core picks).
pub trait SampleIndexValue: Copy + Send + Sync {
    /// `v` as this type (it fits: megatron-core's choice of type guarantees it).
    fn of(v: i64) -> Self;
}

impl SampleIndexValue for i32 {
    fn of(v: i64) -> Self {
        v as i32
    }
}

impl SampleIndexValue for i64 {
    fn of(v: i64) -> Self {
        v
    }
}

/// megatron-core's `build_sample_idx` into `out` (`2 * (num_samples + 1)` values: per row the
/// document's place in `document_index` and the offset in it), for the documents
/// `document_index` (ids into `sizes`, the documents' lengths).
///
/// # Examples
///
/// ```
/// use croupier_core::{sample_index, SampleIndexSpec};
///
/// let spec = SampleIndexSpec {
///     seq_length: 4,
///     num_epochs: 1,
///     tokens_per_epoch: 10,
///     drop_last_partial_sequence: true,
///     add_extra_token: 1,
/// };
/// // Documents of 3, 5 and 2 tokens, read in the order 1, 0, 2 (the stream's tokens 0-4,
/// // 5-7, 8-9): rows start at tokens 0, 4 (place 0, offset 4) and 8 (place 2, offset 0).
/// let mut out = vec![0i32; 2 * 3];
/// sample_index(&[3, 5, 2], &[1, 0, 2], &spec, &mut out).unwrap();
/// assert_eq!(out, [0, 0, 0, 4, 2, 0]);
/// ```
pub fn sample_index<T: SampleIndexValue>(
    sizes: &[i32],
    document_index: &[i32],
    spec: &SampleIndexSpec,
    out: &mut [T],
) -> Result<()> {
    // `out` is often fresh memory (the binding's zeroed buffer, tens of megabytes for a large
    // dataset, not yet touched): a helper thread faults it in ahead of the walk, so the
    // threads gathering the lengths do not wait on its faults.
    let stream = [Stream::of(out)];
    writing_ahead(&stream, || {
        sample_index_in_windows(sizes, document_index, spec, out, WINDOW)
    })
}

/// [`sample_index`], its documents read in windows of `window` (tests take small ones).
fn sample_index_in_windows<T: SampleIndexValue>(
    sizes: &[i32],
    document_index: &[i32],
    spec: &SampleIndexSpec,
    out: &mut [T],
    window: usize,
) -> Result<()> {
    let samples = spec.num_samples()?;
    if document_index.is_empty() {
        return Err(Error::out_of_range(
            "document_index",
            "not empty",
            "no documents",
        ));
    }
    if out.len() as u64 != 2 * (samples + 1) {
        return Err(Error::out_of_range(
            "out",
            format!("of 2 * (num_samples + 1) = {}", 2 * (samples + 1)),
            out.len().to_string(),
        ));
    }
    // The inputs are checked in parallel pieces that look at the call's cancellation first:
    // at 2e8 documents the two checks read 1.6 GB, over a second on a slow VM, and a Ctrl-C
    // there waited for them.
    let bad_size = first_at_least(sizes, 1 << 31); // a negative length, as u32
    let bad_id = first_at_least(document_index, id_limit(sizes.len()));
    if cancelled() {
        return Err(Error::Cancelled);
    }
    if let Some(j) = bad_size {
        return Err(Error::out_of_range(
            "sizes",
            "at least 0",
            sizes[j].to_string(),
        ));
    }
    if let Some(j) = bad_id {
        return Err(Error::out_of_range(
            "document_index",
            format!("ids in [0, {})", sizes.len()),
            format!("document_index[{j}] = {}", document_index[j]),
        ));
    }
    let (seq, extra) = (spec.seq_length as i64, spec.add_extra_token as i64);
    // Samples k >= 1 whose start k * seq + extra is at most `tokens` (k <= samples).
    let started = |tokens: i64| (((tokens - extra).max(0) / seq) as u64).min(samples);
    let (head, mut rows) = out.split_at_mut(2);
    head[0] = T::of(0);
    head[1] = T::of(0);
    // The documents are read in windows: each window's lengths are gathered once, in parallel
    // (the lengths are read in the order of a shuffled index, a cache miss each: the time is
    // here), into a buffer that stays in cache; then each piece of the window, its first
    // prefix sum known from the pieces before it, writes the rows (samples) starting inside
    // it, in parallel too.
    let window = document_index.len().min(window.max(1));
    let piece = window
        .div_ceil(PIECES_PER_THREAD * rayon::current_num_threads())
        .max(1);
    let mut lengths = vec![0i32; window];
    let mut tokens = 0i64; // before the window
    for (w, docs) in document_index.chunks(window).enumerate() {
        if cancelled() {
            return Err(Error::Cancelled);
        }
        if rows.is_empty() {
            break; // every sample placed: megatron-core's walk stops here too
        }
        let lengths = &mut lengths[..docs.len()];
        let totals: Vec<i64> = lengths
            .par_chunks_mut(piece)
            .zip(docs.par_chunks(piece))
            .map(|(lengths, docs)| {
                let mut total = 0;
                for (j, (length, &d)) in lengths.iter_mut().zip(docs).enumerate() {
                    if let Some(&ahead) = docs.get(j + AHEAD) {
                        prefetch(&sizes[ahead as usize]);
                    }
                    *length = sizes[d as usize];
                    total += *length as i64;
                }
                total
            })
            .collect();
        // Each piece's first prefix sum, and its share of the rows.
        let mut shares = Vec::with_capacity(totals.len());
        for (p, total) in totals.iter().enumerate() {
            let (from, to) = (started(tokens), started(tokens + total));
            let (share, rest) = rows.split_at_mut(2 * (to - from) as usize);
            shares.push((p, tokens, from, share));
            rows = rest;
            tokens += total;
        }
        let begin = w * window;
        let lengths = &*lengths;
        shares.into_par_iter().for_each(|(p, first, from, share)| {
            let mut target = (from + 1) as i64 * seq + extra;
            let mut before = first;
            let at = p * piece;
            let lengths = &lengths[at..(at + piece).min(lengths.len())];
            // No branch on whether a sample starts in a document: each document writes its
            // candidate row into the next row's place and moves on by one row when a sample
            // starts in it (here about one document in four, at random: a branch on it
            // mispredicted about once a row). A later document's candidate overwrites a row
            // that was not taken; the share holds no row past its last start, so none is
            // left unwritten. (The loop for a second start in one document is a branch, but
            // one that is almost never taken while documents are shorter than a sample.)
            let open = share.len() / 2;
            let mut next = 0;
            for (j, &length) in lengths.iter().enumerate() {
                if next == open {
                    break; // every row of the share written
                }
                let doc = T::of((begin + at + j) as i64);
                let after = before + length as i64;
                share[2 * next] = doc;
                share[2 * next + 1] = T::of(target - extra - before);
                let starts = target <= after;
                next += starts as usize;
                target += seq * starts as i64;
                // A document longer than a sample holds more starts.
                while target <= after && next < open {
                    share[2 * next] = doc;
                    share[2 * next + 1] = T::of(target - extra - before);
                    next += 1;
                    target += seq;
                }
                before = after;
            }
        });
    }
    // Samples past the documents' end: the last document, at its length less the extra token.
    let last = *document_index.last().expect("not empty");
    let tail_offset = sizes[last as usize] as i64 - extra;
    for row in rows.chunks_exact_mut(2) {
        row[0] = T::of(document_index.len() as i64 - 1);
        row[1] = T::of(tail_offset);
    }
    if cancelled() {
        return Err(Error::Cancelled);
    }
    Ok(())
}

/// Inputs checked per parallel piece (each piece looks at the call's cancellation first).
const CHECK_PIECE: usize = 1 << 20;

/// The bound of valid document ids as a `u32`, for `ids` documents: `ids`, at most `2**31`
/// (an `i32` id is below that; a negative one, read as `u32`, is at least that).
fn id_limit(ids: usize) -> u32 {
    ids.min(1 << 31) as u32
}

/// The place of the first value of `values` at least `limit` as a `u32` (a negative value is
/// at least `2**31`), or `None`; checked in parallel pieces of [`CHECK_PIECE`] values, each
/// piece by its greatest value (a loop the compiler vectorises) and searched only when that
/// fails. Stops early when the call is cancelled (the caller then checks [`cancelled`]).
fn first_at_least(values: &[i32], limit: u32) -> Option<usize> {
    values
        .par_chunks(CHECK_PIECE)
        .enumerate()
        .find_map_first(|(k, piece)| {
            if cancelled() {
                return None;
            }
            let greatest = piece.iter().fold(0u32, |m, &v| m.max(v as u32));
            if greatest < limit {
                return None;
            }
            piece
                .iter()
                .position(|&v| v as u32 >= limit)
                .map(|j| k * CHECK_PIECE + j)
        })
}

/// Documents whose lengths are gathered at once (4 MiB of `i32`: the buffer stays in cache
/// between its gather and its walk).
const WINDOW: usize = 1 << 20;
/// Pieces of a window per thread (uneven pieces balance).
const PIECES_PER_THREAD: usize = 4;

/// Documents between asking for a length and reading it.
const AHEAD: usize = 96;

/// Asks the CPU to bring `value`'s cache line in (a hint, no effect on any result).
#[inline(always)]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; any address is allowed, this one is valid.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// megatron-core's `build_sample_idx` walk, as its C++ writes it.
    fn reference(sizes: &[i32], docs: &[i32], spec: &SampleIndexSpec) -> Vec<i64> {
        let samples = spec.num_samples().unwrap() as usize;
        let (seq, extra) = (spec.seq_length, spec.add_extra_token);
        let mut out = vec![0i64; 2 * (samples + 1)];
        let (mut j, mut offset, mut row) = (0usize, 0i64, 1usize);
        while row <= samples {
            let mut remaining = seq + extra;
            while remaining != 0 {
                let length = sizes[docs[j] as usize] as i64 - offset;
                remaining -= length as i32;
                if remaining <= 0 {
                    offset += remaining as i64 + length - extra as i64;
                    remaining = 0;
                } else {
                    if j == docs.len() - 1 {
                        offset = sizes[docs[j] as usize] as i64 - extra as i64;
                        break;
                    }
                    j += 1;
                    offset = 0;
                }
            }
            out[2 * row] = j as i64;
            out[2 * row + 1] = offset;
            row += 1;
        }
        out
    }

    #[test]
    fn rows_are_megatron_cores() {
        let mut lcg = crate::testkit::Lcg::new(3);
        let mut next = |bound: u64| lcg.below(bound);
        for case in 0..60 {
            let n_sizes = 1 + next(50) as usize;
            let sizes: Vec<i32> = (0..n_sizes)
                .map(|_| next(if case % 3 == 0 { 4 } else { 40 }) as i32)
                .collect();
            let epochs = 1 + next(3) as i32;
            let docs: Vec<i32> = (0..epochs as usize * n_sizes)
                .map(|_| next(n_sizes as u64) as i32)
                .collect();
            let tokens: i64 = docs
                .iter()
                .map(|&d| sizes[d as usize] as i64)
                .sum::<i64>()
                .max(2);
            for (seq, extra, drop, tpe) in [
                (1 + next(9) as i32, 1, true, tokens / epochs as i64),
                (1 + next(9) as i32, 0, true, tokens / epochs as i64),
                (1 + next(9) as i32, 1, false, tokens / epochs as i64),
                (1 + next(9) as i32, 0, false, tokens / epochs as i64 + 5),
            ] {
                let spec = SampleIndexSpec {
                    seq_length: seq,
                    num_epochs: epochs,
                    tokens_per_epoch: tpe.max(1),
                    drop_last_partial_sequence: drop,
                    add_extra_token: extra,
                };
                let expected = reference(&sizes, &docs, &spec);
                let mut out = vec![0i64; expected.len()];
                sample_index(&sizes, &docs, &spec, &mut out).unwrap();
                assert_eq!(out, expected, "{sizes:?} {docs:?} {spec:?}");
                // Windows of every size down to one document each: the same rows.
                for window in [1, 2, 3, 7, 1 + next(docs.len() as u64) as usize] {
                    let mut out = vec![-1i64; expected.len()];
                    sample_index_in_windows(&sizes, &docs, &spec, &mut out, window).unwrap();
                    assert_eq!(
                        out, expected,
                        "window {window}: {sizes:?} {docs:?} {spec:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_first_value_out_of_range_is_found_in_any_piece() {
        let n = 2 * CHECK_PIECE + 77;
        let mut values: Vec<i32> = (0..n).map(|i| (i % 1000) as i32).collect();
        assert_eq!(first_at_least(&values, 1000), None);
        assert_eq!(first_at_least(&values, 1 << 31), None);
        assert_eq!(first_at_least(&values, 999), Some(999)); // a value equal to the limit
        for (at, bad) in [
            (0, 1000),
            (CHECK_PIECE - 1, 1000),
            (CHECK_PIECE, -1),
            (n - 1, i32::MIN),
            (CHECK_PIECE + 5, i32::MAX),
        ] {
            let kept = values[at];
            values[at] = bad;
            assert_eq!(first_at_least(&values, 1000), Some(at), "{bad} at {at}");
            let negative = (bad < 0).then_some(at);
            assert_eq!(first_at_least(&values, 1 << 31), negative, "{bad} at {at}");
            values[at] = kept;
        }
        // Two values out of range in different pieces: the earlier one.
        values[2 * CHECK_PIECE + 3] = -5;
        values[CHECK_PIECE + 9] = 5000;
        assert_eq!(first_at_least(&values, 1000), Some(CHECK_PIECE + 9));
        assert_eq!(first_at_least(&[], 0), None);
    }

    #[test]
    fn ids_are_limited_below_2_31_whatever_the_sizes() {
        assert_eq!(id_limit(0), 0);
        assert_eq!(id_limit(5), 5);
        assert_eq!(id_limit(1 << 31), 1 << 31);
        assert_eq!(id_limit((1 << 31) + 7), 1 << 31); // i32::MIN still refused
        assert_eq!(id_limit((1 << 32) + 3), 1 << 31); // not 3
        assert_eq!(
            first_at_least(&[5, i32::MIN], id_limit((1 << 31) + 7)),
            Some(1)
        );
        assert_eq!(
            first_at_least(&[5, i32::MAX], id_limit((1 << 31) + 7)),
            None
        );
    }

    /// 5,000 documents of 0 to 299 tokens, and a document index of 400,000 of them.
    fn many_documents() -> (Vec<i32>, Vec<i32>) {
        let sizes = (0..5000i64).map(|i| (i * 7919 % 300) as i32).collect();
        let docs = (0..400_000)
            .map(|j| ((j as u64 * 2654435761) % 5000) as i32)
            .collect();
        (sizes, docs)
    }

    #[test]
    fn windows_and_pieces_agree_with_one_walk() {
        let (sizes, docs) = many_documents();
        let tokens: i64 = docs.iter().map(|&d| sizes[d as usize] as i64).sum();
        // All the documents, and a third of them (the walk stops once every sample is placed,
        // windows before the index's end).
        for tokens_per_epoch in [tokens, tokens / 3] {
            let spec = SampleIndexSpec {
                seq_length: 1024,
                num_epochs: 1,
                tokens_per_epoch,
                drop_last_partial_sequence: true,
                add_extra_token: 1,
            };
            let expected = reference(&sizes, &docs, &spec);
            for window in [WINDOW, 1 << 16, 99_991] {
                let mut out = vec![-1i32; expected.len()];
                sample_index_in_windows(&sizes, &docs, &spec, &mut out, window).unwrap();
                assert!(
                    out.iter().zip(&expected).all(|(&a, &b)| a as i64 == b),
                    "{window}, {tokens_per_epoch} tokens"
                );
            }
        }
    }

    #[test]
    fn an_index_faulted_in_by_the_helper_has_the_same_rows() {
        // Samples of 16 tokens: about 3.7e6 rows, an output past WRITING_AHEAD_FROM, fresh
        // zeroed memory that the helper faults in while the walk writes it.
        let (sizes, docs) = many_documents();
        let tokens: i64 = docs.iter().map(|&d| sizes[d as usize] as i64).sum();
        let spec = SampleIndexSpec {
            seq_length: 16,
            num_epochs: 1,
            tokens_per_epoch: tokens,
            drop_last_partial_sequence: true,
            add_extra_token: 1,
        };
        let expected = reference(&sizes, &docs, &spec);
        assert!(4 * expected.len() > crate::prefault::WRITING_AHEAD_FROM);
        let mut out = vec![0i32; expected.len()];
        sample_index(&sizes, &docs, &spec, &mut out).unwrap();
        assert!(out.iter().zip(&expected).all(|(&a, &b)| a as i64 == b));
    }
}

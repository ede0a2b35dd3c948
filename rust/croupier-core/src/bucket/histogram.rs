//! How many samples have each length: the one histogram the boundary finders share.

use crate::cancel::{cancelled, par_max, sort_values, CHECK_EVERY};
use rayon::prelude::*;

/// Lengths below this are counted in a dense table (8 bytes per value up to the longest);
/// from it on, a sorted copy of the lengths is counted instead.
const TABLE_MAX: u64 = 1 << 24;

/// Every distinct length among `lengths` for which `keep` holds, increasing, and how many
/// samples have it. In parallel; cancellable (the caller discards what a cancelled call
/// returns).
pub(crate) fn length_counts<L, F>(lengths: &[L], keep: F) -> (Vec<u64>, Vec<u64>)
where
    L: Copy + Into<u64> + Send + Sync,
    F: Fn(u64) -> bool + Sync,
{
    let max = par_max(lengths);
    if max < TABLE_MAX {
        let table = lengths
            .par_chunks(1 << 16)
            .fold(
                || vec![0u64; (max + 1) as usize],
                |mut h, chunk| {
                    if cancelled() {
                        return h; // the caller discards the histogram
                    }
                    for &x in chunk {
                        h[x.into() as usize] += 1;
                    }
                    h
                },
            )
            .reduce(
                || vec![0u64; (max + 1) as usize],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        return table
            .iter()
            .enumerate()
            .filter(|&(v, &c)| c > 0 && keep(v as u64))
            .map(|(v, &c)| (v as u64, c))
            .unzip();
    }
    let mut sorted: Vec<u64> = lengths
        .par_iter()
        .map(|&l| l.into())
        .filter(|&l| keep(l))
        .collect();
    sort_values(&mut sorted);
    let mut out: (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    for (i, v) in sorted.into_iter().enumerate() {
        if i % CHECK_EVERY == 0 && cancelled() {
            break; // the caller discards the counts
        }
        if out.0.last() == Some(&v) {
            *out.1.last_mut().expect("a value") += 1;
        } else {
            out.0.push(v);
            out.1.push(1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_count_the_same() {
        let small: Vec<u64> = [5, 3, 5, 9, 3, 5].to_vec();
        assert_eq!(
            length_counts(&small, |_| true),
            (vec![3, 5, 9], vec![2, 3, 1])
        );
        assert_eq!(length_counts(&small, |v| v != 5), (vec![3, 9], vec![2, 1]));
        let big: Vec<u64> = small.iter().map(|&v| v << 30).collect(); // the sorted way
        assert_eq!(
            length_counts(&big, |_| true),
            (vec![3 << 30, 5 << 30, 9 << 30], vec![2, 3, 1])
        );
    }
}

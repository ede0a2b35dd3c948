//! One rank's micro-batches of consecutive samples, as Megatron-LM's sequential pretraining
//! sampler deals them: the samples in their order are cut into groups of `group` samples
//! (`micro_batch_size * data_parallel_size`), and the rank takes `micro_batch_size`
//! consecutive samples of each group, starting `first` samples into the first group.

use crate::error::{Error, Result};

/// The micro-batches of groups `from..to`: group `k`'s are the `mbs` samples from
/// `first + k * group`, one after another, flattened. `mbs` must be at least 1 and the last
/// sample below `2**63`.
///
/// # Examples
///
/// ```
/// use croupier_core::deal::micro_batches;
///
/// // Rank 1 of 2, micro-batches of 3, from sample 12: groups of 6, the rank's part from 15.
/// assert_eq!(micro_batches(15, 6, 3, 0, 2).unwrap(), [15, 16, 17, 21, 22, 23]);
/// ```
pub fn micro_batches(first: u64, group: u64, mbs: u64, from: u64, to: u64) -> Result<Vec<i64>> {
    if mbs == 0 || group < mbs {
        return Err(Error::out_of_range(
            "micro_batch_size",
            format!("1 to the group of {group}"),
            mbs.to_string(),
        ));
    }
    if to <= from {
        return Ok(Vec::new());
    }
    let last = (to - 1)
        .checked_mul(group)
        .and_then(|x| x.checked_add(first))
        .and_then(|x| x.checked_add(mbs - 1))
        .filter(|&x| x <= i64::MAX as u64);
    if last.is_none() {
        return Err(Error::out_of_range(
            "samples",
            "below 2**63",
            format!("group {} of {group} from {first}", to - 1),
        ));
    }
    let count = ((to - from) as usize)
        .checked_mul(mbs as usize)
        .ok_or_else(|| Error::out_of_range("micro-batches", "fewer", (to - from).to_string()))?;
    let mut out = Vec::with_capacity(count);
    for k in from..to {
        let base = (first + k * group) as i64;
        out.extend((0..mbs as i64).map(|j| base + j));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_gives_the_rank_its_contiguous_part() {
        for (first, group, mbs) in [(0, 1, 1), (5, 8, 4), (7, 12, 3), (100, 100, 100)] {
            for (from, to) in [(0, 0), (0, 1), (3, 9)] {
                let got = micro_batches(first, group, mbs, from, to).unwrap();
                let want: Vec<i64> = (from..to)
                    .flat_map(|k| (0..mbs).map(move |j| (first + k * group + j) as i64))
                    .collect();
                assert_eq!(got, want, "{first} {group} {mbs} {from} {to}");
            }
        }
    }

    #[test]
    fn refuses_what_cannot_be_dealt() {
        assert!(micro_batches(0, 4, 0, 0, 1).is_err());
        assert!(micro_batches(0, 2, 3, 0, 1).is_err());
        assert!(micro_batches(i64::MAX as u64, 4, 2, 0, 1).is_err());
        assert!(micro_batches(0, 1 << 62, 1, 0, 3).is_err());
        assert_eq!(micro_batches(0, 1 << 62, 1, 0, 2).unwrap(), [0, 1 << 62]);
    }
}

//! Helpers shared by the unit tests.

/// Pearson's chi-square statistic of `counts` against the same `expected` count in every cell.
pub(crate) fn chi2_flat<'a>(counts: impl IntoIterator<Item = &'a u64>, expected: f64) -> f64 {
    counts
        .into_iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

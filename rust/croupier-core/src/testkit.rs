//! Helpers shared by the unit tests.

/// Pearson's chi-square statistic of `counts` against the same `expected` count in every cell.
pub(crate) fn chi2_flat<'a>(counts: impl IntoIterator<Item = &'a u64>, expected: f64) -> f64 {
    counts
        .into_iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// Over seeds `0..trials`, how many distinct orders `draw(seed)` gave, and Pearson's chi-square
/// of their counts against all `orders` orders being equally likely.
pub(crate) fn orders_chi2<T: std::hash::Hash + Eq>(
    orders: u64,
    trials: u64,
    mut draw: impl FnMut(u64) -> Vec<T>,
) -> (usize, f64) {
    let mut counts = std::collections::HashMap::<Vec<T>, u64>::new();
    for seed in 0..trials {
        *counts.entry(draw(seed)).or_default() += 1;
    }
    let chi = chi2_flat(counts.values(), trials as f64 / orders as f64);
    (counts.len(), chi)
}

/// Over seeds `0..trials`, where values `0`, `n / 2` and `n - 1` land in `draw(seed)` (an order
/// of `[0, n)`), by tenth of the order: chi-square of that 3 x 10 table against flat (27 dof).
pub(crate) fn tenths_chi2(n: u64, trials: u64, mut draw: impl FnMut(u64) -> Vec<u64>) -> f64 {
    let mut table = [[0u64; 10]; 3];
    for seed in 0..trials {
        let order = draw(seed);
        for (row, v) in [0, n / 2, n - 1].iter().enumerate() {
            let pos = order.iter().position(|x| x == v).unwrap() as u64;
            table[row][(pos * 10 / n) as usize] += 1;
        }
    }
    chi2_flat(table.iter().flatten(), trials as f64 / 10.0)
}

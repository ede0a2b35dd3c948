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

/// A small linear congruential generator (Knuth's MMIX constants) for the tests' cases: not
/// for anything whose quality matters, and the same sequence everywhere.
pub(crate) struct Lcg(u64);

impl Lcg {
    pub(crate) fn new(seed: u64) -> Self {
        Lcg(seed)
    }

    /// The next state.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// The next state's high 31 bits, reduced below `bound` (at least 1).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        (self.next_u64() >> 33) % bound
    }

    /// The next state's high 53 bits as an `f64` in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

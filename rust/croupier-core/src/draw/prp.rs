//! A keyed pseudorandom permutation of `[0, n)` evaluated one position at a time: how
//! [`crate::deal::class_split`] deals the values of a large value leaf to classes when a rank
//! wants only a few of them (many ranks), and how [`crate::chunk`] orders an epoch's full
//! chunks so that each load request is computed on its own.
//!
//! A balanced Feistel network on `2h` bits (`h = ceil(bits(n - 1) / 2)`, so the domain is less
//! than `4n`) with [`ROUNDS`] rounds, each round function a SplitMix64-style multiply-xorshift
//! of the half block and that round's key; positions that land outside `[0, n)` are encrypted
//! again until they fall inside ("cycle walking", Black and Rogaway, "Ciphers with arbitrary
//! finite domains", CT-RSA 2002), which keeps it a permutation of `[0, n)`. Grain's
//! `index_shuffle` reads permutations the same way. Six rounds: Luby and Rackoff's bound needs
//! four for a pseudorandom permutation; the extra two are cheap insurance for round functions
//! this light. Integer arithmetic only, so the permutation is the same on every platform.
//!
//! Feistel networks on few bits are far from uniform (on `2h` bits they only reach even
//! permutations, and with 2-bit halves a round function has 4 inputs), so domains of at most
//! [`TABLE_MAX`] positions are permuted explicitly instead: a Fisher–Yates shuffle of `[0, n)`
//! drawn from a SplitMix64 generator keyed the same way, looked up per position.

use crate::draw::cell_rng::CellRng;
use crate::stream::fold;

/// Feistel rounds.
const ROUNDS: usize = 6;
/// Domains up to this size are a shuffled table.
pub(crate) const TABLE_MAX: u64 = 1 << 8;

/// A permutation of `[0, n)` keyed by 64 bits.
#[derive(Debug, Clone)]
pub(crate) struct Prp {
    n: u64,
    half: u32,
    mask: u64,
    keys: [u64; ROUNDS],
    table: Vec<u32>,
}

impl Prp {
    /// The permutation of `[0, n)` (`n >= 1`) keyed by `key`.
    pub(crate) fn new(n: u64, key: u64) -> Self {
        debug_assert!(n >= 1);
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half = bits.div_ceil(2).max(1);
        let mut keys = [0u64; ROUNDS];
        let mut k = key;
        for slot in &mut keys {
            k = fold(k, 0x7072_7020_726f_756e); // "prp roun"
            *slot = k;
        }
        let mut table = Vec::new();
        if n <= TABLE_MAX {
            table = (0..n as u32).collect();
            let mut rng = CellRng::new(fold(key, 0x7072_7020_7461_626c)); // "prp tabl"
            for i in (1..table.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                table.swap(i, j);
            }
        }
        Prp {
            n,
            half,
            mask: (1u64 << half) - 1,
            keys,
            table,
        }
    }

    #[inline(always)]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half, x & self.mask);
        for &k in &self.keys {
            let mut z = (r ^ k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let f = (z ^ (z >> 32)) & self.mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }

    /// The image of `x < n`.
    #[inline(always)]
    pub(crate) fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        if let Some(&y) = self.table.get(x as usize) {
            return u64::from(y);
        }
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::chi2_flat;

    #[test]
    fn a_permutation_of_every_small_domain() {
        for n in 1..=300u64 {
            for key in [0u64, 1, 0xdead_beef] {
                let p = Prp::new(n, key);
                let mut seen = vec![false; n as usize];
                for x in 0..n {
                    let y = p.apply(x);
                    assert!(y < n && !seen[y as usize], "n={n} key={key}");
                    seen[y as usize] = true;
                }
            }
        }
        let p = Prp::new(1 << 20, 5);
        let mut seen = vec![false; 1 << 20];
        for x in 0..1u64 << 20 {
            let y = p.apply(x) as usize;
            assert!(!seen[y]);
            seen[y] = true;
        }
    }

    #[test]
    fn positions_are_spread_evenly() {
        // Where position 0 goes, over many keys, on a Feistel domain: uniform over 10 ranges of
        // [0, n) (chi-square, 9 dof).
        let n = 10_000u64;
        let mut counts = [0u64; 10];
        let trials = 100_000u64;
        for key in 0..trials {
            counts[(Prp::new(n, key).apply(0) / 1000) as usize] += 1;
        }
        let chi2 = chi2_flat(&counts, trials as f64 / 10.0);
        assert!(chi2 < 27.9, "chi2 = {chi2} (p < 0.001 at 9 dof)");
        // Pairs on a Feistel domain: (image of 0, image of 1) over keys, n = 6000, each image
        // bucketed into 6 ranges of 1000: 36 cells, 35 dof.
        let mut pairs = [[0u64; 6]; 6];
        let n = 6000u64;
        for key in 0..trials {
            let p = Prp::new(n, key);
            pairs[(p.apply(0) / 1000) as usize][(p.apply(1) / 1000) as usize] += 1;
        }
        let chi2 = chi2_flat(pairs.iter().flatten(), trials as f64 / 36.0);
        assert!(chi2 < 66.6, "chi2 = {chi2} (p < 0.001 at 35 dof)");
        // And the table: n = 6 exactly, every ordered pair equally likely (30 cells).
        let mut pairs = [[0u64; 6]; 6];
        for key in 0..trials {
            let p = Prp::new(6, key);
            pairs[p.apply(0) as usize][p.apply(1) as usize] += 1;
        }
        let off_diagonal =
            (0..6).flat_map(|a| (0..6).filter(move |&b| b != a).map(move |b| (a, b)));
        let chi2 = chi2_flat(
            off_diagonal.map(|(a, b)| &pairs[a][b]),
            trials as f64 / 30.0,
        );
        assert!(chi2 < 58.3, "chi2 = {chi2} (p < 0.001 at 29 dof)");
    }
}

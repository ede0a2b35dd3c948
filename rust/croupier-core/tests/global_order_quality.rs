//! The quality battery of the world-size-invariant order (`order="global"`): a keyed
//! permutation is not Fisher–Yates, so its permutations are tested, over 1,000 keys per size
//! (250 at 1e6), with the classical statistics of uniform random permutations against their
//! exact distributions, at a Bonferroni-corrected level of 1e-3 for the whole battery. The same
//! battery runs on a reference uniform shuffle (`rand`'s Fisher–Yates) as a control, which must
//! pass too, and on a weak keyed permutation (affine maps `i -> a*i + b mod n`), which must fail:
//! the battery can tell.
//!
//! Run in release (`cargo test --release -p croupier-core --test global_order_quality --
//! --ignored`, about a minute on 2 cores); `.ci/run` runs it with the slow tests. The results
//! are in `docs/design.md` ("The global order").

use croupier_core::RandomAccessPermutation;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;
use statrs::distribution::{ChiSquared, ContinuousCDF, Normal};

/// Keys (permutations) per size.
const KEYS: u64 = 1000;
/// Keys from this size on: a million-element permutation's statistics cost about a tenth of a
/// second of CPU each (the inversions' merge sort, the cycles' random walk), and 1,000 of them
/// took most of CI's battery time. 250 still resolve a mean shift of about 0.3 standard
/// deviations at the Bonferroni level; the smaller sizes keep 1,000.
const LARGE: u64 = 1_000_000;
const LARGE_KEYS: u64 = 250;

/// Keys (permutations) the battery draws at size `n`.
fn keys(n: u64) -> u64 {
    if n >= LARGE {
        LARGE_KEYS
    } else {
        KEYS
    }
}
/// The sizes of the battery: the five, plus 1025 and 2**17 + 1, where the network has
/// halves of unequal widths and walks the most (a domain of almost 2n).
const SIZES: [u64; 7] = [5, 64, 1000, 1025, 65_536, 131_073, 1_000_000];
/// Bins per axis of the position-by-value and adjacent-pair tables.
const BINS: u64 = 16;
/// The battery's family-wise level.
const LEVEL: f64 = 1e-3;

/// What one permutation contributes.
#[derive(Default, Clone)]
struct Stats {
    fixed: u64,
    cycles: u64,
    descents: u64,
    inversions: u64,
    /// `table[pos_bin * B + value_bin]`.
    table: Vec<u64>,
    /// `pairs[bin(p[i]) * B + bin(p[i + 1])]`.
    pairs: Vec<u64>,
}

fn bin(x: u64, n: u64, b: u64) -> usize {
    (x * b / n) as usize
}

/// `bins[x]` is `bin(x)`: looked up, not divided, a billion times per size.
fn bin_table(n: u64) -> Vec<u8> {
    let b = BINS.min(n);
    (0..n).map(|x| bin(x, n, b) as u8).collect()
}

fn stats(p: &[u64], bins: &[u8]) -> Stats {
    let n = p.len() as u64;
    let b = BINS.min(n) as usize;
    let mut s = Stats {
        table: vec![0; b * b],
        pairs: vec![0; b * b],
        ..Stats::default()
    };
    for (i, &v) in p.iter().enumerate() {
        s.fixed += u64::from(v == i as u64);
        let vb = bins[v as usize] as usize;
        s.table[bins[i] as usize * b + vb] += 1;
        if i + 1 < p.len() {
            s.descents += u64::from(p[i + 1] < v);
            s.pairs[vb * b + bins[p[i + 1] as usize] as usize] += 1;
        }
    }
    // Cycles, walked over a u32 copy with a bit set of the visited values (cache-resident).
    let q: Vec<u32> = p.iter().map(|&x| x as u32).collect();
    let mut seen = vec![0u64; p.len().div_ceil(64)];
    for start in 0..q.len() {
        if seen[start / 64] >> (start % 64) & 1 == 0 {
            s.cycles += 1;
            let mut i = start;
            while seen[i / 64] >> (i % 64) & 1 == 0 {
                seen[i / 64] |= 1 << (i % 64);
                i = q[i] as usize;
            }
        }
    }
    s.inversions = inversions(&q);
    s
}

/// Inversions by a bottom-up merge sort (sequential passes, faster than a Fenwick tree at
/// 1e6 values): each merge counts, for every value taken from the right run, the values
/// left in the left run.
fn inversions(p: &[u32]) -> u64 {
    let n = p.len();
    let mut a: Vec<u32> = p.to_vec();
    let mut b = vec![0u32; n];
    let mut count = 0u64;
    let mut width = 1;
    while width < n {
        for lo in (0..n).step_by(2 * width) {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut i, mut j, mut k) = (lo, mid, lo);
            // Branch-free: random data would mispredict every other comparison.
            while i < mid && j < hi {
                let right = a[j] < a[i];
                b[k] = if right { a[j] } else { a[i] };
                count += u64::from(right) * (mid - i) as u64;
                j += usize::from(right);
                i += usize::from(!right);
                k += 1;
            }
            b[k..k + mid - i].copy_from_slice(&a[i..mid]);
            k += mid - i;
            b[k..k + hi - j].copy_from_slice(&a[j..hi]);
        }
        std::mem::swap(&mut a, &mut b);
        width *= 2;
    }
    count
}

fn two_sided_normal(z: f64) -> f64 {
    2.0 * Normal::standard().sf(z.abs())
}

fn chi2_sf(x: f64, dof: f64) -> f64 {
    ChiSquared::new(dof).unwrap().sf(x)
}

/// A z-test of the mean of `values` against a known mean and variance.
fn mean_test(values: &[f64], mean: f64, var: f64) -> f64 {
    let k = values.len() as f64;
    let m = values.iter().sum::<f64>() / k;
    two_sided_normal((m - mean) / (var / k).sqrt())
}

/// `P(F = j)` for the fixed points `F` of a uniform permutation of `n`:
/// `(1/j!) * sum_{i=0}^{n-j} (-1)^i / i!`.
fn fixed_point_pmf(n: u64, j: u64) -> f64 {
    if j > n {
        return 0.0;
    }
    let mut fact = 1.0;
    let mut sum = 0.0;
    for i in 0..=(n - j) {
        if i > 0 {
            fact *= i as f64;
        }
        sum += if i % 2 == 0 { 1.0 } else { -1.0 } / fact;
    }
    let jf: f64 = (1..=j).map(|x| x as f64).product();
    sum / jf
}

/// The harmonic numbers `H_n` and `H_n^(2)`.
fn harmonic(n: u64) -> (f64, f64) {
    (1..=n).fold((0.0, 0.0), |(h, h2), i| {
        let x = i as f64;
        (h + 1.0 / x, h2 + 1.0 / (x * x))
    })
}

/// Pearson's statistic of a table of permutation counts against its expectation, scaled by
/// `(n - 1) / n` (counts of a permutation are drawn without replacement), with its p-value.
fn table_test(counts: &[u64], expected: &[f64], dof: f64, n: u64) -> f64 {
    let x: f64 = counts
        .iter()
        .zip(expected)
        .filter(|(_, &e)| e > 0.0)
        .map(|(&o, &e)| (o as f64 - e).powi(2) / e)
        .sum();
    chi2_sf(x * (n as f64 - 1.0) / n as f64, dof)
}

/// Every p-value of the battery for `n` over [`keys`]`(n)` permutations drawn by `perm(key)`,
/// named.
fn battery(n: u64, perm: impl Fn(u64) -> Vec<u64> + Sync) -> Vec<(String, f64)> {
    let keys = keys(n);
    let bins = bin_table(n);
    let all: Vec<Stats> = (0..keys)
        .into_par_iter()
        .map(|k| stats(&perm(k), &bins))
        .collect();
    let b = BINS.min(n);
    // The size of each bin: the x in [0, n) with x * b / n == j.
    let bin_size: Vec<u64> = (0..b)
        .map(|j| (j * n).div_ceil(b)..((j + 1) * n).div_ceil(b))
        .map(|r| r.end - r.start)
        .collect();
    let nf = n as f64;
    let mut out = Vec::new();
    let col = |f: fn(&Stats) -> u64| all.iter().map(|s| f(s) as f64).collect::<Vec<f64>>();

    // Fixed points: their exact distribution, 0..=3 and 4 or more.
    let mut counts = [0u64; 5];
    all.iter()
        .for_each(|s| counts[s.fixed.min(4) as usize] += 1);
    let mut probs: Vec<f64> = (0..4).map(|j| fixed_point_pmf(n, j)).collect();
    probs.push(1.0 - probs.iter().sum::<f64>());
    let x: f64 = counts
        .iter()
        .zip(&probs)
        .filter(|(_, &p)| p > 1e-12)
        .map(|(&o, &p)| (o as f64 - keys as f64 * p).powi(2) / (keys as f64 * p))
        .sum();
    let dof = probs.iter().filter(|&&p| p > 1e-12).count() as f64 - 1.0;
    out.push(("fixed points (exact law)".into(), chi2_sf(x, dof)));
    // Cycles: mean H_n, variance H_n - H_n^(2).
    let (h, h2) = harmonic(n);
    out.push((
        "cycles (mean H_n)".into(),
        mean_test(&col(|s| s.cycles), h, h - h2),
    ));
    // Parity: odd as often as even.
    let odd = all.iter().filter(|s| (n - s.cycles) % 2 == 1).count() as f64;
    let z = (odd - keys as f64 / 2.0) / (keys as f64 / 4.0).sqrt();
    out.push(("parity (odd half the time)".into(), two_sided_normal(z)));
    // Descents: mean (n - 1) / 2, variance (n + 1) / 12.
    out.push((
        "descents".into(),
        mean_test(&col(|s| s.descents), (nf - 1.0) / 2.0, (nf + 1.0) / 12.0),
    ));
    // Inversions: mean n(n-1)/4, variance n(n-1)(2n+5)/72.
    out.push((
        "inversions".into(),
        mean_test(
            &col(|s| s.inversions),
            nf * (nf - 1.0) / 4.0,
            nf * (nf - 1.0) * (2.0 * nf + 5.0) / 72.0,
        ),
    ));
    // Position by value: each position bin's values spread over the value bins in proportion.
    let mut table = vec![0u64; (b * b) as usize];
    let mut pairs = vec![0u64; (b * b) as usize];
    for s in &all {
        table.iter_mut().zip(&s.table).for_each(|(t, x)| *t += x);
        pairs.iter_mut().zip(&s.pairs).for_each(|(t, x)| *t += x);
    }
    let k = keys as f64;
    let expected: Vec<f64> = (0..b * b)
        .map(|c| k * bin_size[(c / b) as usize] as f64 * bin_size[(c % b) as usize] as f64 / nf)
        .collect();
    out.push((
        format!("position by value ({b}x{b} bins)"),
        table_test(&table, &expected, ((b - 1) * (b - 1)) as f64, n),
    ));
    // Adjacent pairs: (p[i], p[i+1]) spread over value-bin pairs as distinct values are. A
    // permutation's row and column sums are all but fixed (each value starts and ends at most
    // one pair), so (b - 1)^2 degrees of freedom, as for a contingency table.
    let expected: Vec<f64> = (0..b * b)
        .map(|c| {
            let (u, v) = (
                bin_size[(c / b) as usize] as f64,
                bin_size[(c % b) as usize] as f64,
            );
            let same = if c / b == c % b { 1.0 } else { 0.0 };
            k * (nf - 1.0) * u * (v - same) / (nf * (nf - 1.0))
        })
        .collect();
    out.push((
        format!("adjacent pairs ({b}x{b} bins)"),
        table_test(&pairs, &expected, ((b - 1) * (b - 1)) as f64, n),
    ));
    out
}

/// Every one of the `n!` orders for `n <= 6`, as often as the others (`200 * n!` keys).
fn every_order(n: u64, perm: impl Fn(u64) -> Vec<u64> + Sync) -> f64 {
    let orders: u64 = (1..=n).product();
    let keys = 200 * orders;
    let index = |p: &[u64]| -> usize {
        // The Lehmer code of p, an index in [0, n!).
        let mut idx = 0usize;
        for i in 0..p.len() {
            let smaller = p[i + 1..].iter().filter(|&&x| x < p[i]).count();
            idx = idx * (p.len() - i) + smaller;
        }
        idx
    };
    let mut counts = vec![0u64; orders as usize];
    for k in 0..keys {
        counts[index(&perm(k))] += 1;
    }
    let e = keys as f64 / orders as f64;
    let x: f64 = counts.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
    chi2_sf(x, orders as f64 - 1.0)
}

fn global(n: u64) -> impl Fn(u64) -> Vec<u64> + Sync {
    move |key| {
        let p = RandomAccessPermutation::new(n, key, 7);
        let mut out = vec![0u64; n as usize];
        p.fill_strided(&mut out, 0, n.max(1), 0, 1);
        out
    }
}

fn feistel_only(n: u64) -> impl Fn(u64) -> Vec<u64> + Sync {
    move |key| {
        let p = RandomAccessPermutation::feistel_only(n, key, 7);
        (0..n).map(|i| p.at(i)).collect()
    }
}

fn reference(n: u64) -> impl Fn(u64) -> Vec<u64> + Sync {
    move |key| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(key);
        let mut v: Vec<u64> = (0..n).collect();
        v.shuffle(&mut rng);
        v
    }
}

/// A weak keyed permutation: `i -> (a*i + b) mod n` with `a` a unit modulo `n`.
fn affine(n: u64) -> impl Fn(u64) -> Vec<u64> + Sync {
    move |key| {
        let mut a = ((key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) % n.max(2)) | 1;
        while gcd(a, n) != 1 {
            a += 2;
        }
        let b = key.wrapping_mul(0xbf58_476d_1ce4_e5b9) % n;
        (0..n)
            .map(|i| ((a as u128 * i as u128 + b as u128) % n as u128) as u64)
            .collect()
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A generator of the keyed permutations of one size.
type Make<'a> = &'a dyn Fn(u64) -> Box<dyn Fn(u64) -> Vec<u64> + Sync>;

/// Runs the battery over `sizes` (and every order of 1..=6 elements when `orders`) for one
/// generator, prints it, and returns the smallest p-value.
fn run(name: &str, make: Make<'_>, sizes: &[u64], orders: bool) -> f64 {
    let mut all = Vec::new();
    for &n in sizes {
        let clock = std::time::Instant::now();
        let results = battery(n, make(n));
        println!(
            "{name:>14}  n={n:<8} ({:.1} s)",
            clock.elapsed().as_secs_f64()
        );
        for (test, p) in results {
            println!("{name:>14}  n={n:<8} {test:<32} p={p:.4}");
            all.push(p);
        }
    }
    if orders {
        for n in 2..=6 {
            let clock = std::time::Instant::now();
            let p = every_order(n, make(n));
            println!(
                "{name:>14}  n={n:<8} ({:.1} s)",
                clock.elapsed().as_secs_f64()
            );
            println!(
                "{name:>14}  n={n:<8} {:<32} p={p:.4}",
                format!("all {n}! orders")
            );
            all.push(p);
        }
    }
    all.iter().copied().fold(1.0, f64::min)
}

/// Tests per full run: seven per size and one per order size (2 to 6).
const TESTS: usize = 7 * SIZES.len() + 5;
/// The controls' sizes: enough to calibrate the battery (and to fail the affine maps).
const CONTROL_SIZES: [u64; 4] = [5, 64, 1000, 65_536];

#[test]
#[ignore = "slow: run in release with --ignored (about a minute)"]
fn global_order_passes_the_battery_and_the_battery_can_fail() {
    let threshold = LEVEL / TESTS as f64;
    println!("Bonferroni threshold {threshold:.2e} ({TESTS} tests per generator)");
    let global_min = run("global", &|n| Box::new(global(n)), &SIZES, true);
    // The Feistel network alone where the table serves the product (n <= 1024): printed for
    // the record at 64, held to the level at 1000.
    run("feistel only", &|n| Box::new(feistel_only(n)), &[64], false);
    let feistel_min = run(
        "feistel only",
        &|n| Box::new(feistel_only(n)),
        &[1000],
        false,
    );
    let reference_min = run(
        "reference",
        &|n| Box::new(reference(n)),
        &CONTROL_SIZES,
        true,
    );
    let affine_min = run("affine", &|n| Box::new(affine(n)), &CONTROL_SIZES, false);
    assert!(
        global_min > threshold,
        "global order fails: min p {global_min}"
    );
    assert!(
        feistel_min > threshold,
        "Feistel (no table) fails: min p {feistel_min}"
    );
    assert!(
        reference_min > threshold,
        "reference fails: min p {reference_min}"
    );
    assert!(
        affine_min < threshold,
        "the battery does not tell an affine map apart"
    );
}

//! The balanced interleave of a mixture phase: every prefix holds each dataset within one
//! sample of its share (`interleave="balanced"`).
//!
//! # Algorithm
//!
//! A phase of `m` positions holds dataset `d` exactly `C_d` times; its share of the first `t`
//! positions is `p_d t` with `p_d = C_d / m`. The sequence keeps `⌊p_d t⌋ <= c_d(t) <=
//! ⌈p_d t⌉` for every `t` and `d` (the "quota" property of apportionment), so
//! `|c_d(t) - p_d t| < 1`. This is Tijdeman's chairman assignment problem ("The chairman
//! assignment problem", Discrete Mathematics 32, 1980): the `j`-th occurrence of `d`
//! (1-based) may not come before position `⌊(j - 1) / p_d⌋ + 1` (else `c_d` would pass
//! `⌈p_d t⌉`) and must come by position `⌈j / p_d⌉` (else it would fall below `⌊p_d t⌋`).
//! These windows satisfy Hall's condition on every interval (at most `p_d (z - a + 1)` of
//! `d`'s windows fit in `[a, z]`, and the `p_d` sum to 1), so earliest-deadline-first, which
//! is optimal for unit jobs with integer release times and deadlines on one machine, meets
//! every deadline. Ties go to the lower dataset. All arithmetic is on integers (`u128`).
//!
//! Megatron's blended datasets choose, at each position, the dataset whose count lags its
//! share the most; that greedy can exceed one sample (1.3 in a test of random weights),
//! which the deadlines here cannot.
//!
//! # Cost
//!
//! The sequence is sequential: position `t` depends on the counts at `t - 1`, `O(log D)`
//! per position with two heaps. The counts at every leaf boundary (`mix::interleave`'s leaf
//! size) are kept once computed, so a leaf is read by replaying it from its boundary, and an
//! epoch of many positions costs one sequential pass to reach its end. The sequence has no
//! randomness: it is the same every epoch (as Megatron's is), only the passes change.

use crate::cancel::cancelled;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

/// The balanced sequence of one phase and the counts at its leaf boundaries found so far.
#[derive(Debug)]
pub(crate) struct Balanced {
    /// `C_d` per dataset.
    counts: Vec<u64>,
    /// Positions of the phase (`Σ C_d`).
    m: u64,
    /// Positions per leaf.
    leaf: u64,
    /// The counts after `l * leaf` positions, for `l` from 0 on.
    boundaries: Mutex<Vec<Vec<u64>>>,
}

impl Clone for Balanced {
    fn clone(&self) -> Self {
        let boundaries = self
            .boundaries
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        Balanced {
            counts: self.counts.clone(),
            m: self.m,
            leaf: self.leaf,
            boundaries: Mutex::new(boundaries),
        }
    }
}

/// Earliest-deadline-first over the datasets' next occurrences, from given counts.
struct Edf {
    counts: Vec<u64>,
    /// Per dataset, `c m = q C + r` for its count `c` and total `C` (`0 <= r < C`), kept
    /// by addition: the next occurrence's release is `q + 1` and its deadline `⌈(c + 1) m /
    /// C⌉`, with no division per step.
    q: Vec<u64>,
    r: Vec<u64>,
    /// Per dataset, `m = step_q C + step_r`.
    step_q: Vec<u64>,
    step_r: Vec<u64>,
    totals: Vec<u64>,
    /// Released occurrences: `(deadline, dataset)`.
    ready: BinaryHeap<Reverse<(u64, u32)>>,
    /// Occurrences not yet released: `(release, dataset)`.
    waiting: BinaryHeap<Reverse<(u64, u32)>>,
    /// Positions done (the next position is `t + 1`, 1-based).
    t: u64,
}

impl Edf {
    fn new(totals: &[u64], m: u64, counts: Vec<u64>, t: u64) -> Self {
        let d = totals.len();
        let (mut q, mut r) = (vec![0; d], vec![0; d]);
        let (mut step_q, mut step_r) = (vec![0; d], vec![0; d]);
        for i in 0..d {
            let total = totals[i];
            if total == 0 {
                continue;
            }
            let cm = u128::from(counts[i]) * u128::from(m);
            q[i] = (cm / u128::from(total)) as u64;
            r[i] = (cm % u128::from(total)) as u64;
            (step_q[i], step_r[i]) = (m / total, m % total);
        }
        let mut edf = Edf {
            counts,
            q,
            r,
            step_q,
            step_r,
            totals: totals.to_vec(),
            ready: BinaryHeap::with_capacity(d),
            waiting: BinaryHeap::with_capacity(d),
            t,
        };
        for i in 0..d {
            edf.queue(i as u32);
        }
        edf
    }

    /// The deadline of dataset `d`'s next occurrence: `⌈(c + 1) m / C⌉`.
    #[inline]
    fn deadline(&self, d: usize) -> u64 {
        deadline_of(
            self.q[d],
            self.r[d],
            self.step_q[d],
            self.step_r[d],
            self.totals[d],
        )
    }

    /// Queues dataset `d`'s next occurrence, if it has one.
    #[inline]
    fn queue(&mut self, d: u32) {
        let i = d as usize;
        if self.counts[i] >= self.totals[i] {
            return;
        }
        let release = self.q[i] + 1;
        if release <= self.t + 1 {
            let deadline = self.deadline(i);
            self.ready.push(Reverse((deadline, d)));
        } else {
            self.waiting.push(Reverse((release, d)));
        }
    }

    /// The dataset of the next position.
    #[inline]
    fn step(&mut self) -> u32 {
        let t = self.t + 1;
        while let Some(&Reverse((release, d))) = self.waiting.peek() {
            if release > t {
                break;
            }
            self.waiting.pop();
            let deadline = self.deadline(d as usize);
            self.ready.push(Reverse((deadline, d)));
        }
        let mut top = self
            .ready
            .peek_mut()
            .expect("the quota windows always leave an occurrence released");
        let Reverse((deadline, d)) = *top;
        debug_assert!(deadline >= t, "a deadline was missed");
        let i = d as usize;
        self.counts[i] += 1;
        self.q[i] += self.step_q[i];
        self.r[i] += self.step_r[i];
        if self.r[i] >= self.totals[i] {
            self.q[i] += 1;
            self.r[i] -= self.totals[i];
        }
        self.t = t;
        // The dataset's next occurrence replaces it at the top when already released (one
        // sift instead of a pop and a push): the common case.
        if self.counts[i] < self.totals[i] && self.q[i] <= t {
            let (q, r) = (self.q[i], self.r[i]);
            *top = Reverse((
                deadline_of(q, r, self.step_q[i], self.step_r[i], self.totals[i]),
                d,
            ));
            return d;
        }
        std::collections::binary_heap::PeekMut::pop(top);
        self.queue(d);
        d
    }
}

/// `⌈(c + 1) m / C⌉` from `c m = q C + r` and `m = step_q C + step_r`.
#[inline]
fn deadline_of(q: u64, r: u64, step_q: u64, step_r: u64, total: u64) -> u64 {
    let (q, r) = (q + step_q, r + step_r);
    if r >= total {
        q + 1 + u64::from(r > total)
    } else {
        q + u64::from(r > 0)
    }
}

impl Balanced {
    /// The balanced sequence of a phase holding dataset `d` `counts[d]` times, read in
    /// leaves of `leaf` positions.
    pub(crate) fn new(counts: &[u64], leaf: u64) -> Self {
        Balanced {
            counts: counts.to_vec(),
            m: counts.iter().sum(),
            leaf,
            boundaries: Mutex::new(vec![vec![0; counts.len()]]),
        }
    }

    /// Positions per leaf.
    pub(crate) fn leaf(&self) -> u64 {
        self.leaf
    }

    /// The counts before leaf `l` (after `l * leaf` positions), replaying the leaves not
    /// reached before.
    ///
    /// The replay looks at the cancellation flag before each leaf (a leaf is a few
    /// milliseconds of it): once raised, it stops, keeps only the boundaries it completed,
    /// and returns the last of them (a meaningless answer, which the cancelled caller
    /// discards).
    pub(crate) fn before_leaf(&self, l: u64) -> Vec<u64> {
        let mut known = self
            .boundaries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while (known.len() as u64) <= l {
            if cancelled() {
                return known.last().expect("boundary 0").clone();
            }
            let at = known.len() as u64 - 1;
            let start = known.last().expect("boundary 0").clone();
            let mut edf = Edf::new(&self.counts, self.m, start, at * self.leaf);
            let steps = self.leaf.min(self.m - at * self.leaf);
            for _ in 0..steps {
                edf.step();
            }
            known.push(edf.counts);
        }
        known[l as usize].clone()
    }

    /// Leaf `l`'s datasets, one per position, and for each position how many earlier
    /// positions of the phase drew the same dataset.
    pub(crate) fn leaf_sequence(&self, l: u64) -> (Vec<u32>, Vec<u64>) {
        let before = self.before_leaf(l);
        let lo = l * self.leaf;
        let len = self.leaf.min(self.m - lo) as usize;
        if cancelled() {
            // The replay stopped short: a sequence of the right length that the cancelled
            // caller discards (the first dataset's first occurrence throughout).
            return (vec![0; len], vec![0; len]);
        }
        let mut edf = Edf::new(&self.counts, self.m, before, lo);
        let (mut ds, mut occ) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for _ in 0..len {
            let d = edf.step();
            ds.push(d);
            occ.push(edf.counts[d as usize] - 1);
        }
        // The counts after this leaf are the next leaf's start: kept when not known yet, so a
        // read of the leaves in order replays each once (it replayed each twice).
        let mut known = self
            .boundaries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() as u64 == l + 1 {
            known.push(edf.counts);
        }
        (ds, occ)
    }

    /// How many of the phase's first `q` positions each dataset takes, added to `into`.
    pub(crate) fn prefix(&self, q: u64, into: &mut [u64]) {
        let l = q / self.leaf;
        let before = self.before_leaf(l.min(self.m.div_ceil(self.leaf)));
        if cancelled() {
            return; // the replay stopped short; the cancelled caller discards the counts
        }
        let mut edf = Edf::new(&self.counts, self.m, before, l * self.leaf);
        for _ in l * self.leaf..q {
            edf.step();
        }
        into.iter_mut().zip(&edf.counts).for_each(|(a, c)| *a += c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole sequence, leaf by leaf.
    fn sequence(b: &Balanced) -> Vec<u32> {
        let leaves = b.m.div_ceil(b.leaf);
        (0..leaves).flat_map(|l| b.leaf_sequence(l).0).collect()
    }

    #[test]
    fn every_prefix_is_within_one_of_its_share() {
        let cases: [&[u64]; 5] = [
            &[1, 1],
            &[700, 200, 99, 1],
            &[3, 5, 7, 11, 13, 17, 19, 23],
            &[1, 0, 999, 0],
            &[10_000],
        ];
        for counts in cases {
            let b = Balanced::new(counts, 64);
            let seq = sequence(&b);
            let m = b.m;
            assert_eq!(seq.len() as u64, m);
            let mut c = vec![0u64; counts.len()];
            for (t, &d) in seq.iter().enumerate() {
                c[d as usize] += 1;
                let t = t as u64 + 1;
                for (d, (&cd, &total)) in c.iter().zip(counts).enumerate() {
                    // floor(p t) <= c <= ceil(p t), in integers: c m in [p t m - m, p t m + m).
                    let (lo, hi) = (
                        u128::from(total * t) / u128::from(m),
                        u128::from(total * t).div_ceil(u128::from(m)),
                    );
                    assert!(
                        (lo..=hi).contains(&u128::from(cd)),
                        "{counts:?}: dataset {d} has {cd} after {t}"
                    );
                }
            }
            assert_eq!(c, counts);
        }
    }

    #[test]
    fn leaves_prefixes_and_occurrences_agree_with_one_pass() {
        let counts = [300u64, 41, 7, 652];
        let one = Balanced::new(&counts, 1 << 20);
        let whole = one.leaf_sequence(0);
        let leafed = Balanced::new(&counts, 37);
        assert_eq!(sequence(&leafed), whole.0);
        for q in [0u64, 1, 36, 37, 500, 1000] {
            let mut got = vec![0u64; 4];
            leafed.prefix(q, &mut got);
            let mut want = vec![0u64; 4];
            for &d in &whole.0[..q as usize] {
                want[d as usize] += 1;
            }
            assert_eq!(got, want, "prefix {q}");
        }
        let (ds, occ) = leafed.leaf_sequence(5);
        for (i, (&d, &o)) in ds.iter().zip(&occ).enumerate() {
            let t = 5 * 37 + i;
            assert_eq!(o as usize, whole.0[..t].iter().filter(|&&x| x == d).count());
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// `cargo test --release -p croupier-core --lib balanced_timing -- --ignored --nocapture`:
    /// the sequence of a phase of 1e7 positions over 100 datasets weighted 1 to 100, in ns a
    /// position (the bench's mixture).
    #[test]
    #[ignore]
    fn balanced_timing() {
        let total: u64 = (1..=100).sum();
        let m = 10_000_000u64;
        let mut counts: Vec<u64> = (1..=100).map(|w| m * w / total).collect();
        let short = m - counts.iter().sum::<u64>();
        counts[99] += short;
        let b = Balanced::new(&counts, 1 << 20);
        let t = std::time::Instant::now();
        let mut check = 0u64;
        for l in 0..m.div_ceil(1 << 20) {
            let (ds, _) = b.leaf_sequence(l);
            check = check.wrapping_add(ds.iter().map(|&d| u64::from(d)).sum::<u64>());
        }
        let s = t.elapsed().as_secs_f64();
        println!("{:.1} ns a position (check {check})", s / m as f64 * 1e9);
    }
}

//! Which dataset each position of a mixture phase draws from: a uniform random sequence with
//! exact counts (a uniform permutation of the multiset `{d × c_d}`), readable at any position.
//!
//! # Algorithm
//!
//! The phase's `m` positions are cut into leaves of `B` positions ([`Interleave::leaf`]:
//! `2**16`, or `16 D` rounded up to a power of two for `D` datasets, so that the tree costs at
//! most about one draw per 8 positions); a binary tree over the leaves halves a leaf range
//! `[a, b)` at `a + (b - a) / 2`. A node knows how many of its positions each dataset takes;
//! its left child's counts are a multivariate hypergeometric draw (the left child's size out
//! of the node's multiset), drawn dataset by dataset as univariate hypergeometrics
//! ([`crate::draw::hypergeom`], exact and platform-independent) from the generator of the node
//! `CellRng(base, a, b)`; the right child gets the rest. A leaf's multiset is written out in
//! dataset order and shuffled by Fisher–Yates (xoshiro256++ keyed by the leaf's number).
//!
//! How many of each value fall in a block of a uniform multiset permutation is exactly this
//! hypergeometric split, and given its counts a block's order is uniform, so the whole is a
//! uniform permutation of the multiset. A position is read from its root-to-leaf path
//! (`O(D log(m/B))` draws and one leaf shuffle); the counts before it come from the same walk,
//! which is what a resume needs. The keys fold in the rank, the phase's start and its nominal
//! length, so every rank interleaves independently and a phase cut short by a later schedule
//! keeps its order up to the cut.

use crate::cancel::cancelled;
use crate::draw::cell_rng::CellRng;
use crate::draw::hypergeom::hypergeometric;
use crate::draw::keyed::keyed_xoshiro;
use crate::draw::random_access::RandomAccessPermutation;
use crate::shuffle::parallel::fisher_yates_fast;
use crate::stream::{fold, Purpose, Stream};

/// Positions per leaf of a phase over `datasets` datasets: `2**16`, or `16 D` rounded up to a
/// power of two, so that the tree costs at most about one draw per 8 positions.
pub(crate) fn leaf_size(datasets: usize) -> u64 {
    (16 * datasets as u64).next_power_of_two().max(1 << 16)
}

/// Positions per leaf of a phase of the global order over `datasets` datasets: `2**20`, or
/// `16 D` rounded up to a power of two. Larger than [`leaf_size`]: every rank walks the whole
/// phase's tree (its positions are strided over all of it), so fewer, larger leaves keep the
/// tree's hypergeometric draws (the costly step, `docs/performance.md`) to about one per
/// 10,000 positions; a leaf
/// is read by random access, so its size costs nothing else.
pub(crate) fn global_leaf_size(datasets: usize) -> u64 {
    // The unit tests' phases are far smaller than a leaf: there, 2**12 makes them many leaves.
    let least = if cfg!(test) { 1 << 12 } else { 1 << 20 };
    (16 * datasets as u64).next_power_of_two().max(least)
}

/// A dataset's count in a node: `(dataset, count)`, only nonzero counts, by dataset.
pub(crate) type Counts = Vec<(u32, u64)>;

/// The interleave of one phase on one rank.
#[derive(Debug, Clone)]
pub(crate) struct Interleave {
    /// Positions of the phase (its nominal length).
    m: u64,
    /// Positions per leaf.
    leaf: u64,
    /// The phase's counts over all `m` positions.
    counts: Counts,
    seed: u64,
    epoch: u64,
    key: u64,
    base: u64,
}

impl Interleave {
    /// The interleave of a phase of `m` positions holding dataset `d` `counts[d]` times
    /// (`Σ counts = m`), keyed by the rank and the phase's start.
    pub(crate) fn new(counts: &[u64], (seed, epoch): (u64, u64), rank: u64, start: u64) -> Self {
        let m: u64 = counts.iter().sum();
        let key = fold(fold(fold(0, rank), start), m);
        Self::keyed(
            counts,
            (seed, epoch),
            (Purpose::MixInterleave, key),
            leaf_size,
        )
    }

    /// The interleave of a phase of the world-size-invariant order (`mix::global`), starting
    /// at global position `start`: one for every rank, its leaves read by random access
    /// ([`Interleave::leaf_perm`]).
    pub(crate) fn global(counts: &[u64], (seed, epoch): (u64, u64), start: u64) -> Self {
        let m: u64 = counts.iter().sum();
        let key = fold(fold(0, start), m);
        let purpose = Purpose::GlobalMixInterleave;
        Self::keyed(counts, (seed, epoch), (purpose, key), global_leaf_size)
    }

    fn keyed(
        counts: &[u64],
        (seed, epoch): (u64, u64),
        (purpose, key): (Purpose, u64),
        leaf_size: fn(usize) -> u64,
    ) -> Self {
        let m: u64 = counts.iter().sum();
        let sparse: Counts = counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(d, &c)| (d as u32, c))
            .collect();
        let leaf = leaf_size(sparse.len());
        let base = Stream::new(seed, epoch, purpose, key).next_u64();
        Interleave {
            m,
            leaf,
            counts: sparse,
            seed,
            epoch,
            key,
            base,
        }
    }

    /// The order of leaf `l` of a [`Interleave::global`] phase, read at any position: a keyed
    /// permutation of the leaf's positions onto its multiset laid out in dataset order.
    pub(crate) fn leaf_perm(&self, l: u64) -> RandomAccessPermutation {
        let (lo, hi) = self.leaf_range(l);
        let stream = Stream::new(
            self.seed,
            self.epoch,
            Purpose::GlobalMixLeaf,
            fold(self.key, l),
        );
        RandomAccessPermutation::from_stream(hi - lo, stream)
    }

    /// Positions per leaf.
    pub(crate) fn leaf(&self) -> u64 {
        self.leaf
    }

    /// Number of leaves.
    pub(crate) fn leaves(&self) -> u64 {
        self.m.div_ceil(self.leaf)
    }

    /// Positions `[lo, hi)` of leaf `l`.
    pub(crate) fn leaf_range(&self, l: u64) -> (u64, u64) {
        (l * self.leaf, ((l + 1) * self.leaf).min(self.m))
    }

    /// The counts of node `[a, b)`'s left child, given the node's.
    fn split_left(&self, a: u64, b: u64, node: &Counts) -> (Counts, Counts) {
        let mid = a + (b - a) / 2;
        let lo = a * self.leaf;
        let hi = (b * self.leaf).min(self.m);
        let mut pop = hi - lo;
        let mut draws = (mid - a) * self.leaf;
        let mut rng = CellRng::for_cell(self.base, a, b, 0, 0);
        let (mut left, mut right) = (Counts::new(), Counts::new());
        // A node of many datasets takes a while (a draw per dataset): once the call is
        // cancelled the rest is split greedily, still a valid split (so nothing downstream
        // trips over it), and the caller discards the result.
        let mut stopped = false;
        for (k, &(d, c)) in node.iter().enumerate() {
            if k % 1024 == 1023 && !stopped {
                stopped = cancelled();
            }
            let x = if draws == 0 {
                0
            } else if draws == pop {
                c
            } else if stopped {
                c.min(draws)
            } else {
                hypergeometric(&mut rng, pop, c, draws)
            };
            pop -= c;
            draws -= x;
            if x > 0 {
                left.push((d, x));
            }
            if c > x {
                right.push((d, c - x));
            }
        }
        (left, right)
    }

    /// The counts of every leaf in `[l0, l1)`, and the counts of all positions before leaf
    /// `l0` (added to `before`, indexed by dataset).
    pub(crate) fn leaf_counts(&self, (l0, l1): (u64, u64), before: &mut [u64]) -> Vec<Counts> {
        let mut out = Vec::with_capacity((l1 - l0) as usize);
        if l0 < l1 {
            self.walk(
                (0, self.leaves()),
                self.counts.clone(),
                (l0, l1),
                before,
                &mut out,
            );
        }
        out
    }

    fn walk(
        &self,
        (a, b): (u64, u64),
        node: Counts,
        (l0, l1): (u64, u64),
        before: &mut [u64],
        out: &mut Vec<Counts>,
    ) {
        if b <= l0 {
            for (d, c) in node {
                before[d as usize] += c;
            }
            return;
        }
        if a >= l1 {
            return;
        }
        if b - a == 1 {
            out.push(node);
            return;
        }
        let mid = a + (b - a) / 2;
        let (left, right) = self.split_left(a, b, &node);
        drop(node);
        self.walk((a, mid), left, (l0, l1), before, out);
        self.walk((mid, b), right, (l0, l1), before, out);
    }

    /// The leaves `[l0, l1)` one after another, each with its counts and the counts of all
    /// positions before it (by dataset, `datasets` of them): what [`Interleave::leaf_counts`]
    /// gives, the same draws, but holding only the walk's pending nodes (one per tree level)
    /// instead of every leaf of the range.
    pub(crate) fn leaf_walk(&self, (l0, l1): (u64, u64), datasets: usize) -> LeafWalk<'_> {
        let stack = if l0 < l1 {
            vec![((0, self.leaves()), self.counts.clone())]
        } else {
            Vec::new()
        };
        LeafWalk {
            il: self,
            stack,
            range: (l0, l1),
            before: vec![0; datasets],
        }
    }

    /// Leaf `l`'s sequence, as indices into its `counts` (which must be the leaf's).
    pub(crate) fn leaf_order(&self, l: u64, counts: &Counts) -> Vec<u32> {
        let (lo, hi) = self.leaf_range(l);
        let mut ids = Vec::with_capacity((hi - lo) as usize);
        for (e, &(_, c)) in counts.iter().enumerate() {
            ids.extend(std::iter::repeat_n(e as u32, c as usize));
        }
        debug_assert_eq!(ids.len() as u64, hi - lo);
        let mut rng = keyed_xoshiro(
            self.seed,
            self.epoch,
            Purpose::MixInterleave,
            fold(self.key, (1 << 63) | l),
        );
        fisher_yates_fast(&mut ids, &mut rng, false);
        ids
    }

    /// How many of the positions `[0, q)` each dataset takes, added to `into` (by dataset).
    pub(crate) fn prefix(&self, q: u64, into: &mut [u64]) {
        let q = q.min(self.m);
        if q == self.m {
            for &(d, c) in &self.counts {
                into[d as usize] += c;
            }
            return;
        }
        let l = q / self.leaf;
        let leaf = self.leaf_counts((l, l + 1), into).pop().expect("one leaf");
        let (lo, _) = self.leaf_range(l);
        for e in &self.leaf_order(l, &leaf)[..(q - lo) as usize] {
            into[leaf[*e as usize].0 as usize] += 1;
        }
    }
}

/// The leaves of a range of an [`Interleave`], in order (see [`Interleave::leaf_walk`]).
pub(crate) struct LeafWalk<'a> {
    il: &'a Interleave,
    /// Nodes still to visit, the next on top: `((a, b), counts)`.
    stack: Vec<((u64, u64), Counts)>,
    range: (u64, u64),
    before: Vec<u64>,
}

impl Iterator for LeafWalk<'_> {
    /// `(leaf, its counts, the counts before it)`.
    type Item = (u64, Counts, Vec<u64>);

    fn next(&mut self) -> Option<Self::Item> {
        let (l0, l1) = self.range;
        while let Some(((a, b), node)) = self.stack.pop() {
            if b <= l0 {
                for (d, c) in node {
                    self.before[d as usize] += c;
                }
                continue;
            }
            if a >= l1 {
                continue;
            }
            if b - a == 1 {
                let before = self.before.clone();
                for &(d, c) in &node {
                    self.before[d as usize] += c;
                }
                return Some((a, node, before));
            }
            let mid = a + (b - a) / 2;
            let (left, right) = self.il.split_left(a, b, &node);
            self.stack.push(((mid, b), right));
            self.stack.push(((a, mid), left));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(il: &Interleave) -> Vec<u32> {
        let mut before = vec![0; 8];
        let leaves = il.leaf_counts((0, il.leaves()), &mut before);
        let mut out = Vec::new();
        for (l, counts) in leaves.iter().enumerate() {
            out.extend(
                il.leaf_order(l as u64, counts)
                    .iter()
                    .map(|&e| counts[e as usize].0),
            );
        }
        out
    }

    #[test]
    fn counts_are_exact_and_prefixes_agree() {
        let counts = [70_000u64, 0, 3, 131_072, 1];
        let il = Interleave::new(&counts, (1, 2), 0, 0);
        assert_eq!(il.leaves(), 4);
        let seq = sequence(&il);
        for (d, &c) in counts.iter().enumerate() {
            assert_eq!(seq.iter().filter(|&&x| x as usize == d).count() as u64, c);
        }
        for q in [0u64, 1, 65_535, 65_536, 100_000, 201_075, 201_076] {
            let mut got = vec![0u64; 5];
            il.prefix(q, &mut got);
            let mut want = vec![0u64; 5];
            for &x in &seq[..q as usize] {
                want[x as usize] += 1;
            }
            assert_eq!(got, want, "prefix {q}");
        }
    }

    #[test]
    fn the_leaf_walk_gives_what_leaf_counts_gives() {
        let counts = [70_000u64, 0, 3, 131_072, 1];
        let il = Interleave::new(&counts, (1, 2), 0, 0);
        for (l0, l1) in [(0u64, 4u64), (1, 3), (2, 2), (3, 4)] {
            let mut before = vec![0u64; 5];
            let leaves = il.leaf_counts((l0, l1), &mut before);
            let walked: Vec<_> = il.leaf_walk((l0, l1), 5).collect();
            assert_eq!(walked.len(), leaves.len());
            for (k, (l, c, b)) in walked.into_iter().enumerate() {
                assert_eq!((l, &c, &b), (l0 + k as u64, &leaves[k], &before));
                c.iter().for_each(|&(d, x)| before[d as usize] += x);
            }
        }
    }

    #[test]
    fn keys_separate_ranks_epochs_and_phases() {
        let counts = [40_000u64, 40_000];
        let s = sequence(&Interleave::new(&counts, (1, 2), 0, 0));
        assert_ne!(s, sequence(&Interleave::new(&counts, (1, 2), 1, 0)));
        assert_ne!(s, sequence(&Interleave::new(&counts, (1, 3), 0, 0)));
        assert_ne!(s, sequence(&Interleave::new(&counts, (1, 2), 0, 5)));
        assert_eq!(s, sequence(&Interleave::new(&counts, (1, 2), 0, 0)));
    }
}

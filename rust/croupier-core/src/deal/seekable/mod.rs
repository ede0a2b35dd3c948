//! The order inside a rank's long blocks: a bucket shuffle whose buckets have fixed sizes, so
//! that any output position can be read with `O(log m)` draws and no pass over the block.
//!
//! # Algorithm
//!
//! A node holds `m` items in an input order (the root: a block's values, increasing). Unless it
//! is a leaf, it is cut into [`FANOUT`] buckets of fixed sizes: bucket `g` is output positions
//! `[g*m/64, (g+1)*m/64)`. Which items fill which bucket is a uniform random partition of the
//! items into sets of those sizes, drawn the way [`crate::deal::class_split`] draws a partition:
//!
//! - The items are cut into stripes of [`STRIPE`] (2**14). Two binary trees organise the
//!   draws: one over the stripes (halved at the middle stripe), one over the buckets (halved
//!   at the middle bucket). Write `t(G, V)` for how many items of stripe range `V` go to
//!   bucket range `G`; at the root `t(G, all)` is `G`'s size and `t(all, V) = |V|`.
//! - For a stripe range `V` with halves `Vl, Vr` and a bucket range `G` with halves `Gl, Gr`,
//!   `t(Gl, Vl) ~ Hyp(population t(G, V), marked t(Gl, V), drawn t(G, Vl))`, drawn from the
//!   generator of cell `(V, G)` ([`crate::draw::cell_rng`]); the other three counts follow by
//!   subtraction. A forced outcome is not drawn.
//! - A stripe, once it knows how many of its items each bucket takes, is shuffled by
//!   Fisher–Yates (its own generator); bucket 0 takes the first items, bucket 1 the next, and
//!   so on. Inside a bucket the stripes' items follow each other in stripe order.
//!
//! Every bucket is a node one level down (6 bits of path a level, as in
//! [`crate::shuffle::parallel`]). A node of at most `leaf` items ([`LEAF`], 2**21) is a leaf,
//! shuffled by Fisher–Yates: in place at depth 1, and by the inside-out variant from the
//! scatter buffer back into place deeper down. The root always splits.
//!
//! The counts of a uniform partition into fixed-size sets are exactly these hypergeometric
//! splits, a stripe's items dealt in a uniform random order go to uniform random subsets of the
//! sizes drawn, and every leaf is ordered uniformly, so the output is a uniform random
//! permutation of the input, exactly.
//!
//! # Reading a position
//!
//! Bucket sizes are arithmetic, so output position `q` names its bucket and its position in
//! the bucket at once, down to a leaf; the leaf's Fisher–Yates (at most `leaf` items) says
//! which item of the bucket's sequence lands there. That item's stripe is found by walking
//! down the stripe tree drawing only the cells of the bucket's own path of the bucket tree
//! (6 draws a level), and the stripe's Fisher–Yates (at most 2**14 items) names the input.
//! Reading `k` positions costs a Fisher–Yates of each leaf they fall in (at most `leaf`
//! items) and, per level of buckets, up to `k` stripe shuffles (at most 2**14 items each) and
//! `O(k log m)` draws, whatever `m`: this is what makes a resume in the middle of a long block
//! cheap ([`crate::deal::fast_share`]).
//!
//! The labelled bucket shuffle of [`crate::shuffle::parallel`] (independent labels, random bucket
//! sizes) is faster in bulk, but finding a position there first counts every label of the
//! node. A rank's share is bound by its partition walk, so the blocks take the seekable one.
//!
//! # Generators
//!
//! Stripes and leaves draw from xoshiro256++ keyed by the ChaCha8 stream
//! `(seed, epoch, ShareBuckets, fold(salt, id))` (the keyed generators of
//! [`crate::shuffle::parallel`], under another purpose and a salt), with `id` =
//! the kind (top four bits) and the node's depth and path, the stripe number folded in for a
//! stripe; cells draw from [`CellRng`] keyed by the node's base and the cell's coordinates.
//! Nothing depends on the number of threads.

use crate::cancel::cancelled;
use crate::draw::cell_rng::CellRng;
use crate::draw::hypergeom::hypergeometric;
use crate::draw::keyed::keyed_xoshiro;
use crate::index::Index;
use crate::shuffle::parallel::{
    child_path, fisher_yates_fast, inside_out_fast, PATH_BITS, PREFETCH_FROM,
};
use crate::stream::{fold, Purpose, Stream};
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod stream;
pub(crate) use stream::{Dealer, Plan};

/// Buckets per node.
pub(crate) const FANOUT: usize = 64;
/// Depth of the bucket tree over [`FANOUT`] buckets.
const LEVELS: usize = FANOUT.trailing_zeros() as usize;
/// Items per stripe: the unit of dealing in bulk and the largest Fisher–Yates a read needs
/// besides the leaf. A split of a stripe range costs up to 63 hypergeometric draws, so shorter
/// stripes would cost more per item in bulk.
pub(crate) const STRIPE: u64 = 1 << 14;
/// Nodes of at most this many items are leaves (8 MiB of `u32`, in the last-level cache).
pub(crate) const LEAF: u64 = 1 << 21;
/// Stripe ranges wider than this split their table's work across threads.
const PAR_STRIPES: u64 = 64;

// Generator kinds (top four bits of an id).
const CELLS: u64 = 1 << 60;
const STRIPE_ORDER: u64 = 2 << 60;
const LEAF_ORDER: u64 = 3 << 60;

/// Stripe and leaf sizes (tests use small ones to reach deep trees with few items).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Items per stripe, at least 1 and below 2**32.
    pub(crate) stripe: u64,
    /// Nodes below the root of at most this many items are leaves; at least 1 and below
    /// 2**32.
    pub(crate) leaf: u64,
}

impl Shape {
    /// The shape of a rank's long blocks.
    pub(crate) const BLOCKS: Shape = Shape {
        stripe: STRIPE,
        leaf: LEAF,
    };
}

/// The generators and shape of one seekable shuffle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seekable {
    seed: u64,
    epoch: u64,
    salt: u64,
    cells: u64,
    shape: Shape,
}

/// A node of the bucket tree: its item count and its place.
#[derive(Clone, Copy, Debug)]
struct Node {
    m: u64,
    depth: u64,
    path: u64,
}

impl Node {
    fn id(&self) -> u64 {
        self.depth.min(15) << PATH_BITS | self.path
    }

    fn child(&self, g: usize) -> Node {
        Node {
            m: bucket_start(self.m, g + 1) - bucket_start(self.m, g),
            depth: self.depth + 1,
            path: child_path(self.depth, self.path, g as u64),
        }
    }
}

/// Where bucket `g` of a node of `m` items starts (`g <= FANOUT`).
fn bucket_start(m: u64, g: usize) -> u64 {
    (u128::from(m) * g as u128 / FANOUT as u128) as u64
}

/// The bucket holding position `q < m`.
fn bucket_of(m: u64, q: u64) -> usize {
    let mut g = ((u128::from(q) * FANOUT as u128) / u128::from(m)) as usize;
    while g + 1 < FANOUT && bucket_start(m, g + 1) <= q {
        g += 1;
    }
    while bucket_start(m, g) > q {
        g -= 1;
    }
    g
}

/// `t(Gl, Vl)` for cell `(V, G)` = `(s0, s1) x (g0, g1)`, given `t(G, V)`, `t(Gl, V)` and
/// `t(G, Vl)`. A forced outcome draws nothing ([`hypergeometric`] returns it first).
fn cell(
    base: u64,
    (s0, s1): (u64, u64),
    (g0, g1): (usize, usize),
    tg: u64,
    tgl: u64,
    tvl: u64,
) -> u64 {
    let mut rng = CellRng::for_cell(base, s0, s1, g0 as u64, g1 as u64);
    hypergeometric(&mut rng, tg, tgl, tvl)
}

/// Where the buckets of a node's output are written: position `bucket_start(g) + i` at
/// `self.0[g] + i`, nowhere when `self.0[g]` is null.
struct Targets<T>([*mut T; FANOUT]);
// SAFETY: the pointers are into buffers borrowed exclusively for as long as the writers live
// (a node's scatter, or a `Dealer` carrying the borrows' lifetime), and every stripe writes
// its own positions of them.
unsafe impl<T: Send> Send for Targets<T> {}
unsafe impl<T: Send> Sync for Targets<T> {}

impl<T> Targets<T> {
    /// Every bucket of a node of `m` items in place in `out`.
    fn contiguous(m: u64, out: *mut T) -> Self {
        // wrapping_add: no pointer beyond `out`'s buffer is formed, the positions are < m.
        Targets(std::array::from_fn(|g| {
            out.wrapping_add(bucket_start(m, g) as usize)
        }))
    }
}

/// Per stripe of a node, where its items of each bucket go (node-relative), plus a last row
/// with the bucket ends: stripe `s` deals `rows[s+1][g] - rows[s][g]` items to bucket `g`.
struct Table {
    rows: Vec<[u64; FANOUT]>,
}

impl Seekable {
    /// The shuffle keyed by `(seed, epoch, salt)`, of the given shape.
    pub(crate) fn new(seed: u64, epoch: u64, salt: u64, shape: Shape) -> Self {
        assert!(
            shape.stripe >= 1 && shape.stripe < 1 << 32,
            "stripe in [1, 2**32)"
        );
        assert!(
            shape.leaf >= 1 && shape.leaf < 1 << 32,
            "leaf in [1, 2**32)"
        );
        let cells = Stream::new(seed, epoch, Purpose::ShareBuckets, fold(salt, CELLS)).next_u64();
        Seekable {
            seed,
            epoch,
            salt,
            cells,
            shape,
        }
    }

    fn rng(&self, id: u64) -> Xoshiro256PlusPlus {
        keyed_xoshiro(
            self.seed,
            self.epoch,
            Purpose::ShareBuckets,
            fold(self.salt, id),
        )
    }

    fn stripe_rng(&self, node: &Node, s: u64) -> Xoshiro256PlusPlus {
        self.rng(STRIPE_ORDER | fold(node.id(), s) >> 4)
    }

    fn leaf_rng(&self, node: &Node) -> Xoshiro256PlusPlus {
        self.rng(LEAF_ORDER | node.id())
    }

    fn base(&self, node: &Node) -> u64 {
        fold(self.cells, node.id())
    }

    fn stripes(&self, m: u64) -> u64 {
        m.div_ceil(self.shape.stripe)
    }

    /// Items of stripes `[s0, s1)` of a node of `m` items.
    fn items(&self, m: u64, s0: u64, s1: u64) -> u64 {
        (s1 * self.shape.stripe).min(m) - s0 * self.shape.stripe
    }

    /// The stripe table of `node`: every cell of its two trees drawn, top down.
    fn table(&self, node: &Node) -> Table {
        let ns = self.stripes(node.m);
        let mut rows = vec![[0u64; FANOUT]; ns as usize + 1];
        let root: [u64; FANOUT] =
            std::array::from_fn(|g| bucket_start(node.m, g + 1) - bucket_start(node.m, g));
        if ns > 0 {
            self.fill(node, (0, ns), root, &mut rows[..ns as usize]);
        }
        // Counts become starts in place, bucket by bucket, stripe by stripe inside a bucket.
        for g in 0..FANOUT {
            let mut at = bucket_start(node.m, g);
            for row in rows.iter_mut() {
                let count = row[g];
                row[g] = at;
                at += count;
            }
            debug_assert!(cancelled() || at == bucket_start(node.m, g + 1));
        }
        Table { rows }
    }

    /// Writes the bucket counts of every stripe of `(s0, s1)`, which holds `counts`, to `out`.
    fn fill(
        &self,
        node: &Node,
        (s0, s1): (u64, u64),
        counts: [u64; FANOUT],
        out: &mut [[u64; FANOUT]],
    ) {
        if s1 - s0 == 1 {
            out[0] = counts;
            return;
        }
        if cancelled() {
            // A long block's table is millions of draws (a tenth of a second at 5e8 items).
            // Left unfilled: every caller looks at the flag before dealing by it.
            return;
        }
        let sm = s0 + (s1 - s0) / 2;
        let left = self.split_counts(node, (s0, s1), &counts, self.items(node.m, s0, sm));
        let right: [u64; FANOUT] = std::array::from_fn(|g| counts[g] - left[g]);
        let (lo, hi) = out.split_at_mut((sm - s0) as usize);
        if s1 - s0 > PAR_STRIPES {
            rayon::join(
                || self.fill(node, (s0, sm), left, lo),
                || self.fill(node, (sm, s1), right, hi),
            );
        } else {
            self.fill(node, (s0, sm), left, lo);
            self.fill(node, (sm, s1), right, hi);
        }
    }

    /// The bucket counts of the left half of stripe range `v`, which holds `counts`, when that
    /// half holds `left_items` items: every cell of the bucket tree at `v`.
    fn split_counts(
        &self,
        node: &Node,
        v: (u64, u64),
        counts: &[u64; FANOUT],
        left_items: u64,
    ) -> [u64; FANOUT] {
        let base = self.base(node);
        let mut left = [0u64; FANOUT];
        // (g0, g1, t(G, V), t(G, Vl)) still to deal, depth first.
        let mut stack = vec![(0usize, FANOUT, counts.iter().sum::<u64>(), left_items)];
        while let Some((g0, g1, tg, tvl)) = stack.pop() {
            if g1 - g0 == 1 {
                left[g0] = tvl;
                continue;
            }
            let gm = g0 + (g1 - g0) / 2;
            let tgl: u64 = counts[g0..gm].iter().sum();
            let x = cell(base, v, (g0, g1), tg, tgl, tvl);
            stack.push((gm, g1, tg - tgl, tvl - x));
            stack.push((g0, gm, tgl, x));
        }
        left
    }

    /// Shuffles stripe `s` of `node` (its items in input order in `buf`) and writes each
    /// bucket's items to their place in the bucket's target (a bucket without one is dropped).
    ///
    /// # Safety
    /// Every non-null target must be valid for writes at every position of its bucket, and no
    /// other thread may touch this stripe's destinations (they are disjoint from other
    /// stripes' by the table).
    unsafe fn deal<T: Index>(
        &self,
        node: &Node,
        table: &Table,
        s: u64,
        buf: &mut [T],
        to: &Targets<T>,
    ) {
        let (at, next) = (&table.rows[s as usize], &table.rows[s as usize + 1]);
        fisher_yates_fast(buf, &mut self.stripe_rng(node, s), false);
        let mut o = 0usize;
        for g in 0..FANOUT {
            let c = (next[g] - at[g]) as usize;
            let dst = to.0[g];
            if !dst.is_null() {
                // SAFETY: positions [at[g], next[g]) are this stripe's own part of bucket g,
                // whose items `dst` has room for (the caller's contract); `buf` holds exactly
                // the stripe's items, which the counts add up to.
                unsafe {
                    let into = dst.add((at[g] - bucket_start(node.m, g)) as usize);
                    std::ptr::copy_nonoverlapping(buf.as_ptr().add(o), into, c)
                };
            }
            o += c;
        }
        debug_assert_eq!(o, buf.len());
    }

    /// Shuffles `part`, the items of node `node` (below the root) in input order, with
    /// `scratch` as long as `part` when `part` is no leaf.
    fn shuffle<T: Index>(&self, node: &Node, part: &mut [T], scratch: &mut [T]) {
        debug_assert!(node.depth >= 1);
        if node.m <= self.shape.leaf {
            let prefetch = part.len() > PREFETCH_FROM;
            fisher_yates_fast(part, &mut self.leaf_rng(node), prefetch);
            return;
        }
        if cancelled() {
            return; // a bucket of a long block is millions of items; the caller discards it
        }
        self.scatter(node, part, scratch);
        self.children(node, part, scratch);
    }

    /// Deals the stripes of `node` from `part` (input order) into `scratch`.
    fn scatter<T: Index>(&self, node: &Node, part: &[T], scratch: &mut [T]) {
        assert_eq!(part.len(), scratch.len());
        let table = self.table(node);
        if cancelled() {
            return; // the table may be unfilled: deal nothing by it
        }
        let to = Targets::contiguous(node.m, scratch.as_mut_ptr());
        part.par_chunks(self.shape.stripe as usize)
            .enumerate()
            .for_each_init(Vec::new, |buf, (s, items)| {
                if cancelled() {
                    return;
                }
                buf.clear();
                buf.extend_from_slice(items);
                // SAFETY: `scratch` holds the node's positions and is borrowed exclusively
                // here; each stripe writes its own destinations.
                unsafe { self.deal(node, &table, s as u64, buf, &to) };
            });
    }

    /// Shuffles every bucket of `node` from `scratch` (where the stripes were dealt) back
    /// into `part`.
    fn children<T: Index>(&self, node: &Node, part: &mut [T], scratch: &mut [T]) {
        for g in 0..FANOUT {
            if cancelled() {
                return; // the caller discards the buffer
            }
            let (lo, hi) = (
                bucket_start(node.m, g) as usize,
                bucket_start(node.m, g + 1) as usize,
            );
            let child = node.child(g);
            if child.m <= self.shape.leaf {
                // Back by an inside-out shuffle: no copy afterwards.
                inside_out_fast(
                    &scratch[lo..hi],
                    &mut part[lo..hi],
                    &mut self.leaf_rng(&child),
                );
                continue;
            }
            self.shuffle(&child, &mut scratch[lo..hi], &mut part[lo..hi]);
            part[lo..hi].copy_from_slice(&scratch[lo..hi]);
        }
    }

    /// Random access: for every output position in `[q0, q1)` of the shuffle of `m` items,
    /// the input position of the item that lands there.
    pub(crate) fn positions(&self, m: u64, q0: u64, q1: u64) -> Vec<u64> {
        assert!(q0 <= q1 && q1 <= m, "positions out of range");
        let mut out = vec![0u64; (q1 - q0) as usize];
        let wanted: Vec<(u64, usize)> = (q0..q1).zip(0..).collect();
        let root = Node {
            m,
            depth: 0,
            path: 0,
        };
        self.locate(&root, &wanted, &mut out);
        out
    }

    /// For every `(q, slot)` of `wanted`, writes to `out[slot]` the position in `node`'s input
    /// of the item at its output position `q`.
    fn locate(&self, node: &Node, wanted: &[(u64, usize)], out: &mut [u64]) {
        if node.depth >= 1 && node.m <= self.shape.leaf {
            let order = self.leaf_order(node);
            for &(q, slot) in wanted {
                out[slot] = u64::from(order[q as usize]);
            }
            return;
        }
        let mut by_bucket = BTreeMap::<usize, Vec<(u64, usize)>>::new();
        for &(q, slot) in wanted {
            let g = bucket_of(node.m, q);
            by_bucket
                .entry(g)
                .or_default()
                .push((q - bucket_start(node.m, g), slot));
        }
        for (g, list) in by_bucket {
            let local: Vec<(u64, usize)> = list.iter().map(|&(q, _)| q).zip(0..).collect();
            let mut inside = vec![0u64; list.len()];
            self.locate(&node.child(g), &local, &mut inside);
            let mut items: Vec<(u64, usize)> = inside
                .into_iter()
                .zip(list.iter().map(|&(_, slot)| slot))
                .collect();
            items.sort_unstable();
            self.select(node, g, &items, out);
        }
    }

    /// The order a leaf's shuffle gives its items: Fisher–Yates in place at depth 1, inside-out
    /// from the parent's scatter buffer deeper down.
    fn leaf_order(&self, node: &Node) -> Vec<u32> {
        let ident: Vec<u32> = (0..node.m as u32).collect();
        let mut rng = self.leaf_rng(node);
        if node.depth == 1 {
            let mut v = ident;
            fisher_yates_fast(&mut v, &mut rng, false);
            v
        } else {
            let mut v = vec![0u32; ident.len()];
            inside_out_fast(&ident, &mut v, &mut rng);
            v
        }
    }

    /// For every `(i, slot)` of `items` (increasing `i`), writes to `out[slot]` the input
    /// position in `node` of the `i`-th item of bucket `g`'s sequence.
    fn select(&self, node: &Node, g: usize, items: &[(u64, usize)], out: &mut [u64]) {
        // Along the bucket tree's path to g: on[d] = t(G_d, V), left[d] = t(left child of
        // G_d, V), where G_d is the path's node at depth d (G_0 all buckets, G_6 = {g}).
        let mut on = [0u64; LEVELS + 1];
        let mut left = [0u64; LEVELS];
        for d in 0..=LEVELS {
            let (g0, g1) = path_node(g, d);
            on[d] = bucket_start(node.m, g1) - bucket_start(node.m, g0);
            if d < LEVELS {
                let gm = g0 + (g1 - g0) / 2;
                left[d] = bucket_start(node.m, gm) - bucket_start(node.m, g0);
            }
        }
        let ns = self.stripes(node.m);
        self.select_in(node, g, (0, ns), (on, left), items, out);
    }

    fn select_in(
        &self,
        node: &Node,
        g: usize,
        (s0, s1): (u64, u64),
        (on, left): ([u64; LEVELS + 1], [u64; LEVELS]),
        items: &[(u64, usize)],
        out: &mut [u64],
    ) {
        if items.is_empty() {
            return;
        }
        if s1 - s0 == 1 {
            // Bucket g's items of this stripe follow those of the buckets before it.
            let offset: u64 = (0..LEVELS)
                .filter(|&d| goes_right(g, d))
                .map(|d| left[d])
                .sum();
            let len = self.items(node.m, s0, s1);
            let mut order: Vec<u32> = (0..len as u32).collect();
            fisher_yates_fast(&mut order, &mut self.stripe_rng(node, s0), false);
            for &(i, slot) in items {
                debug_assert!(i < on[LEVELS]);
                out[slot] = s0 * self.shape.stripe + u64::from(order[(offset + i) as usize]);
            }
            return;
        }
        let sm = s0 + (s1 - s0) / 2;
        let base = self.base(node);
        let mut on_l = [0u64; LEVELS + 1];
        let mut left_l = [0u64; LEVELS];
        on_l[0] = self.items(node.m, s0, sm);
        for d in 0..LEVELS {
            let x = cell(base, (s0, s1), path_node(g, d), on[d], left[d], on_l[d]);
            on_l[d + 1] = if goes_right(g, d) { on_l[d] - x } else { x };
            left_l[d] = x;
        }
        let on_r: [u64; LEVELS + 1] = std::array::from_fn(|d| on[d] - on_l[d]);
        let left_r: [u64; LEVELS] = std::array::from_fn(|d| left[d] - left_l[d]);
        let here = on_l[LEVELS];
        let cut = items.partition_point(|&(i, _)| i < here);
        self.select_in(node, g, (s0, sm), (on_l, left_l), &items[..cut], out);
        let rest: Vec<(u64, usize)> = items[cut..].iter().map(|&(i, s)| (i - here, s)).collect();
        self.select_in(node, g, (sm, s1), (on_r, left_r), &rest, out);
    }
}

/// The bucket range of the bucket tree's node at depth `d` on the path to bucket `g`.
fn path_node(g: usize, d: usize) -> (usize, usize) {
    let width = FANOUT >> d;
    let g0 = g / width * width;
    (g0, g0 + width)
}

/// Whether bucket `g` lies in the right half of its path's node at depth `d`.
fn goes_right(g: usize, d: usize) -> bool {
    let (g0, g1) = path_node(g, d);
    g >= g0 + (g1 - g0) / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{orders_chi2, tenths_chi2};

    const TINY: Shape = Shape { stripe: 3, leaf: 2 };

    /// Pushes `0..m` through dealers cut at `cuts` (increasing), the parts fed last to first,
    /// and finishes: the shuffle of the identity.
    fn streamed(keys: &Seekable, m: u64, cuts: &[u64]) -> Vec<u64> {
        streamed_window(keys, m, cuts, (0, m))
    }

    /// [`streamed`] for output positions `[a, b)` only, through a windowed plan.
    fn streamed_window(keys: &Seekable, m: u64, cuts: &[u64], (a, b): (u64, u64)) -> Vec<u64> {
        let plan = Plan::window(keys, m, (a, b));
        let mut out = vec![0u64; (b - a) as usize];
        let mut edge = vec![0u64; plan.edge_len()];
        {
            let mut parts = Vec::new();
            let mut rest = Dealer::new(&plan, &mut out, &mut edge);
            let mut at = 0;
            for &c in cuts {
                let (a, b) = rest.split(c - at);
                parts.push((at, c, a));
                rest = b;
                at = c;
            }
            parts.push((at, m, rest));
            while let Some((lo, hi, mut part)) = parts.pop() {
                for v in lo..hi {
                    part.push(v);
                }
            }
        }
        plan.finish(&mut out, &mut edge);
        out
    }

    fn keys(seed: u64, shape: Shape) -> Seekable {
        Seekable::new(seed, 7, 11, shape)
    }

    #[test]
    fn a_window_equals_the_cut_of_the_whole_and_keeps_at_most_two_buckets_aside() {
        for shape in [
            TINY,
            Shape {
                stripe: 64,
                leaf: 16,
            },
            Shape::BLOCKS,
        ] {
            for m in [1u64, 63, 64, 65, 200, 4099, 70_000] {
                let k = keys(m + 3, shape);
                let whole = streamed(&k, m, &[]);
                let b64 = |g: usize| bucket_start(m, g);
                let windows = [
                    (0, 0),
                    (0, 1),
                    (0, m),
                    (m / 3, m),
                    (0, m / 2 + 1),
                    (m / 5, m / 5 + 1),
                    (b64(3).min(m), b64(9).min(m)),
                    (b64(3).min(m), (b64(9) + 1).min(m)),
                    (m - 1, m),
                ];
                for (a, b) in windows {
                    let cuts: Vec<u64> = [1, m / 2, m / 2 + 1]
                        .into_iter()
                        .filter(|&c| c < m)
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let got = streamed_window(&k, m, &cuts, (a, b));
                    assert_eq!(
                        got,
                        whole[a as usize..b as usize],
                        "m={m} {shape:?} [{a}, {b})"
                    );
                    let plan: Plan<u64> = Plan::window(&k, m, (a, b));
                    let biggest = (0..FANOUT).map(|g| b64(g + 1) - b64(g)).max().unwrap();
                    assert!(plan.edge_len() as u64 <= 2 * biggest);
                    if (a, b) == (0, m) || a == b {
                        assert_eq!(plan.edge_len(), 0);
                    }
                }
            }
        }
    }

    #[test]
    fn a_permutation_read_anywhere_whatever_the_cuts() {
        let shapes = [
            TINY,
            Shape {
                stripe: 5,
                leaf: 40,
            },
            Shape {
                stripe: 64,
                leaf: 16,
            },
        ];
        for shape in shapes {
            for m in [1u64, 2, 5, 63, 64, 65, 200, 1000, 4099] {
                let k = keys(m, shape);
                let whole = streamed(&k, m, &[]);
                let mut sorted = whole.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..m).collect::<Vec<_>>(), "m={m} {shape:?}");
                assert_eq!(k.positions(m, 0, m), whole, "m={m} {shape:?}");
                for (a, b) in [(0, m / 3), (m / 2, m), (m / 5, m / 5 + 1)] {
                    assert_eq!(k.positions(m, a, b), whole[a as usize..b as usize]);
                }
                // Cuts inside stripes, on stripe ends, and next to each other.
                let cuts: Vec<u64> = [1, shape.stripe, shape.stripe + 1, m / 2, m / 2 + 1]
                    .into_iter()
                    .filter(|&c| c < m)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                assert_eq!(streamed(&k, m, &cuts), whole, "m={m} cuts={cuts:?}");
            }
        }
    }

    #[test]
    fn blocks_shape_through_two_levels() {
        // Buckets above LEAF take a second level; 2**27 items would, so scale the leaf.
        let shape = Shape {
            stripe: STRIPE,
            leaf: 1 << 12,
        };
        let m = (1 << 19) + 12_345;
        let k = keys(5, shape);
        let whole = streamed(
            &k,
            m,
            &[m / 3, m / 3 + 1, (m / 3) / STRIPE * STRIPE + STRIPE],
        );
        let mut seen = vec![false; m as usize];
        for &v in &whole {
            assert!(!std::mem::replace(&mut seen[v as usize], true));
        }
        for a in [0, 1, m / 2, m - 64] {
            assert_eq!(
                k.positions(m, a, a + 64),
                whole[a as usize..a as usize + 64]
            );
        }
    }

    #[test]
    fn same_for_any_thread_count() {
        let k = keys(9, Shape::BLOCKS);
        let m = 3 * STRIPE * 70 + 17;
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let four = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let a = one.install(|| streamed(&k, m, &[STRIPE / 2, m / 2]));
        let b = four.install(|| streamed(&k, m, &[]));
        assert_eq!(a, b);
    }

    #[test]
    fn every_order_equally_likely() {
        // Stripes of one item: the cells alone deal 4 items into 4 one-item buckets; then
        // stripes of two, where the stripe shuffles take part.
        for (m, stripe, orders) in [(4u64, 1u64, 24u64), (5, 2, 120)] {
            let shape = Shape { stripe, leaf: 1 };
            let (distinct, chi) = orders_chi2(orders, orders * 250, |seed| {
                streamed(&keys(seed, shape), m, &[])
            });
            assert_eq!(distinct as u64, orders);
            // 99.9% quantiles: 49.7 (23 dof), 162.0 (119 dof).
            assert!(
                chi < if orders == 24 { 49.7 } else { 162.0 },
                "m={m}: chi2 {chi}"
            );
        }
    }

    #[test]
    fn positions_are_uniform_through_deep_trees() {
        for (m, shape) in [(130u64, TINY), (1000, Shape { stripe: 7, leaf: 9 })] {
            let chi = tenths_chi2(m, 6000, |seed| streamed(&keys(seed, shape), m, &[]));
            // 27 dof, 99.9% quantile 55.5.
            assert!(chi < 55.5, "m={m}: chi2 {chi}");
        }
    }

    #[test]
    fn salts_and_seeds_differ() {
        let m = 5000;
        let a = Seekable::new(1, 2, 3, Shape::BLOCKS).positions(m, 0, 64);
        let b = Seekable::new(1, 2, 4, Shape::BLOCKS).positions(m, 0, 64);
        let c = Seekable::new(2, 2, 3, Shape::BLOCKS).positions(m, 0, 64);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn three_levels_and_nodes_of_exactly_a_leaf() {
        // Depth-2 nodes that split again (their buckets copied back from scratch), and at
        // m = 12288 with leaves of 3, depth-2 nodes of exactly 3 items (leaves, by <=).
        for (m, shape) in [
            (20_000u64, Shape { stripe: 3, leaf: 2 }),
            (12_288, Shape { stripe: 4, leaf: 3 }),
            (9_000, Shape { stripe: 5, leaf: 2 }),
            (
                300_000,
                Shape {
                    stripe: 7,
                    leaf: 30,
                },
            ),
        ] {
            let k = keys(m, shape);
            let whole = streamed(&k, m, &[m / 7, m / 7 + 1, m / 2]);
            let mut sorted = whole.clone();
            sorted.sort_unstable();
            assert!(sorted.iter().copied().eq(0..m), "m={m}");
            assert_eq!(k.positions(m, 0, m), whole, "m={m} {shape:?}");
        }
    }

    #[test]
    fn prefetching_leaves_and_u32_buffers() {
        // Level-1 buckets just over PREFETCH_FROM (2**18) items: their Fisher-Yates prefetches
        // in bulk and not in random access, with the same swaps.
        let m = FANOUT as u64 * ((1 << 18) + 3);
        let k = keys(3, Shape::BLOCKS);
        let plan = Plan::window(&k, m, (0, m));
        let mut out = vec![0u32; m as usize];
        {
            let (mut a, mut b) = Dealer::new(&plan, &mut out, &mut []).split(m / 3 + 5);
            for v in m / 3 + 5..m {
                b.push(v as u32);
            }
            for v in 0..m / 3 + 5 {
                a.push(v as u32);
            }
        }
        plan.finish(&mut out, &mut []);
        let mut seen = vec![false; m as usize];
        for &v in &out {
            assert!(!std::mem::replace(&mut seen[v as usize], true));
        }
        for a in [0, 12_345, m / 2, m - 64] {
            let want: Vec<u64> = out[a as usize..a as usize + 64]
                .iter()
                .map(|&v| v.into())
                .collect();
            assert_eq!(k.positions(m, a, a + 64), want);
        }
    }

    #[test]
    fn nothing_to_shuffle() {
        let k = keys(1, Shape::BLOCKS);
        assert!(k.positions(0, 0, 0).is_empty());
        let plan = Plan::<u64>::window(&k, 0, (0, 0));
        let mut out: Vec<u64> = Vec::new();
        drop(Dealer::new(&plan, &mut out, &mut []));
        plan.finish(&mut out, &mut []);
        assert_eq!(streamed(&k, 1, &[]), [0]);
    }

    #[test]
    fn nodes_draw_from_their_own_generators() {
        // Equal sizes, different places: different leaf orders, stripe orders and cells.
        let k = keys(
            2,
            Shape {
                stripe: 100,
                leaf: 1000,
            },
        );
        let node = |depth, path| Node {
            m: 1000,
            depth,
            path,
        };
        let (a, b, c) = (node(1, 3), node(1, 4), node(2, 3));
        assert_ne!(k.leaf_order(&a), k.leaf_order(&b));
        assert_ne!(k.leaf_order(&b), k.leaf_order(&c));
        let orders = |n: &Node, s| {
            let mut v: Vec<u32> = (0..100).collect();
            fisher_yates_fast(&mut v, &mut k.stripe_rng(n, s), false);
            v
        };
        assert_ne!(orders(&a, 0), orders(&b, 0));
        assert_ne!(orders(&a, 0), orders(&a, 1));
        assert_ne!(k.table(&a).rows, k.table(&b).rows);
        assert_ne!(k.table(&a).rows, k.table(&c).rows);
    }

    #[test]
    fn dealers_on_threads() {
        // Parts fed at once on a pool of three threads deal what one part in order deals.
        let k = keys(4, Shape::BLOCKS);
        let m = 40 * STRIPE + 999;
        let one = streamed(&k, m, &[]);
        let plan = Plan::window(&k, m, (0, m));
        let mut out = vec![0u64; m as usize];
        {
            let mut parts = Vec::new();
            let mut rest = Dealer::new(&plan, &mut out, &mut []);
            let mut at = 0;
            for cut in (1..12).map(|i| i * m / 12 + i) {
                let (a, b) = rest.split(cut - at);
                parts.push((at, cut, a));
                rest = b;
                at = cut;
            }
            parts.push((at, m, rest));
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            pool.install(|| {
                parts.into_par_iter().for_each(|(lo, hi, mut part)| {
                    for v in lo..hi {
                        part.push(v);
                    }
                })
            });
        }
        plan.finish(&mut out, &mut []);
        assert_eq!(out, one);
    }

    #[test]
    #[should_panic(expected = "more inputs than the run holds")]
    fn a_dealer_refuses_inputs_beyond_its_run() {
        let k = keys(1, Shape::BLOCKS);
        let plan = Plan::<u32>::window(&k, 10, (0, 10));
        let mut out = vec![0u32; 10];
        let (mut first, _) = Dealer::new(&plan, &mut out, &mut []).split(3);
        for v in 0..4 {
            first.push(v);
        }
    }

    #[test]
    #[should_panic(expected = "every input dealt once")]
    fn finishing_before_every_input_came_is_refused() {
        let k = keys(1, Shape { stripe: 4, leaf: 2 });
        let plan = Plan::<u32>::window(&k, 100, (0, 100));
        let mut out = vec![0u32; 100];
        {
            let mut d = Dealer::new(&plan, &mut out, &mut []);
            for v in 0..40 {
                d.push(v);
            }
        }
        plan.finish(&mut out, &mut []);
    }

    #[test]
    fn value_stability_pins() {
        // Deliberate pins: a change here changes the order of every rank's long blocks. The
        // tiny shape takes three levels of buckets at m = 300.
        let k = Seekable::new(0, 0, 0, TINY);
        assert_eq!(k.positions(300, 0, 6), PIN_TINY_300);
        let k = Seekable::new(1, 2, 3, Shape::BLOCKS);
        assert_eq!(k.positions(1 << 20, 1000, 1004), PIN_BLOCKS);
    }
    const PIN_TINY_300: [u64; 6] = [19, 230, 65, 8, 271, 21];
    const PIN_BLOCKS: [u64; 4] = [571795, 385176, 199047, 518709];

    #[test]
    fn bucket_arithmetic() {
        for m in [1u64, 2, 63, 64, 65, 1000, u64::MAX / 3] {
            assert_eq!(bucket_start(m, 0), 0);
            assert_eq!(bucket_start(m, FANOUT), m);
            for q in [0, m / 2, m - 1] {
                let g = bucket_of(m, q);
                assert!(
                    bucket_start(m, g) <= q && q < bucket_start(m, g + 1),
                    "m={m} q={q}"
                );
            }
        }
        assert_eq!(path_node(37, 0), (0, 64));
        assert_eq!(path_node(37, 1), (32, 64));
        assert_eq!(path_node(37, 6), (37, 38));
        assert!(goes_right(37, 0) && !goes_right(37, 1));
    }
}

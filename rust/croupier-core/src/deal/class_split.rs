//! The values of chosen classes of a uniform random partition of `[0, n)`, computed without
//! the other classes: recursive hypergeometric splitting.
//!
//! # The partition
//!
//! `n` values are dealt into `C` classes of fixed sizes (class `x` gets `prefix(x+1) -
//! prefix(x)` values), every such partition equally likely. Two binary trees organise it:
//! the *value tree* halves `[lo, hi)` at `lo + (hi - lo) / 2` down to leaves of at most
//! [`Classes::leaf`] values (64 to 1024), and the *class tree* splits class ranges `[a, b)` at
//! [`Classes::split`] (the midpoint by default) down to single classes. Write `t(G, V)` for
//! how many values of value node `V` go to class node `G`; at the root `t(G, [0, n))` is `G`'s
//! size and `t([0, C), V) = |V|`. For a value node `V` with
//! halves `Vl, Vr` and a class node `G` with halves `Gl, Gr`, the values of `V` that `G` gets
//! are a uniform random subset of `V` of size `t(G, V)`, so how many of them lie in `Vl` while
//! belonging to `Gl` is hypergeometric:
//!
//! ```text
//! t(Gl, Vl) ~ Hyp(population t(G, V), marked t(Gl, V), drawn t(G, Vl))
//! ```
//!
//! and the other three counts follow by subtraction. In a leaf `V` the values themselves are
//! dealt: `G`'s values are a bit set, `Gl` takes a uniform random subset of it of size
//! `t(Gl, V)` (see [`subset`]), `Gr` the rest. Each decision is drawn from the generator of
//! its cell `(V, G)` ([`crate::draw::cell_rng`]), so any process that needs a cell draws the
//! same thing, and skipping a cell whose outcome is forced changes nothing else.
//!
//! # Cost
//!
//! To get the classes `[c0, c1)` one walks only the class nodes that overlap them (and their
//! siblings' counts), and only value nodes where those classes have values. For one rank of
//! `W` that is `O(log W)` cells per value node: about `2N/L` value nodes for leaves of `L`
//! when the rank's values are dense, `O(k log(N/k))` when they are sparse (`k` values
//! wanted); a leaf costs `O(L/64)` word operations per class level. Memory is the output plus
//! `O(log N)` small vectors. Work splits over value subtrees with rayon; the
//! output never depends on how.

use crate::cancel::cancelled;
use crate::draw::cell_rng::CellRng;
use crate::draw::hypergeom::hypergeometric;
use crate::draw::prp::Prp;
use crate::index::Index;
use crate::stream::fold;

/// Class sizes of a partition, as prefix sums.
pub(crate) trait Classes: Sync {
    /// Number of classes `C`.
    fn count(&self) -> u64;
    /// Total size of classes `[0, x)` for `x <= C`; non-decreasing, `prefix(0) = 0`.
    fn prefix(&self, x: u64) -> u64;
    /// Where the class tree splits `[a, b)` (`b - a >= 2`); the midpoint unless the classes
    /// have a better shape. Must be in `(a, b)`.
    fn split(&self, a: u64, b: u64) -> u64 {
        a + (b - a) / 2
    }
    /// Leaves of the value tree hold at most this many values: a power of two in
    /// `[64, MAX_PERMUTED_LEAF]`. Big leaves suit classes that are a large fraction of `n`;
    /// above [`MAX_LEAF`] leaves are permuted (each class a run of a keyed permutation of the
    /// leaf, in that permuted order rather than increasing), which suits many small classes.
    fn leaf(&self) -> u64 {
        64
    }
}

/// The largest value leaf dealt with bit sets (of 16 words).
pub(crate) const MAX_LEAF: u64 = 1024;
/// Larger leaves, up to this size, are *permuted*: a keyed pseudorandom permutation of the
/// leaf's positions ([`crate::draw::prp`]) gives each class a run of it, so a class with few
/// values in the leaf costs one evaluation per value instead of bit sets over the leaf.
pub(crate) const MAX_PERMUTED_LEAF: u64 = 1 << 20;
const WORDS: usize = (MAX_LEAF / 64) as usize;

thread_local! {
    /// Per-thread entry vectors, one pair per level of the value tree, reused across calls.
    static SCRATCH: std::cell::RefCell<Vec<(Vec<Entry>, Vec<Entry>)>> =
        std::cell::RefCell::new(vec![(Vec::new(), Vec::new()); 64]);
}

/// Value subtrees larger than this are split across threads.
const PAR_GRAIN: u64 = 1 << 21;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    a: u64,
    b: u64,
    t: u64,
}

/// A value node `[lo, hi)` of the value tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    lo: u64,
    hi: u64,
}

impl Node {
    /// Number of values.
    #[inline(always)]
    fn len(self) -> u64 {
        self.hi - self.lo
    }

    /// Where the node is halved.
    #[inline(always)]
    fn mid(self) -> u64 {
        self.lo + (self.hi - self.lo) / 2
    }

    /// The left and right halves.
    #[inline(always)]
    fn halves(self) -> (Node, Node) {
        let mid = self.mid();
        (
            Node {
                lo: self.lo,
                hi: mid,
            },
            Node {
                lo: mid,
                hi: self.hi,
            },
        )
    }
}

/// A value node's entries (one per class node listed, in the class tree's preorder) and how
/// many of them a walk has read. (`leaf_runs`, the hot walk of a permuted leaf, takes the
/// entries and the position apart instead: kept in registers, it runs 1% fewer
/// instructions.)
struct Cursor<'s> {
    src: &'s [Entry],
    at: usize,
}

impl<'s> Cursor<'s> {
    /// Reads `src` from its first entry.
    fn new(src: &'s [Entry]) -> Self {
        Cursor { src, at: 0 }
    }

    /// The next entry, read.
    #[inline(always)]
    fn take(&mut self) -> Entry {
        let e = self.src[self.at];
        self.at += 1;
        e
    }

    /// The count of the next entry, not read (a class node's left child, after its parent).
    #[inline(always)]
    fn next_t(&self) -> u64 {
        self.src[self.at].t
    }
}

/// The entry lists the halves of a value node receive, or `None` for a half not listed.
type Halves<'v> = (Option<&'v mut Vec<Entry>>, Option<&'v mut Vec<Entry>>);

struct Engine<'c, C> {
    classes: &'c C,
    leaf: u64,
    c0: u64,
    c1: u64,
    base: u64,
}

/// Receives one wanted class's values, in increasing order. The parallel walk splits a sink
/// where a value subtree ends, so each part receives a run of consecutive ranks.
pub(crate) trait Sink: Send + Sized {
    /// The next value of the class.
    fn push(&mut self, v: u64);
    /// The sinks of the next `count` values and of the ones after them.
    fn split(self, count: u64) -> (Self, Self);
}

/// A buffer filled in increasing value order: the plain output of `class_values`.
pub(crate) struct Run<'o, T> {
    buf: &'o mut [T],
    at: usize,
}

impl<'o, T> Run<'o, T> {
    /// Fills `buf` from its start.
    pub(crate) fn new(buf: &'o mut [T]) -> Self {
        Run { buf, at: 0 }
    }
}

impl<T: Index> Sink for Run<'_, T> {
    #[inline(always)]
    fn push(&mut self, v: u64) {
        self.buf[self.at] = T::from_u64(v);
        self.at += 1;
    }

    fn split(self, count: u64) -> (Self, Self) {
        let (a, b) = self.buf[self.at..].split_at_mut(count as usize);
        (Run::new(a), Run::new(b))
    }
}

impl<C: Classes> Engine<'_, C> {
    fn size(&self, a: u64, b: u64) -> u64 {
        self.classes.prefix(b) - self.classes.prefix(a)
    }

    /// Whether `e`'s children are listed after it: it has values, it is not a single class,
    /// and it overlaps the wanted classes.
    #[inline(always)]
    fn expands(&self, e: &Entry) -> bool {
        e.t > 0 && e.b - e.a > 1 && e.a < self.c1 && e.b > self.c0
    }

    /// The entries of the root value node: class sizes.
    fn root(&self, a: u64, b: u64, out: &mut Vec<Entry>) {
        let e = Entry {
            a,
            b,
            t: self.size(a, b),
        };
        out.push(e);
        if self.expands(&e) {
            let m = self.classes.split(a, b);
            self.root(a, m, out);
            self.root(m, b, out);
        }
    }

    fn skip(&self, cur: &mut Cursor) {
        let e = cur.take();
        if self.expands(&e) {
            self.skip(cur);
            self.skip(cur);
        }
    }

    /// How many values of this value node belong to wanted classes.
    fn wanted(&self, cur: &mut Cursor) -> u64 {
        let e = cur.take();
        if e.a >= self.c0 && e.b <= self.c1 {
            if self.expands(&e) {
                self.skip(cur);
                self.skip(cur);
            }
            return e.t;
        }
        if self.expands(&e) {
            self.wanted(cur) + self.wanted(cur)
        } else {
            0
        }
    }

    /// Per wanted class, how many of its values lie in this value node.
    fn class_counts(&self, cur: &mut Cursor, out: &mut [u64]) {
        let e = cur.take();
        if e.b - e.a == 1 && e.a >= self.c0 && e.a < self.c1 {
            out[(e.a - self.c0) as usize] = e.t;
        }
        if self.expands(&e) {
            self.class_counts(cur, out);
            self.class_counts(cur, out);
        }
    }

    /// Splits the entries of value node `node` (read from `cur`) into those of its halves;
    /// `tl` is the count of the current class node in the left half. Adds to `wanted` how many
    /// values of each half belong to the wanted classes (counted at the topmost class nodes
    /// inside them; `inside` says an ancestor already was).
    fn split_node(
        &self,
        node: Node,
        cur: &mut Cursor,
        tl: u64,
        (mut l, mut r): Halves<'_>,
        inside: bool,
        wanted: &mut [u64; 2],
    ) {
        let e = cur.take();
        let el = Entry { t: tl, ..e };
        let er = Entry { t: e.t - tl, ..e };
        let full = !inside && e.a >= self.c0 && e.b <= self.c1;
        if full {
            wanted[0] += el.t;
            wanted[1] += er.t;
        }
        let inside = inside || full;
        if let Some(v) = l.as_deref_mut() {
            v.push(el);
        }
        if let Some(v) = r.as_deref_mut() {
            v.push(er);
        }
        if !self.expands(&e) {
            return;
        }
        let mut l = if self.expands(&el) { l } else { None };
        let mut r = if self.expands(&er) { r } else { None };
        if l.is_none() && r.is_none() {
            self.skip(cur);
            self.skip(cur);
            return;
        }
        let left_t = cur.next_t();
        let x = if tl == 0 || left_t == 0 {
            0
        } else if tl == e.t {
            left_t
        } else if left_t == e.t {
            tl
        } else {
            let mut rng = CellRng::for_cell(self.base, node.lo, node.hi, e.a, e.b);
            hypergeometric(&mut rng, e.t, left_t, tl)
        };
        let left = (l.as_deref_mut(), r.as_deref_mut());
        self.split_node(node, cur, x, left, inside, wanted);
        self.split_node(node, cur, tl - x, (l, r), inside, wanted);
    }

    /// Splits value node `node`'s entries `src` into its halves' and returns how many values of
    /// each half the wanted classes hold.
    fn split(&self, node: Node, src: &[Entry], l: &mut Vec<Entry>, r: &mut Vec<Entry>) -> [u64; 2] {
        l.clear();
        r.clear();
        let mut cur = Cursor::new(src);
        let mut wanted = [0; 2];
        let tl = node.mid() - node.lo;
        self.split_node(node, &mut cur, tl, (Some(l), Some(r)), false, &mut wanted);
        debug_assert_eq!(cur.at, src.len());
        debug_assert_eq!(wanted[0], self.wanted(&mut Cursor::new(l)));
        debug_assert_eq!(wanted[1], self.wanted(&mut Cursor::new(r)));
        wanted
    }

    /// The permutation of a permuted leaf `node`: its own key, apart from every cell's (no
    /// class range ends at `u64::MAX`).
    fn leaf_prp(&self, node: Node) -> Prp {
        Prp::new(
            node.len(),
            fold(
                fold(fold(fold(self.base, node.lo), node.hi), u64::MAX),
                u64::MAX,
            ),
        )
    }

    /// In a permuted leaf, each wanted class's run `(first, count)` in the leaf's permuted
    /// positions: the classes of the leaf take consecutive runs in class order, so a class's
    /// run starts after the values of every class before it (the counts of the left siblings
    /// along its path in the class tree).
    fn leaf_runs(
        &self,
        src: &[Entry],
        idx: &mut usize,
        first: u64,
        emit: &mut impl FnMut(usize, u64, u64),
    ) {
        let e = src[*idx];
        *idx += 1;
        if e.b - e.a == 1 {
            if e.a >= self.c0 && e.a < self.c1 && e.t > 0 {
                emit((e.a - self.c0) as usize, first, e.t);
            }
            return;
        }
        if !self.expands(&e) {
            return;
        }
        let left_t = src[*idx].t;
        self.leaf_runs(src, idx, first, emit);
        self.leaf_runs(src, idx, first + left_t, emit);
    }

    /// Deals the values of a leaf `node` as bit sets (bit `i` of word `k` is value
    /// `node.lo + 64k + i`), its entries read from `cur`.
    fn leaf_node(
        &self,
        node: Node,
        cur: &mut Cursor,
        set: &[u64],
        emit: &mut impl FnMut(usize, &[u64]),
    ) {
        let e = cur.take();
        debug_assert_eq!(
            set.iter().map(|w| u64::from(w.count_ones())).sum::<u64>(),
            e.t
        );
        if e.b - e.a == 1 {
            if e.a >= self.c0 && e.a < self.c1 {
                emit((e.a - self.c0) as usize, set);
            }
            return;
        }
        if !self.expands(&e) {
            return;
        }
        let words = set.len();
        let left_t = cur.next_t();
        let mut left = [0u64; WORDS];
        let mut right = [0u64; WORDS];
        if left_t == e.t {
            left[..words].copy_from_slice(set);
        } else if left_t > 0 {
            let mut rng = CellRng::for_cell(self.base, node.lo, node.hi, e.a, e.b);
            subset(&mut rng, set, e.t, left_t, &mut left[..words]);
        }
        for k in 0..words {
            right[k] = set[k] & !left[k];
        }
        self.leaf_node(node, cur, &left[..words], emit);
        self.leaf_node(node, cur, &right[..words], emit);
    }

    /// Fills the wanted classes' values of value node `node` (entries `src`, `wanted` values
    /// of the wanted classes) into `segs`.
    fn node<S: Sink>(
        &self,
        node: Node,
        src: &[Entry],
        wanted: u64,
        segs: &mut [S],
        scratch: &mut [(Vec<Entry>, Vec<Entry>)],
    ) {
        if wanted == 0 {
            return;
        }
        let Node { lo, hi } = node;
        if hi - lo <= self.leaf && self.leaf > MAX_LEAF {
            let prp = self.leaf_prp(node);
            self.leaf_runs(src, &mut 0, 0, &mut |x, first, count| {
                let seg = &mut segs[x];
                for j in first..first + count {
                    seg.push(lo + prp.apply(j));
                }
            });
            return;
        }
        if hi - lo <= self.leaf {
            let full = full_set(hi - lo);
            let words = (hi - lo).div_ceil(64) as usize;
            let mut cur = Cursor::new(src);
            self.leaf_node(node, &mut cur, &full[..words], &mut |x, set| {
                let seg = &mut segs[x];
                for (k, &word) in set.iter().enumerate() {
                    let mut m = word;
                    while m != 0 {
                        seg.push(lo + 64 * k as u64 + u64::from(m.trailing_zeros()));
                        m &= m - 1;
                    }
                }
            });
            return;
        }
        let ((l, r), rest) = scratch
            .split_first_mut()
            .expect("scratch holds one pair per level of the value tree");
        let [wl, wr] = self.split(node, src, l, r);
        let (left, right) = node.halves();
        self.node(left, l, wl, segs, rest);
        self.node(right, r, wr, segs, rest);
    }

    /// Writes the values of the wanted class (a single one) with the given ranks among its
    /// values in value node `node` to `out`: `ranks` holds `(rank + offset, slot)` pairs in
    /// increasing rank order, every rank below the class's count in the node.
    fn select_node(
        &self,
        node: Node,
        src: &[Entry],
        ranks: &[(u64, usize)],
        offset: u64,
        out: &mut [u64],
        scratch: &mut [(Vec<Entry>, Vec<Entry>)],
    ) {
        if ranks.is_empty() {
            return;
        }
        let Node { lo, hi } = node;
        if hi - lo <= self.leaf && self.leaf > MAX_LEAF {
            let prp = self.leaf_prp(node);
            self.leaf_runs(src, &mut 0, 0, &mut |_, first, _| {
                for &(r, slot) in ranks {
                    out[slot] = lo + prp.apply(first + (r - offset));
                }
            });
            return;
        }
        if hi - lo <= self.leaf {
            let full = full_set(hi - lo);
            let words = (hi - lo).div_ceil(64) as usize;
            let mut cur = Cursor::new(src);
            self.leaf_node(node, &mut cur, &full[..words], &mut |_, set| {
                let mut next = ranks.iter().peekable();
                let mut seen = offset;
                for (k, &word) in set.iter().enumerate() {
                    let ones = u64::from(word.count_ones());
                    let mut m = word;
                    let mut at = seen;
                    while let Some(&&(r, slot)) = next.peek() {
                        if r >= seen + ones {
                            break;
                        }
                        while at < r {
                            m &= m - 1;
                            at += 1;
                        }
                        out[slot] = lo + 64 * k as u64 + u64::from(m.trailing_zeros());
                        next.next();
                    }
                    seen += ones;
                }
                debug_assert!(next.peek().is_none(), "every rank is in the leaf");
            });
            return;
        }
        let ((l, r), rest) = scratch
            .split_first_mut()
            .expect("scratch holds one pair per level of the value tree");
        let [wl, _] = self.split(node, src, l, r);
        let cut = ranks.partition_point(|&(rank, _)| rank < offset + wl);
        let (left, right) = node.halves();
        self.select_node(left, l, &ranks[..cut], offset, out, rest);
        self.select_node(right, r, &ranks[cut..], offset + wl, out, rest);
    }

    fn node_par<S: Sink>(&self, node: Node, src: &[Entry], wanted: u64, segs: Vec<S>) {
        if wanted == 0 || cancelled() {
            return;
        }
        if node.len() <= PAR_GRAIN {
            let mut segs = segs;
            SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                self.node(node, src, wanted, &mut segs, &mut scratch);
            });
            return;
        }
        let (mut l, mut r) = (Vec::new(), Vec::new());
        let [wl, wr] = self.split(node, src, &mut l, &mut r);
        let mut counts = vec![0u64; (self.c1 - self.c0) as usize];
        self.class_counts(&mut Cursor::new(&l), &mut counts);
        let (mut ls, mut rs) = (
            Vec::with_capacity(segs.len()),
            Vec::with_capacity(segs.len()),
        );
        for (seg, &c) in segs.into_iter().zip(&counts) {
            let (a, b) = seg.split(c);
            ls.push(a);
            rs.push(b);
        }
        let (left, right) = node.halves();
        rayon::join(
            || self.node_par(left, &l, wl, ls),
            || self.node_par(right, &r, wr, rs),
        );
    }
}

/// A uniform random subset of size `k` of the `n` set bits of `set`, written to `out`
/// (`0 < k < n`).
///
/// Drawn in the compact positions `[0, n)`, then deposited on the set's bits. Instead of `k`
/// (or `n - k`) sequential draws, each position first gets an independent random bit with
/// probability `e/8` close to `k/n` (whole words at a time: `e/8` from and/or of three random
/// words), and then the count is corrected: `x - k` of the `x` chosen positions are dropped,
/// or `k - x` of the others added, chosen uniformly by Floyd's algorithm. Independent bits are
/// exchangeable and so are the corrections, so every `k`-subset is equally likely; the
/// corrections are about `sqrt(n)/2 + n/16` draws instead of `n/2`.
fn subset(rng: &mut CellRng, set: &[u64], n: u64, k: u64, out: &mut [u64]) {
    let words = n.div_ceil(64) as usize;
    let eighths = ((8 * k + n / 2) / n).clamp(1, 7);
    let mut compact = [0u64; WORDS];
    for w in &mut compact[..words] {
        *w = bernoulli_eighths(rng, eighths);
    }
    if !n.is_multiple_of(64) {
        compact[words - 1] &= (1 << (n % 64)) - 1;
    }
    let x: u64 = compact[..words]
        .iter()
        .map(|w| u64::from(w.count_ones()))
        .sum();
    if x != k {
        // The positions to flip: x - k of the ones, or k - x of the zeros.
        let mut pool = [0u64; WORDS];
        let flips = if x > k {
            pool[..words].copy_from_slice(&compact[..words]);
            x - k
        } else {
            for (p, &c) in pool[..words].iter_mut().zip(&compact[..words]) {
                *p = !c;
            }
            if !n.is_multiple_of(64) {
                pool[words - 1] &= (1 << (n % 64)) - 1;
            }
            k - x
        };
        let size = if x > k { x } else { n - x };
        let mut pick = [0u64; WORDS];
        floyd(rng, size, flips, &mut pick);
        let mut flip = [0u64; WORDS];
        deposit_words(&pick, &pool[..words], &mut flip[..words]);
        for (c, f) in compact[..words].iter_mut().zip(&flip[..words]) {
            *c ^= f;
        }
    }
    deposit_words(&compact, set, out);
}

/// A word of independent bits, each 1 with probability `e/8` (`1 <= e <= 7`).
#[inline(always)]
fn bernoulli_eighths(rng: &mut CellRng, e: u64) -> u64 {
    let a = rng.next_u64();
    match e {
        4 => a,
        2 => a & rng.next_u64(),
        6 => a | rng.next_u64(),
        _ => {
            let (b, c) = (rng.next_u64(), rng.next_u64());
            match e {
                1 => a & b & c,
                3 => a & (b | c),
                5 => a | (b & c),
                _ => a | b | c,
            }
        }
    }
}

/// A uniform random `k`-subset of `[0, n)` as bits (`k <= n <= MAX_LEAF`), by Floyd's
/// algorithm, drawing the smaller of the subset and its complement.
fn floyd(rng: &mut CellRng, n: u64, k: u64, out: &mut [u64; WORDS]) {
    let (want, complement) = if 2 * k > n { (n - k, true) } else { (k, false) };
    let mut add = |j: u64, t: u64| {
        let pick = if out[(t / 64) as usize] >> (t % 64) & 1 == 1 {
            j
        } else {
            t
        };
        out[(pick / 64) as usize] |= 1 << (pick % 64);
    };
    // Two steps per 64-bit word: bounds are at most MAX_LEAF, far below 2**32.
    let mut j = n - want;
    while j + 1 < n {
        let (t1, t2) = rng.below_pair(j as u32 + 1, j as u32 + 2);
        add(j, u64::from(t1));
        add(j + 1, u64::from(t2));
        j += 2;
    }
    if j < n {
        add(j, rng.below(j + 1));
    }
    if complement {
        let full = (n / 64) as usize;
        for w in &mut out[..full] {
            *w = !*w;
        }
        if !n.is_multiple_of(64) {
            out[full] = !out[full] & ((1 << (n % 64)) - 1);
        }
    }
}

/// The `i`-th bit of `compact` goes to the `i`-th set bit of `set`.
fn deposit_words(compact: &[u64], set: &[u64], out: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("bmi2") {
            // SAFETY: the processor supports BMI2, checked just above.
            return unsafe { deposit_words_bmi2(compact, set, out) };
        }
    }
    let mut taken = 0u64;
    for (o, &word) in out.iter_mut().zip(set) {
        let p = u64::from(word.count_ones());
        *o = if p == 0 {
            0
        } else {
            deposit_portable(extract(compact, taken, p), word)
        };
        taken += p;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn deposit_words_bmi2(compact: &[u64], set: &[u64], out: &mut [u64]) {
    let mut taken = 0u64;
    for (o, &word) in out.iter_mut().zip(set) {
        let p = u64::from(word.count_ones());
        *o = if p == 0 {
            0
        } else {
            std::arch::x86_64::_pdep_u64(extract(compact, taken, p), word)
        };
        taken += p;
    }
}

/// `len <= 64` bits of `words` from bit `from` on, as the low bits of a word.
#[inline(always)]
fn extract(words: &[u64], from: u64, len: u64) -> u64 {
    let (k, s) = ((from / 64) as usize, from % 64);
    let mut v = words[k] >> s;
    if s != 0 && k + 1 < words.len() {
        v |= words[k + 1] << (64 - s);
    }
    if len < 64 {
        v & ((1 << len) - 1)
    } else {
        v
    }
}

/// Moves bit `i` of `compact` to the position of the `i`-th set bit of `mask` (x86's `pdep`;
/// the hardware instruction is used when the processor has it, with the same result).
#[cfg(test)]
fn deposit(compact: u64, mask: u64) -> u64 {
    let mut out = [0u64];
    deposit_words(&[compact], &[mask], &mut out);
    out[0]
}

fn deposit_portable(compact: u64, mask: u64) -> u64 {
    let (mut out, mut m, mut c) = (0u64, mask, compact);
    while m != 0 {
        let low = m & m.wrapping_neg();
        if c & 1 == 1 {
            out |= low;
        }
        c >>= 1;
        m ^= low;
    }
    out
}

/// The values of classes `[c0, c1)` of the partition of `[0, n)` keyed by `base`, class by
/// class, each class in increasing order; and the offsets of the classes in the buffer
/// (`c1 - c0 + 1` of them). `classes.prefix(classes.count())` must equal `n`, and `c0 < c1 <=
/// classes.count()`. (The share feeds sinks through [`class_values_into`]; this is the
/// reference the tests compare them with.)
#[cfg(test)]
pub(crate) fn class_values<T: Index, C: Classes>(
    n: u64,
    classes: &C,
    c0: u64,
    c1: u64,
    base: u64,
) -> crate::error::Result<(Vec<T>, Vec<u64>)> {
    let offsets = class_offsets(classes, c0, c1);
    let total = *offsets.last().expect("at least one class");
    let mut out = crate::index::try_with_capacity::<T>("a class's indices", total)?;
    out.resize(total as usize, T::from_u64(0));
    let mut segs = Vec::with_capacity((c1 - c0) as usize);
    let mut rest: &mut [T] = &mut out;
    for w in offsets.windows(2) {
        let (a, b) = std::mem::take(&mut rest).split_at_mut((w[1] - w[0]) as usize);
        segs.push(Run::new(a));
        rest = b;
    }
    class_values_into(n, classes, c0, c1, base, segs);
    Ok((out, offsets))
}

/// Where classes `[c0, c1)` start, from `c0`'s start, and where the last ends.
pub(crate) fn class_offsets<C: Classes>(classes: &C, c0: u64, c1: u64) -> Vec<u64> {
    assert!(
        c0 < c1 && c1 <= classes.count(),
        "wanted classes out of range"
    );
    (c0..=c1)
        .map(|x| classes.prefix(x) - classes.prefix(c0))
        .collect()
}

/// `class_values` into given sinks, one per class of `[c0, c1)`, each fed its class's values
/// in increasing order.
pub(crate) fn class_values_into<C: Classes, S: Sink>(
    n: u64,
    classes: &C,
    c0: u64,
    c1: u64,
    base: u64,
    sinks: Vec<S>,
) {
    assert_eq!(
        classes.prefix(classes.count()),
        n,
        "class sizes must add up to n"
    );
    assert!(
        c0 < c1 && c1 <= classes.count() && sinks.len() as u64 == c1 - c0,
        "wanted classes out of range"
    );
    let total = classes.prefix(c1) - classes.prefix(c0);
    if total == 0 {
        return;
    }
    let leaf = classes.leaf();
    assert!(leaf.is_power_of_two() && (64..=MAX_PERMUTED_LEAF).contains(&leaf));
    let engine = Engine {
        classes,
        leaf,
        c0,
        c1,
        base,
    };
    let mut root = Vec::new();
    engine.root(0, classes.count(), &mut root);
    engine.node_par(Node { lo: 0, hi: n }, &root, total, sinks);
}

/// The bit set of all `len <= MAX_LEAF` values of a leaf.
fn full_set(len: u64) -> [u64; WORDS] {
    let mut full = [0u64; WORDS];
    let words = len.div_ceil(64) as usize;
    full[..words].fill(u64::MAX);
    if !len.is_multiple_of(64) {
        full[words - 1] = (1u64 << (len % 64)) - 1;
    }
    full
}

/// The values of class `class` of the partition of `[0, n)` keyed by `base` with the given
/// ranks among the class's values (in increasing order; ranks need not be sorted, each must be
/// below the class's size): random access into `class_values` without computing the class.
/// The cost is a walk down the value tree along the paths that hold the wanted ranks.
pub(crate) fn class_select<C: Classes>(
    n: u64,
    classes: &C,
    class: u64,
    ranks: &[u64],
    base: u64,
) -> Vec<u64> {
    assert_eq!(
        classes.prefix(classes.count()),
        n,
        "class sizes must add up to n"
    );
    assert!(class < classes.count(), "class out of range");
    let size = classes.prefix(class + 1) - classes.prefix(class);
    assert!(ranks.iter().all(|&r| r < size), "rank out of range");
    let mut out = vec![0u64; ranks.len()];
    if ranks.is_empty() {
        return out;
    }
    let leaf = classes.leaf();
    assert!(leaf.is_power_of_two() && (64..=MAX_PERMUTED_LEAF).contains(&leaf));
    let engine = Engine {
        classes,
        leaf,
        c0: class,
        c1: class + 1,
        base,
    };
    let mut root = Vec::new();
    engine.root(0, classes.count(), &mut root);
    let mut sorted: Vec<(u64, usize)> = ranks.iter().copied().zip(0..).collect();
    sorted.sort_unstable();
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let values = Node { lo: 0, hi: n };
        engine.select_node(values, &root, &sorted, 0, &mut out, &mut scratch);
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{chi2_flat, orders_chi2};

    /// Classes of explicit sizes, with value leaves of the given size.
    struct Sizes(Vec<u64>, u64);
    impl Classes for Sizes {
        fn count(&self) -> u64 {
            self.0.len() as u64
        }
        fn prefix(&self, x: u64) -> u64 {
            self.0[..x as usize].iter().sum()
        }
        fn leaf(&self) -> u64 {
            self.1
        }
    }

    fn all_classes(sizes: &[u64], base: u64) -> Vec<Vec<u64>> {
        let c = Sizes(sizes.to_vec(), 64);
        let n = sizes.iter().sum();
        (0..sizes.len() as u64)
            .map(|x| class_values::<u64, _>(n, &c, x, x + 1, base).unwrap().0)
            .collect()
    }

    #[test]
    fn select_reads_ranks_of_the_class() {
        // Random access equals indexing the whole class: every rank of small classes, spread
        // and unsorted ranks of large ones, with the smallest and the largest leaves.
        for leaf in [64, MAX_LEAF, 1 << 14] {
            let sizes = vec![3u64, 0, 70_000, 1, 250_013, 4_096, 90_001];
            let c = Sizes(sizes.clone(), leaf);
            let n: u64 = sizes.iter().sum();
            for x in 0..sizes.len() as u64 {
                let whole = class_values::<u64, _>(n, &c, x, x + 1, 77).unwrap().0;
                let size = whole.len() as u64;
                let ranks: Vec<u64> = if size <= 4_096 {
                    (0..size).rev().collect()
                } else {
                    (0..500u64)
                        .map(|i| (i * 2_654_435_761) % size)
                        .chain([0, size - 1])
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .rev()
                        .collect()
                };
                let got = class_select(n, &c, x, &ranks, 77);
                let want: Vec<u64> = ranks.iter().map(|&r| whole[r as usize]).collect();
                assert_eq!(got, want, "leaf={leaf} class={x}");
            }
        }
    }

    #[test]
    fn classes_computed_separately_partition_the_values() {
        for sizes in [
            vec![1u64],
            vec![0, 5, 0],
            vec![3, 4, 5],
            vec![64, 64],
            vec![65, 1, 100],
            vec![1000, 1, 1, 7, 300, 0, 4096],
            vec![13; 17],
            vec![9999, 10001],
        ] {
            for base in 0..4 {
                let parts = all_classes(&sizes, base);
                let mut seen: Vec<u64> = parts.iter().flatten().copied().collect();
                for (p, &s) in parts.iter().zip(&sizes) {
                    assert_eq!(p.len() as u64, s);
                    assert!(p.windows(2).all(|w| w[0] < w[1]), "class not increasing");
                }
                seen.sort_unstable();
                let n: u64 = sizes.iter().sum();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{sizes:?}");
            }
        }
    }

    #[test]
    fn a_range_of_classes_equals_the_classes_one_by_one() {
        let sizes = vec![100, 250, 3, 0, 4000, 17];
        let n = sizes.iter().sum();
        let c = Sizes(sizes.clone(), 64);
        let single = all_classes(&sizes, 9);
        let (joint, offs) = class_values::<u64, _>(n, &c, 1, 5, 9).unwrap();
        for x in 1..5 {
            let seg = &joint[offs[x - 1] as usize..offs[x] as usize];
            assert_eq!(seg, &single[x][..]);
        }
    }

    #[test]
    fn parallel_split_gives_the_same_values_for_any_thread_count() {
        // Above PAR_GRAIN so the rayon path is taken.
        let sizes = vec![(1 << 22) + 3, 1 << 21, 12345, (1 << 22) - 7];
        let n: u64 = sizes.iter().sum();
        let c = Sizes(sizes, 64);
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| class_values::<u32, _>(n, &c, 1, 3, 5).unwrap())
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(5));
    }

    #[test]
    fn value_to_class_table_is_flat() {
        // Value v lands in class x with probability size(x) / n, for every v.
        let sizes = [5u64, 3, 8];
        let n = 16usize;
        let trials = 6000;
        let mut table = vec![[0u64; 3]; n];
        for base in 0..trials {
            for (x, p) in all_classes(&sizes, base).iter().enumerate() {
                for &v in p {
                    table[v as usize][x] += 1;
                }
            }
        }
        let mut chi = 0.0;
        for row in &table {
            for (x, &c) in row.iter().enumerate() {
                let e = trials as f64 * sizes[x] as f64 / n as f64;
                chi += (c as f64 - e).powi(2) / e;
            }
        }
        // 16 * 2 = 32 degrees of freedom; 99.9% quantile ~ 62.
        assert!(chi < 62.0, "chi2 {chi}");
    }

    #[test]
    fn every_partition_of_a_small_set_is_equally_likely() {
        // n = 6 into sizes [2, 1, 3]: 6! / (2! 1! 3!) = 60 partitions.
        let sizes = [2u64, 1, 3];
        let (partitions, chi) = orders_chi2(60, 30_000, |base| all_classes(&sizes, base));
        assert_eq!(partitions, 60);
        // 59 dof; 99.9% quantile ~ 99.6.
        assert!(chi < 99.6, "chi2 {chi}");
    }

    #[test]
    fn every_subset_is_equally_likely() {
        // All C(12, 5) = 792 subsets of 5 of 12 positions (near 1/2: bits of probability 3/8
        // and corrections), and all C(10, 1) and C(10, 9) (probability 1/8 and 7/8).
        for (n, k, trials) in [(12u64, 5u64, 79_200u64), (10, 1, 10_000), (10, 9, 10_000)] {
            let set = [(1u64 << n) - 1];
            let mut counts = std::collections::HashMap::new();
            for i in 0..trials {
                let mut out = [0u64];
                subset(&mut CellRng::new(i), &set, n, k, &mut out);
                assert_eq!(u64::from(out[0].count_ones()), k);
                *counts.entry(out[0]).or_insert(0u64) += 1;
            }
            let cells = counts.len() as f64;
            let e = trials as f64 / cells;
            let chi = chi2_flat(counts.values(), e);
            let bound = cells + 3.1 * (2.0 * cells).sqrt() + 10.0;
            assert!(chi < bound, "n={n} k={k}: chi2 {chi} over {cells} subsets");
        }
    }

    #[test]
    fn deposit_is_pdep() {
        assert_eq!(deposit(0b101, 0b1101_0010), 0b0100_0010);
        assert_eq!(deposit(u64::MAX, 0xf0f0), 0xf0f0);
        assert_eq!(deposit(0, u64::MAX), 0);
        let mut rng = CellRng::new(8);
        for _ in 0..10_000 {
            let (c, m) = (rng.next_u64(), rng.next_u64() & rng.next_u64());
            assert_eq!(deposit(c, m), deposit_portable(c, m));
        }
    }

    #[test]
    fn subset_has_the_requested_size_inside_the_set() {
        let mut rng = CellRng::new(1);
        let sets: [&[u64]; 3] = [&[u64::MAX], &[0xf0f0_0001, 0, u64::MAX, 7], &[u64::MAX; 16]];
        for set in sets {
            let n: u64 = set.iter().map(|w| u64::from(w.count_ones())).sum();
            for k in [1, 2, n / 2, n / 2 + 1, n - 1] {
                let mut out = vec![0u64; set.len()];
                subset(&mut rng, set, n, k, &mut out);
                let got: u64 = out.iter().map(|w| u64::from(w.count_ones())).sum();
                assert_eq!(got, k);
                assert!(out.iter().zip(set).all(|(o, s)| o & !s == 0));
            }
        }
    }

    #[test]
    fn big_leaves_partition_and_are_uniform() {
        for sizes in [vec![5000u64, 3, 7000, 1], vec![4096, 4096], vec![1, 10_000]] {
            let n: u64 = sizes.iter().sum();
            let c = Sizes(sizes.clone(), MAX_LEAF);
            let (all, offs) = class_values::<u64, _>(n, &c, 0, sizes.len() as u64, 4).unwrap();
            let mut sorted = all.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            for (x, w) in offs.windows(2).enumerate() {
                assert_eq!(w[1] - w[0], sizes[x]);
            }
        }
        // Flat value-to-class table inside one leaf: n = 100, classes [30, 70].
        let c = Sizes(vec![30, 70], MAX_LEAF);
        let mut hits = [0u64; 100];
        let trials = 4000;
        for base in 0..trials {
            for v in class_values::<u64, _>(100, &c, 0, 1, base).unwrap().0 {
                hits[v as usize] += 1;
            }
        }
        let e = trials as f64 * 0.3;
        let chi: f64 = hits
            .iter()
            .map(|&h| (h as f64 - e).powi(2) / (e * 0.7))
            .sum();
        assert!(chi < 148.2, "chi2 {chi}"); // 99 dof, p = 0.001
    }

    #[test]
    fn permuted_leaves_partition_and_are_uniform() {
        // Leaves above MAX_LEAF: every value once, classes of the right sizes, a class range
        // equal to its classes one by one, the same for any thread count.
        for leaf in [2048u64, 1 << 14, MAX_PERMUTED_LEAF] {
            for sizes in [
                vec![5000u64, 3, 7000, 1],
                vec![1u64; 300],
                vec![70_000, 0, 1, 250_013, 90_001],
                vec![(1 << 21) + 5, 1 << 20, 3],
            ] {
                let n: u64 = sizes.iter().sum();
                let c = Sizes(sizes.clone(), leaf);
                let k = sizes.len() as u64;
                let (all, offs) = class_values::<u64, _>(n, &c, 0, k, 4).unwrap();
                let mut sorted = all.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "leaf {leaf}");
                for (x, w) in offs.windows(2).enumerate() {
                    assert_eq!(w[1] - w[0], sizes[x]);
                    let one = class_values::<u64, _>(n, &c, x as u64, x as u64 + 1, 4)
                        .unwrap()
                        .0;
                    assert_eq!(one[..], all[w[0] as usize..w[1] as usize]);
                }
            }
        }
        // Flat value-to-class table: n = 3000 in one permuted leaf, classes [900, 2100];
        // values in 30 ranges of 100.
        let c = Sizes(vec![900, 2100], 4096);
        let mut hits = [0u64; 30];
        let trials = 3000;
        for base in 0..trials {
            for v in class_values::<u64, _>(3000, &c, 0, 1, base).unwrap().0 {
                hits[(v / 100) as usize] += 1;
            }
        }
        let e = trials as f64 * 30.0;
        let chi: f64 = hits.iter().map(|&h| (h as f64 - e).powi(2) / e).sum();
        assert!(chi < 58.3, "chi2 {chi}"); // 29 dof, p = 0.001
                                           // Across leaves: n = 40,000 in leaves of 2048, class 0 of 4,000 values: each of 40
                                           // value ranges of 1,000 holds a tenth of the class on average.
        let c = Sizes(vec![4_000, 36_000], 2048);
        let mut hits = [0u64; 40];
        let trials = 300;
        for base in 0..trials {
            for v in class_values::<u64, _>(40_000, &c, 0, 1, base).unwrap().0 {
                hits[(v / 1000) as usize] += 1;
            }
        }
        let e = trials as f64 * 100.0;
        let chi: f64 = hits
            .iter()
            .map(|&h| (h as f64 - e).powi(2) / (e * 0.9))
            .sum();
        assert!(chi < 73.4, "chi2 {chi}"); // 39 dof, p = 0.001
    }
}

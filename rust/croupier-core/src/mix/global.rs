//! A mixture's world-size-invariant order (`order="global"`): one global sequence per epoch,
//! the same whatever the number of ranks, dealt with torch's striding; each rank computes
//! only its own positions, by random access.
//!
//! # The sequence
//!
//! The epoch has `T` global positions, cut into phases at global starts; phase `φ` holds
//! dataset `d` exactly `c_{d,φ}` times over its nominal length (`mix::counts`). Which dataset
//! each position draws comes from the phase's interleave:
//!
//! - **uniform** (shuffled): the hypergeometric tree of `mix::interleave` gives every leaf
//!   of `B` positions its exact counts ([`Interleave::global`], keyed by the epoch and the
//!   phase, not by a rank); inside a leaf, position `i` holds slot `π(i)` of the leaf's
//!   multiset laid out in dataset order, `π` a keyed [`RandomAccessPermutation`] of the leaf
//!   ([`Interleave::leaf_perm`]). Slot `s` of dataset `d`'s run is its occurrence
//!   `before_d + s - start_d`, where `before_d` counts `d` in the earlier leaves and phases.
//!   So occurrences follow time from leaf to leaf and are in a random order inside a leaf.
//!   A phase cut inside a leaf by the next one (a schedule, or weights changed at a resume)
//!   keeps that order for the leaf's positions before the cut, so a cut never changes what
//!   comes before it; the leaf's occurrences no position before the cut holds are the next
//!   phase's first draws of their datasets ([`StreamAt`]), so nothing is lost or repeated.
//! - **balanced**: the quota sequence of [`crate::mix::balanced`] (every prefix within one
//!   sample of its share), occurrences in time order.
//! - without shuffling (uniform): the phase's datasets one after another, in dataset order.
//!
//! Occurrence `j` of dataset `d` in the epoch reads `d`'s stream: pass `j / n_d`, position
//! `j % n_d` of it, each pass a keyed [`RandomAccessPermutation`] of the dataset
//! (`(seed, epoch, d, pass)`; without shuffling the identity), plus the dataset's offset.
//! Every pass is a whole permutation, and the passes follow one another (exactly, in the
//! balanced interleave; leaf by leaf, in the uniform one, where a pass boundary inside a leaf
//! mixes the two passes' samples within that leaf's positions).
//!
//! # A rank's positions
//!
//! Rank `r` of `W` takes global positions `offset + (r + k W) % len` (torch's striding and
//! padding over `[offset, offset + len)`: a fresh epoch is `(0, T)`, an elastic rest starts
//! at the consumed offset). They are cut into units of whole leaves holding about
//! [`UNIT`] of them, computed in parallel: one walk of the phase's tree for the unit's leaves,
//! then per leaf the permutation at the rank's strided positions (16 at a time, as
//! [`RandomAccessPermutation::fill_strided`] does), a table lookup of the slot's dataset, and
//! the pass's permutation at the occurrence. Nothing depends on the number of threads.

use rayon::prelude::*;

use crate::cancel::cancelled;
use crate::draw::random_access::{AtMany, RandomAccessPermutation};
use crate::error::Result;
use crate::index::{index_bytes, try_with_capacity_huge, zeros_par, Index};
use crate::mix::balanced::Balanced;
use crate::mix::interleave::{global_leaf_size, leaf_size, Counts, Interleave};
use crate::stream::{fold, Purpose, Stream};

/// A rank's positions per parallel unit (at least one leaf).
const UNIT: u64 = 1 << 16;

/// How the datasets of a mixture phase are interleaved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interleaving {
    /// A uniformly random sequence with the phase's exact counts (datasets one after another
    /// without shuffling).
    #[default]
    Uniform,
    /// Every prefix of the phase holds each dataset within one sample of its share
    /// (`crate::mix::balanced`); deterministic.
    Balanced,
}

/// One phase of the global sequence: global positions `[start, end)`, its nominal counts.
#[derive(Debug, Clone)]
pub(crate) struct GlobalPhase {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) counts: Vec<u64>,
    balanced: Option<Balanced>,
}

impl GlobalPhase {
    pub(crate) fn new(start: u64, end: u64, counts: Vec<u64>, interleave: Interleaving) -> Self {
        let balanced = (interleave == Interleaving::Balanced).then(|| {
            let nonzero = counts.iter().filter(|&&c| c > 0).count();
            Balanced::new(&counts, leaf_size(nonzero))
        });
        GlobalPhase {
            start,
            end,
            counts,
            balanced,
        }
    }

    fn leaf(&self) -> u64 {
        match &self.balanced {
            Some(b) => b.leaf(),
            None => global_leaf_size(self.counts.iter().filter(|&&c| c > 0).count()),
        }
    }
}

/// The global sequence of a mixture's epochs.
#[derive(Debug, Clone)]
pub(crate) struct Global {
    pub(crate) sizes: Vec<u64>,
    pub(crate) offsets: Vec<u64>,
    pub(crate) phases: Vec<GlobalPhase>,
    pub(crate) shuffle: bool,
    /// Whether the passes are permuted (`shuffle` and the config's `permute_samples`).
    pub(crate) permute: bool,
    pub(crate) seed: u64,
}

/// Where every dataset's stream stands at the start of a phase: the occurrences an earlier
/// phase left unread (`holes`, increasing), then every occurrence from `next` on.
///
/// The phase's draws of dataset `d` are counted from 0 ("virtual" occurrences): draw `v` reads
/// occurrence `holes[d][v]` while there are holes, then `next[d] + v - holes[d].len()`. Holes
/// come from a uniform shuffled phase cut inside a leaf by the next phase: the leaf's
/// positions before the cut keep the occurrences they hold in the uncut phase (slot order, so
/// a resume that changes the weights there never changes what was already yielded), and the
/// occurrences of the leaf that no position before the cut read are the next phase's first.
/// All holes are below `next`, so draws read occurrences in increasing order.
#[derive(Debug, Clone)]
pub(crate) struct StreamAt {
    next: Vec<u64>,
    holes: Vec<Vec<u64>>,
}

impl StreamAt {
    fn start(datasets: usize) -> Self {
        StreamAt {
            next: vec![0; datasets],
            holes: vec![Vec::new(); datasets],
        }
    }

    /// The occurrence of dataset `d` its phase's draw `v` reads.
    #[inline]
    fn occurrence(&self, d: usize, v: u64) -> u64 {
        let h = &self.holes[d];
        if v < h.len() as u64 {
            h[v as usize]
        } else {
            self.next[d] + (v - h.len() as u64)
        }
    }

    /// Whether dataset `d`'s draws `[v, v + c)` read more than one pass of its `n` samples.
    #[inline]
    fn crosses_pass(&self, d: usize, v: u64, c: u64, n: u64) -> bool {
        c > 0 && self.occurrence(d, v) / n != self.occurrence(d, v + c - 1) / n
    }
}

/// A rank's positions `g0, g0 + step, …` (`count` of them) inside leaves `[l0, l1)` of one
/// phase, written at `at` in the output.
#[derive(Debug, Clone, Copy)]
struct Unit {
    phase: usize,
    leaves: (u64, u64),
    g0: u64,
    count: u64,
}

/// Where a unit starts: every dataset's draws in its phase before its first leaf (virtual
/// occurrences, see [`StreamAt`]), and (uniform, shuffled) the counts of its leaves.
#[derive(Clone, Copy)]
struct UnitInput<'a> {
    before: &'a [u64],
    leaves: &'a [Counts],
    /// Per leaf of `leaves`: the time order of the occurrences that need it.
    timed: &'a [Timed],
}

/// Leaves of a phase held at a time by a uniform shuffled fill (their counts, starting draws
/// and time orders); a unit spans at most this many.
const WINDOW_LEAVES: u64 = 4;

/// Where a leaf's occurrences of a dataset are put in time order (see [`Global::timed`]).
enum Timed {
    /// No dataset needs it: slot order everywhere.
    Nothing,
    /// Per entry of the leaf's counts, the sorted positions of its slots (`None`: slot order).
    Sorted(Vec<Option<Vec<u64>>>),
    /// For the rank's positions of the leaf (`first`, `first + step`, …), read on the way by
    /// the ranking: each one's entry (low 32 bits) and its occurrence among its entry's in
    /// the leaf (high 32 bits: its rank in time for a marked entry, its slot's place in the
    /// entry's run for the others). Leaves of fewer than `2**32` slots.
    Ranks {
        first: u64,
        step: u64,
        ranked: Vec<u64>,
    },
}

/// Draws a unit writes at a time: a piece's draws, their passes' positions and values stay
/// in cache, and the call looks at its cancellation between pieces. (Smaller in the tests,
/// whose units are small: their units then go in several pieces too.)
const WRITE_STEP: usize = if cfg!(test) { 1 << 9 } else { 1 << 14 };

/// A worker's buffers for the units it fills, kept by its thread from unit to unit and, on
/// a thread that outlives the call (the bindings' process pool serves the short calls), from
/// call to call: fresh buffers of a few hundred kilobytes at every unit cost their page
/// faults. They stay with the thread: about 1-3 MiB, the most its largest unit needed (a
/// piece of [`WRITE_STEP`] draws; a whole unit's in the balanced and unshuffled orders).
#[derive(Default)]
struct Scratch {
    reads: ReadScratch,
    /// A piece's draws (dataset, draw).
    dj: Vec<(u32, u64)>,
    /// A piece's slots of its leaf.
    slots: Vec<u64>,
}

/// The buffers of [`Passes::write`]'s batched reads.
#[derive(Default)]
struct ReadScratch {
    which: Vec<u32>,
    pos: Vec<u64>,
    vals: Vec<u64>,
    many: AtMany,
}

thread_local! {
    /// This thread's [`Scratch`].
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// `f` with this thread's [`Scratch`] (a fresh one where it is already in use: a thread
/// that waits inside a unit may run another unit meanwhile).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// The permutations of the passes a unit reads, built when first met, and the scratch of
/// the batched reads.
struct Passes<'a, 's> {
    global: &'a Global,
    epoch: u64,
    /// Where the phase's streams start.
    at: &'a StreamAt,
    /// Every permutation built, with its dataset's offset.
    arena: Vec<RandomAccessPermutation>,
    arena_offset: Vec<u64>,
    /// Per dataset: the unit's first pass, and the arena place of each pass from it on
    /// (`u32::MAX`: not built yet). A leaf reads its datasets' passes in any order (an
    /// oversampled dataset alternates between two), so every pass met stays at hand.
    first_pass: Vec<u64>,
    by_pass: Vec<Vec<u32>>,
    /// Per dataset: the occurrences `[start, end)` of the pass read last, and its arena place
    /// (a leaf's draws of a dataset mostly read one pass: no division for them).
    last: Vec<(u64, u64, u32)>,
    reads: &'s mut ReadScratch,
}

impl<'a, 's> Passes<'a, 's> {
    /// The passes of a unit of a phase whose streams start at `at`, the unit's first draws
    /// being `before` (virtual: no occurrence it reads is earlier), read with `reads`.
    fn new(
        global: &'a Global,
        epoch: u64,
        (at, before): (&'a StreamAt, &[u64]),
        reads: &'s mut ReadScratch,
    ) -> Self {
        let first_pass = before
            .iter()
            .zip(&global.sizes)
            .enumerate()
            .map(|(d, (&b, &n))| at.occurrence(d, b).checked_div(n).unwrap_or(0))
            .collect();
        Passes {
            global,
            epoch,
            at,
            arena: Vec::new(),
            arena_offset: Vec::new(),
            first_pass,
            by_pass: vec![Vec::new(); global.sizes.len()],
            last: vec![(1, 0, 0); global.sizes.len()], // an empty range: none read yet
            reads,
        }
    }

    /// The arena place of the permutation of dataset `d`'s pass `pass`.
    #[inline]
    fn permutation(&mut self, d: u32, pass: u64) -> u32 {
        let i = d as usize;
        let k = (pass - self.first_pass[i]) as usize;
        if let Some(&at) = self.by_pass[i].get(k) {
            if at != u32::MAX {
                return at;
            }
        }
        let g = self.global;
        self.arena
            .push(pass_permutation(g.seed, self.epoch, i, pass, g.sizes[i]));
        self.arena_offset.push(g.offsets[i]);
        let at = (self.arena.len() - 1) as u32;
        let slots = &mut self.by_pass[i];
        if slots.len() <= k {
            slots.resize(k + 1, u32::MAX);
        }
        slots[k] = at;
        at
    }

    /// [`Passes::write`] a piece of [`WRITE_STEP`] draws at a time, stopping early once the
    /// call is cancelled (a draw of an oversampled dataset often builds its pass's
    /// permutation: a unit can take a tenth of a second).
    fn write_all<T: Index>(&mut self, dv: &[(u32, u64)], out: &mut [T]) {
        for (dv, out) in dv.chunks(WRITE_STEP).zip(out.chunks_mut(WRITE_STEP)) {
            if cancelled() {
                return;
            }
            self.write(dv, out);
        }
    }

    /// The phase's draw `v` of dataset `d` (the occurrence [`StreamAt::occurrence`] says),
    /// for each `(d, v)` of `dv`, as global indices into `out`.
    fn write<T: Index>(&mut self, dv: &[(u32, u64)], out: &mut [T]) {
        let g = self.global;
        let at = self.at;
        if !g.permute {
            for (o, &(d, v)) in out.iter_mut().zip(dv) {
                let d = d as usize;
                *o = T::from_u64(g.offsets[d] + at.occurrence(d, v) % g.sizes[d]);
            }
            return;
        }
        let (mut which, mut pos, mut vals) = (
            std::mem::take(&mut self.reads.which),
            std::mem::take(&mut self.reads.pos),
            std::mem::take(&mut self.reads.vals),
        );
        which.clear();
        pos.clear();
        for &(d, v) in dv {
            let n = g.sizes[d as usize];
            let j = at.occurrence(d as usize, v);
            let (start, end, a) = self.last[d as usize];
            if start <= j && j < end {
                which.push(a);
                pos.push(j - start);
            } else {
                let pass = j / n;
                let a = self.permutation(d, pass);
                self.last[d as usize] = (pass * n, pass * n + n, a);
                which.push(a);
                pos.push(j % n);
            }
        }
        vals.clear();
        vals.resize(dv.len(), 0);
        self.reads.many.read(&self.arena, &which, &pos, &mut vals);
        for ((o, &v), &a) in out.iter_mut().zip(&vals).zip(&which) {
            *o = T::from_u64(self.arena_offset[a as usize] + v);
        }
        (self.reads.which, self.reads.pos, self.reads.vals) = (which, pos, vals);
    }
}

/// The permutation of pass `pass` of dataset `d` (of `n` samples) in `epoch`.
fn pass_permutation(seed: u64, epoch: u64, d: usize, pass: u64, n: u64) -> RandomAccessPermutation {
    let key = fold(fold(0, d as u64), pass);
    RandomAccessPermutation::from_stream(n, Stream::new(seed, epoch, Purpose::GlobalMixPass, key))
}

/// The dataset of each slot of a leaf whose multiset is laid out in dataset order.
struct SlotTable<'a> {
    counts: &'a Counts,
    /// `starts[e]`: the first slot of entry `e` of `counts`.
    starts: Vec<u64>,
    /// Cell `i` (slots from `i << shift`): its first slot's entry `e` in the low 32 bits, and
    /// in the high 32 the first slot of entry `e + 1`, inside the cell or past it, or
    /// [`MANY`] for a cell of more than two entries (where a lookup walks). Few enough cells
    /// (16 a entry, at most 2**11: 16 KiB) to stay in the L1 cache. Empty for a leaf of
    /// `u32::MAX` slots or more, where a lookup is a binary search.
    cells: Vec<u64>,
    shift: u32,
}

/// A cell of a [`SlotTable`] whose slots fall in more than two entries.
const MANY: u64 = u32::MAX as u64;

impl<'a> SlotTable<'a> {
    fn new(counts: &'a Counts, len: u64) -> Self {
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut run = 0u64;
        for &(_, c) in counts {
            starts.push(run);
            run += c;
        }
        starts.push(run);
        let bits = 64 - len.saturating_sub(1).leading_zeros();
        let cells = (16 * counts.len() as u64)
            .next_power_of_two()
            .clamp(1, 1 << 11)
            .min(1 << bits);
        let shift = bits - cells.trailing_zeros();
        let mut table = Vec::new();
        if run.max(len) < MANY && !counts.is_empty() {
            table.reserve_exact(cells as usize);
            // The entry holding `slot`, walking on from entry `e`.
            let walk = |mut e: usize, slot: u64| {
                while e + 1 < counts.len() && starts[e + 1] <= slot {
                    e += 1;
                }
                e
            };
            let mut e = 0usize;
            for i in 0..cells {
                e = walk(e, i << shift);
                let last = walk(e, ((i + 1) << shift).min(run.max(1)) - 1);
                let next = if last <= e + 1 { starts[e + 1] } else { MANY };
                table.push(e as u64 | next << 32);
            }
        }
        SlotTable {
            counts,
            starts,
            cells: table,
            shift,
        }
    }

    /// The entry (of the leaf's counts) holding slot `s`.
    #[inline]
    fn find(&self, s: u64) -> usize {
        let Some(&cell) = self.cells.get((s >> self.shift) as usize) else {
            return self.starts.partition_point(|&x| x <= s) - 1;
        };
        let (mut e, next) = (cell as u32 as usize, cell >> 32);
        if next != MANY {
            return e + usize::from(next <= s);
        }
        while self.starts[e + 1] <= s {
            e += 1;
        }
        e
    }

    /// The dataset of slot `s`.
    #[inline]
    fn dataset(&self, s: u64) -> usize {
        self.counts[self.find(s)].0 as usize
    }
}

/// Positions of a leaf [`rank_in_time`] counts per parallel block.
const RANK_BLOCK: u64 = 1 << 15;
/// Positions of a block [`rank_in_time`] reads at once (their slots and entries stay in L1).
const RANK_CHUNK: usize = 1024;

/// For the positions `first, first + step, …` below `used` of a leaf permuted by `perm`, of
/// fewer than `2**32` slots (slots' entries in `table`): each one's entry (low 32 bits) and its
/// occurrence among its entry's (high 32 bits): for an entry in `marked`, its rank in time
/// (how many positions before it hold a slot of the same entry); for the others, its slot's
/// place in the entry's run. Three steps: per block (in parallel) its counts per entry and
/// the progression's entries and values within it, written to the block's part of the
/// result; then the counts before each block; then (in parallel) each block's marked values
/// raised by them. No buffer of the leaf's size: the slots are read a small block at a time.
fn rank_in_time(
    perm: &RandomAccessPermutation,
    table: &SlotTable<'_>,
    marked: &[bool],
    used: u64,
    (first, step): (u64, u64),
) -> Vec<u64> {
    debug_assert!(perm.len() < 1 << 32);
    // How many of the progression's positions lie below `x`.
    let below = |x: u64| {
        if x <= first {
            0
        } else {
            (x - first - 1) / step + 1
        }
    };
    let blocks = used.div_ceil(RANK_BLOCK);
    let mut ranked = vec![0u64; below(used) as usize];
    let mut parts: Vec<(u64, &mut [u64])> = Vec::with_capacity(blocks as usize);
    let mut rest = &mut ranked[..];
    for b in 0..blocks {
        let z = ((b + 1) * RANK_BLOCK).min(used);
        let (part, tail) = rest.split_at_mut((below(z) - below(b * RANK_BLOCK)) as usize);
        parts.push((b, part));
        rest = tail;
    }
    let mut seen: Vec<Vec<u32>> = parts
        .par_iter_mut()
        .map(|(b, part)| {
            let range = (*b * RANK_BLOCK, ((*b + 1) * RANK_BLOCK).min(used));
            rank_block(perm, table, marked, range, (first, step), part)
        })
        .collect();
    // Each block's counts become the counts before it.
    let mut run = vec![0u32; table.counts.len()];
    for block in &mut seen {
        for (r, x) in run.iter_mut().zip(block.iter_mut()) {
            (*r, *x) = (*r + *x, *r);
        }
    }
    parts
        .into_par_iter()
        .zip(&seen)
        .skip(1) // nothing before the first block
        .for_each(|((_, part), before)| {
            for x in part.iter_mut() {
                let e = *x as u32 as usize;
                if marked[e] {
                    *x += u64::from(before[e]) << 32;
                }
            }
        });
    ranked
}

/// One block `[a, z)` of [`rank_in_time`]: its counts per entry, and each of its positions in
/// the progression written to `mine`, packed as [`rank_in_time`] returns them (for a marked
/// entry, the occurrences of that entry before it in the block). A chunk of slots at a time:
/// each slot's entry counted, the progression's positions noted on the way (no test per
/// position).
fn rank_block(
    perm: &RandomAccessPermutation,
    table: &SlotTable<'_>,
    marked: &[bool],
    (a, z): (u64, u64),
    (first, step): (u64, u64),
    mine: &mut [u64],
) -> Vec<u32> {
    let len = perm.len();
    let mut seen = vec![0u32; table.counts.len()];
    // The progression's first position at or after `a`.
    let mut next = if a <= first {
        first
    } else {
        first + (a - first).div_ceil(step) * step
    };
    let mut slots = [0u32; RANK_CHUNK];
    let entries = seen.len();
    let mut noted = 0;
    let mut i = a;
    while i < z {
        if cancelled() {
            break;
        }
        let n = (z - i).min(RANK_CHUNK as u64) as usize;
        perm.fill_strided(&mut slots[..n], 0, len, i, 1);
        // Each slot's entry counted, and at each of the progression's positions (one in
        // `step`) its entry and occurrence noted first.
        let count = |seen: &mut [u32], slots: &[u32]| {
            for &s in slots {
                let e = table.find(u64::from(s));
                debug_assert!(e < entries);
                seen[e] += 1;
            }
        };
        let mut k = 0;
        while next < i + n as u64 {
            let at = (next - i) as usize;
            count(&mut seen, &slots[k..at]);
            let s = u64::from(slots[at]);
            let e = table.find(s);
            let v = if marked[e] {
                u64::from(seen[e])
            } else {
                s - table.starts[e]
            };
            mine[noted] = e as u64 | v << 32;
            noted += 1;
            seen[e] += 1;
            k = at + 1;
            next += step;
        }
        count(&mut seen, &slots[k..n]);
        i += n as u64;
    }
    debug_assert!(noted == mine.len() || cancelled());
    seen
}

/// A leaf boundary of a balanced phase's sequence, as a checkpoint records it: the counts per
/// dataset after the first `position` positions of phase `phase` (`interleave="balanced"`).
/// The sequence continues from these counts alone, so a resume that has them replays at
/// most a leaf instead of the phase up to its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancedBoundary {
    /// The phase, by index.
    pub phase: usize,
    /// Positions of the phase before the boundary (a multiple of its leaf).
    pub position: u64,
    /// Each dataset's count there.
    pub counts: Vec<u64>,
}

impl Global {
    /// For every balanced phase that starts before global position `g`, the last leaf
    /// boundary known (replayed or seeded) at or below `g` (or the phase's end), other than
    /// the phase's start. Replays nothing.
    pub(crate) fn balanced_boundaries(&self, g: u64) -> Vec<BalancedBoundary> {
        self.phases
            .iter()
            .enumerate()
            .filter(|(_, ph)| ph.start < g)
            .filter_map(|(phase, ph)| {
                let b = ph.balanced.as_ref()?;
                let (position, counts) = b.known_at_or_below(g.min(ph.end) - ph.start)?;
                Some(BalancedBoundary {
                    phase,
                    position,
                    counts,
                })
            })
            .collect()
    }

    /// Checks `boundary` (a balanced phase, a leaf boundary in it, counts each within one
    /// sample of its share there) and, with `apply`, records it in that phase's sequence.
    pub(crate) fn seed_balanced(&self, boundary: &BalancedBoundary, apply: bool) -> Result<()> {
        let balanced = self
            .phases
            .get(boundary.phase)
            .and_then(|ph| ph.balanced.as_ref().map(|b| (ph, b)));
        let Some((ph, b)) = balanced else {
            let phases: Vec<usize> = (0..self.phases.len())
                .filter(|&i| self.phases[i].balanced.is_some())
                .collect();
            return Err(crate::error::Error::out_of_range(
                "phase",
                format!("a phase with the balanced interleave, one of {phases:?}"),
                boundary.phase.to_string(),
            ));
        };
        if boundary.position > ph.end - ph.start {
            return Err(crate::error::Error::out_of_range(
                "position",
                format!("at most the phase's {} positions", ph.end - ph.start),
                boundary.position.to_string(),
            ));
        }
        if apply {
            b.seed(boundary.position, &boundary.counts)
        } else {
            b.check_seed(boundary.position, &boundary.counts)
        }
    }

    fn interleave(&self, epoch: u64, ph: &GlobalPhase) -> Interleave {
        Interleave::global(&ph.counts, (self.seed, epoch), ph.start)
    }

    /// How many of phase `ph`'s first `q` positions each dataset takes, added to `into`.
    fn prefix(&self, epoch: u64, ph: &GlobalPhase, q: u64, into: &mut [u64]) {
        if let Some(b) = &ph.balanced {
            b.prefix(q, into);
            return;
        }
        if !self.shuffle {
            let mut left = q;
            for (a, &c) in into.iter_mut().zip(&ph.counts) {
                let take = c.min(left);
                *a += take;
                left -= take;
            }
            return;
        }
        if q >= ph.counts.iter().sum::<u64>() {
            into.iter_mut().zip(&ph.counts).for_each(|(a, c)| *a += c);
            return;
        }
        let il = self.interleave(epoch, ph);
        let l = q / il.leaf();
        let (lo, _) = il.leaf_range(l);
        let leaf = il.leaf_counts((l, l + 1), into).pop().expect("one leaf");
        let (_, hi) = il.leaf_range(l);
        let table = SlotTable::new(&leaf, hi - lo);
        let perm = il.leaf_perm(l);
        for i in 0..q - lo {
            into[table.dataset(perm.at(i))] += 1;
        }
    }

    /// How many positions of phase `i` each dataset takes in `epoch`, added to `into`: its
    /// nominal counts, or those of its prefix when a later phase cuts it short.
    pub(crate) fn add_effective(&self, epoch: u64, i: usize, into: &mut [u64]) {
        let ph = &self.phases[i];
        let nominal: u64 = ph.counts.iter().sum();
        if ph.end - ph.start == nominal {
            into.iter_mut().zip(&ph.counts).for_each(|(a, c)| *a += c);
        } else {
            self.prefix(epoch, ph, ph.end - ph.start, into);
        }
    }

    /// Where every dataset's stream stands at the start of phases `0..=last` in `epoch`.
    pub(crate) fn streams(&self, epoch: u64, last: usize) -> Vec<StreamAt> {
        let mut out = Vec::with_capacity(last + 1);
        out.push(StreamAt::start(self.sizes.len()));
        for i in 0..last {
            let next = self.after(epoch, i, &out[i]);
            out.push(next);
        }
        out
    }

    /// Where the streams stand after phase `i`, whose streams started at `at`: every draw
    /// the phase made up to its end is read, and the occurrences it left unread (in a leaf
    /// the next phase cuts, those of its slots no position before the cut holds; and holes
    /// it never reached) are the next phase's first.
    fn after(&self, epoch: u64, i: usize, at: &StreamAt) -> StreamAt {
        let ph = &self.phases[i];
        let datasets = self.sizes.len();
        // Per dataset: the phase read its draws [0, v0), and in a cut leaf read in slot order
        // some of [v0, x) (`read`, by slot).
        let mut v0 = vec![0u64; datasets];
        self.add_effective(epoch, i, &mut v0);
        let mut partial: Vec<Option<(u64, u64, u64)>> = vec![None; datasets];
        let mut read: Vec<bool> = Vec::new();
        let q = ph.end - ph.start;
        let nominal: u64 = ph.counts.iter().sum();
        if self.shuffle && ph.balanced.is_none() && q < nominal {
            let il = self.interleave(epoch, ph);
            let l = q / il.leaf();
            let (lo, hi) = il.leaf_range(l);
            if q > lo {
                let mut before = vec![0u64; datasets];
                let counts = il
                    .leaf_counts((l, l + 1), &mut before)
                    .pop()
                    .expect("one leaf");
                let marked = self.marked(&counts, (at, &before));
                if marked.iter().any(|&m| !m) {
                    let mut slots = vec![0u64; (q - lo) as usize];
                    il.leaf_perm(l).fill_strided(&mut slots, 0, hi - lo, 0, 1);
                    read = vec![false; (hi - lo) as usize];
                    slots.iter().for_each(|&s| read[s as usize] = true);
                    let mut first = 0u64;
                    for (&(d, c), &m) in counts.iter().zip(&marked) {
                        let d = d as usize;
                        if !m {
                            v0[d] = before[d];
                            partial[d] = Some((before[d], first, c));
                        }
                        first += c;
                    }
                }
            }
        }
        let mut next = Vec::with_capacity(datasets);
        let mut holes = Vec::with_capacity(datasets);
        for d in 0..datasets {
            let h = at.holes[d].len() as u64;
            let mut unread = Vec::new();
            let mut x = v0[d];
            if let Some((b, first, c)) = partial[d] {
                let slots = &read[first as usize..(first + c) as usize];
                unread.extend(
                    (0..c)
                        .filter(|&k| !slots[k as usize])
                        .map(|k| at.occurrence(d, b + k)),
                );
                x = b + c;
            }
            let y = x.max(h);
            unread.extend((x..y).map(|v| at.occurrence(d, v)));
            next.push(at.next[d] + (y - h));
            holes.push(unread);
        }
        StreamAt { next, holes }
    }

    /// The rank's positions `[start, stop)` of the positions `[offset, offset + len)` dealt to
    /// `w` ranks with torch's striding and wrap-around padding (see the module docs). An empty
    /// buffer when the call is cancelled (the caller discards it).
    pub(crate) fn fill<T: Index>(
        &self,
        epoch: u64,
        (offset, len): (u64, u64),
        (rank, w): (u64, u64),
        (start, stop): (u64, u64),
    ) -> Result<Vec<T>> {
        let what = "a rank's mixture indices";
        let count = stop - start;
        let mut out = if count <= UNIT {
            let mut v = try_with_capacity_huge::<T>(what, count)?;
            v.resize(count as usize, T::from_u64(0));
            v
        } else {
            zeros_par::<T>(what, count)?
        };
        if count == 0 {
            return Ok(out);
        }
        let units = self.units((offset, len), (rank, w), (start, stop));
        let last_phase = units.iter().map(|u| u.phase).max().unwrap_or(0);
        let stream_at = self.streams(epoch, last_phase);
        let mut pieces: Vec<&mut [T]> = Vec::with_capacity(units.len());
        let mut rest: &mut [T] = &mut out;
        for u in &units {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(u.count as usize);
            pieces.push(piece);
            rest = tail;
        }
        let zeros = vec![0u64; self.sizes.len()];
        let mut pieces = pieces.into_iter();
        let mut i = 0;
        while i < units.len() {
            if cancelled() {
                return Ok(Vec::new());
            }
            let phase = units[i].phase;
            let ph = &self.phases[phase];
            let at = &stream_at[phase];
            // A run of units in one phase, their positions increasing (so one progression
            // of step `w`, and leaves in order: the wrapped position of the padding, at the
            // end, starts a run of its own).
            let mut j = i + 1;
            while j < units.len() && units[j].phase == phase && units[j].g0 > units[j - 1].g0 {
                j += 1;
            }
            let run = &units[i..j];
            let run_pieces: Vec<&mut [T]> = pieces.by_ref().take(j - i).collect();
            if !self.shuffle || ph.balanced.is_some() {
                let input = UnitInput {
                    before: &zeros,
                    leaves: &[],
                    timed: &[],
                };
                self.fill_units(epoch, w, at, run, run_pieces, |_| input);
            } else {
                self.fill_run(epoch, w, (ph, at), run, run_pieces);
            }
            i = j;
        }
        if cancelled() {
            return Ok(Vec::new());
        }
        Ok(out)
    }

    /// Fills `units` into `pieces`, in parallel, each from the input `input_of` gives it.
    fn fill_units<'a, T: Index>(
        &self,
        epoch: u64,
        w: u64,
        at: &StreamAt,
        units: &[Unit],
        pieces: Vec<&mut [T]>,
        input_of: impl Fn(&Unit) -> UnitInput<'a> + Sync,
    ) {
        let work = |(u, piece): (&Unit, &mut [T])| {
            if !cancelled() {
                with_scratch(|scratch| {
                    self.fill_unit(epoch, u, w, (at, &input_of(u)), piece, scratch);
                });
            }
        };
        if units.len() == 1 {
            units.iter().zip(pieces).for_each(work);
        } else {
            units.par_iter().zip(pieces).for_each(work);
        }
    }

    /// Fills a run of units of one uniform shuffled phase, a window of leaves at a time: the
    /// phase's tree is walked once for the run, leaf after leaf ([`LeafWalk`](super::interleave::LeafWalk)), and only the
    /// window's leaves (their counts, starting draws and time orders) are held, so the
    /// scratch is bounded whatever the range's length.
    fn fill_run<T: Index>(
        &self,
        epoch: u64,
        w: u64,
        (ph, at): (&GlobalPhase, &StreamAt),
        run: &[Unit],
        pieces: Vec<&mut [T]>,
    ) {
        let il = self.interleave(epoch, ph);
        // Every position of the run is `anchor` plus a multiple of `w` (phase-relative), and
        // below `end`: no leaf is ranked past the run's last position.
        let anchor = run[0].g0 - ph.start;
        let last = &run[run.len() - 1];
        let end = last.g0 + (last.count - 1) * w - ph.start + 1;
        let lmin = run[0].leaves.0;
        let lmax = run.iter().map(|u| u.leaves.1).max().unwrap_or(lmin);
        let mut walk = il.leaf_walk((lmin, lmax), self.sizes.len());
        // The window's leaves [first, first + counts.len()).
        let mut first = lmin;
        let mut counts: Vec<Counts> = Vec::new();
        let mut starts: Vec<Vec<u64>> = Vec::new();
        let mut timed: Vec<Timed> = Vec::new();
        let mut pieces = pieces.into_iter();
        let mut k = 0;
        while k < run.len() {
            if cancelled() {
                return;
            }
            // The next window: units whose leaves fit in WINDOW_LEAVES from the first's (at
            // least one unit).
            let l0 = run[k].leaves.0;
            let mut e = k + 1;
            while e < run.len() && run[e].leaves.1 - l0 <= WINDOW_LEAVES {
                e += 1;
            }
            let l1 = run[k..e].iter().map(|u| u.leaves.1).max().unwrap_or(l0);
            // Drop the leaves before the window (walking past any the run skips), read those
            // it adds.
            let held_end = first + counts.len() as u64;
            if l0 >= held_end {
                counts.clear();
                starts.clear();
                timed.clear();
                for _ in held_end..l0 {
                    walk.next();
                }
            } else {
                let drop = (l0 - first) as usize;
                counts.drain(..drop);
                starts.drain(..drop);
                timed.drain(..drop);
            }
            first = l0;
            let have = first + counts.len() as u64;
            let mut fresh = Vec::with_capacity((l1 - have) as usize);
            for _ in have..l1 {
                let (l, c, b) = walk.next().expect("the walk reaches every leaf of the run");
                debug_assert_eq!(l, have + fresh.len() as u64);
                fresh.push((l, c, b));
            }
            let new_timed: Vec<Timed> = fresh
                .par_iter()
                .map(|(l, c, b)| self.timed(&il, ph, (*l, c), (at, b), (anchor, w, end)))
                .collect();
            for ((_, c, b), t) in fresh.into_iter().zip(new_timed) {
                counts.push(c);
                starts.push(b);
                timed.push(t);
            }
            let window_pieces: Vec<&mut [T]> = pieces.by_ref().take(e - k).collect();
            let (counts, starts, timed) = (&counts, &starts, &timed);
            self.fill_units(epoch, w, at, &run[k..e], window_pieces, |u| {
                let (a, b) = ((u.leaves.0 - first) as usize, (u.leaves.1 - first) as usize);
                UnitInput {
                    before: &starts[a],
                    leaves: &counts[a..b],
                    timed: &timed[a..b],
                }
            });
            k = e;
        }
    }

    /// Which entries of a leaf's `counts` are read in time order: the datasets whose
    /// occurrences in the leaf (its draws from `before`, in streams starting at `at`) cross a
    /// pass boundary. For the others slot order is as good (one pass, so no repeat) and costs
    /// nothing. A later phase cutting the leaf changes nothing here: what its positions before
    /// the cut read never depends on where (or whether) the phase is cut, and the occurrences
    /// they leave unread go to the next phase ([`StreamAt`]).
    fn marked(&self, counts: &Counts, (at, before): (&StreamAt, &[u64])) -> Vec<bool> {
        counts
            .iter()
            .map(|&(d, c)| {
                let d = d as usize;
                at.crosses_pass(d, before[d], c, self.sizes[d])
            })
            .collect()
    }

    /// Leaf `l`'s time order where it is needed ([`Global::marked`]), for the rank's
    /// positions (`anchor` plus multiples of `w`, phase-relative, below `end`). Only the
    /// leaf's positions before `end` and before a later phase's start count: when the marked
    /// datasets hold more than a sixteenth of those, one pass over them counts every entry's
    /// occurrences and notes the rank's; otherwise the marked slots' positions come from the
    /// permutation's inverse, sorted. So a call for a leaf's first positions (a sampler's
    /// first index) reads little of it.
    fn timed(
        &self,
        il: &Interleave,
        ph: &GlobalPhase,
        (l, counts): (u64, &Counts),
        streams: (&StreamAt, &[u64]),
        (anchor, w, end): (u64, u64, u64),
    ) -> Timed {
        let (lo, hi) = il.leaf_range(l);
        let marked = self.marked(counts, streams);
        let table = SlotTable::new(counts, hi - lo);
        let slots_marked: u64 = (0..marked.len())
            .filter(|&e| marked[e])
            .map(|e| table.starts[e + 1] - table.starts[e])
            .sum();
        if slots_marked == 0 {
            return Timed::Nothing;
        }
        let perm = il.leaf_perm(l);
        let used = (ph.end - ph.start).min(hi).min(end).saturating_sub(lo);
        // A leaf of 2**32 slots or more (2**28 datasets) is left to the sorted lists.
        if slots_marked * 16 > used && hi - lo < 1 << 32 {
            let first = (anchor % w + w - lo % w) % w;
            let ranked = rank_in_time(&perm, &table, &marked, used, (first, w));
            return Timed::Ranks {
                first,
                step: w,
                ranked,
            };
        }
        let lists = marked
            .iter()
            .enumerate()
            .map(|(e, &m)| {
                m.then(|| {
                    let run: Vec<u64> = (table.starts[e]..table.starts[e + 1]).collect();
                    let mut at = perm.positions_of(&run);
                    at.retain(|&i| i < used);
                    at.sort_unstable();
                    at
                })
            })
            .collect();
        Timed::Sorted(lists)
    }

    /// The rank's positions cut into units (see the module docs), in output order.
    fn units(
        &self,
        (offset, len): (u64, u64),
        (rank, w): (u64, u64),
        (start, stop): (u64, u64),
    ) -> Vec<Unit> {
        let mut units = Vec::new();
        // Positions before the first wrap: offset + rank + k w for k below `unwrapped`.
        let unwrapped = if rank < len {
            (len - rank).div_ceil(w)
        } else {
            0
        };
        let (mut k, k_end) = (start, stop.min(unwrapped));
        let pos = |k: u64| offset + rank + k * w;
        // The first k whose position is at least `g` (for g past the first position).
        let first_at = |g: u64| (g - offset - rank).div_ceil(w);
        while k < k_end {
            let g = pos(k);
            let i = self.phases.partition_point(|p| p.start <= g) - 1;
            let ph = &self.phases[i];
            let b = ph.leaf();
            let leaves = (ph.end - ph.start).div_ceil(b);
            let l0 = (g - ph.start) / b;
            let per_unit = (UNIT.saturating_mul(w) / b).clamp(1, WINDOW_LEAVES);
            let l1 = (l0 + per_unit).min(leaves);
            let span_end = (ph.start + l1 * b).min(ph.end);
            // At most UNIT positions: a leaf holding more of them (few ranks) is cut into
            // several units, which then share it.
            let next = first_at(span_end).min(k_end).min(k + UNIT);
            let last = pos(next - 1);
            units.push(Unit {
                phase: i,
                leaves: (l0, (last - ph.start) / b + 1),
                g0: g,
                count: next - k,
            });
            k = next;
        }
        // The padded tail wraps to the head: at most one position per rank (its last).
        for k in start.max(unwrapped)..stop {
            let g = offset
                + ((u128::from(rank) + u128::from(k) * u128::from(w)) % u128::from(len)) as u64;
            let i = self.phases.partition_point(|p| p.start <= g) - 1;
            let ph = &self.phases[i];
            let l0 = (g - ph.start) / ph.leaf();
            units.push(Unit {
                phase: i,
                leaves: (l0, l0 + 1),
                g0: g,
                count: 1,
            });
        }
        units
    }

    /// One unit's values into `out`.
    fn fill_unit<T: Index>(
        &self,
        epoch: u64,
        u: &Unit,
        w: u64,
        (at, input): (&StreamAt, &UnitInput<'_>),
        out: &mut [T],
        scratch: &mut Scratch,
    ) {
        let stream_at = &input.before;
        let ph = &self.phases[u.phase];
        let Scratch { reads, dj, slots } = scratch;
        let mut passes = Passes::new(self, epoch, (at, input.before), reads);
        if let Some(b) = &ph.balanced {
            let leaf = b.leaf();
            let mut done = 0usize;
            let mut p = u.g0 - ph.start;
            for l in u.leaves.0..u.leaves.1 {
                let hi = (l + 1) * leaf;
                if done == out.len() || p >= hi {
                    continue;
                }
                let (ds, occ) = b.leaf_sequence(l);
                dj.clear();
                while done + dj.len() < out.len() && p < hi {
                    let i = (p - l * leaf) as usize;
                    let d = ds[i];
                    dj.push((d, stream_at[d as usize] + occ[i]));
                    p += w;
                }
                passes.write_all(dj, &mut out[done..done + dj.len()]);
                done += dj.len();
            }
            return;
        }
        if !self.shuffle {
            // The phase's datasets one after another.
            let mut starts = Vec::with_capacity(ph.counts.len() + 1);
            let mut run = 0u64;
            for &c in &ph.counts {
                starts.push(run);
                run += c;
            }
            starts.push(run);
            dj.clear();
            dj.extend((0..out.len() as u64).map(|i| {
                let p = u.g0 - ph.start + i * w;
                let d = starts.partition_point(|&s| s <= p) - 1;
                (d as u32, stream_at[d] + p - starts[d])
            }));
            passes.write_all(dj, out);
            return;
        }
        let il = self.interleave(epoch, ph);
        let mut before = stream_at.to_vec();
        let leaves = input.leaves;
        let (mut done, mut p) = (0usize, u.g0 - ph.start);
        for (k, (counts, l)) in leaves.iter().zip(u.leaves.0..).enumerate() {
            let (lo, hi) = il.leaf_range(l);
            if done < out.len() && p < hi {
                let here = ((hi - p).div_ceil(w) as usize).min(out.len() - done);
                // Occurrences in time order for the datasets whose occurrences here cross a
                // pass boundary ([`Global::marked`]); slot order for the others. The leaf's
                // positions a piece at a time (the draws of a piece stay in cache).
                let slotted = match &input.timed[k] {
                    Timed::Ranks { .. } => None,
                    _ => Some((il.leaf_perm(l), SlotTable::new(counts, hi - lo))),
                };
                for from in (0..here).step_by(WRITE_STEP) {
                    if cancelled() {
                        return;
                    }
                    let m = (here - from).min(WRITE_STEP);
                    let q = p + from as u64 * w; // the piece's first position
                    dj.clear();
                    match (&input.timed[k], &slotted) {
                        // The ranking read these positions: their entries and occurrences,
                        // consecutive in its progression from this unit's first one here.
                        (
                            Timed::Ranks {
                                first,
                                step,
                                ranked,
                            },
                            _,
                        ) => {
                            // Every position of the run is below `end`, so the progression,
                            // ranked up to there, holds them all.
                            let r = ((q - lo - first) / step) as usize;
                            debug_assert!(r + m <= ranked.len());
                            dj.extend(ranked[r..r + m].iter().map(|&x| {
                                let d = counts[x as u32 as usize].0;
                                (d, before[d as usize] + (x >> 32))
                            }));
                        }
                        (timed, Some((perm, table))) => {
                            slots.clear();
                            slots.resize(m, 0);
                            perm.fill_strided(slots, 0, hi - lo, q - lo, w);
                            dj.extend(slots.iter().zip((q - lo..).step_by(w as usize)).map(
                                |(&s, i)| {
                                    let e = table.find(s);
                                    let d = counts[e].0;
                                    let within = match timed {
                                        Timed::Sorted(lists) => match &lists[e] {
                                            Some(at) => at.partition_point(|&x| x < i) as u64,
                                            None => s - table.starts[e],
                                        },
                                        _ => s - table.starts[e],
                                    };
                                    (d, before[d as usize] + within)
                                },
                            ));
                        }
                        (_, None) => unreachable!("a leaf read in slot order has its table"),
                    }
                    passes.write(dj, &mut out[done + from..done + from + m]);
                }
                done += here;
                p += here as u64 * w;
            }
            counts.iter().for_each(|&(d, c)| before[d as usize] += c);
        }
    }

    /// Bytes a [`Global::fill`] of `count` positions holds at its peak: the output, plus a
    /// scratch bounded whatever `count` is (it grows with the datasets and the leaf, not the
    /// positions): every phase's stream starts (and a cut leaf's holes), the uniform
    /// interleave's window of leaves (counts, starting draws and time orders, the ones being
    /// ranked with their slots, and the walk's pending nodes), per thread a unit's passes
    /// (every pass it meets, at most one per position plus one per dataset) and a leaf's slots
    /// or balanced sequence, plus the balanced phases' boundary counts. An estimate, to
    /// refuse what cannot fit before any work.
    pub(crate) fn fill_bytes(&self, count: u64, total: u64) -> u64 {
        let threads = rayon::current_num_threads() as u64;
        let d = self.sizes.len() as u64;
        let leaf = global_leaf_size(self.sizes.len());
        let boundaries: u64 = self
            .phases
            .iter()
            .filter(|p| p.balanced.is_some())
            .map(|p| (p.end - p.start).div_ceil(leaf) * 8 * d)
            .sum();
        let cut: u64 = self
            .phases
            .iter()
            .filter(|p| p.end - p.start < p.counts.iter().sum::<u64>())
            .count() as u64;
        let streams = self.phases.len() as u64 * d * 32 + cut * leaf * 9;
        let positions = self.phases.last().map_or(0, |p| p.end);
        let levels = u64::from(64 - (positions / leaf + 1).leading_zeros()) + 1;
        // A call meets at most one leaf per position.
        let touched = WINDOW_LEAVES.min(count.max(1));
        let window =
            touched * (d * 24 + leaf * 8) + threads.min(touched) * leaf * 16 + levels * d * 32;
        let pass = std::mem::size_of::<RandomAccessPermutation>() as u64 + 8;
        let unit = UNIT.min(count.max(1));
        let scratch = if boundaries > 0 { leaf * 12 } else { unit * 32 };
        let per_thread = d * 48 + (unit + d.min(count.max(1))) * (pass + 24) + scratch;
        count.saturating_mul(index_bytes(total))
            + streams
            + window
            + threads * per_thread
            + boundaries
    }
}

#[cfg(test)]
mod tests {
    use crate::deal::{Deal, Order};
    use crate::mix::{BalancedBoundary, Interleaving, Mixture, MixtureConfig, PhaseSpec};

    const SIZES: [u64; 5] = [90_000, 7, 40_000, 1, 12_345];

    fn phases() -> Vec<PhaseSpec> {
        // Two phases over the 142,353 positions, the first cut short by the second.
        vec![
            PhaseSpec {
                start: 0,
                length: 120_000,
                weights: vec![1.0, 1.0, 2.0, 0.5, 0.0],
                temperature: 1.0,
            },
            PhaseSpec {
                start: 70_001,
                length: 72_352,
                weights: vec![3.0, 0.0, 1.0, 0.0, 1.0],
                temperature: 2.0,
            },
        ]
    }

    fn mixture(w: u64, r: u64, drop_last: bool, shuffle: bool, il: Interleaving) -> Mixture {
        let config = MixtureConfig {
            deal: Deal {
                num_replicas: w,
                rank: r,
                drop_last,
            },
            shuffle,
            seed: 11,
            interleave: il,
            ..MixtureConfig::default()
        };
        Mixture::new(&SIZES, &phases(), &config).unwrap()
    }

    /// The ranks' sequences interleaved position by position: `g[k W + r] = share_r[k]`.
    fn interleaved(w: u64, drop_last: bool, shuffle: bool, il: Interleaving) -> Vec<u64> {
        let shares: Vec<Vec<u64>> = (0..w)
            .map(|r| {
                let m = mixture(w, r, drop_last, shuffle, il);
                m.range(3, 0, m.len()).unwrap().to_u64_vec()
            })
            .collect();
        let per = shares[0].len();
        (0..per)
            .flat_map(|k| shares.iter().map(move |s| s[k]))
            .collect()
    }

    const KINDS: [(bool, Interleaving); 3] = [
        (true, Interleaving::Uniform),
        (true, Interleaving::Balanced),
        (false, Interleaving::Uniform),
    ];

    /// Where each dataset starts in the concatenation, and the dataset of a global index.
    fn offsets() -> Vec<u64> {
        SIZES
            .iter()
            .scan(0, |run, &n| {
                *run += n;
                Some(*run - n)
            })
            .collect()
    }

    fn dataset_of(offsets: &[u64], g: u64) -> usize {
        offsets.partition_point(|&o| o <= g) - 1
    }

    #[test]
    fn unpermuted_samples_keep_the_interleave_and_read_each_pass_in_order() {
        let offsets = offsets();
        let dataset = |g: u64| dataset_of(&offsets, g);
        for il in [Interleaving::Uniform, Interleaving::Balanced] {
            for order in [Order::Global, Order::PerRank] {
                // (the per-rank order has no balanced interleave)
                if order == Order::PerRank && il == Interleaving::Balanced {
                    continue;
                }
                let make = |permute_samples| {
                    let config = MixtureConfig {
                        seed: 11,
                        interleave: il,
                        order,
                        permute_samples,
                        ..MixtureConfig::default()
                    };
                    let m = Mixture::new(&SIZES, &phases(), &config).unwrap();
                    m.range(3, 0, m.len()).unwrap().to_u64_vec()
                };
                let (permuted, ordered) = (make(true), make(false));
                assert_eq!(permuted.len(), ordered.len());
                let datasets: Vec<usize> = ordered.iter().map(|&g| dataset(g)).collect();
                let same: Vec<usize> = permuted.iter().map(|&g| dataset(g)).collect();
                assert_eq!(
                    datasets, same,
                    "{il:?} {order:?}: the interleave must not change"
                );
                // Each dataset's occurrences read whole passes, each in order but for the
                // slot order inside a leaf of the interleave: no sample further from its place
                // than a leaf (the permuted passes move their samples anywhere).
                let leaf = crate::mix::interleave::global_leaf_size(SIZES.len())
                    .max(crate::mix::interleave::leaf_size(SIZES.len()))
                    as i64;
                // Each dataset's samples, in the order its positions read them.
                let reads = |seq: &[u64]| {
                    let mut read: Vec<Vec<u64>> = vec![Vec::new(); SIZES.len()];
                    for (&g, &d) in seq.iter().zip(&datasets) {
                        read[d].push(g - offsets[d]);
                    }
                    read
                };
                let read = reads(&ordered);
                let far = |reads: &[Vec<u64>]| {
                    reads.iter().enumerate().any(|(d, r)| {
                        r.iter()
                            .enumerate()
                            .any(|(k, &s)| (s as i64 - (k as u64 % SIZES[d]) as i64).abs() >= leaf)
                    })
                };
                for (d, r) in read.iter().enumerate() {
                    for pass in r.chunks(SIZES[d] as usize) {
                        let mut p = pass.to_vec();
                        p.sort_unstable();
                        assert!(p.iter().enumerate().all(|(k, &s)| s == k as u64));
                    }
                }
                assert!(!far(&read), "{il:?} {order:?}: a sample left its leaf");
                assert!(
                    far(&reads(&permuted)),
                    "{il:?} {order:?}: passes are permuted by default"
                );
            }
        }
    }

    #[test]
    fn the_global_sequence_is_the_same_for_every_world_size() {
        for (shuffle, il) in KINDS {
            let one = interleaved(1, false, shuffle, il);
            let t = SIZES.iter().sum::<u64>() as usize;
            assert_eq!(one.len(), t);
            // 1000 ranks each replaying every balanced leaf is slow unoptimised; Python's
            // property tests take the balanced interleave to 1000 ranks.
            let worlds: &[u64] = match il {
                Interleaving::Balanced => &[2, 3, 7, 16],
                Interleaving::Uniform => &[2, 3, 7, 16, 1000],
            };
            for &w in worlds {
                for drop_last in [false, true] {
                    let g = interleaved(w, drop_last, shuffle, il);
                    let kept = if drop_last {
                        t / w as usize * w as usize
                    } else {
                        t
                    };
                    assert_eq!(g[..kept], one[..kept], "W={w} {il:?} shuffle={shuffle}");
                    // torch's padding repeats the head.
                    assert_eq!(g[kept..], one[..g.len() - kept], "W={w} padding");
                }
            }
        }
    }

    #[test]
    fn counts_are_exact_per_phase_and_passes_are_whole() {
        let offsets = offsets();
        let dataset = |v: u64| dataset_of(&offsets, v);
        for (shuffle, il) in KINDS {
            let m = mixture(1, 0, false, shuffle, il);
            let seq = interleaved(1, false, shuffle, il);
            let mut from = 0usize;
            let mut per_ds: Vec<Vec<u64>> = vec![Vec::new(); SIZES.len()];
            for (i, end) in [(0usize, 70_001usize), (1, seq.len())] {
                let mut got = vec![0u64; SIZES.len()];
                for &v in &seq[from..end] {
                    got[dataset(v)] += 1;
                    per_ds[dataset(v)].push(v);
                }
                assert_eq!(got, m.effective_counts(3, i), "phase {i} {il:?}");
                from = end;
            }
            for (d, vs) in per_ds.iter().enumerate() {
                // Every sample drawn as often as the passes say: whole passes, then one part.
                let n = SIZES[d];
                let mut times = vec![0u64; n as usize];
                vs.iter()
                    .for_each(|&v| times[(v - offsets[d]) as usize] += 1);
                let c = vs.len() as u64;
                assert!(
                    times.iter().all(|&x| x == c / n || x == c / n + 1),
                    "dataset {d} {il:?} {shuffle} {c} {:?}",
                    times.iter().max()
                );
                assert_eq!(times.iter().filter(|&&x| x > c / n).count() as u64, c % n);
                if shuffle {
                    // Occurrences in time order: each pass, in turn, a permutation.
                    for pass in vs.chunks(n as usize).filter(|p| p.len() as u64 == n) {
                        let mut p = pass.to_vec();
                        p.sort_unstable();
                        assert_eq!(p, (offsets[d]..offsets[d] + n).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    /// The whole global sequence (one rank) of the phases cut at `cuts`, each later phase
    /// running to the end of the epoch with its own weights (a weight change at a resume).
    fn cut_at(cuts: &[u64], shuffle: bool, il: Interleaving) -> Vec<u64> {
        let t: u64 = SIZES.iter().sum();
        let weights = [
            vec![1.0, 1.0, 2.0, 0.5, 0.0],
            vec![3.0, 0.0, 1.0, 0.0, 1.0],
            vec![0.0, 5.0, 1.0, 1.0, 1.0],
            vec![1.0, 1.0, 1.0, 1.0, 1.0],
        ];
        let mut phases = vec![PhaseSpec {
            start: 0,
            length: t,
            weights: weights[0].clone(),
            temperature: 1.0,
        }];
        for (k, &c) in cuts.iter().enumerate() {
            phases.push(PhaseSpec {
                start: c,
                length: t - c,
                weights: weights[(k + 1) % weights.len()].clone(),
                temperature: 1.0,
            });
        }
        let config = MixtureConfig {
            deal: Deal {
                num_replicas: 1,
                rank: 0,
                drop_last: false,
            },
            shuffle,
            seed: 5,
            interleave: il,
            ..MixtureConfig::default()
        };
        let m = Mixture::new(&SIZES, &phases, &config).unwrap();
        m.range(2, 0, m.len()).unwrap().to_u64_vec()
    }

    #[test]
    fn a_cut_changes_nothing_before_it_and_passes_stay_whole() {
        // Cuts inside leaves (4,096 positions in tests): one, two in one leaf, three in a
        // row, and cuts between which the oversampled datasets (7 and 1 samples) run many
        // passes; each phase's weights differ from the one before.
        let offsets: Vec<u64> = SIZES
            .iter()
            .scan(0, |a, &n| {
                *a += n;
                Some(*a - n)
            })
            .collect();
        let dataset = |v: u64| offsets.partition_point(|&o| o <= v) - 1;
        let cases: [&[u64]; 5] = [
            &[5_000],
            &[5_000, 5_100],
            &[1, 2, 3],
            &[4_096 * 3 + 17, 4_096 * 3 + 18, 100_000],
            &[70_001, 70_002, 70_003],
        ];
        for (shuffle, il) in KINDS {
            for cuts in cases {
                let seq = cut_at(cuts, shuffle, il);
                // What a resume at each cut already yielded: the sequence without that cut.
                for k in 0..cuts.len() {
                    let before = cut_at(&cuts[..k], shuffle, il);
                    let c = cuts[k] as usize;
                    assert_eq!(seq[..c], before[..c], "{cuts:?} cut {k} {il:?} {shuffle}");
                }
                // Every pass of every dataset whole, in time order.
                for (d, &n) in SIZES.iter().enumerate() {
                    let vs: Vec<u64> = seq.iter().copied().filter(|&v| dataset(v) == d).collect();
                    for pass in vs.chunks(n as usize) {
                        let mut p = pass.to_vec();
                        p.sort_unstable();
                        p.dedup();
                        assert_eq!(p.len(), pass.len(), "dataset {d} {cuts:?} {il:?} {shuffle}");
                    }
                }
            }
        }
    }

    #[test]
    fn balanced_prefixes_stay_within_one_sample() {
        let m = mixture(1, 0, false, true, Interleaving::Balanced);
        let seq = interleaved(1, false, true, Interleaving::Balanced);
        let offsets = [0u64, 90_000, 90_007, 130_007, 130_008];
        let dataset = |v: u64| offsets.partition_point(|&o| o <= v) - 1;
        // Phase 1: nominal 72,352 positions, exactly what is left.
        let counts = m.phase_counts(1).unwrap().to_vec();
        let len: u64 = counts.iter().sum();
        let mut c = [0u64; 5];
        for (t, &v) in seq[70_001..].iter().enumerate() {
            c[dataset(v)] += 1;
            let t = t as u64 + 1;
            for d in 0..5 {
                let share = counts[d] as f64 * t as f64 / len as f64;
                assert!((c[d] as f64 - share).abs() < 1.0, "dataset {d} at {t}");
            }
        }
    }

    #[test]
    fn a_resume_from_recorded_boundaries_replays_no_leaf_before_them() {
        // One balanced phase of 8 leaves (2**16 positions each) over three datasets.
        let sizes = [300_000u64, 150_000, 74_288];
        let phase = PhaseSpec {
            start: 0,
            length: sizes.iter().sum(),
            weights: vec![3.0, 2.0, 1.0],
            temperature: 1.0,
        };
        let make = |w: u64, r: u64| {
            let deal = Deal {
                num_replicas: w,
                rank: r,
                drop_last: false,
            };
            let config = MixtureConfig {
                deal,
                seed: 5,
                interleave: Interleaving::Balanced,
                ..MixtureConfig::default()
            };
            Mixture::new(&sizes, std::slice::from_ref(&phase), &config).unwrap()
        };
        let leaf = 1u64 << 16;
        let one = make(1, 0);
        let whole = one.range(2, 0, one.len()).unwrap().to_u64_vec();
        let dataset = |v: u64| usize::from(v >= 300_000) + usize::from(v >= 450_000);
        // 4 ranks consumed 85,000 positions each: global position 340,000, in leaf 5.
        let g = 340_000u64;
        let saver = make(4, 1);
        assert!(saver.balanced_boundaries(g).is_empty(), "nothing read yet");
        assert!(saver.balanced_boundaries(0).is_empty() && saver.balanced_boundaries(1).is_empty());
        saver.range(2, 0, 85_000).unwrap();
        let recorded = saver.balanced_boundaries(g);
        let mut want = vec![0u64; 3];
        for &v in &whole[..5 * leaf as usize] {
            want[dataset(v)] += 1;
        }
        assert_eq!(
            recorded,
            [BalancedBoundary {
                phase: 0,
                position: 5 * leaf,
                counts: want
            }]
        );
        // Every rank of another process, seeded, reads exactly the uninterrupted sequence
        // from there, and never replays the leaves before the boundary.
        for r in 0..4 {
            let fresh = make(4, r);
            fresh.seed_balanced(&recorded[0], true).unwrap();
            let got = fresh.range(2, 85_000, fresh.len()).unwrap().to_u64_vec();
            let mine: Vec<u64> = whole
                .iter()
                .skip(r as usize)
                .step_by(4)
                .skip(85_000)
                .copied()
                .collect();
            assert_eq!(got, mine, "rank {r}");
            assert!(
                fresh.balanced_boundaries(5 * leaf - 1).is_empty(),
                "rank {r}"
            );
        }
    }

    #[test]
    fn a_balanced_phase_too_long_for_its_keys_is_refused() {
        // 65,537 datasets: 17 bits of dataset below each key's position (the largest a release,
        // a phase's length plus one), so phases of at most 2**47 - 3 positions.
        let sizes = vec![1u64; 65_537];
        let config = |length| MixtureConfig {
            interleave: Interleaving::Balanced,
            length: Some(length),
            ..MixtureConfig::default()
        };
        let phase = |length| PhaseSpec {
            start: 0,
            length,
            weights: vec![1.0; 65_537],
            temperature: 1.0,
        };
        let longest = (1u64 << 47) - 3;
        if let Err(e) = Mixture::new(&sizes, &[phase(longest)], &config(longest)) {
            panic!("{e}");
        }
        let e = Mixture::new(&sizes, &[phase(longest + 1)], &config(longest + 1)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("phases must be at most 140737488355325"),
            "{e}"
        );
    }

    #[test]
    fn a_boundary_that_cannot_be_the_sequences_is_refused_and_not_recorded() {
        let m = mixture(2, 0, false, true, Interleaving::Balanced);
        let leaf = 1u64 << 16;
        // Phase 1's nominal counts, and its share at the boundary (72,352 positions).
        let counts = m.phase_counts(1).unwrap().to_vec();
        let total: u64 = counts.iter().sum();
        let share: Vec<u64> = counts.iter().map(|&c| c * leaf / total).collect();
        let mut fair = share.clone();
        let short = leaf - fair.iter().sum::<u64>();
        for c in fair.iter_mut().filter(|c| **c > 0).take(short as usize) {
            *c += 1;
        }
        let at = |phase, position, counts: &[u64]| BalancedBoundary {
            phase,
            position,
            counts: counts.to_vec(),
        };
        m.seed_balanced(&at(1, leaf, &fair), false).unwrap();
        let mut far = fair.clone();
        let d = far.iter().position(|&c| c > 2).unwrap();
        far[d] -= 2;
        far[(d + 2) % 5] += 2;
        let bad = [
            (at(2, leaf, &fair), "phase"),
            (at(1, leaf + 1, &fair), "position"),
            (at(1, 2 * leaf, &fair), "position"),
            (at(1, leaf, &fair[..4]), "counts"),
            (at(1, leaf, &share), "counts"),
            (at(1, leaf, &far), "counts"),
        ];
        for (b, name) in bad {
            let e = m.seed_balanced(&b, true).unwrap_err().to_string();
            assert!(e.starts_with(name), "{b:?}: {e}");
        }
        let per_rank = Mixture::new(
            &SIZES,
            &phases(),
            &MixtureConfig {
                order: Order::PerRank,
                ..MixtureConfig::default()
            },
        )
        .unwrap();
        assert!(per_rank.seed_balanced(&at(0, leaf, &fair), false).is_err());
        assert!(
            m.balanced_boundaries(u64::MAX).is_empty(),
            "nothing recorded"
        );
    }

    #[test]
    fn parts_agree_with_the_whole_and_elastic_rests_continue_it() {
        for (shuffle, il) in KINDS {
            let whole = interleaved(1, false, shuffle, il);
            let m = mixture(3, 2, false, shuffle, il);
            let all = m.range(3, 0, m.len()).unwrap().to_u64_vec();
            for (a, b) in [
                (0u64, 1u64),
                (21_845, 21_847),
                (23_000, 47_451),
                (47_450, 47_451),
            ] {
                let part = m.range(3, a, b).unwrap().to_u64_vec();
                assert_eq!(part, all[a as usize..b as usize]);
            }
            // 3 ranks consumed 10,000 positions each; 4 ranks (then 1) take the rest.
            let offset = 30_000u64;
            for (w, drop_last) in [(4u64, false), (1, false), (4, true)] {
                let el = m.elastic(offset, w, drop_last).unwrap();
                let ns = el.num_samples();
                let mut got = vec![0u64; (ns * w) as usize];
                for r in 0..w {
                    let rest = m.elastic_range(&el, r, 3, 0, ns).unwrap().to_u64_vec();
                    for (k, v) in rest.into_iter().enumerate() {
                        got[k * w as usize + r as usize] = v;
                    }
                }
                let end = whole.len();
                let kept = (end - offset as usize).min(got.len());
                assert_eq!(got[..kept], whole[offset as usize..offset as usize + kept]);
                assert_eq!(got[kept..], whole[offset as usize..][..got.len() - kept]);
            }
        }
    }

    #[test]
    fn the_fast_order_refuses_the_balanced_interleave_and_small_datasets_draw() {
        let config = MixtureConfig {
            deal: Deal {
                num_replicas: 8,
                rank: 0,
                drop_last: true,
            },
            ..MixtureConfig::default()
        };
        let phase = PhaseSpec {
            start: 0,
            length: 103,
            weights: vec![1.0, 1.0],
            temperature: 1.0,
        };
        // A dataset smaller than the world: the per-rank order deals it nothing, the global
        // order draws it.
        assert!(Mixture::new(&[100, 3], std::slice::from_ref(&phase), &config).is_ok());
        let fast = MixtureConfig {
            order: Order::PerRank,
            ..config
        };
        assert!(Mixture::new(&[100, 3], std::slice::from_ref(&phase), &fast).is_err());
        let balanced = MixtureConfig {
            interleave: Interleaving::Balanced,
            ..fast
        };
        let err = Mixture::new(&[100, 30], &[phase], &balanced).unwrap_err();
        assert!(err.to_string().contains("interleave"), "{err}");
    }

    #[test]
    fn a_thread_busy_with_its_scratch_gets_a_fresh_one_and_keeps_its_own() {
        use super::with_scratch;
        // A unit run inside another on the same thread (a worker that waits and steals).
        with_scratch(|outer| {
            outer.slots.push(7);
            let inner = with_scratch(|inner| {
                inner.slots.push(9);
                inner.slots.clone()
            });
            assert_eq!(inner, [9], "the inner unit got a fresh scratch");
            assert_eq!(outer.slots, [7], "the outer unit's scratch is untouched");
        });
        // The thread's own scratch stays for its next unit (each unit clears what it uses).
        with_scratch(|again| assert_eq!(again.slots, [7]));
    }

    #[test]
    fn ranks_in_time_are_the_counts_of_earlier_positions() {
        use super::{rank_in_time, SlotTable, RANK_BLOCK};
        use crate::draw::random_access::RandomAccessPermutation;
        // A leaf of several blocks (the last one partial), five entries of unequal sizes.
        let len = 3 * RANK_BLOCK + 1_234;
        let counts = vec![(0, 10), (2, len / 2), (3, 1), (5, len / 3), (7, 0)];
        let last: u64 = counts[..4].iter().map(|&(_, c)| c).sum();
        let counts: super::Counts = counts
            .into_iter()
            .map(|(d, c)| (d, if d == 7 { len - last } else { c }))
            .collect();
        let table = SlotTable::new(&counts, len);
        let perm = RandomAccessPermutation::new(len, 5, 1);
        // The entry of a slot by binary search, not by the table's cells.
        let entry: Vec<usize> = (0..len)
            .map(|i| table.starts.partition_point(|&x| x <= perm.at(i)) - 1)
            .collect();
        for (used, first, step) in [
            (len, 0, 1),
            (len, 3, 8),
            (len - 999, RANK_BLOCK - 1, 1000),
            (RANK_BLOCK + 5, 2, 3),
            (7, 6, 4),
            // Blocks that hold none of the rank's positions (a world larger than a block).
            (len, 5, 2 * RANK_BLOCK + 1),
            (len, len - 1, len),
        ] {
            // Every entry marked, none, and every other one.
            for marked in [
                vec![true; 5],
                vec![false; 5],
                vec![true, false, true, false, true],
            ] {
                let mut seen = vec![0u64; counts.len()];
                let (mut want_entries, mut want_within) = (Vec::new(), Vec::new());
                for (i, &e) in entry[..used as usize].iter().enumerate() {
                    if i as u64 >= first && (i as u64 - first).is_multiple_of(step) {
                        want_entries.push(e as u32);
                        want_within.push(if marked[e] {
                            seen[e]
                        } else {
                            perm.at(i as u64) - table.starts[e]
                        });
                    }
                    seen[e] += 1;
                }
                let ranked = rank_in_time(&perm, &table, &marked, used, (first, step));
                let case = format!("used {used}, first {first}, step {step}, marked {marked:?}");
                let entries: Vec<u32> = ranked.iter().map(|&x| x as u32).collect();
                let within: Vec<u64> = ranked.iter().map(|&x| x >> 32).collect();
                assert_eq!(entries, want_entries, "{case}");
                assert_eq!(within, want_within, "{case}");
            }
        }
    }

    #[test]
    fn a_slot_table_finds_every_slots_entry() {
        use super::SlotTable;
        // Entries of every size against cells of 2**shift slots: runs of one slot (many entries
        // in a cell), runs ending exactly at a cell's edge, one entry, a long last run.
        let shapes: Vec<Vec<u64>> = vec![
            vec![5],
            vec![1; 300],
            vec![1, 1, 1, 4_000, 1, 1, 2, 60_000],
            vec![64, 64, 128, 1, 63, 4_096, 1, 1, 1, 9_999],
            (1..200).map(|c| c * c % 97 + 1).collect(),
            // Cells of 512 slots, one of them holding the eight short runs.
            vec![500_000, 1, 1, 1, 2, 3, 1, 100, 7, 499_000, 7, 7],
        ];
        for sizes in shapes {
            let counts: super::Counts = sizes
                .iter()
                .enumerate()
                .map(|(d, &c)| (d as u32, c))
                .collect();
            let len: u64 = sizes.iter().sum();
            let table = SlotTable::new(&counts, len);
            let mut e = 0;
            let mut end = sizes[0];
            for s in 0..len {
                while s >= end {
                    e += 1;
                    end += sizes[e];
                }
                assert_eq!(table.find(s), e, "slot {s} of sizes {sizes:?}");
            }
        }
        // A leaf of 2**32 slots or more has no cells: a lookup is a binary search.
        let counts: super::Counts = vec![(0, 1 << 32), (1, 3), (2, 1 << 33)];
        let table = SlotTable::new(&counts, (3 << 32) + 3);
        assert!(table.cells.is_empty());
        for (s, e) in [(0, 0), ((1 << 32) - 1, 0), (1 << 32, 1), ((1 << 32) + 2, 1)] {
            assert_eq!(table.find(s), e, "slot {s}");
        }
        assert_eq!(table.find((1 << 32) + 3), 2);
        assert_eq!(table.find((3 << 32) + 2), 2);
    }
}

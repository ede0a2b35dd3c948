//! A seekable shuffle fed from a stream: a [`Plan`] lays out level 1 of one shuffle whose items
//! arrive in order (a share's partition walk), possibly wanting only a window of its output;
//! [`Dealer`]s write the items to their buckets as they arrive, a stripe at a time, on any
//! number of threads; [`Plan::finish`] shuffles the buckets. The shuffle itself, and reading
//! single positions, are the parent module's.

use super::*;

/// The level-1 layout of one seekable shuffle whose items arrive from a stream (a share's
/// partition walk): [`Dealer`]s write them straight to their bucket, [`Plan::finish`] then
/// shuffles the buckets.
///
/// A plan may want only a window `[a, b)` of the output positions: the buckets that window
/// meets are dealt and shuffled, the others dropped as their stripes are dealt (every stripe
/// is still shuffled, as it decides which items each bucket gets). A bucket wholly inside the
/// window is dealt straight to its place in the window's buffer; the at most two it only
/// partly covers go through an edge buffer ([`Plan::edge_len`], at most two buckets, a 32nd
/// of the shuffle) and their wanted part is copied over by [`Plan::finish`].
pub(crate) struct Plan<T> {
    keys: Seekable,
    root: Node,
    table: Table,
    /// Output positions wanted.
    window: (u64, u64),
    /// Stripes that splits of the stream cut into pieces, by stripe. The part that brings a
    /// stripe's last piece deals it, so pieces wait only while a neighbouring part runs
    /// elsewhere.
    pieces: Mutex<HashMap<u64, Pieces<T>>>,
    /// Items dealt so far: [`Plan::finish`] checks that every input was dealt once.
    dealt: AtomicU64,
}

/// The pieces of one cut stripe that have arrived.
struct Pieces<T> {
    arrived: u64,
    /// (first input position, items)
    parts: Vec<(u64, Vec<T>)>,
}

impl<T> Default for Pieces<T> {
    fn default() -> Self {
        Pieces {
            arrived: 0,
            parts: Vec::new(),
        }
    }
}

/// Where one bucket of a windowed plan goes.
enum Slot {
    /// Wholly inside the window: at this position of the window's buffer.
    Window(u64),
    /// Partly inside: at this position of the edge buffer.
    Edge(u64),
}

impl<T: Index> Plan<T> {
    /// The layout of output positions `[a, b)` (`a <= b <= m`) of the shuffle of `m` items
    /// keyed by `keys`: draws the root's stripe table.
    pub(crate) fn window(keys: &Seekable, m: u64, (a, b): (u64, u64)) -> Self {
        assert!(a <= b && b <= m, "a window inside the shuffle");
        let root = Node {
            m,
            depth: 0,
            path: 0,
        };
        Plan {
            keys: *keys,
            root,
            table: keys.table(&root),
            window: (a, b),
            pieces: Mutex::new(HashMap::new()),
            dealt: AtomicU64::new(0),
        }
    }

    /// The buckets the window meets, and where each goes.
    fn slots(&self) -> Vec<(usize, Slot)> {
        let ((a, b), m) = (self.window, self.root.m);
        if a == b {
            return Vec::new();
        }
        let mut at_edge = 0u64;
        (bucket_of(m, a)..=bucket_of(m, b - 1))
            .map(|g| {
                let (lo, hi) = (bucket_start(m, g), bucket_start(m, g + 1));
                let slot = if lo >= a && hi <= b {
                    Slot::Window(lo - a)
                } else {
                    at_edge += hi - lo;
                    Slot::Edge(at_edge - (hi - lo))
                };
                (g, slot)
            })
            .collect()
    }

    /// Length of the edge buffer the dealers need beside the window's.
    pub(crate) fn edge_len(&self) -> usize {
        let m = self.root.m;
        self.slots()
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Edge(_)))
            .map(|&(g, _)| (bucket_start(m, g + 1) - bucket_start(m, g)) as usize)
            .sum()
    }

    fn targets(&self, out: *mut T, edge: *mut T) -> Targets<T> {
        let mut to = Targets([std::ptr::null_mut(); FANOUT]);
        for (g, slot) in self.slots() {
            // wrapping_add: the offsets are inside the buffers (`slots`), checked by the
            // callers' lengths.
            to.0[g] = match slot {
                Slot::Window(at) => out.wrapping_add(at as usize),
                Slot::Edge(at) => edge.wrapping_add(at as usize),
            };
        }
        to
    }

    /// Deals root stripe `s` (its items in input order in `buf`) to `to`, the targets the
    /// plan's dealers hold.
    ///
    /// # Safety
    /// `to` must come from [`Plan::targets`] over the buffers given to [`Dealer::new`] for
    /// this plan, still borrowed by a dealer, and stripe `s` must not be dealt by anyone else.
    unsafe fn deal_root(&self, s: u64, buf: &mut [T], to: &Targets<T>) {
        // SAFETY: the targets hold the window's buckets (the caller's contract), and stripe
        // s's destinations are its own by the table.
        unsafe { self.keys.deal(&self.root, &self.table, s, buf, to) };
        self.dealt.fetch_add(buf.len() as u64, Ordering::Relaxed);
    }

    /// Shuffles every bucket the window meets, in `out` (the window's positions) and `edge`,
    /// the buffers the [`Dealer`]s of this plan filled (they must all be dropped, having taken
    /// every input); then copies the edge buckets' wanted parts to `out`.
    pub(crate) fn finish(self, out: &mut [T], edge: &mut [T]) {
        let ((a, b), m) = (self.window, self.root.m);
        assert_eq!(
            out.len() as u64,
            b - a,
            "the output holds the plan's window"
        );
        assert_eq!(edge.len(), self.edge_len(), "the edge buffer fits the plan");
        let slots = self.slots();
        let pieces = self.pieces.into_inner().expect("no dealer panicked");
        if cancelled() {
            // The walk feeding the dealers stopped early (Ctrl-C): the caller discards the
            // buffer, so there is nothing to check or shuffle.
            return;
        }
        assert!(
            pieces.is_empty() && self.dealt.into_inner() == m,
            "every input dealt once"
        );
        {
            let mut parts = Vec::with_capacity(slots.len());
            let (mut window, mut edges): (&mut [T], &mut [T]) = (&mut *out, &mut *edge);
            let mut skipped = 0u64;
            for (g, slot) in &slots {
                let (lo, hi) = (bucket_start(m, *g), bucket_start(m, g + 1));
                let len = (hi - lo) as usize;
                let part = match slot {
                    Slot::Window(at) => {
                        let rest = &mut std::mem::take(&mut window)[(at - skipped) as usize..];
                        let (part, tail) = rest.split_at_mut(len);
                        window = tail;
                        skipped = at + len as u64;
                        part
                    }
                    Slot::Edge(_) => {
                        let (part, tail) = std::mem::take(&mut edges).split_at_mut(len);
                        edges = tail;
                        part
                    }
                };
                parts.push((*g, part));
            }
            let keys = &self.keys;
            let root = &self.root;
            parts
                .into_par_iter()
                .for_each_init(Vec::<T>::new, |scratch, (g, part)| {
                    if cancelled() {
                        return; // the caller discards the buffer
                    }
                    let child = root.child(g);
                    let scratch: &mut [T] = if child.m > keys.shape.leaf {
                        scratch.resize(part.len(), T::from_u64(0));
                        &mut scratch[..part.len()]
                    } else {
                        &mut []
                    };
                    keys.shuffle(&child, part, scratch);
                });
        }
        for (g, slot) in slots {
            if let Slot::Edge(at) = slot {
                let (lo, hi) = (bucket_start(m, g), bucket_start(m, g + 1));
                let (x, z) = (lo.max(a), hi.min(b));
                let from = (at + x - lo) as usize;
                out[(x - a) as usize..(z - a) as usize]
                    .copy_from_slice(&edge[from..from + (z - x) as usize]);
            }
        }
    }
}

/// Writes a run of consecutive inputs `[next, end)` of a [`Plan`] to their buckets as they
/// arrive, a stripe at a time. Parts split off with [`Dealer::split`] can run on other threads;
/// a stripe a split cuts is dealt by the part that brings its last piece.
pub(crate) struct Dealer<'p, T: Index> {
    plan: &'p Plan<T>,
    /// Shared by the parts (64 pointers: kept out of the dealer, which sinks move around).
    to: Arc<Targets<T>>,
    next: u64,
    end: u64,
    /// Inputs `[from, next)`, not yet dealt.
    buf: Vec<T>,
    from: u64,
    /// The parts of a dealer hold the output buffers' exclusive borrows together.
    _out: PhantomData<&'p mut [T]>,
}

impl<'p, T: Index> Dealer<'p, T> {
    /// A dealer of all the plan's inputs into `out` (exactly as long as the plan's window) and
    /// `edge` (exactly [`Plan::edge_len`] long).
    pub(crate) fn new(plan: &'p Plan<T>, out: &'p mut [T], edge: &'p mut [T]) -> Self {
        let (a, b) = plan.window;
        assert_eq!(
            out.len() as u64,
            b - a,
            "the output holds the plan's window"
        );
        assert_eq!(edge.len(), plan.edge_len(), "the edge buffer fits the plan");
        Dealer {
            plan,
            to: Arc::new(plan.targets(out.as_mut_ptr(), edge.as_mut_ptr())),
            next: 0,
            end: plan.root.m,
            buf: Vec::new(),
            from: 0,
            _out: PhantomData,
        }
    }

    /// The parts for the next `count` inputs and for the ones after them.
    pub(crate) fn split(mut self, count: u64) -> (Self, Self) {
        assert!(count <= self.end - self.next, "split beyond the run");
        let mid = self.next + count;
        let right = Dealer {
            plan: self.plan,
            to: Arc::clone(&self.to),
            next: mid,
            end: self.end,
            buf: Vec::new(),
            from: mid,
            _out: PhantomData,
        };
        self.end = mid;
        (self, right)
    }

    /// Takes the next input.
    #[inline(always)]
    pub(crate) fn push(&mut self, v: T) {
        assert!(self.next < self.end, "more inputs than the run holds");
        if self.buf.capacity() == 0 {
            // A part of a few inputs (a short block's share of a value subtree) stays small.
            let stripe = self.plan.keys.shape.stripe;
            self.buf
                .reserve_exact(stripe.min(self.end - self.next) as usize);
        }
        self.buf.push(v);
        self.next += 1;
        let stripe = self.plan.keys.shape.stripe;
        if self.next.is_multiple_of(stripe) || self.next == self.plan.root.m {
            self.stripe_done();
        }
    }

    /// The current stripe has had its last input here: deal it, or leave the piece held with
    /// the plan if its first inputs went to another part.
    #[cold]
    fn stripe_done(&mut self) {
        let stripe = self.plan.keys.shape.stripe;
        let s = self.from / stripe;
        if self.from == s * stripe {
            // SAFETY: stripe s is whole here, and no other part deals it.
            unsafe { self.plan.deal_root(s, &mut self.buf, &self.to) };
            self.buf.clear();
        } else {
            self.leave_piece();
        }
        self.from = self.next;
    }

    /// Leaves the inputs held, part of a stripe another part also holds some of, with the
    /// plan; deals the stripe if they were its last.
    fn leave_piece(&mut self) {
        let plan = self.plan;
        let stripe = plan.keys.shape.stripe;
        let s = self.from / stripe;
        let len = plan.keys.items(plan.root.m, s, s + 1);
        let mut piece = std::mem::take(&mut self.buf);
        piece.shrink_to_fit();
        let whole = {
            let mut pieces = plan.pieces.lock().expect("no dealer panicked");
            let entry = pieces.entry(s).or_default();
            entry.arrived += piece.len() as u64;
            entry.parts.push((self.from, piece));
            if entry.arrived == len {
                pieces.remove(&s).map(|p| p.parts)
            } else {
                None
            }
        };
        if let Some(mut parts) = whole {
            parts.sort_unstable_by_key(|p| p.0);
            let mut buf = Vec::with_capacity(len as usize);
            for (from, items) in parts {
                assert_eq!(from, s * stripe + buf.len() as u64, "pieces are contiguous");
                buf.extend_from_slice(&items);
            }
            // SAFETY: the stripe is whole now, and only the part that completed it deals it.
            unsafe { plan.deal_root(s, &mut buf, &self.to) };
        }
    }
}

impl<T: Index> Drop for Dealer<'_, T> {
    /// A part that stops inside a stripe leaves its piece with the plan.
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.leave_piece();
        }
    }
}

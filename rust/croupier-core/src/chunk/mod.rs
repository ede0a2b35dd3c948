//! Chunked sampling for on-disk arrays: contiguous chunks of observations read a few at a time,
//! batches shuffled in memory (annbatch's access pattern), dealt to data-parallel ranks in equal
//! batch counts.
//!
//! # The plan of an epoch
//!
//! The observation range `[start, stop)` is cut into chunks of `chunk_size` from `start`; the
//! last one is short when the range is not a multiple. The epoch's chunk order is the `F` full
//! chunks in the order of a keyed pseudorandom permutation of `[0, F)` when shuffling (in order
//! otherwise), then the short chunk (annbatch places it last too, so that a request of whole
//! chunks never holds it in the middle). Rank `r` takes the chunks at order positions
//! `r, r + W, ...` (torch's striding); when the chunk count is not a multiple of `W`,
//! `drop_last` cuts the order to a multiple, otherwise it is padded by repeating its head. The
//! short chunk, if kept, is therefore the last chunk of the rank holding it.
//!
//! A rank reads its chunks `preload` at a time: one *request* is those chunks' ranges and the
//! batches over the concatenation of what they load, as positions into it. Each request's
//! positions are permuted by the stream `(seed, epoch, ChunkSplits, fold(rank, request))` when
//! shuffling, and cut into batches of `batch_size` (`chunk_size * preload` is a multiple of it,
//! so only a rank's last request can end in a partial batch).
//!
//! Every rank yields the same number of batches `B`: with `drop_last` the smallest rank's whole
//! batches (a rank with more drops its surplus, and does not read chunks it would not use);
//! without, the largest rank's count including a partial last batch, a smaller rank padding its
//! last request with repeats of that request's own positions.
//!
//! # Why the chunk order is a keyed permutation evaluated per position
//!
//! A request must be computable on its own, so that a resume at any request costs the same
//! whatever the epoch's size, and a rank's whole epoch costs its own chunks, not everyone's.
//! The chunk order used to be a Fisher–Yates shuffle of all `F` full chunk ids, drawn whole by
//! every rank before its first request (tens of milliseconds at 1e9 rows in chunks of 256, 8
//! GiB of ids at 2**30 chunks), and handed whole to every request. It is now `draw::prp::Prp`,
//! the permutation the per-rank order's permuted leaves use (`deal::class_split`): a
//! six-round Feistel network with cycle walking (Black and Rogaway), or for `F <= 256` an
//! explicit Fisher–Yates table, keyed by the first word of the stream
//! `(seed, epoch, ChunkOrder, 0)`. Order position `p < F` holds full chunk `prp(p)`, computed
//! in O(1) time and memory, so request `j` costs O(`preload`) chunk ids plus its own in-memory
//! shuffle.
//!
//! Rejected: a seekable Fisher–Yates (there is none: its last swap can touch any slot); a
//! rank's share drawn by hypergeometric splitting as the per-rank order does (still O(its chunks)
//! before the first request); caching the whole order (the memory and the first-request cost
//! this removes). Given up: a Feistel permutation is pseudorandom, not a uniform draw from all
//! `F!` orders (a keyed family reaches only a structured subset of them), which is immaterial
//! for the order in which chunks are read; small orders, where it could show, are exact
//! shuffles. Unchanged:
//! the short chunk last, the striding, padding and cutting, and every request's in-memory
//! order.

use crate::deal::Deal;
use crate::draw::prp::Prp;
use crate::error::{Error, Result};
use crate::index::{Index, Indices};
use crate::shuffle::fisher_yates::fisher_yates;
use crate::stream::{fold, Purpose, Stream};

/// A rank's chunked reading plan as `ChunkSampler` sets it: the rows read, how they are cut
/// into chunks, requests and batches, the shuffles, and the rank.
///
/// # Examples
///
/// ```
/// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
/// use croupier_core::Deal;
///
/// let config = ChunkConfig {
///     start: 0,
///     stop: 1000,
///     chunk_size: 100,
///     preload: 2,
///     batch_size: 50,
///     shuffle: true,
///     seed: 0,
///     deal: Deal { num_replicas: 2, rank: 0, drop_last: false },
/// };
/// assert!(ChunkPlan::new(&config).is_ok());
/// assert!(ChunkPlan::new(&ChunkConfig { batch_size: 30, ..config }).is_err()); // 200 % 30 != 0
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkConfig {
    /// The first row read.
    pub start: u64,
    /// The end of the rows read (`start <= stop`).
    pub stop: u64,
    /// Rows per chunk (`>= 1`); the last chunk is short when the rows are not a multiple.
    pub chunk_size: u64,
    /// Chunks per load request (annbatch's `preload_nchunks`, `>= 1`).
    pub preload: u64,
    /// Rows per batch (`>= 1`); `chunk_size * preload` must be a multiple of it.
    pub batch_size: u64,
    /// Shuffle the chunk order and each request's rows.
    pub shuffle: bool,
    /// The seed of the shuffles.
    pub seed: u64,
    /// The rank, its world, and whether the chunks are cut (`drop_last`) or padded to a
    /// multiple of the ranks.
    pub deal: Deal,
}

/// The chunked reading plan of one rank; see the module documentation.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    start: u64,
    stop: u64,
    chunk_size: u64,
    preload: u64,
    batch_size: u64,
    shuffle: bool,
    seed: u64,
    w: u64,
    rank: u64,
    /// Chunks in the epoch's order before padding or cutting.
    chunks: u64,
    /// Batches every rank yields.
    batches: u64,
    /// Observations this rank yields (its chunks' observations, cut or padded to the batches).
    served: u64,
    /// Chunks this rank reads.
    reads: u64,
}

/// One load request: the ranges to read, in order, and the batches as positions into the
/// concatenation of what they load.
#[derive(Debug, Clone)]
pub struct ChunkRequest {
    /// `(start, stop)` of each chunk read, in order.
    pub ranges: Vec<(u64, u64)>,
    /// Every batch's positions, one after another.
    pub positions: Indices,
    /// Batch `i` is `positions[offsets[i]..offsets[i + 1]]`.
    pub offsets: Vec<u64>,
}

impl ChunkPlan {
    /// The plan `config` describes: rank `config.deal.rank`'s over rows `[start, stop)`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a zero size, `chunk_size * preload` not a multiple of
    /// `batch_size`, `start > stop`, no ranks or a rank outside them.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::Deal;
    ///
    /// # let deal = Deal { num_replicas: 2, rank: 0, drop_last: false };
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal };
    /// // Rows 0..1000 in chunks of 100 read 2 at a time, on rank 0 of 2.
    /// let plan = ChunkPlan::new(&config).unwrap();
    /// assert_eq!(plan.requests(), 3); // its 5 chunks, 2 at a time
    /// assert!(ChunkPlan::new(&ChunkConfig { chunk_size: 0, ..config }).is_err());
    /// assert!(ChunkPlan::new(&ChunkConfig { start: 1001, ..config }).is_err()); // start > stop
    /// ```
    pub fn new(config: &ChunkConfig) -> Result<Self> {
        config.check()?;
        let ChunkConfig {
            start,
            stop,
            chunk_size,
            preload,
            batch_size,
            shuffle,
            seed,
            deal,
        } = *config;
        let (w, rank, drop_last) = (deal.num_replicas, deal.rank, deal.drop_last);
        let n = stop - start;
        let chunks = n.div_ceil(chunk_size);
        let dealt = if drop_last {
            chunks / w * w
        } else {
            chunks.div_ceil(w) * w
        };
        let short = n % chunk_size;
        let obs = |r: u64| rank_observations(chunks, dealt, w, chunk_size, short, r);
        let (least, most) = observation_range(chunks, w, obs);
        let mine = obs(rank);
        let (batches, served) = if drop_last {
            let batches = least / batch_size;
            (batches, batches * batch_size)
        } else {
            let batches = most.div_ceil(batch_size);
            let needed = if batches == 0 {
                0
            } else {
                (batches - 1) * batch_size + 1
            };
            (batches, mine.max(needed))
        };
        // Chunks read: all of this rank's when padding; with drop_last only those holding the
        // observations served.
        let reads = match (mine, drop_last) {
            (0, _) => 0,
            (_, true) => served.div_ceil(chunk_size),
            (_, false) => dealt / w,
        };
        Ok(ChunkPlan {
            start,
            stop,
            chunk_size,
            preload,
            batch_size,
            shuffle,
            seed,
            w,
            rank,
            chunks,
            batches,
            served,
            reads,
        })
    }

    /// Batches every rank yields in an epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::Deal;
    ///
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal: Deal::default() };
    /// // 1000 rows over 3 ranks: every rank yields as many batches, covering all rows.
    /// let plans: Vec<ChunkPlan> = (0..3)
    ///     .map(|rank| {
    ///         let deal = Deal { num_replicas: 3, rank, drop_last: false };
    ///         ChunkPlan::new(&ChunkConfig { deal, ..config }).unwrap()
    ///     })
    ///     .collect();
    /// assert!(plans.iter().all(|p| p.batches() == plans[0].batches()));
    /// assert!(3 * plans[0].batches() * 50 >= 1000);
    /// ```
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Load requests this rank yields in an epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::Deal;
    ///
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal: Deal::default() };
    /// let plan = ChunkPlan::new(&config).unwrap();
    /// // The rank's chunks, `preload` (2) at a time.
    /// assert_eq!(plan.requests(), plan.rank_chunks(0).len().div_ceil(2) as u64);
    /// assert!(plan.request(0, plan.requests() - 1).is_ok());
    /// ```
    pub fn requests(&self) -> u64 {
        if self.batches == 0 {
            0
        } else {
            self.reads.div_ceil(self.preload)
        }
    }

    /// Batches in one full request (`chunk_size * preload / batch_size`).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::Deal;
    ///
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal: Deal::default() };
    /// let plan = ChunkPlan::new(&config).unwrap();
    /// assert_eq!(plan.batches_per_request(), 100 * 2 / 50);
    /// let full = plan.request(0, 0).unwrap();
    /// assert_eq!(full.offsets.len() as u64, plan.batches_per_request() + 1);
    /// ```
    pub fn batches_per_request(&self) -> u64 {
        self.chunk_size * self.preload / self.batch_size
    }

    /// The epoch's chunk order, evaluated one position at a time.
    fn order(&self, epoch: u64) -> ChunkOrder {
        let full = (self.stop - self.start) / self.chunk_size;
        let prp = (self.shuffle && full > 1).then(|| {
            let key = Stream::new(self.seed, epoch, Purpose::ChunkOrder, 0).next_u64();
            Prp::new(full, key)
        });
        ChunkOrder {
            full,
            chunks: self.chunks,
            prp,
        }
    }

    /// This rank's `i`-th chunk read (`i < reads`): order position `rank + i * w`.
    fn rank_chunk(&self, order: &ChunkOrder, i: u64) -> u64 {
        order.at(self.rank + i * self.w)
    }

    /// This rank's chunk ids for `epoch`, in reading order (only those read): O(its own
    /// chunks). [`ChunkPlan::request`] does not need it; it is the whole list, for tests and
    /// inspection.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::Deal;
    ///
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal: Deal::default() };
    /// // 10 chunks on 2 ranks, none padded: every chunk read once.
    /// let mut all: Vec<u64> = (0..2)
    ///     .flat_map(|rank| {
    ///         let deal = Deal { num_replicas: 2, rank, drop_last: false };
    ///         ChunkPlan::new(&ChunkConfig { deal, ..config }).unwrap().rank_chunks(3)
    ///     })
    ///     .collect();
    /// all.sort_unstable();
    /// assert_eq!(all, (0..10).collect::<Vec<u64>>());
    /// ```
    pub fn rank_chunks(&self, epoch: u64) -> Vec<u64> {
        let order = self.order(epoch);
        (0..self.reads)
            .map(|i| self.rank_chunk(&order, i))
            .collect()
    }

    /// Request `j` of `epoch`, computed on its own: O(`preload`) chunk ids and the request's
    /// own in-memory order, whatever the epoch's size.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for `j` at or past [`ChunkPlan::requests`].
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::chunk::{ChunkConfig, ChunkPlan};
    /// use croupier_core::{Deal, Indices};
    ///
    /// # let config = ChunkConfig { start: 0, stop: 1000, chunk_size: 100, preload: 2, batch_size: 50, shuffle: true, seed: 0, deal: Deal::default() };
    /// let plan = ChunkPlan::new(&config).unwrap();
    /// let req = plan.request(4, 1).unwrap();
    /// let loaded: u64 = req.ranges.iter().map(|(a, b)| b - a).sum();
    /// let Indices::U32(positions) = &req.positions else { unreachable!() };
    /// assert!(positions.iter().all(|&p| u64::from(p) < loaded)); // positions in what it loads
    /// assert!(plan.request(4, plan.requests()).is_err());
    /// ```
    pub fn request(&self, epoch: u64, j: u64) -> Result<ChunkRequest> {
        let requests = self.requests();
        if j >= requests {
            return Err(Error::out_of_range(
                "request",
                format!("in [0, {requests})"),
                j,
            ));
        }
        let order = self.order(epoch);
        let lo = j * self.preload;
        let hi = self.reads.min(lo + self.preload);
        let ranges: Vec<(u64, u64)> = (lo..hi)
            .map(|i| {
                let a = self.start + self.rank_chunk(&order, i) * self.chunk_size;
                (a, self.stop.min(a + self.chunk_size))
            })
            .collect();
        let loaded: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        // Observations this request serves: full requests serve all they load; the last one
        // serves the rest of `served` (less than it loads with drop_last, more when padded).
        let before = j * self.chunk_size * self.preload;
        let serve = if j + 1 < requests {
            loaded
        } else {
            self.served - before
        };
        let positions = if loaded <= u64::from(u32::MAX) {
            Indices::U32(self.positions::<u32>(epoch, j, loaded, serve))
        } else {
            Indices::U64(self.positions::<u64>(epoch, j, loaded, serve))
        };
        let offsets = (0..serve.div_ceil(self.batch_size))
            .map(|b| b * self.batch_size)
            .chain(std::iter::once(serve))
            .collect();
        Ok(ChunkRequest {
            ranges,
            positions,
            offsets,
        })
    }

    fn positions<T: Index>(&self, epoch: u64, j: u64, loaded: u64, serve: u64) -> Vec<T> {
        let mut v: Vec<T> = (0..loaded).map(T::from_u64).collect();
        if self.shuffle && loaded > 1 {
            let mut stream =
                Stream::new(self.seed, epoch, Purpose::ChunkSplits, fold(self.rank, j));
            fisher_yates(&mut v, &mut stream);
        }
        if serve <= loaded {
            v.truncate(serve as usize);
        } else {
            // Padding: repeat this request's own positions, in its order, as often as needed.
            let extra: Vec<T> = (0..serve - loaded)
                .map(|i| v[(i % loaded) as usize])
                .collect();
            v.extend(extra);
        }
        v
    }
}

/// An epoch's chunk order: full chunk `prp(p)` (or `p` unshuffled) at position `p < full`,
/// then the short chunk `full` if the range has one; positions past the order repeat its head.
#[derive(Debug, Clone)]
struct ChunkOrder {
    full: u64,
    chunks: u64,
    prp: Option<Prp>,
}

impl ChunkOrder {
    /// The chunk at order position `p` (`p < dealt`, so `chunks >= 1`).
    fn at(&self, p: u64) -> u64 {
        // Positions past the order repeat its head (torch's padding), as often as needed.
        let p = p % self.chunks;
        match &self.prp {
            Some(prp) if p < self.full => prp.apply(p),
            _ => p,
        }
    }
}

/// Observations of rank `r`: `dealt / w` order positions `r, r + w, ...`, each a full chunk
/// but position `chunks - 1` when the range ends in a short chunk; positions past the order
/// repeat its head.
fn rank_observations(chunks: u64, dealt: u64, w: u64, chunk_size: u64, short: u64, r: u64) -> u64 {
    let per_rank = dealt / w;
    if per_rank == 0 || chunks == 0 {
        return 0;
    }
    let len_at = |q: u64| {
        if short > 0 && q % chunks == chunks - 1 {
            short
        } else {
            chunk_size
        }
    };
    if chunks < w {
        // Few chunks, many ranks: each rank holds one order position (repeats included).
        return len_at(r);
    }
    // The padding repeats only head positions below chunks - 1, so only the rank dealt
    // position chunks - 1 (if dealt) holds the short chunk.
    let holds_short = short > 0 && chunks <= dealt && (chunks - 1) % w == r;
    per_rank * chunk_size - if holds_short { chunk_size - short } else { 0 }
}

impl ChunkConfig {
    /// Refuses a configuration no plan has: a zero size, `chunk_size * preload` not a
    /// multiple of `batch_size`, `start > stop`, no ranks or a rank outside them.
    fn check(&self) -> Result<()> {
        for (name, v) in [
            ("chunk_size", self.chunk_size),
            ("preload_nchunks", self.preload),
            ("batch_size", self.batch_size),
        ] {
            if v == 0 {
                return Err(Error::out_of_range(name, ">= 1", v));
            }
        }
        let memory = self.chunk_size.checked_mul(self.preload).ok_or_else(|| {
            Error::out_of_range("chunk_size * preload_nchunks", "< 2**64", "more")
        })?;
        if memory % self.batch_size != 0 {
            return Err(Error::out_of_range(
                "chunk_size * preload_nchunks",
                format!("a multiple of batch_size = {}", self.batch_size),
                memory,
            ));
        }
        if self.start > self.stop {
            return Err(Error::out_of_range(
                "start",
                format!("<= stop = {}", self.stop),
                self.start,
            ));
        }
        self.deal.check()
    }
}

/// The fewest and the most observations a rank of `w` holds (`obs(r)` is rank `r`'s).
fn observation_range(chunks: u64, w: u64, obs: impl Fn(u64) -> u64) -> (u64, u64) {
    if w <= 1 << 16 {
        return (0..w)
            .map(obs)
            .fold((u64::MAX, 0), |(a, b), o| (a.min(o), b.max(o)));
    }
    // Only the short chunk's holder differs (and, with fewer chunks than ranks, the ranks
    // past the chunks, which take repeats): rank 0 is full, the holder short.
    let holder = chunks.saturating_sub(1) % w;
    let (a, b) = (obs(0), obs(holder));
    (a.min(b), a.max(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::chi2_flat;

    /// Rows `[0, 1000)` in chunks of 16 read 4 at a time, batches of 8, shuffled with seed 0,
    /// on one rank: what the tests change field by field.
    const BASE: ChunkConfig = ChunkConfig {
        start: 0,
        stop: 1000,
        chunk_size: 16,
        preload: 4,
        batch_size: 8,
        shuffle: true,
        seed: 0,
        deal: Deal {
            num_replicas: 1,
            rank: 0,
            drop_last: false,
        },
    };

    fn positions(req: &ChunkRequest) -> Vec<u64> {
        match &req.positions {
            Indices::U32(v) => v.iter().map(|&x| u64::from(x)).collect(),
            Indices::U64(v) => v.clone(),
        }
    }

    fn all_batches(plan: &ChunkPlan, epoch: u64) -> Vec<Vec<u64>> {
        let mut out = Vec::new();
        for j in 0..plan.requests() {
            let req = plan.request(epoch, j).unwrap();
            let loaded: Vec<u64> = req.ranges.iter().flat_map(|&(a, b)| a..b).collect();
            let pos = positions(&req);
            for w in req.offsets.windows(2) {
                out.push(
                    pos[w[0] as usize..w[1] as usize]
                        .iter()
                        .map(|&p| loaded[p as usize])
                        .collect(),
                );
            }
        }
        out
    }

    /// The epoch's whole chunk order as a list, the way it was dealt before requests were
    /// computed on their own: the full chunks permuted, then the short one.
    fn whole_order(plan: &ChunkPlan, epoch: u64) -> Vec<u64> {
        let full = (plan.stop - plan.start) / plan.chunk_size;
        let order = plan.order(epoch);
        let mut v: Vec<u64> = (0..full)
            .map(|p| order.prp.as_ref().map_or(p, |prp| prp.apply(p)))
            .collect();
        if plan.chunks > full {
            v.push(full);
        }
        v
    }

    #[test]
    fn every_observation_once_and_equal_batch_counts() {
        for &(start, stop) in &[(0u64, 1000u64), (7, 1000), (0, 64), (0, 3), (5, 5)] {
            for w in [1u64, 2, 3, 7, 16] {
                for drop_last in [false, true] {
                    let plans: Vec<ChunkPlan> = (0..w)
                        .map(|r| {
                            ChunkPlan::new(&ChunkConfig {
                                start,
                                stop,
                                seed: 3,
                                deal: Deal {
                                    num_replicas: w,
                                    rank: r,
                                    drop_last,
                                },
                                ..BASE
                            })
                            .unwrap()
                        })
                        .collect();
                    let counts: Vec<usize> =
                        plans.iter().map(|p| all_batches(p, 1).len()).collect();
                    assert!(
                        counts.iter().all(|&c| c as u64 == plans[0].batches()),
                        "{counts:?}"
                    );
                    let mut seen: Vec<u64> = plans
                        .iter()
                        .flat_map(|p| all_batches(p, 1).concat())
                        .collect();
                    seen.sort_unstable();
                    let mut distinct = seen.clone();
                    distinct.dedup();
                    assert!(distinct.iter().all(|&x| (start..stop).contains(&x)));
                    if drop_last {
                        assert_eq!(distinct.len(), seen.len(), "no repeats when dropping");
                    } else {
                        assert_eq!(distinct, (start..stop).collect::<Vec<_>>(), "all covered");
                    }
                }
            }
        }
    }

    #[test]
    fn the_order_is_a_permutation_of_the_full_chunks_then_the_short_one() {
        // Both sides of the table/Feistel boundary (256 full chunks), with and without a short
        // chunk, and a domain of one.
        for full in [1u64, 2, 5, 255, 256, 257, 1000, 4099] {
            for short in [0u64, 3] {
                let plan = ChunkPlan::new(&ChunkConfig {
                    stop: full * 8 + short,
                    chunk_size: 8,
                    preload: 1,
                    seed: 11,
                    ..BASE
                })
                .unwrap();
                for epoch in [0u64, 1, 2] {
                    let order = whole_order(&plan, epoch);
                    let mut sorted = order[..full as usize].to_vec();
                    sorted.sort_unstable();
                    assert_eq!(sorted, (0..full).collect::<Vec<_>>(), "full={full}");
                    if short > 0 {
                        assert_eq!(order.last(), Some(&full), "short chunk last");
                    }
                    if full > 3 {
                        assert_ne!(order[..full as usize], sorted[..], "shuffled");
                    }
                }
            }
        }
    }

    #[test]
    fn requests_deal_the_whole_order_as_a_list_would() {
        // Each request, computed on its own, holds exactly the chunks the whole-list dealing
        // gives it: rank r's i-th chunk is order[(r + i * w) % chunks], cut to the chunks read;
        // `rank_chunks` is that list.
        for &(start, stop, chunk) in &[
            (0u64, 1000u64, 16u64),
            (7, 1000, 16),
            (0, 64, 16),
            (0, 3, 16),
            (0, 100_000, 10),
            (3, 100_003, 100),
        ] {
            for w in [1u64, 2, 3, 7, 16] {
                for drop_last in [false, true] {
                    for shuffle in [false, true] {
                        for r in 0..w {
                            let plan = ChunkPlan::new(&ChunkConfig {
                                start,
                                stop,
                                chunk_size: chunk,
                                shuffle,
                                seed: 5,
                                deal: Deal {
                                    num_replicas: w,
                                    rank: r,
                                    drop_last,
                                },
                                ..BASE
                            })
                            .unwrap();
                            let order = whole_order(&plan, 2);
                            if !shuffle {
                                assert_eq!(order, (0..plan.chunks).collect::<Vec<_>>());
                            }
                            let list: Vec<u64> = (0..plan.reads)
                                .map(|i| order[((r + i * w) % plan.chunks) as usize])
                                .collect();
                            assert_eq!(plan.rank_chunks(2), list);
                            let mut got = Vec::new();
                            for j in 0..plan.requests() {
                                let req = plan.request(2, j).unwrap();
                                assert!(req.ranges.len() as u64 <= plan.preload);
                                got.extend(req.ranges);
                            }
                            let want: Vec<(u64, u64)> = list
                                .iter()
                                .map(|&c| {
                                    let a = start + c * chunk;
                                    (a, stop.min(a + chunk))
                                })
                                .collect();
                            if plan.requests() > 0 {
                                assert_eq!(got, want);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn without_padding_every_chunk_is_read_once() {
        // 64 full chunks over 4 ranks, and over 8 (the Feistel domain of 64 has no spare bit)
        // and 1000 chunks (cycle walking).
        for &(chunks, w) in &[(64u64, 4u64), (64, 8), (1000, 8), (1000, 5)] {
            let mut seen: Vec<u64> = (0..w)
                .flat_map(|r| {
                    ChunkPlan::new(&ChunkConfig {
                        stop: chunks * 4,
                        chunk_size: 4,
                        preload: 3,
                        batch_size: 2,
                        seed: 1,
                        deal: Deal {
                            num_replicas: w,
                            rank: r,
                            drop_last: false,
                        },
                        ..BASE
                    })
                    .unwrap()
                    .rank_chunks(9)
                })
                .collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..chunks).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_first_chunk_is_spread_over_epochs() {
        // Where order position 0 lands over many epochs, 1000 chunks (a Feistel domain) in 10
        // ranges of 100: chi-square at 9 degrees of freedom.
        let plan = ChunkPlan::new(&ChunkConfig {
            chunk_size: 1,
            preload: 1,
            batch_size: 1,
            seed: 4,
            ..BASE
        })
        .unwrap();
        let mut counts = [0u64; 10];
        let trials = 20_000u64;
        for epoch in 0..trials {
            counts[(plan.order(epoch).at(0) / 100) as usize] += 1;
        }
        let chi2 = chi2_flat(&counts, trials as f64 / 10.0);
        assert!(chi2 < 27.9, "chi2 = {chi2} (p < 0.001 at 9 dof)");
    }

    #[test]
    fn in_memory_orders_are_unchanged() {
        // Pins taken before the chunk order became a keyed permutation: each request's
        // in-memory order (and its padding) depends only on (seed, epoch, rank, request) and
        // what it loads, and must not have moved.
        let pins: [(&[u64], &[u64]); 4] = [
            (
                &[
                    12, 0, 2, 14, 9, 5, 3, 11, 1, 8, 10, 17, 16, 15, 13, 18, 4, 7, 19, 6,
                ],
                &[3, 2, 8, 9, 5, 6, 7, 0, 4, 1],
            ),
            (
                &[
                    7, 10, 5, 1, 12, 13, 6, 14, 11, 18, 9, 15, 19, 4, 2, 16, 17, 0, 8, 3,
                ],
                &[2, 0, 3, 4, 1, 2],
            ),
            (
                &[
                    3, 16, 11, 17, 4, 9, 10, 12, 5, 6, 18, 19, 7, 1, 14, 0, 15, 13, 8, 2,
                ],
                &[4, 9, 6, 5, 0, 2, 8, 7, 3, 1],
            ),
            (
                &[
                    15, 9, 0, 11, 10, 12, 4, 19, 5, 14, 3, 13, 8, 17, 1, 18, 7, 16, 6, 2,
                ],
                &[2, 8, 9, 7, 4, 0, 6, 5, 3, 1],
            ),
        ];
        for (r, (first, last)) in pins.iter().enumerate() {
            let plan = ChunkPlan::new(&ChunkConfig {
                stop: 95,
                chunk_size: 10,
                preload: 2,
                batch_size: 5,
                seed: 7,
                deal: Deal {
                    num_replicas: 4,
                    rank: r as u64,
                    drop_last: false,
                },
                ..BASE
            })
            .unwrap();
            assert_eq!(plan.requests(), 2);
            assert_eq!(positions(&plan.request(2, 0).unwrap()), *first, "rank {r}");
            let req = plan.request(2, 1).unwrap();
            assert_eq!(positions(&req), *last, "rank {r}");
            // Rank 1 holds the short chunk and pads one repeat of its request's own order.
            let offsets: &[u64] = if r == 1 { &[0, 5, 6] } else { &[0, 5, 10] };
            assert_eq!(req.offsets, offsets);
        }
    }

    #[test]
    fn value_stability_pin_of_the_chunk_order() {
        // A deliberate pin of the chunk order since it became a keyed permutation (0.2.0; the
        // whole-list Fisher–Yates gave [52, 61, 34, 41, 16, 29, 55, 6, 26, 0, 12, 49, 30, 14,
        // 4, 54, 5, 2, 56, 17, 9] here). A change here changes every user's read order: say
        // so in CHANGELOG.md.
        let plan = ChunkPlan::new(&ChunkConfig {
            preload: 2,
            seed: 3,
            deal: Deal {
                num_replicas: 3,
                rank: 1,
                drop_last: false,
            },
            ..BASE
        })
        .unwrap();
        assert_eq!(plan.rank_chunks(1), PIN);
        assert_eq!(plan.request(1, 0).unwrap().ranges[0].0, PIN[0] * 16);
        // And on a Feistel domain (10,000 full chunks): rank 2 of 4's first eight, epoch 0.
        let plan = ChunkPlan::new(&ChunkConfig {
            stop: 100_000,
            chunk_size: 10,
            preload: 1,
            batch_size: 10,
            seed: 3,
            deal: Deal {
                num_replicas: 4,
                rank: 2,
                drop_last: false,
            },
            ..BASE
        })
        .unwrap();
        assert_eq!(plan.rank_chunks(0)[..8], FEISTEL_PIN);
    }

    const PIN: [u64; 21] = [
        57, 40, 37, 45, 3, 54, 32, 19, 15, 52, 44, 56, 49, 50, 61, 14, 48, 2, 9, 24, 20,
    ];
    const FEISTEL_PIN: [u64; 8] = [3909, 3944, 4433, 2612, 1882, 4055, 3448, 6246];

    #[test]
    fn a_request_of_an_epoch_too_large_to_list_is_computed_on_its_own() {
        // 2**62 rows in chunks of 1024 over 8 ranks: 2**52 chunks, which no list could hold.
        let n = 1u64 << 62;
        let plans: Vec<ChunkPlan> = (0..8)
            .map(|r| {
                ChunkPlan::new(&ChunkConfig {
                    stop: n,
                    chunk_size: 1024,
                    batch_size: 256,
                    seed: 1,
                    deal: Deal {
                        num_replicas: 8,
                        rank: r,
                        drop_last: true,
                    },
                    ..BASE
                })
                .unwrap()
            })
            .collect();
        let last = plans[0].requests() - 1;
        assert_eq!(last + 1, (1u64 << 52) / 8 / 4);
        let mut starts = Vec::new();
        for plan in &plans {
            for j in [0, 1, last / 2, last] {
                let req = plan.request(7, j).unwrap();
                assert_eq!(req.ranges.len(), 4);
                assert_eq!(req.offsets.len(), 17);
                for &(a, b) in &req.ranges {
                    assert!(a % 1024 == 0 && b == a + 1024 && b <= n);
                    starts.push(a);
                }
            }
        }
        let mut distinct = starts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            starts.len(),
            "ranks and requests read disjoint chunks"
        );
    }

    #[test]
    fn deterministic_and_epochs_differ() {
        let p = ChunkPlan::new(&ChunkConfig {
            stop: 10_000,
            chunk_size: 100,
            preload: 2,
            batch_size: 50,
            seed: 9,
            deal: Deal {
                num_replicas: 2,
                rank: 1,
                drop_last: false,
            },
            ..BASE
        })
        .unwrap();
        assert_eq!(all_batches(&p, 3), all_batches(&p, 3));
        assert_ne!(all_batches(&p, 3), all_batches(&p, 4));
        let q = ChunkPlan::new(&ChunkConfig {
            stop: 10_000,
            chunk_size: 100,
            preload: 2,
            batch_size: 50,
            shuffle: false,
            seed: 9,
            ..BASE
        })
        .unwrap();
        assert_eq!(all_batches(&q, 0).concat(), (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(ChunkPlan::new(&ChunkConfig {
            stop: 10,
            chunk_size: 0,
            preload: 1,
            batch_size: 1,
            ..BASE
        })
        .is_err());
        assert!(ChunkPlan::new(&ChunkConfig {
            stop: 10,
            chunk_size: 10,
            preload: 1,
            batch_size: 3,
            ..BASE
        })
        .is_err());
        assert!(ChunkPlan::new(&ChunkConfig {
            start: 5,
            stop: 4,
            chunk_size: 1,
            preload: 1,
            batch_size: 1,
            ..BASE
        })
        .is_err());
        assert!(ChunkPlan::new(&ChunkConfig {
            stop: 10,
            chunk_size: 1,
            preload: 1,
            batch_size: 1,
            deal: Deal {
                num_replicas: 2,
                rank: 2,
                drop_last: false
            },
            ..BASE
        })
        .is_err());
        let p = ChunkPlan::new(&ChunkConfig {
            stop: 10,
            chunk_size: 2,
            preload: 1,
            batch_size: 1,
            ..BASE
        })
        .unwrap();
        assert!(p.request(0, p.requests()).is_err());
    }
}

//! Chunked sampling for on-disk arrays: contiguous chunks of observations read a few at a time,
//! batches shuffled in memory (annbatch's access pattern), dealt to data-parallel ranks in equal
//! batch counts.
//!
//! # The plan of an epoch
//!
//! The observation range `[start, stop)` is cut into chunks of `chunk_size` from `start`; the
//! last one is short when the range is not a multiple. The epoch's chunk order is the full
//! chunks, permuted by Fisher–Yates with the stream `(seed, epoch, ChunkOrder, 0)` when
//! shuffling (in order otherwise), then the short chunk (annbatch places it last too, so that a
//! request of whole chunks never holds it in the middle). Rank `r` takes the chunks at order
//! positions `r, r + W, ...` (torch's striding); when the chunk count is not a multiple of `W`,
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

use crate::error::{Error, Result};
use crate::index::{Index, Indices};
use crate::shuffle::fisher_yates::fisher_yates;
use crate::stream::{fold, Purpose, Stream};

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
    /// The plan of rank `rank` of `w` over `[start, stop)`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a zero size, `chunk_size * preload` not a multiple of
    /// `batch_size`, `start > stop`, `w == 0` or `rank >= w`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        start: u64,
        stop: u64,
        chunk_size: u64,
        preload: u64,
        batch_size: u64,
        shuffle: bool,
        drop_last: bool,
        seed: u64,
        w: u64,
        rank: u64,
    ) -> Result<Self> {
        for (name, v) in [
            ("chunk_size", chunk_size),
            ("preload_nchunks", preload),
            ("batch_size", batch_size),
        ] {
            if v == 0 {
                return Err(Error::out_of_range(name, ">= 1", v));
            }
        }
        let memory = chunk_size.checked_mul(preload).ok_or_else(|| {
            Error::out_of_range("chunk_size * preload_nchunks", "< 2**64", "more")
        })?;
        if memory % batch_size != 0 {
            return Err(Error::out_of_range(
                "chunk_size * preload_nchunks",
                format!("a multiple of batch_size = {batch_size}"),
                memory,
            ));
        }
        if start > stop {
            return Err(Error::out_of_range(
                "start",
                format!("<= stop = {stop}"),
                start,
            ));
        }
        if w == 0 {
            return Err(Error::out_of_range("num_replicas", ">= 1", w));
        }
        if rank >= w {
            return Err(Error::out_of_range("rank", format!("in [0, {w})"), rank));
        }
        let n = stop - start;
        let chunks = n.div_ceil(chunk_size);
        let dealt = if drop_last {
            chunks / w * w
        } else {
            chunks.div_ceil(w) * w
        };
        let mut plan = ChunkPlan {
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
            batches: 0,
            served: 0,
            reads: 0,
        };
        let short = n % chunk_size;
        let obs = |r: u64| rank_observations(chunks, dealt, w, chunk_size, short, r);
        let (least, most) = if w <= 1 << 16 {
            (0..w)
                .map(obs)
                .fold((u64::MAX, 0), |(a, b), o| (a.min(o), b.max(o)))
        } else {
            // Only the short chunk's holder differs (and, with fewer chunks than ranks, the
            // ranks past the chunks, which take repeats): rank 0 is full, the holder short.
            let holder = (chunks - 1) % w;
            let (a, b) = (obs(0), obs(holder));
            (a.min(b), a.max(b))
        };
        let mine = obs(rank);
        if drop_last {
            plan.batches = least / batch_size;
            plan.served = plan.batches * batch_size;
        } else {
            plan.batches = most.div_ceil(batch_size);
            let needed = if plan.batches == 0 {
                0
            } else {
                (plan.batches - 1) * batch_size + 1
            };
            plan.served = mine.max(needed);
        }
        // Chunks read: all of this rank's when padding; with drop_last only those holding the
        // observations served.
        plan.reads = if drop_last {
            plan.served.div_ceil(chunk_size)
        } else {
            dealt / w
        };
        if mine == 0 {
            plan.reads = 0;
        }
        Ok(plan)
    }

    /// Batches every rank yields in an epoch.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Load requests this rank yields in an epoch.
    pub fn requests(&self) -> u64 {
        if self.batches == 0 {
            0
        } else {
            self.reads.div_ceil(self.preload)
        }
    }

    /// Batches in one full request (`chunk_size * preload / batch_size`).
    pub fn batches_per_request(&self) -> u64 {
        self.chunk_size * self.preload / self.batch_size
    }

    /// The chunk at order position `p` of the epoch order before padding, for `p < dealt`.
    fn global_chunk(&self, p: u64) -> u64 {
        // Positions past the order repeat its head (torch's padding), as often as needed.
        p % self.chunks
    }

    /// This rank's chunk ids for `epoch`, in reading order (only those read).
    pub fn rank_chunks(&self, epoch: u64) -> Result<Vec<u64>> {
        let full = (self.stop - self.start) / self.chunk_size;
        let mut order: Vec<u64> = (0..full).collect();
        if self.shuffle && full > 1 {
            let mut stream = Stream::new(self.seed, epoch, Purpose::ChunkOrder, 0);
            fisher_yates(&mut order, &mut stream);
        }
        if self.chunks > full {
            order.push(full);
        }
        Ok((0..self.reads)
            .map(|i| order[self.global_chunk(self.rank + i * self.w) as usize])
            .collect())
    }

    /// Request `j` of `epoch`, given this rank's chunks (from [`ChunkPlan::rank_chunks`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for `j` at or past [`ChunkPlan::requests`].
    pub fn request(&self, epoch: u64, j: u64, chunks: &[u64]) -> Result<ChunkRequest> {
        let requests = self.requests();
        if j >= requests {
            return Err(Error::out_of_range(
                "request",
                format!("in [0, {requests})"),
                j,
            ));
        }
        let lo = (j * self.preload) as usize;
        let hi = chunks.len().min(lo + self.preload as usize);
        let ranges: Vec<(u64, u64)> = chunks[lo..hi]
            .iter()
            .map(|&c| {
                let a = self.start + c * self.chunk_size;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all_batches(plan: &ChunkPlan, epoch: u64) -> Vec<Vec<u64>> {
        let chunks = plan.rank_chunks(epoch).unwrap();
        let mut out = Vec::new();
        for j in 0..plan.requests() {
            let req = plan.request(epoch, j, &chunks).unwrap();
            let loaded: Vec<u64> = req.ranges.iter().flat_map(|&(a, b)| a..b).collect();
            let pos: Vec<u64> = match &req.positions {
                Indices::U32(v) => v.iter().map(|&x| u64::from(x)).collect(),
                Indices::U64(v) => v.clone(),
            };
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

    #[test]
    fn every_observation_once_and_equal_batch_counts() {
        for &(start, stop) in &[(0u64, 1000u64), (7, 1000), (0, 64), (0, 3), (5, 5)] {
            for w in [1u64, 2, 3, 7, 16] {
                for drop_last in [false, true] {
                    let plans: Vec<ChunkPlan> = (0..w)
                        .map(|r| {
                            ChunkPlan::new(start, stop, 16, 4, 8, true, drop_last, 3, w, r).unwrap()
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
    fn deterministic_and_epochs_differ() {
        let p = ChunkPlan::new(0, 10_000, 100, 2, 50, true, false, 9, 2, 1).unwrap();
        assert_eq!(all_batches(&p, 3), all_batches(&p, 3));
        assert_ne!(all_batches(&p, 3), all_batches(&p, 4));
        let q = ChunkPlan::new(0, 10_000, 100, 2, 50, false, false, 9, 1, 0).unwrap();
        assert_eq!(all_batches(&q, 0).concat(), (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(ChunkPlan::new(0, 10, 0, 1, 1, true, false, 0, 1, 0).is_err());
        assert!(ChunkPlan::new(0, 10, 10, 1, 3, true, false, 0, 1, 0).is_err());
        assert!(ChunkPlan::new(5, 4, 1, 1, 1, true, false, 0, 1, 0).is_err());
        assert!(ChunkPlan::new(0, 10, 1, 1, 1, true, false, 0, 2, 2).is_err());
        let p = ChunkPlan::new(0, 10, 2, 1, 1, true, false, 0, 1, 0).unwrap();
        assert!(p
            .request(0, p.requests(), &p.rank_chunks(0).unwrap())
            .is_err());
    }
}

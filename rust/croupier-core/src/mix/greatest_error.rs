//! Megatron-Core's blend, element for element: position `i` goes to the dataset whose count is
//! furthest below its weight's share, the error `weights[d] * max(i, 1) - count[d]` computed in
//! `f64` exactly as megatron-core's C++ computes it (one rounded product, one rounded
//! difference, no fused multiply-add), the lowest dataset index winning a tie. The exhaustive
//! blend is the same greedy with the sizes' shares as weights, each dataset leaving when its
//! size is spent.
//!
//! megatron-core scans every dataset at every position. Here, for each block of 16 positions,
//! only the datasets whose error can reach a `floor` within the block are scanned: the
//! *members* (an error rises by its weight a position while its count stands, so its value at
//! the block's last position bounds it), the floor being a level the largest error has stayed
//! above recently. When no member's error reaches the floor, that position scans every
//! dataset, so the floor decides the speed only, never the result: the members are compared
//! on the very `f64` values megatron-core computes, and a dataset is left out only when its
//! exact error is below the floor by more than any rounding could move it.
//!
//! A long blend runs in parallel pieces (`parallel_blend`): every piece but the first starts
//! from a guess of the counts at its start and is checked against the true run, which it
//! joins within a few positions; the result is the one run's, whatever the guess.

use rayon::prelude::*;

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::error::{Error, Result};

/// The most datasets a blend can name: megatron-core stores the dataset index as `int16`.
pub const BLEND_MAX_DATASETS: usize = i16::MAX as usize;

/// How far the weights' sum may be from 1 (megatron-core normalises its weights in `f64`).
pub const BLEND_WEIGHT_SUM_TOLERANCE: f64 = 1e-6;

/// Positions between two looks at the floor.
const WINDOW: u64 = 1 << 12;

/// megatron-core's `build_blending_indices`: `out[i]` is the dataset of position `i`, for
/// `i < out.len()`, by the greedy with `weights` (one per dataset, at least 0, summing to 1
/// within [`BLEND_WEIGHT_SUM_TOLERANCE`], at most [`BLEND_MAX_DATASETS`]), and `samples[i]`
/// how many earlier positions went to that dataset (megatron-core's dataset sample index; as
/// long as `out`). Stops early (returning [`Error::Cancelled`]) when the call is cancelled.
///
/// # Examples
///
/// ```
/// use croupier_core::greatest_error_blend;
///
/// let (mut out, mut samples) = ([0u16; 6], [0i64; 6]);
/// greatest_error_blend(&[0.5, 0.25, 0.25], &mut out, &mut samples).unwrap();
/// assert_eq!(out, [0, 1, 2, 0, 0, 1]);
/// assert_eq!(samples, [0, 0, 0, 1, 2, 1]);
/// ```
pub fn greatest_error_blend(weights: &[f64], out: &mut [u16], samples: &mut [i64]) -> Result<()> {
    check_datasets(weights.len())?;
    check_samples(out, samples)?;
    if let Some(d) = weights.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
        return Err(Error::out_of_range(
            "weights",
            "finite and at least 0",
            format!("weights[{d}] = {}", weights[d]),
        ));
    }
    let sum: f64 = weights.iter().sum();
    if (sum - 1.0).abs() > BLEND_WEIGHT_SUM_TOLERANCE {
        return Err(Error::out_of_range(
            "weights",
            format!("summing to 1 (within {BLEND_WEIGHT_SUM_TOLERANCE})"),
            format!("a sum of {sum}"),
        ));
    }
    let end = out.len() as u64;
    parallel_blend(
        || Greedy::new(weights.to_vec(), None, end, sum),
        Blend { out, samples },
    )
}

/// megatron-core's `build_exhaustive_blending_indices`: `out` (of length `sizes`' sum) takes
/// exactly `sizes[d]` positions of dataset `d`, by the greedy with weights `sizes[d] / total`
/// among the datasets not yet spent, and `samples` as in [`greatest_error_blend`]. Every size
/// must be at least 1 (megatron-core writes past its arrays on a 0).
///
/// # Examples
///
/// ```
/// use croupier_core::exhaustive_greatest_error_blend;
///
/// let (mut out, mut samples) = ([0u16; 5], [0i64; 5]);
/// exhaustive_greatest_error_blend(&[3, 2], &mut out, &mut samples).unwrap();
/// assert_eq!(out, [0, 1, 0, 1, 0]);
/// assert_eq!(samples, [0, 0, 1, 1, 2]);
/// ```
pub fn exhaustive_greatest_error_blend(
    sizes: &[u64],
    out: &mut [u16],
    samples: &mut [i64],
) -> Result<()> {
    check_datasets(sizes.len())?;
    check_samples(out, samples)?;
    if let Some(d) = sizes.iter().position(|&s| s == 0) {
        return Err(Error::out_of_range(
            "sizes",
            "at least 1",
            format!("sizes[{d}] = 0"),
        ));
    }
    let total = sizes
        .iter()
        .try_fold(0u64, |t, &s| t.checked_add(s))
        .filter(|&t| t < 1 << 53)
        .ok_or_else(|| {
            Error::out_of_range("sizes", "summing to less than 2**53", "a larger sum")
        })?;
    if out.len() as u64 != total {
        return Err(Error::out_of_range(
            "out",
            format!("of the sizes' sum, {total}"),
            out.len().to_string(),
        ));
    }
    // megatron-core: sizes[i] / static_cast<double>(total_size), the int64 converted first.
    let weights: Vec<f64> = sizes.iter().map(|&s| s as f64 / total as f64).collect();
    let sum = weights.iter().sum();
    let limits: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
    parallel_blend(
        || Greedy::new(weights.clone(), Some(limits.clone()), total, sum),
        Blend { out, samples },
    )
}

/// A blend's two outputs over the same positions: each position's dataset, and how many
/// earlier positions went to it.
struct Blend<'a> {
    out: &'a mut [u16],
    samples: &'a mut [i64],
}

impl Blend<'_> {
    /// Positions `from..to` of this blend (relative to its start).
    fn part(&mut self, from: usize, to: usize) -> Blend<'_> {
        Blend {
            out: &mut self.out[from..to],
            samples: &mut self.samples[from..to],
        }
    }

    /// Position `k` (relative to the blend's start) went to dataset `d`, its sample `count`.
    #[inline(always)]
    fn put(&mut self, k: usize, d: usize, count: f64) {
        self.out[k] = d as u16;
        self.samples[k] = count as i64;
    }
}

/// Positions a piece of a parallel blend holds at least.
const PIECE: u64 = 1 << 20;
/// Positions after a piece's start at which it records its counts: where the piece before it,
/// arriving with the true counts, looks whether the two have met.
const MEETINGS: [u64; 5] = [16, 256, 4096, 65_536, 1 << 20];

/// What a piece of a parallel blend leaves: its counts at each meeting point inside it and at
/// its end.
struct Piece {
    meetings: Vec<(u64, Vec<f64>)>,
    end: Vec<f64>,
}

/// The greedy over `out` in parallel pieces, the same positions as one run from the start.
///
/// The greedy's next position depends only on the counts, and its counts after `p` positions
/// stay within a sample or two of the shares `w p`. So every piece but the first starts from
/// the largest-remainder shares at its start, a guess, and runs on while the pieces before it
/// run. Then, piece after piece, the true counts at a piece's start (the end of the piece
/// before, itself true by then) run on over the piece until they equal the guessed run's
/// counts at one of its meeting points: from there the two runs are one, so the rest of the
/// piece (and its end counts) stands. Two runs from different counts meet within a few
/// positions in practice (100 datasets of uniform, Zipf and equal weights, from the
/// largest-remainder guess: within 6); a piece whose runs never meet is rewritten whole, so a
/// guess decides the speed only, never the result.
fn parallel_blend<F: Fn() -> Greedy + Sync>(make: F, blend: Blend<'_>) -> Result<()> {
    let n = blend.out.len() as u64;
    let threads = rayon::current_num_threads() as u64;
    // Two pieces a thread where there are enough positions: a thread runs its two side by
    // side (`Greedy::run_pair`).
    let pair = n / PIECE >= 2 * threads;
    let pieces = if pair {
        2 * threads
    } else {
        threads.min(n / PIECE)
    };
    if pieces < 2 {
        return make().run(blend);
    }
    blend_in_pieces(make, blend, pieces, Greedy::guess_counts, pair, &MEETINGS)
}

/// [`parallel_blend`] in `pieces` pieces, each after the first starting from `guess`'s counts
/// and recording its counts at `meetings` positions after its start; with `pair`, a thread
/// takes two consecutive pieces and runs them side by side.
fn blend_in_pieces<F, G>(
    make: F,
    mut blend: Blend<'_>,
    pieces: u64,
    guess: G,
    pair: bool,
    meetings: &[u64],
) -> Result<()>
where
    F: Fn() -> Greedy + Sync,
    G: Fn(&mut Greedy, u64) + Sync,
{
    let n = blend.out.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let size = n.div_ceil(pieces.max(1)).max(1);
    let per_task = if pair { 2 } else { 1 };
    // A piece after the first starts from the guess and runs to each meeting point, recording
    // its counts there; it returns where the rest of it starts.
    let prepare = |g: &mut Greedy, k: usize, chunk: &mut Blend<'_>| -> Result<_> {
        let start = k as u64 * size;
        let end = start + chunk.out.len() as u64;
        let mut met = Vec::new();
        let mut at = start;
        if k > 0 {
            guess(g, start);
            for &step in meetings {
                let to = (start + step).min(end);
                if to <= at {
                    break;
                }
                g.offset = at;
                g.run(chunk.part((at - start) as usize, (to - start) as usize))?;
                met.push((to, g.counts.clone()));
                at = to;
            }
        }
        g.offset = at;
        Ok((met, (at - start) as usize))
    };
    let results: Vec<Result<Vec<Piece>>> = blend
        .out
        .par_chunks_mut((per_task * size) as usize)
        .zip(blend.samples.par_chunks_mut((per_task * size) as usize))
        .enumerate()
        .map(|(t, (out, samples))| {
            let first = (out.len() as u64).min(size) as usize;
            let (out_a, out_b) = out.split_at_mut(first);
            let (samples_a, samples_b) = samples.split_at_mut(first);
            let mut a = Blend {
                out: out_a,
                samples: samples_a,
            };
            let mut b = Blend {
                out: out_b,
                samples: samples_b,
            };
            let k = t * per_task as usize;
            let (mut ga, mut gb) = (make(), make());
            let (met_a, from_a) = prepare(&mut ga, k, &mut a)?;
            let len_a = a.out.len();
            if b.out.is_empty() {
                ga.run(a.part(from_a, len_a))?;
                return Ok(vec![Piece {
                    meetings: met_a,
                    end: ga.counts,
                }]);
            }
            let (met_b, from_b) = prepare(&mut gb, k + 1, &mut b)?;
            let len_b = b.out.len();
            Greedy::run_pair(
                &mut ga,
                a.part(from_a, len_a),
                &mut gb,
                b.part(from_b, len_b),
            )?;
            Ok(vec![
                Piece {
                    meetings: met_a,
                    end: ga.counts,
                },
                Piece {
                    meetings: met_b,
                    end: gb.counts,
                },
            ])
        })
        .collect();
    let mut pieces_done = Vec::with_capacity(pieces as usize);
    for r in results {
        pieces_done.extend(r?);
    }
    let mut counts = pieces_done[0].end.clone();
    for (k, piece) in pieces_done.iter().enumerate().skip(1) {
        let start = k as u64 * size;
        let end = (start + size).min(n);
        let mut chunk = blend.part(start as usize, end as usize);
        let mut g = make();
        g.counts.clone_from(&counts);
        let mut at = start;
        let mut met = false;
        for (to, theirs) in &piece.meetings {
            g.offset = at;
            g.run(chunk.part((at - start) as usize, (to - start) as usize))?;
            at = *to;
            if g.counts == *theirs {
                met = true;
                break;
            }
        }
        if met {
            counts.clone_from(&piece.end);
        } else {
            g.offset = at;
            g.run(chunk.part((at - start) as usize, (end - start) as usize))?;
            counts = g.counts;
        }
    }
    Ok(())
}

fn check_samples(out: &[u16], samples: &[i64]) -> Result<()> {
    if samples.len() != out.len() {
        return Err(Error::out_of_range(
            "samples",
            format!("as long as out, {}", out.len()),
            samples.len().to_string(),
        ));
    }
    Ok(())
}

fn check_datasets(count: usize) -> Result<()> {
    if count == 0 || count > BLEND_MAX_DATASETS {
        return Err(Error::out_of_range(
            "num_datasets",
            format!("in [1, {BLEND_MAX_DATASETS}] (the dataset index is int16)"),
            count.to_string(),
        ));
    }
    Ok(())
}

/// The greedy's state: weights and counts (padded to whole lanes), and the candidates.
struct Greedy {
    /// Each dataset's weight; padding lanes 0.
    weights: Vec<f64>,
    /// Each dataset's count so far, as the `f64` megatron-core subtracts; a spent dataset's
    /// (and a padding lane's) is infinite, so its error is `-inf`. Behind the members' own
    /// counts while a block runs.
    counts: Vec<f64>,
    /// The exhaustive blend's sizes (empty otherwise).
    limits: Vec<f64>,
    /// The datasets whose error may reach the floor within the current block, in dataset
    /// order, with their weights, counts and sizes side by side, padded to whole vectors
    /// with lanes whose error is `-inf` and whose size is never reached.
    members: Vec<u32>,
    member_weights: Vec<f64>,
    member_counts: Vec<f64>,
    member_limits: Vec<f64>,
    /// The AVX2 kernel's copy of the members' counts, for the samples: the counts themselves
    /// stay in registers.
    member_next: Vec<f64>,
    /// Real members (the rest is padding).
    live: usize,
    /// Lanes in use: `live` rounded up to whole vectors of 4 (at most [`MOST_LANES`], the
    /// kernels' reach; more members round up to [`LANES`] and take the portable loop).
    lanes: usize,
    /// The level the largest error has stayed above recently.
    floor: f64,
    /// More than any rounding of an error, at every position of the run.
    slack: f64,
    /// The position of `out[0]` in the run at hand.
    offset: u64,
}

/// Where a run of the greedy is: its next position and its end, and what the floor's
/// adjustment has seen since it last moved.
struct Course {
    i: u64,
    n: u64,
    /// The position of the next look at the cancellation flag.
    look: u64,
    lowest: f64,
    misses: u32,
    seen: u64,
}

impl Course {
    /// A look at the flag every [`CHECK_EVERY`] positions.
    #[inline(always)]
    fn check_cancelled(&mut self) -> Result<()> {
        if self.i >= self.look {
            if cancelled() {
                return Err(Error::Cancelled);
            }
            self.look = self.i + CHECK_EVERY as u64;
        }
        Ok(())
    }
}

/// Lanes a scan of every dataset handles at once (two 256-bit vectors of `f64`).
const LANES: usize = 8;
/// The most members a kernel holds (12 vectors of 4).
const MOST_LANES: usize = 48;
/// The vectors of 4 lanes the blend's kernels hold for `vectors` vectors of members (up to
/// 12): every count to 8, then 10 or 12 (fewer kernels, for the wheel's size).
fn blend_width(vectors: usize) -> usize {
    match vectors {
        0..=8 => vectors.max(1),
        _ => vectors.next_multiple_of(2),
    }
}

/// The vectors of 4 lanes an exhaustive blend's kernels hold for `vectors` vectors of members
/// (1 to 12): 1, 2, 4, 8 or 12 (its kernels come in fewer widths, for the wheel's size).
fn exhaustive_width(vectors: usize) -> usize {
    match vectors {
        0..=2 => vectors.max(1),
        3..=4 => 4,
        5..=8 => 8,
        _ => 12,
    }
}

/// Positions a member list serves before it is drawn afresh.
const BLOCK: u64 = 16;

impl Greedy {
    fn new(weights: Vec<f64>, limits: Option<Vec<f64>>, end: u64, sum: f64) -> Self {
        let datasets = weights.len();
        let padded = datasets.div_ceil(LANES) * LANES;
        let mut w = weights;
        w.resize(padded, 0.0);
        let mut counts = vec![0.0; datasets];
        counts.resize(padded, f64::INFINITY);
        // An error rounds by at most 2**-53 (w x + |e| + 1), |e| below 2 + |sum - 1| x.
        let slack = (end as f64 * (1.0 + (sum - 1.0).abs()) + 64.0) * 2f64.powi(-48);
        let room = padded + MOST_LANES;
        Greedy {
            weights: w,
            counts,
            // Padded as the weights are: the AVX2 member draw reads whole groups of lanes.
            limits: limits
                .map(|mut l| {
                    l.resize(padded, f64::NAN);
                    l
                })
                .unwrap_or_default(),
            members: vec![u32::MAX; room],
            member_weights: vec![0.0; room],
            member_counts: vec![f64::INFINITY; room],
            member_limits: vec![f64::NAN; room],
            member_next: vec![0.0; room],
            lanes: 0,
            live: 0,
            floor: 0.0,
            slack,
            offset: 0,
        }
    }

    /// The positions `offset..offset + len` into `blend`, from the counts at hand.
    fn run(&mut self, mut blend: Blend<'_>) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.run_avx2(&mut blend) };
        }
        self.run_any(&mut blend, false)
    }

    /// One copy of the AVX2 greedy for every caller (a whole blend, a piece's meeting runs and
    /// its rest, the pieces' checks).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline(never)]
    unsafe fn run_avx2(&mut self, blend: &mut Blend<'_>) -> Result<()> {
        self.run_any(blend, true)
    }

    /// Two runs on one thread (two pieces of a parallel blend), side by side: block by
    /// block, each block's positions by the pair kernel while both runs' members fit one
    /// kernel and reach their floors, the rest of each block on its own; the longer run ends
    /// alone. The same positions as each run alone.
    fn run_pair(
        a: &mut Greedy,
        mut ab: Blend<'_>,
        b: &mut Greedy,
        mut bb: Blend<'_>,
    ) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { Self::run_pair_avx2(a, &mut ab, b, &mut bb) };
        }
        a.run(ab)?;
        b.run(bb)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline(never)]
    unsafe fn run_pair_avx2(
        a: &mut Greedy,
        ab: &mut Blend<'_>,
        b: &mut Greedy,
        bb: &mut Blend<'_>,
    ) -> Result<()> {
        let (mut ca, mut cb) = (a.begin(ab), b.begin(bb));
        let exhaustive = !a.limits.is_empty();
        while ca.i < ca.n && cb.i < cb.n {
            ca.check_cancelled()?;
            let (a0, b0) = (ca.i, cb.i);
            let (a_stop, b_stop) = ((a0 + BLOCK).min(ca.n), (b0 + BLOCK).min(cb.n));
            a.draw_members((a_stop - 1) as f64, true);
            b.draw_members((b_stop - 1) as f64, true);
            // The pair kernel comes in fewer widths than the single one (the wheel's size):
            // even numbers of vectors (and 1), the exhaustive blend's `exhaustive_width`s.
            let vectors = a.lanes.max(b.lanes) / 4;
            let lanes = 4 * match vectors {
                0 | 1 => 1,
                v if exhaustive => exhaustive_width(v),
                v => v.next_multiple_of(2),
            };
            if lanes <= MOST_LANES {
                a.pad_to(lanes);
                b.pad_to(lanes);
                let steps = (a_stop - a0).min(b_stop - b0);
                // SAFETY (the kernel's): AVX2 is on (this function's feature); both runs'
                // member arrays hold `lanes` lanes, padded above.
                macro_rules! pair {
                    ($v:literal, $ex:literal) => {
                        avx2::members_run_pair::<$v, $ex>(
                            (a, ab, a0, &mut ca.lowest),
                            (b, bb, b0, &mut cb.lowest),
                            steps,
                        )
                    };
                }
                let done = match (exhaustive, lanes / 4) {
                    (false, 1) => pair!(1, false),
                    (false, 2) => pair!(2, false),
                    (false, 4) => pair!(4, false),
                    (false, 6) => pair!(6, false),
                    (false, 8) => pair!(8, false),
                    (false, 10) => pair!(10, false),
                    (false, _) => pair!(12, false),
                    (true, 1) => pair!(1, true),
                    (true, 2) => pair!(2, true),
                    (true, 4) => pair!(4, true),
                    (true, 8) => pair!(8, true),
                    (true, _) => pair!(12, true),
                };
                a.sync_counts();
                b.sync_counts();
                ca.i += done;
                cb.i += done;
            }
            a.finish_block(&mut ca, (a0, a_stop), ab, true);
            b.finish_block(&mut cb, (b0, b_stop), bb, true);
        }
        a.blocks(&mut ca, ab, true)?;
        b.blocks(&mut cb, bb, true)
    }

    /// The greedy over `out`, block by block. The same `f64` operations on every CPU: the
    /// AVX2 build only computes more lanes at once and keeps the members' counts in registers.
    #[inline(always)]
    fn run_any(&mut self, blend: &mut Blend<'_>, avx2: bool) -> Result<()> {
        let mut course = self.begin(blend);
        self.blocks(&mut course, blend, avx2)
    }

    /// A run over `blend` from the counts at hand: its first positions below 2 made (they
    /// share `x = 1`: the blocks' rising errors start at position 2), the rest to go.
    #[inline(always)]
    fn begin(&mut self, blend: &mut Blend<'_>) -> Course {
        let n = self.offset + blend.out.len() as u64;
        for i in self.offset..n.min(2) {
            let (d, _) = first_max(&self.weights, &self.counts, 1.0);
            blend.put((i - self.offset) as usize, d, self.counts[d]);
            self.count(d);
        }
        let i = self.offset.max(2).min(n);
        Course {
            i,
            n,
            look: i,
            lowest: f64::INFINITY,
            misses: 0,
            seen: 0,
        }
    }

    /// The rest of `course`, block by block.
    #[inline(always)]
    fn blocks(&mut self, course: &mut Course, blend: &mut Blend<'_>, avx2: bool) -> Result<()> {
        while course.i < course.n {
            course.check_cancelled()?;
            let stop = (course.i + BLOCK).min(course.n);
            self.draw_members((stop - 1) as f64, avx2);
            self.finish_block(course, (course.i, stop), blend, avx2);
        }
        Ok(())
    }

    /// Positions `course.i..stop` of the block `block_start..stop` whose members are drawn
    /// (the pair kernel may have made the first ones): among the members while the largest
    /// error reaches the floor, by a scan of every dataset where it does not; then the floor
    /// follows what the blocks saw.
    #[inline(always)]
    fn finish_block(
        &mut self,
        course: &mut Course,
        (block_start, stop): (u64, u64),
        blend: &mut Blend<'_>,
        avx2: bool,
    ) {
        let mut i = course.i;
        while i < stop {
            i = self.members_run(i, stop, blend, &mut course.lowest, avx2);
            self.sync_counts();
            if i < stop {
                // The floor missed: the largest error may be anyone's.
                course.misses += 1;
                let (d, top) = first_max(&self.weights, &self.counts, i as f64);
                blend.put((i - self.offset) as usize, d, self.counts[d]);
                course.lowest = course.lowest.min(top);
                self.count(d);
                if let Ok(k) = self.members[..self.live].binary_search(&(d as u32)) {
                    self.member_counts[k] = self.counts[d];
                }
                i += 1;
            }
        }
        course.seen += stop - block_start;
        course.i = stop;
        if course.seen >= WINDOW {
            // Every member costs a look at every position; a miss costs a scan of all.
            if course.misses > 4 {
                self.floor = course.lowest - 0.06;
            } else if course.lowest - 0.03 > self.floor + 0.03 {
                self.floor = course.lowest - 0.03;
            }
            (course.lowest, course.misses, course.seen) = (f64::INFINITY, 0, 0);
        }
    }

    /// Counts for a run starting at position `at`: each dataset's share `w at` rounded down,
    /// the positions left over to the largest remainders (a spent dataset's count infinite).
    /// A guess: [`parallel_blend`] checks it against the true run.
    fn guess_counts(&mut self, at: u64) {
        let datasets = if self.limits.is_empty() {
            self.counts.iter().take_while(|c| c.is_finite()).count()
        } else {
            self.limits.len()
        };
        let x = at as f64;
        let mut rest: Vec<(f64, usize)> = Vec::with_capacity(datasets);
        let mut left = at as f64;
        for d in 0..datasets {
            let share = self.weights[d] * x;
            let whole = share.floor();
            self.counts[d] = whole;
            left -= whole;
            rest.push((share - whole, d));
        }
        rest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, d) in rest.iter().take(left.max(0.0) as usize) {
            self.counts[d] += 1.0;
        }
        if !self.limits.is_empty() {
            for d in 0..datasets {
                if self.counts[d] >= self.limits[d] {
                    self.counts[d] = f64::INFINITY;
                }
            }
        }
    }

    /// Counts a sample of `d`; a spent dataset's count turns infinite, so it never wins again.
    fn count(&mut self, d: usize) {
        self.counts[d] += 1.0;
        if !self.limits.is_empty() && self.limits[d] - self.counts[d] == 0.0 {
            self.counts[d] = f64::INFINITY;
        }
    }

    /// Writes the members' counts back to every dataset's.
    fn sync_counts(&mut self) {
        for (&m, &c) in self.members[..self.live].iter().zip(&self.member_counts) {
            self.counts[m as usize] = c;
        }
    }

    /// Positions `start..stop` among the members, while the largest error among them reaches
    /// the floor; returns the first position where it does not (or `stop`).
    #[inline(always)]
    fn members_run(
        &mut self,
        start: u64,
        stop: u64,
        blend: &mut Blend<'_>,
        lowest: &mut f64,
        avx2: bool,
    ) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            let exhaustive = !self.limits.is_empty();
            let vectors = self.lanes / 4;
            macro_rules! kernel {
                ($v:literal, $ex:literal) => {
                    // SAFETY: the caller checked AVX2; the member arrays hold 4 * $v lanes.
                    unsafe { avx2::members_run::<$v, $ex>(self, start, stop, blend, lowest) }
                };
            }
            // The exhaustive blend's members are padded to fewer widths (`pad_members`).
            match (exhaustive, vectors) {
                (false, 1) => return kernel!(1, false),
                (false, 2) => return kernel!(2, false),
                (false, 3) => return kernel!(3, false),
                (false, 4) => return kernel!(4, false),
                (false, 5) => return kernel!(5, false),
                (false, 6) => return kernel!(6, false),
                (false, 7) => return kernel!(7, false),
                (false, 8) => return kernel!(8, false),
                (false, 10) => return kernel!(10, false),
                (false, 12) => return kernel!(12, false),
                (true, 1) => return kernel!(1, true),
                (true, 2) => return kernel!(2, true),
                (true, 4) => return kernel!(4, true),
                (true, 8) => return kernel!(8, true),
                (true, 12) => return kernel!(12, true),
                _ => {}
            }
        }
        let _ = avx2;
        for i in start..stop {
            let lanes = self.lanes;
            let (k, top) = first_max(
                &self.member_weights[..lanes],
                &self.member_counts[..lanes],
                i as f64,
            );
            if top < self.floor {
                return i;
            }
            *lowest = lowest.min(top);
            let d = self.members[k] as usize;
            blend.put((i - self.offset) as usize, d, self.member_counts[k]);
            let count = self.member_counts[k] + 1.0;
            // The whole 4-lane group is written back: the next position reads it as one
            // vector, and a narrower store would stall that read (no store forwarding).
            let spent = self.member_limits[k] - count == 0.0;
            let count = if spent { f64::INFINITY } else { count };
            let group: &mut [f64; 4] = (&mut self.member_counts[k & !3..(k & !3) + 4])
                .try_into()
                .expect("members are padded to whole vectors");
            for (j, c) in group.iter_mut().enumerate() {
                *c = if j == k & 3 { count } else { *c };
            }
        }
        stop
    }

    /// The members for a block whose last position is `x_last`: every dataset whose error
    /// there (the largest it can reach in the block, as errors only rise until picked) may
    /// reach the floor less twice the slack. Every other dataset's rounded error stays below
    /// the floor all block long. Padded as [`Greedy::pad_members`] pads.
    #[inline(always)]
    fn draw_members(&mut self, x_last: f64, avx2: bool) {
        let level = self.floor - 3.0 * self.slack;
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the caller checked AVX2.
            unsafe { avx2::draw_members(self, x_last, level) };
            return self.pad_members();
        }
        let _ = avx2;
        let mut live = 0;
        for g in 0..self.weights.len() / LANES {
            let mut hits = 0u32;
            for j in 0..LANES {
                let d = g * LANES + j;
                hits |= ((self.weights[d] * x_last - self.counts[d] >= level) as u32) << j;
            }
            while hits != 0 {
                let d = g * LANES + hits.trailing_zeros() as usize;
                hits &= hits - 1;
                self.join(live, d);
                live += 1;
            }
        }
        self.live = live;
        self.pad_members();
    }

    /// Dataset `d` as member `k` (its weight, count and size in lane `k`).
    #[inline(always)]
    fn join(&mut self, k: usize, d: usize) {
        self.members[k] = d as u32;
        self.member_weights[k] = self.weights[d];
        self.member_counts[k] = self.counts[d];
        if !self.limits.is_empty() {
            self.member_limits[k] = self.limits[d];
        }
    }

    /// Padding on to `lanes` lanes (at least the members' own), so that a pair of runs fits
    /// one kernel.
    #[inline(always)]
    fn pad_to(&mut self, lanes: usize) {
        for k in self.lanes..lanes {
            self.members[k] = u32::MAX;
            self.member_weights[k] = 0.0;
            self.member_counts[k] = f64::INFINITY;
            self.member_limits[k] = f64::NAN;
        }
        self.lanes = self.lanes.max(lanes);
    }

    /// The lanes after the `live` members, up to whole vectors, made padding.
    #[inline(always)]
    fn pad_members(&mut self) {
        self.lanes = match self.live {
            0..=MOST_LANES if self.limits.is_empty() => 4 * blend_width(self.live.div_ceil(4)),
            0..=MOST_LANES => 4 * exhaustive_width(self.live.div_ceil(4).max(1)),
            live => live.div_ceil(LANES) * LANES,
        };
        for k in self.live..self.lanes {
            self.members[k] = u32::MAX;
            self.member_weights[k] = 0.0;
            self.member_counts[k] = f64::INFINITY;
            self.member_limits[k] = f64::NAN;
        }
    }
}

/// The members' positions with AVX2, their counts held in registers.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Blend, Greedy, MOST_LANES};

    /// For each mask of 4 lanes, the lanes set, first to last, then the rest (as indices of
    /// 32-bit halves: lane `l` is halves `2l` and `2l + 1`): a permutation that packs the
    /// lanes of a mask to the front.
    const PACK: [[i32; 8]; 16] = {
        let mut table = [[0i32; 8]; 16];
        let mut mask = 0;
        while mask < 16 {
            let mut at = 0;
            let mut lane = 0;
            while lane < 4 {
                if mask & (1 << lane) != 0 {
                    table[mask][2 * at] = 2 * lane;
                    table[mask][2 * at + 1] = 2 * lane + 1;
                    at += 1;
                }
                lane += 1;
            }
            mask += 1;
        }
        table
    };

    /// [`Greedy::draw_members`]' scan of every dataset, four at a time and without a branch
    /// on the data: the members (every dataset whose error at `x_last` reaches `level`) in
    /// dataset order, without padding. Each group's lanes are packed to the front and stored
    /// whole at the next free lane; the stray lanes behind are overwritten or padded later.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn draw_members(g: &mut Greedy, x_last: f64, level: f64) {
        let datasets = g.weights.len();
        // The stores write 4 lanes from lane `live` <= datasets - 4 on: room enough. The loads
        // read whole groups of 4 of every per-dataset array (padded to whole groups).
        assert!(g.members.len() >= datasets + 4 && g.member_limits.len() >= datasets + 4);
        assert!(g.counts.len() >= datasets && (g.limits.is_empty() || g.limits.len() >= datasets));
        let (w, c, l) = (g.weights.as_ptr(), g.counts.as_ptr(), g.limits.as_ptr());
        let (mw, mc, ml) = (
            g.member_weights.as_mut_ptr(),
            g.member_counts.as_mut_ptr(),
            g.member_limits.as_mut_ptr(),
        );
        let ids = g.members.as_mut_ptr();
        let exhaustive = !g.limits.is_empty();
        let (xs, level) = (_mm256_set1_pd(x_last), _mm256_set1_pd(level));
        let lanes = _mm256_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0);
        let mut live = 0;
        for base in (0..datasets).step_by(4) {
            let weights = _mm256_loadu_pd(w.add(base));
            let counts = _mm256_loadu_pd(c.add(base));
            let e = _mm256_sub_pd(_mm256_mul_pd(weights, xs), counts);
            let mask = _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_GE_OQ>(e, level)) as usize;
            let pack = _mm256_loadu_si256(PACK[mask].as_ptr().cast());
            macro_rules! put {
                ($at:expr, $v:expr) => {
                    _mm256_storeu_pd(
                        $at,
                        _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps($v), pack)),
                    )
                };
            }
            put!(mw.add(live), weights);
            put!(mc.add(live), counts);
            if exhaustive {
                put!(ml.add(live), _mm256_loadu_pd(l.add(base)));
            }
            // The datasets' ids, packed the same way (even halves of the permutation).
            let id = _mm256_add_epi32(
                _mm256_permutevar8x32_epi32(lanes, pack),
                _mm256_set1_epi32(base as i32),
            );
            let id = _mm256_permutevar8x32_epi32(id, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
            _mm_storeu_si128(ids.add(live).cast(), _mm256_castsi256_si128(id));
            live += mask.count_ones() as usize;
        }
        g.live = live;
    }

    /// One run's registers in [`members_run`] and [`members_run_pair`]: the members' counts,
    /// and where their weights and sizes are read (from memory at every position, off the
    /// counts' chain: registers are kept for the counts and errors).
    struct Lanes<const V: usize> {
        c: [__m256d; V],
        weights: *const f64,
        limits: *const f64,
        floor: f64,
        least: f64,
        /// The next position, in `f64` (exact below 2**53), not converted from the `u64` at
        /// every position: with the conversion in the loop, builds differing only in
        /// unrelated code ran it at 17.5 or 10.5 ns a position (2 threads, 1e8 positions).
        xf: f64,
    }

    #[allow(clippy::needless_range_loop)] // lane j of several vectors at once
    impl<const V: usize> Lanes<V> {
        /// The members' counts of `g` into registers (and into its copy for the samples).
        #[inline(always)]
        unsafe fn load(g: &mut Greedy, lowest: f64, start: u64) -> Self {
            // `commit`'s tie buffer and its 64-bit mask of lanes hold at most MOST_LANES.
            const { assert!(4 * V <= MOST_LANES && MOST_LANES <= 64) };
            let mut c = [_mm256_setzero_pd(); V];
            for (j, c) in c.iter_mut().enumerate() {
                *c = _mm256_loadu_pd(g.member_counts.as_ptr().add(4 * j));
                _mm256_storeu_pd(g.member_next.as_mut_ptr().add(4 * j), *c);
            }
            Lanes {
                c,
                weights: g.member_weights.as_ptr(),
                limits: g.member_limits.as_ptr(),
                floor: g.floor,
                least: lowest,
                xf: start as f64,
            }
        }

        /// The errors at the next position and the largest of them, in every lane.
        #[inline(always)]
        unsafe fn errors(&self) -> ([__m256d; V], __m256d) {
            let x = _mm256_set1_pd(self.xf);
            let mut e = [_mm256_setzero_pd(); V];
            for j in 0..V {
                e[j] = _mm256_sub_pd(
                    _mm256_mul_pd(_mm256_loadu_pd(self.weights.add(4 * j)), x),
                    self.c[j],
                );
            }
            let mut m = e;
            let mut len = V;
            while len > 1 {
                let half = len.div_ceil(2);
                for j in 0..len - half {
                    m[j] = _mm256_max_pd(m[j], m[j + half]);
                }
                len = half;
            }
            let t = _mm256_max_pd(m[0], _mm256_permute2f128_pd::<1>(m[0], m[0]));
            (e, _mm256_max_pd(t, _mm256_permute_pd::<0b0101>(t)))
        }

        /// The position goes to the first member whose error is the largest, `t`: the members'
        /// counts and its outputs (position `at` of `blend`) move on.
        #[inline(always)]
        unsafe fn commit<const EXHAUSTIVE: bool>(
            &mut self,
            g: &mut Greedy,
            e: &[__m256d; V],
            t: __m256d,
            blend: &mut Blend<'_>,
            at: usize,
        ) {
            let one = _mm256_set1_pd(1.0);
            let mut hits = 0u64;
            for j in 0..V {
                let hit = _mm256_cmp_pd::<_CMP_EQ_OQ>(e[j], t);
                hits |= (_mm256_movemask_pd(hit) as u64) << (4 * j);
                self.c[j] = _mm256_add_pd(self.c[j], _mm256_and_pd(hit, one));
            }
            let k = hits.trailing_zeros() as usize;
            if hits & (hits - 1) != 0 {
                let mut lanes = [0.0; MOST_LANES];
                for j in 0..V {
                    _mm256_storeu_pd(lanes.as_mut_ptr().add(4 * j), self.c[j]);
                }
                let mut others = hits & (hits - 1);
                while others != 0 {
                    lanes[others.trailing_zeros() as usize] -= 1.0;
                    others &= others - 1;
                }
                for j in 0..V {
                    self.c[j] = _mm256_loadu_pd(lanes.as_ptr().add(4 * j));
                }
            }
            if EXHAUSTIVE {
                let spent = _mm256_set1_pd(f64::INFINITY);
                for j in 0..V {
                    let full = _mm256_cmp_pd::<_CMP_EQ_OQ>(
                        self.c[j],
                        _mm256_loadu_pd(self.limits.add(4 * j)),
                    );
                    if _mm256_movemask_pd(full) != 0 {
                        self.c[j] = _mm256_blendv_pd(self.c[j], spent, full);
                    }
                }
            }
            // The winner's sample: its count before this position, kept beside the registers.
            let next = g.member_next.get_unchecked_mut(k);
            *blend.out.get_unchecked_mut(at) = *g.members.get_unchecked(k) as u16;
            // A finite whole count below 2**53 (a winner's error is not `-inf`).
            *blend.samples.get_unchecked_mut(at) = next.to_int_unchecked::<i64>();
            *next += 1.0;
            self.xf += 1.0;
        }

        /// The counts back to `g`'s members, and the least largest error seen.
        #[inline(always)]
        unsafe fn store(&self, g: &mut Greedy, lowest: &mut f64) {
            for j in 0..V {
                _mm256_storeu_pd(g.member_counts.as_mut_ptr().add(4 * j), self.c[j]);
            }
            *lowest = self.least;
        }
    }

    /// [`Greedy::members_run`] over `V` vectors of 4 members. A position's winner gets its 1
    /// through the mask of lanes equal to the largest error, so the next position does not wait
    /// for the winner's index; a tie (several such lanes) takes the 1 back from all but the
    /// first, as megatron-core's first maximum wins.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn members_run<const V: usize, const EXHAUSTIVE: bool>(
        g: &mut Greedy,
        start: u64,
        stop: u64,
        blend: &mut Blend<'_>,
        lowest: &mut f64,
    ) -> u64 {
        let mut r = Lanes::<V>::load(g, *lowest, start);
        let mut reached = stop;
        for i in start..stop {
            let (e, t) = r.errors();
            let top = _mm256_cvtsd_f64(t);
            if top < r.floor {
                reached = i;
                break;
            }
            r.least = r.least.min(top);
            r.commit::<EXHAUSTIVE>(g, &e, t, blend, (i - g.offset) as usize);
        }
        r.store(g, lowest);
        reached
    }

    /// [`members_run`] of two runs at once, `steps` positions each from `a_start` and
    /// `b_start` (one thread's two pieces of a parallel blend): each position's counts wait
    /// for the position before, so the core computes one run's position while the other's
    /// waits. Both stop at the first step where either misses its floor; returns the steps
    /// both made.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn members_run_pair<const V: usize, const EXHAUSTIVE: bool>(
        (a, a_blend, a_start, a_lowest): (&mut Greedy, &mut Blend<'_>, u64, &mut f64),
        (b, b_blend, b_start, b_lowest): (&mut Greedy, &mut Blend<'_>, u64, &mut f64),
        steps: u64,
    ) -> u64 {
        let mut ra = Lanes::<V>::load(a, *a_lowest, a_start);
        let mut rb = Lanes::<V>::load(b, *b_lowest, b_start);
        let (a_at, b_at) = ((a_start - a.offset) as usize, (b_start - b.offset) as usize);
        let mut done = steps;
        for s in 0..steps {
            let (ea, ta) = ra.errors();
            let (eb, tb) = rb.errors();
            let (top_a, top_b) = (_mm256_cvtsd_f64(ta), _mm256_cvtsd_f64(tb));
            if top_a < ra.floor || top_b < rb.floor {
                done = s;
                break;
            }
            ra.least = ra.least.min(top_a);
            rb.least = rb.least.min(top_b);
            ra.commit::<EXHAUSTIVE>(a, &ea, ta, a_blend, a_at + s as usize);
            rb.commit::<EXHAUSTIVE>(b, &eb, tb, b_blend, b_at + s as usize);
        }
        ra.store(a, a_lowest);
        rb.store(b, b_lowest);
        done
    }
}

/// The first lane of the largest `w * x - c` (lengths a multiple of 4) and that value:
/// megatron-core's comparison, `e > best` from the first, so the first of equal maxima wins.
#[inline(always)]
fn first_max(w: &[f64], c: &[f64], x: f64) -> (usize, f64) {
    let mut tops = [f64::NEG_INFINITY; 4];
    for (w, c) in w.chunks_exact(4).zip(c.chunks_exact(4)) {
        for j in 0..4 {
            let e = w[j] * x - c[j];
            tops[j] = if e > tops[j] { e } else { tops[j] };
        }
    }
    let pair = |a: f64, b: f64| if a > b { a } else { b };
    let top = pair(pair(tops[0], tops[2]), pair(tops[1], tops[3]));
    for (g, (w, c)) in w.chunks_exact(4).zip(c.chunks_exact(4)).enumerate() {
        let mut hits = 0u32;
        for j in 0..4 {
            hits |= ((w[j] * x - c[j] == top) as u32) << j;
        }
        if hits != 0 {
            return (g * 4 + hits.trailing_zeros() as usize, top);
        }
    }
    (0, top)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// megatron-core's loop, as written in its C++.
    fn reference(weights: &[f64], n: usize) -> Vec<u16> {
        let mut counts = vec![0i64; weights.len()];
        (0..n)
            .map(|i| {
                let x = (i as f64).max(1.0);
                let mut best = 0;
                let mut top = weights[0] * x - counts[0] as f64;
                for d in 1..weights.len() {
                    let e = weights[d] * x - counts[d] as f64;
                    if e > top {
                        (best, top) = (d, e);
                    }
                }
                counts[best] += 1;
                best as u16
            })
            .collect()
    }

    /// megatron-core's exhaustive loop, as written in its C++.
    fn exhaustive_reference(sizes: &[u64]) -> Vec<u16> {
        let total: u64 = sizes.iter().sum();
        let weights: Vec<f64> = sizes.iter().map(|&s| s as f64 / total as f64).collect();
        let mut counts = vec![0i64; sizes.len()];
        let mut unspent: std::collections::BTreeSet<usize> = (0..sizes.len()).collect();
        let mut out = Vec::new();
        while !unspent.is_empty() {
            let x = (out.len() as f64).max(1.0);
            let mut best = usize::MAX;
            let mut top = f64::MIN;
            for &d in &unspent {
                let e = weights[d] * x - counts[d] as f64;
                if e > top {
                    (best, top) = (d, e);
                }
            }
            out.push(best as u16);
            counts[best] += 1;
            if sizes[best] as f64 - counts[best] as f64 == 0.0 {
                unspent.remove(&best);
            }
        }
        out
    }

    fn normalized(raw: &[f64]) -> Vec<f64> {
        let sum: f64 = raw.iter().sum();
        raw.iter().map(|w| w / sum).collect()
    }

    /// megatron-core's dataset sample index of a blend: how many earlier positions went to
    /// each position's dataset.
    fn samples_of(datasets: &[u16]) -> Vec<i64> {
        let mut seen = std::collections::HashMap::new();
        datasets
            .iter()
            .map(|&d| {
                let count = seen.entry(d).or_insert(0i64);
                *count += 1;
                *count - 1
            })
            .collect()
    }

    /// The blend and its samples, the samples checked against the blend's own counts.
    fn blend(weights: &[f64], n: usize) -> Vec<u16> {
        let (mut out, mut samples) = (vec![0u16; n], vec![-1i64; n]);
        greatest_error_blend(weights, &mut out, &mut samples).unwrap();
        assert_eq!(samples, samples_of(&out), "{weights:?} n={n}");
        out
    }

    #[test]
    fn blends_as_megatron_core_does() {
        let mut lcg = crate::testkit::Lcg::new(7);
        let mut next = || lcg.unit();
        let cases: Vec<Vec<f64>> = vec![
            vec![1.0],
            vec![0.5, 0.5],
            vec![1.0 / 3.0; 3],
            vec![0.0, 1.0],
            vec![1.0, 0.0],
            vec![0.25, 0.0, 0.75],
            normalized(&[1.0, 2.0, 3.0, 4.0]),
            normalized(&(1..=100).map(|d| 1.0 / d as f64).collect::<Vec<_>>()),
            normalized(&(0..100).map(|_| next()).collect::<Vec<_>>()),
            normalized(&(0..7).map(|_| next().powi(6)).collect::<Vec<_>>()),
            normalized(&[1e-9, 1.0, 1e-6, 3.0]),
            normalized(&[1.0; 64]),
            // Members from a few vectors to past the kernels' 48 lanes (the portable loop).
            normalized(&(0..200).map(|_| next() + 0.1).collect::<Vec<_>>()),
            normalized(&[1.0; 300]),
        ];
        for weights in &cases {
            for n in [0, 1, 2, 3, 17, 5000, 40_000] {
                assert_eq!(
                    blend(weights, n),
                    reference(weights, n),
                    "{weights:?} n={n}"
                );
            }
        }
    }

    #[test]
    fn blends_exhaustively_as_megatron_core_does() {
        for sizes in [
            vec![1u64],
            vec![3, 2],
            vec![1, 1, 1, 1],
            vec![5000, 1, 20, 333],
            (1..=50).map(|d| d * d).collect(),
            vec![7; 40],
        ] {
            let total: u64 = sizes.iter().sum();
            let (mut out, mut samples) = (vec![0u16; total as usize], vec![-1i64; total as usize]);
            exhaustive_greatest_error_blend(&sizes, &mut out, &mut samples).unwrap();
            assert_eq!(out, exhaustive_reference(&sizes), "{sizes:?}");
            assert_eq!(samples, samples_of(&out), "{sizes:?}");
            for (d, &s) in sizes.iter().enumerate() {
                assert_eq!(out.iter().filter(|&&o| o as usize == d).count() as u64, s);
            }
        }
    }

    #[test]
    fn pieces_give_the_one_run_whatever_the_guess() {
        let weights = [
            normalized(&(1..=100).map(|d| 1.0 / d as f64).collect::<Vec<_>>()),
            normalized(&[1.0, 2.0, 3.0, 4.0]),
            normalized(&[1e-9, 1.0, 1e-6, 3.0]),
            vec![0.5, 0.5],
        ];
        // A guess far from the truth: the pieces' runs never meet and are rewritten whole.
        let far = |g: &mut Greedy, _at: u64| {
            g.counts
                .iter_mut()
                .filter(|c| c.is_finite())
                .for_each(|c| *c = 0.0)
        };
        for w in &weights {
            for n in [0usize, 1, 2, 3, 17, 5000, 70_000] {
                let want = reference(w, n);
                // Pieces alone or two a thread side by side (their meetings early, so that
                // the pair kernel runs long parts of small blends too).
                for (pair, meetings) in [
                    (false, &MEETINGS[..]),
                    (true, &MEETINGS[..]),
                    (true, &[16, 256][..]),
                ] {
                    for pieces in [1u64, 2, 3, 7] {
                        for guessed in [true, false] {
                            let (mut out, mut samples) = (vec![u16::MAX; n], vec![-1i64; n]);
                            let make = || Greedy::new(w.clone(), None, n as u64, w.iter().sum());
                            let blend = Blend {
                                out: &mut out,
                                samples: &mut samples,
                            };
                            if guessed {
                                blend_in_pieces(
                                    make,
                                    blend,
                                    pieces,
                                    Greedy::guess_counts,
                                    pair,
                                    meetings,
                                )
                                .unwrap();
                            } else {
                                blend_in_pieces(make, blend, pieces, far, pair, meetings).unwrap();
                            }
                            let case = format!(
                                "{w:?} n={n} pieces={pieces} {guessed} {pair} {meetings:?}"
                            );
                            assert_eq!(out, want, "{case}");
                            assert_eq!(samples, samples_of(&want), "{case}");
                        }
                    }
                }
            }
        }
        for sizes in [vec![5000u64, 1, 20, 333], (1..=50).map(|d| d * d).collect()] {
            let total: u64 = sizes.iter().sum();
            let want = exhaustive_reference(&sizes);
            let w: Vec<f64> = sizes.iter().map(|&s| s as f64 / total as f64).collect();
            let limits: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
            let cases = [(2u64, false), (5, false), (2, true), (5, true)];
            for ((pieces, pair), guessed) in cases.into_iter().flat_map(|c| [(c, true), (c, false)])
            {
                let (mut out, mut samples) =
                    (vec![u16::MAX; total as usize], vec![-1; total as usize]);
                let make = || Greedy::new(w.clone(), Some(limits.clone()), total, w.iter().sum());
                let blend = Blend {
                    out: &mut out,
                    samples: &mut samples,
                };
                if guessed {
                    blend_in_pieces(make, blend, pieces, Greedy::guess_counts, pair, &[16, 256])
                } else {
                    blend_in_pieces(make, blend, pieces, far, pair, &[16, 256])
                }
                .unwrap();
                assert_eq!(out, want, "{sizes:?} pieces={pieces} {pair} {guessed}");
                assert_eq!(
                    samples,
                    samples_of(&want),
                    "{sizes:?} pieces={pieces} {pair}"
                );
            }
        }
    }

    #[test]
    fn a_long_blend_in_parallel_is_the_one_run() {
        // Over PIECE * 2 positions: the public entry point cuts it in pieces.
        let w = normalized(
            &(0..100)
                .map(|d| ((d * 37 % 101) + 1) as f64)
                .collect::<Vec<_>>(),
        );
        let n = 2 * PIECE as usize + 12_345;
        assert_eq!(blend(&w, n), reference(&w, n));
        // Two pieces a thread from 2 * threads * PIECE positions: pairs side by side.
        let n = 2 * rayon::current_num_threads() * PIECE as usize + 777;
        assert_eq!(blend(&w, n), reference(&w, n));
    }

    #[test]
    fn refuses_bad_input() {
        let (mut out, mut s) = ([0u16; 4], [0i64; 4]);
        assert!(greatest_error_blend(&[], &mut out, &mut s).is_err());
        assert!(greatest_error_blend(&[0.5, 0.6], &mut out, &mut s).is_err());
        assert!(greatest_error_blend(&[1.5, -0.5], &mut out, &mut s).is_err());
        assert!(greatest_error_blend(&[f64::NAN, 1.0], &mut out, &mut s).is_err());
        assert!(greatest_error_blend(&vec![1.0 / 32768.0; 32768], &mut out, &mut s).is_err());
        assert!(greatest_error_blend(&[0.5, 0.5], &mut out, &mut s[..3]).is_err());
        assert!(exhaustive_greatest_error_blend(&[2, 0, 2], &mut out, &mut s).is_err());
        assert!(exhaustive_greatest_error_blend(&[2, 1], &mut out, &mut s).is_err());
        assert!(exhaustive_greatest_error_blend(&[2, 2], &mut out, &mut s[..3]).is_err());
    }
}

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
use crate::prefault::{writing_ahead, Stream};
use crate::simd::Simd;

#[cfg(target_arch = "x86_64")]
mod kernels;

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
    // The caller's arrays are often fresh memory (megatron-core's np.zeros): a helper faults
    // their pages in ahead of the pieces, each piece's part of both arrays in step.
    let streams: Vec<Stream> = blend
        .out
        .chunks(size as usize)
        .zip(blend.samples.chunks(size as usize))
        .flat_map(|(out, samples)| [Stream::of(out), Stream::of(samples)])
        .collect();
    let results: Vec<Result<Vec<Piece>>> = writing_ahead(&streams, || {
        blend
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
            .collect()
    });
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
    /// The vector kernels' copy of the members' counts, for the samples: the counts
    /// themselves stay in registers.
    member_next: Vec<f64>,
    /// Real members (the rest is padding).
    live: usize,
    /// Lanes in use: `live` rounded up to whole vectors of the kernels of `simd` (4 lanes,
    /// then [`blend_width`] or [`exhaustive_width`]; 8 with AVX-512), at most [`MOST_LANES`],
    /// the kernels' reach; more members round up to [`LANES`] and take the portable loop.
    lanes: usize,
    /// The level the largest error has stayed above recently.
    floor: f64,
    /// More than any rounding of an error, at every position of the run.
    slack: f64,
    /// The position of `out[0]` in the run at hand.
    offset: u64,
    /// The kernels this greedy runs.
    simd: Simd,
}

/// The greedy's kernel level for the blend with weights: the widest this CPU runs. With
/// sizes (`exhaustive`), AVX2's at most: its kernels check sizes and come in no wider level.
/// AVX-512's 32 registers keep a pair of runs' counts and errors without spilling: 9.4-11.3
/// -> 6.1-7.5 ns a position on 2 threads (`blend_timing`, 1e8).
fn level(exhaustive: bool) -> Simd {
    let best = Simd::best();
    if exhaustive {
        best.min(Simd::Avx2)
    } else {
        best
    }
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

/// Lanes a scan of every dataset handles at once (two 256-bit vectors of `f64`, or one of
/// 512): the per-dataset arrays are padded to a multiple of it.
const LANES: usize = 8;
/// The most members a kernel holds (12 AVX2 vectors of 4, 6 AVX-512 vectors of 8).
const MOST_LANES: usize = 48;
/// The vectors of 4 lanes the blend's AVX2 kernels hold for `vectors` vectors of members
/// (up to 12): every count to 8, then 10 or 12 (fewer kernels, for the wheel's size).
fn blend_width(vectors: usize) -> usize {
    match vectors {
        0..=8 => vectors.max(1),
        _ => vectors.next_multiple_of(2),
    }
}

/// The vectors of 4 lanes an exhaustive blend's AVX2 kernels hold for `vectors` vectors of
/// members (1 to 12): 1, 2, 4, 8 or 12 (its kernels come in fewer widths, for the wheel's
/// size).
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
        let exhaustive = limits.is_some();
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
            simd: level(exhaustive),
        }
    }

    /// This greedy with the kernels of `simd` (a level the CPU runs: [`Simd::available`]);
    /// the exhaustive blend takes AVX2's where AVX-512's are asked for (it has no others).
    #[cfg(test)]
    fn with_simd(mut self, simd: Simd) -> Self {
        self.simd = match simd {
            Simd::Avx512 if !self.limits.is_empty() => Simd::Avx2,
            simd => simd,
        };
        self
    }

    /// The positions `offset..offset + len` into `blend`, from the counts at hand.
    fn run(&mut self, mut blend: Blend<'_>) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        match self.simd {
            // SAFETY: `simd` is a level the CPU runs (`level`, or a test's pick among
            // `Simd::available`).
            Simd::Avx512 => return unsafe { self.run_avx512(&mut blend) },
            Simd::Avx2 => return unsafe { self.run_avx2(&mut blend) },
            Simd::Portable => {}
        }
        self.run_any(&mut blend, Simd::Portable)
    }

    /// One copy of the AVX2 greedy for every caller (a whole blend, a piece's meeting runs and
    /// its rest, the pieces' checks).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline(never)]
    unsafe fn run_avx2(&mut self, blend: &mut Blend<'_>) -> Result<()> {
        self.run_any(blend, Simd::Avx2)
    }

    /// The AVX-512 greedy, as [`Greedy::run_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline(never)]
    unsafe fn run_avx512(&mut self, blend: &mut Blend<'_>) -> Result<()> {
        self.run_any(blend, Simd::Avx512)
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
        debug_assert_eq!(a.simd, b.simd);
        #[cfg(target_arch = "x86_64")]
        match a.simd {
            // SAFETY: as in `run`.
            Simd::Avx512 => return unsafe { Self::run_pair_avx512(a, &mut ab, b, &mut bb) },
            Simd::Avx2 => return unsafe { Self::run_pair_avx2(a, &mut ab, b, &mut bb) },
            Simd::Portable => {}
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
        Self::run_pair_any(a, ab, b, bb, Simd::Avx2)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline(never)]
    unsafe fn run_pair_avx512(
        a: &mut Greedy,
        ab: &mut Blend<'_>,
        b: &mut Greedy,
        bb: &mut Blend<'_>,
    ) -> Result<()> {
        Self::run_pair_any(a, ab, b, bb, Simd::Avx512)
    }

    /// [`Greedy::run_pair`] with the kernels of `simd` (AVX2 or AVX-512, which the caller
    /// enables).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn run_pair_any(
        a: &mut Greedy,
        ab: &mut Blend<'_>,
        b: &mut Greedy,
        bb: &mut Blend<'_>,
        simd: Simd,
    ) -> Result<()> {
        let (mut ca, mut cb) = (a.begin(ab), b.begin(bb));
        while ca.i < ca.n && cb.i < cb.n {
            ca.check_cancelled()?;
            let (a0, b0) = (ca.i, cb.i);
            let (a_stop, b_stop) = ((a0 + BLOCK).min(ca.n), (b0 + BLOCK).min(cb.n));
            a.draw_members((a_stop - 1) as f64, simd);
            b.draw_members((b_stop - 1) as f64, simd);
            let steps = (a_stop - a0).min(b_stop - b0);
            let done = Self::pair_kernel(
                (a, ab, a0, &mut ca.lowest),
                (b, bb, b0, &mut cb.lowest),
                steps,
                simd,
            );
            if let Some(done) = done {
                a.sync_counts();
                b.sync_counts();
                ca.i += done;
                cb.i += done;
            }
            a.finish_block(&mut ca, (a0, a_stop), ab, simd);
            b.finish_block(&mut cb, (b0, b_stop), bb, simd);
        }
        a.blocks(&mut ca, ab, simd)?;
        b.blocks(&mut cb, bb, simd)
    }

    /// Up to `steps` positions of both runs by the pair kernel of `simd` whose width fits
    /// both runs' members (padding the narrower): the steps made, or `None` (nothing made)
    /// where the members outgrow every kernel.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair_kernel(
        a: kernels::Run<'_, '_>,
        b: kernels::Run<'_, '_>,
        steps: u64,
        simd: Simd,
    ) -> Option<u64> {
        let exhaustive = !a.0.limits.is_empty();
        let lanes = a.0.lanes.max(b.0.lanes);
        if lanes > MOST_LANES {
            return None;
        }
        if simd == Simd::Avx512 {
            // Members come in whole vectors of 8 (`pad_members`).
            a.0.pad_to(lanes);
            b.0.pad_to(lanes);
            // SAFETY (the kernels'): AVX-512 is on (the caller's feature); both runs' member
            // arrays hold `lanes` lanes, padded above.
            macro_rules! pair {
                ($v:literal) => {
                    kernels::members_run_pair_avx512::<$v>(a, b, steps)
                };
            }
            return Some(match lanes / 8 {
                1 => pair!(1),
                2 => pair!(2),
                3 => pair!(3),
                4 => pair!(4),
                5 => pair!(5),
                _ => pair!(6),
            });
        }
        // The AVX2 pair kernel comes in fewer widths than the single one (the wheel's size):
        // even numbers of vectors (and 1), the exhaustive blend's `exhaustive_width`s.
        let lanes = 4 * match lanes / 4 {
            0 | 1 => 1,
            v if exhaustive => exhaustive_width(v),
            v => v.next_multiple_of(2),
        };
        if lanes > MOST_LANES {
            return None;
        }
        a.0.pad_to(lanes);
        b.0.pad_to(lanes);
        // SAFETY (the kernels'): AVX2 is on (the caller's feature); both runs' member arrays
        // hold `lanes` lanes, padded above.
        macro_rules! pair {
            ($v:literal, $ex:literal) => {
                kernels::members_run_pair_avx2::<$v, $ex>(a, b, steps)
            };
        }
        Some(match (exhaustive, lanes / 4) {
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
        })
    }

    /// The greedy over `out`, block by block. The same `f64` operations at every level of
    /// `simd`: the vector kernels only compute more lanes at once and keep the members'
    /// counts in registers. `simd` is passed down (not read from `self.simd`) so that it is
    /// a constant in each `#[target_feature]` copy, which then holds only its own kernels.
    #[inline(always)]
    fn run_any(&mut self, blend: &mut Blend<'_>, simd: Simd) -> Result<()> {
        let mut course = self.begin(blend);
        self.blocks(&mut course, blend, simd)
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
    fn blocks(&mut self, course: &mut Course, blend: &mut Blend<'_>, simd: Simd) -> Result<()> {
        while course.i < course.n {
            course.check_cancelled()?;
            let stop = (course.i + BLOCK).min(course.n);
            self.draw_members((stop - 1) as f64, simd);
            self.finish_block(course, (course.i, stop), blend, simd);
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
        simd: Simd,
    ) {
        let mut i = course.i;
        while i < stop {
            i = self.members_run(i, stop, blend, &mut course.lowest, simd);
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
        // The real datasets, not the padding lanes (whose counts stay infinite): a padding
        // lane counted 0 here would never let a guessed run meet the true one.
        let datasets = if self.limits.is_empty() {
            self.counts.iter().take_while(|c| c.is_finite()).count()
        } else {
            self.limits.iter().take_while(|l| !l.is_nan()).count()
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
        simd: Simd,
    ) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if simd == Simd::Avx512 {
            debug_assert!(self.limits.is_empty(), "the exhaustive blend runs in AVX2");
            macro_rules! kernel {
                ($v:literal) => {
                    // SAFETY: the caller enabled AVX-512; the member arrays hold 8 * $v lanes.
                    unsafe { kernels::members_run_avx512::<$v>(self, start, stop, blend, lowest) }
                };
            }
            match self.lanes / 8 {
                1 => return kernel!(1),
                2 => return kernel!(2),
                3 => return kernel!(3),
                4 => return kernel!(4),
                5 => return kernel!(5),
                6 => return kernel!(6),
                _ => {}
            }
        } else if simd == Simd::Avx2 {
            let exhaustive = !self.limits.is_empty();
            macro_rules! kernel {
                ($v:literal, $ex:literal) => {
                    // SAFETY: the caller enabled AVX2; the member arrays hold 4 * $v lanes.
                    unsafe {
                        kernels::members_run_avx2::<$v, $ex>(self, start, stop, blend, lowest)
                    }
                };
            }
            // The exhaustive blend's members are padded to fewer widths (`pad_members`).
            match (exhaustive, self.lanes / 4) {
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
        let _ = simd;
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
    fn draw_members(&mut self, x_last: f64, simd: Simd) {
        let level = self.floor - 3.0 * self.slack;
        #[cfg(target_arch = "x86_64")]
        match simd {
            // SAFETY: the caller enabled the instruction set of `simd`.
            Simd::Avx512 => {
                unsafe { kernels::draw_members_avx512(self, x_last, level) };
                return self.pad_members(simd);
            }
            Simd::Avx2 => {
                unsafe { kernels::draw_members_avx2(self, x_last, level) };
                return self.pad_members(simd);
            }
            Simd::Portable => {}
        }
        let _ = simd;
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
        self.pad_members(simd);
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
    fn pad_members(&mut self, simd: Simd) {
        self.lanes = match self.live {
            0..=MOST_LANES if simd == Simd::Avx512 => 8 * self.live.div_ceil(8).max(1),
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

    /// [`blend`] with the kernels of `simd`.
    fn blend_with(weights: &[f64], n: usize, simd: Simd) -> Vec<u16> {
        let (mut out, mut samples) = (vec![0u16; n], vec![-1i64; n]);
        let sum = weights.iter().sum();
        let make = || Greedy::new(weights.to_vec(), None, n as u64, sum).with_simd(simd);
        let blend = Blend {
            out: &mut out,
            samples: &mut samples,
        };
        parallel_blend(make, blend).unwrap();
        assert_eq!(samples, samples_of(&out), "{weights:?} n={n} {simd:?}");
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
                let want = reference(weights, n);
                assert_eq!(blend(weights, n), want, "{weights:?} n={n}");
                for simd in Simd::available() {
                    assert_eq!(
                        blend_with(weights, n, simd),
                        want,
                        "{weights:?} n={n} {simd:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn this_cpu_runs_the_widest_kernels_it_has() {
        let widest = *Simd::available().last().unwrap();
        assert_eq!(level(false), widest);
        let sized = if widest == Simd::Avx512 {
            Simd::Avx2
        } else {
            widest
        };
        assert_eq!(level(true), sized);
        assert_eq!(
            Greedy::new(vec![1.0], Some(vec![1.0]), 1, 1.0)
                .with_simd(widest)
                .simd,
            sized
        );
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
                    let levels = Simd::available().into_iter().cycle();
                    for (pieces, simd) in [1u64, 2, 3, 7].into_iter().zip(levels) {
                        for guessed in [true, false] {
                            let (mut out, mut samples) = (vec![u16::MAX; n], vec![-1i64; n]);
                            let make = || {
                                Greedy::new(w.clone(), None, n as u64, w.iter().sum())
                                    .with_simd(simd)
                            };
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
                                "{w:?} n={n} pieces={pieces} {guessed} {pair} {meetings:?} \
                                 {simd:?}"
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
            let cases = cases.into_iter().flat_map(|c| [(c, true), (c, false)]);
            for (((pieces, pair), guessed), simd) in
                cases.zip(Simd::available().into_iter().cycle())
            {
                let (mut out, mut samples) =
                    (vec![u16::MAX; total as usize], vec![-1; total as usize]);
                let make = || {
                    Greedy::new(w.clone(), Some(limits.clone()), total, w.iter().sum())
                        .with_simd(simd)
                };
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
                assert_eq!(
                    out, want,
                    "{sizes:?} pieces={pieces} {pair} {guessed} {simd:?}"
                );
                assert_eq!(
                    samples,
                    samples_of(&want),
                    "{sizes:?} pieces={pieces} {pair}"
                );
            }
        }
    }

    /// Random weights for [`the_pair_kernels_read_what_one_run_reads`]: `datasets` of a kind
    /// (uniform, equal, some zero, small integers, a steep power).
    fn random_weights(lcg: &mut crate::testkit::Lcg, datasets: usize, kind: u64) -> Vec<f64> {
        let raw: Vec<f64> = (0..datasets)
            .map(|_| match kind {
                0 => lcg.unit() + 1e-3,
                1 => 1.0,
                2 => (lcg.below(3) > 0) as u8 as f64 * lcg.unit() + (datasets == 1) as u8 as f64,
                3 => (1 + lcg.below(4)) as f64,
                _ => lcg.unit().powi(4) + 1e-9,
            })
            .collect();
        if raw.iter().all(|&w| w == 0.0) {
            return normalized(&vec![1.0; datasets]);
        }
        normalized(&raw)
    }

    #[test]
    fn the_pair_kernels_read_what_one_run_reads() {
        // Two pieces on one thread side by side, their meetings early so that the pair
        // kernel makes most positions: every kernel level, every width of its members (1 to
        // 70 datasets), ties across vectors (equal weights of 16 to 48 datasets).
        let mut lcg = crate::testkit::Lcg::new(11);
        let mut cases: Vec<Vec<f64>> = [16usize, 24, 40, 48]
            .iter()
            .map(|&d| vec![1.0 / d as f64; d])
            .collect();
        for _ in 0..40 {
            let datasets = 1 + lcg.below(70) as usize;
            let kind = lcg.below(5);
            cases.push(random_weights(&mut lcg, datasets, kind));
        }
        for (c, w) in cases.iter().enumerate() {
            let n = 3_000 + (c * 997) % 9_000;
            let want = reference(w, n);
            for simd in Simd::available() {
                let (mut out, mut samples) = (vec![u16::MAX; n], vec![-1i64; n]);
                let make =
                    || Greedy::new(w.clone(), None, n as u64, w.iter().sum()).with_simd(simd);
                let blend = Blend {
                    out: &mut out,
                    samples: &mut samples,
                };
                blend_in_pieces(make, blend, 2, Greedy::guess_counts, true, &[16, 256]).unwrap();
                assert_eq!(out, want, "{w:?} n={n} {simd:?}");
                assert_eq!(samples, samples_of(&want), "{w:?} n={n} {simd:?}");
            }
        }
    }

    #[test]
    fn a_guess_leaves_the_padding_lanes_spent() {
        // Three sizes, padded to 8 lanes: a guess counts the three, never the padding, so a
        // guessed piece can meet the true run (whose padding counts are infinite).
        let sizes = [1_000_000u64, 700_000, 900_000];
        let total: u64 = sizes.iter().sum();
        let w: Vec<f64> = sizes.iter().map(|&s| s as f64 / total as f64).collect();
        let limits: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
        let mut g = Greedy::new(w, Some(limits), total, 1.0);
        assert_eq!(g.counts.len(), LANES);
        g.guess_counts(1_000_000);
        assert!(
            g.counts[..3].iter().all(|c| c.is_finite()),
            "{:?}",
            g.counts
        );
        assert!(
            g.counts[3..].iter().all(|c| c.is_infinite()),
            "{:?}",
            g.counts
        );
        assert_eq!(g.counts[..3].iter().sum::<f64>(), 1_000_000.0);
    }

    #[test]
    fn a_long_blend_in_parallel_is_the_one_run() {
        // Over PIECE * 2 positions: the public entry point cuts it in pieces. Its arrays (10
        // bytes a position) are past the prefault helper's threshold: the helper faults them
        // in while the pieces write.
        assert!(20 * PIECE as usize > crate::prefault::WRITING_AHEAD_FROM);
        let w = normalized(
            &(0..100)
                .map(|d| ((d * 37 % 101) + 1) as f64)
                .collect::<Vec<_>>(),
        );
        let n = 2 * PIECE as usize + 12_345;
        assert_eq!(blend(&w, n), reference(&w, n));
        // Two pieces a thread from 2 * threads * PIECE positions: pairs side by side (with
        // 20 datasets the members fit the pair kernels).
        let n = 2 * rayon::current_num_threads() * PIECE as usize + 777;
        assert_eq!(blend(&w, n), reference(&w, n));
        let w = normalized(&(1..=20).map(|d| d as f64).collect::<Vec<_>>());
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

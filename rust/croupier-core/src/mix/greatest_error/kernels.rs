//! The blend's x86-64 kernels: the greedy's positions among a block's members, their counts
//! held in registers, in AVX2 (4 lanes a vector) or AVX-512 (8 lanes), and the member draw
//! of each. One generic kernel over [`Wide`] serves both widths; every lane computes the
//! very `f64` operations megatron-core's scalar loop computes.

use std::arch::x86_64::*;

use super::{Blend, Greedy, MOST_LANES};

/// A vector of `f64` lanes: what the member kernels need of AVX2's `__m256d` and AVX-512's
/// `__m512d`. Every method is called only from a function that enables its instruction set.
pub(super) trait Wide: Copy {
    /// Lanes a vector holds.
    const LANES: usize;
    unsafe fn load(p: *const f64) -> Self;
    unsafe fn store(self, p: *mut f64);
    unsafe fn splat(x: f64) -> Self;
    /// `w * x - c` lane by lane, as megatron-core rounds it: the product, then the
    /// difference (no fused multiply-add).
    unsafe fn error(w: Self, x: Self, c: Self) -> Self;
    unsafe fn max(self, other: Self) -> Self;
    /// The largest lane, in every lane.
    unsafe fn spread_max(self) -> Self;
    /// Lane 0.
    unsafe fn first(self) -> f64;
    /// These counts plus 1 in each lane whose error `e` equals `t`, and those lanes as bits.
    unsafe fn count_hits(self, e: Self, t: Self) -> (Self, u64);
    /// These counts, each lane that equals its size made infinite (a spent dataset).
    unsafe fn spend(self, limits: Self) -> Self;
}

impl Wide for __m256d {
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const f64) -> Self {
        _mm256_loadu_pd(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f64) {
        _mm256_storeu_pd(p, self)
    }
    #[inline(always)]
    unsafe fn splat(x: f64) -> Self {
        _mm256_set1_pd(x)
    }
    #[inline(always)]
    unsafe fn error(w: Self, x: Self, c: Self) -> Self {
        _mm256_sub_pd(_mm256_mul_pd(w, x), c)
    }
    #[inline(always)]
    unsafe fn max(self, other: Self) -> Self {
        _mm256_max_pd(self, other)
    }
    #[inline(always)]
    unsafe fn spread_max(self) -> Self {
        let t = _mm256_max_pd(self, _mm256_permute2f128_pd::<1>(self, self));
        _mm256_max_pd(t, _mm256_permute_pd::<0b0101>(t))
    }
    #[inline(always)]
    unsafe fn first(self) -> f64 {
        _mm256_cvtsd_f64(self)
    }
    #[inline(always)]
    unsafe fn count_hits(self, e: Self, t: Self) -> (Self, u64) {
        let hit = _mm256_cmp_pd::<_CMP_EQ_OQ>(e, t);
        let one = _mm256_set1_pd(1.0);
        (
            _mm256_add_pd(self, _mm256_and_pd(hit, one)),
            _mm256_movemask_pd(hit) as u64,
        )
    }
    #[inline(always)]
    unsafe fn spend(self, limits: Self) -> Self {
        let full = _mm256_cmp_pd::<_CMP_EQ_OQ>(self, limits);
        if _mm256_movemask_pd(full) == 0 {
            return self;
        }
        _mm256_blendv_pd(self, _mm256_set1_pd(f64::INFINITY), full)
    }
}

impl Wide for __m512d {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn load(p: *const f64) -> Self {
        _mm512_loadu_pd(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f64) {
        _mm512_storeu_pd(p, self)
    }
    #[inline(always)]
    unsafe fn splat(x: f64) -> Self {
        _mm512_set1_pd(x)
    }
    #[inline(always)]
    unsafe fn error(w: Self, x: Self, c: Self) -> Self {
        _mm512_sub_pd(_mm512_mul_pd(w, x), c)
    }
    #[inline(always)]
    unsafe fn max(self, other: Self) -> Self {
        _mm512_max_pd(self, other)
    }
    #[inline(always)]
    unsafe fn spread_max(self) -> Self {
        // The 256-bit halves swapped, then the 128-bit quarters, then the lanes of each.
        let t = _mm512_max_pd(self, _mm512_shuffle_f64x2::<0b01_00_11_10>(self, self));
        let t = _mm512_max_pd(t, _mm512_shuffle_f64x2::<0b10_11_00_01>(t, t));
        _mm512_max_pd(t, _mm512_permute_pd::<0b0101_0101>(t))
    }
    #[inline(always)]
    unsafe fn first(self) -> f64 {
        _mm512_cvtsd_f64(self)
    }
    #[inline(always)]
    unsafe fn count_hits(self, e: Self, t: Self) -> (Self, u64) {
        let hit = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(e, t);
        (
            _mm512_mask_add_pd(self, hit, self, _mm512_set1_pd(1.0)),
            hit as u64,
        )
    }
    #[inline(always)]
    unsafe fn spend(self, limits: Self) -> Self {
        let full = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(self, limits);
        _mm512_mask_mov_pd(self, full, _mm512_set1_pd(f64::INFINITY))
    }
}

/// One run's registers in [`members_run`] and [`members_run_pair`]: the members' counts, and
/// where their weights and sizes are read (from memory at every position, off the counts'
/// chain: registers are kept for the counts and errors).
struct Lanes<W: Wide, const V: usize> {
    c: [W; V],
    weights: *const f64,
    limits: *const f64,
    floor: f64,
    least: f64,
    /// The next position, in `f64` (exact below 2**53), not converted from the `u64` at
    /// every position: with the conversion in the loop, builds differing only in unrelated
    /// code ran it at 17.5 or 10.5 ns a position (2 threads, 1e8 positions).
    xf: f64,
}

#[allow(clippy::needless_range_loop)] // lane j of several vectors at once
impl<W: Wide, const V: usize> Lanes<W, V> {
    /// The members' counts of `g` into registers (and into its copy for the samples).
    #[inline(always)]
    unsafe fn load(g: &mut Greedy, lowest: f64, start: u64) -> Self {
        // `commit`'s tie buffer and its 64-bit mask of lanes hold at most MOST_LANES.
        const { assert!(W::LANES * V <= MOST_LANES && MOST_LANES <= 64) };
        let mut c = [W::splat(0.0); V];
        for (j, c) in c.iter_mut().enumerate() {
            *c = W::load(g.member_counts.as_ptr().add(W::LANES * j));
            c.store(g.member_next.as_mut_ptr().add(W::LANES * j));
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
    unsafe fn errors(&self) -> ([W; V], W) {
        let x = W::splat(self.xf);
        let mut e = [x; V];
        for j in 0..V {
            e[j] = W::error(W::load(self.weights.add(W::LANES * j)), x, self.c[j]);
        }
        let mut m = e;
        let mut len = V;
        while len > 1 {
            let half = len.div_ceil(2);
            for j in 0..len - half {
                m[j] = m[j].max(m[j + half]);
            }
            len = half;
        }
        (e, m[0].spread_max())
    }

    /// The position goes to the first member whose error is the largest, `t`: the members'
    /// counts and its outputs (position `at` of `blend`) move on.
    #[inline(always)]
    unsafe fn commit<const EXHAUSTIVE: bool>(
        &mut self,
        g: &mut Greedy,
        e: &[W; V],
        t: W,
        blend: &mut Blend<'_>,
        at: usize,
    ) {
        let mut hits = 0u64;
        for j in 0..V {
            let (c, bits) = self.c[j].count_hits(e[j], t);
            self.c[j] = c;
            hits |= bits << (W::LANES * j);
        }
        let k = hits.trailing_zeros() as usize;
        if hits & (hits - 1) != 0 {
            let mut lanes = [0.0; MOST_LANES];
            for j in 0..V {
                self.c[j].store(lanes.as_mut_ptr().add(W::LANES * j));
            }
            let mut others = hits & (hits - 1);
            while others != 0 {
                lanes[others.trailing_zeros() as usize] -= 1.0;
                others &= others - 1;
            }
            for j in 0..V {
                self.c[j] = W::load(lanes.as_ptr().add(W::LANES * j));
            }
        }
        if EXHAUSTIVE {
            for j in 0..V {
                self.c[j] = self.c[j].spend(W::load(self.limits.add(W::LANES * j)));
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
            self.c[j].store(g.member_counts.as_mut_ptr().add(W::LANES * j));
        }
        *lowest = self.least;
    }
}

/// [`Greedy::members_run`] over `V` vectors of members. A position's winner gets its 1
/// through the mask of lanes equal to the largest error, so the next position does not wait
/// for the winner's index; a tie (several such lanes) takes the 1 back from all but the
/// first, as megatron-core's first maximum wins.
#[inline(always)]
unsafe fn members_run<W: Wide, const V: usize, const EXHAUSTIVE: bool>(
    g: &mut Greedy,
    start: u64,
    stop: u64,
    blend: &mut Blend<'_>,
    lowest: &mut f64,
) -> u64 {
    let mut r = Lanes::<W, V>::load(g, *lowest, start);
    let mut reached = stop;
    for i in start..stop {
        let (e, t) = r.errors();
        let top = t.first();
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

/// [`members_run`] of two runs at once, `steps` positions each from `a_start` and `b_start`
/// (one thread's two pieces of a parallel blend): each position's counts wait for the
/// position before, so the core computes one run's position while the other's waits. Both
/// stop at the first step where either misses its floor; returns the steps both made.
#[inline(always)]
unsafe fn members_run_pair<W: Wide, const V: usize, const EXHAUSTIVE: bool>(
    (a, a_blend, a_start, a_lowest): Run<'_, '_>,
    (b, b_blend, b_start, b_lowest): Run<'_, '_>,
    steps: u64,
) -> u64 {
    let mut ra = Lanes::<W, V>::load(a, *a_lowest, a_start);
    let mut rb = Lanes::<W, V>::load(b, *b_lowest, b_start);
    let (a_at, b_at) = ((a_start - a.offset) as usize, (b_start - b.offset) as usize);
    let mut done = steps;
    for s in 0..steps {
        let (ea, ta) = ra.errors();
        let (eb, tb) = rb.errors();
        let (top_a, top_b) = (ta.first(), tb.first());
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

/// One run of a pair: its greedy, its outputs, its first position and its least largest error.
pub(super) type Run<'g, 'b> = (&'g mut Greedy, &'g mut Blend<'b>, u64, &'g mut f64);

/// [`members_run`] in AVX2, `V` vectors of 4 members.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn members_run_avx2<const V: usize, const EXHAUSTIVE: bool>(
    g: &mut Greedy,
    start: u64,
    stop: u64,
    blend: &mut Blend<'_>,
    lowest: &mut f64,
) -> u64 {
    members_run::<__m256d, V, EXHAUSTIVE>(g, start, stop, blend, lowest)
}

/// [`members_run`] in AVX-512, `V` vectors of 8 members (the blend with weights only).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn members_run_avx512<const V: usize>(
    g: &mut Greedy,
    start: u64,
    stop: u64,
    blend: &mut Blend<'_>,
    lowest: &mut f64,
) -> u64 {
    members_run::<__m512d, V, false>(g, start, stop, blend, lowest)
}

/// [`members_run_pair`] in AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn members_run_pair_avx2<const V: usize, const EXHAUSTIVE: bool>(
    a: Run<'_, '_>,
    b: Run<'_, '_>,
    steps: u64,
) -> u64 {
    members_run_pair::<__m256d, V, EXHAUSTIVE>(a, b, steps)
}

/// [`members_run_pair`] in AVX-512 (the blend with weights only).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn members_run_pair_avx512<const V: usize>(
    a: Run<'_, '_>,
    b: Run<'_, '_>,
    steps: u64,
) -> u64 {
    members_run_pair::<__m512d, V, false>(a, b, steps)
}

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
pub(super) unsafe fn draw_members_avx2(g: &mut Greedy, x_last: f64, level: f64) {
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

/// [`Greedy::draw_members`]' scan in AVX-512, eight datasets at a time: each group's members
/// compressed to the front of a vector and stored whole at the next free lane.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn draw_members_avx512(g: &mut Greedy, x_last: f64, level: f64) {
    let datasets = g.weights.len();
    // The loads read whole groups of 8 (the per-dataset arrays are padded to whole groups);
    // the stores write 8 lanes from lane `live` <= datasets - 8 on.
    assert!(datasets.is_multiple_of(8) && g.counts.len() >= datasets);
    assert!(g.members.len() >= datasets && g.member_weights.len() >= datasets);
    assert!(g.limits.is_empty(), "the exhaustive blend draws in AVX2");
    let (w, c) = (g.weights.as_ptr(), g.counts.as_ptr());
    let (mw, mc) = (g.member_weights.as_mut_ptr(), g.member_counts.as_mut_ptr());
    let ids = g.members.as_mut_ptr();
    let (xs, level) = (_mm512_set1_pd(x_last), _mm512_set1_pd(level));
    let lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    let mut live = 0;
    for base in (0..datasets).step_by(8) {
        let weights = _mm512_loadu_pd(w.add(base));
        let counts = _mm512_loadu_pd(c.add(base));
        let e = _mm512_sub_pd(_mm512_mul_pd(weights, xs), counts);
        let hit = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(e, level);
        _mm512_storeu_pd(mw.add(live), _mm512_maskz_compress_pd(hit, weights));
        _mm512_storeu_pd(mc.add(live), _mm512_maskz_compress_pd(hit, counts));
        let id = _mm512_add_epi64(lanes, _mm512_set1_epi64(base as i64));
        let id = _mm512_cvtepi64_epi32(_mm512_maskz_compress_epi64(hit, id));
        _mm256_storeu_si256(ids.add(live).cast(), id);
        live += hit.count_ones() as usize;
    }
    g.live = live;
}

//! A rank's epoch of a weighted mixture: phases of exact per-dataset counts, interleaved,
//! each choice filled with the next sample of that dataset's pass stream.
//!
//! # The order
//!
//! An epoch of `L` positions (per rank) is cut into phases at given starts. Phase `φ` has a
//! nominal length `m_φ` and weights; its counts `c_{d,φ}` are the largest-remainder rounding
//! of `p_{d,φ} m_φ` ([`crate::mix::counts`]) and its order is the interleave of
//! `mix::interleave` (with shuffling) or the datasets one after another in dataset
//! order (without). A phase ends where the next one starts; when that is before its nominal
//! end (a schedule changed mid-phase) it is the prefix of its nominal order.
//!
//! Position `t` drawn from dataset `d` yields `offset_d + s_d[j]`, where `j` counts `d`'s
//! earlier positions in the epoch, across phases, and `s_d` is `d`'s stream on this rank: its
//! share of pass 0, then of pass 1, … (`mix::passes`). So a dataset's stream never
//! restarts at a phase boundary, and no sample repeats before its pass is used up.
//!
//! # Computing a range
//!
//! A range of positions is computed leaf by leaf of the interleave: the root-to-leaf walks
//! give each dataset's count before the range (where its stream stands) and in every leaf;
//! the datasets' stream pieces for the range are read a batch of datasets at a time, in
//! parallel (each pass share computed by one walk of its dataset's partition, or by random
//! access for a few positions), and copied into the output leaf by leaf, each leaf's region
//! holding its datasets' segments one after another; then every leaf is shuffled and put in
//! order inside its own region, in parallel. The batch buffer holds at most a sixteenth of the
//! range or the largest dataset's piece, so a whole epoch of many datasets holds about 1.06
//! times its output at its peak.
//! Nothing depends on the number of threads.

use crate::cancel::cancelled;
use crate::deal::{check_num_replicas, check_world, Deal, Elastic, Layout, Order};
use crate::error::{Error, Result};
use crate::index::{
    index_bytes, try_with_capacity_huge, zeros_par, Index, Indices, MAX_LEN, U32_MAX_LEN,
};
use crate::mix::counts::{phase_counts, probabilities};
use crate::mix::global::{BalancedBoundary, Global, GlobalPhase, Interleaving};
use crate::mix::interleave::{Counts, Interleave};
use crate::mix::passes::Passes;
use rayon::prelude::*;

/// A first call from any position reads this many positions: one leaf walk and at most this
/// many datasets' first blocks (or random-access reads mid-pass).
pub const MIX_FIRST_STOP: u64 = 4;

/// One phase as given: where it starts in the epoch, its nominal length, its weights (one
/// per dataset) and temperature.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSpec {
    /// First position of the phase (the first phase starts at 0).
    pub start: u64,
    /// Nominal length: the counts are rounded over this many positions. At least the distance
    /// to the next phase's start (or to the end of the epoch for the last phase).
    pub length: u64,
    /// Weights, one per dataset.
    pub weights: Vec<f64>,
    /// Temperature: probabilities are `w ** (1 / temperature)`, normalised.
    pub temperature: f64,
}

/// How a [`Mixture`] is dealt: the rank and its world, shuffling, the seed, the epoch's
/// length, the order and the interleave.
///
/// The default is `MixtureSampler`'s: one rank, `drop_last`, shuffled, seed 0, the
/// world-size-invariant order ([`Order::Global`]) with the uniform interleave, one pass of
/// every dataset per epoch.
///
/// # Examples
///
/// ```
/// use croupier_core::{Deal, MixtureConfig};
///
/// let config = MixtureConfig {
///     deal: Deal { num_replicas: 8, rank: 3, drop_last: true },
///     seed: 42,
///     ..MixtureConfig::default()
/// };
/// assert!(config.shuffle && config.length.is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixtureConfig {
    /// The rank, its world, and whether a pass deals each rank `⌊n/W⌋` of a dataset
    /// (`drop_last`) or `⌈n/W⌉`.
    pub deal: Deal,
    /// Interleave the datasets and shuffle their passes; without, a phase is its datasets one
    /// after another, each pass the rank's strided share.
    pub shuffle: bool,
    /// The seed of every shuffle.
    pub seed: u64,
    /// Positions per epoch: per rank in [`Order::PerRank`] (`None`: one pass of every dataset's
    /// share, their sum), of the global sequence in [`Order::Global`] (`None`: one pass of
    /// every dataset, the sizes' sum).
    pub length: Option<u64>,
    /// [`Order::Global`]: one global sequence per epoch, the same for every number of ranks,
    /// dealt with torch's striding (`mix::global`); [`Order::PerRank`]: each rank its own
    /// sequence of exact counts, dealt per dataset pass. Torch's order has no mixture.
    pub order: Order,
    /// How each phase's datasets are interleaved; [`Interleaving::Balanced`] needs
    /// [`Order::Global`].
    pub interleave: Interleaving,
    /// With `shuffle`, whether each dataset's passes are permuted too (the default); `false`
    /// keeps the interleave shuffled and reads every pass in order (a rank's strided share of
    /// it in [`Order::PerRank`]) but for the interleave's slot order inside each of its leaves
    /// (no sample further from its place than a leaf), for callers whose datasets shuffle
    /// their samples themselves.
    pub permute_samples: bool,
}

impl Default for MixtureConfig {
    fn default() -> Self {
        MixtureConfig {
            deal: Deal {
                drop_last: true,
                ..Deal::default()
            },
            shuffle: true,
            seed: 0,
            length: None,
            order: Order::Global,
            interleave: Interleaving::Uniform,
            permute_samples: true,
        }
    }
}

#[derive(Debug, Clone)]
struct Phase {
    start: u64,
    end: u64,
    counts: Vec<u64>,
}

/// A configured mixture on one rank. See the module documentation for the order.
#[derive(Debug, Clone)]
pub struct Mixture {
    offsets: Vec<u64>,
    total: u64,
    passes: Vec<Option<Passes>>,
    num_replicas: u64,
    rank: u64,
    shuffle: bool,
    seed: u64,
    length: u64,
    phases: Vec<Phase>,
    /// In [`Order::Global`]: the global sequence and its layout over the ranks.
    global: Option<(Global, Layout)>,
}

/// Per-rank positions of one pass of each dataset: `⌊n/W⌋` with `drop_last`, `⌈n/W⌉` without.
///
/// # Examples
///
/// ```
/// use croupier_core::mix::pass_shares;
///
/// assert_eq!(pass_shares(&[10, 7], 4, false).unwrap(), [3, 2]);
/// assert_eq!(pass_shares(&[10, 7], 4, true).unwrap(), [2, 1]);
/// assert!(pass_shares(&[10], 0, false).is_err()); // no ranks
/// ```
pub fn pass_shares(sizes: &[u64], num_replicas: u64, drop_last: bool) -> Result<Vec<u64>> {
    check_num_replicas(num_replicas)?;
    Ok(sizes
        .iter()
        .map(|&n| {
            if drop_last {
                n / num_replicas
            } else {
                n.div_ceil(num_replicas)
            }
        })
        .collect())
}

impl Mixture {
    /// A mixture of datasets of `sizes` in the given phases, dealt as `config` says.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase.clone()], &MixtureConfig::default()).unwrap();
    /// assert_eq!(m.len(), 150); // one pass of each dataset's share
    /// assert_eq!(m.phase_counts(0).unwrap(), [100, 50]); // 2 : 1
    /// let one_weight = PhaseSpec { weights: vec![1.0], ..phase };
    /// assert!(Mixture::new(&[100, 50], &[one_weight], &MixtureConfig::default()).is_err());
    /// ```
    pub fn new(sizes: &[u64], phases: &[PhaseSpec], config: &MixtureConfig) -> Result<Self> {
        let Deal {
            num_replicas,
            rank,
            drop_last,
        } = config.deal;
        if sizes.is_empty() {
            return Err(Error::out_of_range(
                "cumulative_sizes",
                "at least 2 entries (one dataset)",
                "1 entry",
            ));
        }
        let shares = pass_shares(sizes, num_replicas, drop_last)?;
        check_world(num_replicas, rank)?;
        check_order(config.order, config.interleave)?;
        let (offsets, total) = dataset_offsets(sizes)?;
        let mixture = Mixture {
            offsets,
            total,
            passes: Vec::new(),
            num_replicas,
            rank,
            shuffle: config.shuffle,
            seed: config.seed,
            length: 0,
            phases: Vec::new(),
            global: None,
        };
        if config.order == Order::Global {
            mixture.in_global_order(sizes, phases, config)
        } else {
            mixture.in_per_rank_order(sizes, &shares, phases, config)
        }
    }

    /// The mixture in the global order: one sequence of `length` (or every sample) global
    /// positions, dealt as torch deals.
    fn in_global_order(
        mut self,
        sizes: &[u64],
        phases: &[PhaseSpec],
        config: &MixtureConfig,
    ) -> Result<Self> {
        let t = config.length.unwrap_or(self.total);
        let layout = Layout::new(t, self.num_replicas, config.deal.drop_last)?;
        // Every dataset is drawn whole, so only an empty one cannot be.
        let checked = Self::phases(phases, sizes, sizes, t)?;
        if config.interleave == Interleaving::Balanced {
            let longest = crate::mix::balanced::longest(sizes.len());
            let mut lengths = checked.iter().map(|p| p.counts.iter().sum::<u64>());
            if let Some(m) = lengths.find(|&m| m > longest) {
                return Err(Error::out_of_range(
                    "phases",
                    format!(
                        "at most {longest} positions long with the balanced interleave over {} \
                         datasets",
                        sizes.len()
                    ),
                    format!("a phase of {m}"),
                ));
            }
        }
        let global = Global {
            sizes: sizes.to_vec(),
            offsets: self.offsets.clone(),
            phases: checked
                .iter()
                .map(|p| GlobalPhase::new(p.start, p.end, p.counts.clone(), config.interleave))
                .collect(),
            shuffle: self.shuffle,
            permute: self.shuffle && config.permute_samples,
            seed: self.seed,
        };
        self.length = layout.num_samples();
        self.phases = checked;
        self.global = Some((global, layout));
        Ok(self)
    }

    /// The mixture in the per-rank order: this rank's own sequence of `length` (or one pass
    /// of each dataset's `shares`) positions, drawn from per-dataset pass streams.
    fn in_per_rank_order(
        mut self,
        sizes: &[u64],
        shares: &[u64],
        phases: &[PhaseSpec],
        config: &MixtureConfig,
    ) -> Result<Self> {
        let length = match config.length {
            Some(l) => l,
            None => shares
                .iter()
                .try_fold(0u64, |a, &s| a.checked_add(s))
                .ok_or_else(|| Error::out_of_range("num_samples", "at most 2**64 - 1", "more"))?,
        };
        self.phases = Self::phases(phases, sizes, shares, length)?;
        self.passes = sizes
            .iter()
            .map(|&n| {
                (n > 0)
                    .then(|| {
                        Passes::new(
                            n,
                            self.num_replicas,
                            self.rank,
                            config.deal.drop_last,
                            self.shuffle && config.permute_samples,
                        )
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        self.length = length;
        Ok(self)
    }

    fn phases(
        specs: &[PhaseSpec],
        sizes: &[u64],
        shares: &[u64],
        length: u64,
    ) -> Result<Vec<Phase>> {
        let Some(first) = specs.first() else {
            return Err(Error::out_of_range(
                "schedule",
                "at least one phase",
                "none",
            ));
        };
        if first.start != 0 {
            return Err(Error::out_of_range(
                "schedule",
                "a first phase that starts at 0",
                first.start,
            ));
        }
        let mut out: Vec<Phase> = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let end = specs.get(i + 1).map_or(length, |next| next.start);
            if i > 0 && (spec.start <= specs[i - 1].start || spec.start >= length) {
                return Err(Error::out_of_range(
                    "schedule",
                    format!("phase starts increasing and below the epoch length {length}"),
                    format!("phase {i} starting at {}", spec.start),
                ));
            }
            if spec.length < end - spec.start {
                return Err(Error::out_of_range(
                    "schedule",
                    format!(
                        "phase {i} of nominal length >= {} (to its end)",
                        end - spec.start
                    ),
                    spec.length,
                ));
            }
            if spec.weights.len() != sizes.len() {
                return Err(Error::out_of_range(
                    "weights",
                    format!("one weight per dataset ({} datasets)", sizes.len()),
                    format!("{} weights", spec.weights.len()),
                ));
            }
            let probs = probabilities(&spec.weights, spec.temperature, "weights")?;
            for (d, &p) in probs.iter().enumerate() {
                if p > 0.0 && shares[d] == 0 {
                    let why = if sizes[d] == 0 {
                        "is empty"
                    } else {
                        "has fewer samples than num_replicas and drop_last=True, so a rank gets none of it"
                    };
                    return Err(Error::out_of_range(
                        "weights",
                        format!("0 for dataset {d}, which {why}"),
                        spec.weights[d],
                    ));
                }
            }
            out.push(Phase {
                start: spec.start,
                end,
                counts: phase_counts(&spec.weights, spec.temperature, spec.length, "weights")?,
            });
        }
        Ok(out)
    }

    /// Positions per rank and epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::mix::pass_shares;
    /// use croupier_core::{Deal, Mixture, MixtureConfig, Order, PhaseSpec};
    ///
    /// let deal = Deal { num_replicas: 3, rank: 1, drop_last: true };
    /// let fast = MixtureConfig { deal, order: Order::PerRank, ..MixtureConfig::default() };
    /// let phase = PhaseSpec { start: 0, length: 49, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase.clone()], &fast).unwrap();
    /// // Without a length, a fast epoch is one pass of every dataset's share on this rank.
    /// assert_eq!(m.len(), pass_shares(&[100, 50], 3, true).unwrap().iter().sum::<u64>());
    /// // A global epoch is one pass of every dataset, dealt to the ranks: 150 // 3 each.
    /// let phase = PhaseSpec { length: 150, ..phase };
    /// let global = MixtureConfig { order: Order::Global, ..fast };
    /// assert_eq!(Mixture::new(&[100, 50], &[phase], &global).unwrap().len(), 50);
    /// ```
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the epoch is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 0, weights: vec![1.0], temperature: 1.0 };
    /// let config = MixtureConfig { length: Some(0), ..MixtureConfig::default() };
    /// let m = Mixture::new(&[10], &[phase], &config).unwrap();
    /// assert!(m.is_empty() && m.range(0, 0, 0).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Number of datasets.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// assert_eq!(m.datasets(), 2);
    /// ```
    pub fn datasets(&self) -> usize {
        self.offsets.len()
    }

    /// Samples in all datasets together.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Indices, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// assert_eq!(m.total(), 150);
    /// // Indices are global: dataset 1's start after dataset 0's 100.
    /// let Indices::U32(v) = m.range(0, 0, m.len()).unwrap() else { unreachable!() };
    /// assert!(v.iter().all(|&i| u64::from(i) < m.total()));
    /// ```
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Phase `i`'s nominal counts per dataset.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let weights = vec![1.0, 1.0, 1.0];
    /// let phase = PhaseSpec { start: 0, length: 200, weights, temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// let counts = m.phase_counts(0).unwrap();
    /// assert_eq!(counts.iter().sum::<u64>(), 200); // the phase's nominal length
    /// assert!(m.phase_counts(1).is_none()); // one phase
    /// ```
    pub fn phase_counts(&self, i: usize) -> Option<&[u64]> {
        self.phases.get(i).map(|p| p.counts.as_slice())
    }

    /// How many positions of phase `phase` (up to its end) each dataset takes in `epoch`: its
    /// nominal counts unless a later phase cuts it short.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phases = [
    ///     PhaseSpec { start: 0, length: 100, weights: vec![1.0, 1.0], temperature: 1.0 },
    ///     PhaseSpec { start: 60, length: 90, weights: vec![0.0, 1.0], temperature: 1.0 },
    /// ];
    /// let m = Mixture::new(&[100, 50], &phases, &MixtureConfig::default()).unwrap();
    /// // Phase 0 ends at 60, before its nominal 100: the counts of its first 60 positions.
    /// let cut = m.effective_counts(3, 0);
    /// assert_eq!(cut.iter().sum::<u64>(), 60);
    /// assert!(cut.iter().zip(m.phase_counts(0).unwrap()).all(|(c, n)| c <= n));
    /// ```
    pub fn effective_counts(&self, epoch: u64, phase: usize) -> Vec<u64> {
        let mut c = vec![0; self.datasets()];
        match &self.global {
            Some((g, _)) => g.add_effective(epoch, phase, &mut c),
            None => self.add_effective(epoch, &self.phases[phase], &mut c),
        }
        c
    }

    /// Positions of the epoch's global sequence in [`Order::Global`] (before torch's padding
    /// or cutting to a multiple of the ranks); `None` in [`Order::PerRank`], where each rank has
    /// its own sequence.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Mixture, MixtureConfig, Order, PhaseSpec};
    ///
    /// let deal = Deal { num_replicas: 4, rank: 1, drop_last: false };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase.clone()], &config).unwrap();
    /// assert_eq!(m.global_len(), Some(150)); // one pass of every dataset, for all ranks
    /// assert_eq!(m.len(), 38); // this rank's positions: ceil(150 / 4), padded as torch pads
    /// let fast = MixtureConfig { order: Order::PerRank, ..config };
    /// assert_eq!(Mixture::new(&[100, 50], &[phase], &fast).unwrap().global_len(), None);
    /// ```
    pub fn global_len(&self) -> Option<u64> {
        self.global.as_ref().map(|(_, layout)| layout.n())
    }

    /// For the balanced interleave (`interleave="balanced"`, the global order): every
    /// balanced phase's last leaf boundary known at or below global position
    /// `global_position` (a checkpoint's first position no rank consumed), as a checkpoint
    /// records them. Empty otherwise. Replays nothing: it lists what reading the sequence has
    /// already found (or [`Mixture::seed_balanced`] was given).
    pub fn balanced_boundaries(&self, global_position: u64) -> Vec<BalancedBoundary> {
        self.global
            .as_ref()
            .map(|(g, _)| g.balanced_boundaries(global_position))
            .unwrap_or_default()
    }

    /// Records `boundary` (from [`Mixture::balanced_boundaries`] of a checkpoint of this
    /// mixture) so that reading from there replays the balanced sequence from it, not from its
    /// phase's start: a resume then costs at most a leaf of the sequence. With `apply` false
    /// only checks it. Refuses a boundary of no balanced phase, off a leaf boundary, or whose
    /// counts are not one per dataset, summing to its position, each within one sample of its
    /// share; counts that pass but are not this sequence's (a state edited by hand) give
    /// another sequence from there, which may leave the one-sample band.
    pub fn seed_balanced(&self, boundary: &BalancedBoundary, apply: bool) -> Result<()> {
        match &self.global {
            Some((g, _)) => g.seed_balanced(boundary, apply),
            None => Err(Error::out_of_range(
                "phase",
                "a phase with the balanced interleave (this mixture has none)",
                boundary.phase.to_string(),
            )),
        }
    }

    fn add_effective(&self, epoch: u64, ph: &Phase, into: &mut [u64]) {
        let nominal: u64 = ph.counts.iter().sum();
        let q = ph.end - ph.start;
        if q == nominal {
            into.iter_mut().zip(&ph.counts).for_each(|(a, c)| *a += c);
        } else if self.shuffle {
            Interleave::new(&ph.counts, (self.seed, epoch), self.rank, ph.start).prefix(q, into);
        } else {
            let mut left = q;
            for (a, &c) in into.iter_mut().zip(&ph.counts) {
                let take = c.min(left);
                *a += take;
                left -= take;
            }
        }
    }

    /// Bytes a [`Mixture::range`] of `[start, stop)` holds at its peak: the output, the
    /// streams' buffer (at most the range again when one dataset dominates), the leaf orders,
    /// and per thread reading a pass: the at most two buckets a partly read pass block deals
    /// beside the output (1/32 of the block), its stripe tables (1/128) and a bucket's shuffle
    /// scratch (1/64), bounded by an eighth of the largest pass share. An estimate, to refuse
    /// what cannot fit before any work.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// let out = m.range(0, 0, m.len()).unwrap();
    /// assert!(m.range_bytes(0, m.len()) >= out.len() as u64 * 4); // at least the u32 output
    /// assert!(m.range_bytes(0, 10) < m.range_bytes(0, m.len()));
    /// ```
    pub fn range_bytes(&self, start: u64, stop: u64) -> u64 {
        let n = stop.saturating_sub(start);
        if let Some((g, _)) = &self.global {
            return g.fill_bytes(n, self.total);
        }
        let leaf = (16 * self.datasets() as u64)
            .next_power_of_two()
            .max(1 << 16);
        let threads = rayon::current_num_threads() as u64;
        let largest_pass = self
            .passes
            .iter()
            .flatten()
            .map(Passes::per_pass)
            .max()
            .unwrap_or(0);
        let readers = threads.min(self.datasets() as u64);
        (2 * n + readers.saturating_mul(largest_pass) / 8).saturating_mul(index_bytes(self.total))
            + threads * leaf * 8
    }

    /// Whether a range `[start, stop)` may take long (a tenth of a second or more) while its
    /// buffers are small: many positions, or many datasets (whose interleave trees cost a
    /// draw per dataset and node), or in the global order a range spread over many leaves
    /// (each leaf it meets is ranked whole: `2**22` global positions, about 15 ms a thread).
    /// The bindings run such calls interruptibly.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// assert!(!m.is_long(0, m.len()));
    /// // A rank's 2**19 positions of 8 ranks' global order read leaves of 2**22 positions.
    /// let deal = Deal { num_replicas: 8, rank: 3, drop_last: true };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let phase = PhaseSpec { start: 0, length: 1 << 22, weights: vec![1.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[1 << 21, 1 << 21], &[phase], &config).unwrap();
    /// assert!(m.is_long(0, m.len()) && !m.is_long(0, m.len() / 2));
    /// ```
    pub fn is_long(&self, start: u64, stop: u64) -> bool {
        let n = stop.saturating_sub(start);
        n >= 1 << 20
            || self.datasets() >= 1 << 12
            || (self.global.is_some() && n.saturating_mul(self.num_replicas) >= 1 << 22)
    }

    /// Bytes a [`Mixture::elastic_range`] of `[start, stop)` holds at its peak: the output
    /// (`u64` per position) and one old rank's range, about as long scaled by the worlds'
    /// sizes, with its own working memory ([`Mixture::range_bytes`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let deal = Deal { num_replicas: 2, rank: 0, drop_last: true };
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let m = Mixture::new(&[100, 50], &[phase], &config).unwrap();
    /// let el = m.elastic(30, 3, false).unwrap();
    /// let n = el.num_samples();
    /// assert!(m.elastic_range_bytes(&el, 0, n) >= n * 8); // at least the output, as u64
    /// ```
    pub fn elastic_range_bytes(&self, elastic: &Elastic, start: u64, stop: u64) -> u64 {
        let n = stop.saturating_sub(start);
        if let Some((g, _)) = &self.global {
            return g.fill_bytes(n, self.total);
        }
        let old = n.saturating_mul(elastic.num_replicas()) / self.num_replicas.max(1);
        self.range_bytes(0, old.min(self.len()))
            .saturating_add(n.saturating_mul(8))
    }

    /// Where a read starting at `start` should stop to hand out its first index soonest
    /// ([`MIX_FIRST_STOP`] positions, at most to the end of the epoch).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// let stop = m.first_stop(20);
    /// assert!(20 < stop && stop <= m.len()); // a short first piece
    /// assert_eq!(m.first_stop(m.len()), m.len()); // never past the end
    /// ```
    pub fn first_stop(&self, start: u64) -> u64 {
        start.saturating_add(MIX_FIRST_STOP).min(self.len())
    }

    /// The same mixture on rank `rank` (of the same number of ranks).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Indices, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// # let u32s = |i: Indices| match i { Indices::U32(v) => v, _ => unreachable!() };
    /// let deal = Deal { num_replicas: 2, rank: 0, drop_last: true };
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let r0 = Mixture::new(&[100, 50], &[phase], &config).unwrap();
    /// let r1 = r0.for_rank(1).unwrap();
    /// // One pass of each dataset per epoch: the two ranks' epochs are every sample once.
    /// let mut all = u32s(r0.range(0, 0, r0.len()).unwrap());
    /// all.extend(u32s(r1.range(0, 0, r1.len()).unwrap()));
    /// all.sort_unstable();
    /// assert_eq!(all, (0..150).collect::<Vec<u32>>());
    /// assert!(r0.for_rank(2).is_err());
    /// ```
    pub fn for_rank(&self, rank: u64) -> Result<Self> {
        check_world(self.num_replicas, rank)?;
        let passes = self
            .passes
            .iter()
            .map(|p| p.as_ref().map(|p| p.for_rank(rank)).transpose())
            .collect::<Result<Vec<_>>>()?;
        Ok(Mixture {
            offsets: self.offsets.clone(),
            total: self.total,
            passes,
            num_replicas: self.num_replicas,
            rank,
            shuffle: self.shuffle,
            seed: self.seed,
            length: self.length,
            phases: self.phases.clone(),
            global: self.global.clone(),
        })
    }

    /// How an epoch of this mixture, dealt over its ranks, continues on `num_replicas` ranks
    /// from global position `offset` ([`Elastic::over_sequences`]: the epoch's global order
    /// takes position `t` of every rank's sequence, rank after rank, before position `t + 1`).
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let deal = Deal { num_replicas: 2, rank: 0, drop_last: true };
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let m = Mixture::new(&[100, 50], &[phase], &config).unwrap();
    /// // The 2 ranks consumed 15 positions each: 30 of their 150 global positions.
    /// let el = m.elastic(30, 3, false).unwrap();
    /// assert_eq!(el.num_replicas(), 3);
    /// assert_eq!(el.num_samples() * 3, 150 - 30);
    /// assert!(m.elastic(151, 3, false).is_err()); // past the epoch's end
    /// ```
    pub fn elastic(&self, offset: u64, num_replicas: u64, drop_last: bool) -> Result<Elastic> {
        if let Some((_, layout)) = &self.global {
            // The global sequence's positions from the offset on: arithmetic.
            return Elastic::new(
                layout.n(),
                self.num_replicas,
                drop_last,
                offset,
                num_replicas,
            );
        }
        Elastic::over_sequences(
            self.num_replicas,
            self.length,
            drop_last,
            offset,
            num_replicas,
        )
    }

    /// New rank `rank`'s positions `[start, stop)` of the rest of `epoch` as `elastic` (from
    /// [`Mixture::elastic`]) deals it: the old ranks' sequences from the offset on, read one
    /// old rank at a time.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Deal, Indices, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// # let u32s = |i: Indices| match i { Indices::U32(v) => v, _ => unreachable!() };
    /// let deal = Deal { num_replicas: 2, rank: 0, drop_last: true };
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let config = MixtureConfig { deal, ..MixtureConfig::default() };
    /// let r0 = Mixture::new(&[100, 50], &[phase], &config).unwrap();
    /// // 2 ranks consumed 15 positions each, then 3 ranks take the rest.
    /// let mut seen = u32s(r0.range(0, 0, 15).unwrap());
    /// seen.extend(u32s(r0.for_rank(1).unwrap().range(0, 0, 15).unwrap()));
    /// let el = r0.elastic(30, 3, false).unwrap();
    /// for rank in 0..3 {
    ///     seen.extend(u32s(r0.elastic_range(&el, rank, 0, 0, el.num_samples()).unwrap()));
    /// }
    /// seen.sort_unstable();
    /// assert_eq!(seen, (0..150).collect::<Vec<u32>>()); // consumed, then the rest: each once
    /// ```
    pub fn elastic_range(
        &self,
        elastic: &Elastic,
        rank: u64,
        epoch: u64,
        start: u64,
        stop: u64,
    ) -> Result<Indices> {
        if let Some((g, _)) = &self.global {
            elastic.check_range(rank, start, stop)?;
            let w = elastic.num_replicas();
            let rest = elastic.rest_span();
            return Ok(if self.total <= U32_MAX_LEN {
                Indices::U32(g.fill(epoch, rest, (rank, w), (start, stop))?)
            } else {
                Indices::U64(g.fill(epoch, rest, (rank, w), (start, stop))?)
            });
        }
        Ok(if self.total <= U32_MAX_LEN {
            Indices::U32(self.gather_olds(elastic, rank, epoch, (start, stop))?)
        } else {
            Indices::U64(self.gather_olds(elastic, rank, epoch, (start, stop))?)
        })
    }

    fn gather_olds<T: Index>(
        &self,
        elastic: &Elastic,
        rank: u64,
        epoch: u64,
        (start, stop): (u64, u64),
    ) -> Result<Vec<T>> {
        // Only the old ranks this range meets are built (at most W / gcd(W, W') of them, one
        // at a time, and a few for a short first piece), never all W: a first index after a
        // resume from many ranks costs what its few positions cost.
        let mut old: Option<Mixture> = None;
        // An old rank's range is read whole: reading it in parts would compute the partly
        // used pass blocks at every cut.
        elastic.gather(
            rank,
            (start, stop),
            |_, _| u64::MAX,
            |s, (a, b), buf: &mut Vec<T>| {
                if old.as_ref().is_none_or(|m| m.rank != s) {
                    old = Some(self.for_rank(s)?);
                }
                let m = old.as_ref().expect("built just above");
                *buf = m.range_as::<T>(epoch, a, b)?;
                Ok(a)
            },
        )
    }

    /// Positions `[start, stop)` of the rank's sequence in `epoch`.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::{Indices, Mixture, MixtureConfig, PhaseSpec};
    ///
    /// let phase = PhaseSpec { start: 0, length: 150, weights: vec![2.0, 1.0], temperature: 1.0 };
    /// let m = Mixture::new(&[100, 50], &[phase], &MixtureConfig::default()).unwrap();
    /// let Indices::U32(whole) = m.range(5, 0, m.len()).unwrap() else { unreachable!() };
    /// let mut sorted = whole.clone();
    /// sorted.sort_unstable();
    /// assert_eq!(sorted, (0..150).collect::<Vec<u32>>()); // one pass of each dataset, no repeat
    /// assert_eq!(m.range(5, 10, 20).unwrap(), Indices::U32(whole[10..20].to_vec())); // a part
    /// assert!(m.range(5, 0, m.len() + 1).is_err());
    /// ```
    pub fn range(&self, epoch: u64, start: u64, stop: u64) -> Result<Indices> {
        if start > stop || stop > self.length {
            return Err(Error::out_of_range(
                "start, stop",
                format!("0 <= start <= stop <= {}", self.length),
                format!("{start}, {stop}"),
            ));
        }
        Ok(if self.total <= U32_MAX_LEN {
            Indices::U32(self.range_as(epoch, start, stop)?)
        } else {
            Indices::U64(self.range_as(epoch, start, stop)?)
        })
    }

    fn range_as<T: Index>(&self, epoch: u64, start: u64, stop: u64) -> Result<Vec<T>> {
        if let Some((g, layout)) = &self.global {
            let w = layout.num_replicas();
            return g.fill(epoch, (0, layout.n()), (self.rank, w), (start, stop));
        }
        let mut out = zeros_par::<T>("a mixture's indices", stop - start)?;
        if start == stop {
            return Ok(out);
        }
        let mut stream_at = vec![0u64; self.datasets()];
        for ph in &self.phases {
            if ph.end <= start {
                self.add_effective(epoch, ph, &mut stream_at);
                continue;
            }
            if ph.start >= stop {
                break;
            }
            let (s, e) = (start.max(ph.start) - ph.start, stop.min(ph.end) - ph.start);
            let dst = &mut out[(ph.start + s - start) as usize..(ph.start + e - start) as usize];
            if self.shuffle {
                self.shuffled_range(epoch, ph, (s, e), &stream_at, dst)?;
            } else {
                self.grouped_range(epoch, ph, (s, e), &stream_at, dst)?;
            }
            if ph.end < stop {
                self.add_effective(epoch, ph, &mut stream_at);
            }
        }
        Ok(out)
    }

    /// Without shuffling a phase is its datasets one after another.
    fn grouped_range<T: Index>(
        &self,
        epoch: u64,
        ph: &Phase,
        (s, e): (u64, u64),
        stream_at: &[u64],
        out: &mut [T],
    ) -> Result<()> {
        let mut lo = 0u64;
        for (d, &c) in ph.counts.iter().enumerate() {
            let (a, b) = (s.max(lo), e.min(lo + c));
            if a < b {
                let dst = &mut out[(a - s) as usize..(b - s) as usize];
                self.read_stream(epoch, d, stream_at[d] + (a - lo), dst)?;
            }
            lo += c;
            if lo >= e {
                break;
            }
        }
        Ok(())
    }

    /// Dataset `d`'s stream from position `from`, as many as `out` holds, as global indices.
    fn read_stream<T: Index>(&self, epoch: u64, d: usize, from: u64, out: &mut [T]) -> Result<()> {
        let passes = self.passes[d]
            .as_ref()
            .expect("a dataset that is drawn is not empty");
        let per = passes.per_pass();
        let (mut pos, mut done) = (from, 0usize);
        while done < out.len() {
            let (pass, within) = (pos / per, pos % per);
            let m = (out.len() - done).min((per - within) as usize);
            passes.read(
                (self.seed, epoch, d as u64, pass),
                (within, within + m as u64),
                self.offsets[d],
                &mut out[done..done + m],
            )?;
            pos += m as u64;
            done += m;
        }
        Ok(())
    }

    fn shuffled_range<T: Index>(
        &self,
        epoch: u64,
        ph: &Phase,
        (s, e): (u64, u64),
        stream_at: &[u64],
        out: &mut [T],
    ) -> Result<()> {
        let il = Interleave::new(&ph.counts, (self.seed, epoch), self.rank, ph.start);
        let b = il.leaf();
        let (l0, l1) = (s / b, e.div_ceil(b));
        let mut at = stream_at.to_vec();
        let leaves = il.leaf_counts((l0, l1), &mut at);
        // In-range counts per leaf: the first and last leaves may be partly outside.
        let mut inside: Vec<Vec<u64>> = leaves
            .iter()
            .map(|c| c.iter().map(|x| x.1).collect())
            .collect();
        let mut ends = vec![(0usize, l0)];
        if leaves.len() > 1 {
            ends.push((leaves.len() - 1, l1 - 1));
        }
        for (i, l) in ends {
            let (lo, hi) = il.leaf_range(l);
            let (a, z) = (s.max(lo), e.min(hi));
            if (a, z) == (lo, hi) {
                continue;
            }
            let order = il.leaf_order(l, &leaves[i]);
            let mut counts = vec![0u64; leaves[i].len()];
            for &x in &order[(a - lo) as usize..(z - lo) as usize] {
                counts[x as usize] += 1;
            }
            for &x in &order[..(a - lo) as usize] {
                at[leaves[i][x as usize].0 as usize] += 1;
            }
            inside[i] = counts;
        }
        let range = LeafRange {
            il: &il,
            first: l0,
            s,
            e,
            counts: &leaves,
            inside: &inside,
        };
        self.fill_leaves(epoch, range, &at, out)
    }

    /// Fills `out` with the leaves `range` meets (`first, first + 1, …`, with counts `leaves`
    /// and in-range counts `inside`), reading each dataset's stream from `at`.
    ///
    /// `out` itself holds the streams' values until the leaves are shuffled: leaf by leaf,
    /// each leaf's region holds its datasets' stream segments one after another (in the
    /// order of the leaf's counts), so that every leaf is then put in order inside its own
    /// region with a leaf-sized scratch. The streams are read a batch of datasets at a time
    /// into a buffer of at most `max(largest piece, range / 16)` and copied to their leaves.
    fn fill_leaves<T: Index>(
        &self,
        epoch: u64,
        LeafRange {
            il,
            first,
            s,
            e,
            counts: leaves,
            inside,
        }: LeafRange<'_>,
        at: &[u64],
        out: &mut [T],
    ) -> Result<()> {
        // Where each leaf entry's segment sits: in `out` (leaf-relative) and in its dataset's
        // piece of the stream.
        let mut need = vec![0u64; self.datasets()];
        let mut segments: Vec<Vec<Segment>> = Vec::with_capacity(leaves.len());
        for (counts, ins) in leaves.iter().zip(inside) {
            let mut off = 0u64;
            segments.push(
                counts
                    .iter()
                    .zip(ins)
                    .map(|(&(d, _), &k)| {
                        let seg = Segment {
                            dataset: d,
                            at: off,
                            from: need[d as usize],
                            len: k,
                        };
                        off += k;
                        need[d as usize] += k;
                        seg
                    })
                    .collect(),
            );
        }
        let total: u64 = need.iter().sum();
        let largest = need.iter().copied().max().unwrap_or(0);
        let budget = largest.max(total / 16);
        let mut buf = try_with_capacity_huge::<T>("a mixture's stream buffer", budget)?;
        // The leaves' regions of `out`, reused by every batch.
        let mut regions: Vec<&mut [T]> = Vec::with_capacity(leaves.len());
        {
            let mut rest: &mut [T] = out;
            for ins in inside {
                let len: u64 = ins.iter().sum();
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
                regions.push(dst);
                rest = tail;
            }
        }
        let mut d0 = 0usize;
        while d0 < need.len() {
            // The next batch of datasets: [d0, d1), their pieces one after another in `buf`.
            let (mut d1, mut size) = (d0, 0u64);
            while d1 < need.len() && (d1 == d0 || size + need[d1] <= budget) {
                size += need[d1];
                d1 += 1;
            }
            buf.clear();
            buf.resize(size as usize, T::from_u64(0));
            let mut piece_at = vec![0u64; d1 - d0];
            {
                let mut pieces = Vec::new();
                let mut rest: &mut [T] = &mut buf;
                let mut run = 0u64;
                for d in d0..d1 {
                    piece_at[d - d0] = run;
                    run += need[d];
                    if need[d] > 0 {
                        let (piece, tail) =
                            std::mem::take(&mut rest).split_at_mut(need[d] as usize);
                        pieces.push((d, at[d], piece));
                        rest = tail;
                    }
                }
                pieces
                    .into_par_iter()
                    .try_for_each(|(d, from, piece)| self.read_stream(epoch, d, from, piece))?;
            }
            if cancelled() {
                return Ok(()); // the caller discards the buffer
            }
            let (buf, piece_at) = (&buf, &piece_at);
            regions
                .par_iter_mut()
                .zip(&segments)
                .with_min_len(4)
                .for_each(|(dst, segs)| {
                    let lo = segs.partition_point(|g| (g.dataset as usize) < d0);
                    for g in segs[lo..].iter().take_while(|g| (g.dataset as usize) < d1) {
                        let src = (piece_at[g.dataset as usize - d0] + g.from) as usize;
                        dst[g.at as usize..(g.at + g.len) as usize]
                            .copy_from_slice(&buf[src..src + g.len as usize]);
                    }
                });
            d0 = d1;
        }
        drop(buf);

        // Every leaf in order, inside its own region.
        regions
            .into_par_iter()
            .zip(leaves)
            .zip(&segments)
            .enumerate()
            .for_each_init(Vec::new, |scratch, (i, ((dst, counts), segs))| {
                if cancelled() {
                    return; // the caller discards the buffer
                }
                let l = first + i as u64;
                let (lo, hi) = il.leaf_range(l);
                let a = s.max(lo) - lo;
                let order = il.leaf_order(l, counts);
                let part = &order[a as usize..(e.min(hi) - lo) as usize];
                scratch.clear();
                scratch.extend_from_slice(dst);
                let mut cursors: Vec<u64> = segs.iter().map(|g| g.at).collect();
                for (o, &x) in dst.iter_mut().zip(part) {
                    let c = &mut cursors[x as usize];
                    *o = scratch[*c as usize];
                    *c += 1;
                }
            });
        Ok(())
    }
}

/// The leaves of a phase's interleave that the range `[s, e)` of the phase's positions meets:
/// leaves `first, first + 1, …`, with each one's counts per dataset and those inside the range.
#[derive(Clone, Copy)]
struct LeafRange<'a> {
    /// The phase's interleave.
    il: &'a Interleave,
    /// The first leaf the range meets.
    first: u64,
    /// The range's first position in the phase.
    s: u64,
    /// The range's end in the phase.
    e: u64,
    /// Per leaf: `(dataset, count)` of every dataset it holds.
    counts: &'a [Counts],
    /// Per leaf: how many of each dataset's positions (in `counts`' order) lie in the range.
    inside: &'a [Vec<u64>],
}

/// One dataset's run of positions in a leaf: `len` values of `dataset`'s stream piece from
/// `from`, placed at `at` in the leaf's region before the leaf is shuffled.
#[derive(Debug, Clone, Copy)]
struct Segment {
    dataset: u32,
    at: u64,
    from: u64,
    len: u64,
}

/// Refuses an order a mixture does not draw: torch's, and the balanced interleave outside
/// the global order.
fn check_order(order: Order, interleave: Interleaving) -> Result<()> {
    match (order, interleave) {
        (Order::Global, _) | (Order::PerRank, Interleaving::Uniform) => Ok(()),
        (Order::PerRank, Interleaving::Balanced) => Err(Error::out_of_range(
            "interleave",
            "'uniform' in the per-rank order (the balanced interleave is the global order's)",
            "'balanced'",
        )),
        (Order::Torch(_), _) => Err(Error::out_of_range(
            "order",
            "the global or the per-rank order for a mixture",
            "torch's order",
        )),
    }
}

/// Where each dataset starts in the concatenation, and its total (at most `2**63 - 1`).
fn dataset_offsets(sizes: &[u64]) -> Result<(Vec<u64>, u64)> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut total: u64 = 0;
    for &n in sizes {
        offsets.push(total);
        total = total
            .checked_add(n)
            .filter(|&t| t <= MAX_LEN)
            .ok_or_else(|| {
                Error::out_of_range("cumulative_sizes", "at most 2**63 - 1 in total", "more")
            })?;
    }
    Ok((offsets, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn one_phase(weights: &[f64], length: u64) -> Vec<PhaseSpec> {
        vec![PhaseSpec {
            start: 0,
            length,
            weights: weights.to_vec(),
            temperature: 1.0,
        }]
    }

    fn mixture(sizes: &[u64], w: u64, r: u64, weights: &[f64], length: Option<u64>) -> Mixture {
        let l = length.unwrap_or_else(|| pass_shares(sizes, w, true).unwrap().iter().sum());
        let config = MixtureConfig {
            deal: Deal {
                num_replicas: w,
                rank: r,
                drop_last: true,
            },
            seed: 9,
            length: Some(l),
            order: Order::PerRank,
            ..MixtureConfig::default()
        };
        Mixture::new(sizes, &one_phase(weights, l), &config).unwrap()
    }

    fn all(m: &Mixture, epoch: u64) -> Vec<u64> {
        m.range(epoch, 0, m.len()).unwrap().to_u64_vec()
    }

    fn dataset_of(offsets: &[u64], v: u64) -> usize {
        offsets.partition_point(|&o| o <= v) - 1
    }

    #[test]
    fn counts_passes_and_disjoint_ranks() {
        let sizes = [30_000u64, 5_000, 70_000, 1_000];
        let weights = [1.0, 3.0, 1.0, 0.5];
        let w = 3;
        let ms: Vec<Mixture> = (0..w)
            .map(|r| mixture(&sizes, w, r, &weights, None))
            .collect();
        let offsets = &ms[0].offsets;
        let counts = ms[0].phase_counts(0).unwrap().to_vec();
        let mut first_pass: Vec<HashSet<u64>> = vec![HashSet::new(); 4];
        for m in &ms {
            let seq = all(m, 4);
            let mut got = vec![0u64; 4];
            let mut seen: Vec<HashMap<u64, u64>> = vec![HashMap::new(); 4];
            let mut per_ds: Vec<Vec<u64>> = vec![Vec::new(); 4];
            for &v in &seq {
                let d = dataset_of(offsets, v);
                got[d] += 1;
                *seen[d].entry(v).or_default() += 1;
                per_ds[d].push(v);
            }
            assert_eq!(got, counts);
            for d in 0..4 {
                let per = sizes[d] / w;
                // No repeat inside a pass, in output order; and pass k is a permutation of pass 0.
                for (k, pass) in per_ds[d].chunks(per as usize).enumerate() {
                    let set: HashSet<u64> = pass.iter().copied().collect();
                    assert_eq!(set.len(), pass.len(), "dataset {d} pass {k} repeats");
                    if k == 0 {
                        for v in &set {
                            assert!(first_pass[d].insert(*v), "ranks overlap in dataset {d}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ranges_and_phases_agree_with_the_whole() {
        let sizes = [300_000u64, 50_000, 1];
        let config = MixtureConfig {
            deal: Deal {
                num_replicas: 2,
                rank: 1,
                drop_last: false,
            },
            seed: 3,
            order: Order::PerRank,
            ..MixtureConfig::default()
        };
        let m = Mixture::new(
            &sizes,
            &[
                PhaseSpec {
                    start: 0,
                    length: 200_000,
                    weights: vec![1.0, 1.0, 0.0],
                    temperature: 1.0,
                },
                PhaseSpec {
                    start: 70_000,
                    length: 105_001,
                    weights: vec![0.0, 1.0, 1.0],
                    temperature: 2.0,
                },
            ],
            &config,
        )
        .unwrap();
        let whole = all(&m, 2);
        assert_eq!(whole.len() as u64, m.len());
        for (a, b) in [
            (0u64, 1u64),
            (65_535, 65_537),
            (69_990, 70_010),
            (100_000, 175_001),
            (5, 150_000),
        ] {
            let part = m.range(2, a, b).unwrap().to_u64_vec();
            assert_eq!(part, whole[a as usize..b as usize], "range {a}..{b}");
        }
        // Phase 0 is cut at 70_000: its prefix, then phase 1's full counts.
        let c0 = m.effective_counts(2, 0);
        assert_eq!(c0.iter().sum::<u64>(), 70_000);
        let mut got = vec![0u64; 3];
        for &v in &whole[..70_000] {
            got[dataset_of(&m.offsets, v)] += 1;
        }
        assert_eq!(got, c0);
    }

    #[test]
    fn bad_schedules_are_refused() {
        let sizes = [10u64, 20];
        let one_rank = MixtureConfig {
            order: Order::PerRank,
            ..MixtureConfig::default()
        };
        let new = |phases: &[PhaseSpec]| Mixture::new(&sizes, phases, &one_rank);
        let p = |start, length, weights: &[f64]| PhaseSpec {
            start,
            length,
            weights: weights.to_vec(),
            temperature: 1.0,
        };
        assert!(new(&[]).is_err());
        assert!(new(&[p(1, 29, &[1.0, 1.0])]).is_err());
        assert!(new(&[p(0, 30, &[1.0])]).is_err());
        assert!(new(&[p(0, 30, &[1.0, 1.0]), p(0, 30, &[1.0, 1.0])]).is_err());
        assert!(new(&[p(0, 30, &[1.0, 1.0]), p(30, 1, &[1.0, 1.0])]).is_err());
        assert!(new(&[p(0, 10, &[1.0, 1.0]), p(20, 10, &[1.0, 1.0])]).is_err());
        let four_ranks = MixtureConfig {
            deal: Deal {
                num_replicas: 4,
                ..one_rank.deal
            },
            ..one_rank
        };
        let err = Mixture::new(&[10, 3], &[p(0, 2, &[1.0, 1.0])], &four_ranks).unwrap_err();
        assert!(err.to_string().contains("dataset 1"), "{err}");
        let err = Mixture::new(&[10, 0], &[p(0, 10, &[1.0, 1.0])], &one_rank).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        assert!(Mixture::new(&[10, 0], &[p(0, 10, &[1.0, 0.0])], &one_rank).is_ok());
    }

    #[test]
    fn an_elastic_rest_reads_the_old_ranks_sequences_in_global_order() {
        let sizes = [3000u64, 500, 12_345, 7];
        let weights = [1.0, 3.0, 2.0, 0.5];
        for (w0, w) in [(4u64, 3u64), (3, 4), (1, 3), (5, 1), (2, 2)] {
            let olds: Vec<Mixture> = (0..w0)
                .map(|r| mixture(&sizes, w0, r, &weights, None))
                .collect();
            let l = olds[0].len();
            let seqs: Vec<Vec<u64>> = olds.iter().map(|m| all(m, 2)).collect();
            let end = w0 * l;
            for drop_last in [false, true] {
                for offset in [0, 1, end / 3, end - 1, end] {
                    let el = olds[0].elastic(offset, w, drop_last).unwrap();
                    let ns = el.num_samples();
                    let rest = end - offset;
                    let want_ns = if drop_last {
                        rest / w
                    } else {
                        rest.div_ceil(w)
                    };
                    assert_eq!(ns, want_ns);
                    let mut got_all = Vec::new();
                    for r in 0..w {
                        let got = olds[1 % w0 as usize]
                            .elastic_range(&el, r, 2, 0, ns)
                            .unwrap()
                            .to_u64_vec();
                        // torch's arithmetic on the rest: h = r + k W, padded from its head.
                        let want: Vec<u64> = (0..ns)
                            .map(|k| {
                                let h = r + k * w;
                                let g = offset + if h < rest { h } else { h % rest };
                                seqs[(g % w0) as usize][(g / w0) as usize]
                            })
                            .collect();
                        assert_eq!(got, want, "{w0}->{w} offset {offset} rank {r}");
                        if ns > 2 {
                            let part = olds[0].elastic_range(&el, r, 2, 1, ns - 1).unwrap();
                            assert_eq!(part.to_u64_vec(), got[1..ns as usize - 1]);
                        }
                        got_all.extend(got);
                    }
                    // What the old ranks had not consumed, each once (plus torch's padding).
                    let mut want_rest: Vec<u64> = (offset..end)
                        .map(|g| seqs[(g % w0) as usize][(g / w0) as usize])
                        .collect();
                    if drop_last {
                        want_rest.truncate((w * ns) as usize);
                    } else {
                        let head = want_rest.clone();
                        want_rest.extend(head.iter().cycle().take((w * ns - rest) as usize));
                    }
                    got_all.sort_unstable();
                    want_rest.sort_unstable();
                    assert_eq!(got_all, want_rest);
                }
            }
        }
    }
}

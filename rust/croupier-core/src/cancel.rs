//! Cooperative cancellation of long calls.
//!
//! A caller that may abandon a long computation (the Python binding, when Ctrl-C arrives)
//! creates a [`Cancel`] flag and makes every thread that works for the call carry it
//! ([`Cancel::attach`]: the calling thread and the threads of a pool made for the call). The
//! long loops of the core (Fisher–Yates, torch's `randperm`, the partition walk, the bucket
//! shuffles, a mixture's leaves) look at the flag every few ten thousand steps and stop early
//! once it is raised; what they leave behind is meaningless, and the caller that raised the
//! flag discards it. A thread that carries no flag is never cancelled, and the flag never
//! changes a result that is returned.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    static FLAG: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// A cancellation flag shared by the threads of one call.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not raised.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// assert!(!cancel.is_raised());
    /// ```
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Asks every thread carrying this flag to stop.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// let seen_by_the_work = cancel.clone(); // one flag, shared by the call's threads
    /// cancel.raise();
    /// assert!(seen_by_the_work.is_raised());
    /// ```
    pub fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancel::raise`] was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// assert!(!cancel.is_raised());
    /// cancel.raise();
    /// assert!(cancel.is_raised());
    /// ```
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Makes the current thread carry this flag (replacing any other) until [`Cancel::detach`].
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// cancel.attach();
    /// assert!(!Cancel::current_is_raised());
    /// cancel.raise();
    /// assert!(Cancel::current_is_raised()); // this thread's long loops stop at their next look
    /// Cancel::detach();
    /// ```
    pub fn attach(&self) {
        FLAG.with(|f| *f.borrow_mut() = Some(Arc::clone(&self.0)));
    }

    /// Makes the current thread carry no flag.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// cancel.attach();
    /// cancel.raise();
    /// Cancel::detach();
    /// assert!(!Cancel::current_is_raised()); // a thread that carries no flag is never cancelled
    /// assert!(cancel.is_raised()); // the flag itself stays raised
    /// ```
    pub fn detach() {
        FLAG.with(|f| *f.borrow_mut() = None);
    }

    /// Whether the flag the current thread carries (if any) was raised: the work of this
    /// thread is being abandoned, and whatever it computes is discarded.
    ///
    /// # Examples
    ///
    /// ```
    /// use croupier_core::Cancel;
    ///
    /// assert!(!Cancel::current_is_raised()); // no flag carried
    /// let cancel = Cancel::new();
    /// cancel.attach();
    /// cancel.raise();
    /// assert!(Cancel::current_is_raised());
    /// // Only the threads that carry the flag see it.
    /// assert!(!std::thread::spawn(Cancel::current_is_raised).join().unwrap());
    /// ```
    pub fn current_is_raised() -> bool {
        cancelled()
    }
}

/// The flag the current thread carries, for a thread started to work for the same call.
pub(crate) fn current() -> Option<Cancel> {
    FLAG.with(|f| f.borrow().as_ref().map(|a| Cancel(Arc::clone(a))))
}

/// Whether the current thread's call was cancelled.
#[inline]
pub(crate) fn cancelled() -> bool {
    FLAG.with(|f| {
        f.borrow()
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Relaxed))
    })
}

/// What a stage that stopped at the raised flag returns (its caller discards it).
pub(crate) fn cancelled_error() -> crate::error::Error {
    crate::error::Error::Cancelled
}

/// Steps between two looks at the flag in a long loop.
pub(crate) const CHECK_EVERY: usize = 1 << 16;

/// The largest of `v` as `u64` (0 when empty), in parallel pieces of [`CHECK_EVERY`], each
/// looking at the flag first (a cancelled call's answer is meaningless).
pub(crate) fn par_max<L: Copy + Into<u64> + Sync>(v: &[L]) -> u64 {
    use rayon::prelude::*;
    v.par_chunks(CHECK_EVERY)
        .map(|c| {
            if cancelled() {
                return 0;
            }
            c.iter().map(|&l| l.into()).max().unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The smallest of `v` as `u64` (0 when empty), as [`par_max`].
pub(crate) fn par_min<L: Copy + Into<u64> + Sync>(v: &[L]) -> u64 {
    use rayon::prelude::*;
    v.par_chunks(CHECK_EVERY)
        .map(|c| {
            if cancelled() {
                return 0;
            }
            c.iter().map(|&l| l.into()).min().unwrap_or(u64::MAX)
        })
        .min()
        .unwrap_or(0)
}

/// `f` of every element of `v`, in parallel pieces of `piece`, each looking at the flag
/// first (a cancelled call's pieces are left at `T::default()`).
pub(crate) fn par_map<L, T, F>(v: &[L], piece: usize, f: F) -> Vec<T>
where
    L: Copy + Sync,
    T: Copy + Default + Send,
    F: Fn(L) -> T + Sync,
{
    use rayon::prelude::*;
    let mut out = vec![T::default(); v.len()];
    out.par_chunks_mut(piece)
        .zip(v.par_chunks(piece))
        .for_each(|(o, i)| {
            if !cancelled() {
                o.iter_mut().zip(i).for_each(|(a, &b)| *a = f(b));
            }
        });
    out
}

/// Elements up to which [`sort_by_key`] is one call of the standard library's stable sort
/// (about 10 ms at most between two looks at the flag).
const SORT_AT_ONCE: usize = 1 << 18;

/// Sorts `v` by `key`, stably, looking at the flag between pieces: slices of up to
/// [`SORT_AT_ONCE`] elements in one call of the standard library's stable sort; longer ones
/// sorted in pieces of that size (in parallel), then merged pairwise, a level at a time (the
/// pairs of a level in parallel; each merge looks at the flag every [`CHECK_EVERY`]
/// elements). A stable sort has one result, so this one is the standard library's. Once the
/// flag is raised what is left in `v` is meaningless.
pub(crate) fn sort_by_key<T, K, F>(v: &mut [T], key: F)
where
    T: Copy + Send + Sync,
    K: Ord,
    F: Fn(&T) -> K + Sync,
{
    if v.len() <= SORT_AT_ONCE {
        v.sort_by_key(&key);
        return;
    }
    use rayon::prelude::*;
    v.par_chunks_mut(SORT_AT_ONCE).for_each(|piece| {
        if !cancelled() {
            piece.sort_by_key(&key);
        }
    });
    let mut buf: Vec<T> = v.to_vec();
    let (mut from, mut to): (&mut [T], &mut [T]) = (v, &mut buf);
    let mut width = SORT_AT_ONCE;
    let mut in_v = true;
    while width < from.len() {
        if cancelled() {
            break;
        }
        to.par_chunks_mut(2 * width)
            .zip(from.par_chunks(2 * width))
            .for_each(|(out, pair)| {
                let (a, b) = pair.split_at(width.min(pair.len()));
                merge(a, b, out, &key);
            });
        std::mem::swap(&mut from, &mut to);
        in_v = !in_v;
        width *= 2;
    }
    if !in_v {
        // The sorted elements are in the buffer: back into `v` (now `to`).
        to.copy_from_slice(from);
    }
}

/// Sorts the values `v` (in parallel up to [`SORT_AT_ONCE`] of them, else by
/// [`sort_by_key`]), looking at the flag between pieces.
pub(crate) fn sort_values(v: &mut [u64]) {
    use rayon::prelude::*;
    if v.len() <= SORT_AT_ONCE {
        v.par_sort_unstable();
    } else {
        sort_by_key(v, |&x| x);
    }
}

/// Merges the sorted `a` and `b` into `out` (ties from `a` first), looking at the flag every
/// [`CHECK_EVERY`] elements.
fn merge<T: Copy, K: Ord, F: Fn(&T) -> K>(a: &[T], b: &[T], out: &mut [T], key: &F) {
    let (mut i, mut j) = (0, 0);
    for (k, slot) in out.iter_mut().enumerate() {
        if k % CHECK_EVERY == 0 && k > 0 && cancelled() {
            return;
        }
        *slot = if j == b.len() || (i < a.len() && key(&b[j]) >= key(&a[i])) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_raised_flag_stops_a_shuffle_early_and_only_on_threads_that_carry_it() {
        let cancel = Cancel::new();
        cancel.attach();
        assert!(!cancelled());
        cancel.raise();
        assert!(cancelled());
        let mut buf: Vec<u32> = (0..1 << 20).collect();
        let mut stream = crate::stream::Stream::new(1, 2, crate::stream::Purpose::Permutation, 0);
        crate::shuffle::fisher_yates::fisher_yates(&mut buf, &mut stream);
        // Stopped at its first look: the top of the buffer is untouched.
        assert!(buf[1..].iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
        Cancel::detach();
        assert!(!cancelled());
        std::thread::spawn(|| assert!(!cancelled())).join().unwrap();
    }

    /// The cancellable stable sort is the standard library's stable sort (pieces merged
    /// with ties from the left), for slices of one piece and of many, odd lengths included.
    #[test]
    fn the_cancellable_sort_is_the_stable_sort() {
        for n in [
            0usize,
            1,
            1000,
            SORT_AT_ONCE,
            SORT_AT_ONCE + 1,
            3 * SORT_AT_ONCE + 12_345,
        ] {
            // Keys with many ties, so that stability shows.
            let v: Vec<u64> = (0..n as u64)
                .map(|i| crate::stream::fold(7, i) % 1000 * (1 << 20) + i)
                .collect();
            let key = |x: &u64| std::cmp::Reverse(*x >> 20);
            let mut want = v.clone();
            want.sort_by_key(key);
            let mut got = v.clone();
            sort_by_key(&mut got, key);
            assert!(got == want, "n = {n}");
            let mut values: Vec<u64> = v.iter().map(|x| x >> 20).collect();
            let mut sorted = values.clone();
            sorted.sort_unstable();
            sort_values(&mut values);
            assert!(values == sorted, "n = {n}");
        }
    }

    /// Runs `f` on a pool of two threads carrying a raised flag (the calling thread too).
    fn with_raised_flag<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        let cancel = Cancel::new();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler({
                let c = cancel.clone();
                move |_| c.attach()
            })
            .build()
            .unwrap();
        cancel.attach();
        cancel.raise();
        let out = pool.install(f);
        Cancel::detach();
        out
    }

    /// Every stage of a bucket plan and of an epoch's plan looks at the flag (building a plan
    /// over 2e7 lengths once ignored it for seconds): with the flag raised before the call,
    /// the plan and the epoch are refused as cancelled, the boundaries' program and the sorts
    /// stop at their first look, and a sequential bucket epoch stops.
    #[test]
    fn a_raised_flag_stops_the_bucket_plans() {
        use crate::bucket::{
            padding_boundaries, quantile_boundaries, BucketPlan, EpochBatches, EpochDraw, Limits,
        };
        let n = 1u64 << 21;
        let lengths: Vec<u32> = (0..n)
            .map(|i| 50 + (crate::stream::fold(3, i) % 3000) as u32)
            .collect();
        let limits = Limits {
            max_tokens: Some(20_000),
            carry: true,
            ..Limits::default()
        };
        // Built without the flag, for the epoch below.
        let plan = BucketPlan::new(&lengths, &[500, 1000, 2000], limits).unwrap();
        with_raised_flag(|| {
            assert_eq!(
                BucketPlan::new(&lengths, &[500, 1000, 2000], limits).unwrap_err(),
                Error::Cancelled
            );
            assert!(padding_boundaries(&lengths, 64, None, |_| true).is_empty());
            // Lengths past the histogram are sorted: the sort stops too (no boundary found).
            let long: Vec<u64> = (0..n)
                .map(|i| (1 << 30) + crate::stream::fold(4, i) % 1000)
                .collect();
            assert!(quantile_boundaries(&long, 4).is_empty());
            assert_eq!(
                EpochBatches::new(&plan, EpochDraw::default()).unwrap_err(),
                Error::Cancelled
            );
            let buckets: Vec<Vec<u64>> = vec![(0..n).collect(), (n..2 * n).collect()];
            let seq = crate::bucket::SequentialBuckets::new(
                &buckets,
                &[32, 32],
                &crate::bucket::SequentialConfig::default(),
            )
            .unwrap();
            assert_eq!(seq.range(1, 2, 0, seq.len()).unwrap_err(), Error::Cancelled);
        });
    }

    /// A balanced mixture's replay (seconds to a resume position at 1e9) stops at its first
    /// look, and keeps none of the boundaries it did not complete: after the cancelled call
    /// the sequence is the one a fresh replay gives.
    #[test]
    fn a_raised_flag_stops_a_balanced_replay_and_leaves_it_sound() {
        let counts = [5000u64, 3000, 2000];
        let fresh = crate::mix::balanced::Balanced::new(&counts, 64);
        let want = fresh.leaf_sequence(100);
        let replayed = crate::mix::balanced::Balanced::new(&counts, 64);
        with_raised_flag(|| {
            let before = replayed.before_leaf(100);
            assert_eq!(before, vec![0; 3]); // boundary 0: nothing replayed
            let mut prefix = vec![0u64; 3];
            replayed.prefix(100 * 64 + 5, &mut prefix);
            assert_eq!(prefix, vec![0; 3]);
        });
        assert_eq!(replayed.leaf_sequence(100), want);
    }

    /// Every stage of the long calls looks at the flag, the first ones included: with the
    /// flag raised before the call, a permutation counts no labels and hands back nothing
    /// (its first second at 1e9 once ignored the flag), and an elastic rest reads no old
    /// share and copies nothing.
    #[test]
    fn a_raised_flag_stops_every_stage_of_the_long_calls() {
        use crate::deal::{Draw, Elastic, Order};
        let cancel = Cancel::new();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler({
                let c = cancel.clone();
                move |_| c.attach()
            })
            .build()
            .unwrap();
        cancel.attach();
        cancel.raise();
        pool.install(|| {
            let n = 1 << 22;
            let namer = crate::shuffle::parallel::Namer::permutation(1, 2);
            let counts = crate::shuffle::parallel::stripe_counts(n, &namer);
            assert!(counts.iter().all(|c| c.iter().all(|&x| x == 0)));
            let perm = crate::shuffle::parallel::permutation(n, 1, 2).unwrap();
            assert_eq!(perm.len(), 0);
            let rest = Elastic::new(n, 8, false, n / 2, 6).unwrap();
            for (shuffle, order) in [
                (true, Order::PerRank),
                (true, Order::Global),
                (false, Order::PerRank),
            ] {
                let draw = Draw {
                    shuffle,
                    order,
                    seed: 1,
                    epoch: 2,
                };
                let got = rest.range(0, draw, 0..rest.num_samples());
                assert!(got.unwrap().len() < 1 << 17, "shuffle={shuffle}");
            }
        });
        Cancel::detach();
    }
}

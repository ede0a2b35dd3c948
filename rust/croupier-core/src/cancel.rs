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

/// Whether the current thread's call was cancelled.
#[inline]
pub(crate) fn cancelled() -> bool {
    FLAG.with(|f| {
        f.borrow()
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Relaxed))
    })
}

/// Steps between two looks at the flag in a long loop.
pub(crate) const CHECK_EVERY: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;

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
                (true, Order::Fast),
                (true, Order::Global),
                (false, Order::Fast),
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

//! Faulting in a caller's output ahead of the threads that write it.
//!
//! An output buffer the caller hands in is often memory no one has touched yet: megatron-core
//! builds a blend into fresh `np.zeros` arrays, 10 GB at 1e9 positions, and the blend's first
//! write to each page faults it in. On the VMs this was measured on, the host serves those
//! faults one at a time whichever vCPU takes them: the blend's threads, each computing and
//! faulting, waited on each other's faults (10 GB touched fresh: 5.7 s on one thread, 7.5 s
//! on two). [`writing_ahead`] gives the faults to one helper thread that runs ahead of the
//! writers, so they find their pages present and keep computing while it waits on the host.
//!
//! The helper asks the kernel to make the pages present and writable without writing them
//! (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14 and later): their contents stay as they are,
//! so the helper never races the writers. Where that is refused (an older kernel, another
//! system, memory that cannot be populated) the helper stops and the writers fault as
//! before: the helper changes speed, never contents.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::cancel::cancelled;

/// Outputs smaller than this (in bytes, all streams together) are left to their writers: the
/// helper thread would cost more than it saves.
pub(crate) const WRITING_AHEAD_FROM: usize = 16 << 20;

/// Bytes the helper populates between two looks at whether the work is done or cancelled: a
/// madvise call is not interrupted by the call's flag, and 2 MiB of fresh memory took about
/// 3 ms on the slow VM (1.5 s a GiB), so the helper stops well within Ctrl-C's 100 ms even
/// where a huge page's fault waits for the kernel to compact memory.
const STEP_BYTES: usize = 2 << 20;

/// A byte range of an output that its writers fill from its start to its end, all the
/// call's ranges at about the same pace relative to their lengths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    /// Address of the first byte.
    pub(crate) start: usize,
    /// Length in bytes.
    pub(crate) len: usize,
}

impl Stream {
    /// The bytes of `values`.
    pub(crate) fn of<T>(values: &[T]) -> Stream {
        Stream {
            start: values.as_ptr() as usize,
            len: std::mem::size_of_val(values),
        }
    }
}

/// Runs `work` while a helper thread faults in the pages of `streams` ahead of it, in the
/// order the writers reach them (every stream's first part, then every stream's next part,
/// and so on); returns what `work` returns. The helper stops when `work` returns, when the
/// call is cancelled, or when the kernel refuses. Below [`WRITING_AHEAD_FROM`] bytes in all,
/// or on a system other than Linux, `work` simply runs.
pub(crate) fn writing_ahead<R>(streams: &[Stream], work: impl FnOnce() -> R) -> R {
    let total: usize = streams.iter().map(|s| s.len).sum();
    if total < WRITING_AHEAD_FROM || !cfg!(target_os = "linux") {
        return work();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let cancel = crate::cancel::current();
        let done = &done;
        let steps = total.div_ceil(STEP_BYTES);
        // A thread that cannot be made (a process limit) only costs the speed it would give.
        let _helper = std::thread::Builder::new()
            .name("croupier-prefault".into())
            .spawn_scoped(scope, move || {
                if let Some(c) = &cancel {
                    c.attach();
                }
                let stop = || done.load(Ordering::Relaxed) || cancelled();
                // SAFETY: the streams are the caller's output buffers, writable and alive
                // until `work` returns, and the scope joins this thread before it does.
                unsafe { populate(streams, steps, &stop) };
            });
        // The helper stops when the work ends, also when it ends by a panic.
        let _stop = StopOnDrop(done);
        work()
    })
}

/// Raises its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Populates `streams` in `steps` rounds (round `r` covers the part `[r/steps, (r+1)/steps)`
/// of each stream's whole pages), looking at `stop` before each stream's range of a round.
/// Returns the rounds done in full: `steps` unless stopped or refused.
///
/// # Safety
///
/// Every stream is memory of this process, writable and mapped for the whole call (its
/// contents are not changed).
pub(crate) unsafe fn populate(streams: &[Stream], steps: usize, stop: &dyn Fn() -> bool) -> usize {
    let page = page_size();
    // Each stream's whole pages: a partial page at either end is left to its writers.
    let pages: Vec<(usize, usize)> = streams
        .iter()
        .map(|s| {
            let lo = s.start.next_multiple_of(page);
            let hi = (s.start + s.len) / page * page;
            (lo, hi.max(lo))
        })
        .collect();
    for r in 0..steps {
        for &(lo, hi) in &pages {
            if stop() {
                return r;
            }
            let at = |k: usize| lo + ((hi - lo) / page * k / steps) * page;
            let (from, to) = (at(r), at(r + 1));
            // SAFETY: a whole-page range inside a stream (the caller's promise).
            if to > from && !unsafe { populate_write(from, to - from) } {
                return r;
            }
        }
    }
    steps
}

/// The system's page size.
fn page_size() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if size > 0 {
            return size as usize;
        }
    }
    4096
}

/// Makes the pages of `[addr, addr + len)` (page-aligned) present and writable, contents
/// unchanged; whether the kernel did.
///
/// # Safety
///
/// The range is writable memory of this process, mapped for the whole call.
unsafe fn populate_write(addr: usize, len: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the caller's promise; MADV_POPULATE_WRITE faults the pages in as a write
        // would, without writing them.
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (addr, len);
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A fresh anonymous mapping of `len` bytes, never touched.
    struct Fresh {
        addr: usize,
        len: usize,
    }

    impl Fresh {
        fn new(len: usize) -> Fresh {
            // SAFETY: an anonymous private mapping, unmapped on drop.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // 4 KiB pages whatever the system's huge-page setting, so that residency is
            // exactly the pages populated.
            // SAFETY: the mapping just made.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
            Fresh {
                addr: p as usize,
                len,
            }
        }

        /// Which of its pages are resident.
        fn resident(&self) -> Vec<bool> {
            let page = page_size();
            let mut v = vec![0u8; self.len.div_ceil(page)];
            // SAFETY: the mapping is ours, v has a byte per page.
            let rc = unsafe {
                libc::mincore(
                    self.addr as *mut libc::c_void,
                    self.len,
                    v.as_mut_ptr().cast(),
                )
            };
            assert_eq!(rc, 0);
            v.iter().map(|b| b & 1 == 1).collect()
        }

        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the mapping is ours and readable and writable.
            unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
        }
    }

    impl Drop for Fresh {
        fn drop(&mut self) {
            // SAFETY: mapped in new with this length.
            unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
        }
    }

    /// Whether this kernel populates (MADV_POPULATE_WRITE, Linux 5.14 and later); the tests
    /// that look at residency say so and stop where it does not.
    fn supported() -> bool {
        let fresh = Fresh::new(page_size());
        // SAFETY: a page of our own writable mapping.
        let ok = unsafe { populate_write(fresh.addr, fresh.len) };
        if !ok {
            eprintln!("MADV_POPULATE_WRITE refused here: residency not tested");
        }
        ok
    }

    #[test]
    fn populates_every_whole_page_of_every_stream_and_nothing_else() {
        if !supported() {
            return;
        }
        let page = page_size();
        let fresh = Fresh::new(64 * page);
        // Two streams over pages 1..30 and 33..60, each starting and ending mid-page.
        let streams = [
            Stream {
                start: fresh.addr + page + 100,
                len: 29 * page - 200,
            },
            Stream {
                start: fresh.addr + 33 * page + 1,
                len: 27 * page - 2,
            },
        ];
        assert!(fresh.resident().iter().all(|&r| !r));
        // SAFETY: both streams lie in our writable mapping.
        assert_eq!(unsafe { populate(&streams, 7, &|| false) }, 7);
        let got = fresh.resident();
        for (p, &r) in got.iter().enumerate() {
            // Whole pages only: 2 to 28 of the first, 34 to 58 of the second.
            let want = (2..29).contains(&p) || (34..59).contains(&p);
            assert_eq!(r, want, "page {p}");
        }
    }

    #[test]
    fn leaves_the_contents_as_they_were() {
        if !supported() {
            return;
        }
        let page = page_size();
        let mut fresh = Fresh::new(16 * page);
        for (k, b) in fresh.bytes()[..5 * page].iter_mut().enumerate() {
            *b = (k * 7 + 3) as u8;
        }
        let stream = Stream {
            start: fresh.addr,
            len: 16 * page,
        };
        // SAFETY: the stream is our writable mapping.
        assert_eq!(unsafe { populate(&[stream], 3, &|| false) }, 3);
        assert!(fresh.resident().iter().all(|&r| r));
        let bytes = fresh.bytes();
        assert!(bytes[..5 * page]
            .iter()
            .enumerate()
            .all(|(k, &b)| b == (k * 7 + 3) as u8));
        assert!(bytes[5 * page..].iter().all(|&b| b == 0));
    }

    #[test]
    fn stops_when_asked_and_leaves_the_rest_untouched() {
        if !supported() {
            return;
        }
        let page = page_size();
        let fresh = Fresh::new(40 * page);
        let stream = Stream {
            start: fresh.addr,
            len: 40 * page,
        };
        // Stopped before its third range: two rounds of 4 pages done, nothing after.
        let looks = std::cell::Cell::new(0);
        let stop = || {
            looks.set(looks.get() + 1);
            looks.get() > 2
        };
        // SAFETY: the stream is our writable mapping.
        assert_eq!(unsafe { populate(&[stream], 10, &stop) }, 2);
        let got = fresh.resident();
        assert!(got[..8].iter().all(|&r| r) && got[8..].iter().all(|&r| !r));
    }

    #[test]
    fn writing_ahead_returns_the_work_and_populates_large_outputs() {
        if !supported() {
            return;
        }
        let fresh = Fresh::new(WRITING_AHEAD_FROM);
        let stream = Stream {
            start: fresh.addr,
            len: fresh.len,
        };
        // The work waits (at most a minute) until the helper has made the last page present.
        let last = fresh.len / page_size() - 1;
        let since = std::time::Instant::now();
        let out = writing_ahead(&[stream], || {
            while !fresh.resident()[last] && since.elapsed().as_secs() < 60 {
                std::thread::yield_now();
            }
            42
        });
        assert_eq!(out, 42);
        assert!(fresh.resident().iter().all(|&r| r));
        // Below the threshold nothing is populated.
        let small = Fresh::new(1 << 20);
        let stream = Stream {
            start: small.addr,
            len: small.len,
        };
        assert_eq!(writing_ahead(&[stream], || 7), 7);
        assert!(small.resident().iter().all(|&r| !r));
    }

    #[test]
    fn writers_racing_the_helper_keep_every_value() {
        // Two threads fill fresh memory while the helper populates it, each its half from the
        // start (as a blend's pieces do): every value written stays (a helper that wrote, or
        // zeroed, pages behind a writer would lose some).
        let mut fresh = Fresh::new(2 * WRITING_AHEAD_FROM);
        let values: &mut [u64] = {
            let bytes = fresh.bytes();
            // SAFETY: the mapping is page-aligned, so aligned for u64, and its length a
            // multiple of 8.
            unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / 8) }
        };
        let half = values.len() / 2;
        let streams = [Stream::of(&values[..half]), Stream::of(&values[half..])];
        writing_ahead(&streams, || {
            let (a, b) = values.split_at_mut(half);
            std::thread::scope(|scope| {
                for (part, first) in [(a, 0u64), (b, half as u64)] {
                    scope.spawn(move || {
                        for (k, v) in part.iter_mut().enumerate() {
                            *v = (first + k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        }
                    });
                }
            });
        });
        assert!(values
            .iter()
            .enumerate()
            .all(|(k, &v)| v == (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1));
    }
}

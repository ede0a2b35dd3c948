//! The loop of a shuffle whose random stream is sequential (numpy's legacy `RandomState`,
//! torch's CPU generator): step `s` reads target `t_s`, the `s`-th output of the stream made
//! into a position, and touches the buffer there. The stream cannot be split, but it does not
//! depend on the buffer, so its outputs are drawn a block at a time, ahead of the steps: each
//! target is prefetched [`LOOKAHEAD`] steps before its step (the steps' random accesses
//! overlap), and from [`DRAWS_APART_FROM`] steps on a second thread draws the blocks while
//! this one makes the steps (for numpy's stream, a third of a step's time on one thread).
//! The drawing thread also prefetches every other target as it draws it, thousands of steps
//! early: the line comes from memory on that core's account and waits in the shared cache, so
//! the two cores' outstanding misses add up where one core's alone bounded the steps (numpy's
//! shuffle of `u32`s, `examples/legacy_timing`: 8.2-8.6 ns a swap at 4e7 against 11.0-12.5,
//! 10.7-11.9 at 2e8 against 13.2-13.5; every target, or one in three or four, was slower).
//! The steps and their order are the plain loop's, so the result is too.

use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};

use crate::cancel::{cancelled, CHECK_EVERY};
use crate::shuffle::fisher_yates::{prefetch, LOOKAHEAD};

/// Steps from which the draws are made on a second thread (with numpy's stream drawn a block
/// at a time, the threaded legacy shuffle measured 3.0-4.0 ns a swap at 2e6 against 4.3-6.0
/// on one thread, and slower below 1e6: `examples/legacy_timing`).
pub const DRAWS_APART_FROM: usize = 1 << 21;
/// Draws made at once on the stepping thread.
const LOCAL_BLOCK: usize = 512;
/// Draws a block carries from the drawing thread to the stepping one.
const DRAW_BLOCK: usize = 1 << 13;
/// Blocks drawn ahead of the steps at most.
const BLOCKS_AHEAD: usize = 4;

/// Makes `steps` steps over `buf`: `draw(s, block)` fills `block` with the targets of steps
/// `s .. s + block.len()` (called with consecutive ranges from 0, so a stream is read in
/// order), and `step(buf, s, target)` makes step `s`. Stops early (the buffer partly done)
/// when the call is cancelled; `draw` may then have read further than the steps made.
pub(crate) fn drawn_steps<T: Send>(
    buf: &mut [T],
    steps: usize,
    mut draw: impl FnMut(usize, &mut [u64]) + Send,
    mut step: impl FnMut(&mut [T], usize, usize),
) {
    if steps >= DRAWS_APART_FROM {
        return with_drawing_thread(buf, steps, draw, step);
    }
    // One block of draws at a time, each target prefetched LOOKAHEAD steps ahead (a block
    // holds more than that, and the next block is drawn once the steps reach it).
    let mut block = [0u64; LOCAL_BLOCK];
    let mut s = 0;
    while s < steps {
        if cancelled() {
            return;
        }
        let len = LOCAL_BLOCK.min(steps - s);
        draw(s, &mut block[..len]);
        for &t in &block[..len.min(LOOKAHEAD)] {
            prefetch(buf.as_ptr().wrapping_add(t as usize));
        }
        for k in 0..len {
            if let Some(&ahead) = block[..len].get(k + LOOKAHEAD) {
                prefetch(buf.as_ptr().wrapping_add(ahead as usize));
            }
            step(buf, s + k, block[k] as usize);
        }
        s += len;
    }
}

/// [`drawn_steps`] with the draws made on a second thread: full blocks of targets come over a
/// channel and go back to be refilled, so no block is allocated after the first few.
fn with_drawing_thread<T: Send>(
    buf: &mut [T],
    steps: usize,
    mut draw: impl FnMut(usize, &mut [u64]) + Send,
    mut step: impl FnMut(&mut [T], usize, usize),
) {
    let (full_tx, full_rx) = sync_channel::<Vec<u64>>(BLOCKS_AHEAD);
    let (empty_tx, empty_rx) = channel::<Vec<u64>>();
    std::thread::scope(|scope| {
        // The drawing side is compiled once, whatever the element type and the steps.
        let draw: &mut (dyn FnMut(usize, &mut [u64]) + Send) = &mut draw;
        let cancel = crate::cancel::current();
        let stage = Stage {
            base: buf.as_ptr() as usize,
            size: std::mem::size_of::<T>(),
        };
        scope.spawn(move || {
            if let Some(c) = &cancel {
                c.attach();
            }
            draw_blocks(steps, draw, &full_tx, &empty_rx, stage);
        });
        // Owned here, so a return drops it: a drawing thread waiting to send then stops.
        let full_rx = full_rx;
        let mut s = 0;
        for block in full_rx.iter() {
            for (k, &t) in block.iter().enumerate() {
                if k % CHECK_EVERY == 0 && cancelled() {
                    return; // dropping the receiver stops the drawing thread
                }
                if let Some(&ahead) = block.get(k + LOOKAHEAD) {
                    prefetch(buf.as_ptr().wrapping_add(ahead as usize));
                }
                step(buf, s, t as usize);
                s += 1;
            }
            let _ = empty_tx.send(block);
        }
    });
}

/// Where the buffer's elements are, for the drawing thread's prefetches.
#[derive(Clone, Copy)]
struct Stage {
    base: usize,
    size: usize,
}

/// Every this many targets, the drawing thread prefetches one (the stepping thread's own
/// prefetch, [`LOOKAHEAD`] steps ahead, then finds half of them in the shared cache).
const STAGE_EVERY: usize = 2;

/// The drawing thread of [`with_drawing_thread`]: blocks of the targets of `steps` steps, in
/// order, sent on `full` (refilling the blocks that come back on `empty`); stops when the
/// call is cancelled or the stepping thread has stopped.
fn draw_blocks(
    steps: usize,
    draw: &mut (dyn FnMut(usize, &mut [u64]) + Send),
    full: &SyncSender<Vec<u64>>,
    empty: &Receiver<Vec<u64>>,
    stage: Stage,
) {
    let mut s = 0;
    while s < steps {
        if cancelled() {
            return; // the stepping thread sees the closed channel
        }
        let mut block = empty
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(DRAW_BLOCK));
        let end = (s + DRAW_BLOCK).min(steps);
        block.resize(end - s, 0);
        draw(s, &mut block);
        for &t in block.iter().step_by(STAGE_EVERY) {
            prefetch((stage.base + t as usize * stage.size) as *const u8);
        }
        s = end;
        if full.send(block).is_err() {
            return; // the stepping thread stopped (cancelled)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Lcg;

    /// A stream of targets for `n` forward swaps (`i` with a position in `[i, n)`), from a
    /// small LCG, and the plain loop over it.
    fn forward(n: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
        let target = |lcg: &mut Lcg, i: usize| i + lcg.below((n - i) as u64) as usize;
        let mut plain: Vec<u32> = (0..n as u32).collect();
        let mut state = Lcg::new(seed);
        for i in 0..n.saturating_sub(1) {
            let j = target(&mut state, i);
            plain.swap(i, j);
        }
        let mut drawn: Vec<u32> = (0..n as u32).collect();
        let mut state = Lcg::new(seed);
        let mut next = 0;
        drawn_steps(
            &mut drawn,
            n.saturating_sub(1),
            |s, block| {
                assert_eq!(s, next, "draws asked for in order");
                for (k, t) in block.iter_mut().enumerate() {
                    *t = target(&mut state, s + k) as u64;
                }
                next = s + block.len();
            },
            |buf, i, j| buf.swap(i, j),
        );
        (drawn, plain)
    }

    #[test]
    fn the_steps_are_the_plain_loops_on_one_thread_and_on_two() {
        for n in [
            0,
            1,
            2,
            LOOKAHEAD,
            LOCAL_BLOCK - 1,
            LOCAL_BLOCK + 2,
            100_000,
            DRAWS_APART_FROM + DRAW_BLOCK + 3,
        ] {
            let (drawn, plain) = forward(n, n as u64);
            assert_eq!(drawn, plain, "n = {n}");
        }
    }
}

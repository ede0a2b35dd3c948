//! Times a full permutation beside the memory passes it is made of, on all threads:
//! `cargo run --release --example perm_timing -- N [REPEATS] [only]` (default 5 repeats;
//! medians; `only`: the permutation into the reused buffer alone, for a profiler).
//!
//! - `write pass`: every value of a `u32` buffer of `N` written once, in order (the floor of
//!   any permutation: its output written once);
//! - `read pass`, `copy pass`: the buffer read once; read and written to a second one;
//! - `scatter pass`: every value written to one of 64 buckets by a label drawn from
//!   xoshiro256++ (the permutation's first level: draws plus 64 write streams);
//! - `permutation`: `croupier_core::fill` into the same (reused, already touched) buffer,
//!   and `croupier_core::permutation` into a fresh one of huge pages (its page faults too).
//!
//! Passes and permutations alternate, so a slow spell of the machine slows all of them. Each
//! line gives the median seconds, the bytes a second the pass's bytes make, and the
//! permutation's time in write passes.
use rand_core::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;
use std::time::Instant;

/// Values a thread's task covers in the parallel passes.
const PIECE: usize = 1 << 16;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn write_pass(buf: &mut [u32]) {
    buf.par_chunks_mut(PIECE).enumerate().for_each(|(c, s)| {
        let first = (c * PIECE) as u32;
        for (i, x) in s.iter_mut().enumerate() {
            *x = first.wrapping_add(i as u32);
        }
    });
}

fn read_pass(buf: &[u32]) -> u64 {
    buf.par_chunks(PIECE)
        .map(|s| s.iter().map(|&x| u64::from(x)).sum::<u64>())
        .sum()
}

fn copy_pass(from: &[u32], to: &mut [u32]) {
    to.par_chunks_mut(PIECE)
        .zip(from.par_chunks(PIECE))
        .for_each(|(t, f)| t.copy_from_slice(f));
}

/// Each piece's values to 64 buckets of its own region by a label of 6 bits (10 from a 64-bit
/// draw), counted first: the draws and 64 write streams of the permutation's first level,
/// without its write combining.
fn scatter_pass(to: &mut [u32]) {
    to.par_chunks_mut(PIECE).enumerate().for_each(|(c, t)| {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(c as u64);
        let mut labels = [0u8; PIECE];
        let labels = &mut labels[..t.len()];
        for ten in labels.chunks_mut(10) {
            let mut word = rng.next_u64();
            for l in ten {
                *l = (word & 63) as u8;
                word >>= 6;
            }
        }
        let mut at = [0usize; 64];
        for &l in labels.iter() {
            at[usize::from(l)] += 1;
        }
        let mut start = 0;
        for a in &mut at {
            (*a, start) = (start, start + *a);
        }
        let first = (c * PIECE) as u32;
        for (i, &l) in labels.iter().enumerate() {
            let a = &mut at[usize::from(l)];
            t[*a] = first.wrapping_add(i as u32);
            *a += 1;
        }
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n = args.next().expect("N").parse::<f64>().expect("a number") as usize;
    let repeats: usize = args.next().map_or(5, |s| s.parse().expect("a count"));
    if args.next().as_deref() == Some("only") {
        let mut a = vec![0u32; n];
        write_pass(&mut a);
        let mut times = Vec::new();
        for _ in 0..repeats {
            let t = Instant::now();
            croupier_core::fill(&mut a, 0, 1);
            times.push(t.elapsed().as_secs_f64());
        }
        println!("permutation, reused buffer: {:.1} ms", median(times) * 1e3);
        return;
    }
    let bytes = (n * 4) as f64;
    let mut a = vec![0u32; n];
    let mut b = vec![0u32; n];
    // Touch both once, so no pass pays the first touch.
    write_pass(&mut a);
    write_pass(&mut b);
    let names = [
        "write pass",
        "read pass",
        "copy pass",
        "scatter pass",
        "permutation, reused buffer",
        "permutation, fresh buffer",
    ];
    // Bytes each moves: written, read, read and written, written.
    let moved = [bytes, bytes, 2.0 * bytes, bytes, f64::NAN, f64::NAN];
    let mut times = vec![Vec::new(); names.len()];
    let mut sink = 0u64;
    for _ in 0..repeats {
        let t = Instant::now();
        write_pass(&mut a);
        times[0].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        sink ^= read_pass(&a);
        times[1].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        copy_pass(&a, &mut b);
        times[2].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        scatter_pass(&mut b);
        times[3].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        croupier_core::fill(&mut a, 0, 1);
        times[4].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let p = croupier_core::permutation(n as u64, 0, 1).expect("permutation");
        times[5].push(t.elapsed().as_secs_f64());
        sink ^= p.len() as u64;
        drop(p);
    }
    let write = median(times[0].clone());
    println!(
        "N = {n} u32 ({:.0} MiB), {} threads, medians of {repeats} (check {sink})",
        bytes / (1 << 20) as f64,
        rayon::current_num_threads()
    );
    for ((name, t), m) in names.iter().zip(times).zip(moved) {
        let t = median(t);
        let rate = if m.is_nan() {
            String::new()
        } else {
            format!(", {:.1} GB/s", m / t / 1e9)
        };
        println!(
            "{name:28} {:8.1} ms{rate}, {:.2} write passes",
            t * 1e3,
            t / write
        );
    }
}

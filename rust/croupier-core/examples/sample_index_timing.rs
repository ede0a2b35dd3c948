//! Times megatron-core's sample index as croupier builds it, beside the gathers it is made of:
//! `cargo run --release --example sample_index_timing -- [N]` (default 1e9 documents of 1 to
//! 2,000 tokens in a shuffled order, samples of 4,096 tokens; 8 GB of input). Buffers are
//! advised onto huge pages, as numpy's are.
use croupier_core::{sample_index, try_with_capacity_huge, SampleIndexSpec};
use rayon::prelude::*;
use std::time::Instant;

/// A buffer of `n` values from `f`, on huge pages where the kernel gives them (as numpy's).
fn huge<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    let mut v = try_with_capacity_huge::<T>("a buffer", n as u64).expect("memory");
    v.spare_capacity_mut()
        .par_iter_mut()
        .enumerate()
        .for_each(|(i, slot)| {
            slot.write(f(i));
        });
    // SAFETY: every element was written above.
    unsafe { v.set_len(n) };
    v
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse::<f64>().expect("a number") as usize)
        .unwrap_or(1_000_000_000)
        .clamp(2, i32::MAX as usize);
    let sizes = huge(n, |i| 1 + (mix(i as u64) % 1999) as i32);
    let mut docs = huge(n, |i| i as i32);
    let mut state = 7u64;
    for i in (1..n).rev() {
        state = mix(state);
        docs.swap(i, ((state as u128 * (i as u128 + 1)) >> 64) as usize);
    }
    let tokens: i64 = sizes.par_iter().map(|&s| s as i64).sum();
    let spec = SampleIndexSpec {
        seq_length: 4096,
        num_epochs: 1,
        tokens_per_epoch: tokens,
        drop_last_partial_sequence: true,
        add_extra_token: 1,
    };
    let rows = 2 * (spec.num_samples().unwrap() as usize + 1);
    println!("{n} documents, {tokens} tokens, {rows} values of output");

    let t = Instant::now();
    let sum: i64 = docs.iter().map(|&d| sizes[d as usize] as i64).sum();
    let took = t.elapsed().as_secs_f64();
    println!(
        "one gather, one thread: {took:.2} s, {:.1} ns a document ({sum})",
        took * 1e9 / n as f64
    );
    let t = Instant::now();
    let sum: i64 = docs
        .par_chunks(1 << 20)
        .map(|c| c.iter().map(|&d| sizes[d as usize] as i64).sum::<i64>())
        .sum();
    let took = t.elapsed().as_secs_f64();
    println!(
        "one gather, all threads: {took:.2} s, {:.1} ns a document ({sum})",
        took * 1e9 / n as f64
    );

    for pass in 0..2 {
        let mut out = if pass == 0 {
            Vec::new()
        } else {
            huge(rows, |_| 0i64)
        };
        let t = Instant::now();
        if pass == 0 {
            out = huge(rows, |_| 0i64);
        }
        sample_index(&sizes, &docs, &spec, &mut out).unwrap();
        let took = t.elapsed().as_secs_f64();
        println!(
            "sample index ({}): {took:.2} s, {:.1} ns a document (last row {:?})",
            if pass == 0 {
                "fresh output"
            } else {
                "output already written"
            },
            took * 1e9 / n as f64,
            &out[rows - 2..]
        );
    }
}

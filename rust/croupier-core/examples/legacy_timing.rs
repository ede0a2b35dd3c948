//! Times numpy's legacy `RandomState.shuffle` as croupier reproduces it, and its draws alone:
//! `cargo run --release --example legacy_timing -- [N]` (default 1e9 `u32` elements, 4 GB).
use croupier_core::shuffle::{legacy_shuffle, Mt19937};
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse::<f64>().expect("a number") as usize)
        .unwrap_or(1_000_000_000)
        .clamp(2, u32::MAX as usize);
    let mut mt = Mt19937::from_genrand_seed(1);
    let t = Instant::now();
    let mut sum = 0u64;
    for s in 0..n - 1 {
        sum = sum.wrapping_add(mt.random_interval((n - 1 - s) as u64));
    }
    let took = t.elapsed().as_secs_f64();
    println!(
        "draws alone: {took:.2} s, {:.2} ns a draw (sum {sum})",
        took * 1e9 / n as f64
    );
    let mut mt = Mt19937::from_genrand_seed(1);
    let t = Instant::now();
    let mut block = vec![0u64; 8192];
    let mut sum = 0u64;
    let mut s = 0;
    while s < n - 1 {
        let len = 8192.min(n - 1 - s);
        mt.intervals_down((n - 1 - s) as u64, &mut block[..len]);
        sum = block[..len].iter().fold(sum, |a, &b| a.wrapping_add(b));
        s += len;
    }
    let took = t.elapsed().as_secs_f64();
    println!(
        "draws in blocks: {took:.2} s, {:.2} ns a draw (sum {sum})",
        took * 1e9 / n as f64
    );
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut mt = Mt19937::from_genrand_seed(1);
    let t = Instant::now();
    legacy_shuffle(&mut v, &mut mt);
    let took = t.elapsed().as_secs_f64();
    println!(
        "shuffle: {took:.2} s, {:.2} ns a swap (first: {})",
        took * 1e9 / n as f64,
        v[0]
    );
}

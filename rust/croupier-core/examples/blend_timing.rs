//! Times Megatron-Core's blend over 100 datasets (weights from a fixed LCG) into outputs already
//! written once, so no first touch of memory is timed:
//! `cargo run --release --example blend_timing -- [N]` (default 1e8; `RAYON_NUM_THREADS=1`
//! for one thread).
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse::<f64>().expect("a number") as usize)
        .unwrap_or(100_000_000)
        .max(1);
    let mut state = 7u64;
    let mut weights: Vec<f64> = (0..100)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect();
    let total: f64 = weights.iter().sum();
    weights.iter_mut().for_each(|w| *w /= total);
    let (mut out, mut samples) = (vec![1u16; n], vec![1i64; n]);
    let t0 = Instant::now();
    croupier_core::greatest_error_blend(&weights, &mut out, &mut samples).expect("a blend");
    let took = t0.elapsed().as_secs_f64();
    println!(
        "{n} positions: {took:.3} s, {:.2} ns a position (last: dataset {}, sample {})",
        took * 1e9 / n as f64,
        out[n - 1],
        samples[n - 1]
    );
}

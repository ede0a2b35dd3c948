//! Times one rank's share: `cargo run --release --example share_timing -- N W RANK [START STOP]`.
use croupier_core::{first_stop, rank_range, Draw, Layout, Order};
use std::time::Instant;

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse::<f64>().expect("numbers") as u64)
        .collect();
    let (n, w, r) = (a[0], a[1], a[2]);
    let layout = Layout::new(n, w, false).expect("layout");
    let ns = layout.num_samples();
    let (start, stop) = (
        a.get(3).copied().unwrap_or(0),
        a.get(4).copied().unwrap_or(ns),
    );
    let draw = Draw {
        order: Order::PerRank,
        ..Draw::default()
    }; // the per-rank order, seed 0, epoch 0
    let t = Instant::now();
    let first = first_stop(&layout, r, true, Order::PerRank, start).expect("first stop");
    let head = rank_range(&layout, r, draw, start..first).expect("head");
    let t_first = t.elapsed();
    let rest = rank_range(&layout, r, draw, first..stop).expect("rest");
    println!(
        "n={n} w={w} rank={r}: first block of {} in {:.1} ms, the rest ({}) after {:.1} ms",
        head.len(),
        t_first.as_secs_f64() * 1e3,
        rest.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
}

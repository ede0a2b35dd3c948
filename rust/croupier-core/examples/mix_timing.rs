//! `cargo run --release --example mix_timing -- N [global|per_rank] [reps]`: a rank's whole share
//! (rank 3 of 8) of the bench's mixture (100 near-equal datasets of N samples in all, weights
//! 1 to 100), the median of `reps` epochs in ms. `-- N perm [reps]`: the keyed permutation's
//! `fill_strided` of N consecutive positions (the global orders' random access), in ns a
//! position, the median of `reps` calls. With `POOL` set in the environment each call runs
//! inside a thread pool's `install`, as the Python bindings run it (its own allocations then
//! come from the pool's threads).
use croupier_core::{Deal, Mixture, MixtureConfig, Order, PhaseSpec};

thread_local! {
    static POOL: rayon::ThreadPool = rayon::ThreadPoolBuilder::new().build().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).map_or(1e6, |s| s.parse::<f64>().unwrap()) as u64;
    let order = match args.get(2).map_or("global", String::as_str) {
        "per_rank" => Order::PerRank,
        _ => Order::Global,
    };
    let reps: usize = args.get(3).map_or(50, |s| s.parse().unwrap());
    if args.get(2).map(String::as_str) == Some("perm") {
        let p = croupier_core::RandomAccessPermutation::new(n, 1, 2);
        let mut out = vec![0u64; n as usize];
        let mut times = Vec::new();
        for _ in 0..reps {
            let t = std::time::Instant::now();
            p.fill_strided(&mut out, 0, n, 0, 1);
            times.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "fill_strided of {n}: {:.2} ns a position (wall)",
            times[reps / 2]
        );
        return;
    }
    let sizes: Vec<u64> = (0..100).map(|i| n / 100 + u64::from(i < n % 100)).collect();
    let weights: Vec<f64> = (1..=100).map(f64::from).collect();
    let config = MixtureConfig {
        deal: Deal {
            num_replicas: 8,
            rank: 3,
            drop_last: true,
        },
        order,
        ..MixtureConfig::default()
    };
    // Phases count global positions in the global order, the rank's in the per-rank one.
    let length = match order {
        Order::Global => n,
        _ => croupier_core::mix::pass_shares(&sizes, 8, true)
            .unwrap()
            .iter()
            .sum(),
    };
    let phase = PhaseSpec {
        start: 0,
        length,
        weights,
        temperature: 1.0,
    };
    let mut times = Vec::new();
    for epoch in 0..reps as u64 {
        let m = Mixture::new(&sizes, std::slice::from_ref(&phase), &config).unwrap();
        let t = std::time::Instant::now();
        let out = if std::env::var("POOL").is_ok() {
            POOL.with(|p| p.install(|| m.range(epoch, 0, m.len()).unwrap()))
        } else {
            m.range(epoch, 0, m.len()).unwrap()
        };
        times.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(out);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{:?} N={n}: median {:.2} ms (fastest {:.2})",
        order,
        times[reps / 2],
        times[0]
    );
}

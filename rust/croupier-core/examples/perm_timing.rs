//! Times a full permutation: `cargo run --release --example perm_timing -- N`.
use std::time::Instant;

fn main() {
    let n = std::env::args()
        .nth(1)
        .expect("N")
        .parse::<f64>()
        .expect("a number") as u64;
    let t = Instant::now();
    let p = croupier_core::permutation(n, 0, 0).expect("permutation");
    println!(
        "n={n}: fresh buffer {:.3} s ({} indices)",
        t.elapsed().as_secs_f64(),
        p.len()
    );
    let mut buf = vec![0u32; n as usize];
    let t = Instant::now();
    croupier_core::fill(&mut buf, 0, 1);
    println!("n={n}: reused buffer {:.3} s", t.elapsed().as_secs_f64());
}

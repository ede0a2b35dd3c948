use std::time::Instant;
fn main() {
    let n: usize = 100_000_000;
    for &b in &[64usize, 512, 4096, 8192] {
        let mut out = vec![0u32; n];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let labels: Vec<u16> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x as u16) & (b as u16 - 1)
            })
            .collect();
        let mut counts = vec![0usize; b];
        for &l in &labels {
            counts[l as usize] += 1;
        }
        let mut slot = vec![0usize; b];
        let mut at = 0;
        for k in 0..b {
            slot[k] = at;
            at += counts[k];
        }
        let t = Instant::now();
        for (v, &l) in labels.iter().enumerate() {
            let k = l as usize;
            unsafe {
                *out.get_unchecked_mut(*slot.get_unchecked(k)) = v as u32;
            }
            unsafe {
                *slot.get_unchecked_mut(k) += 1;
            }
        }
        println!(
            "b={b}: scatter {:.2} ns/elem {}",
            t.elapsed().as_secs_f64() * 1e9 / n as f64,
            out[12345]
        );
    }
}

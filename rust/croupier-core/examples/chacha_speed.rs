use croupier_core::{Purpose, Stream};
use std::time::Instant;
fn main() {
    let mut s = Stream::new(0, 0, Purpose::Permutation, 0);
    let mut buf = vec![0u8; 2048];
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..100_000 {
        s.fill_bytes(&mut buf);
        acc = acc.wrapping_add(buf[7] as u64);
    }
    println!("fill_bytes 204.8 MB: {:?} {acc}", t.elapsed());
    let t = Instant::now();
    for _ in 0..25_600_000 {
        acc = acc.wrapping_add(s.next_u64());
    }
    println!("next_u64 204.8 MB: {:?} {acc}", t.elapsed());
    let mut v = vec![0u32; 100_000_000];
    let t = Instant::now();
    for (i, x) in v.iter_mut().enumerate() {
        *x = i as u32;
    }
    println!("seq write 400MB: {:?} {}", t.elapsed(), v[12345]);
}

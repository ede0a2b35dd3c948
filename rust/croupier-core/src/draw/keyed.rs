//! Keyed bulk generators: xoshiro256++ seeded from a keyed ChaCha8 stream.
//!
//! ChaCha8 (the `stream` module) names every generator by `(seed, epoch, purpose, id)` and is
//! the same on every platform; xoshiro256++ is several times faster for the millions of draws
//! of a bucket shuffle. Seeding one from the other keeps the naming and gains the speed.

use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::stream::{Purpose, Stream};

/// xoshiro256++ seeded with the first 32 bytes of the ChaCha8 stream `(seed, epoch, purpose,
/// id)`: fast bulk draws from a keyed, platform-independent stream (module documentation).
pub(crate) fn keyed_xoshiro(
    seed: u64,
    epoch: u64,
    purpose: Purpose,
    id: u64,
) -> Xoshiro256PlusPlus {
    let mut state = [0u8; 32];
    Stream::new(seed, epoch, purpose, id).fill_bytes(&mut state);
    Xoshiro256PlusPlus::from_seed(state)
}

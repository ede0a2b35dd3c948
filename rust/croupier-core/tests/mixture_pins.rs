//! Value-stability pins of the mixture's global order (`order="global"`), the same values
//! `tests/test_mixture_global.py` pins through Python: a change of these is a change of order,
//! a breaking change. (An integration test: the library is built as users get it, with the
//! global interleave's real leaf size, which its unit tests shrink.)

use croupier_core::{Deal, Indices, Interleaving, Mixture, MixtureConfig, PhaseSpec};

fn first(
    interleave: Interleaving,
    sizes: &[u64],
    weights: &[f64],
    deal: Deal,
    seed: u64,
) -> Vec<u64> {
    let config = MixtureConfig {
        deal,
        seed,
        interleave,
        ..MixtureConfig::default()
    };
    let phase = PhaseSpec {
        start: 0,
        length: sizes.iter().sum(),
        weights: weights.to_vec(),
        temperature: 1.0,
    };
    let m = Mixture::new(sizes, &[phase], &config).unwrap();
    match m.range(0, 0, m.len()).unwrap() {
        Indices::U32(v) => v.into_iter().map(u64::from).collect(),
        Indices::U64(v) => v,
    }
}

#[test]
fn the_global_orders_first_indices_are_pinned() {
    let deal = Deal {
        num_replicas: 2,
        rank: 1,
        drop_last: true,
    };
    let (sizes, weights) = ([1000, 2000, 500], [1.0, 2.0, 0.5]);
    let uniform = first(Interleaving::Uniform, &sizes, &weights, deal, 7);
    assert_eq!(uniform[..8], [18, 2783, 1624, 2649, 1987, 1900, 2278, 3470]);
    let balanced = first(Interleaving::Balanced, &sizes, &weights, deal, 7);
    assert_eq!(balanced[..8], [404, 2058, 1402, 1534, 1588, 546, 3127, 736]);
    let deal = Deal {
        num_replicas: 4,
        rank: 3,
        drop_last: true,
    };
    let big = first(
        Interleaving::Uniform,
        &[1_000_000, 2_000_000],
        &[1.0, 1.0],
        deal,
        2,
    );
    assert_eq!(
        big[400_000..400_006],
        [334033, 948978, 678445, 449857, 741361, 738036]
    );
}

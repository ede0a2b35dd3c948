//! A `rank_range` call that `rank_range_is_inline` calls inline touches no thread pool: after
//! every such call, rayon's global pool is still unbuilt. (This file holds one test, so its
//! process has run nothing else; a call that reached rayon would have built the global pool.)

use croupier_core::{rank_range, rank_range_is_inline, Draw, Layout, Order};

#[test]
fn inline_calls_leave_rayons_global_pool_unbuilt() {
    let mut calls = 0;
    for n in [1u64, 10, 1000, 1 << 20, 1_000_000_007, (1 << 32) + 5] {
        for w in [1u64, 3, 8] {
            for drop_last in [false, true] {
                let Ok(layout) = Layout::new(n, w, drop_last) else {
                    continue;
                };
                let share = layout.num_samples();
                for order in [Order::Global, Order::PerRank] {
                    for shuffle in [true, false] {
                        let draw = Draw {
                            shuffle,
                            order,
                            seed: 5,
                            epoch: 2,
                        };
                        for (start, len) in [(0, 1), (0, 1024), (7, 1 << 14), (share / 2, 1 << 14)]
                        {
                            let range = start.min(share)..(start + len).min(share);
                            if !rank_range_is_inline(draw, range.clone()) {
                                continue;
                            }
                            rank_range(&layout, w - 1, draw, range).expect("a rank's range");
                            calls += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(calls > 100, "only {calls} inline calls made");
    assert!(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .is_ok(),
        "an inline rank_range call built rayon's global pool"
    );
}

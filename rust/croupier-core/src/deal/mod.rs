//! Dealing: how an epoch's indices reach data-parallel ranks.
//!
//! Words used throughout: a rank's *share* is the sequence of indices it receives in an
//! epoch; *dealing* is torch's arithmetic that gives it positions `r, r + W, …` of the global
//! order; a *partition* is only ever the uniform random split of `[0, n)` into classes (sets of
//! given sizes) that the per-rank order (`order="per_rank"`, [`Order::PerRank`]) draws instead of a
//! whole permutation.
//!
//! - `rank`: the entry points ([`rank_range`], [`first_stop`], [`rank_range_bytes`]) that give
//!   a rank's positions in any [`Order`]: without shuffling, in torch's order, in the global
//!   order or in the per-rank order, as a [`Draw`] says.
//! - `elastic`: an epoch continued on a different number of ranks ([`Elastic`]): the rest of
//!   the epoch's global order dealt to the new ranks.
//! - `layout`: torch's `DistributedSampler` arithmetic ([`Layout`]: padding by repeating the
//!   head, `drop_last`, rank `r` taking positions `r, r + W, …`), a rank's place in its world
//!   ([`Deal`], which the mixtures, buckets and chunk plans take too), and a rank's share taken
//!   from a whole global order.
//! - `fast_share`: one rank's share in `order="per_rank"`, computed without the other ranks':
//!   its values from `class_split`, cut into blocks, each block in its own uniform order.
//! - `class_split`: the values of chosen classes of a uniform random partition of `[0, n)`,
//!   drawn by recursive hypergeometric splitting without computing the other classes.
//! - `micro_batches`: one rank's micro-batches of consecutive samples, as Megatron-LM's
//!   sequential pretraining sampler deals them ([`micro_batches()`]).
//! - `seekable`: the order of a share's long blocks, a bucket shuffle with fixed bucket sizes
//!   whose positions can be read one by one (a mid-epoch resume reads only what it needs).
//!
//! The random draws these build on (exact hypergeometric draws, keyed per-cell generators, the
//! keyed permutation) are in the crate-private `draw` folder.

pub(crate) mod class_split;
pub(crate) mod elastic;
pub(crate) mod fast_share;
pub(crate) mod layout;
pub(crate) mod micro_batches;
pub(crate) mod rank;
pub(crate) mod seekable;

pub use elastic::{Elastic, ELASTIC_FIRST_STOP};
pub use layout::{check_num_replicas, check_world, Deal, Layout};
pub use micro_batches::micro_batches;
pub use rank::{first_stop, rank_range, rank_range_bytes, rank_range_is_inline, Draw, Order};

//! Dealing: how an epoch's indices reach data-parallel ranks.
//!
//! - `layout`: torch's `DistributedSampler` arithmetic (padding by repeating the head,
//!   `drop_last`, rank `r` taking positions `r, r + W, …`) and the entry points that give a
//!   rank's positions in either order ([`Order`]).
//! - `class_split`: the values of chosen classes of a uniform random partition of `[0, n)`,
//!   drawn by recursive hypergeometric splitting without computing the other classes.
//! - `hypergeom`: exact hypergeometric draws, bit-identical on every platform (no libm).
//! - `share`: one rank's share in `order="fast"`: its values from `class_split`, cut into
//!   blocks, each block in its own uniform order.
//! - `seekable`: the order of a share's long blocks, a bucket shuffle with fixed bucket sizes
//!   whose positions can be read one by one (a mid-epoch resume reads only what it needs).

pub(crate) mod class_split;
pub(crate) mod hypergeom;
pub(crate) mod layout;
pub(crate) mod seekable;
pub(crate) mod share;

pub use layout::{first_stop, rank_indices, rank_range, rank_range_bytes, Layout, Order};

//! One file per operation family, each run on the core that owns the stream it serves.
//! A handler checks, then changes the shard with no `.await` in between, so its checks are
//! atomic with respect to every other request for the stream.
//!
//! The declaration order is the layering: a handler uses only those declared before it.

pub mod headers;

pub mod buckets;

pub mod fork;

pub mod create;

pub mod append;

pub mod batch;

pub mod head;

pub mod delete;

pub mod read_params;

pub mod catch_up;

pub mod long_poll;

pub mod record_read;

pub mod read;

pub mod attrs;

pub mod producers;

pub mod snapshots;

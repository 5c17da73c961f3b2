//! `ursula-indexer`: an event-time secondary index over Durable Streams.
//!
//! It tails registered JSON/NDJSON streams with long-poll reads, extracts an event time
//! from each message with JSON pointers, keeps the newest entries queryable in memory,
//! and commits them as sorted Parquet parts to an object store (a local directory or S3)
//! under a manifest advanced by ETag compare-and-swap. Queries merge the parts and the
//! in-memory tail and return locators (offset + len, and record ordinals when the source
//! has them) that callers resolve through the stream server.

pub mod batch;
pub mod cache;
pub mod compact;
pub mod config;
pub mod coordinator;
pub mod error;
pub mod extract;
pub mod http;
pub mod index;
pub mod manifest;
pub mod metrics;
pub mod part;
pub mod source;
// The object-store wrapper lives in its own crate, shared with the server's cold tier.
pub use ursula_s3 as store;
pub mod time;

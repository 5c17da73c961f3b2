//! Pure wire rules of the Durable Streams protocol as served by Ursula.
//!
//! Everything here is synchronous and allocation-conscious; nothing performs I/O
//! (apart from reading the wall clock in [`time`]). Section references (`P§n`) point
//! at `protocol.md`.

// One audited exception: the prefetch hint in `json` (see its SAFETY comment).
#![deny(unsafe_code)]

pub mod batch;
pub mod content_type;
pub mod cursor;
pub mod etag;
pub mod headers;
pub mod http1;
pub mod json;
pub mod offset;
pub mod query;
pub mod records;
pub mod sse;
pub mod time;

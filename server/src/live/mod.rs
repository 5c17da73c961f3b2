//! Live reads that outlast one response: SSE sessions and the feeds that bring a stream's
//! new data to the cores their sessions run on.

pub mod feed;

pub mod sse;

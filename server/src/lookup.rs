//! What a storage key refers to right now. A lookup only reads: an expired stream is
//! reported as [`Found::Expired`] and removed by `removal::remove_expired`, never here.

use std::rc::Rc;

use ursula_storage::{Lifetime, StreamId};

use crate::core::{Core, NotServed};
use crate::ext::Ext;
use crate::http::ApiError;

/// What a key currently refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Absent,
    /// Past its TTL or expiry time (P§15): gone for every reader, but still in the shard
    /// until it is removed.
    Expired(StreamId),
    /// Deleted by a client but kept because forks still reference it.
    SoftDeleted,
    Live(StreamId),
}

/// What `key` refers to, or that this core does not run its shard now.
pub fn find(core: &Rc<Core>, key: &str) -> Result<Found, NotServed> {
    // The shard that looked the key up handed out its id, so it holds the stream.
    let shard = core.shard_for(key)?;
    let Some(id) = shard.lookup(key) else {
        return Ok(Found::Absent);
    };
    let Some(s) = shard.stream(id) else {
        return Ok(Found::Absent);
    };
    let expired = match s.lifetime() {
        Lifetime::Forever => false,
        // A window too large for the clock never closes (creates refuse those; this only
        // keeps a stream written before they did from expiring at once).
        Lifetime::TtlSeconds(t) => ttl_deadline_ms(s.last_access_ms(), t)
            .is_some_and(|deadline| ursula_storage::now_ms() >= deadline),
        Lifetime::ExpiresAtMs(at) => ursula_storage::now_ms() >= at,
    };
    if expired {
        return Ok(Found::Expired(id));
    }
    if Ext::is_soft_deleted(s.ext()) {
        return Ok(Found::SoftDeleted);
    }
    Ok(Found::Live(id))
}

/// When a sliding window of `ttl_seconds` that started at `from_ms` closes, or `None` when
/// that instant is past what a millisecond clock can hold.
pub fn ttl_deadline_ms(from_ms: i64, ttl_seconds: u64) -> Option<i64> {
    Lifetime::TtlSeconds(ttl_seconds).deadline_ms(from_ms)
}

/// The live stream `key` names, or the refusal a request for it gets.
pub fn live(core: &Rc<Core>, key: &str) -> Result<StreamId, ApiError> {
    match find(core, key)? {
        Found::Live(id) => Ok(id),
        Found::SoftDeleted => Err(ApiError::StreamGone),
        Found::Absent | Found::Expired(_) => Err(ApiError::StreamNotFound),
    }
}

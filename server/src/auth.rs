//! Bearer-token authentication of a request head against the configured [`Tokens`]. It
//! needs only the method, the path and the headers, so a request is decided before any of
//! its body is read.
//!
//! A token limited to some buckets (`buckets=` in the token file) is answered `404` for
//! everything outside them, as if it did not exist: a `403` would tell the token's holder
//! which other buckets there are. The same holds for the compat surface (outside every
//! bucket) and the metrics on the main listener (which name buckets). The bucket listing
//! is allowed, and shows only the token's buckets (see `handlers::buckets`).

use std::sync::Arc;

use ursula_protocol::http1::{Headers, Method};

use crate::http::ApiError;
use crate::routes::{route, Route};
use crate::surface::{bucket_of, Surface};
use crate::tokens::{BucketScope, Scope, Tokens};

/// The buckets the request's token is limited to (`Ok(None)`: not limited), or why the
/// request is refused. CORS preflights are never authenticated: browsers send them
/// without credentials.
pub fn check(
    tokens: &Tokens,
    method: &Method,
    path: &str,
    headers: &Headers,
) -> Result<Option<Arc<BucketScope>>, ApiError> {
    let needed = match method {
        Method::Options => return Ok(None),
        Method::Get | Method::Head => Scope::Read,
        _ => Scope::Write,
    };
    let presented = headers.get("authorization").and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    let grant = presented
        .and_then(|t| tokens.grant(t))
        .ok_or(ApiError::Unauthorized)?;
    if let Some(scope) = &grant.buckets {
        outside(scope, path)?;
    }
    match (grant.access, needed) {
        (Scope::Read, Scope::Write) => Err(ApiError::Forbidden),
        _ => Ok(grant.buckets.clone()),
    }
}

/// The `404` of a path outside `scope`. Paths that name nothing are let through: they are
/// answered `404` or `400` as for any token.
fn outside(scope: &BucketScope, path: &str) -> Result<(), ApiError> {
    let bucket = match route(path) {
        Route::Buckets
        | Route::StreamResource
        | Route::NotFound
        | Route::Invalid(_)
        | Route::InvalidBucket => return Ok(()),
        Route::Stream {
            surface: Surface::Compat,
            ..
        } => return Err(ApiError::StreamNotFound),
        Route::Bucket(b) | Route::BucketStreams(b) => b,
        Route::Stream { key, .. }
        | Route::AppendBatch(key)
        | Route::Attrs(key)
        | Route::Producers(key)
        | Route::Resource { key, .. } => match bucket_of(&key) {
            Some(b) => b.to_string(),
            None => return Err(ApiError::StreamNotFound),
        },
    };
    if scope.allows(&bucket) {
        Ok(())
    } else {
        Err(ApiError::BucketNotFound)
    }
}

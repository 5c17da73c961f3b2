//! Bearer-token authentication of a request head against the configured [`Tokens`]. It
//! needs only the method and the headers, so a request is decided before any of its body
//! is read.

use ursula_protocol::http1::{Headers, Method};

use crate::http::ApiError;
use crate::tokens::{Scope, Tokens};

/// `Some(refusal)` when the request must be refused. CORS preflights are never
/// authenticated: browsers send them without credentials.
pub fn check(tokens: &Tokens, method: &Method, headers: &Headers) -> Option<ApiError> {
    let needed = match method {
        Method::Options => return None,
        Method::Get | Method::Head => Scope::Read,
        _ => Scope::Write,
    };
    let presented = headers.get("authorization").and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    match presented.and_then(|t| tokens.scope(t)) {
        Some(Scope::Write) => None,
        Some(Scope::Read) if needed == Scope::Read => None,
        Some(Scope::Read) => Some(ApiError::Forbidden),
        None => Some(ApiError::Unauthorized),
    }
}

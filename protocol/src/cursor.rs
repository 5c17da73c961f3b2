//! `Stream-Cursor` (P§16.3): a cache-busting counter clients echo as `?cursor=`.

/// 2024-10-09T00:00:00Z in Unix milliseconds.
pub const DEFAULT_EPOCH_MS: i64 = 1_728_432_000_000;
pub const DEFAULT_INTERVAL_S: u64 = 20;

/// Cursor for a response with the default epoch and interval.
///
/// `rand_seconds_1_to_3600` is caller-supplied randomness (clamped into [1, 3600]) so
/// this stays deterministic and testable.
pub fn next_cursor(now_ms: i64, client_cursor: Option<&str>, rand_seconds_1_to_3600: u64) -> u64 {
    next_cursor_with(
        now_ms,
        DEFAULT_EPOCH_MS,
        DEFAULT_INTERVAL_S,
        client_cursor,
        rand_seconds_1_to_3600,
    )
}

/// [`next_cursor`] with a configured epoch and interval (interval 0 is treated as 1 s).
pub fn next_cursor_with(
    now_ms: i64,
    epoch_ms: i64,
    interval_s: u64,
    client_cursor: Option<&str>,
    rand_seconds_1_to_3600: u64,
) -> u64 {
    let interval_ms = interval_s.max(1).saturating_mul(1000);
    let elapsed = u64::try_from(now_ms.saturating_sub(epoch_ms)).unwrap_or(0);
    let current = elapsed / interval_ms;
    match client_cursor.and_then(parse_cursor) {
        Some(c) if c >= current => {
            // A client at or ahead of the clock must still see a strictly larger
            // value, otherwise a CDN could serve it the response it already has.
            let r = rand_seconds_1_to_3600.clamp(1, 3600);
            let jump = r.div_ceil(interval_s.max(1)).max(1);
            c.saturating_add(jump)
        }
        _ => current,
    }
}

/// A client cursor is honoured only if it is plain decimal digits fitting `u64`;
/// anything else is treated as absent.
pub fn parse_cursor(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = DEFAULT_EPOCH_MS + 1_000_000 * 1000; // 1e6 s after the epoch

    #[test]
    fn epoch_constant_matches_calendar() {
        assert_eq!(
            crate::headers::parse_expires_at("2024-10-09T00:00:00Z"),
            Ok(DEFAULT_EPOCH_MS)
        );
    }

    #[test]
    fn interval_number_without_client_cursor() {
        assert_eq!(next_cursor(T, None, 1), 50_000);
        assert_eq!(next_cursor(T + 19_999, None, 1), 50_000);
        assert_eq!(next_cursor(T + 20_000, None, 1), 50_001);
        assert_eq!(next_cursor(DEFAULT_EPOCH_MS, None, 1), 0);
        assert_eq!(next_cursor(0, None, 1), 0, "clock before epoch");
    }

    #[test]
    fn stale_client_cursor_gets_current_interval() {
        assert_eq!(next_cursor(T, Some("49999"), 3600), 50_000);
        assert_eq!(next_cursor(T, Some("0"), 3600), 50_000);
    }

    #[test]
    fn client_at_or_ahead_gets_strictly_larger() {
        assert_eq!(next_cursor(T, Some("50000"), 1), 50_001);
        assert_eq!(next_cursor(T, Some("50000"), 20), 50_001);
        assert_eq!(next_cursor(T, Some("50000"), 21), 50_002);
        assert_eq!(next_cursor(T, Some("50000"), 3600), 50_180);
        assert_eq!(next_cursor(T, Some("60000"), 0), 60_001, "r clamped to 1");
        assert_eq!(next_cursor(T, Some("60000"), 99_999), 60_180, "r clamped");
        for r in 1..=3600 {
            let c = next_cursor(T, Some("50000"), r);
            assert!(c > 50_000 && c <= 50_180);
        }
        // Echoing the response cursor always moves forward.
        let mut c = next_cursor(T, None, 7);
        for r in [1, 500, 3600, 20] {
            let n = next_cursor(T, Some(&c.to_string()), r);
            assert!(n > c);
            c = n;
        }
    }

    #[test]
    fn invalid_client_cursor_ignored() {
        for bad in ["", "abc", "-5", "1.5", " 50000", "99999999999999999999999"] {
            assert_eq!(next_cursor(T, Some(bad), 3600), 50_000, "{bad:?}");
        }
        assert_eq!(next_cursor(T, Some(&u64::MAX.to_string()), 10), u64::MAX);
    }

    #[test]
    fn custom_interval_and_epoch() {
        assert_eq!(next_cursor_with(10_000, 0, 5, None, 1), 2);
        assert_eq!(next_cursor_with(10_000, 0, 5, Some("2"), 12), 5);
        assert_eq!(next_cursor_with(10_000, 0, 0, None, 1), 10);
    }
}

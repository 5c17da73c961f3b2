//! Request header value grammars (P§4.4). Every parser trims surrounding whitespace
//! itself, so callers can pass raw header values.

use crate::time::{civil_from_days, days_from_civil, days_in_month};

/// Largest integer a JavaScript client can represent exactly (2^53 − 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// Longest accepted `Producer-Id`, in bytes.
pub const MAX_PRODUCER_ID_LEN: usize = 256;
/// Longest accepted `Stream-Seq`, in bytes.
pub const MAX_STREAM_SEQ_LEN: usize = 1024;

/// Why an integer header value (`Stream-TTL`, `Stream-Fork-Sub-Offset`, `Producer-Epoch`,
/// `Producer-Seq`) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntError {
    /// Empty, or not only ASCII digits (a sign, a fraction, an exponent, a space).
    NotDigits,
    /// A leading zero where each value has one spelling only.
    LeadingZero,
    /// Larger than the header allows (`u64`, or 2^53 − 1 for producer values).
    TooLarge,
}

impl IntError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            IntError::NotDigits => "not a decimal integer",
            IntError::LeadingZero => "has a leading zero",
            IntError::TooLarge => "is too large",
        }
    }
}

impl std::fmt::Display for IntError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for IntError {}

/// `Stream-TTL`: `0` or `[1-9][0-9]*`, fitting `u64` (seconds).
pub fn parse_ttl(v: &str) -> Result<u64, IntError> {
    parse_canonical_uint(v.trim())
}

/// `Stream-Fork-Sub-Offset`: same grammar as the TTL (`05`, `+1`, `-1`, `1.5` rejected).
pub fn parse_fork_sub_offset(v: &str) -> Result<u64, IntError> {
    parse_canonical_uint(v.trim())
}

/// `0` or a decimal without leading zeros; one spelling per value so that
/// idempotent-create comparisons never depend on formatting.
fn parse_canonical_uint(s: &str) -> Result<u64, IntError> {
    let n = parse_ascii_digits(s.as_bytes())?;
    if s.len() > 1 && s.starts_with('0') {
        return Err(IntError::LeadingZero);
    }
    Ok(n)
}

fn parse_ascii_digits(b: &[u8]) -> Result<u64, IntError> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return Err(IntError::NotDigits);
    }
    b.iter()
        .try_fold(0u64, |v, &c| {
            v.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        })
        .ok_or(IntError::TooLarge)
}

/// `Producer-Epoch` / `Producer-Seq`: `[0-9]+` with value ≤ 2^53 − 1.
pub fn parse_producer_int(v: &str) -> Result<u64, IntError> {
    match parse_ascii_digits(v.trim().as_bytes())? {
        n if n <= MAX_SAFE_INTEGER => Ok(n),
        _ => Err(IntError::TooLarge),
    }
}

/// `Stream-Closed`: only `true` (any ASCII case) counts; every other value, including
/// empty, is treated as if the header were absent and is never an error.
pub fn is_closed_true(v: Option<&str>) -> bool {
    v.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// A `Stream-Seq` longer than [`MAX_STREAM_SEQ_LEN`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSeqTooLong;

impl std::fmt::Display for StreamSeqTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream-Seq is longer than 1024 bytes")
    }
}

impl std::error::Error for StreamSeqTooLong {}

/// `Stream-Seq`: empty (after trimming) means absent; longer than 1024 bytes is a 400.
pub fn parse_stream_seq(v: Option<&str>) -> Result<Option<&str>, StreamSeqTooLong> {
    match v.map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) if s.len() > MAX_STREAM_SEQ_LEN => Err(StreamSeqTooLong),
        Some(s) => Ok(Some(s)),
    }
}

/// A content coding a request body may arrive in (RFC 9110 §8.4.1), other than `identity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// RFC 1952; `x-gzip` is the same coding (RFC 9110 §8.4.1.3).
    Gzip,
    /// RFC 1950 zlib data. Some clients send raw RFC 1951 deflate under this name; the
    /// decoder tells the two apart by the zlib header.
    Deflate,
    /// RFC 8878.
    Zstd,
}

impl ContentCoding {
    /// The coding's name as `Content-Encoding` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ContentCoding::Gzip => "gzip",
            ContentCoding::Deflate => "deflate",
            ContentCoding::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for ContentCoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a `Content-Encoding` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodingError {
    /// A coding this server does not decode (`br`, `compress`, a typo).
    Unknown,
    /// More than one coding applied in a row (`gzip, zstd`): one is all a client needs.
    Stacked,
}

impl CodingError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            CodingError::Unknown => "unknown content coding",
            CodingError::Stacked => "more than one content coding",
        }
    }
}

impl std::fmt::Display for CodingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for CodingError {}

/// The coding of a request body from every `Content-Encoding` value it carries (the
/// header may repeat; each value is a comma-separated list, RFC 9110 §8.4). `identity` and
/// empty list elements mean no coding; names are case-insensitive. `Ok(None)`: the body is
/// not encoded.
pub fn parse_content_encoding<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Result<Option<ContentCoding>, CodingError> {
    let mut coding = None;
    for name in values.into_iter().flat_map(|v| v.split(',')).map(str::trim) {
        let this = if name.is_empty() || name.eq_ignore_ascii_case("identity") {
            continue;
        } else if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            ContentCoding::Gzip
        } else if name.eq_ignore_ascii_case("deflate") {
            ContentCoding::Deflate
        } else if name.eq_ignore_ascii_case("zstd") {
            ContentCoding::Zstd
        } else {
            return Err(CodingError::Unknown);
        };
        if coding.replace(this).is_some() {
            return Err(CodingError::Stacked);
        }
    }
    Ok(coding)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerHeaders {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// The producer trio (P§7): all three or none. A partial trio is a 400 even when the
/// present values are individually valid, so clients cannot half-enable idempotency.
pub fn parse_producer(
    id: Option<&str>,
    epoch: Option<&str>,
    seq: Option<&str>,
) -> Result<Option<ProducerHeaders>, &'static str> {
    let (id, epoch, seq) = match (id, epoch, seq) {
        (None, None, None) => return Ok(None),
        (Some(i), Some(e), Some(s)) => (i, e, s),
        _ => return Err("Producer-Id, Producer-Epoch and Producer-Seq must be sent together"),
    };
    let id = id.trim();
    if id.is_empty() {
        return Err("Producer-Id must not be empty");
    }
    if id.len() > MAX_PRODUCER_ID_LEN {
        return Err("Producer-Id is longer than 256 bytes");
    }
    let epoch = parse_producer_int(epoch)
        .map_err(|_| "Producer-Epoch must be an integer between 0 and 2^53-1")?;
    let seq = parse_producer_int(seq)
        .map_err(|_| "Producer-Seq must be an integer between 0 and 2^53-1")?;
    Ok(Some(ProducerHeaders {
        id: id.to_owned(),
        epoch,
        seq,
    }))
}

/// Why a `Stream-Expires-At` value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateTimeError {
    /// Not shaped like an RFC 3339 date-time (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`).
    Syntax,
    /// Shaped right, but a month, day, hour, minute, second or offset that does not exist.
    OutOfRange,
}

impl DateTimeError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            DateTimeError::Syntax => "not an RFC 3339 date-time",
            DateTimeError::OutOfRange => "a date or time field is out of range",
        }
    }
}

impl std::fmt::Display for DateTimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for DateTimeError {}

/// `Stream-Expires-At`: an RFC 3339 date-time with `Z` or a numeric offset and an
/// optional fraction, converted to Unix milliseconds (fraction truncated to ms).
pub fn parse_expires_at(v: &str) -> Result<i64, DateTimeError> {
    let b = v.trim().as_bytes();
    // Fixed part: YYYY-MM-DDTHH:MM:SS
    if b.len() < 20 {
        return Err(DateTimeError::Syntax);
    }
    let num = |r: std::ops::Range<usize>| -> Result<u32, DateTimeError> {
        let mut n = 0u32;
        for &c in &b[r] {
            if !c.is_ascii_digit() {
                return Err(DateTimeError::Syntax);
            }
            n = n * 10 + u32::from(c - b'0');
        }
        Ok(n)
    };
    let year = i64::from(num(0..4)?);
    let month = num(5..7)?;
    let day = num(8..10)?;
    let hour = num(11..13)?;
    let minute = num(14..16)?;
    let second = num(17..19)?;
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' {
        return Err(DateTimeError::Syntax);
    }
    if b[16] != b':' {
        return Err(DateTimeError::Syntax);
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err(DateTimeError::OutOfRange);
    }
    // 60 admits a leap second; it simply lands on the next minute's first second.
    if hour > 23 || minute > 59 || second > 60 {
        return Err(DateTimeError::OutOfRange);
    }

    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let n = i - start;
        if n == 0 {
            return Err(DateTimeError::Syntax);
        }
        for _ in n..3 {
            millis *= 10;
        }
    }

    let offset_minutes: i64 = match b.get(i..) {
        Some([b'Z' | b'z']) => 0,
        Some([sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]) => {
            let d = |c: &u8| -> Result<i64, DateTimeError> {
                if c.is_ascii_digit() {
                    Ok(i64::from(c - b'0'))
                } else {
                    Err(DateTimeError::Syntax)
                }
            };
            let oh = d(h1)? * 10 + d(h2)?;
            let om = d(m1)? * 10 + d(m2)?;
            if oh > 23 || om > 59 {
                return Err(DateTimeError::OutOfRange);
            }
            let total = oh * 60 + om;
            if *sign == b'-' {
                -total
            } else {
                total
            }
        }
        _ => return Err(DateTimeError::Syntax),
    };

    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second)
        - offset_minutes * 60;
    Ok(secs * 1000 + millis)
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn format_rfc3339_millis(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_encoding_names_one_coding_at_most() {
        let parse = |v: &[&str]| parse_content_encoding(v.iter().copied());
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["identity"]), Ok(None));
        assert_eq!(parse(&[" Identity , "]), Ok(None));
        assert_eq!(parse(&["gzip"]), Ok(Some(ContentCoding::Gzip)));
        assert_eq!(parse(&["X-GZIP"]), Ok(Some(ContentCoding::Gzip)));
        assert_eq!(parse(&["Deflate"]), Ok(Some(ContentCoding::Deflate)));
        assert_eq!(parse(&[" zstd "]), Ok(Some(ContentCoding::Zstd)));
        assert_eq!(
            parse(&["identity, gzip", "identity"]),
            Ok(Some(ContentCoding::Gzip))
        );
        assert_eq!(parse(&["br"]), Err(CodingError::Unknown));
        assert_eq!(parse(&["gzip;q=1"]), Err(CodingError::Unknown));
        assert_eq!(parse(&["gzip, zstd"]), Err(CodingError::Stacked));
        assert_eq!(parse(&["gzip", "gzip"]), Err(CodingError::Stacked));
        assert_eq!(ContentCoding::Zstd.to_string(), "zstd");
    }

    #[test]
    fn ttl_accepts_canonical_integers() {
        assert_eq!(parse_ttl("0"), Ok(0));
        assert_eq!(parse_ttl("60"), Ok(60));
        assert_eq!(parse_ttl(" 3600 "), Ok(3600));
        assert_eq!(parse_ttl("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn ttl_rejects_noncanonical() {
        for bad in [
            "+60",
            "00060",
            "00",
            "01",
            "60.5",
            "1e3",
            "-1",
            "abc",
            "",
            "   ",
            "6 0",
            "0x3c",
            "18446744073709551616",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fork_sub_offset_grammar() {
        assert_eq!(parse_fork_sub_offset("0"), Ok(0));
        assert_eq!(parse_fork_sub_offset("3"), Ok(3));
        assert_eq!(parse_fork_sub_offset(" 12 "), Ok(12));
        for bad in ["-1", "abc", "1.5", "05", "+1", ""] {
            assert!(parse_fork_sub_offset(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn integer_errors_say_why() {
        assert_eq!(parse_ttl("1e3"), Err(IntError::NotDigits));
        assert_eq!(parse_ttl(""), Err(IntError::NotDigits));
        assert_eq!(parse_ttl("0x3c"), Err(IntError::NotDigits));
        assert_eq!(parse_ttl("007"), Err(IntError::LeadingZero));
        assert_eq!(parse_ttl("18446744073709551616"), Err(IntError::TooLarge));
        assert_eq!(parse_fork_sub_offset("05"), Err(IntError::LeadingZero));
        assert_eq!(
            parse_producer_int("9007199254740992"),
            Err(IntError::TooLarge)
        );
        assert_eq!(parse_producer_int("+1"), Err(IntError::NotDigits));
    }

    #[test]
    fn producer_int() {
        assert_eq!(parse_producer_int("0"), Ok(0));
        assert_eq!(parse_producer_int("007"), Ok(7));
        assert_eq!(parse_producer_int(" 5 "), Ok(5));
        assert_eq!(
            parse_producer_int("9007199254740991"),
            Ok(9_007_199_254_740_991)
        );
        for bad in [
            "9007199254740992",
            "1abc",
            "0xyz",
            "1e3",
            "-1",
            "+1",
            "",
            "1.0",
            "99999999999999999999999",
        ] {
            assert!(parse_producer_int(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn expires_at_errors_say_why() {
        assert_eq!(
            parse_expires_at("2026/07/18T10:30:00Z"),
            Err(DateTimeError::Syntax)
        );
        assert_eq!(parse_expires_at("1784370600"), Err(DateTimeError::Syntax));
        assert_eq!(
            parse_expires_at("2026-02-29T10:30:00Z"),
            Err(DateTimeError::OutOfRange)
        );
        assert_eq!(
            parse_expires_at("2026-07-18T10:30:00+24:00"),
            Err(DateTimeError::OutOfRange)
        );
    }

    #[test]
    fn closed_header() {
        assert!(is_closed_true(Some("true")));
        assert!(is_closed_true(Some("TRUE")));
        assert!(is_closed_true(Some(" True ")));
        for v in ["false", "yes", "1", "", "truee", "t rue"] {
            assert!(!is_closed_true(Some(v)), "{v:?}");
        }
        assert!(!is_closed_true(None));
    }

    #[test]
    fn stream_seq() {
        assert_eq!(parse_stream_seq(None), Ok(None));
        assert_eq!(parse_stream_seq(Some("")), Ok(None));
        assert_eq!(parse_stream_seq(Some("  ")), Ok(None));
        assert_eq!(parse_stream_seq(Some(" 10 ")), Ok(Some("10")));
        let long = "a".repeat(1024);
        assert_eq!(parse_stream_seq(Some(&long)), Ok(Some(long.as_str())));
        assert_eq!(
            parse_stream_seq(Some(&"a".repeat(1025))),
            Err(StreamSeqTooLong)
        );
    }

    #[test]
    fn producer_trio() {
        assert_eq!(parse_producer(None, None, None), Ok(None));
        assert_eq!(
            parse_producer(Some(" p1 "), Some("2"), Some("3")),
            Ok(Some(ProducerHeaders {
                id: "p1".into(),
                epoch: 2,
                seq: 3
            }))
        );
        // Any subset is an error even when the present values are fine.
        for (i, e, s) in [
            (Some("p"), None, None),
            (None, Some("0"), None),
            (None, None, Some("0")),
            (Some("p"), Some("0"), None),
            (Some("p"), None, Some("0")),
            (None, Some("0"), Some("0")),
        ] {
            assert!(parse_producer(i, e, s).is_err());
        }
        assert!(parse_producer(Some(""), Some("0"), Some("0")).is_err());
        assert!(parse_producer(Some("   "), Some("0"), Some("0")).is_err());
        assert!(parse_producer(Some(&"x".repeat(257)), Some("0"), Some("0")).is_err());
        assert!(parse_producer(Some(&"x".repeat(256)), Some("0"), Some("0")).is_ok());
        assert!(parse_producer(Some("p"), Some("1abc"), Some("0")).is_err());
        assert!(parse_producer(Some("p"), Some("0"), Some("-1")).is_err());
        assert!(parse_producer(Some("p"), Some("0"), Some("9007199254740992")).is_err());
    }

    #[test]
    fn expires_at_valid_forms() {
        let base = 1_784_370_600_000; // 2026-07-18T10:30:00Z
        assert_eq!(parse_expires_at("2026-07-18T10:30:00Z"), Ok(base));
        assert_eq!(parse_expires_at("2026-07-18T10:30:00.100Z"), Ok(base + 100));
        assert_eq!(parse_expires_at("2026-07-18T10:30:00.1Z"), Ok(base + 100));
        assert_eq!(parse_expires_at("2026-07-18T10:30:00.12Z"), Ok(base + 120));
        assert_eq!(
            parse_expires_at("2026-07-18T10:30:00.123456789Z"),
            Ok(base + 123)
        );
        assert_eq!(parse_expires_at("2026-07-18T10:30:00+00:00"), Ok(base));
        assert_eq!(parse_expires_at("2026-07-18T10:30:00-00:00"), Ok(base));
        assert_eq!(parse_expires_at("2026-07-18T12:30:00+02:00"), Ok(base));
        assert_eq!(parse_expires_at("2026-07-18T05:00:00-05:30"), Ok(base));
        assert_eq!(parse_expires_at("2026-07-18t10:30:00z"), Ok(base));
        assert_eq!(parse_expires_at(" 2026-07-18T10:30:00Z "), Ok(base));
        assert_eq!(parse_expires_at("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_expires_at("1969-12-31T23:59:59.999Z"), Ok(-1));
        assert_eq!(
            parse_expires_at("2024-02-29T00:00:00Z"),
            Ok(1_709_164_800_000)
        );
        assert_eq!(
            parse_expires_at("2026-07-18T10:29:60Z"),
            Ok(base),
            "leap second rolls over"
        );
    }

    #[test]
    fn expires_at_rejects() {
        for bad in [
            "",
            "2026-07-18",
            "2026-07-18T10:30:00",
            "2026-07-18 10:30:00Z",
            "2026-07-18T10:30Z",
            "2026-07-18T10:30:00.Z",
            "2026-07-18T10:30:00+0000",
            "2026-07-18T10:30:00+00",
            "2026-07-18T10:30:00+24:00",
            "2026-07-18T10:30:00+00:60",
            "2026-13-18T10:30:00Z",
            "2026-00-18T10:30:00Z",
            "2026-02-29T10:30:00Z",
            "2026-04-31T10:30:00Z",
            "2026-07-00T10:30:00Z",
            "2026-07-18T24:00:00Z",
            "2026-07-18T10:60:00Z",
            "2026-07-18T10:30:61Z",
            "2026/07/18T10:30:00Z",
            "+2026-07-18T10:30:00Z",
            "2026-07-18T10:30:00ZZ",
            "2026-07-18T10:30:00Z garbage",
            "1784370600",
            "２026-07-18T10:30:00Z",
        ] {
            assert!(parse_expires_at(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn format_rfc3339() {
        assert_eq!(
            format_rfc3339_millis(1_784_370_600_000 + 3_600_000),
            "2026-07-18T11:30:00.000Z"
        );
        assert_eq!(format_rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_millis(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            format_rfc3339_millis(1_709_164_800_123),
            "2024-02-29T00:00:00.123Z"
        );
    }

    #[test]
    fn format_parse_round_trip() {
        for ms in [
            0i64,
            1,
            999,
            86_399_999,
            1_728_432_000_000,
            1_784_370_600_100,
            253_402_300_799_999,
        ] {
            assert_eq!(parse_expires_at(&format_rfc3339_millis(ms)), Ok(ms));
        }
    }
}

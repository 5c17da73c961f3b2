//! Query strings (P§4.6): `&`-separated, percent-decoded pairs in request order.

/// Largest `max_bytes` honoured (8 MiB); larger requests are clamped. Also the most stream
/// data the server puts in one response or SSE batch.
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

/// Parses a raw query (without the leading `?`). `+` is kept literally: the protocol's
/// values (offsets, cursors) never use form encoding, and reading `+` as a space
/// would turn a fuzzed `+1` offset into a valid-looking ` 1`.
pub fn parse_query(q: &str) -> Result<Query, &'static str> {
    let mut pairs = Vec::new();
    for piece in q.split('&') {
        if piece.is_empty() {
            continue;
        }
        let (k, v) = piece.split_once('=').unwrap_or((piece, ""));
        let k = percent_decode(k).map_err(|_| "invalid percent-encoding in query")?;
        let v = percent_decode(v).map_err(|_| "invalid percent-encoding in query")?;
        pairs.push((k, v));
    }
    Ok(Query { pairs })
}

impl Query {
    /// The value of a parameter that must appear at most once.
    pub fn get_unique(&self, key: &str) -> Result<Option<&str>, &'static str> {
        let mut found = None;
        for (k, v) in &self.pairs {
            if k == key {
                if found.is_some() {
                    return Err("query parameter given more than once");
                }
                found = Some(v.as_str());
            }
        }
        Ok(found)
    }

    /// First value of `key`, ignoring repeats.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == key)
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// Why percent-decoding failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentError {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// The decoded bytes are not UTF-8.
    NotUtf8,
}

impl PercentError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            PercentError::BadEscape => "a % is not followed by two hex digits",
            PercentError::NotUtf8 => "percent-decoded text is not UTF-8",
        }
    }
}

impl std::fmt::Display for PercentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for PercentError {}

/// Decodes `%XX` escapes; a stray `%`, bad hex or a non-UTF-8 result is an error.
pub fn percent_decode(s: &str) -> Result<String, PercentError> {
    let b = s.as_bytes();
    if !b.contains(&b'%') {
        return Ok(s.to_owned());
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |at: usize| b.get(at).copied().and_then(hex_val);
            let hi = hex(i + 1).ok_or(PercentError::BadEscape)?;
            let lo = hex(i + 2).ok_or(PercentError::BadEscape)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| PercentError::NotUtf8)
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `live` parameter values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    LongPoll,
    Sse,
}

/// `live`: `long-poll` or `sse`; anything else is a 400.
pub fn parse_live(v: &str) -> Result<Live, &'static str> {
    match v {
        "long-poll" => Ok(Live::LongPoll),
        "sse" => Ok(Live::Sse),
        _ => Err("live must be long-poll or sse"),
    }
}

/// `max_bytes`: positive decimal integer, clamped to 8 MiB; `0` or non-numeric is a 400.
pub fn parse_max_bytes(v: &str) -> Result<u64, &'static str> {
    const ERR: &str = "max_bytes must be a positive integer";
    if v.is_empty() || !v.bytes().all(|c| c.is_ascii_digit()) {
        return Err(ERR);
    }
    // All digits: the only parse failure left is overflow, which clamps like any
    // other oversized value.
    let n = v.parse::<u64>().unwrap_or(u64::MAX);
    if n == 0 {
        return Err(ERR);
    }
    Ok(n.min(MAX_READ_BYTES))
}

/// `timeout_ms`: integer clamped to [1, 60000]; invalid values are ignored (`None`).
pub fn parse_timeout_ms(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().unwrap_or(u64::MAX).clamp(1, 60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_pairs_in_order() {
        let q = parse_query("offset=-1&foo=bar&baz=qux").expect("ok");
        assert_eq!(q.get_unique("offset"), Ok(Some("-1")));
        assert_eq!(q.get_unique("foo"), Ok(Some("bar")));
        assert_eq!(q.get_unique("missing"), Ok(None));
        let keys: Vec<&str> = q.pairs().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["offset", "foo", "baz"]);
    }

    #[test]
    fn empty_and_valueless() {
        assert!(parse_query("").expect("ok").is_empty());
        assert!(parse_query("&&").expect("ok").is_empty());
        let q = parse_query("live&offset=").expect("ok");
        assert_eq!(q.get_unique("live"), Ok(Some("")));
        assert_eq!(q.get_unique("offset"), Ok(Some("")));
        assert!(q.contains("live"));
        let q = parse_query("a=b=c").expect("ok");
        assert_eq!(q.get("a"), Some("b=c"));
    }

    #[test]
    fn duplicates() {
        let q = parse_query("offset=1&offset=2").expect("ok");
        assert!(q.get_unique("offset").is_err());
        assert_eq!(q.get("offset"), Some("1"));
        // Duplicates of a different key do not matter.
        let q = parse_query("x=1&x=2&offset=3").expect("ok");
        assert_eq!(q.get_unique("offset"), Ok(Some("3")));
    }

    #[test]
    fn decoding() {
        let q = parse_query("offset=%2D1&c%75rsor=12&sp=a%20b&plus=a+b").expect("ok");
        assert_eq!(q.get_unique("offset"), Ok(Some("-1")));
        assert_eq!(q.get_unique("cursor"), Ok(Some("12")));
        assert_eq!(q.get_unique("sp"), Ok(Some("a b")));
        assert_eq!(q.get_unique("plus"), Ok(Some("a+b")));
        // Decoded NUL / LF survive so the offset parser can reject them.
        let q = parse_query("offset=1%00&o2=%0A").expect("ok");
        assert_eq!(q.get("offset"), Some("1\0"));
        assert_eq!(q.get("o2"), Some("\n"));
        // An encoded '&' does not split.
        let q = parse_query("k=a%26b").expect("ok");
        assert_eq!(q.get("k"), Some("a&b"));
    }

    #[test]
    fn bad_encoding() {
        for bad in ["a=%", "a=%2", "a=%zz", "%g0=1", "a=%ff", "a=%c3"] {
            assert!(parse_query(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn percent_decode_cases() {
        assert_eq!(percent_decode("plain").as_deref(), Ok("plain"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Ok("é"));
        assert_eq!(percent_decode("%c3%a9").as_deref(), Ok("é"));
        assert_eq!(percent_decode("a%2Fb").as_deref(), Ok("a/b"));
        assert_eq!(percent_decode("100%"), Err(PercentError::BadEscape));
        assert_eq!(percent_decode("%ZZ"), Err(PercentError::BadEscape));
        assert_eq!(percent_decode("%80"), Err(PercentError::NotUtf8));
        assert_eq!(percent_decode("%e2%82"), Err(PercentError::NotUtf8));
    }

    #[test]
    fn live_values() {
        assert_eq!(parse_live("long-poll"), Ok(Live::LongPoll));
        assert_eq!(parse_live("sse"), Ok(Live::Sse));
        for bad in ["", "SSE", "longpoll", "true", "websocket"] {
            assert!(parse_live(bad).is_err());
        }
    }

    #[test]
    fn max_bytes() {
        assert_eq!(parse_max_bytes("1"), Ok(1));
        assert_eq!(parse_max_bytes("65536"), Ok(65_536));
        assert_eq!(parse_max_bytes("8388608"), Ok(MAX_READ_BYTES));
        assert_eq!(parse_max_bytes("8388609"), Ok(MAX_READ_BYTES));
        assert_eq!(
            parse_max_bytes("99999999999999999999999"),
            Ok(MAX_READ_BYTES)
        );
        for bad in ["0", "000", "", "-1", "1.5", "abc", " 5", "+5"] {
            assert!(parse_max_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timeout_ms() {
        assert_eq!(parse_timeout_ms("500"), Some(500));
        assert_eq!(parse_timeout_ms("0"), Some(1));
        assert_eq!(parse_timeout_ms("999999"), Some(60_000));
        assert_eq!(parse_timeout_ms("99999999999999999999999"), Some(60_000));
        for bad in ["", "-1", "abc", "1.5"] {
            assert_eq!(parse_timeout_ms(bad), None);
        }
    }
}

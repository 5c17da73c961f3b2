//! `If-None-Match` evaluation (P§16.2).

/// Whether `header` (an `If-None-Match` value) matches `etag` (the quoted tag the
/// server would send). Comparison is weak (RFC 9110 §13.1.2): `W/` prefixes are
/// ignored on both sides. An unparsable header never matches, so the client simply
/// gets a full `200`.
pub fn if_none_match_matches(header: &str, etag: &str) -> bool {
    let h = header.trim();
    if h == "*" {
        return true;
    }
    let ours = strip_weak(etag.trim());
    match parse_list(h) {
        Some(tags) => tags.iter().any(|t| strip_weak(t) == ours),
        None => false,
    }
}

fn strip_weak(t: &str) -> &str {
    t.strip_prefix("W/").unwrap_or(t)
}

/// `#entity-tag`; each tag is returned with its `W/` prefix and quotes.
fn parse_list(h: &str) -> Option<Vec<&str>> {
    let b = h.as_bytes();
    let mut tags = Vec::new();
    let mut i = 0;
    loop {
        // Skip OWS and empty list elements.
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b',') {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let start = i;
        if b[i..].starts_with(b"W/") {
            i += 2;
        }
        if b.get(i) != Some(&b'"') {
            return None;
        }
        i += 1;
        // etagc = %x21 / %x23-7E / obs-text
        while i < b.len() && b[i] != b'"' {
            if b[i] < 0x21 || b[i] == 0x7f {
                return None;
            }
            i += 1;
        }
        if i >= b.len() {
            return None;
        }
        i += 1;
        tags.push(&h[start..i]);
        while i < b.len() && matches!(b[i], b' ' | b'\t') {
            i += 1;
        }
        if i < b.len() && b[i] != b',' {
            return None;
        }
    }
    if tags.is_empty() {
        None
    } else {
        Some(tags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: &str = "\"1784370000000:0:00000000000000000042\"";

    #[test]
    fn exact_and_star() {
        assert!(if_none_match_matches(E, E));
        assert!(if_none_match_matches(" * ", E));
        assert!(!if_none_match_matches("\"wrong-etag\"", E));
    }

    #[test]
    fn lists() {
        let list = format!("\"a\", {E} , \"b\"");
        assert!(if_none_match_matches(&list, E));
        assert!(if_none_match_matches(&format!("\"a\",{E}"), E));
        assert!(!if_none_match_matches("\"a\", \"b\"", E));
        assert!(if_none_match_matches("\"x,y\", \"z\"", "\"x,y\""));
        assert!(if_none_match_matches(&format!(",, {E},"), E));
    }

    #[test]
    fn weak_comparison() {
        assert!(if_none_match_matches(&format!("W/{E}"), E));
        assert!(if_none_match_matches(E, &format!("W/{E}")));
        assert!(if_none_match_matches("W/\"a\", W/\"b\"", "\"b\""));
    }

    #[test]
    fn unparsable_never_matches() {
        for bad in [
            "",
            "   ",
            "abc",
            "1784370000000:0:00000000000000000042", // unquoted
            "\"unterminated",
            "\"a\" \"b\"",
            "\"a\"x",
            "w/\"a\"",
            "\"a b\"",
            "*, \"a\"",
        ] {
            assert!(!if_none_match_matches(bad, "\"a\""), "{bad:?}");
        }
        // A malformed element spoils the whole list.
        assert!(!if_none_match_matches(&format!("{E}, junk"), E));
    }

    #[test]
    fn closed_marker_distinguishes() {
        let closed = "\"1:0:00000000000000000042:c\"";
        assert!(!if_none_match_matches(E, closed));
        assert!(if_none_match_matches(closed, closed));
    }
}

//! Content types (P§4.5): normalisation for storage/echo and media-type matching.

/// RFC 9110 `tchar`.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

fn is_lower_token(s: &str) -> bool {
    is_token(s) && !s.bytes().any(|c| c.is_ascii_uppercase())
}

/// Why a `Content-Type` value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentTypeError {
    /// No `type/subtype` of two tokens.
    MediaType,
    /// A parameter that is not `name=token` or `name="quoted string"`.
    Parameter,
}

impl ContentTypeError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            ContentTypeError::MediaType => "no valid type/subtype",
            ContentTypeError::Parameter => "a parameter is not name=value",
        }
    }
}

impl std::fmt::Display for ContentTypeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for ContentTypeError {}

/// Normalises a `Content-Type` value: trimmed, lower-cased, `type/subtype` and every
/// parameter validated, empty parameters (`;;`, trailing `;`) dropped, parameters
/// joined with `"; "`. The result is what the server stores and echoes verbatim.
pub fn normalize(v: &str) -> Result<String, ContentTypeError> {
    // Most values are canonical already (lower-case `type/subtype`, no parameters), and
    // every append carries one: no lower-cased copy, no parameter scan.
    let trimmed = v.trim();
    if let Some((ty, sub)) = trimmed.split_once('/') {
        if is_lower_token(ty) && is_lower_token(sub) {
            return Ok(trimmed.to_owned());
        }
    }
    let lower = trimmed.to_ascii_lowercase();
    let b = lower.as_bytes();
    let semi = b.iter().position(|&c| c == b';').unwrap_or(b.len());
    let mt = lower[..semi].trim();
    let (ty, sub) = mt.split_once('/').ok_or(ContentTypeError::MediaType)?;
    if !is_token(ty) || !is_token(sub) {
        return Err(ContentTypeError::MediaType);
    }
    let mut out = String::with_capacity(lower.len());
    out.push_str(ty);
    out.push('/');
    out.push_str(sub);

    // Parameters are scanned by hand because quoted-string values may contain ';'.
    let mut i = semi;
    while i < b.len() {
        // b[i] == b';'
        i += 1;
        while i < b.len() && matches!(b[i], b' ' | b'\t') {
            i += 1;
        }
        if i >= b.len() || b[i] == b';' {
            continue; // empty parameter
        }
        let name_start = i;
        while i < b.len() && is_tchar(b[i]) {
            i += 1;
        }
        let name = &lower[name_start..i];
        if name.is_empty() || i >= b.len() || b[i] != b'=' {
            return Err(ContentTypeError::Parameter);
        }
        i += 1;
        let value_start = i;
        if i < b.len() && b[i] == b'"' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err(ContentTypeError::Parameter),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        match b.get(i + 1) {
                            Some(&c) if c == b'\t' || c >= 0x20 && c != 0x7f => {}
                            _ => return Err(ContentTypeError::Parameter),
                        }
                        i += 2;
                    }
                    Some(&c) if c == b'\t' || (c >= 0x20 && c != 0x7f) => i += 1,
                    Some(_) => return Err(ContentTypeError::Parameter),
                }
            }
        } else {
            while i < b.len() && is_tchar(b[i]) {
                i += 1;
            }
            if i == value_start {
                return Err(ContentTypeError::Parameter);
            }
        }
        let value = &lower[value_start..i];
        while i < b.len() && matches!(b[i], b' ' | b'\t') {
            i += 1;
        }
        if i < b.len() && b[i] != b';' {
            return Err(ContentTypeError::Parameter);
        }
        out.push_str("; ");
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
    Ok(out)
}

/// The `type/subtype` part of a content type (before any `;`), trimmed, original case.
pub fn media_type(v: &str) -> &str {
    // ';' is ASCII, so the cut is a char boundary. Trimmed like `normalize` trims.
    let end = memchr::memchr(b';', v.as_bytes()).unwrap_or(v.len());
    v[..end].trim()
}

/// Media-type equality used for append/create/fork matching: parameters ignored,
/// ASCII case-insensitive.
pub fn same_media_type(a: &str, b: &str) -> bool {
    media_type(a).eq_ignore_ascii_case(media_type(b))
}

/// JSON mode applies only to `application/json` itself, not `+json` or NDJSON.
pub fn is_json(v: &str) -> bool {
    media_type(v).eq_ignore_ascii_case("application/json")
}

/// `application/x-ndjson`: one JSON text per line.
pub fn is_ndjson(v: &str) -> bool {
    media_type(v).eq_ignore_ascii_case("application/x-ndjson")
}

/// Whether SSE carries the payload as UTF-8 text (else base64).
pub fn sse_is_text(v: &str) -> bool {
    is_text(v) || is_json(v)
}

/// Whether a stream of this type holds text (`text/*`). Text streams hold UTF-8 only, so
/// every view of them (catch-up, SSE) carries exactly the bytes stored.
pub fn is_text(v: &str) -> bool {
    let mt = media_type(v).as_bytes();
    mt.len() > 5 && mt[..5].eq_ignore_ascii_case(b"text/")
}

/// The `charset` parameter of a normalised content type when it names an encoding other
/// than UTF-8 (US-ASCII is a subset of UTF-8 and is fine).
pub fn non_utf8_charset(normalized: &str) -> Option<&str> {
    normalized.split(';').skip(1).find_map(|param| {
        let value = param.trim().strip_prefix("charset=")?;
        let unquoted = value.trim_matches('"');
        (!matches!(unquoted, "utf-8" | "utf8" | "us-ascii")).then_some(value)
    })
}

/// Whether a browser could run content of this type (HTML, SVG, XML, scripts, anything
/// not known to be passive). Such content, served from a stream someone wrote to, gets a
/// sandboxing `Content-Security-Policy`, so a page reached at the server's origin cannot
/// act as that origin.
pub fn is_active(v: &str) -> bool {
    const PASSIVE: [&str; 8] = [
        "application/json",
        "application/x-ndjson",
        "application/octet-stream",
        "application/x-protobuf",
        "application/protobuf",
        "text/plain",
        "text/csv",
        "text/event-stream",
    ];
    let mt = media_type(v);
    let starts = |prefix: &str| {
        mt.len() > prefix.len()
            && mt.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
    };
    // Images, sound and video are passive, but SVG is a document that can hold scripts.
    let media = (starts("image/") || starts("audio/") || starts("video/"))
        && !mt.to_ascii_lowercase().contains("svg");
    !(media || PASSIVE.iter().any(|p| mt.eq_ignore_ascii_case(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types_and_their_charsets() {
        assert!(is_text("text/plain") && is_text("Text/HTML; charset=utf-8"));
        assert!(!is_text("application/json") && !is_text("text/"));
        for ok in [
            "text/plain",
            "text/plain; charset=utf-8",
            "text/plain; charset=\"utf-8\"",
            "text/plain; charset=us-ascii",
            "text/plain; format=flowed",
        ] {
            assert_eq!(non_utf8_charset(ok), None, "{ok}");
        }
        assert_eq!(
            non_utf8_charset("text/plain; charset=latin1"),
            Some("latin1")
        );
        assert_eq!(
            non_utf8_charset("text/plain; a=b; charset=iso-8859-1"),
            Some("iso-8859-1")
        );
    }

    #[test]
    fn active_types_are_everything_not_known_passive() {
        for active in [
            "text/html",
            "application/xhtml+xml",
            "image/svg+xml",
            "text/xml",
            "application/javascript",
            "application/pdf",
            "x/unknown",
        ] {
            assert!(is_active(active), "{active}");
        }
        for passive in [
            "application/json",
            "Text/Plain; charset=utf-8",
            "application/octet-stream",
            "image/png",
            "video/mp4",
            "text/event-stream",
        ] {
            assert!(!is_active(passive), "{passive}");
        }
    }

    #[test]
    fn normalize_examples() {
        assert_eq!(
            normalize("application/json").as_deref(),
            Ok("application/json")
        );
        assert_eq!(
            normalize("Text/Plain;Charset=UTF-8").as_deref(),
            Ok("text/plain; charset=utf-8")
        );
        assert_eq!(
            normalize("  APPLICATION/JSON  ").as_deref(),
            Ok("application/json")
        );
        assert_eq!(
            normalize("text/plain;;  ;charset=utf-8;").as_deref(),
            Ok("text/plain; charset=utf-8")
        );
        assert_eq!(
            normalize("text/plain ; a=1 ;b=2").as_deref(),
            Ok("text/plain; a=1; b=2")
        );
        assert_eq!(
            normalize("multipart/mixed; boundary=\"a;b c\"").as_deref(),
            Ok("multipart/mixed; boundary=\"a;b c\"")
        );
        assert_eq!(
            normalize("application/vnd.api+json").as_deref(),
            Ok("application/vnd.api+json")
        );
        assert_eq!(normalize("text/plain;").as_deref(), Ok("text/plain"));
    }

    #[test]
    fn normalize_rejects() {
        for bad in [
            "",
            "   ",
            "text",
            "text/",
            "/plain",
            "text/plain/x",
            "te xt/plain",
            "text/pl ain",
            "text/plain; charset",
            "text/plain; charset=",
            "text/plain; =utf-8",
            "text/plain; charset = utf-8",
            "text/plain; charset=\"unterminated",
            "text/plain; a=b c",
            "text/plain; a=\"x\"y",
            "text/plain, text/html",
            "tëxt/plain",
            "text/plain; a=\u{1}",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn canonical_values_come_back_as_the_long_way_makes_them() {
        // Lower-case values without parameters take a shortcut; upper-case spellings of the
        // same values take the full parse, and both must agree.
        for v in [
            "application/octet-stream",
            "text/x-ndjson",
            "a/b",
            "a.b+c/d-e",
        ] {
            assert_eq!(normalize(&format!(" {v} ")).as_deref(), Ok(v));
            assert_eq!(normalize(&v.to_ascii_uppercase()).as_deref(), Ok(v));
        }
    }

    #[test]
    fn normalize_is_idempotent() {
        for v in [
            "Text/Plain;Charset=UTF-8",
            "application/json",
            "a/b; x=\"q;r\"; y=z",
        ] {
            let once = normalize(v).unwrap_or_default();
            assert_eq!(normalize(&once).as_deref(), Ok(once.as_str()));
        }
    }

    #[test]
    fn media_type_matching() {
        assert_eq!(media_type(" text/plain ; charset=utf-8"), "text/plain");
        assert_eq!(media_type("application/json"), "application/json");
        // Trimmed as `normalize` trims, vertical tab included (found by fuzz/query_headers).
        assert_eq!(media_type("text/plain\u{b}\u{b}"), "text/plain");
        assert!(same_media_type(
            &normalize("a/b\u{b}").expect("valid"),
            "a/b\u{b}"
        ));
        assert!(same_media_type(
            "application/json; charset=utf-8",
            "APPLICATION/JSON"
        ));
        assert!(!same_media_type("application/json", "application/x-ndjson"));
        assert!(!same_media_type("text/plain", "text/html"));
    }

    #[test]
    fn json_detection() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("application/x-ndjson"));
        assert!(!is_json("application/vnd.api+json"));
        assert!(!is_json("text/json"));
        assert!(!is_json(""));
    }

    #[test]
    fn sse_text_or_base64() {
        assert!(sse_is_text("text/plain"));
        assert!(sse_is_text("TEXT/CSV; charset=utf-8"));
        assert!(sse_is_text("application/json"));
        for b in [
            "application/octet-stream",
            "application/x-protobuf",
            "image/png",
            "application/x-ndjson",
            "text",
            "text/",
            "",
        ] {
            assert!(!sse_is_text(b), "{b:?}");
        }
    }
}

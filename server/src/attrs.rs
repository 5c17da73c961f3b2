//! Stream attributes (extensions.md §7): a small mutable JSON object (`title`, `metadata`)
//! kept beside a bucketed stream in its server-owned state blob ([`Ext`]).
//!
//! Parsing never builds a JSON tree: the input is validated and minified by the protocol
//! crate's iterative canonicaliser (depth-bounded), then the top-level members are split by
//! a flat scan. `metadata` is stored as its minified text, so number lexemes and key order
//! survive byte-for-byte; two attribute objects are "equal" (idempotent create, §7.2) when
//! their decoded titles are equal and their minified metadata texts are identical.

use serde::{Deserialize, Serialize};

use crate::limits::ATTRS_BYTES_MAX;

/// A stored, normalised attribute object. `None` fields are absent; an object with both
/// absent is never stored (`{}` ≡ no attributes).
#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq, Eq)]
pub struct Attrs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Minified JSON text of an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
}

impl Attrs {
    /// `{}`-normalisation: no fields means no attributes.
    fn normalised(self) -> Option<Attrs> {
        (self != Attrs::default()).then_some(self)
    }

    /// The attribute object as served by `GET …/attrs`.
    pub fn render(attrs: Option<&Attrs>) -> String {
        let Some(a) = attrs else {
            return "{}".into();
        };
        let mut out = String::from("{");
        if let Some(t) = &a.title {
            out.push_str("\"title\":");
            out.push_str(&sonic_rs::to_string(t).unwrap_or_else(|_| "\"\"".into()));
        }
        if let Some(m) = &a.metadata {
            if a.title.is_some() {
                out.push(',');
            }
            out.push_str("\"metadata\":");
            out.push_str(m);
        }
        out.push('}');
        out
    }
}

/// Parse and normalise an attribute document (§7.1). `Ok(None)` is `{}`.
pub fn parse(input: &[u8]) -> Result<Option<Attrs>, &'static str> {
    if input.len() > ATTRS_BYTES_MAX {
        return Err("stream attributes are larger than 16 KiB");
    }
    let first = input.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Also rules out top-level arrays, which the canonicaliser would flatten.
        return Err("stream attributes must be a JSON object");
    }
    let canon = ursula_protocol::json::canonicalize(input, false)
        .map_err(|_| "stream attributes are not valid JSON")?;
    let text = canon.bytes.strip_suffix(b"\n").unwrap_or(&canon.bytes);
    let mut attrs = Attrs::default();
    for (key, value) in members(text) {
        let key: std::borrow::Cow<'_, str> = if key.contains(&b'\\') {
            // Escaped key: decode it (a flat string, no recursion).
            sonic_rs::from_slice::<String>(key)
                .map_err(|_| "stream attributes are not valid JSON")?
                .into()
        } else {
            String::from_utf8_lossy(&key[1..key.len() - 1])
        };
        match &*key {
            "title" => {
                if value.first() != Some(&b'"') {
                    return Err("title must be a string");
                }
                let t: String =
                    sonic_rs::from_slice(value).map_err(|_| "title must be a string")?;
                attrs.title = Some(t);
            }
            "metadata" => {
                if value.first() != Some(&b'{') {
                    return Err("metadata must be an object");
                }
                attrs.metadata = Some(String::from_utf8_lossy(value).into_owned());
            }
            // Unknown top-level fields are accepted and dropped (§7.1).
            _ => {}
        }
    }
    Ok(attrs.normalised())
}

/// Top-level `(key, value)` lexemes of a minified, already validated JSON object.
fn members(text: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut out = Vec::new();
    let inner = &text[1..text.len() - 1];
    let mut i = 0;
    while i < inner.len() {
        let key_start = i;
        i = skip_string(inner, i);
        let key = &inner[key_start..i];
        i += 1; // ':'
        let value_start = i;
        let mut depth = 0usize;
        while i < inner.len() {
            match inner[i] {
                b'"' => {
                    i = skip_string(inner, i);
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => depth -= 1,
                b',' if depth == 0 => break,
                _ => {}
            }
            i += 1;
        }
        out.push((key, &inner[value_start..i]));
        i += 1; // ','
    }
    out
}

/// Index just past the string literal starting at `at` (which is `"`).
fn skip_string(s: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Option<Attrs>, &'static str> {
        parse(s.as_bytes())
    }

    #[test]
    fn object_rules() {
        assert_eq!(p("{}"), Ok(None));
        assert_eq!(p(" { } "), Ok(None));
        assert_eq!(p(r#"{"other":1,"x":[1,{"y":2}]}"#), Ok(None));
        let a = p(r#"{ "title" : "Hi \"you\"", "metadata": {"b": [1, 2.50], "a": {}}, "z": 3 }"#)
            .unwrap()
            .unwrap();
        assert_eq!(a.title.as_deref(), Some("Hi \"you\""));
        assert_eq!(a.metadata.as_deref(), Some(r#"{"b":[1,2.50],"a":{}}"#));
        assert_eq!(
            Attrs::render(Some(&a)),
            r#"{"title":"Hi \"you\"","metadata":{"b":[1,2.50],"a":{}}}"#
        );
        assert_eq!(Attrs::render(None), "{}");
        // Escaped key names are decoded.
        assert_eq!(
            p(r#"{"t\u0069tle":"x"}"#)
                .unwrap()
                .unwrap()
                .title
                .as_deref(),
            Some("x")
        );
        // Same attributes modulo whitespace and unknown fields.
        assert_eq!(
            p(r#"{"title":"t","metadata":{"k":1}}"#),
            p(r#"{ "metadata" : { "k" : 1 }, "title":"t", "drop": null }"#)
        );
    }

    #[test]
    fn invalid_documents() {
        for bad in [
            "",
            "[]",
            r#"[{"title":"x"}]"#,
            "\"s\"",
            "42",
            "null",
            "{",
            r#"{"title":1}"#,
            r#"{"title":null}"#,
            r#"{"metadata":[1]}"#,
            r#"{"metadata":"x"}"#,
            r#"{"title":"a"} {}"#,
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        let big = format!(r#"{{"title":"{}"}}"#, "x".repeat(ATTRS_BYTES_MAX));
        assert!(p(&big).is_err());
        let fits = format!(r#"{{"title":"{}"}}"#, "x".repeat(ATTRS_BYTES_MAX - 12));
        assert_eq!(fits.len(), ATTRS_BYTES_MAX);
        assert!(p(&fits).is_ok());
        let deep = format!("{{\"metadata\":{}{}}}", "[".repeat(500), "]".repeat(500));
        assert!(p(&deep).is_err());
    }
}

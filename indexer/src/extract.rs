//! The extractor: JSON pointers (with `*` wildcards) that pull an event time, and optionally
//! an end time, out of each message (indexer.md §2).
//!
//! Messages are walked lazily with sonic-rs: only the members named on a path are visited
//! and only leaf values are decoded, so junk elsewhere in a message cannot break extraction
//! and a simple `/captured_at` costs one pass over the top-level object.

use serde::{Deserialize, Serialize};
use sonic_rs::LazyValue;

use crate::error::{Error, Result};

/// What one message turned into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Entry { t_ms: i64, t_end_ms: i64 },
    Skip(SkipKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipKind {
    Missing,
    Invalid,
    Unparseable,
    Oversize,
}

/// The extractor as registered (`extract` body field), in canonical form once normalised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<String>,
    pub time: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Vec<String>>,
    #[serde(default)]
    pub unit: Unit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    #[default]
    Auto,
    Rfc3339,
    S,
    Ms,
    Us,
    Ns,
}

/// A compiled extractor.
#[derive(Debug, Clone)]
pub struct Extractor {
    spec: ExtractSpec,
    each: Option<Pointer>,
    time: Vec<Pointer>,
    end: Vec<Pointer>,
    /// Test-only fault injection: added to every extracted time (see `--debug-time-offset-ms`).
    skew_ms: i64,
}

/// Messages longer than this are counted as `oversize` and never indexed (§2.5).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

impl ExtractSpec {
    /// The default extractor: `/captured_at`, unit auto.
    pub fn captured_at() -> ExtractSpec {
        ExtractSpec::legacy("captured_at")
    }

    /// The legacy `{"timestamp_field": "x"}` form: `{"time": ["/x"], "unit": "auto"}`.
    pub fn legacy(field: &str) -> ExtractSpec {
        let escaped = field.replace('~', "~0").replace('/', "~1");
        ExtractSpec {
            each: None,
            time: vec![format!("/{escaped}")],
            end: None,
            unit: Unit::Auto,
        }
    }

    /// Canonical JSON: fixed field order, absent optional fields omitted, unit explicit.
    pub fn canonical_json(&self) -> String {
        sonic_rs::to_string(self).unwrap_or_default()
    }

    /// BLAKE3 of the canonical JSON, plus an extraction-semantics version so that a build
    /// that parses times differently gets a new namespace instead of a spurious conflict.
    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"ursula-extract-v1\n");
        h.update(self.canonical_json().as_bytes());
        h.finalize().to_hex().to_string()
    }
}

impl Extractor {
    pub fn compile(spec: &ExtractSpec) -> Result<Extractor> {
        if spec.time.is_empty() {
            return Err(Error::NoTimePointer);
        }
        let each = match &spec.each {
            Some(p) => Some(Pointer::parse(p)?),
            None => None,
        };
        let time = spec
            .time
            .iter()
            .map(|p| Pointer::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let end = spec
            .end
            .iter()
            .flatten()
            .map(|p| Pointer::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Extractor {
            spec: spec.clone(),
            each,
            time,
            end,
            skew_ms: 0,
        })
    }

    pub fn with_skew(mut self, skew_ms: i64) -> Extractor {
        self.skew_ms = skew_ms;
        self
    }

    pub fn spec(&self) -> &ExtractSpec {
        &self.spec
    }

    /// Classify one message (its bytes without the terminating LF).
    pub fn extract(&self, msg: &[u8]) -> Outcome {
        if msg.len() > MAX_MESSAGE_BYTES {
            return Outcome::Skip(SkipKind::Oversize);
        }
        let Ok(text) = std::str::from_utf8(msg) else {
            return Outcome::Skip(SkipKind::Unparseable);
        };
        // One JSON value, validated by sonic-rs's skipper (no DOM is built).
        if sonic_rs::from_str::<serde::de::IgnoredAny>(text).is_err() {
            return Outcome::Skip(SkipKind::Unparseable);
        }
        let text = text.trim();
        let mut acc = Acc::default();
        match &self.each {
            None => self.element(text, &mut acc),
            Some(each) => {
                let mut elements = Vec::new();
                each.select(text, 0, &mut |v| elements.push(v.0));
                for el in elements {
                    self.element(el, &mut acc);
                }
            }
        }
        match acc.t {
            Some(t) => {
                let end = acc.end.unwrap_or(t).max(t);
                Outcome::Entry {
                    t_ms: t.saturating_add(self.skew_ms),
                    t_end_ms: end.saturating_add(self.skew_ms),
                }
            }
            None if acc.invalid => Outcome::Skip(SkipKind::Invalid),
            None => Outcome::Skip(SkipKind::Missing),
        }
    }

    /// §2.3: the element's time (minimum over the first pointer that selects a present
    /// value) and end (maximum, falling back to the time).
    fn element(&self, el: &str, acc: &mut Acc) {
        let t = match self.fallback(&self.time, el, false) {
            Pick::Time(t) => t,
            Pick::Invalid => {
                acc.invalid = true;
                return;
            }
            Pick::Missing => return,
        };
        let end = match self.fallback(&self.end, el, true) {
            Pick::Time(e) => e.max(t),
            _ => t,
        };
        acc.t = Some(acc.t.map_or(t, |x| x.min(t)));
        acc.end = Some(acc.end.map_or(end, |x| x.max(end)));
    }

    fn fallback(&self, ptrs: &[Pointer], el: &str, take_max: bool) -> Pick {
        for p in ptrs {
            let mut best: Option<i64> = None;
            let mut invalid = false;
            p.select(el, 0, &mut |v| match parse_time(&v, self.spec.unit) {
                TimeVal::Ms(ms) => {
                    best = Some(match best {
                        Some(b) if take_max => b.max(ms),
                        Some(b) => b.min(ms),
                        None => ms,
                    })
                }
                TimeVal::Invalid => invalid = true,
                TimeVal::Missing => {}
            });
            if let Some(t) = best {
                return Pick::Time(t);
            }
            if invalid {
                return Pick::Invalid;
            }
        }
        Pick::Missing
    }
}

#[derive(Default)]
struct Acc {
    t: Option<i64>,
    end: Option<i64>,
    invalid: bool,
}

enum Pick {
    Time(i64),
    Invalid,
    Missing,
}

/// An RFC 6901 pointer whose `*` segments match every member or element.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pointer {
    segs: Vec<Seg>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    /// A member name; also an array index when it is a canonical decimal.
    Key(String, Option<usize>),
    Any,
}

impl Pointer {
    fn parse(s: &str) -> Result<Pointer> {
        let invalid = |reason| Error::InvalidPointer {
            pointer: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Ok(Pointer { segs: Vec::new() });
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(invalid("must start with '/'"));
        };
        let mut segs = Vec::new();
        for raw in rest.split('/') {
            if raw == "*" {
                segs.push(Seg::Any);
                continue;
            }
            let mut key = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    key.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => key.push('~'),
                    Some('1') => key.push('/'),
                    _ => return Err(invalid("bad '~' escape")),
                }
            }
            let canonical_index = !key.is_empty()
                && key.bytes().all(|b| b.is_ascii_digit())
                && (key == "0" || !key.starts_with('0'));
            let index = if canonical_index {
                key.parse().ok()
            } else {
                None
            };
            segs.push(Seg::Key(key, index));
        }
        Ok(Pointer { segs })
    }

    /// Call `f` with every value this pointer selects in `raw` (a JSON value's text).
    fn select<'a>(&self, raw: &'a str, depth: usize, f: &mut dyn FnMut(LazyOrRaw<'a>)) {
        let Some(seg) = self.segs.get(depth) else {
            f(LazyOrRaw(raw));
            return;
        };
        let first = raw.as_bytes().first().copied();
        match (seg, first) {
            (Seg::Any, Some(b'{')) => {
                for (_, v) in sonic_rs::to_object_iter(raw).flatten() {
                    self.select(lazy_raw(&v, raw), depth + 1, f);
                }
            }
            (Seg::Any, Some(b'[')) => {
                for v in sonic_rs::to_array_iter(raw).flatten() {
                    self.select(lazy_raw(&v, raw), depth + 1, f);
                }
            }
            (Seg::Key(k, _), Some(b'{')) => {
                // Duplicate keys: the last one wins, as in JSON.parse.
                let mut found = None;
                for (name, v) in sonic_rs::to_object_iter(raw).flatten() {
                    if name == k.as_str() {
                        found = Some(lazy_raw(&v, raw));
                    }
                }
                if let Some(v) = found {
                    self.select(v, depth + 1, f);
                }
            }
            (Seg::Key(_, Some(i)), Some(b'[')) => {
                if let Some(Ok(v)) = sonic_rs::to_array_iter(raw).nth(*i) {
                    self.select(lazy_raw(&v, raw), depth + 1, f);
                }
            }
            _ => {}
        }
    }
}

/// The text of a lazily-parsed member, as a slice of its parent (lifetimes of the
/// iterators' values are tied to the parent text, so re-slice by pointer arithmetic-free
/// search: sonic-rs hands back borrowed raw text for borrowed input).
fn lazy_raw<'a>(v: &LazyValue<'_>, parent: &'a str) -> &'a str {
    let s = v.as_raw_str();
    let base = parent.as_ptr() as usize;
    let p = s.as_ptr() as usize;
    if p >= base && p + s.len() <= base + parent.len() {
        &parent[p - base..p - base + s.len()]
    } else {
        // Never expected for borrowed input; fall back to an empty (missing) value.
        ""
    }
}

/// A selected leaf: its raw JSON text.
struct LazyOrRaw<'a>(&'a str);

#[derive(Debug, PartialEq, Eq)]
enum TimeVal {
    Missing,
    Invalid,
    Ms(i64),
}

/// §2.4: normalise a leaf to milliseconds.
fn parse_time(v: &LazyOrRaw<'_>, unit: Unit) -> TimeVal {
    let raw = v.0.trim();
    let Some(first) = raw.as_bytes().first() else {
        return TimeVal::Missing;
    };
    let (text, is_string) = match first {
        b'"' => match sonic_rs::from_str::<String>(raw) {
            Ok(s) => (std::borrow::Cow::Owned(s), true),
            Err(_) => return TimeVal::Invalid,
        },
        b'n' => return TimeVal::Missing,
        b'-' | b'0'..=b'9' => (std::borrow::Cow::Borrowed(raw), false),
        _ => return TimeVal::Invalid,
    };
    if text.is_empty() {
        return TimeVal::Missing;
    }
    let ms = match unit {
        Unit::Auto if is_string => match crate::time::parse_rfc3339_ms(&text) {
            Some(ms) => Some(ms as i128),
            None => parse_int(&text),
        },
        Unit::Auto | Unit::Ms => parse_int(&text),
        Unit::Rfc3339 if is_string => crate::time::parse_rfc3339_ms(&text).map(|ms| ms as i128),
        Unit::Rfc3339 => None,
        Unit::S => parse_seconds(&text),
        Unit::Us => parse_int(&text).map(|v| v.div_euclid(1_000)),
        Unit::Ns => parse_int(&text).map(|v| v.div_euclid(1_000_000)),
    };
    // Zero counts as missing whatever the unit: OTLP leaves unset times at 0.
    if is_zero(&text) {
        return TimeVal::Missing;
    }
    match ms {
        Some(ms) if ms >= i64::MIN as i128 && ms <= i64::MAX as i128 => TimeVal::Ms(ms as i64),
        _ => TimeVal::Invalid,
    }
}

fn is_zero(text: &str) -> bool {
    let t = text.strip_prefix('-').unwrap_or(text);
    !t.is_empty() && t.bytes().all(|b| b == b'0' || b == b'.') && t.bytes().any(|b| b == b'0')
}

/// A decimal integer (optional sign), at most 38 digits.
fn parse_int(s: &str) -> Option<i128> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || digits.len() > 38 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Seconds as an integer or a plain decimal fraction; digits below the millisecond are
/// truncated; exponents are invalid.
fn parse_seconds(s: &str) -> Option<i128> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, f),
        None => (body, ""),
    };
    if int.is_empty() || int.len() > 30 || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) || (body.contains('.') && frac.is_empty()) {
        return None;
    }
    let whole: i128 = int.parse().ok()?;
    let mut ms_part = 0i128;
    for (i, b) in frac.bytes().take(3).enumerate() {
        ms_part += i128::from(b - b'0') * 10i128.pow(2 - i as u32);
    }
    let v = whole * 1000 + ms_part;
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(spec: &str) -> Extractor {
        let spec: ExtractSpec = sonic_rs::from_str(spec).expect("spec");
        Extractor::compile(&spec).expect("compile")
    }

    fn entry(t: i64, e: i64) -> Outcome {
        Outcome::Entry {
            t_ms: t,
            t_end_ms: e,
        }
    }

    #[test]
    fn captured_at_auto() {
        let x = Extractor::compile(&ExtractSpec::captured_at()).expect("compile");
        assert_eq!(
            x.extract(br#"{"captured_at":"2026-07-18T10:30:00.100Z","type":"x"}"#),
            entry(1784370600100, 1784370600100)
        );
        assert_eq!(x.extract(br#"{"captured_at":1500}"#), entry(1500, 1500));
        assert_eq!(x.extract(br#"{"captured_at":"1500"}"#), entry(1500, 1500));
        let skips: [(&[u8], SkipKind); 10] = [
            (br#"{"captured_at":1.5}"#, SkipKind::Invalid),
            (br#"{"captured_at":1e3}"#, SkipKind::Invalid),
            (br#"{"captured_at":true}"#, SkipKind::Invalid),
            (br#"{"captured_at":"soon"}"#, SkipKind::Invalid),
            (br#"{"captured_at":null}"#, SkipKind::Missing),
            (br#"{"captured_at":0}"#, SkipKind::Missing),
            (br#"{"other":1}"#, SkipKind::Missing),
            (br#"{"captured_at":"#, SkipKind::Unparseable),
            (b"\xff\xfe", SkipKind::Unparseable),
            (br#"{"a":1} {"b":2}"#, SkipKind::Unparseable),
        ];
        for (line, kind) in skips {
            assert_eq!(
                x.extract(line),
                Outcome::Skip(kind),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        // Duplicate keys: last wins.
        assert_eq!(
            x.extract(br#"{"captured_at":1,"captured_at":2}"#),
            entry(2, 2)
        );
    }

    #[test]
    fn otlp_traces_span_min_max() {
        let x = ex(
            r#"{"each":"/resourceSpans/*/scopeSpans/*/spans/*","time":["/startTimeUnixNano"],"end":["/endTimeUnixNano"],"unit":"ns"}"#,
        );
        let msg = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[
            {"startTimeUnixNano":"1784370600100000000","endTimeUnixNano":"1784370600300000000"},
            {"startTimeUnixNano":"1784370600050000000","endTimeUnixNano":"1784370600200000000"}]}]},
            {"scopeSpans":[{"spans":[{"startTimeUnixNano":"1784370601000999999","endTimeUnixNano":"1784370602000000000"}]}]}]}"#;
        assert_eq!(x.extract(msg), entry(1784370600050, 1784370602000));
    }

    #[test]
    fn otlp_logs_fallback_on_zero() {
        let x = ex(
            r#"{"each":"/resourceLogs/*/scopeLogs/*/logRecords/*","time":["/timeUnixNano","/observedTimeUnixNano"],"unit":"ns"}"#,
        );
        let msg = br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[
            {"timeUnixNano":"0","observedTimeUnixNano":"1784370600100000000"},
            {"timeUnixNano":"1784370600500000000","observedTimeUnixNano":"1784370600600000000"}]}]}]}"#;
        assert_eq!(x.extract(msg), entry(1784370600100, 1784370600500));
        // An invalid first pointer does not fall back.
        let bad = br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"x","observedTimeUnixNano":"5000000"}]}]}]}"#;
        assert_eq!(x.extract(bad), Outcome::Skip(SkipKind::Invalid));
    }

    #[test]
    fn units_and_pointers() {
        assert_eq!(
            ex(r#"{"time":["/t"],"unit":"s"}"#).extract(br#"{"t":"12.3456"}"#),
            entry(12345, 12345)
        );
        assert_eq!(
            ex(r#"{"time":["/t"],"unit":"s"}"#).extract(br#"{"t":1e3}"#),
            Outcome::Skip(SkipKind::Invalid)
        );
        assert_eq!(
            ex(r#"{"time":["/t"],"unit":"us"}"#).extract(br#"{"t":1999}"#),
            entry(1, 1)
        );
        assert_eq!(
            ex(r#"{"time":["/t"],"unit":"rfc3339"}"#).extract(br#"{"t":5}"#),
            Outcome::Skip(SkipKind::Invalid)
        );
        assert_eq!(
            ex(r#"{"time":["/a~1b/0"]}"#).extract(br#"{"a/b":[7,8]}"#),
            entry(7, 7)
        );
        assert_eq!(
            ex(r#"{"time":["/a/01"]}"#).extract(br#"{"a":[7,8]}"#),
            Outcome::Skip(SkipKind::Missing)
        );
        assert_eq!(
            ex(r#"{"time":["/t"],"end":["/e"]}"#).extract(br#"{"t":10,"e":5}"#),
            entry(10, 10)
        );
        assert!(Extractor::compile(&ExtractSpec {
            each: None,
            time: vec![],
            end: None,
            unit: Unit::Auto
        })
        .is_err());
        assert!(Extractor::compile(&ExtractSpec {
            each: None,
            time: vec!["x".into()],
            end: None,
            unit: Unit::Auto
        })
        .is_err());
        assert!(Extractor::compile(&ExtractSpec {
            each: None,
            time: vec!["/a~2".into()],
            end: None,
            unit: Unit::Auto
        })
        .is_err());
    }

    #[test]
    fn legacy_digest_matches() {
        let a = ExtractSpec::legacy("captured_at");
        let b: ExtractSpec = sonic_rs::from_str(r#"{"time":["/captured_at"]}"#).expect("spec");
        assert_eq!(a.digest(), b.digest());
    }
}

//! Record parameters of the JSON record-coordinates extension (`json-record-coordinates-v1`,
//! extensions.md §8): the record-aware read selectors (§8.6), the `?record=n` target of
//! snapshot publish and retention (§3.1, §4.1) and the `Stream-Record-Match` append
//! precondition (§8.4). Pure parsing: resolving a record against a stream is the server's.

use crate::query::Query;

/// Where a record-aware read starts (§8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStart {
    /// `record=<r>`.
    At(u64),
    /// `record=now`, or `tail_records=0`.
    Now,
    /// `tail_records=<k>` with `k >= 1`.
    Tail(u64),
}

/// The record-aware parameters of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordParams {
    pub start: RecordStart,
    /// `max_records=<m>`, `m >= 1`.
    pub max_records: Option<u64>,
    /// `record_view=envelope`.
    pub envelope: bool,
}

/// 1-20 ASCII digits that fit a u64 (no sign, no spaces).
fn parse_u64(v: &str) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The record-aware parameters of a read (§8.6), if any, or why they are a `400`. `json`
/// says whether the stream is a JSON stream (record parameters on other streams are an
/// error).
pub fn parse_record_params(
    query: &Query,
    json: bool,
) -> Result<Option<RecordParams>, &'static str> {
    let record = query.get_unique("record")?;
    let tail = query.get_unique("tail_records")?;
    let max_records = query.get_unique("max_records")?;
    let view = query.get_unique("record_view")?;
    let start = match (record, tail) {
        (None, None) => {
            if max_records.is_some() {
                return Err("max_records needs record or tail_records");
            }
            if view.is_some() {
                return Err("record_view needs record or tail_records");
            }
            return Ok(None);
        }
        _ if !json => {
            return Err("record coordinates are only available on application/json streams")
        }
        (Some(_), Some(_)) => return Err("record and tail_records are exclusive"),
        _ if query.contains("offset") => {
            return Err("a record-aware read cannot also give an offset")
        }
        _ if query.contains("max_bytes") => {
            return Err("record-aware reads are bounded by max_records, not max_bytes")
        }
        (Some("now"), None) => RecordStart::Now,
        (Some(r), None) => RecordStart::At(parse_u64(r).ok_or("record must be an integer or now")?),
        (None, Some(k)) => match parse_u64(k).ok_or("tail_records must be an integer >= 0")? {
            0 => RecordStart::Now,
            k => RecordStart::Tail(k),
        },
    };
    let max_records = match max_records {
        Some(m) => match parse_u64(m) {
            Some(m) if m >= 1 => Some(m),
            _ => return Err("max_records must be an integer >= 1"),
        },
        None => None,
    };
    let envelope = match view {
        None => false,
        Some("envelope") => true,
        Some(_) => return Err("record_view must be envelope"),
    };
    Ok(Some(RecordParams {
        start,
        max_records,
        envelope,
    }))
}

/// The value of a `?record=n` snapshot/retention target (§3.1, §4.1): an unsigned decimal
/// record ordinal.
pub fn parse_record_ordinal(v: &str) -> Result<u64, &'static str> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err("record must be an unsigned integer");
    }
    v.parse().map_err(|_| "record out of range")
}

/// The value of a `Stream-Record-Match` header (§8.4): an unsigned decimal integer, else
/// `None` (a `400`).
pub fn parse_record_match(v: &str) -> Option<u64> {
    match v.parse::<u64>() {
        Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::parse_query;

    fn p(q: &str) -> Result<Option<RecordParams>, &'static str> {
        parse_record_params(&parse_query(q).expect("query"), true)
    }

    #[test]
    fn read_parameters() {
        assert_eq!(p(""), Ok(None));
        assert_eq!(p("offset=-1&max_bytes=5"), Ok(None));
        assert_eq!(
            p("record=42&max_records=100"),
            Ok(Some(RecordParams {
                start: RecordStart::At(42),
                max_records: Some(100),
                envelope: false
            }))
        );
        assert_eq!(
            p("record=now").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Now))
        );
        assert_eq!(
            p("tail_records=0").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Now))
        );
        assert_eq!(
            p("tail_records=18446744073709551615").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Tail(u64::MAX)))
        );
        assert_eq!(
            p("record=1&record_view=envelope&live=sse").map(|o| o.map(|r| r.envelope)),
            Ok(Some(true))
        );
        // Percent-encoded names and values are decoded before they are looked at.
        assert_eq!(
            p("%72ecord=%37").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::At(7)))
        );
        for bad in [
            "record=0&offset=5",
            "record=1&tail_records=2",
            "max_records=3",
            "record_view=envelope",
            "record=1&max_records=0",
            "record=1&max_records=x",
            "record=1&record_view=raw",
            "record=1&record_view=",
            "record=1&max_bytes=10",
            "record=-1",
            "record=+1",
            "record= 1",
            "record=1.5",
            "record=",
            "record=NOW",
            "record=18446744073709551616",
            "record=000000000000000000001",
            "tail_records=-2",
            "tail_records=now",
            "record=1&record=2",
            "max_records=1&max_records=2&record=1",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let q = parse_query("record=1").expect("query");
        assert!(parse_record_params(&q, false).is_err());
        let q = parse_query("offset=5").expect("query");
        assert_eq!(parse_record_params(&q, false), Ok(None));
    }

    #[test]
    fn ordinals_and_record_match() {
        assert_eq!(parse_record_ordinal("0"), Ok(0));
        assert_eq!(parse_record_ordinal("007"), Ok(7));
        assert_eq!(parse_record_ordinal("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_record_ordinal("18446744073709551616"),
            Err("record out of range")
        );
        for bad in ["", "-1", "+1", " 1", "1 ", "now", "1e3"] {
            assert_eq!(
                parse_record_ordinal(bad),
                Err("record must be an unsigned integer"),
                "{bad:?}"
            );
        }
        assert_eq!(parse_record_match("42"), Some(42));
        assert_eq!(parse_record_match("0"), Some(0));
        for bad in ["", "+4", "-4", " 4", "4 ", "18446744073709551616", "x"] {
            assert_eq!(parse_record_match(bad), None, "{bad:?}");
        }
    }
}

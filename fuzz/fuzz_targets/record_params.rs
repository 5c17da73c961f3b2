//! Record parameters of the JSON record-coordinates extension (extensions.md §8.4, §8.6,
//! §3.1/§4.1), against a reference written from the spec's tables: for every query string
//! (on a JSON stream and on a non-JSON one) both must agree on accept/refuse and on the
//! parsed selector, and an accepted selector must round-trip through its canonical query.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ursula_protocol::query::{parse_query, Query};
use ursula_protocol::records::{
    parse_record_match, parse_record_ordinal, parse_record_params, RecordParams, RecordStart,
};

/// Unsigned decimal of 1-20 digits that fits a u64, computed digit by digit.
fn decimal(v: &str) -> Option<u64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for b in v.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// `Err(())`: the request is a 400.
fn reference(q: &Query, json: bool) -> Result<Option<RecordParams>, ()> {
    let values = |k: &str| -> Vec<&str> {
        q.pairs()
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let (record, tail, max, view) = (
        values("record"),
        values("tail_records"),
        values("max_records"),
        values("record_view"),
    );
    if [&record, &tail, &max, &view].iter().any(|v| v.len() > 1) {
        return Err(());
    }
    if record.is_empty() && tail.is_empty() {
        // max_records / record_view without a record-aware start.
        return if max.is_empty() && view.is_empty() {
            Ok(None)
        } else {
            Err(())
        };
    }
    if !json || (!record.is_empty() && !tail.is_empty()) {
        return Err(());
    }
    if q.pairs()
        .iter()
        .any(|(k, _)| k == "offset" || k == "max_bytes")
    {
        return Err(());
    }
    let start = if let Some(r) = record.first() {
        if *r == "now" {
            RecordStart::Now
        } else {
            RecordStart::At(decimal(r).ok_or(())?)
        }
    } else {
        match decimal(tail[0]).ok_or(())? {
            0 => RecordStart::Now,
            k => RecordStart::Tail(k),
        }
    };
    let max_records = match max.first() {
        None => None,
        Some(m) => Some(decimal(m).filter(|m| *m >= 1).ok_or(())?),
    };
    let envelope = match view.first() {
        None => false,
        Some(&"envelope") => true,
        Some(_) => return Err(()),
    };
    Ok(Some(RecordParams {
        start,
        max_records,
        envelope,
    }))
}

fn canonical(p: &RecordParams) -> String {
    let mut q = match p.start {
        RecordStart::At(r) => format!("record={r}"),
        RecordStart::Now => "record=now".to_string(),
        RecordStart::Tail(k) => format!("tail_records={k}"),
    };
    if let Some(m) = p.max_records {
        q.push_str(&format!("&max_records={m}"));
    }
    if p.envelope {
        q.push_str("&record_view=envelope");
    }
    q
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    if let Ok(q) = parse_query(s) {
        for json in [true, false] {
            let got = parse_record_params(&q, json);
            if let Err(why) = got {
                assert!(!why.is_empty());
            }
            assert_eq!(
                got.map_err(|_| ()),
                reference(&q, json),
                "{s:?} json={json}"
            );
            if let Ok(Some(p)) = got {
                assert!(
                    json,
                    "record parameters accepted on a non-JSON stream: {s:?}"
                );
                assert!(p.max_records != Some(0));
                assert!(
                    p.start != RecordStart::Tail(0),
                    "tail_records=0 is record=now"
                );
                let text = canonical(&p);
                let again = parse_query(&text).expect("canonical query parses");
                assert_eq!(
                    parse_record_params(&again, true),
                    Ok(Some(p)),
                    "{s:?} -> {text:?}"
                );
            }
        }
    }

    // The `?record=n` target and the Stream-Record-Match header: unsigned decimal, any
    // number of digits as long as the value fits a u64.
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let value = digits.then(|| {
        s.bytes().try_fold(0u64, |n, b| {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
    });
    match parse_record_ordinal(s) {
        Ok(n) => assert_eq!(value, Some(Some(n)), "{s:?}"),
        Err("record out of range") => assert_eq!(value, Some(None), "{s:?}"),
        Err(_) => assert_eq!(value, None, "{s:?}"),
    }
    assert_eq!(parse_record_match(s), parse_record_ordinal(s).ok(), "{s:?}");
});

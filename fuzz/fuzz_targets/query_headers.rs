//! Query and header value grammars. Each accepted value must round-trip through its
//! canonical spelling, so two clients can never mean different things with one value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ursula_protocol::content_type::{is_json, media_type, normalize, same_media_type};
use ursula_protocol::cursor::parse_cursor;
use ursula_protocol::etag::if_none_match_matches;
use ursula_protocol::headers::{
    format_rfc3339_millis, is_closed_true, parse_expires_at, parse_fork_sub_offset, parse_producer,
    parse_producer_int, parse_stream_seq, parse_ttl, MAX_SAFE_INTEGER,
};
use ursula_protocol::offset::{
    format_offset, parse_fork_offset, parse_offset, OffsetError, OffsetParam,
};
use ursula_protocol::query::{
    parse_live, parse_max_bytes, parse_query, parse_timeout_ms, percent_decode, MAX_READ_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    if let Ok(q) = parse_query(s) {
        for (k, _) in q.pairs() {
            // Repeats are refused by get_unique, never silently merged.
            let n = q.pairs().iter().filter(|(k2, _)| k2 == k).count();
            assert_eq!(q.get_unique(k).is_err(), n > 1);
            assert!(q.get(k).is_some());
        }
    }
    if let Ok(d) = percent_decode(s) {
        assert!(d.len() <= s.len());
        if !s.contains('%') {
            assert_eq!(d, s);
        }
    }

    match parse_offset(s) {
        Ok(OffsetParam::At(n)) => {
            assert!(s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()));
            assert_eq!(parse_offset(&format_offset(n)), Ok(OffsetParam::At(n)));
        }
        Ok(OffsetParam::Start) => assert_eq!(s, "-1"),
        Ok(OffsetParam::Now) => assert_eq!(s, "now"),
        Err(OffsetError::OutOfRange) => {
            assert!(s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()));
        }
        Err(OffsetError::Syntax) => {}
    }
    if let Ok(n) = parse_fork_offset(s) {
        assert_eq!(parse_fork_offset(&format_offset(n)), Ok(n));
    }
    for parse in [parse_ttl, parse_fork_sub_offset] {
        if let Ok(n) = parse(s) {
            assert_eq!(n.to_string(), s.trim(), "one spelling per value");
        }
    }
    if let Ok(n) = parse_producer_int(s) {
        assert!(n <= MAX_SAFE_INTEGER);
        let t = s.trim();
        assert!(t.bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(t.trim_start_matches('0').parse::<u64>().unwrap_or(0), n);
    }
    let mut fields = s.splitn(3, '\n');
    let (id, epoch, seq) = (fields.next(), fields.next(), fields.next());
    if let Ok(Some(p)) = parse_producer(id, epoch, seq) {
        assert!(!p.id.is_empty() && p.id.len() <= 256);
        assert!(p.epoch <= MAX_SAFE_INTEGER && p.seq <= MAX_SAFE_INTEGER);
    }
    if let Ok(Some(seq)) = parse_stream_seq(Some(s)) {
        assert!(!seq.is_empty() && seq.len() <= 1024);
    }
    let _ = is_closed_true(Some(s));

    if let Ok(ms) = parse_expires_at(s) {
        // The canonical rendering must parse back to the same instant.
        let text = format_rfc3339_millis(ms);
        assert_eq!(parse_expires_at(&text), Ok(ms), "{s:?} -> {text:?}");
    }

    if let Ok(n) = parse_max_bytes(s) {
        assert!((1..=MAX_READ_BYTES).contains(&n));
    }
    let _ = parse_live(s);
    if let Some(t) = parse_timeout_ms(s) {
        assert!((1..=60_000).contains(&t));
    }
    let _ = parse_cursor(s);
    let _ = if_none_match_matches(s, "\"abc\"");

    if let Ok(ct) = normalize(s) {
        assert_eq!(
            normalize(&ct).as_deref(),
            Ok(ct.as_str()),
            "normalize is idempotent"
        );
        assert!(same_media_type(&ct, s));
        assert_eq!(is_json(&ct), is_json(s));
        assert!(!media_type(&ct).is_empty());
    }
});

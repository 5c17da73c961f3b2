//! JSON normalisation. Whatever the validator accepts must mean exactly what the input
//! meant: every canonical message, parsed by sonic-rs, equals the corresponding value of
//! the input parsed by sonic-rs. Canonical messages are single NDJSON lines, are fixed
//! points of canonicalisation, and render back into an array equal to the input's.
//!
//! The same input read as NDJSON (`canonicalize_lines`): every line that is not blank is
//! one message, exactly what the line alone canonicalises to as the single element of an
//! array; the first line that is not is the one named, and nothing before it is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sonic_rs::{JsonContainerTrait, Value};
use ursula_protocol::json::{
    canonicalize, canonicalize_lines, render_array, JsonError, LinesError, MAX_DEPTH,
};

fn sonic(b: &[u8]) -> Option<Value> {
    sonic_rs::from_slice::<Value>(b).ok()
}

/// Nesting that could exceed MAX_DEPTH, counted without parsing (brackets in strings
/// count too, which only makes the bound looser).
fn maybe_too_deep(b: &[u8]) -> bool {
    b.iter().filter(|&&c| c == b'[' || c == b'{').count() > MAX_DEPTH
}

/// RFC 8259 requires four hex digits after `\u`, and we refuse lone surrogates; sonic-rs's
/// skip path checks neither.
fn has_bad_u_escape(b: &[u8]) -> bool {
    // Each `\u` escape needs four hex digits, and a high surrogate must be followed at
    // once by an escaped low one (and a low one preceded by a high one).
    let mut i = 0;
    let mut high_pending = false;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'u') {
            let unit = b.get(i + 2..i + 6).and_then(|h| {
                h.iter()
                    .try_fold(0u32, |v, &c| Some(v << 4 | char::from(c).to_digit(16)?))
            });
            let Some(unit) = unit else {
                return true;
            };
            let low = (0xDC00..0xE000).contains(&unit);
            if high_pending != low {
                return true;
            }
            high_pending = (0xD800..0xDC00).contains(&unit);
            i += 6;
        } else if high_pending {
            return true;
        } else {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
    }
    high_pending
}

/// The canonical message of one NDJSON line, as the only element of an array (so a line
/// holding an array stays one message); `None` if the line is not exactly one JSON value.
fn line_alone(line: &[u8]) -> Option<Vec<u8>> {
    let mut wrapped = b"[".to_vec();
    wrapped.extend_from_slice(line);
    wrapped.push(b']');
    let c = canonicalize(&wrapped, false).ok()?;
    (c.message_lens.len() == 1).then_some(c.bytes)
}

fn check_lines(body: &[u8]) {
    let blank = |l: &&[u8]| l.iter().all(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'));
    let lines: Vec<(usize, &[u8])> = body
        .split(|&c| c == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !blank(l))
        .collect();
    match canonicalize_lines(body) {
        Ok(c) => {
            let messages: Vec<&[u8]> = c.messages().collect();
            assert_eq!(messages.len(), lines.len(), "one message per line");
            for ((n, line), m) in lines.iter().zip(&messages) {
                if let Some(alone) = line_alone(line) {
                    assert_eq!(alone, *m, "line {n}");
                } else {
                    // Wrapping adds a level: a line at the depth bound is fine alone.
                    assert!(maybe_too_deep(line), "line {n} accepted, invalid alone");
                }
            }
        }
        Err(LinesError::Invalid { line }) => {
            for (n, l) in &lines {
                if *n < line {
                    assert!(line_alone(l).is_some() || maybe_too_deep(l), "line {n} refused");
                } else {
                    let bad = lines.iter().find(|(k, _)| *k == line).expect("a line");
                    assert!(line_alone(bad.1).is_none(), "line {line} is valid alone");
                    break;
                }
            }
        }
        Err(LinesError::Empty) => assert!(lines.is_empty(), "lines with values"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    check_lines(body);
    let allow_empty = flags & 1 == 1;
    let result = canonicalize(body, allow_empty);
    let grammatical =
        sonic_rs::from_slice::<serde::de::IgnoredAny>(body).is_ok() && !has_bad_u_escape(body);

    let canon = match result {
        Ok(c) => c,
        Err(JsonError::EmptyArray) => {
            assert!(!allow_empty);
            let v = sonic(body).expect("an empty array is valid JSON");
            assert!(v.as_array().is_some_and(|a| a.is_empty()));
            return;
        }
        Err(JsonError::Invalid) => {
            assert!(
                !grammatical || maybe_too_deep(body),
                "refused valid JSON {:?}",
                String::from_utf8_lossy(body)
            );
            return;
        }
    };
    assert!(
        grammatical,
        "accepted invalid JSON {:?}",
        String::from_utf8_lossy(body)
    );
    assert_eq!(
        canon
            .message_lens
            .iter()
            .map(|&l| l as usize)
            .sum::<usize>(),
        canon.bytes.len()
    );
    let messages: Vec<&[u8]> = canon.messages().collect();
    for m in &messages {
        let (last, line) = m.split_last().expect("non-empty message");
        assert_eq!(*last, b'\n');
        assert!(!line.contains(&b'\n'), "LF inside a message breaks NDJSON");
        assert!(!line.is_empty());
        // A fixed point: wrapping it in an array (flattened once) gives it back.
        let mut wrapped = b"[".to_vec();
        wrapped.extend_from_slice(line);
        wrapped.push(b']');
        let again = canonicalize(&wrapped, false).expect("a canonical message is valid");
        assert_eq!(again.bytes, *m);
    }
    // Meaning is preserved, where sonic-rs's DOM can represent the value (it refuses lone
    // surrogates and out-of-range numbers, which are kept byte-for-byte).
    let Some(input) = sonic(body) else { return };
    let parsed: Vec<Option<Value>> = messages.iter().map(|m| sonic(&m[..m.len() - 1])).collect();
    match input.as_array() {
        Some(items) => {
            assert_eq!(items.len(), messages.len(), "an array flattens one level");
            for (item, m) in items.iter().zip(&parsed) {
                assert_eq!(Some(item), m.as_ref());
            }
            let rendered = render_array(&messages);
            assert_eq!(sonic(&rendered).as_ref(), Some(&input));
        }
        None => {
            assert_eq!(messages.len(), 1);
            assert_eq!(parsed[0].as_ref(), Some(&input));
        }
    }
});

//! JSON normalisation. Whatever the validator accepts must mean exactly what the input
//! meant: every canonical message, parsed by sonic-rs, equals the corresponding value of
//! the input parsed by sonic-rs. Canonical messages are single NDJSON lines, are fixed
//! points of canonicalisation, and render back into an array equal to the input's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sonic_rs::{JsonContainerTrait, Value};
use ursula_protocol::json::{canonicalize, render_array, JsonError, MAX_DEPTH};

fn sonic(b: &[u8]) -> Option<Value> {
    sonic_rs::from_slice::<Value>(b).ok()
}

/// Nesting that could exceed MAX_DEPTH, counted without parsing (brackets in strings
/// count too, which only makes the bound looser).
fn maybe_too_deep(b: &[u8]) -> bool {
    b.iter().filter(|&&c| c == b'[' || c == b'{').count() > MAX_DEPTH
}

/// RFC 8259 requires four hex digits after `\u`; sonic-rs's skip path does not check.
fn has_bad_u_escape(b: &[u8]) -> bool {
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\\' {
            if b[i + 1] == b'u'
                && !b
                    .get(i + 2..i + 6)
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
            {
                return true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    false
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
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

//! Header repeats. A request head is built from fuzzed headers drawn from a vocabulary
//! of single-valued and list headers in any letter case. A head that repeats a
//! single-valued header must be refused as ambiguous, whatever its position and case; an
//! accepted head holds each single-valued header once, and `header` returns that value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ursula_protocol::http1::{parse_request_head, single_valued, HeadError};

const NAMES: [&str; 12] = [
    "Authorization",
    "Content-Type",
    "Content-Length",
    "Host",
    "Stream-TTL",
    "Stream-Seq",
    "Producer-Epoch",
    "Accept",
    "X-Forwarded-For",
    "Cookie",
    "Stream-Closed",
    "Producer-Id",
];

fuzz_target!(|data: &[u8]| {
    let mut head = String::from("POST /b/s HTTP/1.1\r\n");
    let mut sent: Vec<(String, String)> = Vec::new();
    for pair in data.chunks(2).take(24) {
        let pick = pair[0];
        let name = NAMES[usize::from(pick) % NAMES.len()];
        // High bits of the pick choose the case of each letter.
        let name: String = name
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if pick >> (4 + i % 4) & 1 == 1 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        let value = pair.get(1).map_or(0, |v| v % 100).to_string();
        head.push_str(&format!("{name}: {value}\r\n"));
        sent.push((name.to_ascii_lowercase(), value));
    }
    head.push_str("\r\n");

    let repeated = sent.iter().enumerate().any(|(i, (name, _))| {
        single_valued(name).is_some() && sent[i + 1..].iter().any(|(n, _)| n == name)
    });
    match parse_request_head(head.as_bytes()) {
        Ok(h) => {
            assert!(
                !repeated,
                "a repeated single-valued header was accepted: {head:?}"
            );
            for (name, value) in &sent {
                if single_valued(name).is_some() {
                    assert_eq!(h.header_count(name), 1);
                    assert_eq!(h.header(name), Some(value.as_str()));
                }
            }
        }
        Err(HeadError::Bad(why)) if why.starts_with("duplicate") => {
            assert!(repeated, "{why} without a repeat: {head:?}");
        }
        // No Host: refused for that only when nothing repeats, since repeats are found first.
        Err(e) => assert!(!repeated, "{e:?} for a head with a repeat: {head:?}"),
    }
});

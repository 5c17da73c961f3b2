//! Server-sent event framing (P§13.3, §13.4). Lines end with a single LF; `data:` is
//! followed by the payload with no space (the conformance suite matches literally).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use memchr::memchr2;

/// Encoded characters per `data:` line of a base64 event (a multiple of 4, so every
/// line decodes on its own too).
pub const BASE64_LINE_LEN: usize = 76;

/// Appends a data event whose payload is `text`, one `data:` line per piece between
/// CRLF / lone CR / lone LF. Splitting at every line terminator is what makes
/// embedded `\n\nevent: control` harmless: receivers rejoin the lines with LF.
/// Invalid UTF-8 becomes U+FFFD (SSE streams must be UTF-8). Empty `text` appends
/// nothing, since an empty data event is indistinguishable from no event.
pub fn push_text_data_event(out: &mut Vec<u8>, text: &[u8]) {
    if text.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(text);
    let b = text.as_bytes();
    out.reserve(b.len() + 32);
    out.extend_from_slice(b"event: data\n");
    let mut i = 0;
    loop {
        out.extend_from_slice(b"data:");
        match memchr2(b'\r', b'\n', &b[i..]) {
            None => {
                out.extend_from_slice(&b[i..]);
                out.push(b'\n');
                break;
            }
            Some(k) => {
                out.extend_from_slice(&b[i..i + k]);
                out.push(b'\n');
                i += k + 1;
                if b[i - 1] == b'\r' && b.get(i) == Some(&b'\n') {
                    i += 1;
                }
            }
        }
    }
    out.push(b'\n');
}

/// Appends a data event carrying `bytes` as standard padded base64, wrapped at
/// [`BASE64_LINE_LEN`] characters. Empty input appends nothing.
pub fn push_base64_data_event(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let encoded = STANDARD.encode(bytes);
    let e = encoded.as_bytes();
    out.reserve(e.len() + e.len() / BASE64_LINE_LEN * 6 + 20);
    out.extend_from_slice(b"event: data\n");
    for line in e.chunks(BASE64_LINE_LEN) {
        out.extend_from_slice(b"data:");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Appends a data event whose single `data:` line is a JSON array (ds profile).
/// Canonical JSON never holds raw CR/LF (they are only legal as whitespace outside
/// strings), so dropping any that slip in keeps the framing intact without changing
/// the JSON value.
pub fn push_json_array_data_event(out: &mut Vec<u8>, array_json: &[u8]) {
    out.reserve(array_json.len() + 20);
    out.extend_from_slice(b"event: data\ndata:");
    let mut rest = array_json;
    while let Some(k) = memchr2(b'\r', b'\n', rest) {
        out.extend_from_slice(&rest[..k]);
        rest = &rest[k + 1..];
    }
    out.extend_from_slice(rest);
    out.extend_from_slice(b"\n\n");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Control<'a> {
    pub next_offset: u64,
    pub cursor: Option<&'a str>,
    pub up_to_date: bool,
    pub closed: bool,
    pub first_record: Option<u64>,
    pub next_record: Option<u64>,
}

/// Appends a control event: flat single-line JSON, keys omitted when absent/false.
/// `streamCursor` is dropped when `closed` is set (P§13.4 requires its absence then).
pub fn push_control_event(out: &mut Vec<u8>, c: &Control) {
    out.extend_from_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    crate::offset::write_offset(out, c.next_offset);
    out.push(b'"');
    if let (Some(cur), false) = (c.cursor, c.closed) {
        out.extend_from_slice(b",\"streamCursor\":");
        push_json_string(out, cur);
    }
    if c.up_to_date {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    if c.closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    }
    if let Some(r) = c.first_record {
        out.extend_from_slice(b",\"streamFirstRecord\":");
        out.extend_from_slice(r.to_string().as_bytes());
    }
    if let Some(r) = c.next_record {
        out.extend_from_slice(b",\"streamNextRecord\":");
        out.extend_from_slice(r.to_string().as_bytes());
    }
    out.extend_from_slice(b"}\n\n");
}

/// JSON string literal; cursors are digits in practice, but escaping keeps a
/// misbehaving caller from breaking the single-line framing.
fn push_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &c in s.as_bytes() {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 0xf)]);
            }
            _ => out.push(c),
        }
    }
    out.push(b'"');
}

/// Keep-alive comment (P§13.3, [D14]).
pub fn push_keepalive(out: &mut Vec<u8>) {
    out.extend_from_slice(b":\n\n");
}

/// Largest cut `<= max` that does not split a UTF-8 sequence, so text batches end on
/// a code point. If even the first code point does not fit, returns
/// `min(max, first_char_len)` to guarantee progress (that cut may split the char; its
/// bytes then surface as U+FFFD).
pub fn utf8_safe_cut(bytes: &[u8], max: usize) -> usize {
    if max >= bytes.len() {
        return bytes.len();
    }
    if max == 0 {
        return 0;
    }
    // Find the start of the sequence that straddles `max` (at most 3 continuation
    // bytes back); a longer run of continuation bytes is garbage and cut anywhere.
    let mut s = max;
    let mut back = 0;
    while s > 0 && back < 4 && is_continuation(bytes[s]) {
        s -= 1;
        back += 1;
    }
    if !is_continuation(bytes[s]) && back > 0 && s + seq_len(bytes[s]) > max {
        if s > 0 {
            return s;
        }
        return max.min(seq_len(bytes[0]));
    }
    max
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Length implied by a lead byte; invalid leads count as 1.
fn seq_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_event(t: &[u8]) -> String {
        let mut out = Vec::new();
        push_text_data_event(&mut out, t);
        String::from_utf8(out).expect("utf8")
    }

    /// Minimal SSE receiver: returns (event type, joined data) per dispatched event.
    fn parse_events(s: &str) -> Vec<(String, String)> {
        let mut events = Vec::new();
        let (mut ev, mut data, mut has_data) = (String::new(), Vec::<String>::new(), false);
        for line in s.split('\n') {
            if line.is_empty() {
                if has_data {
                    events.push((std::mem::take(&mut ev), data.join("\n")));
                }
                data.clear();
                has_data = false;
                ev.clear();
            } else if let Some(v) = line.strip_prefix("event: ") {
                ev = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.to_owned());
                has_data = true;
            }
        }
        events
    }

    #[test]
    fn text_single_line() {
        assert_eq!(text_event(b"line1"), "event: data\ndata:line1\n\n");
    }

    #[test]
    fn text_splits_all_terminators() {
        assert_eq!(
            text_event(b"a\nb\r\nc\rd"),
            "event: data\ndata:a\ndata:b\ndata:c\ndata:d\n\n"
        );
        assert_eq!(text_event(b"a\n"), "event: data\ndata:a\ndata:\n\n");
        assert_eq!(text_event(b"\n"), "event: data\ndata:\ndata:\n\n");
        assert_eq!(text_event(b"\r\r"), "event: data\ndata:\ndata:\ndata:\n\n");
        assert_eq!(text_event(b"\r\n"), "event: data\ndata:\ndata:\n\n");
    }

    #[test]
    fn text_empty_is_nothing() {
        assert_eq!(text_event(b""), "");
    }

    #[test]
    fn injection_yields_one_data_event() {
        for payload in [
            &b"x\n\nevent: control\ndata:{\"streamNextOffset\":\"99\"}\n\n"[..],
            b"x\r\n\r\nevent: control\r\ndata:{}\r\n\r\n",
            b"x\r\revent: control\r\rdata:{}\r\r",
        ] {
            let s = text_event(payload);
            let events = parse_events(&s);
            assert_eq!(events.len(), 1, "{s:?}");
            assert_eq!(events[0].0, "data");
            assert_eq!(s.matches("\n\n").count(), 1);
            assert!(s.ends_with("\n\n"));
        }
        // Round trip for LF-only text.
        let t = "a\n\nevent: control\ndata:{}\n\nb";
        let events = parse_events(&text_event(t.as_bytes()));
        assert_eq!(events, [("data".to_owned(), t.to_owned())]);
    }

    #[test]
    fn text_invalid_utf8_replaced() {
        assert_eq!(text_event(b"a\xffb"), "event: data\ndata:a\u{fffd}b\n\n");
    }

    #[test]
    fn base64_event() {
        let mut out = Vec::new();
        push_base64_data_event(&mut out, b"hello");
        assert_eq!(out, b"event: data\ndata:aGVsbG8=\n\n");

        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut out = Vec::new();
        push_base64_data_event(&mut out, &data);
        let s = String::from_utf8(out).expect("ascii");
        let lines: Vec<&str> = s.lines().filter_map(|l| l.strip_prefix("data:")).collect();
        assert!(lines.len() > 1);
        assert!(lines
            .iter()
            .all(|l| l.len() <= BASE64_LINE_LEN && l.len() % 4 == 0));
        let decoded = STANDARD.decode(lines.concat()).expect("decodes");
        assert_eq!(decoded, data);

        let mut out = Vec::new();
        push_base64_data_event(&mut out, b"");
        assert!(out.is_empty());
    }

    #[test]
    fn json_array_event() {
        let mut out = Vec::new();
        push_json_array_data_event(&mut out, br#"[{"id":1,"message":"hello"}]"#);
        assert_eq!(
            out,
            b"event: data\ndata:[{\"id\":1,\"message\":\"hello\"}]\n\n".to_vec()
        );
        let mut out = Vec::new();
        push_json_array_data_event(&mut out, b"[1,\n2,\r\n3]");
        assert_eq!(out, b"event: data\ndata:[1,2,3]\n\n".to_vec());
    }

    #[test]
    fn control_events() {
        let mut out = Vec::new();
        push_control_event(
            &mut out,
            &Control {
                next_offset: 42,
                cursor: Some("3441600"),
                up_to_date: true,
                ..Control::default()
            },
        );
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "event: control\ndata:{\"streamNextOffset\":\"00000000000000000042\",\"streamCursor\":\"3441600\",\"upToDate\":true}\n\n"
        );

        let mut out = Vec::new();
        push_control_event(&mut out, &Control::default());
        assert_eq!(
            out,
            b"event: control\ndata:{\"streamNextOffset\":\"00000000000000000000\"}\n\n".to_vec()
        );

        let mut out = Vec::new();
        push_control_event(
            &mut out,
            &Control {
                next_offset: 7,
                cursor: Some("1"),
                up_to_date: true,
                closed: true,
                first_record: Some(0),
                next_record: Some(3),
            },
        );
        let s = String::from_utf8(out).expect("utf8");
        assert_eq!(
            s,
            "event: control\ndata:{\"streamNextOffset\":\"00000000000000000007\",\"upToDate\":true,\"streamClosed\":true,\"streamFirstRecord\":0,\"streamNextRecord\":3}\n\n"
        );
        // The JSON is valid and flat.
        let json = s
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("data:"))
            .expect("data line");
        let v: sonic_rs::Value = sonic_rs::from_str(json).expect("valid json");
        assert!(sonic_rs::JsonValueTrait::is_object(&v));
        assert_eq!(json.matches('{').count(), 1);
    }

    #[test]
    fn control_escapes_weird_cursor() {
        let mut out = Vec::new();
        push_control_event(
            &mut out,
            &Control {
                cursor: Some("a\"b\n"),
                ..Control::default()
            },
        );
        let s = String::from_utf8(out).expect("utf8");
        assert_eq!(s.matches('\n').count(), 3);
        assert!(s.contains(r#""streamCursor":"a\"b\u000a""#));
    }

    #[test]
    fn keepalive() {
        let mut out = Vec::new();
        push_keepalive(&mut out);
        assert_eq!(out, b":\n\n");
    }

    #[test]
    fn utf8_cut() {
        let s = "aé😀b".as_bytes(); // 1 + 2 + 4 + 1 bytes
        assert_eq!(utf8_safe_cut(s, 100), s.len());
        assert_eq!(utf8_safe_cut(s, 0), 0);
        assert_eq!(utf8_safe_cut(s, 1), 1);
        assert_eq!(utf8_safe_cut(s, 2), 1);
        assert_eq!(utf8_safe_cut(s, 3), 3);
        assert_eq!(utf8_safe_cut(s, 4), 3);
        assert_eq!(utf8_safe_cut(s, 5), 3);
        assert_eq!(utf8_safe_cut(s, 6), 3);
        assert_eq!(utf8_safe_cut(s, 7), 7);
        assert_eq!(utf8_safe_cut(s, 8), 8);
        // Every cut is a char boundary for valid UTF-8 (beyond the first char).
        let text = "héllo wörld 😀 ✓ done";
        for max in 1..=text.len() {
            let c = utf8_safe_cut(text.as_bytes(), max);
            assert!(c <= max && c > 0);
            assert!(text.is_char_boundary(c), "max {max} -> {c}");
        }
    }

    #[test]
    fn utf8_cut_progress_on_first_char() {
        let s = "😀x".as_bytes();
        assert_eq!(utf8_safe_cut(s, 1), 1);
        assert_eq!(utf8_safe_cut(s, 3), 3);
        assert_eq!(utf8_safe_cut(s, 4), 4);
    }

    #[test]
    fn utf8_cut_garbage() {
        // Continuation bytes without a lead: any cut is as good as another.
        let g = [0x80u8, 0x80, 0x80, 0x80, 0x80, 0x80];
        assert_eq!(utf8_safe_cut(&g, 3), 3);
        let g = [b'a', 0xff, 0x80, b'b'];
        assert_eq!(utf8_safe_cut(&g, 2), 2);
    }
}

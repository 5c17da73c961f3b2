//! A write's body as stored: canonical NDJSON for JSON streams (one message per line, so
//! reads can cut whole messages), the bytes as sent otherwise, once checked against what
//! its stream holds.

use bytes::Bytes;
use ursula_protocol::content_type::{is_json, is_ndjson, is_text, non_utf8_charset};
use ursula_protocol::json::LinesError;

use crate::http::ApiError;
use crate::surface::Surface;

/// How a write's body is checked, by the content type it is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// `application/json`: one JSON text (an array is its messages), stored canonical.
    Json,
    /// `application/x-ndjson` written to an `application/json` stream: every line that is
    /// not blank is one message, stored canonical like a JSON message.
    JsonLines,
    /// `text/*`: UTF-8 only, so every view of the stream (SSE included, which carries text
    /// as text) holds exactly the stored bytes.
    Text,
    /// Anything else: any bytes.
    Bytes,
}

impl PayloadKind {
    /// The kind of a normalised content type. A text type whose charset is not UTF-8 is
    /// refused (415): its bytes could not be served as text unchanged.
    pub fn of(content_type: &str) -> Result<PayloadKind, ApiError> {
        if is_json(content_type) {
            Ok(PayloadKind::Json)
        } else if !is_text(content_type) {
            Ok(PayloadKind::Bytes)
        } else if non_utf8_charset(content_type).is_some() {
            Err(ApiError::UnsupportedCharset)
        } else {
            Ok(PayloadKind::Text)
        }
    }

    /// The kind of an append's body: as its own content type says, except NDJSON written
    /// to a JSON stream of the bucketed surface, whose lines become the stream's messages
    /// (the compat surface keeps the base protocol, where the types must match). The
    /// stream is asked whether it is a JSON stream only for an NDJSON body. `true` with
    /// the kind: the request's type counts as the stream's.
    pub fn of_append(
        surface: Surface,
        request_type: &str,
        stream_is_json: impl FnOnce() -> Option<bool>,
    ) -> Result<(PayloadKind, bool), ApiError> {
        if surface == Surface::Bucketed && is_ndjson(request_type) && stream_is_json() == Some(true)
        {
            return Ok((PayloadKind::JsonLines, true));
        }
        Ok((PayloadKind::of(request_type)?, false))
    }
}

/// Body of a write as stored: canonical NDJSON for JSON streams, raw bytes otherwise.
#[derive(Default)]
pub struct Payload {
    pub data: Bytes,
    pub msg_lens: Vec<u32>,
}

pub fn payload(
    kind: PayloadKind,
    body: Bytes,
    allow_empty_array: bool,
) -> Result<Payload, ApiError> {
    if body.is_empty() {
        return Ok(Payload {
            data: Bytes::new(),
            msg_lens: Vec::new(),
        });
    }
    if kind == PayloadKind::Text && simdutf8::basic::from_utf8(&body).is_err() {
        return Err(ApiError::InvalidText);
    }
    if kind == PayloadKind::JsonLines {
        return match ursula_protocol::json::canonicalize_lines(&body) {
            Ok(c) => Ok(Payload {
                data: Bytes::from(c.bytes),
                msg_lens: c.message_lens,
            }),
            Err(LinesError::Invalid { line }) => Err(ApiError::InvalidJsonLine(line)),
            Err(LinesError::Empty) => Err(ApiError::EmptyBody(
                "an NDJSON append needs a line holding a JSON value",
            )),
        };
    }
    if kind != PayloadKind::Json {
        let len = body.len() as u32;
        return Ok(Payload {
            data: body,
            msg_lens: vec![len],
        });
    }
    // A body no one else holds (a request's own, not a frame of an append batch) that is
    // a compact array becomes its own canonical form, saving a copy of every byte: the
    // usual shape of a large telemetry batch.
    let body = match body.try_into_mut() {
        Ok(mut owned) => {
            match ursula_protocol::json::canonicalize_in_place(&mut owned, allow_empty_array) {
                Ok(Some(c)) => {
                    return Ok(Payload {
                        data: owned.freeze().slice(c.range),
                        msg_lens: c.message_lens,
                    })
                }
                Ok(None) => owned.freeze(),
                Err(e) => return Err(json_error(e)),
            }
        }
        Err(shared) => shared,
    };
    match ursula_protocol::json::canonicalize(&body, allow_empty_array) {
        Ok(c) => Ok(Payload {
            data: Bytes::from(c.bytes),
            msg_lens: c.message_lens,
        }),
        Err(e) => Err(json_error(e)),
    }
}

fn json_error(e: ursula_protocol::json::JsonError) -> ApiError {
    match e {
        ursula_protocol::json::JsonError::EmptyArray => ApiError::EmptyJsonArray,
        ursula_protocol::json::JsonError::Invalid => ApiError::InvalidJson,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(p: Result<Payload, ApiError>) -> Payload {
        match p {
            Ok(p) => p,
            Err(e) => panic!("refused with {e:?}"),
        }
    }

    #[test]
    fn a_compact_array_body_becomes_its_own_payload() {
        let body = Bytes::from(br#"[{"a":1},"b",[2]]"#.to_vec());
        let start = body.as_ptr() as usize;
        let p = ok(payload(PayloadKind::Json, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
        // Rewritten where it arrived: the payload starts just after the `[`.
        assert_eq!(p.data.as_ptr() as usize, start + 1);
    }

    #[test]
    fn shared_or_spaced_bodies_take_the_copying_path_to_the_same_payload() {
        let body = Bytes::from(br#"[{"a":1},"b",[2]]"#.to_vec());
        let held = body.clone();
        let p = ok(payload(PayloadKind::Json, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(
            &held[..],
            br#"[{"a":1},"b",[2]]"#,
            "a shared body is not touched"
        );

        let spaced = Bytes::from(br#"[ {"a": 1}, "b", [2] ]"#.to_vec());
        let p = ok(payload(PayloadKind::Json, spaced, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
    }

    #[test]
    fn text_bodies_are_utf8_and_text_types_have_no_other_charset() {
        let latin1 = Bytes::from_static(b"caf\xe9");
        let r = payload(PayloadKind::Text, latin1.clone(), false).err();
        assert_eq!(r.map(|r| r.status()), Some(400));
        let bytes = ok(payload(PayloadKind::Bytes, latin1, false));
        assert_eq!(&bytes.data[..], b"caf\xe9");
        let utf8 = ok(payload(PayloadKind::Text, Bytes::from("café"), false));
        assert_eq!(utf8.msg_lens, vec![5]);

        assert_eq!(PayloadKind::of("text/plain"), Ok(PayloadKind::Text));
        assert_eq!(
            PayloadKind::of("text/plain; charset=utf-8"),
            Ok(PayloadKind::Text)
        );
        assert_eq!(PayloadKind::of("application/json"), Ok(PayloadKind::Json));
        assert_eq!(
            PayloadKind::of("application/octet-stream; charset=latin1"),
            Ok(PayloadKind::Bytes)
        );
        let refused = PayloadKind::of("text/plain; charset=latin1").err();
        assert_eq!(refused.map(|e| e.status()), Some(415));
    }

    #[test]
    fn ndjson_lines_become_canonical_messages() {
        let body = Bytes::from_static(b"{\"a\": 1}\r\n\n[1, 2]\n\"s\"");
        let p = ok(payload(PayloadKind::JsonLines, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n[1,2]\n\"s\"\n");
        assert_eq!(p.msg_lens, vec![8, 6, 4]);
        let bad = payload(
            PayloadKind::JsonLines,
            Bytes::from_static(b"1\n{x}\n3\n"),
            false,
        );
        assert_eq!(bad.err(), Some(ApiError::InvalidJsonLine(2)));
        let blank = payload(PayloadKind::JsonLines, Bytes::from_static(b"\n \n"), false);
        assert_eq!(blank.err().map(|e| e.status()), Some(400));
    }

    #[test]
    fn ndjson_is_read_as_lines_only_on_bucketed_json_streams() {
        let nd = "application/x-ndjson";
        let kind = |surface, json| PayloadKind::of_append(surface, nd, || json);
        assert_eq!(
            kind(Surface::Bucketed, Some(true)),
            Ok((PayloadKind::JsonLines, true))
        );
        assert_eq!(
            kind(Surface::Bucketed, Some(false)),
            Ok((PayloadKind::Bytes, false))
        );
        assert_eq!(
            kind(Surface::Bucketed, None),
            Ok((PayloadKind::Bytes, false))
        );
        assert_eq!(
            kind(Surface::Compat, Some(true)),
            Ok((PayloadKind::Bytes, false))
        );
        // The stream is looked at only for NDJSON.
        let json = PayloadKind::of_append(Surface::Bucketed, "application/json", || {
            panic!("not needed")
        });
        assert_eq!(json, Ok((PayloadKind::Json, false)));
    }

    #[test]
    fn invalid_and_empty_json_bodies_are_refused() {
        for (body, status) in [(&b"[1,]"[..], 400), (b"[]", 400), (b"[1", 400)] {
            let r = payload(PayloadKind::Json, Bytes::from(body.to_vec()), false).err();
            assert_eq!(r.map(|r| r.status()), Some(status), "{body:?}");
        }
        let empty_put = ok(payload(PayloadKind::Json, Bytes::from_static(b"[]"), true));
        assert!(empty_put.data.is_empty() && empty_put.msg_lens.is_empty());
    }
}

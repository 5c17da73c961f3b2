//! A write's body as stored: canonical NDJSON for JSON streams (one message per line, so
//! reads can cut whole messages), the bytes as sent otherwise.

use bytes::Bytes;

use crate::http::ApiError;

/// Body of a write as stored: canonical NDJSON for JSON streams, raw bytes otherwise.
pub struct Payload {
    pub data: Bytes,
    pub msg_lens: Vec<u32>,
}

pub fn payload(json: bool, body: Bytes, allow_empty_array: bool) -> Result<Payload, ApiError> {
    if body.is_empty() {
        return Ok(Payload {
            data: Bytes::new(),
            msg_lens: Vec::new(),
        });
    }
    if !json {
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
        let p = ok(payload(true, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
        // Rewritten where it arrived: the payload starts just after the `[`.
        assert_eq!(p.data.as_ptr() as usize, start + 1);
    }

    #[test]
    fn shared_or_spaced_bodies_take_the_copying_path_to_the_same_payload() {
        let body = Bytes::from(br#"[{"a":1},"b",[2]]"#.to_vec());
        let held = body.clone();
        let p = ok(payload(true, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(
            &held[..],
            br#"[{"a":1},"b",[2]]"#,
            "a shared body is not touched"
        );

        let spaced = Bytes::from(br#"[ {"a": 1}, "b", [2] ]"#.to_vec());
        let p = ok(payload(true, spaced, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
    }

    #[test]
    fn invalid_and_empty_json_bodies_are_refused() {
        for (body, status) in [(&b"[1,]"[..], 400), (b"[]", 400), (b"[1", 400)] {
            let r = payload(true, Bytes::from(body.to_vec()), false).err();
            assert_eq!(r.map(|r| r.status()), Some(status), "{body:?}");
        }
        let empty_put = ok(payload(true, Bytes::from_static(b"[]"), true));
        assert!(empty_put.data.is_empty() && empty_put.msg_lens.is_empty());
    }
}

//! Forks on the compat surface (P§17).
//!
//! A fork copies its source's history up to the fork point into its own log at creation, so
//! it shares the source's offsets without sharing storage across cores. The source keeps a
//! durable reference per fork (named by a token the fork chose) only so that deleting it
//! while forks live makes it soft-deleted (`410`/`409`) until the last fork goes, as the
//! protocol requires.
//!
//! In a cluster the source may be on a lane another host owns: the fork's host then asks
//! that host (`POST /__ursula/forks/take`, see `peer`) to do the source's part and send
//! the inherited history back. A call that ends without an answer saying what happened is
//! followed by giving the token back, so a reference taken for a fork that was never made
//! does not keep its source.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use ursula_protocol::content_type::{is_json, same_media_type};
use ursula_protocol::headers::parse_fork_sub_offset;
use ursula_protocol::offset::parse_fork_offset;
use ursula_storage::{AppendRec, Lifetime, NewStream, Offset, RecordNo};

use crate::core::Core;
use crate::ext::{Ext, ForkLink, Taken};
use crate::http::{ApiError, Handled, Refusal, Request, Response};
use crate::lookup::{find, Found};
use crate::payload::{payload, PayloadKind};
use crate::removal::{self, release};
use crate::routes::{route, Route};
use crate::surface::Surface;

pub struct ForkRequest {
    pub source: String,
    pub offset: Option<Offset>,
    /// Records (JSON) or bytes past `offset`.
    pub sub_offset: u64,
}

/// The fork headers of a PUT, if any (P§4.4, §17.3).
pub fn parse_request(req: &Request) -> Result<Option<ForkRequest>, ApiError> {
    let from = req.header("stream-forked-from");
    let offset = req.header("stream-fork-offset");
    let sub = req.header("stream-fork-sub-offset");
    let Some(from) = from else {
        if offset.is_some() || sub.is_some() {
            return Err(ApiError::InvalidHeader(
                "fork offsets need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let offset = match offset {
        Some(v) => {
            Some(Offset::new(parse_fork_offset(v).map_err(|_| {
                ApiError::InvalidOffset("invalid Stream-Fork-Offset")
            })?))
        }
        None => None,
    };
    let sub_offset = match sub {
        Some(v) => parse_fork_sub_offset(v)
            .map_err(|_| ApiError::InvalidOffset("invalid Stream-Fork-Sub-Offset"))?,
        None => 0,
    };
    // Accept a path or a same-origin absolute URL.
    let path = match from.find("://") {
        Some(i) => from[i + 3..].find('/').map_or("/", |j| &from[i + 3 + j..]),
        None => from,
    };
    let path = path.split('?').next().unwrap_or(path);
    let source = match route(path) {
        Route::Stream {
            surface: Surface::Compat,
            key,
        } => key,
        _ => String::new(),
    };
    Ok(Some(ForkRequest {
        source,
        offset,
        sub_offset,
    }))
}

/// Idempotent-create comparison of fork fields (P§17.5).
pub fn same_link(req: Option<&ForkRequest>, existing: Option<&ForkLink>) -> bool {
    match (req, existing) {
        (None, None) => true,
        (Some(r), Some(e)) => {
            r.source == e.source
                && r.sub_offset == e.sub_offset
                && (r.offset.is_none() || r.offset.map(Offset::get) == e.offset)
        }
        _ => false,
    }
}

/// What a fork inherits, taken (with a reference) on the source's core.
#[derive(Debug, Clone, PartialEq)]
struct Inherited {
    content_type: String,
    lifetime: Lifetime,
    incarnation: u64,
    data: Vec<Bytes>,
    append_lens: Vec<u32>,
    msg_lens: Vec<u32>,
}

pub async fn create(
    core: &Rc<Core>,
    key: &str,
    req: &Request,
    fork: ForkRequest,
    content_type: Option<String>,
    lifetime: Option<Lifetime>,
    closed: bool,
) -> Handled {
    if fork.source.is_empty() {
        return Err(ApiError::ForkSourceNotFound.into());
    }
    let token = reference_token();
    let ask = TakeAsk {
        source: fork.source.clone(),
        content_type: content_type.clone(),
        offset: fork.offset.map(Offset::get),
        sub_offset: fork.sub_offset,
        token: Some(token),
    };
    let inherited = match crate::lanes::serving_host(core, &ask.source).await? {
        None => take_here(core, ask).await?,
        Some(address) => match take_from(core, &address, &ask).await {
            Ok(inherited) => inherited,
            Err(TakeFailed::Refused(refusal)) => return Err(refusal.into()),
            Err(TakeFailed::Undecided(refusal)) => {
                // The source's host may have taken the reference and the answer got lost.
                removal::give_back_untaken(core, fork.source.clone(), token);
                return Err(refusal.into());
            }
        },
    };
    let link = ForkLink {
        source: fork.source.clone(),
        source_incarnation: inherited.incarnation,
        offset: fork.offset.map(Offset::get),
        sub_offset: fork.sub_offset,
        token: Some(token),
    };
    let result = build(core, key, req, &inherited, link.clone(), lifetime, closed).await;
    if result.is_err() {
        release(core, link).await;
    }
    result
}

/// What a fork asks of its source: the body of `POST /__ursula/forks/take`.
#[derive(serde::Serialize, serde::Deserialize)]
struct TakeAsk {
    source: String,
    /// The fork's content type, if it named one: it must be the source's.
    content_type: Option<String>,
    offset: Option<u64>,
    sub_offset: u64,
    /// Names the reference taken, so that giving it back, or taking it twice, is exact
    /// (absent from hosts that predate tokens: a plain count then).
    #[serde(default)]
    token: Option<u64>,
}

/// A new fork's reference token: unique among a source's references (64 random bits).
fn reference_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static TAKEN: AtomicU64 = AtomicU64::new(0);
    // `RandomState` is keyed from the OS's randomness; the counter and the clock make each
    // hash differ within one process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(TAKEN.fetch_add(1, Ordering::Relaxed));
    h.write_i64(ursula_storage::now_ms());
    h.finish()
}

/// Take the source's part on its owner core, on this host.
async fn take_here(core: &Rc<Core>, ask: TakeAsk) -> Result<Inherited, Refusal> {
    let owner = core.owner_of(&ask.source);
    let taken = core
        .on(owner, move |c| async move {
            let offset = ask.offset.map(Offset::new);
            let want = Wanted {
                content_type: ask.content_type,
                offset,
                sub: ask.sub_offset,
                token: ask.token,
            };
            take_source(&c, &ask.source, want).await
        })
        .await;
    taken.map_err(|_| ApiError::owner_unavailable())?
}

/// Why another host did not send a source's part, and the fork's refusal.
#[derive(Debug, PartialEq)]
enum TakeFailed {
    /// It answered with the source's refusal: nothing was taken.
    Refused(ApiError),
    /// No answer that says whether it took the reference (the call broke, or the answer
    /// was not one a take gives).
    Undecided(ApiError),
}

/// Ask the host at `address`, which owns the source's lane, to take the source's part.
async fn take_from(core: &Core, address: &str, ask: &TakeAsk) -> Result<Inherited, TakeFailed> {
    let body = Bytes::from(sonic_rs::to_vec(ask).unwrap_or_default());
    let answer = crate::peer::post(core, address, "/__ursula/forks/take", body)
        .await
        .map_err(|e| TakeFailed::Undecided(e.refusal()))?;
    if answer.status == 200 {
        return decode_inherited(answer.body).ok_or_else(|| {
            TakeFailed::Undecided(ApiError::BadGateway(
                "the fork source's host sent a malformed history".into(),
            ))
        });
    }
    Err(take_failure(&answer))
}

/// What a take's answer other than `200` says: the source's state refuses before anything
/// is taken (a 4xx); any other answer (a storage fault may come after the reference was
/// written, a lane moving may come after the take reached the old owner) leaves it open.
fn take_failure(answer: &crate::peer::Answer) -> TakeFailed {
    let refused = source_host_refusal(answer);
    if (400..500).contains(&answer.status) && !matches!(refused, ApiError::Unavailable(_)) {
        TakeFailed::Refused(refused)
    } else {
        TakeFailed::Undecided(refused)
    }
}

/// The refusal a fork gets for the source host's refusal (`code: reason` in its body):
/// the same refusal where the source's state decided it; otherwise a retry while the
/// source's lane moves, and a 502 for anything the fork's client cannot act on.
fn source_host_refusal(answer: &crate::peer::Answer) -> ApiError {
    let text = String::from_utf8_lossy(&answer.body);
    match text.split(':').next().unwrap_or_default() {
        "stream_not_found" => ApiError::ForkSourceNotFound,
        "stream_gone" => ApiError::ForkSourceGone,
        "content_type_mismatch" => {
            ApiError::ContentTypeMismatch("fork content type differs from the source's")
        }
        "invalid_offset" => ApiError::InvalidOffset("fork point is beyond the source"),
        "offset_not_aligned" => ApiError::OffsetNotAligned("fork offset inside a message"),
        "storage_fault" => ApiError::StorageFault("the fork source's host cannot read it"),
        _ => answer.refusal("/__ursula/forks/take"),
    }
}

/// `POST /__ursula/forks/take` on the host that owns the source's lane: take the source's
/// part for a fork on another host, and answer with the inherited history (see
/// [`encode_inherited`]) or the refusal a local fork would get.
pub async fn serve_take(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(ask) = sonic_rs::from_slice::<TakeAsk>(body) else {
        return ApiError::InvalidJson.response();
    };
    if let Err(refusal) = core.lanes.check(core.placement.shard_of(&ask.source)) {
        return crate::lanes::refusal(core, refusal).response();
    }
    match take_here(core, ask).await {
        Ok(inherited) => Response::new(200)
            .header("content-type", "application/octet-stream")
            .header("cache-control", "no-store")
            .with_body(encode_inherited(inherited)),
        Err(refusal) => refusal.response(),
    }
}

/// How an [`Inherited`] lifetime travels between hosts.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireLifetime {
    Forever,
    TtlSeconds(u64),
    ExpiresAtMs(i64),
}

/// Everything of an [`Inherited`] but its bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct WireInherited {
    content_type: String,
    lifetime: WireLifetime,
    incarnation: u64,
    append_lens: Vec<u32>,
    msg_lens: Vec<u32>,
}

/// An inherited history as it travels: the length of the JSON of everything but the bytes
/// (u32, little-endian), that JSON, then the bytes.
fn encode_inherited(i: Inherited) -> Vec<Bytes> {
    let wire = WireInherited {
        content_type: i.content_type,
        lifetime: match i.lifetime {
            Lifetime::Forever => WireLifetime::Forever,
            Lifetime::TtlSeconds(s) => WireLifetime::TtlSeconds(s),
            Lifetime::ExpiresAtMs(t) => WireLifetime::ExpiresAtMs(t),
        },
        incarnation: i.incarnation,
        append_lens: i.append_lens,
        msg_lens: i.msg_lens,
    };
    let json = sonic_rs::to_vec(&wire).unwrap_or_default();
    let mut head = Vec::with_capacity(4 + json.len());
    head.extend_from_slice(&(json.len() as u32).to_le_bytes());
    head.extend_from_slice(&json);
    let mut parts = vec![Bytes::from(head)];
    parts.extend(i.data);
    parts
}

/// The [`Inherited`] of [`encode_inherited`]'s bytes, if they are whole and consistent.
fn decode_inherited(raw: Bytes) -> Option<Inherited> {
    let len = u32::from_le_bytes(raw.get(..4)?.try_into().ok()?) as usize;
    let json = raw.get(4..4usize.checked_add(len)?)?;
    let wire: WireInherited = sonic_rs::from_slice(json).ok()?;
    let data = raw.slice(4 + len..);
    let total: u64 = wire.append_lens.iter().map(|&l| u64::from(l)).sum();
    if total != data.len() as u64 {
        return None;
    }
    Some(Inherited {
        content_type: wire.content_type,
        lifetime: match wire.lifetime {
            WireLifetime::Forever => Lifetime::Forever,
            WireLifetime::TtlSeconds(s) => Lifetime::TtlSeconds(s),
            WireLifetime::ExpiresAtMs(t) => Lifetime::ExpiresAtMs(t),
        },
        incarnation: wire.incarnation,
        data: if data.is_empty() {
            Vec::new()
        } else {
            vec![data]
        },
        append_lens: wire.append_lens,
        msg_lens: wire.msg_lens,
    })
}

async fn build(
    core: &Rc<Core>,
    key: &str,
    req: &Request,
    inherited: &Inherited,
    link: ForkLink,
    lifetime: Option<Lifetime>,
    closed: bool,
) -> Handled {
    let shard = core.shard_for(key)?;
    match find(core, key)? {
        Found::Absent => {}
        Found::Expired(id) => removal::remove_expired(core, id),
        Found::SoftDeleted | Found::Live(_) => {
            return Err(ApiError::StreamExists("stream was created concurrently").into())
        }
    }
    let own = PayloadKind::of(&inherited.content_type)
        .and_then(|kind| payload(kind, req.body.clone(), true))?;
    let total: usize = inherited.data.iter().map(|b| b.len()).sum::<usize>() + own.data.len();
    let mut data = BytesMut::with_capacity(total);
    for part in &inherited.data {
        data.extend_from_slice(part);
    }
    data.extend_from_slice(&own.data);
    let mut append_lens = inherited.append_lens.clone();
    let mut msg_lens = inherited.msg_lens.clone();
    if !own.data.is_empty() {
        append_lens.push(own.data.len() as u32);
        msg_lens.extend_from_slice(&own.msg_lens);
    }
    let ext = Ext {
        fork: Some(link),
        ..Default::default()
    };
    let spec = NewStream {
        meta: core.new_stream_meta(
            &shard,
            key,
            &inherited.content_type,
            lifetime.unwrap_or(inherited.lifetime),
            ext.encode(),
        ),
        initial: AppendRec {
            append_lens,
            msg_lens,
            data: data.freeze(),
            close: closed,
            ..Default::default()
        },
    };
    let (id, commit) = shard.create(spec)?;
    commit.durable().await?;
    let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
    let mut resp = Response::new(201)
        .header("content-type", s.content_type().to_string())
        .header(
            "stream-next-offset",
            ursula_protocol::offset::format_offset(s.next_offset().get()),
        )
        .header("stream-incarnation", s.incarnation().to_string())
        .header("cache-control", "no-store");
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    crate::handlers::headers::push_lifetime(&mut resp, s.lifetime());
    resp.push("location", req.path.clone());
    Ok(resp)
}

/// What a fork wants of its source.
struct Wanted {
    /// The fork's content type, if it named one.
    content_type: Option<String>,
    /// The fork point (`None`: the source's tail).
    offset: Option<Offset>,
    /// Records (JSON) or bytes past `offset`.
    sub: u64,
    /// The token to take the reference under.
    token: Option<u64>,
}

/// On the source's core: validate the fork point, copy the inherited history and take a
/// reference, all without an await in between.
async fn take_source(core: &Rc<Core>, key: &str, want: Wanted) -> Result<Inherited, Refusal> {
    let Wanted {
        content_type: wanted_type,
        offset,
        sub,
        token,
    } = want;
    let id = match find(core, key)? {
        Found::Absent | Found::Expired(_) => return Err(ApiError::ForkSourceNotFound.into()),
        Found::SoftDeleted => return Err(ApiError::ForkSourceGone.into()),
        Found::Live(id) => id,
    };
    let shard = core.shard(id)?;
    let inherited = {
        let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
        if let Some(t) = &wanted_type {
            if !same_media_type(t, s.content_type()) {
                return Err(ApiError::ContentTypeMismatch(
                    "fork content type differs from the source's",
                )
                .into());
            }
        }
        let tail = s.next_offset();
        let anchor = offset.unwrap_or(tail);
        let beyond = || Refusal::from(ApiError::InvalidOffset("fork point is beyond the source"));
        if anchor > tail {
            return Err(beyond());
        }
        let json = is_json(s.content_type());
        if json && !s.is_message_boundary(anchor) {
            return Err(ApiError::OffsetNotAligned("fork offset inside a message").into());
        }
        let end = if sub == 0 {
            anchor
        } else {
            let chunk = s
                .chunk_at(anchor)
                .filter(|_| anchor < tail)
                .ok_or_else(beyond)?;
            if json {
                let first = s.message_at_or_after(anchor);
                let chunk_end_msg = s.message_at_or_after(chunk.end());
                if first + sub > chunk_end_msg {
                    return Err(beyond());
                }
                s.message_start(first + sub).ok_or_else(beyond)?
            } else {
                if sub > chunk.end() - anchor {
                    return Err(beyond());
                }
                anchor + sub
            }
        };
        let mut append_lens = Vec::new();
        for c in s.chunks() {
            if c.start >= end {
                break;
            }
            append_lens.push((end.min(c.end()) - c.start) as u32);
        }
        let msg_lens = if json {
            s.message_lens(RecordNo::ZERO, s.message_at_or_after(end))
        } else {
            append_lens.clone()
        };
        Inherited {
            content_type: s.content_type().to_string(),
            lifetime: s.lifetime(),
            incarnation: s.incarnation(),
            data: Vec::new(),
            append_lens,
            msg_lens,
        }
    };
    let len: u64 = inherited.append_lens.iter().map(|&l| l as u64).sum();
    let data = shard.read(id, Offset::ZERO, Offset::ZERO + len).await?;
    // The read awaited: make sure the source is still the stream we validated (and its
    // lane still served here).
    match (find(core, key)?, shard.stream(id).map(|s| s.incarnation())) {
        (Found::Live(now), Some(inc)) if now == id && inc == inherited.incarnation => {}
        _ => return Err(ApiError::ForkSourceNotFound.into()),
    }
    let inherited = Inherited { data, ..inherited };
    let ext = {
        let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
        let mut ext = Ext::decode(s.ext());
        match ext.take_ref(token) {
            Taken::New => Some(ext.encode()),
            Taken::Already => None,
            // The fork's host gave up on this take before it got here: nobody waits for
            // the answer.
            Taken::GivenBack => {
                return Err(ApiError::RequestTimeout("the fork gave this take up").into())
            }
        }
    };
    if let Some(ext) = ext {
        shard.set_ext(id, ext)?.durable().await?;
    }
    Ok(inherited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inherited_history_crosses_hosts_unchanged() {
        let sent = Inherited {
            content_type: "application/json".into(),
            lifetime: Lifetime::TtlSeconds(60),
            incarnation: 7,
            data: vec![Bytes::from_static(b"[1,2]"), Bytes::from_static(b"[3]")],
            append_lens: vec![5, 3],
            msg_lens: vec![1, 1, 1],
        };
        let wire: Vec<u8> = encode_inherited(sent.clone()).concat();
        let got = decode_inherited(Bytes::from(wire.clone())).expect("decoded");
        assert_eq!(got.data.concat(), sent.data.concat());
        assert_eq!(
            Inherited {
                data: sent.data.clone(),
                ..got
            },
            sent
        );
        // Cut short: the lengths no longer add up.
        assert!(decode_inherited(Bytes::from(wire[..wire.len() - 1].to_vec())).is_none());
    }

    #[test]
    fn the_source_hosts_refusals_keep_their_meaning() {
        let r = |status, body: &str| {
            source_host_refusal(&crate::peer::Answer {
                status,
                content_type: None,
                location: None,
                body: Bytes::copy_from_slice(body.as_bytes()),
            })
        };
        assert_eq!(
            r(404, "stream_not_found: x\n"),
            ApiError::ForkSourceNotFound
        );
        assert_eq!(r(410, "stream_gone: x\n"), ApiError::ForkSourceGone);
        assert_eq!(r(421, "misdirected: lane 3\n").status(), 503);
        assert_eq!(r(503, "not_served: lane 3\n").status(), 503);
        assert_eq!(r(401, "unauthorized: x\n").status(), 502);
    }

    #[test]
    fn only_the_sources_own_refusals_say_nothing_was_taken() {
        let answer = |status, body: &str| crate::peer::Answer {
            status,
            content_type: None,
            location: None,
            body: Bytes::copy_from_slice(body.as_bytes()),
        };
        let refused =
            |status, body| matches!(take_failure(&answer(status, body)), TakeFailed::Refused(_));
        assert!(refused(404, "stream_not_found: x\n"));
        assert!(refused(410, "stream_gone: x\n"));
        assert!(refused(400, "invalid_offset: x\n"));
        assert!(!refused(421, "misdirected: lane 3\n"));
        assert!(!refused(503, "not_served: lane 3\n"));
        assert!(!refused(500, "storage_fault: x\n"));
        assert!(!refused(502, "bad_gateway: x\n"));
    }
}

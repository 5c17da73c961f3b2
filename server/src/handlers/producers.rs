//! `GET /{bucket}/{stream}/producers`: the idempotent producers of a bucketed stream, each
//! with its epoch, the sequence number of its newest durable append and where that append
//! is in the stream. Read-only, for operators (`ursula stat`); this server's own addition to
//! the extensions contract.

use std::rc::Rc;

use bytes::Bytes;
use ursula_protocol::http1::Method;
use ursula_protocol::offset::format_offset;

use crate::core::Core;
use crate::handlers::buckets::require_bucket;
use crate::http::{ApiError, Handled, Request, Response};
use crate::lookup;

/// `GET|HEAD /{bucket}/{stream}/producers`, on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, req: &Request) -> Handled {
    if !matches!(req.method, Method::Get | Method::Head) {
        return Err(ApiError::MethodNotAllowed {
            allow: "GET, HEAD, OPTIONS",
            reason: "producers are read-only",
        }
        .into());
    }
    require_bucket(core, key).await?;
    let id = lookup::live(core, key)?;
    let shard = core.shard(id)?;
    let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
    // What a reader may know: each producer as of its newest durable append, like every
    // other answer to a read.
    let producers: Vec<sonic_rs::Value> = s
        .producers()
        .iter()
        .map(|p| {
            sonic_rs::json!({
                "producer_id": p.id,
                "epoch": p.epoch,
                "seq": p.seq,
                "last_append": {
                    "offset": format_offset(p.start.get()),
                    "next_offset": format_offset(p.next.get()),
                },
            })
        })
        .collect();
    let body = sonic_rs::json!({
        "producer_count": producers.len(),
        "producers": producers,
    })
    .to_string();
    Ok(Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(body)]))
}

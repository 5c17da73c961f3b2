//! Route a request to the core that owns what it addresses, and there to its handler.
//!
//! The router runs on the core that accepted the connection. A request for a stream (or a
//! stream's sub-resource) goes to the stream's owner core through the hop, [`Core::on`];
//! everything a handler checks and changes then happens on that one core. An SSE read comes
//! back from the owner as the session to drive, which the connection then runs on its own
//! core (`live::sse`).

use std::rc::Rc;

use ursula_protocol::http1::Method;

use crate::core::Core;
use crate::handlers::read_params::ReadReply;
use crate::handlers::{
    append, attrs, batch, buckets, create, delete, head, producers, read, snapshots,
};
use crate::http::{ApiError, Handled, Refusal, Request, Response};
use crate::live::sse::{self, SseSession};
use crate::routes::{route, Route};
use crate::surface::Surface;

/// What the connection writes back.
pub enum Reply {
    /// A complete response.
    Plain(Response),
    /// The head of an event stream, and the session that produces its events.
    Sse(Response, Box<SseSession>),
}

impl From<Response> for Reply {
    fn from(resp: Response) -> Reply {
        Reply::Plain(resp)
    }
}

impl From<Handled> for Reply {
    fn from(handled: Handled) -> Reply {
        Reply::Plain(handled.unwrap_or_else(Refusal::response))
    }
}

impl Reply {
    pub fn head_mut(&mut self) -> &mut Response {
        match self {
            Reply::Plain(r) | Reply::Sse(r, _) => r,
        }
    }
}

/// Entry point for every request, on the core that accepted the connection. Also returns
/// the core that owns the addressed stream when the request was handed to one owner (the
/// connection uses it to follow its stream, see `conn`).
pub async fn dispatch(core: &Rc<Core>, req: Request) -> (Reply, Option<usize>) {
    if req.method == Method::Options {
        return (preflight().into(), None);
    }
    let (key, on_owner) = match route(&req.path) {
        Route::Stream { surface, key } => {
            if let Some(refused) = lane_refusal(core, &key) {
                return (refused.into(), None);
            }
            let owner = owner_for_request(core, &key);
            let mut req = req;
            let call = if req.method == Method::Post {
                StreamCall::Append(append::AppendRequest::read(surface, &mut req))
            } else {
                StreamCall::Other(req)
            };
            let reply = core
                .on(owner, move |c| async move {
                    stream_request(&c, surface, key, call).await
                })
                .await
                .map_or_else(|_| ApiError::owner_unavailable().response().into(), |r| r.0);
            return (reply, Some(owner));
        }
        Route::Buckets => return (buckets::list_buckets(core, &req).await.into(), None),
        Route::Bucket(b) | Route::BucketStreams(b) => {
            return (buckets::handle(core, b, req).await.into(), None)
        }
        Route::AppendBatch(key) => (key, OnOwner::Batch(req)),
        Route::Attrs(key) => (key, OnOwner::Attrs(req)),
        Route::Producers(key) => (key, OnOwner::Producers(req)),
        Route::Resource { key, resource } => (key, OnOwner::Resource(resource, req)),
        Route::StreamResource | Route::NotFound => {
            return (
                ApiError::NotFound("no such resource").response().into(),
                None,
            )
        }
        Route::Invalid(why) => return (ApiError::InvalidStreamId(why).response().into(), None),
        Route::InvalidBucket => return (ApiError::InvalidBucketId.response().into(), None),
    };
    if let Some(refused) = lane_refusal(core, &key) {
        return (refused.into(), None);
    }
    let owner = owner_for_request(core, &key);
    let resp = core
        .on(owner, move |c| async move {
            match on_owner {
                OnOwner::Batch(req) => batch::handle(&c, &key, req).await,
                OnOwner::Attrs(req) => attrs::handle(&c, &key, req).await,
                OnOwner::Producers(req) => producers::handle(&c, &key, &req).await,
                OnOwner::Resource(resource, req) => {
                    snapshots::handle(&c, &key, resource, req).await
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err(ApiError::owner_unavailable().into()));
    (resp.into(), Some(owner))
}

/// In a cluster, the refusal of a request for a stream whose lane this host does not
/// serve now: 421 naming the owner, or 503 while the lane moves (see `lanes`).
fn lane_refusal(core: &Rc<Core>, key: &str) -> Option<Response> {
    if !core.lanes.cluster() {
        return None;
    }
    let refused = core.lanes.check(core.placement.shard_of(key)).err()?;
    Some(crate::lanes::refusal(core, refused).response())
}

/// The core owning `key`, counting the requests that must be handed over to it.
fn owner_for_request(core: &Core, key: &str) -> usize {
    let owner = core.owner_of(key);
    if owner != core.index {
        core.metrics.request_handed_over();
    }
    owner
}

/// A request for a bucketed stream's sub-resource, run on the stream's owner.
enum OnOwner {
    Batch(Request),
    Attrs(Request),
    Producers(Request),
    Resource(crate::routes::Resource, Request),
}

fn preflight() -> Response {
    Response::new(204)
        .header("access-control-allow-methods", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        .header("access-control-allow-headers", "*, if-none-match, content-type, authorization, stream-seq, stream-ttl, stream-expires-at, stream-closed, stream-attrs, stream-record-match, stream-snapshot-match, stream-forked-from, stream-fork-offset, stream-fork-sub-offset, producer-id, producer-epoch, producer-seq, prefer")
        .header("access-control-max-age", "86400")
        .header("cache-control", "no-store")
}

/// What the owner core gets of a request for a stream.
enum StreamCall {
    /// An append, its headers already read on the accepting core.
    Append(append::AppendRequest),
    /// Any other request, whole.
    Other(Request),
}

/// A request for a stream, on its owner core. A whole request travels back with the reply,
/// so its buffers are freed by the core that allocated them (freeing another thread's
/// memory is slower).
async fn stream_request(
    core: &Rc<Core>,
    surface: Surface,
    key: String,
    call: StreamCall,
) -> (Reply, Option<Request>) {
    if surface == Surface::Bucketed {
        if let Err(e) = buckets::require_bucket(core, &key).await {
            let home = match call {
                StreamCall::Append(_) => None,
                StreamCall::Other(req) => Some(req),
            };
            return (e.response().into(), home);
        }
    }
    match call {
        StreamCall::Append(a) => (append::append(core, surface, &key, a).await.into(), None),
        StreamCall::Other(mut req) => {
            let reply = other_request(core, surface, &key, &mut req).await;
            (reply, Some(req))
        }
    }
}

async fn other_request(core: &Rc<Core>, surface: Surface, key: &str, req: &mut Request) -> Reply {
    // Reads (long-poll, SSE) and creates hold large futures; boxed, they no longer size
    // the future of every append, which is moved several times per request.
    match req.method {
        Method::Put => Box::pin(create::create(core, surface, key, req))
            .await
            .into(),
        Method::Post => {
            let a = append::AppendRequest::read(surface, req);
            append::append(core, surface, key, a).await.into()
        }
        Method::Get => match Box::pin(read::read(core, surface, key, req)).await {
            Ok(ReadReply::Done(resp)) => resp.into(),
            Ok(ReadReply::Sse(start)) => match sse::start(core, start) {
                Ok((head, session)) => Reply::Sse(head, Box::new(session)),
                Err(resp) => resp.into(),
            },
            Err(refusal) => refusal.response().into(),
        },
        Method::Head => head::head(core, surface, key).into(),
        Method::Delete => Box::pin(delete::delete(core, key)).await.into(),
        _ => ApiError::MethodNotAllowed {
            allow: "GET, HEAD, POST, PUT, DELETE, OPTIONS",
            reason: "method not allowed",
        }
        .response()
        .into(),
    }
}

//! `GET|PUT /{bucket}/{stream}/attrs` (extensions.md §7): a bucketed stream's attribute
//! object, kept in its server-owned state blob ([`Ext`]).

use std::rc::Rc;

use ursula_protocol::content_type::{is_json, normalize};
use ursula_protocol::http1::Method;

use crate::attrs::{parse, Attrs};
use crate::core::Core;
use crate::ext::Ext;
use crate::handlers::buckets::require_bucket;
use crate::http::{ApiError, Handled, Request, Response};
use crate::lookup;

/// `GET|PUT /{bucket}/{stream}/attrs`, on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, req: Request) -> Handled {
    let put = match req.method {
        Method::Get | Method::Head => false,
        Method::Put => true,
        _ => {
            return Err(ApiError::MethodNotAllowed {
                allow: "GET, HEAD, PUT, OPTIONS",
                reason: "method not allowed",
            }
            .into())
        }
    };
    require_bucket(core, key).await?;
    let id = lookup::live(core, key)?;
    let shard = core.shard(id)?;
    if !put {
        let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
        let body = Attrs::render(Ext::decode(s.ext()).attrs.as_ref());
        return Ok(Response::new(200)
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .with_body(vec![body.into()]));
    }
    let json_type = req
        .header("content-type")
        .and_then(|v| normalize(v).ok())
        .is_some_and(|ct| is_json(&ct));
    if !json_type {
        return Err(
            ApiError::InvalidRequest("stream attributes must be sent as application/json").into(),
        );
    }
    let attrs = parse(&req.body).map_err(ApiError::InvalidRequest)?;
    // Read-modify-write of the state blob with no `.await` in between: atomic on the owner.
    let commit = {
        let mut ext = match shard.stream(id) {
            Some(s) => Ext::decode(s.ext()),
            None => return Err(ApiError::owner_unavailable().into()),
        };
        ext.attrs = attrs;
        shard.set_ext(id, ext.encode())?
    };
    commit.durable().await?;
    Ok(Response::new(204).header("cache-control", "no-store"))
}

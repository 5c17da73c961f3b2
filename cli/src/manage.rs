//! `ursula create` and `ursula delete`, of buckets and streams.

use serde::Serialize;
use ursula_protocol::offset::format_offset;

use crate::client::{Client, Request};
use crate::error::Error;
use crate::output::Out;
use crate::target::Target;
use crate::{CreateArgs, DeleteArgs};

pub fn create(args: CreateArgs) -> Result<(), Error> {
    let target = Target::parse(&args.target)?;
    let mut client = Client::new(&args.connection)?;
    let mut request = Request::new("PUT", target.path());
    match &target {
        Target::Bucket(_) => {
            let stream_only = [
                ("--content-type", args.content_type.is_some()),
                ("--ttl", args.ttl.is_some()),
                ("--expires-at", args.expires_at.is_some()),
                ("--attrs", args.attrs.is_some()),
            ];
            if let Some((option, _)) = stream_only.iter().find(|(_, given)| *given) {
                return Err(Error::Usage(format!(
                    "{option} is a setting of a stream; {} names a bucket",
                    args.target
                )));
            }
        }
        Target::Stream(_) => {
            if let Some(t) = &args.content_type {
                request = request.header("Content-Type", content_type(t));
            }
            if let Some(ttl) = args.ttl {
                request = request.header("Stream-TTL", ttl.as_secs().to_string());
            }
            if let Some(at) = &args.expires_at {
                request = request.header("Stream-Expires-At", at.clone());
            }
            if let Some(attrs) = &args.attrs {
                request = request.header("Stream-Attrs", attrs.clone());
            }
        }
    }
    let resp = client.send(&request)?;
    // 201 created; 200 a stream that already exists with the same settings.
    if !matches!(resp.status, 200 | 201) {
        return Err(client.refusal(&resp, &target));
    }
    let created = Created {
        created: resp.status == 201,
        url: client.url_of(&target.path()),
        content_type: resp.header("content-type").map(str::to_string),
        next_offset: resp.number("stream-next-offset").map(format_offset),
    };
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&created);
    }
    let mut text = if created.created {
        format!("created {target}")
    } else {
        format!("{target} already exists with the same settings")
    };
    if let (Target::Stream(_), Some(t)) = (&target, &created.content_type) {
        text.push_str(&format!(" ({t})"));
    }
    out.line(&text)
}

pub fn delete(args: DeleteArgs) -> Result<(), Error> {
    let target = Target::parse(&args.target)?;
    let mut client = Client::new(&args.connection)?;
    let resp = client.send(&Request::new("DELETE", target.path()))?;
    if resp.status != 204 {
        return Err(client.refusal(&resp, &target));
    }
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&Deleted {
            deleted: client.url_of(&target.path()),
        });
    }
    out.line(&format!("deleted {target}"))
}

/// `ursula create --json`.
#[derive(Serialize)]
struct Created {
    /// False when the stream already existed with the same settings.
    created: bool,
    url: String,
    content_type: Option<String>,
    next_offset: Option<String>,
}

/// `ursula delete --json`.
#[derive(Serialize)]
struct Deleted {
    deleted: String,
}

/// A content type, or one of its short names.
pub fn content_type(name: &str) -> &str {
    match name {
        "json" => "application/json",
        "text" => "text/plain",
        "binary" | "bytes" => "application/octet-stream",
        other => other,
    }
}

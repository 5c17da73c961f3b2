//! `ursula stat`: what the server tells of one stream. Its `HEAD` (type, offsets, records,
//! lifetime, snapshot, incarnation) and, for a stream in a bucket, its attributes and the
//! bucket listing's creation and last-write times.

use serde::Serialize;
use sonic_rs::JsonContainerTrait;
use ursula_protocol::offset::format_offset;

use crate::client::{Client, Request};
use crate::error::Error;
use crate::list;
use crate::output::{time, Out};
use crate::stream::{Lifetime, StreamInfo};
use crate::target::StreamName;
use crate::StatArgs;

pub fn run(args: StatArgs) -> Result<(), Error> {
    let name = StreamName::parse(&args.stream)?;
    let mut client = Client::new(&args.connection)?;
    let info = StreamInfo::fetch(&mut client, &name)?;
    let (entry, attrs) = match &name {
        StreamName::Bucketed { bucket, stream } => (
            list::entry(&mut client, bucket, stream)?,
            attributes(&mut client, &name)?,
        ),
        StreamName::Compat(_) => (None, None),
    };
    let stat = Stat::new(&client, &name, info, entry, attrs);
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&stat);
    }
    out.bytes(stat.human().as_bytes())
}

/// `ursula stat --json`.
#[derive(Serialize)]
struct Stat {
    stream: String,
    url: String,
    content_type: String,
    closed: bool,
    next_offset: String,
    retained_offset: String,
    /// Bytes between the retention point and the tail (offsets are byte positions).
    retained_bytes: u64,
    incarnation: Option<String>,
    ttl_seconds: Option<u64>,
    expires_at: Option<String>,
    snapshot: Option<Snapshot>,
    records: Option<Records>,
    created_at_ms: Option<i64>,
    last_write_at_ms: Option<i64>,
    attrs: Option<sonic_rs::Value>,
}

#[derive(Serialize)]
struct Snapshot {
    offset: String,
    digest: String,
}

/// The retained records `[first, next)`.
#[derive(Serialize)]
struct Records {
    first: u64,
    next: u64,
}

impl Stat {
    fn new(
        client: &Client,
        name: &StreamName,
        info: StreamInfo,
        entry: Option<list::StreamEntry>,
        attrs: Option<sonic_rs::Value>,
    ) -> Stat {
        let (ttl_seconds, expires_at) = match info.lifetime {
            Lifetime::Forever => (None, None),
            Lifetime::TtlSeconds(t) => (Some(t), None),
            Lifetime::ExpiresAt(at) => (None, Some(at)),
        };
        Stat {
            stream: name.to_string(),
            url: client.url_of(&name.path()),
            content_type: info.content_type,
            closed: info.closed,
            next_offset: format_offset(info.next_offset),
            retained_offset: format_offset(info.retained_offset),
            retained_bytes: info.next_offset.saturating_sub(info.retained_offset),
            incarnation: info.incarnation,
            ttl_seconds,
            expires_at,
            snapshot: info.snapshot.map(|(at, digest)| Snapshot {
                offset: format_offset(at),
                digest,
            }),
            records: info.records.map(|(first, next)| Records { first, next }),
            created_at_ms: entry.as_ref().map(|e| e.created_at_ms),
            last_write_at_ms: entry.as_ref().map(|e| e.last_write_at_ms),
            attrs,
        }
    }

    /// One `name  value` line per fact.
    fn human(&self) -> String {
        let mut lines: Vec<(&str, String)> = vec![
            ("stream", self.stream.clone()),
            ("url", self.url.clone()),
            ("content type", self.content_type.clone()),
            ("status", if self.closed { "closed" } else { "open" }.into()),
            (
                "offsets",
                format!(
                    "{} .. {} ({} bytes retained)",
                    self.retained_offset, self.next_offset, self.retained_bytes
                ),
            ),
        ];
        if let Some(r) = &self.records {
            let retained = r.next.saturating_sub(r.first);
            lines.push((
                "records",
                format!("{} .. {} ({retained} retained)", r.first, r.next),
            ));
        }
        let lifetime = match (&self.ttl_seconds, &self.expires_at) {
            (Some(t), _) => format!("deleted {t} s after the last write"),
            (None, Some(at)) => format!("deleted at {at}"),
            (None, None) => "kept until deleted".into(),
        };
        lines.push(("lifetime", lifetime));
        let snapshot = match &self.snapshot {
            Some(s) => format!("at {} (digest {})", s.offset, s.digest),
            None => "none".into(),
        };
        lines.push(("snapshot", snapshot));
        if let Some(i) = &self.incarnation {
            lines.push(("incarnation", i.clone()));
        }
        if let Some(ms) = self.created_at_ms {
            lines.push(("created", time(ms)));
        }
        if let Some(ms) = self.last_write_at_ms {
            lines.push(("last write", time(ms)));
        }
        if let Some(attrs) = &self.attrs {
            lines.push(("attributes", attrs.to_string()));
        }
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        lines
            .iter()
            .map(|(k, v)| format!("{k:width$}  {v}\n"))
            .collect()
    }
}

/// A bucketed stream's attributes (`GET …/attrs`); `None` when it has none set.
fn attributes(client: &mut Client, name: &StreamName) -> Result<Option<sonic_rs::Value>, Error> {
    let Some(path) = name.sub_path("attrs") else {
        return Ok(None);
    };
    let resp = client.send(&Request::new("GET", path))?;
    if resp.status != 200 {
        return Err(client.refusal(&resp, &format!("stream {name}")));
    }
    let attrs: sonic_rs::Value = sonic_rs::from_slice(&resp.body)
        .map_err(|e| client.unexpected(format!("attributes that are not JSON: {e}")))?;
    let empty = attrs.as_object().is_some_and(|o| o.is_empty());
    Ok((!empty).then_some(attrs))
}

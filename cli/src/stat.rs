//! `ursula stat`: what the server tells of one stream. Its `HEAD` (type, offsets, records,
//! lifetime, snapshot, incarnation) and, for a stream in a bucket, its attributes, its
//! idempotent producers and the bucket listing's creation and last-write times.

use serde::{Deserialize, Serialize};
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
    let (entry, attrs, producers) = match &name {
        StreamName::Bucketed { bucket, stream } => (
            list::entry(&mut client, bucket, stream)?,
            attributes(&mut client, &name)?,
            producers(&mut client, &name)?,
        ),
        StreamName::Compat(_) => (None, None, None),
    };
    let stat = Stat::new(&client, &name, info, entry, attrs, producers);
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
    /// The stream's idempotent producers, sorted by ID; `None` where the server does not
    /// serve them (streams of the compat surface).
    producers: Option<Vec<Producer>>,
}

/// An idempotent producer, as `GET …/producers` lists it.
#[derive(Serialize, Deserialize)]
struct Producer {
    producer_id: String,
    epoch: u64,
    /// The sequence number of its newest durable append.
    seq: u64,
    last_append: Span,
}

/// Where an append is in the stream: `[offset, next_offset)`.
#[derive(Serialize, Deserialize)]
struct Span {
    offset: String,
    next_offset: String,
}

/// The body of `GET …/producers`.
#[derive(Deserialize)]
struct ProducerList {
    producers: Vec<Producer>,
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
        producers: Option<Vec<Producer>>,
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
            producers,
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
        match self.producers.as_deref() {
            None => {}
            Some([]) => lines.push(("producers", "none".into())),
            Some(producers) => {
                // One line each, the name shown on the first only.
                for (i, p) in producers.iter().enumerate() {
                    let key = if i == 0 { "producers" } else { "" };
                    lines.push((
                        key,
                        format!(
                            "{} epoch {} seq {} (last append {} .. {})",
                            p.producer_id,
                            p.epoch,
                            p.seq,
                            p.last_append.offset,
                            p.last_append.next_offset
                        ),
                    ));
                }
            }
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

/// A bucketed stream's idempotent producers (`GET …/producers`); `None` for a stream of the
/// compat surface, which has no sub-resources, and from a server too old to list them.
fn producers(client: &mut Client, name: &StreamName) -> Result<Option<Vec<Producer>>, Error> {
    let Some(path) = name.sub_path("producers") else {
        return Ok(None);
    };
    let resp = client.send(&Request::new("GET", path))?;
    // A server without the listing answers any unknown sub-resource `404 not_found`; a
    // missing stream or bucket has codes of its own.
    if resp.status == 404 && resp.reason().starts_with("not_found:") {
        return Ok(None);
    }
    if resp.status != 200 {
        return Err(client.refusal(&resp, &format!("stream {name}")));
    }
    let list: ProducerList = sonic_rs::from_slice(&resp.body)
        .map_err(|e| client.unexpected(format!("a producer list that does not parse: {e}")))?;
    Ok(Some(list.producers))
}

//! `ursula ls`: the buckets (`GET /`), or the streams of one bucket
//! (`GET /{bucket}/streams`), every page of them.

use serde::{Deserialize, Serialize};

use crate::client::{Client, Request};
use crate::error::Error;
use crate::output::{table, time, Out};
use crate::target::{encode, Target};
use crate::ListArgs;

/// Entries the server returns at most per page.
const PAGE_MAX: usize = 1000;

pub fn run(args: ListArgs) -> Result<(), Error> {
    let mut client = Client::new(&args.connection)?;
    let mut out = Out::stdout();
    let pages = Pages {
        prefix: args.prefix.as_deref(),
        limit: args.limit.unwrap_or(usize::MAX),
    };
    match args.bucket {
        None => {
            let buckets = pages.collect(&mut client, "/", "buckets", |p: BucketPage| {
                (p.buckets, p.next_cursor)
            })?;
            if args.connection.json {
                return out.json(&BucketList { buckets });
            }
            let rows: Vec<Vec<String>> = buckets
                .iter()
                .map(|b| vec![b.bucket_id.clone(), b.streams.to_string()])
                .collect();
            out.bytes(table(&["BUCKET", "STREAMS"], &rows, &[1]).as_bytes())
        }
        Some(bucket) => {
            let Target::Bucket(bucket) = Target::parse(&bucket)? else {
                return Err(Error::Usage(format!(
                    "{bucket:?} is not a bucket: `ursula ls` lists buckets, `ursula ls BUCKET` \
                     its streams"
                )));
            };
            let path = format!("/{}/streams", encode(&bucket));
            let what = format!("bucket {bucket}");
            let streams = pages.collect(&mut client, &path, &what, |p: StreamPage| {
                (p.streams, p.next_cursor)
            })?;
            if args.connection.json {
                return out.json(&StreamList {
                    bucket_id: bucket,
                    streams,
                });
            }
            let rows: Vec<Vec<String>> = streams
                .iter()
                .map(|s| {
                    vec![
                        s.stream_id.clone(),
                        s.status.to_lowercase(),
                        s.content_type.clone(),
                        s.tail_offset.clone(),
                        time(s.last_write_at_ms),
                    ]
                })
                .collect();
            let header = [
                "STREAM",
                "STATUS",
                "CONTENT TYPE",
                "TAIL OFFSET",
                "LAST WRITE",
            ];
            out.bytes(table(&header, &rows, &[]).as_bytes())
        }
    }
}

/// The listing's entry of one stream of a bucket: the listing is where the server tells a
/// stream's creation and last write times. The stream's own name is the first of the names
/// it starts, so a page of one with it as the prefix holds it, if it exists.
pub fn entry(
    client: &mut Client,
    bucket: &str,
    stream: &str,
) -> Result<Option<StreamEntry>, Error> {
    let pages = Pages {
        prefix: Some(stream),
        limit: 1,
    };
    let path = format!("/{}/streams", encode(bucket));
    let what = format!("bucket {bucket}");
    let first = pages.collect(client, &path, &what, |p: StreamPage| (p.streams, None))?;
    Ok(first.into_iter().find(|e| e.stream_id == stream))
}

/// What to fetch of a paged listing.
struct Pages<'a> {
    prefix: Option<&'a str>,
    /// Entries wanted at most.
    limit: usize,
}

impl Pages<'_> {
    /// Every entry of the listing at `path`, following `next_cursor` until the server has
    /// no more or `limit` are in hand. `split` takes a page apart into its entries and its
    /// cursor.
    fn collect<P, E>(
        &self,
        client: &mut Client,
        path: &str,
        what: &str,
        split: impl Fn(P) -> (Vec<E>, Option<String>),
    ) -> Result<Vec<E>, Error>
    where
        P: for<'de> Deserialize<'de>,
    {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        while all.len() < self.limit {
            let page_size = (self.limit - all.len()).min(PAGE_MAX);
            let mut query = format!("{path}?limit={page_size}");
            if let Some(prefix) = self.prefix {
                query.push_str(&format!("&prefix={}", encode(prefix)));
            }
            if let Some(cursor) = &after {
                query.push_str(&format!("&after={}", encode(cursor)));
            }
            let resp = client.send(&Request::new("GET", query))?;
            if resp.status != 200 {
                return Err(client.refusal(&resp, &what));
            }
            let page: P = sonic_rs::from_slice(&resp.body).map_err(|e| {
                client.unexpected(format!("a listing that is not the JSON expected: {e}"))
            })?;
            let (entries, cursor) = split(page);
            all.extend(entries);
            match cursor {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
        }
        all.truncate(self.limit);
        Ok(all)
    }
}

/// A page of `GET /`.
#[derive(Deserialize)]
struct BucketPage {
    buckets: Vec<Bucket>,
    next_cursor: Option<String>,
}

#[derive(Deserialize, Serialize)]
struct Bucket {
    bucket_id: String,
    /// Live streams in the bucket.
    streams: u64,
}

/// A page of `GET /{bucket}/streams`.
#[derive(Deserialize)]
struct StreamPage {
    streams: Vec<StreamEntry>,
    next_cursor: Option<String>,
}

/// A stream as the listing describes it (extensions.md §1.4).
#[derive(Deserialize, Serialize)]
pub struct StreamEntry {
    pub stream_id: String,
    /// `Open` or `Closed`.
    pub status: String,
    pub content_type: String,
    pub tail_offset: String,
    pub created_at_ms: i64,
    pub last_write_at_ms: i64,
}

/// `ursula ls --json`.
#[derive(Serialize)]
struct BucketList {
    buckets: Vec<Bucket>,
}

/// `ursula ls BUCKET --json`.
#[derive(Serialize)]
struct StreamList {
    bucket_id: String,
    streams: Vec<StreamEntry>,
}

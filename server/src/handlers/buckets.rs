//! Buckets (extensions §1): the namespace of the bucketed surface, and the listing of all
//! buckets (`GET /`, an addition of this server: the contract lists only a bucket's streams).
//!
//! A bucket is recorded in every shard (key `k/{bucket}`), so checking that a stream's
//! bucket exists is a lookup in the stream's own shard, and a shard that moves (a lane's
//! log) takes its copy along. The shard the bucket's key is placed on holds the
//! authoritative record: it is written first on create and removed last on delete, and a
//! shard missing its copy asks the owner and repairs it.
//!
//! A bucket's settings (`bucket_settings`) are the `ext` blob of its record, in every copy,
//! so the core that owns a stream reads them locally. `PUT /{bucket}` may carry them and
//! `PATCH /{bucket}` changes them: the owner's copy first, then every other shard's.
//!
//! In a cluster the authoritative record is on the host that owns its key's lane: the
//! bucket's own requests are forwarded there, other hosts' shards ask it for their copies
//! (and are sent a changed record's settings, or told to drop a deleted one's), a lane
//! adopted from another host has its copies brought up to the records (a change made while
//! it moved reached no host's copy of it), a delete waits until no lane is between hosts,
//! and a listing or count asks every host for the lanes it serves (see the end of this
//! module).

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ursula_protocol::http1::Method;
use ursula_protocol::offset::format_offset;
use ursula_protocol::query::parse_query;
use ursula_storage::placement::Placement;
use ursula_storage::{AppendRec, Lifetime, NewStream, Shard, StreamMeta};

use crate::bucket_settings::{BucketSettings, SettingsError};
use crate::core::{Core, NotServed};
use crate::http::{ApiError, Handled, Request, Response};
use crate::limits::LIST_PAGE_MAX;
use crate::lookup::{find, Found};
use crate::surface::{bucket_key, bucket_of};
use crate::tokens::BucketScope;

const BUCKET_TYPE: &str = "application/x-ursula-bucket";

pub async fn handle(core: &Rc<Core>, bucket: String, req: Request) -> Handled {
    let listing = req.path.trim_end_matches('/').ends_with("/streams");
    if !listing {
        if let Some(host) = crate::lanes::serving_host(core, &bucket_key(&bucket)).await? {
            return forward(core, &host, &req).await;
        }
    }
    match (&req.method, listing) {
        (Method::Get, true) => list(core, &bucket, &req).await,
        (_, true) => Err(ApiError::MethodNotAllowed {
            allow: "GET",
            reason: "only GET lists streams",
        }
        .into()),
        (Method::Put, false) => create(core, &bucket, &req.body).await,
        (Method::Get, false) => metadata(core, &bucket).await,
        (Method::Delete, false) => delete(core, &bucket).await,
        (Method::Other(m), false) if m == "PATCH" => change(core, &bucket, &req.body).await,
        _ => Err(ApiError::MethodNotAllowed {
            allow: "PUT, GET, PATCH, DELETE",
            reason: "method not allowed",
        }
        .into()),
    }
}

/// On the owner of stream `key` (`b/{bucket}/{stream}`): whether its bucket has a record in
/// the stream's shard (repaired from the authoritative one if missing), refused with a 404
/// when it does not. A key outside every bucket (the compat surface's) needs none.
pub async fn require_bucket(core: &Rc<Core>, key: &str) -> Result<(), ApiError> {
    let Some(bucket) = key
        .strip_prefix("b/")
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string)
    else {
        return Ok(());
    };
    let shard = core.shard_for(key)?;
    if exists_in(&shard, &bucket) {
        return Ok(());
    }
    let there = record(core, &bucket).await?;
    if let Some(ext) = there {
        if replicate(&shard, &bucket, ext).await {
            return Ok(());
        }
    }
    Err(ApiError::BucketNotFound)
}

/// Whether `bucket` exists, by its authoritative record (on the bucket key's owner):
/// refused with a 404 when it does not.
async fn require_bucket_record(core: &Rc<Core>, bucket: &str) -> Result<(), ApiError> {
    match record(core, bucket).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::BucketNotFound),
    }
}

/// The settings blob of `bucket`'s authoritative record, wherever it is (`None`: there is
/// no such bucket).
async fn record(core: &Rc<Core>, bucket: &str) -> Result<Option<Bytes>, ApiError> {
    if let Some(host) = crate::lanes::serving_host(core, &bucket_key(bucket)).await? {
        return record_from(core, &host, bucket).await;
    }
    let b = bucket.to_string();
    let here = core
        .on(core.owner_of(&bucket_key(bucket)), move |c| async move {
            c.shard_for(&bucket_key(&b))
                .map(|home| settings_blob(&home, &b))
        })
        .await;
    // An owner core that is gone has no record to give: the bucket is not found.
    Ok(here.unwrap_or(Ok(None))?)
}

/// The settings of `bucket` in `shard`'s copy of its record (none when it has no copy).
/// Only valid after [`require_bucket`] said the bucket exists there.
pub fn settings(shard: &Shard, bucket: &str) -> BucketSettings {
    shard
        .stream_by_key(&bucket_key(bucket))
        .map(|s| BucketSettings::decode(s.ext()))
        .unwrap_or_default()
}

/// Take `appends` appends of `bytes` bytes from the rate limit of the bucket of stream
/// `key` (this core's cache of the bucket's limiter), or refuse them with the 429. `shard`
/// is the stream's, whose copy of the bucket's settings a cache miss reads.
pub fn throttle(
    core: &Core,
    shard: &Shard,
    key: &str,
    appends: u64,
    bytes: u64,
) -> Result<(), ApiError> {
    let Some(bucket) = bucket_of(key) else {
        return Ok(());
    };
    let settings = || settings(shard, bucket).rate_limit;
    let admitted = core
        .limits
        .with(&core.bucket_limits, bucket, settings, |limiter| {
            limiter.admit(appends, bytes)
        });
    match admitted {
        None | Some(Ok(())) => Ok(()),
        Some(Err(t)) => Err(ApiError::TooManyRequests {
            limit: t.limit.label(),
            retry_after_secs: t.retry_after_secs,
        }),
    }
}

fn exists_in(shard: &Shard, bucket: &str) -> bool {
    shard.lookup(&bucket_key(bucket)).is_some()
}

/// `shard`'s copy of the bucket's settings blob, if it has the bucket.
fn settings_blob(shard: &Shard, bucket: &str) -> Option<Bytes> {
    shard
        .stream_by_key(&bucket_key(bucket))
        .map(|s| s.ext().clone())
}

/// Record the bucket in every shard of core `c` with the settings blob `ext`. True when
/// every copy is durable.
async fn replicate_on(c: &Core, bucket: &str, ext: &Bytes) -> bool {
    for shard in c.shards() {
        if !replicate(&shard, bucket, ext.clone()).await {
            return false;
        }
    }
    true
}

/// Record the bucket in `shard` with the settings blob `ext`, or give an existing record
/// that blob. True when it is durable.
async fn replicate(shard: &Shard, bucket: &str, ext: Bytes) -> bool {
    if let Some(id) = shard.lookup(&bucket_key(bucket)) {
        if shard.stream(id).is_some_and(|s| *s.ext() == ext) {
            return true;
        }
        return match shard.set_ext(id, ext) {
            Ok(commit) => commit.durable().await.is_ok(),
            Err(_) => false,
        };
    }
    let now = ursula_storage::now_ms();
    let spec = NewStream {
        meta: StreamMeta {
            key: bucket_key(bucket).into(),
            incarnation: shard.next_incarnation(now),
            created_ms: now,
            content_type: BUCKET_TYPE.into(),
            lifetime: Lifetime::Forever,
            ext,
        },
        initial: AppendRec::default(),
    };
    match shard.create(spec) {
        Ok((_, commit)) => commit.durable().await.is_ok(),
        Err(_) => false,
    }
}

async fn create(core: &Rc<Core>, bucket: &str, body: &[u8]) -> Handled {
    let settings = BucketSettings::parse(body).map_err(invalid_settings)?;
    let ext = Bytes::from(settings.encode());
    let owner = core.owner_of(&bucket_key(bucket));
    let b = bucket.to_string();
    let blob = ext.clone();
    let created = core
        .on(owner, move |c| async move {
            let home = c.shard_for(&bucket_key(&b))?;
            if exists_in(&home, &b) {
                return Ok(Some(false));
            }
            Ok::<_, NotServed>(replicate(&home, &b, blob).await.then_some(true))
        })
        .await;
    match created {
        Ok(Ok(Some(true))) => {}
        Ok(Ok(Some(false))) => return Err(ApiError::BucketExists.into()),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(None)) | Err(_) => return Err(ApiError::owner_unavailable().into()),
    }
    for i in 0..core.cores() {
        let b = bucket.to_string();
        let blob = ext.clone();
        // A shard that misses this is repaired on first use (require_bucket).
        let _ = core
            .on(i, move |c| async move { replicate_on(&c, &b, &blob).await })
            .await;
    }
    // Cores may still cache the limits of an earlier bucket of this name.
    core.bucket_limits.set(bucket, settings.rate_limit);
    Ok(Response::new(201)
        .header("cache-control", "no-store")
        .header("location", format!("/{bucket}")))
}

/// One stream of a listing, gathered from its owner core.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    name: String,
    closed: bool,
    content_type: String,
    tail: u64,
    created_ms: i64,
    last_write_ms: i64,
}

/// Which streams of a bucket a listing asks for.
#[derive(Clone, Copy)]
struct Selection<'a> {
    /// Names start with this.
    prefix: Option<&'a str>,
    /// Names sort after this (the cursor).
    after: Option<&'a str>,
}

/// A [`Selection`] that owns its strings, to send to another core or host.
#[derive(serde::Serialize, serde::Deserialize)]
struct OwnedSelection {
    prefix: Option<String>,
    after: Option<String>,
}

impl OwnedSelection {
    fn get(&self) -> Selection<'_> {
        Selection {
            prefix: self.prefix.as_deref(),
            after: self.after.as_deref(),
        }
    }
}

impl Selection<'_> {
    fn owned(self) -> OwnedSelection {
        OwnedSelection {
            prefix: self.prefix.map(str::to_string),
            after: self.after.map(str::to_string),
        }
    }

    fn takes(&self, name: &str) -> bool {
        self.prefix
            .is_none_or(|p| name.as_bytes().starts_with(p.as_bytes()))
            && self.after.is_none_or(|a| name.as_bytes() > a.as_bytes())
    }
}

/// The paging parameters of a listing: `prefix`, `after` (the cursor) and `limit`.
struct Page {
    prefix: Option<String>,
    after: Option<String>,
    limit: usize,
}

impl Page {
    /// The parameters of `req`, with `limit` from 1 to [`LIST_PAGE_MAX`] (its default), or
    /// the 400.
    fn parse(req: &Request) -> Result<Page, ApiError> {
        let query =
            parse_query(&req.query).map_err(|_| ApiError::InvalidRequest("invalid query"))?;
        let (Ok(prefix), Ok(after), Ok(limit)) = (
            query.get_unique("prefix"),
            query.get_unique("after"),
            query.get_unique("limit"),
        ) else {
            return Err(ApiError::InvalidRequest("parameter given more than once"));
        };
        let limit = match limit {
            None => LIST_PAGE_MAX,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=LIST_PAGE_MAX).contains(&n) && !v.starts_with('+') => n,
                // A reason is static text: it names the bound the assertion after `Page`
                // holds it to.
                _ => {
                    return Err(ApiError::InvalidRequest(
                        "limit must be an integer from 1 to 1000",
                    ))
                }
            },
        };
        Ok(Page {
            prefix: prefix.map(str::to_string),
            after: after.map(str::to_string),
            limit,
        })
    }

    fn selection(&self) -> Selection<'_> {
        Selection {
            prefix: self.prefix.as_deref(),
            after: self.after.as_deref(),
        }
    }
}

const _: () = assert!(
    LIST_PAGE_MAX == 1000,
    "Page::parse's reason names the bound"
);

/// The first `most` live streams of `bucket` that `sel` takes, across all cores and hosts,
/// sorted by name.
async fn entries(
    core: &Rc<Core>,
    bucket: &str,
    sel: Selection<'_>,
    most: usize,
) -> Result<Vec<Entry>, ApiError> {
    let ask = PartAsk::Streams {
        bucket: bucket.to_string(),
        sel: sel.owned(),
        most,
    };
    let mut all = local_entries(core, bucket, sel, most).await;
    for part in other_parts(core, &ask).await? {
        all.extend(part.streams);
    }
    all.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    all.truncate(most);
    Ok(all)
}

/// [`entries`] on this host's cores. Each core sorts its names first and wakes (see
/// `ursula_storage::shard` dormancy) only the streams it reports, at most `most`.
async fn local_entries(
    core: &Rc<Core>,
    bucket: &str,
    sel: Selection<'_>,
    most: usize,
) -> Vec<Entry> {
    let prefix = format!("b/{bucket}/");
    let mut all = Vec::new();
    for i in 0..core.cores() {
        let prefix = prefix.clone();
        let owned = sel.owned();
        let part = core
            .on(i, move |c| async move {
                let sel = owned.get();
                let mut keys: Vec<Box<str>> = c
                    .shards()
                    .iter()
                    .flat_map(Shard::keys)
                    .filter(|k| {
                        k.strip_prefix(prefix.as_str())
                            .is_some_and(|n| sel.takes(n))
                    })
                    .collect();
                keys.sort_unstable();
                let mut out = Vec::new();
                for key in keys {
                    if out.len() == most {
                        break;
                    }
                    // No `.await` since the keys were taken: their shards are all still here.
                    let Ok(Found::Live(id)) = find(&c, &key) else {
                        continue;
                    };
                    let Ok(shard) = c.shard(id) else {
                        continue;
                    };
                    let Some(s) = shard.stream(id) else {
                        continue;
                    };
                    out.push(Entry {
                        name: key[prefix.len()..].to_string(),
                        closed: s.is_closed(),
                        content_type: s.content_type().to_string(),
                        tail: s.next_offset().get(),
                        created_ms: s.created_ms(),
                        last_write_ms: s.last_access_ms(),
                    });
                }
                out
            })
            .await
            .unwrap_or_default();
        all.extend(part);
    }
    all.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    all.truncate(most);
    all
}

/// How many live streams `bucket` has, across all cores and hosts, without waking dormant
/// ones.
async fn count(core: &Rc<Core>, bucket: &str) -> Result<usize, ApiError> {
    let counts = live_stream_counts(core, vec![bucket.to_string()]).await?;
    Ok(counts.first().copied().unwrap_or(0))
}

/// How many live streams each of `buckets` (sorted byte-wise) has, across all cores and
/// hosts.
async fn live_stream_counts(core: &Rc<Core>, buckets: Vec<String>) -> Result<Vec<usize>, ApiError> {
    let ask = PartAsk::Counts {
        buckets: buckets.clone(),
    };
    let mut totals = local_stream_counts(core, buckets).await;
    for part in other_parts(core, &ask).await? {
        for (total, n) in totals.iter_mut().zip(part.counts) {
            *total += n;
        }
    }
    Ok(totals)
}

/// [`live_stream_counts`] on this host, in one pass over every core's keys. Dormant streams
/// are not woken: a dormant stream is live until the deadline it went to sleep with.
async fn local_stream_counts(core: &Rc<Core>, buckets: Vec<String>) -> Vec<usize> {
    let mut totals = vec![0; buckets.len()];
    for i in 0..core.cores() {
        let buckets = buckets.clone();
        let part = core
            .on(i, move |c| async move {
                let now = ursula_storage::now_ms();
                let mut counts = vec![0; buckets.len()];
                for shard in c.shards() {
                    for key in shard.keys() {
                        let Some((bucket, _)) =
                            key.strip_prefix("b/").and_then(|r| r.split_once('/'))
                        else {
                            continue;
                        };
                        let Ok(at) = buckets.binary_search_by(|b| b.as_str().cmp(bucket)) else {
                            continue;
                        };
                        let live =
                            match shard.lookup(&key).and_then(|id| shard.dormant_deadline(id)) {
                                Some(deadline) => deadline > now,
                                None => matches!(find(&c, &key), Ok(Found::Live(_))),
                            };
                        counts[at] += usize::from(live);
                    }
                }
                counts
            })
            .await
            .unwrap_or_default();
        for (total, n) in totals.iter_mut().zip(part) {
            *total += n;
        }
    }
    totals
}

/// `PATCH /{bucket}`: change the bucket's settings (see `BucketSettings::patched`), on the
/// owner's record first, then on every other core's copy.
async fn change(core: &Rc<Core>, bucket: &str, body: &[u8]) -> Handled {
    require_bucket_record(core, bucket).await?;
    let owner = core.owner_of(&bucket_key(bucket));
    let b = bucket.to_string();
    let patch = Bytes::copy_from_slice(body);
    // Read, patch and write on the owner with no `.await` between them: concurrent
    // changes of one bucket apply one after the other.
    let written = core
        .on(owner, move |c| async move {
            let home = c.shard_for(&bucket_key(&b))?;
            let id = home
                .lookup(&bucket_key(&b))
                .ok_or(ApiError::BucketNotFound)?;
            let now = settings(&home, &b);
            let new = now.patched(&patch).map_err(invalid_settings)?;
            let ext = Bytes::from(new.encode());
            let commit = home.set_ext(id, ext.clone()).map_err(ApiError::from)?;
            commit.durable().await.map_err(ApiError::from)?;
            Ok::<_, ApiError>(ext)
        })
        .await
        .map_err(|_| ApiError::owner_unavailable())??;
    let settled = spread_settings(core, bucket, owner, written).await?;
    copy_to_other_hosts(core, bucket, &settled).await?;
    metadata(core, bucket).await
}

/// Give every shard's copy of `bucket` the settings `ext` the owner's record was given, and
/// install its limits. Two changes racing may reach the copies in either order, so this
/// repeats until the owner's record still holds what was last spread: the last change to
/// finish leaves every copy, and the limiter, as the owner's record says. Returns the
/// settings it left.
async fn spread_settings(
    core: &Rc<Core>,
    bucket: &str,
    owner: usize,
    mut ext: Bytes,
) -> Result<Bytes, ApiError> {
    loop {
        for i in 0..core.cores() {
            let (b, blob) = (bucket.to_string(), ext.clone());
            let ok = core
                .on(i, move |c| async move { replicate_on(&c, &b, &blob).await })
                .await;
            if !matches!(ok, Ok(true)) {
                return Err(ApiError::owner_unavailable());
            }
        }
        core.bucket_limits
            .set(bucket, BucketSettings::decode(&ext).rate_limit);
        let b = bucket.to_string();
        let now = core
            .on(owner, move |c| async move {
                c.shard_for(&bucket_key(&b))
                    .map(|home| settings_blob(&home, &b))
            })
            .await
            .map_err(|_| ApiError::owner_unavailable())??
            .ok_or(ApiError::BucketNotFound)?;
        if now == ext {
            return Ok(ext);
        }
        ext = now;
    }
}

fn invalid_settings(e: SettingsError) -> ApiError {
    ApiError::InvalidSettings(e.to_string().into())
}

/// The body of `GET /{bucket}`: its ID, its number of live streams and its settings.
#[derive(serde::Serialize)]
struct Metadata<'a> {
    bucket_id: &'a str,
    streams: usize,
    #[serde(flatten)]
    settings: BucketSettings,
}

async fn metadata(core: &Rc<Core>, bucket: &str) -> Handled {
    require_bucket_record(core, bucket).await?;
    let count = count(core, bucket).await?;
    let owner = core.owner_of(&bucket_key(bucket));
    let b = bucket.to_string();
    let settings = core
        .on(owner, move |c| async move {
            c.shard_for(&bucket_key(&b)).map(|home| settings(&home, &b))
        })
        .await
        // An owner core that is gone reports the default settings; one that does not run
        // the bucket's shard now is a retry.
        .unwrap_or_else(|_| Ok(BucketSettings::default()))?;
    let body = sonic_rs::to_string(&Metadata {
        bucket_id: bucket,
        streams: count,
        settings,
    })
    .unwrap_or_default();
    Ok(Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(body)]))
}

async fn list(core: &Rc<Core>, bucket: &str, req: &Request) -> Handled {
    let page = Page::parse(req)?;
    let (prefix, limit) = (page.prefix.as_deref(), page.limit);
    require_bucket_record(core, bucket).await?;
    let matching = entries(core, bucket, page.selection(), limit + 1).await?;
    let has_more = matching.len() > limit;
    let shown = &matching[..matching.len().min(limit)];
    let streams: Vec<sonic_rs::Value> = shown
        .iter()
        .map(|e| {
            sonic_rs::json!({
                "stream_id": e.name,
                "status": if e.closed { "Closed" } else { "Open" },
                "content_type": e.content_type,
                "tail_offset": format_offset(e.tail),
                "created_at_ms": e.created_ms,
                "last_write_at_ms": e.last_write_ms,
            })
        })
        .collect();
    let next_cursor = if has_more {
        shown.last().map(|e| e.name.clone())
    } else {
        None
    };
    let body = sonic_rs::json!({
        "bucket_id": bucket,
        "prefix": prefix,
        "stream_count": shown.len(),
        "streams": streams,
        "next_cursor": next_cursor,
        "has_more": has_more,
    })
    .to_string();
    Ok(Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(body)]))
}

/// `GET /?prefix=&after=&limit=`: the buckets, sorted by ID and paged like a stream
/// listing, each with its number of live streams (as `GET /{bucket}` counts them).
pub async fn list_buckets(core: &Rc<Core>, req: &Request) -> Handled {
    if req.method != Method::Get {
        return Err(ApiError::MethodNotAllowed {
            allow: "GET",
            reason: "only GET lists buckets",
        }
        .into());
    }
    let page = Page::parse(req)?;
    let visible = req.buckets.clone();
    let mut ids = bucket_ids(core, page.selection(), visible, page.limit + 1).await?;
    let has_more = ids.len() > page.limit;
    ids.truncate(page.limit);
    let counts = live_stream_counts(core, ids.clone()).await?;
    let buckets: Vec<sonic_rs::Value> = ids
        .iter()
        .zip(&counts)
        .map(|(id, streams)| sonic_rs::json!({"bucket_id": id, "streams": streams}))
        .collect();
    let next_cursor = if has_more { ids.last().cloned() } else { None };
    let body = sonic_rs::json!({
        "prefix": page.prefix,
        "bucket_count": ids.len(),
        "buckets": buckets,
        "next_cursor": next_cursor,
        "has_more": has_more,
    })
    .to_string();
    Ok(Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(body)]))
}

/// The first `most` bucket IDs that `sel` takes, sorted byte-wise, of those `visible` allows
/// (`None`: all; a token limited to some buckets lists only those), across all hosts.
async fn bucket_ids(
    core: &Rc<Core>,
    sel: Selection<'_>,
    visible: Option<Arc<BucketScope>>,
    most: usize,
) -> Result<Vec<String>, ApiError> {
    let ask = PartAsk::Buckets {
        sel: sel.owned(),
        most,
        visible: visible.as_deref().cloned(),
    };
    let mut all = local_bucket_ids(core, sel, visible, most).await;
    for part in other_parts(core, &ask).await? {
        all.extend(part.buckets);
    }
    all.sort_unstable();
    all.truncate(most);
    Ok(all)
}

/// [`bucket_ids`] on this host. Each core reports only the buckets it owns: the owner's
/// record is the authoritative one (see the module comment), so a bucket a replica missed
/// or still holds is reported as its owner says.
async fn local_bucket_ids(
    core: &Rc<Core>,
    sel: Selection<'_>,
    visible: Option<Arc<BucketScope>>,
    most: usize,
) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..core.cores() {
        let owned = sel.owned();
        let visible = visible.clone();
        let part = core
            .on(i, move |c| async move {
                let sel = owned.get();
                let shards = c.shards();
                let mut ids: Vec<String> = shards
                    .iter()
                    .flat_map(|shard| shard.keys().into_iter().filter(|k| c.is_home_of(shard, k)))
                    .filter_map(|k| k.strip_prefix("k/").map(str::to_string))
                    .filter(|id| sel.takes(id))
                    .filter(|id| visible.as_ref().is_none_or(|v| v.allows(id)))
                    .collect();
                ids.sort_unstable();
                ids.truncate(most);
                ids
            })
            .await
            .unwrap_or_default();
        all.extend(part);
    }
    all.sort_unstable();
    all.truncate(most);
    all
}

async fn delete(core: &Rc<Core>, bucket: &str) -> Handled {
    require_bucket_record(core, bucket).await?;
    if count(core, bucket).await? > 0 {
        return Err(ApiError::BucketNotEmpty.into());
    }
    // Copies first, other hosts' and then this one's; the authoritative record goes last
    // (see the module comment), and only once every lane's copy is gone: a lane moving
    // between hosts meanwhile would keep a copy of a bucket that no longer exists.
    let key = bucket_key(bucket);
    let mut dropped = drop_on_other_hosts(core, bucket).await?;
    dropped.extend(drop_copies_here(core, &key).await?);
    if core.lanes.cluster() {
        dropped.push(core.placement.shard_of(&key) as u32);
        dropped.sort_unstable();
        dropped.dedup();
        if dropped.len() as u32 != core.lanes.lanes() {
            return Err(ApiError::lanes_moving().into());
        }
    }
    let owner = core.owner_of(&key);
    let removed = core
        .on(owner, move |c| async move {
            delete_records_on(&c, &key, true).await
        })
        .await;
    if !matches!(removed, Ok(Some(_))) {
        return Err(ApiError::owner_unavailable().into());
    }
    core.bucket_limits.set(bucket, None);
    Ok(Response::new(204).header("cache-control", "no-store"))
}

/// Delete the copies of bucket record `key` in every shard of this host (not the record
/// itself). The numbers of the shards that have none now.
async fn drop_copies_here(core: &Rc<Core>, key: &str) -> Result<Vec<u32>, ApiError> {
    let mut dropped = Vec::new();
    for i in 0..core.cores() {
        let k = key.to_string();
        let visited = core
            .on(
                i,
                move |c| async move { delete_records_on(&c, &k, false).await },
            )
            .await;
        dropped.extend(
            visited
                .ok()
                .flatten()
                .ok_or_else(ApiError::owner_unavailable)?,
        );
    }
    Ok(dropped)
}

/// Delete `key`'s bucket records in core `c`'s shards: the authoritative one (in the shard
/// that is its home), or the copies. The numbers of the shards it went through (each now
/// without its copy, or its record), or `None` if a deletion did not become durable.
async fn delete_records_on(c: &Core, key: &str, authoritative: bool) -> Option<Vec<u32>> {
    let mut visited = Vec::new();
    for shard in c.shards() {
        if c.is_home_of(&shard, key) != authoritative {
            continue;
        }
        if let Some(id) = shard.lookup(key) {
            shard.delete(id).ok()?.durable().await.ok()?;
        }
        visited.push(shard.config().shard);
    }
    Some(visited)
}

/// After `lane` was adopted: give the bucket copies its log carried here the settings
/// their records hold now, and drop copies of buckets that are gone. A change made while
/// the lane moved reached every host's copies but this lane's, which no host ran then;
/// from its installation on, changes reach it as they reach any lane. Tried again while a
/// record's lane moves or its host cannot be reached.
pub fn refresh_after_adoption(core: Rc<Core>, lane: u32) {
    monoio::spawn(async move { refresh_adopted_copies(&core, lane).await });
}

/// [`refresh_after_adoption`]'s task: each bucket copy in turn.
async fn refresh_adopted_copies(core: &Rc<Core>, lane: u32) {
    let owner = Placement::core_of_shard(lane as usize, core.cores());
    let buckets = core
        .on(owner, move |c| async move {
            let Some(shard) = c.running_shard(lane) else {
                return Vec::new();
            };
            let copies = shard.keys_starting_with("k/");
            copies
                .iter()
                .filter(|k| !c.is_home_of(&shard, k))
                .filter_map(|k| k.strip_prefix("k/").map(str::to_string))
                .collect()
        })
        .await
        .unwrap_or_default();
    for bucket in buckets {
        let started = Instant::now();
        let mut pause = REFRESH_FIRST_PAUSE;
        while let Err(e) = refresh_copy(core, lane, owner, &bucket).await {
            if started.elapsed() >= REFRESH_FOR {
                tracing::warn!(
                    lane,
                    bucket,
                    "could not refresh an adopted lane's bucket copy: {}",
                    e.reason()
                );
                break;
            }
            tracing::debug!(
                lane,
                bucket,
                "refreshing an adopted lane's bucket copy: {}",
                e.reason()
            );
            monoio::time::sleep(pause).await;
            pause = (pause * 2).min(REFRESH_LONGEST_PAUSE);
        }
    }
}

/// How long an adopted lane's bucket copy is tried, and the pauses between tries.
const REFRESH_FOR: Duration = Duration::from_secs(600);
const REFRESH_FIRST_PAUSE: Duration = Duration::from_millis(200);
const REFRESH_LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// Make lane `lane`'s copy of `bucket` (on core `owner`) what the record says. Repeats
/// until the record still says what was last written: a change racing this one reaches
/// the copy in either order, and the last write must be the newest.
async fn refresh_copy(
    core: &Rc<Core>,
    lane: u32,
    owner: usize,
    bucket: &str,
) -> Result<(), ApiError> {
    let mut written: Option<Option<Bytes>> = None;
    loop {
        let now = record(core, bucket).await?;
        if written.as_ref() == Some(&now) {
            return Ok(());
        }
        let (b, blob) = (bucket.to_string(), now.clone());
        let done = core
            .on(owner, move |c| async move {
                // Released again meanwhile: its next owner refreshes it.
                let Some(shard) = c.running_shard(lane) else {
                    return true;
                };
                let Some(id) = shard.lookup(&bucket_key(&b)) else {
                    return true;
                };
                match blob {
                    Some(ext) => replicate(&shard, &b, ext).await,
                    None => match shard.delete(id) {
                        Ok(commit) => commit.durable().await.is_ok(),
                        Err(_) => false,
                    },
                }
            })
            .await;
        if !matches!(done, Ok(true)) {
            return Err(ApiError::owner_unavailable());
        }
        let limit = now
            .as_ref()
            .and_then(|ext| BucketSettings::decode(ext).rate_limit);
        core.bucket_limits.set(bucket, limit);
        written = Some(now);
    }
}

// ---------------------------------------------------------------------------------------
// Across the hosts of a cluster. Hosts ask each other through `peer`, at
// `/__ursula/buckets/...` (see `admin`).

/// Relay a request for `bucket` itself to the host that owns its record's lane, and its
/// answer back. A request another host forwarded here is not forwarded again: this host
/// no longer serving the lane means it is moving, a retry.
async fn forward(core: &Rc<Core>, host: &str, req: &Request) -> Handled {
    if req.header(crate::peer::CALL_HEADER).is_some() {
        let lane = core.placement.shard_of(&bucket_key_of(req)) as u32;
        return Err(ApiError::NotServed { shard: lane }.into());
    }
    let path = if req.query.is_empty() {
        req.path.clone()
    } else {
        format!("{}?{}", req.path, req.query)
    };
    let answer = crate::peer::call(core, host, req.method.as_str(), &path, req.body.clone())
        .await
        .map_err(|e| e.refusal())?;
    let mut resp = Response::new(answer.status).header("cache-control", "no-store");
    if let Some(t) = answer.content_type {
        resp.push("content-type", t);
    }
    // The owner made it absolute on its own address: made again on this one's.
    if let Some(l) = answer.location {
        let path = match l.find("://") {
            Some(i) => l[i + 3..].find('/').map_or("/", |j| &l[i + 3 + j..]),
            None => l.as_str(),
        };
        resp.push("location", path.to_string());
    }
    Ok(resp.with_body(vec![answer.body]))
}

/// The record key of the bucket a `/{bucket}` request names.
fn bucket_key_of(req: &Request) -> String {
    let bucket = req
        .path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    bucket_key(bucket)
}

/// What one host is asked for its part of a listing or count.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "part", rename_all = "snake_case")]
enum PartAsk {
    Streams {
        bucket: String,
        sel: OwnedSelection,
        most: usize,
    },
    Counts {
        buckets: Vec<String>,
    },
    Buckets {
        sel: OwnedSelection,
        most: usize,
        visible: Option<BucketScope>,
    },
}

/// One host's part: what was asked for, over the lanes it served.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct PartAnswer {
    lanes: Vec<u32>,
    #[serde(default)]
    streams: Vec<Entry>,
    #[serde(default)]
    counts: Vec<usize>,
    #[serde(default)]
    buckets: Vec<String>,
}

/// The other hosts' parts of `ask` (none without a cluster). Refused as a retry unless this
/// host's lanes and theirs are every lane: a lane moving between hosts would be left out.
async fn other_parts(core: &Rc<Core>, ask: &PartAsk) -> Result<Vec<PartAnswer>, ApiError> {
    let answers = on_every_other_host(core, "/__ursula/buckets/part", ask, 200).await?;
    let mut covered = core.lanes.served();
    let mut parts = Vec::new();
    for answer in answers {
        let part: PartAnswer = sonic_rs::from_slice(&answer.body).map_err(|_| {
            ApiError::BadGateway("a host of the cluster sent a malformed listing".into())
        })?;
        covered.extend(&part.lanes);
        parts.push(part);
    }
    covered.sort_unstable();
    covered.dedup();
    if covered.len() as u32 != core.lanes.lanes() {
        return Err(ApiError::lanes_moving());
    }
    Ok(parts)
}

/// Make the call `path` with `call` (as JSON) on every other host (none without a
/// cluster), each of which must answer with `status`.
async fn on_every_other_host(
    core: &Rc<Core>,
    path: &str,
    call: &impl serde::Serialize,
    status: u16,
) -> Result<Vec<crate::peer::Answer>, ApiError> {
    if !core.lanes.cluster() {
        return Ok(Vec::new());
    }
    let body = Bytes::from(sonic_rs::to_vec(call).unwrap_or_default());
    let mut answers = Vec::new();
    for host in crate::lanes::other_hosts(core).await? {
        let answer = crate::peer::post(core, &host, path, body.clone())
            .await
            .map_err(|e| e.refusal())?;
        if answer.status != status {
            return Err(answer.refusal(path));
        }
        answers.push(answer);
    }
    Ok(answers)
}

/// `POST /__ursula/buckets/part`: this host's part of another host's listing or count.
pub async fn serve_part(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(ask) = sonic_rs::from_slice::<PartAsk>(body) else {
        return ApiError::InvalidJson.response();
    };
    let lanes = core.lanes.served();
    let part = match ask {
        PartAsk::Streams { bucket, sel, most } => PartAnswer {
            lanes,
            streams: local_entries(core, &bucket, sel.get(), most).await,
            ..PartAnswer::default()
        },
        PartAsk::Counts { buckets } => PartAnswer {
            lanes,
            counts: local_stream_counts(core, buckets).await,
            ..PartAnswer::default()
        },
        PartAsk::Buckets { sel, most, visible } => PartAnswer {
            lanes,
            buckets: local_bucket_ids(core, sel.get(), visible.map(Arc::new), most).await,
            ..PartAnswer::default()
        },
    };
    json_answer(sonic_rs::to_vec(&part).unwrap_or_default())
}

fn json_answer(body: Vec<u8>) -> Response {
    Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(body)])
}

/// Which bucket a host-to-host bucket call is about, and for a copy its settings.
#[derive(serde::Serialize, serde::Deserialize)]
struct BucketCall {
    bucket: String,
    #[serde(default)]
    settings: Option<String>,
}

/// The settings blob of `bucket`'s record on the host at `host`, which owns its lane.
async fn record_from(core: &Rc<Core>, host: &str, bucket: &str) -> Result<Option<Bytes>, ApiError> {
    let call = BucketCall {
        bucket: bucket.to_string(),
        settings: None,
    };
    let body = Bytes::from(sonic_rs::to_vec(&call).unwrap_or_default());
    let answer = crate::peer::post(core, host, "/__ursula/buckets/record", body)
        .await
        .map_err(|e| e.refusal())?;
    match answer.status {
        200 => Ok(Some(answer.body)),
        404 => Ok(None),
        _ => Err(answer.refusal("/__ursula/buckets/record")),
    }
}

/// `POST /__ursula/buckets/record`: the settings blob of a bucket whose record's lane this
/// host serves (`200`), or `404`.
pub async fn serve_record(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(call) = sonic_rs::from_slice::<BucketCall>(body) else {
        return ApiError::InvalidJson.response();
    };
    let key = bucket_key(&call.bucket);
    if let Err(refused) = core.lanes.check(core.placement.shard_of(&key)) {
        return crate::lanes::refusal(core, refused).response();
    }
    match record(core, &call.bucket).await {
        Ok(Some(ext)) => Response::new(200)
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .with_body(vec![ext]),
        Ok(None) => ApiError::BucketNotFound.response(),
        Err(e) => e.response(),
    }
}

/// Give every other host's copies of `bucket` the settings `ext` (after a change).
async fn copy_to_other_hosts(core: &Rc<Core>, bucket: &str, ext: &Bytes) -> Result<(), ApiError> {
    let call = BucketCall {
        bucket: bucket.to_string(),
        settings: Some(String::from_utf8_lossy(ext).into_owned()),
    };
    on_other_hosts(core, "/__ursula/buckets/copy", &call).await
}

/// Remove every other host's copies of `bucket` (before its record goes). Returns the
/// lanes whose copies they removed.
async fn drop_on_other_hosts(core: &Rc<Core>, bucket: &str) -> Result<Vec<u32>, ApiError> {
    let call = BucketCall {
        bucket: bucket.to_string(),
        settings: None,
    };
    let path = "/__ursula/buckets/drop";
    let mut lanes = Vec::new();
    for answer in on_every_other_host(core, path, &call, 200).await? {
        let dropped: Dropped = sonic_rs::from_slice(&answer.body).map_err(|_| {
            ApiError::BadGateway("a host of the cluster sent a malformed answer".into())
        })?;
        lanes.extend(dropped.lanes);
    }
    Ok(lanes)
}

/// A host's answer to `/__ursula/buckets/drop`: the lanes it removed the copies from.
#[derive(serde::Serialize, serde::Deserialize)]
struct Dropped {
    lanes: Vec<u32>,
}

/// Make `call` at `path` on every other host; each must answer `204`.
async fn on_other_hosts(core: &Rc<Core>, path: &str, call: &BucketCall) -> Result<(), ApiError> {
    on_every_other_host(core, path, call, 204).await.map(drop)
}

/// `POST /__ursula/buckets/copy`: give this host's copies of a bucket the settings its
/// record was given on the host that owns it.
pub async fn serve_copy(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(BucketCall {
        bucket,
        settings: Some(settings),
    }) = sonic_rs::from_slice::<BucketCall>(body)
    else {
        return ApiError::InvalidJson.response();
    };
    let ext = Bytes::from(settings);
    for i in 0..core.cores() {
        let (b, blob) = (bucket.clone(), ext.clone());
        let done = core
            .on(
                i,
                move |c| async move { update_copies_on(&c, &b, &blob).await },
            )
            .await;
        if !matches!(done, Ok(true)) {
            return ApiError::owner_unavailable().response();
        }
    }
    core.bucket_limits
        .set(&bucket, BucketSettings::decode(&ext).rate_limit);
    Response::new(204).header("cache-control", "no-store")
}

/// Give the copies of `bucket` core `c`'s shards hold the settings `ext` (a shard without
/// one gets it from the record when it next needs it). True when every change is durable.
async fn update_copies_on(c: &Core, bucket: &str, ext: &Bytes) -> bool {
    for shard in c.shards() {
        if exists_in(&shard, bucket) && !replicate(&shard, bucket, ext.clone()).await {
            return false;
        }
    }
    true
}

/// `POST /__ursula/buckets/drop`: remove this host's copies of a bucket being deleted on
/// the host that owns its record, and answer with the lanes they were removed from.
pub async fn serve_drop(core: &Rc<Core>, body: &[u8]) -> Response {
    let Ok(call) = sonic_rs::from_slice::<BucketCall>(body) else {
        return ApiError::InvalidJson.response();
    };
    // Only copies: the record itself stays, should its lane have come here.
    let lanes = match drop_copies_here(core, &bucket_key(&call.bucket)).await {
        Ok(lanes) => lanes,
        Err(e) => return e.response(),
    };
    core.bucket_limits.set(&call.bucket, None);
    json_answer(sonic_rs::to_vec(&Dropped { lanes }).unwrap_or_default())
}

//! Operational endpoints: liveness, readiness, Prometheus metrics, and the lane map.
//!
//! They live under `/__ursula/` on the main listener, because a first path segment that
//! starts with `__` can never be a bucket (protocol.md D21), whereas `/healthz` or
//! `/metrics` are valid bucket IDs. The optional admin listener (`metrics_listen`) serves
//! only these endpoints and also answers the bare `/healthz`, `/readyz` and `/metrics`.
//!
//! Counters are plain `Cell`s owned by each core (`metrics`), so the request path never
//! touches shared memory; a scrape asks every core for a snapshot through the normal
//! cross-core hop and renders them with `prometheus-client`.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use ursula_protocol::http1::Method;
use ursula_storage::placement::Placement;
use ursula_storage::shard::{COMMIT_BYTES_BUCKETS, COMMIT_WRITE_BUCKETS_US};
use ursula_storage::{DiskUsage, HeapUsage, ShardStats};
use ursula_storage::{S3WalStats, S3_PUT_SECONDS_BUCKETS};

use crate::config::StorageMode;
use crate::core::Core;
use crate::http::{ApiError, Request, Response};
use crate::lane_table::LaneState;
use crate::metrics::{
    AppendTimes, LoopLag, APPEND_DURATION_BUCKETS_US, APPEND_TIMING_SAMPLE, LOOP_LAG_BUCKETS_US,
};
use crate::rate_limit::Limit;

/// Set once every core has recovered its shard and is accepting connections.
static STARTED: AtomicBool = AtomicBool::new(false);

pub fn mark_started() {
    STARTED.store(true, Ordering::SeqCst);
}

fn started() -> bool {
    STARTED.load(Ordering::SeqCst)
}

/// Which listener a connection arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    Main,
    Admin,
}

/// The internal endpoint a path names, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Ready,
    Metrics,
    Lanes,
    /// `POST /__ursula/lanes/N/adopt` or `/release` (a cluster's manual lane moves).
    LaneMove(u32, LaneMove),
    /// `POST /__ursula/forks/take` or `/release`: another cluster host's fork of a stream
    /// on a lane this host serves (see `handlers::fork` and `removal`).
    Fork(ForkCall),
    /// `POST /__ursula/buckets/part`, `/record`, `/copy` or `/drop`: another cluster
    /// host's question or change about buckets (see `handlers::buckets`).
    Bucket(BucketCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketCall {
    Part,
    Record,
    Copy,
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkCall {
    Take,
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneMove {
    Adopt,
    Release,
}

/// `Some` when the request is for an operational endpoint on this listener (or, on the
/// admin listener, for anything at all: it serves nothing else).
pub fn endpoint(listener: Listener, path: &str) -> Option<Option<Endpoint>> {
    let named = |p: &str| match p {
        "healthz" => Some(Endpoint::Health),
        "readyz" => Some(Endpoint::Ready),
        "metrics" => Some(Endpoint::Metrics),
        "lanes" => Some(Endpoint::Lanes),
        "forks/take" => Some(Endpoint::Fork(ForkCall::Take)),
        "forks/release" => Some(Endpoint::Fork(ForkCall::Release)),
        "buckets/part" => Some(Endpoint::Bucket(BucketCall::Part)),
        "buckets/record" => Some(Endpoint::Bucket(BucketCall::Record)),
        "buckets/copy" => Some(Endpoint::Bucket(BucketCall::Copy)),
        "buckets/drop" => Some(Endpoint::Bucket(BucketCall::Drop)),
        other => {
            let (lane, action) = other.strip_prefix("lanes/")?.split_once('/')?;
            let action = match action {
                "adopt" => LaneMove::Adopt,
                "release" => LaneMove::Release,
                _ => return None,
            };
            Some(Endpoint::LaneMove(lane.parse().ok()?, action))
        }
    };
    match listener {
        Listener::Main => path.strip_prefix("/__ursula/").map(named),
        Listener::Admin => {
            let rest = path.strip_prefix("/__ursula/").or(path.strip_prefix('/'));
            Some(rest.and_then(named))
        }
    }
}

/// Answer an operational request.
pub async fn handle(
    core: &Rc<Core>,
    listener: Listener,
    endpoint: Option<Endpoint>,
    req: &Request,
) -> Response {
    let Some(endpoint) = endpoint else {
        return ApiError::NotFound("no such resource").response();
    };
    if let Endpoint::LaneMove(lane, action) = endpoint {
        if req.method != Method::Post {
            return ApiError::MethodNotAllowed {
                allow: "POST",
                reason: "a lane moves with POST",
            }
            .response();
        }
        return move_lane(core, lane, action, &req.query).await;
    }
    if matches!(endpoint, Endpoint::Fork(_) | Endpoint::Bucket(_)) {
        if req.method != Method::Post {
            return ApiError::MethodNotAllowed {
                allow: "POST",
                reason: "hosts call each other with POST",
            }
            .response();
        }
        use crate::handlers::{buckets, fork};
        let body = &req.body;
        return match endpoint {
            Endpoint::Fork(ForkCall::Take) => fork::serve_take(core, body).await,
            Endpoint::Fork(ForkCall::Release) => crate::removal::serve_release(core, body).await,
            Endpoint::Bucket(BucketCall::Part) => buckets::serve_part(core, body).await,
            Endpoint::Bucket(BucketCall::Record) => buckets::serve_record(core, body).await,
            Endpoint::Bucket(BucketCall::Copy) => buckets::serve_copy(core, body).await,
            Endpoint::Bucket(BucketCall::Drop) => buckets::serve_drop(core, body).await,
            _ => ApiError::NotFound("no such resource").response(),
        };
    }
    if !matches!(req.method, Method::Get | Method::Head) {
        return ApiError::MethodNotAllowed {
            allow: "GET, HEAD",
            reason: "method not allowed",
        }
        .response();
    }
    match endpoint {
        Endpoint::Health => text(200, "ok\n"),
        Endpoint::Ready => ready(core).await,
        // With an admin listener, metrics stay off the (possibly public) main listener.
        Endpoint::Metrics if listener == Listener::Main && core.config.metrics_listen.is_some() => {
            ApiError::NotFound("metrics are served on the admin listener").response()
        }
        Endpoint::Metrics => metrics(core).await,
        Endpoint::Lanes => lanes(core),
        Endpoint::LaneMove(..) | Endpoint::Fork(_) | Endpoint::Bucket(_) => {
            ApiError::NotFound("no such resource").response()
        }
    }
}

/// Adopt or release a lane (see `lanes`), answering with what it took as JSON, or why it
/// could not move as plain text.
async fn move_lane(core: &Rc<Core>, lane: u32, action: LaneMove, query: &str) -> Response {
    use crate::lanes::MoveError;
    let force = query
        .split('&')
        .any(|kv| kv == "force=1" || kv == "force=true");
    let moved = match action {
        LaneMove::Adopt => crate::lanes::adopt(core, lane, force).await.map(|a| {
            format!(
                "{{\"lane\":{},\"epoch\":{},\"previous_owner\":{},\"restored_bytes\":{},\
                 \"restored_objects\":{},\"claim_ms\":{},\"restore_ms\":{},\"open_ms\":{},\
                 \"ms\":{}}}\n",
                a.lane,
                a.epoch,
                sonic_rs::to_string(&a.previous_owner).unwrap_or_else(|_| "null".into()),
                a.restored_bytes,
                a.restored_objects,
                a.claim.as_millis(),
                a.restore.as_millis(),
                a.open.as_millis(),
                a.took.as_millis()
            )
        }),
        LaneMove::Release => crate::lanes::release(core, lane).await.map(|r| {
            format!(
                "{{\"lane\":{},\"archived_lsn\":{},\"ms\":{}}}\n",
                r.lane,
                r.archived_lsn,
                r.took.as_millis()
            )
        }),
    };
    match moved {
        Ok(json) => Response::new(200)
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .with_body(vec![Bytes::from(json)]),
        Err(e) => {
            let status = match &e {
                MoveError::NotCluster => 400,
                MoveError::NoSuchLane(_) => 404,
                MoveError::AlreadyServed(_)
                | MoveError::NotServed(_)
                | MoveError::Moving(_)
                | MoveError::Owned { .. } => 409,
                MoveError::Cold { .. } | MoveError::Unarchived { .. } => 503,
                MoveError::CoreUnavailable(_) => 503,
                MoveError::Open { .. } | MoveError::Stop { .. } => 500,
            };
            let resp = text(status, &format!("{e}\n"));
            if status == 503 {
                resp.header("retry-after", "1")
            } else {
                resp
            }
        }
    }
}

/// Where each lane lives: its core, and the core's own port when `core_listen` is set.
/// A proxy's lane map is built from this (`deploy/haproxy/`).
fn lanes(core: &Core) -> Response {
    use std::fmt::Write;
    let placement = core.placement;
    let port = |c: usize| {
        core.config.core_listen.map_or("null".to_string(), |a| {
            (usize::from(a.port()) + c).to_string()
        })
    };
    let mut out = String::with_capacity(64 + 40 * placement.lanes().unwrap_or(0) as usize);
    let kind = if placement.lanes().is_some() {
        "crc32c"
    } else {
        "fnv1a"
    };
    let logs = if placement.log_per_lane() {
        "lane"
    } else {
        "core"
    };
    let node = crate::cold::archive()
        .filter(|_| core.lanes.cluster())
        .map_or("null".to_string(), |a| {
            sonic_rs::to_string(a.owner()).unwrap_or_else(|_| "null".into())
        });
    let _ = write!(
        out,
        "{{\"placement\":\"{kind}\",\"logs\":\"{logs}\",\"cluster\":{},\"node\":{node},\
         \"cores\":{},\"lane_count\":{},\"core_ports\":[",
        core.lanes.cluster(),
        core.cores(),
        placement
            .lanes()
            .map_or("null".to_string(), |l| l.to_string()),
    );
    for c in 0..core.cores() {
        let _ = write!(out, "{}{}", if c > 0 { "," } else { "" }, port(c));
    }
    out.push_str("],\"lanes\":[");
    // Each shard's archive (with a cold tier): its owner, epoch and lag.
    let archive: Vec<String> = (0..placement.shards())
        .map(|shard| {
            let state = crate::cold::archive().and_then(|a| a.shard_state(shard));
            state.map_or("null".to_string(), |st| {
                format!(
                    "{{\"owner\":{},\"address\":{},\"epoch\":{},\"archived_lsn\":{},\"lag_bytes\":{}}}",
                    sonic_rs::to_string(&st.owner).unwrap_or_else(|_| "null".into()),
                    sonic_rs::to_string(&st.address).unwrap_or_else(|_| "null".into()),
                    st.epoch,
                    st.archived_lsn,
                    st.lag_bytes
                )
            })
        })
        .collect();
    for lane in 0..placement.lanes().unwrap_or(0) {
        let shard = placement.shard_of_lane(lane).unwrap_or(0);
        let c = Placement::core_of_shard(shard, core.cores());
        let state = match core.lanes.state(shard as u32) {
            LaneState::Served => "served",
            LaneState::Moving => "moving",
            LaneState::Elsewhere => "elsewhere",
        };
        let owner = core
            .lanes
            .owner(shard as u32)
            .filter(|_| state == "elsewhere")
            .map_or("null".to_string(), |o| {
                sonic_rs::to_string(&o).unwrap_or_else(|_| "null".into())
            });
        let _ = write!(
            out,
            "{}{{\"lane\":{lane},\"shard\":{shard},\"core\":{c},\"port\":{},\"state\":\"{state}\",\
             \"owner_address\":{owner},\"archive\":{}}}",
            if lane > 0 { "," } else { "" },
            port(c),
            archive.get(shard).map_or("null", String::as_str)
        );
    }
    out.push_str("]}\n");
    Response::new(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(out)])
}

fn text(status: u16, body: &str) -> Response {
    Response::new(status)
        .header("content-type", "text/plain; charset=utf-8")
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::copy_from_slice(body.as_bytes())])
}

/// Ready when start-up has finished, no shutdown has begun and no shard has stopped
/// accepting writes after a failed log write.
async fn ready(core: &Rc<Core>) -> Response {
    if !started() {
        return text(503, "starting\n").header("retry-after", "1");
    }
    if core.shutting_down() {
        return text(503, "stopping\n");
    }
    if let Some(why) = crate::cold::archive().and_then(|a| a.status.fenced()) {
        return text(503, &format!("cold tier archiving stopped: {why}\n"));
    }
    for index in 0..core.cores() {
        let failed = |c: Rc<Core>| async move {
            c.shards()
                .iter()
                .find_map(|s| s.failure().map(|why| (s.config().shard, why)))
        };
        match core.on(index, failed).await {
            Ok(None) => {}
            Ok(Some((shard, why))) => return text(503, &format!("shard {shard} failed: {why}\n")),
            Err(_) => return text(503, &format!("core {index} unavailable\n")),
        }
    }
    text(200, "ready\n")
}

async fn metrics(core: &Rc<Core>) -> Response {
    let mut cores = Vec::with_capacity(core.cores());
    let mut shards = Vec::with_capacity(core.cores());
    for index in 0..core.cores() {
        match core.on(index, |c| async move { snapshot(&c) }).await {
            Ok((c, s)) => {
                cores.push(c);
                shards.extend(s);
            }
            Err(_) => return text(503, &format!("core {index} unavailable\n")),
        }
    }
    shards.sort_by_key(|s| s.shard);
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Scrape {
        cores,
        shards,
        ready: started() && !core.shutting_down(),
        process: ProcessSnapshot::now(core),
        throttled: core.bucket_limits.throttled(),
        cluster: core.lanes.cluster().then(|| core.lanes.clone()),
    }));
    let mut out = String::with_capacity(16 * 1024);
    if prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).is_err() {
        return text(500, "metrics encoding failed\n");
    }
    Response::new(200)
        .header(
            "content-type",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )
        .header("cache-control", "no-store")
        .with_body(vec![Bytes::from(out)])
}

/// Everything a scrape reports about one core.
#[derive(Debug)]
struct CoreSnapshot {
    core: usize,
    requests: Vec<((&'static str, &'static str, u16), u64)>,
    append_bytes: u64,
    read_bytes: u64,
    sse_open: u64,
    moved_out: u64,
    handed_over: u64,
    loop_lag: LoopLag,
    append_times: AppendTimes,
    waiting_readers: usize,
    connections: usize,
    inflight: usize,
}

/// Everything a scrape reports about one shard.
#[derive(Debug)]
struct ShardSnapshot {
    shard: usize,
    stats: ShardStats,
    unflushed_bytes: u64,
    disk: Option<DiskUsage>,
    cache_bytes: usize,
    write_budget_bytes: usize,
    streams: usize,
    dormant_streams: usize,
    heap: HeapUsage,
    failed: bool,
    /// With `--durability s3`.
    s3_wal: Option<S3WalStats>,
}

fn snapshot(core: &Rc<Core>) -> (CoreSnapshot, Vec<ShardSnapshot>) {
    let m = &core.metrics;
    let (connections, waiting_readers) = (
        core.connections(),
        core.waiting_on_streams() + crate::live::feed::waiting(),
    );
    let snapshot = CoreSnapshot {
        core: core.index,
        requests: m.requests.borrow().iter().map(|(k, v)| (*k, *v)).collect(),
        append_bytes: m.append_bytes.get(),
        read_bytes: m.read_bytes.get(),
        sse_open: m.sse_open.get(),
        moved_out: m.moved_out.get(),
        handed_over: m.handed_over.get(),
        loop_lag: *m.loop_lag.borrow(),
        append_times: *m.append_times.borrow(),
        waiting_readers,
        connections,
        inflight: core.inflight.get(),
    };
    let disk = core.config.storage == StorageMode::Disk;
    let shards = core
        .shards()
        .iter()
        .map(|shard| {
            let (streams, dormant_streams) = shard.stream_counts();
            ShardSnapshot {
                shard: shard.config().shard as usize,
                stats: shard.stats(),
                unflushed_bytes: shard.unflushed_bytes(),
                disk: disk.then(|| shard.disk_usage()),
                cache_bytes: shard.resident_bytes(),
                write_budget_bytes: shard.config().write_budget_bytes,
                streams,
                dormant_streams,
                heap: shard.heap_usage(),
                failed: shard.failure().is_some(),
                s3_wal: shard.s3_wal_stats(),
            }
        })
        .collect();
    (snapshot, shards)
}

/// One scrape's data, encoded by `prometheus-client`.
#[derive(Debug)]
struct Scrape {
    cores: Vec<CoreSnapshot>,
    /// Every shard of every core, by number.
    shards: Vec<ShardSnapshot>,
    ready: bool,
    process: ProcessSnapshot,
    /// Each rate-limited bucket's refused appends (see `rate_limit`).
    throttled: Vec<(String, [u64; 2])>,
    /// A cluster host's lane table (its states and counters).
    cluster: Option<std::sync::Arc<crate::lane_table::LaneTable>>,
}

/// What a scrape reports about the process and the file system under its data dir.
#[derive(Debug)]
struct ProcessSnapshot {
    /// Resident memory, from `/proc/self/statm` (None where that is unreadable).
    resident_bytes: Option<u64>,
    /// Open file descriptors: entries of `/proc/self/fd`.
    open_fds: Option<u64>,
    /// Size and space left for unprivileged writers of the data dir's file system (disk
    /// engine only).
    filesystem: Option<(u64, u64)>,
}

impl ProcessSnapshot {
    fn now(core: &Core) -> ProcessSnapshot {
        let disk = core.config.storage == StorageMode::Disk;
        ProcessSnapshot {
            resident_bytes: resident_bytes(),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            filesystem: disk
                .then(|| filesystem_space(&core.config.data_dir))
                .flatten(),
        }
    }
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant; it has no memory arguments.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The size of the file system holding `dir`, and the bytes left on it for writers that
/// are not root (what the server, running unprivileged, can still use).
fn filesystem_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `st` points at
    // writable memory of the size statvfs fills; it is read only after a zero return,
    // which means statvfs filled it.
    let st = unsafe {
        if libc::statvfs(path.as_ptr(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    let frag = st.f_frsize;
    Some((st.f_blocks * frag, st.f_bavail * frag))
}

/// A histogram whose buckets were counted elsewhere (by the storage shard).
struct BucketCounts {
    sum: f64,
    count: u64,
    /// Upper bound and the (non-cumulative) count of each bucket; the last is +Inf.
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for BucketCounts {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl BucketCounts {
    /// Buckets with upper bounds `bounds_us` (microseconds) then +Inf, and their counts.
    fn from_micros(bounds_us: &[u64], counts: &[u64], sum_nanos: u64, count: u64) -> Self {
        let buckets = bounds_us
            .iter()
            .map(|&us| us as f64 / 1e6)
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts.iter().copied())
            .collect();
        BucketCounts {
            sum: sum_nanos as f64 / 1e9,
            count,
            buckets,
        }
    }
}

fn loop_lag_histogram(lag: &LoopLag) -> BucketCounts {
    BucketCounts::from_micros(&LOOP_LAG_BUCKETS_US, &lag.buckets, lag.sum_nanos, lag.count)
}

fn commit_bytes_histogram(stats: &ShardStats) -> BucketCounts {
    let buckets = COMMIT_BYTES_BUCKETS
        .iter()
        .map(|&bytes| bytes as f64)
        .chain(std::iter::once(f64::INFINITY))
        .zip(stats.commit_bytes_buckets.iter().copied())
        .collect();
    BucketCounts {
        sum: stats.bytes_flushed as f64,
        count: stats.flushes,
        buckets,
    }
}

fn commit_write_histogram(stats: &ShardStats) -> BucketCounts {
    BucketCounts::from_micros(
        &COMMIT_WRITE_BUCKETS_US,
        &stats.commit_write_buckets,
        stats.commit_write_nanos,
        stats.commit_writes,
    )
}

type Labels<'a> = [(&'static str, String); 1];

fn per_core<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    rows: impl Iterator<Item = (usize, M)>,
) -> Result<(), std::fmt::Error> {
    let mut rows = rows.peekable();
    let Some((_, first)) = rows.peek() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (index, metric) in rows {
        let labels: Labels = [(label, index.to_string())];
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ready = ConstGauge::new(i64::from(self.ready));
        ready.encode(e.encode_descriptor(
            "ursula_ready",
            "1 when start-up has finished and shutdown has not begun",
            None,
            ready.metric_type(),
        )?)?;

        encode_process(&mut e, &self.process)?;
        encode_requests(&mut e, &self.cores)?;
        encode_cores(&mut e, &self.cores)?;
        encode_storage(&mut e, &self.shards)?;
        encode_storage_space(&mut e, &self.shards)?;
        encode_s3_wal(&mut e, &self.shards)?;
        encode_streams_and_memory(&mut e, &self.shards)?;
        encode_throttled(&mut e, &self.throttled)?;
        if let Some(archive) = crate::cold::archive() {
            encode_cold(&mut e, &archive.status)?;
        }
        if let Some(lanes) = &self.cluster {
            encode_cluster(&mut e, lanes)?;
        }
        Ok(())
    }
}

/// The build, the process's memory and descriptors, and the data dir's file system.
fn encode_process(e: &mut DescriptorEncoder, p: &ProcessSnapshot) -> Result<(), std::fmt::Error> {
    let info = ConstGauge::new(1);
    let labels: Labels = [("version", env!("CARGO_PKG_VERSION").to_string())];
    info.encode(
        e.encode_descriptor(
            "ursula_build_info",
            "Always 1; the version label names the running build",
            None,
            info.metric_type(),
        )?
        .encode_family(&labels)?,
    )?;
    let single = |e: &mut DescriptorEncoder, name: &str, help: &str, v: Option<u64>| {
        let Some(v) = v else { return Ok(()) };
        let g = gauge(v);
        g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
    };
    single(
        e,
        "process_resident_memory_bytes",
        "Resident memory of the server process",
        p.resident_bytes,
    )?;
    single(
        e,
        "process_open_fds",
        "Open file descriptors of the server process",
        p.open_fds,
    )?;
    single(
        e,
        "ursula_storage_filesystem_size_bytes",
        "Size of the file system holding the data dir",
        p.filesystem.map(|(size, _)| size),
    )?;
    single(
        e,
        "ursula_storage_filesystem_free_bytes",
        "Bytes left for the server's writes on the file system holding the data dir",
        p.filesystem.map(|(_, free)| free),
    )?;
    Ok(())
}

/// Appends each rate-limited bucket refused, by the limit that refused them.
fn encode_throttled(
    e: &mut DescriptorEncoder,
    throttled: &[(String, [u64; 2])],
) -> Result<(), std::fmt::Error> {
    if throttled.is_empty() {
        return Ok(());
    }
    let mut family = e.encode_descriptor(
        "ursula_bucket_throttled",
        "Appends refused with 429 by a bucket's rate limit (limit: appends or bytes per \
         second), for the buckets that have one",
        None,
        MetricType::Counter,
    )?;
    for (bucket, counts) in throttled {
        for (limit, n) in [Limit::Appends, Limit::Bytes].into_iter().zip(counts) {
            let labels = [
                ("bucket", bucket.clone()),
                ("limit", limit.label().to_string()),
            ];
            counter(*n).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn counter(v: u64) -> ConstCounter {
    ConstCounter::new(v)
}

fn gauge(v: u64) -> ConstGauge {
    ConstGauge::new(v as i64)
}

/// Requests by route, method and status, summed over the cores that accepted them.
fn encode_requests(
    e: &mut DescriptorEncoder,
    cores: &[CoreSnapshot],
) -> Result<(), std::fmt::Error> {
    let mut requests: HashMap<(&str, &str, u16), u64> = HashMap::new();
    for c in cores {
        for (k, v) in &c.requests {
            *requests.entry(*k).or_insert(0) += v;
        }
    }
    let mut requests: Vec<_> = requests.into_iter().collect();
    requests.sort_unstable();
    let mut family = e.encode_descriptor(
        "ursula_http_requests",
        "HTTP requests answered, by route family, method and status",
        None,
        MetricType::Counter,
    )?;
    for ((route, method, status), n) in requests {
        let labels = [
            ("route", route.to_string()),
            ("method", method.to_string()),
            ("status", status.to_string()),
        ];
        counter(n).encode(family.encode_family(&labels)?)?;
    }

    Ok(())
}

/// Each core's connections, requests, bytes and event loop.
fn encode_cores(e: &mut DescriptorEncoder, cores: &[CoreSnapshot]) -> Result<(), std::fmt::Error> {
    let c = || cores.iter();
    per_core(
        e,
        "ursula_core_requests",
        "HTTP requests answered by each core's connections",
        "core",
        c().map(|s| (s.core, counter(s.requests.iter().map(|(_, v)| v).sum()))),
    )?;
    per_core(
        e,
        "ursula_append_bytes",
        "Body bytes of successful POST requests (appends, batches)",
        "core",
        c().map(|s| (s.core, counter(s.append_bytes))),
    )?;
    per_core(
        e,
        "ursula_read_bytes",
        "Body bytes of successful GET responses, SSE events included",
        "core",
        c().map(|s| (s.core, counter(s.read_bytes))),
    )?;
    per_core(
        e,
        "ursula_connections",
        "Open client connections",
        "core",
        c().map(|s| (s.core, gauge(s.connections as u64))),
    )?;
    per_core(
        e,
        "ursula_connections_moved",
        "Keep-alive connections this core handed to the core owning their stream",
        "core",
        c().map(|s| (s.core, counter(s.moved_out))),
    )?;
    per_core(
        e,
        "ursula_requests_handed_over",
        "Requests this core handed to the core owning their stream (a proxy routing by \
         lane to each core's port keeps this at zero)",
        "core",
        c().map(|s| (s.core, counter(s.handed_over))),
    )?;
    per_core(
        e,
        "ursula_inflight_requests",
        "Requests being processed",
        "core",
        c().map(|s| (s.core, gauge(s.inflight as u64))),
    )?;
    per_core(
        e,
        "ursula_sse_connections",
        "Open SSE responses",
        "core",
        c().map(|s| (s.core, gauge(s.sse_open))),
    )?;
    per_core(
        e,
        "ursula_core_loop_lag_seconds",
        "How late each core's 10 ms heartbeat timer ran: time the event loop spent away \
             from its timers (a long task, or the thread not scheduled)",
        "core",
        c().map(|s| (s.core, loop_lag_histogram(&s.loop_lag))),
    )?;
    let append_help = format!(
        "Time from an append's head being read to its reply being ready (durable), for one \
         append in {APPEND_TIMING_SAMPLE}"
    );
    per_core(
        e,
        "ursula_append_duration_seconds",
        &append_help,
        "core",
        c().map(|s| {
            let t = &s.append_times;
            let h = BucketCounts::from_micros(
                &APPEND_DURATION_BUCKETS_US,
                &t.buckets,
                t.sum_nanos,
                t.count,
            );
            (s.core, h)
        }),
    )?;
    per_core(
        e,
        "ursula_core_loop_lag_max_seconds",
        "The longest heartbeat lag since the core started",
        "core",
        c().map(|s| (s.core, ConstGauge::new(s.loop_lag.max_nanos as f64 / 1e9))),
    )?;
    per_core(
        e,
        "ursula_live_readers_waiting",
        "Long-poll and SSE readers waiting for data on each owner core",
        "core",
        c().map(|s| (s.core, gauge(s.waiting_readers as u64))),
    )?;

    Ok(())
}

/// Each shard's log and disk reads.
fn encode_storage(
    e: &mut DescriptorEncoder,
    shards: &[ShardSnapshot],
) -> Result<(), std::fmt::Error> {
    let c = || shards.iter();
    per_core(
        e,
        "ursula_storage_flushes",
        "Group commits written durably",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.flushes))),
    )?;
    per_core(
        e,
        "ursula_storage_records_flushed",
        "Log records made durable; divide by flushes for appends per group commit",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.records_flushed))),
    )?;
    per_core(
        e,
        "ursula_storage_bytes_flushed",
        "Framed log bytes made durable",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.bytes_flushed))),
    )?;
    per_core(
        e,
        "ursula_storage_spare_segments",
        "Segments that began as a zero-filled spare prepared while the log filled slowly",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.spare_segments))),
    )?;
    per_core(
        e,
        "ursula_storage_zeroed_ahead_bytes",
        "Zeros written just ahead of the records while the log fills slowly",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.zeroed_ahead_bytes))),
    )?;
    per_core(
        e,
        "ursula_storage_commit_bytes",
        "Bytes each group commit wrote to the log",
        "shard",
        c().map(|s| (s.shard, commit_bytes_histogram(&s.stats))),
    )?;
    per_core(
        e,
        "ursula_storage_read_cache_hit_bytes",
        "Bytes reads returned from the read cache",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.read_cache_hit_bytes))),
    )?;
    per_core(
        e,
        "ursula_storage_read_cache_miss_bytes",
        "Bytes reads fetched from the log on disk or the cold tier",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.read_cache_miss_bytes))),
    )?;
    per_core(
        e,
        "ursula_storage_write_budget_bytes",
        "Unflushed bytes at which a shard answers appends 503 (write_budget_bytes)",
        "shard",
        c().map(|s| (s.shard, gauge(s.write_budget_bytes as u64))),
    )?;
    per_core(
        e,
        "ursula_storage_disk_reads",
        "Direct-I/O reads of evicted stream data (neighbouring records share one)",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.disk_reads))),
    )?;
    per_core(
        e,
        "ursula_storage_disk_read_bytes",
        "Bytes those reads transferred, gaps between wanted records included",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.disk_read_bytes))),
    )?;
    Ok(())
}

/// Each shard's cold tier use, group-commit writes and disk space.
fn encode_storage_space(
    e: &mut DescriptorEncoder,
    shards: &[ShardSnapshot],
) -> Result<(), std::fmt::Error> {
    let c = || shards.iter();
    per_core(
        e,
        "ursula_storage_cold_reads",
        "Fetches of archived segment blocks from the cold tier",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.cold_reads))),
    )?;
    per_core(
        e,
        "ursula_storage_cold_cache_hits",
        "Reads of cold segment blocks answered from the in-memory cold cache",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.cold_cache_hits))),
    )?;
    per_core(
        e,
        "ursula_storage_cold_cache_misses",
        "Reads of cold segment blocks that had to fetch from the cold tier",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.cold_cache_misses))),
    )?;
    per_core(
        e,
        "ursula_storage_evicted_segments",
        "Archived sealed segments whose local file was deleted to keep within local_bytes",
        "shard",
        c().map(|s| (s.shard, counter(s.stats.evicted_segments))),
    )?;
    per_core(
        e,
        "ursula_storage_cold_segments",
        "Sealed segments that live only in the cold tier",
        "shard",
        c().map(|s| (s.shard, gauge(s.stats.cold_segments))),
    )?;
    per_core(
        e,
        "ursula_storage_local_segment_bytes",
        "Bytes of segment files on the local disk",
        "shard",
        c().map(|s| (s.shard, gauge(s.stats.local_segment_bytes))),
    )?;
    per_core(
        e,
        "ursula_storage_commit_write_duration_seconds",
        "Latency of a group commit's durable (O_DSYNC) log writes: data and disk flush",
        "shard",
        c().filter(|s| s.disk.is_some())
            .map(|s| (s.shard, commit_write_histogram(&s.stats))),
    )?;
    per_core(
        e,
        "ursula_storage_unflushed_bytes",
        "Group-commit queue depth: framed bytes not yet durable",
        "shard",
        c().map(|s| (s.shard, gauge(s.unflushed_bytes))),
    )?;
    per_core(
        e,
        "ursula_storage_live_bytes",
        "Bytes of data held by live streams",
        "shard",
        c().filter_map(|s| Some((s.shard, gauge(s.disk?.live_bytes)))),
    )?;
    per_core(
        e,
        "ursula_storage_segment_bytes",
        "Preallocated bytes of all log segment files",
        "shard",
        c().filter_map(|s| Some((s.shard, gauge(s.disk?.segment_bytes)))),
    )?;
    per_core(
        e,
        "ursula_storage_reclaimable_bytes",
        "Segment bytes not held by live data (reclaimed by the cleaner over time)",
        "shard",
        c().filter_map(|s| {
            let d = s.disk?;
            Some((s.shard, gauge(d.segment_bytes.saturating_sub(d.live_bytes))))
        }),
    )?;
    per_core(
        e,
        "ursula_storage_segments",
        "Log segment files",
        "shard",
        c().filter_map(|s| Some((s.shard, gauge(s.disk?.segments as u64)))),
    )?;
    per_core(
        e,
        "ursula_storage_cache_bytes",
        "Stream bytes cached in memory",
        "shard",
        c().map(|s| (s.shard, gauge(s.cache_bytes as u64))),
    )?;
    Ok(())
}

/// Each shard's streams, the memory its components hold, and whether it failed.
fn encode_streams_and_memory(
    e: &mut DescriptorEncoder,
    shards: &[ShardSnapshot],
) -> Result<(), std::fmt::Error> {
    let c = || shards.iter();
    per_core(
        e,
        "ursula_streams",
        "Streams owned by each shard",
        "shard",
        c().map(|s| (s.shard, gauge(s.streams as u64))),
    )?;
    per_core(
        e,
        "ursula_dormant_streams",
        "Streams of each shard whose state is in its index files, not in memory, until used",
        "shard",
        c().map(|s| (s.shard, gauge(s.dormant_streams as u64))),
    )?;
    let mut family = e.encode_descriptor(
        "ursula_memory_bytes",
        "Heap bytes each shard's components hold, as each counts them",
        None,
        MetricType::Gauge,
    )?;
    for s in c() {
        for (component, bytes) in s.heap.components() {
            let labels = [
                ("shard", s.shard.to_string()),
                ("component", component.to_string()),
            ];
            gauge(bytes as u64).encode(family.encode_family(&labels)?)?;
        }
    }
    per_core(
        e,
        "ursula_storage_failed",
        "1 when the shard refuses writes after a failed log write",
        "shard",
        c().map(|s| (s.shard, gauge(u64::from(s.failed)))),
    )?;
    Ok(())
}

/// Each shard's S3 write-ahead log (only with `--durability s3`).
fn encode_s3_wal(
    e: &mut DescriptorEncoder,
    shards: &[ShardSnapshot],
) -> Result<(), std::fmt::Error> {
    if shards.iter().all(|s| s.s3_wal.is_none()) {
        return Ok(());
    }
    let w = || shards.iter().filter_map(|s| s.s3_wal.map(|w| (s.shard, w)));
    per_core(
        e,
        "ursula_s3_wal_put_seconds",
        "Time from a WAL object's PUT to S3 holding it (retries included)",
        "shard",
        w().map(|(shard, w)| {
            let buckets = S3_PUT_SECONDS_BUCKETS
                .iter()
                .copied()
                .chain(std::iter::once(f64::INFINITY))
                .zip(w.put_buckets.iter().copied())
                .collect();
            let h = BucketCounts {
                sum: w.put_nanos as f64 / 1e9,
                count: w.objects,
                buckets,
            };
            (shard, h)
        }),
    )?;
    per_core(
        e,
        "ursula_s3_wal_object_bytes",
        "Log bytes each WAL object PUT to S3 held",
        "shard",
        w().map(|(shard, w)| {
            let buckets = COMMIT_BYTES_BUCKETS
                .iter()
                .map(|&b| b as f64)
                .chain(std::iter::once(f64::INFINITY))
                .zip(w.object_bytes_buckets.iter().copied())
                .collect();
            let h = BucketCounts {
                sum: w.bytes as f64,
                count: w.objects,
                buckets,
            };
            (shard, h)
        }),
    )?;
    per_core(
        e,
        "ursula_s3_wal_commits",
        "Group commits shipped to S3 in WAL objects (commits per PUT: divide by the objects)",
        "shard",
        w().map(|(shard, w)| (shard, counter(w.commits))),
    )?;
    per_core(
        e,
        "ursula_s3_wal_pending_objects",
        "WAL objects gathering or in flight to S3",
        "shard",
        w().map(|(shard, w)| (shard, gauge(w.pending_objects))),
    )?;
    per_core(
        e,
        "ursula_s3_wal_pending_bytes",
        "Log bytes durable locally and not in S3 yet",
        "shard",
        w().map(|(shard, w)| (shard, gauge(w.pending_bytes))),
    )?;
    per_core(
        e,
        "ursula_s3_wal_waiting_acks",
        "Writes durable locally whose acknowledgement waits for S3",
        "shard",
        w().map(|(shard, w)| (shard, gauge(w.waiting_acks))),
    )?;
    Ok(())
}

/// A cluster host's lanes and moves (only with `--cluster`).
fn encode_cluster(
    e: &mut DescriptorEncoder,
    lanes: &crate::lane_table::LaneTable,
) -> Result<(), std::fmt::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut family = e.encode_descriptor(
        "ursula_cluster_lanes",
        "Lanes by their state on this host: served, moving (in or out), elsewhere",
        None,
        MetricType::Gauge,
    )?;
    let counts = lanes.state_counts();
    for (state, n) in ["served", "moving", "elsewhere"].iter().zip(counts) {
        let labels = [("state", state.to_string())];
        gauge(n).encode(family.encode_family(&labels)?)?;
    }
    let c = &lanes.counts;
    let mut family = e.encode_descriptor(
        "ursula_cluster_lane_moves",
        "Lanes this host adopted, released, or lost to a host that took them over",
        None,
        MetricType::Counter,
    )?;
    for (kind, n) in [
        ("adopted", &c.adopted),
        ("released", &c.released),
        ("lost", &c.lost),
    ] {
        let labels = [("kind", kind.to_string())];
        counter(n.load(Relaxed)).encode(family.encode_family(&labels)?)?;
    }
    let seconds = ConstCounter::new(c.adoption_ms.load(Relaxed) as f64 / 1000.0);
    seconds.encode(e.encode_descriptor(
        "ursula_cluster_adoption_seconds",
        "Time adoptions took from claim to serving, summed (divide by the adopted moves)",
        None,
        seconds.metric_type(),
    )?)?;
    let failures = counter(c.heartbeat_failures.load(Relaxed));
    failures.encode(e.encode_descriptor(
        "ursula_cluster_heartbeat_failures",
        "Heartbeats whose node record could not be written or the others read",
        None,
        failures.metric_type(),
    )?)?;
    let live = gauge(c.live_hosts.load(Relaxed));
    live.encode(e.encode_descriptor(
        "ursula_cluster_live_hosts",
        "Hosts whose node record was younger than the lease at the last heartbeat",
        None,
        live.metric_type(),
    )?)
}

/// The cold tier's metrics (only with a bucket configured).
fn encode_cold(
    e: &mut DescriptorEncoder,
    s: &ursula_cold::status::Status,
) -> Result<(), std::fmt::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    use ursula_cold::status::{Outcome, Request};
    let (lag_bytes, lag_secs) = s.lag(ursula_storage::now_ms());
    let lag = ConstGauge::new(lag_secs);
    lag.encode(e.encode_descriptor(
        "ursula_cold_archive_lag_seconds",
        "Age of the oldest durable log byte not yet in a committed manifest",
        None,
        lag.metric_type(),
    )?)?;
    let gauges = [
        (
            "ursula_cold_archive_lag_bytes",
            "Durable log bytes not yet in a committed manifest",
            lag_bytes,
        ),
        (
            "ursula_cold_fenced",
            "1 when another server took the archive over and archiving stopped",
            u64::from(s.fenced().is_some()),
        ),
    ];
    for (name, help, v) in gauges {
        let g = ConstGauge::new(v as i64);
        g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)?;
    }
    let counters = [
        (
            "ursula_cold_objects_uploaded",
            "Objects written to the cold tier",
            &s.objects_uploaded,
        ),
        (
            "ursula_cold_uploaded_bytes",
            "Bytes written to the cold tier",
            &s.bytes_uploaded,
        ),
        (
            "ursula_cold_objects_deleted",
            "Objects deleted from the cold tier after their grace period",
            &s.objects_deleted,
        ),
        (
            "ursula_cold_read_bytes",
            "Bytes of archived segments read back from the cold tier",
            &s.cold_read_bytes,
        ),
    ];
    for (name, help, v) in counters {
        let c = ConstCounter::new(v.load(Relaxed));
        c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)?;
    }
    let mut family = e.encode_descriptor(
        "ursula_cold_requests",
        "S3 requests of the cold tier by kind and result",
        None,
        MetricType::Counter,
    )?;
    for kind in Request::ALL {
        for outcome in Outcome::ALL {
            let labels = [("kind", kind.label()), ("result", outcome.label())];
            ConstCounter::new(s.requests(kind, outcome)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CoreMetrics;

    #[test]
    fn endpoints_only_under_reserved_prefix_on_main() {
        assert_eq!(endpoint(Listener::Main, "/healthz"), None);
        assert_eq!(endpoint(Listener::Main, "/metrics"), None);
        assert_eq!(
            endpoint(Listener::Main, "/__ursula/healthz"),
            Some(Some(Endpoint::Health))
        );
        assert_eq!(endpoint(Listener::Main, "/__ursula/nope"), Some(None));
        assert_eq!(
            endpoint(Listener::Admin, "/metrics"),
            Some(Some(Endpoint::Metrics))
        );
        assert_eq!(endpoint(Listener::Admin, "/logs/app"), Some(None));
    }

    #[test]
    fn commit_bytes_histogram_has_every_bound_and_inf() {
        let mut stats = ShardStats::default();
        stats.commit_bytes_buckets[2] = 5;
        stats.flushes = 5;
        stats.bytes_flushed = 200_000;
        let h = commit_bytes_histogram(&stats);
        assert_eq!(h.buckets.len(), COMMIT_BYTES_BUCKETS.len() + 1);
        assert_eq!(h.buckets[2], (65536.0, 5));
        assert_eq!((h.count, h.sum), (5, 200_000.0));
    }

    #[test]
    fn process_and_filesystem_readings_are_plausible() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (size, free) = filesystem_space(dir.path()).expect("statvfs");
        assert!(size > 0 && free <= size, "{size} {free}");
        assert!(filesystem_space(&dir.path().join("missing")).is_none());
        assert!(resident_bytes().expect("statm") > 1 << 20);
    }

    #[test]
    fn one_append_in_the_sample_is_timed() {
        let m = CoreMetrics::default();
        let timed = (0..APPEND_TIMING_SAMPLE * 3)
            .filter(|_| m.time_this_append())
            .count();
        assert_eq!(timed, 3);
        m.append_took(std::time::Duration::from_millis(2));
        let t = *m.append_times.borrow();
        assert_eq!(t.count, 1);
        let slot = APPEND_DURATION_BUCKETS_US
            .iter()
            .position(|&b| b == 2_500)
            .expect("a 2.5 ms bound");
        assert_eq!(t.buckets[slot], 1);
    }

    #[test]
    fn loop_lag_histogram_has_every_bound_and_inf() {
        let m = CoreMetrics::default();
        m.loop_lag(std::time::Duration::from_millis(1));
        m.loop_lag(std::time::Duration::from_secs(3));
        let h = loop_lag_histogram(&m.loop_lag.borrow());
        assert_eq!(h.buckets.len(), LOOP_LAG_BUCKETS_US.len() + 1);
        assert!((h.sum - 3.001).abs() < 1e-9);
    }

    #[test]
    fn commit_write_histogram_has_every_bound_and_inf() {
        let mut stats = ShardStats {
            commit_writes: 3,
            commit_write_nanos: 3_000_000,
            ..Default::default()
        };
        stats.commit_write_buckets[4] = 3;
        let h = commit_write_histogram(&stats);
        assert_eq!(h.buckets.len(), COMMIT_WRITE_BUCKETS_US.len() + 1);
        assert_eq!(h.buckets[4], (0.001, 3));
        assert!(h.buckets.last().is_some_and(|b| b.0.is_infinite()));
    }
}

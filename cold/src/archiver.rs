//! The archiver: one thread beside the cores, with a tokio current-thread runtime for
//! aws-sdk-s3, copying each shard's durable log to S3 and committing its manifest.
//!
//! The cores never wait for it: each core's upkeep tells it, once a second, how far its
//! log is durable ([`ColdStore::durable`]); everything else the archiver reads from the
//! data dir's files, which never change below that point. Per shard, a round (every
//! second, or the archive interval if shorter):
//!
//! 1. lists the local segments and snapshot blobs, then reads the durable end: a file
//!    missing from that listing was deleted by the engine before the end was read, so the
//!    log up to the end no longer needs it;
//! 2. uploads every newly sealed segment whole (up to the end of its records) and, once the
//!    archive interval has passed since the last one, a slice of the segment being written
//!    up to the durable end;
//! 3. uploads a newer checkpoint (after the index files it names) once the archived log
//!    covers its position, and any new snapshot blobs;
//! 4. moves what the manifest no longer needs to its garbage list, deletes garbage older
//!    than the grace period, and commits the manifest by compare-and-swap (at least once
//!    per interval: the owner's heartbeat).
//!
//! A commit that finds a newer epoch in the manifest stops the archiver for good: another
//! server owns the prefix now. Any other failure (S3 down) is retried with capped backoff;
//! appends never notice, the archive lag grows, and the next good round catches up.
//!
//! Objects a round uploaded but never committed (the commit failed, or the server died or
//! was fenced in between) are named by no manifest and are on no garbage list. The orphan
//! sweep finds them: at start and then once per grace period it lists the shard's epoch
//! directories and deletes what the manifest neither names nor lists as garbage, once it
//! is older than the grace period (an upload still in flight, ours or a fenced owner's, is
//! younger than that).
//!
//! On a clean stop the server hands the cores' final durable ends over and calls
//! [`Archive::finish`]: every shard runs one last round, so a planned restart leaves
//! nothing acknowledged only on the local disk.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ursula_s3::{DynStore, PutMode, StoreError};
use ursula_storage::cold::{ColdRead, ColdStore, DurableEnd};
use ursula_storage::segment::{self, DATA_START};
use ursula_storage::SegmentNo;

use crate::error::{Error, Result};
use crate::manifest::{self, End, Keys, Manifest, Object, Piece};
use crate::status::{Outcome, Request, Status};

/// How the server runs its cold tier.
#[derive(Debug, Clone)]
pub struct Settings {
    pub s3: ursula_s3::S3Settings,
    /// Longest an acknowledged byte waits before it is in S3.
    pub archive_interval: Duration,
    /// How long an object no manifest needs is kept before it is deleted.
    pub grace: Duration,
    /// Take the archive over even if another live server owns it.
    pub takeover: bool,
}

/// The running cold tier: what the cores see (as [`ColdStore`]) and the server reports.
pub struct Archive {
    shards: Vec<Slot>,
    pub status: Arc<Status>,
    store: DynStore,
    runtime: tokio::runtime::Handle,
    /// Set by [`Archive::finish`]: every worker runs its last round and reports on
    /// `finished`.
    finishing: tokio::sync::watch::Sender<bool>,
    finished: Mutex<std::sync::mpsc::Receiver<(u32, FinalRound)>>,
}

/// How one shard's last round on a clean stop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalRound {
    /// Everything durable is in the committed manifest, up to this end.
    Archived(End),
    /// Archiving had stopped: another server owns the archive.
    Fenced(String),
    /// Out of time: this many durable bytes are only on the local disk.
    TimedOut { lag_bytes: u64 },
}

struct Slot {
    /// Published by the shard's core, taken by its archiver task.
    durable: Mutex<Option<DurableEnd>>,
    /// The last manifest committed, for reads and `is_archived`.
    committed: Mutex<Arc<Manifest>>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Archive({})", self.store.describe())
    }
}

/// The identity of the server owning a data dir, kept in it.
pub const OWNER_FILE: &str = "cold-owner";
/// Left by `ursula restore`: the epochs it restored, so the first start takes the archive
/// over from them (the restore was the operator's decision) and continues their objects.
pub const RESTORED_FILE: &str = "cold-restored";

/// Start the archiver thread for a data dir of `shards` shards: claim every shard's
/// manifest (the next owner epoch) and return once that is done, or why it was refused.
pub fn start(settings: Settings, data_dir: &Path, shards: u32) -> Result<Arc<Archive>> {
    let owner = owner_identity(data_dir)?;
    let restored = read_restored(data_dir)?;
    let (tx, rx) = std::sync::mpsc::channel::<Result<Arc<Archive>>>();
    let data_dir = data_dir.to_path_buf();
    std::thread::Builder::new()
        .name("ursula-archiver".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(source) => {
                    let _ = tx.send(Err(Error::Start {
                        what: "archiver runtime",
                        source,
                    }));
                    return;
                }
            };
            runtime.block_on(async move {
                let store: DynStore = Arc::new(ursula_s3::S3Store::connect(&settings.s3).await);
                let claimed = claim(&store, &settings, shards, &owner, &restored).await;
                let claimed = match claimed {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let (finishing, finish) = tokio::sync::watch::channel(false);
                let (done, finished) = std::sync::mpsc::channel();
                let archive = Arc::new(Archive {
                    shards: claimed
                        .iter()
                        .map(|(m, _)| Slot {
                            durable: Mutex::new(None),
                            committed: Mutex::new(Arc::new(m.clone())),
                        })
                        .collect(),
                    status: Arc::new(Status::new(shards as usize)),
                    store: store.clone(),
                    runtime: tokio::runtime::Handle::current(),
                    finishing,
                    finished: Mutex::new(finished),
                });
                if restored.is_some() {
                    let _ = std::fs::remove_file(data_dir.join(RESTORED_FILE));
                }
                let mut tasks = Vec::new();
                for (shard, (m, etag)) in claimed.into_iter().enumerate() {
                    let worker = Worker::new(
                        archive.clone(),
                        &settings,
                        &data_dir,
                        shard as u32,
                        (m, etag),
                        (finish.clone(), done.clone()),
                    );
                    tasks.push(tokio::spawn(worker.run()));
                }
                let _ = tx.send(Ok(archive));
                for t in tasks {
                    let _ = t.await;
                }
            });
        })
        .map_err(|source| Error::Start {
            what: "spawn archiver thread",
            source,
        })?;
    rx.recv().map_err(|_| Error::ThreadExited)?
}

impl ColdStore for Archive {
    fn durable(&self, shard: u32, end: DurableEnd) {
        if let Some(slot) = self.shards.get(shard as usize) {
            if let Ok(mut d) = slot.durable.lock() {
                // A shard's log only grows: a late report from its upkeep must not take
                // back the end its shutdown reported.
                if d.is_none_or(|old| end > old) {
                    *d = Some(end);
                }
            }
        }
    }

    fn is_archived(&self, shard: u32, segment: SegmentNo) -> bool {
        self.committed(shard)
            .is_some_and(|m| m.sealed(segment.get()))
    }

    fn stopped(&self) -> bool {
        self.status.fenced().is_some()
    }

    fn read(&self, shard: u32, segment: SegmentNo, offset: u64, len: usize) -> ColdRead {
        let (tx, rx) = futures_channel::oneshot::channel();
        let manifest = self.committed(shard);
        let store = self.store.clone();
        let status = self.status.clone();
        self.runtime.spawn(async move {
            let result = match manifest {
                Some(m) => read_range(&store, &status, &m, segment.get(), offset, len).await,
                None => Err(io::Error::new(io::ErrorKind::NotFound, "no such shard")),
            };
            if let Ok(b) = &result {
                status
                    .cold_read_bytes
                    .fetch_add(b.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = tx.send(result);
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(io::Error::other("the archiver thread stopped")))
        })
    }
}

impl Archive {
    /// The last round of a clean stop, after every shard's final durable end was reported:
    /// each shard uploads what its archive lacks and commits, retrying within `timeout`.
    /// Returns how each shard's round ended, in shard order. A fenced archive runs none.
    pub fn finish(&self, timeout: Duration) -> Vec<FinalRound> {
        let shards = self.shards.len();
        if let Some(why) = self.status.fenced() {
            return vec![FinalRound::Fenced(why); shards];
        }
        let deadline = Instant::now() + timeout;
        let _ = self.finishing.send(true);
        let mut out: Vec<Option<FinalRound>> = vec![None; shards];
        if let Ok(finished) = self.finished.lock() {
            while out.iter().any(Option::is_none) {
                let left = deadline.saturating_duration_since(Instant::now());
                match finished.recv_timeout(left) {
                    Ok((shard, r)) => {
                        if let Some(slot) = out.get_mut(shard as usize) {
                            *slot = Some(r);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(shard, r)| {
                r.unwrap_or_else(|| FinalRound::TimedOut {
                    lag_bytes: self.status.shard_lag_bytes(shard as u32),
                })
            })
            .collect()
    }

    fn committed(&self, shard: u32) -> Option<Arc<Manifest>> {
        let slot = self.shards.get(shard as usize)?;
        slot.committed.lock().ok().map(|m| m.clone())
    }
}

/// `len` bytes at `offset` of archived segment `segment`, from the pieces holding them
/// (ranged GETs); bytes past a sealed segment's records read as the zeros they are.
async fn read_range(
    store: &DynStore,
    status: &Status,
    m: &Manifest,
    segment: u64,
    offset: u64,
    len: usize,
) -> io::Result<Bytes> {
    let missing = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("segment {segment} bytes {offset}+{len} are not archived"),
        )
    };
    let seg = m
        .segments
        .iter()
        .find(|s| s.index == segment)
        .ok_or_else(missing)?;
    let end = offset + len as u64;
    let mut out = vec![0u8; len];
    let mut covered = offset;
    for p in &seg.pieces {
        let (from, to) = (p.start.max(offset), (p.start + p.object.len).min(end));
        if from >= to {
            continue;
        }
        if from > covered {
            return Err(missing());
        }
        let got = store
            .get_range(&p.object.key, from - p.start, to - from)
            .await;
        let bytes = match got {
            Ok(Some(b)) => {
                status.count(Request::Get, Outcome::Ok);
                b
            }
            Ok(None) => {
                status.count(Request::Get, Outcome::Error);
                return Err(missing());
            }
            Err(e) => {
                status.count(Request::Get, Outcome::Error);
                return Err(io::Error::other(Error::request(&p.object.key)(e)));
            }
        };
        out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&bytes);
        covered = to;
    }
    if covered < end && !(seg.sealed && end <= seg.file_len) {
        return Err(missing());
    }
    Ok(Bytes::from(out))
}

/// Take the next owner epoch of every shard's manifest, or refuse to start.
async fn claim(
    store: &DynStore,
    settings: &Settings,
    shards: u32,
    owner: &str,
    restored: &Option<Vec<u64>>,
) -> Result<Vec<(Manifest, String)>> {
    let at = store.describe();
    let claiming = |e: Error| Error::Claim {
        store: at.clone(),
        source: Box::new(e),
    };
    manifest::ensure_layout(store, shards)
        .await
        .map_err(claiming)?;
    let interval_ms = settings.archive_interval.as_millis() as u64;
    let mut out = Vec::new();
    for shard in 0..shards {
        let now = ursula_storage::now_ms();
        let current = manifest::load(store, shard).await.map_err(claiming)?;
        let (next, etag) = match current {
            None => (Manifest::new(shard, 1, owner, interval_ms, now), None),
            Some((m, etag)) => {
                let restored_from = restored
                    .as_ref()
                    .and_then(|r| r.get(shard as usize))
                    .is_some_and(|&e| e == m.epoch);
                let ours = m.owner == owner;
                if !ours && !restored_from && !settings.takeover && m.owner_alive(now) {
                    return Err(Error::Owned {
                        store: at.clone(),
                        shard,
                        owner: m.owner,
                        epoch: m.epoch,
                        heartbeat_age_ms: now - m.heartbeat_ms,
                    });
                }
                if !ours && !restored_from {
                    tracing::warn!(
                        shard,
                        previous_owner = %m.owner,
                        epoch = m.epoch + 1,
                        "taking the cold tier archive over; the previous owner's objects \
                         are dropped after the grace period"
                    );
                }
                (
                    m.successor(owner, interval_ms, ours || restored_from, now),
                    Some(etag),
                )
            }
        };
        let etag = manifest::commit(store, &next, etag.as_deref())
            .await
            .map_err(|e| match e {
                Error::Conflict { .. } => Error::ClaimRace {
                    store: at.clone(),
                    shard,
                },
                e => claiming(e),
            })?;
        tracing::info!(
            shard,
            epoch = next.epoch,
            owner,
            "cold tier archive claimed"
        );
        out.push((next, etag));
    }
    Ok(out)
}

/// The random identity of the server owning `data_dir`, created on first use.
fn owner_identity(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(OWNER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path)(e)),
    }
    let mut random = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|f| f.read_exact_at(&mut random, 0))
        .map_err(Error::io("/dev/urandom"))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let id = format!("{}-{hex}", host.trim());
    let tmp = data_dir.join(format!("{OWNER_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| segment::sync_dir(data_dir))
        .map_err(Error::io(&path))?;
    Ok(id)
}

/// The epochs `ursula restore` left in `data_dir`, if it did.
fn read_restored(data_dir: &Path) -> Result<Option<Vec<u64>>> {
    let path = data_dir.join(RESTORED_FILE);
    match std::fs::read(&path) {
        Ok(b) => sonic_rs::from_slice(&b)
            .map(Some)
            .map_err(|source| Error::CorruptFile { path, source }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path)(e)),
    }
}

/// Longest one round may take (a sealed segment's upload included) before it is retried.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a round stopped short.
enum RoundError {
    /// Another owner has the manifest: stop archiving for good.
    Fenced(String),
    /// Try again (S3 unreachable, a file vanished under the round).
    Retry(Error),
}

impl From<Error> for RoundError {
    fn from(e: Error) -> Self {
        RoundError::Retry(e)
    }
}

/// One shard's archiving.
struct Worker {
    archive: Arc<Archive>,
    shard: u32,
    dir: PathBuf,
    keys: Keys,
    manifest: Manifest,
    etag: String,
    interval: Duration,
    grace_ms: i64,
    last_slice: Option<Instant>,
    last_commit: Instant,
    /// The local checkpoint file's (modification time, length) when last looked at.
    checkpoint_seen: Option<(SystemTime, u64)>,
    /// Durable ends seen and when, oldest first, while not yet archived: the archive lag.
    observed: VecDeque<(DurableEnd, i64)>,
    segment_bytes: u64,
    /// When the orphan sweep last ran (never: it runs before the first round).
    last_sweep: Option<Instant>,
    /// Turns true when the server stops cleanly; the worker then reports its last round.
    finish: tokio::sync::watch::Receiver<bool>,
    done: std::sync::mpsc::Sender<(u32, FinalRound)>,
}

/// How often a shard's orphans are looked for. An orphan may only go once it is a grace
/// period old, so sweeping more often finds nothing new to delete; once per grace period
/// deletes every orphan within two grace periods of its upload for one LIST request (per
/// 1000 objects) per shard per period. The floor keeps a tiny grace from listing the
/// prefix every round.
fn sweep_every(grace: Duration) -> Duration {
    grace.max(Duration::from_secs(1))
}

impl Worker {
    fn new(
        archive: Arc<Archive>,
        settings: &Settings,
        data_dir: &Path,
        shard: u32,
        (manifest, etag): (Manifest, String),
        (finish, done): (
            tokio::sync::watch::Receiver<bool>,
            std::sync::mpsc::Sender<(u32, FinalRound)>,
        ),
    ) -> Worker {
        Worker {
            archive,
            shard,
            dir: data_dir.join(format!("shard-{shard}")),
            keys: Keys::new(shard, manifest.epoch),
            manifest,
            etag,
            interval: settings.archive_interval,
            grace_ms: settings.grace.as_millis() as i64,
            last_slice: None,
            last_commit: Instant::now(),
            checkpoint_seen: None,
            observed: VecDeque::new(),
            segment_bytes: 0,
            last_sweep: None,
            finish,
            done,
        }
    }

    async fn run(mut self) {
        let tick = self
            .interval
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut backoff = Duration::ZERO;
        let mut failing_since: Option<Instant> = None;
        loop {
            let grace = Duration::from_millis(self.grace_ms.max(0) as u64);
            if self
                .last_sweep
                .is_none_or(|t| t.elapsed() >= sweep_every(grace))
                && !*self.finish.borrow()
            {
                self.last_sweep = Some(Instant::now());
                self.sweep_orphans().await;
            }
            let finishing = tokio::select! {
                () = tokio::time::sleep(tick.max(backoff)) => false,
                r = self.finish.wait_for(|f| *f) => r.is_ok(),
            };
            if finishing {
                let last = self.final_round().await;
                let _ = self.done.send((self.shard, last));
                return;
            }
            let result = self.bounded_round().await;
            self.report_lag();
            match result {
                Ok(()) => {
                    if let Some(t) = failing_since.take() {
                        tracing::info!(
                            shard = self.shard,
                            after_ms = t.elapsed().as_millis() as u64,
                            "cold tier archiving caught up again"
                        );
                    }
                    backoff = Duration::ZERO;
                }
                Err(RoundError::Fenced(why)) => {
                    tracing::error!(shard = self.shard, "cold tier archiving stopped: {why}");
                    self.archive.status.fence(why);
                    return;
                }
                Err(RoundError::Retry(why)) => {
                    // What this round uploaded is not committed: look at it all again.
                    self.checkpoint_seen = None;
                    self.last_slice = None;
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        tracing::warn!(
                            shard = self.shard,
                            "cold tier archiving failed, retrying: {why}"
                        );
                    } else {
                        tracing::debug!(
                            shard = self.shard,
                            "cold tier archiving failed again: {why}"
                        );
                    }
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(200), Duration::from_secs(5));
                }
            }
            if self.archive.status.fenced().is_some() {
                return;
            }
        }
    }

    /// The last round before a clean stop: everything up to the final durable end, the
    /// open segment's slice without waiting for the interval, retried until it commits
    /// (the server stops waiting at its deadline).
    /// One round, given up after `ROUND_TIMEOUT`: aws-sdk-s3 sets no operation timeout,
    /// and a request that hangs must not stop this shard's archiving for good.
    async fn bounded_round(&mut self) -> Result<(), RoundError> {
        match tokio::time::timeout(ROUND_TIMEOUT, self.round()).await {
            Ok(r) => r,
            Err(_) => Err(RoundError::Retry(Error::Stalled {
                after: ROUND_TIMEOUT,
            })),
        }
    }

    async fn final_round(&mut self) -> FinalRound {
        let mut backoff = Duration::from_millis(100);
        loop {
            self.last_slice = None;
            self.checkpoint_seen = None;
            let result = self.bounded_round().await;
            self.report_lag();
            match result {
                Ok(()) => return FinalRound::Archived(self.manifest.archived),
                Err(RoundError::Fenced(why)) => {
                    self.archive.status.fence(why.clone());
                    return FinalRound::Fenced(why);
                }
                Err(RoundError::Retry(why)) => {
                    tracing::warn!(
                        shard = self.shard,
                        "cold tier: the last archive round failed, retrying: {why}"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    async fn round(&mut self) -> Result<(), RoundError> {
        let now = ursula_storage::now_ms();
        // Listed before the durable end is read (see the module comment).
        let local: BTreeSet<u64> = segment::list_segments(&self.dir)
            .map_err(Error::io(&self.dir))?
            .into_iter()
            .map(SegmentNo::get)
            .collect();
        let blobs_before = list_blobs(&self.dir)?;
        let slot = &self.archive.shards[self.shard as usize];
        let Some(point) = slot.durable.lock().ok().and_then(|d| *d) else {
            return Ok(());
        };
        if self.observed.back().is_none_or(|(p, _)| *p != point) {
            self.observed.push_back((point, now));
        }
        let mut m = self.manifest.clone();
        let archived = (m.archived.segment, m.archived.position);
        let durable = (point.segment.get(), point.position);
        if durable < archived || point.lsn.get() < m.archived.lsn {
            return Err(RoundError::Fenced(format!(
                "shard {}: the local log ends at segment {} position {} (LSN {}), before its \
                 archive (segment {} position {}); restore the data dir from the archive or \
                 archive to a new prefix",
                self.shard,
                point.segment.get(),
                point.position,
                point.lsn,
                archived.0,
                archived.1,
            )));
        }
        let sealed_new: Vec<u64> = local
            .iter()
            .copied()
            .filter(|&s| s < point.segment.get() && s >= m.archived.segment && !m.sealed(s))
            .collect();
        let interval_over = self.last_slice.is_none_or(|t| t.elapsed() >= self.interval);
        if durable > archived && (!sealed_new.is_empty() || interval_over) {
            for s in sealed_new {
                self.archive_sealed(&mut m, s, now).await?;
            }
            self.archive_slice(&mut m, point, now).await?;
            m.archived = End {
                segment: point.segment.get(),
                position: point.position,
                lsn: point.lsn.get(),
            };
            self.last_slice = Some(Instant::now());
        }
        self.archive_checkpoint(&mut m, now).await?;
        self.keep_needed_segments(&mut m, now);
        let blobs_after = list_blobs(&self.dir)?;
        self.archive_blobs(&mut m, &blobs_before, &blobs_after, now)
            .await?;
        self.collect_garbage(&mut m, now).await;
        if m != self.manifest || self.last_commit.elapsed() >= self.interval {
            m.heartbeat_ms = now;
            self.commit(m).await?;
        }
        Ok(())
    }

    /// Upload sealed segment `s` whole, in place of any slices of it.
    async fn archive_sealed(
        &mut self,
        m: &mut Manifest,
        s: u64,
        now: i64,
    ) -> Result<(), RoundError> {
        let path = segment::segment_path(&self.dir, SegmentNo::new(s));
        let mut bytes = read_at(&path, 0, None)?;
        let file_len = bytes.len() as u64;
        // Only up to the end of the records: the rest is the zeroed preallocation.
        let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let keep =
            (used.div_ceil(DATA_START as usize) * DATA_START as usize).max(DATA_START as usize);
        bytes.truncate(keep.min(bytes.len()));
        let object = self
            .upload(&self.keys.sealed(s), Bytes::from(bytes))
            .await?;
        let entry = manifest::Segment {
            index: s,
            file_len,
            sealed: true,
            pieces: vec![Piece { start: 0, object }],
        };
        match m.segments.iter_mut().find(|e| e.index == s) {
            Some(e) => {
                let old = std::mem::replace(e, entry);
                for p in old.pieces {
                    m.garbage.push(manifest::Garbage {
                        key: p.object.key,
                        since_ms: now,
                    });
                }
            }
            None => {
                m.segments.push(entry);
                m.segments.sort_by_key(|e| e.index);
            }
        }
        Ok(())
    }

    /// Upload the segment being written from where its archive ends up to `point`.
    async fn archive_slice(
        &mut self,
        m: &mut Manifest,
        point: DurableEnd,
        _now: i64,
    ) -> Result<(), RoundError> {
        let seg = point.segment.get();
        let start = match m.segments.iter().find(|e| e.index == seg) {
            Some(e) if e.sealed => return Ok(()),
            Some(e) => e.pieces.last().map_or(0, |p| p.start + p.object.len),
            None => 0,
        };
        if point.position <= start {
            return Ok(());
        }
        let path = segment::segment_path(&self.dir, point.segment);
        let file_len = std::fs::metadata(&path).map_err(Error::io(&path))?.len();
        self.segment_bytes = file_len;
        let bytes = read_at(&path, start, Some(point.position - start))?;
        let object = self
            .upload(
                &self.keys.slice(seg, start, point.position),
                Bytes::from(bytes),
            )
            .await?;
        let piece = Piece { start, object };
        match m.segments.iter_mut().find(|e| e.index == seg) {
            Some(e) => e.pieces.push(piece),
            None => {
                m.segments.push(manifest::Segment {
                    index: seg,
                    file_len,
                    sealed: false,
                    pieces: vec![piece],
                });
                m.segments.sort_by_key(|e| e.index);
            }
        }
        Ok(())
    }

    /// Put a newer local checkpoint into the manifest once the archived log covers it,
    /// after the index files it names.
    async fn archive_checkpoint(&mut self, m: &mut Manifest, now: i64) -> Result<(), RoundError> {
        let path = self.dir.join(ursula_storage::CHECKPOINT_FILE);
        let seen = match std::fs::metadata(&path) {
            Ok(meta) => (meta.modified().map_err(Error::io(&path))?, meta.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path)(e).into()),
        };
        if self.checkpoint_seen == Some(seen) {
            return Ok(());
        }
        let bytes = Bytes::from(std::fs::read(&path).map_err(Error::io(&path))?);
        let summary = ursula_storage::checkpoint_summary(self.shard, &bytes).map_err(|reason| {
            Error::CorruptCheckpoint {
                path: path.clone(),
                reason,
            }
        })?;
        let crc = crc32c::crc32c(&bytes);
        if m.checkpoint
            .as_ref()
            .is_some_and(|c| c.object.crc == crc && c.lsn == summary.lsn.get())
        {
            self.checkpoint_seen = Some(seen);
            return Ok(());
        }
        if (summary.segment.get(), summary.position) > (m.archived.segment, m.archived.position) {
            // The log it continues is not archived yet; look again next round.
            return Ok(());
        }
        let mut index_files = Vec::new();
        for number in summary.index_files.iter().map(|n| n.get()) {
            if let Some(f) = m.index_files.iter().find(|f| f.number == number) {
                index_files.push(f.clone());
                continue;
            }
            let idx = self.dir.join(format!("{number:010}.idx"));
            let content = match std::fs::read(&idx) {
                Ok(c) => c,
                // Replaced by a newer checkpoint meanwhile: take that one next round.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::io(idx)(e).into()),
            };
            let object = self
                .upload(&self.keys.index(number), Bytes::from(content))
                .await?;
            index_files.push(manifest::IndexFile { number, object });
        }
        let object = self
            .upload(&self.keys.checkpoint(summary.lsn.get(), crc), bytes)
            .await?;
        let next = manifest::Checkpoint {
            lsn: summary.lsn.get(),
            segment: summary.segment.get(),
            position: summary.position,
            segments: summary.segments.iter().map(|s| s.get()).collect(),
            object,
        };
        if let Some(old) = m.checkpoint.replace(next) {
            m.drop_object(old.object.key, now);
        }
        let named: BTreeSet<u64> = index_files.iter().map(|f| f.number).collect();
        for f in std::mem::replace(&mut m.index_files, index_files) {
            if !named.contains(&f.number) {
                m.drop_object(f.object.key, now);
            }
        }
        self.checkpoint_seen = Some(seen);
        Ok(())
    }

    /// Drop segments the manifest's checkpoint no longer needs: it needs those its segment
    /// map names and every one from its log position on.
    fn keep_needed_segments(&self, m: &mut Manifest, now: i64) {
        let Some(c) = &m.checkpoint else { return };
        let (from, map): (u64, BTreeSet<u64>) = (c.segment, c.segments.iter().copied().collect());
        let (keep, drop): (Vec<_>, Vec<_>) = std::mem::take(&mut m.segments)
            .into_iter()
            .partition(|s| s.index >= from || map.contains(&s.index));
        m.segments = keep;
        for s in drop {
            for p in s.pieces {
                m.drop_object(p.object.key, now);
            }
        }
    }

    /// Upload snapshot blobs not archived yet (or grown since: a blob is written in
    /// place, so a listing can catch one half written), and drop the ones deleted locally.
    async fn archive_blobs(
        &mut self,
        m: &mut Manifest,
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
        now: i64,
    ) -> Result<(), RoundError> {
        let dir = self.dir.join("snapshots");
        for (name, &len) in after {
            if m.blobs
                .iter()
                .any(|b| &b.name == name && b.object.len == len)
            {
                continue;
            }
            let content = match std::fs::read(dir.join(name)) {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(dir.join(name))(e).into()),
            };
            let len = content.len() as u64;
            let object = self
                .upload(&self.keys.blob(name, len), Bytes::from(content))
                .await?;
            let blob = manifest::Blob {
                name: name.clone(),
                object,
            };
            match m.blobs.iter_mut().find(|b| &b.name == name) {
                Some(b) => {
                    let old = std::mem::replace(b, blob);
                    m.garbage.push(manifest::Garbage {
                        key: old.object.key,
                        since_ms: now,
                    });
                }
                None => m.blobs.push(blob),
            }
        }
        let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut m.blobs)
            .into_iter()
            .partition(|b| before.contains_key(&b.name) || after.contains_key(&b.name));
        m.blobs = keep;
        for b in gone {
            m.drop_object(b.object.key, now);
        }
        Ok(())
    }

    /// Delete this shard's orphans (see the module comment); a failure is logged and the
    /// next sweep tries again. Never touches the manifest, the layout or another shard.
    async fn sweep_orphans(&self) {
        let status = &self.archive.status;
        let store = &self.archive.store;
        // The manifest as stored, besides ours: a commit whose answer was lost names
        // objects our copy does not.
        let stored = match manifest::load(store, self.shard).await {
            Ok(m) => {
                status.count(Request::Manifest, Outcome::Ok);
                m
            }
            Err(e) => {
                status.count(Request::Manifest, Outcome::Error);
                tracing::warn!(shard = self.shard, "cold tier orphan sweep: {e}");
                return;
            }
        };
        let stored = match stored {
            Some((m, _)) if m.epoch == self.manifest.epoch && m.owner == self.manifest.owner => m,
            // Another owner's now (the next commit notices): its objects are its to sweep.
            _ => return,
        };
        let listed = match store.list(&format!("shard-{}/", self.shard)).await {
            Ok(l) => {
                status.count(Request::List, Outcome::Ok);
                l
            }
            Err(e) => {
                status.count(Request::List, Outcome::Error);
                tracing::warn!(shard = self.shard, "cold tier orphan sweep: {e}");
                return;
            }
        };
        let doomed = orphans(
            self.shard,
            &[&self.manifest, &stored],
            &listed,
            ursula_storage::now_ms(),
            self.grace_ms,
        );
        let mut deleted = 0;
        for key in &doomed {
            match store.delete(key).await {
                Ok(()) => {
                    status.count(Request::Delete, Outcome::Ok);
                    status
                        .objects_deleted
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    deleted += 1;
                }
                Err(e) => {
                    status.count(Request::Delete, Outcome::Error);
                    tracing::debug!(shard = self.shard, "cold tier orphan {key}: {e}");
                }
            }
        }
        if !doomed.is_empty() {
            tracing::info!(
                shard = self.shard,
                deleted,
                failed = doomed.len() - deleted,
                "cold tier: deleted objects no manifest names"
            );
        }
    }

    /// Delete garbage whose grace period is over; what fails stays for the next round.
    async fn collect_garbage(&self, m: &mut Manifest, now: i64) {
        let mut kept = Vec::new();
        for g in std::mem::take(&mut m.garbage) {
            if now - g.since_ms < self.grace_ms {
                kept.push(g);
                continue;
            }
            match self.archive.store.delete(&g.key).await {
                Ok(()) => {
                    self.archive.status.count(Request::Delete, Outcome::Ok);
                    self.archive
                        .status
                        .objects_deleted
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(_) => {
                    self.archive.status.count(Request::Delete, Outcome::Error);
                    kept.push(g);
                }
            }
        }
        m.garbage = kept;
    }

    async fn commit(&mut self, m: Manifest) -> Result<(), RoundError> {
        let status = &self.archive.status;
        match manifest::commit(&self.archive.store, &m, Some(&self.etag)).await {
            Ok(etag) => {
                tracing::debug!(
                    shard = self.shard,
                    segment = m.archived.segment,
                    position = m.archived.position,
                    lsn = m.archived.lsn,
                    "manifest committed"
                );
                status.count(Request::Manifest, Outcome::Ok);
                self.etag = etag;
                self.last_commit = Instant::now();
                self.publish(m);
                Ok(())
            }
            Err(Error::Conflict { .. }) => {
                status.count(Request::Manifest, Outcome::Precondition);
                let current = manifest::load(&self.archive.store, self.shard).await?;
                match current {
                    Some((cur, _)) if cur.epoch != m.epoch || cur.owner != m.owner => {
                        Err(RoundError::Fenced(format!(
                            "shard {}: server {} took the archive over (epoch {}, ours {})",
                            self.shard, cur.owner, cur.epoch, m.epoch
                        )))
                    }
                    // Our own earlier write, whose answer was lost: continue from it.
                    Some((cur, etag)) => {
                        self.etag = etag;
                        self.publish(cur);
                        Err(RoundError::Retry(Error::OwnWriteRetried))
                    }
                    None => Err(RoundError::Fenced(format!(
                        "shard {}: the manifest was deleted",
                        self.shard
                    ))),
                }
            }
            Err(e) => {
                status.count(Request::Manifest, Outcome::Error);
                Err(RoundError::Retry(e))
            }
        }
    }

    fn publish(&mut self, m: Manifest) {
        let archived = m.archived;
        self.manifest = m.clone();
        if let Ok(mut c) = self.archive.shards[self.shard as usize].committed.lock() {
            *c = Arc::new(m);
        }
        while self.observed.front().is_some_and(|(p, _)| {
            (p.segment.get(), p.position) <= (archived.segment, archived.position)
        }) {
            self.observed.pop_front();
        }
    }

    /// Publish how far the committed archive is behind the newest durable end seen.
    fn report_lag(&self) {
        let Some(&(point, _)) = self.observed.back() else {
            self.archive.status.set_lag(self.shard, 0, 0);
            return;
        };
        let a = self.manifest.archived;
        let bytes = if (point.segment.get(), point.position) <= (a.segment, a.position) {
            0
        } else if point.segment.get() == a.segment {
            point.position - a.position
        } else {
            let seg = self.segment_bytes.max(point.position);
            (point.segment.get() - a.segment.max(1)) * seg + point.position - a.position.min(seg)
        };
        let since = self.observed.front().map_or(0, |(_, t)| *t);
        self.archive.status.set_lag(self.shard, bytes, since);
    }

    /// Write an immutable object. A create that finds the key taken is fine when the object
    /// there is this one (a retry whose first attempt landed), an error otherwise.
    async fn upload(&self, key: &str, bytes: Bytes) -> Result<Object, RoundError> {
        let status = &self.archive.status;
        let object = Object {
            key: key.to_string(),
            len: bytes.len() as u64,
            crc: crc32c::crc32c(&bytes),
        };
        match self
            .archive
            .store
            .put(key, bytes, PutMode::CreateOnly)
            .await
        {
            Ok(_) => {
                status.count(Request::Put, Outcome::Ok);
                status
                    .objects_uploaded
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                status
                    .bytes_uploaded
                    .fetch_add(object.len, std::sync::atomic::Ordering::Relaxed);
                Ok(object)
            }
            Err(StoreError::PreconditionFailed) => {
                status.count(Request::Put, Outcome::Precondition);
                let there = self
                    .archive
                    .store
                    .get(key)
                    .await
                    .map_err(Error::request(key))?;
                status.count(Request::Get, Outcome::Ok);
                match there {
                    Some(o)
                        if o.bytes.len() as u64 == object.len
                            && crc32c::crc32c(&o.bytes) == object.crc =>
                    {
                        Ok(object)
                    }
                    _ => Err(RoundError::Fenced(format!(
                        "{key} already exists in {} with other content; another server writes \
                         under this owner epoch",
                        self.archive.store.describe()
                    ))),
                }
            }
            Err(e) => {
                status.count(Request::Put, Outcome::Error);
                Err(RoundError::Retry(Error::request(key)(e)))
            }
        }
    }
}

/// The keys in `listed` that are shard `shard`'s orphans: under one of its epoch
/// directories (`shard-<c>/e<epoch>/`, the only objects the archiver writes), named by none
/// of `manifests` nor on their garbage lists, and last modified at least `grace_ms` before
/// `now_ms`. An object whose age the store does not report is kept.
fn orphans(
    shard: u32,
    manifests: &[&Manifest],
    listed: &[ursula_s3::Listed],
    now_ms: i64,
    grace_ms: i64,
) -> Vec<String> {
    let known: BTreeSet<&str> = manifests
        .iter()
        .flat_map(|m| {
            let named = m
                .segments
                .iter()
                .flat_map(|s| s.pieces.iter().map(|p| &p.object));
            named
                .chain(m.checkpoint.iter().map(|c| &c.object))
                .chain(m.index_files.iter().map(|f| &f.object))
                .chain(m.blobs.iter().map(|b| &b.object))
                .map(|o| o.key.as_str())
                .chain(m.garbage.iter().map(|g| g.key.as_str()))
        })
        .collect();
    let base = format!("shard-{shard}/");
    let in_an_epoch_dir = |key: &str| {
        key.strip_prefix(&base)
            .and_then(|rest| rest.strip_prefix('e'))
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(epoch, name)| {
                !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty()
            })
    };
    listed
        .iter()
        .filter(|o| in_an_epoch_dir(&o.key) && !known.contains(o.key.as_str()))
        .filter(|o| o.modified_ms.is_some_and(|t| now_ms - t >= grace_ms))
        .map(|o| o.key.clone())
        .collect()
}

/// Snapshot blob files of a shard directory and their lengths.
fn list_blobs(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let dir = dir.join("snapshots");
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(&dir))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !name.ends_with(".blob") {
            continue;
        }
        match entry.metadata() {
            Ok(meta) => {
                out.insert(name, meta.len());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(dir.join(name))(e)),
        }
    }
    Ok(out)
}

/// `len` bytes of the file at `path` from `offset` on (`None`: to its end).
fn read_at(path: &Path, offset: u64, len: Option<u64>) -> Result<Vec<u8>> {
    let read = || {
        let file = std::fs::File::open(path)?;
        let len = match len {
            Some(n) => n,
            None => file.metadata()?.len().saturating_sub(offset),
        };
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    };
    read().map_err(Error::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(key: &str, modified_ms: Option<i64>) -> ursula_s3::Listed {
        ursula_s3::Listed {
            key: key.to_string(),
            size: 1,
            modified_ms,
        }
    }

    fn object(key: &str) -> Object {
        Object {
            key: key.to_string(),
            len: 1,
            crc: 0,
        }
    }

    #[test]
    fn orphans_are_old_unnamed_objects_of_this_shards_epochs() {
        let mut m = Manifest::new(1, 3, "a", 1000, 0);
        m.segments.push(manifest::Segment {
            index: 2,
            file_len: 1 << 20,
            sealed: true,
            pieces: vec![Piece {
                start: 0,
                object: object("shard-1/e3/0000000002.seg"),
            }],
        });
        m.blobs.push(manifest::Blob {
            name: "b".into(),
            object: object("shard-1/e2/snapshots/b.blob.4"),
        });
        m.drop_object("shard-1/e2/0000000001.seg".into(), 0);
        // What a commit whose answer was lost added: the stored manifest names it.
        let mut stored = m.clone();
        stored.index_files.push(manifest::IndexFile {
            number: 2,
            object: object("shard-1/e3/0000000002.idx"),
        });
        let (now, grace) = (100_000, 10_000);
        let old = Some(now - grace);
        let young = Some(now - grace + 1);
        let all = [
            listed("shard-1/manifest.json", old),
            listed("shard-1/e3/0000000002.seg", old),
            listed("shard-1/e2/snapshots/b.blob.4", old),
            listed("shard-1/e2/0000000001.seg", old),
            listed("shard-1/e3/0000000002.idx", old),
            listed("shard-1/e3/0000000003.seg.000000004096-000000009000", old),
            listed("shard-1/e1/checkpoint.00000000000000000007.0000abcd", old),
            listed("shard-1/e3/0000000004.seg", young),
            listed("shard-1/e3/0000000005.seg", None),
            listed("shard-1/notes.txt", old),
            listed("shard-1/ex/0000000003.seg", old),
            listed("shard-1/e/0000000003.seg", old),
            listed("shard-10/e3/0000000003.seg", old),
            listed("layout.json", old),
        ];
        let got = orphans(1, &[&m, &stored], &all, now, grace);
        assert_eq!(
            got,
            vec![
                "shard-1/e3/0000000003.seg.000000004096-000000009000".to_string(),
                "shard-1/e1/checkpoint.00000000000000000007.0000abcd".to_string(),
            ]
        );
        // Without the stored manifest the index file would have gone.
        assert!(orphans(1, &[&m], &all, now, grace).contains(&"shard-1/e3/0000000002.idx".into()));
    }

    #[test]
    fn sweeps_come_once_per_grace_period_and_at_most_every_second() {
        assert_eq!(
            sweep_every(Duration::from_secs(600)),
            Duration::from_secs(600)
        );
        assert_eq!(
            sweep_every(Duration::from_millis(7)),
            Duration::from_secs(1)
        );
    }
}

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
//!
//! With `--durability s3` the cores also hand it WAL objects to PUT (`wal_puts`), and a
//! shard acknowledges a change once the object holding it is in S3; the claim at start
//! fences the previous epoch's WAL (`crate::wal`).
//!
//! The files here: this one has the [`Archive`] and [`start`]; `claim` takes every
//! shard's next owner epoch at start; `reads` serves the engine's cold reads; `wal_puts`
//! its WAL PUTs; `worker` runs one shard's rounds and commits them; `segments`,
//! `checkpoint` and `blobs` are what a round copies; `garbage` deletes what no manifest
//! needs.

mod blobs;
mod checkpoint;
mod claim;
mod garbage;
mod reads;
mod segments;
mod wal_puts;
mod worker;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ursula_s3::DynStore;
use ursula_storage::cold::DurableEnd;
use ursula_storage::placement::Placement;

use crate::error::{Error, Result};
use crate::manifest::{End, Manifest};
use crate::status::Status;
use claim::{claim, owner_identity, read_restored};
use worker::Worker;

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
    /// The WAL PUTs' own thread and client (see [`wal_puts::WalThread`]).
    wal: wal_puts::WalThread,
    /// Set by [`Archive::finish`]: every worker runs its last round and reports on
    /// `finished`.
    finishing: tokio::sync::watch::Sender<bool>,
    finished: Mutex<std::sync::mpsc::Receiver<(u32, FinalRound)>>,
}

/// A shard's archive as its owner last committed it (what `/__ursula/lanes` reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardState {
    /// The owning server's identity, and the epoch it claimed the shard under.
    pub owner: String,
    pub epoch: u64,
    /// Everything up to this LSN is in S3.
    pub archived_lsn: u64,
    /// Durable log bytes not yet in a committed manifest.
    pub lag_bytes: u64,
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
    /// How far S3 held the log when this server claimed the shard (`None`: the archive
    /// was not this data dir's, and holds none of its log).
    s3_end: Option<DurableEnd>,
    /// This epoch's WAL objects: numbering and which ones the archive covers.
    wal: Mutex<wal_puts::WalPuts>,
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
pub fn start(settings: Settings, data_dir: &Path, placement: Placement) -> Result<Arc<Archive>> {
    let shards = placement.shards();
    let owner = owner_identity(data_dir)?;
    let restored = read_restored(data_dir)?;
    let wal = wal_puts::WalThread::start(&settings.s3)?;
    let (tx, rx) = std::sync::mpsc::channel::<Result<Arc<Archive>>>();
    let data_dir = data_dir.to_path_buf();
    std::thread::Builder::new()
        .name("ursula-archiver".into())
        .spawn(move || {
            let runtime = match current_thread_runtime("archiver runtime") {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let store: DynStore = Arc::new(ursula_s3::S3Store::connect(&settings.s3).await);
                let claimed = claim(&store, &settings, placement, &owner, &restored).await;
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
                        .map(|c| Slot {
                            durable: Mutex::new(None),
                            committed: Mutex::new(Arc::new(c.manifest.clone())),
                            s3_end: c.s3_end,
                            wal: Mutex::new(wal_puts::WalPuts::default()),
                        })
                        .collect(),
                    status: Arc::new(Status::new(shards as usize)),
                    store: store.clone(),
                    runtime: tokio::runtime::Handle::current(),
                    wal,
                    finishing,
                    finished: Mutex::new(finished),
                });
                if restored.is_some() {
                    let _ = std::fs::remove_file(data_dir.join(RESTORED_FILE));
                }
                let mut tasks = Vec::new();
                for (shard, c) in claimed.into_iter().enumerate() {
                    let worker = Worker::new(
                        archive.clone(),
                        &settings,
                        &data_dir,
                        shard as u32,
                        (c.manifest, c.etag),
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

/// A tokio current-thread runtime for one of the cold tier's threads.
fn current_thread_runtime(what: &'static str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Start { what, source })
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

    /// Who holds shard `shard`'s archive and how far behind it is, as this server last
    /// committed it (`None`: no such shard).
    pub fn shard_state(&self, shard: u32) -> Option<ShardState> {
        let m = self.committed(shard)?;
        Some(ShardState {
            owner: m.owner.clone(),
            epoch: m.epoch,
            archived_lsn: m.archived.lsn,
            lag_bytes: self.status.shard_lag_bytes(shard),
        })
    }

    fn committed(&self, shard: u32) -> Option<Arc<Manifest>> {
        let slot = self.shards.get(shard as usize)?;
        slot.committed.lock().ok().map(|m| m.clone())
    }
}

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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ursula_s3::DynStore;
use ursula_storage::cold::DurableEnd;
use ursula_storage::placement::Placement;

use crate::error::{Error, Result};
use crate::manifest::{End, Manifest};
use crate::status::Status;
pub use claim::Claim;
use claim::{claim, claim_shard, owner_identity, read_restored, ClaimMode, Claimed};
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
    /// Where this server serves its lanes (`host:port`), written into each manifest it
    /// claims so that other servers can name the owner.
    pub advertise: Option<String>,
    /// Lanes move between servers: a shard another server takes over is lost on its own
    /// (see [`Archive::take_lost`]) instead of stopping the whole archive.
    pub lanes_move: bool,
}

/// The running cold tier: what the cores see (as [`ColdStore`]) and the server reports.
pub struct Archive {
    /// By shard number: the shards this server archives now.
    slots: Vec<RwLock<Option<Arc<Slot>>>>,
    pub status: Arc<Status>,
    store: DynStore,
    runtime: tokio::runtime::Handle,
    /// The WAL PUTs' own thread and client (see [`wal_puts::WalThread`]).
    wal: wal_puts::WalThread,
    settings: Settings,
    data_dir: PathBuf,
    owner: String,
    /// Where workers report their last round on a clean stop, and where
    /// [`Archive::finish`] collects them.
    done: std::sync::mpsc::Sender<(u32, FinalRound)>,
    finished: Mutex<std::sync::mpsc::Receiver<(u32, FinalRound)>>,
    /// Shards another server took over while this one archived them (with `lanes_move`),
    /// found by their worker's commit or by a WAL PUT.
    lost: Arc<Mutex<Vec<u32>>>,
}

/// A shard's archive as its owner last committed it (what `/__ursula/lanes` reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardState {
    /// The owning server's identity and advertised address, and the epoch it claimed the
    /// shard under.
    pub owner: String,
    pub address: String,
    pub epoch: u64,
    /// Everything up to this LSN is in S3.
    pub archived_lsn: u64,
    /// Durable log bytes not yet in a committed manifest.
    pub lag_bytes: u64,
}

/// How one shard's last round on a clean stop (or a release) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalRound {
    /// Everything durable is in the committed manifest, up to this end.
    Archived(End),
    /// Archiving had stopped: another server owns the archive.
    Fenced(String),
    /// Out of time: this many durable bytes are only on the local disk.
    TimedOut { lag_bytes: u64 },
}

/// A lane adopted: its directory restored from the archive, ready for the engine to open.
#[derive(Debug, Clone)]
pub struct Adopted {
    pub shard: u32,
    /// The owner epoch this server claimed it under, and the one it took it from (0: the
    /// lane had no archive yet).
    pub epoch: u64,
    pub previous_owner: String,
    /// How long the claim took (reading the manifest, fencing the previous epoch's WAL,
    /// committing the next epoch).
    pub claim: Duration,
    /// What the restore wrote, and how long it took.
    pub restore: crate::restore::Report,
}

/// What a shard's worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// Keep archiving.
    Run,
    /// The server stops: run the last round and report it on `Archive::done`.
    Stop,
    /// The server lets the lane go: run the last round, commit the manifest as released,
    /// and report on the slot's `released` channel.
    Release,
    /// Another server fenced this epoch's WAL (the shard is reported lost already): stop
    /// now. The worker's own commits may never find the fence, as the lost lane's log
    /// stops moving, and its slot would keep the lane from being adopted here again.
    Lost,
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
    finish: tokio::sync::watch::Sender<Finish>,
    /// Where a release's last round is reported.
    released: Mutex<Option<futures_channel::oneshot::Sender<FinalRound>>>,
}

impl Slot {
    fn new(claimed: &Claimed) -> Slot {
        Slot {
            durable: Mutex::new(None),
            committed: Mutex::new(Arc::new(claimed.manifest.clone())),
            s3_end: claimed.s3_end,
            wal: Mutex::new(wal_puts::WalPuts::default()),
            finish: tokio::sync::watch::channel(Finish::Run).0,
            released: Mutex::new(None),
        }
    }
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

/// Start the archiver thread for a data dir laid out as `placement`: claim the manifests
/// of the shards `which` names (the next owner epoch) and return once that is done, or
/// why it was refused. [`Archive::held`] then names the shards claimed.
pub fn start(
    settings: Settings,
    data_dir: &Path,
    placement: Placement,
    which: Claim,
) -> Result<Arc<Archive>> {
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
                let claimed = claim(&store, &settings, placement, which, &owner, &restored).await;
                let claimed = match claimed {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let (done, finished) = std::sync::mpsc::channel();
                let archive = Arc::new(Archive {
                    slots: (0..shards).map(|_| RwLock::new(None)).collect(),
                    status: Arc::new(Status::new(shards as usize)),
                    store: store.clone(),
                    runtime: tokio::runtime::Handle::current(),
                    wal,
                    settings,
                    data_dir,
                    owner,
                    done,
                    finished: Mutex::new(finished),
                    lost: Arc::new(Mutex::new(Vec::new())),
                });
                if restored.is_some() {
                    let _ = std::fs::remove_file(archive.data_dir.join(RESTORED_FILE));
                }
                for (shard, c) in claimed {
                    archive.run_shard(shard, c);
                }
                let _ = tx.send(Ok(archive));
                // The runtime lives as long as the process: workers of adopted lanes are
                // spawned on it later.
                std::future::pending::<()>().await;
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
    /// The shards this server archives now, lowest first.
    pub fn held(&self) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|&s| self.slot(s).is_some())
            .collect()
    }

    /// The last round of a clean stop, after every shard's final durable end was reported:
    /// each shard uploads what its archive lacks and commits, retrying within `timeout`.
    /// Returns how each held shard's round ended, by shard. A fenced archive runs none.
    pub fn finish(&self, timeout: Duration) -> Vec<(u32, FinalRound)> {
        let held = self.held();
        if let Some(why) = self.status.fenced() {
            return held
                .into_iter()
                .map(|s| (s, FinalRound::Fenced(why.clone())))
                .collect();
        }
        let deadline = Instant::now() + timeout;
        for &shard in &held {
            if let Some(slot) = self.slot(shard) {
                slot.finish.send_replace(Finish::Stop);
            }
        }
        let mut out: Vec<(u32, Option<FinalRound>)> = held.iter().map(|&s| (s, None)).collect();
        if let Ok(finished) = self.finished.lock() {
            while out.iter().any(|(_, r)| r.is_none()) {
                let left = deadline.saturating_duration_since(Instant::now());
                match finished.recv_timeout(left) {
                    Ok((shard, r)) => {
                        if let Some((_, slot)) = out.iter_mut().find(|(s, _)| *s == shard) {
                            *slot = Some(r);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        out.into_iter()
            .map(|(shard, r)| {
                let r = r.unwrap_or_else(|| FinalRound::TimedOut {
                    lag_bytes: self.status.shard_lag_bytes(shard),
                });
                (shard, r)
            })
            .collect()
    }

    /// Adopt lane `shard` at run time: claim its manifest (the next owner epoch, fencing
    /// the previous owner's WAL), restore its directory in the data dir from the archive
    /// (what was there is removed first), and start archiving it. The previous owner must
    /// have released it or stopped heartbeating, unless `force`. `local_budget` is the
    /// shard's share of the local disk budget. Runs on the archiver's thread; the returned
    /// future may be awaited on any runtime.
    pub fn adopt(
        self: &Arc<Self>,
        shard: u32,
        force: bool,
        local_budget: Option<u64>,
    ) -> impl std::future::Future<Output = Result<Adopted>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let archive = self.clone();
        self.runtime.spawn(async move {
            let _ = tx.send(archive.adopt_here(shard, force, local_budget).await);
        });
        async move { rx.await.unwrap_or(Err(Error::ThreadExited)) }
    }

    async fn adopt_here(
        self: &Arc<Self>,
        shard: u32,
        force: bool,
        local_budget: Option<u64>,
    ) -> Result<Adopted> {
        if shard as usize >= self.slots.len() {
            return Err(Error::NoSuchShard { shard });
        }
        if self.slot(shard).is_some() {
            return Err(Error::AlreadyHeld { shard });
        }
        let started = Instant::now();
        let previous = crate::manifest::load(&self.store, shard).await?;
        let claimed = claim_shard(
            &self.store,
            &self.settings,
            shard,
            ClaimMode::Adopt { force },
            &self.owner,
            None,
        )
        .await?
        .ok_or(Error::AlreadyHeld { shard })?;
        let claim = started.elapsed();
        let dir = self.data_dir.join(format!("shard-{shard}"));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&dir)(e)),
        }
        let restore = crate::restore::restore_lane(
            &self.store,
            &claimed.manifest,
            &self.data_dir,
            local_budget,
        )
        .await?;
        let adopted = Adopted {
            shard,
            epoch: claimed.manifest.epoch,
            previous_owner: previous.map(|(m, _)| m.owner).unwrap_or_default(),
            claim,
            restore,
        };
        self.run_shard(shard, claimed);
        Ok(adopted)
    }

    /// Let lane `shard` go: its engine has stopped and reported `end` as its final durable
    /// end. The shard's worker archives everything up to it, commits the manifest as
    /// released (the next owner need not wait for the heartbeat to age), and stops.
    /// Resolves to how that last round ended; the caller bounds the wait. Until it ended
    /// with [`FinalRound::Archived`] the local directory is the only copy of the lag.
    pub fn release(
        &self,
        shard: u32,
        end: DurableEnd,
    ) -> impl std::future::Future<Output = FinalRound> {
        use ursula_storage::cold::ColdStore;
        let (tx, rx) = futures_channel::oneshot::channel();
        match self.slot(shard) {
            Some(slot) => {
                self.durable(shard, end);
                if let Ok(mut r) = slot.released.lock() {
                    *r = Some(tx);
                }
                slot.finish.send_replace(Finish::Release);
            }
            None => {
                let _ = tx.send(FinalRound::Fenced(format!(
                    "shard {shard} is not archived by this server"
                )));
            }
        }
        async move {
            rx.await
                .unwrap_or_else(|_| FinalRound::Fenced("the archiver thread stopped".to_string()))
        }
    }

    /// The shards other servers took over since the last call (with `lanes_move`): this
    /// server no longer archives them, and must stop serving them.
    pub fn take_lost(&self) -> Vec<u32> {
        let mut lost = self
            .lost
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default();
        // A shard's WAL PUT and its worker may both have found the fence.
        lost.sort_unstable();
        lost.dedup();
        lost
    }

    /// Who holds shard `shard`'s archive and how far behind it is, as this server last
    /// committed it (`None`: this server does not archive it).
    pub fn shard_state(&self, shard: u32) -> Option<ShardState> {
        let m = self.committed(shard)?;
        Some(ShardState {
            owner: m.owner.clone(),
            address: m.address.clone(),
            epoch: m.epoch,
            archived_lsn: m.archived.lsn,
            lag_bytes: self.status.shard_lag_bytes(shard),
        })
    }

    /// Shard `shard`'s manifest as committed in S3 now, whoever owns it (`None`: it has
    /// none). Runs on the archiver's thread.
    pub fn load_manifest(
        self: &Arc<Self>,
        shard: u32,
    ) -> impl std::future::Future<Output = Result<Option<Manifest>>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let store = self.store.clone();
        self.runtime.spawn(async move {
            let loaded = crate::manifest::load(&store, shard).await;
            let _ = tx.send(loaded.map(|m| m.map(|(m, _)| m)));
        });
        async move { rx.await.unwrap_or(Err(Error::ThreadExited)) }
    }

    /// This server's owner identity: what its manifests and node record name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Write this host's node record and read every host's back (see [`crate::members`]).
    /// Runs on the WAL PUTs' thread, beside the archiver's: a busy archiver (restoring an
    /// adopted lane, archiving a backlog) must not delay the heartbeat past the lease.
    pub fn heartbeat(
        &self,
        record: crate::members::NodeRecord,
    ) -> impl std::future::Future<Output = Result<crate::members::Membership>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let store = self.wal.store.clone();
        self.wal.runtime.spawn(async move {
            let _ = tx.send(crate::members::heartbeat(&store, &record).await);
        });
        async move { rx.await.unwrap_or(Err(Error::ThreadExited)) }
    }

    /// Remove this host's node record: it has given its lanes up and leaves.
    pub fn leave(&self) -> impl std::future::Future<Output = Result<()>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let store = self.store.clone();
        let owner = self.owner.clone();
        self.runtime.spawn(async move {
            let _ = tx.send(crate::members::leave(&store, &owner).await);
        });
        async move { rx.await.unwrap_or(Err(Error::ThreadExited)) }
    }

    /// Start archiving `shard` under the manifest just claimed.
    fn run_shard(self: &Arc<Self>, shard: u32, claimed: Claimed) {
        let slot = Arc::new(Slot::new(&claimed));
        let finish = slot.finish.subscribe();
        if let Some(cell) = self.slots.get(shard as usize) {
            if let Ok(mut c) = cell.write() {
                *c = Some(slot.clone());
            }
        }
        let worker = Worker::new(
            self.clone(),
            slot,
            shard,
            (claimed.manifest, claimed.etag),
            finish,
        );
        self.runtime.spawn(worker.run());
    }

    /// A worker's end: its slot is emptied, and a lost shard remembered for `take_lost`.
    fn end_shard(&self, shard: u32, lost: bool) {
        if let Some(cell) = self.slots.get(shard as usize) {
            if let Ok(mut c) = cell.write() {
                *c = None;
            }
        }
        if lost {
            if let Ok(mut l) = self.lost.lock() {
                l.push(shard);
            }
        }
    }

    fn slot(&self, shard: u32) -> Option<Arc<Slot>> {
        let cell = self.slots.get(shard as usize)?;
        cell.read().ok().and_then(|s| s.clone())
    }

    fn committed(&self, shard: u32) -> Option<Arc<Manifest>> {
        let slot = self.slot(shard)?;
        let m = slot.committed.lock().ok()?;
        Some(m.clone())
    }
}

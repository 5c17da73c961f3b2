//! A cluster's lanes on the move: adopting one, releasing one, dropping one another host
//! took, and the membership thread that decides which lanes this host should serve.
//!
//! With `--cluster`, a lane (a log of its own, see `ursula_storage::placement`) is owned
//! through its manifest in the cold tier: the host whose claim committed the manifest's
//! current epoch serves it, and every other host refuses its requests with `421
//! Misdirected Request` naming the owner's advertised address (`lane_table` is what the
//! cores check). A lane moves in two steps, each on the host concerned:
//!
//! * **release** ([`release`]): the lane stops taking requests (503 with `Retry-After`),
//!   its shard is stopped once everything it accepted is durable, the archiver archives it
//!   up to that end and commits the manifest as released, and the local directory goes;
//! * **adopt** ([`adopt`]): the archiver claims the manifest (the next epoch, fencing the
//!   previous owner's WAL), restores the lane's directory from S3, and the lane's core
//!   opens the shard and serves it.
//!
//! Which host should serve which lane is the membership thread's call
//! ([`start_membership`]): hosts heartbeat node records through the bucket, and each lane
//! goes to the live host rendezvous hashing picks. A lane another host takes over while
//! this one serves it (this host was stopped past its lease, or the operator forced it) is
//! noticed when its archive commit or WAL PUT is refused: [`drop_lost_lanes`] then stops
//! its shard without waiting for anything.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ursula_cold::FinalRound;
use ursula_storage::placement::Placement;

use crate::config::{AssignMode, Config};
use crate::core::{Core, Mailboxes};
use crate::http::ApiError;
use crate::lane_table::{LaneState, LaneTable, NotHere};

/// How long a release waits for the lane's last archive round before it reports the lane
/// as still moving (the round goes on in the background).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often lanes taken over by another host are looked for.
const LOST_LANES_EVERY: Duration = Duration::from_millis(200);

/// The refusal of a request for a lane this host does not serve now: 421 naming the
/// owner (looked up again in the background when not known lately), or 503 while the lane
/// moves.
pub fn refusal(core: &Rc<Core>, not_here: NotHere) -> ApiError {
    match not_here {
        NotHere::Moving { lane } => ApiError::NotServed { shard: lane },
        NotHere::Elsewhere { lane, owner } => {
            refresh_owner(core, lane);
            ApiError::Misdirected { lane, owner }
        }
    }
}

/// Where stream `key` is served: `None` here, or the address of the host that owns its
/// lane (see [`lane_host`]).
pub async fn serving_host(core: &Rc<Core>, key: &str) -> Result<Option<String>, ApiError> {
    lane_host(core, core.placement.shard_of(key) as u32).await
}

/// Where `lane` is served: `None` here, or the address of the host that owns it (looked up
/// in the lane's manifest when not known yet). A lane that moves, or has no owner yet, is
/// a retry.
pub async fn lane_host(core: &Rc<Core>, lane: u32) -> Result<Option<String>, ApiError> {
    match core.lanes.check(lane as usize) {
        Ok(()) => return Ok(None),
        Err(NotHere::Moving { lane }) => return Err(ApiError::NotServed { shard: lane }),
        Err(NotHere::Elsewhere {
            owner: Some(address),
            ..
        }) => return Ok(Some(address)),
        Err(NotHere::Elsewhere { owner: None, .. }) => {}
    }
    let looked_up = match crate::cold::archive() {
        Some(archive) => archive.load_manifest(lane).await.ok().flatten(),
        None => None,
    };
    core.lanes.learnt_owner(lane, looked_up.map(|m| m.address));
    core.lanes
        .owner(lane)
        .map(Some)
        .ok_or(ApiError::NotServed { shard: lane })
}

/// The other hosts that serve lanes now, each once: everything a question about all
/// streams (a bucket's listing) must also ask. A lane that moves, or has no owner yet, is
/// a retry.
pub async fn other_hosts(core: &Rc<Core>) -> Result<Vec<String>, ApiError> {
    let mut hosts: Vec<String> = Vec::new();
    for lane in 0..core.lanes.lanes() {
        if let Some(address) = lane_host(core, lane).await? {
            if !hosts.contains(&address) {
                hosts.push(address);
            }
        }
    }
    Ok(hosts)
}

/// Look the owner of `lane` up in its manifest (at most every few seconds), so the
/// next refusal names it. Called on the refusal path; the lookup runs in the background.
pub fn refresh_owner(core: &Rc<Core>, lane: u32) {
    let table = core.lanes.clone();
    let Some(archive) = crate::cold::archive() else {
        return;
    };
    if !table.should_look_up(lane) {
        return;
    }
    let loading = archive.load_manifest(lane);
    monoio::spawn(async move {
        match loading.await {
            Ok(m) => table.learnt_owner(lane, m.map(|m| m.address)),
            Err(e) => {
                tracing::debug!(lane, "looking up the lane's owner: {e}");
                table.learnt_owner(lane, table.owner(lane));
            }
        }
    });
}

/// Why a lane could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("lanes move only between hosts started with --cluster")]
    NotCluster,
    #[error("there is no lane {0}")]
    NoSuchLane(u32),
    #[error("lane {0} is already served here")]
    AlreadyServed(u32),
    #[error("lane {0} is not served here")]
    NotServed(u32),
    #[error("lane {0} is already moving")]
    Moving(u32),
    #[error(
        "lane {lane} is owned by {owner} (last heartbeat {heartbeat_age_ms} ms ago); \
         force=1 takes it over and fences that host out"
    )]
    Owned {
        lane: u32,
        owner: String,
        heartbeat_age_ms: i64,
    },
    #[error("lane {lane}: {source}")]
    Cold {
        lane: u32,
        #[source]
        source: ursula_cold::Error,
    },
    #[error("lane {lane}: opening its restored log: {source}")]
    Open {
        lane: u32,
        #[source]
        source: ursula_storage::StorageError,
    },
    #[error("lane {lane}: stopping its log: {source}")]
    Stop {
        lane: u32,
        #[source]
        source: ursula_storage::StorageError,
    },
    #[error("lane {lane}: its last archive round did not finish: {why}")]
    Unarchived { lane: u32, why: String },
    #[error("core {0} is unavailable")]
    CoreUnavailable(usize),
}

/// A lane adopted.
#[derive(Debug, Clone)]
pub struct Adoption {
    pub lane: u32,
    pub epoch: u64,
    pub previous_owner: String,
    pub restored_bytes: u64,
    pub restored_objects: u64,
    /// Where the time went: claiming the manifest, restoring the directory, opening the
    /// shard (recovery), and all of it.
    pub claim: Duration,
    pub restore: Duration,
    pub open: Duration,
    pub took: Duration,
}

/// A lane released.
#[derive(Debug, Clone)]
pub struct Release {
    pub lane: u32,
    /// The LSN the lane's archive ends at: everything it acknowledged.
    pub archived_lsn: u64,
    pub took: Duration,
}

/// Adopt `lane`: claim it in the cold tier, restore it, and serve it on its core. The
/// previous owner must have released it or stopped heartbeating, unless `force`.
pub async fn adopt(core: &Rc<Core>, lane: u32, force: bool) -> Result<Adoption, MoveError> {
    let started = Instant::now();
    let (table, archive) = movable(core, lane)?;
    if !table.transition(lane, LaneState::Elsewhere, LaneState::Moving) {
        return Err(match table.state(lane) {
            LaneState::Served => MoveError::AlreadyServed(lane),
            _ => MoveError::Moving(lane),
        });
    }
    let budget = crate::shards::local_budget(&core.config, &core.placement);
    let adopted = match archive.adopt(lane, force, budget).await {
        Ok(a) => a,
        Err(ursula_cold::Error::Owned {
            owner,
            heartbeat_age_ms,
            ..
        }) => {
            table.set(lane, LaneState::Elsewhere);
            return Err(MoveError::Owned {
                lane,
                owner,
                heartbeat_age_ms,
            });
        }
        Err(source) => {
            table.set(lane, LaneState::Elsewhere);
            return Err(MoveError::Cold { lane, source });
        }
    };
    let owner_core = Placement::core_of_shard(lane as usize, core.cores());
    let opening = Instant::now();
    let opened = core
        .on(owner_core, move |c| async move {
            let shard = crate::shards::open_shard(c.index, &c.config, &c.placement, lane).await?;
            c.install_shard(shard);
            Ok::<(), ursula_storage::StorageError>(())
        })
        .await;
    let failed = match opened {
        Ok(Ok(())) => None,
        Ok(Err(source)) => Some(MoveError::Open { lane, source }),
        Err(_) => Some(MoveError::CoreUnavailable(owner_core)),
    };
    if let Some(e) = failed {
        // Claimed but not servable: give the lane back rather than hold it unserved.
        tracing::error!(lane, "adopting failed, releasing the lane again: {e}");
        let restored = adopted.restore.restored_ends.first().copied();
        let restored = restored.unwrap_or_default();
        let end = ursula_storage::cold::DurableEnd {
            segment: ursula_storage::SegmentNo::new(restored.segment),
            position: restored.position,
            lsn: ursula_storage::Lsn::new(restored.lsn),
        };
        let _ = archive.release(lane, end).await;
        table.set(lane, LaneState::Elsewhere);
        return Err(e);
    }
    table.set(lane, LaneState::Served);
    (core.after_adoption)(core.clone(), lane);
    let open = opening.elapsed();
    let took = started.elapsed();
    table.counts.adopted.fetch_add(1, Ordering::Relaxed);
    table
        .counts
        .adoption_ms
        .fetch_add(took.as_millis() as u64, Ordering::Relaxed);
    tracing::info!(
        lane,
        epoch = adopted.epoch,
        previous_owner = %adopted.previous_owner,
        restored_bytes = adopted.restore.bytes,
        claim_ms = adopted.claim.as_millis() as u64,
        restore_ms = adopted.restore.elapsed.as_millis() as u64,
        open_ms = open.as_millis() as u64,
        ms = took.as_millis() as u64,
        "lane adopted"
    );
    Ok(Adoption {
        lane,
        epoch: adopted.epoch,
        previous_owner: adopted.previous_owner,
        restored_bytes: adopted.restore.bytes,
        restored_objects: adopted.restore.objects,
        claim: adopted.claim,
        restore: adopted.restore.elapsed,
        open,
        took,
    })
}

/// Release `lane`: stop serving it, archive all of it, mark its manifest released, and
/// remove its local directory. Requests for it meanwhile get 503 with `Retry-After`.
pub async fn release(core: &Rc<Core>, lane: u32) -> Result<Release, MoveError> {
    let started = Instant::now();
    let (table, archive) = movable(core, lane)?;
    if !table.transition(lane, LaneState::Served, LaneState::Moving) {
        return Err(match table.state(lane) {
            LaneState::Elsewhere => MoveError::NotServed(lane),
            _ => MoveError::Moving(lane),
        });
    }
    let owner_core = Placement::core_of_shard(lane as usize, core.cores());
    let stopped = core
        .on(owner_core, move |c| async move {
            let Some(shard) = c.remove_shard(lane) else {
                return Ok(None);
            };
            // Everything it accepted becomes durable; live readers are woken and end.
            shard.shutdown().await?;
            // A request that took the shard before it was removed may still have queued a
            // write: the flusher writes it before it exits, and marks the shard stopped
            // then. Only after that is the durable end final.
            while shard.failure().is_none() {
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok::<_, ursula_storage::StorageError>(Some(shard.durable_end()))
        })
        .await;
    let end = match stopped {
        Ok(Ok(Some(end))) => end,
        Ok(Ok(None)) => {
            table.set(lane, LaneState::Elsewhere);
            return Err(MoveError::NotServed(lane));
        }
        Ok(Err(source)) => return Err(MoveError::Stop { lane, source }),
        Err(_) => return Err(MoveError::CoreUnavailable(owner_core)),
    };
    // The last round goes on in the background if it outlasts the wait here (S3 slow or
    // down): the lane stays moving until it ends.
    let (tx, rx) = futures_channel::oneshot::channel();
    let last_round = archive.release(lane, end);
    let c = core.clone();
    monoio::spawn(async move {
        let _ = tx.send(released(&c, lane, last_round.await, started));
    });
    match monoio::time::timeout(RELEASE_TIMEOUT, rx).await {
        Ok(Ok(result)) => result,
        _ => Err(MoveError::Unarchived {
            lane,
            why: format!(
                "not archived within {} s; the archiver keeps trying, and the lane's local \
                 directory stays until it has",
                RELEASE_TIMEOUT.as_secs()
            ),
        }),
    }
}

/// A release's end, once the lane's last archive round has ended.
fn released(
    core: &Rc<Core>,
    lane: u32,
    last: FinalRound,
    started: Instant,
) -> Result<Release, MoveError> {
    let table = &core.lanes;
    match last {
        FinalRound::Archived(archived) => {
            let dir = core.config.data_dir.join(format!("shard-{lane}"));
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(lane, "removing the released lane's directory: {e}");
            }
            table.learnt_owner(lane, None);
            table.set(lane, LaneState::Elsewhere);
            table.counts.released.fetch_add(1, Ordering::Relaxed);
            let took = started.elapsed();
            tracing::info!(
                lane,
                lsn = archived.lsn,
                ms = took.as_millis() as u64,
                "lane released"
            );
            Ok(Release {
                lane,
                archived_lsn: archived.lsn,
                took,
            })
        }
        // Another host has it already: nothing of this one's is needed any more.
        FinalRound::Fenced(why) => {
            table.set(lane, LaneState::Elsewhere);
            Err(MoveError::Unarchived { lane, why })
        }
        FinalRound::TimedOut { lag_bytes } => Err(MoveError::Unarchived {
            lane,
            why: format!("{lag_bytes} bytes are not archived"),
        }),
    }
}

/// In a cluster, stop serving the lanes other hosts took over (see the module comment).
/// Runs on core 0 for the life of the server.
pub async fn drop_lost_lanes(core: Rc<Core>) {
    let Some(archive) = crate::cold::archive() else {
        return;
    };
    if !core.lanes.cluster() {
        return;
    }
    while !core.shutting_down() {
        monoio::time::sleep(LOST_LANES_EVERY).await;
        for lane in archive.take_lost() {
            tracing::error!(
                lane,
                "another host took the lane over: no longer serving it"
            );
            core.lanes.counts.lost.fetch_add(1, Ordering::Relaxed);
            core.lanes.set(lane, LaneState::Moving);
            let owner_core = Placement::core_of_shard(lane as usize, core.cores());
            let _ = core
                .on(owner_core, move |c| async move {
                    if let Some(shard) = c.remove_shard(lane) {
                        // Its log is no use to anyone now: the new owner restored the lane
                        // from S3, and nothing this host wrote since is acknowledged.
                        let _ = shard.halt().await;
                    }
                })
                .await;
            core.lanes.learnt_owner(lane, None);
            core.lanes.set(lane, LaneState::Elsewhere);
        }
    }
}

/// How often a host waiting for a lane that another live host is giving up looks at the
/// lane's manifest, so a planned move's adoption follows its release closely.
const HANDOVER_POLL: Duration = Duration::from_millis(100);

/// Start a cluster host's membership thread. Each heartbeat it writes the host's node
/// record, reads everyone's, learns who serves which lane, and (with automatic
/// assignment) moves lanes toward the assignment every host computes alike
/// (`ursula_cold::members`):
///
/// * a lane assigned here that no live host serves (its host died, or released it) is
///   adopted, by force when the manifest still names a host that is no longer live;
/// * a lane assigned here that a live host still serves is watched until that host has
///   released it (it computes the same assignment), then adopted;
/// * a lane served here but assigned to another live host is released.
///
/// The loop has a thread of its own so that nothing a core does (recovering an adopted
/// lane's log, a burst of requests) can delay a heartbeat past the lease; the moves it
/// decides run on core 0.
pub fn start_membership(
    config: Arc<Config>,
    lanes: Arc<LaneTable>,
    peers: Mailboxes,
    shards: u32,
    shutdown: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let Some(archive) = crate::cold::archive() else {
        return Ok(());
    };
    if !lanes.cluster() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("ursula-members".into())
        .spawn(move || {
            let membership = Membership {
                config,
                lanes,
                peers,
                shards,
                me: archive.owner().to_string(),
            };
            membership.run(archive, &shutdown);
        })
        .map(drop)
}

/// What the membership thread works with.
struct Membership {
    config: Arc<Config>,
    lanes: Arc<LaneTable>,
    peers: Mailboxes,
    shards: u32,
    me: String,
}

impl Membership {
    fn run(&self, archive: &Arc<ursula_cold::Archive>, shutdown: &AtomicBool) {
        let lease_ms = self.config.cluster_lease.as_millis() as i64;
        let mut failing_since: Option<Instant> = None;
        // After heartbeats failed (S3 unreachable, for this host or for all), the others'
        // records are old because nobody could write them: no lane moves until every
        // host has had a lease to heartbeat again.
        let mut quiet_until: Option<Instant> = None;
        let mut live_before: Vec<String> = Vec::new();
        // The lanes held at start were just claimed: good for one lease from now.
        self.lanes
            .renew_lease(Instant::now(), lease_validity(&self.config));
        while !shutdown.load(Ordering::Acquire) {
            let record = node_record(&self.config, &self.lanes, &self.me);
            let beat = Instant::now();
            match block_on(archive.heartbeat(record)) {
                Ok(view) => {
                    if !self.lanes.lease_lapsed() || self.find_lanes_taken_over(archive) {
                        self.lanes.renew_lease(beat, lease_validity(&self.config));
                    }
                    if let Some(t) = failing_since.take() {
                        tracing::info!(
                            after_ms = t.elapsed().as_millis() as u64,
                            "heartbeats work again; no lane moves for one lease"
                        );
                        quiet_until = Some(Instant::now() + self.config.cluster_lease);
                    }
                    let live: Vec<String> = view
                        .candidates(lease_ms)
                        .into_iter()
                        .map(str::to_string)
                        .collect();
                    self.lanes
                        .counts
                        .live_hosts
                        .store(view.live(lease_ms).count() as u64, Ordering::Relaxed);
                    if live != live_before {
                        let ages: Vec<(&str, i64)> = view
                            .members
                            .iter()
                            .map(|m| (m.record.id.as_str(), m.age_ms))
                            .collect();
                        tracing::info!(?live, ?ages, "cluster membership changed");
                        live_before = live;
                    }
                    self.learn_owners(&view, lease_ms);
                    let quiet = quiet_until.is_some_and(|t| Instant::now() < t);
                    if self.config.cluster_assign == AssignMode::Auto && !quiet {
                        self.steer(&view, lease_ms);
                    }
                }
                Err(e) => {
                    self.lanes
                        .counts
                        .heartbeat_failures
                        .fetch_add(1, Ordering::Relaxed);
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        tracing::warn!("cluster heartbeat failed, retrying: {e}");
                    }
                }
            }
            let next = Instant::now() + self.config.cluster_heartbeat;
            while Instant::now() < next && !shutdown.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20).min(self.config.cluster_heartbeat));
            }
        }
    }

    /// After the lease lapsed (this host was paused or cut off), before it serves again:
    /// a lane whose manifest now names another owner was taken over meanwhile. It stays
    /// unserved (`503`) until the archiver, refused at its next commit, reports it lost
    /// and `drop_lost_lanes` drops it. False when a manifest could not be read: the lease
    /// stays lapsed until the next heartbeat looks again.
    fn find_lanes_taken_over(&self, archive: &Arc<ursula_cold::Archive>) -> bool {
        for lane in self.lanes.served() {
            let owner = block_on(archive.load_manifest(lane)).map(|m| m.map(|m| m.owner));
            match owner {
                Ok(Some(owner)) if owner == self.me => {}
                Ok(owner) => {
                    tracing::warn!(
                        lane,
                        owner = owner.as_deref().unwrap_or(""),
                        "after a lapsed lease: another host took the lane over"
                    );
                    self.lanes
                        .transition(lane, LaneState::Served, LaneState::Moving);
                }
                Err(e) => {
                    tracing::warn!(
                        lane,
                        "after a lapsed lease: cannot read the lane's manifest: {e}"
                    );
                    return false;
                }
            }
        }
        true
    }

    /// Remember where the lanes other live hosts serve are, for refusals to name.
    fn learn_owners(&self, view: &ursula_cold::members::Membership, lease_ms: i64) {
        for m in view.live(lease_ms).filter(|m| m.record.id != self.me) {
            for &lane in &m.record.lanes {
                if self.lanes.state(lane) == LaneState::Elsewhere {
                    self.lanes
                        .learnt_owner(lane, Some(m.record.address.clone()));
                }
            }
        }
    }

    /// One heartbeat's moves (see [`start_membership`]), handed to core 0.
    fn steer(&self, view: &ursula_cold::members::Membership, lease_ms: i64) {
        let me = self.me.as_str();
        let candidates = view.candidates(lease_ms);
        // A leaving host's lanes are released by its drain, once the others watch them.
        if self.lanes.draining() {
            return;
        }
        let live: Vec<String> = view.live(lease_ms).map(|m| m.record.id.clone()).collect();
        for lane in 0..self.shards {
            let holder = view.holder(lane, lease_ms).filter(|m| m.record.id != me);
            let assigned = ursula_cold::members::assign(lane, &candidates);
            let letter: crate::core::Letter = match self.lanes.state(lane) {
                LaneState::Served if assigned.is_some_and(|a| a != me) => Box::new(move |core| {
                    let c = core.clone();
                    monoio::spawn(async move {
                        if let Err(e) = release(&c, lane).await {
                            tracing::warn!(lane, "giving the lane to its assigned host: {e}");
                        }
                    });
                }),
                LaneState::Elsewhere if assigned == Some(me) => {
                    let live = live.clone();
                    let handing_over = holder.is_some();
                    Box::new(move |core| {
                        let c = core.clone();
                        monoio::spawn(async move { take(&c, lane, live, handing_over).await });
                    })
                }
                _ => continue,
            };
            // Core 0 is stopping when this fails, and so is the loop.
            let _ = self.peers[0].post(letter);
        }
    }
}

/// How long after a successful heartbeat began this host may serve without another: the
/// lease, less what the others' view of it may be short by (object stores date records to
/// the second) and a margin, so it stops before anyone may count it gone.
fn lease_validity(config: &Config) -> Duration {
    config
        .cluster_lease
        .saturating_sub(Duration::from_millis(1_250))
}

/// Run `f` to completion on this (non-core) thread: the cold tier's futures complete from
/// its own threads, so parking until woken is all it takes.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// What this host says about itself now.
fn node_record(config: &Config, table: &LaneTable, me: &str) -> ursula_cold::members::NodeRecord {
    ursula_cold::members::NodeRecord {
        id: me.to_string(),
        address: config.advertise.clone().unwrap_or_default(),
        core_ports: config.core_listen.map_or_else(Vec::new, |a| {
            (0..config.cores).map(|c| a.port() + c as u16).collect()
        }),
        draining: table.draining(),
        lanes: table.served(),
    }
}

/// Adopt `lane`, assigned here: at once if no live host serves it, else once the host
/// serving it has released it.
async fn take(core: &Rc<Core>, lane: u32, live: Vec<String>, handing_over: bool) {
    let Some(archive) = crate::cold::archive() else {
        return;
    };
    if handing_over {
        // Watched within one heartbeat; the next heartbeat looks again if it takes longer.
        let deadline = Instant::now() + core.config.cluster_heartbeat;
        loop {
            match archive.load_manifest(lane).await {
                Ok(Some(m)) if m.released || !live.contains(&m.owner) => break,
                Ok(None) => break,
                _ if Instant::now() >= deadline || core.shutting_down() => return,
                _ => monoio::time::sleep(HANDOVER_POLL).await,
            }
        }
    }
    match adopt(core, lane, false).await {
        Ok(_) | Err(MoveError::Moving(_) | MoveError::AlreadyServed(_)) => {}
        // The manifest names a host that no longer heartbeats: fence it out.
        Err(MoveError::Owned { owner, .. }) if !live.contains(&owner) => {
            if let Err(e) = adopt(core, lane, true).await {
                tracing::warn!(lane, "adopting the lane of a lost host: {e}");
            }
        }
        Err(e) => tracing::info!(lane, "not adopting the lane yet: {e}"),
    }
}

/// Leave the cluster on a clean stop: say so (no host assigns this one lanes any more),
/// give every lane up so the others adopt them without waiting for a lease to run out,
/// and remove the node record.
pub async fn drain(core: Rc<Core>) {
    let Some(archive) = crate::cold::archive() else {
        return;
    };
    if !core.lanes.cluster() {
        return;
    }
    core.lanes.start_draining();
    let me = archive.owner().to_string();
    match archive
        .heartbeat(node_record(&core.config, &core.lanes, &me))
        .await
    {
        // The other hosts see the drain at their next heartbeat and start watching the
        // lanes they are to adopt: released after that, each lane is adopted within a
        // manifest poll instead of a heartbeat.
        Ok(_) => monoio::time::sleep(core.config.cluster_heartbeat).await,
        Err(e) => tracing::warn!("announcing the drain: {e}"),
    }
    let started = Instant::now();
    // Every lane served here is released, including those still being adopted when the
    // drain began (once they are served); the membership thread may have started some
    // of the releases already.
    let mut asked: Vec<u32> = Vec::new();
    while !core.lanes.none_here() {
        for lane in core.lanes.served() {
            if asked.contains(&lane) {
                continue;
            }
            asked.push(lane);
            let c = core.clone();
            monoio::spawn(async move {
                match release(&c, lane).await {
                    Ok(_) | Err(MoveError::Moving(_) | MoveError::NotServed(_)) => {}
                    Err(e) => tracing::warn!(lane, "releasing on the way out: {e}"),
                }
            });
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Err(e) = archive.leave().await {
        tracing::warn!("removing the node record: {e}");
    }
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "left the cluster: every lane released"
    );
}

/// The lane table and the archive, if `lane` can move at all.
fn movable(
    core: &Rc<Core>,
    lane: u32,
) -> Result<
    (
        std::sync::Arc<LaneTable>,
        &'static std::sync::Arc<ursula_cold::Archive>,
    ),
    MoveError,
> {
    if !core.lanes.cluster() {
        return Err(MoveError::NotCluster);
    }
    let archive = crate::cold::archive().ok_or(MoveError::NotCluster)?;
    if lane >= core.placement.shards() {
        return Err(MoveError::NoSuchLane(lane));
    }
    Ok((core.lanes.clone(), archive))
}

//! Claiming the archive at start: the layout must match, and every shard's manifest
//! passes to this server's next owner epoch unless another live server owns it. The owner
//! identity and a restore's epochs live in files of the data dir.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ursula_s3::DynStore;
use ursula_storage::placement::Placement;
use ursula_storage::segment;

use ursula_storage::cold::DurableEnd;

use super::{Settings, OWNER_FILE, RESTORED_FILE};
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest};
use crate::wal::{follow_and_fence, Fencer};

/// A shard as claimed: the manifest committed, its ETag, and how far S3 holds the log.
pub(super) struct Claimed {
    pub(super) manifest: Manifest,
    pub(super) etag: String,
    pub(super) s3_end: Option<DurableEnd>,
}

/// Which shards a start claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Every shard of the layout (one server owns the whole archive), refusing to start
    /// while another live server owns any of them.
    Every,
    /// Only the lanes this server owned when it stopped, and still owns: the lanes of a
    /// cluster member, which gets others by adopting them.
    Owned,
}

/// How one shard is being claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimMode {
    /// At start, owning every shard (see [`Claim::Every`]).
    Start,
    /// At start, a lane this server owned (see [`Claim::Owned`]); skipped otherwise.
    Resume,
    /// At run time, a lane whose directory is then restored from the archive: taken from
    /// an owner that released it or stopped heartbeating, or from any owner when `force`.
    Adopt { force: bool },
}

/// Take the next owner epoch of every shard's manifest `which` names, or refuse to start.
/// Returns the shards claimed, by number.
pub(super) async fn claim(
    store: &DynStore,
    settings: &Settings,
    placement: Placement,
    which: Claim,
    owner: &str,
    restored: &Option<Vec<u64>>,
) -> Result<Vec<(u32, Claimed)>> {
    let at = store.describe();
    manifest::ensure_layout(store, placement)
        .await
        .map_err(|e| Error::Claim {
            store: at.clone(),
            source: Box::new(e),
        })?;
    let mode = match which {
        Claim::Every => ClaimMode::Start,
        Claim::Owned => ClaimMode::Resume,
    };
    let mut out = Vec::new();
    for shard in 0..placement.shards() {
        let restored_epoch = restored
            .as_ref()
            .and_then(|r| r.get(shard as usize).copied());
        if let Some(c) = claim_shard(store, settings, shard, mode, owner, restored_epoch).await? {
            out.push((shard, c));
        }
    }
    Ok(out)
}

/// Take the next owner epoch of shard `shard`'s manifest. The previous epoch's WAL is
/// fenced first, and what it holds past the archived end is inherited when this data dir
/// continues that log (it is this server's, was restored from it, or is being adopted and
/// will be restored from it). `None`: a resume found the lane is not this server's.
pub(super) async fn claim_shard(
    store: &DynStore,
    settings: &Settings,
    shard: u32,
    mode: ClaimMode,
    owner: &str,
    restored_epoch: Option<u64>,
) -> Result<Option<Claimed>> {
    let at = store.describe();
    let claiming = |e: Error| Error::Claim {
        store: at.clone(),
        source: Box::new(e),
    };
    let interval_ms = settings.archive_interval.as_millis() as u64;
    let now = ursula_storage::now_ms();
    let current = manifest::load(store, shard).await.map_err(claiming)?;
    let (mut next, etag, s3_end) = match current {
        None if mode == ClaimMode::Resume => return Ok(None),
        None => (Manifest::new(shard, 1, owner, interval_ms, now), None, None),
        Some((m, etag)) => {
            let restored_from = restored_epoch == Some(m.epoch);
            let ours = m.owner == owner;
            let adopting = matches!(mode, ClaimMode::Adopt { .. });
            if mode == ClaimMode::Resume && (!ours || m.released) {
                return Ok(None);
            }
            let forced = match mode {
                ClaimMode::Start => settings.takeover,
                ClaimMode::Resume => false,
                ClaimMode::Adopt { force } => force,
            };
            if !ours && !restored_from && !forced && m.owner_alive(now) {
                return Err(Error::Owned {
                    store: at.clone(),
                    shard,
                    owner: m.owner,
                    epoch: m.epoch,
                    heartbeat_age_ms: now - m.heartbeat_ms,
                });
            }
            if !ours && !restored_from && !m.released {
                tracing::warn!(
                    shard,
                    previous_owner = %m.owner,
                    epoch = m.epoch + 1,
                    "taking the cold tier archive over"
                );
            }
            let inherit = ours || restored_from || adopting;
            let mut next = m.successor(owner, interval_ms, inherit, now);
            let fencer = Fencer {
                epoch: next.epoch,
                owner,
            };
            let known = crate::wal::newest_archived_seq(&m);
            let chain = follow_and_fence(
                store,
                shard,
                m.epoch,
                m.s3_end().lsn,
                known,
                &fencer,
                |_| Ok(()),
            )
            .await
            .map_err(claiming)?;
            next.add_fence(chain.fence);
            if inherit {
                next.wal.retain(|w| w.last_lsn > next.archived.lsn);
                next.wal.extend(chain.objects);
            } else {
                // This data dir's log is another one: the old WAL is garbage.
                for w in chain.objects {
                    next.drop_object(w.object.key, now);
                }
            }
            let s3_end = inherit.then(|| end_of(&next));
            (next, Some(etag), s3_end)
        }
    };
    next.address = settings.advertise.clone().unwrap_or_default();
    let etag = match manifest::commit(store, &next, etag.as_deref()).await {
        Ok(etag) => etag,
        // A lane resumed at start that another host took over since it was read (this
        // host's heartbeats had stopped): it is that host's now, not this one's.
        Err(Error::Conflict { .. }) if mode == ClaimMode::Resume => {
            tracing::warn!(
                shard,
                "another host took the lane over while it was resumed"
            );
            return Ok(None);
        }
        Err(Error::Conflict { .. }) => {
            return Err(Error::ClaimRace {
                store: at.clone(),
                shard,
            })
        }
        Err(e) => return Err(claiming(e)),
    };
    tracing::info!(
        shard,
        epoch = next.epoch,
        owner,
        "cold tier archive claimed"
    );
    Ok(Some(Claimed {
        manifest: next,
        etag,
        s3_end,
    }))
}

/// How far S3 holds the log the manifest describes.
fn end_of(m: &Manifest) -> DurableEnd {
    let end = m.s3_end();
    DurableEnd {
        segment: ursula_storage::SegmentNo::new(end.segment),
        position: end.position,
        lsn: ursula_storage::Lsn::new(end.lsn),
    }
}

/// The random identity of the server owning `data_dir`, created on first use.
pub(super) fn owner_identity(data_dir: &Path) -> Result<String> {
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
pub(super) fn read_restored(data_dir: &Path) -> Result<Option<Vec<u64>>> {
    let path = data_dir.join(RESTORED_FILE);
    match std::fs::read(&path) {
        Ok(b) => sonic_rs::from_slice(&b)
            .map(Some)
            .map_err(|source| Error::CorruptFile { path, source }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path)(e)),
    }
}

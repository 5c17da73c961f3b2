//! What a shard's archive in the object store is: its manifest and the names of its objects.
//!
//! ```text
//! layout.json                                   {"shards": N, "lanes": L} (and "logs": "lane"): created once, never changed
//! shard-<c>/manifest.json                       the manifest (CAS: If-Match / If-None-Match: *)
//! shard-<c>/e<epoch>/<seg>.seg                  a sealed segment, up to its records' end
//! shard-<c>/e<epoch>/<seg>.seg.<start>-<end>    a slice of the segment being written
//! shard-<c>/e<epoch>/<number>.idx               an index file
//! shard-<c>/e<epoch>/checkpoint.<lsn>.<crc>     a checkpoint copy
//! shard-<c>/e<epoch>/snapshots/<blob>.<len>     a snapshot blob
//! shard-<c>/e<epoch>/wal/<sequence>              a WAL object, or a fence (`--durability s3`)
//! ```
//!
//! Every object but the manifest is written once, create-only. Keys carry the owner epoch
//! that wrote them: after a restore or a takeover the new owner writes other bytes at the
//! same log positions, and objects a dead owner uploaded but never committed must not be
//! mistaken for its successor's.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use ursula_s3::{DynStore, PutMode, StoreError};
use ursula_storage::placement::Placement;

use crate::error::{Error, Result};

pub const LAYOUT_KEY: &str = "layout.json";
pub const VERSION: u32 = 1;

/// The prefix-level object: how the archived data dir places streams on its shards
/// (`lanes` absent: by the hash data dirs used before lanes; `logs` absent: a log per
/// core).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub shards: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<u32>,
    /// `"lane"` when every lane is a log of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
}

impl Layout {
    pub fn of(placement: Placement) -> Layout {
        Layout {
            shards: placement.shards(),
            lanes: placement.lanes(),
            logs: placement.log_per_lane().then(|| "lane".to_string()),
        }
    }

    /// The placement this layout describes; `None` if it describes none (zero shards,
    /// fewer lanes than shards, an unknown kind of log).
    pub fn placement(&self) -> Option<Placement> {
        let log_per_lane = match self.logs.as_deref() {
            None => false,
            Some("lane") => true,
            Some(_) => return None,
        };
        Placement::from_parts(self.shards, self.lanes, log_per_lane).ok()
    }
}

/// A position in the shard's log: segment, byte position in it, and the LSN of the last
/// record before it. Segment 0 means nothing is archived yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct End {
    pub segment: u64,
    pub position: u64,
    pub lsn: u64,
}

/// An immutable object and the bytes it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    pub key: String,
    pub len: u64,
    /// CRC32C of the content.
    pub crc: u32,
}

/// Bytes `[start, start + object.len)` of a segment file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub start: u64,
    pub object: Object,
}

/// One segment of the log: whole (sealed) or as slices of the segment being written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub index: u64,
    /// Size of the local file (preallocated), restored as such.
    pub file_len: u64,
    pub sealed: bool,
    pub pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub lsn: u64,
    /// Where the log continues after it.
    pub segment: u64,
    pub position: u64,
    /// Segments before `segment` that hold data of its streams (its segment map).
    pub segments: Vec<u64>,
    pub object: Object,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexFile {
    /// The file's number (its name in the shard's directory). Stored as `segment`, the name
    /// from when index files were numbered by the segment whose roll wrote them.
    #[serde(rename = "segment")]
    pub number: u64,
    pub object: Object,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub name: String,
    pub object: Object,
}

/// A WAL object past the archived end that an earlier epoch wrote and this one inherited
/// (see `crate::wal`): a restore applies it before this epoch's own WAL objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalRef {
    pub first_lsn: u64,
    pub last_lsn: u64,
    /// Where the log ends after it.
    pub end_segment: u64,
    pub end_position: u64,
    pub object: Object,
}

/// An object no committed manifest needs any more, deleted once the grace period after
/// `since_ms` has passed (a reader or a restore may still be fetching it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Garbage {
    pub key: String,
    pub since_ms: i64,
}

/// A shard's archive: which objects make up its log, and who may change it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub shard: u32,
    /// Taken by compare-and-swap at each start: a writer whose epoch is no longer the
    /// manifest's is fenced out.
    pub epoch: u64,
    /// The owning server's identity (kept in its data dir).
    pub owner: String,
    /// Where the owner serves this shard's lane (its advertised `host:port`), for a server
    /// that does not own the lane to name in its refusal; empty when it did not say.
    #[serde(default)]
    pub address: String,
    /// The owner let the lane go after archiving all of it: the next owner takes it over at
    /// once, without waiting for the heartbeat to age.
    #[serde(default)]
    pub released: bool,
    /// When the owner last committed, ms since the epoch, and how often it commits: an owner
    /// silent for a few intervals is presumed gone.
    pub heartbeat_ms: i64,
    pub interval_ms: u64,
    /// Everything before this is in the objects below.
    pub archived: End,
    pub segments: Vec<Segment>,
    pub checkpoint: Option<Checkpoint>,
    /// The index files `checkpoint` names.
    pub index_files: Vec<IndexFile>,
    pub blobs: Vec<Blob>,
    pub garbage: Vec<Garbage>,
    /// WAL objects of earlier epochs past `archived`, in log order.
    #[serde(default)]
    pub wal: Vec<WalRef>,
    /// The keys of the fences written when earlier epochs were taken over: kept for good,
    /// because a stale owner that wakes up must still find its next WAL key taken.
    #[serde(default)]
    pub fences: Vec<String>,
}

/// How many fences a manifest remembers: an owner fenced that many takeovers ago has long
/// found its manifest commits refused.
pub const FENCES_KEPT: usize = 16;

impl Manifest {
    pub fn new(shard: u32, epoch: u64, owner: &str, interval_ms: u64, now_ms: i64) -> Manifest {
        Manifest {
            version: VERSION,
            shard,
            epoch,
            owner: owner.to_string(),
            address: String::new(),
            released: false,
            heartbeat_ms: now_ms,
            interval_ms,
            archived: End::default(),
            segments: Vec::new(),
            checkpoint: None,
            index_files: Vec::new(),
            blobs: Vec::new(),
            garbage: Vec::new(),
            wal: Vec::new(),
            fences: Vec::new(),
        }
    }

    /// The manifest a new owner commits: the next epoch, and either this archive's objects
    /// (`inherit`: its local log continues this one) or none of them, all to be deleted
    /// after the grace period.
    pub fn successor(&self, owner: &str, interval_ms: u64, inherit: bool, now_ms: i64) -> Manifest {
        let mut next = if inherit {
            self.clone()
        } else {
            let mut fresh = Manifest::new(self.shard, 0, owner, interval_ms, now_ms);
            fresh.garbage = self.garbage.clone();
            fresh.fences = self.fences.clone();
            let dropped = self.keys();
            fresh.garbage.extend(dropped.into_iter().map(|key| Garbage {
                key,
                since_ms: now_ms,
            }));
            fresh
        };
        next.epoch = self.epoch + 1;
        next.owner = owner.to_string();
        next.address = String::new();
        next.released = false;
        next.heartbeat_ms = now_ms;
        next.interval_ms = interval_ms;
        next
    }

    /// Every object key the manifest needs (not its garbage).
    pub fn keys(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .segments
            .iter()
            .flat_map(|s| s.pieces.iter().map(|p| p.object.key.clone()))
            .collect();
        out.extend(self.checkpoint.iter().map(|c| c.object.key.clone()));
        out.extend(self.index_files.iter().map(|f| f.object.key.clone()));
        out.extend(self.blobs.iter().map(|b| b.object.key.clone()));
        out.extend(self.wal.iter().map(|w| w.object.key.clone()));
        out
    }

    /// How far S3 holds the log: the archived end, or the end of the inherited WAL
    /// objects past it.
    pub fn s3_end(&self) -> End {
        match self.wal.last() {
            Some(w) if w.last_lsn > self.archived.lsn => End {
                segment: w.end_segment,
                position: w.end_position,
                lsn: w.last_lsn,
            },
            _ => self.archived,
        }
    }

    /// Remember a fence key, forgetting the oldest beyond [`FENCES_KEPT`].
    pub fn add_fence(&mut self, key: String) {
        if !self.fences.contains(&key) {
            self.fences.push(key);
        }
        let over = self.fences.len().saturating_sub(FENCES_KEPT);
        self.fences.drain(..over);
    }

    /// Whether `segment` is archived whole.
    pub fn sealed(&self, segment: u64) -> bool {
        self.segments.iter().any(|s| s.index == segment && s.sealed)
    }

    /// Whether the owner committed recently enough to be presumed alive (and did not
    /// release the lane).
    pub fn owner_alive(&self, now_ms: i64) -> bool {
        if self.released {
            return false;
        }
        let window = 3 * self.interval_ms as i64 + 2_000;
        now_ms - self.heartbeat_ms < window
    }

    /// Move `key` to the garbage list.
    pub fn drop_object(&mut self, key: String, now_ms: i64) {
        self.garbage.push(Garbage {
            key,
            since_ms: now_ms,
        });
    }
}

pub fn manifest_key(shard: u32) -> String {
    format!("shard-{shard}/manifest.json")
}

/// Names of the immutable objects one owner epoch of one shard writes.
pub struct Keys {
    base: String,
}

impl Keys {
    pub fn new(shard: u32, epoch: u64) -> Keys {
        Keys {
            base: format!("shard-{shard}/e{epoch}"),
        }
    }

    pub fn sealed(&self, segment: u64) -> String {
        format!("{}/{segment:010}.seg", self.base)
    }

    pub fn slice(&self, segment: u64, start: u64, end: u64) -> String {
        format!("{}/{segment:010}.seg.{start:012}-{end:012}", self.base)
    }

    pub fn index(&self, number: u64) -> String {
        format!("{}/{number:010}.idx", self.base)
    }

    pub fn checkpoint(&self, lsn: u64, crc: u32) -> String {
        format!("{}/checkpoint.{lsn:020}.{crc:08x}", self.base)
    }

    pub fn blob(&self, name: &str, len: u64) -> String {
        format!("{}/snapshots/{name}.{len}", self.base)
    }

    /// This epoch's WAL object (or fence) number `seq`.
    pub fn wal(&self, seq: u64) -> String {
        format!("{}/{}{seq:020}", self.base, WAL_DIR)
    }

    /// The prefix all WAL keys of this epoch share.
    pub fn wal_prefix(&self) -> String {
        format!("{}/{}", self.base, WAL_DIR)
    }
}

const WAL_DIR: &str = "wal/";

/// The epoch and sequence number a WAL key of shard `shard` names.
pub fn parse_wal_key(shard: u32, key: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(&format!("shard-{shard}/e"))?;
    let (epoch, rest) = rest.split_once('/')?;
    let seq = rest.strip_prefix(WAL_DIR)?;
    if seq.len() != 20 {
        return None;
    }
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

/// Read shard `shard`'s manifest and its ETag.
pub async fn load(store: &DynStore, shard: u32) -> Result<Option<(Manifest, String)>> {
    let key = manifest_key(shard);
    match store.get(&key).await.map_err(Error::request(&key))? {
        None => Ok(None),
        Some(o) => {
            let m: Manifest =
                sonic_rs::from_slice(&o.bytes).map_err(|source| Error::CorruptManifest {
                    key: key.clone(),
                    source,
                })?;
            if m.shard != shard {
                return Err(Error::WrongShard {
                    key,
                    found: m.shard,
                });
            }
            Ok(Some((m, o.etag)))
        }
    }
}

/// Write `m` if the stored manifest still has ETag `etag` (`None`: if there is none yet);
/// returns the new ETag. [`Error::Conflict`] when another writer changed it.
pub async fn commit(store: &DynStore, m: &Manifest, etag: Option<&str>) -> Result<String> {
    let bytes = sonic_rs::to_vec(m).map_err(|source| Error::Encode {
        what: "manifest",
        source,
    })?;
    let mode = match etag {
        Some(e) => PutMode::IfMatch(e.to_string()),
        None => PutMode::CreateOnly,
    };
    let key = manifest_key(m.shard);
    match store.put(&key, Bytes::from(bytes), mode).await {
        Ok(tag) => Ok(tag),
        Err(StoreError::PreconditionFailed) => Err(Error::Conflict { key }),
        Err(e) => Err(Error::request(key)(e)),
    }
}

/// Read the prefix's layout.
pub async fn load_layout(store: &DynStore) -> Result<Option<Layout>> {
    match store
        .get(LAYOUT_KEY)
        .await
        .map_err(Error::request(LAYOUT_KEY))?
    {
        None => Ok(None),
        Some(o) => {
            sonic_rs::from_slice(&o.bytes)
                .map(Some)
                .map_err(|source| Error::CorruptLayout {
                    key: LAYOUT_KEY.to_string(),
                    source,
                })
        }
    }
}

/// Create the layout, or check that the existing one places streams as `placement` does.
pub async fn ensure_layout(store: &DynStore, placement: Placement) -> Result<()> {
    let ours = Layout::of(placement);
    let check = |l: Layout| {
        if l == ours {
            Ok(())
        } else {
            Err(Error::LayoutMismatch {
                store: store.describe(),
                archived: l,
                ours: ours.clone(),
            })
        }
    };
    if let Some(l) = load_layout(store).await? {
        return check(l);
    }
    let bytes = sonic_rs::to_vec(&ours).map_err(|source| Error::Encode {
        what: "layout",
        source,
    })?;
    match store
        .put(LAYOUT_KEY, Bytes::from(bytes), PutMode::CreateOnly)
        .await
    {
        Ok(_) => Ok(()),
        Err(StoreError::PreconditionFailed) => match load_layout(store).await? {
            Some(l) => check(l),
            None => Err(Error::LayoutVanished {
                key: LAYOUT_KEY.to_string(),
            }),
        },
        Err(e) => Err(Error::request(LAYOUT_KEY)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{local, run};

    fn object(key: &str) -> Object {
        Object {
            key: key.into(),
            len: 1,
            crc: 0,
        }
    }

    #[test]
    fn keys_carry_shard_epoch_and_positions() {
        let k = Keys::new(3, 7);
        assert_eq!(k.sealed(12), "shard-3/e7/0000000012.seg");
        assert_eq!(
            k.slice(12, 4096, 8200),
            "shard-3/e7/0000000012.seg.000000004096-000000008200"
        );
        assert_eq!(k.index(2), "shard-3/e7/0000000002.idx");
        assert_eq!(
            k.checkpoint(5, 0xab),
            "shard-3/e7/checkpoint.00000000000000000005.000000ab"
        );
        assert_eq!(
            k.blob("19a-1.blob", 10),
            "shard-3/e7/snapshots/19a-1.blob.10"
        );
        assert_ne!(
            Keys::new(3, 8).sealed(12),
            k.sealed(12),
            "a new owner never reuses a key"
        );
        assert_eq!(manifest_key(3), "shard-3/manifest.json");
        let wal = k.wal(42);
        assert_eq!(wal, "shard-3/e7/wal/00000000000000000042");
        assert!(wal.starts_with(&k.wal_prefix()));
        assert_eq!(parse_wal_key(3, &wal), Some((7, 42)));
        assert_eq!(parse_wal_key(4, &wal), None);
        assert_eq!(parse_wal_key(3, &k.sealed(42)), None);
    }

    #[test]
    fn fences_are_remembered_up_to_a_bound() {
        let mut m = Manifest::new(0, 1, "a", 1000, 0);
        for i in 0..FENCES_KEPT + 3 {
            m.add_fence(format!("f{i}"));
        }
        m.add_fence(format!("f{}", FENCES_KEPT + 2));
        assert_eq!(m.fences.len(), FENCES_KEPT);
        assert_eq!(m.fences[0], "f3");
        assert_eq!(m.successor("b", 1000, false, 1).fences, m.fences);
    }

    #[test]
    fn a_successor_takes_the_next_epoch_and_inherits_or_drops_the_objects() {
        let mut m = Manifest::new(0, 4, "a", 1000, 10);
        m.segments.push(Segment {
            index: 1,
            file_len: 1 << 20,
            sealed: true,
            pieces: vec![Piece {
                start: 0,
                object: object("s1"),
            }],
        });
        m.blobs.push(Blob {
            name: "b".into(),
            object: object("b1"),
        });
        m.garbage.push(Garbage {
            key: "old".into(),
            since_ms: 1,
        });
        let same = m.successor("a", 500, true, 20);
        assert_eq!(
            (same.epoch, same.owner.as_str(), same.interval_ms),
            (5, "a", 500)
        );
        assert_eq!(same.segments, m.segments);
        let other = m.successor("b", 1000, false, 30);
        assert_eq!((other.epoch, other.owner.as_str()), (5, "b"));
        assert!(other.segments.is_empty() && other.blobs.is_empty());
        let mut dropped: Vec<_> = other.garbage.iter().map(|g| g.key.as_str()).collect();
        dropped.sort_unstable();
        assert_eq!(dropped, vec!["b1", "old", "s1"]);
        assert!(other
            .garbage
            .iter()
            .filter(|g| g.key != "old")
            .all(|g| g.since_ms == 30));
    }

    #[test]
    fn an_owner_is_alive_for_a_few_intervals() {
        let m = Manifest::new(0, 1, "a", 1000, 10_000);
        assert!(m.owner_alive(10_000 + 4_999));
        assert!(!m.owner_alive(10_000 + 5_000));
    }

    #[test]
    fn commits_are_compare_and_swap() {
        let (_dir, store) = local();
        run(async {
            assert!(load(&store, 0).await.expect("load").is_none());
            let m = Manifest::new(0, 1, "a", 1000, 1);
            let tag = commit(&store, &m, None).await.expect("create");
            assert!(
                matches!(commit(&store, &m, None).await, Err(Error::Conflict { .. })),
                "create-only"
            );
            let (got, got_tag) = load(&store, 0).await.expect("load").expect("present");
            assert_eq!((got, got_tag.as_str()), (m.clone(), tag.as_str()));
            // Two owners start from the same read: exactly one wins the epoch.
            let a = m.successor("a", 1000, true, 2);
            let b = m.successor("b", 1000, false, 2);
            let won = commit(&store, &a, Some(&tag)).await.expect("first wins");
            assert!(matches!(
                commit(&store, &b, Some(&tag)).await,
                Err(Error::Conflict { .. })
            ));
            let (now, now_tag) = load(&store, 0).await.expect("load").expect("present");
            assert_eq!((now.epoch, now.owner.as_str(), now_tag), (2, "a", won));
            assert!(
                load(&store, 1).await.expect("load").is_none(),
                "other shard untouched"
            );
        });
    }

    #[test]
    fn the_layout_is_created_once_and_checked() {
        let (_dir, store) = local();
        run(async {
            let four = Placement::with_lanes(4, 64).expect("placement");
            ensure_layout(&store, four).await.expect("create");
            ensure_layout(&store, four).await.expect("same placement");
            let two = Placement::with_lanes(2, 64).expect("placement");
            let err = ensure_layout(&store, two)
                .await
                .expect_err("other count")
                .to_string();
            assert!(
                err.contains("4 shards") && err.contains("--cores 4"),
                "{err}"
            );
            let older = Placement::Hashed { shards: 4 };
            let err = ensure_layout(&store, older)
                .await
                .expect_err("other placement")
                .to_string();
            assert!(err.contains("64 lanes"), "{err}");
            let lane_logs = Placement::lane_logs(64).expect("placement");
            let err = ensure_layout(&store, lane_logs)
                .await
                .expect_err("a log per lane")
                .to_string();
            assert!(err.contains("--cores 4 --lanes 64"), "{err}");
        });
        let (_dir, store) = local();
        run(async {
            let lane_logs = Placement::lane_logs(12).expect("placement");
            ensure_layout(&store, lane_logs).await.expect("create");
            let per_core = Placement::with_lanes(2, 12).expect("placement");
            let err = ensure_layout(&store, per_core)
                .await
                .expect_err("a log per core")
                .to_string();
            assert!(err.contains("--logs lane --lanes 12"), "{err}");
        });
    }

    #[test]
    fn layouts_from_before_lanes_still_read() {
        let layout: Layout = sonic_rs::from_slice(br#"{"shards":2}"#).expect("parse");
        assert_eq!(layout.placement(), Some(Placement::Hashed { shards: 2 }));
        let lanes = Layout::of(Placement::with_lanes(2, 64).expect("placement"));
        let text = sonic_rs::to_string(&lanes).expect("encode");
        assert_eq!(text, r#"{"shards":2,"lanes":64}"#);
        let lane_logs = Layout::of(Placement::lane_logs(12).expect("placement"));
        let text = sonic_rs::to_string(&lane_logs).expect("encode");
        assert_eq!(text, r#"{"shards":12,"lanes":12,"logs":"lane"}"#);
        assert_eq!(lane_logs.placement(), Placement::lane_logs(12).ok());
        let unknown: Layout =
            sonic_rs::from_slice(br#"{"shards":2,"lanes":2,"logs":"disk"}"#).expect("parse");
        assert_eq!(unknown.placement(), None);
    }
}

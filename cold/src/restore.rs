//! `ursula restore`: build a data dir from the cold tier alone.
//!
//! Every shard's manifest names a checkpoint, the index files it refers to, snapshot
//! blobs, and the segments of the log up to the archived end (the one being written as
//! slices). The restored segments are preallocated to their original size, so the data dir
//! is exactly what a crash right after the archived end would have left: the server's
//! recovery replays it from the checkpoint, and everything after the archived end is gone.
//!
//! With a local budget (`--cold-local-bytes`, the server's `local_bytes`), a restore onto a
//! smaller disk downloads what recovery replays (the segments from the checkpoint's
//! position on), then the newest older segments that still fit in each shard's share of
//! the budget. The rest stays cold: the shard's directory gets the cold marker, and the
//! server, started with the same cold tier, reads those segments from S3 like any it
//! evicted itself.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ursula_s3::DynStore;
use ursula_storage::segment::{self, SegmentHeader, DATA_START};
use ursula_storage::SegmentNo;

use crate::archiver::RESTORED_FILE;
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, Object};

/// What a restore wrote.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub shards: u32,
    pub objects: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Per shard: the archived end it was rewound to (segment, position, LSN).
    pub ends: Vec<manifest::End>,
    /// Sealed segments left in the cold tier to keep within the local budget, and their
    /// bytes.
    pub cold_segments: u64,
    pub cold_bytes: u64,
    /// WAL objects applied past the archived end (`--durability s3`), and the end each
    /// shard's log was restored to with them.
    pub wal_objects: u64,
    pub restored_ends: Vec<manifest::End>,
}

/// Restore the archive in `store` into `data_dir`, which must be empty or absent. With
/// `local_bytes`, older sealed segments beyond that budget (split evenly over the shards)
/// stay in the cold tier.
pub async fn restore(
    store: &DynStore,
    data_dir: &Path,
    local_bytes: Option<u64>,
) -> Result<Report> {
    let started = Instant::now();
    if let Ok(mut entries) = std::fs::read_dir(data_dir) {
        if entries.next().is_some() {
            return Err(Error::NotEmpty {
                dir: data_dir.to_path_buf(),
            });
        }
    }
    let at = store.describe();
    let layout = manifest::load_layout(store)
        .await?
        .ok_or_else(|| Error::NoArchive {
            store: at.clone(),
            key: manifest::LAYOUT_KEY,
        })?;
    let placement = layout.placement().ok_or_else(|| Error::UnusableLayout {
        key: manifest::LAYOUT_KEY.to_string(),
        shards: layout.shards,
        lanes: layout.lanes,
    })?;
    segment::create_dir_durable(data_dir).map_err(Error::io(data_dir))?;
    let mut report = Report {
        shards: layout.shards,
        ..Report::default()
    };
    let mut epochs = Vec::new();
    for shard in 0..layout.shards {
        let (m, _) = manifest::load(store, shard)
            .await?
            .ok_or_else(|| Error::NoManifest {
                store: at.clone(),
                shard,
            })?;
        let budget = local_bytes.map(|b| b / u64::from(layout.shards.max(1)));
        restore_shard(store, &m, data_dir, budget, &mut report).await?;
        let end = restore_wal(store, &m, data_dir, &mut report).await?;
        epochs.push(m.epoch);
        report.ends.push(m.archived);
        report.restored_ends.push(end);
    }
    let restored = sonic_rs::to_vec(&epochs).map_err(|source| Error::Encode {
        what: "restored epochs",
        source,
    })?;
    write_file(&data_dir.join(RESTORED_FILE), &restored)?;
    // The layout last: a data dir with one was restored completely.
    write_file(
        &data_dir.join("ursula.layout"),
        placement.to_layout_text().as_bytes(),
    )?;
    segment::sync_dir(data_dir).map_err(Error::io(data_dir))?;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Restore shard `m.shard`'s directory in `data_dir` from `m`, the manifest a new owner has
/// just claimed: its claim fenced the previous epoch and inherited that epoch's WAL
/// objects, so they are all in `m.wal` and there is no chain to follow. The directory must
/// not exist. Returns the end the log was restored to.
pub async fn restore_lane(
    store: &DynStore,
    m: &Manifest,
    data_dir: &Path,
    budget: Option<u64>,
) -> Result<Report> {
    let started = Instant::now();
    let mut report = Report {
        shards: 1,
        ..Report::default()
    };
    restore_shard(store, m, data_dir, budget, &mut report).await?;
    let dir = data_dir.join(format!("shard-{}", m.shard));
    let mut end = m.archived;
    let wal: Vec<&manifest::WalRef> = m
        .wal
        .iter()
        .filter(|w| w.last_lsn > m.archived.lsn)
        .collect();
    let fetched = wal.iter().map(|w| {
        let (store, w) = (store.clone(), (*w).clone());
        async move { crate::wal::fetch(&store, &w).await }
    });
    in_order(fetched, |i, o| {
        crate::wal::apply(&dir, m.shard, &o)?;
        end = applied(&mut report, wal[i]);
        Ok(())
    })
    .await?;
    segment::sync_dir(&dir).map_err(Error::io(&dir))?;
    report.ends.push(m.archived);
    report.restored_ends.push(end);
    report.elapsed = started.elapsed();
    Ok(report)
}

async fn restore_shard(
    store: &DynStore,
    m: &Manifest,
    data_dir: &Path,
    budget: Option<u64>,
    report: &mut Report,
) -> Result<()> {
    let dir = data_dir.join(format!("shard-{}", m.shard));
    segment::create_dir_durable(&dir).map_err(Error::io(&dir))?;
    let (local, cold) = local_segments(m, budget);
    if !cold.is_empty() {
        ursula_storage::write_cold_marker(&dir).map_err(Error::io(&dir))?;
        report.cold_segments += cold.len() as u64;
        report.cold_bytes += cold.iter().map(|s| s.file_len).sum::<u64>();
    }
    // A segment is restored from its first piece on: one without pieces cannot be.
    if let Some(seg) = local.iter().find(|s| s.pieces.is_empty()) {
        return Err(Error::BadSegmentHeader {
            segment: seg.index,
            shard: m.shard,
        });
    }
    // An open segment is archived in many small pieces: fetched one after another, their
    // round trips added up to seconds per lane.
    let pieces: Vec<(&manifest::Segment, &manifest::Piece)> = local
        .iter()
        .flat_map(|seg| seg.pieces.iter().map(move |p| (*seg, p)))
        .collect();
    let mut writing: Option<(u64, std::fs::File)> = None;
    let objects = pieces.iter().map(|(_, p)| p.object.clone());
    in_order(fetches(store, objects, report), |i, bytes| {
        let (seg, piece) = pieces[i];
        let path = segment::segment_path(&dir, SegmentNo::new(seg.index));
        if writing
            .as_ref()
            .is_none_or(|(index, _)| *index != seg.index)
        {
            if let Some((_, done)) = writing.take() {
                done.sync_all().map_err(Error::io(&path))?;
            }
            let header = Some(&bytes)
                .filter(|b| piece.start == 0 && b.len() >= DATA_START as usize)
                .and_then(|b| SegmentHeader::decode(b))
                .filter(|h| h.shard == m.shard && h.index.get() == seg.index)
                .ok_or(Error::BadSegmentHeader {
                    segment: seg.index,
                    shard: m.shard,
                })?;
            drop(segment::create_segment(&dir, header, seg.file_len).map_err(Error::io(&path))?);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(Error::io(&path))?;
            writing = Some((seg.index, file));
        }
        if let Some((_, file)) = &writing {
            file.write_all_at(&bytes, piece.start)
                .map_err(Error::io(&path))?;
        }
        Ok(())
    })
    .await?;
    if let Some((index, done)) = writing.take() {
        let path = segment::segment_path(&dir, SegmentNo::new(index));
        done.sync_all().map_err(Error::io(&path))?;
    }

    let blobs = dir.join("snapshots");
    if !m.blobs.is_empty() {
        segment::create_dir_durable(&blobs).map_err(Error::io(&blobs))?;
    }
    let files: Vec<(std::path::PathBuf, &Object)> = m
        .index_files
        .iter()
        .map(|f| (dir.join(format!("{:010}.idx", f.number)), &f.object))
        .chain(m.blobs.iter().map(|b| (blobs.join(&b.name), &b.object)))
        .chain(
            m.checkpoint
                .iter()
                .map(|c| (dir.join(ursula_storage::CHECKPOINT_FILE), &c.object)),
        )
        .collect();
    let objects = files.iter().map(|(_, o)| (*o).clone());
    in_order(fetches(store, objects, report), |i, bytes| {
        write_file(&files[i].0, &bytes)
    })
    .await?;
    if !m.blobs.is_empty() {
        segment::sync_dir(&blobs).map_err(Error::io(&blobs))?;
    }
    segment::sync_dir(&dir).map_err(Error::io(&dir))
}

/// The name a restore writes into the fences it leaves.
const RESTORE_OWNER: &str = "ursula-restore";

/// Apply the WAL past the archived end: the objects the manifest inherited, then its own
/// epoch's up to the first gap, and fence that epoch so its owner, if it still runs,
/// acknowledges nothing more. Returns where the restored log ends.
async fn restore_wal(
    store: &DynStore,
    m: &Manifest,
    data_dir: &Path,
    report: &mut Report,
) -> Result<manifest::End> {
    let dir = data_dir.join(format!("shard-{}", m.shard));
    let mut end = m.archived;
    let archived = m.archived.lsn;
    let wal: Vec<&manifest::WalRef> = m.wal.iter().filter(|w| w.last_lsn > archived).collect();
    let fetched = wal.iter().map(|w| {
        let (store, w) = (store.clone(), (*w).clone());
        async move { crate::wal::fetch(&store, &w).await }
    });
    in_order(fetched, |i, o| {
        crate::wal::apply(&dir, m.shard, &o)?;
        end = applied(report, wal[i]);
        Ok(())
    })
    .await?;
    let fencer = crate::wal::Fencer {
        epoch: m.epoch + 1,
        owner: RESTORE_OWNER,
    };
    let known = crate::wal::newest_archived_seq(m);
    let chain =
        crate::wal::follow_and_fence(store, m.shard, m.epoch, end.lsn, known, &fencer, |o| {
            crate::wal::apply(&dir, m.shard, o)
        })
        .await?;
    for w in &chain.objects {
        end = applied(report, w);
    }
    Ok(end)
}

/// Count WAL object `w` as applied; returns the log's end after it.
fn applied(report: &mut Report, w: &manifest::WalRef) -> manifest::End {
    report.wal_objects += 1;
    report.objects += 1;
    report.bytes += w.object.len;
    manifest::End {
        segment: w.end_segment,
        position: w.end_position,
        lsn: w.last_lsn,
    }
}

/// Which of the manifest's segments up to the archived end to download, and which to leave
/// in the cold tier. Recovery replays the log from the checkpoint's position, so those
/// segments are always local (even beyond the budget; the server cannot evict them until
/// its next checkpoint either). Older ones the checkpoint's segment map does not name hold
/// no live data and are skipped; of the rest, the newest that fit stay local, because
/// readers mostly read recent data.
fn local_segments(
    m: &Manifest,
    budget: Option<u64>,
) -> (Vec<&manifest::Segment>, Vec<&manifest::Segment>) {
    let archived: Vec<&manifest::Segment> = m
        .segments
        .iter()
        .filter(|s| s.index <= m.archived.segment)
        .collect();
    let (Some(budget), Some(c)) = (budget, &m.checkpoint) else {
        return (archived, Vec::new());
    };
    let (replayed, older): (Vec<_>, Vec<_>) =
        archived.into_iter().partition(|s| s.index >= c.segment);
    let mut used: u64 = replayed.iter().map(|s| s.file_len).sum();
    let mut local = replayed;
    let mut cold = Vec::new();
    for seg in older.into_iter().rev() {
        if !c.segments.contains(&seg.index) {
            continue;
        }
        if used + seg.file_len <= budget {
            used += seg.file_len;
            local.push(seg);
        } else {
            cold.push(seg);
        }
    }
    local.sort_by_key(|s| s.index);
    cold.sort_by_key(|s| s.index);
    (local, cold)
}

/// How many downloads a restore keeps in flight: enough to hide an object store's round
/// trip behind the others, few enough that a lane's restore does not crowd out the
/// archiving of the others on the same thread.
const FETCHES_IN_FLIGHT: usize = 16;

/// The downloads of `objects`, each checked to be what the manifest says, counted in
/// `report` up front (a restore that fails is abandoned whole).
fn fetches<'a>(
    store: &'a DynStore,
    objects: impl Iterator<Item = Object> + 'a,
    report: &'a mut Report,
) -> impl Iterator<Item = impl std::future::Future<Output = Result<Bytes>> + Send + 'static> + 'a {
    objects.map(move |o| {
        report.objects += 1;
        report.bytes += o.len;
        let store = store.clone();
        async move { fetch(&store, &o).await }
    })
}

/// Run `tasks` with up to [`FETCHES_IN_FLIGHT`] at once, handing each one's output to
/// `each` (with its position) in the order of `tasks`. The first error ends it and cancels
/// the tasks still running.
pub(crate) async fn in_order<T, F>(
    tasks: impl Iterator<Item = F>,
    mut each: impl FnMut(usize, T) -> Result<()>,
) -> Result<()>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
{
    /// Cancels the tasks still running when the pipeline ends early.
    struct Running<T>(std::collections::VecDeque<tokio::task::JoinHandle<Result<T>>>);
    impl<T> Drop for Running<T> {
        fn drop(&mut self) {
            for task in &self.0 {
                task.abort();
            }
        }
    }
    let mut tasks = tasks.fuse();
    let mut running = Running(std::collections::VecDeque::new());
    let mut i = 0;
    loop {
        while running.0.len() < FETCHES_IN_FLIGHT {
            let Some(task) = tasks.next() else { break };
            running.0.push_back(tokio::spawn(task));
        }
        let Some(next) = running.0.pop_front() else {
            return Ok(());
        };
        let out = next.await.map_err(|_| Error::ThreadExited)??;
        each(i, out)?;
        i += 1;
    }
}

/// Download `o` and check it is what the manifest says.
async fn fetch(store: &DynStore, o: &Object) -> Result<Bytes> {
    let got = store
        .get(&o.key)
        .await
        .map_err(Error::request(&o.key))?
        .ok_or_else(|| Error::Missing {
            key: o.key.clone(),
            store: store.describe(),
        })?;
    if got.bytes.len() as u64 != o.len || crc32c::crc32c(&got.bytes) != o.crc {
        return Err(Error::CorruptObject { key: o.key.clone() });
    }
    Ok(got.bytes)
}

/// Write `path` and make its content durable (its directory is synced by the caller).
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .and_then(|()| std::fs::File::open(path)?.sync_all())
        .map_err(Error::io(path))
}

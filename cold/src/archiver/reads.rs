//! The engine's side of the archive ([`ColdStore`]): durable ends reported by the cores,
//! whether a segment is archived whole, reads of archived segments as ranged GETs on the
//! archiver's runtime, and (with `--durability s3`) where S3's copy of the log ends and the
//! WAL objects' PUTs.

use std::io;

use bytes::Bytes;
use ursula_s3::DynStore;
use ursula_storage::cold::{ColdRead, ColdStore, DurableEnd, WalPut};
use ursula_storage::SegmentNo;

use super::Archive;
use crate::error::Error;
use crate::manifest::Manifest;
use crate::status::{Outcome, Request, Status};

impl ColdStore for Archive {
    fn durable(&self, shard: u32, end: DurableEnd) {
        if let Some(slot) = self.slot(shard) {
            if let Ok(mut d) = slot.durable.lock() {
                // A shard's log only grows: a late report from its upkeep must not take
                // back the end its shutdown reported.
                if d.is_none_or(|old| end > old) {
                    *d = Some(end);
                }
            }
        }
    }

    fn s3_end(&self, shard: u32) -> Option<DurableEnd> {
        self.slot(shard).and_then(|s| s.s3_end)
    }

    fn archived_lsn(&self, shard: u32) -> ursula_storage::Lsn {
        let lsn = self.committed(shard).map_or(0, |m| m.archived.lsn);
        ursula_storage::Lsn::new(lsn)
    }

    fn put_wal(&self, shard: u32, object: ursula_storage::wal::WalObject) -> WalPut {
        self.put_wal_object(shard, object)
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

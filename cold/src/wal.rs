//! The S3 write-ahead log (`--durability s3`) as the cold tier sees it: following a shard's
//! chain of WAL objects past the archived end, fencing it, and writing it into a data dir.
//!
//! A shard's WAL objects are keyed by owner epoch and a sequence number counting that
//! epoch's objects from 0 (`manifest::Keys::wal`); their changes follow each other without
//! a gap. What they hold beyond the archived end was acknowledged (or, past the last
//! acknowledgement, merely written), so whoever takes a shard over, a restore or the next
//! start of a server, first finds the chain's end and then **fences** it: a fence written
//! create-only at the sequence number the next WAL object would take. A previous owner
//! still running (paused, cut off) then finds that key taken and acknowledges nothing
//! more, since it acknowledges only through objects whose predecessors all landed; S3's
//! create-only PUT lets exactly one of the two writes win. Should the old owner win the
//! race, the fence goes one object further. Keys are numbered rather than named by LSN so
//! that the next key is known without knowing where the old owner's next object starts.

use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use ursula_s3::{DynStore, PutMode, StoreError};
use ursula_storage::segment::{self, SegmentHeader};
use ursula_storage::wal::{self, WalEntry, WalObject};
use ursula_storage::SegmentNo;

use crate::error::{Error, Result};
use crate::manifest::{parse_wal_key, Keys, Object, WalRef};

/// One shard's chain of WAL objects as found and fenced.
#[derive(Debug, Default)]
pub struct Chain {
    /// The objects holding changes past the starting LSN, in order, up to the first gap.
    pub objects: Vec<WalRef>,
    /// The fence's key.
    pub fence: String,
}

/// The newest sequence number of epoch `m.epoch`'s WAL that `m` dropped as archived: the
/// chain past the archive starts after it.
pub fn newest_archived_seq(m: &crate::manifest::Manifest) -> Option<u64> {
    m.garbage
        .iter()
        .filter_map(|g| crate::manifest::parse_wal_key(m.shard, &g.key))
        .filter(|&(epoch, _)| epoch == m.epoch)
        .map(|(_, seq)| seq)
        .max()
}

/// Who writes a fence.
#[derive(Debug, Clone)]
pub struct Fencer<'a> {
    pub epoch: u64,
    pub owner: &'a str,
}

/// Follow epoch `epoch`'s WAL of `shard` from the change after `after`, calling `apply` on
/// every object that continues the log without a gap, to the first sequence number with
/// no object, and fence it there (see the module comment). An object whose PUT lost the
/// race against a fence, or that follows a gap in the changes, is never part of it.
/// `known`: a sequence number at or before the chain's start, if one is known (see
/// [`newest_archived_seq`]).
pub async fn follow_and_fence(
    store: &DynStore,
    shard: u32,
    epoch: u64,
    mut after: u64,
    known: Option<u64>,
    fencer: &Fencer<'_>,
    mut apply: impl FnMut(&WalObject) -> Result<()>,
) -> Result<Chain> {
    let keys = Keys::new(shard, epoch);
    let mut seq = start_of_chain(store, shard, &keys, after, known).await?;
    let mut chain = Chain::default();
    let mut continuous = true;
    loop {
        let key = keys.wal(seq);
        match read_or_fence(store, &key, fencer).await? {
            None | Some((WalEntry::Fence { .. }, _)) => {
                chain.fence = key;
                return Ok(chain);
            }
            Some((WalEntry::Object(o), bytes)) => {
                if o.shard != shard {
                    return Err(Error::CorruptWal {
                        key,
                        why: "holds another shard's log",
                    });
                }
                if o.first_lsn.get() > after + 1 {
                    // Changes no earlier object holds: nothing from here on was
                    // acknowledged (the archive gate held it), so none of it is applied.
                    continuous = false;
                }
                if continuous && o.last_lsn.get() > after {
                    apply(&o)?;
                    chain.objects.push(WalRef {
                        first_lsn: o.first_lsn.get(),
                        last_lsn: o.last_lsn.get(),
                        end_segment: o.end.0.get(),
                        end_position: o.end.1,
                        object: Object {
                            key,
                            len: bytes.len() as u64,
                            crc: crc32c::crc32c(&bytes),
                        },
                    });
                    after = o.last_lsn.get();
                }
                seq += 1;
            }
        }
    }
}

/// What `key` holds; if nothing, a fence is written there, and `None` returned once it is.
async fn read_or_fence(
    store: &DynStore,
    key: &str,
    fencer: &Fencer<'_>,
) -> Result<Option<(WalEntry, Bytes)>> {
    if let Some(o) = store.get(key).await.map_err(Error::request(key))? {
        return Ok(Some((decode(key, &o.bytes)?, o.bytes)));
    }
    let fence = wal::encode_fence(fencer.epoch, fencer.owner);
    match store.put(key, fence, PutMode::CreateOnly).await {
        Ok(_) => Ok(None),
        // The old owner's PUT of this key landed first: that object is part of the chain.
        Err(StoreError::PreconditionFailed) => {
            let o = store
                .get(key)
                .await
                .map_err(Error::request(key))?
                .ok_or_else(|| Error::Missing {
                    key: key.to_string(),
                    store: store.describe(),
                })?;
            Ok(Some((decode(key, &o.bytes)?, o.bytes)))
        }
        Err(e) => Err(Error::request(key)(e)),
    }
}

/// The sequence number to follow the chain from: the newest object that starts at or
/// before the change after `after` (older ones may be deleted already, once the archive
/// covers them), found by a binary search over the objects' heads; the oldest listed one
/// if none does, 0 when the epoch has none.
async fn start_of_chain(
    store: &DynStore,
    shard: u32,
    keys: &Keys,
    after: u64,
    known: Option<u64>,
) -> Result<u64> {
    let prefix = keys.wal_prefix();
    // The epoch's WAL objects below the archive stay for the grace period: thousands on a
    // busy lane. Listing from the newest one known archived skips them.
    let listed = match known {
        Some(seq) if seq > 0 => store.list_after(&prefix, &keys.wal(seq - 1)).await,
        _ => store.list(&prefix).await,
    };
    let listed = listed.map_err(Error::request(&prefix))?;
    let mut seqs: Vec<u64> = listed
        .iter()
        .filter_map(|l| parse_wal_key(shard, &l.key).map(|(_, seq)| seq))
        .collect();
    seqs.sort_unstable();
    let Some(&lo) = seqs.first() else {
        return Ok(0);
    };
    // Deletion takes the oldest first, so the chain is the run without a gap from `lo`.
    let hi = seqs
        .iter()
        .zip(seqs.iter().skip(1))
        .find(|(a, b)| **b != **a + 1)
        .map_or(seqs[seqs.len() - 1], |(a, _)| *a);
    let wanted = after + 1;
    let starts_by = |seq: u64| async move {
        let key = keys.wal(seq);
        let head = store
            .get_range(&key, 0, wal::PEEK_BYTES as u64)
            .await
            .map_err(Error::request(&key))?;
        Ok::<bool, Error>(matches!(
            head.as_deref().and_then(wal::peek),
            Some(wal::Peeked::Object { first, .. }) if first.get() <= wanted
        ))
    };
    if !starts_by(lo).await? {
        return Ok(lo);
    }
    // Invariant: the object at `a` starts at or before `wanted`; the answer is in [a, b].
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a).div_ceil(2);
        if starts_by(mid).await? {
            a = mid;
        } else {
            b = mid - 1;
        }
    }
    Ok(a)
}

/// Download an inherited WAL object and check it is what the manifest says.
pub async fn fetch(store: &DynStore, w: &WalRef) -> Result<WalObject> {
    let key = &w.object.key;
    let got = store
        .get(key)
        .await
        .map_err(Error::request(key))?
        .ok_or_else(|| Error::Missing {
            key: key.clone(),
            store: store.describe(),
        })?;
    if got.bytes.len() as u64 != w.object.len || crc32c::crc32c(&got.bytes) != w.object.crc {
        return Err(Error::CorruptObject { key: key.clone() });
    }
    match decode(key, &got.bytes)? {
        WalEntry::Object(o) => Ok(o),
        WalEntry::Fence { .. } => Err(Error::CorruptWal {
            key: key.clone(),
            why: "a fence where the manifest names a WAL object",
        }),
    }
}

fn decode(key: &str, bytes: &Bytes) -> Result<WalEntry> {
    wal::decode(bytes).map_err(|source| Error::CorruptWalObject {
        key: key.to_string(),
        source,
    })
}

/// Write a WAL object's pieces into shard directory `dir` at their positions, creating a
/// segment the directory lacks from the piece that starts it.
pub fn apply(dir: &Path, shard: u32, o: &WalObject) -> Result<()> {
    for p in &o.pieces {
        let path = segment::segment_path(dir, p.segment);
        if !path.exists() {
            let first_lsn = p.segment_first_lsn.ok_or(Error::WalGap {
                shard,
                segment: p.segment.get(),
            })?;
            let header = SegmentHeader {
                shard,
                index: SegmentNo::new(p.segment.get()),
                first_lsn,
            };
            drop(segment::create_segment(dir, header, p.file_len).map_err(Error::io(&path))?);
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        file.write_all_at(&p.bytes, p.start)
            .and_then(|()| file.sync_data())
            .map_err(Error::io(&path))?;
    }
    segment::sync_dir(dir).map_err(Error::io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{local, run};
    use ursula_storage::wal::WalPiece;
    use ursula_storage::Lsn;

    /// WAL object `seq` of epoch 1, shard 0: changes `first..=last`.
    async fn put(store: &DynStore, seq: u64, first: u64, last: u64) {
        let o = WalObject {
            shard: 0,
            first_lsn: Lsn::new(first),
            last_lsn: Lsn::new(last),
            end: (SegmentNo::new(1), 4096 + last * 10),
            pieces: vec![WalPiece {
                segment: SegmentNo::new(1),
                start: 4096 + (first - 1) * 10,
                file_len: 1 << 20,
                segment_first_lsn: None,
                bytes: Bytes::from(vec![first as u8; ((last - first + 1) * 10) as usize]),
            }],
        };
        store
            .put(&Keys::new(0, 1).wal(seq), o.encode(), PutMode::CreateOnly)
            .await
            .expect("put");
    }

    const FENCER: Fencer<'static> = Fencer {
        epoch: 2,
        owner: "next",
    };

    #[test]
    fn a_chain_found_from_a_known_archived_object_is_the_same_chain() {
        let (_dir, store) = local();
        run(async {
            for seq in 0..40 {
                put(&store, seq, seq * 2 + 1, seq * 2 + 2).await;
            }
            // Archived through LSN 60 (object 29); object 25 is the newest known dropped.
            let mut everything = Vec::new();
            let listed = follow_and_fence(&store, 0, 1, 60, None, &FENCER, |o| {
                everything.push(o.first_lsn.get());
                Ok(())
            })
            .await
            .expect("follow");
            let mut from_known = Vec::new();
            let again = follow_and_fence(&store, 0, 1, 60, Some(25), &FENCER, |o| {
                from_known.push(o.first_lsn.get());
                Ok(())
            })
            .await
            .expect("follow");
            assert_eq!(everything, (30..40).map(|s| s * 2 + 1).collect::<Vec<_>>());
            assert_eq!(from_known, everything);
            assert_eq!((again.fence, again.objects.len()), (listed.fence, 10));
        });
    }

    #[test]
    fn a_chain_is_followed_to_its_first_missing_object_and_fenced_there() {
        let (_dir, store) = local();
        run(async {
            put(&store, 0, 1, 3).await;
            put(&store, 1, 4, 9).await;
            put(&store, 2, 10, 10).await;
            let mut applied = Vec::new();
            let chain = follow_and_fence(&store, 0, 1, 3, None, &FENCER, |o| {
                applied.push(o.first_lsn.get());
                Ok(())
            })
            .await
            .expect("follow");
            assert_eq!(applied, vec![4, 10], "only what comes after LSN 3");
            assert_eq!(chain.objects.len(), 2);
            assert_eq!(chain.objects[1].last_lsn, 10);
            assert_eq!(chain.fence, Keys::new(0, 1).wal(3));
            // The old owner's next PUT finds the fence.
            let late = store
                .put(&chain.fence, Bytes::from_static(b"x"), PutMode::CreateOnly)
                .await;
            assert!(matches!(late, Err(StoreError::PreconditionFailed)));
            // A second takeover stops at the same fence and writes none.
            let again = follow_and_fence(&store, 0, 1, 10, None, &FENCER, |_| Ok(()))
                .await
                .expect("follow");
            assert!(again.objects.is_empty());
            assert_eq!(again.fence, chain.fence);
        });
    }

    #[test]
    fn archived_objects_already_deleted_are_skipped_by_a_search() {
        let (_dir, store) = local();
        run(async {
            for (seq, first, last) in [(0, 1, 2), (1, 3, 4), (2, 5, 6), (3, 7, 8), (4, 9, 9)] {
                put(&store, seq, first, last).await;
            }
            for seq in [0, 1] {
                store
                    .delete(&Keys::new(0, 1).wal(seq))
                    .await
                    .expect("delete");
            }
            let mut applied = Vec::new();
            // The archive ends at LSN 7, inside object 3.
            follow_and_fence(&store, 0, 1, 7, None, &FENCER, |o| {
                applied.push(o.first_lsn.get());
                Ok(())
            })
            .await
            .expect("follow");
            assert_eq!(applied, vec![7, 9]);
        });
    }

    #[test]
    fn objects_past_a_gap_are_not_applied_but_the_fence_goes_after_them() {
        let (_dir, store) = local();
        run(async {
            // This epoch's WAL starts at LSN 20 while the archive ends at 15: its owner
            // acknowledged none of it (the archive gate), so none of it is the log.
            put(&store, 0, 20, 25).await;
            let mut applied = 0;
            let chain = follow_and_fence(&store, 0, 1, 15, None, &FENCER, |_| {
                applied += 1;
                Ok(())
            })
            .await
            .expect("follow");
            assert_eq!(applied, 0);
            assert_eq!(chain.fence, Keys::new(0, 1).wal(1));
        });
    }

    #[test]
    fn applying_creates_a_segment_from_the_piece_that_starts_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = WalObject {
            shard: 3,
            first_lsn: Lsn::new(5),
            last_lsn: Lsn::new(5),
            end: (SegmentNo::new(2), segment::DATA_START + 4),
            pieces: vec![WalPiece {
                segment: SegmentNo::new(2),
                start: segment::DATA_START,
                file_len: 1 << 20,
                segment_first_lsn: Some(Lsn::new(5)),
                bytes: Bytes::from_static(b"abcd"),
            }],
        };
        apply(dir.path(), 3, &o).expect("apply");
        let path = segment::segment_path(dir.path(), SegmentNo::new(2));
        let bytes = std::fs::read(&path).expect("segment");
        assert_eq!(bytes.len(), 1 << 20);
        let header = SegmentHeader::decode(&bytes).expect("header");
        assert_eq!((header.shard, header.first_lsn), (3, Lsn::new(5)));
        let at = segment::DATA_START as usize;
        assert_eq!(&bytes[at..at + 4], b"abcd");
        let mut continues = o.clone();
        continues.pieces[0].segment = SegmentNo::new(9);
        continues.pieces[0].segment_first_lsn = None;
        assert!(matches!(
            apply(dir.path(), 3, &continues),
            Err(Error::WalGap { segment: 9, .. })
        ));
    }
}

//! Deleting what no manifest needs: garbage (objects a manifest dropped) once its grace
//! period is over, and orphans (uploads no manifest ever named, from a failed commit or a
//! dead or fenced owner) found by listing the shard's epoch directories.

use std::collections::BTreeSet;
use std::time::Duration;

use super::worker::Worker;
use crate::manifest::{self, Manifest};
use crate::status::{Outcome, Request};

/// How often a shard's orphans are looked for. An orphan may only go once it is a grace
/// period old, so sweeping more often finds nothing new to delete; once per grace period
/// deletes every orphan within two grace periods of its upload for one LIST request (per
/// 1000 objects) per shard per period. The floor keeps a tiny grace from listing the
/// prefix every round.
pub(super) fn sweep_every(grace: Duration) -> Duration {
    grace.max(Duration::from_secs(1))
}

impl Worker {
    /// Delete this shard's orphans (see the module comment); a failure is logged and the
    /// next sweep tries again. Never touches the manifest, the layout or another shard.
    pub(super) async fn sweep_orphans(&self) {
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
        let wal_covered = self.slot.wal.lock().ok().and_then(|w| w.covered_through());
        let doomed = orphans(
            self.shard,
            &[&self.manifest, &stored],
            (self.manifest.epoch, wal_covered),
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
    pub(super) async fn collect_garbage(&self, m: &mut Manifest, now: i64) {
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
}

/// The keys in `listed` that are shard `shard`'s orphans: under one of its epoch
/// directories (`shard-<c>/e<epoch>/`, the only objects the archiver writes), named by none
/// of `manifests` nor on their garbage lists nor a fence they keep, and last modified at
/// least `grace_ms` before `now_ms`. An object whose age the store does not report is kept.
///
/// The WAL objects of the current epoch (`current`: the epoch, and the sequence number
/// through which the archive covers them) are named by no manifest, one per PUT: they go
/// once the archive covers them, and never before.
fn orphans(
    shard: u32,
    manifests: &[&Manifest],
    (epoch, wal_covered): (u64, Option<u64>),
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
                .chain(m.wal.iter().map(|w| &w.object))
                .map(|o| o.key.as_str())
                .chain(m.garbage.iter().map(|g| g.key.as_str()))
                .chain(m.fences.iter().map(String::as_str))
        })
        .collect();
    let current_wal_kept = |key: &str| match manifest::parse_wal_key(shard, key) {
        Some((e, seq)) if e == epoch => wal_covered.is_none_or(|c| seq > c),
        _ => false,
    };
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
        .filter(|o| !current_wal_kept(&o.key))
        .filter(|o| o.modified_ms.is_some_and(|t| now_ms - t >= grace_ms))
        .map(|o| o.key.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Object, Piece};

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
        let got = orphans(1, &[&m, &stored], (3, None), &all, now, grace);
        assert_eq!(
            got,
            vec![
                "shard-1/e3/0000000003.seg.000000004096-000000009000".to_string(),
                "shard-1/e1/checkpoint.00000000000000000007.0000abcd".to_string(),
            ]
        );
        // Without the stored manifest the index file would have gone.
        assert!(orphans(1, &[&m], (3, None), &all, now, grace)
            .contains(&"shard-1/e3/0000000002.idx".into()));
    }

    #[test]
    fn wal_objects_go_once_archived_and_fences_stay() {
        let mut m = Manifest::new(1, 3, "a", 1000, 0);
        let keys = manifest::Keys::new(1, 2);
        m.add_fence(keys.wal(7));
        m.wal.push(manifest::WalRef {
            first_lsn: 50,
            last_lsn: 60,
            end_segment: 1,
            end_position: 9000,
            object: object(&keys.wal(6)),
        });
        let (now, grace) = (100_000, 10_000);
        let old = Some(now - grace);
        let ours = manifest::Keys::new(1, 3);
        let all = [
            listed(&keys.wal(5), old),
            listed(&keys.wal(6), old),
            listed(&keys.wal(7), old),
            listed(&keys.wal(8), old),
            listed(&ours.wal(0), old),
            listed(&ours.wal(1), old),
            listed(&ours.wal(2), old),
        ];
        let got = orphans(1, &[&m], (3, Some(1)), &all, now, grace);
        assert_eq!(
            got,
            vec![keys.wal(5), keys.wal(8), ours.wal(0), ours.wal(1)],
            "the inherited object and the fence stay, and this epoch's uncovered object"
        );
        assert_eq!(
            orphans(1, &[&m], (3, None), &all, now, grace),
            vec![keys.wal(5), keys.wal(8)]
        );
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

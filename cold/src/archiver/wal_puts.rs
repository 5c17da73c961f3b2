//! The archive's side of the S3 write-ahead log (`--durability s3`): numbering each
//! shard's WAL objects, PUTting them create-only, retried until they land or a fence is
//! found, and knowing which ones the archive covers, so that they can be deleted.
//!
//! The PUTs run on a thread of their own with their own S3 client ([`WalThread`]), not on
//! the archiver's: an archive round reads whole segment files and signs uploads of up to a
//! segment's size on its thread, and an acknowledgement must not wait behind that (it
//! held WAL PUTs for up to 0.8 s at 36 MB/s of 64 KiB appends when they shared it).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ursula_s3::{DynStore, PutMode, StoreError};
use ursula_storage::cold::{WalPut, WalRefused};
use ursula_storage::wal::{self, WalEntry, WalObject};

use super::Archive;
use crate::manifest::Keys;
use crate::status::{Outcome, Request, Status};

/// Longest one PUT attempt may take before it is retried: aws-sdk-s3 sets no operation
/// timeout, and a hung request must not hold a shard's acknowledgements for ever.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// This epoch's WAL objects of one shard.
#[derive(Debug, Default)]
pub(super) struct WalPuts {
    next_seq: u64,
    /// Objects handed out and not known to be covered by the archive: (sequence number,
    /// last LSN), in order.
    uncovered: VecDeque<(u64, u64)>,
    /// Every object up to this sequence number holds only archived changes.
    covered_through: Option<u64>,
}

impl WalPuts {
    /// Number the next object, whose last change is `last_lsn`.
    fn next(&mut self, last_lsn: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.uncovered.push_back((seq, last_lsn));
        seq
    }

    /// The archive now holds every change through `lsn`.
    pub(super) fn archived_through(&mut self, lsn: u64) {
        while let Some(&(seq, last)) = self.uncovered.front() {
            if last > lsn {
                break;
            }
            self.covered_through = Some(seq);
            self.uncovered.pop_front();
        }
    }

    /// The highest sequence number whose object the archive covers, with all before it.
    pub(super) fn covered_through(&self) -> Option<u64> {
        self.covered_through
    }
}

/// The thread the WAL PUTs run on: a tokio current-thread runtime kept alive for the
/// process, and its S3 client.
pub(super) struct WalThread {
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) store: DynStore,
}

impl WalThread {
    pub(super) fn start(s3: &ursula_s3::S3Settings) -> crate::Result<WalThread> {
        let (tx, rx) = std::sync::mpsc::channel();
        let s3 = s3.clone();
        std::thread::Builder::new()
            .name("ursula-s3-wal".into())
            .spawn(move || {
                let runtime = match super::current_thread_runtime("S3 WAL runtime") {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let store: DynStore =
                        std::sync::Arc::new(ursula_s3::S3Store::connect(&s3).await);
                    let handle = tokio::runtime::Handle::current();
                    let _ = tx.send(Ok(WalThread {
                        runtime: handle,
                        store,
                    }));
                    // Serve the PUTs spawned onto this runtime for the life of the process.
                    std::future::pending::<()>().await;
                });
            })
            .map_err(|source| crate::Error::Start {
                what: "spawn S3 WAL thread",
                source,
            })?;
        rx.recv().map_err(|_| crate::Error::ThreadExited)?
    }
}

impl Archive {
    /// See [`ursula_storage::cold::ColdStore::put_wal`].
    pub(super) fn put_wal_object(&self, shard: u32, object: WalObject) -> WalPut {
        let Some(slot) = self.slot(shard) else {
            return refused(WalRefused::Unsupported("no such shard"));
        };
        let epoch = match slot.committed.lock() {
            Ok(m) => m.epoch,
            Err(_) => return refused(WalRefused::Unsupported("archive state poisoned")),
        };
        let seq = match slot.wal.lock() {
            Ok(mut w) => w.next(object.last_lsn.get()),
            Err(_) => return refused(WalRefused::Unsupported("archive state poisoned")),
        };
        let key = Keys::new(shard, epoch).wal(seq);
        let (tx, rx) = futures_channel::oneshot::channel();
        let store = self.wal.store.clone();
        let status = self.status.clone();
        // When lanes move between servers, a fence costs this one lane only: it is
        // reported lost, and the rest of the archive carries on.
        let on_fence = if self.settings.lanes_move {
            OnFence::LoseShard(shard, self.lost.clone(), slot.clone())
        } else {
            OnFence::StopArchive
        };
        self.wal.runtime.spawn(async move {
            let bytes = object.encode();
            let _ = tx.send(put_until_done(&store, &status, &on_fence, &key, bytes).await);
        });
        Box::pin(async move {
            rx.await
                .unwrap_or(Err(WalRefused::Unsupported("the archiver thread stopped")))
        })
    }
}

/// What a WAL PUT that finds its key fenced does besides refusing.
enum OnFence {
    /// Stop the whole archive: another server took this one's data over.
    StopArchive,
    /// Report this shard lost (see `Archive::take_lost`) and stop its worker.
    LoseShard(u32, Arc<Mutex<Vec<u32>>>, Arc<super::Slot>),
}

fn refused(why: WalRefused) -> WalPut {
    Box::pin(std::future::ready(Err(why)))
}

/// PUT `bytes` at `key` create-only, retrying transient failures with capped backoff for
/// as long as it takes; the engine bounds how long a write waits for it.
async fn put_until_done(
    store: &DynStore,
    status: &Status,
    on_fence: &OnFence,
    key: &str,
    bytes: Bytes,
) -> Result<(), WalRefused> {
    let mut backoff = Duration::from_millis(50);
    let mut failing = false;
    loop {
        if let Some(why) = status.fenced() {
            return Err(WalRefused::Fenced(why));
        }
        let attempt = tokio::time::timeout(
            ATTEMPT_TIMEOUT,
            store.put(key, bytes.clone(), PutMode::CreateOnly),
        )
        .await;
        let error = match attempt {
            Ok(Ok(_)) => {
                status.count(Request::Put, Outcome::Ok);
                status.wal_objects.fetch_add(1, Ordering::Relaxed);
                status
                    .wal_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if failing {
                    tracing::info!(key, "S3 WAL PUT succeeded again");
                }
                return Ok(());
            }
            Ok(Err(StoreError::PreconditionFailed)) => {
                status.count(Request::Put, Outcome::Precondition);
                match taken_by(store, status, key, &bytes).await {
                    Ok(None) => return Ok(()),
                    Ok(Some(why)) => {
                        match on_fence {
                            OnFence::StopArchive => status.fence(why.clone()),
                            OnFence::LoseShard(shard, lost, slot) => {
                                if let Ok(mut l) = lost.lock() {
                                    l.push(*shard);
                                }
                                // A stop or release under way goes on: its commit finds
                                // the fence.
                                slot.finish.send_if_modified(|f| {
                                    let run = *f == super::Finish::Run;
                                    if run {
                                        *f = super::Finish::Lost;
                                    }
                                    run
                                });
                            }
                        }
                        return Err(WalRefused::Fenced(why));
                    }
                    Err(e) => e,
                }
            }
            Ok(Err(e)) => {
                status.count(Request::Put, Outcome::Error);
                e.to_string()
            }
            Err(_) => {
                status.count(Request::Put, Outcome::Error);
                format!("no answer in {ATTEMPT_TIMEOUT:?}")
            }
        };
        if !failing {
            tracing::warn!(key, "S3 WAL PUT failed, retrying: {error}");
            failing = true;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// What holds `key` now that a create-only PUT of `bytes` found it taken: `None` when it is
/// these bytes (an earlier attempt landed), otherwise why this owner is fenced.
async fn taken_by(
    store: &DynStore,
    status: &Status,
    key: &str,
    bytes: &Bytes,
) -> Result<Option<String>, String> {
    let there = store.get(key).await.map_err(|e| e.to_string())?;
    status.count(Request::Get, Outcome::Ok);
    let Some(there) = there else {
        return Err(format!("{key} was taken and is gone again"));
    };
    if there.bytes == *bytes {
        return Ok(None);
    }
    Ok(Some(match wal::decode(&there.bytes) {
        Ok(WalEntry::Fence { epoch, owner }) => {
            format!("server {owner} took the shard over (epoch {epoch}) and fenced {key}")
        }
        _ => format!("{key} holds another writer's WAL object under this epoch"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_numbered_and_covered_in_order() {
        let mut w = WalPuts::default();
        assert_eq!(w.next(10), 0);
        assert_eq!(w.next(20), 1);
        assert_eq!(w.next(30), 2);
        w.archived_through(9);
        assert_eq!(w.covered_through(), None);
        w.archived_through(25);
        assert_eq!(w.covered_through(), Some(1));
        w.archived_through(30);
        assert_eq!(w.covered_through(), Some(2));
        assert_eq!(w.next(40), 3);
    }
}

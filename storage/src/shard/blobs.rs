//! Snapshot blobs: one file each under `snapshots/` (or in memory), written before the
//! Snapshot record that makes them visible, removed once the record that dropped them is
//! durable.
//!
//! [`Blobs`] owns the names handed out, the dropped blobs waiting for their record to be
//! durable, and a memory shard's blobs; the `Shard` methods below do the file I/O.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{Corruption, Durability, Shard, StorageError};
use crate::position::Lsn;
use crate::record::SnapshotMeta;
use crate::segment;

#[derive(Default)]
pub(super) struct Blobs {
    /// Blobs named so far (the last name's number; a checkpoint saves it, so a name is
    /// never reused even for a blob that was deleted).
    counter: u64,
    /// Dropped blobs to delete once the record that dropped them is durable: (lsn, name).
    dead: Vec<(Lsn, Box<str>)>,
    /// Every blob of a memory shard.
    memory: HashMap<Box<str>, Bytes>,
}

impl Blobs {
    /// A name no blob of this shard has had.
    fn new_name(&mut self, now_ms: i64) -> Box<str> {
        self.counter += 1;
        format!("{:x}-{:x}.blob", now_ms, self.counter).into()
    }

    pub(super) fn counter(&self) -> u64 {
        self.counter
    }

    /// Recovery: the checkpoint's counter (names after it are new).
    pub(super) fn counted(&mut self, counter: u64) {
        self.counter = self.counter.max(counter);
    }

    /// Take the dropped blobs whose dropping record is at or below `durable`.
    fn take_dead(&mut self, durable: Lsn) -> Vec<Box<str>> {
        let mut due = Vec::new();
        self.dead.retain_mut(|(lsn, name)| {
            if *lsn > durable {
                return true;
            }
            due.push(std::mem::take(name));
            false
        });
        due
    }
}

impl Shard {
    /// Store a snapshot blob durably in its own file (memory mode: in memory) and return
    /// its name. It becomes a stream's snapshot only through [`Shard::set_snapshot`]; a blob
    /// never referenced is removed at the next start.
    pub async fn write_blob(&self, body: Bytes) -> Result<Box<str>, StorageError> {
        let name = self.inner.blobs.borrow_mut().new_name(crate::now_ms());
        let Some(dir) = self.blob_dir() else {
            self.inner
                .blobs
                .borrow_mut()
                .memory
                .insert(name.clone(), body);
            return Ok(name);
        };
        segment::create_dir_durable(&dir)?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(&*name))?;
        let file = monoio::fs::File::from_std(file)?;
        if !body.is_empty() {
            let (res, _) = file.write_all_at(body, 0).await;
            res?;
        }
        file.sync_all().await?;
        segment::sync_dir_on_ring(&dir).await?;
        Ok(name)
    }

    /// Read a snapshot blob back.
    pub async fn read_blob(&self, meta: &SnapshotMeta) -> Result<Bytes, StorageError> {
        let Some(dir) = self.blob_dir() else {
            return self
                .inner
                .blobs
                .borrow()
                .memory
                .get(&meta.blob)
                .cloned()
                .ok_or_else(|| Corruption::SnapshotBlobMissing(meta.blob.clone()).into());
        };
        let file = monoio::fs::File::open(dir.join(&*meta.blob)).await?;
        let buf = Vec::with_capacity(meta.len as usize);
        let (res, buf) = file.read_exact_at(buf, 0).await;
        res?;
        Ok(Bytes::from(buf))
    }

    /// Forget a blob written by [`Shard::write_blob`] that will not be used.
    pub fn discard_blob(&self, name: Box<str>) {
        let lsn = self.durable_lsn();
        self.drop_blob(lsn, name);
    }

    pub(super) fn blob_dir(&self) -> Option<PathBuf> {
        match &self.inner.cfg.durability {
            Durability::Disk(root) => Some(
                root.join(format!("shard-{}", self.inner.cfg.shard))
                    .join("snapshots"),
            ),
            Durability::Memory => None,
        }
    }

    /// Delete a blob once everything up to `lsn` is durable (memory mode: now).
    pub(super) fn drop_blob(&self, lsn: Lsn, name: Box<str>) {
        let mut blobs = self.inner.blobs.borrow_mut();
        if self.memory() {
            blobs.memory.remove(&name);
        } else {
            blobs.dead.push((lsn, name));
        }
    }

    /// Remove dropped blobs whose dropping record is durable.
    pub(super) fn collect_dead_blobs(&self) {
        let durable = self.durable_lsn();
        let Some(dir) = self.blob_dir() else { return };
        let due = self.inner.blobs.borrow_mut().take_dead(durable);
        for name in due {
            if let Err(e) = std::fs::remove_file(dir.join(&*name)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("could not remove snapshot blob {name}: {e}");
                }
            }
        }
    }

    /// Blob files no stream refers to (written for a publish that never committed, or
    /// dropped before a crash) are deleted at start.
    pub(super) fn remove_unreferenced_blobs(&self, dir: &Path) {
        let blobs = dir.join("snapshots");
        let Ok(entries) = std::fs::read_dir(&blobs) else {
            return;
        };
        // A stream with a snapshot never sleeps (see `dormancy`): the resident ones name
        // every blob in use.
        let referenced: HashSet<Box<str>> = self
            .inner
            .catalog
            .borrow()
            .resident()
            .filter_map(|s| s.snapshot.as_ref().map(|m| m.blob.clone()))
            .collect();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !referenced.contains(name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_never_reused_after_a_restart() {
        let mut blobs = Blobs::default();
        let first = blobs.new_name(5);
        let mut restarted = Blobs::default();
        restarted.counted(blobs.counter());
        assert_ne!(restarted.new_name(5), first);
    }

    #[test]
    fn a_dropped_blob_is_due_once_its_record_is_durable() {
        let mut blobs = Blobs::default();
        blobs.dead.push((Lsn::new(3), "a".into()));
        blobs.dead.push((Lsn::new(5), "b".into()));
        assert!(blobs.take_dead(Lsn::new(2)).is_empty());
        assert_eq!(blobs.take_dead(Lsn::new(4)), vec![Box::<str>::from("a")]);
        assert_eq!(blobs.take_dead(Lsn::new(9)), vec![Box::<str>::from("b")]);
        assert!(blobs.dead.is_empty());
    }
}

//! Snapshot blobs: one file each under `snapshots/` (or in memory), written before the
//! Snapshot record that makes them visible, removed once the record that dropped them is
//! durable.

use super::*;

impl Shard {
    /// Store a snapshot blob durably in its own file (memory mode: in memory) and return
    /// its name. It becomes a stream's snapshot only through [`Shard::set_snapshot`]; a blob
    /// never referenced is removed at the next start.
    pub async fn write_blob(&self, body: Bytes) -> Result<Box<str>, StorageError> {
        let n = self.inner.blob_counter.get() + 1;
        self.inner.blob_counter.set(n);
        let name: Box<str> = format!("{:x}-{n:x}.blob", crate::now_ms()).into();
        let Some(dir) = self.blob_dir() else {
            self.inner
                .memory_blobs
                .borrow_mut()
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
                .memory_blobs
                .borrow()
                .get(&meta.blob)
                .cloned()
                .ok_or_else(|| {
                    StorageError::Corrupt(format!("snapshot blob {} missing", meta.blob))
                });
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
        if self.memory() {
            self.inner.memory_blobs.borrow_mut().remove(&name);
        } else {
            self.inner.dead_blobs.borrow_mut().push((lsn, name));
        }
    }

    /// Remove dropped blobs whose dropping record is durable.
    pub(super) fn collect_dead_blobs(&self) {
        let durable = self.durable_lsn();
        let Some(dir) = self.blob_dir() else { return };
        self.inner.dead_blobs.borrow_mut().retain(|(lsn, name)| {
            if *lsn > durable {
                return true;
            }
            if let Err(e) = std::fs::remove_file(dir.join(&**name)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("could not remove snapshot blob {name}: {e}");
                }
            }
            false
        });
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

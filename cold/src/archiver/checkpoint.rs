//! The checkpoint in the archive: a newer local checkpoint is uploaded, after the index
//! files it names, once the archived log covers the position it continues from.

use std::collections::BTreeSet;
use std::io;

use bytes::Bytes;

use super::worker::{RoundError, Worker};
use crate::error::Error;
use crate::manifest::{self, Manifest};

impl Worker {
    /// Put a newer local checkpoint into the manifest once the archived log covers it,
    /// after the index files it names.
    pub(super) async fn archive_checkpoint(
        &mut self,
        m: &mut Manifest,
        now: i64,
    ) -> Result<(), RoundError> {
        let path = self.dir.join(ursula_storage::CHECKPOINT_FILE);
        let seen = match std::fs::metadata(&path) {
            Ok(meta) => (meta.modified().map_err(Error::io(&path))?, meta.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path)(e).into()),
        };
        if self.checkpoint_seen == Some(seen) {
            return Ok(());
        }
        let bytes = Bytes::from(std::fs::read(&path).map_err(Error::io(&path))?);
        let summary = ursula_storage::checkpoint_summary(self.shard, &bytes).map_err(|reason| {
            Error::CorruptCheckpoint {
                path: path.clone(),
                reason,
            }
        })?;
        let crc = crc32c::crc32c(&bytes);
        if m.checkpoint
            .as_ref()
            .is_some_and(|c| c.object.crc == crc && c.lsn == summary.lsn.get())
        {
            self.checkpoint_seen = Some(seen);
            return Ok(());
        }
        if (summary.segment.get(), summary.position) > (m.archived.segment, m.archived.position) {
            // The log it continues is not archived yet; look again next round.
            return Ok(());
        }
        let mut index_files = Vec::new();
        for number in summary.index_files.iter().map(|n| n.get()) {
            if let Some(f) = m.index_files.iter().find(|f| f.number == number) {
                index_files.push(f.clone());
                continue;
            }
            let idx = self.dir.join(format!("{number:010}.idx"));
            let content = match std::fs::read(&idx) {
                Ok(c) => c,
                // Replaced by a newer checkpoint meanwhile: take that one next round.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::io(idx)(e).into()),
            };
            let object = self
                .upload(&self.keys.index(number), Bytes::from(content))
                .await?;
            index_files.push(manifest::IndexFile { number, object });
        }
        let object = self
            .upload(&self.keys.checkpoint(summary.lsn.get(), crc), bytes)
            .await?;
        let next = manifest::Checkpoint {
            lsn: summary.lsn.get(),
            segment: summary.segment.get(),
            position: summary.position,
            segments: summary.segments.iter().map(|s| s.get()).collect(),
            object,
        };
        if let Some(old) = m.checkpoint.replace(next) {
            m.drop_object(old.object.key, now);
        }
        let named: BTreeSet<u64> = index_files.iter().map(|f| f.number).collect();
        for f in std::mem::replace(&mut m.index_files, index_files) {
            if !named.contains(&f.number) {
                m.drop_object(f.object.key, now);
            }
        }
        self.checkpoint_seen = Some(seen);
        Ok(())
    }
}

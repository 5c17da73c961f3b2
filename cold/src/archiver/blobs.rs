//! Snapshot blobs in the archive: uploaded when new or grown, dropped when deleted
//! locally.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use bytes::Bytes;

use super::worker::{RoundError, Worker};
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest};

impl Worker {
    /// Upload snapshot blobs not archived yet (or grown since: a blob is written in
    /// place, so a listing can catch one half written), and drop the ones deleted locally.
    pub(super) async fn archive_blobs(
        &mut self,
        m: &mut Manifest,
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
        now: i64,
    ) -> Result<(), RoundError> {
        let dir = self.dir.join("snapshots");
        for (name, &len) in after {
            if m.blobs
                .iter()
                .any(|b| &b.name == name && b.object.len == len)
            {
                continue;
            }
            let content = match std::fs::read(dir.join(name)) {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(dir.join(name))(e).into()),
            };
            let len = content.len() as u64;
            let object = self
                .upload(&self.keys.blob(name, len), Bytes::from(content))
                .await?;
            let blob = manifest::Blob {
                name: name.clone(),
                object,
            };
            match m.blobs.iter_mut().find(|b| &b.name == name) {
                Some(b) => {
                    let old = std::mem::replace(b, blob);
                    m.garbage.push(manifest::Garbage {
                        key: old.object.key,
                        since_ms: now,
                    });
                }
                None => m.blobs.push(blob),
            }
        }
        let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut m.blobs)
            .into_iter()
            .partition(|b| before.contains_key(&b.name) || after.contains_key(&b.name));
        m.blobs = keep;
        for b in gone {
            m.drop_object(b.object.key, now);
        }
        Ok(())
    }
}

/// Snapshot blob files of a shard directory and their lengths.
pub(super) fn list_blobs(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let dir = dir.join("snapshots");
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(&dir))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !name.ends_with(".blob") {
            continue;
        }
        match entry.metadata() {
            Ok(meta) => {
                out.insert(name, meta.len());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(dir.join(name))(e)),
        }
    }
    Ok(out)
}

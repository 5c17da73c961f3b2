//! Bounded, disposable caches of immutable parts.
//!
//! * memory: opened parts (bytes + decoded footer), decoded page slices and the `t_ms`
//!   columns of page slices, each held to a share of `--cache-bytes`, least recently used
//!   first out;
//! * disk (`--cache-dir`, S3 store only): downloaded part files, so a restart does not
//!   re-download; a worker with an empty cache rebuilds everything from the store.
//!
//! Parts are content-addressed, so no entry ever needs invalidating.

use std::collections::HashMap;
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::part::{Group, PartFile};
use crate::store::DynStore;

/// One slice of a part: (part key, row group, slice within the group).
type PageKey = (String, usize, usize);

pub struct PartCache {
    store: DynStore,
    disk: Option<DiskCache>,
    files: Mutex<Lru<String, Arc<PartFile>>>,
    groups: Mutex<Lru<PageKey, Arc<Group>>>,
    times: Mutex<Lru<PageKey, Arc<Vec<i64>>>>,
}

impl PartCache {
    pub fn new(store: DynStore, disk_dir: Option<PathBuf>, budget: u64) -> PartCache {
        let mem = (budget / 4).max(8 << 20) as usize;
        PartCache {
            store,
            disk: disk_dir.map(|d| DiskCache::new(d, budget)),
            files: Mutex::new(Lru::new(mem)),
            groups: Mutex::new(Lru::new(mem)),
            times: Mutex::new(Lru::new(mem / 4)),
        }
    }

    pub async fn file(&self, key: &str) -> Result<Arc<PartFile>> {
        if let Some(f) = lock(&self.files).get(&key.to_string()) {
            return Ok(f);
        }
        let bytes = match self.disk.as_ref().and_then(|d| d.get(key)) {
            Some(b) => b,
            None => {
                let got = match crate::batch::pack_member(key) {
                    Some((pack, off, len)) => self
                        .store
                        .get_range(&pack, off, len)
                        .await
                        .map_err(Error::request(pack))?,
                    None => self
                        .store
                        .get(key)
                        .await
                        .map_err(Error::request(key))?
                        .map(|o| o.bytes),
                };
                let Some(bytes) = got else {
                    return Err(Error::MissingPart {
                        key: key.to_string(),
                    });
                };
                if let Some(d) = &self.disk {
                    d.put(key, &bytes);
                }
                bytes
            }
        };
        let size = bytes.len();
        let file = Arc::new(PartFile::open(bytes)?);
        lock(&self.files).insert(key.to_string(), file.clone(), size);
        Ok(file)
    }

    /// Page slice `s` of row group `i` of part `key`, decoded.
    pub async fn slice(&self, key: &str, i: usize, s: usize) -> Result<Arc<Group>> {
        let k = (key.to_string(), i, s);
        if let Some(g) = lock(&self.groups).get(&k) {
            return Ok(g);
        }
        let file = self.file(key).await?;
        let g = Arc::new(file.decode_slice(i, s)?);
        let size = g.approx_bytes();
        lock(&self.groups).insert(k, g.clone(), size);
        Ok(g)
    }

    /// The `t_ms` column alone of page slice `s` of row group `i` of part `key`.
    pub async fn times(&self, key: &str, i: usize, s: usize) -> Result<Arc<Vec<i64>>> {
        let k = (key.to_string(), i, s);
        if let Some(t) = lock(&self.times).get(&k) {
            return Ok(t);
        }
        let file = self.file(key).await?;
        let t = Arc::new(file.slice_times(i, s)?);
        let size = t.len() * 8 + 64;
        lock(&self.times).insert(k, t.clone(), size);
        Ok(t)
    }

    /// Remember a part this process just wrote, so the first query does not re-read it.
    pub fn prime(&self, key: &str, bytes: Bytes) {
        let size = bytes.len();
        if let Ok(f) = PartFile::open(bytes) {
            lock(&self.files).insert(key.to_string(), Arc::new(f), size);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A small size-bounded LRU (linear eviction scan: the maps hold hundreds of entries).
struct Lru<K, V> {
    map: HashMap<K, (V, usize, u64)>,
    tick: u64,
    used: usize,
    budget: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    fn new(budget: usize) -> Self {
        Lru {
            map: HashMap::new(),
            tick: 0,
            used: 0,
            budget,
        }
    }

    fn get(&mut self, k: &K) -> Option<V> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(k).map(|e| {
            e.2 = t;
            e.0.clone()
        })
    }

    fn insert(&mut self, k: K, v: V, size: usize) {
        self.tick += 1;
        if let Some(old) = self.map.insert(k, (v, size, self.tick)) {
            self.used -= old.1;
        }
        self.used += size;
        while self.used > self.budget && self.map.len() > 1 {
            let Some(victim) = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.2)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.map.remove(&victim) {
                self.used -= e.1;
            }
        }
    }
}

struct DiskCache {
    dir: PathBuf,
    budget: u64,
    used: Mutex<u64>,
}

impl DiskCache {
    fn new(dir: PathBuf, budget: u64) -> DiskCache {
        let _ = std::fs::create_dir_all(&dir);
        let used = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        DiskCache {
            dir,
            budget,
            used: Mutex::new(used),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key.replace('/', "_"))
    }

    fn get(&self, key: &str) -> Option<Bytes> {
        let b = std::fs::read(self.path(key)).ok()?;
        // Content-addressed: the file name is the hash of its bytes; a torn file is
        // detected here and refetched.
        // (A part inside a pack ends its name with its own hash too.)
        let want = key
            .rsplit('/')
            .next()?
            .strip_suffix(".parquet")?
            .rsplit('-')
            .next()?;
        if blake3::hash(&b).to_hex().starts_with(want) {
            Some(Bytes::from(b))
        } else {
            let _ = std::fs::remove_file(self.path(key));
            None
        }
    }

    fn put(&self, key: &str, bytes: &[u8]) {
        let mut used = lock(&self.used);
        if *used + bytes.len() as u64 > self.budget {
            // Evict oldest files until the new one fits.
            let mut files: Vec<_> = std::fs::read_dir(&self.dir)
                .map(|rd| {
                    rd.flatten()
                        .filter_map(|e| {
                            let m = e.metadata().ok()?;
                            Some((m.modified().ok()?, e.path(), m.len()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            for (_, p, len) in files {
                if *used + bytes.len() as u64 <= self.budget {
                    break;
                }
                if std::fs::remove_file(&p).is_ok() {
                    *used = used.saturating_sub(len);
                }
            }
        }
        let tmp = self.dir.join(format!(".tmp-{}", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, self.path(key)).is_ok() {
            *used += bytes.len() as u64;
        }
    }
}

//! The worker: keeps one [`Index`] per registration in `CATALOG`, runs their ingest tasks,
//! and carries out the admin operations (register, unregister) as CATALOG compare-and-swaps.
//! Any number of workers may share one store prefix; each index is ingested by whichever
//! worker holds its claim, and every worker answers queries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::extract::{ExtractSpec, Extractor};
use crate::index::{Index, Shared};
use crate::manifest::{self, Catalog, Registration, RetiredNamespace, Start};
use crate::source::{self, HeadResult};
use crate::time::now_ms;

pub struct Coordinator {
    pub shared: Arc<Shared>,
    indexes: RwLock<HashMap<String, Arc<Index>>>,
    catalog_etag: tokio::sync::Mutex<Option<String>>,
    /// Last CATALOG read succeeded (readiness).
    pub ready: AtomicBool,
    /// A catalog read and the opening of its indexes (their manifests) has completed at
    /// least once: systemd readiness.
    pub loaded: AtomicBool,
    restarted: Arc<tokio::sync::Notify>,
}

/// The body of `PUT /v1/indexes/{id}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    pub stream_url: String,
    #[serde(default)]
    pub extract: Option<ExtractSpec>,
    #[serde(default)]
    pub timestamp_field: Option<String>,
    #[serde(default)]
    pub start: Option<Start>,
}

pub enum RegisterError {
    Bad(String),
    Source(String),
    Conflict(String),
    Internal(String),
}

pub fn valid_id(id: &str) -> bool {
    (1..=122).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Coordinator {
    pub fn new(shared: Arc<Shared>) -> Arc<Coordinator> {
        Arc::new(Coordinator {
            shared,
            indexes: RwLock::new(HashMap::new()),
            catalog_etag: tokio::sync::Mutex::new(None),
            ready: AtomicBool::new(false),
            loaded: AtomicBool::new(false),
            restarted: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Background loop: re-read CATALOG every poll interval (or at once after a restart)
    /// and purge retired namespaces past the grace window.
    pub async fn run(self: Arc<Self>) {
        let mut next_purge = std::time::Instant::now();
        loop {
            if let Err(e) = self.sync(false).await {
                tracing::warn!("catalog: {e}");
            }
            if std::time::Instant::now() >= next_purge {
                next_purge = std::time::Instant::now() + self.shared.cfg.gc_interval;
                if let Err(e) = self.purge_retired().await {
                    tracing::warn!("purge: {e}");
                }
                let grace = self.shared.cfg.gc_grace.as_millis() as i64;
                match crate::batch::gc_packs(&self.shared.shards, now_ms(), grace).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("gc: deleted {n} unreferenced packs"),
                    Err(e) => tracing::warn!("gc packs: {e}"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.shared.cfg.poll_interval) => {}
                _ = self.restarted.notified() => {}
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Index>> {
        self.indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Bring the set of open indexes in line with CATALOG (`force`: even if unchanged).
    pub async fn sync(&self, force: bool) -> Result<(), String> {
        let mut etag = self.catalog_etag.lock().await;
        let store = &self.shared.store;
        let catalog = if force || etag.is_none() {
            manifest::load::<Catalog>(store, manifest::CATALOG_KEY).await
        } else {
            match manifest::reload::<Catalog>(
                store,
                manifest::CATALOG_KEY,
                etag.as_deref().unwrap_or(""),
            )
            .await
            {
                Ok(None) => {
                    self.ready.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                other => other,
            }
        };
        let catalog = match catalog {
            Ok(c) => c,
            Err(e) => {
                // An unreadable catalog is never treated as empty: keep what is open.
                self.ready.store(false, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.ready.store(true, Ordering::Relaxed);
        let (regs, new_etag) = match catalog {
            Some(v) => (v.value.registrations, Some(v.etag)),
            None => (Vec::new(), None),
        };
        let current: HashMap<String, Arc<Index>> = self
            .indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut next = HashMap::new();
        for reg in regs {
            match current.get(&reg.id) {
                Some(ix) if ix.reg == reg => {
                    next.insert(reg.id.clone(), ix.clone());
                }
                _ => match Index::open(self.shared.clone(), reg.clone()).await {
                    Ok(ix) => {
                        tokio::spawn(ix.clone().run(self.restarted.clone()));
                        next.insert(reg.id.clone(), ix);
                    }
                    Err(e) => {
                        tracing::warn!(index = %reg.id, "open: {e}");
                        if let Some(old) = current.get(&reg.id) {
                            next.insert(reg.id.clone(), old.clone());
                        }
                    }
                },
            }
        }
        for (id, ix) in &current {
            if next.get(id).is_none_or(|n| !Arc::ptr_eq(n, ix)) {
                ix.stop();
                self.shared.metrics.forget(id);
            }
        }
        *self.indexes.write().unwrap_or_else(|p| p.into_inner()) = next;
        *etag = new_etag;
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    pub async fn list(&self) -> Result<Vec<Registration>, String> {
        Ok(
            manifest::load::<Catalog>(&self.shared.store, manifest::CATALOG_KEY)
                .await?
                .map(|v| v.value.registrations)
                .unwrap_or_default(),
        )
    }

    pub async fn register(
        &self,
        id: &str,
        body: RegisterBody,
    ) -> Result<Registration, RegisterError> {
        let extract = match (body.extract, body.timestamp_field) {
            (Some(_), Some(_)) => {
                return Err(RegisterError::Bad(
                    "give either extract or timestamp_field, not both".into(),
                ))
            }
            (Some(e), None) => e,
            (None, Some(f)) => ExtractSpec::legacy(&f),
            (None, None) => ExtractSpec::captured_at(),
        };
        Extractor::compile(&extract).map_err(RegisterError::Bad)?;
        let stream_url = source::canonical_url(&body.stream_url).map_err(RegisterError::Bad)?;
        let start = body.start.unwrap_or_default();
        let head = match self.shared.source.head(&stream_url).await {
            Ok(HeadResult::Ok(h)) => h,
            Ok(HeadResult::NotFound) => {
                return Err(RegisterError::Source("source stream does not exist".into()))
            }
            Err(e) => return Err(RegisterError::Source(format!("source did not answer: {e}"))),
        };
        if !source::is_indexable_type(&head.content_type) {
            return Err(RegisterError::Source(format!(
                "source content type {:?} is not application/json or application/x-ndjson",
                head.content_type
            )));
        }
        let (from, from_record) = match start {
            Start::Retained => (head.retained_offset, head.record_first),
            Start::Tail => (head.next_offset, head.record_next),
        };
        let reg = Registration {
            id: id.to_string(),
            stream_url,
            extract,
            start,
            indexed_from_offset: source::offset_token(from),
            indexed_from_record: if head.record_coordinates {
                from_record
            } else {
                None
            },
            incarnation: head.incarnation.clone(),
            restarted_from_incarnation: None,
            record_coordinates: head.record_coordinates,
        };
        let candidate = reg.clone();
        let result = manifest::update::<Catalog, Result<Registration, RegisterError>>(
            &self.shared.store,
            manifest::CATALOG_KEY,
            32,
            |cur| {
                let mut next = cur.cloned().unwrap_or(Catalog {
                    version: 1,
                    ..Catalog::default()
                });
                if let Some(existing) = next.registrations.iter().find(|r| r.id == candidate.id) {
                    let same = existing.stream_url == candidate.stream_url
                        && existing.extract.digest() == candidate.extract.digest()
                        && existing.start == candidate.start;
                    return Ok((
                        None,
                        if same {
                            Ok(existing.clone())
                        } else {
                            Err(RegisterError::Conflict(format!(
                                "index {} is already registered with different settings",
                                candidate.id
                            )))
                        },
                    ));
                }
                if let Some(other) = next
                    .registrations
                    .iter()
                    .find(|r| r.stream_url == candidate.stream_url)
                {
                    return Ok((
                        None,
                        Err(RegisterError::Conflict(format!(
                            "stream is already indexed as {}",
                            other.id
                        ))),
                    ));
                }
                if next
                    .retired
                    .iter()
                    .any(|t| t.namespace == candidate.namespace())
                {
                    return Ok((
                        None,
                        Err(RegisterError::Conflict(
                            "namespace is retired; try again later".into(),
                        )),
                    ));
                }
                next.registrations.push(candidate.clone());
                Ok((Some(next), Ok(candidate.clone())))
            },
        )
        .await
        .map_err(RegisterError::Internal)?;
        let reg = result.0?;
        self.sync(true).await.map_err(RegisterError::Internal)?;
        Ok(reg)
    }

    /// Unregister: drop the registration and tombstone its namespace in one CAS.
    pub async fn unregister(&self, id: &str) -> Result<bool, String> {
        let id = id.to_string();
        let (found, _) = manifest::update::<Catalog, bool>(
            &self.shared.store,
            manifest::CATALOG_KEY,
            32,
            |cur| {
                let Some(cur) = cur else {
                    return Ok((None, false));
                };
                let Some(reg) = cur.registrations.iter().find(|r| r.id == id) else {
                    return Ok((None, false));
                };
                let mut next = cur.clone();
                next.retired.push(RetiredNamespace {
                    id: id.clone(),
                    namespace: reg.namespace(),
                    retired_at_ms: now_ms(),
                });
                next.registrations.retain(|r| r.id != id);
                Ok((Some(next), true))
            },
        )
        .await?;
        self.sync(true).await?;
        Ok(found)
    }

    /// Delete retired namespaces whose tombstone is older than the grace window.
    async fn purge_retired(&self) -> Result<(), String> {
        let Some(cat) =
            manifest::load::<Catalog>(&self.shared.store, manifest::CATALOG_KEY).await?
        else {
            return Ok(());
        };
        let grace = self.shared.cfg.gc_grace.as_millis() as i64;
        let now = now_ms();
        let due: Vec<RetiredNamespace> = cat
            .value
            .retired
            .iter()
            .filter(|t| now - t.retired_at_ms >= grace)
            .cloned()
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        for t in &due {
            // The manifest and claim live in shard slots, not under the prefix.
            for key in [
                manifest::current_key(&t.namespace),
                manifest::claim_key(&t.namespace),
            ] {
                self.shared
                    .store
                    .delete(&key)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            for l in self
                .shared
                .store
                .list(&manifest::ns_prefix(&t.namespace))
                .await
                .map_err(|e| e.to_string())?
            {
                self.shared
                    .store
                    .delete(&l.key)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        manifest::update::<Catalog, ()>(&self.shared.store, manifest::CATALOG_KEY, 32, |cur| {
            let Some(cur) = cur else {
                return Ok((None, ()));
            };
            let mut next = cur.clone();
            next.retired.retain(|t| !due.contains(t));
            Ok((Some(next), ()))
        })
        .await?;
        Ok(())
    }
}

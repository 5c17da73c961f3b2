//! What lives in the object store, and how it changes.
//!
//! ```text
//! CATALOG                                  registrations + retired namespaces (CAS)
//! indexes/<namespace>/CURRENT              the manifest itself (CAS, If-Match / If-None-Match: *)
//! indexes/<namespace>/parts/<blake3>.parquet   immutable, content-addressed parts
//! indexes/<namespace>/claims/current.json  the one ingest claim (a lease; a hint, not a lock)
//! ```
//!
//! `CURRENT` holds the whole manifest rather than a pointer to one, which saves a PUT on
//! every commit. Older generations stay safe for readers because a part replaced by
//! compaction is not deleted at once: it moves to `retired_parts` with the generation that
//! dropped it, and GC deletes it only after `--gc-retain-generations` newer generations and
//! the grace window have passed.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::extract::ExtractSpec;
use crate::store::{DynStore, Fetched, PutMode};

pub const CATALOG_KEY: &str = "CATALOG";
pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    #[default]
    Retained,
    Tail,
}

/// One registered index, as stored in `CATALOG` and returned by the admin routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub id: String,
    pub stream_url: String,
    pub extract: ExtractSpec,
    pub start: Start,
    /// 20-digit offset token.
    pub indexed_from_offset: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indexed_from_record: Option<u64>,
    pub incarnation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_from_incarnation: Option<String>,
    /// The source advertised `json-record-coordinates-v1` at registration.
    #[serde(default)]
    pub record_coordinates: bool,
}

impl Registration {
    /// `<id>-<url hash>-<incarnation>-<extractor digest>`: a recreated stream or a new
    /// extractor gets a fresh namespace, so old and new data never mix.
    pub fn namespace(&self) -> String {
        let url = &blake3::hash(self.stream_url.as_bytes()).to_hex()[..16];
        let inc = match &self.incarnation {
            None => "none".to_string(),
            Some(i)
                if (1..=40).contains(&i.len())
                    && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                i.clone()
            }
            Some(i) => blake3::hash(i.as_bytes()).to_hex()[..16].to_string(),
        };
        let digest = self.extract.digest();
        format!("{}-{url}-{inc}-{}", self.id, &digest[..16])
    }

    pub fn from_offset(&self) -> u64 {
        self.indexed_from_offset.parse().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredNamespace {
    pub id: String,
    pub namespace: String,
    pub retired_at_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub version: u32,
    pub registrations: Vec<Registration>,
    #[serde(default)]
    pub retired: Vec<RetiredNamespace>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub missing: u64,
    pub invalid: u64,
    pub unparseable: u64,
    pub oversize: u64,
}

impl Skipped {
    pub fn add(&mut self, o: &Skipped) {
        self.missing += o.missing;
        self.invalid += o.invalid;
        self.unparseable += o.unparseable;
        self.oversize += o.oversize;
    }

    pub fn count(&mut self, k: crate::extract::SkipKind) {
        use crate::extract::SkipKind::*;
        match k {
            Missing => self.missing += 1,
            Invalid => self.invalid += 1,
            Unparseable => self.unparseable += 1,
            Oversize => self.oversize += 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    #[default]
    Ready,
    Blocked {
        offset: String,
        reason: String,
    },
    SourceGone,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    pub key: String,
    pub level: u8,
    pub day_ms: i64,
    pub entries: u64,
    pub min_t_ms: i64,
    pub max_t_ms: i64,
    pub max_t_end_ms: i64,
    /// Largest `t_end_ms - t_ms` in the part: bounds how far before `from` an overlap
    /// query has to start scanning.
    pub max_span_ms: i64,
    pub min_offset: u64,
    pub max_offset: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPart {
    pub key: String,
    /// The generation whose publish dropped the part.
    pub generation: u64,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub namespace: String,
    pub stream_url: String,
    pub incarnation: Option<String>,
    pub extractor_digest: String,
    pub generation: u64,
    pub indexed_from_offset: u64,
    pub floor_offset: u64,
    pub durable_offset: u64,
    #[serde(default)]
    pub durable_record: Option<u64>,
    pub trimmed_bytes: u64,
    pub skipped: Skipped,
    pub status: Status,
    pub parts: Vec<PartMeta>,
    #[serde(default)]
    pub retired_parts: Vec<RetiredPart>,
}

impl Manifest {
    pub fn initial(reg: &Registration) -> Manifest {
        let from = reg.from_offset();
        Manifest {
            version: MANIFEST_VERSION,
            namespace: reg.namespace(),
            stream_url: reg.stream_url.clone(),
            incarnation: reg.incarnation.clone(),
            extractor_digest: reg.extract.digest(),
            generation: 0,
            indexed_from_offset: from,
            floor_offset: from,
            durable_offset: from,
            durable_record: reg.indexed_from_record,
            trimmed_bytes: 0,
            skipped: Skipped::default(),
            status: Status::Ready,
            parts: Vec::new(),
            retired_parts: Vec::new(),
        }
    }

    /// Structural checks on a loaded manifest (stored under `key`).
    pub fn validate(&self, key: &str, reg: &Registration) -> Result<()> {
        if self.version != MANIFEST_VERSION {
            return Err(Error::bad_manifest(
                key,
                format!(
                    "manifest version {} is not {MANIFEST_VERSION}",
                    self.version
                ),
            ));
        }
        if self.stream_url != reg.stream_url || self.extractor_digest != reg.extract.digest() {
            return Err(Error::bad_manifest(
                key,
                "manifest belongs to another source or extractor",
            ));
        }
        if self.indexed_from_offset > self.floor_offset || self.floor_offset > self.durable_offset {
            return Err(Error::bad_manifest(key, "manifest watermarks out of order"));
        }
        Ok(())
    }
}

pub fn ns_prefix(ns: &str) -> String {
    format!("indexes/{ns}/")
}

pub fn current_key(ns: &str) -> String {
    format!("indexes/{ns}/CURRENT")
}

pub fn claim_key(ns: &str) -> String {
    format!("indexes/{ns}/claims/current.json")
}

pub fn parts_prefix(ns: &str) -> String {
    format!("indexes/{ns}/parts/")
}

pub fn part_key(ns: &str, bytes: &[u8]) -> String {
    format!(
        "indexes/{ns}/parts/{}.parquet",
        &blake3::hash(bytes).to_hex()[..32]
    )
}

/// A JSON document and the ETag it was read with.
#[derive(Debug, Clone)]
pub struct Versioned<T> {
    pub value: T,
    pub etag: String,
}

pub async fn load<T: for<'de> Deserialize<'de>>(
    store: &DynStore,
    key: &str,
) -> Result<Option<Versioned<T>>> {
    match store.get(key).await.map_err(Error::request(key))? {
        None => Ok(None),
        Some(o) => Ok(Some(Versioned {
            value: parse(key, &o.bytes)?,
            etag: o.etag,
        })),
    }
}

/// The JSON document `key` holds.
pub fn parse<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T> {
    sonic_rs::from_slice(bytes).map_err(|source| Error::CorruptJson {
        key: key.to_string(),
        source,
    })
}

/// Conditional reload: `None` when unchanged.
pub async fn reload<T: for<'de> Deserialize<'de>>(
    store: &DynStore,
    key: &str,
    etag: &str,
) -> Result<Option<Versioned<T>>> {
    match store
        .get_if_changed(key, Some(etag))
        .await
        .map_err(Error::request(key))?
    {
        Fetched::Unchanged => Ok(None),
        Fetched::Missing => Err(Error::Vanished {
            key: key.to_string(),
        }),
        Fetched::Changed(o) => Ok(Some(Versioned {
            value: parse(key, &o.bytes)?,
            etag: o.etag,
        })),
    }
}

/// Write `value` under `key` if its ETag is still `etag` (`None`: create only); returns
/// the new ETag, or [`Error::Conflict`] when someone else wrote `key` first.
pub async fn cas<T: Serialize>(
    store: &DynStore,
    key: &str,
    value: &T,
    etag: Option<&str>,
) -> Result<String> {
    let bytes = sonic_rs::to_vec(value).map_err(Error::Encode)?;
    let mode = match etag {
        Some(e) => PutMode::IfMatch(e.to_string()),
        None => PutMode::CreateOnly,
    };
    store
        .put(key, bytes.into(), mode)
        .await
        .map_err(Error::write(key))
}

/// Read-modify-write `key` with compare-and-swap, retrying on conflicts. `f` gets the
/// current value (or `None`) and returns the new value plus a result, or an early result
/// when nothing should be written.
pub async fn update<T, R>(
    store: &DynStore,
    key: &str,
    attempts: usize,
    mut f: impl FnMut(Option<&T>) -> Result<(Option<T>, R)>,
) -> Result<(R, Option<Versioned<T>>)>
where
    T: Serialize + for<'de> Deserialize<'de> + Clone,
{
    for _ in 0..attempts {
        let cur: Option<Versioned<T>> = load(store, key).await?;
        let (next, r) = f(cur.as_ref().map(|v| &v.value))?;
        let Some(next) = next else {
            return Ok((r, cur));
        };
        match cas(store, key, &next, cur.as_ref().map(|v| v.etag.as_str())).await {
            Ok(etag) => return Ok((r, Some(Versioned { value: next, etag }))),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Contended {
        key: key.to_string(),
    })
}

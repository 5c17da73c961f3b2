//! Object stores: one trait, two backends with the same compare-and-swap semantics.
//!
//! * [`LocalStore`]: a directory (the embedded default for a single host). Writes go to a
//!   temp file and are renamed into place while holding an exclusive lock on one lock file,
//!   so the precondition check and the rename are atomic across processes. The ETag is
//!   the BLAKE3 hash of the content.
//! * [`S3Store`]: aws-sdk-s3 against S3 or any S3-compatible endpoint, with `If-Match` and
//!   `If-None-Match: *` on PUT, and `If-None-Match: <etag>` on GET (a 304, or an unchanged
//!   ETag on servers that ignore it, means "unchanged"). A PUT's body is not part of its
//!   signature (`UNSIGNED-PAYLOAD`): it carries `x-amz-checksum-crc32c` instead, which S3
//!   checks before storing the object. Hashing every byte with SHA-256 for the signature
//!   was about 9% of the server's CPU with `--durability s3`; CRC32C is a CPU instruction.
//!
//! Keys are relative to the store's root (the directory, or the bucket plus `--s3-prefix`)
//! and are minted by this crate only (`[A-Za-z0-9._/-]`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

#[derive(Debug)]
pub enum StoreError {
    /// A conditional write lost: the object changed (or exists, for create-only).
    PreconditionFailed,
    Other(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::PreconditionFailed => f.write_str("precondition failed"),
            StoreError::Other(s) => f.write_str(s),
        }
    }
}

/// So the cold tier and the indexer can keep a store failure as the source of their own
/// errors.
impl std::error::Error for StoreError {}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone)]
pub struct Object {
    pub bytes: Bytes,
    pub etag: String,
}

/// Result of a conditional read.
#[derive(Debug)]
pub enum Fetched {
    Missing,
    Unchanged,
    Changed(Object),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    Overwrite,
    /// `If-None-Match: *`.
    CreateOnly,
    /// `If-Match: <etag>`.
    IfMatch(String),
}

#[derive(Debug, Clone)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    /// Last modification, ms since the epoch, when the store reports it.
    pub modified_ms: Option<i64>,
}

#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>>;
    /// Read `key` unless its ETag is still `etag`.
    async fn get_if_changed(&self, key: &str, etag: Option<&str>) -> StoreResult<Fetched>;
    /// `len` bytes of `key` from `start` (parts inside packs); `None` when the key is missing.
    async fn get_range(&self, key: &str, start: u64, len: u64) -> StoreResult<Option<Bytes>>;
    /// Write `key`; returns the new ETag.
    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> StoreResult<String>;
    async fn delete(&self, key: &str) -> StoreResult<()>;
    async fn list(&self, prefix: &str) -> StoreResult<Vec<Listed>>;
    /// The keys under `prefix` that sort after `after`: a store that can start a listing
    /// there (S3's `start-after`) reads none of the keys before it.
    async fn list_after(&self, prefix: &str, after: &str) -> StoreResult<Vec<Listed>> {
        let mut listed = self.list(prefix).await?;
        listed.retain(|l| l.key.as_str() > after);
        Ok(listed)
    }
    fn describe(&self) -> String;
}

pub type DynStore = Arc<dyn ObjectStore>;

// ---------------------------------------------------------------------------------------
// Local directory

pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    pub fn open(root: &Path) -> StoreResult<LocalStore> {
        std::fs::create_dir_all(root.join(".tmp"))
            .map_err(|e| StoreError::Other(format!("create {}: {e}", root.display())))?;
        Ok(LocalStore {
            root: root.to_path_buf(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

fn local_etag(bytes: &[u8]) -> String {
    let h = blake3::hash(bytes).to_hex();
    format!("\"{}\"", &h[..32])
}

fn read_opt(path: &Path) -> StoreResult<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Other(format!("read {}: {e}", path.display()))),
    }
}

fn io_err(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Other(format!("{what}: {e}"))
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let path = self.path(key);
        let got = tokio::task::spawn_blocking(move || read_opt(&path))
            .await
            .map_err(|e| StoreError::Other(e.to_string()))??;
        Ok(got.map(|b| Object {
            etag: local_etag(&b),
            bytes: Bytes::from(b),
        }))
    }

    async fn get_if_changed(&self, key: &str, etag: Option<&str>) -> StoreResult<Fetched> {
        Ok(match self.get(key).await? {
            None => Fetched::Missing,
            Some(o) if Some(o.etag.as_str()) == etag => Fetched::Unchanged,
            Some(o) => Fetched::Changed(o),
        })
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> StoreResult<Option<Bytes>> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path(key);
        tokio::task::spawn_blocking(move || {
            let mut f = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err("open", e)),
            };
            f.seek(SeekFrom::Start(start))
                .map_err(|e| io_err("seek", e))?;
            let mut buf = vec![0u8; len as usize];
            f.read_exact(&mut buf)
                .map_err(|e| io_err("read range", e))?;
            Ok(Some(Bytes::from(buf)))
        })
        .await
        .map_err(|e| StoreError::Other(e.to_string()))?
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> StoreResult<String> {
        let root = self.root.clone();
        let path = self.path(key);
        tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| io_err("mkdir", e))?;
            }
            // One lock for every write: the check and the rename happen as one step for
            // every process sharing this directory.
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(root.join(".lock"))
                .map_err(|e| io_err("open lock", e))?;
            lock.lock().map_err(|e| io_err("lock", e))?;
            if mode != PutMode::Overwrite {
                let current = read_opt(&path)?;
                match (&mode, current) {
                    (PutMode::CreateOnly, Some(_)) => return Err(StoreError::PreconditionFailed),
                    (PutMode::IfMatch(_), None) => return Err(StoreError::PreconditionFailed),
                    (PutMode::IfMatch(want), Some(cur)) if &local_etag(&cur) != want => {
                        return Err(StoreError::PreconditionFailed)
                    }
                    _ => {}
                }
            }
            let tmp = root.join(".tmp").join(format!(
                "{}-{}",
                std::process::id(),
                blake3::hash(path.to_string_lossy().as_bytes()).to_hex()
            ));
            let mut f = std::fs::File::create(&tmp).map_err(|e| io_err("create temp", e))?;
            f.write_all(&bytes).map_err(|e| io_err("write temp", e))?;
            f.sync_data().map_err(|e| io_err("sync temp", e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io_err("rename", e))?;
            Ok(local_etag(&bytes))
        })
        .await
        .map_err(|e| StoreError::Other(e.to_string()))?
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let path = self.path(key);
        tokio::task::spawn_blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("delete", e)),
        })
        .await
        .map_err(|e| StoreError::Other(e.to_string()))?
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let root = self.root.clone();
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            // Walk from the deepest directory named by the prefix.
            let dir_part = match prefix.rfind('/') {
                Some(i) => &prefix[..i],
                None => "",
            };
            let mut out = Vec::new();
            let mut stack = vec![root.join(dir_part)];
            while let Some(dir) = stack.pop() {
                let rd = match std::fs::read_dir(&dir) {
                    Ok(rd) => rd,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err("list", e)),
                };
                for ent in rd.flatten() {
                    let p = ent.path();
                    let Ok(meta) = ent.metadata() else { continue };
                    if meta.is_dir() {
                        stack.push(p);
                        continue;
                    }
                    let Ok(rel) = p.strip_prefix(&root) else {
                        continue;
                    };
                    let key = rel.to_string_lossy().replace('\\', "/");
                    if key.starts_with('.') || !key.starts_with(&prefix) {
                        continue;
                    }
                    let modified_ms = meta
                        .modified()
                        .ok()
                        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_millis() as i64);
                    out.push(Listed {
                        key,
                        size: meta.len(),
                        modified_ms,
                    });
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Other(e.to_string()))?
    }

    fn describe(&self) -> String {
        format!("dir {}", self.root.display())
    }
}

// ---------------------------------------------------------------------------------------
// S3

pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// Key prefix, empty or ending in `/`.
    prefix: String,
}

#[derive(Debug, Clone)]
pub struct S3Settings {
    pub bucket: String,
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub path_style: bool,
    /// (access key, secret key) instead of the standard chain: for in-process clients in
    /// tests, which must not change the process environment under other threads.
    pub static_credentials: Option<(String, String)>,
}

impl S3Store {
    /// Credentials come from the standard AWS chain (environment, profile, IMDS…).
    pub async fn connect(s: &S3Settings) -> S3Store {
        use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(r) = &s.region {
            loader = loader.region(Region::new(r.clone()));
        } else {
            loader = loader.region(
                aws_config::meta::region::RegionProviderChain::default_provider()
                    .or_else(Region::new("us-east-1")),
            );
        }
        if let Some(e) = &s.endpoint {
            loader = loader.endpoint_url(e.clone());
        }
        if let Some((ak, sk)) = &s.static_credentials {
            loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
                ak.clone(),
                sk.clone(),
                None,
                None,
                "static",
            ));
        }
        let shared = loader.load().await;
        let conf = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(s.path_style || s.endpoint.is_some())
            // Plain Content-MD5-free PUTs: S3-compatible servers differ in trailer support.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        let mut prefix = s.prefix.trim_matches('/').to_string();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        S3Store {
            client: aws_sdk_s3::Client::from_conf(conf),
            bucket: s.bucket.clone(),
            prefix,
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

/// The value of `x-amz-checksum-crc32c`: the big-endian CRC32C, base64.
fn crc32c_header(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(crc32c::crc32c(bytes).to_be_bytes())
}

type SdkErr<E> = aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>;

fn status_of<E>(e: &SdkErr<E>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

fn s3_err<E: std::error::Error + 'static>(what: &str, e: SdkErr<E>) -> StoreError {
    StoreError::Other(format!(
        "s3 {what}: {}",
        aws_sdk_s3::error::DisplayErrorContext(&e)
    ))
}

impl S3Store {
    /// Every key under `prefix` (after `after`, when given), page by page.
    async fn list_from(&self, prefix: &str, after: Option<&str>) -> StoreResult<Vec<Listed>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(self.key(prefix));
            if let Some(a) = after {
                req = req.start_after(self.key(a));
            }
            if let Some(t) = &token {
                req = req.continuation_token(t);
            }
            let resp = req.send().await.map_err(|e| s3_err("list", e))?;
            for o in resp.contents() {
                let Some(k) = o.key() else { continue };
                let Some(rel) = k.strip_prefix(&self.prefix) else {
                    continue;
                };
                out.push(Listed {
                    key: rel.to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    modified_ms: o.last_modified().and_then(|t| t.to_millis().ok()),
                });
            }
            match resp.next_continuation_token() {
                Some(t) if resp.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        match self.get_if_changed(key, None).await? {
            Fetched::Missing => Ok(None),
            Fetched::Changed(o) => Ok(Some(o)),
            Fetched::Unchanged => Err(StoreError::Other("s3 get: unexpected 304".into())),
        }
    }

    async fn get_if_changed(&self, key: &str, etag: Option<&str>) -> StoreResult<Fetched> {
        let mut req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.key(key));
        if let Some(e) = etag {
            req = req.if_none_match(e);
        }
        match req.send().await {
            Ok(out) => {
                let tag = out.e_tag().unwrap_or_default().to_string();
                if etag.is_some() && Some(tag.as_str()) == etag {
                    return Ok(Fetched::Unchanged);
                }
                let body = out
                    .body
                    .collect()
                    .await
                    .map_err(|e| StoreError::Other(format!("s3 get body: {e}")))?;
                Ok(Fetched::Changed(Object {
                    bytes: body.into_bytes(),
                    etag: tag,
                }))
            }
            Err(e) => match status_of(&e) {
                Some(304) => Ok(Fetched::Unchanged),
                Some(404) => Ok(Fetched::Missing),
                _ => Err(s3_err("get", e)),
            },
        }
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> StoreResult<Option<Bytes>> {
        if len == 0 {
            return Ok(Some(Bytes::new()));
        }
        let req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .range(format!("bytes={start}-{}", start + len - 1));
        match req.send().await {
            Ok(out) => {
                let body = out
                    .body
                    .collect()
                    .await
                    .map_err(|e| StoreError::Other(format!("s3 get body: {e}")))?
                    .into_bytes();
                if body.len() as u64 != len {
                    return Err(StoreError::Other(format!(
                        "s3 range get of {key}: {} bytes, wanted {len}",
                        body.len()
                    )));
                }
                Ok(Some(body))
            }
            Err(e) => match status_of(&e) {
                Some(404) => Ok(None),
                _ => Err(s3_err("get range", e)),
            },
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> StoreResult<String> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .checksum_crc32_c(crc32c_header(&bytes))
            .body(aws_sdk_s3::primitives::ByteStream::from(bytes));
        match &mode {
            PutMode::Overwrite => {}
            PutMode::CreateOnly => req = req.if_none_match("*"),
            PutMode::IfMatch(e) => req = req.if_match(e),
        }
        match req.customize().disable_payload_signing().send().await {
            Ok(out) => Ok(out.e_tag().unwrap_or_default().to_string()),
            // AWS answers 404 for If-Match on a missing key; s3s-fs answers 412.
            Err(e) => match status_of(&e) {
                Some(412) | Some(409) => Err(StoreError::PreconditionFailed),
                Some(404) if matches!(mode, PutMode::IfMatch(_)) => {
                    Err(StoreError::PreconditionFailed)
                }
                _ => Err(s3_err("put", e)),
            },
        }
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(s3_err("delete", e)),
        }
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.list_from(prefix, None).await
    }

    async fn list_after(&self, prefix: &str, after: &str) -> StoreResult<Vec<Listed>> {
        self.list_from(prefix, Some(after)).await
    }

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_header_is_the_big_endian_crc32c_in_base64() {
        // CRC32C("123456789") is 0xE3069283, the standard check value.
        assert_eq!(crc32c_header(b"123456789"), "4waSgw==");
        assert_eq!(crc32c_header(b""), "AAAAAA==");
    }
}

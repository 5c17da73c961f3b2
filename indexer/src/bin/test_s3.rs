//! `ursula-test-s3`: a real S3 server for the indexer's tests.
//!
//! It is s3s-fs (objects are files under `--root`, one subdirectory per bucket) behind the
//! `s3s` HTTP/SigV4 front end, with two changes. Listings read only the directories under
//! their prefix (see `list_under`). And every call that changes an object runs under that
//! object's lock. Stock s3s-fs checks `If-Match` / `If-None-Match`, writes a
//! temp file and renames it with no lock across those steps, so two racing
//! compare-and-swap writers can both win; the indexer's manifest CAS needs exactly one
//! winner. There is one lock per key, so writes of different objects go side by side as on
//! S3: a lock shared by several keys held a small PUT behind a large upload of another key
//! for the whole transfer (one lock for everything did that to every PUT; 64 stripes still
//! held one WAL PUT in a few hundred behind an archive upload for over a second). Calls
//! that change several objects or a bucket exclude all of them.
//! Reads are not locked (a rename is atomic, so a reader sees the old or the new object).
//!
//! `--put-delay-ms` and `--get-delay-ms` hold each request that long before it is served
//! (outside the locks, so concurrent requests wait side by side, as they do on S3), to
//! stand in for an object store's latency: S3 Standard answers a small PUT in about 20-80 ms.
//!
//! Prints `ursula-test-s3 listening on http://ADDR` on stdout once it accepts connections.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hyper_util::rt::TokioIo;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;
use tokio::sync::Mutex;

#[derive(Parser, Debug)]
#[command(
    name = "ursula-test-s3",
    about = "s3s-fs with serialised writes (tests only)"
)]
struct Opt {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Directory holding one subdirectory per bucket.
    #[arg(long)]
    root: PathBuf,
    /// Buckets to create at start (directories under --root).
    #[arg(long)]
    bucket: Vec<String>,
    #[arg(long, default_value = "testak")]
    access_key: String,
    #[arg(long, default_value = "testsecretkey")]
    secret_key: String,
    /// Write `GET n\nPUT n\nHEAD n\nLIST n\nDELETE n` here every 100 ms (request counts,
    /// for measuring how many S3 requests the indexer makes).
    #[arg(long)]
    counts_file: Option<PathBuf>,
    /// Hold every request that writes an object (PUT, copy, completing a multipart
    /// upload) this long before serving it.
    #[arg(long, default_value_t = 0)]
    put_delay_ms: u64,
    /// Hold every request that reads (GET, HEAD, LIST) this long before serving it.
    #[arg(long, default_value_t = 0)]
    get_delay_ms: u64,
}

/// Requests served, by kind: GET, PUT, HEAD, LIST, DELETE.
#[derive(Default)]
struct Counts([AtomicU64; 5]);

impl Counts {
    fn bump(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self) -> String {
        let names = ["GET", "PUT", "HEAD", "LIST", "DELETE"];
        names
            .iter()
            .zip(&self.0)
            .map(|(n, c)| format!("{n} {}\n", c.load(Ordering::Relaxed)))
            .collect()
    }
}

fn main() {
    let opt = Opt::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ursula-test-s3: runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(opt)) {
        eprintln!("ursula-test-s3: {e}");
        std::process::exit(1);
    }
}

async fn run(opt: Opt) -> Result<(), Box<dyn std::error::Error>> {
    for b in &opt.bucket {
        std::fs::create_dir_all(opt.root.join(b))?;
    }
    let fs = FileSystem::new(&opt.root).map_err(|e| format!("s3s-fs: {e:?}"))?;
    let counts = Arc::new(Counts::default());
    if let Some(path) = opt.counts_file.clone() {
        let counts = counts.clone();
        tokio::spawn(async move {
            loop {
                let tmp = path.with_extension("tmp");
                if std::fs::write(&tmp, counts.render()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
    }
    let locked = Locked {
        fs,
        root: opt.root.clone(),
        keys: KeyLocks::default(),
        all: tokio::sync::RwLock::new(()),
        counts,
        put_delay: Duration::from_millis(opt.put_delay_ms),
        get_delay: Duration::from_millis(opt.get_delay_ms),
    };
    let service = {
        let mut b = S3ServiceBuilder::new(locked);
        b.set_auth(SimpleAuth::from_single(opt.access_key, opt.secret_key));
        b.build()
    };
    let listener = tokio::net::TcpListener::bind(opt.listen).await?;
    println!(
        "ursula-test-s3 listening on http://{}",
        listener.local_addr()?
    );
    let service = Arc::new(service);
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => continue,
        };
        let service = (*service).clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}

/// s3s-fs with a lock around every call that changes an object, and the configured
/// latencies.
struct Locked {
    fs: FileSystem,
    /// The directory holding one subdirectory per bucket (s3s-fs's root).
    root: PathBuf,
    /// Each key's lock, held across a conditional write's check and rename.
    keys: KeyLocks,
    /// Held shared by a one-key write, exclusively by a call that changes several keys or a
    /// bucket.
    all: tokio::sync::RwLock<()>,
    counts: Arc<Counts>,
    put_delay: Duration,
    get_delay: Duration,
}

impl Locked {
    /// Run `write` holding the lock of `bucket/key`.
    async fn one<T>(
        &self,
        bucket: &str,
        key: &str,
        write: impl std::future::Future<Output = T>,
    ) -> T {
        let held = self.keys.get(format!("{bucket}/{key}"));
        let _shared = self.all.read().await;
        let _key = held.lock.lock().await;
        write.await
    }

    /// Run `write` holding every lock.
    async fn every<T>(&self, write: impl std::future::Future<Output = T>) -> T {
        let _all = self.all.write().await;
        write.await
    }
}

/// The locks of the keys being written now: an entry lives while a writer holds or waits
/// for it, so the table stays as small as the writes in progress.
#[derive(Default)]
struct KeyLocks {
    table: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// One writer's hold on a key's lock entry; dropping it (the write ended or was cancelled)
/// removes the entry once no other writer holds it.
struct HeldKey<'a> {
    locks: &'a KeyLocks,
    key: String,
    lock: Arc<Mutex<()>>,
}

impl KeyLocks {
    fn get(&self, key: String) -> HeldKey<'_> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let lock = table.entry(key.clone()).or_default().clone();
        HeldKey {
            locks: self,
            key,
            lock,
        }
    }
}

impl Drop for HeldKey<'_> {
    fn drop(&mut self) {
        let mut table = self.locks.table.lock().unwrap_or_else(|p| p.into_inner());
        // The table's reference and this one: no other writer holds or awaits the lock,
        // and none can take it without the table's mutex, held here.
        if Arc::strong_count(&self.lock) == 2 {
            table.remove(&self.key);
        }
    }
}

/// A listing without a delimiter, read from the directory of the prefix's last complete
/// path segment down: the keys of other prefixes are never visited, so a listing costs
/// what the prefix holds, as on S3, not what the whole bucket holds. (s3s-fs walks the
/// whole bucket for every listing, which made a lane's takeover slower with every object
/// other lanes had written.)
fn list_under(bucket_dir: &Path, input: ListObjectsV2Input) -> S3Result<ListObjectsV2Output> {
    if !bucket_dir.is_dir() {
        return Err(s3s::s3_error!(NoSuchBucket));
    }
    let prefix = input.prefix.clone().unwrap_or_default();
    let top = match prefix.rfind('/') {
        Some(i) => bucket_dir.join(&prefix[..i]),
        None => bucket_dir.to_path_buf(),
    };
    let mut objects = Vec::new();
    let mut dirs = vec![top];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue; // no object has this prefix
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue; // removed while listed
            };
            let path = entry.path();
            if meta.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(key) = path
                .strip_prefix(bucket_dir)
                .ok()
                .and_then(|k| k.to_str())
                .map(str::to_owned)
            else {
                continue;
            };
            if key.starts_with(&prefix) {
                objects.push((key, meta));
            }
        }
    }
    objects.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let marker = match (&input.continuation_token, &input.start_after) {
        (Some(t), Some(a)) => Some(t.max(a).clone()),
        (t, a) => t.clone().or_else(|| a.clone()),
    };
    if let Some(m) = &marker {
        objects.retain(|(k, _)| k > m);
    }
    let max_keys = input.max_keys.unwrap_or(1000).max(0);
    let page = usize::try_from(max_keys).unwrap_or(1000);
    let is_truncated = objects.len() > page;
    objects.truncate(page);
    let next_continuation_token = is_truncated
        .then(|| objects.last().map(|(k, _)| k.clone()))
        .flatten();
    let contents: Vec<Object> = objects
        .into_iter()
        .map(|(key, meta)| Object {
            key: Some(key),
            size: i64::try_from(meta.len()).ok(),
            last_modified: meta.modified().ok().map(Timestamp::from),
            ..Default::default()
        })
        .collect();
    Ok(ListObjectsV2Output {
        key_count: i32::try_from(contents.len()).ok(),
        max_keys: Some(max_keys),
        is_truncated: Some(is_truncated),
        contents: (!contents.is_empty()).then_some(contents),
        continuation_token: input.continuation_token,
        next_continuation_token,
        encoding_type: input.encoding_type,
        name: Some(input.bucket),
        prefix: input.prefix,
        start_after: input.start_after,
        ..Default::default()
    })
}

/// Wait `delay` (nothing when it is zero).
async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

#[async_trait::async_trait]
impl S3 for Locked {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.every(self.fs.create_bucket(req)).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.fs.list_buckets(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.counts.bump(0);
        pause(self.get_delay).await;
        self.fs.get_object(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.counts.bump(2);
        pause(self.get_delay).await;
        self.fs.head_object(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.counts.bump(3);
        pause(self.get_delay).await;
        if req.input.delimiter.is_some() {
            return self.fs.list_objects_v2(req).await;
        }
        let bucket_dir = self.root.join(&req.input.bucket);
        let input = req.input;
        let listed = tokio::task::spawn_blocking(move || list_under(&bucket_dir, input))
            .await
            .map_err(|e| s3s::s3_error!(InternalError, "listing: {e}"))??;
        Ok(S3Response::new(listed))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.counts.bump(1);
        pause(self.put_delay).await;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.one(&bucket, &key, self.fs.put_object(req)).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        pause(self.put_delay).await;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.one(&bucket, &key, self.fs.copy_object(req)).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.counts.bump(4);
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.one(&bucket, &key, self.fs.delete_object(req)).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.every(self.fs.delete_objects(req)).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.fs.upload_part(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        pause(self.put_delay).await;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.one(&bucket, &key, self.fs.complete_multipart_upload(req))
            .await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.fs.abort_multipart_upload(req).await
    }
}

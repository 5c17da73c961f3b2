//! Configuration: command-line flags over an optional TOML file over defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Parser, Debug, Default)]
#[command(
    name = "ursula-indexer",
    version,
    about = "Event-time index over Durable Streams"
)]
pub struct Cli {
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Local directory object store (the default: ./ursula-index).
    #[arg(long, conflicts_with = "s3_bucket")]
    pub store_dir: Option<PathBuf>,
    /// S3 bucket object store (credentials from the standard AWS chain).
    #[arg(long)]
    pub s3_bucket: Option<String>,
    #[arg(long)]
    pub s3_prefix: Option<String>,
    /// S3-compatible endpoint URL (implies path-style addressing).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Disposable local cache of downloaded parts (S3 store).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Budget for the part caches (disk, and a quarter of it in memory).
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Commit the in-memory tail to the store at least this often.
    #[arg(long)]
    pub commit_interval_ms: Option<u64>,
    /// ... or when this many entries are pending.
    #[arg(long)]
    pub commit_entries: Option<usize>,
    /// How often followers re-read CATALOG and manifests.
    #[arg(long)]
    pub poll_interval_ms: Option<u64>,
    /// Ingest claim lease.
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Level-0 parts of one day that trigger a compaction, and the most merged at once
    /// (the fan-in: these plus the day's level-1 run).
    #[arg(long)]
    pub compact_parts: Option<usize>,
    /// Maximum entries in one compaction output part. With the fan-in it bounds the rows
    /// a compaction holds: (fan-in + 1) decoded pages plus one output part.
    #[arg(long)]
    pub compaction_max_entries: Option<usize>,
    #[arg(long)]
    pub gc_interval_ms: Option<u64>,
    #[arg(long)]
    pub gc_grace_ms: Option<u64>,
    #[arg(long)]
    pub gc_retain_generations: Option<u64>,
    /// Compression of the Parquet parts written from now on: `zstd` (default) or `none`.
    /// Parts are delta-encoded either way, so ZSTD saves little on real data, but the
    /// parquet crate sets up a decompression context per column reader, which dominates a
    /// cold page's decode; `none` makes cold queries faster (docs/indexer.md). Readers
    /// follow each part's own metadata, so the two can be mixed.
    #[arg(long, value_enum)]
    pub part_compression: Option<crate::part::PartCompression>,
    /// Identity of this worker in claims (default: host-pid-random).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// PEM file of extra root certificates trusted for https sources (on top of the
    /// platform's).
    #[arg(long)]
    pub source_ca_file: Option<PathBuf>,
    /// File holding the bearer token sent to the stream server with every request (its
    /// first line that is not blank or a `#` comment; a `read:` token of the server's
    /// `auth_token_file`, without the prefix). Read at start and again on SIGHUP.
    #[arg(long, value_name = "PATH")]
    pub server_token_file: Option<PathBuf>,
    /// PEM certificate chain (leaf first) for TLS on the listener; needs `--tls-key`.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) matching `--tls-cert`.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// TOML file with any of the settings above (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Test-only fault injection: shift every extracted time by this many ms.
    #[arg(long, hide = true)]
    pub debug_time_offset_ms: Option<i64>,
    /// Test-only: re-read each index from its registration base, so the first commit
    /// overlaps what is already durable (exercises overlap verification).
    #[arg(long, hide = true)]
    pub debug_reingest: bool,
    /// Test-only: wait this long before opening each index, so a test can watch a worker
    /// that listens while its indexes are still opening.
    #[arg(long, hide = true)]
    pub debug_open_delay_ms: Option<u64>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub source_ca_file: Option<PathBuf>,
    pub server_token_file: Option<PathBuf>,
    pub store_dir: Option<PathBuf>,
    pub s3_bucket: Option<String>,
    pub s3_prefix: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub cache_dir: Option<PathBuf>,
    pub cache_bytes: Option<u64>,
    pub commit_interval_ms: Option<u64>,
    pub commit_entries: Option<usize>,
    pub poll_interval_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub compact_parts: Option<usize>,
    pub compaction_max_entries: Option<usize>,
    pub gc_interval_ms: Option<u64>,
    pub gc_grace_ms: Option<u64>,
    pub gc_retain_generations: Option<u64>,
    pub part_compression: Option<crate::part::PartCompression>,
    pub worker_id: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub enum StoreConfig {
    Dir(PathBuf),
    S3(crate::store::S3Settings),
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub store: StoreConfig,
    pub cache_dir: Option<PathBuf>,
    pub cache_bytes: u64,
    pub commit_interval: Duration,
    pub commit_entries: usize,
    pub poll_interval: Duration,
    pub lease: Duration,
    pub compact_parts: usize,
    pub compaction_max_entries: usize,
    pub gc_interval: Duration,
    pub gc_grace: Duration,
    pub gc_retain_generations: u64,
    pub part_compression: crate::part::PartCompression,
    pub worker_id: String,
    pub source_ca_file: Option<PathBuf>,
    /// The bearer token for the stream server; `None`: requests carry no token.
    pub server_token_file: Option<PathBuf>,
    /// Certificate chain and key for TLS on the listener; `None`: plain HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub debug_time_offset_ms: i64,
    pub debug_reingest: bool,
    pub debug_open_delay: Duration,
}

impl Config {
    pub fn resolve(cli: Cli) -> Result<Config> {
        let file = match &cli.config {
            Some(p) => load_file(p)?,
            None => FileConfig::default(),
        };
        let ms =
            |a: Option<u64>, b: Option<u64>, d: u64| Duration::from_millis(a.or(b).unwrap_or(d));
        let bucket = cli.s3_bucket.or(file.s3_bucket);
        let store_dir = cli.store_dir.or(file.store_dir);
        let store = match (bucket, store_dir) {
            (Some(_), Some(_)) => {
                return Err(Error::Config(
                    "give either a store directory or an S3 bucket, not both",
                ))
            }
            (Some(bucket), None) => StoreConfig::S3(crate::store::S3Settings {
                bucket,
                prefix: cli
                    .s3_prefix
                    .or(file.s3_prefix)
                    .unwrap_or_else(|| "event-index".into()),
                endpoint: cli.s3_endpoint.or(file.s3_endpoint),
                region: cli.s3_region.or(file.s3_region),
                path_style: false,
                static_credentials: None,
            }),
            (None, dir) => StoreConfig::Dir(dir.unwrap_or_else(|| PathBuf::from("ursula-index"))),
        };
        let compact_parts = cli.compact_parts.or(file.compact_parts).unwrap_or(8);
        if compact_parts < 2 {
            return Err(Error::Config("--compact-parts must be at least 2"));
        }
        let worker_id = cli.worker_id.or(file.worker_id).unwrap_or_else(|| {
            format!(
                "w{}-{:x}",
                std::process::id(),
                crate::time::now_ms() & 0xffff_ffff
            )
        });
        let tls = match (cli.tls_cert.or(file.tls_cert), cli.tls_key.or(file.tls_key)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(Error::Config("tls_cert and tls_key must be given together")),
        };
        Ok(Config {
            tls,
            listen: cli
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 4493))),
            store,
            cache_dir: cli.cache_dir.or(file.cache_dir),
            cache_bytes: cli
                .cache_bytes
                .or(file.cache_bytes)
                .unwrap_or(1 << 30)
                .max(16 << 20),
            commit_interval: ms(cli.commit_interval_ms, file.commit_interval_ms, 5_000),
            commit_entries: cli
                .commit_entries
                .or(file.commit_entries)
                .unwrap_or(65_536)
                .max(1),
            poll_interval: ms(cli.poll_interval_ms, file.poll_interval_ms, 250),
            lease: ms(cli.lease_ms, file.lease_ms, 15_000),
            compact_parts,
            compaction_max_entries: cli
                .compaction_max_entries
                .or(file.compaction_max_entries)
                .unwrap_or(1_000_000)
                .max(1024),
            gc_interval: ms(cli.gc_interval_ms, file.gc_interval_ms, 60_000),
            gc_grace: ms(cli.gc_grace_ms, file.gc_grace_ms, 600_000),
            gc_retain_generations: cli
                .gc_retain_generations
                .or(file.gc_retain_generations)
                .unwrap_or(8)
                .max(1),
            part_compression: cli
                .part_compression
                .or(file.part_compression)
                .unwrap_or_default(),
            worker_id,
            source_ca_file: cli.source_ca_file.or(file.source_ca_file),
            server_token_file: cli.server_token_file.or(file.server_token_file),
            debug_time_offset_ms: cli.debug_time_offset_ms.unwrap_or(0),
            debug_reingest: cli.debug_reingest,
            debug_open_delay: Duration::from_millis(cli.debug_open_delay_ms.unwrap_or(0)),
        })
    }
}

fn load_file(p: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(p).map_err(|source| Error::ConfigRead {
        path: p.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| Error::ConfigParse {
        path: p.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::part::PartCompression;

    #[test]
    fn part_compression_from_flag_file_or_default() {
        let resolve = |args: &[&str]| {
            let mut argv = vec!["ursula-indexer"];
            argv.extend_from_slice(args);
            Config::resolve(Cli::try_parse_from(argv).expect("parse"))
                .map(|c| c.part_compression)
                .ok()
        };
        assert_eq!(resolve(&[]), Some(PartCompression::Zstd));
        assert_eq!(
            resolve(&["--part-compression", "none"]),
            Some(PartCompression::None)
        );
        assert!(Cli::try_parse_from(["ursula-indexer", "--part-compression", "lz4"]).is_err());
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("indexer.toml");
        std::fs::write(&file, "part_compression = \"none\"\n").expect("write");
        let file = file.to_str().expect("utf-8");
        assert_eq!(resolve(&["--config", file]), Some(PartCompression::None));
        assert_eq!(
            resolve(&["--config", file, "--part-compression", "zstd"]),
            Some(PartCompression::Zstd)
        );
    }
}

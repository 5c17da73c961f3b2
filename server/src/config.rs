//! Server configuration: command-line flags over an optional TOML file over defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

#[derive(Parser, Debug)]
#[command(
    name = "ursula",
    version,
    about = "Durable Streams server, and its command-line client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the stream server.
    Server(Box<ServerArgs>),
    /// Build a data dir from the cold tier (S3) alone; `ursula server` then recovers it
    /// rewound to the archived end.
    Restore(RestoreArgs),
    /// The client commands (`ls`, `stat`, `cat`, `tail`, `append`, `create`, `delete`,
    /// `snapshot`, `retain`), which talk to a running server over HTTP: the `ursula-cli`
    /// crate.
    #[command(flatten)]
    Client(ursula_cli::Command),
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The data dir to create; must be empty or absent.
    #[arg(long)]
    pub data_dir: PathBuf,
    #[arg(long)]
    pub cold_s3_bucket: String,
    #[arg(long, default_value = "")]
    pub cold_s3_prefix: String,
    /// S3-compatible endpoint (implies path-style addressing).
    #[arg(long)]
    pub cold_s3_endpoint: Option<String>,
    #[arg(long)]
    pub cold_s3_region: Option<String>,
    /// Bytes of segment files to download (all shards together), as the server's
    /// `--cold-local-bytes`: what recovery replays, then the newest older segments that
    /// fit. The rest stays in the cold tier; start the server with this cold tier.
    #[arg(long)]
    pub cold_local_bytes: Option<u64>,
}

impl RestoreArgs {
    pub fn s3(&self) -> ursula_s3::S3Settings {
        s3_settings(
            self.cold_s3_bucket.clone(),
            self.cold_s3_prefix.clone(),
            self.cold_s3_endpoint.clone(),
            self.cold_s3_region.clone(),
        )
    }
}

fn s3_settings(
    bucket: String,
    prefix: String,
    endpoint: Option<String>,
    region: Option<String>,
) -> ursula_s3::S3Settings {
    ursula_s3::S3Settings {
        bucket,
        prefix,
        path_style: endpoint.is_some(),
        endpoint,
        region,
        static_credentials: None,
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    /// Segment files in --data-dir; appends acknowledged once their log write is durable.
    Disk,
    /// Process memory only; everything is lost on exit.
    Memory,
}

/// How a data dir divides its streams into logs (storage shards).
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogsMode {
    /// One log per core: every lane of a core shares its log and its group commits.
    Core,
    /// One log per lane, on core `lane mod cores`: the unit a cluster moves between hosts.
    Lane,
}

/// Lanes per core of a new data dir with a log per lane and no lane count given: a
/// core's commits and write buffers are shared by this many logs (see
/// docs/benchmarks.md, "Logs per core").
pub const DEFAULT_LANE_LOGS_PER_CORE: u32 = 4;

/// Who moves a cluster's lanes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssignMode {
    /// The hosts: each lane goes to the live host rendezvous hashing picks, and a lost
    /// host's lanes are adopted by the others.
    #[default]
    Auto,
    /// The operator, through the admin endpoints; hosts still heartbeat and name owners.
    Manual,
}

/// When an append is acknowledged.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Once its log write is durable on the local disk.
    #[default]
    Local,
    /// Once it is durable on the local disk and in S3 (a WAL object PUT through the cold
    /// tier): losing the host and its disk loses nothing acknowledged. Needs the cold tier.
    S3,
}

#[derive(Args, Debug, Default)]
pub struct ServerArgs {
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Directory for segment files (disk storage).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Number of cores (event loops and shards); default: all available.
    #[arg(long)]
    pub cores: Option<usize>,
    /// Lanes a new data dir divides its streams into (lane = CRC32C of the stream's key mod
    /// lanes, each lane on core `lane mod cores`); fixed once the data dir exists.
    /// Default 64.
    #[arg(long)]
    pub lanes: Option<u32>,
    /// How a new data dir keeps its logs: `core` (one log per core, the fastest on one
    /// host) or `lane` (one log per lane, what a cluster moves between hosts; the core
    /// count may then change between starts). Fixed once the data dir exists.
    #[arg(long, value_enum)]
    pub logs: Option<LogsMode>,
    /// Also give every core a port of its own, from this address's port upward (core N on
    /// port + N): a proxy that computes a stream's lane sends its requests straight to
    /// the core that owns it.
    #[arg(long)]
    pub core_listen: Option<SocketAddr>,
    #[arg(long, value_enum)]
    pub storage: Option<StorageMode>,
    /// When appends are acknowledged: `local` (durable on this disk) or `s3` (also in S3;
    /// needs the cold tier).
    #[arg(long, value_enum)]
    pub durability: Option<DurabilityMode>,
    /// How long a long-poll read waits for data before answering 204.
    #[arg(long)]
    pub long_poll_timeout_ms: Option<u64>,
    /// Most open client connections per process, split evenly over the cores; more are
    /// answered 503 and closed.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this separate address instead of
    /// exposing metrics on the main listener (health stays available there too, under
    /// `/__ursula/`).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Log level or filter (`info`, `debug`, `ursula_server=debug,info`); overrides the
    /// `URSULA_LOG` and `RUST_LOG` environment variables.
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log one line per request (at most `access_log_per_sec` lines per second per core).
    #[arg(long)]
    pub access_log: bool,
    /// Bearer tokens, one per line as `read:<token>` or `write:<token>`; when set, every
    /// request except CORS preflights and health checks needs one.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Allow browser requests only from this origin (`https://app.example.com`);
    /// repeatable. Default: any origin (`Access-Control-Allow-Origin: *`).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// The URL clients reach this server at (`https://streams.example.com`), used for the
    /// `Location` of what a request creates. Default: the scheme and address the request
    /// arrived on. Never taken from the request's `Host` header.
    #[arg(long)]
    pub public_url: Option<String>,
    /// PEM certificate chain (leaf first) for TLS on the main listener; needs `--tls-key`.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) matching `--tls-cert`.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Archive every shard continuously to this S3 bucket (the cold tier); without it
    /// nothing leaves the local disk.
    #[arg(long)]
    pub cold_s3_bucket: Option<String>,
    /// Key prefix of the archive inside the bucket.
    #[arg(long)]
    pub cold_s3_prefix: Option<String>,
    /// S3-compatible endpoint URL (implies path-style addressing).
    #[arg(long)]
    pub cold_s3_endpoint: Option<String>,
    #[arg(long)]
    pub cold_s3_region: Option<String>,
    /// Longest an acknowledged byte waits before it is in S3 (default 10000).
    #[arg(long)]
    pub archive_interval_ms: Option<u64>,
    /// Bytes of segment files kept on the local disk (all cores together) when archived.
    #[arg(long)]
    pub cold_local_bytes: Option<u64>,
    /// Take the archive over even if another live server owns it (that server stops
    /// archiving at its next commit).
    #[arg(long)]
    pub cold_takeover: bool,
    /// Run as one host of several sharing the cold tier's bucket: lanes are owned through
    /// their manifests, a start serves only the lanes this host still owns, and lanes
    /// move between hosts at run time. Needs the cold tier; implies `--logs lane`.
    #[arg(long)]
    pub cluster: bool,
    /// With `--cluster`: the `host:port` other hosts and proxies reach this host at, named
    /// in the manifests of the lanes it owns and in its refusals of lanes it does not.
    #[arg(long)]
    pub advertise: Option<String>,
    /// With `--cluster`: `auto` (the hosts spread the lanes among themselves and adopt a
    /// lost host's) or `manual` (lanes move only through `/__ursula/lanes/N/adopt` and
    /// `/release`).
    #[arg(long, value_enum)]
    pub cluster_assign: Option<AssignMode>,
    /// With `--cluster` and `--auth-token-file`: a file holding the write token (one of the
    /// token file's, limited to no buckets) this host presents when it calls another host
    /// (a fork whose source is on another host's lane).
    #[arg(long)]
    pub cluster_token_file: Option<PathBuf>,
    /// TOML file with any of the settings above (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The `[cold_tier]` section.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct ColdTierFile {
    pub s3_bucket: Option<String>,
    pub s3_prefix: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub archive_interval_ms: Option<u64>,
    pub local_bytes: Option<u64>,
    pub grace_ms: Option<u64>,
    /// With `durability = "s3"`: while a WAL PUT is in flight, the next one starts beside
    /// it once it holds this many bytes.
    pub wal_object_bytes: Option<usize>,
    /// With `durability = "s3"`: ... or once its oldest change has waited this long.
    pub wal_linger_ms: Option<u64>,
    /// With `durability = "s3"`: with no WAL PUT in flight, how long changes still wait for
    /// more before theirs starts (bounds the PUT rate of a trickle of appends).
    pub wal_hold_ms: Option<u64>,
    /// With `durability = "s3"`: WAL PUTs in flight at once per core.
    pub wal_max_in_flight: Option<usize>,
    /// With `durability = "s3"`: longest an append waits for S3 before it is answered 503.
    pub s3_ack_timeout_ms: Option<u64>,
}

/// The cold tier, when a bucket is configured.
#[derive(Clone, Debug)]
pub struct ColdTier {
    pub settings: ursula_cold::Settings,
    /// Local segment bytes for all cores together.
    pub local_bytes: Option<u64>,
}

/// The settings file; every key is optional.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub cores: Option<usize>,
    pub lanes: Option<u32>,
    pub logs: Option<LogsMode>,
    pub core_listen: Option<SocketAddr>,
    pub storage: Option<StorageMode>,
    pub durability: Option<DurabilityMode>,
    pub long_poll_timeout_ms: Option<u64>,
    pub sse_keepalive_ms: Option<u64>,
    pub sse_max_connection_ms: Option<u64>,
    pub header_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
    pub body_min_rate: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub producer_receipt_window: Option<usize>,
    pub segment_bytes: Option<u64>,
    /// Stream bytes each core keeps cached in memory (disk storage).
    pub cache_bytes: Option<usize>,
    /// Bytes of index pages read back from index files each core keeps cached (disk storage).
    pub index_cache_bytes: Option<usize>,
    /// How long a stream goes unused before its state leaves memory for its shard's index
    /// files, to come back on its next use (disk storage; 0: streams always stay in memory).
    pub idle_stream_ms: Option<u64>,
    pub max_connections: Option<usize>,
    /// Appended bytes each core may hold that are not yet durable (disk storage).
    pub write_budget_bytes: Option<usize>,
    /// Request-body bytes each core may be receiving at once.
    pub body_budget_bytes: Option<usize>,
    pub public_url: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub log_level: Option<String>,
    pub access_log: Option<bool>,
    pub access_log_per_sec: Option<u32>,
    pub auth_token_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub cors_origins: Option<Vec<String>>,
    pub cluster: Option<bool>,
    pub advertise: Option<String>,
    pub cluster_assign: Option<AssignMode>,
    /// With `cluster`: how often this host writes its node record and looks at the others'.
    pub cluster_heartbeat_ms: Option<u64>,
    /// With `cluster`: a host whose node record is this much older than the newest one is
    /// gone, and its lanes are adopted by the others.
    pub cluster_lease_ms: Option<u64>,
    pub cluster_token_file: Option<PathBuf>,
    pub cold_tier: Option<ColdTierFile>,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub cores: usize,
    /// Lanes asked for on the command line or in the file (`None`: the data dir's, or
    /// `DEFAULT_LANES` for a new one).
    pub lanes: Option<u32>,
    /// How the logs are kept, as asked for (`None`: the data dir's, or a log per core for
    /// a new one).
    pub logs: Option<LogsMode>,
    /// One host of several: lanes are owned through the cold tier and move at run time.
    pub cluster: bool,
    /// Where this host is reached (`host:port`), written into its node record and the
    /// manifests of its lanes.
    pub advertise: Option<String>,
    pub cluster_assign: AssignMode,
    pub cluster_heartbeat: Duration,
    pub cluster_lease: Duration,
    /// The token this host presents to the others when the hosts check tokens.
    pub cluster_token: Option<String>,
    /// The first per-core port (core N listens on its port + N), if any.
    pub core_listen: Option<SocketAddr>,
    pub storage: StorageMode,
    pub long_poll_timeout: Duration,
    pub sse_keepalive: Duration,
    pub sse_max_connection: Duration,
    /// Time allowed to send a complete request head (and longest wait for any body read).
    pub header_timeout: Duration,
    /// Time allowed for a request body after its head, before `body_min_rate` extends it.
    pub body_timeout: Duration,
    /// The slowest average rate a body may arrive at: every `body_min_rate` bytes received
    /// (up to the announced length) add one second to `body_timeout` (0: none).
    pub body_min_rate: u64,
    /// How long an idle keep-alive connection is kept open.
    pub idle_timeout: Duration,
    pub receipt_window: usize,
    pub segment_bytes: u64,
    pub cache_bytes: usize,
    pub index_cache_bytes: usize,
    /// Unused this long, a stream goes dormant (`Duration::MAX`: never).
    pub idle_stream: Duration,
    /// Open connections allowed on each core (`max_connections` split over the cores).
    pub max_connections_per_core: usize,
    pub write_budget_bytes: usize,
    /// Request-body bytes each core may be receiving at once; a body that would go over
    /// gets 503 before it is read (one body alone is always admitted).
    pub body_budget_bytes: usize,
    /// `scheme://host[:port][/path]` without a trailing slash, the base of `Location`;
    /// `None`: the scheme and address each request arrived on.
    pub public_url: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter from the flag or file; the environment is consulted when it is absent.
    pub log_level: Option<String>,
    pub access_log: bool,
    /// Most access-log lines each core writes per second; the rest are counted and the
    /// count is reported on the next line written.
    pub access_log_per_sec: u32,
    /// Accepted bearer tokens, reloaded on SIGHUP; `None`: no authentication.
    pub auth: Option<std::sync::Arc<crate::tokens::TokenFile>>,
    /// TLS on the main listener; `None`: plain HTTP.
    pub tls: Option<crate::tls::Tls>,
    /// Origins allowed by CORS; `None`: any (`*`).
    pub cors_origins: Option<Vec<String>>,
    /// Continuous archiving to S3; `None`: none.
    pub cold: Option<ColdTier>,
    /// With `--durability s3`: how each shard ships its log to S3 before acknowledging.
    pub s3_wal: Option<ursula_storage::S3WalSettings>,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:4437";

/// The S3 WAL's settings from the `[cold_tier]` section, over the engine's defaults.
fn s3_wal_settings(file: &ColdTierFile) -> Result<ursula_storage::S3WalSettings, ConfigError> {
    let defaults = ursula_storage::S3WalSettings::default();
    let at_least_one = |v: Option<u64>, what| match v {
        Some(0) => Err(ConfigError::Zero(what)),
        v => Ok(v),
    };
    let object_bytes = at_least_one(file.wal_object_bytes.map(|b| b as u64), "wal_object_bytes")?;
    let in_flight = at_least_one(
        file.wal_max_in_flight.map(|n| n as u64),
        "wal_max_in_flight",
    )?;
    let ack = at_least_one(file.s3_ack_timeout_ms, "s3_ack_timeout_ms")?;
    Ok(ursula_storage::S3WalSettings {
        object_bytes: object_bytes.map_or(defaults.object_bytes, |b| b as usize),
        linger: file
            .wal_linger_ms
            .map_or(defaults.linger, Duration::from_millis),
        hold: file
            .wal_hold_ms
            .map_or(defaults.hold, Duration::from_millis),
        max_in_flight: in_flight.map_or(defaults.max_in_flight, |n| n as usize),
        ack_timeout: ack.map_or(defaults.ack_timeout, Duration::from_millis),
        ack_before_s3: false,
    })
}

/// A setting the server cannot start with (the process exits with status 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("cores must be between 1 and 1024, got {0}")]
    Cores(usize),
    #[error(transparent)]
    Lanes(#[from] ursula_storage::placement::PlacementError),
    #[error("core_listen {0} needs {1} consecutive ports from a fixed (non-zero) port")]
    CorePorts(SocketAddr, usize),
    #[error("{0} cores with a log per lane need at least {0} lanes, not {1}")]
    CoresBeyondLanes(usize, u32),
    #[error("max_connections must be at least 1")]
    NoConnections,
    #[error("tls_cert and tls_key must be given together")]
    HalfTls,
    #[error("archive_interval_ms must be at least 1")]
    NoArchiveInterval,
    #[error("the cold tier archives the data dir: it needs --storage disk")]
    ColdNeedsDisk,
    #[error(
        "--durability s3 acknowledges once appends are in S3: it needs the cold tier \
         (--cold-s3-bucket, or s3_bucket in [cold_tier])"
    )]
    S3DurabilityNeedsColdTier,
    #[error(
        "--cluster keeps lane ownership in the cold tier's bucket: it needs the cold tier \
         (--cold-s3-bucket, or s3_bucket in [cold_tier])"
    )]
    ClusterNeedsColdTier,
    #[error("--cluster moves lanes between hosts: it needs a log per lane, not --logs core")]
    ClusterNeedsLaneLogs,
    #[error(
        "--cluster needs --advertise (the host:port other hosts and proxies reach this one \
         at) when listening on {0}"
    )]
    ClusterNeedsAdvertise(SocketAddr),
    #[error(
        "cluster_lease_ms = {lease_ms} is too short: it must be at least 3 heartbeats \
         ({heartbeat_ms} ms each) and 2000 ms"
    )]
    ShortLease { lease_ms: u64, heartbeat_ms: u64 },
    #[error(
        "--cluster hosts call each other over plain HTTP: terminate TLS in front of them \
         (HAProxy) rather than on their listeners"
    )]
    ClusterWithTls,
    #[error(
        "--cluster with --auth-token-file needs cluster_token_file: a file holding the write \
         token (limited to no buckets) the hosts present to each other"
    )]
    ClusterNeedsToken,
    #[error("cannot read cluster_token_file {}: {source}", path.display())]
    ClusterTokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the token in cluster_token_file {} is not a write token of the auth token file \
         limited to no buckets",
        .0.display()
    )]
    ClusterTokenNotGranted(PathBuf),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "invalid CORS origin {0:?}: expected scheme://host[:port] (e.g. https://app.example.com) or *"
    )]
    Origin(String),
    #[error(
        "invalid public_url {0:?}: expected http(s)://host[:port][/path] (e.g. https://streams.example.com)"
    )]
    PublicUrl(String),
    #[error(transparent)]
    Tokens(#[from] crate::tokens::TokenFileError),
    #[error(transparent)]
    Tls(#[from] ursula_tls::TlsConfigError),
}

impl Config {
    /// The settings from the command line, the TOML file and the defaults, in that order
    /// of precedence. One setting after another (about 130 lines): splitting the list
    /// would only scatter it.
    pub fn resolve(args: ServerArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let default_cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cores = args.cores.or(file.cores).unwrap_or(default_cores);
        if cores == 0 || cores > 1024 {
            return Err(ConfigError::Cores(cores));
        }
        let lanes = args.lanes.or(file.lanes);
        let cluster = args.cluster || file.cluster.unwrap_or(false);
        let logs = match args.logs.or(file.logs) {
            Some(LogsMode::Core) if cluster => return Err(ConfigError::ClusterNeedsLaneLogs),
            None if cluster => Some(LogsMode::Lane),
            logs => logs,
        };
        let listen = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default"));
        let advertise = match args.advertise.or(file.advertise) {
            Some(a) => Some(a),
            None if !cluster => None,
            // Other hosts can reach a fixed address it listens on.
            None if !listen.ip().is_unspecified() && listen.port() != 0 => Some(listen.to_string()),
            None => return Err(ConfigError::ClusterNeedsAdvertise(listen)),
        };
        if let Some(lanes) = lanes {
            use ursula_storage::placement::Placement;
            let placement = match logs {
                Some(LogsMode::Lane) => Placement::lane_logs(lanes)?,
                _ => Placement::with_lanes(cores as u32, lanes)?,
            };
            if !placement.fits_cores(cores) {
                return Err(ConfigError::CoresBeyondLanes(cores, lanes));
            }
        }
        let core_listen = args.core_listen.or(file.core_listen);
        if let Some(a) = core_listen {
            if a.port() == 0 || usize::from(a.port()) + cores > usize::from(u16::MAX) + 1 {
                return Err(ConfigError::CorePorts(a, cores));
            }
        }
        let ms = Duration::from_millis;
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(crate::limits::CONNECTIONS_MAX_DEFAULT);
        if max_connections == 0 {
            return Err(ConfigError::NoConnections);
        }
        let auth = match args.auth_token_file.or(file.auth_token_file) {
            Some(path) => Some(std::sync::Arc::new(crate::tokens::TokenFile::load(&path)?)),
            None => None,
        };
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some(crate::tls::Tls::load(&cert, &key)?),
            (None, None) => None,
            _ => return Err(ConfigError::HalfTls),
        };
        let origins = if args.cors_origins.is_empty() {
            file.cors_origins.unwrap_or_default()
        } else {
            args.cors_origins
        };
        let cors_origins = check_origins(origins)?;
        let public_url = match args.public_url.or(file.public_url) {
            Some(url) => Some(check_public_url(&url)?),
            None => None,
        };
        let cold_file = file.cold_tier.unwrap_or_default();
        let wal_settings = s3_wal_settings(&cold_file);
        let cold = match args.cold_s3_bucket.or(cold_file.s3_bucket) {
            None => None,
            Some(bucket) => {
                let interval = args
                    .archive_interval_ms
                    .or(cold_file.archive_interval_ms)
                    .unwrap_or(10_000);
                if interval == 0 {
                    return Err(ConfigError::NoArchiveInterval);
                }
                Some(ColdTier {
                    settings: ursula_cold::Settings {
                        s3: s3_settings(
                            bucket,
                            args.cold_s3_prefix
                                .or(cold_file.s3_prefix)
                                .unwrap_or_default(),
                            args.cold_s3_endpoint.or(cold_file.s3_endpoint),
                            args.cold_s3_region.or(cold_file.s3_region),
                        ),
                        archive_interval: ms(interval),
                        grace: ms(cold_file.grace_ms.unwrap_or(600_000)),
                        takeover: args.cold_takeover,
                        advertise: advertise.clone(),
                        lanes_move: cluster,
                    },
                    local_bytes: args.cold_local_bytes.or(cold_file.local_bytes),
                })
            }
        };
        if cluster && cold.is_none() {
            return Err(ConfigError::ClusterNeedsColdTier);
        }
        if cluster && tls.is_some() {
            return Err(ConfigError::ClusterWithTls);
        }
        let cluster_token = match (
            cluster,
            &auth,
            args.cluster_token_file.or(file.cluster_token_file),
        ) {
            (true, Some(tokens), Some(path)) => Some(cluster_token(&tokens.current(), &path)?),
            (true, Some(_), None) => return Err(ConfigError::ClusterNeedsToken),
            _ => None,
        };
        let heartbeat_ms = file.cluster_heartbeat_ms.unwrap_or(1_000).max(50);
        let lease_ms = file.cluster_lease_ms.unwrap_or(5_000);
        // Object stores date objects to the second: a lease any shorter would see live
        // hosts come and go.
        if lease_ms < (3 * heartbeat_ms).max(2_000) {
            return Err(ConfigError::ShortLease {
                lease_ms,
                heartbeat_ms,
            });
        }
        let storage = args.storage.or(file.storage).unwrap_or(StorageMode::Disk);
        if cold.is_some() && storage == StorageMode::Memory {
            return Err(ConfigError::ColdNeedsDisk);
        }
        let s3_wal = match args.durability.or(file.durability).unwrap_or_default() {
            DurabilityMode::Local => None,
            DurabilityMode::S3 if cold.is_none() => {
                return Err(ConfigError::S3DurabilityNeedsColdTier)
            }
            DurabilityMode::S3 => Some(wal_settings?),
        };
        Ok(Config {
            cold,
            s3_wal,
            auth,
            tls,
            cors_origins,
            listen,
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            cores,
            lanes,
            logs,
            cluster,
            advertise,
            cluster_assign: args
                .cluster_assign
                .or(file.cluster_assign)
                .unwrap_or_default(),
            cluster_heartbeat: ms(heartbeat_ms),
            cluster_lease: ms(lease_ms),
            cluster_token,
            core_listen,
            storage,
            long_poll_timeout: ms(args
                .long_poll_timeout_ms
                .or(file.long_poll_timeout_ms)
                .unwrap_or(1000)
                .clamp(1, 60_000)),
            sse_keepalive: ms(file.sse_keepalive_ms.unwrap_or(15_000).max(10)),
            sse_max_connection: ms(file.sse_max_connection_ms.unwrap_or(60_000).max(100)),
            header_timeout: ms(file.header_timeout_ms.unwrap_or(10_000).max(10)),
            body_timeout: ms(file.body_timeout_ms.unwrap_or(30_000).max(10)),
            body_min_rate: file.body_min_rate.unwrap_or(256 * 1024),
            idle_timeout: ms(file.idle_timeout_ms.unwrap_or(60_000).max(10)),
            receipt_window: file.producer_receipt_window.unwrap_or(256).max(1),
            segment_bytes: file
                .segment_bytes
                .unwrap_or(ursula_storage::shard::DEFAULT_SEGMENT_BYTES),
            cache_bytes: file
                .cache_bytes
                .unwrap_or(ursula_storage::shard::DEFAULT_CACHE_BYTES),
            index_cache_bytes: file
                .index_cache_bytes
                .unwrap_or(ursula_storage::DEFAULT_INDEX_CACHE_BYTES),
            idle_stream: match file.idle_stream_ms {
                Some(0) => Duration::MAX,
                Some(n) => ms(n),
                None => ursula_storage::shard::DEFAULT_IDLE_AFTER,
            },
            // Rounded up so that every core can hold at least one connection.
            max_connections_per_core: max_connections.div_ceil(cores),
            write_budget_bytes: file
                .write_budget_bytes
                .unwrap_or(ursula_storage::shard::DEFAULT_WRITE_BUDGET_BYTES),
            body_budget_bytes: file
                .body_budget_bytes
                .unwrap_or(crate::limits::BODY_BUDGET_BYTES_DEFAULT),
            public_url,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            log_level: args.log_level.or(file.log_level),
            access_log: args.access_log || file.access_log.unwrap_or(false),
            access_log_per_sec: file.access_log_per_sec.unwrap_or(100),
        })
    }
}

/// Check the configured origins: each is `*` or `scheme://host[:port]` as browsers send
/// it in `Origin` (no path, no trailing slash). An empty list or one with `*` allows any.
/// The token of `cluster_token_file`, if the token file grants it writes on everything.
fn cluster_token(tokens: &crate::tokens::Tokens, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ClusterTokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim().to_string();
    match tokens.grant(&token) {
        Some(grant) if grant.access == crate::tokens::Scope::Write && grant.buckets.is_none() => {
            Ok(token)
        }
        _ => Err(ConfigError::ClusterTokenNotGranted(path.to_path_buf())),
    }
}

fn check_origins(list: Vec<String>) -> Result<Option<Vec<String>>, ConfigError> {
    if list.is_empty() || list.iter().any(|o| o == "*") {
        return Ok(None);
    }
    for o in &list {
        let rest = o
            .strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"));
        let ok = rest.is_some_and(|host| {
            !host.is_empty() && !host.contains(['/', '?', '#', ' ', ',']) && host.is_ascii()
        });
        if !ok {
            return Err(ConfigError::Origin(o.clone()));
        }
    }
    Ok(Some(list))
}

/// Check a public base URL: `http://` or `https://`, a host, an optional port and path, and
/// nothing a `Location` built on it could be misread by (user info, query, fragment). The
/// trailing slash is dropped, since every path appended to it starts with one.
fn check_public_url(url: &str) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|r| r.split('/').next().unwrap_or_default());
    let ok = rest.is_some_and(|r| r.is_ascii() && !r.contains(['?', '#', ' ', '@', '\\']))
        && host.is_some_and(|h| !h.is_empty());
    if !ok {
        return Err(ConfigError::PublicUrl(url.to_string()));
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// deploy/ursula.toml shows every key with its default: with its commented keys
    /// switched on (all but those whose default depends on the host or means "off"), it
    /// must resolve to exactly the built-in defaults.
    #[test]
    fn example_config_shows_the_defaults() {
        let example = include_str!("../../deploy/ursula.toml");
        let on: String = example
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(kv)
                    if kv.contains(" = ")
                        && !kv.starts_with("cores ")
                        && !kv.starts_with("lanes ")
                        && !kv.starts_with("logs ")
                        && !kv.starts_with("core_listen ")
                        && !kv.starts_with("advertise ")
                        && !kv.starts_with("cluster_token_file ")
                        && !kv.starts_with("metrics_listen ")
                        && !kv.starts_with("log_level ")
                        && !kv.starts_with("tls_")
                        && !kv.starts_with("public_url ") =>
                {
                    kv
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ursula.toml");
        std::fs::write(&path, on).expect("write");
        let from_file = Config::resolve(ServerArgs {
            config: Some(path),
            cores: Some(1),
            ..Default::default()
        })
        .expect("example parses");
        let defaults = Config::resolve(ServerArgs {
            data_dir: Some(PathBuf::from("/var/lib/ursula")),
            cores: Some(1),
            ..Default::default()
        })
        .expect("defaults");
        assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn core_ports_need_a_fixed_range_and_lanes_at_least_the_cores() {
        let args = |core_listen: &str, cores: usize, lanes: Option<u32>| ServerArgs {
            core_listen: Some(core_listen.parse().expect("addr")),
            cores: Some(cores),
            lanes,
            ..Default::default()
        };
        let cfg = Config::resolve(args("127.0.0.1:4440", 2, Some(2))).expect("resolve");
        assert_eq!(cfg.core_listen.map(|a| a.port()), Some(4440));
        assert_eq!(cfg.lanes, Some(2));
        for (addr, cores) in [("127.0.0.1:0", 1), ("127.0.0.1:65535", 2)] {
            let err = Config::resolve(args(addr, cores, None)).expect_err(addr);
            assert!(matches!(err, ConfigError::CorePorts(..)), "{err}");
        }
        assert!(Config::resolve(args("127.0.0.1:65535", 1, None)).is_ok());
        let err = Config::resolve(args("127.0.0.1:4440", 4, Some(2))).expect_err("lanes");
        assert_eq!(
            err.to_string(),
            "2 lanes cannot spread over 4 shards (need 1 <= shards <= lanes <= 65536)"
        );
    }

    #[test]
    fn flags_override_file_override_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ursula.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\ncores = 3\nstorage = \"memory\"\nlong_poll_timeout_ms = 500\n",
        )
        .expect("write");
        let cfg = Config::resolve(ServerArgs {
            cores: Some(2),
            config: Some(path.clone()),
            ..Default::default()
        })
        .expect("resolve");
        assert_eq!(cfg.listen.port(), 9000);
        assert_eq!(cfg.cores, 2);
        assert_eq!(cfg.storage, StorageMode::Memory);
        assert_eq!(cfg.long_poll_timeout, Duration::from_millis(500));
        assert_eq!(cfg.data_dir, PathBuf::from("./data"));
        std::fs::write(&path, "bogus = 1\n").expect("write");
        let err = Config::resolve(ServerArgs {
            config: Some(path),
            ..Default::default()
        });
        assert!(err.is_err());
    }

    #[test]
    fn public_url_must_be_a_plain_base() {
        assert_eq!(
            check_public_url("https://streams.example.com/")
                .ok()
                .as_deref(),
            Some("https://streams.example.com")
        );
        assert_eq!(
            check_public_url("http://10.0.0.1:4437/ursula")
                .ok()
                .as_deref(),
            Some("http://10.0.0.1:4437/ursula")
        );
        for bad in [
            "streams.example.com",
            "ftp://x",
            "https://",
            "https://user@evil.example",
            "https://x/?q",
            "https://x/#f",
            "https://x y",
        ] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_cold_tier_comes_from_its_section_and_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ursula.toml");
        std::fs::write(
            &path,
            "[cold_tier]\ns3_bucket = \"b\"\ns3_prefix = \"p\"\ns3_endpoint = \"http://127.0.0.1:9\"\n\
             archive_interval_ms = 500\nlocal_bytes = 1000\ngrace_ms = 7\n",
        )
        .expect("write");
        let cfg = Config::resolve(ServerArgs {
            config: Some(path.clone()),
            archive_interval_ms: Some(250),
            ..Default::default()
        })
        .expect("resolve");
        let cold = cfg.cold.expect("configured");
        assert_eq!(cold.settings.s3.bucket, "b");
        assert_eq!(cold.settings.s3.prefix, "p");
        assert!(
            cold.settings.s3.path_style,
            "an endpoint implies path style"
        );
        assert_eq!(cold.settings.archive_interval, Duration::from_millis(250));
        assert_eq!(cold.settings.grace, Duration::from_millis(7));
        assert_eq!(cold.local_bytes, Some(1000));
        assert!(Config::resolve(ServerArgs::default())
            .expect("resolve")
            .cold
            .is_none());
        let memory = Config::resolve(ServerArgs {
            cold_s3_bucket: Some("b".into()),
            storage: Some(StorageMode::Memory),
            ..Default::default()
        });
        assert!(matches!(
            memory.expect_err("refused"),
            ConfigError::ColdNeedsDisk
        ));
        std::fs::write(&path, "[cold_tier]\nbucket = \"b\"\n").expect("write");
        assert!(Config::resolve(ServerArgs {
            config: Some(path),
            ..Default::default()
        })
        .is_err());
    }
}

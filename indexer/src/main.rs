//! `ursula-indexer`: the event-time index process.
//!
//! A separate process from `ursula` and on tokio rather than monoio: aws-sdk-s3 needs a
//! tokio runtime, and this process is I/O-bound on object-store and HTTP round trips.

use std::sync::Arc;

use clap::Parser;
use hyper_util::rt::TokioIo;

use ursula_indexer::config::{Cli, Config, StoreConfig};
use ursula_indexer::coordinator::Coordinator;
use ursula_indexer::error::{Error, Result};
use ursula_indexer::index::Shared;
use ursula_indexer::source::SourceClient;
use ursula_indexer::store::{DynStore, LocalStore, S3Store};

fn main() {
    let cli = Cli::parse();
    init_logging();
    let cfg = match Config::resolve(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ursula-indexer: {e}");
            std::process::exit(2);
        }
    };
    // A bad certificate or key is a configuration error, reported before anything starts.
    let tls = match &cfg.tls {
        Some((cert, key)) => match ursula_tls::server_config(cert, key) {
            Ok(c) => Some(tokio_rustls::TlsAcceptor::from(c)),
            Err(e) => {
                eprintln!("ursula-indexer: {e}");
                std::process::exit(2);
            }
        },
        None => None,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ursula-indexer: runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(cfg, tls)) {
        eprintln!("ursula-indexer: {e}");
        std::process::exit(1);
    }
}

async fn run(cfg: Config, tls: Option<tokio_rustls::TlsAcceptor>) -> Result<()> {
    let io = |what: String| move |source| Error::Io { what, source };
    let store: DynStore = match &cfg.store {
        StoreConfig::Dir(d) => Arc::new(LocalStore::open(d).map_err(|source| Error::Request {
            key: d.display().to_string(),
            source,
        })?),
        StoreConfig::S3(s) => Arc::new(S3Store::connect(s).await),
    };
    tracing::info!("store: {}", store.describe());
    // A local directory store needs no disk cache: the parts already are local files.
    let disk_cache = match cfg.store {
        StoreConfig::Dir(_) => None,
        StoreConfig::S3(_) => cfg.cache_dir.clone(),
    };
    let mut source = SourceClient::with_roots(cfg.source_ca_file.as_deref())?;
    if let Some(path) = &cfg.server_token_file {
        source = source.with_token_file(path)?;
    }
    let shared = Shared::new(store, cfg.clone(), disk_cache, source);
    let co = Coordinator::new(shared);
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(io(format!("bind {}", cfg.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(io("listener address".into()))?;
    // Read CATALOG, then listen at once: the indexes open in the background (a request
    // for one that is not open yet opens it first), and `/readyz` and READY=1 wait
    // until every index has been opened.
    if let Err(e) = co.sync(true).await {
        tracing::warn!("catalog: {e}");
    }
    co.open_in_background();
    tokio::spawn(co.clone().run());
    // Before the listening line: the default action of SIGHUP ends the process, and a
    // reload may come as soon as a service manager has seen the line.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(io("SIGHUP handler".into()))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("ursula-indexer listening on {scheme}://{addr}");
    tokio::spawn(notify_ready(co.clone()));
    if let Some(interval) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(interval));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io("SIGTERM handler".into()))?;
    loop {
        let (socket, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
            _ = hup.recv() => {
                reload_token(&co.shared.source);
                continue;
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let _ = socket.set_nodelay(true);
        let co = co.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(co, socket).await,
                Some(acceptor) => {
                    // A failed or stalled handshake only ends this connection.
                    let accepted =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await;
                    match accepted {
                        Ok(Ok(stream)) => serve_connection(co, stream).await,
                        Ok(Err(e)) => tracing::debug!("tls handshake failed: {e}"),
                        Err(_) => tracing::debug!("tls handshake timed out"),
                    }
                }
            }
        });
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("stopping: committing indexed tails and releasing ingest claims");
    let (ended, running) = co.shutdown(SHUTDOWN_TIMEOUT).await;
    if ended < running {
        tracing::warn!(
            "stopped {ended} of {running} ingest tasks within {SHUTDOWN_TIMEOUT:?}; the rest \
             are claimed again once their lease runs out"
        );
    } else {
        tracing::info!("stopped {running} ingest tasks");
    }
    Ok(())
}

/// SIGHUP (`systemctl reload`): re-read `server_token_file`. A file that cannot be used
/// keeps the token in force, so a half-written file does not cut the indexer off.
fn reload_token(source: &SourceClient) {
    match source.reload_token() {
        Ok(Some(path)) => tracing::info!("reloaded the server token from {}", path.display()),
        Ok(None) => tracing::info!("SIGHUP: no server token file to reload"),
        Err(e) => tracing::error!("kept the server token in force: {e}"),
    }
}

/// Tell systemd (`Type=notify`) the indexer is ready: the listener accepts already, so
/// wait until the catalog has been read and its indexes opened (in the background, see
/// `Coordinator::open_in_background`). When the first read failed, the coordinator's
/// loop keeps trying and this fires once a pass after its first success is done.
async fn notify_ready(co: Arc<Coordinator>) {
    while !co.loaded.load(std::sync::atomic::Ordering::Acquire) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("sd_notify READY: {e}");
    }
}

/// `WATCHDOG=1` at half the interval systemd asked for (`WatchdogSec=`), from a task on
/// the runtime: a runtime that no longer schedules tasks stops the keep-alives and
/// systemd restarts the service.
async fn watchdog(interval: std::time::Duration) {
    let period = (interval / 2).max(std::time::Duration::from_millis(10));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
    }
}

const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a stopping worker waits for its ingest tasks to commit and release their
/// claims; under systemd's default `TimeoutStopSec` (90 s) with room to spare.
const SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Serve HTTP/1.1 on one connection, plain or TLS.
async fn serve_connection<IO>(co: Arc<Coordinator>, io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| ursula_indexer::http::handle(co.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// Logs go to stderr (stdout carries only the listening line); `RUST_LOG` sets the level.
/// Coloured only on a terminal: a file, a pipe or journald gets plain lines.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

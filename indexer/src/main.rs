//! `ursula-indexer`: the event-time index process.
//!
//! A separate process from `ursula` and on tokio rather than monoio: aws-sdk-s3 needs a
//! tokio runtime, and this process is I/O-bound on object-store and HTTP round trips.

use std::sync::Arc;

use clap::Parser;
use hyper_util::rt::TokioIo;

use ursula_indexer::config::{Cli, Config, StoreConfig};
use ursula_indexer::coordinator::Coordinator;
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
    if let Err(e) = rt.block_on(run(cfg)) {
        eprintln!("ursula-indexer: {e}");
        std::process::exit(1);
    }
}

async fn run(cfg: Config) -> Result<(), String> {
    let store: DynStore = match &cfg.store {
        StoreConfig::Dir(d) => Arc::new(LocalStore::open(d).map_err(|e| e.to_string())?),
        StoreConfig::S3(s) => Arc::new(S3Store::connect(s).await),
    };
    tracing::info!("store: {}", store.describe());
    // A local directory store needs no disk cache: the parts already are local files.
    let disk_cache = match cfg.store {
        StoreConfig::Dir(_) => None,
        StoreConfig::S3(_) => cfg.cache_dir.clone(),
    };
    let source = SourceClient::with_roots(cfg.source_ca_file.as_deref())?;
    let shared = Shared::new(store, cfg.clone(), disk_cache, source);
    let co = Coordinator::new(shared);
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("bind {}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Open the registered indexes before announcing readiness to accept requests.
    if let Err(e) = co.sync(true).await {
        tracing::warn!("catalog: {e}");
    }
    tokio::spawn(co.clone().run());
    println!("ursula-indexer listening on http://{addr}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        let (socket, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let _ = socket.set_nodelay(true);
        let co = co.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                ursula_indexer::http::handle(co.clone(), req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(socket), svc)
                .await;
        });
    }
    Ok(())
}

/// Logs go to stderr (stdout carries only the listening line); `RUST_LOG` sets the level.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

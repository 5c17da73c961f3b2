//! `ursula`: the Durable Streams server.

mod attrs;
mod auth;
mod batch;
mod buckets;
mod config;
mod conn;
mod cores;
mod ext;
mod feed;
mod fork;
mod handlers;
mod http;
mod ops;
mod records;
mod routes;
mod snapshots;
mod sse;
mod tls;

use clap::Parser;

/// Request buffers cross cores (read on the owner, written by the connection's core), a
/// pattern glibc's per-thread arenas handle with lock traffic and consolidation passes.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use config::{Cli, Command, Config};

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Server(args) => {
            let config = match Config::resolve(args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ursula: {e}");
                    std::process::exit(2);
                }
            };
            if let Err(e) = init_logging(config.log_level.as_deref()) {
                eprintln!("ursula: {e}");
                std::process::exit(2);
            }
            if let Err(e) = cores::run(config) {
                eprintln!("ursula: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// Logs go to stderr (stdout carries only the listening lines). The filter comes from
/// `--log-level` / `log_level`, else `URSULA_LOG`, else `RUST_LOG`, else `info`.
///
/// On a terminal the output is coloured; anywhere else (a pipe, a file, journald) it is one
/// plain line per event. Under journald (`JOURNAL_STREAM` set) the timestamp is left out
/// because the journal stamps every line itself.
fn init_logging(flag: Option<&str>) -> Result<(), String> {
    use std::io::IsTerminal;
    let env = |name| {
        std::env::var(name)
            .ok()
            .filter(|v: &String| !v.trim().is_empty())
    };
    let spec = flag
        .map(str::to_string)
        .or_else(|| env("URSULA_LOG"))
        .or_else(|| env("RUST_LOG"))
        .unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&spec)
        .map_err(|e| format!("invalid log level {spec:?}: {e}"))?;
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let terminal = std::io::stderr().is_terminal() && !journal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(terminal);
    if journal {
        builder.without_time().init();
    } else {
        builder.init();
    }
    Ok(())
}

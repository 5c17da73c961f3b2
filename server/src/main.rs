//! `ursula`: the Durable Streams server.

// The declaration order is the layering: a module uses only modules declared before it
// (scripts/check-layers enforces it; docs/architecture.md explains it). Modules in one run
// of lines with no blank line between them are one layer and do not use each other.

// Limits, configuration and the stream state blob: plain values, no I/O of requests.
mod limits;

mod tls;
mod tokens;

mod config;

mod cold;

mod surface;

mod attrs;

mod ext;

// The HTTP codec, with its error vocabulary; it knows no protocol feature.
mod http;

// What a path names, and who may ask for it.
mod routes;

mod auth;

mod records;

// One core's state and the cross-core hop.
mod hop;
mod metrics;

mod core;

// Lookups and write payloads, on the owner core.
mod lookup;

mod payload;

mod removal;

// The operations, then live reads that outlast a response.
mod handlers;

mod live;

mod admin;

// Routing to the owner, connections, and the process around the cores.
mod router;

mod conn;

mod runtime;

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
            let config = match Config::resolve(*args) {
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
            if let Err(e) = runtime::run(config) {
                eprintln!("ursula: {e}");
                std::process::exit(1);
            }
        }
        Command::Restore(args) => match cold::restore(&args) {
            Ok(report) => {
                println!(
                    "restored {} shards into {}: {} objects, {} bytes in {} ms",
                    report.shards,
                    args.data_dir.display(),
                    report.objects,
                    report.bytes,
                    report.elapsed.as_millis()
                );
                if report.cold_segments > 0 {
                    println!(
                        "{} sealed segments ({} bytes) stay in the cold tier, over \
                         --cold-local-bytes: start the server with the same cold tier",
                        report.cold_segments, report.cold_bytes
                    );
                }
                for (shard, end) in report.ends.iter().enumerate() {
                    println!(
                        "shard {shard}: rewound to segment {} position {} (LSN {})",
                        end.segment, end.position, end.lsn
                    );
                }
            }
            Err(e) => {
                eprintln!("ursula restore: {e}");
                std::process::exit(1);
            }
        },
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

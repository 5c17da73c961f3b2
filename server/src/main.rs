//! `ursula`: the Durable Streams server. The same binary carries the command-line client
//! (`ursula ls`, `tail`, …), whose code is the `ursula-cli` crate.

// The declaration order is the layering: a module uses only modules declared before it
// (scripts/check-layers enforces it; docs/architecture.md explains it). Modules in one run
// of lines with no blank line between them are one layer and do not use each other.

// Limits, configuration and the stream state blob: plain values, no I/O of requests.
mod limits;

mod tls;
mod tokens;

mod config;

mod cold;

// Which lanes this host serves now.
mod lane_table;

mod surface;

mod attrs;

mod bucket_settings;
mod ext;

mod rate_limit;

// The HTTP codec, with its error vocabulary; it knows no protocol feature.
mod http;

// What a path names, and who may ask for it.
mod routes;

mod auth;

mod records;

// Opening a shard with the settings its core gives it.
mod shards;

// One core's state and the cross-core hop.
mod hop;
mod metrics;

mod core;
// Which lanes this host serves, and moving them between hosts.
mod lanes;
mod peer;

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
            refuse_transparent_huge_pages();
            if let Err(e) = runtime::run(config) {
                eprintln!("ursula: {e}");
                std::process::exit(1);
            }
        }
        Command::Client(command) => std::process::exit(ursula_cli::run(command)),
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
                if report.wal_objects > 0 {
                    println!(
                        "{} WAL objects applied past the archived ends",
                        report.wal_objects
                    );
                }
                for (shard, end) in report.restored_ends.iter().enumerate() {
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

/// Keep the heap in 4 KiB pages even where the host enables transparent huge pages.
///
/// mimalloc asks for huge pages on its arena (`MADV_HUGEPAGE`), and the kernel then backs
/// whole 2 MiB ranges around scattered live blocks: RSS follows how the heap happens to lie,
/// not what is live. Under 1,000 streams of appends 49-54 MB were live while RSS was
/// 98-115 MB, and a 5 s burst of random reads after a restart left RSS 3-13 MB higher for
/// the minutes of writes that followed, with the live heap unchanged. Without huge pages
/// the same load runs at 57-83 MB. (What the allocator touched before `main`, 4 MiB here,
/// keeps its huge pages.) A kernel without the call leaves things as they were, so failing
/// is not an error.
fn refuse_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of
    // ours; it only sets a flag on this process's address space.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not turn transparent huge pages off for this process"
        );
    }
}

/// Logs go to stderr (stdout carries only the listening lines). The filter comes from
/// A log filter `tracing` cannot parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid log level {spec:?}: {source}")]
struct InvalidLogLevel {
    spec: String,
    source: tracing_subscriber::filter::ParseError,
}

/// `--log-level` / `log_level`, else `URSULA_LOG`, else `RUST_LOG`, else `info`.
///
/// On a terminal the output is coloured; anywhere else (a pipe, a file, journald) it is one
/// plain line per event. Under journald (`JOURNAL_STREAM` set) the timestamp is left out
/// because the journal stamps every line itself.
fn init_logging(flag: Option<&str>) -> Result<(), InvalidLogLevel> {
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
        .map_err(|source| InvalidLogLevel { spec, source })?;
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

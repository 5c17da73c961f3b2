//! `ursula`: the Durable Streams server.

mod attrs;
mod batch;
mod buckets;
mod config;
mod conn;
mod cores;
mod ext;
mod fork;
mod handlers;
mod http;
mod records;
mod routes;
mod snapshots;
mod sse;

use clap::Parser;

use config::{Cli, Command, Config};

fn main() {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Server(args) => {
            let config = match Config::resolve(args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ursula: {e}");
                    std::process::exit(2);
                }
            };
            if let Err(e) = cores::run(config) {
                eprintln!("ursula: {e}");
                std::process::exit(1);
            }
        }
    }
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

//! The `ursula` command-line tool: the operator's client of any Ursula server.
//!
//! `ursula ls`, `stat`, `cat`, `tail`, `append`, `create`, `delete`, `snapshot`,
//! `retain` and `haproxy-map` are subcommands of the `ursula` binary, beside `ursula server` and `ursula
//! restore`: one binary to install and one version to match, while this crate keeps the
//! client apart from the server's code (the binary only hands a parsed [`Command`] to
//! [`run`]).
//!
//! Everything goes over the server's public HTTP API (`docs/api.md`), blocking, one
//! connection at a time, HTTP or HTTPS, with an optional bearer token. Human output by
//! default; `--json` prints JSON for scripts.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::{Args, Subcommand};

mod append;
mod client;
mod error;
mod haproxy_map;
mod list;
mod manage;
mod output;
mod read;
mod snapshot;
mod stat;
mod stream;
mod target;
pub mod wire;

pub use error::{Error, Refusal};

/// The server the commands talk to when neither `--server` nor `URSULA_URL` names one: the
/// address `ursula server` listens on by default.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:4437";

/// The client commands of the `ursula` binary.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the buckets, or the streams of one bucket.
    #[command(visible_alias = "list")]
    Ls(ListArgs),
    /// Show what the server knows of a stream: type, offsets, records, lifetime, snapshot.
    Stat(StatArgs),
    /// Print a stream from a starting point (default: its beginning) up to its end.
    Cat(CatArgs),
    /// Follow a stream: print what is appended to it as it arrives.
    Tail(TailArgs),
    /// Append standard input to a stream, one message per line.
    Append(AppendArgs),
    /// Create a bucket (`BUCKET`) or a stream (`BUCKET/STREAM`, `/v1/stream/ID`).
    Create(CreateArgs),
    /// Delete a stream, or an empty bucket.
    Delete(DeleteArgs),
    /// Publish or read a stream's snapshot: the application's state at an offset.
    Snapshot(SnapshotArgs),
    /// Drop a stream's history before a point at or before its snapshot.
    Retain(RetainArgs),
    /// Keep an HAProxy lane map current with the lanes a cluster's hosts serve.
    HaproxyMap(haproxy_map::HaproxyMapArgs),
}

/// Run a client command; returns the process exit status (0 success, 1 failure). Errors are
/// printed to stderr as one line. A closed stdout (`ursula cat … | head`) ends the command
/// quietly with status 0, as it does for `cat`.
pub fn run(command: Command) -> i32 {
    match dispatch(command) {
        Ok(()) => 0,
        Err(Error::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("ursula: {e}");
            1
        }
    }
}

fn dispatch(command: Command) -> Result<(), Error> {
    match command {
        Command::Ls(args) => list::run(args),
        Command::Stat(args) => stat::run(args),
        Command::Cat(args) => read::cat(args),
        Command::Tail(args) => read::tail(args),
        Command::Append(args) => append::run(args),
        Command::Create(args) => manage::create(args),
        Command::Delete(args) => manage::delete(args),
        Command::Snapshot(SnapshotArgs {
            action: SnapshotAction::Put(args),
        }) => snapshot::put(args),
        Command::Snapshot(SnapshotArgs {
            action: SnapshotAction::Get(args),
        }) => snapshot::get(args),
        Command::Retain(args) => snapshot::retain(args),
        Command::HaproxyMap(args) => haproxy_map::run(args),
    }
}

/// Where the server is and how to reach it; every command takes these.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Connection")]
pub struct Connection {
    /// Server URL, `http://` or `https://` (a path after the address is kept as a prefix of
    /// every request) [env: URSULA_URL] [default: http://127.0.0.1:4437]
    #[arg(long, short = 's', value_name = "URL")]
    pub server: Option<String>,
    /// Bearer token [env: URSULA_TOKEN]
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the bearer token: its first line that is not blank or a `#` comment
    /// [env: URSULA_TOKEN_FILE]
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// PEM certificates to trust instead of the system's roots: a private CA, or a
    /// self-signed server certificate itself [env: URSULA_CACERT]
    #[arg(long, value_name = "PATH")]
    pub cacert: Option<PathBuf>,
    /// Print JSON instead of text: one object, or one per line for `cat` and `tail`
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// The bucket whose streams to list; without it, the buckets are listed.
    pub bucket: Option<String>,
    /// Only names that start with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// List at most this many (default: all, fetched a page of 1000 at a time).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct StatArgs {
    /// `BUCKET/STREAM`, or `/v1/stream/ID` for a stream of the compat surface.
    pub stream: String,
    #[command(flatten)]
    pub connection: Connection,
}

/// Where a read starts; at most one of these.
#[derive(Args, Debug, Default, Clone)]
#[group(multiple = false)]
pub struct StartArgs {
    /// Start at this offset: a `Stream-Next-Offset` value (or its number), `-1` for the
    /// beginning, `now` for the end.
    #[arg(long, value_name = "OFFSET", allow_hyphen_values = true)]
    pub offset: Option<String>,
    /// Start at this record number (JSON streams in a bucket).
    #[arg(long, value_name = "N")]
    pub record: Option<u64>,
    /// Start this many records before the end (JSON streams in a bucket).
    #[arg(long, value_name = "N")]
    pub last: Option<u64>,
}

#[derive(Args, Debug)]
pub struct CatArgs {
    /// `BUCKET/STREAM`, or `/v1/stream/ID`.
    pub stream: String,
    #[command(flatten)]
    pub start: StartArgs,
    /// Stop after this many records (JSON streams) or lines (text streams).
    #[arg(long, short = 'n', value_name = "N")]
    pub count: Option<u64>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    /// `BUCKET/STREAM`, or `/v1/stream/ID`.
    pub stream: String,
    // Without a start, a tail starts at the end: only what is appended from now on.
    #[command(flatten)]
    pub start: StartArgs,
    /// Stop after this many records (JSON streams) or lines (text streams).
    #[arg(long, short = 'n', value_name = "N")]
    pub count: Option<u64>,
    /// Stop after this long (`30s`, `5m`, `1h`, or seconds); without it, tail runs until
    /// the stream is closed or deleted, or it is interrupted.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct AppendArgs {
    /// `BUCKET/STREAM`, or `/v1/stream/ID`. On a JSON stream each line is one record
    /// (blank lines are skipped); on any other stream each line, with its newline, is one
    /// message.
    pub stream: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// `BUCKET` for a bucket; `BUCKET/STREAM` or `/v1/stream/ID` for a stream.
    pub target: String,
    /// The stream's content type; `json`, `text` and `binary` stand for
    /// `application/json`, `text/plain` and `application/octet-stream` (the server's default).
    #[arg(long, short = 't', value_name = "TYPE")]
    pub content_type: Option<String>,
    /// Delete the stream this long after its last write (`30s`, `12h`, `7d`, or seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "expires_at")]
    pub ttl: Option<std::time::Duration>,
    /// Delete the stream at this time (RFC 3339, e.g. `2030-01-01T00:00:00Z`).
    #[arg(long, value_name = "TIME")]
    pub expires_at: Option<String>,
    /// The stream's attributes, a JSON object (`{"title":"App events"}`; streams in a bucket).
    #[arg(long, value_name = "JSON")]
    pub attrs: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// `BUCKET` (it must hold no streams), `BUCKET/STREAM` or `/v1/stream/ID`.
    pub target: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub action: SnapshotAction,
}

#[derive(Subcommand, Debug)]
pub enum SnapshotAction {
    /// Publish standard input as the stream's snapshot at a point.
    Put(SnapshotPutArgs),
    /// Print the stream's snapshot, as it was published.
    Get(SnapshotGetArgs),
}

/// A point in a stream: exactly one of these.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct PointArgs {
    /// At this offset: a `Stream-Next-Offset` value, or its number. (`-1` is let through
    /// to be refused with the reason, as `now` is.)
    #[arg(long, value_name = "OFFSET", allow_hyphen_values = true)]
    pub offset: Option<String>,
    /// At the start of this record (JSON streams); the record tail means the end.
    #[arg(long, value_name = "N")]
    pub record: Option<u64>,
}

#[derive(Args, Debug)]
pub struct SnapshotPutArgs {
    /// `BUCKET/STREAM`.
    pub stream: String,
    /// Where the snapshot's state stands: it covers the stream before this point.
    #[command(flatten)]
    pub at: PointArgs,
    /// The snapshot's content type (default `application/octet-stream`); `json`, `text`
    /// and `binary` are short for the three common types.
    #[arg(long, short = 't', value_name = "TYPE")]
    pub content_type: Option<String>,
    /// Publish only if the current snapshot has this digest.
    #[arg(long = "match", value_name = "DIGEST")]
    pub match_digest: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct SnapshotGetArgs {
    /// `BUCKET/STREAM`.
    pub stream: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct RetainArgs {
    /// `BUCKET/STREAM`.
    pub stream: String,
    /// The new first point kept; at or before the snapshot's.
    #[command(flatten)]
    pub at: PointArgs,
    #[command(flatten)]
    pub connection: Connection,
}

/// A duration as an operator writes one: `90`, `90s`, `15m`, `12h` or `7d`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let seconds_per_unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: expected a number with s, m, h or d")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(seconds_per_unit))
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: expected a number with s, m, h or d"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit_or_mean_seconds() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "m", "1.5h", "-3s", "3w", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

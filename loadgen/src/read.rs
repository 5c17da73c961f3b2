//! `read`: catch-up reads of pre-filled streams. Each reader starts at `offset=-1`,
//! follows `Stream-Next-Offset` until `Stream-Up-To-Date`, then starts over.
//! `--view records|envelope` reads a JSON stream by record ordinals instead (Ursula's
//! record coordinates, bucketed surface), following `Stream-Record-Next`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::Window;
use crate::common::{
    err_key, join_merged, merge_all, parse_size, pattern, run_cores, setup_append, setup_then_sync,
    status_key, Common, Target,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct ReadArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of pre-filled streams.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Readers per stream (one connection each).
    #[arg(long, default_value_t = 1)]
    pub readers_per_stream: usize,
    /// Bytes written into each stream before reading.
    #[arg(long, default_value = "32m", value_parser = parse_size)]
    pub prefill: usize,
    /// Size of each pre-fill append.
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    pub append_size: usize,
    /// Optional `max_bytes` on every read (the server caps responses at 8 MiB anyway).
    #[arg(long, value_parser = parse_size)]
    pub max_bytes: Option<usize>,
    /// How to read: `bytes` (offset reads of an octet-stream), or a JSON stream read by
    /// offsets (`ndjson`), by `records` (whole records) or as `envelope`s; the record views
    /// need the bucketed surface.
    #[arg(long, value_enum, default_value_t = View::Bytes)]
    pub view: View,
    /// Bytes per JSON record when `--view` is records or envelope.
    #[arg(long, default_value_t = 200)]
    pub record_size: usize,
    /// Read a stream that already exists (from an earlier run with the same `--prefix` and
    /// `--run-id`) as it is, without another pre-fill: repeated short runs then measure
    /// steady reads, not a write burst at the start of each.
    #[arg(long)]
    pub reuse: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum View {
    Bytes,
    /// Offset reads of the same JSON data the record views read.
    Ndjson,
    Records,
    Envelope,
}

/// A JSON array of records of about `size` bytes each, `n` bytes in total at most.
fn json_records(stream: u64, seq: u64, n: usize, size: usize) -> Bytes {
    let filler = "x".repeat(size.saturating_sub(40).max(1));
    let mut out = String::from("[");
    let mut i = 0u64;
    while out.len() + size + 2 <= n.max(size + 2) {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{{\"s\":{stream},\"q\":{seq},\"i\":{i},\"f\":\"{filler}\"}}"
        ));
        i += 1;
    }
    out.push(']');
    Bytes::from(out)
}

pub fn run(args: &ReadArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0
        || args.readers_per_stream == 0
        || args.prefill == 0
        || args.append_size == 0
    {
        return Err(
            "--streams, --readers-per-stream, --prefill and --append-size must be > 0".into(),
        );
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let my_streams: Vec<usize> = ctx.mine(a.streams).collect();
            let setup = async {
                let mut c = Conn::new(t.addr, timeout);
                t.ensure_bucket(&mut c).await?;
                for &i in &my_streams {
                    let path = t.stream_path(&t.stream_name("read", i));
                    let json = a.view != View::Bytes;
                    let ct = if json {
                        "application/json"
                    } else {
                        "application/octet-stream"
                    };
                    let created = t.create_stream(&mut c, &path, ct).await?;
                    let mut left = if created || !a.reuse { a.prefill } else { 0 };
                    let mut seq = 0u64;
                    while left > 0 {
                        let n = left.min(a.append_size);
                        let body = if json {
                            json_records(i as u64, seq, n, a.record_size)
                        } else {
                            Bytes::from(pattern(i as u64, seq, n))
                        };
                        setup_append(&mut c, &path, ct, Body::Shared(body)).await?;
                        left -= n;
                        seq += 1;
                    }
                }
                Ok(())
            };
            setup_then_sync(&ctx, setup).await?;
            // All streams are filled once every core passed the barrier.
            let win = ctx.window(a.common.warmup, a.common.duration);
            let mut tasks = Vec::new();
            for r in ctx.mine(a.streams * a.readers_per_stream) {
                let path = t.stream_path(&t.stream_name("read", r % a.streams));
                let conn = Conn::new(t.addr, timeout);
                tasks.push(monoio::spawn(reader(conn, path, a.max_bytes, a.view, win)));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "read request",
        latency_of: "catch-up read request",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn reader(
    mut conn: Conn,
    path: String,
    max_bytes: Option<usize>,
    view: View,
    win: Window,
) -> Stats {
    let mut st = Stats::default();
    let mut offset = String::from("-1");
    let extra = max_bytes
        .map(|m| format!("&max_bytes={m}"))
        .unwrap_or_default();
    let mut record = 0u64;
    while !win.over() {
        let url = match view {
            View::Bytes | View::Ndjson => format!("{path}?offset={offset}{extra}"),
            View::Records => format!("{path}?record={record}"),
            View::Envelope => format!("{path}?record={record}&record_view=envelope"),
        };
        let t0 = Instant::now();
        let r = conn.get(&url).await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        if counted {
            st.requests += 1;
        }
        match r {
            Ok(resp) if resp.status == 200 => {
                if counted {
                    st.ops += 1;
                    st.bytes += resp.body.len() as u64;
                    st.record(t1 - t0);
                }
                if matches!(view, View::Records | View::Envelope) {
                    record = match resp.record_next {
                        Some(next) if !resp.up_to_date => next,
                        Some(_) => {
                            if counted {
                                st.count("full_passes", 1);
                            }
                            0
                        }
                        None => {
                            if counted {
                                st.error("missing Stream-Record-Next");
                            }
                            0
                        }
                    };
                }
                match resp.next_offset {
                    Some(next) if !resp.up_to_date => offset = next,
                    Some(_) => {
                        if counted {
                            st.count("full_passes", 1);
                        }
                        offset = String::from("-1");
                    }
                    None => {
                        if counted {
                            st.error("missing Stream-Next-Offset");
                        }
                        offset = String::from("-1");
                    }
                }
                conn.recycle(resp.body);
            }
            Ok(resp) => {
                if counted {
                    st.error(status_key(resp.status));
                }
                offset = String::from("-1");
            }
            Err(e) => {
                if counted {
                    st.error(err_key(&e));
                }
                offset = String::from("-1");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

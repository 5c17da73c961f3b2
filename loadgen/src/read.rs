//! `read`: catch-up reads of pre-filled streams. Each reader starts at `offset=-1`,
//! follows `Stream-Next-Offset` until `Stream-Up-To-Date`, then starts over.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::Window;
use crate::common::{
    err_key, merge_all, parse_size, pattern, run_cores, setup_append, setup_then_sync, status_key,
    Common, Target,
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
                    let ct = "application/octet-stream";
                    t.create_stream(&mut c, &path, ct).await?;
                    let mut left = a.prefill;
                    let mut seq = 0u64;
                    while left > 0 {
                        let n = left.min(a.append_size);
                        let body = Bytes::from(pattern(i as u64, seq, n));
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
                tasks.push(monoio::spawn(reader(conn, path, a.max_bytes, win)));
            }
            let mut parts = Vec::with_capacity(tasks.len());
            for t in tasks {
                parts.push(t.await);
            }
            Ok(merge_all(parts))
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

async fn reader(mut conn: Conn, path: String, max_bytes: Option<usize>, win: Window) -> Stats {
    let mut st = Stats::default();
    let mut offset = String::from("-1");
    let extra = max_bytes
        .map(|m| format!("&max_bytes={m}"))
        .unwrap_or_default();
    while !win.over() {
        let url = format!("{path}?offset={offset}{extra}");
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

//! `write`: N streams, closed-loop writers. By default one writer per stream on its own
//! keep-alive connection; with `--spread`, a fixed pool of connections (a gateway's or a
//! collector's shape) where every connection sends to every stream in turn.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::{
    err_key, merge_all, run_cores, setup_then_sync, status_key, Common, Rotation, Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct WriteArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of streams; one writer (and connection) per stream unless `--spread`.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Gateway shape: a fixed pool of `--connections` keep-alive connections, each
    /// sending to every stream in turn, instead of one connection per stream.
    #[arg(long)]
    pub spread: bool,
    /// Connections in the `--spread` pool (default: as many as streams).
    #[arg(long, requires = "spread")]
    pub connections: Option<usize>,
    /// Bytes per append.
    #[arg(long, default_value = "256", value_parser = crate::common::parse_size)]
    pub payload: usize,
    /// Content type of the streams.
    #[arg(long, default_value = "application/octet-stream")]
    pub content_type: String,
}

pub fn run(args: &WriteArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    if args.connections == Some(0) {
        return Err("--connections must be at least 1".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let senders = if a.spread {
                let conns = a.connections.unwrap_or(a.streams);
                let setup =
                    t.spread_pool(&ctx, "write", a.streams, conns, &a.content_type, timeout);
                let pool = setup_then_sync(&ctx, setup).await?;
                pool.conns
                    .into_iter()
                    .map(|(c, first)| (c, Rotation::starting_at(pool.paths.clone(), first)))
                    .collect::<Vec<_>>()
            } else {
                let mine: Vec<usize> = ctx.mine(a.streams).collect();
                let setup = t.connect_streams("write", &mine, |i| i, &a.content_type, timeout);
                let conns = setup_then_sync(&ctx, setup).await?;
                conns
                    .into_iter()
                    .map(|(c, path)| (c, Rotation::one(path)))
                    .collect()
            };
            let win = ctx.window(a.common.warmup, a.common.duration);
            let payload = Bytes::from(crate::common::pattern(0, 0, a.payload));
            let ct: Rc<str> = Rc::from(a.content_type.as_str());
            let mut tasks = Vec::with_capacity(senders.len());
            for (conn, route) in senders {
                let payload = payload.clone();
                let ct = ct.clone();
                tasks.push(monoio::spawn(writer(conn, route, ct, payload, win)));
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
        op: "append",
        latency_of: "append request",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn writer(
    mut conn: Conn,
    mut route: Rotation,
    ct: Rc<str>,
    payload: Bytes,
    win: Window,
) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", &*ct)];
    while !win.over() {
        let t0 = Instant::now();
        let r = conn
            .request(
                "POST",
                route.advance(),
                &headers,
                Body::Shared(payload.clone()),
            )
            .await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        match r {
            Ok(resp) if (200..300).contains(&resp.status) => {
                if counted {
                    st.requests += 1;
                    st.ops += 1;
                    st.bytes += payload.len() as u64;
                    st.record(t1 - t0);
                }
            }
            Ok(resp) => st.failed(counted, status_key(resp.status)),
            Err(e) => {
                st.failed(counted, err_key(&e));
                // Do not spin on a dead server.
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

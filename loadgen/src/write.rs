//! `write`: N streams, one closed-loop writer per stream (own keep-alive connection).

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::Window;
use crate::common::{err_key, merge_all, run_cores, setup_then_sync, status_key, Common, Target};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct WriteArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of streams; one writer (and connection) per stream.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
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
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let mine: Vec<usize> = ctx.mine(a.streams).collect();
            let setup = t.connect_streams("write", &mine, |i| i, &a.content_type, timeout);
            let conns = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let payload = Bytes::from(crate::common::pattern(0, 0, a.payload));
            let ct: Rc<str> = Rc::from(a.content_type.as_str());
            let mut tasks = Vec::with_capacity(conns.len());
            for (conn, path) in conns {
                let payload = payload.clone();
                let ct = ct.clone();
                tasks.push(monoio::spawn(writer(conn, path, ct, payload, win)));
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

async fn writer(mut conn: Conn, path: String, ct: Rc<str>, payload: Bytes, win: Window) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", &*ct)];
    while !win.over() {
        let t0 = Instant::now();
        let r = conn
            .request("POST", &path, &headers, Body::Shared(payload.clone()))
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

//! `head`: N connections each sending closed-loop HEAD requests over a set of streams, the
//! metadata request clients use to find a stream's tail and incarnation.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::common::Window;
use crate::common::{
    err_key, join_merged, merge_all, run_cores, setup_then_sync, status_key, Common, Target,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct HeadArgs {
    #[command(flatten)]
    pub common: Common,
    /// Concurrent connections, each with one request in flight.
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Streams the requests are spread over (created first).
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
}

pub fn run(args: &HeadArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.connections == 0 || args.streams == 0 {
        return Err("--connections and --streams must be at least 1".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let mine: Vec<usize> = ctx.mine(a.connections).collect();
            let setup = t.connect_streams(
                "head",
                &mine,
                |i| i % a.streams,
                "application/octet-stream",
                timeout,
            );
            let conns = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let mut tasks = Vec::with_capacity(conns.len());
            for (conn, path) in conns {
                tasks.push(monoio::spawn(header(conn, path, win)));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "head",
        latency_of: "HEAD request",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn header(mut conn: Conn, path: String, win: Window) -> Stats {
    let mut st = Stats::default();
    while !win.over() {
        let t0 = Instant::now();
        let r = conn.request("HEAD", &path, &[], Body::None).await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        if !counted {
            if !matches!(&r, Ok(resp) if (200..300).contains(&resp.status)) {
                st.count("warmup_errors", 1);
            }
            continue;
        }
        st.requests += 1;
        match r {
            Ok(resp) if resp.status == 200 => {
                st.ops += 1;
                st.record(t1 - t0);
            }
            Ok(resp) => st.error(status_key(resp.status)),
            Err(e) => {
                st.error(err_key(&e));
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

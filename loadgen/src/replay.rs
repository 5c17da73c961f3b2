//! `replay`: N clients, each with its own stream pre-filled with `events` x `event_size`
//! appends, repeatedly replays it from `offset=-1` until `Stream-Up-To-Date`. The
//! latency is the time to the full replay (all requests it takes).

use std::time::{Duration, Instant};

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
pub struct ReplayArgs {
    #[command(flatten)]
    pub common: Common,
    /// Clients, each with its own stream and connection.
    #[arg(long, default_value_t = 100)]
    pub clients: usize,
    /// Events (appends) per stream.
    #[arg(long, default_value_t = 200)]
    pub events: usize,
    /// Bytes per event.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    pub event_size: usize,
}

pub fn run(args: &ReplayArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.clients == 0 || args.events == 0 || args.event_size == 0 {
        return Err("--clients, --events and --event-size must be > 0".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let mine: Vec<usize> = ctx.mine(a.clients).collect();
            let setup = async {
                let mut c = Conn::new(t.addr, timeout);
                t.ensure_bucket(&mut c).await?;
                drop(c);
                // Pre-fill concurrently: one task per client stream.
                let mut tasks = Vec::new();
                for &i in &mine {
                    let t = t.clone();
                    let (events, size) = (a.events, a.event_size);
                    tasks.push(monoio::spawn(async move {
                        let mut c = Conn::new(t.addr, timeout);
                        let path = t.stream_path(&t.stream_name("replay", i));
                        let ct = "application/octet-stream";
                        t.create_stream(&mut c, &path, ct).await?;
                        for e in 0..events {
                            let body = pattern(i as u64, e as u64, size);
                            setup_append(&mut c, &path, ct, Body::Slice(&body)).await?;
                        }
                        Ok::<_, String>((c, path))
                    }));
                }
                let mut out = Vec::new();
                let mut first_err = None;
                for t in tasks {
                    match t.await {
                        Ok(v) => out.push(v),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(out),
                }
            };
            let clients = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let expect = (a.events * a.event_size) as u64;
            let mut tasks = Vec::new();
            for (c, path) in clients {
                tasks.push(monoio::spawn(client(c, path, expect, win)));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "replay",
        latency_of: "full replay (offset=-1 until Stream-Up-To-Date)",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn client(mut conn: Conn, path: String, expect: u64, win: Window) -> Stats {
    let mut st = Stats::default();
    'replays: while !win.over() {
        let t0 = Instant::now();
        let mut offset = String::from("-1");
        let mut got = 0u64;
        let mut requests = 0u64;
        // Bounded: a replay of `expect` bytes never needs more requests than this.
        for _ in 0..(expect / 1024 + 16) {
            let r = conn.get(&format!("{path}?offset={offset}")).await;
            requests += 1;
            let counted = win.counts(Instant::now());
            match r {
                Ok(resp) if resp.status == 200 => {
                    got += resp.body.len() as u64;
                    let up_to_date = resp.up_to_date;
                    let next = resp.next_offset.clone();
                    conn.recycle(resp.body);
                    match next {
                        Some(n) if !up_to_date => offset = n,
                        Some(_) => {
                            let t1 = Instant::now();
                            if win.counts(t1) {
                                st.requests += requests;
                                if got == expect {
                                    st.ops += 1;
                                    st.bytes += got;
                                    st.record(t1 - t0);
                                } else {
                                    st.error("wrong replay length");
                                }
                            }
                            continue 'replays;
                        }
                        None => {
                            if counted {
                                st.requests += requests;
                                st.error("missing Stream-Next-Offset");
                            }
                            continue 'replays;
                        }
                    }
                }
                Ok(resp) => {
                    if counted {
                        st.requests += requests;
                        st.error(status_key(resp.status));
                    }
                    continue 'replays;
                }
                Err(e) => {
                    if counted {
                        st.requests += requests;
                        st.error(err_key(&e));
                    }
                    monoio::time::sleep(Duration::from_millis(10)).await;
                    continue 'replays;
                }
            }
        }
        if win.counts(Instant::now()) {
            st.requests += requests;
            st.error("replay did not finish");
        }
    }
    st
}

//! `write`: N streams, closed-loop writers. By default one writer per stream on its own
//! keep-alive connection; with `--spread`, a fixed pool of connections (a gateway's or a
//! collector's shape) where every connection sends to every stream in turn.
//!
//! With `--rate`, the writers offer a fixed load instead of as much as the server takes:
//! each sends on its own schedule, and an append's latency runs from the time it was due,
//! so a server that falls behind shows the queueing in its percentiles (as wrk2 does). This
//! is the shape for comparing CPU per append between servers or core counts at one load,
//! which saturation cannot do: there, whoever runs faster also batches more.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::{
    err_key, merge_all, run_cores, setup_then_sync, status_key, Common, Rotation, Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::{Check, Stats};
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
    /// Offered load in appends per second over all writers, each writer paced evenly
    /// (default: closed loop, every writer sends as soon as its previous append is answered).
    #[arg(long)]
    pub rate: Option<f64>,
}

/// One writer's schedule under `--rate`: the next append is due at `next`, then every
/// `interval`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pace {
    next: Instant,
    interval: Duration,
}

impl Pace {
    /// Writer `index` of `writers` sharing `rate` appends/s: the writers' first appends are
    /// spread over one interval so the load arrives evenly rather than in bursts.
    fn of(index: usize, writers: usize, rate: f64, start: Instant) -> Pace {
        let interval = Duration::from_secs_f64(writers as f64 / rate);
        Pace {
            next: start + interval.mul_f64(index as f64 / writers as f64),
            interval,
        }
    }
}

pub fn run(args: &WriteArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    if args.connections == Some(0) {
        return Err("--connections must be at least 1".into());
    }
    if let Some(rate) = args.rate {
        if !(rate > 0.0 && rate <= 10_000_000.0) {
            return Err("--rate must be in (0, 10000000] appends/s".into());
        }
    }
    let writers = match args.spread {
        true => args.connections.unwrap_or(args.streams),
        false => args.streams,
    };
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
            for (k, (conn, route)) in senders.into_iter().enumerate() {
                let payload = payload.clone();
                let ct = ct.clone();
                // Senders are dealt to cores round-robin, so this is the writer's global index.
                let index = ctx.core + k * ctx.cores;
                let pace = a.rate.map(|r| Pace::of(index, writers, r, win.start));
                tasks.push(monoio::spawn(writer(conn, route, ct, payload, win, pace)));
            }
            let mut parts = Vec::with_capacity(tasks.len());
            for t in tasks {
                parts.push(t.await);
            }
            Ok(merge_all(parts))
        }
    })?;
    let stats = merge_all(parts);
    let checks = args
        .rate
        .map(|rate| offered_load_held(rate, stats.ops, args.common.duration))
        .into_iter()
        .collect();
    Ok(Outcome {
        stats,
        op: "append",
        latency_of: if args.rate.is_some() {
            "append, from when it was due"
        } else {
            "append request"
        },
        checks,
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

/// Whether the server kept up with `--rate`: a server that answers more slowly than the
/// offered load has its appends queue, and its CPU per append is then measured at a lower
/// load than the other servers'.
fn offered_load_held(rate: f64, ops: u64, window: Duration) -> Check {
    let achieved = ops as f64 / window.as_secs_f64().max(1e-9);
    Check {
        name: "offered load held".into(),
        passed: achieved >= 0.97 * rate,
        detail: format!("{achieved:.0} of {rate:.0} appends/s"),
    }
}

async fn writer(
    mut conn: Conn,
    mut route: Rotation,
    ct: Rc<str>,
    payload: Bytes,
    win: Window,
    mut pace: Option<Pace>,
) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", &*ct)];
    while !win.over() {
        let t0 = match pace.as_mut() {
            Some(p) => {
                let at = p.next;
                if at >= win.end {
                    break;
                }
                let now = Instant::now();
                if at > now {
                    monoio::time::sleep(at - now).await;
                }
                p.next = at + p.interval;
                // Late or not, the append's latency runs from when it was due.
                at
            }
            None => Instant::now(),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_writers_share_the_rate_and_start_spread_over_one_interval() {
        let start = Instant::now();
        let paces: Vec<Pace> = (0..4).map(|i| Pace::of(i, 4, 1000.0, start)).collect();
        // 4 writers sharing 1,000 appends/s: each sends every 4 ms.
        for p in &paces {
            assert_eq!(p.interval, Duration::from_millis(4));
        }
        let offsets: Vec<Duration> = paces.iter().map(|p| p.next - start).collect();
        assert_eq!(
            offsets,
            [0, 1, 2, 3].map(Duration::from_millis),
            "first appends 1 ms apart, so the load arrives every 1 ms"
        );
    }

    #[test]
    fn a_server_below_the_offered_load_fails_the_check() {
        let window = Duration::from_secs(10);
        assert!(offered_load_held(1000.0, 9_800, window).passed);
        let behind = offered_load_held(1000.0, 9_000, window);
        assert!(!behind.passed);
        assert_eq!(behind.detail, "900 of 1000 appends/s");
    }
}

//! `batch`: many small JSON events per request. N connections, each closed-loop on its own
//! stream, or with `--spread` each sending to every one of `--streams` streams in turn (a
//! gateway's shape). On the bucketed surface a request is an append-batch body (one
//! `[u32 BE len][event]` frame per event, extensions §6) and every frame's acknowledgement
//! is checked; on the compat surface it is one JSON array POST (served by any Durable
//! Streams server). One op = one event committed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::common::{
    err_key, join_merged, merge_all, run_cores, setup_then_sync, status_key, Common, Rotation,
    Surface, Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

/// Most frames the server takes in one append-batch request (§6.1).
const MAX_FRAMES: usize = 512;

#[derive(Args, Debug, Clone, Serialize)]
pub struct BatchArgs {
    #[command(flatten)]
    pub common: Common,
    /// Connections, each with one request in flight (and its own stream unless `--spread`).
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Gateway shape: every connection sends to every one of `--streams` streams in turn.
    #[arg(long)]
    pub spread: bool,
    /// Streams shared by the `--spread` pool (default: as many as connections).
    #[arg(long, requires = "spread")]
    pub streams: Option<usize>,
    /// Events per request.
    #[arg(long, default_value_t = 100)]
    pub events: usize,
    /// Bytes per JSON event (at least 32).
    #[arg(long, default_value = "200", value_parser = crate::common::parse_size)]
    pub event_size: usize,
}

/// One JSON event of exactly `size` bytes (`size` >= 32): `{"i":N,"pad":"xxx…"}`.
pub fn json_event(i: u64, size: usize) -> Vec<u8> {
    let mut out = format!("{{\"i\":{i},\"pad\":\"").into_bytes();
    let fill = size.saturating_sub(out.len() + 2);
    out.extend(std::iter::repeat_n(b'x', fill));
    out.extend_from_slice(b"\"}");
    out
}

/// Append-batch body: one frame per event.
pub fn frames_body(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.len() + 4).sum());
    for e in events {
        out.extend_from_slice(&(e.len() as u32).to_be_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// Compat body: one JSON array holding every event.
pub fn array_body(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.push(b']');
    out
}

#[derive(Deserialize)]
struct FrameAck {
    status: u16,
}

/// Frame statuses from an append-batch `200` body, in frame order.
pub fn frame_statuses(body: &[u8]) -> Result<Vec<u16>, String> {
    let acks: Vec<FrameAck> =
        sonic_rs::from_slice(body).map_err(|e| format!("bad append-batch ack body: {e}"))?;
    Ok(acks.into_iter().map(|a| a.status).collect())
}

pub fn run(args: &BatchArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    if args.streams == Some(0) {
        return Err("--streams must be at least 1".into());
    }
    if args.events == 0 || args.events > MAX_FRAMES {
        return Err(format!("--events must be in 1..={MAX_FRAMES}"));
    }
    if args.event_size < 32 {
        return Err("--event-size must be at least 32".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let ct = "application/json";
            let framed = t.surface == Surface::Bucketed;
            let url_of = |path: &str| {
                if framed {
                    format!("{path}/append-batch")
                } else {
                    path.to_string()
                }
            };
            let senders = if a.spread {
                let streams = a.streams.unwrap_or(a.connections);
                let setup = t.spread_pool(&ctx, "batch", streams, a.connections, ct, timeout);
                let pool = setup_then_sync(&ctx, setup).await?;
                let urls: std::rc::Rc<[String]> = pool.paths.iter().map(|p| url_of(p)).collect();
                pool.conns
                    .into_iter()
                    .map(|(c, first)| (c, Rotation::starting_at(urls.clone(), first)))
                    .collect::<Vec<_>>()
            } else {
                let mine: Vec<usize> = ctx.mine(a.connections).collect();
                let setup = t.connect_streams("batch", &mine, |i| i, ct, timeout);
                let conns = setup_then_sync(&ctx, setup).await?;
                conns
                    .into_iter()
                    .map(|(c, path)| (c, Rotation::one(url_of(&path))))
                    .collect()
            };
            let win = ctx.window(a.common.warmup, a.common.duration);
            let events: Vec<Vec<u8>> = (0..a.events as u64)
                .map(|i| json_event(i, a.event_size))
                .collect();
            let event_bytes: u64 = events.iter().map(|e| e.len() as u64).sum();
            let body = Bytes::from(if framed {
                frames_body(&events)
            } else {
                array_body(&events)
            });
            let mut tasks = Vec::with_capacity(senders.len());
            for (conn, route) in senders {
                let job = Job {
                    route,
                    body: body.clone(),
                    events: a.events as u64,
                    event_bytes,
                    event_size: a.event_size as u64,
                    framed,
                };
                tasks.push(monoio::spawn(sender(conn, job, win)));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "event",
        latency_of: "batch request",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

struct Job {
    route: Rotation,
    body: Bytes,
    events: u64,
    event_bytes: u64,
    event_size: u64,
    framed: bool,
}

async fn sender(mut conn: Conn, mut job: Job, win: Window) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", "application/json")];
    while !win.over() {
        let t0 = Instant::now();
        let r = conn
            .request(
                "POST",
                job.route.advance(),
                &headers,
                Body::Shared(job.body.clone()),
            )
            .await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        match r {
            Ok(resp) if job.framed && resp.status == 200 => {
                let statuses = frame_statuses(&resp.body);
                conn.recycle(resp.body);
                if !counted {
                    continue;
                }
                st.requests += 1;
                match statuses {
                    Ok(s) if s.len() as u64 == job.events => {
                        let ok = s.iter().filter(|&&x| x == 204).count() as u64;
                        for &x in s.iter().filter(|&&x| x != 204) {
                            st.error(format!("frame {}", status_key(x)));
                        }
                        st.ops += ok;
                        st.bytes += ok * job.event_size;
                        st.record(t1 - t0);
                    }
                    Ok(_) => st.error("ack count mismatch"),
                    Err(_) => st.error("bad ack body"),
                }
            }
            Ok(resp) if !job.framed && (200..300).contains(&resp.status) => {
                conn.recycle(resp.body);
                if counted {
                    st.requests += 1;
                    st.ops += job.events;
                    st.bytes += job.event_bytes;
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
    fn events_and_bodies() {
        let e = json_event(7, 200);
        assert_eq!(e.len(), 200);
        let v: sonic_rs::Value = sonic_rs::from_slice(&e).unwrap();
        assert!(sonic_rs::JsonValueTrait::is_object(&v));
        let evs = vec![json_event(0, 40), json_event(1, 50)];
        let f = frames_body(&evs);
        assert_eq!(&f[..4], &40u32.to_be_bytes());
        assert_eq!(&f[44..48], &50u32.to_be_bytes());
        assert_eq!(f.len(), 98);
        let arr = array_body(&evs);
        let v: Vec<sonic_rs::Value> = sonic_rs::from_slice(&arr).unwrap();
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn parses_frame_acks() {
        let body = br#"[{"status":204,"stream_next_offset":"00000000000000000009","stream_record_start":0,"stream_record_next":1},{"status":409,"error_code":"stream_closed","error":"stream is closed","stream_closed":true}]"#;
        assert_eq!(frame_statuses(body).unwrap(), vec![204, 409]);
        assert!(frame_statuses(b"nope").is_err());
    }
}

//! `seek`: random reads of old offsets in streams that already exist, the way consumers
//! resuming from old checkpoints read. Each connection picks a random stream and a random
//! byte position below its tail and reads `--max-bytes` from there. Offsets must be byte
//! positions (Ursula's are); the tails come from one HEAD per stream at the start.
//!
//! Point it at the streams of an earlier `write` run (same `--prefix` and `--run-id`):
//! with a history far larger than the server's caches, nearly every read starts in data
//! and index pages that are only on disk.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use ursula_protocol::offset::{format_offset, parse_offset, OffsetParam};

use crate::common::{
    err_key, join_merged, merge_all, parse_size, run_cores, setup_then_sync, status_key, Common,
    Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct SeekArgs {
    #[command(flatten)]
    pub common: Common,
    /// Scenario whose streams are read: they are named `{prefix}-{of}-{run-id}-{i}`.
    #[arg(long, default_value = "write")]
    pub of: String,
    /// Number of those streams (`0..streams`).
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Concurrent connections, each with one read in flight.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// `max_bytes` of every read.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Read only below this fraction of each tail (0.5: the older half of the history).
    #[arg(long, default_value_t = 1.0)]
    pub below: f64,
}

pub fn run(args: &SeekArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 || args.connections == 0 || args.max_bytes == 0 {
        return Err("--streams, --connections and --max-bytes must be at least 1".into());
    }
    if !(args.below > 0.0 && args.below <= 1.0) {
        return Err("--below must be in (0, 1]".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let mine: Vec<usize> = ctx.mine(a.streams).collect();
            let setup = async {
                let mut c = Conn::new(t.addr, timeout);
                let mut streams = Vec::with_capacity(mine.len());
                for &i in &mine {
                    let path = t.stream_path(&t.stream_name(&a.of, i));
                    let tail = tail_of(&mut c, &path).await?;
                    let limit = (tail as f64 * a.below) as u64;
                    if limit > 0 {
                        streams.push((path, limit));
                    }
                }
                if streams.is_empty() && !mine.is_empty() {
                    return Err(format!(
                        "every stream of scenario `{}` is empty or missing",
                        a.of
                    ));
                }
                Ok(streams)
            };
            let streams = std::rc::Rc::new(setup_then_sync(&ctx, setup).await?);
            let win = ctx.window(a.common.warmup, a.common.duration);
            let mut tasks = Vec::new();
            for n in ctx.mine(a.connections) {
                if streams.is_empty() {
                    break;
                }
                let conn = Conn::new(t.addr, timeout);
                let seed = 0x9e37_79b9_7f4a_7c15u64 ^ ((n as u64 + 1) << 17);
                tasks.push(monoio::spawn(seeker(
                    conn,
                    streams.clone(),
                    a.max_bytes,
                    seed,
                    win,
                )));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "read",
        latency_of: "random old-offset read",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

/// The stream's tail as a byte position, from `Stream-Next-Offset` on a HEAD.
async fn tail_of(c: &mut Conn, path: &str) -> Result<u64, String> {
    let resp = c
        .request("HEAD", path, &[], Body::None)
        .await
        .map_err(|e| format!("HEAD {path}: {}", err_key(&e)))?;
    if resp.status != 200 {
        return Err(format!("HEAD {path}: {}", status_key(resp.status)));
    }
    let next = resp
        .next_offset
        .ok_or_else(|| format!("HEAD {path}: no Stream-Next-Offset"))?;
    match parse_offset(&next) {
        Ok(OffsetParam::At(pos)) => Ok(pos),
        _ => Err(format!(
            "HEAD {path}: offset {next:?} is not a byte position, so this server's offsets \
             cannot be chosen at random"
        )),
    }
}

/// xorshift64*: reproducible positions without a dependency.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

async fn seeker(
    mut conn: Conn,
    streams: std::rc::Rc<Vec<(String, u64)>>,
    max_bytes: usize,
    mut seed: u64,
    win: Window,
) -> Stats {
    let mut st = Stats::default();
    while !win.over() {
        let (path, limit) = &streams[(next_random(&mut seed) % streams.len() as u64) as usize];
        let from = next_random(&mut seed) % limit;
        let url = format!(
            "{path}?offset={}&max_bytes={max_bytes}",
            format_offset(from)
        );
        let t0 = Instant::now();
        let r = conn.get(&url).await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        if counted {
            st.requests += 1;
        }
        match r {
            Ok(resp) if resp.status == 200 && !resp.body.is_empty() => {
                if counted {
                    st.ops += 1;
                    st.bytes += resp.body.len() as u64;
                    st.record(t1 - t0);
                }
                conn.recycle(resp.body);
            }
            Ok(resp) if resp.status == 200 => {
                if counted {
                    st.error("empty body below the tail");
                }
            }
            Ok(resp) => {
                if counted {
                    st.error(status_key(resp.status));
                }
            }
            Err(e) => {
                if counted {
                    st.error(err_key(&e));
                }
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

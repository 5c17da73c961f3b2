//! `verify`: write known payloads (deterministic, varying sizes), read everything back
//! (whole stream, paged with `max_bytes`, and from sampled append offsets) and compare
//! byte-exact. Count-based, not time-based; any mismatch fails the run.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::common::{
    err_key, parse_size, pattern, run_cores, setup_then_sync, status_key, Common, Target,
};
use crate::http::{Body, Conn};
use crate::stats::{Check, Stats};
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of streams (verified concurrently).
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Appends per stream.
    #[arg(long, default_value_t = 200)]
    pub appends: usize,
    /// Largest payload; sizes vary deterministically in 1..=max.
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    pub max_payload: usize,
    /// `max_bytes` for the paged read-back pass.
    #[arg(long, default_value = "100000", value_parser = parse_size)]
    pub page_bytes: usize,
}

/// Per-stream result: stats plus the first problem found, if any.
struct StreamResult {
    stats: Stats,
    problem: Option<String>,
}

pub fn run(args: &VerifyArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 || args.appends == 0 || args.max_payload == 0 || args.page_bytes == 0 {
        return Err("--streams, --appends, --max-payload and --page-bytes must be > 0".into());
    }
    let started = Instant::now();
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let mut c = Conn::new(t.addr, a.common.timeout);
            setup_then_sync(&ctx, t.ensure_bucket(&mut c)).await?;
            let mut tasks = Vec::new();
            for i in ctx.mine(a.streams) {
                tasks.push(monoio::spawn(verify_stream(t.clone(), a.clone(), i)));
            }
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await);
            }
            Ok(out)
        }
    })?;
    let mut stats = Stats::default();
    let mut problems = Vec::new();
    for r in parts.into_iter().flatten() {
        stats.merge(r.stats);
        if let Some(p) = r.problem {
            problems.push(p);
        }
    }
    let verified = stats.counters.get("bytes_verified").copied().unwrap_or(0);
    let check = Check {
        name: "byte-exact read-back".into(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            format!(
                "{} streams x {} appends, {} bytes compared",
                args.streams, args.appends, verified
            )
        } else {
            format!(
                "{} stream(s) failed; first: {}",
                problems.len(),
                problems[0]
            )
        },
    };
    Ok(Outcome {
        stats,
        op: "append",
        latency_of: "append request",
        checks: vec![check],
        window: started.elapsed(),
        warmup: Duration::ZERO,
    })
}

fn payload_len(stream: usize, seq: usize, max: usize) -> usize {
    // Mix small, mid and maximal sizes deterministically.
    let h = pattern(stream as u64 ^ 0x5eed, seq as u64, 8);
    let r = u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]) as usize;
    match seq % 10 {
        0 => max,
        1 => 1,
        _ => 1 + r % max,
    }
}

async fn verify_stream(t: Target, a: VerifyArgs, i: usize) -> StreamResult {
    let mut st = Stats::default();
    let problem = verify_inner(&t, &a, i, &mut st).await.err();
    StreamResult { stats: st, problem }
}

async fn verify_inner(t: &Target, a: &VerifyArgs, i: usize, st: &mut Stats) -> Result<(), String> {
    let mut conn = Conn::new(t.addr, a.common.timeout);
    let path = t.stream_path(&t.stream_name("verify", i));
    let ct = "application/octet-stream";
    t.create_stream(&mut conn, &path, ct).await?;
    let mut expected = Vec::new();
    // (offset returned by append k, byte position after append k)
    let mut marks: Vec<(String, usize)> = Vec::with_capacity(a.appends);
    for seq in 0..a.appends {
        let body = pattern(i as u64, seq as u64, payload_len(i, seq, a.max_payload));
        let t0 = Instant::now();
        let r = conn
            .request("POST", &path, &[("Content-Type", ct)], Body::Slice(&body))
            .await;
        let lat = t0.elapsed();
        st.requests += 1;
        match r {
            Ok(resp) if (200..300).contains(&resp.status) => {
                st.ops += 1;
                st.bytes += body.len() as u64;
                st.record(lat);
                expected.extend_from_slice(&body);
                let off = resp.next_offset.ok_or_else(|| {
                    format!("{path}: append {seq} answered without Stream-Next-Offset")
                })?;
                marks.push((off, expected.len()));
            }
            Ok(resp) => {
                st.error(status_key(resp.status));
                return Err(format!("{path}: append {seq} got status {}", resp.status));
            }
            Err(e) => {
                st.error(err_key(&e));
                return Err(format!("{path}: append {seq}: {e}"));
            }
        }
    }

    // 1. Whole stream from the beginning.
    let got = read_all(&mut conn, &path, "-1", None, st).await?;
    compare(&path, "full read from -1", &got, &expected)?;
    st.count("bytes_verified", got.len() as u64);
    // 2. Paged with max_bytes.
    let got = read_all(&mut conn, &path, "-1", Some(a.page_bytes), st).await?;
    compare(&path, "paged read", &got, &expected)?;
    st.count("bytes_verified", got.len() as u64);
    // 3. From sampled offsets returned by appends (must resume exactly after that append).
    let step = (a.appends / 8).max(1);
    for k in (0..marks.len()).step_by(step) {
        let (off, pos) = &marks[k];
        let got = read_all(&mut conn, &path, off, None, st).await?;
        compare(
            &path,
            &format!("read from append {k}'s offset {off}"),
            &got,
            &expected[*pos..],
        )?;
        st.count("bytes_verified", got.len() as u64);
    }
    Ok(())
}

/// Catch-up reads from `offset` until `Stream-Up-To-Date`.
async fn read_all(
    conn: &mut Conn,
    path: &str,
    offset: &str,
    max_bytes: Option<usize>,
    st: &mut Stats,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut offset = offset.to_string();
    // Bounded: every non-final response must make progress.
    for _ in 0..1_000_000 {
        let url = match max_bytes {
            Some(m) => format!("{path}?offset={offset}&max_bytes={m}"),
            None => format!("{path}?offset={offset}"),
        };
        st.requests += 1;
        st.count("reads", 1);
        let resp = match conn.get(&url).await {
            Ok(r) => r,
            Err(e) => {
                st.error(err_key(&e));
                return Err(format!("GET {url}: {e}"));
            }
        };
        if resp.status != 200 {
            st.error(status_key(resp.status));
            return Err(format!("GET {url}: status {}", resp.status));
        }
        let next = resp
            .next_offset
            .ok_or_else(|| format!("GET {url}: no Stream-Next-Offset"))?;
        out.extend_from_slice(&resp.body);
        if resp.up_to_date {
            return Ok(out);
        }
        if resp.body.is_empty() && next == offset {
            return Err(format!("GET {url}: no progress and not up to date"));
        }
        offset = next;
    }
    Err(format!("{path}: read did not finish"))
}

fn compare(path: &str, what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    Err(format!(
        "{path}: {what}: got {} bytes, expected {}; first difference at byte {first}",
        got.len(),
        want.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_range() {
        for seq in 0..100 {
            let n = payload_len(3, seq, 1000);
            assert!((1..=1000).contains(&n));
        }
        assert_eq!(payload_len(3, 0, 77), 77);
        assert_eq!(payload_len(3, 1, 77), 1);
    }

    #[test]
    fn compare_reports_first_difference() {
        assert!(compare("p", "w", b"abc", b"abc").is_ok());
        let e = compare("p", "w", b"abXd", b"abcd").unwrap_err();
        assert!(e.contains("byte 2"), "{e}");
        let e = compare("p", "w", b"ab", b"abc").unwrap_err();
        assert!(e.contains("byte 2"), "{e}");
    }
}

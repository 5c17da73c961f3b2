//! `append-max`: closed-loop appends near the 32 MiB request limit (MB/s), then a probe
//! that a body of limit + 1 bytes is refused with `413`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::{
    err_key, join_merged, merge_all, parse_size, pattern, run_cores, setup_then_sync, status_key,
    Common, Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::{Check, Stats};
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct AppendMaxArgs {
    #[command(flatten)]
    pub common: Common,
    /// Concurrent writers (one stream each).
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Bytes per append (default: exactly the limit).
    #[arg(long, default_value = "32m", value_parser = parse_size)]
    pub size: usize,
    /// The server's request body limit; the probe sends limit + 1 bytes.
    #[arg(long, default_value = "32m", value_parser = parse_size)]
    pub limit: usize,
    /// Stop once this many bytes were appended in total (bounds server memory/disk).
    #[arg(long, default_value = "2g", value_parser = parse_size)]
    pub max_total: usize,
    /// Skip the limit + 1 probe.
    #[arg(long)]
    pub no_probe: bool,
    /// Keep the streams instead of deleting them at the end.
    #[arg(long)]
    pub keep: bool,
}

pub fn run(args: &AppendMaxArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.writers == 0 || args.size == 0 {
        return Err("--writers and --size must be > 0".into());
    }
    let a = args.clone();
    let t = target.clone();
    let per_writer = (args.max_total / args.writers).max(args.size) as u64;
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let mine: Vec<usize> = ctx.mine(a.writers).collect();
            let setup = async {
                let mut conns = Vec::new();
                for &i in &mine {
                    let mut c = Conn::new(t.addr, timeout);
                    t.ensure_bucket(&mut c).await?;
                    let path = t.stream_path(&t.stream_name("amax", i));
                    t.create_stream(&mut c, &path, "application/octet-stream")
                        .await?;
                    conns.push((c, path));
                }
                Ok(conns)
            };
            // Built before the window opens (32 MiB of pattern takes a while in debug builds).
            let body = Bytes::from(pattern(1, 1, a.size));
            let conns = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let mut tasks = Vec::new();
            for (c, path) in conns {
                tasks.push(monoio::spawn(writer(
                    c,
                    path,
                    body.clone(),
                    win,
                    per_writer,
                    a.keep,
                )));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    let mut stats = merge_all(parts);
    let mut checks = Vec::new();
    if args.size == args.limit {
        let refused = stats.errors.get("413").copied().unwrap_or(0);
        checks.push(Check {
            name: format!("append of exactly {} bytes accepted", args.limit),
            passed: stats.ops > 0 && refused == 0,
            detail: format!("{} accepted, {} refused with 413", stats.ops, refused),
        });
    }
    // The measured window may be cut short by --max-total.
    let window = match stats.counters.remove("window_us") {
        Some(us) if us > 0 => Duration::from_micros(us / args.writers.max(1) as u64),
        _ => args.common.duration,
    };
    if !args.no_probe {
        let path = target.stream_path(&target.stream_name("amax-probe", 0));
        checks.push(probe_413(target, &path, args.limit, args.common.timeout));
    }
    Ok(Outcome {
        stats,
        op: "append",
        latency_of: "append request",
        checks,
        window: window.min(args.common.duration),
        warmup: args.common.warmup,
    })
}

async fn writer(
    mut conn: Conn,
    path: String,
    body: Bytes,
    win: Window,
    budget: u64,
    keep: bool,
) -> Stats {
    let mut st = Stats::default();
    let mut sent = 0u64;
    let mut stopped_at = win.end;
    let headers = [("Content-Type", "application/octet-stream")];
    while !win.over() {
        if sent >= budget {
            stopped_at = Instant::now();
            st.count("stopped_by_max_total", 1);
            break;
        }
        let t0 = Instant::now();
        let r = conn
            .request("POST", &path, &headers, Body::Shared(body.clone()))
            .await;
        let t1 = Instant::now();
        sent += body.len() as u64;
        let counted = win.counts(t1);
        if counted {
            st.requests += 1;
        }
        match r {
            Ok(resp) if (200..300).contains(&resp.status) => {
                if counted {
                    st.ops += 1;
                    st.bytes += body.len() as u64;
                    st.record(t1 - t0);
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
    let measured = stopped_at.saturating_duration_since(win.warm_end);
    st.count("window_us", measured.as_micros() as u64);
    if !keep {
        let _ = conn.request("DELETE", &path, &[], Body::None).await;
    }
    st
}

/// Sends a `limit + 1` byte append on a fresh connection and expects `413`. The body is
/// written from a helper thread so a server that answers early and closes cannot wedge
/// the probe.
pub fn probe_413(target: &Target, path: &str, limit: usize, timeout: Duration) -> Check {
    let name = format!("append of {} bytes (limit + 1) refused with 413", limit + 1);
    match probe_inner(target.addr, &target.base, path, limit, timeout) {
        Ok(413) => Check {
            name,
            passed: true,
            detail: "413".into(),
        },
        Ok(s) => Check {
            name,
            passed: false,
            detail: format!("got status {s}"),
        },
        Err(e) => Check {
            name,
            passed: false,
            detail: e,
        },
    }
}

fn probe_inner(
    addr: SocketAddr,
    base: &str,
    path: &str,
    limit: usize,
    timeout: Duration,
) -> Result<u16, String> {
    // The stream must exist, else a server may answer 404 before looking at the size.
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let host = base.trim_start_matches("http://");
    let create = format!(
        "PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(create.as_bytes())
        .map_err(|e| format!("create: {e}"))?;
    let st = read_status(&mut s)?;
    if st != 201 && st != 200 {
        return Err(format!("creating the probe stream got status {st}"));
    }

    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        limit + 1
    );
    let writer = std::thread::spawn(move || {
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        let chunk = vec![b'x'; 1 << 20];
        let mut left = limit + 1;
        while left > 0 {
            let n = left.min(chunk.len());
            if w.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
    });
    let mut r = s;
    let st = read_status(&mut r);
    // Unblock the writer if the server stopped reading without closing.
    let _ = r.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    // Clean up (best effort).
    if let Ok(mut d) = TcpStream::connect_timeout(&addr, timeout) {
        let _ = d.set_read_timeout(Some(timeout));
        let del = format!("DELETE {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        if d.write_all(del.as_bytes()).is_ok() {
            let _ = read_status(&mut d);
        }
    }
    st
}

/// Reads until a complete non-1xx response head and returns its status.
fn read_status(s: &mut TcpStream) -> Result<u16, String> {
    let mut buf = Vec::with_capacity(4096);
    let mut tmp = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let n = s
            .read(&mut tmp)
            .map_err(|e| format!("read response: {e}"))?;
        if n == 0 {
            return Err("connection closed without a response".into());
        }
        buf.extend_from_slice(&tmp[..n]);
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&buf) {
                Ok(httparse::Status::Complete(used)) => {
                    let code = resp.code.ok_or("no status")?;
                    if (100..200).contains(&code) {
                        buf.drain(..used);
                        continue;
                    }
                    return Ok(code);
                }
                Ok(httparse::Status::Partial) => break,
                Err(e) => return Err(format!("bad response: {e}")),
            }
        }
        if buf.len() > 64 * 1024 {
            return Err("response head too large".into());
        }
    }
    Err("no response in time".into())
}

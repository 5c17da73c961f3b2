//! Test support: spawn the real binaries (`ursula`, `ursula-indexer`, `ursula-test-s3`) on
//! loopback port 0, read their `… listening on http://ADDR` lines, and talk HTTP/1.1 to
//! them with a tiny blocking client. Every child is killed when its handle drops.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

pub const INDEXER_BIN: &str = env!("CARGO_BIN_EXE_ursula-indexer");
pub const TEST_S3_BIN: &str = env!("CARGO_BIN_EXE_ursula-test-s3");

/// The `ursula` server binary: `$URSULA_BIN`, else next to our own binaries (the
/// workspace build puts every binary in one target directory).
pub fn ursula_bin() -> PathBuf {
    if let Ok(p) = std::env::var("URSULA_BIN") {
        return PathBuf::from(p);
    }
    let p = Path::new(INDEXER_BIN).with_file_name("ursula");
    assert!(
        p.exists(),
        "{} not found: build it first (cargo build --release -p ursula-server) or set URSULA_BIN",
        p.display()
    );
    p
}

pub struct Proc {
    pub child: Child,
    pub addr: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn spawn(
        bin: &Path,
        args: &[String],
        prefix: &str,
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Proc {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open log");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !sent => {
                        let _ = tx.send(line.trim_end().to_string());
                        sent = true;
                    }
                    Ok(_) => {}
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "{} printed no listening line (log {})",
                    bin.display(),
                    log.display()
                )
            });
        let addr = line
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Proc { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kill(self) {}
}

pub fn ursula(dir: &Path) -> Proc {
    ursula_with(dir, &[])
}

/// The test `ursula` with extra flags (e.g. `--max-connections`).
pub fn ursula_with(dir: &Path, extra: &[&str]) -> Proc {
    let data = dir.join("ursula-data");
    std::fs::create_dir_all(&data).expect("mkdir");
    let args: Vec<String> = [
        "server",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--storage",
        "memory",
        "--cores",
        "1",
        "--long-poll-timeout-ms",
        "2000",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    Proc::spawn(
        &ursula_bin(),
        &args,
        "ursula listening on http://",
        &[],
        &dir.join("ursula.log"),
    )
}

pub const S3_BUCKET: &str = "idx-test";

pub fn test_s3(dir: &Path) -> Proc {
    test_s3_with(dir, &[])
}

/// The test S3 server with extra flags (e.g. `--counts-file`).
pub fn test_s3_with(dir: &Path, extra: &[String]) -> Proc {
    let root = dir.join("s3-root");
    std::fs::create_dir_all(&root).expect("mkdir");
    let mut args: Vec<String> = vec![
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--root".into(),
        root.to_string_lossy().into(),
        "--bucket".into(),
        S3_BUCKET.into(),
    ];
    args.extend_from_slice(extra);
    Proc::spawn(
        Path::new(TEST_S3_BIN),
        &args,
        "ursula-test-s3 listening on http://",
        &[],
        &dir.join("s3.log"),
    )
}

/// Flags every test indexer gets: fast commits and polls so tests run in seconds.
pub fn fast_flags() -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--commit-interval-ms",
        "200",
        "--poll-interval-ms",
        "100",
        "--lease-ms",
        "3000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub enum Store<'a> {
    Dir(&'a Path),
    S3 { endpoint: &'a str, prefix: &'a str },
}

pub fn indexer(dir: &Path, name: &str, store: Store<'_>, extra: &[&str]) -> Proc {
    // Defaults from fast_flags(), unless `extra` overrides the flag.
    let mut args = Vec::new();
    for pair in fast_flags().chunks(2) {
        if !extra.contains(&pair[0].as_str()) {
            args.extend_from_slice(pair);
        }
    }
    let mut envs: Vec<(&str, &str)> = Vec::new();
    match store {
        Store::Dir(d) => {
            args.push("--store-dir".into());
            args.push(d.to_string_lossy().into());
        }
        Store::S3 { endpoint, prefix } => {
            args.extend(
                [
                    "--s3-bucket",
                    S3_BUCKET,
                    "--s3-prefix",
                    prefix,
                    "--s3-endpoint",
                    endpoint,
                    "--s3-region",
                    "us-east-1",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            let cache = dir.join(format!("cache-{name}"));
            args.push("--cache-dir".into());
            args.push(cache.to_string_lossy().into());
            envs.extend([
                ("AWS_ACCESS_KEY_ID", "testak"),
                ("AWS_SECRET_ACCESS_KEY", "testsecretkey"),
                ("AWS_EC2_METADATA_DISABLED", "true"),
            ]);
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--worker-id".into());
    args.push(name.into());
    Proc::spawn(
        Path::new(INDEXER_BIN),
        &args,
        "ursula-indexer listening on http://",
        &envs,
        &dir.join(format!("indexer-{name}.log")),
    )
}

// ---------------------------------------------------------------------------------------
// HTTP

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> sonic_rs::Value {
        sonic_rs::from_slice(&self.body).unwrap_or_else(|e| panic!("bad JSON {e}: {}", self.text()))
    }
}

/// One request on a fresh connection (`Connection: close`).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write");
    s.write_all(body).expect("write body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    parse_response(&raw, method == "HEAD")
}

fn parse_response(raw: &[u8], head: bool) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head_text = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head_text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if head {
        Vec::new()
    } else if chunked {
        let mut out = Vec::new();
        let mut r = rest;
        while let Some(i) = r.windows(2).position(|w| w == b"\r\n") {
            let n = usize::from_str_radix(String::from_utf8_lossy(&r[..i]).trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&r[i + 2..i + 2 + n]);
            r = &r[i + 2 + n + 2..];
        }
        out
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub fn get(addr: &str, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub const JSON: (&str, &str) = ("Content-Type", "application/json");
pub const NDJSON: (&str, &str) = ("Content-Type", "application/x-ndjson");

pub fn expect(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: u16,
) -> Resp {
    let r = request(addr, method, path, headers, body);
    assert_eq!(
        r.status,
        status,
        "{method} {path}: {} {}",
        r.status,
        r.text()
    );
    r
}

/// Register `id` over `stream_url` with `body_extra` (JSON members without braces).
pub fn register(ix: &str, id: &str, stream_url: &str, body_extra: &str) -> Resp {
    let body = if body_extra.is_empty() {
        format!(r#"{{"stream_url":"{stream_url}"}}"#)
    } else {
        format!(r#"{{"stream_url":"{stream_url}",{body_extra}}}"#)
    };
    request(
        ix,
        "PUT",
        &format!("/v1/indexes/{id}"),
        &[JSON],
        body.as_bytes(),
    )
}

/// Poll `f` until it returns Some, or panic after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn status(ix: &str, id: &str) -> sonic_rs::Value {
    expect(
        ix,
        "GET",
        &format!("/v1/indexes/{id}/status"),
        &[],
        b"",
        200,
    )
    .json()
}

/// `GET /v1/indexes/{id}/events?{params}`, which must answer 200.
pub fn events(ix: &str, id: &str, params: &str) -> sonic_rs::Value {
    expect(
        ix,
        "GET",
        &format!("/v1/indexes/{id}/events?{params}"),
        &[],
        b"",
        200,
    )
    .json()
}

/// Wait until the index is durable through the source's current tail.
pub fn wait_durable(ix: &str, id: &str, ursula: &str, stream_path: &str) {
    let tail = request(ursula, "HEAD", stream_path, &[], b"")
        .header("stream-next-offset")
        .expect("next offset")
        .to_string();
    wait_for(Duration::from_secs(20), "durable through the tail", || {
        let s = status(ix, id);
        (s["coverage"]["durable"].as_str() == Some(tail.as_str())).then_some(())
    });
}

/// All entries in `[from, until)` by paging with `limit`, pinning `through`.
pub fn all_entries(
    ix: &str,
    id: &str,
    from: i64,
    until: i64,
    limit: usize,
    extra: &str,
) -> Vec<sonic_rs::Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    let mut through: Option<String> = None;
    loop {
        let mut path =
            format!("/v1/indexes/{id}/events?from={from}&until={until}&limit={limit}{extra}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        if let Some(t) = &through {
            path.push_str(&format!("&through={t}"));
        }
        let v = expect(ix, "GET", &path, &[], b"", 200).json();
        through = v["coverage"]["through"].as_str().map(str::to_string);
        if let Some(arr) = v["entries"].as_array() {
            out.extend(arr.iter().cloned());
        }
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return out,
        }
    }
}

/// Fetch a message by locator through the stream server, as the spec tells clients to.
pub fn resolve(ursula: &str, stream_path: &str, offset: &str, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut off = offset.to_string();
    while (out.len() as u64) < len {
        let want = len - out.len() as u64;
        let r = expect(
            ursula,
            "GET",
            &format!("{stream_path}?offset={off}&max_bytes={want}"),
            &[],
            b"",
            200,
        );
        assert!(!r.body.is_empty(), "empty read resolving locator");
        out.extend_from_slice(&r.body);
        off = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
    }
    out
}

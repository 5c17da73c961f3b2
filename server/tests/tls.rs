//! TLS on the main listener: the real binary with a certificate this test generates (rcgen),
//! spoken to by curl trusting only that certificate (`--cacert`).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{temp_dir, Server, URSULA_BIN};

/// A self-signed certificate for 127.0.0.1 and localhost, written as PEM files.
fn write_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("generate certificate");
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    (cert, key)
}

fn start(dir: &Path, cert: &Path, key: &Path) -> Server {
    let data = dir.join("data");
    let args = [
        "server",
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "memory",
        "--cores",
        "2",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
    ];
    Server::spawn(&args, None, Duration::from_secs(30))
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl (is it installed?)")
}

/// `curl -i` over TLS with the test CA: (status, lower-cased head, body).
fn https(ca: &Path, args: &[&str]) -> (u16, String, Vec<u8>) {
    let mut all = vec!["-i", "--cacert", ca.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    let out = curl(&all);
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    split_response(&out.stdout)
}

fn split_response(mut raw: &[u8]) -> (u16, String, Vec<u8>) {
    // Skip interim `100 Continue` heads.
    while raw.starts_with(b"HTTP/1.1 100") {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("interim head");
        raw = &raw[end + 4..];
    }
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    (status, head, raw[end + 4..].to_vec())
}

#[test]
fn curl_speaks_https_to_the_server() {
    let dir = temp_dir("ursula-tls");
    let (cert, key) = write_cert(dir.path());
    let server = start(dir.path(), &cert, &key);
    assert!(
        server.base_url.starts_with("https://127.0.0.1:"),
        "listening line names https: {}",
        server.base_url
    );
    let url = format!("{}/v1/stream/tls-demo", server.base_url);

    let (status, head, _) = https(
        &cert,
        &["-X", "PUT", &url, "-H", "Content-Type: text/plain"],
    );
    assert_eq!(status, 201, "{head}");
    assert!(head.contains("\r\nstream-next-offset: "), "{head}");
    // What it created is named with the scheme it was reached by.
    assert!(head.contains(&format!("\r\nlocation: {url}\r\n")), "{head}");
    for part in ["hello ", "world"] {
        let (status, head, _) = https(
            &cert,
            &[
                "-X",
                "POST",
                &url,
                "-H",
                "Content-Type: text/plain",
                "--data-binary",
                part,
            ],
        );
        assert_eq!(status, 204, "{head}");
    }
    let (status, head, body) = https(&cert, &[&format!("{url}?offset=-1")]);
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert_eq!(body, b"hello world");

    // Over 1 MiB, so curl asks for `100 Continue` first, and the response is many records.
    let big: Vec<u8> = (0..1_500_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let big_file = dir.path().join("big.txt");
    std::fs::write(&big_file, &big).expect("write body");
    let big_url = format!("{}/v1/stream/tls-big", server.base_url);
    let (status, _, _) = https(
        &cert,
        &[
            "-X",
            "PUT",
            &big_url,
            "-H",
            "Content-Type: application/octet-stream",
        ],
    );
    assert_eq!(status, 201);
    let at = format!("@{}", big_file.display());
    let (status, _, _) = https(
        &cert,
        &[
            "-X",
            "POST",
            &big_url,
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &at,
        ],
    );
    assert_eq!(status, 204);
    let (status, _, body) = https(&cert, &[&format!("{big_url}?offset=-1")]);
    assert_eq!(status, 200);
    assert_eq!(body.len(), big.len());
    assert!(body == big, "large body read back unchanged over TLS");

    // Keep-alive over TLS: two requests, one connection.
    let ka = curl(&[
        "--cacert",
        cert.to_str().expect("utf-8"),
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{num_connects}\n",
        &format!("{url}?offset=-1"),
        &format!("{url}?offset=-1"),
    ]);
    assert!(ka.status.success(), "{ka:?}");
    assert_eq!(String::from_utf8_lossy(&ka.stdout), "200 1\n200 0\n");

    // SSE over TLS: the catch-up data event, then the control event; the response stays
    // open (live), so curl is stopped by --max-time.
    let sse = curl(&[
        "-N",
        "-i",
        "--max-time",
        "2",
        "--cacert",
        cert.to_str().expect("utf-8"),
        &format!("{url}?offset=-1&live=sse"),
    ]);
    // 28: the transfer was cut by --max-time, as expected for a live response.
    assert_eq!(sse.status.code(), Some(28), "{sse:?}");
    let (status, head, body) = split_response(&sse.stdout);
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("event: data\ndata:hello world\n"), "{body}");
    assert!(body.contains("event: control\n"), "{body}");
    assert!(body.contains("\"upToDate\":true"), "{body}");

    // Plain HTTP to the TLS port fails for that client only.
    let plain = curl(&[&url.replacen("https://", "http://", 1)]);
    assert!(!plain.status.success(), "plain HTTP must not be served");
    let mut raw = TcpStream::connect(&server.addr).expect("connect");
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    raw.write_all(b"GET /v1/stream/tls-demo?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send plain request");
    let started = Instant::now();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the server closes a plain-HTTP connection promptly"
    );
    assert!(!got.starts_with(b"HTTP/"), "no plain HTTP answer");

    // A client that does not trust the certificate is refused by curl, not served.
    let untrusted = curl(&[&url]);
    assert_eq!(untrusted.status.code(), Some(60), "{untrusted:?}");

    // The server is still serving TLS clients.
    let (status, _, body) = https(&cert, &[&format!("{url}?offset=-1")]);
    assert_eq!(status, 200);
    assert_eq!(body, b"hello world");
    let st = server
        .sigterm(Duration::from_secs(10))
        .expect("exits after SIGTERM");
    assert!(st.success(), "{st:?}");
}

#[test]
fn tls_settings_are_checked_at_start() {
    let dir = temp_dir("ursula-tls-bad");
    let (cert, key) = write_cert(dir.path());
    let other = dir.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    let (_, other_key) = write_cert(&other);
    let run = |extra: &[&Path], flags: &[&str]| {
        let mut cmd = Command::new(URSULA_BIN);
        cmd.args(["server", "--storage", "memory", "--listen", "127.0.0.1:0"]);
        for (flag, path) in flags.iter().zip(extra) {
            cmd.arg(flag).arg(path);
        }
        let out = cmd.stdin(Stdio::null()).output().expect("run ursula");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&[&cert], &["--tls-cert"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("tls_cert and tls_key must be given together"),
        "{err}"
    );
    let (code, err) = run(&[&cert, &other_key], &["--tls-cert", "--tls-key"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("cannot be used together"), "{err}");
    let (code, err) = run(&[&key, &key], &["--tls-cert", "--tls-key"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("holds no PEM certificate"), "{err}");
}

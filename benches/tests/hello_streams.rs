//! Starts the real `hello-streams` binary and checks that it serves what the loadgen's read,
//! replay and fanout scenarios rely on: create, append, catch-up reads capped at 8 MiB that
//! follow `Stream-Next-Offset` to `Stream-Up-To-Date`, and live SSE delivery.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hello-streams"))
            .args(["127.0.0.1:0", "2"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hello-streams");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read banner");
        let addr = line
            .trim()
            .strip_prefix("hello-streams listening on http://")
            .unwrap_or_else(|| panic!("unexpected banner {line:?}"))
            .to_string();
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a keep-alive connection; reads a `Content-Length` response.
fn request(conn: &mut TcpStream, method: &str, target: &str, body: &[u8]) -> Reply {
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).expect("write head");
    conn.write_all(body).expect("write body");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(n) = resp.parse(&buf).expect("parse response") {
            let headers: Vec<(String, String)> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let status = resp.code.expect("status");
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, v)| v.parse().expect("content-length"));
            let mut body = buf[n..].to_vec();
            while body.len() < len {
                let got = conn.read(&mut chunk).expect("read body");
                assert!(got > 0, "connection closed mid-body");
                body.extend_from_slice(&chunk[..got]);
            }
            assert_eq!(body.len(), len, "no pipelined bytes expected");
            return Reply {
                status,
                headers,
                body,
            };
        }
        let got = conn.read(&mut chunk).expect("read head");
        assert!(got > 0, "connection closed before the response");
        buf.extend_from_slice(&chunk[..got]);
    }
}

#[test]
fn serves_catch_up_reads_and_live_sse() {
    let server = Server::start();
    let mut conn = TcpStream::connect(&server.addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(20))).ok();

    assert_eq!(request(&mut conn, "PUT", "/v1/stream/s", b"").status, 201);
    assert_eq!(request(&mut conn, "PUT", "/v1/stream/s", b"").status, 200);
    assert_eq!(
        request(&mut conn, "POST", "/v1/stream/none", b"x").status,
        404
    );

    // 12 MiB in three appends: a read from the start is capped at 8 MiB, and the socket
    // takes such a response in several writes.
    let data: Vec<u8> = (0..12u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    for part in data.chunks(4 << 20) {
        let r = request(&mut conn, "POST", "/v1/stream/s", part);
        assert_eq!(r.status, 204);
    }
    let mut offset = "-1".to_string();
    let mut got = Vec::new();
    loop {
        let r = request(
            &mut conn,
            "GET",
            &format!("/v1/stream/s?offset={offset}"),
            b"",
        );
        assert_eq!(r.status, 200);
        assert!(r.body.len() <= 8 << 20);
        got.extend_from_slice(&r.body);
        offset = r
            .header("Stream-Next-Offset")
            .expect("next offset")
            .to_string();
        if r.header("Stream-Up-To-Date") == Some("true") {
            break;
        }
    }
    assert!(got == data, "catch-up read differs from what was appended");
    let bad = request(&mut conn, "GET", "/v1/stream/s?offset=99999999999", b"");
    assert_eq!(bad.status, 400);

    // A live reader gets each later append as one data event.
    let mut live = TcpStream::connect(&server.addr).expect("connect live");
    live.set_read_timeout(Some(Duration::from_secs(20))).ok();
    live.write_all(b"GET /v1/stream/s?offset=now&live=sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write live request");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = live.read(&mut chunk).expect("read live head");
        assert!(n > 0);
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"));
    // The reader is registered before its head is written, so an append now reaches it.
    assert_eq!(
        request(&mut conn, "POST", "/v1/stream/s", b"LG 1 2\n").status,
        204
    );
    let expect = b"event: data\ndata: LG 1 2\ndata: \n\n";
    let start = seen.len();
    while !seen[start..].windows(expect.len()).any(|w| w == expect) {
        let n = live.read(&mut chunk).expect("read live event");
        assert!(n > 0, "live response ended");
        seen.extend_from_slice(&chunk[..n]);
    }
}

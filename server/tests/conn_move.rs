//! A keep-alive connection whose requests keep going to a stream another core owns moves to
//! that core between requests. The client must not notice: one TCP connection that keeps
//! answering in order, pipelined requests that straddle the move included.

mod support;

use support::{request, temp_dir, Raw, Server};

/// Sum of `ursula_connections_moved_total` over the cores.
fn moved(addr: &str) -> u64 {
    let r = request(addr, "GET", "/__ursula/metrics", &[], b"").expect("metrics");
    assert_eq!(r.status, 200);
    r.body_str()
        .lines()
        .filter(|l| l.starts_with("ursula_connections_moved_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn append(path: &str, host: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn connections_move_to_their_streams_owner_without_the_client_noticing() {
    let dir = temp_dir("conn-move");
    let server = Server::spawn_standard(dir.path(), "disk", 2, &[], None);
    let addr = server.addr.as_str();
    assert_eq!(moved(addr), 0);

    // One stream per connection. Which core accepts a connection is up to the kernel, so
    // with 16 connections some land on the core that doesn't own their stream (all 16 on
    // the owner has probability 2^-16).
    const CONNS: usize = 16;
    const ROUNDS: usize = 4;
    const PIPELINED: usize = 5;
    let mut conns = Vec::new();
    for i in 0..CONNS {
        let path = format!("/v1/stream/move-{i}");
        let r = request(addr, "PUT", &path, &[("Content-Type", "text/plain")], b"").unwrap();
        assert_eq!(r.status, 201, "create {path}");
        conns.push((path, Raw::connect(addr), String::new()));
    }
    for round in 0..ROUNDS {
        for (path, conn, expected) in conns.iter_mut() {
            // Several requests in one write: a move after any of them has to carry the
            // bytes already read past it to the other core.
            let mut wire = String::new();
            for j in 0..PIPELINED {
                let body = format!("{round}.{j};");
                wire.push_str(&append(path, addr, &body));
                expected.push_str(&body);
            }
            conn.send(wire.as_bytes()).unwrap();
            let mut last = 0;
            for j in 0..PIPELINED {
                let r = conn
                    .response()
                    .unwrap_or_else(|e| panic!("{path} round {round} append {j}: {e}"));
                assert!(r.is_success(), "{path}: status {}", r.status);
                let next = r.next_offset().expect("Stream-Next-Offset");
                assert!(next > last, "{path}: offsets must grow");
                last = next;
            }
        }
    }
    // Reads on the same (possibly moved) connections see exactly what was appended.
    for (path, conn, expected) in conns.iter_mut() {
        let get = format!("GET {path}?offset=-1 HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        conn.send(get.as_bytes()).unwrap();
        let r = conn.response().unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body_str(), *expected, "{path}");
    }
    let n = moved(addr);
    assert!(
        (1..=CONNS as u64).contains(&n),
        "expected some of the {CONNS} connections to move once each, got {n}"
    );
}

//! Bearer-token authentication (`--auth-token-file`): read tokens may read, write tokens
//! may do anything, everything else gets 401 without details; preflights and health
//! checks need no token. Tokens limited to buckets see nothing else (404), and the file
//! reloads on SIGHUP without dropping connections.

mod support;

use std::process::{Command, Stdio};

use std::time::{Duration, Instant};

use support::{request, signal, temp_dir, Raw, Server, URSULA_BIN};

const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

#[test]
fn tokens_gate_reads_and_writes() {
    let dir = temp_dir("ursula-auth");
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        format!("# test tokens\nread:{READ}\nwrite:{WRITE}\n"),
    )
    .expect("write");
    let file = file.to_str().expect("utf-8").to_string();
    let s = Server::spawn_standard(
        &dir.path().join("data"),
        "memory",
        2,
        &["--auth-token-file", &file],
        None,
    );
    let a = s.addr.as_str();
    let req = |method: &str, path: &str, auth: Option<&str>| {
        let value = auth.map(bearer);
        let mut headers = vec![("content-type", "text/plain")];
        if let Some(v) = &value {
            headers.push(("authorization", v.as_str()));
        }
        request(a, method, path, &headers, b"data").expect("request")
    };

    for auth in [None, Some("wrong-token-0123456789"), Some("")] {
        let r = req("PUT", "/v1/stream/s", auth);
        assert_eq!(r.status, 401, "{auth:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.body_str(), "unauthorized: authentication required\n");
        assert_eq!(req("GET", "/v1/stream/s", auth).status, 401);
    }
    // A read token reads but never writes; its refusal names nothing either.
    let r = req("PUT", "/v1/stream/s", Some(READ));
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (403, "forbidden: not allowed\n")
    );
    assert_eq!(req("PUT", "/v1/stream/s", Some(WRITE)).status, 201);
    assert_eq!(req("POST", "/v1/stream/s", Some(WRITE)).status, 204);
    assert_eq!(req("POST", "/v1/stream/s", Some(READ)).status, 403);
    let r = req("GET", "/v1/stream/s?offset=-1", Some(READ));
    assert_eq!((r.status, r.body_str().as_str()), (200, "datadata"));
    assert_eq!(req("HEAD", "/v1/stream/s", Some(READ)).status, 200);
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let r = request(
        a,
        "GET",
        "/v1/stream/s",
        &[("authorization", &format!("bearer {READ}"))],
        b"",
    )
    .expect("request");
    assert_eq!(r.status, 200);
    // Preflights and health checks carry no credentials; metrics do need one.
    assert_eq!(req("OPTIONS", "/v1/stream/s", None).status, 204);
    assert_eq!(req("GET", "/__ursula/healthz", None).status, 200);
    assert_eq!(req("GET", "/__ursula/readyz", None).status, 200);
    assert_eq!(req("GET", "/__ursula/metrics", None).status, 401);
    assert_eq!(req("GET", "/__ursula/metrics", Some(READ)).status, 200);
    // The bucket listing is a read like any other.
    assert_eq!(req("GET", "/", None).status, 401);
    assert_eq!(req("GET", "/", Some(READ)).status, 200);
}

#[test]
fn a_token_without_a_scope_is_refused_at_start() {
    let dir = temp_dir("ursula-auth");
    let file = dir.path().join("tokens");
    std::fs::write(&file, "just-a-token-0123456789\n").expect("write");
    let out = Command::new(URSULA_BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--storage", "memory"])
        .arg("--auth-token-file")
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("expected read:<token> or write:<token>"),
        "{err}"
    );
    assert!(
        !err.contains("just-a-token"),
        "the token is not echoed: {err}"
    );
}

const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_A_READ: &str = "tenant-a-reader-0123456789";
const OTHER: &str = "other-token-0123456789";

fn auth_headers(token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", bearer(token)),
        ("content-type", "text/plain".to_string()),
    ]
}

fn call(addr: &str, method: &str, path: &str, token: &str, body: &[u8]) -> support::Response {
    let h = auth_headers(token);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    request(addr, method, path, &h, body).expect("request")
}

#[test]
fn a_token_limited_to_buckets_sees_nothing_else() {
    let dir = temp_dir("ursula-auth-scoped");
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        format!(
            "write:{WRITE}\nwrite:{TENANT_A} buckets=alpha,tenant-a-*\nread:{TENANT_A_READ} buckets=alpha\n"
        ),
    )
    .expect("write");
    let file = file.to_str().expect("utf-8").to_string();
    let s = Server::spawn_standard(
        &dir.path().join("data"),
        "memory",
        2,
        &["--auth-token-file", &file],
        None,
    );
    let a = s.addr.as_str();
    for b in ["alpha", "bravo", "tenant-a-web", "tenant-b-web"] {
        assert_eq!(call(a, "PUT", &format!("/{b}"), WRITE, b"").status, 201);
        assert_eq!(call(a, "PUT", &format!("/{b}/s"), WRITE, b"").status, 201);
    }
    assert_eq!(call(a, "PUT", "/v1/stream/c", WRITE, b"").status, 201);

    // In scope: everything a write token may do.
    assert_eq!(call(a, "POST", "/alpha/s", TENANT_A, b"x").status, 204);
    assert_eq!(
        call(a, "GET", "/alpha/s?offset=-1", TENANT_A, b"").status,
        200
    );
    assert_eq!(call(a, "PUT", "/tenant-a-api", TENANT_A, b"").status, 201);
    assert_eq!(
        call(a, "GET", "/tenant-a-web/streams", TENANT_A, b"").status,
        200
    );
    // Outside: 404, for streams, buckets and their sub-resources alike, existing or not,
    // and the body says no more than for a bucket that does not exist.
    for (method, path) in [
        ("POST", "/bravo/s"),
        ("GET", "/bravo/s?offset=-1"),
        ("HEAD", "/bravo/s"),
        ("DELETE", "/bravo/s"),
        ("GET", "/bravo"),
        ("GET", "/bravo/streams"),
        ("PUT", "/bravo"),
        ("PATCH", "/bravo"),
        ("PUT", "/charlie"),
        ("GET", "/tenant-b-web/s?offset=-1"),
        ("POST", "/bravo/s/append-batch"),
        ("GET", "/bravo/s/attrs"),
    ] {
        let r = call(a, method, path, TENANT_A, b"");
        assert_eq!(r.status, 404, "{method} {path}");
        if method != "HEAD" {
            assert_eq!(
                r.body_str(),
                "bucket_not_found: bucket not found\n",
                "{method} {path}"
            );
        }
    }
    // The compat surface is outside every bucket; the metrics name every bucket.
    assert_eq!(
        call(a, "GET", "/v1/stream/c?offset=-1", TENANT_A, b"").status,
        404
    );
    assert_eq!(
        call(a, "GET", "/__ursula/metrics", TENANT_A, b"").status,
        404
    );
    assert_eq!(call(a, "GET", "/__ursula/metrics", WRITE, b"").status, 200);
    // The listing shows only the token's buckets.
    let r = call(a, "GET", "/", TENANT_A, b"");
    assert_eq!(r.status, 200);
    let body = r.body_str();
    assert!(body.contains(r#""bucket_count":3"#), "{body}");
    for b in ["alpha", "tenant-a-api", "tenant-a-web"] {
        assert!(body.contains(&format!(r#""bucket_id":"{b}""#)), "{body}");
    }
    assert!(
        !body.contains("bravo") && !body.contains("tenant-b"),
        "{body}"
    );
    let all = call(a, "GET", "/", WRITE, b"").body_str();
    assert!(all.contains(r#""bucket_count":5"#), "{all}");
    // A read token limited to a bucket reads it and writes nothing; outside, still 404.
    assert_eq!(
        call(a, "GET", "/alpha/s?offset=-1", TENANT_A_READ, b"").status,
        200
    );
    assert_eq!(call(a, "POST", "/alpha/s", TENANT_A_READ, b"x").status, 403);
    assert_eq!(call(a, "POST", "/bravo/s", TENANT_A_READ, b"x").status, 404);
    assert_eq!(
        call(a, "GET", "/tenant-a-web/s?offset=-1", TENANT_A_READ, b"").status,
        404
    );
}

/// Send `GET /` with `token` on the open connection `c` and read the status.
fn listing_status(c: &mut Raw, token: &str) -> u16 {
    c.send(
        format!("GET / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n").as_bytes(),
    )
    .expect("send on the kept connection");
    c.response()
        .expect("a response on the kept connection")
        .status
}

/// Poll `check` on `c` until it is true, for at most 10 s.
fn until(c: &mut Raw, mut check: impl FnMut(&mut Raw) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check(c) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn sighup_reloads_the_tokens_and_keeps_connections() {
    let dir = temp_dir("ursula-auth-reload");
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("write:{WRITE}\n")).expect("write");
    let log = dir.path().join("stderr.log");
    let path = file.to_str().expect("utf-8").to_string();
    let s = Server::spawn_standard(
        &dir.path().join("data"),
        "memory",
        2,
        &["--auth-token-file", &path],
        Some(&log),
    );
    let mut kept = Raw::connect(&s.addr);
    kept.set_read_timeout(Duration::from_secs(10));
    assert_eq!(listing_status(&mut kept, WRITE), 200);
    assert_eq!(listing_status(&mut kept, OTHER), 401);

    // Add a token and remove the old one.
    std::fs::write(&file, format!("write:{OTHER}\n")).expect("write");
    signal(s.pid(), libc::SIGHUP);
    assert!(
        until(&mut kept, |c| listing_status(c, OTHER) == 200),
        "the added token never worked"
    );
    assert_eq!(listing_status(&mut kept, WRITE), 401);

    // A broken file keeps the tokens in force, and the log says why.
    std::fs::write(&file, format!("{WRITE}\n")).expect("write");
    signal(s.pid(), libc::SIGHUP);
    let logged = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::read_to_string(&log).is_ok_and(|l| {
            l.contains("kept the auth tokens in force")
                && l.contains("expected read:<token> or write:<token>")
        })
    });
    assert!(
        logged,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(listing_status(&mut kept, OTHER), 200);
    assert_eq!(listing_status(&mut kept, WRITE), 401);
    // So does a missing one.
    std::fs::remove_file(&file).expect("remove");
    signal(s.pid(), libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(listing_status(&mut kept, OTHER), 200);
    // The same connection served every request.
    assert_eq!(
        request(&s.addr, "GET", "/__ursula/healthz", &[], b"")
            .expect("up")
            .status,
        200
    );
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log.contains(OTHER) && !log.contains(WRITE),
        "tokens are not logged: {log}"
    );
}

//! Bearer-token authentication (`--auth-token-file`): read tokens may read, write tokens
//! may do anything, everything else gets 401 without details; preflights and health
//! checks need no token.

mod support;

use std::process::{Command, Stdio};

use support::{request, temp_dir, Server, URSULA_BIN};

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

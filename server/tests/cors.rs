//! CORS: any origin by default (what the conformance suite expects), or only the origins
//! configured with `--cors-origin` / `cors_origins`.

mod support;

use std::process::{Command, Stdio};

use support::{request, temp_dir, Response, Server, URSULA_BIN};

fn start(extra: &[&str]) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-cors");
    let server = Server::spawn_standard(dir.path(), "memory", 2, extra, None);
    (server, dir)
}

fn has_cors(r: &Response) -> bool {
    r.headers
        .iter()
        .any(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
}

fn preflight(addr: &str, origin: &str) -> Response {
    request(
        addr,
        "OPTIONS",
        "/v1/stream/c",
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        b"",
    )
    .expect("preflight")
}

#[test]
fn default_allows_any_origin() {
    let (server, _dir) = start(&[]);
    let r = request(
        &server.addr,
        "PUT",
        "/v1/stream/c",
        &[
            ("Origin", "https://anywhere.example"),
            ("Content-Type", "text/plain"),
        ],
        b"",
    )
    .expect("put");
    assert_eq!(r.status, 201);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    assert_eq!(r.header("vary"), None, "nothing varies by origin");
    // Without an Origin header too (non-browser clients).
    let r = request(&server.addr, "GET", "/v1/stream/c?offset=-1", &[], b"").expect("get");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let p = preflight(&server.addr, "https://anywhere.example");
    assert_eq!(p.status, 204);
    assert_eq!(p.header("access-control-allow-origin"), Some("*"));
    assert!(p
        .header("access-control-allow-methods")
        .is_some_and(|m| m.contains("POST")));
}

#[test]
fn configured_origins_are_reflected_and_others_get_no_cors_headers() {
    let (server, _dir) = start(&[
        "--cors-origin",
        "https://app.example.com",
        "--cors-origin",
        "http://localhost:5173",
    ]);
    let addr = server.addr.clone();
    let put = request(
        &addr,
        "PUT",
        "/v1/stream/c",
        &[
            ("Origin", "https://app.example.com"),
            ("Content-Type", "text/plain"),
        ],
        b"",
    )
    .expect("put");
    assert_eq!(put.status, 201);
    assert_eq!(
        put.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(put.header("access-control-expose-headers"), Some("*"));
    assert_eq!(put.header("vary"), Some("origin"));

    let post = request(
        &addr,
        "POST",
        "/v1/stream/c",
        &[
            ("Origin", "http://localhost:5173"),
            ("Content-Type", "text/plain"),
        ],
        b"hi",
    )
    .expect("post");
    assert_eq!(post.status, 204);
    assert_eq!(
        post.header("access-control-allow-origin"),
        Some("http://localhost:5173")
    );

    // Another origin: the request is still served (CORS is enforced by the browser), but
    // without any Access-Control-* header, so the browser withholds the answer.
    let other = request(
        &addr,
        "GET",
        "/v1/stream/c?offset=-1",
        &[("Origin", "https://evil.example")],
        b"",
    )
    .expect("get");
    assert_eq!(other.status, 200);
    assert_eq!(other.body, b"hi");
    assert!(!has_cors(&other), "{:?}", other.headers);
    assert_eq!(other.header("vary"), Some("origin"));
    // No Origin at all (curl, server-to-server): no CORS headers either.
    let none = request(&addr, "GET", "/v1/stream/c?offset=-1", &[], b"").expect("get");
    assert_eq!(none.status, 200);
    assert!(!has_cors(&none), "{:?}", none.headers);

    // Preflights follow the same rule.
    let ok = preflight(&addr, "https://app.example.com");
    assert_eq!(ok.status, 204);
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert!(ok
        .header("access-control-allow-methods")
        .is_some_and(|m| m.contains("POST")));
    assert!(ok.header("access-control-allow-headers").is_some());
    assert_eq!(ok.header("vary"), Some("origin"));
    let refused = preflight(&addr, "https://evil.example");
    assert_eq!(refused.status, 204);
    assert!(!has_cors(&refused), "{:?}", refused.headers);

    // Error answers follow the rule too.
    let missing = request(
        &addr,
        "GET",
        "/v1/stream/nope",
        &[("Origin", "https://app.example.com")],
        b"",
    )
    .expect("get");
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
}

#[test]
fn origins_from_the_config_file_and_a_star_means_any() {
    let dir = temp_dir("ursula-cors-file");
    let cfg = dir.path().join("ursula.toml");
    std::fs::write(&cfg, "cors_origins = [\"https://app.example.com\"]\n").expect("write");
    let cfg_s = cfg.to_str().expect("utf-8");
    let server = Server::spawn_standard(dir.path(), "memory", 1, &["--config", cfg_s], None);
    let p = preflight(&server.addr, "https://app.example.com");
    assert_eq!(
        p.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert!(!has_cors(&preflight(&server.addr, "https://other.example")));
    drop(server);

    let server = Server::spawn_standard(dir.path(), "memory", 1, &["--cors-origin", "*"], None);
    let p = preflight(&server.addr, "https://other.example");
    assert_eq!(p.header("access-control-allow-origin"), Some("*"));
    drop(server);

    // Something that is not an origin is refused at start.
    let out = Command::new(URSULA_BIN)
        .args([
            "server",
            "--storage",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--cors-origin",
            "https://app.example.com/",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run ursula");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid CORS origin"));
}

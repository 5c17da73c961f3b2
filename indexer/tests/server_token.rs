//! A source server that requires tokens (`ursula --auth-token-file`): the indexer sends
//! the `read:` token of `--server-token-file` with every request and indexes; without a
//! token, or with one the server does not accept, it says so (the registration's 422, the
//! log and `ursula_indexer_source_refused`) instead of retrying quietly; a corrected file
//! is picked up on SIGHUP; and the token itself never reaches the log.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sonic_rs::JsonContainerTrait;
use support::*;

const T0: i64 = 1_784_370_600_000;
const READ_TOKEN: &str = "indexer-read-token-5c2a81f0d9e3";
const WRITE_TOKEN: &str = "writer-token-7d1e9a44c2b64f0e";
const WRONG_TOKEN: &str = "not-a-server-token-0b3f8c1e6d2a";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Append `n` events with times from `first` on, with the write token.
fn append(ua: &str, first: i64, n: i64) {
    let evs: Vec<String> = (first..first + n)
        .map(|i| format!(r#"{{"captured_at":{}}}"#, T0 + i))
        .collect();
    let auth = bearer(WRITE_TOKEN);
    expect(
        ua,
        "POST",
        "/tele/s",
        &[JSON, ("Authorization", &auth)],
        format!("[{}]", evs.join(",")).as_bytes(),
        204,
    );
}

fn indexed(ia: &str) -> usize {
    events(ia, "e", &format!("from={}&until={}", T0, T0 + 1000))["entries"]
        .as_array()
        .map_or(0, |a| a.len())
}

fn refused_gauge(ia: &str) -> Option<String> {
    let text = expect(ia, "GET", "/metrics", &[], b"", 200).text();
    text.lines()
        .find(|l| l.starts_with("ursula_indexer_source_refused{index=\"e\"}"))
        .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("indexer-{name}.log"))).unwrap_or_default()
}

#[test]
fn indexer_sends_the_server_token_and_reports_refusals() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let tokens = d.join("tokens");
    std::fs::write(&tokens, format!("read:{READ_TOKEN}\nwrite:{WRITE_TOKEN}\n"))
        .expect("write tokens");
    let u = ursula_with(d, &["--auth-token-file", tokens.to_str().expect("utf-8")]);
    let ua = u.addr.clone();
    let auth = bearer(WRITE_TOKEN);
    expect(&ua, "PUT", "/tele", &[("Authorization", &auth)], b"", 201);
    expect(
        &ua,
        "PUT",
        "/tele/s",
        &[JSON, ("Authorization", &auth)],
        b"",
        201,
    );
    expect(&ua, "HEAD", "/tele/s", &[], b"", 401);
    let url = format!("http://{ua}/tele/s");
    let store = d.join("store");

    // No token: the registration's preflight HEAD is refused, and the answer says why.
    let plain = indexer(d, "plain", Store::Dir(&store), &[]);
    let r = register(&plain.addr, "e", &url, "");
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("401") && r.text().contains("server_token_file"),
        "{}",
        r.text()
    );
    drop(plain);

    // The read token: registration, ingest and queries work.
    let token_file = d.join("indexer-token");
    std::fs::write(
        &token_file,
        format!("# the indexer's read token\n{READ_TOKEN}\n"),
    )
    .expect("write token");
    let token_arg = token_file.to_str().expect("utf-8");
    let ix = indexer(
        d,
        "good",
        Store::Dir(&store),
        &["--server-token-file", token_arg],
    );
    let r = register(&ix.addr, "e", &url, "");
    assert_eq!(r.status, 201, "{}", r.text());
    append(&ua, 0, 20);
    wait_for(Duration::from_secs(20), "20 events indexed", || {
        (indexed(&ix.addr) == 20).then_some(())
    });
    assert_eq!(refused_gauge(&ix.addr).as_deref(), Some("0"));
    // Durable before the kill, so the next worker starts from all 20.
    wait_for(Duration::from_secs(20), "20 events durable", || {
        let c = &status(&ix.addr, "e")["coverage"];
        (c["durable"] == c["indexed"]).then_some(())
    });
    drop(ix);

    // A token the server does not accept: the owner says so in the log and the metric,
    // and indexes nothing more. The same worker id takes its own claim back at once,
    // although the kill left it unreleased.
    std::fs::write(&token_file, format!("{WRONG_TOKEN}\n")).expect("write token");
    let ix = indexer(
        d,
        "good",
        Store::Dir(&store),
        &["--server-token-file", token_arg],
    );
    append(&ua, 20, 10);
    wait_for(Duration::from_secs(20), "source_refused 1", || {
        (refused_gauge(&ix.addr).as_deref() == Some("1")).then_some(())
    });
    let log = log_of(d, "good");
    assert!(
        log.contains("ERROR")
            && log.contains("source HEAD answered 401")
            && log.contains("does not accept the token"),
        "{log}"
    );
    assert_eq!(indexed(&ix.addr), 20, "nothing is read while refused");

    // The right token again and SIGHUP: the next HEAD gets through and ingest resumes.
    std::fs::write(&token_file, format!("{READ_TOKEN}\n")).expect("write token");
    let hup = Command::new("kill")
        .args(["-HUP", &ix.child.id().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(hup.success());
    wait_for(Duration::from_secs(30), "30 events indexed", || {
        (indexed(&ix.addr) == 30).then_some(())
    });
    assert_eq!(refused_gauge(&ix.addr).as_deref(), Some("0"));
    let log = log_of(d, "good");
    assert!(log.contains("reloaded the server token from"), "{log}");
    assert!(log.contains("the source accepts the token again"), "{log}");
    drop(ix);

    // No log line of any worker holds a token.
    for name in ["plain", "good"] {
        let log = log_of(d, name);
        for t in [READ_TOKEN, WRITE_TOKEN, WRONG_TOKEN] {
            assert!(!log.contains(t), "the {name} log holds a token:\n{log}");
        }
    }
}

#[test]
fn unusable_token_files_stop_the_indexer_at_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let cases = [
        (
            "scoped",
            format!("read:{READ_TOKEN}\n"),
            "give the token alone",
        ),
        ("empty", "# nothing yet\n\n".to_string(), "holds no token"),
        (
            "spaced",
            format!("{READ_TOKEN} buckets=tele\n"),
            "printable ASCII",
        ),
    ];
    for (name, text, reason) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
        let out = Command::new(INDEXER_BIN)
            .args(["--listen", "127.0.0.1:0", "--store-dir"])
            .arg(dir.path().join("store"))
            .arg("--server-token-file")
            .arg(&file)
            .output()
            .expect("run ursula-indexer");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: started");
        assert!(stderr.contains(reason), "{name}: {stderr}");
        assert!(!stderr.contains(READ_TOKEN), "{name}: {stderr}");
    }
    let out = Command::new(INDEXER_BIN)
        .args(["--listen", "127.0.0.1:0", "--server-token-file"])
        .arg(dir.path().join("missing"))
        .arg("--store-dir")
        .arg(dir.path().join("store"))
        .output()
        .expect("run ursula-indexer");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server token file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

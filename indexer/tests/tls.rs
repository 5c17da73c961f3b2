//! TLS on the indexer's listener: the real binary with a certificate this test generates
//! (rcgen), spoken to by curl trusting only that certificate (`--cacert`).

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl (is it installed?)")
}

/// curl over TLS trusting `ca`: (status, body).
fn https(ca: &Path, args: &[&str]) -> (u16, String) {
    let mut all = vec![
        "--cacert",
        ca.to_str().expect("utf-8"),
        "-w",
        "\n%{http_code}",
    ];
    all.extend_from_slice(args);
    let out = curl(&all);
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.parse().expect("status"), body.to_string())
}

#[test]
fn curl_speaks_https_to_the_indexer() {
    let dir = tempfile::tempdir().expect("tmp");
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("certificate");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");

    let u = ursula(dir.path());
    expect(&u.addr, "PUT", "/tlsdemo", &[], b"", 201);
    expect(&u.addr, "PUT", "/tlsdemo/events", &[JSON], b"", 201);
    expect(
        &u.addr,
        "POST",
        "/tlsdemo/events",
        &[JSON],
        br#"[{"captured_at":1784370600000,"n":1},{"captured_at":1784370601000,"n":2}]"#,
        204,
    );

    let mut args = fast_flags();
    let store = dir.path().join("store");
    for a in [
        "--store-dir",
        store.to_str().expect("utf-8"),
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
    ] {
        args.push(a.to_string());
    }
    let ix = Proc::spawn(
        Path::new(INDEXER_BIN),
        &args,
        "ursula-indexer listening on https://",
        &[],
        &dir.path().join("indexer.log"),
    );
    let base = format!("https://{}", ix.addr);

    let (status, _) = https(&cert, &[&format!("{base}/livez")]);
    assert_eq!(status, 204);

    let register = format!(
        r#"{{"stream_url":"{}/tlsdemo/events","extract":{{"time":["/captured_at"],"unit":"ms"}}}}"#,
        u.url()
    );
    let (status, body) = https(
        &cert,
        &[
            "-X",
            "PUT",
            &format!("{base}/v1/indexes/tlsdemo"),
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &register,
        ],
    );
    assert_eq!(status, 201, "{body}");

    let (status, body) = https(&cert, &[&format!("{base}/v1/indexes")]);
    assert_eq!(status, 200);
    assert!(body.contains("\"tlsdemo\""), "{body}");

    let events = format!("{base}/v1/indexes/tlsdemo/events?from=1784370600000&until=1784370700000");
    let entries = wait_for(Duration::from_secs(20), "two entries over https", || {
        let (status, body) = https(&cert, &[&events]);
        assert_eq!(status, 200, "{body}");
        let v: sonic_rs::Value = sonic_rs::from_str(&body).expect("json");
        let n = v["entries"].as_array().map_or(0, |a| a.len());
        (n == 2).then_some(v)
    });
    assert_eq!(
        entries["entries"][0]["t_ms"].as_i64(),
        Some(1_784_370_600_000),
        "{entries:?}"
    );

    // Plain HTTP to the TLS port fails for that client, and the indexer keeps serving.
    let plain_url = format!("http://{}/livez", ix.addr);
    let plain = curl(&["-o", "/dev/null", "-w", "%{http_code}", &plain_url]);
    assert!(!plain.status.success(), "{plain:?}");
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "000",
        "no HTTP answer"
    );
    let (status, _) = https(&cert, &[&format!("{base}/livez")]);
    assert_eq!(status, 204);
}

//! An https source: `ursula` behind a TLS-terminating proxy with a certificate made here
//! by rcgen, trusted by the indexer through `--source-ca-file`.

mod support;

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sonic_rs::JsonValueTrait;
use support::*;

const T0: i64 = 1_784_370_600_000;

/// A TLS listener on 127.0.0.1 that forwards every connection to `upstream` in the clear.
fn tls_proxy(cert: CertificateDer<'static>, key: Vec<u8>, upstream: String) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
            )
            .expect("server cert");
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr").to_string())
                .expect("send addr");
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let (acceptor, up) = (acceptor.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(s).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(&up).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
    });
    rx.recv().expect("proxy address")
}

#[test]
fn https_source_through_tls_proxy() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    expect(&ua, "PUT", "/demo/h", &[JSON], b"", 201);
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("cert");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).expect("write ca");
    let proxy = tls_proxy(
        ck.cert.der().clone(),
        ck.signing_key.serialize_der(),
        ua.clone(),
    );
    let url = format!("https://{proxy}/demo/h");

    // Without the certificate in its roots the indexer cannot reach the source.
    let store0 = dir.path().join("store0");
    let plain = indexer(dir.path(), "plain", Store::Dir(&store0), &[]);
    assert_ne!(register(&plain.addr, "h", &url, "").status, 201);

    let store = dir.path().join("store");
    let ca_arg = ca.to_string_lossy().to_string();
    let ix = indexer(
        dir.path(),
        "tls",
        Store::Dir(&store),
        &["--source-ca-file", &ca_arg],
    );
    let r = register(&ix.addr, "h", &url, "");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["stream_url"].as_str(), Some(url.as_str()));
    let evs: Vec<String> = (0..40)
        .map(|i| format!(r#"{{"captured_at":{}}}"#, T0 + (i * 7919) % 1000))
        .collect();
    expect(
        &ua,
        "POST",
        "/demo/h",
        &[JSON],
        format!("[{}]", evs.join(",")).as_bytes(),
        204,
    );
    wait_durable(&ix.addr, "h", &ua, "/demo/h");
    let all = all_entries(&ix.addr, "h", T0 - 1, T0 + 1000, 7, "");
    assert_eq!(all.len(), 40);
}

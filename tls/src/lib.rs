//! The TLS server configuration both processes use: `ursula` (monoio) and
//! `ursula-indexer` (tokio) wrap it in their own runtime's acceptor, but read certificates,
//! choose the crypto provider and report bad files the same way.

#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// Read a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
/// SEC1), check that they belong together, and build a server configuration that speaks
/// HTTP/1.1 only. Errors name the file and the setting (`tls_cert`, `tls_key`) at fault.
pub fn server_config(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, String> {
    let cert_pem = std::fs::read(cert_path)
        .map_err(|e| format!("cannot read tls_cert {}: {e}", cert_path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid tls_cert {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls_cert {} holds no PEM certificate",
            cert_path.display()
        ));
    }
    let key_pem = std::fs::read(key_path)
        .map_err(|e| format!("cannot read tls_key {}: {e}", key_path.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("invalid tls_key {}: {e}", key_path.display()))?;
    // The provider is named rather than taken from the process default, so a dependency
    // that enables a second rustls provider cannot make the choice ambiguous.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "tls_cert {} and tls_key {} cannot be used together: {e}",
                cert_path.display(),
                key_path.display()
            )
        })?;
    // Both listeners speak HTTP/1.1 only; saying so keeps clients from trying h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("nope.pem");
        let empty = write(dir.path(), "empty.pem", "");
        let err = server_config(&missing, &missing).expect_err("missing cert");
        assert!(
            err.starts_with("cannot read tls_cert") && err.contains("nope.pem"),
            "{err}"
        );
        let err = server_config(&empty, &missing).expect_err("no certificate");
        assert!(err.contains("holds no PEM certificate"), "{err}");
    }
}

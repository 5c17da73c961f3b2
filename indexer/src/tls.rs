//! TLS for the indexer's HTTP listener: a PEM certificate chain and key read once at start
//! into a rustls configuration; each connection's handshake runs in its own task.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// Read a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
/// SEC1), and check that they belong together.
pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, String> {
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
    // Named provider: the https source client builds the same one (aws-lc-rs).
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
    // hyper is set up for HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

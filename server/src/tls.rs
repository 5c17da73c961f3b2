//! TLS on the main listener: the certificate chain and key are read once at start into a
//! rustls configuration shared by every core; each connection does its handshake on the
//! core that accepted it, then is served exactly like a plain TCP connection.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpStream;
use monoio_rustls::{ServerTlsStream, TlsAcceptor};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// The server's TLS settings, loaded and checked at start.
#[derive(Clone)]
pub struct Tls {
    pub cert_path: PathBuf,
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Read a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
    /// SEC1), and check that they belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls, String> {
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
        // The provider is named rather than taken from the process default, so another
        // crate enabling a second rustls provider cannot make this ambiguous.
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
        // Only HTTP/1.1 is spoken; saying so keeps clients from trying h2.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            cert_path: cert_path.to_path_buf(),
            config: Arc::new(config),
        })
    }

    /// Complete the server side of the handshake within `timeout`. A failure (a plain-HTTP
    /// client, a bad certificate on the client side, a timeout) only ends this connection.
    pub async fn accept(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Option<ServerTlsStream<TcpStream>> {
        let acceptor = TlsAcceptor::from(self.config.clone());
        match monoio::time::timeout(timeout, acceptor.accept(stream)).await {
            Ok(Ok(s)) => Some(s),
            // Debug level: port scanners and plain-HTTP clients would flood the log.
            Ok(Err(e)) => {
                tracing::debug!(%peer, "tls handshake failed: {e}");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "tls handshake timed out");
                None
            }
        }
    }
}

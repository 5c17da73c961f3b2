//! TLS on the main listener: the certificate chain and key are read once at start into a
//! rustls configuration shared by every core; each connection does its handshake on the
//! core that accepted it, then is served exactly like a plain TCP connection.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpStream;
use monoio_rustls::{ServerTlsStream, TlsAcceptor};
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
    /// Read and check the PEM certificate chain and key (see [`ursula_tls::server_config`]).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls, ursula_tls::TlsConfigError> {
        let config = ursula_tls::server_config(cert_path, key_path)?;
        Ok(Tls {
            cert_path: cert_path.to_path_buf(),
            config,
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

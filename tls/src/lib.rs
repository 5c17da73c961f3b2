//! The TLS configurations of the project's processes, read from PEM files the same way.
//!
//! The server side: `ursula` (monoio) and `ursula-indexer` (tokio) wrap [`server_config`]
//! in their own runtime's acceptor, but read certificates, choose the crypto provider and
//! report bad files the same way. The client side: the `ursula` command-line tool connects
//! with [`client_config`], trusting a private CA file or the system's roots.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why a certificate and key cannot serve TLS. Each names the file and the setting
/// (`tls_cert`, `tls_key`) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("cannot read tls_cert {}: {source}", path.display())]
    ReadCert {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid tls_cert {}: {source}", path.display())]
    BadCert { path: PathBuf, source: pem::Error },
    #[error("tls_cert {} holds no PEM certificate", .0.display())]
    NoCert(PathBuf),
    #[error("cannot read tls_key {}: {source}", path.display())]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid tls_key {}: {source}", path.display())]
    BadKey { path: PathBuf, source: pem::Error },
    #[error("tls: {0}")]
    Protocols(rustls::Error),
    #[error("tls_cert {} and tls_key {} cannot be used together: {source}", cert.display(), key.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// Read a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
/// SEC1), check that they belong together, and build a server configuration that speaks
/// HTTP/1.1 only.
pub fn server_config(
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let cert_pem = std::fs::read(cert_path).map_err(|source| TlsConfigError::ReadCert {
        path: cert_path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsConfigError::BadCert {
            path: cert_path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCert(cert_path.to_path_buf()));
    }
    let key_pem = std::fs::read(key_path).map_err(|source| TlsConfigError::ReadKey {
        path: key_path.to_path_buf(),
        source,
    })?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsConfigError::BadKey {
        path: key_path.to_path_buf(),
        source,
    })?;
    // The provider is named rather than taken from the process default, so a dependency
    // that enables a second rustls provider cannot make the choice ambiguous.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Protocols)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|source| TlsConfigError::Mismatch {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
            source,
        })?;
    // Both listeners speak HTTP/1.1 only; saying so keeps clients from trying h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why a client cannot be set up for TLS: its CA file, or the system's trust store.
#[derive(Debug, thiserror::Error)]
pub enum TlsClientError {
    #[error("cannot read CA file {}: {source}", path.display())]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid CA file {}: {source}", path.display())]
    BadCa { path: PathBuf, source: pem::Error },
    #[error("CA file {} holds no PEM certificate", .0.display())]
    NoCa(PathBuf),
    #[error("CA file {}: unusable certificate: {source}", path.display())]
    UnusableCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("no trusted root certificates on this system ({why}); pass a CA file")]
    NoSystemRoots { why: String },
    #[error("tls: {0}")]
    Protocols(rustls::Error),
}

/// A client configuration that trusts only the certificates in `ca_file` when one is given
/// (a private CA, or a self-signed server certificate itself), and otherwise the system's
/// trust store. It offers HTTP/1.1 only, like the servers.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsClientError> {
    let roots = match ca_file {
        Some(path) => ca_file_roots(path)?,
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsClientError::Protocols)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn ca_file_roots(path: &Path) -> Result<RootCertStore, TlsClientError> {
    let pem = std::fs::read(path).map_err(|source| TlsClientError::ReadCa {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsClientError::BadCa {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsClientError::NoCa(path.to_path_buf()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|source| TlsClientError::UnusableCa {
                path: path.to_path_buf(),
                source,
            })?;
    }
    Ok(roots)
}

/// The system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured). A certificate the
/// store cannot parse is skipped, as the system's own TLS libraries skip it; only a store
/// with nothing usable is an error.
fn system_roots() -> Result<RootCertStore, TlsClientError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = match found.errors.first() {
            Some(e) => e.to_string(),
            None => "the trust store is empty".to_string(),
        };
        return Err(TlsClientError::NoSystemRoots { why });
    }
    Ok(roots)
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
        assert!(matches!(err, TlsConfigError::ReadCert { .. }), "{err:?}");
        let err = err.to_string();
        assert!(
            err.starts_with("cannot read tls_cert") && err.contains("nope.pem"),
            "{err}"
        );
        let err = server_config(&empty, &missing).expect_err("no certificate");
        assert!(matches!(err, TlsConfigError::NoCert(_)), "{err:?}");
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
    }

    #[test]
    fn a_client_trusts_exactly_its_ca_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("ca.pem");
        let err = client_config(Some(&missing)).expect_err("missing CA file");
        assert!(matches!(err, TlsClientError::ReadCa { .. }), "{err:?}");
        assert!(err.to_string().contains("ca.pem"), "{err}");
        let empty = write(dir.path(), "empty.pem", "# nothing here\n");
        let err = client_config(Some(&empty)).expect_err("no certificate");
        assert!(matches!(err, TlsClientError::NoCa(_)), "{err:?}");
        let garbage = write(
            dir.path(),
            "bad.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        let err = client_config(Some(&garbage)).expect_err("bad PEM");
        assert!(
            matches!(
                err,
                TlsClientError::BadCa { .. } | TlsClientError::UnusableCa { .. }
            ),
            "{err:?}"
        );
    }
}

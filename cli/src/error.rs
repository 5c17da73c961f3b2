//! Why a command failed, in words an operator can act on.

use std::io;
use std::path::PathBuf;

/// Every way a client command can fail. Its message is printed after `ursula: `.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid server URL {url:?}: {why}")]
    BadUrl { url: String, why: &'static str },
    #[error("cannot reach the server at {url}: {source}")]
    Unreachable { url: String, source: io::Error },
    #[error("TLS with {url} failed: {source}{}", tls_hint(source))]
    Tls { url: String, source: rustls::Error },
    #[error(transparent)]
    TlsSetup(#[from] ursula_tls::TlsClientError),
    #[error("connection to {url} failed: {source}")]
    Connection { url: String, source: io::Error },
    #[error("no answer from {url} within {seconds} s")]
    TimedOut { url: String, seconds: u64 },
    #[error("{url} did not answer as an HTTP/1.1 server: {why}")]
    NotHttp { url: String, why: String },
    #[error("unexpected answer from {url}: {why}")]
    UnexpectedAnswer { url: String, why: String },
    #[error("cannot read the token file {}: {source}", path.display())]
    TokenFile { path: PathBuf, source: io::Error },
    #[error("the token file {} holds no token", .0.display())]
    EmptyTokenFile(PathBuf),
    #[error("invalid name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("line {line}: not one JSON value, so nothing from it on was appended")]
    NotJson { line: u64 },
    #[error("{} not appended: {source}", lines(*first, *last))]
    BatchRefused {
        first: u64,
        last: u64,
        source: Box<Error>,
    },
    #[error(
        "line {line} was not appended ({status} {reason}); of the {later} lines sent after \
         it in the same batch, {appended} were"
    )]
    LineRefused {
        line: u64,
        status: u16,
        reason: String,
        later: usize,
        appended: usize,
    },
    #[error("reading standard input: {0}")]
    Stdin(io::Error),
    #[error("writing standard output: {0}")]
    Stdout(io::Error),
}

/// A request the server answered with an error status, explained by status. `reason` is the
/// server's own plain-text reason (`stream_not_found: stream not found`).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{url} requires a token: pass --token, --token-file, or set URSULA_TOKEN \
         (401 {reason})"
    )]
    NoToken { url: String, reason: String },
    #[error("{url} did not accept the token (401 {reason})")]
    BadToken { url: String, reason: String },
    #[error("the token may not do this: a read token can only read (403 {reason})")]
    Forbidden { reason: String },
    #[error("{what} not found (404 {reason})")]
    NotFound { what: String, reason: String },
    #[error("{what}: {status} {reason}")]
    Other {
        what: String,
        status: u16,
        reason: String,
    },
}

/// `line 3` or `lines 3-9`.
fn lines(first: u64, last: u64) -> String {
    if first == last {
        format!("line {first} was")
    } else {
        format!("lines {first}-{last} were")
    }
}

/// What to do about a certificate the client refused.
fn tls_hint(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError;
    match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            " (for a private CA or a self-signed certificate, pass it with --cacert)"
        }
        // What a self-signed certificate made as a CA (`openssl req -x509` without
        // `-addext basicConstraints=critical,CA:FALSE`) gets, even when it is the CA file:
        // webpki does not accept a CA certificate as the server's own.
        rustls::Error::InvalidCertificate(CertificateError::Other(_)) => {
            " (a self-signed server certificate must say basicConstraints CA:FALSE; see \
             docs/operations.md, TLS)"
        }
        rustls::Error::InvalidCertificate(_) => {
            " (check the certificate's names and dates, and the CA passed with --cacert)"
        }
        _ => "",
    }
}

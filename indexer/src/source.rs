//! The source: a stream on any Durable Streams server, read with ordinary HTTP requests
//! (HEAD for identity and retention, offset reads with `live=long-poll` for tailing).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::{Error, Refusal, Result};

pub const RECORD_EXTENSION: &str = "json-record-coordinates-v1";

#[derive(Clone)]
pub struct SourceClient {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// The bearer token sent to the source server (`server_token_file`), if any.
    token: Option<Arc<ServerToken>>,
}

/// The token file and the `Authorization` value read from it last. Kept behind a lock so
/// SIGHUP can swap in a rotated token while reads are in flight; the value is marked
/// sensitive so no `Debug` of a request or header map prints it.
struct ServerToken {
    path: PathBuf,
    header: RwLock<http::HeaderValue>,
}

/// Read the token from `path`: its first line that is neither blank nor a `#` comment,
/// trimmed (as the `ursula` client's `--token-file` reads it), as an `Authorization`
/// header value. Errors name the file, never its contents.
pub fn read_token_file(path: &Path) -> Result<http::HeaderValue> {
    let bad = |reason| Error::BadTokenFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .ok_or(bad("it holds no token"))?;
    // A line copied from the server's `auth_token_file` keeps its scope prefix and
    // `buckets=`; sent as is it would only ever be answered 401.
    if token.starts_with("read:") || token.starts_with("write:") {
        return Err(bad(
            "its token starts with read: or write:, as in the server's token file; \
             give the token alone",
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "its token has spaces or characters other than printable ASCII",
        ));
    }
    let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| bad("its token is not a valid header value"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// What a HEAD says about the stream.
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub content_type: String,
    pub next_offset: u64,
    pub retained_offset: u64,
    pub incarnation: Option<String>,
    pub record_coordinates: bool,
    pub record_first: Option<u64>,
    pub record_next: Option<u64>,
}

#[derive(Debug)]
pub enum HeadResult {
    Ok(Head),
    NotFound,
}

#[derive(Debug)]
pub enum ReadResult {
    Data {
        body: Bytes,
        next_offset: Option<u64>,
        json_array: bool,
    },
    /// Long-poll timed out with nothing new; `next_offset` is the tail the source
    /// reported (`Stream-Next-Offset` of the 204), if any.
    NoData {
        next_offset: Option<u64>,
    },
    /// Retention passed the requested offset.
    Gone,
    NotFound,
}

/// Validate and canonicalise a `stream_url`: absolute `http` URL with a host, no user
/// info, no fragment; scheme and host lower-cased.
pub fn canonical_url(raw: &str) -> Result<String> {
    let uri: http::Uri = raw
        .parse()
        .map_err(|_| Error::InvalidUrl("stream_url is not a valid URL"))?;
    let scheme = uri.scheme_str().map(|s| s.to_ascii_lowercase());
    let scheme = match scheme.as_deref() {
        Some("http") => "http",
        Some("https") => "https",
        _ => {
            return Err(Error::InvalidUrl(
                "stream_url must be an absolute http or https URL",
            ))
        }
    };
    if raw.contains('#') {
        return Err(Error::InvalidUrl("stream_url must not have a fragment"));
    }
    let Some(auth) = uri.authority() else {
        return Err(Error::InvalidUrl("stream_url must have a host"));
    };
    if auth.as_str().contains('@') {
        return Err(Error::InvalidUrl("stream_url must not contain user info"));
    }
    if auth.host().is_empty() {
        return Err(Error::InvalidUrl("stream_url must have a host"));
    }
    let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    Ok(format!(
        "{scheme}://{}{}",
        auth.as_str().to_ascii_lowercase(),
        pq
    ))
}

pub fn offset_token(o: u64) -> String {
    format!("{o:020}")
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn header_u64(h: &http::HeaderMap, name: &str) -> Option<u64> {
    header(h, name).and_then(|v| v.trim().parse().ok())
}

impl SourceClient {
    /// Plain HTTP and HTTPS (rustls, the platform's root certificates).
    pub fn new() -> Result<SourceClient> {
        Self::with_roots(None)
    }

    /// Send `Authorization: Bearer <token>` with every request, the token read from
    /// `path` now and again on each [`SourceClient::reload_token`].
    pub fn with_token_file(mut self, path: &Path) -> Result<SourceClient> {
        let header = read_token_file(path)?;
        self.token = Some(Arc::new(ServerToken {
            path: path.to_path_buf(),
            header: RwLock::new(header),
        }));
        Ok(self)
    }

    /// Re-read the token file (SIGHUP). `Ok(None)`: no token file is configured. A file
    /// that cannot be used leaves the token in force.
    pub fn reload_token(&self) -> Result<Option<&Path>> {
        let Some(t) = &self.token else {
            return Ok(None);
        };
        let header = read_token_file(&t.path)?;
        *t.header.write().unwrap_or_else(|p| p.into_inner()) = header;
        Ok(Some(&t.path))
    }

    /// Whether requests carry a token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Like [`SourceClient::new`], also trusting the PEM certificates in `ca_file`.
    pub fn with_roots(ca_file: Option<&std::path::Path>) -> Result<SourceClient> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        // A platform store that cannot be read leaves https to the extra roots only.
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(path) = ca_file {
            let bad = |e: Box<dyn std::error::Error + Send + Sync>| Error::CaFile {
                path: path.to_path_buf(),
                source: e,
            };
            let mut n = 0;
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.into()))? {
                let cert = cert.map_err(|e| bad(e.into()))?;
                roots.add(cert).map_err(|e| bad(e.into()))?;
                n += 1;
            }
            if n == 0 {
                return Err(Error::NoCertificates {
                    path: path.to_path_buf(),
                });
            }
        }
        Self::build(roots)
    }

    fn build(roots: rustls::RootCertStore) -> Result<SourceClient> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(conn);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(SourceClient {
            client,
            token: None,
        })
    }

    async fn send(
        &self,
        method: http::Method,
        url: &str,
        timeout: Duration,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(url)
            .body(Empty::new())
            .map_err(Error::SourceUrl)?;
        if let Some(t) = &self.token {
            let value = t.header.read().unwrap_or_else(|p| p.into_inner()).clone();
            req.headers_mut().insert(http::header::AUTHORIZATION, value);
        }
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(Error::SourceRequest(e)),
            Err(_) => Err(Error::SourceTimeout),
        }
    }

    /// The source answered `status` (401 or 403): it wants a token, or another one.
    fn refused(&self, request: &'static str, status: u16) -> Error {
        Error::SourceRefused {
            request,
            status,
            why: match (status, self.has_token()) {
                (403, _) => Refusal::Forbidden,
                (_, true) => Refusal::TokenRejected,
                (_, false) => Refusal::NoToken,
            },
        }
    }

    pub async fn head(&self, url: &str) -> Result<HeadResult> {
        let resp = self
            .send(http::Method::HEAD, url, Duration::from_secs(10))
            .await?;
        let status = resp.status().as_u16();
        if status == 404 || status == 410 {
            return Ok(HeadResult::NotFound);
        }
        if status == 401 || status == 403 {
            return Err(self.refused("HEAD", status));
        }
        if !(200..300).contains(&status) {
            return Err(Error::SourceStatus {
                request: "HEAD",
                status,
            });
        }
        let h = resp.headers();
        let ext = header(h, "stream-extensions").unwrap_or("");
        Ok(HeadResult::Ok(Head {
            content_type: header(h, "content-type").unwrap_or("").to_string(),
            next_offset: header_u64(h, "stream-next-offset").unwrap_or(0),
            retained_offset: header_u64(h, "stream-retained-offset").unwrap_or(0),
            incarnation: header(h, "stream-incarnation").map(str::to_string),
            record_coordinates: ext.split(',').any(|t| t.trim() == RECORD_EXTENSION),
            record_first: header_u64(h, "stream-record-first"),
            record_next: header_u64(h, "stream-record-next"),
        }))
    }

    /// `GET url?offset=<o>&live=long-poll`; `wait` bounds the whole request.
    pub async fn read(
        &self,
        url: &str,
        offset: u64,
        long_poll: bool,
        wait: Duration,
    ) -> Result<ReadResult> {
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut full = format!("{url}{sep}offset={}", offset_token(offset));
        if long_poll {
            full.push_str("&live=long-poll");
        }
        let resp = match self.send(http::Method::GET, &full, wait).await {
            Ok(r) => r,
            Err(Error::SourceTimeout) if long_poll => {
                return Ok(ReadResult::NoData { next_offset: None })
            }
            Err(e) => return Err(e),
        };
        let status = resp.status().as_u16();
        match status {
            204 => {
                return Ok(ReadResult::NoData {
                    next_offset: header_u64(resp.headers(), "stream-next-offset"),
                })
            }
            404 => return Ok(ReadResult::NotFound),
            410 => return Ok(ReadResult::Gone),
            401 | 403 => return Err(self.refused("read", status)),
            200 => {}
            status => {
                return Err(Error::SourceStatus {
                    request: "read",
                    status,
                })
            }
        }
        let next_offset = header_u64(resp.headers(), "stream-next-offset");
        let ct = header(resp.headers(), "content-type")
            .unwrap_or("")
            .to_ascii_lowercase();
        let body = match tokio::time::timeout(
            wait.max(Duration::from_secs(30)),
            resp.into_body().collect(),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return Err(Error::SourceBody(e)),
            Err(_) => return Err(Error::SourceBodyTimeout),
        };
        let json_array = ct.starts_with("application/json") && body.first() == Some(&b'[');
        Ok(ReadResult::Data {
            body,
            next_offset,
            json_array,
        })
    }
}

pub fn is_indexable_type(ct: &str) -> bool {
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    base == "application/json" || base == "application/x-ndjson"
}

/// A JSON-array read (the compat surface renders JSON streams as arrays) turned back into
/// the stored framing: one line per element. Each element is stored as its canonical text
/// plus LF, so offsets stay byte positions.
pub fn array_to_lines(body: &[u8]) -> Result<Vec<u8>> {
    let text = std::str::from_utf8(body).map_err(Error::ArrayNotUtf8)?;
    let mut out = Vec::with_capacity(body.len());
    for v in sonic_rs::to_array_iter(text) {
        let v = v.map_err(Error::ArrayRead)?;
        out.extend_from_slice(v.as_raw_str().as_bytes());
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            canonical_url("HTTP://Example.COM:80/a/b?x=1")
                .ok()
                .as_deref(),
            Some("http://example.com:80/a/b?x=1")
        );
        assert!(canonical_url("http://u:p@h/x").is_err());
        assert!(canonical_url("http://h/x#f").is_err());
        assert!(canonical_url("/relative").is_err());
        assert!(canonical_url("ftp://h/x").is_err());
        assert_eq!(
            canonical_url("https://H:8443/s").ok().as_deref(),
            Some("https://h:8443/s")
        );
        assert!(matches!(
            canonical_url("http://u:p@h/x"),
            Err(Error::InvalidUrl("stream_url must not contain user info"))
        ));
    }

    #[test]
    fn arrays() {
        assert_eq!(
            array_to_lines(br#"[{"a":1},2]"#).expect("ok"),
            b"{\"a\":1}\n2\n"
        );
    }
}

//! A blocking HTTP/1.1 client for one server: plain TCP or rustls, an optional bearer token,
//! and one kept-alive connection that the requests of a command reuse (the bytes on the
//! wire are `wire`'s).
//!
//! A request is retried once, on a new connection, only when a reused connection turned
//! out to be closed before any byte of an answer came back: the server closed it while it
//! was idle, so it never saw the request.

use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Refusal};
use crate::wire::{self, WireError};
use crate::Connection;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

pub use crate::wire::Response;

/// How long a connection attempt (and a TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ordinary request waits for its answer; long-polls say their own.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// A server and the credentials to use with it.
pub struct Client {
    endpoint: Endpoint,
    tls: Option<Arc<ClientConfig>>,
    token: Option<String>,
    conn: Option<BufReader<Transport>>,
    /// How long a connection may take to open.
    connect_timeout: Duration,
}

/// One request.
pub struct Request<'a> {
    method: &'static str,
    /// Path and query, percent-encoded, without the endpoint's prefix.
    target: String,
    headers: Vec<(&'static str, String)>,
    body: &'a [u8],
    /// How long to wait for the answer.
    wait: Duration,
}

impl Client {
    /// The client a command's [`Connection`] options describe, with the environment
    /// (`URSULA_URL`, `URSULA_TOKEN`, `URSULA_TOKEN_FILE`, `URSULA_CACERT`) under them.
    pub fn new(options: &Connection) -> Result<Client, Error> {
        let settings = Settings::resolve(options, |name| {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        });
        let endpoint = Endpoint::parse(&settings.server)?;
        let token = match (settings.token, settings.token_file) {
            (Some(token), _) => Some(token),
            (None, Some(path)) => Some(read_token_file(&path)?),
            (None, None) => None,
        };
        let tls = if endpoint.tls {
            Some(ursula_tls::client_config(settings.cacert.as_deref())?)
        } else {
            None
        };
        Ok(Client {
            endpoint,
            tls,
            token,
            conn: None,
            connect_timeout: CONNECT_TIMEOUT,
        })
    }

    /// Give up on opening a connection after `timeout` instead of [`CONNECT_TIMEOUT`].
    pub fn connect_within(mut self, timeout: Duration) -> Client {
        self.connect_timeout = timeout;
        self
    }

    /// The URL of a request path, for messages and output.
    pub fn url_of(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint.url)
    }

    /// Send a request and read its whole answer, whatever its status.
    pub fn send(&mut self, req: &Request<'_>) -> Result<Response, Error> {
        let reused = self.conn.is_some();
        match self.attempt(req) {
            Err(Attempt::Unanswered(_)) if reused => {
                self.conn = None;
                self.attempt(req).map_err(|a| self.failure(a))
            }
            result => result.map_err(|a| self.failure(a)),
        }
    }

    /// The error a refused request becomes: what the status means for `what` (a stream, a
    /// bucket), with the server's reason.
    pub fn refusal(&self, resp: &Response, what: &dyn std::fmt::Display) -> Error {
        let reason = resp.reason();
        let url = self.endpoint.url.clone();
        let refusal = match resp.status {
            401 if self.token.is_none() => Refusal::NoToken { url, reason },
            401 => Refusal::BadToken { url, reason },
            403 => Refusal::Forbidden { reason },
            404 => Refusal::NotFound {
                what: what.to_string(),
                reason,
            },
            status => Refusal::Other {
                what: what.to_string(),
                status,
                reason,
            },
        };
        Error::Refused(refusal)
    }

    /// An answer that is not what the protocol promises (a missing header, bad JSON).
    pub fn unexpected(&self, why: impl Into<String>) -> Error {
        Error::UnexpectedAnswer {
            url: self.endpoint.url.clone(),
            why: why.into(),
        }
    }

    fn attempt(&mut self, req: &Request<'_>) -> Result<Response, Attempt> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.connect().map_err(Attempt::Failed)?,
        };
        conn.get_ref()
            .socket()
            .set_read_timeout(Some(req.wait))
            .map_err(Attempt::Io)?;
        let head = self.head_of(req);
        let sent = wire::write_request(conn.get_mut(), head.as_bytes(), req.body);
        if let Err(e) = sent {
            return Err(match e.kind() {
                io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted => Attempt::Unanswered(e),
                _ => Attempt::Io(e),
            });
        }
        let read = wire::read_response(&mut conn, req.method == "HEAD");
        let (resp, reusable) = read.map_err(|e| match e {
            WireError::Closed => Attempt::Unanswered(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection without answering",
            )),
            WireError::Io(e) if is_timeout(&e) => Attempt::TimedOut(req.wait),
            WireError::Io(e) => Attempt::Io(e),
            WireError::NotHttp(why) => Attempt::NotHttp(why),
        })?;
        if reusable {
            self.conn = Some(conn);
        }
        Ok(resp)
    }

    fn head_of(&self, req: &Request<'_>) -> String {
        let mut head = format!(
            "{} {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ursula/{}\r\n",
            req.method,
            self.endpoint.prefix,
            req.target,
            self.endpoint.authority,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        for (name, value) in &req.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !req.body.is_empty() || matches!(req.method, "POST" | "PUT") {
            head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
        }
        head.push_str("\r\n");
        head
    }

    fn connect(&self) -> Result<BufReader<Transport>, Error> {
        let url = &self.endpoint.url;
        let unreachable = |source| Error::Unreachable {
            url: url.clone(),
            source,
        };
        let addrs = (self.endpoint.host.as_str(), self.endpoint.port)
            .to_socket_addrs()
            .map_err(unreachable)?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name has no address");
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.connect_timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let mut tcp = tcp.ok_or_else(|| unreachable(last))?;
        let setup = tcp
            .set_nodelay(true)
            .and_then(|()| tcp.set_write_timeout(Some(ANSWER_TIMEOUT)))
            .and_then(|()| tcp.set_read_timeout(Some(CONNECT_TIMEOUT)));
        setup.map_err(|source| Error::Connection {
            url: url.clone(),
            source,
        })?;
        let transport = match &self.tls {
            None => Transport::Plain(tcp),
            Some(config) => {
                let name = ServerName::try_from(self.endpoint.host.clone()).map_err(|_| {
                    Error::BadUrl {
                        url: url.clone(),
                        why: "the host is not a valid TLS server name",
                    }
                })?;
                let mut tls =
                    ClientConnection::new(config.clone(), name).map_err(|source| Error::Tls {
                        url: url.clone(),
                        source,
                    })?;
                // The handshake here, so that a certificate the client does not trust is
                // reported as such, not as a failed request.
                while tls.is_handshaking() {
                    tls.complete_io(&mut tcp)
                        .map_err(|e| self.failure(Attempt::Io(e)))?;
                }
                Transport::Tls(Box::new(StreamOwned::new(tls, tcp)))
            }
        };
        Ok(BufReader::with_capacity(64 * 1024, transport))
    }

    fn failure(&self, attempt: Attempt) -> Error {
        let url = self.endpoint.url.clone();
        match attempt {
            Attempt::Failed(e) => e,
            Attempt::TimedOut(wait) => Error::TimedOut {
                url,
                seconds: wait.as_secs(),
            },
            Attempt::NotHttp(why) => Error::NotHttp { url, why },
            Attempt::Unanswered(source) | Attempt::Io(source) => {
                let tls = source
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .cloned();
                match tls {
                    Some(source) => Error::Tls { url, source },
                    None if is_timeout(&source) => Error::TimedOut {
                        url,
                        seconds: self.connect_timeout.as_secs(),
                    },
                    None => Error::Connection { url, source },
                }
            }
        }
    }
}

impl<'a> Request<'a> {
    pub fn new(method: &'static str, target: impl Into<String>) -> Request<'a> {
        Request {
            method,
            target: target.into(),
            headers: Vec::new(),
            body: &[],
            wait: ANSWER_TIMEOUT,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn body(mut self, body: &'a [u8]) -> Self {
        self.body = body;
        self
    }

    /// Wait this long for the answer instead of [`ANSWER_TIMEOUT`] (a long-poll).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

/// Where the server is: from `http://host:port/prefix` (scheme and port optional).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// The URL as messages show it: scheme, authority and prefix, no trailing `/`.
    url: String,
    tls: bool,
    /// The host name or address (IPv6 without brackets): what is resolved and what TLS
    /// checks the certificate against.
    host: String,
    port: u16,
    /// `host[:port]` as written: the `Host` header.
    authority: String,
    /// A path every request path is put under (a server behind a proxy's path), no
    /// trailing `/`; empty for none.
    prefix: String,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, Error> {
        let bad = |why| Error::BadUrl {
            url: url.to_string(),
            why,
        };
        let (tls, rest) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some(_) => return Err(bad("the scheme must be http or https")),
            None => (false, url),
        };
        if rest.contains(['?', '#']) {
            return Err(bad("a server URL has no query or fragment"));
        }
        let (authority, prefix) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("credentials go in --token, not in the URL"));
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or(bad("unclosed '['"))?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
            None if tls => 443,
            None => 80,
        };
        let prefix = prefix.trim_end_matches('/').to_string();
        let scheme = if tls { "https" } else { "http" };
        Ok(Endpoint {
            url: format!("{scheme}://{authority}{prefix}"),
            tls,
            host: host.to_string(),
            port,
            authority: authority.to_string(),
            prefix,
        })
    }
}

/// The connection options after the environment has filled what the flags left out.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    server: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
    cacert: Option<PathBuf>,
}

impl Settings {
    /// Flags first, then the environment. A token given either way on the command line
    /// wins over both variables: a flag is the more deliberate choice.
    fn resolve(options: &Connection, env: impl Fn(&str) -> Option<String>) -> Settings {
        let server = options
            .server
            .clone()
            .or_else(|| env("URSULA_URL"))
            .unwrap_or_else(|| crate::DEFAULT_SERVER.to_string());
        let (token, token_file) = match (&options.token, &options.token_file) {
            (Some(t), _) => (Some(t.clone()), None),
            (None, Some(f)) => (None, Some(f.clone())),
            (None, None) => match env("URSULA_TOKEN") {
                Some(t) => (Some(t), None),
                None => (None, env("URSULA_TOKEN_FILE").map(PathBuf::from)),
            },
        };
        Settings {
            server,
            token,
            token_file,
            cacert: options
                .cacert
                .clone()
                .or_else(|| env("URSULA_CACERT").map(PathBuf::from)),
        }
    }
}

/// The first line of a token file that is neither blank nor a `#` comment, trimmed.
fn read_token_file(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .ok_or_else(|| Error::EmptyTokenFile(path.to_path_buf()))
}

/// Why an attempt at a request failed.
enum Attempt {
    /// The connection could not be made.
    Failed(Error),
    /// The connection was closed before any byte of an answer: the server did not take the
    /// request (it may be retried on a new connection when this one was reused).
    Unanswered(io::Error),
    Io(io::Error),
    TimedOut(Duration),
    NotHttp(String),
}

/// A connection, plain or TLS.
enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Transport {
    fn socket(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_scheme_host_port_and_prefix() {
        let e = Endpoint::parse("https://streams.example.com").expect("url");
        assert!(e.tls);
        assert_eq!((e.host.as_str(), e.port), ("streams.example.com", 443));
        assert_eq!(e.authority, "streams.example.com");
        let e = Endpoint::parse("localhost:4437").expect("url");
        assert!(!e.tls);
        assert_eq!(e.url, "http://localhost:4437");
        let e = Endpoint::parse("http://[::1]:9000/ursula/").expect("url");
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        assert_eq!(
            (e.prefix.as_str(), e.authority.as_str()),
            ("/ursula", "[::1]:9000")
        );
        assert_eq!(e.url, "http://[::1]:9000/ursula");
        for bad in [
            "ftp://x",
            "http://",
            "http://:80",
            "http://h:port",
            "http://u:p@h",
            "http://h/?q",
            "http://[::1",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(Error::BadUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn flags_win_over_the_environment() {
        let env = |name: &str| match name {
            "URSULA_URL" => Some("https://env:1".to_string()),
            "URSULA_TOKEN" => Some("env-token".to_string()),
            "URSULA_TOKEN_FILE" => Some("/env/token".to_string()),
            "URSULA_CACERT" => Some("/env/ca.pem".to_string()),
            _ => None,
        };
        let from_env = Settings::resolve(&Connection::default(), env);
        assert_eq!(
            from_env,
            Settings {
                server: "https://env:1".into(),
                token: Some("env-token".into()),
                token_file: None,
                cacert: Some("/env/ca.pem".into()),
            }
        );
        let flags = Connection {
            server: Some("http://flag:2".into()),
            token_file: Some("/flag/token".into()),
            ..Connection::default()
        };
        let s = Settings::resolve(&flags, env);
        assert_eq!(s.server, "http://flag:2");
        assert_eq!((s.token, s.token_file), (None, Some("/flag/token".into())));
        let none = Settings::resolve(&Connection::default(), |_| None);
        assert_eq!(none.server, crate::DEFAULT_SERVER);
        assert_eq!(
            (none.token, none.token_file, none.cacert),
            (None, None, None)
        );
    }

    #[test]
    fn token_files_hold_the_token_on_their_first_line() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("token");
        std::fs::write(
            &path,
            "# the ingest token\n\n  secret-token-0123456789  \nnext\n",
        )
        .expect("write");
        assert_eq!(
            read_token_file(&path).ok().as_deref(),
            Some("secret-token-0123456789")
        );
        std::fs::write(&path, "# nothing\n\n").expect("write");
        assert!(matches!(
            read_token_file(&path),
            Err(Error::EmptyTokenFile(_))
        ));
        let missing = dir.path().join("missing");
        assert!(matches!(
            read_token_file(&missing),
            Err(Error::TokenFile { .. })
        ));
    }
}

//! Test support: spawn the `ursula` binary and talk HTTP/1.1 to it.
//!
//! Deliberately small: a blocking client over `std::net::TcpStream` with optional
//! keep-alive, whose responses are read by the command-line tool's reader
//! (`ursula_cli::wire`), plus helpers to start the server, read its
//! `ursula listening on http://…` line, and stop it with SIGKILL or SIGTERM.
#![allow(dead_code)]

pub mod s3;
pub mod workload;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ursula_cli::wire;

/// Path of the server binary built by cargo for this test run.
pub const URSULA_BIN: &str = env!("CARGO_BIN_EXE_ursula");

/// The binary [`Server::spawn`] starts: `URSULA_TEST_BIN` when set (a long run such as
/// `scripts/crash-loop` points it at a private copy, so a rebuild of the shared target
/// directory cannot swap the server under it), otherwise [`URSULA_BIN`].
pub fn ursula_bin() -> String {
    std::env::var("URSULA_TEST_BIN").unwrap_or_else(|_| URSULA_BIN.to_string())
}

/// Prefix of the one line the server prints on stdout once it accepts connections.
pub const LISTENING_PREFIX: &str = "ursula listening on http://";

/// The `--listen` address of a test server: `127.0.0.1:0` (a free port the kernel picks),
/// unless `URSULA_TEST_PORTS=LO-HI` names a range to take a free port from instead, for
/// machines where servers must stay out of the ephemeral range client sockets draw from.
/// Ports of the range are handed out in turn within a process, from a start that differs
/// between processes, and one that is taken is skipped.
pub fn listen_addr() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let range = std::env::var("URSULA_TEST_PORTS").ok().and_then(|r| {
        let (lo, hi) = r.split_once('-')?;
        let (lo, hi) = (
            lo.trim().parse::<u16>().ok()?,
            hi.trim().parse::<u16>().ok()?,
        );
        (lo <= hi).then_some((lo, hi))
    });
    let Some((lo, hi)) = range else {
        return "127.0.0.1:0".to_string();
    };
    let span = u32::from(hi - lo) + 1;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + ((start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    panic!("no free port in URSULA_TEST_PORTS={lo}-{hi}");
}

/// The arguments of [`Server::spawn_standard`]: `server --listen ADDR --data-dir DIR
/// --storage disk|memory --cores N --long-poll-timeout-ms 500` plus `extra`, with ADDR
/// from [`listen_addr`].
pub fn server_args(data_dir: &Path, storage: &str, cores: usize, extra: &[&str]) -> Vec<String> {
    let data_dir = data_dir.to_str().expect("utf-8 data dir");
    let cores = cores.to_string();
    let listen = listen_addr();
    let mut args: Vec<String> = [
        "server",
        "--listen",
        &listen,
        "--data-dir",
        data_dir,
        "--storage",
        storage,
        "--cores",
        &cores,
        "--long-poll-timeout-ms",
        "500",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// A running `ursula` process.
pub struct Server {
    pub child: Child,
    /// `host:port` the server is bound to.
    pub addr: String,
    /// `http://host:port` (no trailing slash).
    pub base_url: String,
}

impl Server {
    /// Start `ursula` with `args` (e.g. `["server", "--listen", "127.0.0.1:0", …]`) and wait
    /// up to `timeout` for its listening line. Stderr is appended to `stderr_log` if given,
    /// otherwise discarded.
    pub fn spawn(args: &[&str], stderr_log: Option<&Path>, timeout: Duration) -> Server {
        Server::spawn_with_env(args, &[], stderr_log, timeout)
    }

    /// [`Server::spawn`] with extra environment variables for the server process.
    pub fn spawn_with_env(
        args: &[&str],
        env: &[(&str, &str)],
        stderr_log: Option<&Path>,
        timeout: Duration,
    ) -> Server {
        match Server::spawn_unless(args, env, stderr_log, timeout, &|| false) {
            Ok(server) => server,
            Err(_) => unreachable!("never gives up"),
        }
    }

    /// [`Server::spawn_with_env`] that stops waiting for the listening line once `give_up`
    /// returns true (polled every 10 ms) and hands back the still running child, e.g. when
    /// the server's disk froze under it during startup.
    pub fn spawn_unless(
        args: &[&str],
        env: &[(&str, &str)],
        stderr_log: Option<&Path>,
        timeout: Duration,
        give_up: &dyn Fn() -> bool,
    ) -> Result<Server, Child> {
        let stderr = match stderr_log {
            Some(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .unwrap_or_else(|e| panic!("open server log {}: {e}", p.display())),
            ),
            None => Stdio::null(),
        };
        let bin = ursula_bin();
        let mut child = Command::new(&bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));

        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        // Read the first line, hand it over, then keep draining stdout so the server
        // never blocks on (or dies from) a full/closed pipe.
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if !sent {
                            let _ = tx.send(line.trim_end().to_string());
                            sent = true;
                        }
                    }
                }
            }
        });

        let deadline = Instant::now() + timeout;
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(l) => break l,
                Err(mpsc::RecvTimeoutError::Timeout) if give_up() => return Err(child),
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => {
                    let status = child.try_wait().ok().flatten();
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "ursula did not print its listening line within {timeout:?} (args {args:?}, exit status {status:?})"
                    );
                }
            }
        };
        // With --tls-cert the line says https://.
        let (scheme, rest) = match line.strip_prefix(LISTENING_PREFIX) {
            Some(a) => ("http", Some(a)),
            None => ("https", line.strip_prefix("ursula listening on https://")),
        };
        let addr = match rest {
            Some(a) => a.trim_end_matches('/').to_string(),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("unexpected first stdout line from ursula: {line:?}");
            }
        };
        Ok(Server {
            child,
            base_url: format!("{scheme}://{addr}"),
            addr,
        })
    }

    /// Convenience: `ursula server --listen 127.0.0.1:0 --data-dir DIR --storage disk|memory
    /// --cores N --long-poll-timeout-ms 500` plus `extra` args.
    pub fn spawn_standard(
        data_dir: &Path,
        storage: &str,
        cores: usize,
        extra: &[&str],
        stderr_log: Option<&Path>,
    ) -> Server {
        let args = server_args(data_dir, storage, cores, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::spawn(&args, stderr_log, Duration::from_secs(60))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn client(&self) -> Client {
        Client::new(&self.addr)
    }

    /// SIGKILL the process and reap it.
    pub fn kill9(mut self) {
        signal(self.pid(), libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM the process and wait up to `timeout` for it to exit. Returns its exit
    /// status, or `None` if it did not exit in time (it is then SIGKILLed and reaped).
    pub fn sigterm(mut self, timeout: Duration) -> Option<ExitStatus> {
        signal(self.pid(), libc::SIGTERM);
        let st = wait_timeout(&mut self.child, timeout);
        if st.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        st
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Never leave a server behind (e.g. when a test panics).
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Send `sig` to `pid`.
pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        // ESRCH: already gone, which is fine for our purposes.
        if err.raw_os_error() != Some(libc::ESRCH) {
            panic!("kill({pid}, {sig}): {err}");
        }
    }
}

/// Poll `child` until it exits or `timeout` passes.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `Stream-Next-Offset` parsed as a byte position.
    pub fn next_offset(&self) -> Option<u64> {
        self.header("stream-next-offset")
            .and_then(|v| v.trim().parse::<u64>().ok())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl From<wire::Response> for Response {
    fn from(resp: wire::Response) -> Response {
        Response {
            status: resp.status,
            headers: resp.headers().to_vec(),
            body: resp.body,
        }
    }
}

/// Blocking HTTP/1.1 client with optional keep-alive on one connection.
pub struct Client {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    pub keep_alive: bool,
    pub timeout: Duration,
}

impl Client {
    pub fn new(addr: &str) -> Client {
        Client {
            addr: addr.to_string(),
            conn: None,
            keep_alive: true,
            timeout: Duration::from_secs(60),
        }
    }

    /// Drop the current connection (the next request opens a new one).
    pub fn disconnect(&mut self) {
        self.conn = None;
    }

    /// Open a connection now if there is none (lets callers tell "server down" from
    /// "request failed").
    pub fn connect(&mut self) -> io::Result<()> {
        if self.conn.is_none() {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            s.set_write_timeout(Some(self.timeout))?;
            self.conn = Some(BufReader::with_capacity(256 * 1024, s));
        }
        Ok(())
    }

    /// Send one request and read the whole response. On any I/O error the connection
    /// is dropped and the error returned; the request may or may not have been processed.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        self.connect()?;
        let res = self.request_on_conn(method, path, headers, body);
        match res {
            Ok((resp, reusable)) => {
                if !reusable || !self.keep_alive {
                    self.conn = None;
                }
                Ok(resp)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    fn request_on_conn(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<(Response, bool)> {
        let conn = self.conn.as_mut().expect("connected");
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        let mut has_len = false;
        for (k, v) in headers {
            if k.eq_ignore_ascii_case("content-length") {
                has_len = true;
            }
            head.push_str(k);
            head.push_str(": ");
            head.push_str(v);
            head.push_str("\r\n");
        }
        if !has_len && (!body.is_empty() || matches!(method, "POST" | "PUT")) {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        if !self.keep_alive {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let sent = {
            let s = conn.get_mut();
            if body.len() <= 64 * 1024 {
                let mut buf = head.into_bytes();
                buf.extend_from_slice(body);
                s.write_all(&buf)
            } else {
                s.write_all(head.as_bytes())
                    .and_then(|()| s.write_all(body))
            }
            .and_then(|()| s.flush())
        };
        match sent {
            Ok(()) => read_response(conn, method == "HEAD"),
            // A server may answer before the body is in (a refusal) and close without
            // draining a large body, so the rest of the send fails. Its answer is still
            // in our receive buffer: read it as an HTTP client does, and report the send's
            // error only if there is none.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                read_response(conn, method == "HEAD").map_err(|_| e)
            }
            Err(e) => Err(e),
        }
    }
}

/// Read one response from `r`. Returns the response and whether the connection can be
/// reused.
pub fn read_response<R: BufRead>(r: &mut R, head_request: bool) -> io::Result<(Response, bool)> {
    let (resp, reusable) = wire::read_response(r, head_request)?;
    Ok((Response::from(resp), reusable))
}

/// One-shot request on a fresh connection (`Connection: close`).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let mut c = Client::new(addr);
    c.keep_alive = false;
    c.request(method, path, headers, body)
}

/// Format a byte position as a 20-digit offset token.
pub fn offset_token(pos: u64) -> String {
    format!("{pos:020}")
}

/// A fresh temporary directory (removed on drop).
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create temp dir")
}

/// Small deterministic PRNG (xorshift64*), so tests need no `rand` dependency.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Seed from the clock (printed by callers so failures can be replayed).
    pub fn from_time() -> (Rng, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42);
        (Rng::new(seed), seed)
    }

    /// Seed from `URSULA_CRASH_SEED` when set (to replay a failure), else from the clock.
    pub fn from_env_or_time() -> (Rng, u64) {
        match std::env::var("URSULA_CRASH_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(s) => (Rng::new(s), s),
            None => Rng::from_time(),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / ((1u64 << 53) as f64) < p
    }

    /// Log-uniform size in `lo..=hi` (many small, some large).
    pub fn log_size(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next_u64() >> 11) as f64 / ((1u64 << 53) as f64);
        ((a + (b - a) * u).exp() as usize).clamp(lo, hi)
    }
}

/// Write `toml` to `dir/ursula.toml` and return its path as a `String` (for `--config`).
pub fn write_config(dir: &Path, toml: &str) -> String {
    let p = dir.join("ursula.toml");
    std::fs::write(&p, toml).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p.to_str().expect("utf-8 path").to_string()
}

/// A raw TCP connection for tests that must control the exact bytes on the wire
/// (pipelining, chunked framing, `Expect: 100-continue`, slow clients, limits).
pub struct Raw {
    pub r: BufReader<TcpStream>,
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        Raw {
            r: BufReader::with_capacity(256 * 1024, s),
        }
    }

    pub fn set_read_timeout(&self, d: Duration) {
        self.r.get_ref().set_read_timeout(Some(d)).unwrap();
    }

    /// Write all of `bytes` in one `write_all`.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let s = self.r.get_mut();
        s.write_all(bytes)?;
        s.flush()
    }

    /// Read one (final, non-1xx) response.
    pub fn response(&mut self) -> io::Result<Response> {
        self.response_for(false)
    }

    pub fn response_for(&mut self, head_request: bool) -> io::Result<Response> {
        read_response(&mut self.r, head_request).map(|(r, _)| r)
    }

    /// Read exactly one response head, including interim 1xx ones (returns status and
    /// headers; reads no body).
    pub fn head_only(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        Ok(wire::read_head(&mut self.r)?)
    }

    /// Whether the server has closed the connection: `Ok(true)` on EOF or reset, `Ok(false)`
    /// if bytes arrived instead (they are consumed), `Err` on timeout.
    pub fn wait_closed(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 4096];
        loop {
            match self.r.read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(_) => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Read everything until EOF/reset (or timeout), returning what arrived.
    pub fn read_until_close(&mut self) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match self.r.read(&mut buf) {
                Ok(0) => return (out, true),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (out, true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return (out, false),
            }
        }
    }
}

/// One request to the server; panics naming the request on an I/O error.
pub fn req(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    request(&s.addr, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// [`req`], asserting the status (the message shows the response and its body).
pub fn expect(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: u16,
) -> Response {
    let r = req(s, method, path, headers, body);
    assert_eq!(
        r.status,
        status,
        "{method} {path}: {r:?} body {:?}",
        r.body_str()
    );
    r
}

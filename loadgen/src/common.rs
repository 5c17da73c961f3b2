//! Flags shared by every scenario, the target's URL surfaces, the thread-per-core runner
//! and the measured window.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use monoio::time::TimeDriver;
use serde::Serialize;

use crate::http::{Body, Conn, ReqError, Response};
use crate::stats::Stats;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Surface {
    /// `/v1/stream/{name}`: served by every Durable Streams server.
    Compat,
    /// `/{bucket}/{stream}`: Ursula's bucketed surface (the bucket is created first).
    Bucketed,
}

#[derive(Args, Debug, Clone, Serialize)]
pub struct Common {
    /// Server base URL (plain HTTP), e.g. http://127.0.0.1:4437
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub target: String,
    /// URL surface to use.
    #[arg(long, value_enum, default_value_t = Surface::Compat)]
    pub surface: Surface,
    /// Bucket for --surface bucketed (created with PUT /{bucket}; 409 = exists is fine).
    #[arg(long, default_value = "loadgen")]
    pub bucket: String,
    /// Client threads, one pinned monoio loop per core (default: all cores, or one per
    /// CPU of --cpus).
    #[arg(long)]
    pub cores: Option<usize>,
    /// CPUs to pin the client threads to, in turn (e.g. 2,3), to keep the client off the
    /// server's CPUs (default: 0, 1, ...).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Measured window (e.g. 10s, 500ms, 1m; a bare number is seconds).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub duration: Duration,
    /// Warm-up before the measured window (results are discarded).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub warmup: Duration,
    /// Per-request timeout; a request that takes longer counts as a "timeout" error.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub timeout: Duration,
    /// Stream name prefix (a per-run suffix keeps runs apart).
    #[arg(long, default_value = "lg")]
    pub prefix: String,
    /// The per-run part of stream names (default: unique per run). Fixing it lets a later
    /// run address the same streams, e.g. `read --reuse`, or a script delete them:
    /// streams are named `{prefix}-{scenario}-{run-id}-{i}`.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Write the machine-readable report to this file.
    #[arg(long)]
    #[serde(skip)]
    pub json: Option<std::path::PathBuf>,
    /// Draw the latency distribution (percentile curve) to this SVG file.
    #[arg(long)]
    #[serde(skip)]
    pub svg: Option<std::path::PathBuf>,
    /// Create the empty files PATH.start when the measured window begins (after set-up and
    /// warm-up) and PATH.end when it ends, so that a script can sample the server over
    /// exactly the window.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub window_marks: Option<std::path::PathBuf>,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// `10s`, `250ms`, `2m`, `1.5` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (use e.g. 10s, 500ms, 2m)"))?;
    if !v.is_finite() || v < 0.0 || v * mult > 86_400.0 {
        return Err(format!("duration {s:?} out of range"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// `256`, `1k`/`1KiB`, `8m`/`8MiB` (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size {s:?} (use e.g. 256, 4k, 8m)"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

/// The resolved target.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub base: String,
    pub surface: Surface,
    pub bucket: String,
    pub run_id: String,
    pub prefix: String,
}

impl Target {
    pub fn from_common(c: &Common) -> Result<Target, String> {
        let rest = c
            .target
            .strip_prefix("http://")
            .ok_or_else(|| format!("--target must be http://HOST:PORT, got {:?}", c.target))?;
        let hostport = rest.trim_end_matches('/');
        if hostport.contains('/') {
            return Err(format!("--target must not have a path: {:?}", c.target));
        }
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| format!("resolve {hostport}: {e}"))?
            .next()
            .ok_or_else(|| format!("{hostport} resolves to nothing"))?;
        let bucket_ok = (4..=64).contains(&c.bucket.len())
            && !c.bucket.starts_with("__")
            && c.bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if c.surface == Surface::Bucketed && !bucket_ok {
            return Err(format!(
                "--bucket {:?} must match ^[a-z0-9_-]{{4,64}}$",
                c.bucket
            ));
        }
        if c.prefix.is_empty()
            || !c
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("--prefix must be non-empty [A-Za-z0-9_-]".into());
        }
        if c.run_id.as_deref().is_some_and(|r| {
            r.is_empty()
                || !r
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }) {
            return Err("--run-id must be non-empty [A-Za-z0-9_-]".into());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Ok(Target {
            addr,
            base: format!("http://{hostport}"),
            surface: c.surface,
            bucket: c.bucket.clone(),
            run_id: c
                .run_id
                .clone()
                .unwrap_or_else(|| format!("{:x}{:x}", now, std::process::id())),
            prefix: c.prefix.clone(),
        })
    }

    /// A stream name unique to this run.
    pub fn stream_name(&self, scenario: &str, i: usize) -> String {
        format!("{}-{}-{}-{}", self.prefix, scenario, self.run_id, i)
    }

    pub fn stream_path(&self, name: &str) -> String {
        match self.surface {
            Surface::Compat => format!("/v1/stream/{name}"),
            Surface::Bucketed => format!("/{}/{}", self.bucket, name),
        }
    }

    /// Creates the bucket when the surface needs one (`201`, or `409` if it exists).
    pub async fn ensure_bucket(&self, conn: &mut Conn) -> Result<(), String> {
        if self.surface != Surface::Bucketed {
            return Ok(());
        }
        let path = format!("/{}", self.bucket);
        let r = conn
            .request("PUT", &path, &[], Body::Empty)
            .await
            .map_err(|e| format!("PUT {path}: {e}"))?;
        match r.status {
            200 | 201 | 204 | 409 => Ok(()),
            s => Err(format!("PUT {path}: status {s}")),
        }
    }

    /// One keep-alive connection per index in `indexes`, each paired with the path of
    /// stream `scenario`-`stream_of(index)`, created (with its bucket) before measuring.
    pub async fn connect_streams(
        &self,
        scenario: &str,
        indexes: &[usize],
        stream_of: impl Fn(usize) -> usize,
        content_type: &str,
        timeout: Duration,
    ) -> Result<Vec<(Conn, String)>, String> {
        let mut conns = Vec::with_capacity(indexes.len());
        for &i in indexes {
            let mut c = Conn::new(self.addr, timeout);
            self.ensure_bucket(&mut c).await?;
            let path = self.stream_path(&self.stream_name(scenario, stream_of(i)));
            self.create_stream(&mut c, &path, content_type).await?;
            conns.push((c, path));
        }
        Ok(conns)
    }

    /// The gateway shape: this core creates its share of `streams` streams and opens its
    /// share of a pool of `connections` keep-alive connections. Every connection sends to
    /// every stream in turn (the way a gateway or collector multiplexes its streams over a
    /// pool), each starting at its own stream so that the pool covers them evenly. Returns
    /// the connections with their starting index into the path list.
    pub async fn spread_pool(
        &self,
        ctx: &Ctx,
        scenario: &str,
        streams: usize,
        connections: usize,
        content_type: &str,
        timeout: Duration,
    ) -> Result<Pool, String> {
        let paths: Vec<String> = (0..streams)
            .map(|i| self.stream_path(&self.stream_name(scenario, i)))
            .collect();
        let mut setup = Conn::new(self.addr, timeout);
        self.ensure_bucket(&mut setup).await?;
        for i in ctx.mine(streams) {
            self.create_stream(&mut setup, &paths[i], content_type)
                .await?;
        }
        let conns = ctx
            .mine(connections)
            .map(|j| (Conn::new(self.addr, timeout), j % streams))
            .collect();
        Ok(Pool {
            conns,
            paths: paths.into(),
        })
    }

    /// Creates a stream (`201`; `200` if an identical one exists).
    pub async fn create_stream(
        &self,
        conn: &mut Conn,
        path: &str,
        content_type: &str,
    ) -> Result<bool, String> {
        let r = conn
            .request("PUT", path, &[("Content-Type", content_type)], Body::Empty)
            .await
            .map_err(|e| format!("PUT {path}: {e}"))?;
        match r.status {
            201 => Ok(true),
            200 => Ok(false),
            s => Err(format!("PUT {path}: status {s}")),
        }
    }
}

/// A pool of connections that share every stream (see `Target::spread_pool`).
pub struct Pool {
    /// Each connection with the index of the first stream it sends to.
    pub conns: Vec<(Conn, usize)>,
    pub paths: std::rc::Rc<[String]>,
}

/// The streams one sender writes to, in turn: one stream, or all of a pool's.
#[derive(Clone)]
pub struct Rotation {
    paths: std::rc::Rc<[String]>,
    next: usize,
}

impl Rotation {
    pub fn one(path: String) -> Rotation {
        Rotation {
            paths: vec![path].into(),
            next: 0,
        }
    }

    pub fn starting_at(paths: std::rc::Rc<[String]>, first: usize) -> Rotation {
        let next = if paths.is_empty() {
            0
        } else {
            first % paths.len()
        };
        Rotation { paths, next }
    }

    /// The path for the next request.
    pub fn advance(&mut self) -> &str {
        let i = self.next;
        self.next = (i + 1) % self.paths.len();
        &self.paths[i]
    }
}

/// Appends during setup (not measured); any failure aborts the run.
pub async fn setup_append(
    conn: &mut Conn,
    path: &str,
    content_type: &str,
    body: Body<'_>,
) -> Result<Response, String> {
    let r = conn
        .request("POST", path, &[("Content-Type", content_type)], body)
        .await
        .map_err(|e| format!("POST {path}: {e}"))?;
    if !(200..300).contains(&r.status) {
        return Err(format!("POST {path}: status {}", r.status));
    }
    Ok(r)
}

/// Key under which a non-success status is counted.
pub fn status_key(status: u16) -> String {
    status.to_string()
}

pub fn err_key(e: &ReqError) -> String {
    e.key().to_string()
}

/// The measured window, computed by each core right after the start barrier.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: Instant,
    pub warm_end: Instant,
    pub end: Instant,
}

impl Window {
    pub fn starting_at(start: Instant, warmup: Duration, duration: Duration) -> Window {
        Window {
            start,
            warm_end: start + warmup,
            end: start + warmup + duration,
        }
    }

    /// Whether an operation that finished at `t` is counted.
    pub fn counts(&self, t: Instant) -> bool {
        t >= self.warm_end && t <= self.end
    }

    pub fn over(&self) -> bool {
        Instant::now() >= self.end
    }
}

/// What each core's scenario function gets.
#[derive(Clone)]
pub struct Ctx {
    pub core: usize,
    pub cores: usize,
    barrier: Arc<Barrier>,
    start: Arc<OnceLock<Window>>,
}

impl Ctx {
    /// Waits until every core reaches this point. Only call it when the core has no
    /// other tasks in flight (it blocks the thread).
    pub fn sync(&self) {
        self.barrier.wait();
    }

    /// The measured window, identical on every core (the first core to ask fixes the
    /// start), so that events stamped on one core are judged alike on another.
    pub fn window(&self, warmup: Duration, duration: Duration) -> Window {
        let start = self.start.get_or_init(|| {
            let window = Window::starting_at(Instant::now(), warmup, duration);
            cpu::sample_over(window);
            mark_window(window);
            window
        });
        Window::starting_at(start.start, warmup, duration)
    }

    /// Indices `0..n` assigned to this core (round-robin).
    pub fn mine(&self, n: usize) -> impl Iterator<Item = usize> {
        (self.core..n).step_by(self.cores)
    }
}

/// The CPUs given with `--cpus`, set once by `main` before any core starts.
pub static PIN_TO: OnceLock<Vec<usize>> = OnceLock::new();

/// The path given with `--window-marks`, set once by `main` before any core starts.
pub static WINDOW_MARKS: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Creates `PATH.start` and `PATH.end` at the window's edges, from a thread of its own (a
/// core may be busy at the instant). A file that cannot be created is reported, not fatal:
/// the run's own figures do not depend on it.
fn mark_window(window: Window) {
    let Some(path) = WINDOW_MARKS.get().cloned() else {
        return;
    };
    let marker = move || {
        for (at, suffix) in [(window.warm_end, "start"), (window.end, "end")] {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let mut name = path.clone().into_os_string();
            name.push(".");
            name.push(suffix);
            if let Err(e) = std::fs::File::create(&name) {
                eprintln!(
                    "--window-marks: cannot create {}: {e}",
                    name.to_string_lossy()
                );
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("loadgen-marks".into())
        .spawn(marker)
    {
        eprintln!("--window-marks: no thread for the marks: {e}");
    }
}

pub fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Runs `f` on `cores` threads, each pinned to one CPU with its own monoio runtime, and
/// collects their results (in core order).
pub fn run_cores<T, F, Fut>(cores: usize, f: F) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, String>> + 'static,
{
    let cores = cores.max(1);
    let ncpu = available_cores();
    let pin_to = PIN_TO.get().filter(|c| !c.is_empty()).cloned();
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(cores));
    let start = Arc::new(OnceLock::new());
    let mut handles = Vec::with_capacity(cores);
    for core in 0..cores {
        let f = f.clone();
        let cpu = pin_to.as_ref().map_or(core % ncpu, |c| c[core % c.len()]);
        let ctx = Ctx {
            core,
            cores,
            barrier: barrier.clone(),
            start: start.clone(),
        };
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{core}"))
            .spawn(move || -> Result<T, String> {
                let _ = monoio::utils::bind_to_cpu_set([cpu]);
                let mut rt = client_runtime().map_err(|e| format!("core {core}: runtime: {e}"))?;
                rt.block_on(f(ctx))
            })
            .map_err(|e| format!("spawn thread: {e}"))?;
        handles.push(h);
    }
    let progress = crate::progress::Progress::start();
    let mut out = Vec::with_capacity(cores);
    let mut first_err = None;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(t)) => out.push(t),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(format!("core {i} panicked"));
            }
        }
    }
    progress.finish();
    if let Some(window) = start.get() {
        cpu::collect(window);
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

type ClientRuntime =
    monoio::FusionRuntime<TimeDriver<monoio::IoUringDriver>, TimeDriver<monoio::LegacyDriver>>;

/// A core's event loop. The client shares the host's CPUs with the server it measures, so
/// its ring runs completion work cooperatively (`IORING_SETUP_COOP_TASKRUN`, as the
/// server's does): a response arriving from another CPU is processed when this thread next
/// enters the kernel rather than through an IPI. Kernels before 5.19 get a plain ring.
fn client_runtime() -> std::io::Result<ClientRuntime> {
    let on = |ring| {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .with_entries(1024)
            .uring_builder(ring)
            .enable_timer()
            .build()
    };
    let mut cooperative = io_uring::IoUring::builder();
    cooperative.setup_coop_taskrun();
    on(cooperative).or_else(|_| on(io_uring::IoUring::builder()))
}

/// Runs a setup future, then the start barrier (always reached, so one core's failure
/// cannot strand the others), then returns the setup result.
pub async fn setup_then_sync<T>(
    ctx: &Ctx,
    setup: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let r = setup.await;
    ctx.sync();
    r
}

/// Merges per-core stats.
/// Wait for every task of a core and merge their statistics.
pub async fn join_merged(tasks: Vec<monoio::task::JoinHandle<Stats>>) -> Stats {
    let mut parts = Vec::with_capacity(tasks.len());
    for t in tasks {
        parts.push(t.await);
    }
    merge_all(parts)
}

pub fn merge_all(parts: Vec<Stats>) -> Stats {
    let mut total = Stats::default();
    for p in parts {
        total.merge(p);
    }
    total
}

/// Deterministic payload bytes for stream `stream`, append `seq` (xorshift; printable so
/// that text content types stay valid).
pub fn pattern(stream: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut x =
        (stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for b in x.to_le_bytes() {
            if out.len() == len {
                break;
            }
            out.push(b'!' + (b % 94));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_size("256"), Ok(256));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("32m"), Ok(32 << 20));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn pattern_is_deterministic_and_distinct() {
        assert_eq!(pattern(1, 2, 100), pattern(1, 2, 100));
        assert_ne!(pattern(1, 2, 100), pattern(1, 3, 100));
        assert_eq!(pattern(5, 5, 37).len(), 37);
        assert!(pattern(5, 5, 1000).iter().all(|b| b.is_ascii_graphic()));
    }

    #[test]
    fn rotation_visits_every_path_in_turn() {
        let paths: std::rc::Rc<[String]> = vec!["a".into(), "b".into(), "c".into()].into();
        let mut r = Rotation::starting_at(paths, 4);
        let seen: Vec<String> = (0..6).map(|_| r.advance().to_string()).collect();
        assert_eq!(seen, ["b", "c", "a", "b", "c", "a"]);
        let mut one = Rotation::one("x".into());
        assert_eq!(one.advance(), "x");
        assert_eq!(one.advance(), "x");
    }

    #[test]
    fn target_paths() {
        let c = Common {
            target: "http://127.0.0.1:4437/".into(),
            surface: Surface::Bucketed,
            bucket: "bench".into(),
            cores: None,
            cpus: Vec::new(),
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(1),
            prefix: "lg".into(),
            run_id: None,
            json: None,
            svg: None,
            window_marks: None,
        };
        let t = Target::from_common(&c).unwrap();
        assert_eq!(t.stream_path("s"), "/bench/s");
        assert_eq!(t.base, "http://127.0.0.1:4437");
        let mut c2 = c.clone();
        c2.surface = Surface::Compat;
        assert_eq!(
            Target::from_common(&c2).unwrap().stream_path("s"),
            "/v1/stream/s"
        );
        c2.target = "https://x:1".into();
        assert!(Target::from_common(&c2).is_err());
        let mut c3 = c;
        c3.bucket = "ab".into();
        assert!(Target::from_common(&c3).is_err());
    }
}

/// The load generator's own CPU time over the measured window. It shares the host's cores
/// with the server it measures, so a server's throughput is only comparable alongside what
/// the client spent to drive it.
pub mod cpu {
    use std::sync::{Mutex, OnceLock};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use super::Window;

    static SAMPLER: Mutex<Option<JoinHandle<Option<Duration>>>> = Mutex::new(None);
    static OVER_WINDOW: OnceLock<Duration> = OnceLock::new();

    /// CPU time (user + system, every thread) spent inside the window, once it has been
    /// collected; `None` when the run stopped before its window ended.
    pub fn over_window() -> Option<Duration> {
        OVER_WINDOW.get().copied()
    }

    /// Starts a thread that samples the process's CPU time at the window's edges.
    pub(super) fn sample_over(window: Window) {
        let sampler = std::thread::Builder::new()
            .name("loadgen-cpu".into())
            .spawn(move || {
                sleep_until(window.warm_end);
                let start = process_cpu()?;
                sleep_until(window.end);
                Some(process_cpu()?.saturating_sub(start))
            });
        if let (Ok(handle), Ok(mut slot)) = (sampler, SAMPLER.lock()) {
            *slot = Some(handle);
        }
    }

    /// Records the sample once the window is over. A run whose cores finished before the
    /// window ended has no figure (the sampler is left to finish on its own).
    pub(super) fn collect(window: &Window) {
        if Instant::now() < window.end {
            return;
        }
        let handle = SAMPLER.lock().ok().and_then(|mut slot| slot.take());
        if let Some(Ok(Some(cpu))) = handle.map(JoinHandle::join) {
            let _ = OVER_WINDOW.set(cpu);
        }
    }

    fn sleep_until(t: Instant) {
        std::thread::sleep(t.saturating_duration_since(Instant::now()));
    }

    fn process_cpu() -> Option<Duration> {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
        // SAFETY: getrusage writes a whole `rusage` into the pointer it is given, which
        // points at storage of exactly that type; the value is read only when it returns 0.
        let usage = unsafe {
            if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
                return None;
            }
            usage.assume_init()
        };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        Some(tv(usage.ru_utime) + tv(usage.ru_stime))
    }
}

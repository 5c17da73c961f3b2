//! Thread-per-core runtime: one pinned monoio event loop per core, each with its own
//! `SO_REUSEPORT` listener and its own storage shard.
//!
//! A stream key hashes to exactly one owner core. A request that arrives on another core is
//! handed to the owner as a boxed closure over an unbounded channel, runs there against the
//! owner's shard, and its response travels back on a oneshot channel. Nothing on the request
//! path is shared between cores, so nothing is locked.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ursula_storage::{Durability, Shard, ShardConfig};

use crate::config::{Config, StorageMode};
use crate::ops::Listener;

/// Work sent to another core: runs there with that core's context.
pub type Job = Box<dyn FnOnce(Rc<Core>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// One core's context. Lives on (and never leaves) its thread.
pub struct Core {
    pub index: usize,
    pub shard: Shard,
    pub config: Arc<Config>,
    peers: Arc<Vec<async_channel::Sender<Job>>>,
    pub shutdown: Arc<AtomicBool>,
    /// Cores still finishing their requests after shutdown started (see `serve`).
    draining: Arc<AtomicUsize>,
    /// Requests being processed on this core (for graceful shutdown).
    pub inflight: Cell<usize>,
    /// Open client connections on this core, against `max_connections_per_core`.
    connections: Cell<usize>,
    /// The listening socket, shut down to end the accept loop.
    listener_fd: Cell<Option<std::os::unix::io::RawFd>>,
    /// The admin (metrics) listener, on core 0 only.
    admin_fd: Cell<Option<std::os::unix::io::RawFd>>,
    /// Request counters, read by `/metrics` through a job on this core.
    pub metrics: crate::ops::CoreMetrics,
    /// Live feeds of SSE readers on this core (see `feed`).
    pub feeds: crate::feed::Feeds,
    /// Access-log rate limit: the current second, lines written in it, lines left out.
    access_window: Cell<(u64, u32, u64)>,
    /// Live readers (long-poll, SSE) to wake when shutdown starts, one slot per waiting
    /// task, removed when its wait ends.
    shutdown_waiters: std::cell::RefCell<std::collections::HashMap<u64, std::task::Waker>>,
    next_waiter: Cell<u64>,
    rng: Cell<u64>,
}

/// Why a cross-core call did not complete.
#[derive(Debug)]
pub struct Unavailable;

impl Core {
    pub fn cores(&self) -> usize {
        self.peers.len()
    }

    /// The core owning `key`. Stable for a given core count (FNV-1a).
    pub fn owner_of(&self, key: &str) -> usize {
        owner_of(key, self.peers.len())
    }

    /// Run `f` on core `core` and return its result here.
    pub async fn on<R, F, Fut>(self: &Rc<Self>, core: usize, f: F) -> Result<R, Unavailable>
    where
        F: FnOnce(Rc<Core>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + 'static,
        R: Send + 'static,
    {
        if core == self.index {
            return Ok(f(self.clone()).await);
        }
        let (tx, rx) = futures_channel::oneshot::channel();
        let job: Job = Box::new(move |owner| {
            Box::pin(async move {
                let _ = tx.send(f(owner).await);
            })
        });
        self.peers[core].try_send(job).map_err(|_| Unavailable)?;
        rx.await.map_err(|_| Unavailable)
    }

    /// Hand a client connection (between requests, with the bytes already read past the
    /// last one) to core `target`, which counts and serves it from then on. If that core's
    /// queue is gone (shutdown), the job and with it the socket are dropped, which closes
    /// the connection as shutdown would have.
    pub fn adopt_on(
        &self,
        target: usize,
        socket: std::net::TcpStream,
        peer: SocketAddr,
        rbuf: Vec<u8>,
    ) {
        let job: Job = Box::new(move |core: Rc<Core>| {
            Box::pin(async move {
                let slot = ConnectionSlot::take(&core);
                crate::conn::serve_moved(core, socket, peer, rbuf).await;
                drop(slot);
            })
        });
        let _ = self.peers[target].try_send(job);
    }

    /// A cheap per-core pseudo-random number (cursor jitter); not for secrets.
    pub fn random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }

    /// Open connections, and live readers (long-poll, SSE) waiting on this core: on a
    /// stream it owns, or at the tail of one of its feeds.
    pub fn load(&self) -> (usize, usize) {
        // The expiry sweeper holds one waiter slot, except during its synchronous pass,
        // which a job on this same thread can never observe.
        let waiting = self.shutdown_waiters.try_borrow().map_or(0, |w| w.len());
        (
            self.connections.get(),
            waiting.saturating_sub(1) + self.feeds.waiting(),
        )
    }

    /// Whether an access-log line may be written now; `Some(n)` carries the number of
    /// lines suppressed since the last one written.
    pub fn access_log_permit(&self) -> Option<u64> {
        let now = ursula_storage::now_ms() as u64 / 1000;
        let (second, written, suppressed) = self.access_window.get();
        let written = if second == now { written } else { 0 };
        if written >= self.config.access_log_per_sec {
            self.access_window.set((now, written, suppressed + 1));
            return None;
        }
        self.access_window.set((now, written + 1, 0));
        Some(suppressed)
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Wait for `changed` to resolve, `wait` to pass, or shutdown to start, whichever is
    /// first. Live readers use this so shutdown never waits for their timeouts.
    pub async fn wait_or_shutdown<F: std::future::Future>(&self, changed: F, wait: Duration) {
        let id = self.next_waiter.get();
        self.next_waiter.set(id + 1);
        // The slot is given back however the wait ends (change, timeout, or drop).
        let _slot = WaiterSlot { core: self, id };
        let mut changed = std::pin::pin!(changed);
        let either = std::future::poll_fn(|cx| {
            if self.shutting_down() {
                return std::task::Poll::Ready(());
            }
            let mut waiters = self.shutdown_waiters.borrow_mut();
            match waiters.get_mut(&id) {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => {
                    waiters.insert(id, cx.waker().clone());
                }
            }
            drop(waiters);
            changed.as_mut().poll(cx).map(|_| ())
        });
        let _ = monoio::time::timeout(wait, either).await;
    }

    /// Make the pending `accept` fail so the accept loop ends; no connection is lost.
    fn stop_accepting(&self) {
        for (_, w) in self.shutdown_waiters.borrow_mut().drain() {
            w.wake();
        }
        self.feeds.notify_all();
        for fd in [self.listener_fd.take(), self.admin_fd.take()]
            .into_iter()
            .flatten()
        {
            // SAFETY: fd is one of this core's listening sockets, still open (each listener is
            // owned by its accept loop, which only closes it after it has observed this
            // shutdown).
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    }
}

/// One counted connection; the count drops however the connection task ends.
struct ConnectionSlot(Rc<Core>);

impl ConnectionSlot {
    fn take(core: &Rc<Core>) -> ConnectionSlot {
        core.connections.set(core.connections.get() + 1);
        ConnectionSlot(core.clone())
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0
            .connections
            .set(self.0.connections.get().saturating_sub(1));
    }
}

/// A live reader's registration in `Core::shutdown_waiters`, removed on drop.
struct WaiterSlot<'a> {
    core: &'a Core,
    id: u64,
}

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.core.shutdown_waiters.try_borrow_mut() {
            waiters.remove(&self.id);
        }
    }
}

pub fn owner_of(key: &str, cores: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % cores as u64) as usize
}

/// Start every core, print the listening line once all have recovered and are accepting,
/// and return when a shutdown signal has been handled.
pub fn run(config: Config) -> Result<(), String> {
    let config = Arc::new(config);
    // Held until the process exits (the kernel releases it on kill -9 too).
    let _data_dir_lock = match config.storage {
        StorageMode::Disk => Some(lock_data_dir(&config)?),
        StorageMode::Memory => None,
    };
    if config.storage == StorageMode::Disk {
        check_layout(&config)?;
    }
    let listeners = bind_listeners(config.listen, config.cores)?;
    let addr = listeners[0]
        .local_addr()
        .map_err(|e| format!("listener address: {e}"))?;
    let mut admin = match config.metrics_listen {
        Some(a) => Some(bind_admin(a)?),
        None => None,
    };
    let admin_addr = match &admin {
        Some(l) => Some(l.local_addr().map_err(|e| format!("admin address: {e}"))?),
        None => None,
    };
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..config.cores)
        .map(|_| async_channel::unbounded::<Job>())
        .unzip();
    let peers = Arc::new(senders);
    let shutdown = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicUsize::new(config.cores));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let mut threads = Vec::new();
    for (index, (listener, inbox)) in listeners.into_iter().zip(receivers).enumerate() {
        let config = config.clone();
        let peers = peers.clone();
        let stopping = (shutdown.clone(), draining.clone());
        let ready = ready_tx.clone();
        let listener = Listeners {
            main: listener,
            admin: if index == 0 { admin.take() } else { None },
        };
        let thread = std::thread::Builder::new()
            .name(format!("ursula-core-{index}"))
            .spawn(move || {
                core_thread(index, config, listener, inbox, peers, stopping, ready);
            })
            .map_err(|e| format!("spawn core thread: {e}"))?;
        threads.push(thread);
    }
    drop(ready_tx);
    for _ in 0..config.cores {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a core exited during start-up".into()),
        }
    }
    crate::ops::mark_started();
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!("ursula listening on {scheme}://{addr}");
    if let Some(a) = admin_addr {
        println!("ursula admin listening on http://{a}");
    }
    tracing::info!(%addr, cores = config.cores, storage = ?config.storage, "ready");
    // Every core has recovered and is accepting, so readiness is true from here on.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("sd_notify READY: {e}");
    }
    if let Some(interval) = sd_notify::watchdog_enabled() {
        start_watchdog(interval, peers.clone())?;
    }
    wait_for_signal()?;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("shutting down: no new connections, finishing requests");
    shutdown.store(true, Ordering::SeqCst);
    for p in peers.iter() {
        let _ = p.try_send(Box::new(|core| {
            Box::pin(async move { core.stop_accepting() })
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Send `WATCHDOG=1` every half interval, but only while every core's event loop still
/// runs jobs: a wedged core stops the keep-alives and systemd restarts the service.
fn start_watchdog(
    interval: Duration,
    peers: Arc<Vec<async_channel::Sender<Job>>>,
) -> Result<(), String> {
    use std::sync::atomic::AtomicU64;
    let period = (interval / 2).max(Duration::from_millis(10));
    let seen: Arc<Vec<AtomicU64>> = Arc::new(peers.iter().map(|_| AtomicU64::new(0)).collect());
    std::thread::Builder::new()
        .name("ursula-watchdog".into())
        .spawn(move || {
            for round in 1u64.. {
                for (index, peer) in peers.iter().enumerate() {
                    let seen = seen.clone();
                    let _ = peer.try_send(Box::new(move |_core| {
                        Box::pin(async move { seen[index].store(round, Ordering::Relaxed) })
                    }));
                }
                std::thread::sleep(period);
                // The jobs had a whole period to run; a core that missed it is stuck.
                if seen.iter().all(|s| s.load(Ordering::Relaxed) >= round) {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                } else {
                    tracing::warn!("a core did not answer the watchdog round; not notifying");
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("spawn watchdog thread: {e}"))
}

fn bind_admin(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let l = bind_exclusive(addr)?;
    l.set_nonblocking(true)
        .map_err(|e| format!("nonblocking: {e}"))?;
    Ok(l)
}

/// A core's listening sockets: the shared stream port, and on core 0 the admin port.
struct Listeners {
    main: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
}

fn wait_for_signal() -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("signal handler: {e}"))?;
    let _ = signals.forever().next();
    Ok(())
}

/// The data directory remembers how many shards it was created with; streams are placed by
/// hashing over that count, so starting with a different one would hide data.
fn check_layout(config: &Config) -> Result<(), String> {
    let dir = &config.data_dir;
    ursula_storage::segment::create_dir_durable(dir)
        .map_err(|e| format!("data dir {}: {e}", dir.display()))?;
    let meta = dir.join("ursula.layout");
    match std::fs::read_to_string(&meta) {
        Ok(text) => {
            let shards: usize = text
                .trim()
                .strip_prefix("shards=")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{} is malformed", meta.display()))?;
            if shards != config.cores {
                return Err(format!(
                    "data dir {} was created with {shards} cores; start with --cores {shards}",
                    dir.display()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join("ursula.layout.tmp");
            std::fs::write(&tmp, format!("shards={}\n", config.cores))
                .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|()| std::fs::rename(&tmp, &meta))
                .and_then(|()| ursula_storage::segment::sync_dir(dir))
                .map_err(|e| format!("write {}: {e}", meta.display()))
        }
        Err(e) => Err(format!("read {}: {e}", meta.display())),
    }
}

/// Two servers on one data dir would corrupt it: take an exclusive lock for our lifetime.
fn lock_data_dir(config: &Config) -> Result<std::fs::File, String> {
    use std::os::unix::io::AsRawFd;
    let dir = &config.data_dir;
    // A new data dir's own entry must survive a power cut, or everything in it goes too.
    ursula_storage::segment::create_dir_durable(dir)
        .map_err(|e| format!("data dir {}: {e}", dir.display()))?;
    let path = dir.join("ursula.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock only reads the fd, which `file` keeps open.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(format!(
            "data dir {} is in use by another ursula process",
            dir.display()
        ));
    }
    Ok(file)
}

/// How long a start waits for a port that is still in use. After a `kill -9` under load
/// the kernel keeps the dead process's listening socket for about 2 s while it tears down
/// its io_uring (the socket even accepts connections nobody answers), so a supervisor
/// restarting at once would otherwise lose that start. A port held by a live server is
/// still refused, only later.
const BIND_RETRY: Duration = Duration::from_secs(10);

/// A plain (not `SO_REUSEPORT`) bind of `addr`, retried while the address is in use for at
/// most [`BIND_RETRY`].
fn bind_exclusive(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => {
                if warned {
                    tracing::info!("bound {addr} after {:?}", started.elapsed());
                }
                return Ok(l);
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < BIND_RETRY =>
            {
                if !warned {
                    warned = true;
                    tracing::warn!(
                        "bind {addr}: {e}; retrying for up to {BIND_RETRY:?} (the socket of a \
                         process that just died lingers while the kernel closes it)"
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("bind {addr}: {e}")),
        }
    }
}

fn bind_listeners(addr: SocketAddr, cores: usize) -> Result<Vec<std::net::TcpListener>, String> {
    use socket2::{Domain, Protocol, Socket, Type};
    // Our per-core listeners share the port through SO_REUSEPORT, which would also let us
    // join a port another server holds and silently split its traffic. A plain bind first
    // proves the port is free.
    if addr.port() != 0 {
        drop(bind_exclusive(addr)?);
    }
    let mut out = Vec::with_capacity(cores);
    let mut addr = addr;
    for _ in 0..cores {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| format!("socket: {e}"))?;
        socket
            .set_reuse_address(true)
            .and_then(|()| socket.set_reuse_port(true))
            .and_then(|()| socket.set_nodelay(true))
            .map_err(|e| format!("socket options: {e}"))?;
        socket
            .bind(&addr.into())
            .map_err(|e| format!("bind {addr}: {e}"))?;
        socket.listen(1024).map_err(|e| format!("listen: {e}"))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| format!("nonblocking: {e}"))?;
        let listener: std::net::TcpListener = socket.into();
        // Every further core binds the port the first one got (matters for port 0).
        addr = listener
            .local_addr()
            .map_err(|e| format!("local addr: {e}"))?;
        out.push(listener);
    }
    Ok(out)
}

fn core_thread(
    index: usize,
    config: Arc<Config>,
    listeners: Listeners,
    inbox: async_channel::Receiver<Job>,
    peers: Arc<Vec<async_channel::Sender<Job>>>,
    (shutdown, draining): (Arc<AtomicBool>, Arc<AtomicUsize>),
    ready: mpsc::Sender<Result<(), String>>,
) {
    if let Err(e) = monoio::utils::bind_to_cpu_set([index % num_cpus()]) {
        tracing::warn!(core = index, "could not pin thread: {e:?}");
    }
    let runtime = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(1024)
        .enable_timer()
        .build();
    let mut runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("core {index}: runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let durability = match config.storage {
            StorageMode::Disk => Durability::Disk(config.data_dir.clone()),
            StorageMode::Memory => Durability::Memory,
        };
        let mut shard_cfg = ShardConfig::new(index as u32, durability);
        shard_cfg.receipt_window = config.receipt_window;
        shard_cfg.segment_bytes = config.segment_bytes;
        shard_cfg.cache_bytes = config.cache_bytes;
        shard_cfg.write_budget_bytes = config.write_budget_bytes;
        shard_cfg.fail_fsync_after = fault_fail_fsync_after();
        let shard = match ursula_storage::Shard::open(shard_cfg).await {
            Ok((shard, report)) => {
                tracing::info!(
                    core = index,
                    streams = report.streams,
                    records = report.records,
                    log_bytes = report.log_bytes,
                    dropped_bytes = report.dropped_bytes,
                    ms = report.elapsed.as_millis() as u64,
                    "recovered"
                );
                shard
            }
            Err(e) => {
                let _ = ready.send(Err(format!("core {index}: open storage: {e}")));
                return;
            }
        };
        let listener = match monoio::net::TcpListener::from_std(listeners.main) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(format!("core {index}: listener: {e}")));
                return;
            }
        };
        let listener_fd = std::os::unix::io::AsRawFd::as_raw_fd(&listener);
        let admin = match listeners.admin.map(monoio::net::TcpListener::from_std) {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => {
                let _ = ready.send(Err(format!("core {index}: admin listener: {e}")));
                return;
            }
        };
        let core = Rc::new(Core {
            index,
            shard,
            config,
            peers,
            shutdown,
            draining,
            inflight: Cell::new(0),
            connections: Cell::new(0),
            listener_fd: Cell::new(None),
            admin_fd: Cell::new(admin.as_ref().map(std::os::unix::io::AsRawFd::as_raw_fd)),
            metrics: Default::default(),
            feeds: Default::default(),
            access_window: Cell::new((0, 0, 0)),
            shutdown_waiters: std::cell::RefCell::new(std::collections::HashMap::new()),
            next_waiter: Cell::new(0),
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1) ^ ursula_storage::now_ms() as u64,
            ),
        });
        core.listener_fd.set(Some(listener_fd));
        let _ = ready.send(Ok(()));
        let admin = admin.map(|l| {
            let core = core.clone();
            monoio::spawn(async move { serve_admin(core, l).await })
        });
        serve(core, listener, inbox).await;
        if let Some(admin) = admin {
            admin.await;
        }
    });
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

async fn serve(
    core: Rc<Core>,
    listener: monoio::net::TcpListener,
    inbox: async_channel::Receiver<Job>,
) {
    let jobs = {
        let core = core.clone();
        let inbox = inbox.clone();
        monoio::spawn(async move {
            while let Ok(job) = inbox.recv().await {
                monoio::spawn(job(core.clone()));
            }
        })
    };
    let sweeper = {
        let core = core.clone();
        monoio::spawn(async move { sweep_expired(core).await })
    };
    let heartbeat = {
        let core = core.clone();
        monoio::spawn(async move { heartbeat(core).await })
    };
    // One accept is always pending and never cancelled: dropping an io_uring accept that
    // already completed would lose that connection. Shutdown ends it via stop_accepting().
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let core = core.clone();
                if core.connections.get() >= core.config.max_connections_per_core {
                    monoio::spawn(async move {
                        match core.config.tls.clone() {
                            None => crate::conn::refuse_connection(core, stream).await,
                            Some(tls) => {
                                let timeout = core.config.header_timeout;
                                if let Some(s) = tls.accept(stream, peer, timeout).await {
                                    crate::conn::refuse_connection(core, s).await;
                                }
                            }
                        }
                    });
                    continue;
                }
                let slot = ConnectionSlot::take(&core);
                monoio::spawn(async move {
                    match core.config.tls.clone() {
                        None => {
                            crate::conn::serve_connection(core, stream, peer, Listener::Main).await
                        }
                        Some(tls) => {
                            // The handshake counts against the connection cap (the slot is
                            // taken) and has the request-head deadline.
                            let timeout = core.config.header_timeout;
                            if let Some(s) = tls.accept(stream, peer, timeout).await {
                                crate::conn::serve_connection(core, s, peer, Listener::Main).await;
                            }
                        }
                    }
                    drop(slot);
                });
            }
            Err(_) if core.shutting_down() => break,
            Err(e) => {
                tracing::warn!(core = core.index, "accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    // Finish what is in flight (live readers are woken by the shutdown and end at once).
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while core.inflight.get() > 0 && std::time::Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another core's requests may still need this one (a request handed to the stream's
    // owner, an SSE session stepping there), so keep running jobs until every core is
    // done. A job queued to a core that had stopped polling would never answer, and its
    // caller would hold its core for the whole deadline.
    core.draining.fetch_sub(1, Ordering::SeqCst);
    while core.draining.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
    // From here a job sent to this core fails at once, and one already queued is dropped
    // with its reply channel, so its caller gets an error rather than no answer.
    inbox.close();
    while inbox.try_recv().is_ok() {}
    if let Err(e) = core.shard.shutdown().await {
        tracing::error!(core = core.index, "final flush failed: {e}");
    }
    drop(jobs);
    drop(sweeper);
    drop(heartbeat);
}

/// The admin listener: operational endpoints only. Its connections are not counted
/// against `max_connections`, so a scrape still works when clients use up the cap.
async fn serve_admin(core: Rc<Core>, listener: monoio::net::TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let core = core.clone();
                monoio::spawn(async move {
                    crate::conn::serve_connection(core, stream, peer, Listener::Admin).await;
                });
            }
            Err(_) if core.shutting_down() => break,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Expiry is decided at request time (P§15); this pass also deletes expired streams nobody
/// asks for, so their log space is reclaimed.
async fn sweep_expired(core: Rc<Core>) {
    while !core.shutting_down() {
        core.wait_or_shutdown(std::future::pending::<()>(), Duration::from_secs(1))
            .await;
        for key in core.shard.keys() {
            // find() deletes the stream if it has expired.
            let _ = crate::handlers::find(&core, &key);
        }
    }
}

/// How often each core's heartbeat timer is due.
const HEARTBEAT: Duration = Duration::from_millis(10);

/// Records how late this core runs a timer that is due every `HEARTBEAT`: the time its event
/// loop spent away from its timers, in one long task or with the thread not scheduled. A
/// stall anywhere on the core shows here (`ursula_core_loop_lag_seconds`), however brief the
/// requests around it were.
async fn heartbeat(core: Rc<Core>) {
    while !core.shutting_down() {
        let due = std::time::Instant::now() + HEARTBEAT;
        monoio::time::sleep(HEARTBEAT).await;
        core.metrics
            .loop_lag(std::time::Instant::now().saturating_duration_since(due));
    }
}

/// Fault injection for the test suite (`server/tests/faults.rs`): with
/// `URSULA_FAULT_FAIL_FSYNC_AFTER=N` in the environment, each core's flush after N
/// successful ones fails as if fdatasync had returned EIO. Never set in production.
fn fault_fail_fsync_after() -> Option<u64> {
    let n = std::env::var("URSULA_FAULT_FAIL_FSYNC_AFTER")
        .ok()?
        .parse()
        .ok()?;
    tracing::warn!("fault injection: fdatasync will fail after {n} flushes");
    Some(n)
}

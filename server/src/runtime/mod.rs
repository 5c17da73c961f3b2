//! The process: bind the port, start one pinned thread per core (`core_thread`), print the
//! listening line once every core has recovered its shard, and stop on SIGTERM/SIGINT.

mod core_thread;
mod watchdog;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::config::{Config, StorageMode};
use crate::core::Mailboxes;
use crate::hop::Mailbox;
use crate::limits::{BIND_RETRY, LISTEN_BACKLOG};

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
    // Claims the archive (or refuses to start) before any core opens its shard.
    if let Some(tier) = &config.cold {
        crate::cold::start(tier, &config.data_dir, config.cores)?;
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
    let peers: Mailboxes = Arc::new((0..config.cores).map(|_| Mailbox::default()).collect());
    let shutdown = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicUsize::new(config.cores));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let mut threads = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
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
                core_thread::run(index, config, listener, peers, stopping, ready);
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
    crate::admin::mark_started();
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
        watchdog::start(interval, peers.clone())?;
    }
    wait_for_signal()?;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("shutting down: no new connections, finishing requests");
    shutdown.store(true, Ordering::SeqCst);
    for p in peers.iter() {
        let _ = p.post(Box::new(|core| {
            core.stop_accepting();
            crate::live::feed::notify_all();
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    // Every core has stopped and reported its final durable end.
    crate::cold::finish();
    tracing::info!("stopped");
    Ok(())
}

fn bind_admin(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let l = bind_exclusive(addr)?;
    l.set_nonblocking(true)
        .map_err(|e| format!("nonblocking: {e}"))?;
    Ok(l)
}

/// A core's listening sockets: the shared stream port, and on core 0 the admin port.
pub struct Listeners {
    pub main: std::net::TcpListener,
    pub admin: Option<std::net::TcpListener>,
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

/// A plain (not `SO_REUSEPORT`) bind of `addr`, retried while the address is in use for at
/// most [`BIND_RETRY`](crate::limits::BIND_RETRY).
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
        socket
            .listen(LISTEN_BACKLOG)
            .map_err(|e| format!("listen: {e}"))?;
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

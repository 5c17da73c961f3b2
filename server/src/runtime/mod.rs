//! The process: bind the port, start one pinned thread per core (`core_thread`), print the
//! listening line once every core has recovered its shard, and stop on SIGTERM/SIGINT.

mod core_thread;
mod start_error;
mod watchdog;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::config::{AssignMode, Config, LogsMode, StorageMode, DEFAULT_LANE_LOGS_PER_CORE};
use crate::core::Mailboxes;
use crate::hop::Mailbox;
use crate::lane_table::LaneTable;
use crate::limits::{BIND_RETRY, LISTEN_BACKLOG};
pub use start_error::StartError;
use ursula_storage::placement::{Placement, DEFAULT_LANES};

/// Start every core, print the listening line once all have recovered and are accepting,
/// and return when a shutdown signal has been handled.
pub fn run(config: Config) -> Result<(), StartError> {
    let config = Arc::new(config);
    // Held until the process exits (the kernel releases it on kill -9 too).
    let _data_dir_lock = match config.storage {
        StorageMode::Disk => Some(lock_data_dir(&config)?),
        StorageMode::Memory => None,
    };
    let placement = check_layout(&config)?;
    // Claims the archive (or refuses to start) before any core opens its shard.
    if let Some(tier) = &config.cold {
        crate::cold::start(tier, &config.data_dir, placement, config.cluster)?;
    }
    let held = crate::cold::archive().map_or_else(Vec::new, |a| a.held());
    let lanes = Arc::new(LaneTable::new(placement.shards(), config.cluster, &held));
    if config.cluster {
        tracing::info!(lanes = ?held, "cluster host: serving the lanes it still owns");
    }
    let listeners = bind_listeners(config.listen, config.cores)?;
    let mut core_ports = match config.core_listen {
        Some(first) => bind_core_ports(first, config.cores)?,
        None => Vec::new(),
    }
    .into_iter();
    let addr = listeners[0]
        .local_addr()
        .map_err(StartError::os("listener address"))?;
    let mut admin = match config.metrics_listen {
        Some(a) => Some(bind_admin(a)?),
        None => None,
    };
    let admin_addr = match &admin {
        Some(l) => Some(l.local_addr().map_err(StartError::os("admin address"))?),
        None => None,
    };
    let peers: Mailboxes = Arc::new((0..config.cores).map(|_| Mailbox::default()).collect());
    let shutdown = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicUsize::new(config.cores));
    let bucket_limits = Arc::new(crate::rate_limit::BucketLimits::default());
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StartError>>();
    let mut threads = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let config = config.clone();
        let peers = peers.clone();
        let stopping = (shutdown.clone(), draining.clone());
        let bucket_limits = bucket_limits.clone();
        let lanes = lanes.clone();
        let ready = ready_tx.clone();
        let listener = Listeners {
            main: listener,
            own: core_ports.next(),
            admin: if index == 0 { admin.take() } else { None },
        };
        let thread = std::thread::Builder::new()
            .name(format!("ursula-core-{index}"))
            .spawn(move || {
                core_thread::run(
                    index,
                    config,
                    listener,
                    (peers, bucket_limits, placement, lanes),
                    stopping,
                    ready,
                );
            })
            .map_err(StartError::os("spawn core thread"))?;
        threads.push(thread);
    }
    drop(ready_tx);
    for _ in 0..config.cores {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(StartError::CoreExited),
        }
    }
    crate::lanes::start_membership(
        config.clone(),
        lanes.clone(),
        peers.clone(),
        placement.shards(),
        shutdown.clone(),
    )
    .map_err(StartError::os("spawn membership thread"))?;
    crate::admin::mark_started();
    // Taken before the listening line: a SIGHUP from whoever waits for that line must not
    // meet the default action, which ends the process.
    let signals = signal_hook::iterator::Signals::new(STOP_AND_RELOAD)
        .map_err(StartError::os("signal handler"))?;
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
    wait_for_signal(signals, &config);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    // A host that places its lanes itself gives them to the others before it goes; one
    // whose lanes the operator places keeps them, to serve again when it is back.
    if config.cluster && config.cluster_assign == AssignMode::Auto {
        leave_cluster(&peers);
    }
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

/// Give every lane up to the other hosts before stopping (see `lanes::drain`), while the
/// cores still serve everything else.
fn leave_cluster(peers: &Mailboxes) {
    tracing::info!("leaving the cluster: releasing every lane");
    let (done, left) = mpsc::channel::<()>();
    let posted = peers[0].post(Box::new(move |core| {
        let core = core.clone();
        monoio::spawn(async move {
            crate::lanes::drain(core).await;
            let _ = done.send(());
        });
    }));
    if posted.is_ok() && left.recv_timeout(LEAVE_TIMEOUT).is_err() {
        tracing::warn!(
            "leaving the cluster took over {} s; stopping anyway",
            LEAVE_TIMEOUT.as_secs()
        );
    }
}

/// Longest a clean stop of a cluster host waits for its lanes to be released.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);

fn bind_admin(addr: SocketAddr) -> Result<std::net::TcpListener, StartError> {
    let l = bind_exclusive(addr)?;
    l.set_nonblocking(true)
        .map_err(StartError::os("nonblocking"))?;
    Ok(l)
}

/// A core's listening sockets: the shared stream port, the core's own port (with
/// `core_listen`), and on core 0 the admin port.
pub struct Listeners {
    pub main: std::net::TcpListener,
    pub own: Option<std::net::TcpListener>,
    pub admin: Option<std::net::TcpListener>,
}

/// Wait for SIGTERM or SIGINT. SIGHUP (`systemctl reload`) reloads the token file
/// meanwhile: the cores pick the new tokens up at their next request, and connections
/// stay open. A file that cannot be used keeps the tokens in force, and the log says why.
fn wait_for_signal(mut signals: signal_hook::iterator::Signals, config: &Config) {
    for signal in signals.forever() {
        if signal != signal_hook::consts::SIGHUP {
            break;
        }
        match &config.auth {
            None => tracing::info!("SIGHUP: no auth token file to reload"),
            Some(file) => match file.reload() {
                Ok(path) => tracing::info!("reloaded auth tokens from {}", path.display()),
                Err(e) => tracing::error!("kept the auth tokens in force: {e}"),
            },
        }
    }
}

const STOP_AND_RELOAD: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// How streams are placed on the cores. A data directory remembers the placement it was
/// created with (`ursula.layout`, see `ursula_storage::placement`): a different core or
/// lane count would look for existing streams on the wrong shard and hide them.
fn check_layout(config: &Config) -> Result<Placement, StartError> {
    let cores = config.cores as u32;
    let wanted = || match config.logs {
        Some(LogsMode::Lane) => {
            let lanes = config.lanes.unwrap_or(DEFAULT_LANE_LOGS_PER_CORE * cores);
            Placement::lane_logs(lanes).map_err(StartError::Lanes)
        }
        _ => {
            let lanes = config.lanes.unwrap_or(DEFAULT_LANES.max(cores));
            Placement::with_lanes(cores, lanes).map_err(StartError::Lanes)
        }
    };
    if config.storage == StorageMode::Memory {
        return wanted();
    }
    let dir = &config.data_dir;
    ursula_storage::segment::create_dir_durable(dir).map_err(|source| StartError::DataDir {
        dir: dir.clone(),
        source,
    })?;
    let meta = dir.join("ursula.layout");
    match std::fs::read_to_string(&meta) {
        Ok(text) => {
            let placement = Placement::from_layout_text(&text)
                .map_err(|_| StartError::LayoutMalformed(meta.clone()))?;
            let log_per_lane = placement.log_per_lane();
            if config
                .logs
                .is_some_and(|l| (l == LogsMode::Lane) != log_per_lane)
            {
                return Err(StartError::LogsChanged {
                    dir: dir.clone(),
                    log_per_lane,
                });
            }
            if !placement.fits_cores(config.cores) {
                return Err(match placement {
                    Placement::LaneLogs { lanes } => StartError::CoresBeyondLanes {
                        dir: dir.clone(),
                        lanes,
                    },
                    _ => StartError::CoresChanged {
                        dir: dir.clone(),
                        created: placement.shards() as usize,
                    },
                });
            }
            if config.lanes.is_some() && config.lanes != placement.lanes() {
                return Err(StartError::LanesChanged {
                    dir: dir.clone(),
                    created: placement.lanes(),
                });
            }
            Ok(placement)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let placement = wanted()?;
            let tmp = dir.join("ursula.layout.tmp");
            std::fs::write(&tmp, placement.to_layout_text())
                .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|()| std::fs::rename(&tmp, &meta))
                .and_then(|()| ursula_storage::segment::sync_dir(dir))
                .map_err(|source| StartError::File {
                    what: "write",
                    path: meta,
                    source,
                })?;
            Ok(placement)
        }
        Err(source) => Err(StartError::File {
            what: "read",
            path: meta,
            source,
        }),
    }
}

/// Two servers on one data dir would corrupt it: take an exclusive lock for our lifetime.
fn lock_data_dir(config: &Config) -> Result<std::fs::File, StartError> {
    use std::os::unix::io::AsRawFd;
    let dir = &config.data_dir;
    // A new data dir's own entry must survive a power cut, or everything in it goes too.
    ursula_storage::segment::create_dir_durable(dir).map_err(|source| StartError::DataDir {
        dir: dir.clone(),
        source,
    })?;
    let path = dir.join("ursula.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| StartError::File {
            what: "open",
            path: path.clone(),
            source,
        })?;
    // SAFETY: flock only reads the fd, which `file` keeps open.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(StartError::DataDirInUse(dir.clone()));
    }
    Ok(file)
}

/// A plain (not `SO_REUSEPORT`) bind of `addr`, retried while the address is in use for at
/// most [`BIND_RETRY`](crate::limits::BIND_RETRY).
fn bind_exclusive(addr: SocketAddr) -> Result<std::net::TcpListener, StartError> {
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
            Err(source) => return Err(StartError::Bind { addr, source }),
        }
    }
}

/// One port per core from `first` upward, each bound by that core alone (no
/// `SO_REUSEPORT`): a connection there is always accepted by the core the port names.
fn bind_core_ports(
    first: SocketAddr,
    cores: usize,
) -> Result<Vec<std::net::TcpListener>, StartError> {
    (0..cores)
        .map(|index| {
            let mut addr = first;
            // Config checked that `cores` ports from `first` fit below 65536.
            addr.set_port(first.port() + index as u16);
            listen_on(addr, false)
        })
        .collect()
}

fn bind_listeners(
    addr: SocketAddr,
    cores: usize,
) -> Result<Vec<std::net::TcpListener>, StartError> {
    // Our per-core listeners share the port through SO_REUSEPORT, which would also let us
    // join a port another server holds and silently split its traffic. A plain bind first
    // proves the port is free.
    if addr.port() != 0 {
        drop(bind_exclusive(addr)?);
    }
    let mut out = Vec::with_capacity(cores);
    let mut addr = addr;
    for _ in 0..cores {
        let listener = listen_on(addr, true)?;
        // Every further core binds the port the first one got (matters for port 0).
        addr = listener
            .local_addr()
            .map_err(StartError::os("local addr"))?;
        out.push(listener);
    }
    Ok(out)
}

/// A non-blocking listening socket on `addr` with Nagle off for the connections it accepts;
/// `shared` lets every core bind the same address (`SO_REUSEPORT`).
fn listen_on(addr: SocketAddr, shared: bool) -> Result<std::net::TcpListener, StartError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(StartError::os("socket"))?;
    socket
        .set_reuse_address(true)
        .and_then(|()| socket.set_reuse_port(shared))
        .and_then(|()| socket.set_nodelay(true))
        .map_err(StartError::os("socket options"))?;
    socket
        .bind(&addr.into())
        .map_err(|source| StartError::Bind { addr, source })?;
    socket
        .listen(LISTEN_BACKLOG)
        .map_err(StartError::os("listen"))?;
    socket
        .set_nonblocking(true)
        .map_err(StartError::os("nonblocking"))?;
    Ok(socket.into())
}

//! One core's thread: its monoio runtime, its shards, and its tasks (accept loop, mailbox,
//! expiry sweep, heartbeat), until shutdown has drained it.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use monoio::time::TimeDriver;
use ursula_storage::placement::Placement;

use crate::admin::Listener;
use crate::config::Config;
use crate::conn::{self, Ends};
use crate::core::{ConnectionSlot, Core, CoreParts, Mailboxes};
use crate::lane_table::{LaneState, LaneTable};
use crate::limits::{EXPIRY_SWEEP, HEARTBEAT, SHUTDOWN_DRAIN, URING_ENTRIES};
use crate::lookup::{find, Found};
use crate::rate_limit::BucketLimits;
use crate::removal;
use crate::runtime::{Listeners, StartError};

pub fn run(
    index: usize,
    config: Arc<Config>,
    listeners: Listeners,
    (peers, bucket_limits, placement, lanes): (
        Mailboxes,
        Arc<BucketLimits>,
        Placement,
        Arc<LaneTable>,
    ),
    (shutdown, draining): (Arc<AtomicBool>, Arc<AtomicUsize>),
    ready: mpsc::Sender<Result<(), StartError>>,
) {
    // The thread still has the mask it inherited, so every core reads the same list.
    let cpus = allowed_cpus();
    if let Err(e) = monoio::utils::bind_to_cpu_set([cpus[index % cpus.len()]]) {
        tracing::warn!(core = index, "could not pin thread: {e:?}");
    }
    let mut runtime = match build_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(StartError::Core {
                core: index,
                what: "runtime",
                source: e,
            }));
            return;
        }
    };
    runtime.block_on(async move {
        let shards = match open_shards(index, &config, &placement, &lanes).await {
            Ok(shards) => shards,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let adopt = |l: std::net::TcpListener, what: &'static str| {
            monoio::net::TcpListener::from_std(l).map_err(|source| StartError::Core {
                core: index,
                what,
                source,
            })
        };
        let adopted = adopt(listeners.main, "listener").and_then(|main| {
            let own = listeners.own.map(|l| adopt(l, "core port listener"));
            let admin = listeners.admin.map(|l| adopt(l, "admin listener"));
            Ok((main, own.transpose()?, admin.transpose()?))
        });
        let (listener, own, admin) = match adopted {
            Ok(listeners) => listeners,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let listener_fd = std::os::unix::io::AsRawFd::as_raw_fd(&listener);
        let core = Rc::new(Core::new(CoreParts {
            index,
            shards,
            config,
            peers,
            bucket_limits,
            placement,
            lanes,
            shutdown,
            draining,
            after_adoption: crate::handlers::buckets::refresh_after_adoption,
        }));
        core.admin_fd
            .set(admin.as_ref().map(std::os::unix::io::AsRawFd::as_raw_fd));
        core.listener_fd.set(Some(listener_fd));
        core.own_listener_fd
            .set(own.as_ref().map(std::os::unix::io::AsRawFd::as_raw_fd));
        let _ = ready.send(Ok(()));
        let admin = admin.map(|l| {
            let core = core.clone();
            monoio::spawn(async move { serve_admin(core, l).await })
        });
        serve(core, listener, own).await;
        if let Some(admin) = admin {
            admin.await;
        }
    });
}

/// Open (recovering) every shard of core `index` this host serves, one after another, in
/// the core's slot order (lowest number first; see `CoreParts::shards`): all of them, or
/// in a cluster the lanes it still owns (`lanes`).
async fn open_shards(
    index: usize,
    config: &Config,
    placement: &Placement,
    lanes: &LaneTable,
) -> Result<Vec<Option<ursula_storage::Shard>>, StartError> {
    let numbers: Vec<u32> = (index as u32..placement.shards())
        .step_by(config.cores)
        .collect();
    let mut shards = Vec::with_capacity(numbers.len());
    for number in numbers {
        if lanes.state(number) != LaneState::Served {
            shards.push(None);
            continue;
        }
        let shard = crate::shards::open_shard(index, config, placement, number)
            .await
            .map_err(|source| StartError::Storage {
                core: index,
                shard: number,
                source,
            })?;
        shards.push(Some(shard));
    }
    Ok(shards)
}

/// The CPUs this thread may run on, lowest first: the mask the server was started with
/// (`taskset`, systemd's `CPUAffinity=`), so core N pins to the N-th CPU it was given and
/// never to one the operator kept for something else. All CPUs if the mask is unreadable.
fn allowed_cpus() -> Vec<usize> {
    let every = || (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    // SAFETY: `cpu_set_t` is a plain bit array, valid when zeroed; sched_getaffinity writes
    // at most the size it is given into it, and CPU_ISSET only reads bits below
    // CPU_SETSIZE, which is that array's size in bits.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return every();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    };
    if cpus.is_empty() {
        every()
    } else {
        cpus
    }
}

async fn serve(
    core: Rc<Core>,
    listener: monoio::net::TcpListener,
    own: Option<monoio::net::TcpListener>,
) {
    let letters = {
        let core = core.clone();
        monoio::spawn(async move { read_letters(core).await })
    };
    let sweeper = {
        let core = core.clone();
        monoio::spawn(async move { sweep_expired(core).await })
    };
    let heartbeat = {
        let core = core.clone();
        monoio::spawn(async move { heartbeat(core).await })
    };
    // A cluster host stops serving the lanes it loses from core 0 (this ends at once on a
    // single host).
    let lost_lanes = (core.index == 0).then(|| {
        let core = core.clone();
        monoio::spawn(async move { crate::lanes::drop_lost_lanes(core).await })
    });
    let own = own.map(|l| {
        let core = core.clone();
        monoio::spawn(async move { accept_all(&core, l).await })
    });
    accept_all(&core, listener).await;
    if let Some(own) = own {
        own.await;
    }
    // Finish what is in flight (live readers are woken by the shutdown and end at once).
    let deadline = std::time::Instant::now() + SHUTDOWN_DRAIN;
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
    // From here a letter sent to this core fails at once, and one already queued is dropped
    // with its reply channel, so its caller gets an error rather than no answer.
    drop(core.peers[core.index].close());
    for shard in core.shards() {
        if let Err(e) = shard.shutdown().await {
            tracing::error!(
                core = core.index,
                shard = shard.config().shard,
                "final flush failed: {e}"
            );
        }
    }
    drop(letters);
    drop(sweeper);
    drop(heartbeat);
    drop(lost_lanes);
}

/// Accept connections on `listener` and serve each, until shutdown stops accepting.
async fn accept_all(core: &Rc<Core>, listener: monoio::net::TcpListener) {
    // One accept is always pending and never cancelled: dropping an io_uring accept that
    // already completed would lose that connection. Shutdown ends it via stop_accepting().
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let core = core.clone();
                if core.connections() >= core.config.max_connections_per_core {
                    monoio::spawn(async move {
                        match core.config.tls.clone() {
                            None => conn::refuse_connection(core, stream).await,
                            Some(tls) => {
                                let timeout = core.config.header_timeout;
                                if let Some(s) = tls.accept(stream, peer, timeout).await {
                                    conn::refuse_connection(core, s).await;
                                }
                            }
                        }
                    });
                    continue;
                }
                let slot = ConnectionSlot::take(&core);
                let ends = Ends {
                    peer,
                    local: stream.local_addr().ok(),
                };
                monoio::spawn(async move {
                    match core.config.tls.clone() {
                        None => conn::serve_connection(core, stream, ends, Listener::Main).await,
                        Some(tls) => {
                            // The handshake counts against the connection cap (the slot is
                            // taken) and has the request-head deadline.
                            let timeout = core.config.header_timeout;
                            if let Some(s) = tls.accept(stream, peer, timeout).await {
                                conn::serve_connection(core, s, ends, Listener::Main).await;
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
}

/// Runs every letter other cores post to this core, a whole mailbox at a time, until the
/// mailbox is closed.
async fn read_letters(core: Rc<Core>) {
    let mut batch = Vec::new();
    while core.peers[core.index].take(&mut batch).await {
        for letter in batch.drain(..) {
            letter(&core);
        }
    }
}

/// The admin listener: operational endpoints only. Its connections are not counted
/// against `max_connections`, so a scrape still works when clients use up the cap.
async fn serve_admin(core: Rc<Core>, listener: monoio::net::TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let core = core.clone();
                let ends = Ends {
                    peer,
                    local: stream.local_addr().ok(),
                };
                monoio::spawn(async move {
                    conn::serve_connection(core, stream, ends, Listener::Admin).await;
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

/// Expiry is decided at request time (P§15): an expired stream is gone for every reader.
/// This pass deletes the expired streams, so their log space is reclaimed.
async fn sweep_expired(core: Rc<Core>) {
    while !core.shutting_down() {
        core.wait_or_shutdown(std::future::pending::<()>(), EXPIRY_SWEEP)
            .await;
        // Only streams that may have expired: resident ones with a lifetime, and dormant
        // ones past the deadline they slept with (the others stay asleep).
        for shard in core.shards() {
            for id in shard.expiry_candidates(ursula_storage::now_ms()) {
                let Some(key) = shard.stream(id).map(|s| s.key().to_string()) else {
                    continue;
                };
                if let Ok(Found::Expired(id)) = find(&core, &key) {
                    removal::remove_expired(&core, id);
                }
            }
        }
    }
}

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

type CoreRuntime =
    monoio::FusionRuntime<TimeDriver<monoio::IoUringDriver>, TimeDriver<monoio::LegacyDriver>>;

/// The core's event loop, on a cooperative ring where the kernel has one (see
/// [`cooperative_runtime`]), else on a plain one.
fn build_runtime() -> std::io::Result<CoreRuntime> {
    cooperative_runtime().or_else(|e| {
        tracing::debug!("io_uring without cooperative task running: {e}");
        runtime_on(io_uring::IoUring::builder())
    })
}

/// An event loop whose ring runs completion work cooperatively
/// (`IORING_SETUP_COOP_TASKRUN`): a completion that arrives from another CPU (a socket
/// becoming readable, an io-wq worker finishing a write or an fdatasync) is processed the
/// next time this thread enters the kernel, instead of interrupting it with an IPI per
/// completion. monoio enters the kernel before every look at its completion queue (each
/// loop turn of a busy core, and to wait when idle), so no completion is seen any later.
/// Kernels before 5.19 refuse the flag.
fn cooperative_runtime() -> std::io::Result<CoreRuntime> {
    let mut ring = io_uring::IoUring::builder();
    ring.setup_coop_taskrun();
    runtime_on(ring)
}

fn runtime_on(ring: io_uring::Builder) -> std::io::Result<CoreRuntime> {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(URING_ENTRIES)
        .uring_builder(ring)
        .enable_timer()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's rings are cooperative on the kernels we run on, and such a ring still
    /// completes everything a core waits for: file writes, fdatasync, reads and timers.
    #[test]
    fn a_cooperative_ring_completes_writes_syncs_reads_and_timers() {
        let runtime = cooperative_runtime().expect("the kernel takes IORING_SETUP_COOP_TASKRUN");
        let monoio::FusionRuntime::Uring(mut runtime) = runtime else {
            panic!("io_uring is available here, so the runtime must not be the legacy one");
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ring-check");
        runtime.block_on(async move {
            let file = monoio::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .await
                .expect("create");
            let (written, _) = file.write_at(vec![7u8; 4096], 0).await;
            assert_eq!(written.expect("write"), 4096);
            file.sync_data().await.expect("fdatasync");
            let started = std::time::Instant::now();
            monoio::time::sleep(Duration::from_millis(5)).await;
            assert!(started.elapsed() >= Duration::from_millis(5));
            let (read, buf) = file.read_at(vec![0u8; 4096], 0).await;
            assert_eq!(read.expect("read"), 4096);
            assert!(buf.iter().all(|b| *b == 7));
        });
    }
}

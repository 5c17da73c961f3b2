//! One core's state and the cross-core hop.
//!
//! Every core runs one pinned monoio event loop with its own storage shards (see `runtime`):
//! one, or with a log per lane one for each lane on the core. A stream key hashes to
//! exactly one shard, and so to one owner core. A request that arrives on another core is
//! handed to the owner by [`Core::on`]: a letter posted to the owner's mailbox (`hop`)
//! starts it there as a task against the owner's shard, and its result is posted back to
//! the requesting core's mailbox, which completes the waiting request there. Nothing on
//! the request path is shared between cores but the mailboxes, whose locks are held for a
//! push or a swap.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ursula_storage::placement::Placement;
use ursula_storage::{Lifetime, Shard, StreamId, StreamMeta, WaiterIds, WaiterSet};

use crate::config::Config;
use crate::hop::Mailbox;
use crate::metrics::CoreMetrics;
use crate::rate_limit::{BucketLimits, LocalLimits};
use crate::tokens::{TokenFile, Tokens};

/// Work sent to another core: runs there, synchronously, with that core's context, as its
/// drain loop takes it from the mailbox (work that waits spawns a task).
pub type Letter = Box<dyn FnOnce(&Rc<Core>) + Send>;

/// Every core's mailbox, indexed by core.
pub type Mailboxes = Arc<Vec<Mailbox<Letter>>>;

/// One core's context. Lives on (and never leaves) its thread.
pub struct Core {
    pub index: usize,
    /// The shards this core runs, by number: shard `s` is at `s / cores` (see
    /// [`Core::shard`]). Never empty.
    shards: Vec<Shard>,
    pub config: Arc<Config>,
    /// Every core's mailbox, this one's included.
    pub peers: Mailboxes,
    /// Every bucket's rate limiter, shared by all cores.
    pub bucket_limits: Arc<BucketLimits>,
    /// Which core owns which key, as the data dir was created.
    pub placement: Placement,
    /// This core's cache of `bucket_limits`.
    pub limits: LocalLimits,
    /// The tokens this core last read from `config.auth`, with their generation.
    tokens: RefCell<Option<(u64, Arc<Tokens>)>>,
    pub shutdown: Arc<AtomicBool>,
    /// Cores still finishing their requests after shutdown started (see `runtime`).
    pub draining: Arc<AtomicUsize>,
    /// Requests being processed on this core (for graceful shutdown).
    pub inflight: Cell<usize>,
    /// Open client connections on this core, against `max_connections_per_core`.
    connections: Cell<usize>,
    /// Request-body bytes this core's connections are receiving, against
    /// `body_budget_bytes` (held and given back by the connection's body permits).
    pub body_bytes: Cell<usize>,
    /// The listening socket, shut down to end the accept loop.
    pub listener_fd: Cell<Option<std::os::unix::io::RawFd>>,
    /// This core's own port (`core_listen`), shut down with the shared one.
    pub own_listener_fd: Cell<Option<std::os::unix::io::RawFd>>,
    /// The admin (metrics) listener, on core 0 only.
    pub admin_fd: Cell<Option<std::os::unix::io::RawFd>>,
    /// Request counters, read by `/metrics` through a job on this core.
    pub metrics: CoreMetrics,
    /// Access-log rate limit: the current second, lines written in it, lines left out.
    access_window: Cell<(u64, u32, u64)>,
    /// Live readers (long-poll, SSE) to wake when shutdown starts, one slot per waiting
    /// task, removed when its wait ends.
    shutdown_waiters: WaiterSet,
    next_waiter: WaiterIds,
    rng: Cell<u64>,
}

/// What a core is made of when its thread starts.
pub struct CoreParts {
    pub index: usize,
    /// Every shard on core `index`, lowest number first.
    pub shards: Vec<Shard>,
    pub config: Arc<Config>,
    pub peers: Mailboxes,
    pub bucket_limits: Arc<BucketLimits>,
    pub placement: Placement,
    pub shutdown: Arc<AtomicBool>,
    pub draining: Arc<AtomicUsize>,
}

/// Why a cross-core call did not complete.
#[derive(Debug)]
pub struct Unavailable;

impl Core {
    /// A core with its parts. Panics without a shard: every core runs at least one.
    pub fn new(parts: CoreParts) -> Core {
        let index = parts.index;
        assert!(!parts.shards.is_empty(), "core {index} has no shard");
        Core {
            index,
            shards: parts.shards,
            config: parts.config,
            peers: parts.peers,
            bucket_limits: parts.bucket_limits,
            placement: parts.placement,
            limits: LocalLimits::default(),
            tokens: RefCell::new(None),
            shutdown: parts.shutdown,
            draining: parts.draining,
            inflight: Cell::new(0),
            connections: Cell::new(0),
            body_bytes: Cell::new(0),
            listener_fd: Cell::new(None),
            own_listener_fd: Cell::new(None),
            admin_fd: Cell::new(None),
            metrics: CoreMetrics::default(),
            access_window: Cell::new((0, 0, 0)),
            shutdown_waiters: WaiterSet::default(),
            next_waiter: WaiterIds::default(),
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1) ^ ursula_storage::now_ms() as u64,
            ),
        }
    }

    /// Run `f` with the tokens of `file` as last loaded. The core keeps its own reference
    /// and takes a new one only after a reload, so checking a request touches nothing
    /// another core writes.
    pub fn with_tokens<R>(&self, file: &TokenFile, f: impl FnOnce(&Tokens) -> R) -> R {
        let generation = file.generation();
        let mut cached = self.tokens.borrow_mut();
        if cached.as_ref().is_none_or(|(g, _)| *g != generation) {
            *cached = Some((generation, file.current()));
        }
        match cached.as_ref() {
            Some((_, tokens)) => f(tokens),
            None => f(&file.current()),
        }
    }

    pub fn cores(&self) -> usize {
        self.peers.len()
    }

    /// The core owning `key`, by the data dir's placement (lane, or the older hash).
    pub fn owner_of(&self, key: &str) -> usize {
        Placement::core_of_shard(self.placement.shard_of(key), self.cores())
    }

    /// The shard that holds `key`. Only its owner core asks.
    pub fn shard_for(&self, key: &str) -> &Shard {
        self.local_shard(self.placement.shard_of(key))
    }

    /// The shard stream `id` is in: the core's only one, or with a log per lane the one
    /// whose number the id carries.
    pub fn shard(&self, id: StreamId) -> &Shard {
        match self.placement.shard_of_id(id) {
            Some(shard) if self.shards.len() > 1 => self.local_shard(shard),
            _ => self.first_shard(),
        }
    }

    /// Every shard this core runs.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Whether `shard` is the one `key` is placed on: where a key kept in every shard (a
    /// bucket record) has its authoritative copy.
    pub fn is_home_of(&self, shard: &Shard, key: &str) -> bool {
        self.placement.shard_of(key) == shard.config().shard as usize
    }

    fn local_shard(&self, shard: usize) -> &Shard {
        debug_assert_eq!(Placement::core_of_shard(shard, self.cores()), self.index);
        self.shards
            .get(shard / self.cores())
            .unwrap_or_else(|| self.first_shard())
    }

    fn first_shard(&self) -> &Shard {
        // `Core::new` refuses an empty list.
        &self.shards[0]
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
        let home = self.index;
        let request: Letter = Box::new(move |owner: &Rc<Core>| {
            let owner = owner.clone();
            monoio::spawn(async move {
                let result = f(owner.clone()).await;
                // The reply is delivered by the requesting core itself, so waking the
                // waiting task is a local wake, and the replies of one batch (e.g. every
                // append of one commit) cost that core one wake-up. If that core is
                // stopping, the reply is dropped and the caller sees `Unavailable`.
                let reply: Letter = Box::new(move |_home| {
                    let _ = tx.send(result);
                });
                let _ = owner.peers[home].post(reply);
            });
        });
        self.peers[core].post(request).map_err(|_| Unavailable)?;
        rx.await.map_err(|_| Unavailable)
    }

    /// Post `letter` to core `core`'s mailbox. Gives it back when that core is stopping.
    pub fn post(&self, core: usize, letter: Letter) -> Result<(), Letter> {
        self.peers[core].post(letter)
    }

    /// The identity of a stream created now on this core: a fresh incarnation, created now.
    /// Create, fork and create-on-first-append all take it from here.
    pub fn new_stream_meta(
        &self,
        key: &str,
        content_type: &str,
        lifetime: Lifetime,
        ext: bytes::Bytes,
    ) -> StreamMeta {
        let now = ursula_storage::now_ms();
        StreamMeta {
            key: key.into(),
            incarnation: self.shard_for(key).next_incarnation(now),
            created_ms: now,
            content_type: content_type.into(),
            lifetime,
            ext,
        }
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

    /// Open client connections on this core.
    pub fn connections(&self) -> usize {
        self.connections.get()
    }

    /// Live readers (long-poll, SSE steps, feed pumps) waiting on a stream this core owns.
    pub fn waiting_on_streams(&self) -> usize {
        // The expiry sweeper holds one waiter slot, except during its synchronous pass,
        // which a job on this same thread can never observe.
        let waiting = self.shutdown_waiters.len();
        waiting.saturating_sub(1)
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
        let id = self.next_waiter.next();
        // The slot is given back however the wait ends (change, timeout, or drop).
        let _slot = WaiterSlot { core: self, id };
        let mut changed = std::pin::pin!(changed);
        let either = std::future::poll_fn(|cx| {
            if self.shutting_down() {
                return std::task::Poll::Ready(());
            }
            self.shutdown_waiters.register(id, cx.waker());
            changed.as_mut().poll(cx).map(|_| ())
        });
        let _ = monoio::time::timeout(wait, either).await;
    }

    /// Wake the live readers waiting on this core's streams, and make the pending
    /// `accept` fail so the accept loop ends; no connection is lost.
    pub fn stop_accepting(&self) {
        self.shutdown_waiters.wake_all();
        for fd in [
            self.listener_fd.take(),
            self.own_listener_fd.take(),
            self.admin_fd.take(),
        ]
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
pub struct ConnectionSlot(Rc<Core>);

impl ConnectionSlot {
    pub fn take(core: &Rc<Core>) -> ConnectionSlot {
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
        self.core.shutdown_waiters.unregister(self.id);
    }
}

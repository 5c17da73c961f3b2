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
use crate::lane_table::LaneTable;
pub use crate::lane_table::NotServed;
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
    /// The shards placed on this core (numbers `index`, `index + cores`, ...), shard `s` in
    /// slot `s / cores`; `None` while this core does not run it (a lane being adopted or
    /// released). Borrowed only for a lookup or a swap, never across an `.await`.
    shards: RefCell<Vec<Option<Shard>>>,
    pub config: Arc<Config>,
    /// Every core's mailbox, this one's included.
    pub peers: Mailboxes,
    /// Every bucket's rate limiter, shared by all cores.
    pub bucket_limits: Arc<BucketLimits>,
    /// Which core owns which key, as the data dir was created.
    pub placement: Placement,
    /// Which lanes this host serves now (all of them but in a cluster), shared by every
    /// core.
    pub lanes: Arc<LaneTable>,
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
    /// Started once a lane is adopted here, from `lanes`.
    pub after_adoption: AfterAdoption,
    next_waiter: WaiterIds,
    rng: Cell<u64>,
}

/// What a core is made of when its thread starts.
pub struct CoreParts {
    pub index: usize,
    /// The shards placed on core `index`, lowest number first: shard `s` in slot
    /// `s / cores`, `None` for one the core does not run.
    pub shards: Vec<Option<Shard>>,
    pub config: Arc<Config>,
    pub peers: Mailboxes,
    pub bucket_limits: Arc<BucketLimits>,
    pub placement: Placement,
    pub lanes: Arc<LaneTable>,
    pub shutdown: Arc<AtomicBool>,
    pub draining: Arc<AtomicUsize>,
    pub after_adoption: AfterAdoption,
}

/// What a layer above the core starts once this host adopted a lane (the server brings
/// the lane's bucket copies up to their records; see `handlers::buckets`).
pub type AfterAdoption = fn(Rc<Core>, u32);

/// Why a cross-core call did not complete.
#[derive(Debug)]
pub struct Unavailable;

impl Core {
    /// A core with its parts. It may run none of its shards yet: they can be installed
    /// later ([`Core::install_shard`]).
    pub fn new(parts: CoreParts) -> Core {
        let index = parts.index;
        let cores = parts.peers.len().max(1);
        let mut shards = parts.shards;
        // One slot per shard the placement puts here, so a later install has its slot.
        let slots = (index..parts.placement.shards() as usize)
            .step_by(cores)
            .count();
        debug_assert!(shards.len() <= slots, "core {index} given too many shards");
        debug_assert!(shards
            .iter()
            .enumerate()
            .all(|(slot, s)| s
                .as_ref()
                .is_none_or(|s| s.config().shard as usize == index + slot * cores)));
        shards.resize(slots, None);
        Core {
            index,
            shards: RefCell::new(shards),
            config: parts.config,
            peers: parts.peers,
            bucket_limits: parts.bucket_limits,
            placement: parts.placement,
            lanes: parts.lanes,
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
            after_adoption: parts.after_adoption,
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

    /// The shard that holds `key`. Only its owner core asks. Owned, so a handler keeps it
    /// across an `.await` without holding the slots borrowed while lanes come and go.
    pub fn shard_for(&self, key: &str) -> Result<Shard, NotServed> {
        self.held(self.placement.shard_of(key))
    }

    /// The shard stream `id` is in: the one whose number the id carries (a log per lane),
    /// or the core's only one (a log per core, whose ids do not carry it). Owned, like
    /// [`Core::shard_for`].
    pub fn shard(&self, id: StreamId) -> Result<Shard, NotServed> {
        match self.placement.shard_of_id(id) {
            Some(number) if self.shards.borrow().len() > 1 => self.held(number),
            _ => {
                let only = self.shards.borrow().first().cloned().flatten();
                only.ok_or(NotServed {
                    shard: self.index as u32,
                })
            }
        }
    }

    /// The shards this core runs now, lowest number first. A copy, so the caller may await
    /// while it goes through them and a shard installed or removed meanwhile changes
    /// nothing it holds.
    pub fn shards(&self) -> Vec<Shard> {
        self.shards.borrow().iter().flatten().cloned().collect()
    }

    /// Shard `number`, if this core runs it now.
    pub fn running_shard(&self, number: u32) -> Option<Shard> {
        let slot = self.slot(number as usize)?;
        self.shards.borrow().get(slot)?.clone()
    }

    /// Start serving a shard (a lane adopted): requests for its streams find it from now on.
    ///
    /// # Panics
    ///
    /// If the shard's number is not one this core runs by the placement: its requests
    /// would never be sent here.
    pub fn install_shard(&self, shard: Shard) {
        let number = shard.config().shard;
        let Some(slot) = self.slot(number as usize) else {
            panic!("shard {number} is not placed on core {}", self.index);
        };
        let mut shards = self.shards.borrow_mut();
        // Installing over a running shard would drop it without its final flush.
        debug_assert!(
            shards[slot].is_none(),
            "shard {number} is already installed"
        );
        shards[slot] = Some(shard);
    }

    /// Stop serving shard `number` (a lane released): requests for its streams are answered
    /// [`NotServed`] from now on. Returns the shard, for the caller to flush and close;
    /// `None` if this core did not run it.
    pub fn remove_shard(&self, number: u32) -> Option<Shard> {
        let slot = self.slot(number as usize)?;
        self.shards.borrow_mut().get_mut(slot)?.take()
    }

    /// Whether `shard` is the one `key` is placed on: where a key kept in every shard (a
    /// bucket record) has its authoritative copy.
    pub fn is_home_of(&self, shard: &Shard, key: &str) -> bool {
        self.placement.shard_of(key) == shard.config().shard as usize
    }

    /// Shard `number`, if this core runs it now.
    fn held(&self, number: usize) -> Result<Shard, NotServed> {
        let not_served = NotServed {
            shard: number as u32,
        };
        // Keys and ids are routed to their owner core before they get here.
        debug_assert_eq!(
            Placement::core_of_shard(number, self.cores()),
            self.index,
            "shard {number} asked for on the wrong core"
        );
        let slot = self.slot(number).ok_or(not_served)?;
        let shards = self.shards.borrow();
        shards.get(slot).cloned().flatten().ok_or(not_served)
    }

    /// The slot of shard `number` in `shards`, if the placement puts it on this core.
    fn slot(&self, number: usize) -> Option<usize> {
        let cores = self.cores().max(1);
        let on_this_core = number < self.placement.shards() as usize
            && Placement::core_of_shard(number, cores) == self.index;
        on_this_core.then_some(number / cores)
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
    /// Create, fork and create-on-first-append all take it from here. `shard` is the one
    /// that will hold the stream (`shard_for(key)`): it numbers the incarnations.
    pub fn new_stream_meta(
        &self,
        shard: &Shard,
        key: &str,
        content_type: &str,
        lifetime: Lifetime,
        ext: bytes::Bytes,
    ) -> StreamMeta {
        let now = ursula_storage::now_ms();
        StreamMeta {
            key: key.into(),
            incarnation: shard.next_incarnation(now),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerArgs;
    use ursula_storage::{Durability, ShardConfig};

    /// Shard `number` of `placement`, in memory.
    async fn open(placement: &Placement, number: u32) -> Shard {
        let mut cfg = ShardConfig::new(number, Durability::Memory);
        cfg.first_id = placement.first_id(number);
        Shard::open(cfg).await.expect("open").0
    }

    /// Core `index` of `cores`, running `shards` (in slot order).
    fn core(index: usize, cores: usize, placement: Placement, shards: Vec<Option<Shard>>) -> Core {
        let config = Config::resolve(ServerArgs {
            cores: Some(cores),
            ..Default::default()
        })
        .expect("config");
        Core::new(CoreParts {
            index,
            shards,
            config: Arc::new(config),
            peers: Arc::new((0..cores).map(|_| Mailbox::default()).collect()),
            bucket_limits: Arc::default(),
            placement,
            lanes: Arc::new(crate::lane_table::LaneTable::new(
                placement.shards(),
                false,
                &[],
            )),
            shutdown: Arc::default(),
            draining: Arc::default(),
            after_adoption: |_, _| {},
        })
    }

    /// A key `placement` puts on shard `shard`.
    fn key_on(placement: &Placement, shard: usize) -> String {
        (0..)
            .map(|n| format!("k{n}"))
            .find(|k| placement.shard_of(k) == shard)
            .expect("some key lands on every shard")
    }

    fn numbers(core: &Core) -> Vec<u32> {
        core.shards().iter().map(|s| s.config().shard).collect()
    }

    fn block_on(f: impl Future<Output = ()>) {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f);
    }

    #[test]
    fn a_lane_is_installed_and_removed_while_the_core_runs() {
        block_on(async {
            // Four lanes, a log each, on two cores: core 0 runs shards 0 and 2.
            let placement = Placement::lane_logs(4).expect("placement");
            let first = open(&placement, 0).await;
            let c = core(0, 2, placement, vec![Some(first)]);
            assert_eq!(numbers(&c), [0]);
            assert!(c.running_shard(0).is_some());
            assert!(c.running_shard(2).is_none(), "not adopted yet");
            assert!(c.running_shard(1).is_none(), "another core's");
            assert!(c.running_shard(6).is_none(), "past the placement");
            let (key, id) = (key_on(&placement, 2), placement.first_id(2));
            assert_eq!(c.shard_for(&key).err(), Some(NotServed { shard: 2 }));
            assert_eq!(c.shard(id).err(), Some(NotServed { shard: 2 }));

            c.install_shard(open(&placement, 2).await);
            assert_eq!(numbers(&c), [0, 2]);
            assert!(c.running_shard(2).is_some());
            assert_eq!(c.shard_for(&key).expect("served").config().shard, 2);
            assert_eq!(c.shard(id).expect("served").config().shard, 2);
            assert_eq!(c.shard(1).expect("served").config().shard, 0);

            let released = c.remove_shard(0).expect("was running");
            assert_eq!(released.config().shard, 0);
            assert_eq!(numbers(&c), [2]);
            assert_eq!(c.shard(1).err(), Some(NotServed { shard: 0 }));
            assert!(c.remove_shard(0).is_none(), "already released");
            assert!(c.remove_shard(1).is_none(), "another core's");
        });
    }

    #[test]
    fn with_a_log_per_core_every_id_is_in_the_core_s_one_shard() {
        block_on(async {
            let placement = Placement::with_lanes(2, 8).expect("placement");
            let only = open(&placement, 1).await;
            let c = core(1, 2, placement, vec![Some(only)]);
            // Ids do not carry the shard: every shard counts from 1.
            assert_eq!(c.shard(1).expect("served").config().shard, 1);
            assert_eq!(c.shard(1 << 41).expect("served").config().shard, 1);
            assert!(c.remove_shard(1).is_some());
            assert!(c.shards().is_empty(), "a core may run no shard");
            assert_eq!(c.shard(1).err(), Some(NotServed { shard: 1 }));
            let key = key_on(&placement, 1);
            assert_eq!(c.shard_for(&key).err(), Some(NotServed { shard: 1 }));
        });
    }
}

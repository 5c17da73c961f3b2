//! Live feeds: one per (core, stream) that has SSE readers on that core.
//!
//! Without a feed, every SSE session steps on the stream's owner core for every event: one
//! cross-core round trip, one wake-up and one read per subscriber per event, all of it on
//! the owner. With a thousand subscribers on one stream that saturates the owner while the
//! other cores idle. A feed instead brings each newly visible range to a subscriber core
//! once (one pump task per core and stream); that core's sessions cut their events from it
//! locally. A session outside the feed's window (catching up, or just started) steps on the
//! owner as before until it reaches the window, so the feed is only ever a shortcut.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use ursula_storage::{Offset, StreamId, WaiterIds, WaiterSet};

use crate::core::Core;
use crate::limits::{FEED_STEP_BYTES_MAX, FEED_WINDOW_BYTES};

/// Feeds of one core, keyed by (owner core, stream id); stream ids are never reused on a
/// shard, so a recreated stream gets a new feed.
#[derive(Default)]
struct Feeds {
    live: RefCell<HashMap<(usize, StreamId), Rc<Feed>>>,
}

thread_local! {
    /// This core's feeds. A core is one thread, so its feeds are thread-local state like
    /// the rest of the core's, kept here because the core itself knows nothing of SSE.
    static FEEDS: Feeds = Feeds::default();
}

/// A session's membership in a feed; leaving is dropping it.
pub struct Subscription {
    feed: Rc<Feed>,
}

/// What a session at `offset` can take from the feed right now.
pub enum Cut {
    /// The data from the offset to the feed's tail (whole appends), and the feed's view of
    /// the stream after it.
    Data {
        parts: Vec<Bytes>,
        end: Offset,
        tail: Offset,
        closed: bool,
    },
    /// The session is at the tail.
    AtTail { closed: bool },
    /// Not in the window (or the feed ended): step on the owner instead.
    Outside,
}

/// Join (or start) the feed of stream `id`, owned by core `owner`, as of `incarnation`.
pub fn subscribe(core: &Rc<Core>, owner: usize, id: StreamId, incarnation: u64) -> Subscription {
    let feed = FEEDS.with(|feeds| {
        let existing = feeds
            .live
            .borrow()
            .get(&(owner, id))
            .filter(|f| !f.ended.get() && f.incarnation == incarnation)
            .cloned();
        existing.unwrap_or_else(|| {
            let feed = Rc::new(Feed::new(owner, id, incarnation));
            feeds.live.borrow_mut().insert((owner, id), feed.clone());
            monoio::spawn(pump(core.clone(), feed.clone()));
            feed
        })
    });
    feed.subscribers.set(feed.subscribers.get() + 1);
    Subscription { feed }
}

/// Wake every session waiting on this core's feeds (shutdown: they end at their next look
/// at the core).
pub fn notify_all() {
    FEEDS.with(|feeds| {
        for feed in feeds.live.borrow().values() {
            feed.notify();
        }
    });
}

/// Sessions waiting at the tail of one of this core's feeds.
pub fn waiting() -> usize {
    FEEDS.with(|feeds| feeds.live.borrow().values().map(|f| f.waiters.len()).sum())
}

impl Subscription {
    pub fn feed(&self) -> &Feed {
        &self.feed
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let n = self.feed.subscribers.get().saturating_sub(1);
        self.feed.subscribers.set(n);
    }
}

pub struct Feed {
    owner: usize,
    id: StreamId,
    incarnation: u64,
    window: RefCell<Window>,
    /// Bumped on every change of the window; sessions wait for it to move.
    version: Cell<u64>,
    waiters: WaiterSet,
    next_waiter: WaiterIds,
    subscribers: Cell<usize>,
    /// The pump stopped (stream gone, shutdown, no subscribers left).
    ended: Cell<bool>,
}

/// Contiguous recent data `[base, tail)`, as the pump received it: each batch is one
/// pump step, so batch starts are the tails sessions were told about.
struct Window {
    /// `None` until the pump's first look at the stream.
    known: bool,
    base: Offset,
    tail: Offset,
    closed: bool,
    batches: VecDeque<Batch>,
    bytes: usize,
}

struct Batch {
    start: Offset,
    parts: Vec<Bytes>,
    len: usize,
}

impl Feed {
    fn new(owner: usize, id: StreamId, incarnation: u64) -> Feed {
        Feed {
            owner,
            id,
            incarnation,
            window: RefCell::new(Window {
                known: false,
                base: Offset::ZERO,
                tail: Offset::ZERO,
                closed: false,
                batches: VecDeque::new(),
                bytes: 0,
            }),
            version: Cell::new(0),
            waiters: WaiterSet::default(),
            next_waiter: WaiterIds::default(),
            subscribers: Cell::new(0),
            ended: Cell::new(false),
        }
    }

    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// The data for a session at `offset`: everything from there to the tail, as long as
    /// `offset` is where a batch starts (so JSON messages are whole) and it fits `max`.
    pub fn cut(&self, offset: Offset, max: usize) -> Cut {
        let w = self.window.borrow();
        if self.ended.get() || !w.known || offset < w.base || offset > w.tail {
            return Cut::Outside;
        }
        if offset == w.tail {
            return Cut::AtTail { closed: w.closed };
        }
        if (w.tail - offset) as usize > max {
            return Cut::Outside;
        }
        // Batches are few (the window is small); the live case is the last one.
        let Some(first) = w.batches.iter().rposition(|b| b.start == offset) else {
            return Cut::Outside;
        };
        let parts = w
            .batches
            .range(first..)
            .flat_map(|b| b.parts.iter().cloned())
            .collect();
        Cut::Data {
            parts,
            end: w.tail,
            tail: w.tail,
            closed: w.closed,
        }
    }

    /// Resolves once the window changes after `seen` (or the feed ends).
    pub async fn changed(&self, seen: u64) {
        let id = self.next_waiter.next();
        let _slot = FeedWaiter { feed: self, id };
        std::future::poll_fn(|cx| {
            if self.version.get() != seen || self.ended.get() {
                return Poll::Ready(());
            }
            self.waiters.register(id, cx.waker());
            Poll::Pending
        })
        .await
    }

    fn notify(&self) {
        self.version.set(self.version.get() + 1);
        self.waiters.wake_all();
    }

    /// Take in one pump step: `parts` are the bytes `[from, tail)` when the pump could read
    /// them; without them (a gap, a failed read) the window restarts at `tail`.
    fn advance(&self, from: Offset, parts: Option<Vec<Bytes>>, tail: Offset, closed: bool) {
        let mut w = self.window.borrow_mut();
        match parts {
            Some(parts) if w.known && from == w.tail && tail > from => {
                let len = parts.iter().map(Bytes::len).sum::<usize>();
                debug_assert_eq!(len as u64, tail - from);
                w.bytes += len;
                w.batches.push_back(Batch {
                    start: from,
                    parts,
                    len,
                });
                while w.bytes > FEED_WINDOW_BYTES && w.batches.len() > 1 {
                    if let Some(old) = w.batches.pop_front() {
                        w.bytes -= old.len;
                    }
                    w.base = w.batches.front().map_or(tail, |b| b.start);
                }
            }
            _ if w.known && tail == w.tail => {}
            _ => {
                w.batches.clear();
                w.bytes = 0;
                w.base = tail;
            }
        }
        w.known = true;
        w.tail = tail;
        w.closed = closed;
        drop(w);
        self.notify();
    }

    fn end(&self) {
        self.ended.set(true);
        self.notify();
    }
}

/// A session's slot in `Feed::waiters`, removed however its wait ends.
struct FeedWaiter<'a> {
    feed: &'a Feed,
    id: u64,
}

impl Drop for FeedWaiter<'_> {
    fn drop(&mut self) {
        self.feed.waiters.unregister(self.id);
    }
}

/// What one pump step learned on the owner.
enum Step {
    /// Nothing changed before the wait ran out.
    Same,
    /// The stream is gone or was recreated.
    Gone,
    Changed {
        version: u64,
        tail: Offset,
        closed: bool,
        parts: Option<Vec<Bytes>>,
    },
}

/// Keep `feed` current until it has no subscribers, the stream goes, or shutdown starts.
async fn pump(core: Rc<Core>, feed: Rc<Feed>) {
    let wait = core.config.sse_keepalive;
    // u64::MAX: no version seen yet, so the first step answers at once.
    let mut seen = u64::MAX;
    loop {
        if feed.subscribers.get() == 0 || core.shutting_down() {
            break;
        }
        let from = {
            let w = feed.window.borrow();
            w.known.then_some(w.tail)
        };
        let (id, incarnation) = (feed.id, feed.incarnation);
        let step = core
            .on(feed.owner, move |owner| async move {
                step_on_owner(&owner, id, incarnation, seen, from, wait).await
            })
            .await;
        match step {
            Ok(Step::Same) => {}
            Ok(Step::Changed {
                version,
                tail,
                closed,
                parts,
            }) => {
                seen = version;
                feed.advance(from.unwrap_or(tail), parts, tail, closed);
            }
            Ok(Step::Gone) | Err(_) => break,
        }
    }
    feed.end();
    FEEDS.with(|feeds| {
        let mut live = feeds.live.borrow_mut();
        if live
            .get(&(feed.owner, feed.id))
            .is_some_and(|f| Rc::ptr_eq(f, &feed))
        {
            live.remove(&(feed.owner, feed.id));
        }
    });
}

/// On the owner: wait (at most `wait`) for the stream to move past version `seen`, then
/// read what became visible after `from`.
async fn step_on_owner(
    core: &Rc<Core>,
    id: StreamId,
    incarnation: u64,
    seen: u64,
    from: Option<Offset>,
    wait: Duration,
) -> Step {
    // A lane moving away ends the feed; its sessions step on the owner, which answers them.
    let Ok(shard) = core.shard(id) else {
        return Step::Gone;
    };
    if shard.stopped() {
        return Step::Gone;
    }
    let current = match shard.stream(id) {
        Some(s) if s.incarnation() == incarnation => s.version(),
        _ => return Step::Gone,
    };
    if current == seen {
        core.wait_or_shutdown(shard.changed(id, seen), wait).await;
    }
    let (version, tail, closed) = match shard.stream(id) {
        Some(s) if s.incarnation() == incarnation => (s.version(), s.next_offset(), s.is_closed()),
        _ => return Step::Gone,
    };
    if version == seen {
        // An idle interval: the subscribers' keep-alives count as access (sliding TTL).
        shard.touch(id, ursula_storage::now_ms());
        return Step::Same;
    }
    let parts = match from {
        Some(from) if tail > from && tail - from <= FEED_STEP_BYTES_MAX => {
            shard.read(id, from, tail).await.ok()
        }
        _ => None,
    };
    Step::Changed {
        version,
        tail,
        closed,
        parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Vec<Bytes> {
        vec![Bytes::from(s.to_string())]
    }

    fn at(n: u64) -> Offset {
        Offset::new(n)
    }

    fn data(cut: Cut) -> (String, u64) {
        match cut {
            Cut::Data { parts, end, .. } => (
                parts
                    .iter()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect(),
                end.get(),
            ),
            Cut::AtTail { .. } => panic!("at tail"),
            Cut::Outside => panic!("outside"),
        }
    }

    #[test]
    fn sessions_cut_from_batch_starts_to_the_tail() {
        let f = Feed::new(0, 1, 1);
        assert!(
            matches!(f.cut(at(0), 100), Cut::Outside),
            "unknown until the first step"
        );
        f.advance(at(10), None, at(10), false);
        assert!(matches!(f.cut(at(10), 100), Cut::AtTail { closed: false }));
        f.advance(at(10), Some(bytes("abc")), at(13), false);
        f.advance(at(13), Some(bytes("defg")), at(17), true);
        assert_eq!(data(f.cut(at(10), 100)), ("abcdefg".into(), 17));
        assert_eq!(data(f.cut(at(13), 100)), ("defg".into(), 17));
        assert!(matches!(f.cut(at(17), 100), Cut::AtTail { closed: true }));
        // Not a batch start, before the window, past the tail, or too big: the owner's job.
        assert!(matches!(f.cut(at(11), 100), Cut::Outside));
        assert!(matches!(f.cut(at(9), 100), Cut::Outside));
        assert!(matches!(f.cut(at(18), 100), Cut::Outside));
        assert!(matches!(f.cut(at(10), 6), Cut::Outside));
    }

    #[test]
    fn a_gap_restarts_the_window_and_old_batches_fall_out() {
        let f = Feed::new(0, 1, 1);
        f.advance(at(0), None, at(0), false);
        f.advance(at(0), Some(bytes("ab")), at(2), false);
        // The pump could not read [2, 50): the window restarts at 50.
        f.advance(at(2), None, at(50), false);
        assert!(matches!(f.cut(at(0), 100), Cut::Outside));
        assert!(matches!(f.cut(at(50), 100), Cut::AtTail { .. }));
        let big = "x".repeat(FEED_WINDOW_BYTES);
        f.advance(at(50), Some(bytes(&big)), at(50 + big.len() as u64), false);
        let t = 50 + big.len() as u64;
        f.advance(at(t), Some(bytes("y")), at(t + 1), false);
        assert!(matches!(f.cut(at(50), usize::MAX), Cut::Outside), "trimmed");
        assert_eq!(data(f.cut(at(t), 100)), ("y".into(), t + 1));
    }

    #[test]
    fn waiters_wake_on_change_and_on_end() {
        let f = Rc::new(Feed::new(0, 1, 1));
        let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let v = f.version();
            let g = f.clone();
            let waiter = monoio::spawn(async move { g.changed(v).await });
            monoio::time::sleep(Duration::from_millis(5)).await;
            f.advance(at(0), None, at(0), false);
            waiter.await;
            assert_eq!(f.waiters.len(), 0, "slot released");
            let v = f.version();
            let g = f.clone();
            let waiter = monoio::spawn(async move { g.changed(v).await });
            monoio::time::sleep(Duration::from_millis(5)).await;
            f.end();
            waiter.await;
        });
    }
}

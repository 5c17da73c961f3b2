//! The transport of the cross-core hop: one mailbox per core, into which every core posts.
//!
//! A core takes everything in its mailbox at once, so however many letters other cores
//! posted since it last looked, they cost it one wake-up. A poster wakes the receiving core
//! only when its letter is the first one the receiver is waiting for: while the receiver
//! has letters it has not taken yet, further letters are a push under a lock and nothing
//! else. (A cross-thread wake in monoio is a message on the target's waker queue plus an
//! eventfd write when the target is parked; paying it per letter rather than per batch is
//! what made the hop expensive.)

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// One core's inbox, shared (through `Arc`) by every core that posts to it.
pub struct Mailbox<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    letters: Vec<T>,
    /// The receiver's waker while it waits on an empty mailbox; the next poster takes it.
    waiting: Option<Waker>,
    /// No more letters are accepted (the receiving core is stopping).
    closed: bool,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            state: Mutex::new(State {
                letters: Vec::new(),
                waiting: None,
                closed: false,
            }),
        }
    }
}

impl<T> Mailbox<T> {
    /// Queue `letter` for the receiving core. Gives it back when the mailbox is closed.
    pub fn post(&self, letter: T) -> Result<(), T> {
        let wake = {
            let mut state = self.lock();
            if state.closed {
                return Err(letter);
            }
            state.letters.push(letter);
            state.waiting.take()
        };
        // Woken outside the lock: waking may itself take the target core's queue lock.
        if let Some(w) = wake {
            w.wake();
        }
        Ok(())
    }

    /// Wait until there are letters, then move all of them into `batch` (which the caller
    /// has emptied). Resolves to `false` once the mailbox is closed and empty.
    pub fn take<'a>(&'a self, batch: &'a mut Vec<T>) -> impl Future<Output = bool> + 'a {
        std::future::poll_fn(move |cx| {
            let mut state = self.lock();
            if !state.letters.is_empty() {
                std::mem::swap(&mut state.letters, batch);
                return Poll::Ready(true);
            }
            if state.closed {
                return Poll::Ready(false);
            }
            match &state.waiting {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => state.waiting = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
    }

    /// Refuse further letters, and hand back the ones still queued (dropping them drops
    /// their reply channels, so whoever waits on them learns the core is unavailable).
    /// A receiver waiting in [`take`](Self::take) is woken and sees the mailbox closed.
    pub fn close(&self) -> Vec<T> {
        let (left, wake) = {
            let mut state = self.lock();
            state.closed = true;
            (std::mem::take(&mut state.letters), state.waiting.take())
        };
        if let Some(w) = wake {
            w.wake();
        }
        left
    }

    /// A poisoned lock only means a thread panicked while pushing or swapping; the vector
    /// itself is intact.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<CountWakes>, Waker) {
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        (wakes.clone(), Waker::from(wakes))
    }

    #[test]
    fn a_waiting_receiver_is_woken_once_per_batch() {
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mailbox = Mailbox::default();
        let mut batch = Vec::new();
        {
            let mut take = std::pin::pin!(mailbox.take(&mut batch));
            assert!(take.as_mut().poll(&mut cx).is_pending());
            for i in 0..3 {
                assert!(mailbox.post(i).is_ok());
            }
            assert_eq!(
                wakes.0.load(Ordering::SeqCst),
                1,
                "one wake for three letters"
            );
            assert_eq!(take.as_mut().poll(&mut cx), Poll::Ready(true));
        }
        assert_eq!(batch, vec![0, 1, 2], "letters arrive in the order posted");
        // Letters posted while the receiver is busy (not waiting) wake nobody, and the
        // next take returns them without waiting.
        batch.clear();
        assert!(mailbox.post(3).is_ok());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        let mut take = std::pin::pin!(mailbox.take(&mut batch));
        assert_eq!(take.as_mut().poll(&mut cx), Poll::Ready(true));
    }

    #[test]
    fn a_closed_mailbox_refuses_letters_and_hands_back_the_queued_ones() {
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mailbox = Mailbox::default();
        let mut batch = Vec::new();
        {
            let mut take = std::pin::pin!(mailbox.take(&mut batch));
            assert!(take.as_mut().poll(&mut cx).is_pending());
            assert!(mailbox.post(1).is_ok());
            assert_eq!(mailbox.close(), vec![1]);
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
            assert_eq!(take.as_mut().poll(&mut cx), Poll::Ready(false));
        }
        assert_eq!(mailbox.post(2), Err(2));
        assert!(batch.is_empty());
        // A receiver that starts waiting after the close is told at once.
        let mut take = std::pin::pin!(mailbox.take(&mut batch));
        assert_eq!(take.as_mut().poll(&mut cx), Poll::Ready(false));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn posts_from_other_threads_all_arrive() {
        let mailbox = Arc::new(Mailbox::default());
        let posters: Vec<_> = (0..4)
            .map(|t| {
                let mailbox = mailbox.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        assert!(mailbox.post(t * 1000 + i).is_ok());
                    }
                })
            })
            .collect();
        for p in posters {
            assert!(p.join().is_ok());
        }
        let (_wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut batch = Vec::new();
        {
            let mut take = std::pin::pin!(mailbox.take(&mut batch));
            assert_eq!(take.as_mut().poll(&mut cx), Poll::Ready(true));
        }
        batch.sort_unstable();
        assert_eq!(batch, (0..4000).collect::<Vec<_>>());
    }
}

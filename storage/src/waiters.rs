//! Tasks waiting for one thing to change (a stream, a live feed, a core's shutdown): one
//! slot per waiting task, refreshed when the task polls again, all woken at once.
//!
//! Single-threaded, like everything a core owns. A slot is keyed by an id from
//! [`WaiterIds`] so that a task polled many times holds one slot, and can give it back when
//! its wait ends some other way (a timeout, a dropped request). The ids come from a counter
//! outside the set when sets are replaced while tasks wait on them (a stream's state is
//! rebuilt when it wakes from dormancy), so two tasks can never share an id.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::task::Waker;

/// Hands out waiter ids, each once.
#[derive(Debug, Default)]
pub struct WaiterIds(Cell<u64>);

impl WaiterIds {
    pub fn next(&self) -> u64 {
        let id = self.0.get();
        self.0.set(id + 1);
        id
    }
}

/// The tasks waiting for one thing, by waiter id.
#[derive(Debug, Default)]
pub struct WaiterSet {
    slots: RefCell<HashMap<u64, Waker>>,
}

impl WaiterSet {
    /// Register (or refresh) waiter `id`; O(1), one slot per waiting task.
    pub fn register(&self, id: u64, waker: &Waker) {
        let mut slots = self.slots.borrow_mut();
        match slots.get_mut(&id) {
            Some(old) if old.will_wake(waker) => {}
            Some(old) => *old = waker.clone(),
            None => {
                slots.insert(id, waker.clone());
            }
        }
    }

    /// Give slot `id` back (its wait ended without a wake). Callable from a `Drop` while
    /// the set is being woken: then the slot is already gone and nothing happens.
    pub fn unregister(&self, id: u64) {
        if let Ok(mut slots) = self.slots.try_borrow_mut() {
            slots.remove(&id);
        }
    }

    /// Wake every waiting task and empty the set (a woken task registers again if it still
    /// has to wait).
    pub fn wake_all(&self) {
        let woken: Vec<Waker> = self.slots.borrow_mut().drain().map(|(_, w)| w).collect();
        for w in woken {
            w.wake();
        }
    }

    /// Tasks waiting now.
    pub fn len(&self) -> usize {
        self.slots.try_borrow().map_or(0, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes the slots hold (the table at its capacity).
    pub fn heap_bytes(&self) -> usize {
        self.slots.borrow().capacity() * (std::mem::size_of::<(u64, Waker)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn one_slot_per_task_however_often_it_polls_and_all_woken_once() {
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let (ids, set) = (WaiterIds::default(), WaiterSet::default());
        let (a, b) = (ids.next(), ids.next());
        assert_ne!(a, b);
        set.register(a, &waker);
        set.register(a, &waker);
        set.register(b, &waker);
        assert_eq!(set.len(), 2);
        set.unregister(b);
        assert_eq!(set.len(), 1);
        set.wake_all();
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert!(set.is_empty());
        set.wake_all();
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
    }
}

//! Upkeep work done in slices, with the core's requests served in between: a checkpoint's
//! encoding, streams put to sleep, an index file's image. Each slice is short, and the
//! longest is measured so the debug logs can show how long upkeep held a core.

use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Let every other task that is ready run before this one goes on.
///
/// Not by waking itself: monoio puts a task that wakes itself while it runs at the front of
/// its run queue, so it runs again at once and the requests waiting behind it run only once
/// it is done (a checkpoint "in slices" held its core for its whole encode). A helper task
/// joins the back of the queue and wakes this one from there, so this one comes back behind
/// every task that was ready.
pub(crate) async fn yield_to_requests() {
    let mut queued = false;
    poll_fn(|cx| {
        if queued {
            return Poll::Ready(());
        }
        queued = true;
        let waker = cx.waker().clone();
        drop(monoio::spawn(async move { waker.wake() }));
        Poll::Pending
    })
    .await
}

/// Work done in slices with the core's requests served in between, and the longest slice
/// by wall time (which includes the thread being preempted) and by the thread's CPU time
/// (the core's own hold).
pub(crate) struct Slices {
    started: Instant,
    started_cpu: Duration,
    longest: Duration,
    longest_cpu: Duration,
}

impl Default for Slices {
    fn default() -> Slices {
        Slices {
            started: Instant::now(),
            started_cpu: thread_cpu_time(),
            longest: Duration::ZERO,
            longest_cpu: Duration::ZERO,
        }
    }
}

impl Slices {
    /// End the current slice: let requests run, then start the next.
    pub(crate) async fn next(&mut self) {
        self.end_slice();
        yield_to_requests().await;
        self.started = Instant::now();
        self.started_cpu = thread_cpu_time();
    }

    fn end_slice(&mut self) {
        self.longest = self.longest.max(self.started.elapsed());
        self.longest_cpu = self
            .longest_cpu
            .max(thread_cpu_time().saturating_sub(self.started_cpu));
    }

    /// The longest slice so far by wall time and by CPU time, the current one included.
    pub(crate) fn longest(&mut self) -> (Duration, Duration) {
        self.end_slice();
        (self.longest, self.longest_cpu)
    }
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer it is given, which points
    // at the live local above.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

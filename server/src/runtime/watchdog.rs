//! The systemd watchdog: keep-alives only while every core still runs jobs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::Mailboxes;
use crate::runtime::StartError;

/// Send `WATCHDOG=1` every half interval, but only while every core's event loop still
/// runs jobs: a wedged core stops the keep-alives and systemd restarts the service.
pub fn start(interval: Duration, peers: Mailboxes) -> Result<(), StartError> {
    let period = (interval / 2).max(Duration::from_millis(10));
    let seen: Arc<Vec<AtomicU64>> = Arc::new(peers.iter().map(|_| AtomicU64::new(0)).collect());
    std::thread::Builder::new()
        .name("ursula-watchdog".into())
        .spawn(move || {
            for round in 1u64.. {
                for (index, peer) in peers.iter().enumerate() {
                    let seen = seen.clone();
                    let _ = peer.post(Box::new(move |_core| {
                        seen[index].store(round, Ordering::Relaxed)
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
        .map_err(StartError::os("spawn watchdog thread"))
}

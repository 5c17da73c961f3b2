//! Which lanes this host serves now, as every core sees it: without `--cluster` all of
//! them, unchecked; in a cluster each lane is served here, moving in or out, or elsewhere
//! (with the owner's address as last learnt, for refusals to name). `lanes` moves lanes
//! and keeps the table current.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the owner named in a refusal is looked up again.
const OWNER_REFRESH: Duration = Duration::from_secs(2);

/// Which lanes this host serves, shared by every core.
#[derive(Debug)]
pub struct LaneTable {
    /// Whether lanes can be elsewhere at all: without `--cluster` every lane is served
    /// here and nothing is checked.
    cluster: bool,
    /// Per lane, a [`LaneState`].
    states: Vec<AtomicU8>,
    /// Per lane, where its owner serves it as last learnt (only read to refuse a request).
    owners: Vec<Mutex<KnownOwner>>,
    /// This host is leaving the cluster: it takes no lanes and gives its own up.
    draining: AtomicBool,
    /// In a cluster, until when (ms after `born`) this host may serve its lanes without
    /// another successful heartbeat: past it, the others may already count the host as
    /// gone and adopt its lanes, so it answers nothing (see [`LaneTable::renew_lease`]).
    lease_until_ms: AtomicU64,
    born: Instant,
    /// What the cluster's metrics report (see [`ClusterCounts`]).
    pub counts: ClusterCounts,
}

/// Counters of a cluster host's lane moves and membership, for `/metrics`.
#[derive(Debug, Default)]
pub struct ClusterCounts {
    pub adopted: AtomicU64,
    pub released: AtomicU64,
    /// Lanes another host took over while this one served them.
    pub lost: AtomicU64,
    /// Adoptions' time from claim to serving, summed.
    pub adoption_ms: AtomicU64,
    pub heartbeat_failures: AtomicU64,
    /// Live hosts (this one included) at the last heartbeat.
    pub live_hosts: AtomicU64,
}

/// Where a lane is now, as this host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LaneState {
    /// This host serves it.
    Served = 0,
    /// It is being adopted or released here: retry shortly.
    Moving = 1,
    /// Another host owns it, or nobody yet.
    Elsewhere = 2,
}

/// Why a request for a lane is not served here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHere {
    /// The lane is owned elsewhere: by the host at this address, if known.
    Elsewhere { lane: u32, owner: Option<String> },
    /// The lane is moving in or out of this host.
    Moving { lane: u32 },
}

#[derive(Debug, Default)]
struct KnownOwner {
    address: Option<String>,
    learnt: Option<Instant>,
    looking: bool,
}

impl LaneTable {
    /// A table of `lanes` lanes: every lane served, or in a cluster only those `held`.
    pub fn new(lanes: u32, cluster: bool, held: &[u32]) -> LaneTable {
        let state = |lane: u32| {
            if !cluster || held.contains(&lane) {
                LaneState::Served
            } else {
                LaneState::Elsewhere
            }
        };
        LaneTable {
            cluster,
            states: (0..lanes).map(|l| AtomicU8::new(state(l) as u8)).collect(),
            owners: (0..lanes).map(|_| Mutex::default()).collect(),
            draining: AtomicBool::new(false),
            // No lease until the membership thread starts one (see `lanes`).
            lease_until_ms: AtomicU64::new(u64::MAX),
            born: Instant::now(),
            counts: ClusterCounts::default(),
        }
    }

    /// A heartbeat that started at `beat` succeeded: serve until `valid` after it.
    pub(crate) fn renew_lease(&self, beat: Instant, valid: Duration) {
        let until = beat.saturating_duration_since(self.born) + valid;
        self.lease_until_ms
            .store(until.as_millis() as u64, Ordering::Release);
    }

    /// Whether the lease ran out: no heartbeat has succeeded for too long (this host was
    /// paused, cut off, or S3 is unreachable), so other hosts may have taken its lanes.
    pub fn lease_lapsed(&self) -> bool {
        self.cluster
            && self.born.elapsed().as_millis() as u64 > self.lease_until_ms.load(Ordering::Acquire)
    }

    /// Whether this host serves `lane` now; the refusal otherwise.
    pub fn check(&self, lane: usize) -> Result<(), NotHere> {
        if !self.cluster {
            return Ok(());
        }
        match self.state(lane as u32) {
            LaneState::Served if self.lease_lapsed() => Err(NotHere::Moving { lane: lane as u32 }),
            LaneState::Served => Ok(()),
            LaneState::Moving => Err(NotHere::Moving { lane: lane as u32 }),
            LaneState::Elsewhere => Err(NotHere::Elsewhere {
                lane: lane as u32,
                owner: self.owner(lane as u32),
            }),
        }
    }

    pub fn cluster(&self) -> bool {
        self.cluster
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// From now on this host takes no lanes and gives its own up.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn state(&self, lane: u32) -> LaneState {
        match self
            .states
            .get(lane as usize)
            .map(|s| s.load(Ordering::Acquire))
        {
            Some(0) => LaneState::Served,
            Some(1) => LaneState::Moving,
            _ => LaneState::Elsewhere,
        }
    }

    /// How many lanes there are.
    pub fn lanes(&self) -> u32 {
        self.states.len() as u32
    }

    /// The lanes served here now.
    pub fn served(&self) -> Vec<u32> {
        (0..self.states.len() as u32)
            .filter(|&l| self.state(l) == LaneState::Served)
            .collect()
    }

    /// How many lanes are served here, moving, and elsewhere.
    pub fn state_counts(&self) -> [u64; 3] {
        let mut out = [0; 3];
        for lane in 0..self.states.len() as u32 {
            out[self.state(lane) as usize] += 1;
        }
        out
    }

    /// Whether no lane is served or moving here.
    pub fn none_here(&self) -> bool {
        (0..self.states.len() as u32).all(|l| self.state(l) == LaneState::Elsewhere)
    }

    /// The owner's address last learnt for `lane`.
    pub fn owner(&self, lane: u32) -> Option<String> {
        let known = self.owners.get(lane as usize)?.lock().ok()?;
        known.address.clone()
    }

    /// Whether the owner of `lane` should be looked up (again); marks the lookup started.
    pub(crate) fn should_look_up(&self, lane: u32) -> bool {
        let Some(Ok(mut known)) = self.owners.get(lane as usize).map(|o| o.lock()) else {
            return false;
        };
        if known.looking || known.learnt.is_some_and(|t| t.elapsed() < OWNER_REFRESH) {
            return false;
        }
        known.looking = true;
        true
    }

    pub(crate) fn learnt_owner(&self, lane: u32, address: Option<String>) {
        if let Some(Ok(mut known)) = self.owners.get(lane as usize).map(|o| o.lock()) {
            known.address = address.filter(|a| !a.is_empty());
            known.learnt = Some(Instant::now());
            known.looking = false;
        }
    }

    /// Move `lane` from `from` to `to`; false if it was not in `from`.
    pub(crate) fn transition(&self, lane: u32, from: LaneState, to: LaneState) -> bool {
        self.states.get(lane as usize).is_some_and(|s| {
            s.compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    pub(crate) fn set(&self, lane: u32, to: LaneState) {
        if let Some(s) = self.states.get(lane as usize) {
            s.store(to as u8, Ordering::Release);
        }
    }
}

/// A core does not run that shard now: its lane is moving to or from another host.
/// Retrying shortly may find it here, or routed elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shard {shard} is not served on this core now")]
pub struct NotServed {
    pub shard: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_host_serves_every_lane_without_looking() {
        let t = LaneTable::new(8, false, &[]);
        assert!((0..8).all(|l| t.check(l).is_ok()));
        assert_eq!(t.served().len(), 8);
    }

    #[test]
    fn a_cluster_host_serves_only_what_it_holds_and_moves_by_transitions() {
        let t = LaneTable::new(4, true, &[1, 3]);
        assert_eq!(t.served(), vec![1, 3]);
        assert_eq!(
            t.check(0),
            Err(NotHere::Elsewhere {
                lane: 0,
                owner: None
            })
        );
        assert!(t.transition(0, LaneState::Elsewhere, LaneState::Moving));
        assert_eq!(t.check(0), Err(NotHere::Moving { lane: 0 }));
        assert!(!t.transition(0, LaneState::Elsewhere, LaneState::Moving));
        t.set(0, LaneState::Served);
        assert!(t.check(0).is_ok());
        t.learnt_owner(2, Some("10.0.0.2:4437".into()));
        assert_eq!(
            t.check(2),
            Err(NotHere::Elsewhere {
                lane: 2,
                owner: Some("10.0.0.2:4437".into())
            })
        );
        assert!(!t.should_look_up(2), "just learnt");
        assert!(t.should_look_up(0));
        assert!(!t.should_look_up(0), "one lookup at a time");
    }

    #[test]
    fn a_lapsed_lease_serves_nothing_until_a_heartbeat_renews_it() {
        let t = LaneTable::new(2, true, &[0, 1]);
        assert!(t.check(0).is_ok(), "the lanes claimed at start are served");
        // A heartbeat long ago, whose lease has run out (a pause, a cut link).
        t.renew_lease(t.born, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(t.lease_lapsed());
        assert_eq!(t.check(1), Err(NotHere::Moving { lane: 1 }));
        t.renew_lease(Instant::now(), Duration::from_secs(5));
        assert!(!t.lease_lapsed());
        assert!(t.check(1).is_ok());
        // Without a cluster there is no lease.
        let single = LaneTable::new(2, false, &[]);
        single.renew_lease(single.born, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(single.check(0).is_ok());
    }
}

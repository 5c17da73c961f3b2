//! Cluster membership through the archive's bucket: every host writes its node record
//! (`nodes/<id>.json`: where it serves, which lanes, whether it is draining) once per
//! heartbeat, then lists `nodes/` and reads the others' records back.
//!
//! Liveness is judged on the object store's clock only: the listing gives every record's
//! last modification, and a host's own record, just written, is "now". A host whose record
//! is older than the lease by that clock is gone, however the hosts' own clocks differ.
//!
//! Which host should serve a lane is decided by rendezvous hashing over the live hosts
//! that are not draining ([`assign`]): every host computes the same answer from the same
//! records, a new host takes about 1/N of the lanes, and a host that leaves gives up only
//! its own.

use serde::{Deserialize, Serialize};
use ursula_s3::{DynStore, PutMode};

use crate::error::{Error, Result};

/// Where node records live, under the archive's prefix.
pub const NODES_PREFIX: &str = "nodes/";

/// What a host says about itself each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The host's owner identity (the one its manifests name).
    pub id: String,
    /// Where it serves (`host:port`), and each core's own port if it has them.
    pub address: String,
    #[serde(default)]
    pub core_ports: Vec<u16>,
    /// It is leaving: it takes no lanes and gives its own up.
    pub draining: bool,
    /// The lanes it serves now.
    pub lanes: Vec<u32>,
}

/// A host as the last heartbeat saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub record: NodeRecord,
    /// How long before this host's own last record the member's was written, by the
    /// object store's clock (ms; 0 for this host itself).
    pub age_ms: i64,
}

/// Every host's record, as of one heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub members: Vec<Member>,
}

impl Membership {
    /// The members whose records are younger than `lease_ms`.
    pub fn live(&self, lease_ms: i64) -> impl Iterator<Item = &Member> + '_ {
        self.members.iter().filter(move |m| m.age_ms < lease_ms)
    }

    /// The live member that says it serves `lane`, if any.
    pub fn holder(&self, lane: u32, lease_ms: i64) -> Option<&Member> {
        self.live(lease_ms).find(|m| m.record.lanes.contains(&lane))
    }

    /// The ids of the live members that take lanes (not draining), in a stable order.
    pub fn candidates(&self, lease_ms: i64) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .live(lease_ms)
            .filter(|m| !m.record.draining)
            .map(|m| m.record.id.as_str())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The member with id `id`.
    pub fn member(&self, id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.record.id == id)
    }
}

/// The host of `candidates` that should serve `lane` (rendezvous hashing), if any.
pub fn assign<'a>(lane: u32, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .copied()
        .max_by_key(|id| (weight(id, lane), *id))
}

/// A well-mixed 64-bit weight of (host, lane).
fn weight(id: &str, lane: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut x = h ^ (u64::from(lane) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn record_key(id: &str) -> String {
    format!("{NODES_PREFIX}{id}.json")
}

/// Write `record`, then read every host's back. Records that cannot be read or parsed
/// are left out (a host writing its first one, or one being removed).
pub async fn heartbeat(store: &DynStore, record: &NodeRecord) -> Result<Membership> {
    let key = record_key(&record.id);
    let bytes = sonic_rs::to_vec(record).map_err(|source| Error::Encode {
        what: "node record",
        source,
    })?;
    store
        .put(&key, bytes.into(), PutMode::Overwrite)
        .await
        .map_err(Error::request(&key))?;
    let listed = store
        .list(NODES_PREFIX)
        .await
        .map_err(Error::request(NODES_PREFIX))?;
    let now = listed
        .iter()
        .find(|l| l.key == key)
        .and_then(|l| l.modified_ms)
        .unwrap_or_else(ursula_storage::now_ms);
    let mut members = Vec::with_capacity(listed.len());
    for l in listed.iter().filter(|l| l.key.ends_with(".json")) {
        let age_ms = l.modified_ms.map_or(0, |m| (now - m).max(0));
        if l.key == key {
            members.push(Member {
                record: record.clone(),
                age_ms: 0,
            });
            continue;
        }
        let Ok(Some(o)) = store.get(&l.key).await else {
            continue;
        };
        if let Ok(record) = sonic_rs::from_slice::<NodeRecord>(&o.bytes) {
            members.push(Member { record, age_ms });
        }
    }
    Ok(Membership { members })
}

/// Remove this host's record: it has left (after giving its lanes up).
pub async fn leave(store: &DynStore, id: &str) -> Result<()> {
    let key = record_key(id);
    store.delete(&key).await.map_err(Error::request(&key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{local, run};

    fn record(id: &str, lanes: &[u32], draining: bool) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            address: format!("{id}:4437"),
            core_ports: Vec::new(),
            draining,
            lanes: lanes.to_vec(),
        }
    }

    #[test]
    fn rendezvous_moves_about_a_share_of_lanes_when_a_host_joins() {
        let lanes = 1024;
        let two = ["a", "b"];
        let three = ["a", "b", "c"];
        let mut moved = 0;
        let mut per_host = [0usize; 3];
        for lane in 0..lanes {
            let before = assign(lane, &two).expect("a host");
            let after = assign(lane, &three).expect("a host");
            if before != after {
                assert_eq!(after, "c", "only the new host gains lanes");
                moved += 1;
            }
            per_host[three.iter().position(|h| *h == after).expect("known")] += 1;
        }
        // About a third moves, and every host has about a third.
        assert!((250..430).contains(&moved), "{moved} of {lanes} moved");
        assert!(
            per_host.iter().all(|&n| (250..430).contains(&n)),
            "{per_host:?}"
        );
        assert_eq!(assign(3, &[]), None);
    }

    #[test]
    fn hosts_see_each_other_and_who_holds_what() {
        let (_dir, store) = local();
        run(async {
            heartbeat(&store, &record("a", &[0, 2], false))
                .await
                .expect("a");
            let view = heartbeat(&store, &record("b", &[1], true))
                .await
                .expect("b");
            assert_eq!(view.members.len(), 2);
            let lease = 60_000;
            assert_eq!(
                view.holder(2, lease).map(|m| m.record.id.as_str()),
                Some("a")
            );
            assert_eq!(view.holder(3, lease), None);
            assert_eq!(
                view.candidates(lease),
                vec!["a"],
                "a draining host takes none"
            );
            leave(&store, "a").await.expect("leave");
            let view = heartbeat(&store, &record("b", &[1], false))
                .await
                .expect("b");
            assert_eq!(view.candidates(lease), vec!["b"]);
        });
    }
}

//! Where this process's provisioning plans put pending pods, as they are made: the batches
//! record them, and every [`ClusterState`](archer_model::ClusterState) this process builds
//! carries a snapshot ([`archer_model::plans::Plans`]) that the next batch and the extender's
//! hand-off read. Bounded, and forgotten after [`PLACEMENT_TTL`]: a plan is only worth following
//! while its pods are pending. Times are [`super::monotonic_ms`]: a wall-clock step moves no plan.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::sync::Cache;

use archer_model::plans::Placement;

/// How long a planned placement is followed.
const PLACEMENT_TTL: Duration = Duration::from_secs(600);
/// At most this many planned placements are remembered.
const MAX_PLACEMENTS: u64 = 200_000;
/// A snapshot is rebuilt when a placement changes, and at least this often (placements expire).
const SNAPSHOT_REFRESH: Duration = Duration::from_secs(1);

/// The last snapshot: the version it was at, when it was built, the placements.
type Snapshot = (u64, Instant, Arc<HashMap<String, Placement>>);

/// The placements plans made, shared by the provisioner (which writes them) and the extender.
#[derive(Clone)]
pub struct PlanBook {
    placements: Cache<String, Placement>,
    /// Bumped once per call that records or forgets a placement.
    version: Arc<AtomicU64>,
    last: Arc<Mutex<Option<Snapshot>>>,
}

impl Default for PlanBook {
    fn default() -> Self {
        PlanBook { placements: Cache::builder().max_capacity(MAX_PLACEMENTS).time_to_live(PLACEMENT_TTL).build(), version: Arc::default(), last: Arc::default() }
    }
}

impl PlanBook {
    /// Record that a plan put these pods (`namespace/name`) on `node` at `now_ms`. A pod planned
    /// onto the same node again keeps its first time: the patience the extender grants a plan
    /// runs from the first plan, so batches repeating a plan kube-scheduler refuses cannot hold a
    /// pod back.
    pub fn placed(&self, pods: Vec<String>, node: &str, now_ms: i64) {
        let mut changed = false;
        for p in pods {
            if self.placements.get(&p).is_some_and(|old| old.node == node) {
                continue;
            }
            self.placements.insert(p, Placement { node: node.to_string(), at_ms: now_ms });
            changed = true;
        }
        if changed {
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// Forget where plans put these pods (a batch found no place for them): the room they held
    /// is free again.
    pub fn forgotten(&self, pods: Vec<String>) {
        let mut changed = false;
        for p in pods {
            changed |= self.placements.remove(&p).is_some();
        }
        if changed {
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// Forget every placement (this process stopped provisioning: no plan of its is followed).
    pub fn clear(&self) {
        self.placements.invalidate_all();
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Where a recent plan put the pod, by one lookup (the extender's calls for pods with no
    /// plan build nothing).
    pub fn placement(&self, pod: &str) -> Option<Placement> {
        self.placements.get(pod)
    }

    /// The placements now, with the version they are at: rebuilt only when one changed or
    /// [`SNAPSHOT_REFRESH`] passed (a snapshot is shared by every state built meanwhile).
    pub fn snapshot(&self) -> (u64, Arc<HashMap<String, Placement>>) {
        let version = self.version.load(Ordering::Acquire);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, at, snap)) = last.as_ref() {
            if *v == version && at.elapsed() < SNAPSHOT_REFRESH {
                return (version, snap.clone());
            }
        }
        let snap: Arc<HashMap<String, Placement>> = Arc::new(self.placements.iter().map(|(k, v)| (k.as_ref().clone(), v)).collect());
        *last = Some((version, Instant::now(), snap.clone()));
        (version, snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_keeps_its_first_time_and_only_a_change_is_a_new_version() {
        let book = PlanBook::default();
        book.placed(vec!["ns/a".into(), "ns/b".into()], "n1", 1_000);
        let (v1, snap) = book.snapshot();
        assert_eq!(snap.len(), 2);
        // The same node again, or forgetting a pod no plan placed: no change, no new version.
        book.placed(vec!["ns/a".into()], "n1", 5_000);
        book.forgotten(vec!["ns/nobody".into()]);
        let (v2, again) = book.snapshot();
        assert_eq!(v1, v2);
        assert_eq!(again.get("ns/a").map(|p| p.at_ms), Some(1_000));
        assert_eq!(book.placement("ns/a").map(|p| p.at_ms), Some(1_000));
        // Another node, then forgotten: new versions, new snapshots.
        book.placed(vec!["ns/a".into()], "n2", 6_000);
        let (v3, moved) = book.snapshot();
        assert!(v3 > v2);
        assert_eq!(moved.get("ns/a"), Some(&Placement { node: "n2".into(), at_ms: 6_000 }));
        book.forgotten(vec!["ns/a".into()]);
        let (v4, left) = book.snapshot();
        assert!(v4 > v3);
        assert_eq!(left.keys().map(String::as_str).collect::<Vec<_>>(), vec!["ns/b"]);
        // Leadership lost: nothing is followed any more.
        book.clear();
        assert!(book.snapshot().1.is_empty() && book.placement("ns/b").is_none());
    }
}

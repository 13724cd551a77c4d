//! Where the provisioner's recent plans put pending pods, and which nodes were recently seen to
//! finish registering: what the extender's hand-off ([`crate::handoff`]) and the next batch read.
//! The runtime records both as they happen and hands each [`crate::ClusterState`] a snapshot.
//! Times are milliseconds on the recorder's own clock (the runtime's is monotonic, so a step of
//! the wall clock neither ages nor freshens a plan), read against [`Plans::now_ms`].

use std::collections::HashMap;
use std::sync::Arc;

/// A pending pod's planned node, and when a plan first put it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub at_ms: i64,
}

/// The plans in flight at one moment (cheap to clone: the runtime shares one snapshot of each
/// map between the states it builds while nothing changes).
#[derive(Debug, Clone, Default)]
pub struct Plans {
    /// Changes whenever a placement is recorded or forgotten (views built from the plans are
    /// current while it holds still).
    pub version: u64,
    /// Now, on the clock the times below are on.
    pub now_ms: i64,
    /// `namespace/name` -> where a recent plan put the pod.
    placements: Arc<HashMap<String, Placement>>,
    /// Node name -> when it was seen free of registering taints, for nodes seen registering
    /// recently (a node up before the process started is not here).
    registered: Arc<HashMap<String, i64>>,
}

impl Plans {
    pub fn new(version: u64, now_ms: i64, placements: Arc<HashMap<String, Placement>>, registered: Arc<HashMap<String, i64>>) -> Self {
        Plans { version, now_ms, placements, registered }
    }

    /// Where a recent plan put the pod (`namespace/name`).
    pub fn placement(&self, pod: &str) -> Option<&Placement> {
        self.placements.get(pod)
    }

    /// The pods (`namespace/name`) recent plans put on each node.
    pub fn by_node(&self) -> HashMap<&str, Vec<&str>> {
        let mut out: HashMap<&str, Vec<&str>> = HashMap::new();
        for (pod, p) in self.placements.iter() {
            out.entry(p.node.as_str()).or_default().push(pod.as_str());
        }
        out
    }

    /// When the node was seen to finish registering, if it was recently.
    pub(crate) fn registered_at(&self, node: &str) -> Option<i64> {
        self.registered.get(node).copied()
    }

    /// How long ago `at_ms` was (a time not yet come reads as now).
    pub(crate) fn age(&self, at_ms: i64) -> std::time::Duration {
        std::time::Duration::from_millis(u64::try_from(self.now_ms.saturating_sub(at_ms)).unwrap_or(0))
    }
}

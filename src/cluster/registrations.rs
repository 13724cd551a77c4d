//! When each node the Node cache saw registering (a [`REGISTERING_TAINTS`] taint on it) was first
//! seen without them. kube-scheduler's own cache can be moments behind Archer's: a node
//! registered here may still be tainted in the snapshot it filters on (the extender's hand-off,
//! [`archer_model::handoff`], reads this through each state's plans). Nodes already free of the
//! taints when first seen (at start-up) are not recorded.
//!
//! [`REGISTERING_TAINTS`]: archer_core::taints::REGISTERING_TAINTS

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

/// At most this many nodes are remembered registering, and as many as registered.
const MAX_REGISTRATIONS: u64 = 100_000;
/// A node seen registering is forgotten after this long (it was deleted, or never registers).
const REGISTERING_TTL: Duration = Duration::from_secs(3600);
/// A node's registration time is kept this long: only a recent one matters.
const REGISTERED_TTL: Duration = Duration::from_secs(600);

/// The last snapshot and the version it was at.
type Snapshot = (u64, Arc<HashMap<String, i64>>);

#[derive(Clone)]
pub struct Registrations {
    registering: moka::sync::Cache<String, ()>,
    /// Node name -> when it was seen registered ([`super::monotonic_ms`]).
    registered: moka::sync::Cache<String, i64>,
    version: Arc<AtomicU64>,
    last: Arc<Mutex<Option<Snapshot>>>,
}

impl Default for Registrations {
    fn default() -> Self {
        Self {
            registering: moka::sync::Cache::builder().max_capacity(MAX_REGISTRATIONS).time_to_live(REGISTERING_TTL).build(),
            registered: moka::sync::Cache::builder().max_capacity(MAX_REGISTRATIONS).time_to_live(REGISTERED_TTL).build(),
            version: Arc::default(),
            last: Arc::default(),
        }
    }
}

impl Registrations {
    /// A node added or changed in the cache, at `now_ms` ([`super::monotonic_ms`]).
    pub fn observe(&self, node: &Node, now_ms: i64) {
        let Some(name) = node.metadata.name.as_deref() else { return };
        if archer_core::taints::node_registering(node) {
            self.registering.insert(name.to_string(), ());
            if self.registered.contains_key(name) {
                self.registered.invalidate(name);
                self.version.fetch_add(1, Ordering::Release);
            }
        } else if self.registering.contains_key(name) {
            self.registering.invalidate(name);
            self.registered.insert(name.to_string(), now_ms);
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// Node name -> when it was seen registered, for the nodes seen so recently; shared while no
    /// registration changes. (An entry past [`REGISTERED_TTL`] may linger until the next change:
    /// readers compare its time with theirs.)
    pub fn snapshot(&self) -> Arc<HashMap<String, i64>> {
        let version = self.version.load(Ordering::Acquire);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, snap)) = last.as_ref().filter(|(v, _)| *v == version) {
            return snap.clone();
        }
        let snap: Arc<HashMap<String, i64>> = Arc::new(self.registered.iter().map(|(k, v)| (k.as_ref().clone(), v)).collect());
        *last = Some((version, snap.clone()));
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, taints: &[&str]) -> Node {
        let taints = taints.iter().map(|k| k8s_openapi::api::core::v1::Taint { key: k.to_string(), effect: "NoSchedule".into(), ..Default::default() }).collect();
        Node {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec { taints: Some(taints), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_recorded_registered_when_its_registering_taints_go() {
        let r = Registrations::default();
        // Up before Archer saw it: never recorded.
        r.observe(&node("old", &[]), 1_000);
        assert_eq!(r.snapshot().get("old"), None);
        // New: unregistered, then not-ready (a startup taint of another kind does not count).
        r.observe(&node("new", &["karpenter.sh/unregistered", "node.kubernetes.io/not-ready"]), 1_000);
        r.observe(&node("new", &["node.kubernetes.io/not-ready", "cni-not-ready"]), 2_000);
        assert_eq!(r.snapshot().get("new"), None);
        r.observe(&node("new", &["cni-not-ready"]), 3_000);
        assert_eq!(r.snapshot().get("new"), Some(&3_000));
        // Later updates keep the first time; tainted again (not-ready) and back records anew.
        r.observe(&node("new", &[]), 4_000);
        assert_eq!(r.snapshot().get("new"), Some(&3_000));
        r.observe(&node("new", &["node.kubernetes.io/not-ready"]), 5_000);
        assert_eq!(r.snapshot().get("new"), None);
        r.observe(&node("new", &[]), 6_000);
        assert_eq!(r.snapshot().get("new"), Some(&6_000));
    }
}

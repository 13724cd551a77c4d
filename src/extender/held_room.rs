//! Room a provisioning plan holds on a node for pods it put there that kube-scheduler has not
//! bound yet.
//!
//! kube-scheduler binds pods one at a time in its own queue order and knows nothing of the plan
//! that bought a node: a pod the plan put elsewhere (or on no node) can take the room the plan
//! counted on for another pod, which then needs yet another node while the one bought for the
//! first may stay empty. kube-scheduler holds room the same way for the pods it nominates when
//! it preempts (their requests count on the nominated node for pods of no higher priority); the
//! extender does it for the plan's pods. A node is refused to a pod that does not fit there once
//! the pending pods planned on it (of at least its priority) count as bound. A planned pod that
//! no longer fits its node (the plan went stale) holds nothing.
//!
//! The refusal never strands a pod: when every node refuses it, the provisioner sees it pending
//! and plans it a place on the same model (the held room is taken there too), and the node that
//! brings, or the binding of the pods the room was held for, is a cluster event kube-scheduler
//! retries the pod on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use archer_core::pod_id;
use archer_core::sched::{NodeInfo, PodInfo, Snapshot};
use archer_model::ClusterState;

/// The nodes whose room plans hold, each as a one-node snapshot of its bound pods plus the
/// pending pods planned there. Built from the cluster state and shared by the filter calls of a
/// short while: a pod binding in between counts the same on its node bound or held.
pub(super) struct HeldRoom {
    pub(super) built: Instant,
    /// The placements' version it was built from ([`crate::cluster::ClusterView::plans_version`]).
    pub(super) version: u64,
    nodes: HashMap<String, Held>,
}

struct Held {
    snapshot: Mutex<Snapshot>,
    /// The pods the room is held for (`namespace/name`) and the highest of their priorities.
    pods: HashSet<String>,
    priority: i32,
}

impl HeldRoom {
    /// From `held` (node name -> pods, `namespace/name`, plans put there): the pods still
    /// pending, on the nodes in the cache, that still fit beside what is there (a stale plan
    /// holds nothing).
    pub(super) fn build(held: &HashMap<String, Vec<String>>, version: u64, state: &ClusterState) -> Self {
        let pending = pending_by_id(state, held);
        let waiting: HashMap<&str, Vec<&Arc<Pod>>> = held
            .iter()
            .map(|(node, ids)| (node.as_str(), ids.iter().filter_map(|i| pending.get(i.as_str()).copied()).collect::<Vec<_>>()))
            .filter(|(_, ps)| !ps.is_empty())
            .collect();
        let mut bound: HashMap<&str, Vec<&Arc<Pod>>> = HashMap::new();
        if !waiting.is_empty() {
            for p in &state.pods {
                if let Some((node, _)) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| waiting.get_key_value(n)) {
                    bound.entry(node).or_default().push(p);
                }
            }
        }
        let nodes = state.nodes_by_name();
        let mut out = HashMap::new();
        for (node, planned) in waiting {
            let Some(n) = nodes.get(node) else { continue };
            let mut snap = Snapshot::default();
            snap.nodes.push(NodeInfo::from_node(n));
            for p in bound.get(node).into_iter().flatten() {
                snap.bind(PodInfo::from_pod(p), 0);
            }
            let (mut ids, mut priority) = (HashSet::new(), i32::MIN);
            for q in planned {
                let info = PodInfo::from_pod(q);
                if snap.room_and_anti_affinity(&info, 0).is_ok() {
                    snap.bind(info, 0);
                    ids.insert(pod_id(q));
                    priority = priority.max(self::priority(q));
                }
            }
            if !ids.is_empty() {
                out.insert(node.to_string(), Held { snapshot: Mutex::new(snap), pods: ids, priority });
            }
        }
        HeldRoom { built: Instant::now(), version, nodes: out }
    }

    /// `(node, why)` for each of `candidates` (the nodes kube-scheduler found feasible, the
    /// pod's own planned node aside) whose room is held for pods other than `pod`: it does not
    /// fit there (room, host ports, anti-affinity either way) once they count as bound. As for
    /// kube-scheduler's nominated pods, a pod of higher priority than all of them is not held
    /// back. Held room never leaves a pod with no node: when every candidate is held, nothing
    /// is, and the pod binds now (see the README, "Plans kube-scheduler follows", for the
    /// alternatives measured).
    pub(super) fn refusals(&self, pod: &Pod, candidates: &[&str]) -> Vec<(String, String)> {
        if self.nodes.is_empty() {
            return Vec::new();
        }
        let (me, mine) = (pod_id(pod), priority(pod));
        let info = PodInfo::from_pod(pod);
        let mut out = Vec::new();
        for node in candidates {
            let Some(h) = self.nodes.get(*node) else { continue };
            if h.pods.contains(&me) || mine > h.priority {
                continue;
            }
            let snap = h.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(why) = snap.room_and_anti_affinity(&info, 0) {
                out.push((node.to_string(), format!("room on node {node} is held for {} pending pod(s) the provisioning plan put there ({why})", h.pods.len())));
            }
        }
        if out.len() >= candidates.len() {
            return Vec::new();
        }
        out.sort();
        out
    }
}

fn priority(p: &Pod) -> i32 {
    p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pods `held` names (`namespace/name`) that are in the state, not bound, not going away
/// and not done.
fn pending_by_id<'a>(state: &'a ClusterState, held: &HashMap<String, Vec<String>>) -> HashMap<String, &'a Arc<Pod>> {
    let wanted: HashSet<&str> = held.values().flatten().map(String::as_str).collect();
    state.pods.iter().filter(|p| archer_core::awaits_node(p)).map(|p| (pod_id(p), p)).filter(|(id, _)| wanted.contains(id.as_str())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}})).expect("node")
    }

    fn pod(name: &str, cpu: &str, node: Option<&str>, extra: serde_json::Value) -> Pod {
        let mut spec = json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec})).expect("pod")
    }

    fn store<K>(items: Vec<K>) -> Vec<Arc<K>> {
        items.into_iter().map(Arc::new).collect()
    }

    /// The room `held` holds on the cluster of `nodes` and `pods`.
    fn build(held: &HashMap<String, Vec<String>>, pods: &[Arc<Pod>], nodes: &[Arc<Node>]) -> HeldRoom {
        HeldRoom::build(held, 0, &ClusterState { nodes: nodes.to_vec(), pods: pods.to_vec(), ..Default::default() })
    }

    /// `n` candidates: the held node and others.
    fn cands(n: usize) -> &'static [&'static str] {
        &["n", "other", "third"][..n]
    }

    fn held(node: &str, pods: &[&str]) -> HashMap<String, Vec<String>> {
        [(node.to_string(), pods.iter().map(|p| format!("ns/{p}")).collect())].into()
    }

    #[test]
    fn a_pod_may_not_take_room_held_for_a_planned_pod() {
        let nodes = store(vec![node("n", "2")]);
        let intruder = pod("intruder", "1500m", None, json!({}));
        let pods = store(vec![pod("running", "500m", Some("n"), json!({})), pod("planned", "1", None, json!({})), intruder.clone()]);
        let why = build(&held("n", &["planned"]), &pods, &nodes).refusals(&intruder, cands(2));
        assert_eq!(why, vec![("n".to_string(), "room on node n is held for 1 pending pod(s) the provisioning plan put there (Insufficient cpu)".to_string())]);
        // A pod that fits beside the held room is not refused.
        let small = pod("small", "500m", None, json!({}));
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&small, cands(2)).is_empty());
        // The planned pod itself is never refused by its own hold.
        let planned = pod("planned", "1", None, json!({}));
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&planned, cands(2)).is_empty());
    }

    #[test]
    fn held_room_never_leaves_a_pod_without_a_node() {
        let nodes = store(vec![node("n", "2")]);
        let intruder = pod("intruder", "1500m", None, json!({}));
        let pods = store(vec![pod("planned", "1", None, json!({})), intruder.clone()]);
        let held = build(&held("n", &["planned"]), &pods, &nodes);
        assert_eq!(held.refusals(&intruder, cands(2)).len(), 1, "another node is left");
        assert!(held.refusals(&intruder, cands(1)).is_empty(), "n was the only candidate");
    }

    #[test]
    fn held_room_counts_anti_affinity_both_ways() {
        let nodes = store(vec![node("n", "4")]);
        let anti = |app: &str| json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}});
        let labelled = |name: &str, app: &str, extra: serde_json::Value| {
            let mut p = pod(name, "100m", None, extra);
            p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
            p
        };
        let mut n = node("n", "4");
        n.metadata.labels = Some([("kubernetes.io/hostname".to_string(), "n".to_string())].into());
        let nodes_l = store(vec![n]);
        // The held pod refuses pods it must not share a host with...
        let db = labelled("db", "db", anti("web"));
        let web = labelled("web", "web", json!({}));
        let pods = store(vec![db.clone(), web.clone()]);
        let why = build(&held("n", &["db"]), &pods, &nodes_l).refusals(&web, cands(2));
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].1.contains("anti-affinity"), "{why:?}");
        // ...and a pod that must not share a host with the held one is refused too.
        let web2 = labelled("web2", "web", anti("db"));
        let db2 = labelled("db2", "db", json!({}));
        let pods = store(vec![db2, web2.clone()]);
        assert_eq!(build(&held("n", &["db2"]), &pods, &nodes_l).refusals(&web2, cands(2)).len(), 1);
        // Without labels on the node there is no domain, hence no conflict.
        let pods = store(vec![db, web.clone()]);
        assert!(build(&held("n", &["db"]), &pods, &nodes).refusals(&web, cands(2)).is_empty());
    }

    #[test]
    fn a_hold_ends_when_its_pod_binds_goes_away_or_no_longer_fits() {
        let nodes = store(vec![node("n", "2")]);
        let intruder = pod("intruder", "1500m", None, json!({}));
        // Bound elsewhere: nothing held.
        let pods = store(vec![pod("planned", "1", Some("m"), json!({}))]);
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&intruder, cands(2)).is_empty());
        // Deleted (not in the cache): nothing held.
        let pods = store(Vec::<Pod>::new());
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&intruder, cands(2)).is_empty());
        // Stale: the planned pod no longer fits beside what is bound there.
        let pods = store(vec![pod("running", "1500m", Some("n"), json!({})), pod("planned", "1", None, json!({}))]);
        let small = pod("small", "500m", None, json!({}));
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&small, cands(2)).is_empty());
        // An unknown node holds nothing.
        let pods = store(vec![pod("planned", "1", None, json!({}))]);
        assert!(build(&held("gone", &["planned"]), &pods, &nodes).refusals(&intruder, cands(2)).is_empty());
    }

    #[test]
    fn held_host_ports_and_priority_follow_kube_scheduler() {
        let nodes = store(vec![node("n", "4")]);
        let port = json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
        let planned = pod("planned", "100m", None, port.clone());
        let other = pod("other", "100m", None, port);
        let pods = store(vec![planned, other.clone()]);
        let why = build(&held("n", &["planned"]), &pods, &nodes).refusals(&other, cands(2));
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].1.contains("free ports"), "{why:?}");
        // A pod of higher priority than the held pods is not held back (kube-scheduler counts
        // nominated pods only for pods of no higher priority).
        let urgent = pod("urgent", "3900m", None, json!({"priority": 1000}));
        let pods = store(vec![pod("planned", "1", None, json!({})), urgent.clone()]);
        assert!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&urgent, cands(2)).is_empty());
        let plain = pod("plain", "3900m", None, json!({}));
        assert_eq!(build(&held("n", &["planned"]), &pods, &nodes).refusals(&plain, cands(2)).len(), 1);
    }
}

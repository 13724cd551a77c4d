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

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::core::sched::{NodeInfo, PodInfo, Snapshot};

/// `(node, why)` for each node in `held` (node name -> pods, `namespace/name`, plans put there)
/// whose room is held for other pods than `pod`.
pub(super) fn refusals(pod: &Pod, held: &HashMap<String, Vec<String>>, pods: &Store<Pod>, nodes: &Store<Node>) -> Vec<(String, String)> {
    let me = id(pod);
    let mine = priority(pod);
    let waiting: HashMap<&str, Vec<std::sync::Arc<Pod>>> = held
        .iter()
        .map(|(node, ids)| (node.as_str(), ids.iter().filter(|i| **i != me).filter_map(|i| pending(pods, i)).filter(|p| priority(p) >= mine).collect::<Vec<_>>()))
        .filter(|(_, ps)| !ps.is_empty())
        .collect();
    if waiting.is_empty() {
        return Vec::new();
    }
    let mut bound: HashMap<&str, Vec<std::sync::Arc<Pod>>> = HashMap::new();
    let all = pods.state();
    for p in &all {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            if let Some((node, _)) = waiting.get_key_value(n) {
                bound.entry(node).or_default().push(p.clone());
            }
        }
    }
    let info = PodInfo::from_pod(pod);
    let mut out = Vec::new();
    for (node, planned) in &waiting {
        let Some(n) = nodes.get(&ObjectRef::new(node)) else { continue };
        let mut snap = Snapshot::default();
        snap.nodes.push(NodeInfo::from_node(&n));
        for p in bound.get(node).into_iter().flatten() {
            snap.bind(PodInfo::from_pod(p), 0);
        }
        let mut holding = 0;
        for q in planned {
            let q = PodInfo::from_pod(q);
            if snap.room_for(&q, 0).is_ok() {
                snap.bind(q, 0);
                holding += 1;
            }
        }
        if holding == 0 {
            continue;
        }
        if let Err(why) = snap.room_for(&info, 0) {
            out.push((node.to_string(), format!("room on node {node} is held for {holding} pending pod(s) the provisioning plan put there ({why})")));
        }
    }
    out.sort();
    out
}

fn id(p: &Pod) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or(""))
}

fn priority(p: &Pod) -> i32 {
    p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod `namespace/name` when it is in the cache, not bound, not going away and not done.
fn pending(pods: &Store<Pod>, id: &str) -> Option<std::sync::Arc<Pod>> {
    let (ns, name) = id.split_once('/')?;
    let p = pods.get(&ObjectRef::new(name).within(ns))?;
    let unbound = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty);
    let done = p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    (unbound && p.metadata.deletion_timestamp.is_none() && !done).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};
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

    fn store<K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static>(items: Vec<K>) -> Store<K>
    where
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let mut writer = reflector::store::Writer::<K>::default();
        for i in items {
            writer.apply_watcher_event(&watcher::Event::Apply(i));
        }
        writer.as_reader()
    }

    fn held(node: &str, pods: &[&str]) -> HashMap<String, Vec<String>> {
        [(node.to_string(), pods.iter().map(|p| format!("ns/{p}")).collect())].into()
    }

    #[test]
    fn a_pod_may_not_take_room_held_for_a_planned_pod() {
        let nodes = store(vec![node("n", "2")]);
        let intruder = pod("intruder", "1500m", None, json!({}));
        let pods = store(vec![pod("running", "500m", Some("n"), json!({})), pod("planned", "1", None, json!({})), intruder.clone()]);
        let why = refusals(&intruder, &held("n", &["planned"]), &pods, &nodes);
        assert_eq!(why, vec![("n".to_string(), "room on node n is held for 1 pending pod(s) the provisioning plan put there (Insufficient cpu)".to_string())]);
        // A pod that fits beside the held room is not refused.
        let small = pod("small", "500m", None, json!({}));
        assert!(refusals(&small, &held("n", &["planned"]), &pods, &nodes).is_empty());
        // The planned pod itself is never refused by its own hold.
        let planned = pod("planned", "1", None, json!({}));
        assert!(refusals(&planned, &held("n", &["planned"]), &pods, &nodes).is_empty());
    }

    #[test]
    fn a_hold_ends_when_its_pod_binds_goes_away_or_no_longer_fits() {
        let nodes = store(vec![node("n", "2")]);
        let intruder = pod("intruder", "1500m", None, json!({}));
        // Bound elsewhere: nothing held.
        let pods = store(vec![pod("planned", "1", Some("m"), json!({}))]);
        assert!(refusals(&intruder, &held("n", &["planned"]), &pods, &nodes).is_empty());
        // Deleted (not in the cache): nothing held.
        let pods = store(Vec::<Pod>::new());
        assert!(refusals(&intruder, &held("n", &["planned"]), &pods, &nodes).is_empty());
        // Stale: the planned pod no longer fits beside what is bound there.
        let pods = store(vec![pod("running", "1500m", Some("n"), json!({})), pod("planned", "1", None, json!({}))]);
        let small = pod("small", "500m", None, json!({}));
        assert!(refusals(&small, &held("n", &["planned"]), &pods, &nodes).is_empty());
        // An unknown node holds nothing.
        let pods = store(vec![pod("planned", "1", None, json!({}))]);
        assert!(refusals(&intruder, &held("gone", &["planned"]), &pods, &nodes).is_empty());
    }

    #[test]
    fn held_host_ports_and_priority_follow_kube_scheduler() {
        let nodes = store(vec![node("n", "4")]);
        let port = json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
        let planned = pod("planned", "100m", None, port.clone());
        let other = pod("other", "100m", None, port);
        let pods = store(vec![planned, other.clone()]);
        let why = refusals(&other, &held("n", &["planned"]), &pods, &nodes);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].1.contains("free ports"), "{why:?}");
        // A pod of higher priority than the held pods is not held back (kube-scheduler counts
        // nominated pods only for pods of no higher priority).
        let urgent = pod("urgent", "3900m", None, json!({"priority": 1000}));
        let pods = store(vec![pod("planned", "1", None, json!({})), urgent.clone()]);
        assert!(refusals(&urgent, &held("n", &["planned"]), &pods, &nodes).is_empty());
        let plain = pod("plain", "3900m", None, json!({}));
        assert_eq!(refusals(&plain, &held("n", &["planned"]), &pods, &nodes).len(), 1);
    }
}

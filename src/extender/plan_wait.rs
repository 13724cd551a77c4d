//! When a pod may wait for the registered node its plan named although kube-scheduler refuses
//! that node now.
//!
//! kube-scheduler tries a pod it could not place again only on cluster events its own filters
//! care about. A pod held back by the extender must therefore wait only for something such an
//! event ends. One case is safe and common: the node is refused by topology spread alone (the
//! plan's pods for the other domains have not landed yet), and some of those pods are still
//! pending under a plan. Each of them binding is a Pod event PodTopologySpread requeues the pod
//! on; when the last has landed, the pod no longer waits. A node refused for anything else
//! (its room taken, ports, affinity) is not waited for: no event may ever come.

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::cluster::ClusterView;
use archer_core::sched::{PodInfo, Snapshot};
use archer_model::ClusterState;

/// Why the pod waits for `planned`, the node its plan (made `age` ago) bought for it, which has
/// no Node yet: a live claim will make it. The plan may have opened a domain no node is in yet
/// (a zone its pool allows, [`archer_core::planner`]'s domains), which kube-scheduler cannot
/// see: without the wait it would bind the pod to a node of another domain that registers
/// first, and the planned node would stay empty. The Node's creation is a cluster event
/// kube-scheduler tries the pod again on; past [`PLAN_PATIENCE`] the pod no longer waits.
pub(super) fn node_coming(planned: &str, age: std::time::Duration, state: &ClusterState) -> Option<String> {
    let coming = age < PLAN_PATIENCE && state.claims.iter().any(|c| !c.deleting() && c.node_name() == planned);
    coming.then(|| format!("waiting for node {planned}, which the provisioning plan bought for the pod, to be created"))
}

/// How long after its plan a pod may wait for its planned node: to be created, or to be
/// accepted by kube-scheduler's spread.
pub(super) const PLAN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Would `node` take the pod but for topology spread across nodes? It is checked alone, with
/// the pods bound to it: every filter of the scheduling model holds there, and spread over a
/// single domain always does. Pods with required inter-pod (anti-)affinity are left out (pods
/// on other nodes decide those).
pub(super) fn refused_only_for_spread(pod: &Pod, node: &Node, state: &ClusterState) -> bool {
    let info = PodInfo::from_pod(pod);
    if info.spread.is_empty() || !info.affinity.is_empty() || !info.anti_affinity.is_empty() {
        return false;
    }
    fits_alone(&info, node, state)
}

/// Would `node` take the pod by every filter of the scheduling model, checked alone with the
/// pods bound to it? (Spread over a single domain always holds, and inter-pod rules see only
/// that node's pods.) A node whose room, ports or pods refuse the pod here is refused by
/// kube-scheduler for that, not for a view that lags.
pub(super) fn fits_alone(info: &PodInfo, node: &Node, state: &ClusterState) -> bool {
    let Some(name) = node.metadata.name.as_deref() else { return false };
    let bound: Vec<Pod> = state.pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name)).map(|p| p.as_ref().clone()).collect();
    Snapshot::new(std::slice::from_ref(node), &bound, &[]).fits(info, 0).is_ok()
}

/// Will another pod the pod's spread counts bind soon, where its own plan put it? Such a pod is
/// pending with a plan whose node is still registering (it binds once the node is up), or whose
/// node takes it now by the scheduling model on the bound pods alone (kube-scheduler's view).
/// Pods that are themselves waiting for the others do not count, so pods never wait for each
/// other in a circle.
pub(super) async fn siblings_coming(pod: &Pod, state: &ClusterState, cluster: &ClusterView) -> bool {
    let info = PodInfo::from_pod(pod);
    let all = &state.pods;
    let siblings: Vec<&Pod> = all
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == info.namespace && p.metadata.name.as_deref() != Some(info.name.as_str()))
        .filter(|p| archer_core::awaits_node(p))
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            info.spread.iter().any(|c| c.selector.matches(&labels))
        })
        .map(|p| p.as_ref())
        .collect();
    let mut planned = Vec::new();
    for p in siblings {
        let id = archer_core::pod_id(p);
        if let Some((node, _)) = cluster.planned_node(&id).await {
            planned.push((p, node));
        }
    }
    if planned.is_empty() {
        return false;
    }
    let node_list: Vec<Node> = state.nodes.iter().map(|n| n.as_ref().clone()).collect();
    let bound: Vec<Pod> = all.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())).map(|p| p.as_ref().clone()).collect();
    let snap = Snapshot::new(&node_list, &bound, &[]);
    planned.into_iter().any(|(p, node)| {
        let Some((i, planned_node)) = snap.nodes.iter().enumerate().find(|(_, n)| n.name == node) else { return false };
        let registering = planned_node.taints.iter().any(|t| archer_core::taints::is_registering_taint(&t.key));
        registering || snap.fits(&PodInfo::from_pod(p), i).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn pod(name: &str, cpu: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}))
        .expect("pod")
    }

    fn store(pods: Vec<Pod>) -> ClusterState {
        ClusterState { pods: pods.into_iter().map(Arc::new).collect(), ..Default::default() }
    }

    #[test]
    fn a_pod_waits_for_a_planned_node_only_while_its_claim_is_live_and_the_plan_is_fresh() {
        let claim = |name: &str, node: Option<&str>, deleting: bool| -> Arc<archer_api::nodeclaim::NodeClaim> {
            let mut c: archer_api::nodeclaim::NodeClaim = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name},
                "spec": {"nodePool": "default", "instanceType": "m7g.large", "zone": "us-east-1c", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.08}}))
            .expect("claim");
            c.status = node.map(|n| archer_api::nodeclaim::NodeClaimStatus { node_name: Some(n.into()), ..Default::default() });
            if deleting {
                c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
            }
            Arc::new(c)
        };
        let state = |claims: Vec<Arc<archer_api::nodeclaim::NodeClaim>>| ClusterState { claims, ..Default::default() };
        let fresh = std::time::Duration::from_secs(5);
        // kwok names the node as its claim; a cloud names it at launch (the claim's status).
        assert!(node_coming("zone-c-1", fresh, &state(vec![claim("zone-c-1", None, false)])).is_some());
        assert!(node_coming("ip-10-0-3-7", fresh, &state(vec![claim("zone-c-1", Some("ip-10-0-3-7"), false)])).is_some());
        assert!(node_coming("zone-c-1", fresh, &state(vec![claim("zone-c-1", Some("ip-10-0-3-7"), false)])).is_none(), "the claim's node has another name");
        assert!(node_coming("zone-c-1", fresh, &state(vec![claim("zone-c-1", None, true)])).is_none(), "a claim going away makes no node");
        assert!(node_coming("zone-c-1", fresh, &state(Vec::new())).is_none(), "no claim, no node");
        assert!(node_coming("zone-c-1", PLAN_PATIENCE, &state(vec![claim("zone-c-1", None, false)])).is_none(), "past the patience the pod goes where it may");
    }

    #[test]
    fn a_node_whose_room_a_bound_pod_took_does_not_fit_alone() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "n"}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"}}}))
        .expect("node");
        let incoming = PodInfo::from_pod(&pod("api-1", "1500m", None));
        assert!(fits_alone(&incoming, &node, &store(vec![pod("elsewhere", "1500m", Some("m"))])));
        // A sibling bound there first (kube-scheduler's refusal is its room, not a lagging view).
        assert!(!fits_alone(&incoming, &node, &store(vec![pod("api-0", "1500m", Some("n"))])));
    }
}

//! Which pods get a deletion cost, and the order of nodes the costs make.

use std::sync::Arc;

use serde_json::json;

use archer_core::packer::Offering;

use super::*;

fn node(name: &str, instance_type: &str) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {
            "archer.dev/nodepool": "default", "node.kubernetes.io/instance-type": instance_type,
            "topology.kubernetes.io/zone": "us-east-1a", "karpenter.sh/capacity-type": "on-demand"}}}))
        .expect("node"),
    )
}

fn pod(name: &str, on: Option<&str>, owner: &str, annotations: serde_json::Value) -> Arc<Pod> {
    let owners = if owner.is_empty() { json!([]) } else { json!([{"apiVersion": "apps/v1", "kind": owner, "name": "rs-1", "uid": "rs-1", "controller": true}]) };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "ownerReferences": owners, "annotations": annotations},
            "spec": {"nodeName": on, "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
        }))
        .expect("pod"),
    )
}

fn state(nodes: Vec<Arc<Node>>, pods: Vec<Arc<Pod>>) -> ClusterState {
    ClusterState { nodes, pods, offerings: Arc::new(Offering::embedded_on_demand()), ..Default::default() }
}

#[test]
fn pods_on_dearer_nodes_cost_less_to_delete_and_one_node_one_cost() {
    let s = state(
        vec![node("big", "m5.4xlarge"), node("small", "m5.large"), node("small-2", "m5.large")],
        vec![pod("a", Some("big"), "ReplicaSet", json!({})), pod("b", Some("small"), "ReplicaSet", json!({})), pod("c", Some("big"), "ReplicaSet", json!({})), pod("d", Some("small-2"), "ReplicaSet", json!({}))],
    );
    let w = writes(&s, 100);
    let cost = |p: &str| w.iter().find(|x| x.name == p).map(|x| x.cost).expect("written");
    assert_eq!(w.len(), 4);
    assert_eq!(cost("a"), cost("c"), "one node, one cost");
    assert!(cost("a") < cost("b"), "the dearer node's pods go first");
    assert_ne!(cost("b"), cost("d"), "nodes of one price in a fixed order");
    assert_eq!(node_cost("small", Some(0.096)), node_cost("small", Some(0.096)));
    assert!(w.iter().all(|x| x.cost >= 0));
}

#[test]
fn only_replica_set_pods_on_managed_nodes_whose_cost_is_archers() {
    let mut unmanaged = (*node("other", "m5.large")).clone();
    unmanaged.metadata.labels = Some(Default::default());
    let ours = node_cost("n", Some(0.096)).to_string();
    let s = state(
        vec![node("n", "m5.large"), Arc::new(unmanaged)],
        vec![
            pod("job", Some("n"), "Job", json!({})),
            pod("bare", Some("n"), "", json!({})),
            pod("pending", None, "ReplicaSet", json!({})),
            pod("elsewhere", Some("other"), "ReplicaSet", json!({})),
            pod("users", Some("n"), "ReplicaSet", json!({POD_DELETION_COST: "-5"})),
            pod("done", Some("n"), "ReplicaSet", json!({POD_DELETION_COST: ours, ARCHER_DELETION_COST: ours})),
            pod("stale", Some("n"), "ReplicaSet", json!({POD_DELETION_COST: "7", ARCHER_DELETION_COST: "7"})),
            pod("changed-by-user", Some("n"), "ReplicaSet", json!({POD_DELETION_COST: "9", ARCHER_DELETION_COST: "7"})),
            pod("fresh", Some("n"), "ReplicaSet", json!({})),
        ],
    );
    let names: Vec<String> = writes(&s, 100).into_iter().map(|w| w.name).collect();
    assert_eq!(names, ["stale", "fresh"]);
    assert_eq!(writes(&s, 1).len(), 1, "at most the limit");
}

#[test]
fn costs_stay_inside_an_int32_whatever_the_price() {
    for price in [None, Some(0.0), Some(-1.0), Some(f64::NAN), Some(f64::INFINITY), Some(1e12), Some(0.0015)] {
        let c = node_cost("node-with-a-long-name", price);
        assert!((0..1_000_000_000).contains(&c), "{price:?}: {c}");
    }
    assert!(node_cost("n", Some(2.0)) < node_cost("n", Some(1.0)));
}

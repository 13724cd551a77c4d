//! One disruption pass on recorded cluster states, at a fixed time.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use time::OffsetDateTime;

use super::*;
use crate::consolidation::pool_nodes;
use crate::ClusterState;
use archer_core::packer::{Offering, Pool};
use archer_core::platform::PlatformSet;
use archer_core::sched::Volumes;

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_767_226_200).expect("time")
}

fn ago(hours: i64) -> String {
    (now() - time::Duration::hours(hours)).format(&time::format_description::well_known::Rfc3339).expect("format")
}

fn node_pool(template_labels: serde_json::Value) -> NodePool {
    serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"metadata": {"labels": template_labels}, "spec": {"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}},
                 "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}}}))
    .expect("pool")
}

fn node(name: &str) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": "us-east-1a", "archer.dev/nodepool": "default", "node.kubernetes.io/instance-type": "m5.xlarge"}},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("node"),
    )
}

/// A claim for node `name`, written `hours` ago from `pool` as it is now (or from another template).
fn claim(name: &str, hours: i64, pool: &NodePool, same_template: bool) -> Arc<NodeClaim> {
    let hash = if same_template { crate::drift::pool_hash(pool) } else { "0000000000000000".into() };
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": name, "creationTimestamp": ago(hours), "annotations": {crate::drift::POOL_HASH_ANNOTATION: hash}},
            "spec": {"nodePool": "default", "instanceType": "m5.xlarge", "zone": "us-east-1a", "capacityType": "on-demand", "arch": "amd64", "os": "linux", "pricePerHour": 0.192},
            "status": {"providerId": format!("kwok://{name}"), "nodeName": name, "launchedAt": ago(hours)}}))
        .expect("claim"),
    )
}

fn pod(name: &str, on: &str) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]},
            "spec": {"nodeName": on, "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod"),
    )
}

/// Every test pod runs image `x`, known to be amd64 only.
fn amd64(mut state: ClusterState) -> ClusterState {
    state.platforms.insert("x".into(), PlatformSet::parse_annotation("linux/amd64").expect("platform"));
    state
}

/// The pass on `state` with every clock run out unless `clock` says otherwise.
fn pass(state: &ClusterState, pool: &NodePool, draining: &dyn Fn(&str) -> bool, hold: Option<&str>, provider_drift: &dyn Fn(&NodeClaim) -> Option<String>) -> Vec<Command> {
    let settings = DisruptionSettings::of(pool).expect("settings");
    let nodes = pool_nodes(state, "default", &|_| true, &|n| state.claim_of_node(n.metadata.name.as_deref().unwrap_or("")).map(|c| c.spec.price_per_hour), &mut |_| {});
    let pools = [Pool { name: "default".into(), weight: 0, requirements: Default::default(), labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: None, daemons: Vec::new(), closed: None, variant: Default::default() }];
    let volumes = Volumes::default();
    let world = World { state, pools: &pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
    let clock = Clock { now: now(), draining, empty_long_enough: &|_| true, settled: &|_| true, hold: hold.map(String::from) };
    disrupt_pool(&world, pool, &settings, &nodes, &clock, provider_drift, Search::exhaustive(0.02))
}

fn cluster(pool: &NodePool, claims: Vec<Arc<NodeClaim>>, pods: Vec<Arc<Pod>>) -> ClusterState {
    let nodes = claims.iter().map(|c| node(&c.name())).collect();
    amd64(ClusterState { nodes, claims, pods, pools: vec![Arc::new(pool.clone())], offerings: Arc::new(Offering::embedded_on_demand()), ..Default::default() })
}

fn no_drift(_: &NodeClaim) -> Option<String> {
    None
}

#[test]
fn an_expired_node_goes_first_and_stops_the_pass() {
    let pool = node_pool(json!({}));
    // Karpenter's default expireAfter is 720h; "old" was written 800h ago, "drifted" has another template.
    let state = cluster(&pool, vec![claim("old", 800, &pool, true), claim("drifted", 1, &pool, false)], vec![pod("a", "old"), pod("b", "drifted")]);
    assert_eq!(pass(&state, &pool, &|_| false, None, &no_drift), [Command::Expire { node: "old".into() }]);
    // While a node of the pool drains, nothing else is started.
    let young = cluster(&pool, vec![claim("n1", 1, &pool, false), claim("n2", 1, &pool, true)], vec![pod("a", "n1"), pod("b", "n2")]);
    assert_eq!(pass(&young, &pool, &|n| n == "n2", None, &no_drift), []);
}

#[test]
fn drifted_nodes_are_replaced_by_the_pools_template_or_the_providers_reason_even_while_consolidation_holds() {
    let pool = node_pool(json!({}));
    let state = cluster(&pool, vec![claim("n1", 1, &pool, false), claim("n2", 1, &pool, true)], vec![pod("a", "n1"), pod("b", "n2")]);
    let got = pass(&state, &pool, &|_| false, Some("pod x is waiting for capacity"), &no_drift);
    assert_eq!(got, [Command::Replace { node: "n1".into(), why: "NodePool default changed its node template".into() }]);
    let image = |c: &NodeClaim| (c.name() == "n2").then(|| "a newer image replaced ami-1".to_string());
    let fresh = cluster(&pool, vec![claim("n1", 1, &pool, true), claim("n2", 1, &pool, true)], vec![pod("a", "n1"), pod("b", "n2")]);
    assert_eq!(pass(&fresh, &pool, &|_| false, None, &image), [Command::Replace { node: "n2".into(), why: "a newer image replaced ami-1".into() }]);
}

#[test]
fn consolidation_runs_only_on_a_settled_cluster_and_records_what_it_decided_on() {
    let pool = node_pool(json!({}));
    let state = cluster(&pool, vec![claim("busy", 1, &pool, true), claim("idle", 1, &pool, true)], vec![pod("a", "busy")]);
    assert_eq!(pass(&state, &pool, &|_| false, Some("node claim x is still launching"), &no_drift), []);
    let got = pass(&state, &pool, &|_| false, None, &no_drift);
    let [Command::Consolidate { decision, before }] = got.as_slice() else { panic!("{got:?}") };
    assert_eq!((decision.reason, decision.nodes.clone()), ("empty", vec!["idle".to_string()]));
    assert_eq!(before.get("idle"), Some(&Vec::new()));
}

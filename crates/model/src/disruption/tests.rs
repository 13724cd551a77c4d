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

/// The rule the worker and `archer simulate --disruption` share: Ready, registered, not being
/// deleted, launched by a claim at least the grace period ago; priced by the claim.
#[test]
fn disruption_takes_only_settled_nodes_of_its_own_claims_priced_by_them() {
    let pool = node_pool(json!({}));
    let with = |f: &dyn Fn(&mut Node)| {
        let mut n = node("n").as_ref().clone();
        f(&mut n);
        Arc::new(n)
    };
    let named = |name: &str, f: &dyn Fn(&mut Node)| {
        with(&|n: &mut Node| {
            n.metadata.name = Some(name.into());
            f(n);
        })
    };
    let nodes = vec![
        named("settled", &|_| {}),
        named("young", &|_| {}),
        named("not-ready", &|n| n.status.as_mut().expect("status").conditions = Some(Vec::new())),
        named("unregistered", &|n| n.spec = Some(k8s_openapi::api::core::v1::NodeSpec { taints: Some(vec![k8s_openapi::api::core::v1::Taint { key: "karpenter.sh/unregistered".into(), effect: "NoSchedule".into(), ..Default::default() }]), ..Default::default() })),
        named("deleting", &|n| n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()))),
        named("karpenters", &|_| {}),
    ];
    let claims = ["settled", "not-ready", "unregistered", "deleting"].iter().map(|n| claim(n, 2, &pool, true)).chain([claim("young", 0, &pool, true)]).collect();
    let state = ClusterState { nodes, claims, pools: vec![Arc::new(pool)], now_ms: now().unix_timestamp() * 1000, ..Default::default() };
    let found = candidates(&state, "default", std::time::Duration::from_secs(600));
    let names: Vec<(&str, f64)> = found.candidates.iter().map(|c| (c.name(), c.price)).collect();
    assert_eq!(names, vec![("settled", 0.192)]);
    assert_eq!(found.total, 6);
    assert_eq!(found.disrupting, 1, "the node being deleted is leaving");
    // Without a grace period the young claim's node is a candidate too.
    let found = candidates(&state, "default", std::time::Duration::ZERO);
    assert_eq!(found.candidates.iter().map(|c| c.name()).collect::<Vec<_>>(), vec!["settled", "young"]);
}

/// `archer simulate --disruption` reads a scenario's nodes as Archer's: each gets a claim priced
/// by its offering, and a node with no offering is left alone.
#[test]
fn a_scenario_is_read_as_launched_by_archer() {
    let pool = node_pool(json!({}));
    let on_demand = |name: &str| {
        let mut n = node(name).as_ref().clone();
        n.metadata.labels.as_mut().expect("labels").insert("karpenter.sh/capacity-type".into(), "on-demand".into());
        n
    };
    let mut odd = on_demand("odd");
    odd.metadata.labels.as_mut().expect("labels").insert("node.kubernetes.io/instance-type".into(), "no-such-type".into());
    let mut unready = on_demand("plain");
    unready.status.as_mut().expect("status").conditions = None;
    // A dump's node: NotReady then, still registering, with the claim it was launched by (at
    // another price, an hour before the dump was taken).
    let mut dumped = on_demand("dumped");
    dumped.status.as_mut().expect("status").conditions = Some(vec![k8s_openapi::api::core::v1::NodeCondition { type_: "Ready".into(), status: "False".into(), ..Default::default() }]);
    dumped.spec = Some(k8s_openapi::api::core::v1::NodeSpec { taints: Some(vec![k8s_openapi::api::core::v1::Taint { key: "karpenter.sh/unregistered".into(), effect: "NoSchedule".into(), ..Default::default() }]), ..Default::default() });
    let mut paid = claim("dumped", 1, &pool, true).as_ref().clone();
    paid.spec.price_per_hour = 9.99;
    let state = ClusterState { nodes: vec![Arc::new(unready), Arc::new(odd), Arc::new(dumped)], claims: vec![Arc::new(paid)], pools: vec![Arc::new(pool)], ..Default::default() };
    let scenario = crate::scenario::Scenario { state, ..Default::default() };
    let offerings = Offering::embedded_on_demand();
    let launched = scenario.as_launched(&offerings);
    let found = candidates(&launched, "default", std::time::Duration::ZERO);
    let plain = on_demand("plain");
    let price = ClusterState { offerings: Arc::new(offerings.clone()), ..Default::default() }.pricer().per_hour(&plain).expect("m5.xlarge is offered in us-east-1a");
    assert_eq!(found.candidates.iter().map(|c| (c.name(), c.price)).collect::<Vec<_>>(), vec![("plain", price), ("dumped", price)], "every pool node with an offering, priced by the catalog");
    assert_eq!(scenario.state.claims.len(), 1, "the scenario itself is unchanged");
    assert_eq!(scenario.state.claims[0].spec.price_per_hour, 9.99);
}

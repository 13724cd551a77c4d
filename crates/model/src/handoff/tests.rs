#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, reason = "test code")]

use super::*;
use crate::plans::{Placement, Plans};
use archer_api::nodeclaim::{NodeClaim, NodeClaimStatus};
use serde_json::json;

const NOW: i64 = 10_000_000;

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

fn node(name: &str, cpu: &str, taints: &[&str]) -> Node {
    let taints: Vec<serde_json::Value> = taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect();
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}}))
    .expect("node")
}

fn claim(name: &str, node: Option<&str>, deleting: bool) -> Arc<NodeClaim> {
    let mut c: NodeClaim = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodePool": "default", "instanceType": "m7g.large", "zone": "us-east-1c", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.08}}))
    .expect("claim");
    c.status = node.map(|n| NodeClaimStatus { node_name: Some(n.into()), ..Default::default() });
    if deleting {
        c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
    }
    Arc::new(c)
}

/// A state of `nodes` and `pods` whose plans put each `(pod, node, ms ago)` there, and in which
/// each `(node, ms ago)` of `registered` finished registering.
fn state(nodes: Vec<Node>, pods: Vec<Pod>, planned: &[(&str, &str, i64)], registered: &[(&str, i64)]) -> ClusterState {
    let placements = planned.iter().map(|(p, n, ago)| (format!("ns/{p}"), Placement { node: n.to_string(), at_ms: NOW - ago })).collect();
    let registered = registered.iter().map(|(n, ago)| (n.to_string(), NOW - ago)).collect();
    ClusterState {
        nodes: nodes.into_iter().map(Arc::new).collect(),
        pods: pods.into_iter().map(Arc::new).collect(),
        plans: Plans::new(1, NOW, Arc::new(placements), Arc::new(registered)),
        ..Default::default()
    }
}

#[test]
fn a_pod_takes_only_its_planned_node_when_kube_scheduler_offers_it() {
    let p = pod("api-0", "1", None, json!({}));
    let s = state(vec![node("n", "2", &[]), node("m", "2", &[])], vec![p.clone()], &[("api-0", "n", 1_000)], &[]);
    let steer = steer(&s, &p, &["m", "n"]).expect("steered");
    assert_eq!((steer.node.as_str(), steer.offered), ("n", true));
    // No plan: no steering.
    let q = pod("other", "1", None, json!({}));
    assert_eq!(super::steer(&s, &q, &["m", "n"]), None);
}

#[test]
fn a_pod_waits_for_a_planned_node_only_while_its_claim_is_live_and_the_plan_is_fresh() {
    let p = pod("api-0", "1", None, json!({}));
    let with_claims = |claims: Vec<Arc<NodeClaim>>, node: &str, ago: i64| {
        let mut s = state(Vec::new(), vec![p.clone()], &[("api-0", node, ago)], &[]);
        s.claims = claims;
        steer(&s, &p, &["m"]).map(|s| s.why)
    };
    let waiting = Some("waiting for node zone-c-1, which the provisioning plan bought for the pod, to be created".to_string());
    // kwok names the node as its claim; a cloud names it at launch (the claim's status).
    assert_eq!(with_claims(vec![claim("zone-c-1", None, false)], "zone-c-1", 5_000), waiting);
    assert!(with_claims(vec![claim("zone-c-1", Some("ip-10-0-3-7"), false)], "ip-10-0-3-7", 5_000).is_some());
    assert_eq!(with_claims(vec![claim("zone-c-1", Some("ip-10-0-3-7"), false)], "zone-c-1", 5_000), None, "the claim's node has another name");
    assert_eq!(with_claims(vec![claim("zone-c-1", None, true)], "zone-c-1", 5_000), None, "a claim going away makes no node");
    assert_eq!(with_claims(Vec::new(), "zone-c-1", 5_000), None, "no claim, no node");
    let patience = i64::try_from(PLAN_PATIENCE.as_millis()).expect("ms");
    assert_eq!(with_claims(vec![claim("zone-c-1", None, false)], "zone-c-1", patience), None, "past the patience the pod goes where it may");
}

#[test]
fn a_pod_waits_for_its_planned_node_while_it_registers_and_while_kube_scheduler_may_lag() {
    let p = pod("api-0", "1", None, json!({}));
    let lag = i64::try_from(SCHEDULER_VIEW_LAG.as_millis()).expect("ms");
    let why = |n: Node, registered: &[(&str, i64)], ago: i64| steer(&state(vec![n], vec![p.clone()], &[("api-0", "n", ago)], registered), &p, &["m"]).map(|s| s.why);
    // Still tainted as registering, or not-ready still on: wait (however old the plan).
    assert_eq!(why(node("n", "2", &["karpenter.sh/unregistered"]), &[], 600_000).as_deref(), Some("waiting for node n, which the provisioning plan bought for the pod, to register"));
    assert!(why(node("n", "2", &["node.kubernetes.io/not-ready"]), &[], 600_000).is_some());
    // Registered a moment ago by Archer's cache: kube-scheduler's may still show the taint.
    assert_eq!(why(node("n", "2", &[]), &[("n", 40)], 600_000).as_deref(), Some("waiting for kube-scheduler to see node n, which the provisioning plan bought for the pod, registered"));
    // Long registered, or never seen registering (up before Archer started): kube-scheduler
    // refused it for reasons of its own, and the pod is not held back.
    assert_eq!(why(node("n", "2", &[]), &[("n", lag)], 600_000), None);
    assert_eq!(why(node("n", "2", &[]), &[], 600_000), None);
    // Registered a moment ago but its room is taken: kube-scheduler refuses it for that.
    let s = state(vec![node("n", "2", &[])], vec![p.clone(), pod("big", "1500m", Some("n"), json!({}))], &[("api-0", "n", 600_000)], &[("n", 40)]);
    assert_eq!(steer(&s, &p, &["m"]), None);
}

#[test]
fn a_pod_refused_for_spread_alone_waits_while_its_siblings_are_coming() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "api"}}}]});
    let labelled = |name: &str, node: Option<&str>| {
        let mut p = pod(name, "500m", node, spread.clone());
        p.metadata.labels = Some([("app".to_string(), "api".to_string())].into());
        p
    };
    let (a, b) = (labelled("api-0", None), labelled("api-1", None));
    let nodes = || vec![node("n", "2", &[]), node("m", "2", &["karpenter.sh/unregistered"])];
    // api-1 is planned onto m, still registering: api-0 waits for n.
    let s = state(nodes(), vec![a.clone(), b.clone()], &[("api-0", "n", 1_000), ("api-1", "m", 1_000)], &[]);
    let why = steer(&s, &a, &["x"]).expect("waits").why;
    assert!(why.contains("until the pods planned before it in other domains land"), "{why}");
    // No sibling planned: nothing to wait for.
    let s = state(nodes(), vec![a.clone(), b.clone()], &[("api-0", "n", 1_000)], &[]);
    assert_eq!(steer(&s, &a, &["x"]), None);
    // Past the patience: the pod goes where it may.
    let s = state(nodes(), vec![a.clone(), b], &[("api-0", "n", 61_000), ("api-1", "m", 1_000)], &[]);
    assert_eq!(steer(&s, &a, &["x"]), None);
}

#[test]
fn a_node_whose_room_a_bound_pod_took_does_not_fit_alone() {
    let n = node("n", "2", &[]);
    let incoming = PodInfo::from_pod(&pod("api-1", "1500m", None, json!({})));
    assert!(fits_alone(&incoming, &n, &state(Vec::new(), vec![pod("elsewhere", "1500m", Some("m"), json!({}))], &[], &[])));
    // A sibling bound there first (kube-scheduler's refusal is its room, not a lagging view).
    assert!(!fits_alone(&incoming, &n, &state(Vec::new(), vec![pod("api-0", "1500m", Some("n"), json!({}))], &[], &[])));
}

/// The room plans hold when `held` pods are planned onto `on`.
fn held_on(on: &str, held: &[&str], nodes: Vec<Node>, pods: Vec<Pod>) -> HeldRoom {
    let planned: Vec<(&str, &str, i64)> = held.iter().map(|p| (*p, on, 0)).collect();
    HeldRoom::build(&state(nodes, pods, &planned, &[]))
}

/// `n` candidates: the held node and others.
fn cands(n: usize) -> &'static [&'static str] {
    &["n", "other", "third"][..n]
}

#[test]
fn a_pod_may_not_take_room_held_for_a_planned_pod() {
    let intruder = pod("intruder", "1500m", None, json!({}));
    let pods = vec![pod("running", "500m", Some("n"), json!({})), pod("planned", "1", None, json!({})), intruder.clone()];
    let held = held_on("n", &["planned"], vec![node("n", "2", &[])], pods);
    assert_eq!(held.refusals(&intruder, cands(2)), vec![("n".to_string(), "room on node n is held for 1 pending pod(s) the provisioning plan put there (Insufficient cpu)".to_string())]);
    // A pod that fits beside the held room is not refused.
    assert!(held.refusals(&pod("small", "500m", None, json!({})), cands(2)).is_empty());
    // The planned pod itself is never refused by its own hold.
    assert!(held.refusals(&pod("planned", "1", None, json!({})), cands(2)).is_empty());
}

#[test]
fn held_room_never_leaves_a_pod_without_a_node() {
    let intruder = pod("intruder", "1500m", None, json!({}));
    let held = held_on("n", &["planned"], vec![node("n", "2", &[])], vec![pod("planned", "1", None, json!({})), intruder.clone()]);
    assert_eq!(held.refusals(&intruder, cands(2)).len(), 1, "another node is left");
    assert!(held.refusals(&intruder, cands(1)).is_empty(), "n was the only candidate");
}

#[test]
fn held_room_counts_anti_affinity_both_ways() {
    let anti = |app: &str| json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    let labelled = |name: &str, app: &str, extra: serde_json::Value| {
        let mut p = pod(name, "100m", None, extra);
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        p
    };
    // The held pod refuses pods it must not share a host with...
    let (db, web) = (labelled("db", "db", anti("web")), labelled("web", "web", json!({})));
    let why = held_on("n", &["db"], vec![node("n", "4", &[])], vec![db.clone(), web.clone()]).refusals(&web, cands(2));
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].1.contains("anti-affinity"), "{why:?}");
    // ...and a pod that must not share a host with the held one is refused too.
    let (web2, db2) = (labelled("web2", "web", anti("db")), labelled("db2", "db", json!({})));
    assert_eq!(held_on("n", &["db2"], vec![node("n", "4", &[])], vec![db2, web2.clone()]).refusals(&web2, cands(2)).len(), 1);
    // Without labels on the node there is no domain, hence no conflict.
    let mut bare = node("n", "4", &[]);
    bare.metadata.labels = None;
    assert!(held_on("n", &["db"], vec![bare], vec![db, web.clone()]).refusals(&web, cands(2)).is_empty());
}

#[test]
fn a_hold_ends_when_its_pod_binds_goes_away_or_no_longer_fits() {
    let intruder = pod("intruder", "1500m", None, json!({}));
    let n = || vec![node("n", "2", &[])];
    // Bound elsewhere: nothing held.
    assert!(held_on("n", &["planned"], n(), vec![pod("planned", "1", Some("m"), json!({}))]).refusals(&intruder, cands(2)).is_empty());
    // Deleted (not in the state): nothing held.
    assert!(held_on("n", &["planned"], n(), Vec::new()).refusals(&intruder, cands(2)).is_empty());
    // Stale: the planned pod no longer fits beside what is bound there.
    let pods = vec![pod("running", "1500m", Some("n"), json!({})), pod("planned", "1", None, json!({}))];
    assert!(held_on("n", &["planned"], n(), pods).refusals(&pod("small", "500m", None, json!({})), cands(2)).is_empty());
    // An unknown node holds nothing.
    assert!(held_on("gone", &["planned"], n(), vec![pod("planned", "1", None, json!({}))]).refusals(&intruder, cands(2)).is_empty());
}

#[test]
fn held_host_ports_and_priority_follow_kube_scheduler() {
    let port = json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]});
    let other = pod("other", "100m", None, port.clone());
    let why = held_on("n", &["planned"], vec![node("n", "4", &[])], vec![pod("planned", "100m", None, port), other.clone()]).refusals(&other, cands(2));
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].1.contains("free ports"), "{why:?}");
    // A pod of higher priority than the held pods is not held back (kube-scheduler counts
    // nominated pods only for pods of no higher priority).
    let urgent = pod("urgent", "3900m", None, json!({"priority": 1000}));
    let plain = pod("plain", "3900m", None, json!({}));
    let held = held_on("n", &["planned"], vec![node("n", "4", &[])], vec![pod("planned", "1", None, json!({})), urgent.clone(), plain.clone()]);
    assert!(held.refusals(&urgent, cands(2)).is_empty());
    assert_eq!(held.refusals(&plain, cands(2)).len(), 1);
}

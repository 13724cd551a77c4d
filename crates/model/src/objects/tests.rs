use super::*;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn pending(extra_spec: serde_json::Value, extra_status: serde_json::Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": "p", "namespace": "ns", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    });
    if let (Some(s), Some(e)) = (p["spec"].as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    if let (Some(s), Some(e)) = (p["status"].as_object_mut(), extra_status.as_object()) {
        s.extend(e.clone());
    }
    pod(p)
}

#[test]
fn provisionable_pods_are_unschedulable_ungated_unnominated_and_not_daemons() {
    let none: &[String] = &[];
    let eager = &["default-scheduler".to_string()];
    for e in [none, eager] {
        assert!(is_provisionable(&pending(json!({}), json!({})), e));
        assert!(!is_provisionable(&pending(json!({"schedulingGates": [{"name": "wait"}]}), json!({})), e), "gated");
        assert!(!is_provisionable(&pending(json!({}), json!({"nominatedNodeName": "n1"})), e), "nominated");
        assert!(!is_provisionable(&pending(json!({"nodeName": "n1"}), json!({})), e), "bound");
        assert!(!is_provisionable(&pending(json!({}), json!({"phase": "Failed"})), e), "terminal");
        assert!(!is_provisionable(&pending(json!({}), json!({"conditions": [{"type": "PodScheduled", "status": "True"}]})), e), "scheduled, binding");
        let mut d = pending(json!({}), json!({}));
        d.metadata.owner_references = Some(vec![serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "2", "controller": true})).expect("owner")]);
        assert!(!is_provisionable(&d, e), "DaemonSet pod");
    }
    // Not tried yet by its scheduler: only a scheduler that consults Archer's plan.
    let untried = pending(json!({}), json!({"conditions": []}));
    let gate_lifted = pending(json!({}), json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}));
    let other = pending(json!({"schedulerName": "someone-else"}), json!({"conditions": []}));
    let named = pending(json!({"schedulerName": "default-scheduler"}), json!({"conditions": []}));
    assert!(!is_provisionable(&untried, none) && !is_provisionable(&gate_lifted, none), "waits for Unschedulable");
    assert!(is_provisionable(&untried, eager) && is_provisionable(&gate_lifted, eager) && is_provisionable(&named, eager), "planned at once");
    assert!(!is_provisionable(&other, eager), "another scheduler's pod waits until it says Unschedulable");
    let other_failed = pending(json!({"schedulerName": "someone-else"}), json!({}));
    assert!(is_provisionable(&other_failed, eager), "any scheduler's Unschedulable counts");
}

fn node(name: &str, pool: Option<&str>, taints: serde_json::Value) -> Node {
    let mut labels = json!({"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"});
    if let Some(p) = pool {
        labels["archer.dev/nodepool"] = json!(p);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "20"}, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node")
}

fn claim(name: &str, pool: &str, startup: &[&str]) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodePool": pool, "instanceType": "m6i.large", "zone": "us-east-1a", "capacityType": "on-demand", "arch": "amd64", "os": "linux",
                 "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"},
                 "startupTaints": startup.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
                 "capacity": {"cpu": "2000m", "memory": "8192Mi", "pods": "29"}, "allocatable": {"cpu": "1930m", "memory": "6000Mi", "pods": "29"}, "pricePerHour": 0.096}
    }))
    .expect("claim")
}

fn packer_pool(name: &str, daemon: Option<Resources>) -> Pool {
    let np: NodePool = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": name}, "spec": {}})).expect("pool");
    let mut p = np.to_pool().expect("pool");
    p.daemons = daemon.map(|r| vec![DaemonLoad { selector: Requirements::new(), tolerations: Vec::new(), requests: r }]).unwrap_or_default();
    p
}

#[test]
fn free_room_counts_bound_pods_in_flight_claims_and_daemonsets() {
    let busy = node("busy", None, json!([]));
    let mut on_busy = pending(json!({"nodeName": "busy"}), json!({"phase": "Running"}));
    on_busy.metadata.name = Some("a".into());
    let mut done = pending(json!({"nodeName": "busy"}), json!({"phase": "Succeeded"}));
    done.metadata.name = Some("done".into());
    // A node still starting: its not-ready and startup taints do not turn pods away in simulation.
    let starting = node("starting", Some("p"), json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}, {"key": "cilium-agent", "effect": "NoSchedule"}, {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]));
    let leaving = node("leaving", Some("p"), json!([{"key": labels::DISRUPTED_TAINT, "effect": "NoSchedule"}]));
    let claims = [claim("starting", "p", &["cilium-agent"]), claim("in-flight", "p", &[])];
    let pools = [packer_pool("p", Some(Resources::new(100, 64 << 20, 1)))];
    let snap = crate::adapter::cluster_snapshot(&[&busy, &starting, &leaving], &claims.iter().collect::<Vec<_>>(), &[&on_busy, &done], &[], &pools, &|_| false);
    let by: BTreeMap<&str, &archer_core::sched::NodeInfo> = snap.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let free = |n: &archer_core::sched::NodeInfo| (n.allocatable.get("cpu") - n.requested.get("cpu"), n.allocatable.get("memory") - n.requested.get("memory"), n.max_pods - n.pods.len() as i64);
    assert!(by["leaving"].unschedulable, "a node being disrupted offers no room");
    assert!(by["leaving"].pods.is_empty(), "but it stays in the snapshot so its pods count for spread and anti-affinity");
    assert_eq!(free(by["busy"]), (1500, (4 << 30) - (1 << 30), 19), "the finished pod frees its room");
    assert_eq!(by["busy"].pods.len(), 1, "the running pod is in the snapshot");
    assert_eq!(by["starting"].taints.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), vec!["dedicated"], "ephemeral and startup taints dropped, real ones kept");
    assert_eq!(free(by["starting"]), (2000 - 100, (4 << 30) - (64 << 20), 19), "the DaemonSet's room is held until its pod shows up");
    assert_eq!(free(by["in-flight"]), (1930 - 100, 6000 * (1 << 20) - (64 << 20), 28), "a claim without a node yet");
    assert_eq!(by["in-flight"].labels.get(labels::HOSTNAME).map(String::as_str), Some("in-flight"));
    let skipped = crate::adapter::cluster_snapshot(&[&busy], &[], &[&on_busy], &[], &pools, &|n| n == "busy");
    assert!(skipped.nodes.is_empty() && skipped.pods.is_empty());
}

/// A cloud names the node after the instance, not the claim: a launched claim whose node has
/// registered is that node (its room is not counted twice), and one whose node has not is a
/// node-to-be under the name its node will have (where the claim's planned pods are expected).
#[test]
fn a_claims_node_named_by_the_cloud_is_counted_once_under_that_name() {
    let launched = |claim_name: &str, node_name: &str| {
        let mut c = claim(claim_name, "p", &[]);
        c.status = Some(archer_api::nodeclaim::NodeClaimStatus { provider_id: Some(format!("aws:///us-east-1a/i-{claim_name}")), node_name: Some(node_name.into()), ..Default::default() });
        c
    };
    let registered = node("ip-10-0-0-4.ec2.internal", Some("p"), json!([]));
    let claims = [launched("p-abcde", "ip-10-0-0-4.ec2.internal"), launched("p-fghij", "ip-10-0-0-5.ec2.internal")];
    let pools = [packer_pool("p", None)];
    let snap = crate::adapter::cluster_snapshot(&[&registered], &claims.iter().collect::<Vec<_>>(), &[], &[], &pools, &|_| false);
    let names: Vec<&str> = snap.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["ip-10-0-0-4.ec2.internal", "ip-10-0-0-5.ec2.internal"]);
    assert_eq!(snap.nodes[1].labels.get(labels::HOSTNAME).map(String::as_str), Some("ip-10-0-0-5.ec2.internal"));
    // Leaving out a node leaves out its claim too (consolidation and interruptions plan so).
    let without = crate::adapter::cluster_snapshot(&[&registered], &claims.iter().collect::<Vec<_>>(), &[], &[], &pools, &|n| n == "ip-10-0-0-4.ec2.internal");
    assert_eq!(without.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["ip-10-0-0-5.ec2.internal"]);
}

#[test]
fn pool_limits_are_reduced_by_what_the_pool_already_launched() {
    let np: NodePool = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "p"}, "spec": {"limits": {"cpu": "10", "memory": "100Gi", "nodes": 3}}})).expect("pool");
    let mut gone = claim("gone", "p", &[]);
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-01-01T00:00:00Z".parse().expect("time")));
    let claims = [claim("a", "p", &[]), claim("b", "p", &[]), claim("other", "q", &[]), gone];
    let pools = packer_pools(&[&np], &claims.iter().collect::<Vec<_>>(), &[], &|_| None);
    assert_eq!(pools[0].limit_cpu_millis, Some(10_000 - 4000));
    assert_eq!(pools[0].limit_memory_bytes, Some(100 * (1 << 30) - 2 * 8192 * (1 << 20)));
    assert_eq!(pools[0].limit_nodes, Some(1), "two live claims of this pool count; another pool's and a deleted one do not");
}

#[test]
fn budgets_and_disruption_settings() {
    assert_eq!(BudgetValue::parse("10%").map(|b| b.allowed(3)), Ok(1), "percentages round up");
    assert_eq!(BudgetValue::parse("50%").map(|b| b.allowed(5)), Ok(3));
    assert_eq!(BudgetValue::parse("0").map(|b| b.allowed(5)), Ok(0));
    assert_eq!(BudgetValue::parse("2").map(|b| b.allowed(50)), Ok(2));
    assert!(BudgetValue::parse("110%").is_err() && BudgetValue::parse("lots").is_err());

    let np = |spec: serde_json::Value| -> NodePool { serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "p"}, "spec": spec})).expect("pool") };
    let d = DisruptionSettings::of(&np(json!({}))).expect("defaults");
    assert!(d.underutilized);
    assert_eq!((d.consolidate_after, d.expire_after), (Some(Duration::ZERO), Some(Duration::from_secs(720 * 3600))));
    assert_eq!(d.allowed(20, "Empty"), 2, "Karpenter's default budget: 10%");
    let d = DisruptionSettings::of(&np(json!({
        "template": {"spec": {"expireAfter": "Never"}},
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "1h30m", "budgets": [{"nodes": "5"}, {"nodes": "0", "reasons": ["Underutilized"]}]}
    })))
    .expect("settings");
    assert!(!d.underutilized);
    assert_eq!((d.consolidate_after, d.expire_after), (Some(Duration::from_secs(5400)), None));
    assert_eq!((d.allowed(100, "Empty"), d.allowed(100, "Underutilized")), (5, 0), "the smallest budget that applies");
    assert!(DisruptionSettings::of(&np(json!({"disruption": {"consolidationPolicy": "Sometimes"}}))).is_err());
    assert!(DisruptionSettings::of(&np(json!({"disruption": {"consolidateAfter": "soon"}}))).is_err());
}

#[test]
fn what_blocks_a_drain_and_what_is_evicted() {
    let owned = pending(json!({"nodeName": "n"}), json!({"phase": "Running"}));
    assert_eq!(disruption_blocker(&[&owned]), None);
    let mut annotated = owned.clone();
    annotated.metadata.annotations = Some([("karpenter.sh/do-not-disrupt".to_string(), "true".to_string())].into_iter().collect());
    assert!(disruption_blocker(&[&owned, &annotated]).is_some_and(|w| w.contains("do-not-disrupt")));
    let mut bare = owned.clone();
    bare.metadata.owner_references = None;
    assert!(disruption_blocker(&[&bare]).is_some_and(|w| w.contains("no controller")));
    let mut daemon = owned.clone();
    daemon.metadata.owner_references = Some(vec![serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "2", "controller": true})).expect("owner")]);
    let mut mirror = owned.clone();
    mirror.metadata.annotations = Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into_iter().collect());
    assert_eq!(evictable(&[&owned, &daemon, &mirror]).len(), 1);
}

#[test]
fn consolidation_waits_while_pods_wait_or_claims_launch() {
    let ready = node("ready", Some("p"), json!([]));
    let registering = node("registering", Some("p"), json!([{"key": labels::UNREGISTERED_TAINT, "effect": "NoSchedule"}]));
    let mut done = claim("ready", "p", &[]);
    done.status = Some(serde_json::from_value(json!({"nodeName": "ready"})).expect("status"));
    let in_flight = claim("in-flight", "p", &[]);
    let other_pool = claim("elsewhere", "q", &[]);
    // Settled: every claim of the pool has a Ready, registered node, and nothing waits.
    assert_eq!(consolidation_hold("p", &[&done, &other_pool], &[&ready], &[]), None);
    // A pod the last batch placed has not landed yet.
    assert!(consolidation_hold("p", &[&done], &[&ready], &["ns/web-1".into()]).is_some_and(|w| w.contains("ns/web-1")));
    // A claim still launching, or its node still registering.
    assert!(consolidation_hold("p", &[&done, &in_flight], &[&ready], &[]).is_some_and(|w| w.contains("in-flight")));
    let mut reg = claim("registering", "p", &[]);
    reg.status = Some(serde_json::from_value(json!({"nodeName": "registering"})).expect("status"));
    assert!(consolidation_hold("p", &[&reg], &[&registering], &[]).is_some());
    // Another pool's launches do not hold this one.
    assert_eq!(consolidation_hold("q", &[&done, &in_flight], &[&ready], &[]), None);
}

#[test]
fn pods_planned_on_a_node_stay_covered_until_it_has_been_up_a_moment() {
    let mut c = claim("n1", "p", &[]);
    c.metadata.annotations = Some([(labels::PLANNED_PODS_ANNOTATION.to_string(), "ns/p".to_string())].into());
    let waiting = pending(json!({}), json!({}));
    let up_since = |ago: i64| {
        let mut n = node("n1", Some("p"), json!([]));
        let at = time::OffsetDateTime::now_utc() - time::Duration::seconds(ago);
        let stamp = at.format(&time::format_description::well_known::Rfc3339).expect("time");
        if let Some(cond) = n.status.as_mut().and_then(|s| s.conditions.as_mut()).and_then(|c| c.first_mut()) {
            cond.last_transition_time = serde_json::from_value(json!(stamp)).ok();
        }
        n
    };
    let covered = |nodes: &[&Node]| crate::adapter::covered(&[&c], nodes, &[&waiting]).len();
    assert_eq!(covered(&[]), 1, "the node is not there yet");
    assert_eq!(covered(&[&node("n1", Some("p"), json!([{"key": labels::UNREGISTERED_TAINT, "effect": "NoSchedule"}]))]), 1, "still registering");
    assert_eq!(covered(&[&up_since(2)]), 1, "up for 2 s: kube-scheduler is still binding its pods");
    assert_eq!(covered(&[&up_since(60)]), 0, "up for a minute: a pod still pending is planned again");
}

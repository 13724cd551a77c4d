//! Cases ported from kube-scheduler's plugin tests (podtopologyspread and interpodaffinity
//! filtering_test.go, noderesources fit_test.go, nodeports, tainttoleration), written in our own
//! form: each test is named after the upstream case it follows.

use serde_json::{json, Value};

use super::*;

fn node(name: &str, labels: Value) -> Node {
    node_with(name, labels, json!({}))
}

fn node_with(name: &str, labels: Value, spec: Value) -> Node {
    let mut l = labels;
    l["kubernetes.io/hostname"] = json!(name);
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": l},
        "spec": spec,
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "20Gi"}}
    }))
    .expect("node")
}

fn pod(name: &str, labels: Value, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
    }
    json!({"metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": spec})
}

fn on(mut p: Value, node: &str) -> Value {
    p["spec"]["nodeName"] = json!(node);
    p
}

fn in_ns(mut p: Value, ns: &str) -> Value {
    p["metadata"]["namespace"] = json!(ns);
    p
}

fn pods(v: Vec<Value>) -> Vec<Pod> {
    v.into_iter().map(|p| serde_json::from_value(p).expect("pod")).collect()
}

fn info(p: Value) -> PodInfo {
    PodInfo::from_pod(&serde_json::from_value(p).expect("pod"))
}

fn spread(key: &str, max_skew: i32, extra: Value) -> Value {
    let mut c = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}});
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            c[k] = v.clone();
        }
    }
    json!({"topologySpreadConstraints": [c]})
}

/// Names of the nodes the pod fits, in snapshot order.
fn fits(s: &Snapshot, p: &PodInfo) -> Vec<String> {
    s.feasible(p).into_iter().filter_map(Result::ok).map(|i| s.nodes[i].name.clone()).collect()
}

fn zones4() -> Vec<Node> {
    vec![
        node("node-a", json!({"zone": "zone1"})),
        node("node-b", json!({"zone": "zone1"})),
        node("node-x", json!({"zone": "zone2"})),
        node("node-y", json!({"zone": "zone2"})),
    ]
}

fn foo(name: &str, at: &str) -> Value {
    on(pod(name, json!({"foo": ""}), json!({})), at)
}

// ---- PodTopologySpread ----

#[test]
fn spread_no_existing_pods() {
    let s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({}))));
    assert_eq!(fits(&s, &p), ["node-a", "node-b", "node-x", "node-y"]);
}

#[test]
fn spread_no_existing_pods_incoming_pod_doesnt_match_itself() {
    let s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({"bar": ""}), spread("zone", 1, json!({}))));
    assert_eq!(fits(&s, &p).len(), 4);
}

#[test]
fn spread_existing_pods_in_a_different_namespace_do_not_count() {
    let s = Snapshot::new(&zones4(), &pods(vec![in_ns(foo("a1", "node-a"), "ns1"), in_ns(foo("b1", "node-b"), "ns1"), foo("x1", "node-x"), foo("y1", "node-y")]), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({}))));
    assert_eq!(fits(&s, &p), ["node-a", "node-b"]);
}

#[test]
fn spread_pods_spread_across_zones_as_3_3_all_nodes_fit() {
    let existing = pods(vec![foo("a1", "node-a"), foo("a2", "node-a"), foo("b1", "node-b"), foo("x1", "node-x"), foo("y1", "node-y"), foo("y2", "node-y")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({}))));
    assert_eq!(fits(&s, &p).len(), 4);
}

#[test]
fn spread_pods_spread_across_zones_as_1_2_due_to_absence_of_label_zone_on_node_b() {
    let nodes = vec![node("node-a", json!({"zone": "zone1"})), node("node-b", json!({"zon": "zone1"})), node("node-x", json!({"zone": "zone2"})), node("node-y", json!({"zone": "zone2"}))];
    let s = Snapshot::new(&nodes, &pods(vec![foo("a1", "node-a"), foo("b1", "node-b"), foo("x1", "node-x"), foo("y1", "node-y")]), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({}))));
    let r = s.feasible(&p);
    assert!(r[0].is_ok());
    assert_eq!(r[1], Err((1, Unfit::SpreadLabelMissing("zone".into()))));
    assert!(matches!(r[2], Err((2, Unfit::Spread { skew: 2, .. }))), "{:?}", r[2]);
}

#[test]
fn spread_pod_cannot_be_scheduled_as_all_nodes_dont_have_label_rack() {
    let s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("rack", 1, json!({}))));
    assert!(fits(&s, &p).is_empty());
    assert!(s.feasible(&p).iter().all(|r| matches!(r, Err((_, Unfit::SpreadLabelMissing(k))) if k == "rack")));
}

fn spread_2_1_0_3() -> Vec<Pod> {
    pods(vec![foo("a1", "node-a"), foo("a2", "node-a"), foo("b1", "node-b"), foo("y1", "node-y"), foo("y2", "node-y"), foo("y3", "node-y")])
}

#[test]
fn spread_pods_spread_across_nodes_as_2_1_0_3_only_node_x_fits() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({}))));
    assert_eq!(fits(&s, &p), ["node-x"]);
}

#[test]
fn spread_pods_spread_across_nodes_as_2_1_0_3_maxskew_is_2_node_b_and_node_x_fit() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 2, json!({}))));
    assert_eq!(fits(&s, &p), ["node-b", "node-x"]);
}

#[test]
fn spread_pods_spread_across_nodes_as_2_1_0_3_but_pod_doesnt_match_itself() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let p = info(pod("p", json!({"bar": ""}), spread("kubernetes.io/hostname", 1, json!({}))));
    assert_eq!(fits(&s, &p), ["node-b", "node-x"]);
}

#[test]
fn spread_incoming_pod_has_node_affinity_pods_spread_as_2_1_0_3_hence_node_a_fits() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let mut spec = spread("kubernetes.io/hostname", 1, json!({}));
    spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-b", "node-x"]}]}]}}});
    let p = info(pod("p", json!({"foo": ""}), spec));
    assert_eq!(fits(&s, &p), ["node-a"], "node-b and node-x are not eligible domains, so the minimum is node-a's 2");
}

#[test]
fn spread_node_affinity_policy_ignore_counts_excluded_nodes() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let mut spec = spread("kubernetes.io/hostname", 1, json!({"nodeAffinityPolicy": "Ignore"}));
    spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-b", "node-x"]}]}]}}});
    let p = info(pod("p", json!({"foo": ""}), spec));
    assert!(fits(&s, &p).is_empty(), "node-x's 0 is the minimum; node-a and node-y are too full");
}

#[test]
fn spread_node_taints_policy_honor_drops_tainted_domains() {
    let nodes = vec![
        node_with("node-a", json!({"zone": "zone1"}), json!({"taints": [{"key": "foo", "value": "bar", "effect": "NoSchedule"}]})),
        node("node-b", json!({"zone": "zone1"})),
        node("node-x", json!({"zone": "zone2"})),
    ];
    let existing = pods(vec![foo("b1", "node-b"), foo("x1", "node-x")]);
    let s = Snapshot::new(&nodes, &existing, &[]);
    let ignore = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({}))));
    assert!(fits(&s, &ignore).is_empty(), "Ignore: tainted node-a's 0 is the minimum");
    let honor = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({"nodeTaintsPolicy": "Honor"}))));
    assert_eq!(fits(&s, &honor), ["node-b", "node-x"]);
}

#[test]
fn spread_terminating_pods_should_be_excluded() {
    let mut terminating = foo("a1", "node-a");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-23T00:00:00Z");
    let s = Snapshot::new(&zones4()[..2], &pods(vec![terminating, foo("b1", "node-b")]), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({}))));
    assert_eq!(fits(&s, &p), ["node-a"]);
}

#[test]
fn spread_pods_spread_across_zones_as_2_1_but_min_domains_is_3_so_global_minimum_is_0() {
    let existing = pods(vec![foo("a1", "node-a"), foo("b1", "node-b"), foo("x1", "node-x")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let without = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({}))));
    assert_eq!(fits(&s, &without), ["node-x", "node-y"]);
    let with = info(pod("p", json!({"foo": ""}), spread("zone", 1, json!({"minDomains": 3}))));
    assert!(fits(&s, &with).is_empty(), "two domains of three wanted: the minimum counts 0");
}

#[test]
fn spread_match_label_keys_narrow_the_selector_to_the_pods_revision() {
    let rev = |name: &str, at: &str, hash: &str| on(pod(name, json!({"foo": "", "pod-template-hash": hash}), json!({})), at);
    let existing = pods(vec![rev("a1", "node-a", "old"), rev("a2", "node-a", "old"), rev("b1", "node-b", "new")]);
    let s = Snapshot::new(&zones4()[..2], &existing, &[]);
    let p = info(pod("p", json!({"foo": "", "pod-template-hash": "new"}), spread("kubernetes.io/hostname", 1, json!({"matchLabelKeys": ["pod-template-hash"]}))));
    assert_eq!(fits(&s, &p), ["node-a"], "only the new revision counts: a has 0, b has 1");
}

#[test]
fn spread_schedule_anyway_constraints_do_not_filter() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({"whenUnsatisfiable": "ScheduleAnyway"}))));
    assert_eq!(fits(&s, &p).len(), 4);
}

#[test]
fn spread_empty_selector_counts_no_pods() {
    let s = Snapshot::new(&zones4(), &spread_2_1_0_3(), &[]);
    let p = info(pod("p", json!({"foo": ""}), json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}]})));
    assert_eq!(fits(&s, &p).len(), 4, "every domain counts 0; the pod itself adds 1: skew 1");
}

#[test]
fn spread_placed_pods_count_for_the_next_ones() {
    let mut s = Snapshot::new(&zones4()[..2], &[], &[]);
    let p = info(pod("p", json!({"foo": ""}), spread("kubernetes.io/hostname", 1, json!({}))));
    let first = s.first_fit(&p).expect("fits");
    s.bind(p.clone(), first);
    assert_eq!(fits(&s, &p), ["node-b"], "the second replica must go to the other node");
}

// ---- InterPodAffinity ----

fn affinity(kind: &str, key: &str, selector: Value, extra: Value) -> Value {
    let mut term = json!({"labelSelector": selector, "topologyKey": key});
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            term[k] = v.clone();
        }
    }
    json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}})
}

fn sel(key: &str, values: &[&str]) -> Value {
    json!({"matchExpressions": [{"key": key, "operator": "In", "values": values}]})
}

#[test]
fn affinity_a_pod_that_has_no_required_pod_affinity_can_schedule_onto_a_node_with_no_existing_pods() {
    let s = Snapshot::new(&zones4()[..1], &[], &[]);
    assert_eq!(fits(&s, &info(pod("p", json!({}), json!({})))), ["node-a"]);
}

#[test]
fn affinity_satisfies_pod_affinity_using_in_operator_that_matches_the_existing_pod() {
    let existing = pods(vec![on(pod("e", json!({"service": "securityscan"}), json!({})), "node-a")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("service", &["securityscan", "value2"]), json!({}))));
    assert_eq!(fits(&s, &p), ["node-a", "node-b"], "any node of the zone where the matching pod runs");
}

#[test]
fn affinity_doesnt_satisfy_pod_affinity_because_of_unmatching_label_selector() {
    let existing = pods(vec![on(pod("e", json!({"service": "securityscan"}), json!({})), "node-a")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("service", &["antivirusscan"]), json!({}))));
    assert!(fits(&s, &p).is_empty());
    assert!(s.feasible(&p).iter().all(|r| matches!(r, Err((_, Unfit::Affinity)))));
}

#[test]
fn affinity_the_first_pod_with_affinity_to_itself_is_schedulable() {
    let s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({"app": "db"}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert_eq!(fits(&s, &p).len(), 4, "no pod matches anywhere and the pod matches its own terms");
    let other = info(pod("p", json!({"app": "web"}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert!(fits(&s, &other).is_empty(), "affinity to a pod that does not exist (and is not itself) never fits");
}

#[test]
fn affinity_self_affinity_exception_ends_once_a_matching_pod_runs() {
    let existing = pods(vec![on(pod("e", json!({"app": "db"}), json!({})), "node-x")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({"app": "db"}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert_eq!(fits(&s, &p), ["node-x", "node-y"]);
}

#[test]
fn affinity_node_without_the_topology_key_fails_affinity() {
    let nodes = vec![node("node-a", json!({"zone": "zone1"})), node("node-b", json!({}))];
    let existing = pods(vec![on(pod("e", json!({"app": "db"}), json!({})), "node-a")]);
    let s = Snapshot::new(&nodes, &existing, &[]);
    let p = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert_eq!(fits(&s, &p), ["node-a"]);
}

#[test]
fn anti_affinity_nodes_in_the_same_zone_as_a_matching_pod_cannot_take_the_pod() {
    let existing = pods(vec![on(pod("e", json!({"service": "securityscan"}), json!({})), "node-a")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({}), affinity("podAntiAffinity", "zone", sel("service", &["securityscan"]), json!({}))));
    assert_eq!(fits(&s, &p), ["node-x", "node-y"]);
}

#[test]
fn anti_affinity_nodes_without_the_topology_key_are_fine() {
    let nodes = vec![node("node-a", json!({"zone": "zone1"})), node("node-b", json!({}))];
    let existing = pods(vec![on(pod("e", json!({"app": "db"}), json!({})), "node-b")]);
    let s = Snapshot::new(&nodes, &existing, &[]);
    let p = info(pod("p", json!({}), affinity("podAntiAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert_eq!(fits(&s, &p), ["node-a", "node-b"]);
}

#[test]
fn anti_affinity_of_an_existing_pod_is_respected_when_symmetry_is_checked() {
    let existing = pods(vec![on(pod("e", json!({"app": "db"}), affinity("podAntiAffinity", "kubernetes.io/hostname", sel("team", &["noisy"]), json!({}))), "node-a")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    let p = info(pod("p", json!({"team": "noisy"}), json!({})));
    let r = s.feasible(&p);
    assert_eq!(r[0], Err((0, Unfit::ExistingAntiAffinity)));
    assert_eq!(fits(&s, &p), ["node-b", "node-x", "node-y"]);
}

#[test]
fn affinity_terms_in_another_namespace_do_not_match_unless_named() {
    let existing = pods(vec![in_ns(on(pod("e", json!({"app": "db"}), json!({})), "node-x"), "data")]);
    let namespaces: Vec<Namespace> = vec![serde_json::from_value(json!({"metadata": {"name": "data", "labels": {"tier": "storage"}}})).expect("ns")];
    let s = Snapshot::new(&zones4(), &existing, &namespaces);
    let own = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({}))));
    assert!(fits(&s, &own).is_empty(), "the term looks in the pod's own namespace only");
    let named = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({"namespaces": ["data"]}))));
    assert_eq!(fits(&s, &named), ["node-x", "node-y"]);
    let by_selector = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({"namespaceSelector": {"matchLabels": {"tier": "storage"}}}))));
    assert_eq!(fits(&s, &by_selector), ["node-x", "node-y"]);
    let all = info(pod("p", json!({}), affinity("podAffinity", "zone", sel("app", &["db"]), json!({"namespaceSelector": {}}))));
    assert_eq!(fits(&s, &all), ["node-x", "node-y"], "an empty namespaceSelector selects every namespace");
}

#[test]
fn anti_affinity_to_own_replicas_spreads_them_one_per_node_as_they_are_placed() {
    let mut s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({"app": "web"}), affinity("podAntiAffinity", "kubernetes.io/hostname", sel("app", &["web"]), json!({}))));
    for _ in 0..4 {
        let i = s.first_fit(&p).expect("a node is free");
        s.bind(p.clone(), i);
    }
    assert!(s.first_fit(&p).is_err(), "a fifth replica has no node left");
    assert!(s.nodes.iter().all(|n| n.pods.len() == 1));
}

// ---- InterPodAffinity scoring: running pods' own terms (scoring_test.go's symmetry cases) ----

fn preferred(kind: &str, weight: i32, key: &str, selector: Value) -> Value {
    json!({"affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight, "podAffinityTerm": {"labelSelector": selector, "topologyKey": key}}]}}})
}

/// Each node's score for `p` from running pods' terms ([`Snapshot::affinity_scores`]).
fn scores(s: &Snapshot, p: &PodInfo) -> Vec<i64> {
    let toward = s.affinity_scores(p);
    s.nodes.iter().map(|n| toward.iter().filter(|((k, v), _)| n.labels.get(k) == Some(v)).map(|(_, w)| w).sum()).collect()
}

fn regions() -> Vec<Node> {
    vec![node("node1", json!({"region": "China"})), node("node2", json!({"region": "India"})), node("node3", json!({"az": "az1"}))]
}

#[test]
fn affinity_symmetry_considered_only_the_preferred_during_scheduling_in_pod_affinity_symmetry() {
    let existing = pods(vec![
        on(pod("e1", json!({"security": "S1"}), preferred("podAffinity", 5, "region", sel("security", &["S1"]))), "node1"),
        on(pod("e2", json!({"security": "S2"}), preferred("podAffinity", 5, "region", sel("security", &["S2"]))), "node2"),
    ]);
    let s = Snapshot::new(&regions(), &existing, &[]);
    assert_eq!(scores(&s, &info(pod("p", json!({"security": "S2"}), json!({})))), [0, 5, 0]);
}

#[test]
fn affinity_symmetry_considered_required_during_scheduling_in_pod_affinity_symmetry() {
    // A running pod's required affinity that selects the incoming pod counts as weight 1.
    let hard = affinity("podAffinity", "region", sel("security", &["S1", "value2"]), json!({}));
    let existing = pods(vec![on(pod("e1", json!({"security": "S1"}), hard.clone()), "node1"), on(pod("e2", json!({"security": "S2"}), hard), "node2")]);
    let s = Snapshot::new(&regions(), &existing, &[]);
    assert_eq!(scores(&s, &info(pod("p", json!({"security": "S1"}), json!({})))), [1, 1, 0]);
}

#[test]
fn affinity_symmetry_with_namespace_selector() {
    let namespaces: Vec<Namespace> = vec![serde_json::from_value(json!({"metadata": {"name": "subteam1.team1", "labels": {"team": "team1"}}})).expect("ns")];
    let mut term = preferred("podAffinity", 5, "region", sel("security", &["S1"]));
    term["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["namespaceSelector"] = json!({"matchLabels": {"team": "team1"}});
    let existing = pods(vec![on(pod("e1", json!({"security": "S1"}), term), "node1"), on(pod("e2", json!({"security": "S2"}), preferred("podAffinity", 5, "region", sel("security", &["S2"]))), "node2")]);
    let s = Snapshot::new(&regions(), &existing, &namespaces);
    assert_eq!(scores(&s, &info(in_ns(pod("p", json!({"security": "S1"}), json!({})), "subteam1.team1"))), [5, 0, 0]);
    // Its own namespace's default does not reach another namespace.
    let plain = pods(vec![on(pod("e1", json!({"security": "S1"}), preferred("podAffinity", 5, "region", sel("security", &["S1"]))), "node1")]);
    let s = Snapshot::new(&regions(), &plain, &namespaces);
    assert_eq!(scores(&s, &info(in_ns(pod("p", json!({"security": "S1"}), json!({})), "subteam1.team1"))), [0, 0, 0]);
}

#[test]
fn anti_affinity_symmetry_the_existing_pods_in_node_which_has_anti_affinity_match_will_get_high_score() {
    // Upstream's scores, normalized: node1 0, node2 the maximum. Raw: node1 loses the weight.
    let nodes = vec![node("node1", json!({"az": "az1"})), node("node2", json!({"az": "az2"}))];
    let existing = pods(vec![
        on(pod("e1", json!({"security": "S1"}), preferred("podAntiAffinity", 5, "az", sel("security", &["S2"]))), "node1"),
        on(pod("e2", json!({"security": "S2"}), preferred("podAntiAffinity", 5, "az", sel("security", &["S1"]))), "node2"),
    ]);
    let s = Snapshot::new(&nodes, &existing, &[]);
    assert_eq!(scores(&s, &info(pod("p", json!({"security": "S2"}), json!({})))), [-5, 0]);
}

#[test]
fn avoid_panic_when_partial_nodes_in_a_topology_dont_have_pods_with_affinity() {
    // Both nodes share the region a running pod's preference points at: they score alike.
    let both = vec![node("node1", json!({"region": "China"})), node("node2", json!({"region": "China"}))];
    let mut terms = preferred("podAffinity", 5, "region", sel("security", &["S1"]));
    terms["affinity"]["podAntiAffinity"] = preferred("podAntiAffinity", 5, "az", sel("security", &["S2"]))["affinity"]["podAntiAffinity"].clone();
    let existing = pods(vec![on(pod("e1", json!({"security": "S1"}), json!({})), "node1"), on(pod("e2", json!({}), terms), "node2")]);
    let s = Snapshot::new(&both, &existing, &[]);
    let [a, b] = scores(&s, &info(pod("p", json!({"security": "S1"}), json!({}))))[..] else { panic!("two nodes") };
    assert_eq!((a, b), (5, 5));
}

#[test]
fn scores_follow_the_pods_placed_since_the_last_look() {
    let mut s = Snapshot::new(&regions(), &[], &[]);
    let web = info(pod("p", json!({"security": "S1"}), json!({})));
    assert_eq!(scores(&s, &web), [0, 0, 0]);
    s.bind(info(pod("e1", json!({}), preferred("podAffinity", 5, "region", sel("security", &["S1"])))), 1);
    assert_eq!(scores(&s, &web), [0, 5, 0]);
    s.bind(info(pod("e2", json!({}), preferred("podAntiAffinity", 3, "region", sel("security", &["S1"])))), 1);
    s.bind(info(pod("e3", json!({}), preferred("podAffinity", 2, "region", sel("security", &["S1"])))), 0);
    assert_eq!(scores(&s, &web), [2, 2, 0]);
    // Another kind of pod is scored on its own.
    assert_eq!(scores(&s, &info(pod("q", json!({"security": "S2"}), json!({})))), [0, 0, 0]);
}

#[test]
fn a_terminating_pods_terms_and_pods_without_terms_score_nothing() {
    let mut leaving = on(pod("e1", json!({}), preferred("podAffinity", 5, "region", sel("security", &["S1"]))), "node1");
    leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let s = Snapshot::new(&regions(), &pods(vec![leaving, on(pod("e2", json!({"security": "S1"}), json!({})), "node2")]), &[]);
    assert!(s.affinity_scores(&info(pod("p", json!({"security": "S1"}), json!({})))).is_empty());
}

// ---- NodeResourcesFit, NodePorts, TaintToleration, NodeUnschedulable, NodeAffinity ----

#[test]
fn fit_extended_resources_ephemeral_storage_and_pod_count() {
    let mut gpu_node = node("gpu", json!({}));
    gpu_node.status.as_mut().and_then(|s| s.allocatable.as_mut()).expect("alloc").insert("nvidia.com/gpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()));
    let s = Snapshot::new(&[node("plain", json!({})), gpu_node], &[], &[]);
    let wants_gpu = info(pod("p", json!({}), json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]})));
    let r = s.feasible(&wants_gpu);
    assert_eq!(r[0], Err((0, Unfit::Insufficient("nvidia.com/gpu".into()))));
    assert!(r[1].is_ok());
    let disk = info(pod("p", json!({}), json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"ephemeral-storage": "30Gi"}}}]})));
    assert!(fits(&s, &disk).is_empty());
    // Max pods: 110 pods that request nothing fill a node.
    let mut full = Snapshot::new(&[node("n", json!({}))], &[], &[]);
    let nothing = info(pod("p", json!({}), json!({})));
    for _ in 0..110 {
        let i = full.first_fit(&nothing).expect("a pod slot");
        full.bind(nothing.clone(), i);
    }
    assert_eq!(full.feasible(&nothing)[0], Err((0, Unfit::TooManyPods)));
}

#[test]
fn fit_requests_add_up_across_bound_pods() {
    let existing = pods(vec![on(pod("e", json!({}), json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]})), "n")]);
    let s = Snapshot::new(&[node("n", json!({}))], &existing, &[]);
    let big = info(pod("p", json!({}), json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1500m"}}}]})));
    assert_eq!(s.feasible(&big)[0], Err((0, Unfit::Insufficient("cpu".into()))));
    let small = info(pod("p", json!({}), json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]})));
    assert!(s.feasible(&small)[0].is_ok());
}

#[test]
fn node_ports_conflict_on_the_same_port_protocol_and_address() {
    let port = |ip: &str, proto: &str, port: i32| json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip, "protocol": proto}]}]});
    let existing = pods(vec![on(pod("e", json!({}), port("127.0.0.1", "TCP", 8080)), "n")]);
    let s = Snapshot::new(&[node("n", json!({}))], &existing, &[]);
    assert_eq!(s.feasible(&info(pod("p", json!({}), port("0.0.0.0", "TCP", 8080))))[0], Err((0, Unfit::Ports)), "0.0.0.0 overlaps every address");
    assert!(s.feasible(&info(pod("p", json!({}), port("127.0.0.2", "TCP", 8080))))[0].is_ok());
    assert!(s.feasible(&info(pod("p", json!({}), port("127.0.0.1", "UDP", 8080))))[0].is_ok());
    assert!(s.feasible(&info(pod("p", json!({}), port("", "TCP", 8081))))[0].is_ok());
}

#[test]
fn taints_need_tolerations_and_unschedulable_nodes_refuse_pods() {
    let tainted = node_with("t", json!({}), json!({"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": "soft", "effect": "PreferNoSchedule"}]}));
    let cordoned = node_with("c", json!({}), json!({"unschedulable": true}));
    let s = Snapshot::new(&[tainted, cordoned], &[], &[]);
    let plain = info(pod("p", json!({}), json!({})));
    assert_eq!(s.feasible(&plain), vec![Err((0, Unfit::Taint("dedicated: gpu".into()))), Err((1, Unfit::Unschedulable))]);
    let tolerant = info(pod("p", json!({}), json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}, {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]})));
    assert_eq!(fits(&s, &tolerant), ["t", "c"], "PreferNoSchedule never filters");
}

#[test]
fn node_affinity_is_the_node_selector_and_one_required_term() {
    let s = Snapshot::new(&zones4(), &[], &[]);
    let p = info(pod("p", json!({}), json!({"nodeSelector": {"zone": "zone1"}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b", "node-x"]}]}]}}}})));
    assert_eq!(fits(&s, &p), ["node-b"]);
    let named = info(pod("p", json!({}), json!({"nodeName": "node-y"})));
    assert_eq!(fits(&s, &named), ["node-y"]);
}

#[test]
fn the_snapshot_ignores_pods_not_bound_to_a_known_node() {
    let existing = pods(vec![foo("a1", "node-a"), pod("pending", json!({"foo": ""}), json!({})), foo("gone", "node-z")]);
    let s = Snapshot::new(&zones4(), &existing, &[]);
    assert_eq!(s.pods.len(), 1);
    assert_eq!(s.nodes[0].pods, vec![0]);
}

// ---- VolumeBinding / VolumeZone ----

#[test]
fn volume_a_pod_whose_claim_is_bound_to_a_zonal_volume_stays_in_that_zone() {
    let claim = |name: &str, volume: Option<&str>| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"volumeName": volume}})).expect("pvc")
    };
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["zone2"]}]}]}}}})).expect("pv");
    let claims = [claim("data", Some("pv-1")), claim("later", None)];
    let volumes = Volumes::new(&claims.iter().collect::<Vec<_>>(), &[&pv]);
    let s = Snapshot::new(&zones4(), &[], &[]);
    let with_claim = |c: &str| {
        let p: Pod = serde_json::from_value(pod("p", json!({}), json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": c}}]}))).expect("pod");
        PodInfo::from_pod(&p).with_volumes(&p, &volumes)
    };
    let bound = with_claim("data");
    assert_eq!(fits(&s, &bound), ["node-x", "node-y"]);
    assert_eq!(s.feasible(&bound)[0], Err((0, Unfit::VolumeNodeAffinity)));
    assert_eq!(fits(&s, &with_claim("later")).len(), 4, "a WaitForFirstConsumer claim not bound yet does not constrain");
}

// ---- The memo (incremental state) against the state computed afresh ----

/// Pods of several kinds (zone and hostname spread, affinity, anti-affinity, symmetric
/// anti-affinity, no terms) bound one by one onto nodes added along the way: after every step
/// each kind's verdicts from the memo equal those computed from scratch.
#[test]
fn memo_matches_fresh_state_through_binds_and_new_nodes() {
    let kinds = [
        pod("spread", json!({"foo": "a"}), spread("zone", 1, json!({}))),
        pod("hosts", json!({"foo": "b"}), spread("kubernetes.io/hostname", 2, json!({"minDomains": 3}))),
        pod("anti", json!({"app": "db"}), json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}]}}})),
        pod("near", json!({"app": "web"}), json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"foo": "a"}}, "topologyKey": "zone"}]}}})),
        pod("plain", json!({"foo": "c"}), json!({})),
        in_ns(pod("other-ns", json!({"foo": "a"}), spread("zone", 1, json!({}))), "team"),
    ];
    let infos: Vec<PodInfo> = kinds.iter().cloned().map(info).collect();
    let mut s = Snapshot::new(&[node("n0", json!({"zone": "z1"}))], &[], &[]);
    let mut seed = 7u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for step in 0..120 {
        if step % 9 == 0 {
            let zone = format!("z{}", next() % 4);
            let n = node(&format!("n{}", s.nodes.len()), json!({"zone": zone}));
            s.nodes.push(NodeInfo::from_node(&n));
        }
        for p in &infos {
            assert_eq!(s.feasible(p), s.feasible_fresh(p), "kind {} at step {step}", p.name);
        }
        let p = &infos[(next() % infos.len() as u64) as usize];
        let fits: Vec<usize> = s.feasible(p).into_iter().filter_map(Result::ok).collect();
        let i = if fits.is_empty() { (next() % s.nodes.len() as u64) as usize } else { fits[(next() % fits.len() as u64) as usize] };
        s.bind(PodInfo { name: format!("{}-{step}", p.name), ..p.clone() }, i);
    }
}

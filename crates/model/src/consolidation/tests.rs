//! The pure disruption decisions: what consolidation takes, what it refuses, and re-validation.

use super::*;
use archer_core::packer::Offering;
use archer_core::requirements::Requirements;
use serde_json::json;

fn node(name: &str, cpu: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "topology.kubernetes.io/zone": "us-east-1a", "archer.dev/nodepool": "default"}},
        "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node")
}

fn pod(name: &str, on: &str, cpu: &str, spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!(on);
    spec["containers"] = json!([{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]);
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]},
        "spec": spec, "status": {"phase": "Running"}
    }))
    .expect("pod")
}

/// A pool that may buy any on-demand type of the embedded catalog in one zone (or, with
/// `max_nodes` 0, nothing).
fn pool(max_nodes: Option<i64>) -> Pool {
    Pool { name: "default".into(), weight: 0, requirements: Requirements::new(), labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: max_nodes, daemons: Vec::new(), closed: None, variant: Default::default() }
}

fn offerings() -> Vec<Offering> {
    Offering::embedded_on_demand()
}

/// Every test pod runs image `x`, known to be amd64 only.
fn amd64(mut state: ClusterState) -> ClusterState {
    use archer_core::platform::PlatformSet;
    state.platforms.insert("x".into(), PlatformSet::parse_annotation("linux/amd64").expect("platform"));
    state
}

/// Decide on `nodes` and `pods` (every node a candidate at `price` per hour).
fn with_world<R>(nodes: &[Node], pods: &[Pod], pools: &[Pool], f: impl FnOnce(&World<'_>, &[&Candidate<'_>]) -> R) -> R {
    let state = state_of(nodes, pods);
    let volumes = Volumes::default();
    let world = World { state: &state, pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
    let candidates: Vec<Candidate> = nodes
        .iter()
        .map(|n| Candidate { node: n, pods: pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == n.metadata.name.as_deref()).collect(), price: 0.20 })
        .collect();
    let refs: Vec<&Candidate> = candidates.iter().collect();
    f(&world, &refs)
}

const MARGIN: f64 = 0.02;

/// Required anti-affinity between p1 and p2 on the hostname key: they never share a node.
fn apart() -> serde_json::Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["p1", "p2"]}]}, "topologyKey": "kubernetes.io/hostname"}]}}})
}

/// The underutilised decision on `nodes` and `pods`, every candidate searched.
fn consolidate(nodes: &[Node], pods: &[Pod], pools: &[Pool], budget: usize, margin: f64) -> Option<Decision> {
    with_world(nodes, pods, pools, |w, c| underutilized(w, "default", c, budget, Search::exhaustive(margin)))
}

#[test]
fn two_half_used_nodes_become_one_without_buying_anything() {
    let nodes = [node("a", "4"), node("b", "4")];
    let pods = [pod("p1", "a", "1", json!({})), pod("p2", "b", "1", json!({}))];
    let d = consolidate(&nodes, &pods, &[pool(Some(0))], 1, MARGIN).expect("a decision");
    assert_eq!(d.nodes.len(), 1);
    assert!(d.replacements.is_empty());
    assert_eq!(d.moves.len(), 1, "the moving pod goes to the node that stays: {:?}", d.moves);
    assert!((d.saving_per_hour - 0.20).abs() < 1e-9);
}

#[test]
fn a_decision_whose_evicted_pods_have_no_place_is_never_taken() {
    // Each pod refuses to share a node with the other, and the pool may buy nothing.
    let anti = apart();
    let nodes = [node("a", "4"), node("b", "4")];
    let pods = [pod("p1", "a", "1", anti.clone()), pod("p2", "b", "1", anti)];
    assert_eq!(consolidate(&nodes, &pods, &[pool(Some(0))], 2, MARGIN), None);
    // Too big for what remains: no decision either.
    let pods = [pod("p1", "a", "3", json!({})), pod("p2", "b", "3", json!({}))];
    assert_eq!(consolidate(&nodes, &pods, &[pool(Some(0))], 2, MARGIN), None);
}

#[test]
fn a_replacement_must_save_more_than_the_margin() {
    // One small pod on a node priced $0.20/h: a cheaper node saves most of it.
    let nodes = [node("a", "4")];
    let pods = [pod("p1", "a", "100m", json!({}))];
    let d = consolidate(&nodes, &pods, &[pool(None)], 1, MARGIN).expect("a cheaper node");
    assert_eq!(d.replacements.len(), 1);
    assert!(d.replacements[0].price_per_hour < 0.20 * (1.0 - MARGIN));
    // With a margin no replacement can beat, nothing is decided.
    assert_eq!(consolidate(&nodes, &pods, &[pool(None)], 1, 0.99), None);
}

#[test]
fn a_set_is_replaced_by_at_most_one_node() {
    // Two pods that refuse to share a node, alone on one node: moving them needs two new nodes.
    let anti = apart();
    let nodes = [node("a", "4"), node("b", "4")];
    let pods = [pod("p1", "a", "100m", anti.clone()), pod("p2", "b", "100m", anti)];
    let d = consolidate(&nodes, &pods, &[pool(None)], 2, MARGIN).expect("one node at a time");
    assert_eq!((d.nodes.len(), d.replacements.len()), (1, 1), "{d:?}");
    let two = with_world(&nodes, &pods, &[pool(None)], |w, c| decide(w, "default", c, "underutilized", MARGIN, None, None));
    assert_eq!(two, Err("would need 2 replacements; at most one replaces a set".to_string()));
}

#[test]
fn the_search_evaluates_a_bounded_number_of_sets_and_moves_on() {
    // Only b's pod can move: a's and c's are pinned to their nodes.
    let pinned = |n: &str| json!({"nodeSelector": {"kubernetes.io/hostname": n}});
    let nodes = [node("a", "4"), node("b", "4"), node("c", "4")];
    let pods = [pod("p1", "a", "1", pinned("a")), pod("p2", "b", "1", json!({})), pod("p3", "c", "1", pinned("c"))];
    let one = |start| Search { min_saving_fraction: MARGIN, max_evaluations: 1, start, balance: None };
    let found: Vec<Option<Vec<String>>> = (0..3).map(|start| with_world(&nodes, &pods, &[pool(Some(0))], |w, c| underutilized(w, "default", c, 1, one(start))).map(|d| d.nodes)).collect();
    // Exactly one of three starting points evaluates b (the only set that works).
    assert_eq!(found.iter().filter(|f| f.is_some()).count(), 1, "{found:?}");
    assert!(found.contains(&Some(vec!["b".to_string()])));
}

#[test]
fn revalidation_keeps_a_decision_nothing_changed_and_drops_a_stale_one() {
    let nodes = [node("a", "4"), node("b", "4")];
    let pods = [pod("p1", "a", "1", json!({})), pod("p2", "b", "1", json!({}))];
    let pools = [pool(Some(0))];
    let (decision, before) = with_world(&nodes, &pods, &pools, |w, c| {
        let d = underutilized(w, "default", c, 1, Search::exhaustive(MARGIN)).expect("a decision");
        let chosen: Vec<&Candidate> = c.iter().copied().filter(|x| d.nodes.iter().any(|n| n == x.name())).collect();
        (d.clone(), signature(&chosen))
    });
    let going = decision.nodes[0].clone();
    let staying = if going == "a" { "b" } else { "a" };
    // Nothing changed: the same decision.
    let again = with_world(&nodes, &pods, &pools, |w, c| revalidate(w, &decision, &before, c, MARGIN)).expect("still valid");
    assert_eq!(again.nodes, decision.nodes);
    // A pod landed on the node meanwhile.
    let mut more = pods.to_vec();
    more.push(pod("p9", &going, "100m", json!({})));
    let stale = with_world(&nodes, &more, &pools, |w, c| revalidate(w, &decision, &before, c, MARGIN));
    assert_eq!(stale, Err(format!("the pods on node {going} changed")));
    // The room the moving pod was to take is gone.
    let mut full = pods.to_vec();
    full.push(pod("big", staying, "2500m", json!({})));
    let stale = with_world(&nodes, &full, &pools, |w, c| revalidate(w, &decision, &before, c, MARGIN));
    assert_eq!(stale, Err("some pod would have no place".to_string()));
    // The node is no longer a candidate (gone, leaving, or blocked).
    let only = [node(staying, "4")];
    let stale = with_world(&only, &pods, &pools, |w, c| revalidate(w, &decision, &before, c, MARGIN));
    assert_eq!(stale, Err(format!("node {going} is no longer a candidate")));
}

#[test]
fn an_empty_node_stays_removable_only_while_it_stays_empty() {
    let nodes = [node("a", "4")];
    let c = Candidate { node: &nodes[0], pods: Vec::new(), price: 0.20 };
    let d = empty("default", &[&c], 1).expect("empty node");
    let before = signature(&[&c]);
    assert_eq!(with_world(&nodes, &[], &[pool(Some(0))], |w, c| revalidate(w, &d, &before, c, MARGIN)).map(|d| d.reason), Ok("empty"));
    let landed = [pod("p1", "a", "100m", json!({}))];
    assert_eq!(with_world(&nodes, &landed, &[pool(Some(0))], |w, c| revalidate(w, &d, &before, c, MARGIN)), Err("the pods on node a changed".to_string()));
}

#[test]
fn the_largest_set_that_can_go_is_taken_at_once() {
    let names = ["a", "b", "c", "d", "e", "f"];
    let nodes: Vec<Node> = names.iter().map(|n| node(n, "4")).collect();
    let pods: Vec<Pod> = names.iter().map(|n| pod(&format!("p-{n}"), n, "500m", json!({}))).collect();
    // Nothing may be bought: five nodes' pods fit on the sixth.
    let d = consolidate(&nodes, &pods, &[pool(Some(0))], 6, MARGIN).expect("a decision");
    assert_eq!((d.nodes.len(), d.replacements.len()), (5, 0), "{d:?}");
    // Buying is allowed: still at least five go, for at most one new node.
    let d = consolidate(&nodes, &pods, &[pool(None)], 6, MARGIN).expect("a decision");
    assert!(d.nodes.len() >= 5 && d.replacements.len() <= 1, "{d:?}");
    // The budget bounds the set.
    let d = consolidate(&nodes, &pods, &[pool(None)], 3, MARGIN).expect("a decision");
    assert_eq!(d.nodes.len(), 3);
}

fn settings(underutilized: bool, budget: usize) -> DisruptionSettings {
    DisruptionSettings { underutilized, balanced: false, consolidate_after: Some(std::time::Duration::ZERO), expire_after: None, budgets: vec![(objects::BudgetValue::Count(budget), Vec::new())] }
}

fn state_of(nodes: &[Node], pods: &[Pod]) -> ClusterState {
    amd64(ClusterState { nodes: nodes.iter().cloned().map(std::sync::Arc::new).collect(), pods: pods.iter().cloned().map(std::sync::Arc::new).collect(), offerings: std::sync::Arc::new(offerings()), ..Default::default() })
}

#[test]
fn a_pools_nodes_are_counted_by_either_pool_label_and_only_eligible_priced_ones_are_candidates() {
    let mut karpenters = node("k1", "4");
    if let Some(l) = karpenters.metadata.labels.as_mut() {
        l.remove("archer.dev/nodepool");
        l.insert("karpenter.sh/nodepool".into(), "default".into());
    }
    let mut leaving = node("gone", "4");
    leaving.spec = Some(k8s_openapi::api::core::v1::NodeSpec { unschedulable: Some(true), ..Default::default() });
    let mut other = node("other", "4");
    if let Some(l) = other.metadata.labels.as_mut() {
        l.insert("archer.dev/nodepool".into(), "batch".into());
    }
    let nodes = [node("n1", "4"), node("young", "4"), node("unpriced", "4"), karpenters, leaving, other];
    let pods = [pod("a", "n1", "1", json!({})), pod("b", "k1", "1", json!({}))];
    let state = state_of(&nodes, &pods);
    let mut left_out = Vec::new();
    let view = pool_nodes(&state, "default", &|n| n.metadata.name.as_deref() != Some("young"), &|n| (n.metadata.name.as_deref() != Some("unpriced")).then_some(0.1), &mut |n| left_out.push(n.metadata.name.clone().unwrap_or_default()));
    assert_eq!((view.total, view.disrupting), (5, 1), "n1, young, unpriced, k1 and the leaving node are the pool's; 'other' is batch's");
    let names: Vec<&str> = view.candidates.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["n1", "k1"]);
    assert_eq!(left_out, ["unpriced"]);
    assert_eq!(view.get("n1").map(|c| c.pods.len()), Some(1));
    assert_eq!(view.budget(&settings(true, 3), "Empty"), 2, "the budget less the node already leaving");
}

#[test]
fn a_pool_pass_takes_empty_nodes_first_then_underutilised_ones_and_respects_the_predicates() {
    let nodes = [node("n1", "4"), node("n2", "4"), node("idle", "4")];
    let pods = [pod("a", "n1", "1", json!({})), pod("b", "n2", "1", json!({}))];
    let state = state_of(&nodes, &pods);
    let view = pool_nodes(&state, "default", &|_| true, &|_| Some(0.2), &mut |_| {});
    let pools = [pool(None)];
    let volumes = Volumes::default();
    let world = World { state: &state, pools: &pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
    let search = Search::exhaustive(MARGIN);
    let d = consolidate_pool(&world, "default", &settings(true, 10), &view, &|_| true, &|_| true, search).expect("a decision");
    assert_eq!((d.reason, d.nodes.clone()), ("empty", vec!["idle".to_string()]), "the empty node goes first");
    // The empty node's clock has not run long enough: it goes first all the same, once it has;
    // meanwhile no pod is moved (a scale-down that just emptied nodes is not consolidated onto them).
    assert_eq!(consolidate_pool(&world, "default", &settings(true, 10), &view, &|c| c.name() != "idle", &|_| true, search), None);
    // With no empty node, the underutilised pair goes.
    let busy = pool_nodes(&state, "default", &|n| n.metadata.name.as_deref() != Some("idle"), &|_| Some(0.2), &mut |_| {});
    let d = consolidate_pool(&world, "default", &settings(true, 10), &busy, &|_| false, &|_| true, search).expect("a decision");
    assert_eq!(d.reason, "underutilized");
    assert!(!d.nodes.contains(&"idle".to_string()));
    // WhenEmpty pools, unsettled nodes and a pool that does not consolidate decide nothing.
    assert_eq!(consolidate_pool(&world, "default", &settings(false, 10), &view, &|c| c.name() != "idle", &|_| true, search), None);
    assert_eq!(consolidate_pool(&world, "default", &settings(true, 10), &view, &|c| c.name() != "idle", &|_| false, search), None);
    let never = DisruptionSettings { consolidate_after: None, ..settings(true, 10) };
    assert_eq!(consolidate_pool(&world, "default", &never, &view, &|_| true, &|_| true, search), None);
    assert_eq!(consolidate_pool(&world, "default", &settings(true, 0), &view, &|_| true, &|_| true, search), None, "no budget");
}

/// Karpenter v1.15's Balanced scoring (its `balanced_scoring_test.go` cases): score =
/// (saving / pool cost) / (disruption / pool disruption), approved at 1/k = 0.5 or more; no saving
/// scores 0; no disruption (or no totals) passes.
#[test]
fn balanced_scores_as_karpenter_does() {
    let b = Balance { total_cost: 10.0, total_disruption: 20.0 };
    assert!((b.score(1.0, 4.0) - 0.5).abs() < 1e-12, "10% saved for 20% disrupted");
    assert!(b.approves(1.0, 4.0), "exactly the threshold passes");
    assert!(!b.approves(1.0, 4.01));
    assert_eq!(b.score(0.0, 4.0), 0.0);
    assert_eq!(b.score(-1.0, 4.0), 0.0);
    assert!(b.score(1.0, 0.0).is_infinite());
    assert!(Balance { total_cost: 0.0, total_disruption: 0.0 }.approves(0.0, 1.0), "nothing to normalise against");
    assert_eq!(BALANCED_K, 2.0);
}

/// Eviction costs as Karpenter counts them: 1 by default, deletion cost / 2^27 and priority / 2^25
/// on top, clamped to [-10, 10]; a deletion cost Archer wrote itself (its scale-down order) is
/// not the owner's and counts for nothing.
#[test]
fn eviction_costs_follow_deletion_cost_and_priority_but_not_archers_own() {
    let with = |annotations: serde_json::Value, priority: Option<i32>| -> Pod {
        let mut p = pod("p", "a", "1", json!({}));
        p.metadata.annotations = serde_json::from_value(annotations).ok();
        p.spec.as_mut().expect("spec").priority = priority;
        p
    };
    assert_eq!(objects::eviction_cost(&with(json!(null), None)), 1.0);
    assert!((objects::eviction_cost(&with(json!({"controller.kubernetes.io/pod-deletion-cost": "134217728"}), None)) - 2.0).abs() < 1e-12);
    assert!((objects::eviction_cost(&with(json!(null), Some(33_554_432))) - 2.0).abs() < 1e-12);
    assert_eq!(objects::eviction_cost(&with(json!({"controller.kubernetes.io/pod-deletion-cost": "2147483647"}), Some(1_000_000_000))), 10.0, "clamped");
    assert_eq!(objects::eviction_cost(&with(json!({"controller.kubernetes.io/pod-deletion-cost": "2147483647", "archer.dev/deletion-cost": "2147483647"}), None)), 1.0, "Archer's own order is not a disruption cost");
    let c_pods = [with(json!(null), None), with(json!({"controller.kubernetes.io/pod-deletion-cost": "-2147483647"}), None)];
    let node_a = node("a", "4");
    let c = Candidate { node: &node_a, pods: c_pods.iter().collect(), price: 1.0 };
    assert!((node_disruption_cost(&c) - 2.0).abs() < 1e-12, "1 for the drain, 1 for the pod, a negative pod cost counts as 0");
}

/// A Balanced pool moves pods only when the saving is worth the disruption: a node with many pods
/// is left where WhenEmptyOrUnderutilized would consolidate it for the same saving; a cheap move
/// of one pod still goes.
#[test]
fn a_balanced_pool_weighs_the_saving_against_the_pods_it_moves() {
    let nodes = [node("a", "8"), node("b", "8"), node("c", "8")];
    // a and b are nearly full with many small pods; c holds 6 small pods: removing c saves a
    // third of the pool's cost but moves 6 of 22 pods (7 of 25 disruption units).
    let mut pods: Vec<Pod> = (0..8).map(|i| pod(&format!("a{i}"), "a", "500m", json!({}))).collect();
    pods.extend((0..8).map(|i| pod(&format!("b{i}"), "b", "500m", json!({}))));
    pods.extend((0..6).map(|i| pod(&format!("c{i}"), "c", "100m", json!({}))));
    let pools = [pool(Some(0))];
    let balanced = |pods: &[Pod]| {
        with_world(&nodes, pods, &pools, |w, c| {
            let all: Vec<Candidate> = c.iter().map(|x| (*x).clone()).collect();
            let search = Search { balance: Some(Balance::of(&all)), ..Search::exhaustive(MARGIN) };
            underutilized(w, "default", c, 1, search)
        })
    };
    let plain = consolidate(&nodes, &pods, &pools, 1, MARGIN).expect("WhenEmptyOrUnderutilized consolidates c");
    assert_eq!(plain.nodes, ["c"]);
    let d = balanced(&pods).expect("a third of the cost for 28% of the disruption passes");
    assert_eq!(d.nodes, ["c"]);
    assert!(d.balance.is_some());
    // With c's pods made costly to evict (priority), the same move disrupts too much.
    let costly: Vec<Pod> = pods
        .iter()
        .cloned()
        .map(|mut p| {
            if p.metadata.name.as_deref().is_some_and(|n| n.starts_with('c')) {
                p.spec.as_mut().expect("spec").priority = Some(300_000_000);
            }
            p
        })
        .collect();
    assert_eq!(consolidate(&nodes, &costly, &pools, 1, MARGIN).map(|d| d.nodes), Some(vec!["c".to_string()]), "the plain policy moves the fewest pods, whatever they cost to evict");
    // Balanced refuses c (6 pods of cost ~9.9: 60 of 79 disruption units for a third of the
    // cost) and takes a instead: 8 pods of cost 1, 9 units, for the same saving.
    let d = balanced(&costly).expect("another move passes");
    assert_eq!(d.nodes, ["a"]);
    let refused = with_world(&nodes, &costly, &pools, |w, c| {
        let all: Vec<Candidate> = c.iter().map(|x| (*x).clone()).collect();
        let only_c: Vec<&Candidate> = c.iter().copied().filter(|x| x.name() == "c").collect();
        decide(w, "default", &only_c, "underutilized", MARGIN, Some(Balance::of(&all)), None)
    });
    assert!(refused.is_err_and(|why| why.contains("Balanced: score")), "c alone is refused with its score");
}

#[test]
fn balanced_is_a_consolidation_policy() {
    let p: archer_api::nodepool::NodePool = archer_core::yaml::from_str("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: b}\nspec:\n  disruption: {consolidationPolicy: Balanced, consolidateAfter: 1m}\n  template: {spec: {requirements: []}}\n").expect("pool");
    let s = DisruptionSettings::of(&p).expect("Balanced is read");
    assert!(s.underutilized && s.balanced);
    let w: archer_api::nodepool::NodePool = archer_core::yaml::from_str("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: w}\nspec:\n  disruption: {consolidationPolicy: WhenEmptyOrUnderutilized}\n  template: {spec: {requirements: []}}\n").expect("pool");
    assert!(!DisruptionSettings::of(&w).expect("read").balanced);
}

#[test]
fn pods_that_two_small_nodes_hold_most_cheaply_go_onto_one_cheaper_node() {
    // Karpenter's consolidation simulation opens one new NodeClaim for pods one instance type
    // holds together, so it replaces a node with one cheaper node though two smaller ones would
    // cost less still; Archer's cost-optimal plan buys the two, which a set may not trade for.
    let nodes = [node("a", "8")];
    let pods = [pod("p1", "a", "900m", json!({})), pod("p2", "a", "900m", json!({})), pod("p3", "a", "900m", json!({}))];
    let pools = [pool(None)];
    let cheapest = with_world(&nodes, &pods, &pools, |w, c| {
        let batch: Vec<Pending> = c[0].pods.iter().map(|p| adapter::pending_unbound(p, w.state.pod_platforms(p), w.volumes, w.preferences)).collect();
        plan_batch_within(&w.state.snapshot(w.pools, &|n: &str| n == "a"), &batch, w.pools, &w.state.offerings, w.budget)
    });
    assert_eq!(cheapest.nodes.len(), 2, "the cost-optimal plan buys two nodes: {cheapest:?}");
    let d = consolidate(&nodes, &pods, &pools, 1, MARGIN).expect("one cheaper node");
    assert_eq!(d.replacements.len(), 1, "{d:?}");
    let one = &d.replacements[0];
    let mut held = one.pods.clone();
    held.sort();
    assert_eq!(held, ["default/p1", "default/p2", "default/p3"]);
    assert!(one.price_per_hour < 0.20 * (1.0 - MARGIN) && one.price_per_hour >= cheapest.total_price_per_hour, "{one:?}");
    // The cheapest such node: no cheaper offering has room for all three.
    let cpu_needed = 2700;
    for o in offerings().iter().filter(|o| o.price < one.price_per_hour) {
        assert!(pools[0].room(&o.labels(&pools[0]), o.instance.allocatable).cpu_millis < cpu_needed || o.instance.arch != one.arch, "{} at ${}/h holds them for less", o.instance.name, o.price);
    }
}

#[test]
fn no_single_node_holding_the_pods_means_no_replacement() {
    // The same three pods under a pool whose types are at most 2 vCPU: only two nodes hold them.
    let nodes = [node("a", "8")];
    let pods = [pod("p1", "a", "900m", json!({})), pod("p2", "a", "900m", json!({})), pod("p3", "a", "900m", json!({}))];
    let mut small = pool(None);
    small.requirements = Requirements::from_expressions(&serde_json::from_value::<Vec<_>>(json!([{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["3"]}])).expect("terms")).expect("requirements");
    assert_eq!(consolidate(&nodes, &pods, &[small], 1, MARGIN), None);
}

#[test]
fn a_node_alone_goes_instead_of_the_set_when_it_saves_more() {
    // Two 900m pods on a small node and one on a large one: the set of both needs one node for all
    // three (4 vCPU), while the large node alone needs only a 1-pod node for its pod.
    let nodes = [node("small", "2"), node("large", "8")];
    let pods = [pod("p1", "small", "900m", json!({})), pod("p2", "small", "900m", json!({})), pod("p3", "large", "900m", json!({}))];
    let pools = [pool(None)];
    let prices = [("small", 0.0765), ("large", 0.306)];
    let decide_on = |search: Search| {
        let state = state_of(&nodes, &pods);
        let volumes = Volumes::default();
        let world = World { state: &state, pools: &pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
        let candidates: Vec<Candidate> = nodes
            .iter()
            .zip(prices)
            .map(|(n, (name, price))| Candidate { node: n, pods: pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name)).collect(), price })
            .collect();
        let refs: Vec<&Candidate> = candidates.iter().collect();
        let set = decide(&world, "default", &refs, "underutilized", MARGIN, None, None).expect("the set can go");
        (set, underutilized(&world, "default", &refs, 2, search))
    };
    let (set, d) = decide_on(Search::exhaustive(MARGIN));
    let d = d.expect("a decision");
    assert_eq!(d.nodes, ["large"], "{d:?}");
    assert!(d.saving_per_hour > set.saving_per_hour, "alone {} against the set's {}", d.saving_per_hour, set.saving_per_hour);
    // With evaluations for the set search only, the set goes.
    let (_, d) = decide_on(Search { max_evaluations: 1, ..Search::exhaustive(MARGIN) });
    assert_eq!(d.expect("the set").nodes, ["large", "small"]);
}

thread_local! {
    /// Planning runs ([`evaluate`]) made on this thread: what a search spent.
    pub(super) static PLANNING_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn planning_runs() -> usize {
    PLANNING_RUNS.with(std::cell::Cell::get)
}

/// The cheapest offering a pool of `pools` may launch with room for `need` (read straight off
/// the catalog: allocatable against need, no DaemonSets).
fn cheapest_holding(pools: &[Pool], need: archer_core::resources::Resources) -> f64 {
    offerings()
        .iter()
        .filter(|o| pools.iter().any(|p| p.requirements.matches_map(&o.labels(p))) && need.fits(o.instance.allocatable))
        .map(|o| o.price)
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn a_still_pool_is_searched_without_planning_a_set_no_replacement_makes_worth_it() {
    // Three nodes, each with a 3-CPU pod no other node has room for: whichever node goes, its pod
    // needs a new node with 3 CPUs free. Priced as the cheapest such node, none can save.
    let nodes = [node("a", "4"), node("b", "4"), node("c", "4")];
    let pods = [pod("p1", "a", "3", json!({})), pod("p2", "b", "3", json!({})), pod("p3", "c", "3", json!({}))];
    let pools = [pool(None)];
    let need = archer_core::resources::Resources::new(3000, 256 << 20, 1);
    let least = cheapest_holding(&pools, need);
    assert!(least.is_finite() && least < 0.20 * (1.0 - MARGIN), "the fixture needs a node cheaper than $0.20/h: {least}");
    let search = |price: f64| {
        let state = state_of(&nodes, &pods);
        let volumes = Volumes::default();
        let world = World { state: &state, pools: &pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
        let candidates: Vec<Candidate> = nodes.iter().zip(&pods).map(|(n, p)| Candidate { node: n, pods: vec![p], price }).collect();
        let refs: Vec<&Candidate> = candidates.iter().collect();
        let before = planning_runs();
        let d = underutilized(&world, "default", &refs, 3, Search::exhaustive(MARGIN));
        let unbounded = (0..refs.len()).find_map(|i| decide(&world, "default", &refs[i..=i], "underutilized", MARGIN, None, None).ok());
        (d, unbounded, planning_runs() - before)
    };
    // Before the floor, every set (two prefixes and three nodes alone) was planned to find nothing.
    let (d, unbounded, runs) = search(least);
    assert_eq!((d, unbounded.is_none()), (None, true));
    assert_eq!(runs, 3, "only the three unbounded decisions planned");
    // Priced at $0.20/h, a smaller node saves: each set is planned and one goes.
    let (d, _, runs) = search(0.20);
    let d = d.expect("a cheaper node");
    assert_eq!(d.replacements.len(), 1, "{d:?}");
    assert!(runs > 3, "the sets were planned: {runs}");
}

/// A node of `cpu` CPUs and `memory`, in the test pool.
fn node_sized(name: &str, cpu: u32, memory_gib: u32) -> Node {
    let mut n = node(name, &cpu.to_string());
    if let Some(a) = n.status.as_mut().and_then(|s| s.allocatable.as_mut()) {
        a.insert("memory".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(format!("{memory_gib}Gi")));
    }
    n
}

fn pod_sized(name: &str, on: &str, cpu: &str, memory: &str, spec: serde_json::Value) -> Pod {
    let mut p = pod(name, on, cpu, spec);
    if let Some(c) = p.spec.as_mut().map(|s| &mut s.containers[0]) {
        c.resources = serde_json::from_value(json!({"requests": {"cpu": cpu, "memory": memory}})).ok();
    }
    p
}

#[test]
fn the_floor_never_refuses_a_set_the_planner_would_take() {
    // Random clusters (a fixed seed): every single node and every prefix of the nodes, decided
    // with the floor and without; the answers are the same, and the floor spares some plans.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) as usize) % n
    };
    let (mut spared, mut taken, mut compared) = (0, 0, 0);
    for cluster in 0..40 {
        let count = 2 + next(4);
        let nodes: Vec<Node> = (0..count).map(|i| node_sized(&format!("n{i}"), [2, 4, 8, 16][next(4)], [4, 8, 16, 32, 64][next(5)])).collect();
        let mut pods = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            for j in 0..next(5) {
                let spec = match next(6) {
                    0 => json!({"nodeSelector": {"kubernetes.io/hostname": n.metadata.name.clone()}}),
                    1 => apart(),
                    _ => json!({}),
                };
                let cpu = ["100m", "500m", "900m", "1500m", "3", "6"][next(6)];
                let memory = ["256Mi", "1Gi", "3Gi", "8Gi", "28Gi"][next(5)];
                pods.push(pod_sized(&format!("p{i}-{j}"), n.metadata.name.as_deref().unwrap_or(""), cpu, memory, spec));
            }
        }
        let mut p = pool([None, Some(0), Some(1)][next(3)]);
        if next(3) == 0 {
            p.requirements = Requirements::from_expressions(&serde_json::from_value::<Vec<_>>(json!([{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["9"]}])).expect("terms")).expect("requirements");
        }
        let mut state = state_of(&nodes, &pods);
        // A second pool, in some clusters, with offerings of its own at half price (a NodeOverlay
        // for that pool alone): no other pool buys at its prices.
        let pools: Vec<Pool> = if next(3) == 0 {
            let mut b = pool(None);
            b.name = "b".into();
            b.weight = [0, 20][next(2)];
            b.requirements = Requirements::from_expressions(&serde_json::from_value::<Vec<_>>(json!([{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["5"]}])).expect("terms")).expect("requirements");
            let mut offered = offerings();
            offered.extend(offerings().into_iter().map(|o| Offering { price: o.price / 2.0, pool: Some("b".into()), ..o }));
            state.offerings = std::sync::Arc::new(offered);
            vec![p, b]
        } else {
            vec![p]
        };
        let prices: Vec<f64> = (0..count).map(|_| [0.05, 0.1, 0.17, 0.3, 0.5, 0.9, 1.6][next(7)]).collect();
        let balanced = next(2) == 0;
        let volumes = Volumes::default();
        let world = World { state: &state, pools: &pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences: Default::default() };
        let candidates: Vec<Candidate> = nodes
            .iter()
            .zip(&prices)
            .map(|(n, &price)| Candidate { node: n, pods: pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == n.metadata.name.as_deref()).collect(), price })
            .collect();
        let refs: Vec<&Candidate> = candidates.iter().filter(|c| !c.pods.is_empty()).collect();
        let balance = balanced.then(|| Balance::of(&candidates));
        let floor = Floor::new(&world);
        let sets = (0..refs.len()).map(|i| i..i + 1).chain((2..=refs.len()).map(|n| 0..n));
        for range in sets {
            let set = &refs[range];
            let plain = decide(&world, "default", set, "underutilized", MARGIN, balance, None);
            let before = planning_runs();
            let bounded = decide(&world, "default", set, "underutilized", MARGIN, balance, Some(&floor));
            if planning_runs() == before {
                spared += 1;
            }
            assert_eq!(plain.as_ref().ok(), bounded.as_ref().ok(), "cluster {cluster}, set {:?}: {plain:?} against {bounded:?}", set.iter().map(|c| c.name()).collect::<Vec<_>>());
            taken += usize::from(plain.is_ok());
            compared += 1;
        }
    }
    assert!(taken > 10 && spared > 10 && compared > taken + spared, "a test of both answers: {taken} taken, {spared} spared of {compared}");
}

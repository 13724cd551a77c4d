use super::*;
use crate::platform::PlatformSet;
use crate::requirements::Requirements;
use crate::resources::{pod_requests, Resources};
use crate::packer::PlannedNode;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn node(name: &str, arch: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/arch": arch, "kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "us-east-1a"}},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}}))
    .expect("node")
}

fn pod(name: &str, labels: serde_json::Value, spec: serde_json::Value, node: Option<&str>) -> Pod {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]);
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": spec})).expect("pod")
}

/// An amd64 node in `zone`.
fn zoned(name: &str, zone: &str) -> Node {
    let mut n = node(name, "amd64");
    n.metadata.labels.get_or_insert_with(Default::default).insert("topology.kubernetes.io/zone".into(), zone.into());
    n
}

fn pending(p: &Pod, platforms: &str) -> Pending {
    Pending {
        packer: PendingPod {
            id: format!("default/{}", p.metadata.name.clone().unwrap_or_default()),
            requests: Resources { pods: 1, ..pod_requests(p, false) },
            terms: Vec::new(),
            tolerations: Vec::new(),
            platforms: Some(PlatformSet::parse_annotation(platforms).expect("platforms")),
            zone_spread: false,
            per_node_max: None,
            zone_group: None,
            preferred: Vec::new(),
            spread_group: None,
            one_per_zone: false,
            colocate: false,
            spread_keys: Vec::new(),
            extended: Default::default(),
        },
        stricter: Vec::new(),
        preferences: Vec::new(),
        planned: None,
        queue_order: 0,
        sched: PodInfo::from_pod(p),
    }
}

fn offerings() -> Vec<Offering> {
    Offering::embedded_on_demand()
}

fn pool() -> Pool {
    Pool { name: "default".into(), weight: 0, requirements: Requirements::new(), labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: None, daemons: Vec::new(), closed: None, variant: Default::default() }
}

#[test]
fn anti_affinity_to_a_running_pod_buys_a_node_instead_of_a_refused_placement() {
    // The finding: first-fit put a pod with required anti-affinity on a node kube-scheduler
    // refuses, so no node was bought and the pod stayed Pending forever.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    let running = pod("db-0", json!({"app": "db"}), json!({}), Some("n1"));
    let snapshot = Snapshot::new(&[node("n1", "amd64")], &[running], &[]);
    let incoming = pod("db-1", json!({"app": "db"}), anti, None);
    let plan = plan_batch(&snapshot, &[pending(&incoming, "linux/amd64")], &[pool()], &offerings());
    assert!(plan.existing.is_empty(), "{:?}", plan.existing);
    assert_eq!(plan.nodes.len(), 1, "a new node is bought for it");
    // No pool at all: the pod's reason names what every existing node said, as kube-scheduler does.
    let plan = plan_batch(&snapshot, &[pending(&incoming, "linux/amd64")], &[], &offerings());
    assert_eq!(plan.unschedulable.len(), 1);
    assert!(plan.unschedulable[0].reason.ends_with("0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."), "{}", plan.unschedulable[0].reason);
    // Without the anti-affinity the room on n1 is used.
    let plain = pod("web-1", json!({"app": "web"}), json!({}), None);
    let plan = plan_batch(&snapshot, &[pending(&plain, "linux/amd64")], &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/web-1").map(String::as_str), Some("n1"));
    assert!(plan.nodes.is_empty());
}

#[test]
fn running_pods_preferences_toward_the_incoming_pod_decide_among_existing_nodes() {
    // kube-scheduler's InterPodAffinity scores a node by running pods' own preferred terms that
    // select the incoming pod: a cache on n2 that prefers web beside it draws web to n2, though
    // n1 comes first; one on n1 that prefers web away sends it on to n2 as well.
    let near = json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}}]}}});
    let away = json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}}]}}});
    let web = pending(&pod("web-0", json!({"app": "web"}), json!({}), None), "linux/amd64");
    let nodes = [node("n1", "amd64"), node("n2", "amd64")];
    for (what, running) in [("affinity on n2", pod("cache", json!({"app": "cache"}), near, Some("n2"))), ("anti-affinity on n1", pod("cache", json!({"app": "cache"}), away, Some("n1")))] {
        let snapshot = Snapshot::new(&nodes, std::slice::from_ref(&running), &[]);
        let plan = plan_batch(&snapshot, std::slice::from_ref(&web), &[pool()], &offerings());
        assert_eq!(plan.existing.get("default/web-0").map(String::as_str), Some("n2"), "{what}: {:?}", plan.existing);
    }
    // A running pod whose terms do not select web changes nothing: the first node.
    let other = pod("cache", json!({"app": "cache"}), json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "api"}}, "topologyKey": "kubernetes.io/hostname"}}]}}}), Some("n2"));
    let snapshot = Snapshot::new(&nodes, &[other], &[]);
    let plan = plan_batch(&snapshot, &[web], &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/web-0").map(String::as_str), Some("n1"));
}

#[test]
fn running_pods_count_for_spread_and_images_decide_the_architecture() {
    // As the webhook leaves them: pinned to the architectures their images run on.
    let spread = json!({"nodeSelector": {"kubernetes.io/arch": "amd64"}, "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let running = vec![pod("web-0", json!({"app": "web"}), json!({}), Some("n1")), pod("web-1", json!({"app": "web"}), json!({}), Some("n1"))];
    let snapshot = Snapshot::new(&[node("n1", "amd64"), node("n2", "amd64"), node("n3", "arm64")], &running, &[]);
    let incoming: Vec<Pending> = (2..4).map(|i| pending(&pod(&format!("web-{i}"), json!({"app": "web"}), spread.clone(), None), "linux/amd64")).collect();
    let plan = plan_batch(&snapshot, &incoming, &[pool()], &offerings());
    // n1 holds 2 and n3 (arm64) is no domain of theirs: n2 takes both (skew 1 each time).
    assert_eq!(plan.existing.values().collect::<Vec<_>>(), ["n2", "n2"], "{:?}", plan);
    assert!(plan.nodes.is_empty());
}

#[test]
fn a_pod_an_earlier_plan_placed_stays_on_that_node_while_it_fits() {
    // Found by the plan-fidelity e2e: once a pod's planned node registered, the next batch
    // re-planned the pod first-fit onto another node, and kube-scheduler followed the new plan,
    // leaving room bought for the pod unused.
    let snapshot = Snapshot::new(&[node("n1", "amd64"), node("n2", "amd64")], &[], &[]);
    // Named to sort after the others, which would otherwise be placed first.
    let mut stays = pending(&pod("zz-0", json!({}), json!({}), None), "linux/amd64");
    stays.planned = Some("n2".into());
    let plan = plan_batch(&snapshot, std::slice::from_ref(&stays), &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/zz-0").map(String::as_str), Some("n2"));
    // Its room is held before any other pod of the batch is placed: sixteen more 500m pods fill
    // both 4-cpu nodes but for its place, and one of them gets a new node.
    let others: Vec<Pending> = (1..=16).map(|i| pending(&pod(&format!("web-{i}"), json!({}), json!({}), None), "linux/amd64")).collect();
    let mut batch = others.clone();
    batch.push(stays.clone());
    let plan = plan_batch(&snapshot, &batch, &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/zz-0").map(String::as_str), Some("n2"), "{:?}", plan.existing);
    assert_eq!(plan.existing.len(), 16);
    assert_eq!(plan.nodes.len(), 1);
    // A planned node that no longer takes the pod (full): it goes wherever it fits.
    let full: Vec<Pod> = (0..8).map(|i| pod(&format!("busy-{i}"), json!({}), json!({}), Some("n2"))).collect();
    let snapshot = Snapshot::new(&[node("n1", "amd64"), node("n2", "amd64")], &full, &[]);
    let plan = plan_batch(&snapshot, std::slice::from_ref(&stays), &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/zz-0").map(String::as_str), Some("n1"));
    // A planned node not in the snapshot (gone): first fit, as for any pod.
    stays.planned = Some("gone".into());
    let snapshot = Snapshot::new(&[node("n1", "amd64"), node("n2", "amd64")], &[], &[]);
    let plan = plan_batch(&snapshot, std::slice::from_ref(&stays), &[pool()], &offerings());
    assert_eq!(plan.existing.get("default/zz-0").map(String::as_str), Some("n1"));
}

#[test]
fn interchangeable_spread_pods_take_their_places_in_kube_schedulers_queue_order() {
    // Found by the plan-fidelity e2e: the plan spread six replicas two per zone, but gave the
    // places out by name; kube-scheduler tries them in its queue's order and refused the second
    // one its planned zone (skew 2 against an empty zone), so it bound to a place planned for
    // another pod.
    let snapshot = Snapshot::new(&[zoned("a", "us-east-1a"), zoned("b", "us-east-1b"), zoned("c", "us-east-1c")], &[], &[]);
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "z"}}}]});
    // Queue order 0, 3, 1, 4, 2, 5: by name, pods 0 and 3 share a zone.
    let batch: Vec<Pending> = [0u64, 2, 4, 1, 3, 5]
        .iter()
        .enumerate()
        .map(|(i, &queue)| {
            let mut p = pending(&pod(&format!("z-{i}"), json!({"app": "z"}), spread.clone(), None), "linux/amd64");
            p.queue_order = queue;
            p
        })
        .collect();
    let plan = plan_batch(&snapshot, &batch, &[pool()], &offerings());
    assert_eq!(plan.existing.len(), 6, "{plan:?}");
    let zone_of = |pod: &str| plan.existing[&format!("default/{pod}")].clone();
    let mut per_node: std::collections::BTreeMap<String, usize> = Default::default();
    let mut in_queue: Vec<&Pending> = batch.iter().collect();
    in_queue.sort_by_key(|p| p.queue_order);
    for p in in_queue {
        *per_node.entry(zone_of(&p.sched.name)).or_default() += 1;
        let (lo, hi) = (["a", "b", "c"].iter().map(|n| per_node.get(*n).copied().unwrap_or(0)).min().unwrap_or(0), per_node.values().max().copied().unwrap_or(0));
        assert!(hi - lo <= 1, "after {} the zones hold {per_node:?}", p.sched.name);
    }
    // The same places: two pods per zone.
    assert_eq!(per_node.values().collect::<Vec<_>>(), [&2, &2, &2]);
}

#[test]
fn an_earlier_plan_for_a_spread_holds_as_a_whole_whatever_order_its_pods_are_checked_in() {
    // Found by the plan-fidelity e2e: pods an earlier plan spread over two zones were checked
    // one by one; the second pod for zone a came before the pod for zone b (skew 2 for a moment),
    // lost its place, and was bought a new node while kube-scheduler bound it to the old one.
    // a0 comes first: a pod that lost its place would go there.
    let snapshot = Snapshot::new(&[zoned("a0", "us-east-1a"), zoned("a", "us-east-1a"), zoned("b", "us-east-1b")], &[], &[]);
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "z"}}}]});
    let batch: Vec<Pending> = [("z-0", "a"), ("z-1", "a"), ("z-2", "b")]
        .iter()
        .map(|(name, planned)| {
            let mut p = pending(&pod(name, json!({"app": "z"}), spread.clone(), None), "linux/amd64");
            p.planned = Some((*planned).into());
            p
        })
        .collect();
    let plan = plan_batch(&snapshot, &batch, &[pool()], &offerings());
    let got: Vec<(&str, &str)> = plan.existing.iter().map(|(p, n)| (p.as_str(), n.as_str())).collect();
    assert_eq!(got, [("default/z-0", "a"), ("default/z-1", "a"), ("default/z-2", "b")], "{plan:?}");
    assert!(plan.nodes.is_empty());
}

#[test]
fn a_closed_pool_buys_nothing_and_its_pods_fall_through_to_the_next_by_weight() {
    // As a NodePool whose node class is not ready: no room for a new node, and that reason.
    let closed = |name: &str, weight: i32| Pool { name: name.into(), weight, limit_nodes: Some(0), closed: Some("EC2NodeClass gone not found on the cluster".into()), ..pool() };
    let open = |name: &str, weight: i32| Pool { name: name.into(), weight, ..pool() };
    let snapshot = Snapshot::new(&[], &[], &[]);
    let pods: Vec<Pending> = (0..3).map(|i| pending(&pod(&format!("web-{i}"), json!({"app": "web"}), json!({}), None), "linux/amd64")).collect();
    let plan = plan_batch(&snapshot, &pods, &[closed("heavy", 10), open("light", 1)], &offerings());
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!(!plan.nodes.is_empty() && plan.nodes.iter().all(|n| n.pool == "light"), "{:?}", plan.nodes);
    // The heavier pool open again: it is chosen.
    let plan = plan_batch(&snapshot, &pods, &[open("heavy", 10), open("light", 1)], &offerings());
    assert!(plan.nodes.iter().all(|n| n.pool == "heavy"), "{:?}", plan.nodes);
    // Only a closed pool: every pod is unschedulable, saying why.
    let plan = plan_batch(&snapshot, &pods, &[closed("heavy", 10)], &offerings());
    assert!(plan.nodes.is_empty());
    assert_eq!(plan.unschedulable.len(), 3);
    assert!(plan.unschedulable.iter().all(|u| u.reason.contains("NodePool heavy is not ready: EC2NodeClass gone not found on the cluster")), "{:?}", plan.unschedulable);
}

#[test]
fn a_closed_pool_names_itself_whatever_packer_path_gives_up_on_the_pod() {
    // Zone spread, one per zone, a node of their own, colocated, a zone group: each packer path
    // that gives up on a pod for want of a pool's room says the pool is not ready.
    let closed = Pool { name: "heavy".into(), limit_nodes: Some(0), closed: Some("EC2NodeClass gone not found on the cluster".into()), ..pool() };
    let snapshot = Snapshot::new(&[], &[], &[]);
    // Three zones, so that one pod per zone can place every pod.
    let zones: Vec<Offering> = ["us-east-1a", "us-east-1b", "us-east-1c"].iter().flat_map(|z| offerings().into_iter().map(|o| Offering { zone: z.to_string(), ..o })).collect();
    type Shape = fn(&mut PendingPod);
    let shapes: [(&str, Shape); 5] = [
        ("zone spread", |p| {
            p.zone_spread = true;
            p.spread_group = Some("web".into());
            p.spread_keys = vec!["topology.kubernetes.io/zone".into()];
        }),
        ("one per zone", |p| p.one_per_zone = true),
        ("one per node", |p| p.per_node_max = Some(1)),
        ("colocated", |p| p.colocate = true),
        ("zone group", |p| p.zone_group = Some("web".into())),
    ];
    for (what, shape) in shapes {
        let pods: Vec<Pending> = (0..3)
            .map(|i| {
                let mut p = pending(&pod(&format!("web-{i}"), json!({"app": "web"}), json!({}), None), "linux/amd64");
                shape(&mut p.packer);
                p
            })
            .collect();
        let plan = plan_batch(&snapshot, &pods, std::slice::from_ref(&closed), &zones);
        assert!(plan.nodes.is_empty(), "{what}: {:?}", plan.nodes);
        assert_eq!(plan.unschedulable.len(), 3, "{what}");
        assert!(plan.unschedulable.iter().all(|u| u.reason.contains("NodePool heavy is not ready: EC2NodeClass gone not found on the cluster")), "{what}: {:?}", plan.unschedulable);
    }
    // Colocated pods one node would hold, in a pool at its limits: the limit is the reason (it
    // used to say no instance type holds them).
    let full = Pool { name: "heavy".into(), limit_nodes: Some(0), ..pool() };
    let pods: Vec<Pending> = (0..3)
        .map(|i| {
            let mut p = pending(&pod(&format!("web-{i}"), json!({"app": "web"}), json!({}), None), "linux/amd64");
            p.packer.colocate = true;
            p
        })
        .collect();
    let plan = plan_batch(&snapshot, &pods, &[full], &zones);
    assert!(plan.unschedulable.len() == 3 && plan.unschedulable.iter().all(|u| u.reason == "pool limits reached (heavy)"), "{:?}", plan.unschedulable);
}

#[test]
fn a_single_replacement_is_bought_at_its_own_pools_price_never_at_another_pools_own_offering() {
    // Pool b's own (overlay-priced) offering of a type is b's alone, as the packer's slots have
    // it: consolidation's one replacement in pool a is priced as a's offering of that type.
    let all = offerings();
    let of = |name: &str| all.iter().find(|o| o.instance.name == name).cloned().unwrap_or_else(|| panic!("{name} in the embedded catalog"));
    let (small, large) = (of("m7i.xlarge"), of("m7i.2xlarge"));
    let b_own = Offering { price: large.price / 2.0, pool: Some("b".into()), ..large.clone() };
    let offerings = vec![small.clone(), large.clone(), b_own];
    let a = Pool { name: "a".into(), weight: 10, ..pool() };
    let b = Pool {
        name: "b".into(),
        requirements: Requirements::from_expressions(&serde_json::from_value::<Vec<_>>(json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m7i.xlarge"]}])).expect("terms")).expect("requirements"),
        ..pool()
    };
    let pods: Vec<Pod> = (0..10).map(|i| pod(&format!("p{i}"), json!({}), json!({}), None)).collect();
    let batch: Vec<Pending> = pods.iter().map(|p| pending(p, "linux/amd64")).collect();
    // Two new nodes for the ten pods (5 CPUs): one node must hold them all.
    let node = |name: &str, ids: &[Pending]| PlannedNode {
        name: name.into(),
        pool: "a".into(),
        instance_type: small.instance.name.clone(),
        arch: "amd64".into(),
        zone: small.zone.clone(),
        capacity_type: "on-demand".into(),
        price_per_hour: small.price,
        pods: ids.iter().map(|p| p.packer.id.clone()).collect(),
        labels: Default::default(),
    };
    let (left, right) = batch.split_at(5);
    let plan = Plan { nodes: vec![node("a-1", left), node("a-2", right)], total_price_per_hour: 2.0 * small.price, ..Plan::default() };
    let one = onto_one_new_node(&Snapshot::default(), &batch, &[a, b], &offerings, &plan).expect("one node holds them");
    assert_eq!(one.nodes.len(), 1);
    let n = &one.nodes[0];
    assert_eq!((n.pool.as_str(), n.instance_type.as_str()), ("a", "m7i.2xlarge"));
    assert_eq!(n.price_per_hour, large.price, "a's price for the type, not b's own");
}

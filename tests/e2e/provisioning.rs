//! Scenarios driven by Archer's provisioner (kwok provider): nodes appear for pending pods,
//! carry the labels users select on, and go away when empty or wasteful.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use archer::catalog::Catalog;
use archer::provisioner::nodeclaim::NodeClaim;
use archer::provisioner::nodepool::NodePool;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{deployment, namespace, running_pods, wait, wait_running};
use crate::cluster::Cluster;

pub(crate) async fn pool(client: &Client, yaml: &str) {
    let p: NodePool = archer::yaml::from_str(yaml).expect("pool yaml");
    Api::<NodePool>::all(client.clone()).create(&PostParams::default(), &p).await.expect("create pool");
}

/// Nodes Archer launched.
pub(crate) async fn archer_nodes(client: &Client) -> Vec<Node> {
    Api::<Node>::all(client.clone()).list(&ListParams::default().labels("archer.dev/nodepool")).await.map(|l| l.items).unwrap_or_default()
}

pub(crate) async fn claims(client: &Client) -> Vec<NodeClaim> {
    Api::<NodeClaim>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

pub(crate) fn label<'a>(n: &'a Node, key: &str) -> &'a str {
    n.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str).unwrap_or("")
}

/// The Deployment with its container's requests set to `cpu` and `memory`.
pub(crate) fn with_requests(mut d: Deployment, cpu: &str, memory: &str) -> Deployment {
    if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.containers[0].resources = serde_json::from_value(json!({"requests": {"cpu": cpu, "memory": memory}})).ok();
    }
    d
}

pub(crate) async fn scale(client: &Client, ns: &str, name: &str, replicas: i32) {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}})))
        .await
        .expect("scale");
}

pub(crate) fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

pub(crate) fn price(catalog: &Catalog, n: &Node) -> f64 {
    let cap = archer::catalog::CapacityType::parse(label(n, "karpenter.sh/capacity-type")).expect("capacity type label");
    catalog.price(label(n, "node.kubernetes.io/instance-type"), None, cap).expect("priced type")
}

/// Warning events posted on a pod.
async fn pod_events(client: &Client, ns: &str, pod: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

pub(crate) const DEFAULT_POOL: &str = "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand, spot]}\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 5s\n";

/// Scenario 1: two Deployments of a multi-arch image, one pinned to amd64 on-demand, one to
/// c6g.xlarge, scaled 0 -> 2: the right nodes appear; scaled to 0: they go away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_1_inflate_amd64_and_arm64() {
    let started = Instant::now();
    let mut c = Cluster::start("scenario-1").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/inflate", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "workshop", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    let image = c.registry.image("apps/inflate:1");
    let requests = |spec: serde_json::Value| {
        let mut s = spec;
        s["containers"] = json!([{"name": "app", "image": image, "resources": {"requests": {"cpu": "1", "memory": "1536Mi"}}}]);
        s
    };
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "workshop");
    let amd = deployment("inflate-amd64", "unused", 0, requests(json!({"nodeSelector": {"kubernetes.io/arch": "amd64", "karpenter.sh/capacity-type": "on-demand"}})));
    let arm = deployment("inflate-arm64", "unused", 0, requests(json!({"nodeSelector": {"kubernetes.io/arch": "arm64", "node.kubernetes.io/instance-type": "c6g.xlarge"}})));
    deploys.create(&PostParams::default(), &amd).await.expect("create");
    deploys.create(&PostParams::default(), &arm).await.expect("create");

    let t0 = Instant::now();
    scale(&client, "workshop", "inflate-amd64", 2).await;
    scale(&client, "workshop", "inflate-arm64", 2).await;
    let amd_pods = wait_running(&client, "workshop", "inflate-amd64", 2, Duration::from_secs(120)).await;
    let arm_pods = wait_running(&client, "workshop", "inflate-arm64", 2, Duration::from_secs(120)).await;
    eprintln!("scenario 1: scale 0 -> 2+2, all 4 pods Running in {:?}", t0.elapsed());

    let catalog = Catalog::embedded().expect("catalog");
    let nodes: BTreeMap<String, Node> = archer_nodes(&client).await.into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
    for p in &arm_pods {
        let n = nodes.get(&node_of(p)).expect("on an Archer node");
        assert_eq!((label(n, "kubernetes.io/arch"), label(n, "node.kubernetes.io/instance-type")), ("arm64", "c6g.xlarge"));
    }
    let mut amd_nodes: BTreeMap<String, usize> = BTreeMap::new();
    for p in &amd_pods {
        *amd_nodes.entry(node_of(p)).or_default() += 1;
    }
    for (name, count) in &amd_nodes {
        let n = nodes.get(name).expect("on an Archer node");
        assert_eq!((label(n, "kubernetes.io/arch"), label(n, "karpenter.sh/capacity-type")), ("amd64", "on-demand"));
        // Labels users already select on, Karpenter's included.
        for key in ["kubernetes.io/os", "topology.kubernetes.io/zone", "topology.kubernetes.io/region", "karpenter.sh/nodepool", "karpenter.sh/provisioner-name", "archer.dev/nodepool", "archer.dev/capacity-type"] {
            assert!(!label(n, key).is_empty(), "node {name} lacks {key}");
        }
        // Cheapest fitting type: no amd64 on-demand type that holds these pods costs less.
        let need = archer::core::resources::Resources::new(1000 * *count as i64, 1536 * 1024 * 1024 * *count as i64, *count as i64);
        let chosen = price(&catalog, n);
        let cheaper: Vec<&str> = catalog
            .types()
            .iter()
            .filter(|t| t.arch == "amd64" && need.fits(t.allocatable))
            .filter(|t| catalog.price_of(t, None, archer::catalog::CapacityType::OnDemand).is_some_and(|p| p < chosen - 1e-9))
            .map(|t| t.name.as_str())
            .collect();
        assert!(cheaper.is_empty(), "node {name} ({}, ${chosen}/h) for {count} pod(s), but {cheaper:?} are cheaper and fit", label(n, "node.kubernetes.io/instance-type"));
    }
    let amd_total: usize = amd_nodes.values().sum();
    assert_eq!(amd_total, 2);

    scale(&client, "workshop", "inflate-amd64", 0).await;
    scale(&client, "workshop", "inflate-arm64", 0).await;
    let t1 = Instant::now();
    while !(archer_nodes(&client).await.is_empty() && claims(&client).await.is_empty()) {
        assert!(t1.elapsed() < Duration::from_secs(60), "empty nodes not removed; archer exit status: {:?}", c.archer_exit());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("scenario 1: scale -> 0, empty nodes gone in {:?}", t1.elapsed());
    assert!(c.archer_metric("archer_nodes_terminated_total{reason=\"empty\"}").await >= 2.0);
    eprintln!("scenario 1 total: {:?}", started.elapsed());
}

/// Scenario 2: a tainted team pool, a Deployment that tolerates and selects it with a zone spread
/// (DoNotSchedule, minDomains 2): nodes in two zones, pods balanced, no other team's pods on them.
/// The spread is a hard rule with minDomains so kube-scheduler itself keeps the balance whatever
/// order the nodes appear in: a ScheduleAnyway spread is only a score, and kube-scheduler binds a
/// pod to the one zone that has a node before the second zone's node registers (the flake of
/// session 3's CI run, 3 pods in us-east-1a and 1 in us-east-1b).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_2_team_pool_with_taint_and_zone_spread() {
    let started = Instant::now();
    let c = Cluster::start("scenario-2").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "team1", json!({})).await;
    namespace(&client, "team2", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    pool(
        &client,
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: team1}\nspec:\n  weight: 10\n  template:\n    metadata:\n      labels: {team: team1}\n    spec:\n      taints:\n        - {key: team1, effect: NoSchedule}\n      requirements:\n        - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1a, us-east-1b]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n",
    )
    .await;
    let image = c.registry.image("apps/web:1");
    let team1 = deployment(
        "web",
        &image,
        4,
        json!({
            "nodeSelector": {"team": "team1"},
            "tolerations": [{"key": "team1", "operator": "Exists", "effect": "NoSchedule"}],
            "topologySpreadConstraints": [{"maxSkew": 1, "minDomains": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]
        }),
    );
    let t0 = Instant::now();
    Api::<Deployment>::namespaced(client.clone(), "team1").create(&PostParams::default(), &team1).await.expect("create");
    Api::<Deployment>::namespaced(client.clone(), "team2").create(&PostParams::default(), &deployment("other", &image, 3, json!({}))).await.expect("create");
    let pods = wait_running(&client, "team1", "web", 4, Duration::from_secs(120)).await;
    let other = wait_running(&client, "team2", "other", 3, Duration::from_secs(120)).await;
    eprintln!("scenario 2: create -> 7 pods Running in {:?}", t0.elapsed());

    let nodes: BTreeMap<String, Node> = archer_nodes(&client).await.into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pods {
        let n = nodes.get(&node_of(p)).expect("on an Archer node");
        assert_eq!((label(n, "team"), label(n, "archer.dev/nodepool")), ("team1", "team1"));
        assert!(n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.key == "team1" && t.effect == "NoSchedule")));
        *per_zone.entry(label(n, "topology.kubernetes.io/zone").to_string()).or_default() += 1;
    }
    assert_eq!(per_zone.len(), 2, "team1 pods in two zones: {per_zone:?}");
    let (lo, hi) = (per_zone.values().min().copied().unwrap_or(0), per_zone.values().max().copied().unwrap_or(0));
    assert!(hi - lo <= 1, "balanced across zones: {per_zone:?}");
    for p in &other {
        let n = nodes.get(&node_of(p)).expect("on an Archer node");
        assert_ne!(label(n, "team"), "team1", "another team's pod on a team1 node");
    }
    eprintln!("scenario 2 total: {:?}", started.elapsed());
}

/// The consolidation scenarios' shop: the webhook registered, the amd64-only image `apps/api:1`
/// pushed, namespace `shop`, and a NodePool `pool` (amd64, on-demand, and `requirement`) that
/// consolidates underutilised nodes after 3 s with no budget. Returns the client.
async fn api_shop(c: &Cluster, pool_name: &str, requirement: &str) -> Client {
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_image("apps/api", "1", "linux/amd64", true).await;
    namespace(&client, "shop", json!({})).await;
    let yaml = format!("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: {pool_name}}}\nspec:\n  template:\n    spec:\n      requirements:\n        - {{key: kubernetes.io/arch, operator: In, values: [amd64]}}\n        - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}\n        - {requirement}\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 3s\n    budgets: [{{nodes: \"100%\"}}]\n");
    pool(&client, &yaml).await;
    client
}

/// Scenario 4: 10 replicas, then 3: Archer removes and replaces nodes until the 3 pods cost no
/// more than the cheapest single node that holds them, never taking the Deployment below its
/// PodDisruptionBudget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_4_consolidation_respects_the_pdb() {
    let started = Instant::now();
    let c = Cluster::start("scenario-4").await;
    let client = api_shop(&c, "general", "{key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}").await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "api"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "api"}}}})).expect("pdb");
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "shop").create(&PostParams::default(), &pdb).await.expect("pdb");
    let d = with_requests(deployment("api", &c.registry.image("apps/api:1"), 10, json!({})), "900m", "1Gi");
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &d).await.expect("create");
    wait_running(&client, "shop", "api", 10, Duration::from_secs(120)).await;
    let catalog = Catalog::embedded().expect("catalog");
    let price_at_10: f64 = archer_nodes(&client).await.iter().map(|n| price(&catalog, n)).sum();

    // The cheapest single node of this pool for 3 such pods (the packer with the 3 pods bound to
    // share a node). Whichever pods the ReplicaSet keeps, consolidation can always get there
    // under Karpenter's rule that a set of nodes is replaced by at most one node (all the nodes
    // as one set); it may get lower (two pods stay on a small node, the third moves).
    let p1 = {
        let pool: NodePool = archer::yaml::from_str("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: general}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64]}\n        - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}\n").expect("pool");
        let offers = archer::provisioner::nodepool::offerings(&catalog, &["us-east-1a".into(), "us-east-1b".into(), "us-east-1c".into()]);
        let pods: Vec<_> = (0..3)
            .map(|i| archer::core::packer::PendingPod {
                id: format!("p{i}"),
                requests: archer::core::resources::Resources::new(900, 1 << 30, 1),
                terms: vec![],
                tolerations: vec![],
                platforms: None,
                zone_spread: false,
                per_node_max: None,
                zone_group: None,
                preferred: vec![],
                spread_group: None,
                one_per_zone: false,
                colocate: true,
                spread_keys: Vec::new(),
                extended: Default::default(),
            })
            .collect();
        let plan = archer::core::packer::pack(&pods, &[pool.to_pool().expect("pool")], &offers, &[]);
        assert_eq!(plan.nodes.len(), 1, "one node for the three: {plan:?}");
        plan.total_price_per_hour
    };

    let t0 = Instant::now();
    scale(&client, "shop", "api", 3).await;
    let mut min_running = usize::MAX;
    let deadline = Duration::from_secs(240);
    loop {
        let running = running_pods(&client, "shop", "api").await;
        let ready = running.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
        if t0.elapsed() > Duration::from_secs(3) {
            min_running = min_running.min(ready);
        }
        let nodes = archer_nodes(&client).await;
        let live: Vec<&Node> = nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()).collect();
        let total: f64 = live.iter().map(|n| price(&catalog, n)).sum();
        let settled = ready == 3 && total <= p1 + 1e-9 && claims(&client).await.len() == live.len();
        if settled {
            eprintln!("scenario 4: 10 -> 3 replicas; ${price_at_10:.4}/h -> ${total:.4}/h ({} node(s)) in {:?}", live.len(), t0.elapsed());
            break;
        }
        assert!(t0.elapsed() < deadline, "not consolidated after {deadline:?}: {} node(s) at ${total:.4}/h, target at most ${p1:.4}/h, {ready} pods ready", live.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(min_running >= 2, "the PodDisruptionBudget (minAvailable 2) held: lowest Running count was {min_running}");
    assert!(c.archer_metric("archer_nodes_terminated_total{reason=\"underutilized\"}").await + c.archer_metric("archer_nodes_terminated_total{reason=\"empty\"}").await >= 1.0);
    eprintln!("scenario 4 total: {:?}", started.elapsed());
}

/// A scale-down empties whole nodes: Archer gives each pod its node's deletion cost, so the
/// ReplicaSet deletes the pods of the same nodes (12 pods on three 4-vCPU nodes, 12 -> 4: two
/// nodes emptied, one full), and those nodes go without a single eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scale_down_empties_whole_nodes_by_deletion_cost() {
    let started = Instant::now();
    let off = std::env::var("ARCHER_E2E_NO_DELETION_COST").is_ok();
    let c = Cluster::start_mode("deletion-cost", &[], crate::cluster::Mode::Archer, if off { vec!["podDeletionCost: false".into()] } else { vec![] }).await;
    let client = api_shop(&c, "four", "{key: karpenter.k8s.aws/instance-cpu, operator: In, values: [\"4\"]}").await;
    let d = with_requests(deployment("api", &c.registry.image("apps/api:1"), 12, json!({})), "900m", "1Gi");
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &d).await.expect("create");
    let up = wait_running(&client, "shop", "api", 12, Duration::from_secs(120)).await;
    let mut uids: BTreeSet<String> = up.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    let nodes: BTreeSet<String> = up.iter().map(node_of).collect();
    assert_eq!(nodes.len(), 3, "12 pods of 900m on 4-vCPU nodes: {nodes:?}");
    // Every pod gets its node's cost: one value per node, three values.
    let t = Instant::now();
    let costs = loop {
        let pods = running_pods(&client, "shop", "api").await;
        let costs: BTreeMap<String, BTreeSet<String>> = pods.iter().fold(BTreeMap::new(), |mut m, p| {
            let cost = p.metadata.annotations.as_ref().and_then(|a| a.get("controller.kubernetes.io/pod-deletion-cost")).cloned().unwrap_or_default();
            m.entry(node_of(p)).or_default().insert(cost);
            m
        });
        if off || pods.len() == 12 && costs.values().all(|c| c.len() == 1 && !c.contains("")) {
            break costs;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "deletion costs not written: {costs:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(off || costs.values().collect::<BTreeSet<_>>().len() == 3, "one cost per node: {costs:?}");
    // Written under Archer's one field manager, like every object Archer writes.
    if !off {
        for p in running_pods(&client, "shop", "api").await {
            let cost_by_archer = p.metadata.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some("archer") && f.fields_v1.as_ref().is_some_and(|v| v.0.to_string().contains("controller.kubernetes.io/pod-deletion-cost")));
            assert!(cost_by_archer, "pod {:?}: {:?}", p.metadata.name, p.metadata.managed_fields);
        }
    }
    assert!(off || c.archer_metric("archer_pod_deletion_cost_writes_total{outcome=\"written\"}").await >= 12.0);

    scale(&client, "shop", "api", 4).await;
    let t0 = Instant::now();
    let left = loop {
        let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), "shop").list(&ListParams::default().labels("app=api")).await.map(|l| l.items).unwrap_or_default();
        if pods.len() == 4 {
            break pods;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{} pods after the scale-down", pods.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let on: BTreeSet<String> = left.iter().map(node_of).collect();
    assert_eq!(on.len(), 1, "the 4 pods left share one node: {on:?}");
    // The two emptied nodes go; nothing is evicted on the way.
    loop {
        let pods = running_pods(&client, "shop", "api").await;
        uids.extend(pods.iter().filter_map(|p| p.metadata.uid.clone()));
        let live = archer_nodes(&client).await.into_iter().filter(|n| n.metadata.deletion_timestamp.is_none()).count();
        if live == 1 && pods.len() == 4 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "{live} nodes, {} pods Running", pods.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(uids.len(), 12, "no pod was evicted and made again");
    assert_eq!(c.archer_metric("archer_pod_evictions_total{reason=\"underutilized\"}").await, 0.0);
    eprintln!("deletion cost: 12 -> 4 replicas, 3 -> 1 node with no eviction in {:?} (total {:?})", t0.elapsed(), started.elapsed());
}

/// Scenario 5 (provisioner part) and limits: a pod no pool can run gets an event naming why and
/// no node; a pool's node limit is never exceeded (the pods beyond it get an event too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_5_no_pool_fits_and_limits_hold() {
    let started = Instant::now();
    let c = Cluster::start("scenario-5-provisioner").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/multi", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "edge", json!({})).await;
    pool(
        &client,
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: small}\nspec:\n  limits: {nodes: 1}\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64]}\n        - {key: node.kubernetes.io/instance-type, operator: In, values: [m6i.large]}\n",
    )
    .await;
    let image = c.registry.image("apps/multi:1");
    let api: Api<Deployment> = Api::namespaced(client.clone(), "edge");
    // Wants arm64: the only pool is amd64.
    api.create(&PostParams::default(), &deployment("arm-only", &image, 1, json!({"nodeSelector": {"kubernetes.io/arch": "arm64"}}))).await.expect("create");
    // Needs more than one m6i.large (2 vCPU): the pool may have one node.
    let big = with_requests(deployment("big", &image, 3, json!({})), "1", "1Gi");
    api.create(&PostParams::default(), &big).await.expect("create");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "edge");
    let arm_pod = loop {
        let l = pods.list(&ListParams::default().labels("app=arm-only")).await.expect("list").items;
        if let Some(p) = l.into_iter().next() {
            break p.metadata.name.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    wait("an event on the pod no pool fits", Duration::from_secs(60), || async { pod_events(&client, "edge", &arm_pod).await.iter().any(|(reason, _)| reason == "FailedProvisioning") }).await;
    let events = pod_events(&client, "edge", &arm_pod).await;
    let (_, note) = events.iter().find(|(r, _)| r == "FailedProvisioning").expect("event");
    assert!(note.contains("small") && note.contains("arm64") || note.contains("node selector"), "the event names why: {note}");
    wait_running(&client, "edge", "big", 1, Duration::from_secs(60)).await;
    // Several batches later: still one node, and the pods beyond the limit were told why.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let nodes = archer_nodes(&client).await;
    assert_eq!(nodes.len(), 1, "limits: nodes 1");
    assert!(nodes.iter().all(|n| label(n, "node.kubernetes.io/instance-type") == "m6i.large"));
    assert_eq!(claims(&client).await.len(), 1);
    let pending: BTreeSet<String> = pods
        .list(&ListParams::default().labels("app=big"))
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(!pending.is_empty());
    for p in &pending {
        // A pod whose planned room another pod took is left to kube-scheduler for 10 s after its
        // node came up (model::PLANNED_POD_GRACE) before it is planned again and told why.
        let limited = || async { pod_events(&client, "edge", p).await.iter().any(|(r, n)| r == "FailedProvisioning" && n.contains("limit")) };
        let until = Instant::now() + Duration::from_secs(30);
        while !limited().await && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let ev = pod_events(&client, "edge", p).await;
        assert!(ev.iter().any(|(r, n)| r == "FailedProvisioning" && n.contains("limit")), "pod {p} beyond the limit got an event: {ev:?}");
    }
    // And the re-plan bought nothing either.
    assert_eq!(archer_nodes(&client).await.len(), 1, "limits: still 1 node after the pods beyond it were planned again");
    assert_eq!(claims(&client).await.len(), 1);
    assert!(c.archer_metric("archer_unprovisionable_pods_total").await >= 2.0);
    eprintln!("scenario 5 (provisioner) total: {:?}", started.elapsed());
}

/// A crash between writing the NodeClaim and launching its node: the restarted Archer launches
/// that claim's node, and no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn restart_mid_launch_creates_no_duplicate_node() {
    let mut c = Cluster::start("restart-mid-launch").await;
    let client = c.client().await;
    c.registry.push_image("apps/one", "1", "linux/amd64", true).await;
    namespace(&client, "solo", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    // Restart Archer with the fault hook armed.
    c.stop_archer();
    c.archer_env = vec![("ARCHER_TEST_CRASH_AFTER_CLAIM".into(), "1".into())];
    c.start_archer().await;
    Api::<Deployment>::namespaced(client.clone(), "solo").create(&PostParams::default(), &deployment("one", &c.registry.image("apps/one:1"), 1, json!({}))).await.expect("create");
    let start = Instant::now();
    while c.archer_exit().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "archer did not reach the crash point");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written = claims(&client).await;
    assert_eq!(written.len(), 1, "the claim was written before the crash");
    assert!(archer_nodes(&client).await.is_empty(), "and no node launched");
    c.archer_env.clear();
    c.start_archer().await;
    wait_running(&client, "solo", "one", 1, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let nodes = archer_nodes(&client).await;
    let after = claims(&client).await;
    assert_eq!((nodes.len(), after.len()), (1, 1), "one node, one claim after the restart");
    assert_eq!(nodes[0].metadata.name, written[0].metadata.name, "the node is the claim's");
    assert_eq!(after[0].status.as_ref().and_then(|s| s.node_name.clone()), nodes[0].metadata.name);
}

/// Two replicas: exactly one holds the Lease and provisions; when it stops, the other takes over
/// and provisions; both keep serving the webhook meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn one_replica_provisions_and_another_takes_over() {
    use crate::cluster::metric_at;
    let mut c = Cluster::start("leader-election").await;
    let client = c.client().await;
    c.registry.push_image("apps/one", "1", "linux/amd64", true).await;
    namespace(&client, "ha", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    let (second, second_admin) = c.start_replica("archer-replica").await;
    wait("one leader", Duration::from_secs(30), || async { metric_at(c.archer_admin, "archer_provisioner_leader").await + metric_at(second_admin, "archer_provisioner_leader").await == 1.0 }).await;
    let first_leads = metric_at(c.archer_admin, "archer_provisioner_leader").await;
    let lease: k8s_openapi::api::coordination::v1::Lease = Api::namespaced(client.clone(), "archer-system").get("archer-provisioner").await.expect("the Lease exists");
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert_eq!(holder, if first_leads == 1.0 { "archer" } else { "archer-replica" });

    let api: Api<Deployment> = Api::namespaced(client.clone(), "ha");
    api.create(&PostParams::default(), &deployment("one", &c.registry.image("apps/one:1"), 2, json!({}))).await.expect("create");
    wait_running(&client, "ha", "one", 2, Duration::from_secs(120)).await;
    let launched = metric_at(c.archer_admin, "archer_nodes_launched_total{pool=\"default\"}").await + metric_at(second_admin, "archer_nodes_launched_total{pool=\"default\"}").await;
    let from_leader = metric_at(if first_leads == 1.0 { c.archer_admin } else { second_admin }, "archer_nodes_launched_total{pool=\"default\"}").await;
    assert!(launched >= 1.0 && launched == from_leader, "only the leader launched ({launched} launches, {from_leader} by the leader)");

    // Stop the leader: the other replica takes the Lease and provisions the next pods.
    let survivor_admin = if first_leads == 1.0 {
        c.stop_archer();
        second_admin
    } else {
        drop(second);
        c.archer_admin
    };
    wait("the other replica leads", Duration::from_secs(60), || async { metric_at(survivor_admin, "archer_provisioner_leader").await == 1.0 }).await;
    assert_eq!(metric_at(survivor_admin, "archer_provisioner_leader_candidate").await, 1.0, "it campaigns: the ArcherNoLeader alert can tell no leader from no provisioner");
    let big = with_requests(deployment("two", &c.registry.image("apps/one:1"), 2, json!({})), "3", "2Gi");
    api.create(&PostParams::default(), &big).await.expect("create");
    wait_running(&client, "ha", "two", 2, Duration::from_secs(120)).await;
    assert!(metric_at(survivor_admin, "archer_nodes_launched_total{pool=\"default\"}").await >= 1.0, "the new leader provisioned");

    // Work that stops while its replica holds the lease (a provisioner loop panicked) ends the
    // leader loop with an error, so the process restarts instead of holding the lease idle.
    let metrics = archer::metrics::Metrics::new();
    let ended = tokio::time::timeout(Duration::from_secs(60), archer::cluster::leader::while_leader(client.clone(), "archer-system", "work-ends", Duration::from_secs(3), (&metrics.provisioner.leader, &metrics.provisioner.candidate), || async {})).await;
    assert!(matches!(ended, Ok(Err(archer::cluster::leader::LeaderError::WorkEnded(_)))), "{ended:?}");
    assert_eq!((metrics.provisioner.leader.get(), metrics.provisioner.candidate.get()), (0, 0), "a loop that ended neither leads nor campaigns");
}

/// Plan fidelity: about 200 pods from 8 Deployments that mix zone and hostname spread (maxSkew 1
/// and 2), required anti-affinity to another Deployment, affinity to a Deployment already
/// running, pods with no requests, host ports and a GPU, and pods asking for an extended resource
/// only a NodeOverlay's `capacity` gives (two per arm64 node), on a cluster that already runs
/// pods. Every pod ends Running on the node the plan named for it (or one of the same pool,
/// instance type and zone), no node is left empty, no pod is left Pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn plan_fidelity_two_hundred_pods_land_where_the_plan_put_them() {
    let started = Instant::now();
    let c = Cluster::start("plan-fidelity").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "fidelity", json!({})).await;
    // Consolidation off: what stays is what provisioning bought.
    pool(
        &client,
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand, spot]}\n  disruption:\n    consolidationPolicy: WhenEmpty\n    consolidateAfter: Never\n",
    )
    .await;
    // Two `smarter-devices/fuse` on every arm64 type, as a NodeOverlay says (issue #42): the
    // provisioner's watch has it before any pod comes.
    let overlays = Api::<archer::provisioner::nodeoverlay::NodeOverlay>::all(client.clone());
    let overlay = archer::yaml::from_str("apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: fuse-on-arm64}\nspec:\n  requirements: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]\n  capacity: {smarter-devices/fuse: \"2\"}\n").expect("overlay");
    overlays.create(&PostParams::default(), &overlay).await.expect("create overlay");
    let applied = || async {
        let o = overlays.get("fuse-on-arm64").await.ok();
        o.and_then(|o| o.status).and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "ArcherApplied")).map(|c| (c.reason, c.message))
    };
    wait("the overlay applied", Duration::from_secs(60), || async { applied().await.is_some() }).await;
    let (reason, message) = applied().await.unwrap_or_default();
    assert!(reason == "Applied" && message.contains("sets the capacity of"), "{reason}: {message}");
    let image = c.registry.image("apps/web:1");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "fidelity");
    let create = |d: Deployment| {
        let deploys = deploys.clone();
        async move { deploys.create(&PostParams::default(), &d).await.expect("create") }
    };
    // The cluster already runs pods.
    create(with_requests(deployment("base", &image, 10, json!({})), "500m", "512Mi")).await;
    wait_running(&client, "fidelity", "base", 10, Duration::from_secs(120)).await;

    let spread = |key: &str, skew: i32, app: &str| json!({"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}});
    let term = |key: &str, app: &str| json!([{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]);
    let t0 = Instant::now();
    let mut expected: Vec<(&str, usize)> = Vec::new();
    for (name, replicas, cpu, spec) in [
        ("zonal", 40, "250m", json!({"topologySpreadConstraints": [spread("topology.kubernetes.io/zone", 1, "zonal")]})),
        ("hosts", 30, "200m", json!({"topologySpreadConstraints": [spread("kubernetes.io/hostname", 2, "hosts")]})),
        ("both", 30, "300m", json!({"topologySpreadConstraints": [spread("topology.kubernetes.io/zone", 2, "both"), spread("kubernetes.io/hostname", 1, "both")]})),
        ("db", 10, "500m", json!({})),
        ("web", 20, "100m", json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("kubernetes.io/hostname", "db")}}})),
        ("near-base", 30, "100m", json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("topology.kubernetes.io/zone", "base")}}})),
        ("ports", 10, "100m", json!({})),
    ] {
        let mut d = with_requests(deployment(name, &image, replicas, spec), cpu, "256Mi");
        if name == "ports" {
            if let Some(s) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                s.containers[0].ports = serde_json::from_value(json!([{"containerPort": 8080, "hostPort": 8080}])).ok();
            }
        }
        create(d).await;
        expected.push((name, replicas as usize));
    }
    // No requests at all, and one GPU pod.
    let mut bare = deployment("bare", &image, 20, json!({}));
    if let Some(s) = bare.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        s.containers[0].resources = None;
    }
    create(bare).await;
    expected.push(("bare", 20));
    create(with_requests(deployment("gpu", &image, 1, json!({})), "1", "2Gi").tap_gpu()).await;
    expected.push(("gpu", 1));
    let mut fuse = deployment("fuse", &image, 6, json!({}));
    if let Some(s) = fuse.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        s.containers[0].resources = serde_json::from_value(json!({"requests": {"cpu": "100m", "memory": "128Mi", "smarter-devices/fuse": "1"}, "limits": {"smarter-devices/fuse": "1"}})).ok();
    }
    create(fuse).await;
    expected.push(("fuse", 6));

    let mut all: Vec<Pod> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    for (name, n) in &expected {
        loop {
            let pods = running_pods(&client, "fidelity", name).await;
            if pods.len() >= *n {
                all.extend(pods);
                break;
            }
            if Instant::now() > deadline {
                explain_pending(&client).await;
                panic!("{name}: {} of {n} pods Running after 240 s (see the dump above)", pods.len());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eprintln!("plan fidelity: {} pods Running in {:?}", all.len(), t0.elapsed());
    assert_eq!(all.len(), 197);
    // Batches that bought nodes reported their price over the LP lower bound (1 or more).
    let batches = c.archer_metric("archer_provisioner_plan_cost_ratio_count").await;
    let ratio_sum = c.archer_metric("archer_provisioner_plan_cost_ratio_sum").await;
    eprintln!("plan fidelity: {batches} batch(es) with a lower bound, mean price / bound {:.4}", ratio_sum / batches.max(1.0));
    assert!(batches >= 1.0 && ratio_sum >= batches * (1.0 - 1e-9), "{batches} {ratio_sum}");

    // Where the plans put each pod (the claims record it), against where kube-scheduler bound it.
    let nodes: BTreeMap<String, Node> = archer_nodes(&client).await.into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
    let shape = |n: &Node| (label(n, "archer.dev/nodepool").to_string(), label(n, "node.kubernetes.io/instance-type").to_string(), label(n, "topology.kubernetes.io/zone").to_string());
    let planned = planned_by_claims(&client).await;
    // Pods a batch placed on room already there (a node up, or a claim of an earlier batch):
    // Archer's log names them (`placed on room the cluster already has`).
    let on_room = placed_on_room(&c.logs.join("archer.log"));
    let (mut exact, mut same_shape, mut on_existing) = (0, 0, 0);
    let mut wrong = Vec::new();
    for p in all.iter().filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get("app")).is_some_and(|a| a != "base")) {
        let id = format!("fidelity/{}", p.metadata.name.clone().unwrap_or_default());
        let bound_to = node_of(p);
        match planned.get(&id) {
            Some(n) if *n == bound_to => exact += 1,
            Some(n) if nodes.get(n).zip(nodes.get(&bound_to)).is_some_and(|(a, b)| shape(a) == shape(b)) => same_shape += 1,
            Some(n) => wrong.push(format!("{id}: planned {n} {:?}, bound to {bound_to} {:?}", nodes.get(n).map(shape), nodes.get(&bound_to).map(shape))),
            // Placed on room already there, or bound by kube-scheduler before any batch saw it.
            None => match on_room.get(&id) {
                Some(n) if *n == bound_to || nodes.get(n).zip(nodes.get(&bound_to)).is_some_and(|(a, b)| shape(a) == shape(b)) => on_existing += 1,
                Some(n) => wrong.push(format!("{id}: placed on room of {n}, bound to {bound_to}")),
                None => on_existing += 1,
            },
        }
    }
    eprintln!("plan fidelity: {exact} on their planned node, {same_shape} on one of the same pool/type/zone, {on_existing} on nodes already there, {} elsewhere", wrong.len());
    // No node left empty.
    let pods_per_node: BTreeMap<String, usize> = all.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(node_of(p)).or_default() += 1;
        m
    });
    let empty: Vec<&String> = nodes.keys().filter(|n| !pods_per_node.contains_key(*n)).collect();
    // Measured with pods planned as soon as they are created: none, in every run idle and with
    // both cores busy (before that, up to two under load: pods kube-scheduler had not failed yet
    // were not planned, and took room planned for others).
    eprintln!("plan fidelity: {} of {} nodes left empty", empty.len(), nodes.len());
    assert!(empty.is_empty(), "nodes bought and left empty: {empty:?}");
    // The GPU pod is on a GPU instance.
    let gpu = all.iter().find(|p| p.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str) == Some("gpu")).expect("gpu pod");
    let gpu_node = nodes.get(&node_of(gpu)).expect("on an Archer node");
    let catalog = Catalog::embedded().expect("catalog");
    assert!(catalog.types().iter().any(|t| t.name == label(gpu_node, "node.kubernetes.io/instance-type") && t.gpu_count > 0));
    // The fuse pods are on arm64 nodes that advertise the overlay's two devices, two at most each.
    let mut fuse_per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in all.iter().filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str) == Some("fuse")) {
        *fuse_per_node.entry(node_of(p)).or_default() += 1;
    }
    for (name, n) in &fuse_per_node {
        let node = nodes.get(name).expect("on an Archer node");
        let fuse = node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get("smarter-devices/fuse")).map(|q| q.0.clone());
        assert_eq!((label(node, "kubernetes.io/arch"), fuse.as_deref()), ("arm64", Some("2")), "{name}");
        assert!(*n <= 2, "{name} runs {n} fuse pods");
    }
    // Every pod a plan placed where it put it (or on a node of the same pool, type and zone).
    let followed = exact + same_shape;
    eprintln!("plan fidelity: {followed} of {} pods planned onto new nodes followed the plan ({:.1}%)", followed + wrong.len(), 100.0 * followed as f64 / (followed + wrong.len()).max(1) as f64);
    assert!(wrong.is_empty(), "pods not where the plan put them:\n{}", wrong.join("\n"));
    eprintln!("plan fidelity total: {:?}", started.elapsed());
}

/// Preferences on the real control plane: 6 replicas that prefer a zone of their own (preferred
/// zone anti-affinity) and an even zone spread (ScheduleAnyway). The planner honours both while it
/// can (one node in each of the 3 zones for the first 3) and then relaxes the anti-affinity, not
/// the spread (Karpenter's order), for the other 3: 3 nodes, zones 2/2/2, every pod on the node
/// its plan named, none left empty. With its required rules alone the group fits one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn preferences_are_honoured_until_they_cannot_be() {
    let started = Instant::now();
    let c = Cluster::start("preferences").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "prefs", json!({})).await;
    pool(
        &client,
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n  disruption:\n    consolidationPolicy: WhenEmpty\n    consolidateAfter: Never\n",
    )
    .await;
    let spec = json!({
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "pref"}}}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "pref"}}}}]}}
    });
    let d = with_requests(deployment("pref", &c.registry.image("apps/web:1"), 6, spec), "200m", "128Mi");
    let t0 = Instant::now();
    Api::<Deployment>::namespaced(client.clone(), "prefs").create(&PostParams::default(), &d).await.expect("create");
    let pods = wait_running(&client, "prefs", "pref", 6, Duration::from_secs(120)).await;
    eprintln!("preferences: 6 pods Running in {:?}", t0.elapsed());

    let nodes: BTreeMap<String, Node> = archer_nodes(&client).await.into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pods {
        let n = nodes.get(&node_of(p)).expect("on an Archer node");
        *per_node.entry(node_of(p)).or_default() += 1;
        *per_zone.entry(label(n, "topology.kubernetes.io/zone").to_string()).or_default() += 1;
    }
    eprintln!("preferences: pods per node {per_node:?}, per zone {per_zone:?}");
    assert_eq!(nodes.len(), 3, "a node per zone: {per_node:?}");
    assert_eq!(per_node.len(), 3, "no node left empty: {per_node:?}");
    assert_eq!(per_zone.values().copied().collect::<Vec<_>>(), [2, 2, 2], "the spread preference kept: {per_zone:?}");
    // Each pod where the plan put it.
    let planned = planned_by_claims(&client).await;
    for p in &pods {
        let id = format!("prefs/{}", p.metadata.name.clone().unwrap_or_default());
        assert_eq!(planned.get(&id), Some(&node_of(p)), "{id} planned on {:?}", planned.get(&id));
    }
    eprintln!("preferences total: {:?}", started.elapsed());
}

/// `namespace/name` -> the node of the claim whose plan put the pod there (the claims record it);
/// a pod planned again by a later batch follows the later plan (claims in the order written).
async fn planned_by_claims(client: &Client) -> BTreeMap<String, String> {
    let mut planned = BTreeMap::new();
    let mut written = claims(client).await;
    written.sort_by_key(|c| c.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0));
    for claim in written {
        let node = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let pods = claim.metadata.annotations.as_ref().and_then(|a| a.get(archer::core::labels::PLANNED_PODS_ANNOTATION)).cloned().unwrap_or_default();
        for p in pods.split(',').filter(|p| !p.is_empty()) {
            planned.insert(p.to_string(), node.clone());
        }
    }
    planned
}

/// `namespace/name` -> node for each pod Archer's log says a batch placed on room the cluster
/// already had (the last such line per pod).
fn placed_on_room(log: &std::path::Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("placed on room the cluster already has")) {
        let plain = strip_ansi(line);
        let field = |key: &str| plain.split_whitespace().find_map(|w| w.strip_prefix(key)).map(|v| v.trim_matches('"').to_string());
        if let (Some(pod), Some(node)) = (field("pod="), field("node=")) {
            out.insert(pod, node);
        }
    }
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// When pods stay Pending: each one's scheduler message, and every node's allocatable against
/// the requests of the pods bound to it, as the API server has them (to set against the
/// provisioner's `placed on room the cluster already has` log lines).
pub(crate) async fn explain_pending(client: &Client) {
    let pods = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let q = |v: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>, f: fn(&str) -> Option<i64>| v.and_then(|q| f(&q.0)).unwrap_or(0);
    let mut used: BTreeMap<String, (i64, i64, usize, Vec<String>)> = BTreeMap::new();
    for p in &pods {
        let id = format!("{}/{}", p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        let node = node_of(p);
        if node.is_empty() {
            let msg = p.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled")).and_then(|c| c.message.clone()).unwrap_or_default();
            eprintln!("pending {id}: {msg}");
            continue;
        }
        let e = used.entry(node).or_default();
        for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
            let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            e.0 += q(r.and_then(|r| r.get("cpu")), archer::core::quantity::cpu_millis);
            e.1 += q(r.and_then(|r| r.get("memory")), archer::core::quantity::value);
        }
        e.2 += 1;
        e.3.push(format!("{}{}", if p.metadata.deletion_timestamp.is_some() { "(terminating)" } else { "" }, p.metadata.name.clone().unwrap_or_default()));
    }
    for n in Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        let name = n.metadata.name.clone().unwrap_or_default();
        let alloc = n.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
        let (cpu, mem, count, on) = used.get(&name).cloned().unwrap_or_default();
        let taints: Vec<String> = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().into_iter().map(|t| t.key).collect();
        eprintln!(
            "node {name} zone {} cpu {cpu}/{} memory {}Mi/{}Mi pods {count} taints {taints:?}: {}",
            label(&n, "topology.kubernetes.io/zone"),
            q(alloc.get("cpu"), archer::core::quantity::cpu_millis),
            mem >> 20,
            q(alloc.get("memory"), archer::core::quantity::value) >> 20,
            on.join(" ")
        );
    }
}

trait GpuRequest {
    fn tap_gpu(self) -> Self;
}

impl GpuRequest for Deployment {
    /// The Deployment's container asks for one `nvidia.com/gpu` (request and limit).
    fn tap_gpu(mut self) -> Self {
        if let Some(c) = self.spec.as_mut().and_then(|s| s.template.spec.as_mut()).map(|s| &mut s.containers[0]) {
            c.resources = serde_json::from_value(json!({"requests": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})).ok();
        }
        self
    }
}

/// The launch cap is a safety valve: with `maxLaunchesPerMinute: 6`, a burst needing 9 nodes
/// (hostname anti-affinity between the replicas) gets 6 at once, the other 3 are deferred and
/// counted, and come as the cap refills (one per 10 s); every pod ends Running, one claim each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn launch_cap_defers_the_rest_of_a_burst() {
    let mut c = Cluster::start("launch-cap").await;
    let client = c.client().await;
    c.registry.push_image("apps/one", "1", "linux/amd64", true).await;
    namespace(&client, "capped", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    c.stop_archer();
    c.provisioner_config = vec!["maxLaunchesPerMinute: 6".into()];
    c.start_archer().await;
    let apart = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "one"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    Api::<Deployment>::namespaced(client.clone(), "capped").create(&PostParams::default(), &deployment("one", &c.registry.image("apps/one:1"), 9, apart)).await.expect("create");
    wait("the first claims", Duration::from_secs(60), || async { !claims(&client).await.is_empty() }).await;
    // Within the next 5 s (before the cap refills one launch) no more than 6 claims.
    let t0 = Instant::now();
    let mut most = 0;
    while t0.elapsed() < Duration::from_secs(5) {
        most = most.max(claims(&client).await.len());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(most, 6, "the burst is cut at the cap");
    assert!(c.archer_metric("archer_launches_rate_limited_total").await >= 3.0, "the deferred launches are counted");
    wait_running(&client, "capped", "one", 9, Duration::from_secs(120)).await;
    assert_eq!(claims(&client).await.len(), 9, "one claim per pod, the deferred ones launched later");
    eprintln!("launch cap: 6 at once, 9 Running after {:?}", t0.elapsed());
}

/// The sum of every sample of one metric family in Archer's `/metrics`.
pub(crate) async fn metric_sum(c: &Cluster, family: &str) -> f64 {
    let body = reqwest::get(format!("http://127.0.0.1:{}/metrics", c.archer_admin)).await.map(|r| r.text()).expect("metrics");
    body.await.unwrap_or_default().lines().filter(|l| l.starts_with(family) && (l.as_bytes().get(family.len()) == Some(&b'{') || l.as_bytes().get(family.len()) == Some(&b' '))).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() + 0.0
}

/// A cluster with Archer's webhook, the multi-arch image `apps/web:1` in the registry, the
/// namespace `shop` and the default pool.
async fn shop(test: &str) -> (Cluster, Client) {
    let c = Cluster::start(test).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "shop", json!({})).await;
    pool(&client, DEFAULT_POOL).await;
    (c, client)
}

/// A Deployment `name` in `shop` of the registry's `image`, with these cpu and memory requests.
async fn web(c: &Cluster, client: &Client, name: &str, image: &str, replicas: i32, (cpu, memory): (&str, &str)) {
    let d = with_requests(deployment(name, &c.registry.image(image), replicas, json!({})), cpu, memory);
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &d).await.expect("create");
}

/// The cost and savings metrics of a live cluster: the managed nodes' cost is their offerings'
/// prices, and the savings against amd64 on-demand are what `archer simulate --compare` says for
/// the same pods and pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn cost_and_savings_metrics_match_simulate_compare() {
    let (mut c, client) = shop("savings").await;
    // Recomputed every 2 s here (60 s by default; the other scenarios keep the default).
    c.stop_archer();
    c.provisioner_config = vec!["costIntervalSeconds: 2".into()];
    c.start_archer().await;
    web(&c, &client, "web", "apps/web:1", 5, ("1", "2Gi")).await;
    let pods = wait_running(&client, "shop", "web", 5, Duration::from_secs(120)).await;
    let catalog = Catalog::embedded().expect("catalog");

    // The gauges follow the cluster within costIntervalSeconds (2 s here).
    let metrics = || async {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", c.archer_admin)).await.expect("metrics").text().await.expect("text");
        let sum = |name: &str| text.lines().filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>();
        let one = |sample: &str| text.lines().find_map(|l| l.strip_prefix(sample).and_then(|r| r.trim().parse::<f64>().ok()));
        (sum("archer_managed_nodes"), sum("archer_nodes_cost_per_hour_dollars"), one("archer_savings_per_hour_dollars{source=\"arm64\"}"), one("archer_savings_per_hour_dollars{source=\"spot\"}"), one("archer_baseline_cost_per_hour_dollars"))
    };
    // The same pods, pending, and the same pool, planned offline.
    let mut docs = vec![serde_json::to_string(&archer::yaml::from_str::<serde_json::Value>(DEFAULT_POOL).expect("pool")).expect("json")];
    for p in &pods {
        let mut pod = serde_json::to_value(p).expect("pod");
        pod["metadata"] = json!({"name": p.metadata.name, "namespace": "shop", "labels": p.metadata.labels, "annotations": p.metadata.annotations});
        pod["spec"].as_object_mut().expect("spec").remove("nodeName");
        pod.as_object_mut().expect("pod").remove("status");
        docs.push(serde_json::to_string(&pod).expect("json"));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(&scenario, docs.join("\n---\n")).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["simulate", "--compare", "--offline", "--output", "json", "--scenario"])
        .arg(&scenario)
        .output()
        .expect("simulate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let compare = &plan["compare"];
    assert_eq!(compare["leftOut"], json!([]), "{compare}");
    let want = |field: &str| compare[field].as_f64().unwrap_or_else(|| panic!("{field} in {compare}"));
    let (arm, spot, baseline) = (want("savingsPerHour"), want("spotSavingsPerHour"), want("baselinePerHour"));
    assert!(baseline > 0.0 && arm + spot > 0.0, "multi-arch pods on a spot-allowing pool save something: {compare}");

    // The gauges catch up with the cluster within costIntervalSeconds: node count and
    // cost those of the nodes now (consolidation may still be at work), savings simulate's.
    let started = Instant::now();
    loop {
        let m = metrics().await;
        let nodes = archer_nodes(&client).await;
        let expected_cost: f64 = nodes.iter().map(|n| price(&catalog, n)).sum();
        let close = |metric: Option<f64>, want: f64| metric.is_some_and(|m| (m - want).abs() < 1e-5);
        if m.0 == nodes.len() as f64 && (m.1 - expected_cost).abs() < 1e-6 && close(m.2, arm) && close(m.3, spot) && close(m.4, baseline) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "metrics (nodes, cost, arm64, spot, baseline) {m:?}; expected {} nodes at {expected_cost}/h and simulate's {arm}, {spot}, {baseline}",
            nodes.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Pods the claims were launched for were timed from creation to Ready (looked for every
    // 2 s here, so the count may trail the pods' readiness by that much).
    wait("5 pod startups observed", Duration::from_secs(15), || async { c.archer_metric("archer_provisioned_pod_startup_duration_seconds_count").await >= 5.0 }).await;
}

/// `kubectl get` through the real API server: NodeClaim conditions and NodePool status with
/// their printer columns (the Table the API server renders from the CRDs), and Events on claims
/// and pools for launches, registration and disruption with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn claims_and_pools_show_status_columns_and_events() {
    let (c, client) = shop("status").await;
    web(&c, &client, "web", "apps/web:1", 3, ("1", "2Gi")).await;
    wait_running(&client, "shop", "web", 3, Duration::from_secs(120)).await;

    let ready = |cs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], t: &str| cs.iter().any(|x| x.type_ == t && x.status == "True");
    wait("every claim Launched, Registered, Initialized and Ready", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let cs = claims(&client).await;
            !cs.is_empty() && cs.iter().all(|cl| {
                let conds = cl.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
                ["Launched", "Registered", "Initialized", "Ready"].iter().all(|t| ready(&conds, t))
            })
        }
    })
    .await;
    let n_claims = claims(&client).await.len() as i64;
    wait("the pool's status counts its nodes", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let p = Api::<NodePool>::all(client).get("default").await.expect("pool");
            p.status.is_some_and(|s| s.nodes == n_claims && s.resources.get("nodes") == Some(&n_claims.to_string()) && s.conditions.iter().any(|x| x.type_ == "Ready" && x.status == "True"))
        }
    })
    .await;

    // Status is written by server-side apply under Archer's one field manager: the claims'
    // (their launch and their conditions) and the pool's.
    let applied_status = |m: &kube::api::ObjectMeta| {
        m.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some("archer") && f.operation.as_deref() == Some("Apply") && f.subresource.as_deref() == Some("status"))
            && !m.managed_fields.iter().flatten().any(|f| f.subresource.as_deref() == Some("status") && f.operation.as_deref() == Some("Update"))
    };
    for cl in claims(&client).await {
        assert!(applied_status(&cl.metadata), "claim {:?}: {:?}", cl.metadata.name, cl.metadata.managed_fields);
        let created_by_archer = cl.metadata.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some("archer") && f.subresource.is_none());
        assert!(created_by_archer, "claim {:?} is created under the field manager archer: {:?}", cl.metadata.name, cl.metadata.managed_fields);
        assert!(cl.status.as_ref().is_some_and(|s| s.provider_id.is_some() && s.launched_at.is_some()), "the launch's fields survive the conditions' writes: {:?}", cl.status);
    }
    let pool = Api::<NodePool>::all(client.clone()).get("default").await.expect("pool");
    assert!(applied_status(&pool.metadata), "pool: {:?}", pool.metadata.managed_fields);

    // The Table kubectl prints.
    let table = |plural: &'static str| {
        let client = client.clone();
        async move {
            let req = http::Request::get(format!("/apis/archer.dev/v1alpha1/{plural}")).header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").body(Vec::new()).expect("request");
            client.request::<serde_json::Value>(req).await.expect("table")
        }
    };
    let t = table("archernodeclaims").await;
    let columns: Vec<&str> = t["columnDefinitions"].as_array().expect("columns").iter().filter_map(|c| c["name"].as_str()).collect();
    for want in ["Name", "Pool", "Type", "Zone", "Capacity", "Node", "Ready", "Age"] {
        assert!(columns.contains(&want), "nodeclaims columns {columns:?} lack {want}");
    }
    let ready_at = columns.iter().position(|c| *c == "Ready").expect("Ready");
    assert!(t["rows"].as_array().expect("rows").iter().all(|r| r["cells"][ready_at] == "True"), "{t}");
    let t = table("archernodepools").await;
    let columns: Vec<&str> = t["columnDefinitions"].as_array().expect("columns").iter().filter_map(|c| c["name"].as_str()).collect();
    for want in ["Name", "Nodes", "CPU", "Memory", "Ready", "Age"] {
        assert!(columns.contains(&want), "nodepools columns {columns:?} lack {want}");
    }
    let nodes_at = columns.iter().position(|c| *c == "Nodes").expect("Nodes");
    assert_eq!(t["rows"][0]["cells"][nodes_at].as_i64(), Some(n_claims), "{t}");

    // Events: launches and registrations on the claims; then, scaled to zero, the disruption
    // and its reason on the claims and the pool.
    let events = || {
        let client = client.clone();
        async move {
            Api::<k8s_openapi::api::events::v1::Event>::all(client)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.regarding.as_ref().and_then(|r| r.kind.clone()).unwrap_or_default(), e.reason.unwrap_or_default()))
                .collect::<BTreeSet<(String, String)>>()
        }
    };
    let seen = events().await;
    for reason in ["Launched", "Registered", "Initialized"] {
        assert!(seen.contains(&("NodeClaim".to_string(), reason.to_string())), "no {reason} Event on a NodeClaim: {seen:?}");
    }
    assert!(seen.contains(&("NodePool".to_string(), "Launching".to_string())), "no Launching Event on the NodePool: {seen:?}");
    scale(&client, "shop", "web", 0).await;
    wait("an Empty disruption Event on the claim and the pool", Duration::from_secs(60), || {
        async move {
            let seen = events().await;
            seen.contains(&("NodeClaim".to_string(), "Empty".to_string())) && seen.contains(&("NodePool".to_string(), "Empty".to_string()))
        }
    })
    .await;
}

/// `archer report` against the live e2e cluster: images from the test registry, one multi-arch
/// (its pods land on arm64), one amd64-only (blocked, and misplaced where a pod was bound to an
/// arm64 node by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn archer_report_reads_the_live_cluster() {
    let (c, client) = shop("report").await;
    c.registry.push_image("apps/legacy", "1", "linux/amd64", true).await;
    for (name, image) in [("web", "apps/web:1"), ("legacy", "apps/legacy:1")] {
        web(&c, &client, name, image, 2, ("500m", "1Gi")).await;
    }
    wait_running(&client, "shop", "web", 2, Duration::from_secs(120)).await;
    wait_running(&client, "shop", "legacy", 2, Duration::from_secs(120)).await;
    let arm_node = archer_nodes(&client).await.into_iter().find(|n| label(n, "kubernetes.io/arch") == "arm64").and_then(|n| n.metadata.name).expect("an arm64 node for the multi-arch pods");
    // Bound by hand, past the webhook and the scheduler: an amd64-only image on arm64.
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "namespace": "shop", "labels": {"archer.dev/ignore": "true"}},
        "spec": {"nodeName": arm_node, "tolerations": [{"operator": "Exists"}], "containers": [{"name": "c", "image": c.registry.image("apps/legacy:1")}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), "shop").create(&PostParams::default(), &stray).await.expect("stray pod");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["report", "--output", "json", "--insecure-registry", &c.registry.host, "--kubeconfig"])
        .arg(&c.kubeconfig)
        .output()
        .expect("archer report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let w = |name: &str| r["workloads"].as_array().expect("workloads").iter().find(|w| w["name"] == name).cloned().unwrap_or_else(|| panic!("no {name}: {r}"));
    // The multi-arch pods go where the plan put them: any on amd64 (sharing a node with the
    // amd64-only pods can be cheapest) make the workload movable, with its saving.
    let web = w("web");
    let expected = if web["architectures"]["amd64"].as_u64().unwrap_or(0) > 0 { "movable" } else { "on-arm64" };
    assert_eq!((web["kind"].as_str(), web["readiness"].as_str()), (Some("Deployment"), Some(expected)), "{r}");
    assert_eq!(web["savingPerMonth"].is_number(), expected == "movable", "{r}");
    assert_eq!(w("legacy")["readiness"], "blocked");
    assert_eq!(w("legacy")["blockedBy"][0]["platforms"], json!(["linux/amd64"]));
    assert!(w("legacy")["architectures"]["amd64"].as_u64() == Some(2), "{r}");
    assert_eq!(r["misplaced"][0]["pod"], "shop/stray", "{r}");
    assert!(r["summary"]["costPerMonth"].as_f64().is_some_and(|c| c > 0.0));
    assert_eq!(r["summary"]["nodes"].as_u64(), Some(archer_nodes(&client).await.len() as u64));
}

/// AKS node auto-provisioning's arm64 module on the real control plane, kwok standing in for
/// Azure VMs (there is no Azure VM provider yet): its NodePool ported by changing its apiVersion
/// to Archer's (and without its cilium startup taint: no cilium runs here to lift it), an
/// AKSNodeClass, and the `inflate` Deployment. All 4 pods run on arm64 D-family sizes of at most 4
/// vCPU in eastus's zones, and the nodes carry the labels Karpenter on Azure writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn the_aks_arm64_module_runs_on_arm64_d_series_with_azures_labels() {
    let c = Cluster::start_mode("aks-module", &[], crate::cluster::Mode::Archer, vec!["zones: [eastus-1, eastus-2, eastus-3]".into()]).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("oss/kubernetes/pause", "3.6", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "workshop", json!({})).await;
    let class: archer::provisioner::cloud::azure::nodeclass::AKSNodeClass =
        serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": {"imageFamily": "Ubuntu2204", "osDiskSizeGB": 100}})).expect("class");
    Api::all(client.clone()).create(&PostParams::default(), &class).await.expect("create class");
    apply_aks_module(&client, &c, json!(null)).await;
    let pods = wait_running(&client, "workshop", "inflate", 4, Duration::from_secs(120)).await;
    let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
    let all = archer_nodes(&client).await;
    for name in &nodes {
        let n = all.iter().find(|n| n.metadata.name.as_ref() == Some(name)).expect("an Archer node");
        let get = |k: &str| label(n, k).to_string();
        assert_eq!(get("kubernetes.io/arch"), "arm64");
        assert!(get("node.kubernetes.io/instance-type").starts_with("Standard_D"), "{}", get("node.kubernetes.io/instance-type"));
        assert_eq!(get("karpenter.azure.com/sku-family"), "D");
        assert!(get("karpenter.azure.com/sku-cpu").parse::<u32>().is_ok_and(|c| c <= 4));
        assert_eq!(get("kubernetes.azure.com/sku-cpu"), get("karpenter.azure.com/sku-cpu"));
        assert!(get("karpenter.azure.com/sku-series").starts_with("Dp"), "an arm64 series");
        assert!(["5", "6"].contains(&get("karpenter.azure.com/sku-version").as_str()));
        assert!(get("karpenter.azure.com/sku-memory").parse::<u64>().is_ok());
        assert_eq!(get("karpenter.azure.com/sku-networking-accelerated"), "true");
        assert_eq!(get("karpenter.azure.com/sku-storage-premium-capable"), "true");
        assert_eq!(get("kubernetes.azure.com/scalesetpriority"), "regular");
        assert!(get("topology.kubernetes.io/zone").starts_with("eastus-"));
        assert_eq!(get("topology.kubernetes.io/region"), "eastus");
        assert_eq!(get("aks-karpenter"), "demo");
        assert!(!n.metadata.labels.as_ref().expect("labels").keys().any(|k| k.starts_with("karpenter.k8s.aws/")));
    }
    let cost: f64 = nodes.iter().map(|n| all.iter().find(|x| x.metadata.name.as_ref() == Some(n)).map(|x| label(x, "node.kubernetes.io/instance-type").to_string()).unwrap_or_default()).map(|t| archer::catalog::Catalog::embedded().expect("catalog").price(&t, Some("eastus"), archer::catalog::CapacityType::OnDemand).expect("priced")).sum();
    assert!((cost - 0.186).abs() < 1e-9, "the plan simulate makes: D4pls_v6 + D2pls_v6 ({cost})");
}

/// The AKS arm64 module's NodePool (ported to Archer's by its apiVersion, naming the AKSNodeClass
/// `default`, without cilium's startup taint: no cilium runs here to lift it; `disruption` replaced
/// when given) and its `inflate` Deployment in `workshop`, its image from the test registry.
pub(crate) async fn apply_aks_module(client: &Client, c: &Cluster, disruption: serde_json::Value) {
    let text = std::fs::read_to_string(format!("{}/examples/aks-arm64.yaml", env!("CARGO_MANIFEST_DIR"))).expect("example");
    for mut doc in archer::yaml::from_multiple::<serde_json::Value>(&text).expect("yaml") {
        match doc["kind"].as_str() {
            Some("NodePool") => {
                doc["apiVersion"] = json!("archer.dev/v1alpha1");
                doc["spec"]["template"]["spec"]["nodeClassRef"] = json!({"group": "archer.dev", "kind": "AKSNodeClass", "name": "default"});
                if let Some(spec) = doc["spec"]["template"]["spec"].as_object_mut() {
                    spec.remove("startupTaints");
                }
                if !disruption.is_null() {
                    doc["spec"]["disruption"] = disruption.clone();
                }
                let p: NodePool = serde_json::from_value(doc).expect("pool");
                Api::<NodePool>::all(client.clone()).create(&PostParams::default(), &p).await.expect("create pool");
            }
            Some("Deployment") => {
                doc["spec"]["template"]["spec"]["containers"][0]["image"] = json!(c.registry.image("oss/kubernetes/pause:3.6"));
                let d: Deployment = serde_json::from_value(doc).expect("deployment");
                Api::<Deployment>::namespaced(client.clone(), "workshop").create(&PostParams::default(), &d).await.expect("create deployment");
            }
            _ => {}
        }
    }
}

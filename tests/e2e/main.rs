//! End-to-end scenarios on a real control plane (see cluster.rs). Run with `tests/e2e/run`,
//! which builds the components and runs these ignored tests one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

#[path = "../common/mod.rs"]
mod common;
mod aws;
mod azure;
mod cluster;
mod compare;
mod crd_migration;
mod gate_policy;
mod helm;
mod installed;
mod karpenter;
mod managed_tls;
mod multi_tenant;
mod node;
mod private_registries;
mod provisioning;
mod safety_net;
mod scale;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use cluster::Cluster;
use common::node_json;

/// Namespace `name`, made when the control plane does not have it yet (no default service
/// account is waited for: for Archer's own objects, not for pods).
async fn ensure_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await.expect("namespaces").is_none() {
        namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns")).await.expect("namespace");
    }
}

async fn namespace(client: &Client, name: &str, annotations: serde_json::Value) {
    let ns: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": annotations}})).expect("ns");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create namespace");
    // kube-controller-manager creates the default service account pods need.
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait("default service account", Duration::from_secs(60), || async { sa.get_opt("default").await.ok().flatten().is_some() }).await;
}

async fn wait<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// A kwok-managed node of a catalog instance type (arm64 nodes carry the arch taint).
async fn node(client: &Client, name: &str, instance_type: &str, zone: &str, capacity: &str) {
    let mut n = node_json(name, instance_type, zone, capacity);
    n["metadata"]["labels"]["type"] = json!("kwok");
    n["metadata"]["annotations"]["kwok.x-k8s.io/node"] = json!("fake");
    if let Some(m) = n["metadata"].as_object_mut() {
        for k in ["uid", "resourceVersion", "creationTimestamp"] {
            m.remove(k);
        }
    }
    let node: Node = serde_json::from_value(n).expect("node");
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("create node");
}

async fn nodes_ready(client: &Client, count: usize) {
    let api: Api<Node> = Api::all(client.clone());
    wait("nodes Ready and untainted by not-ready", Duration::from_secs(90), || async {
        let list = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        list.len() >= count
            && list.iter().all(|n| {
                let ready = n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let not_ready_taint = n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
                ready && !not_ready_taint
            })
    })
    .await;
}

fn deployment(name: &str, image: &str, replicas: i32, extra_spec: serde_json::Value) -> Deployment {
    let mut spec = json!({"containers": [{"name": "app", "image": image, "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}}}], "terminationGracePeriodSeconds": 0});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}
    }))
    .expect("deployment")
}

async fn running_pods(client: &Client, ns: &str, app: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("app={app}"))).await.map(|l| l.items).unwrap_or_default().into_iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).collect()
}

async fn wait_running(client: &Client, ns: &str, app: &str, n: usize, timeout: Duration) -> Vec<Pod> {
    let start = Instant::now();
    loop {
        let pods = running_pods(client, ns, app).await;
        if pods.len() >= n {
            return pods;
        }
        assert!(start.elapsed() < timeout, "{app}: {} of {n} pods Running after {timeout:?}", pods.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn node_arch(client: &Client, node: &str) -> String {
    let n = Api::<Node>::all(client.clone()).get(node).await.expect("node");
    n.metadata.labels.and_then(|l| l.get("kubernetes.io/arch").cloned()).unwrap_or_default()
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// Scenario 3: an amd64-only image and a multi-arch image, neither constraining the architecture,
/// in a namespace that prefers arm64, with the arm64 nodes tainted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_3_images_decide_the_architecture() {
    let started = Instant::now();
    let c = Cluster::start("scenario-3").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_image("apps/amd64-only", "1", "linux/amd64", false).await;
    c.registry.push_index("apps/multi", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "shop", json!({"archer.dev/prefer": "arm64,amd64"})).await;
    for (name, t, zone) in [("amd-a", "m6i.large", "us-east-1a"), ("amd-b", "m6i.large", "us-east-1b"), ("arm-a", "m7g.large", "us-east-1a"), ("arm-b", "m7g.large", "us-east-1b")] {
        node(&client, name, t, zone, "on-demand").await;
    }
    nodes_ready(&client, 4).await;

    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    let t0 = Instant::now();
    deploys.create(&PostParams::default(), &deployment("amd64-only", &c.registry.image("apps/amd64-only:1"), 2, json!({}))).await.expect("create");
    deploys.create(&PostParams::default(), &deployment("multi", &c.registry.image("apps/multi:1"), 2, json!({}))).await.expect("create");
    let amd = wait_running(&client, "shop", "amd64-only", 2, Duration::from_secs(120)).await;
    let multi = wait_running(&client, "shop", "multi", 2, Duration::from_secs(120)).await;
    eprintln!("scenario 3: create -> 4 pods Running in {:?}", t0.elapsed());

    for p in &amd {
        assert_eq!(annotation(p, "archer.dev/platforms"), Some("linux/amd64"), "the webhook's patch is on the stored pod");
        let terms = p.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref()).map(|r| r.node_selector_terms.clone()).expect("required affinity");
        assert!(terms[0].match_expressions.iter().flatten().any(|e| e.key == "kubernetes.io/arch" && e.values.as_deref() == Some(&["amd64".to_string()][..])));
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled");
        assert_eq!(node_arch(&client, &node).await, "amd64", "amd64-only pod {} on {node}", p.metadata.name.as_deref().unwrap_or(""));
    }
    for p in &multi {
        assert_eq!(annotation(p, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"));
        assert!(p.spec.as_ref().and_then(|s| s.tolerations.as_ref()).is_some_and(|t| t.iter().any(|t| t.key.as_deref() == Some("kubernetes.io/arch"))));
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled");
        assert_eq!(node_arch(&client, &node).await, "arm64", "multi-arch pod {} on {node}", p.metadata.name.as_deref().unwrap_or(""));
    }
    eprintln!("scenario 3 total: {:?}", started.elapsed());
}

/// A running pod's own preferred pod affinity toward the incoming pod decides where
/// kube-scheduler binds it among nodes with room (InterPodAffinity scores it), and
/// `archer simulate` on a dump of that cluster places the pod on the same node. Two nodes alike
/// in type, zone and price; `cache` runs on the second and prefers `web` beside it, so the first
/// node, which would otherwise come first and has more room, is not chosen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn a_running_pods_preference_draws_the_pod_and_simulate_agrees_with_kube_scheduler() {
    let c = Cluster::start("symmetry").await;
    let client = c.client().await;
    namespace(&client, "shop", json!({})).await;
    for name in ["node-a", "node-b"] {
        node(&client, name, "m6i.large", "us-east-1a", "on-demand").await;
    }
    nodes_ready(&client, 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let near = json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}}]}});
    let cache: Pod = serde_json::from_value(json!({"metadata": {"name": "cache", "labels": {"app": "cache"}}, "spec": {"nodeName": "node-b", "affinity": near,
        "containers": [{"name": "c", "image": "cache", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}})).expect("pod");
    pods.create(&PostParams::default(), &cache).await.expect("create cache");
    let web = |name: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {"containers": [{"name": "w", "image": "web", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}})).expect("pod")
    };
    pods.create(&PostParams::default(), &web("web-0")).await.expect("create web");
    let bound = wait_running(&client, "shop", "web", 1, Duration::from_secs(60)).await;
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    assert_eq!(node_of(&bound[0]), "node-b", "kube-scheduler scores node-b for cache's preference");

    // The cluster as `kubectl get nodes,pods -A -o yaml` shows it, with one more web pod pending.
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.expect("nodes").items;
    let running = pods.list(&ListParams::default()).await.expect("pods").items;
    let mut items: Vec<serde_json::Value> = nodes.iter().map(|n| json!(n)).chain(running.iter().map(|p| json!(p))).collect();
    items.iter_mut().for_each(|o| {
        o["apiVersion"] = json!("v1");
        o["kind"] = json!(if o["spec"].get("containers").is_some() { "Pod" } else { "Node" });
    });
    let mut pending = json!(web("web-1"));
    pending["metadata"]["namespace"] = json!("shop");
    pending["apiVersion"] = json!("v1");
    pending["kind"] = json!("Pod");
    items.push(pending);
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("dump.yaml");
    std::fs::write(&dump, serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items})).expect("json")).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(["simulate", "--offline", "--output", "json", "--scenario"]).arg(&dump).output().expect("simulate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(plan["existing"], json!([{"node": "node-b", "pods": ["shop/web-1"]}]), "{plan}");
    // And kube-scheduler puts that pod there too.
    pods.create(&PostParams::default(), &web("web-1")).await.expect("create web-1");
    wait("web-1 bound", Duration::from_secs(60), || async { pods.get("web-1").await.ok().is_some_and(|p| !node_of(&p).is_empty()) }).await;
    assert_eq!(node_of(&pods.get("web-1").await.expect("web-1")), "node-b");
}

/// Scenario 5 (webhook and extender parts): with the webhook down the extender keeps amd64-only
/// pods off arm64; with the extender down scheduling goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn scenario_5_safety_nets() {
    let started = Instant::now();
    let mut c = Cluster::start("scenario-5").await;
    // The webhook is registered at a port where nothing listens: failurePolicy Ignore lets pods in.
    c.register_webhook(common::free_port()).await;
    let client = c.client().await;
    c.registry.push_image("apps/amd64-only", "1", "linux/amd64", true).await;
    c.registry.push_index("apps/multi", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "legacy", json!({})).await;
    node(&client, "amd", "m6i.xlarge", "us-east-1a", "on-demand").await;
    node(&client, "arm", "m7g.xlarge", "us-east-1a", "spot").await;
    nodes_ready(&client, 2).await;

    // Tolerating every taint: only the extender stands between these pods and arm64.
    let tolerate_all = json!({"tolerations": [{"operator": "Exists"}]});
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "legacy");
    deploys.create(&PostParams::default(), &deployment("amd64-only", &c.registry.image("apps/amd64-only:1"), 4, tolerate_all.clone())).await.expect("create");
    let pods = wait_running(&client, "legacy", "amd64-only", 4, Duration::from_secs(120)).await;
    let mut placed = BTreeMap::new();
    for p in &pods {
        assert_eq!(annotation(p, "archer.dev/platforms"), None, "the webhook was down: the pod is unpatched");
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled");
        *placed.entry(node_arch(&client, &node).await).or_insert(0) += 1;
    }
    assert_eq!(placed.get("amd64"), Some(&4), "the extender's filter kept amd64-only pods off arm64: {placed:?}");
    assert!(c.archer_metric("archer_extender_filtered_nodes_total").await >= 4.0, "the arm64 node was filtered for each pod");

    // The extender down (ignorable: true): pods are still scheduled.
    c.stop_archer();
    deploys.create(&PostParams::default(), &deployment("multi", &c.registry.image("apps/multi:1"), 2, tolerate_all)).await.expect("create");
    wait_running(&client, "legacy", "multi", 2, Duration::from_secs(120)).await;
    eprintln!("scenario 5 total: {:?}", started.elapsed());
}

/// The webhook against a real API server: pull secrets from the pod's own namespace only (and its
/// service account's), and namespace policy annotations through the watch-backed cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn webhook_pull_secrets_and_namespace_policy() {
    use base64::Engine;
    use k8s_openapi::api::core::v1::Secret;

    let private = common::Registry::start_with_auth("puller", "pw").await;
    private.push_index("team/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let c = Cluster::start_with("webhook-secrets", &[&private.host]).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let auth = base64::engine::general_purpose::STANDARD.encode("puller:pw");
    let dockercfg = json!({"auths": {private.host.clone(): {"auth": auth}}}).to_string();
    for ns in ["team-a", "team-b", "team-c"] {
        namespace(&client, ns, json!({})).await;
    }
    namespace(&client, "watching", json!({"archer.dev/mode": "observe"})).await;
    for ns in ["team-a", "team-c"] {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(&dockercfg)}
        }))
        .expect("secret");
        Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await.expect("secret");
    }
    // team-c: the credential comes through the default service account.
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "team-c");
    sa.patch("default", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"imagePullSecrets": [{"name": "regcred"}]}))).await.expect("patch sa");
    tokio::time::sleep(Duration::from_secs(1)).await; // let Archer's namespace watch see the new namespaces

    let image = private.image("team/app:1");
    let make = |ns: &str, secrets: bool| -> Pod {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": ns},
            "spec": {"containers": [{"name": "app", "image": image}]}});
        if secrets {
            p["spec"]["imagePullSecrets"] = json!([{"name": "regcred"}]);
        }
        serde_json::from_value(p).expect("pod")
    };
    let create = |ns: &'static str, secrets: bool| {
        let client = client.clone();
        let pod = make(ns, secrets);
        async move { Api::<Pod>::namespaced(client, ns).create(&PostParams::default(), &pod).await.expect("create pod") }
    };
    let a = create("team-a", true).await;
    assert_eq!(annotation(&a, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"), "pull secret of the pod's namespace");
    let b = create("team-b", true).await;
    assert_eq!(annotation(&b, "archer.dev/decision"), Some("inspection-failed"), "team-a's secret is never used for team-b");
    assert!(b.spec.as_ref().and_then(|s| s.affinity.as_ref()).is_none());
    let cpod = create("team-c", false).await;
    assert_eq!(annotation(&cpod, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"), "the service account's pull secret");
    c.registry.push_index("apps/multi", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let mut w = make("watching", false);
    if let Some(spec) = w.spec.as_mut() {
        spec.containers[0].image = Some(c.registry.image("apps/multi:1"));
    }
    let w = Api::<Pod>::namespaced(client.clone(), "watching").create(&PostParams::default(), &w).await.expect("create pod");
    assert_eq!(annotation(&w, "archer.dev/decision"), Some("observed"), "namespace annotation archer.dev/mode=observe");
    assert!(w.spec.as_ref().and_then(|s| s.affinity.as_ref()).is_none());

    // `archer report` reads private images as the webhook does: with each pod's own namespace's
    // pull secrets. Pods bound by hand past the webhook (no platforms annotation) on an amd64 node.
    private.push_index("team/other", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "reported", "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.large", "topology.kubernetes.io/zone": "us-east-1a"}}})).expect("node");
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("node");
    for (ns, image, secrets) in [("team-a", "team/app:1", true), ("team-c", "team/app:1", false), ("team-b", "team/other:1", true)] {
        let mut p = make(ns, secrets);
        p.metadata.name = Some("reported".into());
        p.metadata.labels = Some([("archer.dev/ignore".to_string(), "true".to_string())].into());
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = Some("reported".into());
            spec.containers[0].image = Some(private.image(image));
        }
        let created = Api::<Pod>::namespaced(client.clone(), ns).create(&PostParams::default(), &p).await.expect("bound pod");
        assert_eq!(annotation(&created, "archer.dev/platforms"), None, "past the webhook");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["report", "--output", "json", "--insecure-registry", &private.host, "--kubeconfig"])
        .arg(&c.kubeconfig)
        .output()
        .expect("archer report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let readiness = |ns: &str| r["workloads"].as_array().expect("workloads").iter().find(|w| w["namespace"] == ns && w["name"] == "reported").map(|w| w["readiness"].clone());
    assert_eq!(readiness("team-a"), Some(json!("movable")), "the pod's pull secret reads its image: {r}");
    assert_eq!(readiness("team-c"), Some(json!("movable")), "the service account's pull secret: {r}");
    assert_eq!(readiness("team-b"), Some(json!("unknown")), "team-a's secret is never used for team-b: {r}");
}

/// The generated NodePool CRD is accepted by a real API server (structural schema), and the
/// workshop pools are valid objects of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn nodepool_crd_installs_and_validates() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use archer::provisioner::nodepool::NodePool;
    // The harness installed deploy/crds/*.yaml (it panics if the API server refuses them).
    let c = Cluster::start("nodepool-crd").await;
    let client = c.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["archernodepools.archer.dev", "archernodeclaims.archer.dev"] {
        let crd = crds.get(name).await.expect("installed");
        assert!(crd.status.and_then(|s| s.conditions).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True")));
    }
    let pools: Api<NodePool> = Api::all(client.clone());
    for file in ["examples/inflate.yaml", "examples/team1.yaml"] {
        let text = std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).expect("example");
        for v in archer::yaml::from_multiple::<serde_json::Value>(&text).expect("yaml") {
            if v["kind"].as_str() == Some("NodePool") {
                let mut pool: NodePool = serde_json::from_value(v).expect("pool");
                pool.metadata.name = Some(format!("{}-{}", pool.metadata.name.clone().unwrap_or_default(), file.len()));
                pools.create(&PostParams::default(), &pool).await.unwrap_or_else(|e| panic!("{file}: {e}"));
            }
        }
    }
    assert_eq!(pools.list(&ListParams::default()).await.expect("list").items.len(), 3);
    // A pool that breaks the schema is refused by the API server.
    let raw = serde_json::to_vec(&json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "bad"}, "spec": {"weight": "heavy"}})).expect("json");
    let req = http::Request::post("/apis/archer.dev/v1alpha1/archernodepools").header("content-type", "application/json").body(raw).expect("request");
    assert!(client.request::<NodePool>(req).await.is_err(), "a string weight is refused by the schema");

    // The AKSNodeClass CRD: Karpenter on Azure's node class, written for Archer's group, is
    // accepted; one outside the schema's bounds is refused.
    use archer::provisioner::cloud::azure::nodeclass::AKSNodeClass;
    let classes: Api<AKSNodeClass> = Api::all(client.clone());
    let good: AKSNodeClass = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": {"imageFamily": "Ubuntu2204", "osDiskSizeGB": 100, "maxPods": 110}})).expect("class");
    classes.create(&PostParams::default(), &good).await.expect("a valid AKSNodeClass is accepted");
    for (name, spec) in [("small-disk", json!({"osDiskSizeGB": 10})), ("many-pods", json!({"maxPods": 500})), ("windows", json!({"imageFamily": "Windows"}))] {
        let raw = serde_json::to_vec(&json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": name}, "spec": spec})).expect("json");
        let req = http::Request::post("/apis/archer.dev/v1alpha1/archeraksnodeclasses").header("content-type", "application/json").body(raw).expect("request");
        assert!(client.request::<AKSNodeClass>(req).await.is_err(), "{name} is refused by the schema");
    }
}

//! Karpenter on the same control plane (issue #29): Karpenter v1.15's own kwok controller, built
//! from its Go module by `tests/e2e/build-components` (ARCHER_E2E_KARPENTER=1), given exactly
//! Archer's instance types, zones and prices, and an equivalent `karpenter.sh/v1` NodePool.
//!
//! Karpenter's kwok provider makes a Node whose allocatable is the instance type's `resources`
//! less its kube-reserved (100m cpu, 10Mi memory): the types are written with Archer's
//! allocatable plus that, so a node holds the same pods under either.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use archer::core::packer::Offering;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::cluster::{Cluster, Mode};
use crate::common::free_port;

/// The Karpenter release compared against (its module version).
pub const VERSION: &str = "v1.15.0";

/// Karpenter's kwok provider reserves this much of every node for the kubelet.
const KWOK_RESERVED_CPU_MILLIS: i64 = 100;
const KWOK_RESERVED_MEMORY_BYTES: i64 = 10 * 1024 * 1024;

/// The zones both provisioners launch in (Archer's default `provisioner.zones`).
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

/// Where build-components put Karpenter's kwok controller and CRDs (ARCHER_E2E_KARPENTER_DIR,
/// else `karpenter-<version>` beside the other components).
pub fn dir() -> PathBuf {
    let dir = std::env::var_os("ARCHER_E2E_KARPENTER_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("ARCHER_E2E_BIN").map(|b| PathBuf::from(b).join(format!("karpenter-{VERSION}"))))
        .expect("ARCHER_E2E_BIN: run tests/e2e/karpenter-compare (it builds Karpenter)");
    assert!(dir.join("karpenter-kwok").exists(), "karpenter-kwok missing in {}: build it with ARCHER_E2E_KARPENTER=1 tests/e2e/build-components", dir.display());
    dir
}

/// Archer's offerings as Karpenter's kwok instance-types file: one entry per instance type with
/// its offerings (price, and capacity type and zone as requirements), architecture, OS and resources (Archer's
/// allocatable plus kwok's kube-reserved; GPUs as `nvidia.com/gpu`; Archer's max pods).
pub fn instance_types(offerings: &[Offering]) -> Value {
    let mut by_type: BTreeMap<&str, (&Offering, Vec<Value>)> = BTreeMap::new();
    for o in offerings {
        // The shape Karpenter's own embedded file has (its example with `zone`/`capacityType`
        // fields is not what it parses: those offerings get no zone and match no pool).
        let requirements = json!([
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [o.capacity.as_str()]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [o.zone]}
        ]);
        by_type.entry(o.instance.name.as_str()).or_insert_with(|| (o, Vec::new())).1.push(json!({"Price": o.price, "Available": true, "Requirements": requirements}));
    }
    let types: Vec<Value> = by_type
        .into_values()
        .map(|(o, offerings)| {
            let t = &o.instance;
            let a = t.allocatable;
            let mut resources = json!({
                "cpu": format!("{}m", a.cpu_millis + KWOK_RESERVED_CPU_MILLIS),
                "memory": format!("{}Ki", (a.memory_bytes + KWOK_RESERVED_MEMORY_BYTES) / 1024),
                "pods": a.pods.to_string(),
            });
            if t.gpu_count > 0 {
                resources["nvidia.com/gpu"] = json!(t.gpu_count.to_string());
            }
            json!({"name": t.name, "offerings": offerings, "architecture": t.arch, "operatingSystems": [t.os], "resources": resources})
        })
        .collect();
    Value::Array(types)
}

/// What Karpenter is given: its NodePool, and which of Archer's offerings become its kwok
/// instance types (the comparison's `--pool getting-started` keeps categories c, m, r of
/// generation > 2, as Archer's own pool requires).
pub struct Setup {
    pub pool: Value,
    pub keep: Box<dyn Fn(&Offering) -> bool + Send + Sync>,
    /// The API server runs Priority and Fairness (the comparison counts writes by FlowSchema).
    pub flow_control: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup { pool: node_pool(), keep: Box::new(|_| true), flow_control: false }
    }
}

/// The user Karpenter's controller acts as (the admin impersonates it; a ClusterRoleBinding
/// gives it `cluster-admin`), so the API server's request metrics tell its writes from everyone
/// else's (in `system:masters` the mandatory `exempt` FlowSchema would take them all).
pub const USER: &str = "karpenter";

/// Karpenter's NodePool equivalent to Archer's e2e default pool: both architectures, on-demand
/// and spot, Linux, the same consolidation policy and delay (budgets: both default to 10%).
pub fn node_pool() -> Value {
    json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                "requirements": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]},
                    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                ]
            }},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"}
        }
    })
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource { group: group.into(), version: "v1".into(), api_version: format!("{group}/v1"), kind: kind.into(), plural: plural.into() }
}

/// The NodeClaims Karpenter made (`karpenter.sh/v1`).
pub async fn claims(client: &Client) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource("karpenter.sh", "NodeClaim", "nodeclaims"));
    api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// The nodes Karpenter launched (they carry its NodePool label).
pub async fn nodes(client: &Client) -> Vec<Node> {
    Api::<Node>::all(client.clone()).list(&ListParams::default().labels("karpenter.sh/nodepool")).await.map(|l| l.items).unwrap_or_default()
}

/// Install Karpenter's CRDs, its KWOKNodeClass and `setup`'s NodePool, and start its kwok
/// controller with Archer's instance types that `setup` keeps and the e2e batching clocks (1 s
/// idle, 3 s at most, as Archer's), acting as [`USER`]. Returns the controller's process id.
pub async fn start(c: &mut Cluster, setup: &Setup) -> u32 {
    let dir = dir();
    let mut crds: Vec<PathBuf> = std::fs::read_dir(dir.join("crds")).expect("karpenter crds").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "yaml")).collect();
    crds.sort();
    c.install_crd_files(&crds).await;
    let client = c.client().await;
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource { version: "v1alpha1".into(), api_version: "karpenter.kwok.sh/v1alpha1".into(), ..resource("karpenter.kwok.sh", "KWOKNodeClass", "kwoknodeclasses") });
    let class: DynamicObject = serde_json::from_value(json!({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": "default"}, "spec": {}})).expect("node class");
    classes.create(&PostParams::default(), &class).await.expect("create the KWOKNodeClass");
    let pools: Api<DynamicObject> = Api::all_with(client.clone(), &resource("karpenter.sh", "NodePool", "nodepools"));
    pools.create(&PostParams::default(), &serde_json::from_value(setup.pool.clone()).expect("pool")).await.expect("create the NodePool");

    let catalog = archer::catalog::Catalog::embedded().expect("catalog");
    let zones: Vec<String> = ZONES.iter().map(|z| z.to_string()).collect();
    let types = c.dir.path().join("karpenter-instance-types.json");
    let offerings: Vec<Offering> = archer::provisioner::nodepool::offerings(&catalog, &zones).into_iter().filter(|o| (setup.keep)(o)).collect();
    std::fs::write(&types, instance_types(&offerings).to_string()).expect("instance types");
    let admin = std::fs::read_to_string(&c.kubeconfig).expect("kubeconfig");
    let token = format!("    token: {}\n", crate::cluster::TOKEN);
    let kubeconfig = c.dir.path().join("kubeconfig-karpenter");
    let as_karpenter = admin.replace(&token, &format!("{token}    as: {USER}\n"));
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "karpenter-e2e"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    }))
    .expect("binding");
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.expect("bind Karpenter's user to cluster-admin");
    assert_ne!(as_karpenter, admin, "the admin kubeconfig has its token line");
    std::fs::write(&kubeconfig, as_karpenter).expect("Karpenter's kubeconfig");
    let (metrics, health) = (free_port(), free_port());
    let mut cmd = Command::new(dir.join("karpenter-kwok"));
    cmd.env("KUBECONFIG", &kubeconfig)
        .env("INSTANCE_TYPES_FILE_PATH", &types)
        .env("DISABLE_LEADER_ELECTION", "true")
        .env("METRICS_PORT", metrics.to_string())
        .env("HEALTH_PROBE_PORT", health.to_string())
        .env("BATCH_IDLE_DURATION", "1s")
        .env("BATCH_MAX_DURATION", "3s")
        .env("SYSTEM_NAMESPACE", "kube-system")
        .env("LOG_LEVEL", "info");
    let pid = c.spawn_component("karpenter", cmd);
    let start = Instant::now();
    while !reqwest::get(format!("http://127.0.0.1:{health}/readyz")).await.is_ok_and(|r| r.status().is_success()) {
        assert!(start.elapsed() < Duration::from_secs(90), "Karpenter did not become ready; see {}", c.logs.join("karpenter.log").display());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    pid
}

/// Each node's architecture (`kubernetes.io/arch`), by node name.
fn archs(nodes: Vec<Node>) -> BTreeMap<String, String> {
    nodes.into_iter().filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.labels.as_ref()?.get("kubernetes.io/arch")?.clone()))).collect()
}

/// Pods of `namespace` on a node whose architecture is not among `platforms` of their image
/// (`image -> architectures`, as pushed to the registry).
pub async fn wrong_arch_pods(client: &Client, namespace: &str, platforms: &BTreeMap<String, Vec<&str>>) -> Vec<String> {
    let nodes = archs(Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default());
    let pods = Api::<Pod>::namespaced(client.clone(), namespace).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    pods.iter()
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            let arch = nodes.get(spec.node_name.as_deref()?)?;
            let wrong = spec.containers.iter().filter_map(|c| platforms.get(c.image.as_deref()?)).any(|archs| !archs.contains(&arch.as_str()));
            wrong.then(|| format!("{} on {arch}", p.metadata.name.clone().unwrap_or_default()))
        })
        .collect()
}

/// Start a control plane for `mode` with Karpenter running where the mode has it (Archer's
/// config with `provisioner_config` lines, see [`Cluster::start_mode`]).
pub async fn cluster(test: &str, mode: Mode, provisioner_config: Vec<String>, setup: &Setup) -> (Cluster, Option<u32>) {
    let mut c = if setup.flow_control { Cluster::start_mode_with_flow_control(test, mode, provisioner_config).await } else { Cluster::start_mode(test, &[], mode, provisioner_config).await };
    let pid = match mode {
        Mode::Archer => None,
        Mode::Karpenter | Mode::KarpenterWithArcher => Some(start(&mut c, setup).await),
    };
    if mode != Mode::Karpenter {
        c.register_webhook(c.archer_port).await;
    }
    (c, pid)
}

#[test]
fn archers_offerings_become_karpenters_instance_types_with_the_same_allocatable() {
    let catalog = archer::catalog::Catalog::embedded().expect("catalog");
    let zones: Vec<String> = ZONES.iter().map(|z| z.to_string()).collect();
    let offerings = archer::provisioner::nodepool::offerings(&catalog, &zones);
    let types = instance_types(&offerings);
    let list = types.as_array().expect("a list");
    assert_eq!(list.len(), catalog.types().iter().filter(|t| offerings.iter().any(|o| o.instance.name == t.name)).count());
    let m7g = list.iter().find(|t| t["name"] == "m7g.large").expect("m7g.large");
    let t = catalog.types().iter().find(|t| t.name == "m7g.large").expect("m7g.large in the catalog");
    assert_eq!(m7g["architecture"], "arm64");
    assert_eq!(m7g["resources"]["cpu"], format!("{}m", t.allocatable.cpu_millis + 100));
    assert_eq!(m7g["resources"]["memory"], format!("{}Ki", (t.allocatable.memory_bytes + 10 * 1024 * 1024) / 1024));
    assert_eq!(m7g["resources"]["pods"], t.allocatable.pods.to_string());
    let offers = m7g["offerings"].as_array().expect("offerings");
    assert_eq!(offers.len(), 6, "on-demand and spot in three zones");
    let on_demand = catalog.price_of(t, None, archer::catalog::CapacityType::OnDemand).expect("price");
    let value = |o: &Value, key: &str| o["Requirements"].as_array().and_then(|r| r.iter().find(|q| q["key"] == key)).map(|q| q["values"][0].clone());
    assert!(offers.iter().any(|o| value(o, "karpenter.sh/capacity-type") == Some(json!("on-demand")) && value(o, "topology.kubernetes.io/zone") == Some(json!("us-east-1b")) && o["Price"] == json!(on_demand)));
}

/// The supported installation beside Karpenter (issue #29): Archer's webhook and extender, its
/// provisioner off and none of its CRDs. An amd64-only image never lands on arm64; a multi-arch
/// image lands on arm64, the cheaper, because Karpenter honours the preferred term Archer adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane and Karpenter: run tests/e2e/karpenter-compare"]
async fn beside_karpenter_an_amd64_only_image_never_lands_on_arm64_and_a_multi_arch_one_goes_to_arm64() {
    let (c, _) = cluster("beside-karpenter", Mode::KarpenterWithArcher, Vec::new(), &Setup::default()).await;
    let client = c.client().await;
    c.registry.push_image("apps/legacy", "1", "linux/amd64", true).await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    crate::namespace(&client, "shop", json!({})).await;
    let (legacy, web) = (c.registry.image("apps/legacy:1"), c.registry.image("apps/web:1"));
    let deploys: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), "shop");
    let running = |n: usize| {
        let client = client.clone();
        async move {
            let pods = Api::<Pod>::namespaced(client, "shop").list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
            pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count() == n
        }
    };
    // The multi-arch pods first, onto the nodes Karpenter launches for them (a preferred term is
    // a score: a pod created while an amd64 node with room is up may be bound there); then the
    // amd64-only pods, while arm64 nodes with room are up, which they must not use.
    deploys.create(&PostParams::default(), &crate::deployment("web", &web, 3, json!({}))).await.expect("web");
    crate::wait("3 multi-arch pods Running on Karpenter's nodes", Duration::from_secs(180), || running(3)).await;
    deploys.create(&PostParams::default(), &crate::deployment("legacy", &legacy, 3, json!({}))).await.expect("legacy");
    crate::wait("6 pods Running on Karpenter's nodes", Duration::from_secs(180), || running(6)).await;
    let platforms = BTreeMap::from([(legacy.clone(), vec!["amd64"]), (web.clone(), vec!["amd64", "arm64"])]);
    assert_eq!(wrong_arch_pods(&client, "shop", &platforms).await, Vec::<String>::new());
    let nodes = archs(nodes(&client).await);
    let pods = Api::<Pod>::namespaced(client.clone(), "shop").list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    for p in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let arch = nodes.get(&node).unwrap_or_else(|| panic!("{name} is on {node}, which Karpenter did not launch"));
        let expected = if name.starts_with("web") { "arm64" } else { "amd64" };
        assert_eq!(arch, expected, "{name} on {node}");
    }
    assert!(c.archer_pid().is_some(), "Archer's webhook and extender ran");
    assert!(!claims(&client).await.is_empty(), "Karpenter provisioned");

    // The savings beside Karpenter: Archer's savings reporter (its provisioner off) prices
    // Karpenter's nodes under their NodePool, and the multi-arch pods on arm64 save against the
    // same pods on amd64, planned on Karpenter's NodePool.
    crate::wait("the savings reporter leads", Duration::from_secs(30), || async { c.archer_metric("archer_savings_leader ").await == 1.0 }).await;
    let pool = node_pool()["metadata"]["name"].as_str().expect("pool name").to_string();
    let cost = |arch: &'static str| {
        let pool = pool.clone();
        let c = &c;
        async move {
            let mut sum = 0.0;
            for capacity in ["on-demand", "spot"] {
                sum += c.archer_metric(&format!("archer_nodes_cost_per_hour_dollars{{nodepool=\"{pool}\",arch=\"{arch}\",capacity_type=\"{capacity}\"}}")).await;
            }
            sum
        }
    };
    crate::wait("Karpenter's nodes priced under their NodePool", Duration::from_secs(30), || async { cost("arm64").await > 0.0 && cost("amd64").await > 0.0 }).await;
    crate::wait("an arm64 saving for the multi-arch pods", Duration::from_secs(30), || async { c.archer_metric("archer_savings_per_hour_dollars{source=\"arm64\"}").await > 0.0 }).await;
    let baseline = c.archer_metric("archer_baseline_cost_per_hour_dollars ").await;
    let saving = c.archer_metric("archer_savings_per_hour_dollars{source=\"arm64\"}").await;
    assert!(baseline > saving, "the baseline (every pod on amd64 on-demand) costs more than the arm64 saving: {baseline} vs {saving}");
    assert_eq!(c.archer_metric("archer_provisioner_leader ").await, 0.0, "the provisioner is off");
}

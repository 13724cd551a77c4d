//! The Azure provider end to end: the real control plane, `archer serve --cloud-provider azure`
//! against the local Azure Resource Manager (tests/common/arm.rs: every request checked against
//! the schemas of Azure's management SDKs), and the harness playing the kubelet and Azure's cloud
//! node manager: when the server holds a VM of the cluster whose creation succeeded, a Node
//! registers under the VM's name with its `providerID` (`azure:///subscriptions/...`), the labels
//! and taints the VM's custom data gives the kubelet, and its size's capacity; kwok makes it
//! Ready and runs its pods. A deleted VM's Node is deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archer::provisioner::cloud::azure::nodeclass::AKSNodeClass;
use archer::provisioner::nodepool::NodePool;
use base64::Engine;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::provisioning::{apply_aks_module, claims, scale};
use super::{namespace, wait, wait_running};
use crate::cluster::Cluster;
use crate::common::arm::ArmServer;

/// A cluster whose Archer runs the azure provider against a fresh local ARM, with the module's
/// AKSNodeClass applied and Ready.
async fn azure_cluster(name: &str) -> (Cluster, ArmServer) {
    let mut c = Cluster::start(name).await;
    let arm = ArmServer::start().await;
    c.stop_archer();
    c.cloud_provider = "azure";
    // The Retail Prices API, stood in for with the catalog's own eastus prices (so the scenarios'
    // numbers are the catalog's), read live by the provider.
    let catalog = archer::catalog::Catalog::embedded().expect("catalog");
    let location = arm.settings().location;
    let rows = catalog
        .types()
        .iter()
        .filter(|t| t.provider == "azure")
        .filter_map(|t| Some(crate::common::price_apis::azure_row(&location, &t.name, &t.name, "Virtual Machines", *t.prices.get(&location)?)))
        .collect();
    let retail = crate::common::price_apis::AzureRetail::start(&location, rows, 100).await;
    c.provisioner_config = ["registrationTimeoutSeconds: 600".to_string(), "garbageGraceSeconds: 5".to_string()].into_iter().chain(arm.config_lines()).chain([format!("  pricesEndpoint: {}", retail.endpoint)]).collect();
    c.start_archer().await;
    // Throttled once (retried after a second), then answered.
    wait("the provider reading the Retail Prices API", Duration::from_secs(30), || async { retail.calls.load(std::sync::atomic::Ordering::SeqCst) >= 2 }).await;
    assert!(retail.refused().is_empty(), "requests the API would refuse: {:?}", retail.refused());
    let client = c.client().await;
    let class: AKSNodeClass = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": {"imageFamily": "Ubuntu2204", "osDiskSizeGB": 100}})).expect("class");
    let classes: Api<AKSNodeClass> = Api::all(client.clone());
    classes.create(&PostParams::default(), &class).await.expect("create class");
    wait("the AKSNodeClass Ready with an image per architecture", Duration::from_secs(60), || async {
        classes.get("default").await.ok().and_then(|n| n.status).is_some_and(|s| ["Ready", "ImagesReady", "SubnetsReady"].iter().all(|t| s.conditions.iter().any(|c| c.type_ == *t && c.status == "True")) && s.images.len() == 2)
    })
    .await;
    (c, arm)
}

/// The harness's kubelets. Stops when dropped.
struct Kubelets {
    stop: Arc<AtomicBool>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn kubelets(client: Client, arm: Arc<crate::common::arm::Arm>) -> Kubelets {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut registered: BTreeSet<String> = BTreeSet::new();
        while !flag.load(Ordering::Relaxed) {
            let vms: BTreeMap<String, Value> = arm.vms.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for gone in registered.clone().iter().filter(|n| !vms.contains_key(*n)) {
                let _ = nodes.delete(gone, &DeleteParams::default()).await;
                registered.remove(gone);
            }
            let new: Vec<(&String, &Value)> = vms.iter().filter(|(n, v)| !registered.contains(*n) && v["properties"]["provisioningState"] == "Succeeded").collect();
            for (name, vm) in new {
                let custom = arm.custom_data.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned().unwrap_or_default();
                if custom.is_empty() {
                    // Not made by a launch (a VM planted as leaked): no kubelet would join.
                    continue;
                }
                let node = kubelet_node(name, vm, &custom);
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => drop(registered.insert(name.clone())),
                    Err(kube::Error::Api(s)) if s.code == 409 => drop(registered.insert(name.clone())),
                    Err(e) => eprintln!("kubelet {name}: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    Kubelets { stop }
}

/// The Node a kubelet on this VM registers: what its custom data tells the kubelet (labels,
/// taints, max pods), the size's capacity, the unregistered taint, and the provider id Azure's
/// cloud node manager writes.
fn kubelet_node(name: &str, vm: &Value, custom_data_b64: &str) -> Node {
    let boot = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(custom_data_b64).expect("base64")).expect("utf8");
    let config: Value = serde_json::from_str(boot.strip_prefix("#cloud-config\n").expect("a cloud-config")).expect("JSON cloud-config");
    let kubelet = config["write_files"][0]["content"].as_str().expect("/etc/default/kubelet").to_string();
    // Values are double-quoted (an environment file systemd and a shell read alike).
    let var = |key: &str| kubelet.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_default().trim_matches('"').to_string();
    let mut labels: BTreeMap<String, String> = var("KUBELET_NODE_LABELS").split(',').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    labels.insert("type".into(), "kwok".into());
    let flags = var("KUBELET_FLAGS");
    let flag = |f: &str| flags.split(' ').find_map(|x| x.strip_prefix(&format!("--{f}="))).map(str::to_string);
    let mut taints: Vec<Value> = flag("register-with-taints")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (kv, effect) = t.split_once(':').unwrap_or((t, "NoSchedule"));
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            json!({"key": k, "value": v, "effect": effect})
        })
        .collect();
    taints.push(json!({"key": "karpenter.sh/unregistered", "effect": "NoSchedule"}));
    let size = vm["properties"]["hardwareProfile"]["vmSize"].as_str().unwrap_or_default();
    let t = archer::catalog::Catalog::embedded().expect("catalog").get(size).unwrap_or_else(|| panic!("{size} not in the catalog")).clone();
    let pods = flag("max-pods").unwrap_or_else(|| t.max_pods.to_string());
    let id = vm["id"].as_str().unwrap_or_default().replace(crate::common::arm::RESOURCE_GROUP, &crate::common::arm::RESOURCE_GROUP.to_ascii_lowercase());
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"providerID": format!("azure://{id}"), "taints": taints},
        "status": {
            "capacity": {"cpu": t.vcpu.to_string(), "memory": format!("{}Mi", t.memory_mib), "pods": pods},
            "allocatable": {"cpu": t.allocatable_cpu, "memory": t.allocatable_memory, "pods": pods}
        }
    }))
    .expect("node")
}

/// The AKS arm64 module with the Azure provider: its NodePool (ported by apiVersion, without
/// cilium's startup taint) and `inflate` Deployment. All 4 pods end up Running on arm64 D-series
/// VMs of at most 4 vCPU, launched through ARM with requests the SDKs' schemas accept, on Nodes
/// labelled as Karpenter on Azure labels them; a leaked VM of the cluster (no claim) is deleted;
/// a newer node image published replaces every node as drifted; scaled to 0, the VMs and their
/// NICs are deleted. Then (issue #43) a pod of a private ACR image with no pull secret is decided
/// onto arm64 with Archer's own workload identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn azure_the_aks_arm64_module_runs_on_arm64_vms_launched_through_arm() {
    let (c, arm) = azure_cluster("azure-module").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), arm.state.clone());
    c.registry.push_index("oss/kubernetes/pause", "3.6", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "workshop", json!({})).await;
    // A VM Archer launched for a claim that no longer exists (lost in a crash): collected.
    arm.plant_vm("aks-gone-claim", "gone-claim");
    apply_aks_module(&client, &c, json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"})).await;
    let t0 = Instant::now();
    let pods = wait_running(&client, "workshop", "inflate", 4, Duration::from_secs(180)).await;
    eprintln!("azure: 4 pods Running on VMs launched through ARM in {:?}", t0.elapsed());
    let nodes: Vec<Node> = Api::<Node>::all(client.clone()).list(&Default::default()).await.expect("nodes").items;
    let running: BTreeMap<String, Value> = arm.running().into_iter().filter(|(n, _)| n != "aks-gone-claim").collect();
    let written = claims(&client).await;
    assert_eq!(running.len(), written.len(), "one VM per claim");
    for p in &pods {
        let node_name = p.spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled");
        let n = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node_name.as_str())).expect("node");
        let get = |k: &str| n.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned().unwrap_or_default();
        let vm = running.get(&node_name).expect("the node is a VM ARM made");
        assert_eq!(get("kubernetes.io/arch"), "arm64");
        assert_eq!(vm["properties"]["hardwareProfile"]["vmSize"].as_str(), Some(get("node.kubernetes.io/instance-type").as_str()));
        assert!(get("karpenter.azure.com/sku-series").starts_with("Dp"), "an arm64 D series");
        assert!(get("karpenter.azure.com/sku-cpu").parse::<u32>().is_ok_and(|c| c <= 4));
        assert_eq!(get("karpenter.azure.com/sku-family"), "D");
        assert_eq!(get("kubernetes.azure.com/scalesetpriority"), "regular");
        assert_eq!(get("aks-karpenter"), "demo");
        assert_eq!(format!("eastus-{}", vm["zones"][0].as_str().unwrap_or_default()), get("topology.kubernetes.io/zone"));
        assert!(vm["properties"]["storageProfile"]["imageReference"]["communityGalleryImageId"].as_str().is_some_and(|i| i.contains("/images/2204gen2arm64containerd/versions/")));
        assert_eq!(vm["tags"]["archer.dev_cluster"], "archer-test");
        let claim = written.iter().find(|cl| cl.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())).expect("its claim");
        assert_eq!(claim.status.as_ref().and_then(|s| s.provider_id.clone()), n.spec.as_ref().and_then(|s| s.provider_id.clone()), "the claim's provider id is the Node's");
    }
    assert_eq!(arm.violations(), Vec::<String>::new(), "every ARM request as the SDKs' schemas allow");
    wait("the leaked VM garbage-collected", Duration::from_secs(60), || async { !arm.state.vms.lock().unwrap_or_else(|e| e.into_inner()).contains_key("aks-gone-claim") }).await;

    // AKS publishes a newer arm64 node image: every node is replaced as drifted, onto it.
    arm.publish("2204gen2arm64containerd", "202612.01.0", "2026-12-01T00:00:00Z");
    let t2 = Instant::now();
    let on_new_image = || async {
        let running = arm.running();
        !running.is_empty() && running.values().all(|vm| vm["properties"]["storageProfile"]["imageReference"]["communityGalleryImageId"].as_str().is_some_and(|i| i.ends_with("/versions/202612.01.0"))) && super::running_pods(&client, "workshop", "inflate").await.len() == 4
    };
    wait("every VM replaced onto the new image, the 4 pods Running", Duration::from_secs(180), on_new_image).await;
    eprintln!("azure: drifted nodes replaced onto the new node image in {:?}", t2.elapsed());

    scale(&client, "workshop", "inflate", 0).await;
    let t1 = Instant::now();
    loop {
        // Each lock released before the await (the server's handlers take them too).
        let vms = arm.state.vms.lock().unwrap_or_else(|e| e.into_inner()).len();
        let nics = arm.state.nics.lock().unwrap_or_else(|e| e.into_inner()).len();
        let left = claims(&client).await.len();
        if vms == 0 && nics == 0 && left == 0 {
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(120), "{vms} VMs, {nics} NICs and {left} claims left after scaling to zero");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("azure: scaled to 0, every VM and NIC deleted in {:?}", t1.elapsed());
    assert_eq!(arm.violations(), Vec::<String>::new());

    // Private ACR, no pull secret (issue #43): Archer's workload identity (the local Entra)
    // exchanged at the registry's /oauth2/exchange, the local ACR in front of the real registry
    // standing for `archerdemo.azurecr.io` through hosts.toml's `server`.
    use crate::private_registries::{admitted, restart_with_hosts, HostsFile};
    let mut c = c;
    let open = crate::common::Registry::start().await;
    open.push_image("team/api", "2", "linux/arm64", true).await;
    let login = "archerdemo.azurecr.io";
    let s = arm.settings();
    let acr = crate::common::acr::Acr::start(c.dir.path(), &open.storage, login, crate::common::arm::ACR_TOKEN, crate::common::arm::TENANT).await;
    let identity = [
        "acr:".to_string(),
        format!("  tenantId: {}", s.tenant_id.unwrap_or_default()),
        format!("  clientId: {}", s.client_id.unwrap_or_default()),
        format!("  federatedTokenFile: {}", s.federated_token_file.unwrap_or_default()),
        format!("  authorityHost: {}", s.authority_host.unwrap_or_default()),
    ];
    restart_with_hosts(&mut c, &[HostsFile { registry: login.into(), text: format!("server = \"http://{}\"\n", acr.host) }], std::slice::from_ref(&acr.host), &identity).await;
    let (platforms, arch, error) = admitted(&c, "workshop", "acr", &format!("{login}/team/api:2")).await;
    assert_eq!((platforms.as_deref(), arch, error), (Some("linux/arm64"), vec!["arm64".to_string()], None), "a private ACR image decided as a public one");
    assert!(acr.violations().is_empty() && acr.exchanges() == 1, "{:?}", acr.violations());
    eprintln!("azure: a private ACR image with no pull secret decided onto arm64");
}

/// Spot: the cheapest arm64 sizes answer `SkuNotAvailable` in every zone, so the launches fall
/// through to the next offering; then a spot VM whose preemption is scheduled (the node agent's
/// `PreemptionScheduled=True`) has its pods moved at once onto a new VM, and is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn azure_spot_falls_through_unavailable_sizes_and_a_scheduled_preemption_moves_the_pods() {
    let (c, arm) = azure_cluster("azure-spot").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), arm.state.clone());
    c.registry.push_index("apps/inflate", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "workshop", json!({})).await;
    let pool: NodePool = archer::yaml::from_str(
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: spot}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: archer.dev, kind: AKSNodeClass, name: default}\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [arm64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}\n        - {key: karpenter.azure.com/sku-family, operator: In, values: [D]}\n",
    )
    .expect("pool");
    Api::<NodePool>::all(client.clone()).create(&PostParams::default(), &pool).await.expect("create pool");
    // The cheapest arm64 sizes cannot be had in any zone: the launches fall through to the next.
    let scarce = ["Standard_D2pls_v5", "Standard_D2pls_v6"];
    for size in scarce {
        for zone in ["1", "2", "3"] {
            arm.state.faults.lock().unwrap_or_else(|e| e.into_inner()).sku_not_available.insert((size.to_string(), zone.to_string()));
        }
    }
    let image = c.registry.image("apps/inflate:1");
    let d = super::deployment("inflate", "unused", 2, json!({"containers": [{"name": "app", "image": image, "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]}));
    Api::<Deployment>::namespaced(client.clone(), "workshop").create(&PostParams::default(), &d).await.expect("create deployment");
    let pods = wait_running(&client, "workshop", "inflate", 2, Duration::from_secs(180)).await;
    let refused = arm.received("VirtualMachines_CreateOrUpdate").iter().filter(|r| scarce.iter().any(|s| r.body["properties"]["hardwareProfile"]["vmSize"] == *s)).count();
    assert!(refused >= 1, "the plan asked for a scarce size first");
    assert!(arm.running().values().all(|vm| !scarce.iter().any(|s| vm["properties"]["hardwareProfile"]["vmSize"] == *s)), "and fell through to another");
    let victim = pods[0].spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled");
    let vm = arm.running().get(&victim).cloned().expect("a VM");
    assert_eq!((vm["properties"]["priority"].as_str(), vm["properties"]["evictionPolicy"].as_str()), (Some("Spot"), Some("Delete")));
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(&victim, &PatchParams::default(), &Patch::Strategic(json!({"status": {"conditions": [{"type": "PreemptionScheduled", "status": "True", "reason": "Preempt", "message": "IMDS scheduled event Preempt"}]}})))
        .await
        .expect("condition");
    wait("the preempted VM deleted", Duration::from_secs(120), || async { !arm.state.vms.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&victim) }).await;
    let moved = wait_running(&client, "workshop", "inflate", 2, Duration::from_secs(120)).await;
    assert!(moved.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(victim.as_str())), "no pod left on the preempted node");
    assert!(claims(&client).await.iter().any(|cl| cl.spec.reason.as_deref() == Some("replacement") || cl.status.as_ref().and_then(|s| s.node_name.as_deref()) != Some(victim.as_str())));
    assert_eq!(arm.violations(), Vec::<String>::new());
}

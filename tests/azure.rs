//! The Azure VM provider against the local Azure Resource Manager (tests/common/arm.rs), which
//! checks every request against the operation's schema from Azure's management SDKs: the token
//! exchange, node class resolution (the newest AKS image per architecture), launches (NIC, then
//! VM: spot, zone, image, tags, bootstrap), idempotency, the unavailable-offering fallthrough
//! (SkuNotAvailable, AllocationFailed, quota), deletion, listing for garbage collection, drift,
//! throttling, and answers no server should give.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use archer::catalog::{CapacityType, Catalog};
use archer::provisioner::cloud::azure::nodeclass::AKSNodeClassSpec;
use archer::provisioner::cloud::azure::Azure;
use archer::provisioner::cloud::{CloudError, CloudProvider, NodeClassReadiness};
use archer::provisioner::nodeclaim::NodeClaim;
use base64::Engine;
use common::arm::*;
use serde_json::{json, Value};

fn claim(name: &str, size: &str, arch: &str, zone: &str, capacity: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodePool": "general", "instanceType": size, "zone": zone, "capacityType": capacity, "arch": arch, "os": "linux",
                 "labels": {"kubernetes.io/arch": arch, "karpenter.sh/capacity-type": capacity, "aks-karpenter": "demo", "karpenter.azure.com/sku-name": size},
                 "taints": [{"key": "dedicated", "value": "demo", "effect": "NoSchedule"}], "pricePerHour": 0.05,
                 "nodeClassRef": {"group": "archer.dev", "kind": "AKSNodeClass", "name": "default"}}
    }))
    .expect("claim")
}

/// The claim as the claim keeper retries it: written long ago, launched or not.
fn retried(mut c: NodeClaim) -> NodeClaim {
    c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-01-01T00:00:00Z".parse().unwrap()));
    c
}

fn spec() -> AKSNodeClassSpec {
    serde_json::from_value(json!({"imageFamily": "Ubuntu2204", "osDiskSizeGB": 64, "tags": {"team/name": "platform"}, "maxPods": 110, "kubelet": {"cpuManagerPolicy": "static"}})).expect("spec")
}

fn kube() -> kube::Client {
    kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).expect("client")
}

async fn provider(arm: &ArmServer) -> Azure {
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let azure = Azure::new(arm.settings(), catalog, kube()).expect("provider");
    let class = azure.use_class("default", &spec()).await;
    assert!(class.resolved.ready(), "problems: {}", class.resolved.problems());
    azure
}

fn custom_data(arm: &ArmServer, vm: &str) -> String {
    let b64 = arm.state.custom_data.lock().unwrap().get(vm).cloned().expect("custom data");
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).expect("base64")).expect("utf8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arm64_spot_claim_becomes_a_nic_and_a_vm_that_the_schemas_accept() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    assert_eq!(azure.node_class_readiness(Some(&[("name".to_string(), "default".to_string())].into())), NodeClassReadiness::Ready);
    let c = claim("general-abcde", "Standard_D2pls_v6", "arm64", "eastus-2", "spot");
    let i = azure.create(&c).await.expect("launched");
    assert_eq!(i.node_name, "aks-general-abcde");
    assert_eq!(i.provider_id, format!("azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/mc_archer_test_eastus/providers/Microsoft.Compute/virtualMachines/aks-general-abcde"));
    assert_eq!((i.instance_type.as_deref(), i.zone.as_deref(), i.claim.as_str()), (Some("Standard_D2pls_v6"), Some("eastus-2"), "general-abcde"));
    assert_eq!(i.image_id.as_deref(), Some("/CommunityGalleries/AKSUbuntu-38d80f77-467a-481f-a8d4-09b6d4220bd2/images/2204gen2arm64containerd/versions/202611.10.0"));
    assert!(i.node_class_hash.is_some() && i.launched_at.is_some());
    assert_eq!(arm.violations(), Vec::<String>::new(), "every request as the schemas allow");

    let nic = &arm.received("NetworkInterfaces_CreateOrUpdate")[0].body;
    assert_eq!(nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"], SUBNET);
    assert_eq!(nic["properties"]["enableAcceleratedNetworking"], true, "the catalog says Dpls_v6 has it");
    let vm = &arm.received("VirtualMachines_CreateOrUpdate")[0].body;
    let p = &vm["properties"];
    assert_eq!((&p["priority"], &p["evictionPolicy"], &p["billingProfile"]["maxPrice"]), (&json!("Spot"), &json!("Delete"), &json!(-1.0)));
    assert_eq!(vm["zones"], json!(["2"]));
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_D2pls_v6");
    assert_eq!(p["storageProfile"]["osDisk"]["diskSizeGB"], 64);
    assert_eq!(p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"], "Delete", "the NIC goes with the VM");
    assert_eq!(p["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"], true);
    let tags = &vm["tags"];
    assert_eq!((&tags["archer.dev_cluster"], &tags["archer.dev_nodeclaim"], &tags["archer.dev_nodepool"], &tags["archer.dev_aksnodeclass"]), (&json!("archer-test"), &json!("general-abcde"), &json!("general"), &json!("default")));
    assert_eq!(tags["team_name"], "platform", "the class's tags, '/' made '_'");

    let boot = custom_data(&arm, "aks-general-abcde");
    let config: Value = serde_json::from_str(boot.strip_prefix("#cloud-config\n").expect("cloud-config")).expect("JSON");
    let kubelet = config["write_files"][0]["content"].as_str().unwrap();
    assert!(kubelet.contains("aks-karpenter=demo") && kubelet.contains("kubernetes.io/arch=arm64"), "{kubelet}");
    assert!(kubelet.contains("--register-with-taints=dedicated=demo:NoSchedule") && kubelet.contains("--max-pods=110") && kubelet.contains("--cpu-manager-policy=static"), "{kubelet}");
    let lines: Vec<&str> = kubelet.lines().collect();
    assert_eq!(lines.len(), 2, "{kubelet}");
    assert!(lines[0].starts_with("KUBELET_NODE_LABELS=\"") && lines[0].ends_with('"') && lines[1].starts_with("KUBELET_FLAGS=\"--max-pods=110 ") && lines[1].ends_with('"'), "values quoted: {kubelet}");
    assert_eq!(*arm.state.tokens_issued.lock().unwrap(), 1, "one token exchange, kept for every request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_launch_finds_its_vm_and_makes_no_second_one() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    let c = claim("general-retry", "Standard_D4pls_v6", "arm64", "eastus-1", "on-demand");
    let first = azure.create(&c).await.expect("launched");
    let again = azure.create(&retried(c)).await.expect("found");
    assert_eq!(first.provider_id, again.provider_id);
    assert_eq!(arm.received("VirtualMachines_CreateOrUpdate").len(), 1, "looked up by name and tag, not made again");
    let vm = &arm.received("VirtualMachines_CreateOrUpdate")[0].body;
    assert_eq!((&vm["properties"]["priority"], vm["properties"].get("evictionPolicy")), (&json!("Regular"), None), "on-demand");
    assert_eq!(arm.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_size_is_left_out_and_the_next_offering_planned() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    let key = |size: &str, zone: &str, cap| azure.offerings().iter().any(|o| o.instance.name == size && o.zone == zone && o.capacity == cap);
    assert!(key("Standard_D2pls_v6", "eastus-1", CapacityType::Spot));

    // At once: SkuNotAvailable (asked for in zone 1): the size for spot in every zone, as
    // Karpenter on Azure (spot capacity or the subscription's offer, not a zone's).
    arm.state.faults.lock().unwrap().sku_not_available.insert(("Standard_D2pls_v6".into(), "1".into()));
    let e = azure.create(&claim("general-sku", "Standard_D2pls_v6", "arm64", "eastus-1", "spot")).await.expect_err("not available");
    assert!(matches!(&e, CloudError::InsufficientCapacity { message, .. } if message.starts_with("SkuNotAvailable")), "{e}");
    for zone in ["eastus-1", "eastus-2", "eastus-3"] {
        assert!(!key("Standard_D2pls_v6", zone, CapacityType::Spot), "left out for spot in {zone}");
        assert!(key("Standard_D2pls_v6", zone, CapacityType::OnDemand), "not for on-demand");
    }
    assert!(arm.state.nics.lock().unwrap().is_empty(), "the NIC made for it is deleted");

    // In the operation: AllocationFailed: the size in every zone, spot and on-demand.
    arm.state.faults.lock().unwrap().allocation_failed.insert("Standard_D4pls_v6".into());
    let e = azure.create(&claim("general-alloc", "Standard_D4pls_v6", "arm64", "eastus-3", "on-demand")).await.expect_err("allocation failed");
    assert!(matches!(&e, CloudError::InsufficientCapacity { message, .. } if message.starts_with("AllocationFailed")), "{e}");
    for zone in ["eastus-1", "eastus-2", "eastus-3"] {
        assert!(!key("Standard_D4pls_v6", zone, CapacityType::OnDemand) && !key("Standard_D4pls_v6", zone, CapacityType::Spot));
    }
    assert!(arm.state.vms.lock().unwrap().is_empty() && arm.state.nics.lock().unwrap().is_empty(), "the failed VM and its NIC are deleted");

    // The family's quota: this size, every zone, this capacity type; the family's smaller sizes
    // are tried meanwhile (Karpenter on Azure's rule), and spot has a quota of its own.
    arm.state.faults.lock().unwrap().quota_exceeded.insert("Standard_D8pls_v6".into());
    let e = azure.create(&claim("general-quota", "Standard_D8pls_v6", "arm64", "eastus-2", "on-demand")).await.expect_err("quota");
    assert!(matches!(&e, CloudError::InsufficientCapacity { message, .. } if message.contains("Family Cores quota")), "{e}");
    for zone in ["eastus-1", "eastus-2", "eastus-3"] {
        assert!(!key("Standard_D8pls_v6", zone, CapacityType::OnDemand), "{zone}");
        assert!(key("Standard_D8pls_v6", zone, CapacityType::Spot) && key("Standard_D2pls_v6", zone, CapacityType::OnDemand));
    }
    assert_eq!(arm.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_failures_are_the_claims_to_retry_not_capacity() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    // The class's image is withdrawn from the gallery after it was resolved.
    arm.state.images.lock().unwrap().clear();
    let e = azure.create(&claim("general-img", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand")).await.expect_err("no image");
    assert!(matches!(&e, CloudError::Api { message, .. } if message.contains("GalleryImageNotFound")), "{e}");
    assert!(azure.offerings().iter().any(|o| o.instance.name == "Standard_D2pls_v6" && o.zone == "eastus-1"), "not marked unavailable");
    // And a class resolved now is not ready, and says why.
    let class = azure.use_class("default", &spec()).await;
    assert!(!class.resolved.ready() && class.resolved.image_problems.iter().any(|p| p.contains("2204gen2arm64containerd")) && class.resolved.subnet_problems.is_empty(), "{}", class.resolved.problems());
    assert!(matches!(azure.node_class_readiness(Some(&[("name".to_string(), "default".to_string())].into())), NodeClassReadiness::NotReady { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_removes_the_vm_and_its_nic_and_listing_finds_the_clusters_vms() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    let c = claim("general-del", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand");
    azure.create(&c).await.expect("launched");
    arm.plant_vm("aks-leaked", "gone-claim");
    arm.plant_vm("other-tool-vm", "");
    arm.state.vms.lock().unwrap().get_mut("other-tool-vm").unwrap()["tags"] = json!({"owner": "someone-else"});
    let mut listed: Vec<(String, String)> = azure.list().await.expect("list").into_iter().map(|i| (i.node_name, i.claim)).collect();
    listed.sort();
    assert_eq!(listed, [("aks-general-del".to_string(), "general-del".to_string()), ("aks-leaked".to_string(), "gone-claim".to_string())], "the cluster's VMs only");

    azure.delete(&c).await.expect("deleted");
    assert!(!arm.state.vms.lock().unwrap().contains_key("aks-general-del") && arm.state.nics.lock().unwrap().is_empty());
    azure.delete(&c).await.expect("gone already: not an error");
    // A NIC of the name another claim would use, not tagged as Archer's: left alone.
    arm.state.nics.lock().unwrap().insert("aks-general-other".into(), json!({"id": "/subscriptions/x/resourceGroups/y/providers/Microsoft.Network/networkInterfaces/aks-general-other", "name": "aks-general-other", "tags": {"owner": "someone-else"}}));
    azure.delete(&claim("general-other", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand")).await.expect("nothing of ours");
    assert!(arm.state.nics.lock().unwrap().contains_key("aks-general-other"), "not Archer's: kept");
    assert_eq!(arm.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_node_image_or_a_changed_class_makes_a_node_drifted() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    let c = claim("general-drift", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand");
    let i = azure.create(&c).await.expect("launched");
    let mut launched = c.clone();
    launched.status = Some(archer::provisioner::nodeclaim::NodeClaimStatus { provider_id: Some(i.provider_id), image_id: i.image_id, node_class_hash: i.node_class_hash, ..Default::default() });
    assert_eq!(azure.drifted(&launched), None);
    arm.publish("2204gen2arm64containerd", "202612.01.0", "2026-12-01T00:00:00Z");
    azure.use_class("default", &spec()).await;
    let why = azure.drifted(&launched).expect("drifted");
    assert!(why.contains("202611.10.0") && why.contains("202612.01.0"), "{why}");
    let mut changed = spec();
    changed.os_disk_size_gb = Some(128);
    azure.use_class("default", &changed).await;
    assert_eq!(azure.drifted(&launched).as_deref(), Some("AKSNodeClass default changed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_waited_out() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    arm.state.faults.lock().unwrap().throttle = 3;
    azure.create(&claim("general-429", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand")).await.expect("launched after 429s");
    assert_eq!(arm.state.faults.lock().unwrap().throttle, 0);
}

/// Answers no server should give end in an error, in bounded time and memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_or_a_foreign_poll_link_is_an_error() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    arm.state.faults.lock().unwrap().endless_answers = true;
    let c = retried(claim("general-endless", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand"));
    let e = tokio::time::timeout(Duration::from_secs(30), azure.create(&c)).await.expect("bounded").expect_err("refused");
    assert!(e.to_string().contains("more than 16777216 bytes"), "{e}");
    arm.state.faults.lock().unwrap().endless_answers = false;
    arm.state.faults.lock().unwrap().foreign_poll_links = true;
    let e = azure.create(&claim("general-foreign", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand")).await.expect_err("refused");
    assert!(e.to_string().contains("another origin"), "the token is never sent elsewhere: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_federated_token_is_said_plainly() {
    let arm = ArmServer::start().await;
    std::fs::write(arm.token_file.path(), "not-the-projected-token").unwrap();
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let azure = Azure::new(arm.settings(), catalog, kube()).expect("provider");
    let class = azure.use_class("default", &spec()).await;
    assert!(class.resolved.problems().contains("Microsoft Entra ID refused the federated token"), "{}", class.resolved.problems());
    assert!(arm.violations().iter().any(|v| v.contains("client_assertion")), "the server saw the wrong assertion");
}

/// The server's schema check is real: bodies the SDKs' schemas refuse are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_what_the_schemas_refuse() {
    let arm = ArmServer::start().await;
    let http = reqwest::Client::new();
    let token = http.post(format!("{}/{TENANT}/oauth2/v2.0/token", arm.endpoint))
        .form(&[("client_id", CLIENT_ID), ("grant_type", "client_credentials"), ("scope", "https://management.azure.com/.default"), ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"), ("client_assertion", ASSERTION)])
        .send().await.unwrap().json::<Value>().await.unwrap()["access_token"].as_str().unwrap().to_string();
    let put = |body: Value, api: &'static str| {
        let url = format!("{}/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines/x?api-version={api}", arm.endpoint);
        http.put(url).bearer_auth(&token).json(&body).send()
    };
    for (body, why) in [
        (json!({"properties": {"hardwareProfile": {"vmSize": "Standard_D2pls_v6"}}}), "location is required"),
        (json!({"location": "eastus", "properties": {"hardwareProfile": {"vmSize": 2}}}), "vmSize is a string"),
        (json!({"location": "eastus", "properties": {"hardwareProfile": {"size": "Standard_D2pls_v6"}}}), "no such member"),
        (json!({"location": "eastus", "properties": {"provisioningState": "Succeeded"}}), "read-only"),
        (json!({"location": "eastus", "properties": {"storageProfile": {"osDisk": {"diskSizeGB": 30}}}}), "osDisk needs createOption"),
    ] {
        let r = put(body, "2026-04-01").await.unwrap();
        assert_eq!(r.status(), 400, "{why}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "InvalidRequestContent", "{why}");
    }
    assert_eq!(put(json!({"location": "eastus"}), "2024-07-01").await.unwrap().status(), 400, "the SDK's api-version only");
    assert_eq!(arm.violations().len(), 6);
}

/// The custom data of a claim, if the provider launched one: `None` when nothing was made.
fn launched_custom_data(arm: &ArmServer, vm: &str) -> Option<String> {
    arm.state.custom_data.lock().unwrap().get(vm).map(|b64| String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).expect("base64")).expect("utf8"))
}

/// A NodePool label with a newline and `--` is refused in Azure custom data: the labels,
/// taints and kubelet settings become `/etc/default/kubelet`, where a newline is another
/// variable and a space another kubelet flag. Refused at launch (a clear error, nothing made in
/// Azure), whatever the CRD let through; what passes is written quoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodepool_label_with_a_newline_and_dashes_is_refused_in_azure_custom_data() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    let mut c = claim("general-inject", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand");
    c.spec.labels.insert("team".into(), "a\n--kubeconfig=/tmp/evil".into());
    let made = azure.create(&c).await;
    let boot = launched_custom_data(&arm, "aks-general-inject");
    assert!(boot.as_deref().is_none_or(|b| !b.contains("\\n--kubeconfig")), "the label became another line of /etc/default/kubelet: {boot:?}");
    let e = made.expect_err("refused");
    assert!(e.to_string().contains("label team: value") && e.to_string().contains("not a label value"), "{e}");
    assert!(arm.received("NetworkInterfaces_CreateOrUpdate").is_empty() && arm.received("VirtualMachines_CreateOrUpdate").is_empty(), "nothing made in Azure");

    // A label key, a taint, or a kubelet setting of the class: refused alike.
    let mut c = claim("general-key", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand");
    c.spec.labels.insert("team --register-node=false".into(), "a".into());
    assert!(azure.create(&c).await.expect_err("refused").to_string().contains("label key"));
    let mut c = claim("general-taint", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand");
    c.spec.taints[0].effect = "NoSchedule --anonymous-auth=true".into();
    assert!(azure.create(&c).await.expect_err("refused").to_string().contains("effect"));
    let mut evil = spec();
    evil.kubelet.as_mut().unwrap().cpu_manager_policy = Some("static\nKUBELET_FLAGS=--anonymous-auth=true".into());
    azure.use_class("default", &evil).await;
    let e = azure.create(&claim("general-kubelet", "Standard_D2pls_v6", "arm64", "eastus-1", "on-demand")).await.expect_err("refused");
    assert!(e.to_string().contains("kubelet.cpuManagerPolicy"), "{e}");
    assert!(arm.state.vms.lock().unwrap().is_empty() && arm.state.nics.lock().unwrap().is_empty());
    assert_eq!(arm.violations(), Vec::<String>::new());
}

/// The CRDs refuse the same: a NodePool (or NodeClaim) whose label value or taint could carry a
/// kubelet flag does not validate against the generated schema (checked here with a JSON Schema
/// validator; label keys are held by a CEL rule, which only the API server runs: its text is
/// checked).
#[test]
fn the_crds_refuse_labels_and_taints_that_are_not_kubernetes_syntax() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, wrap) in [("nodepool.yaml", true), ("nodeclaim.yaml", false)] {
        for dir in ["deploy/crds", "deploy/helm/archer/files/crds"] {
            let crd: Value = archer::yaml::from_str(&std::fs::read_to_string(root.join(dir).join(file)).unwrap()).unwrap();
            let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
            let validator = jsonschema::validator_for(&schema).expect("the CRD's schema compiles");
            let object = |labels: Value, taints: Value| {
                let spec = if wrap {
                    json!({"template": {"metadata": {"labels": labels}, "spec": {"taints": taints}}})
                } else {
                    json!({"nodePool": "general", "instanceType": "m6g.large", "zone": "us-east-1a", "capacityType": "spot", "arch": "arm64", "os": "linux", "pricePerHour": 0.03, "labels": labels, "taints": taints})
                };
                json!({"apiVersion": "archer.dev/v1alpha1", "kind": crd["spec"]["names"]["kind"], "metadata": {"name": "x"}, "spec": spec})
            };
            let good_taint = json!([{"key": "dedicated", "value": "demo", "effect": "NoSchedule"}]);
            assert!(validator.is_valid(&object(json!({"team": "a", "karpenter.sh/capacity-type": "spot"}), good_taint.clone())), "{dir}/{file}: a pool of valid labels and taints");
            for (labels, taints, what) in [
                (json!({"team": "a\n--kubeconfig=/tmp/evil"}), good_taint.clone(), "a label value with a newline and --"),
                (json!({"team": "a --register-node=false"}), good_taint.clone(), "a label value with a space"),
                (json!({"team": "x".repeat(64)}), good_taint.clone(), "a label value over 63 characters"),
                (json!({}), json!([{"key": "dedicated\n--x", "value": "demo", "effect": "NoSchedule"}]), "a taint key with a newline"),
                (json!({}), json!([{"key": "dedicated", "value": "a,b=c:NoExecute", "effect": "NoSchedule"}]), "a taint value with separators"),
                (json!({}), json!([{"key": "dedicated", "value": "demo", "effect": "NoSchedule --x"}]), "a taint effect that is not one"),
            ] {
                assert!(!validator.is_valid(&object(labels, taints)), "{dir}/{file} lets through {what}");
            }
            let labels = if wrap { &schema["properties"]["spec"]["properties"]["template"]["properties"]["metadata"]["properties"]["labels"] } else { &schema["properties"]["spec"]["properties"]["labels"] };
            let rule = labels["x-kubernetes-validations"][0]["rule"].as_str().unwrap_or_default();
            assert!(rule.starts_with("self.all(k, ") && rule.contains("k.matches("), "{dir}/{file}: label keys held by a CEL rule: {labels}");
        }
    }
    // The value pattern (run by the schema validator's regex engine) and the code agree.
    let crd: Value = archer::yaml::from_str(&std::fs::read_to_string(root.join("deploy/crds/nodeclaim.yaml")).unwrap()).unwrap();
    let taint = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["taints"]["items"].clone();
    let validator = jsonschema::validator_for(&taint).expect("compiles");
    for s in ["team", "karpenter.sh/capacity-type", "a/b/c", "Example.com/x", "-a", "a-", "a b", "a\n--b", "x.y-z.example.com/Name_1", "m6g.large", ""] {
        let as_key = validator.is_valid(&json!({"key": s, "value": "v", "effect": "NoSchedule"}));
        let as_value = validator.is_valid(&json!({"key": "k", "value": s, "effect": "NoSchedule"}));
        assert_eq!(as_key, archer_api::validation::qualified_name(s).is_ok(), "key {s:?}");
        assert_eq!(as_value, archer_api::validation::label_value(s).is_ok(), "value {s:?}");
    }
}

/// A failed launch's clean-up deletes what carries Archer's tags for the claim, and nothing
/// else: a VM of the claim's name that is not Archer's is kept, and a NIC of that name that is
/// not Archer's is neither taken over nor deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_launch_cleans_up_only_what_carries_archers_tags() {
    let arm = ArmServer::start().await;
    let azure = provider(&arm).await;
    // Someone else's VM, of the name the claim's would have; the size is not available.
    arm.plant_vm("aks-general-clash", "");
    arm.state.vms.lock().unwrap().get_mut("aks-general-clash").unwrap()["tags"] = json!({"owner": "someone-else"});
    arm.state.faults.lock().unwrap().sku_not_available.insert(("Standard_D2pls_v6".into(), "1".into()));
    let e = azure.create(&claim("general-clash", "Standard_D2pls_v6", "arm64", "eastus-1", "spot")).await.expect_err("not available");
    assert!(matches!(&e, CloudError::InsufficientCapacity { .. }), "{e}");
    assert_eq!(arm.state.vms.lock().unwrap().get("aks-general-clash").map(|v| v["tags"]["owner"].clone()), Some(json!("someone-else")), "someone else's VM is not deleted by the clean-up");
    assert!(!arm.state.nics.lock().unwrap().contains_key("aks-general-clash"), "the NIC Archer made for the launch is");
    // Someone else's NIC of the claim's name: the launch is refused, the NIC untouched.
    let foreign = json!({"id": format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Network/networkInterfaces/aks-general-nic"), "name": "aks-general-nic", "location": LOCATION, "tags": {"owner": "someone-else"}});
    arm.state.nics.lock().unwrap().insert("aks-general-nic".into(), foreign.clone());
    let e = azure.create(&claim("general-nic", "Standard_D4pls_v6", "arm64", "eastus-2", "on-demand")).await.expect_err("refused");
    assert!(e.to_string().contains("aks-general-nic") && e.to_string().contains("not Archer's"), "{e}");
    assert_eq!(arm.state.nics.lock().unwrap().get("aks-general-nic"), Some(&foreign), "not taken over, not deleted");
    assert!(arm.received("NetworkInterfaces_CreateOrUpdate").iter().all(|r| !r.path.ends_with("/aks-general-nic")));
    azure.delete(&claim("general-nic", "Standard_D4pls_v6", "arm64", "eastus-2", "on-demand")).await.expect("nothing of the claim's");
    assert_eq!(arm.state.nics.lock().unwrap().get("aks-general-nic"), Some(&foreign));
    assert_eq!(arm.violations(), Vec::<String>::new());
}

/// Bearer and federated tokens go over https only: a plain-http endpoint or authority that is
/// not loopback is refused when the provider is made (this server, on 127.0.0.1, is accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_endpoint_or_authority_off_loopback_is_refused() {
    let arm = ArmServer::start().await;
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    assert!(Azure::new(arm.settings(), catalog.clone(), kube()).is_ok(), "http to loopback: accepted");
    let localhost = archer_cloud::settings::AzureConfig { endpoint: arm.endpoint.replace("127.0.0.1", "localhost"), ..arm.settings() };
    assert!(Azure::new(localhost, catalog.clone(), kube()).is_ok(), "localhost: accepted");
    for (settings, says) in [
        (archer_cloud::settings::AzureConfig { endpoint: "http://management.example.com".into(), ..arm.settings() }, "provisioner.azure.endpoint"),
        (archer_cloud::settings::AzureConfig { authority_host: Some("http://login.example.com/".into()), ..arm.settings() }, "authorityHost"),
    ] {
        let e = Azure::new(settings.clone(), catalog.clone(), kube()).err().expect("refused");
        assert!(e.to_string().contains(says) && e.to_string().contains("clear text"), "{e}");
        assert!(settings.validate().is_err_and(|v| v.contains(says) && v.contains("https")), "{:?}", settings.validate());
    }
    assert_eq!(*arm.state.tokens_issued.lock().unwrap(), 0, "no token was asked for");
}

/// The provider in a region the embedded catalog does not price (swedencentral): its sizes are
/// priced by the Azure Retail Prices API (a stand-in checking every request against the API's
/// documentation, paging and throttling), on demand from the Linux meter and spot from the Spot
/// meter rather than the catalog's 65% estimate, which stays only for a size with no Spot meter.
/// Before live prices the provider refused to start there ("the catalog prices no Azure size in
/// swedencentral").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_are_priced_by_the_retail_prices_api_spot_from_its_spot_meters() {
    use common::price_apis::{azure_row, AzureRetail};
    let row = |sku, meter, product, price| azure_row("swedencentral", sku, meter, product, price);
    let retail = AzureRetail::start(
        "swedencentral",
        vec![
            row("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series", 0.081),
            row("Standard_D2ps_v5", "D2ps v5 Spot", "Virtual Machines Dpsv5 Series", 0.0123),
            row("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series Windows", 0.17),
            row("Standard_D2s_v5", "D2s v5", "Virtual Machines Dsv5 Series", 0.101),
        ],
        2,
    )
    .await;
    let arm = ArmServer::start().await;
    let settings = archer_cloud::settings::AzureConfig { location: "swedencentral".into(), zones: Vec::new(), prices_endpoint: retail.endpoint.clone(), ..arm.settings() };
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    assert!(!catalog.regions().contains_key("swedencentral"), "the catalog does not price swedencentral");
    let azure = Azure::new(settings.clone(), catalog.clone(), kube()).expect("provider");
    azure.start_prices().await.expect("priced by the API");
    assert!(retail.refused().is_empty(), "requests the API would refuse: {:?}", retail.refused());
    assert_eq!(retail.calls.load(std::sync::atomic::Ordering::SeqCst), 3, "throttled once, then two pages");
    let all = azure.offerings();
    let find = |size: &str, c: CapacityType| all.iter().find(|o| o.instance.name == size && o.zone == "swedencentral-1" && o.capacity == c).map(|o| o.price);
    assert_eq!(find("Standard_D2ps_v5", CapacityType::OnDemand), Some(0.081));
    assert_eq!(find("Standard_D2ps_v5", CapacityType::Spot), Some(0.0123), "the Spot meter, not 65% off");
    let estimate = find("Standard_D2s_v5", CapacityType::Spot).expect("an estimate");
    assert!((estimate - 0.101 * (1.0 - catalog.spot_discount)).abs() < 1e-9, "no Spot meter: the catalog's estimate on the API's price ({estimate})");
    let sizes: std::collections::BTreeSet<&str> = all.iter().map(|o| o.instance.name.as_str()).collect();
    assert_eq!(sizes, ["Standard_D2ps_v5", "Standard_D2s_v5"].into());
    assert_eq!(azure.prices().map(|s| (s.source, s.priced)), Some(("retail-prices-api", 2)));

    // Down at start in a region only the API prices: the provider refuses, saying both.
    retail.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let azure = Azure::new(settings.clone(), catalog.clone(), kube()).expect("provider");
    let err = azure.start_prices().await.expect_err("nothing prices swedencentral");
    assert!(err.to_string().contains("swedencentral") && err.to_string().contains("Retail Prices API did not answer") && err.to_string().contains("eastus"), "{err}");
    // In a region the catalog prices, it plans with the catalog's prices and says so.
    let azure = Azure::new(archer_cloud::settings::AzureConfig { prices_endpoint: retail.endpoint.clone(), ..arm.settings() }, catalog.clone(), kube()).expect("provider");
    azure.start_prices().await.expect("the catalog's eastus prices");
    let status = azure.prices().expect("a status");
    assert!(status.source == "catalog" && status.failing_since.is_some(), "{status:?}");
    assert_eq!(azure.offerings().iter().find(|o| o.instance.name == "Standard_D2ps_v5" && o.capacity == CapacityType::OnDemand).map(|o| o.price), catalog.price("Standard_D2ps_v5", Some("eastus"), CapacityType::OnDemand));
}
